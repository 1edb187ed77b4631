"""The start-up heap frozen out of the garbage collector (services.common.heap), and GC_FREEZE."""

import subprocess
import sys

import pytest

from services.common.environment import ConfigError, read_workload
from services.common.heap import describe


def _frozen_after(freeze: bool) -> int:
    """gc.get_freeze_count() in a fresh interpreter after freeze_startup(freeze): the objects it froze."""
    code = (
        "import gc; from services.common.heap import freeze_startup; "
        f"freeze_startup({freeze}); print(gc.get_freeze_count())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(done.stdout)


def test_freezing_moves_the_start_up_heap_out_of_collections() -> None:
    assert _frozen_after(True) > 1000  # the interpreter's own modules at least
    assert _frozen_after(False) == 0


@pytest.mark.parametrize(("raw", "freeze"), [(None, True), ("1", True), ("0", False), ("off", False)])
def test_gc_freeze_is_on_unless_the_environment_turns_it_off(monkeypatch, raw, freeze) -> None:
    if raw is None:
        monkeypatch.delenv("GC_FREEZE", raising=False)
    else:
        monkeypatch.setenv("GC_FREEZE", raw)
    assert read_workload().gc_freeze is freeze
    assert describe(freeze) == ("freeze" if freeze else "default")


def test_a_bad_gc_freeze_is_a_configuration_error_naming_it(monkeypatch) -> None:
    monkeypatch.setenv("GC_FREEZE", "sometimes")
    with pytest.raises(ConfigError, match="GC_FREEZE='sometimes' is not a boolean"):
        read_workload()
