"""Ctrl-C while a run is under way: the first one ends the run, the ones after it cannot cut short
the cleanup it started, and none lands between starting a process and knowing it."""

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

# SIGTERM too, so `kill`, `timeout` or a CI job's cancel clean up as a Ctrl-C does.
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _State:
    """What the handler and held() share; both run on the main thread (Python runs signal
    handlers there), so no lock."""

    holds = 0  # held() blocks open
    pending = False  # an interrupt came inside one, to be raised at its end


@contextmanager
def first_one_ends_the_run() -> Iterator[None]:
    """Inside the block, the first SIGINT or SIGTERM raises KeyboardInterrupt; every later one is said
    on stderr and ignored, so what the first one set off (stopping services and k6, writing the
    finishing result and the manifest, stopping the local Prometheus and InfluxDB) always completes.
    Each of those steps has its own timeout. The previous handlers are back once the block is left."""
    interrupted = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal interrupted
        name = signal.Signals(signum).name
        if not interrupted:
            interrupted = True
            _say(f"{name}: stopping what the run started and keeping what it finished (a few seconds)")
            if _State.holds:
                _State.pending = True
                return
            raise KeyboardInterrupt
        _say(f"{name} again: still stopping what the run started (services, k6, results); it ends by itself")

    previous = {signum: signal.signal(signum, on_signal) for signum in SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextmanager
def held() -> Iterator[None]:
    """The run's first interrupt, if it comes inside this block, is raised at its end: for a step a
    KeyboardInterrupt must not cut in two, such as starting a process and recording it (cut inside
    subprocess.Popen, the child runs on and nobody knows its pid). Only the main thread's
    blocks hold, as only it gets the KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _State.holds += 1
    try:
        yield
    finally:
        _State.holds -= 1
        if not _State.holds and _State.pending:
            _State.pending = False
            raise KeyboardInterrupt


def _say(line: str) -> None:
    print(f"\n{line}", file=sys.stderr, flush=True)
