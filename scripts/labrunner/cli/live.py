"""The live line during each measured window on a terminal: elapsed/total, req/s and errors so far.

Only on a terminal (rich, transient: it disappears when the window ends); a pipe or CI gets
the plain progress lines alone.
"""

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from rich.console import Console
from rich.live import Live
from rich.text import Text

from labrunner.run import live
from labrunner.run.live import Counts, Window

POLL_INTERVAL_S = 1.0


def watch_for(stream: TextIO) -> live.Watch | None:
    """The live line's watch when `stream` is a terminal; None (plain lines only) otherwise."""
    if not stream.isatty():
        return None
    console = Console(file=stream)

    @contextmanager
    def watch(window: Window) -> Iterator[None]:
        began = time.monotonic()
        stop = threading.Event()
        with Live(
            Text(line(window, 0.0, None)), console=console, transient=True, auto_refresh=False
        ) as shown:

            def update() -> None:
                while not stop.wait(POLL_INTERVAL_S):
                    counts = live.poll(window.api_addresses) if window.api_addresses else None
                    shown.update(Text(line(window, time.monotonic() - began, counts)), refresh=True)

            poller = threading.Thread(target=update, name="live-line", daemon=True)
            poller.start()
            try:
                yield
            finally:
                stop.set()
                poller.join()

    return watch


def line(window: Window, elapsed_s: float, counts: Counts | None) -> str:
    """`  measuring aiohttp-h1.quarter...: 12/30 s, 1,203 req/s, 0 errors` (no counts: time only)."""
    text = f"  measuring {window.scenario_id}: {elapsed_s:.0f}/{window.total_s:.0f} s"
    if counts is not None:
        errors = "every request failing" if counts.errors is None else f"{counts.errors} errors"
        text += f", {counts.requests_per_second:,.0f} req/s, {errors}"
    return text
