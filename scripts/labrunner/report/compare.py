"""Scenario results grouped across repeats, and the comparisons derived from target attributes."""

import itertools
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from labrunner.model.questions import pairs
from labrunner.model.scenario import (
    DEFAULT_DIRECTION,
    DEFAULT_SHAPE,
    DEFAULT_STREAMS,
    IDENTITY,
    churn_words,
    duet_name_of,
)
from labrunner.report.stats import (
    Ratio,
    SpreadPrior,
    Summary,
    paired_ratio,
    ratio,
    spread_prior,
    summarize,
    supports,
)
from labrunner.results.result import LoadModel, Metrics, Result, Usage
from labrunner.results.trust import verdict_of
from labrunner.run.k6_stats import LATENCY_BATCHES, LATENCY_STATS, PERCENTILES

Reader = Callable[[Result], float | None]

THROUGHPUT, SEQUENTIAL, CAPACITY = "throughput", "sequential", "capacity"


@dataclass(frozen=True)
class Metric:
    """A number read from each repeat's result; None when that result lacks it."""

    name: str
    label: str
    higher_is_better: bool
    read: Reader


def _k6(read: Callable[[Metrics], float | None]) -> Reader:
    return lambda r: read(r.metrics) if r.metrics else None


def _latency(key: str) -> Reader:
    return _k6(lambda m: m.latency_ms.get(key))


def _usage(read: Callable[[Usage], float | None]) -> Reader:
    return lambda r: read(r.usage) if r.usage else None


def _k6_cpu_seconds(result: Result) -> float | None:
    """k6's process CPU seconds over the measured run (results record them beside cpu_utilisation)."""
    return result.k6.cpu_seconds if result.k6 else None


def _per_request(numerator: Reader, scale: float) -> Reader:
    def read(result: Result) -> float | None:
        value, requests = numerator(result), _k6(lambda m: m.requests)(result)
        return value * scale / requests if value is not None and requests else None

    return read


METRICS = {
    m.name: m
    for m in (
        Metric("rps", "req/s", True, _k6(lambda m: m.requests_per_second)),
        # Older results lack the later percentiles (p99.9): a missing one reads None, as any metric.
        *(Metric(k, k, False, _latency(k)) for k in LATENCY_STATS),
        # CPU over the measured window per successful request: what a request costs the budget.
        Metric("cpu_per_1k", "CPU s / 1k req", False, _per_request(_usage(lambda u: u.cpu_seconds), 1000)),
        # Everything k6 read from the socket (headers, framing, TLS) per successful request.
        Metric("bytes", "bytes / response", False, _per_request(_k6(lambda m: m.data_received_bytes), 1)),
        # The connections k6 dialed per successful request: a churn's 1/N, about 0 with connections kept.
        Metric(
            "dialed", "connections / request", False, _per_request(_k6(lambda m: m.connections_opened), 1)
        ),
        Metric("service_cpu", "service CPU", False, _usage(lambda u: u.cpu_utilisation)),
        # CFS throttling over the window: near a full quota, the tail waits for the next period.
        Metric("throttled_s", "throttled s", False, _usage(lambda u: u.throttled_seconds)),
        Metric("k6_cpu", "k6 CPU", False, lambda r: r.k6.cpu_utilisation if r.k6 else None),
        # The speed reference's CPU per unit over the window (run.speed_reference): the host's speed then.
        Metric(
            "reference_unit",
            "reference CPU / unit (s)",
            False,
            lambda r: r.host.reference_seconds_per_unit if r.host else None,
        ),
        # k6's CPU per successful request, in ms (its process's CPU seconds, start-up included, every
        # instance's of a split run): what the load generator spends on a request of this protocol.
        Metric("k6_cpu_per_1k", "k6 CPU / req (ms)", False, _per_request(_k6_cpu_seconds, 1000)),
        Metric("seconds", "k6 run s", False, _k6(lambda m: m.test_run_seconds)),
        Metric(
            "sustainable",
            "sustainable req/s",
            True,
            lambda r: r.capacity.sustainable_rate if r.capacity else None,
        ),
    )
}
# What a comparison reports, per kind of group.
COMPARED = {
    THROUGHPUT: ("rps", "p50", "p99", "cpu_per_1k"),
    SEQUENTIAL: ("avg", "p50", "p99"),
    CAPACITY: ("sustainable",),
}
# Under an open model the offered rate sets req/s (a ratio of it only echoes the rate) and idle
# cost weighs in CPU per request: such groups compare by latency alone.
OPEN_EXECUTORS = ("constant-arrival-rate",)
OPEN_COMPARED = ("p50", "p99")


