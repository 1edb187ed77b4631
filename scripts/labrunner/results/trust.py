"""The one judge of trust: whether a result is suspect, and whether its throughput is only a lower bound.

Under a closed model the service answers as fast as k6 asks. If k6 ran out of CPU, or the service
left most of its quota unused, something other than the service limited the number: it says the
service can do at least this much, and it enters no ratio between targets (a ratio against k6's
limit measures k6). Everything that prints a verdict (the progress line, summaries, the report)
takes it from here.
"""

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from scipy import special  # not scipy.stats: about 1 s to import (report/stats.py)

from labrunner.backends.base import cpu_list
from labrunner.results.result import Host, K6Instance, Others, Result, Step

__all__ = ["Host", "K6Instance", "Others", "Step"]  # the judge's figures, from the result model

K6_SATURATED = 0.8  # above this share of its CPUs, k6 may be what limits throughput
# Below this share of its quota under a closed model, something else held the service back.
SERVICE_CPU_BOUND = 0.5
CLOSED_EXECUTORS = ("constant-vus", "ramping-vus")
MAX_ERROR_RATE = 0.01
# Above this share of the scenario's CPUs, what others (or the hypervisor) took may have moved
# the numbers: the result is suspect.
SUSPECT_SHARE = 0.05
# Repeats of a 10 s window spread with a coefficient of variation of req/s of 2-8% on a quiet host
# (docs/results.md#the-measurement-window, the window study); a group above SPREAD_CV that neither
# interference nor steal explains moved for a reason the lab did not measure. Halving the window
# doubled the spread there, so below SPREAD_WINDOW_S the threshold grows as 1 / window.
SPREAD_CV = 0.10
SPREAD_WINDOW_S = 10.0
SETTLED_HALF_WIDTH = 0.05  # the ratio interval (±5%) that enough repeats of such a group would give
SPREAD_CONFIDENCE = 0.95
# A ratio whose interval reaches more than this factor from its low end to its high end (high / low)
# decides nothing a reader can use ("0.05x [0.00, 4376.40]"): it is no finding, and wherever it would
# be printed the lab says how many rounds it needs instead (too_wide, rounds_needed).
MAX_INTERVAL_WIDTH = 3.0

# The short flag the progress line shows for each kind of suspect reason (the words are in
# summary.md): one per kind, so a flag says which sentence to read.
FLAG_K6_SATURATED = "k6-bound"
FLAG_DROPPED = "dropped"
FLAG_ERRORS = "errors"
FLAG_CAPPED = "capped"
FLAG_NOT_CPU_BOUND = "svc-idle"
FLAG_INTERFERENCE = "others"  # the line's "others" figure: processes outside the scenario
FLAG_STEAL = "steal"
FLAG_SEARCH_K6_BOUND = "search-k6-bound"

# What limited a closed-model result whose throughput is only a lower bound.
LIMITED_BY_K6 = "k6"  # the load generator ran out of CPU
LIMITED_BY_OTHER = "other"  # the service left its quota unused: something else held it back


@dataclass(frozen=True)
class Requests:
    """What k6's summary says about the requests (old results may lack attempts)."""

    dropped_iterations: int
    error_rate: float | None
    attempts: int | None


@dataclass(frozen=True)
class Figures:
    """Every number the verdict depends on."""

    executor: str
    iterations: int | None  # shared-iterations: the request cap
    duration_s: float | None
    profile_cpus: float | None
    k6_cpu_utilisation: float | None  # a split run's: its busiest instance's
    k6_instances: tuple[K6Instance, ...]  # empty unless k6 was split
    requests: Requests | None  # None without a k6 summary
    service_cpu_utilisation: float | None
    host: Host | None  # None when the window was not measured
    steps: tuple[Step, ...]  # a capacity search's; empty otherwise


@dataclass(frozen=True)
class Reason:
    """One reason not to trust a result: its kind's short flag and the sentence that explains it."""

    flag: str
    text: str


@dataclass(frozen=True)
class Verdict:
    """Why not to trust a result's numbers (empty: no reason), and why its throughput is only a
    lower bound of the service's (None: it is the service's). flags: the reasons' kinds, once
    each, in order, for the progress line; a stored verdict keeps only the sentences, so verdicts
    are equal when their reasons are."""

    suspect: tuple[str, ...]
    lower_bound: str | None
    flags: tuple[str, ...] = field(default=(), compare=False)
    limited_by: str | None = field(default=None, compare=False)  # LIMITED_BY_*, with lower_bound


