"""The connections k6 holds to a service while it runs, against the plan's connection model
(model.scenario: a closed model's VUs / streams). The backend counts them in the service's network
namespace (backends.connections) at a few moments of each k6 run: under docker each count is an exec
in the service's container, so a handful cost its quota next to nothing."""

import threading
from collections.abc import Callable
from types import TracebackType

from labrunner.backends.base import ScenarioFailed

# The moments of a k6 run's expected length at which the connections are counted: after k6's start
# (a few hundred ms), before its VUs end their last iterations.
MOMENTS = (0.3, 0.5, 0.7)
# Then, while fewer than the plan were counted, again every this share of the run's length until it
# ends: a connection whose SYN or handshake an emulated lossy link dropped comes a second or more
# late, and a load generator slow to start (the Python driver, an eighth of a CPU doing the TLS
# handshakes) can hold all of its connections only after the last moment of a short window.
LATE_EVERY = 0.1


class Watch:
    """Counts while a k6 run runs (`with Watch(count, seconds, planned) as watch:`); watch.held (what
    the runner checks) and watch.peak after it. planned: the connections the plan holds (None: not
    known, only the moments are counted)."""

    def __init__(self, count: Callable[[], int | None], seconds: float, planned: int | None = None) -> None:
        self._count = count
        self._seconds = seconds
        self._planned = planned
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="connections", daemon=True)
        self.counts: list[int] = []

    def __enter__(self) -> "Watch":
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak(self) -> int | None:
        """The most connections counted; None when none was (the run ended first, or no count)."""
        return max(self.counts, default=None)

    @property
    def held(self) -> int | None:
        """The connections k6 held over the run: the most counted, unless only one count saw that many
        and it was more than the plan. A connection k6 dials again (its old one closing as the
        service answers its last request) is held beside its replacement for a moment, which one
        count can catch on a busy host; a connection model k6 does not follow (a VU that does not
        multiplex) holds its extra connections at every count. None without a count."""
        if len(self.counts) < 2 or self._planned is None:
            return self.peak
        highest, second = sorted(self.counts, reverse=True)[:2]
        return second if highest > self._planned and second < highest else highest

    def _watch(self) -> None:
        waited = 0.0
        for moment in MOMENTS:
            if self._stop.wait(moment * self._seconds - waited):
                return
            waited = moment * self._seconds
            self._count_once()
        while self._planned is not None and (self.peak or 0) < self._planned:
            if self._stop.wait(LATE_EVERY * self._seconds):
                return
            self._count_once()

    def _count_once(self) -> None:
        if (counted := self._count()) is not None:
            self.counts.append(counted)


def check_churn(churn: int, attempts: int, opened: int, vus: int) -> None:
    """ScenarioFailed when k6 did not dial a new connection every `churn` calls: each VU dials one for
    its first call and one after every `churn` calls, so `attempts` calls over `vus` VUs dial between
    attempts / churn and attempts / churn + vus connections."""
    low, high = attempts // churn, attempts / churn + vus
    if not low <= opened <= high:
        raise ScenarioFailed(
            "connections",
            f"k6 dialed {opened} connections for {attempts} calls on {vus} VUs; a new one every {churn} "
            f"calls dials {low} to {high:.0f}",
        )


def check(planned: int | None, seen: int | None, phase: str, connection_model: str) -> None:
    """ScenarioFailed when k6 held other than the planned connections. In the warm-up, only more than
    planned fails (a request that did not multiplex): its first count may come before every VU has
    connected. In the measured window, any other number fails."""
    if planned is None or seen is None or seen == planned or (phase == "warmup" and seen < planned):
        return
    raise ScenarioFailed(
        "connections",
        f"the service held {seen} connections from k6 in the {phase}; the plan is {planned} "
        f"({connection_model}: connections x streams)",
    )