@dataclass(frozen=True)
class Group:
    """One scenario group (scenario id without the repeat) and its successful repeats."""

    id: str
    target: str
    service: str
    protocol: str
    script: str  # the k6 script
    tls: bool
    instrumented: bool  # request metrics on (METRICS_ENABLED is not "0" in the target's env)
    profile: str
    cpus: float
    count: int
    load_model: str
    response_model: str  # "build" or "prebuilt"
    direction: str  # "download" or "upload"
    shape: str  # the record shape ("cars" for results written before shapes)
    network: str  # the network profile
    kind: str  # THROUGHPUT, SEQUENTIAL or CAPACITY
    iterations: int | None  # sequential: requests per repeat
    order: int  # position of the target in the run (matrix order)
    results: tuple[Result, ...]  # status ok, in repeat order
    attempted: int  # repeats with a result file, failed ones included
    # A duet's group (model.duet): the target it ran beside, and its side of the pair (1 or 2).
    partner: str | None = None
    side: int | None = None
    streams: int = DEFAULT_STREAMS  # requests at once on each connection
    connection_model: str = ""  # connections x streams, "1x10" ("?x1": an open model's connections vary)
    churn: int | None = None  # calls a connection carried before k6 replaced it; None: never
    compression: str = IDENTITY  # what the service compressed its responses with
    # A duet group's run: what its duet pairs tell of one another's spread, by metric (MODERATED).
    spread_priors: Mapping[str, SpreadPrior] = field(default_factory=dict, compare=False, hash=False)

    @property
    def duet_name(self) -> str:
        """What a duet partner calls this group's side (model.scenario.Scenario.duet_name)."""
        return duet_name_of(self.target, self.streams, self.connection_model, self.churn, self.compression)

    def values(self, metric: str) -> list[float]:
        read = METRICS[metric].read
        return [v for v in (read(r) for r in self.results) if v is not None]

    def by_repeat(self, metric: str) -> dict[int, float]:
        """Each successful repeat's value of `metric`, by repeat number (its round in the run)."""
        read = METRICS[metric].read
        found = ((r.scenario.repeat, read(r)) for r in self.results)
        return {repeat: value for repeat, value in found if value is not None}

    def summary(self, metric: str) -> Summary | None:
        """The repeats' summary (stats.summarize): a percentile's centre is the geometric mean of the
        repeats' own percentiles, the centre a ratio between groups pairs (_compare); an open model's
        is over its latency batches where they support it, as its ratios are."""
        values = self.batches(metric) or self.values(metric)
        return summarize(values) if values else None

    def batches(self, metric: str) -> list[float]:
        """An open model's percentile `metric` in every latency batch of every repeat (run/k6_stats
        batch_percentiles), when each batch's samples support it and there are LATENCY_BATCHES or
        more (at least LATENCY_BATCHES - 1 degrees of freedom); else none."""
        if metric not in PERCENTILES or not self.open_model:
            return []
        found = self._latency_batches
        if len(found) < LATENCY_BATCHES or not all(supports(int(b["n"]), PERCENTILES[metric]) for b in found):
            return []
        return [float(b[metric]) for b in found]

    @property
    def fewest_in_a_batch(self) -> int | None:
        """The samples of the smallest latency batch of any repeat; None without batches."""
        return min((int(b["n"]) for b in self._latency_batches), default=None)

    @property
    def _latency_batches(self) -> list[Mapping[str, float]]:
        return [b for r in self.results if r.k6 for b in r.k6.latency_batches]

    @property
    def samples(self) -> int:
        """Latency samples over every repeat."""
        return sum(_latency_count(r) for r in self.results)

    def supports(self, metric: str) -> bool:
        """Whether each repeat's own samples support the percentile `metric` (stats.supports): each
        repeat's percentile is what the group's centre and a ratio's rounds are made of. Any other
        metric is supported."""
        return metric not in PERCENTILES or supports(self.fewest_samples, PERCENTILES[metric])

    @property
    def fewest_samples(self) -> int:
        """The latency samples of the repeat with the fewest (0 without a repeat)."""
        return min((_latency_count(r) for r in self.results), default=0)

    @property
    def open_model(self) -> bool:
        return bool(self.results) and self.results[0].scenario.load_model.executor in OPEN_EXECUTORS

    @property
    def lower_bound(self) -> str | None:
        """Why this group's throughput is only a lower bound of the service's (then it enters no
        ratio between targets or budgets), or None."""
        reasons = [reason for r in self.results if (reason := verdict_of(r).lower_bound)]
        if not reasons or self.kind != THROUGHPUT:
            return None
        return f"{len(reasons)} of {len(self.results)} repeats not service-bound ({reasons[0]})"

    @property
    def context(self) -> str:
        """What a comparison holds fixed: profile, payload and load."""
        held = f"{self.profile}, c{self.count}, {self.load_model}"
        if self.direction != DEFAULT_DIRECTION:
            held = f"{held}, {self.direction}"
        if self.shape != DEFAULT_SHAPE:
            held = f"{held}, {self.shape}"
        if self.streams != DEFAULT_STREAMS:
            held = f"{held}, {self.connection_model}"
        if self.churn is not None:
            held = f"{held}, {churn_words(self.churn)}"
        if self.compression != IDENTITY:
            held = f"{held}, {self.compression}"
        return held if self.network == "loopback" else f"{held}, {self.network}"