@dataclass(frozen=True)
class Spread:
    """A group whose repeats spread more than its window explains: its CV of req/s, and about how
    many repeats of it (round by round with a group it is compared with) would bring the ratio's
    interval to ±SETTLED_HALF_WIDTH (rounds_needed)."""

    cv: float
    repeats: int
    repeats_needed: int

    @property
    def reason(self) -> str:
        return (
            f"unexplained spread (CV {self.cv:.1%}): about {self.repeats_needed} repeats instead of "
            f"{self.repeats} would bring the ratio interval to ±{SETTLED_HALF_WIDTH:.0%}"
        )


def spread_threshold(window_s: float | None) -> float:
    """The CV of req/s above which a group's repeats spread more than a window of window_s gives."""
    if not window_s or window_s >= SPREAD_WINDOW_S:
        return SPREAD_CV
    return SPREAD_CV * SPREAD_WINDOW_S / window_s


def unexplained_spread(results: Sequence[Result]) -> Spread | None:
    """A throughput group's (its successful repeats') spread that the lab cannot explain, or None.

    Not flagged when any repeat is suspect for interference or steal: that explains it already.
    """
    closed = all(r.scenario.load_model.executor in CLOSED_EXECUTORS for r in results)
    rates = [m.requests_per_second for r in results if (m := r.metrics) and m.requests_per_second]
    if not closed or len(rates) < 2 or len(rates) != len(results):
        return None
    if any(_host_reasons(r.host) for r in results):
        return None
    cv = statistics.stdev(rates) / statistics.mean(rates)
    window = results[0].scenario.duration_s
    if cv <= spread_threshold(window):
        return None
    n = len(rates)
    log_sd = statistics.stdev(math.log(v) for v in rates)
    # Sized from the group's own spread, not doubled as for two independent sides: a ratio within a
    # run pairs the sides' repeats by round (report.compare), so what moves a round moves both.
    return Spread(cv, n, rounds_needed(_t(n - 1) * log_sd / math.sqrt(n), n))


def rounds_needed(
    log_half_width: float, rounds: int, target: float = SETTLED_HALF_WIDTH, prior_df: float = 0.0
) -> int:
    """About how many rounds would bring an interval now log_half_width wide (ln(high / centre)) from
    `rounds` rounds to ±target: the fewest n with t(n-1)·s/√n <= ln(1 + target), s the rounds' standard
    deviation the current interval implies (log_half_width·√rounds / t(rounds-1)). t is taken at the
    n sought, not kept at today's: with 3 rounds t is 4.30, with 19 it is 2.10. A ratio whose spread is
    moderated by the run's other pairs (report/stats.SpreadPrior) has prior_df more degrees of freedom
    at every n, and s stays the moderated one."""
    if rounds < 2:
        raise ValueError("rounds_needed needs an interval from at least two rounds")
    sd = log_half_width * math.sqrt(rounds) / _t(rounds - 1 + prior_df)
    goal = math.log(1 + target)
    # t is above the normal quantile at every n: the normal's count is where the search starts.
    z = float(special.ndtri((1 + SPREAD_CONFIDENCE) / 2))
    n = max(2, math.ceil((z * sd / goal) ** 2))
    while _t(n - 1 + prior_df) * sd / math.sqrt(n) > goal:
        n += 1
    return n


def too_wide(low: float, high: float) -> bool:
    """Whether an interval of a positive quantity reaches past MAX_INTERVAL_WIDTH (high / low)."""
    return low <= 0 or high / low > MAX_INTERVAL_WIDTH


def _t(df: float) -> float:
    """The two-sided SPREAD_CONFIDENCE Student t critical value with df degrees of freedom."""
    return float(special.stdtrit(df, (1 + SPREAD_CONFIDENCE) / 2))


def judge(figures: Figures) -> Verdict:
    reasons = (*_load_reasons(figures), *_host_reasons(figures.host), *_capacity_reasons(figures.steps))
    limited_by, lower_bound = _lower_bound(figures) or (None, None)
    return Verdict(
        suspect=tuple(r.text for r in reasons),
        lower_bound=lower_bound,
        flags=tuple(dict.fromkeys(r.flag for r in reasons)),
        limited_by=limited_by,
    )


