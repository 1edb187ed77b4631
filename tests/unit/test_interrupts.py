"""Ctrl-C during a run (labrunner.interrupts): real signals to this process, whose handler Python runs
on the main thread, as it does for run_matrix.py."""

import os
import signal

import pytest
from labrunner import interrupts


def ctrl_c() -> None:
    os.kill(os.getpid(), signal.SIGINT)


def test_the_first_ctrl_c_ends_the_run_and_the_next_ones_are_said_and_ignored(
    capsys: pytest.CaptureFixture[str],
) -> None:
    steps: list[str] = []
    with pytest.raises(KeyboardInterrupt), interrupts.first_one_ends_the_run():
        try:
            ctrl_c()
            steps.append("not reached")
        finally:  # the cleanup the first one set off
            ctrl_c()
            ctrl_c()
            steps.append("cleanup done")
    assert steps == ["cleanup done"]
    said = capsys.readouterr().err
    assert said.count("SIGINT: stopping what the run started") == 1, said
    assert said.count("SIGINT again: still stopping") == 2, said
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the previous handler back


def test_a_ctrl_c_inside_held_is_raised_at_its_end() -> None:
    steps: list[str] = []
    with pytest.raises(KeyboardInterrupt), interrupts.first_one_ends_the_run():
        with interrupts.held():
            ctrl_c()
            steps.append("the held step completed")
        steps.append("not reached")
    assert steps == ["the held step completed"]


def test_sigterm_ends_a_run_as_ctrl_c_does() -> None:
    with pytest.raises(KeyboardInterrupt), interrupts.first_one_ends_the_run():
        os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