@dataclass(frozen=True)
class Comparison:
    """candidate / baseline for each compared metric."""

    kind: str  # the question, e.g. "HTTP/2 vs HTTP/1.1"
    candidate: Group
    baseline: Group
    ratios: Mapping[str, Ratio]  # metric name -> ratio; metrics without values on a side are absent


# The A/A control of a duet run: one target against itself, side 1 over side 2 (model.duet).
AA_CONTROL = "A/A control"
# The duet ratios whose spread a run's pairs share (stats.SpreadPrior): both come from the blocks'
# windows, whose spread is the host's and the fresh processes' more than the pair's own.
MODERATED = ("rps", "cpu_per_1k")


def group_results(results: Iterable[Result]) -> list[Group]:
    """Group results by scenario.group, keeping the order groups first appear in."""
    members: dict[str, list[Result]] = {}
    targets: dict[str, int] = {}
    for result in results:
        members.setdefault(result.scenario.group, []).append(result)
        targets.setdefault(result.scenario.target, len(targets))
    groups = []
    for group_id, rs in members.items():
        scenario = rs[0].scenario
        model = scenario.load_model
        ok = sorted((r for r in rs if r.status == "ok"), key=lambda r: r.scenario.repeat)
        groups.append(
            Group(
                id=group_id,
                target=scenario.target,
                service=scenario.service,
                protocol=scenario.protocol,
                script=scenario.script,
                tls=scenario.tls,
                instrumented=scenario.instrumented,
                profile=scenario.profile.name,
                cpus=scenario.profile.cpus,
                count=scenario.count,
                load_model=model.name,
                response_model=scenario.response_model,
                direction=scenario.direction,
                shape=scenario.shape,
                network=rs[0].network.profile,
                kind=_kind(model),
                iterations=model.iterations,
                order=targets[scenario.target],
                results=tuple(ok),
                attempted=len(rs),
                partner=scenario.duet.partner if scenario.duet else None,
                side=scenario.duet.side if scenario.duet else None,
                streams=scenario.streams,
                churn=scenario.churn,
                compression=scenario.compression,
                connection_model=scenario.connection_model,
            )
        )
    priors = spread_priors(groups)
    return [replace(g, spread_priors=priors) if g.partner else g for g in groups]


def spread_priors(groups: Sequence[Group]) -> dict[str, SpreadPrior]:
    """Each MODERATED metric's prior over the run's duet pairs (stats.spread_prior): the variance of
    each pair's per-block log ratios, side 1 over side 2. Not the A/A control's (a control that
    borrowed its spread from the pairs it checks would check nothing), nor a pair whose throughput is
    only a lower bound (its spread is its k6's)."""
    duets = [
        (one, two)
        for one in groups
        for two in groups
        if one.side == 1
        and two.side == 2
        and _moderated(one, two)
        and (one.context, one.response_model, one.kind) == (two.context, two.response_model, two.kind)
        and not (one.lower_bound or two.lower_bound)
    ]
    priors = {}
    for metric in MODERATED:
        kept = [logs for one, two in duets if len(logs := _log_ratios(one, two, metric)) >= 2]
        prior = spread_prior([statistics.variance(logs) for logs in kept], [len(logs) - 1 for logs in kept])
        if prior is not None:
            priors[metric] = prior
    return priors


def _moderated(candidate: Group, baseline: Group) -> bool:
    """Whether a pair's ratios borrow spread from the run's other duet pairs: two targets of one duet."""
    return (
        candidate.partner is not None
        and partners(candidate, baseline)
        and candidate.duet_name != baseline.duet_name
    )


def _log_ratios(candidate: Group, baseline: Group, name: str) -> list[float]:
    return [math.log(c / b) for c, b in paired_rounds(candidate, baseline, name) if c > 0 and b > 0]