def verdict_of(result: Result) -> Verdict:
    """A saved result's verdict: its stored sentences (what the run judged, even if the thresholds
    moved since), with what limited a lower bound judged from its figures; all of it judged from
    the figures when it predates the stored verdict (result.StoredVerdict)."""
    stored = result.verdict
    if stored is None:
        return judge(figures_of(result))
    limited_by = None
    if stored.lower_bound:
        limited_by = judge(figures_of(result)).limited_by or LIMITED_BY_OTHER
    return Verdict(stored.suspect, stored.lower_bound, limited_by=limited_by)


def figures_of(result: Result) -> Figures:
    """The figures the judge reads, from a result just measured or stored long ago alike."""
    scenario, k6, metrics = result.scenario, result.k6, result.metrics
    return Figures(
        executor=scenario.load_model.executor,
        iterations=scenario.load_model.iterations,
        duration_s=scenario.duration_s,
        profile_cpus=scenario.profile.cpus,
        k6_cpu_utilisation=k6.cpu_utilisation if k6 else None,
        k6_instances=k6.instances if k6 else (),
        requests=None
        if metrics is None
        else Requests(metrics.dropped_iterations, metrics.error_rate, metrics.attempts),
        service_cpu_utilisation=result.usage.cpu_utilisation if result.usage else None,
        host=result.host,
        steps=result.capacity.steps if result.capacity else (),
    )


def _load_reasons(f: Figures) -> list[Reason]:
    """Reasons not to trust a measured number as the service's capacity."""
    reasons: list[Reason] = []
    for index, instance in _saturated_instances(f.k6_instances):
        reasons.append(
            Reason(
                FLAG_K6_SATURATED,
                f"k6 instance {index} of {len(f.k6_instances)} used {instance.cpu_utilisation:.0%} of its "
                f"CPU {cpu_list(instance.cpus)} (load generator saturated)",
            )
        )
    if not f.k6_instances and _saturated(f.k6_cpu_utilisation):
        reasons.append(
            Reason(
                FLAG_K6_SATURATED,
                f"k6 used {f.k6_cpu_utilisation:.0%} of its CPUs (load generator saturated)",
            )
        )
    requests = f.requests
    if requests is not None:
        # shared-iterations counts what the cap cut off as dropped: the reason below says it better.
        if requests.dropped_iterations and f.iterations is None:
            reasons.append(Reason(FLAG_DROPPED, f"{requests.dropped_iterations} iterations dropped"))
        if requests.error_rate is not None and requests.error_rate > MAX_ERROR_RATE:
            reasons.append(Reason(FLAG_ERRORS, f"error rate {requests.error_rate:.2%}"))
        if f.iterations is not None and requests.attempts is not None and requests.attempts < f.iterations:
            reasons.append(
                Reason(
                    FLAG_CAPPED,
                    f"only {requests.attempts} of {f.iterations} requests within the {f.duration_s:g}s cap",
                )
            )
    utilisation = f.service_cpu_utilisation
    closed = f.executor in CLOSED_EXECUTORS
    if requests is not None and closed and utilisation is not None and utilisation < SERVICE_CPU_BOUND:
        reasons.append(
            Reason(
                FLAG_NOT_CPU_BOUND,
                f"service used {utilisation:.0%} of its {f.profile_cpus:g}-CPU quota under a "
                "closed model: not CPU-bound, so something else limited throughput",
            )
        )
    return reasons


def _host_reasons(host: Host | None) -> list[Reason]:
    """Why a result's numbers may be the host's: others (less the lab's own daemons, which the run
    started and pinned to k6's side) or steal above SUSPECT_SHARE of the CPUs."""
    if host is None:
        return []
    reasons: list[Reason] = []
    sets = [(host.service_cpus, "the service's CPUs"), (host.k6_cpus, "k6's CPUs")]
    if host.shared:  # one figure for both sets: one reason
        sets = [(host.service_cpus, "the CPUs the service shares with k6,")]
    for figure, label in sets:
        if (
            figure is None
            or figure.share is None
            or figure.share - (figure.lab_share or 0.0) <= SUSPECT_SHARE
        ):
            continue
        relay, lab = figure.relay_cpu_seconds, figure.lab_cpu_seconds
        of_which = f", of which the userspace link emulator {relay:.2f}" if relay is not None else ""
        if lab is not None:
            of_which += f", of which the lab's Prometheus and InfluxDB {lab:.2f}, not counted"
        reasons.append(
            Reason(
                FLAG_INTERFERENCE,
                f"other processes used {figure.share:.1%} of {label} {cpu_list(figure.cpus)} "
                f"({figure.others_cpu_seconds:.2f} CPU s{of_which}) during the measured window "
                f"(> {SUSPECT_SHARE:.0%}): host interference",
            )
        )
    if host.steal_share is not None and host.steal_share > SUSPECT_SHARE:
        reasons.append(
            Reason(
                FLAG_STEAL,
                f"the hypervisor took {host.steal_share:.1%} of the scenario's CPUs (steal, "
                f"{host.steal_seconds:.2f} s) during the measured window (> {SUSPECT_SHARE:.0%})",
            )
        )
    return reasons