def compare_groups(groups: Sequence[Group]) -> list[Comparison]:
    """Every pair the questions find, in question then group order, and each duet's A/A control;
    groups without a successful repeat, or whose throughput is only a lower bound, are skipped.

    A duet's group compares only with its partner's group of the same duet: each ran beside the
    other, so their ratio is the duet's; a group that ran alone compares only with others that did.
    """
    usable = [g for g in groups if g.results and not g.lower_bound]
    comparisons = [
        _compare(question.kind, candidate, baseline)
        for question, candidate, baseline in pairs(usable)
        if candidate.kind == baseline.kind and partners(candidate, baseline)
    ]
    for candidate in usable:
        for baseline in usable:
            if _aa_control(candidate, baseline):
                comparisons.append(_compare(AA_CONTROL, candidate, baseline))
    return comparisons


def partners(candidate: Group, baseline: Group) -> bool:
    """Whether two groups may form a pair: both ran alone, or each beside the other in one duet."""
    if candidate.partner is None and baseline.partner is None:
        return True
    return candidate.partner == baseline.duet_name and baseline.partner == candidate.duet_name


def _aa_control(candidate: Group, baseline: Group) -> bool:
    """Side 1 over side 2 of one target dueted with itself, all else the same."""
    return (
        candidate.duet_name == candidate.partner == baseline.duet_name == baseline.partner
        and (candidate.side, baseline.side) == (1, 2)
        and candidate.kind == baseline.kind
        and candidate.id.removesuffix(".aa1") == baseline.id.removesuffix(".aa2")
    )


def budget_pairs(groups: Sequence[Group]) -> list[Comparison]:
    """The same target, payload, load, response model and network on consecutive budgets: does more CPU
    buy more throughput?

    Sequential groups are left out: one client at a time keeps at most one CPU busy.
    """
    by_rest: dict[tuple[str, int, str, str, str, str, str], list[Group]] = {}
    for g in groups:
        if g.results and g.kind != SEQUENTIAL and not g.lower_bound:
            key = (g.target, g.count, g.load_model, g.response_model, g.direction, g.shape, g.network)
            by_rest.setdefault(key, []).append(g)
    comparisons = []
    for members in by_rest.values():
        ordered = sorted(members, key=lambda g: g.cpus)
        for smaller, larger in itertools.pairwise(ordered):
            if larger.cpus > smaller.cpus:
                kind = f"{larger.profile} vs {smaller.profile} ({larger.cpus / smaller.cpus:g}x CPUs)"
                comparisons.append(_compare(kind, larger, smaller))
    return comparisons


def against_baseline(current: Sequence[Group], baseline: Sequence[Group]) -> dict[str, Comparison]:
    """Each group of this run against the same group of another run, by group id."""
    previous = {g.id: g for g in baseline if g.results}
    return {
        g.id: _compare("vs baseline", g, previous[g.id], same_run=False)
        for g in current
        if g.results and g.id in previous
    }


def is_regression(comparison: Comparison) -> list[str]:
    """The compared metrics that got significantly worse than in the baseline."""
    worse = []
    for name, r in comparison.ratios.items():
        if r.significant and (r.estimate < 1) == METRICS[name].higher_is_better:
            worse.append(name)
    return worse


# A change beyond this (either way) is flagged even when no test judged it: 0.20 = +-20%.
LARGE_CHANGE = 0.20
REGRESSION = "significant regression"
IMPROVEMENT = "significant improvement"
LARGE_UNJUDGED = "large unjudged change"
LARGE_NOT_SIGNIFICANT = "large change, not significant"
UNJUDGED = "unjudged"  # untested, and within LARGE_CHANGE
WITHIN_NOISE = "within noise"
NOT_COMPARED = "not compared"
VERDICTS = (
    REGRESSION,
    IMPROVEMENT,
    LARGE_UNJUDGED,
    LARGE_NOT_SIGNIFICANT,
    UNJUDGED,
    WITHIN_NOISE,
    NOT_COMPARED,
)