def _capacity_reasons(steps: Sequence[Step]) -> list[Reason]:
    """A search whose limiting step (the lowest failing rate) saturated k6 found k6's capacity."""
    failed = [s for s in steps if not s.passed]
    if not failed:
        return []
    lowest = min(failed, key=lambda s: s.rate)
    if _saturated(lowest.k6_cpu_utilisation):
        return [
            Reason(
                FLAG_SEARCH_K6_BOUND,
                f"k6 used {lowest.k6_cpu_utilisation:.0%} of its CPUs at {lowest.rate}/s, the rate that "
                "failed: the capacity found may be the load generator's",
            )
        ]
    return []


def _lower_bound(f: Figures) -> tuple[str, str] | None:
    """What limited a closed-model result whose throughput is only a lower bound (LIMITED_BY_*) and
    why in words, or None when the throughput is the service's."""
    if f.executor not in CLOSED_EXECUTORS:
        return None
    for index, instance in _saturated_instances(f.k6_instances):
        return (
            LIMITED_BY_K6,
            f"k6 instance {index} of {len(f.k6_instances)} used {instance.cpu_utilisation:.0%} of its CPU",
        )
    if not f.k6_instances and _saturated(f.k6_cpu_utilisation):
        return LIMITED_BY_K6, f"k6 used {f.k6_cpu_utilisation:.0%} of its CPUs"
    if f.service_cpu_utilisation is not None and f.service_cpu_utilisation < SERVICE_CPU_BOUND:
        return LIMITED_BY_OTHER, f"the service used {f.service_cpu_utilisation:.0%} of its quota"
    return None


def _saturated_instances(instances: Sequence[K6Instance]) -> list[tuple[int, K6Instance]]:
    """k6 split: any saturated instance limited the load it was given (numbered from 1)."""
    return [(i, inst) for i, inst in enumerate(instances, start=1) if _saturated(inst.cpu_utilisation)]


def _saturated(share: float | None) -> bool:
    return share is not None and share > K6_SATURATED


# Preset caller (docs/caller.md): the Python caller is what is measured, so the server it calls runs
# on a CPU of its own. A server that used more than this share of its CPU over the caller's window
# may have been what held the caller back: the caller's calls/s is only a lower bound of its own.
CALLER_SERVER_BUSY = 0.5


def caller_lower_bound(server_cpu_share: float | None, caller_quota_share: float | None) -> str | None:
    """Why a caller's calls/s is only a lower bound of what it can call, or None when it is its own: the
    server used more than CALLER_SERVER_BUSY of its CPU, or the caller left more than half its quota
    unused (SERVICE_CPU_BOUND, as for a service under a closed model)."""
    if server_cpu_share is not None and server_cpu_share > CALLER_SERVER_BUSY:
        return f"the server used {server_cpu_share:.0%} of its CPU"
    if caller_quota_share is not None and caller_quota_share < SERVICE_CPU_BOUND:
        return f"the caller used {caller_quota_share:.0%} of its quota"
    return None


def caller_suspect(
    others_share: float | None, steal_share: float | None, error_rate: float | None
) -> list[str]:
    """Reasons not to trust a caller's window: others or the hypervisor on its CPUs above SUSPECT_SHARE,
    failed calls above MAX_ERROR_RATE."""
    reasons = []
    if others_share is not None and others_share > SUSPECT_SHARE:
        reasons.append(
            f"other processes used {others_share:.1%} of the caller's CPUs during its window "
            f"(> {SUSPECT_SHARE:.0%}): host interference"
        )
    if steal_share is not None and steal_share > SUSPECT_SHARE:
        reasons.append(
            f"the hypervisor took {steal_share:.1%} of the caller's CPUs (steal, > {SUSPECT_SHARE:.0%})"
        )
    if error_rate is not None and error_rate > MAX_ERROR_RATE:
        reasons.append(f"{error_rate:.2%} of the calls failed")
    return reasons