@dataclass(frozen=True)
class BaselineChange:
    """One group present in both runs, and what its change against the baseline run amounts to.

    A change is judged only where both runs have repeats: with one repeat on either side
    no test can tell a change from noise, so such a group is "unjudged", never "no
    regression". A change beyond LARGE_CHANGE is flagged whether or not it was tested.
    """

    current: Group
    baseline: Group
    comparison: Comparison | None  # None when one side has no successful repeat

    @property
    def id(self) -> str:
        return self.current.id

    @property
    def ratios(self) -> Mapping[str, Ratio]:
        return self.comparison.ratios if self.comparison else {}

    @property
    def worse(self) -> list[str]:
        """Metrics significantly worse than in the baseline."""
        return is_regression(self.comparison) if self.comparison else []

    @property
    def better(self) -> list[str]:
        """Metrics significantly better than in the baseline."""
        return [
            name
            for name, r in self.ratios.items()
            if r.significant and (r.estimate > 1) == METRICS[name].higher_is_better
        ]

    @property
    def untested(self) -> list[str]:
        """Metrics whose ratio no test could judge (one repeat on a side, values not positive)."""
        return [name for name, r in self.ratios.items() if r.significant is None]

    @property
    def large(self) -> list[str]:
        """Metrics that moved beyond LARGE_CHANGE without a significant test result."""
        return [name for name, r in self.ratios.items() if not r.significant and is_large(r)]

    @property
    def verdict(self) -> str:
        """The group's category, one of VERDICTS."""
        if not self.ratios:
            return NOT_COMPARED
        if self.worse:
            return REGRESSION
        if self.better:
            return IMPROVEMENT
        if self.large:
            large_untested = set(self.large) & set(self.untested)
            return LARGE_UNJUDGED if large_untested else LARGE_NOT_SIGNIFICANT
        return UNJUDGED if self.untested else WITHIN_NOISE


def is_large(r: Ratio) -> bool:
    """Whether a ratio's estimate is beyond +-LARGE_CHANGE."""
    return abs(r.estimate - 1) > LARGE_CHANGE


def baseline_changes(current: Sequence[Group], baseline: Sequence[Group]) -> list[BaselineChange]:
    """Every group present in both runs (by group id), in this run's group order."""
    previous = {g.id: g for g in baseline}
    changes = []
    for g in current:
        then = previous.get(g.id)
        if then is None:
            continue
        comparison = _compare("vs baseline", g, then, same_run=False) if g.results and then.results else None
        changes.append(BaselineChange(g, then, comparison))
    return changes


def _compare(kind: str, candidate: Group, baseline: Group, same_run: bool = True) -> Comparison:
    """The compared metrics' ratios; a percentile only where every repeat of both sides has the
    samples to support its own (Group.supports): those per-repeat percentiles are what is paired.

    Within a run, repeat i of every group ran in round i: the ratio pairs the rounds both sides
    have (stats.paired_ratio) when there are two or more, so a round the host slowed for every
    target cancels. Across runs (a baseline) no repeat has a partner: Welch's test (stats.ratio).
    An open model's percentile where both sides have latency batches (Group.batches): Welch's test
    over the batches.
    """
    ratios = {}
    compared = OPEN_COMPARED if candidate.open_model else COMPARED[candidate.kind]
    for name in compared:
        if (c_batches := candidate.batches(name)) and (b_batches := baseline.batches(name)):
            # Open models run one target at a time: nothing pairs their batches, so Welch's test;
            # no rounds (stats.too_few_rounds): batches of one window, not rounds of a run.
            ratios[name] = replace(ratio(c_batches, b_batches), rounds=None)
            continue
        c, b = candidate.values(name), baseline.values(name)
        if not (c and b and candidate.supports(name) and baseline.supports(name)):
            continue
        ratios[name] = round_ratio(candidate, baseline, name, same_run)
    return Comparison(kind, candidate, baseline, ratios)


def round_ratio(candidate: Group, baseline: Group, name: str, same_run: bool = True) -> Ratio:
    """candidate / baseline of metric `name` over their repeats: within a run, paired by the rounds
    both sides have (stats.paired_ratio) when there are two or more, so a round the host slowed for
    both cancels (a duet block's two sides are one round); across runs, Welch's test (stats.ratio)."""
    rounds = paired_rounds(candidate, baseline, name)
    if same_run and len(rounds) >= 2:
        prior = candidate.spread_priors.get(name) if _moderated(candidate, baseline) else None
        return paired_ratio([ours for ours, _ in rounds], [theirs for _, theirs in rounds], prior=prior)
    return ratio(candidate.values(name), baseline.values(name))


def paired_rounds(candidate: Group, baseline: Group, name: str) -> list[tuple[float, float]]:
    """(candidate, baseline) values of metric `name` in every round both sides have, in round order."""
    ours, theirs = candidate.by_repeat(name), baseline.by_repeat(name)
    return [(ours[i], theirs[i]) for i in sorted(ours.keys() & theirs.keys())]


def _latency_count(result: Result) -> int:
    return result.metrics.latency_count if result.metrics else 0


def _kind(model: LoadModel) -> str:
    if model.searched:
        return CAPACITY
    if model.executor == "shared-iterations":
        return SEQUENTIAL
    return THROUGHPUT
