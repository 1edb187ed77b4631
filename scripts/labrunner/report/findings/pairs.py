"""The pairs' findings: one line per pair of targets a comparison rule (model.questions) asks about.

Throughput and CPU per request come from saturating (closed-model) groups, latency from groups
under an offered load (open model) both compared targets carried: the highest such rate. A ratio
is "significant" after Holm's correction over the run's tests, "equivalent within ±10%" by TOST,
and otherwise "inconclusive" with its interval; a ratio whose interval is wider than
trust.MAX_INTERVAL_WIDTH is none of these, but says how many rounds it needs. Lower bounds and suspect
groups are named.
"""

import math
from collections.abc import Sequence

from labrunner.model.questions import is_streaming
from labrunner.model.scenario import UPLOAD, churn_words
from labrunner.report.compare import Comparison, Group, compare_groups
from labrunner.report.findings.finding import (
    CONDITIONS,
    PRECISION,
    SUSPECT,
    VERDICT,
    Evidence,
    Finding,
    Note,
    closed_groups,
    corrected,
    glance,
    held_fixed,
    open_groups,
)
from labrunner.report.stats import (
    EQUIVALENCE_MARGIN,
    Ratio,
    ratio_too_wide,
    relative_half_width,
    samples_needed,
)
from labrunner.results.trust import MAX_INTERVAL_WIDTH, SETTLED_HALF_WIDTH, rounds_needed
from labrunner.run.k6_stats import PERCENTILES

# The questions the pairs answer, and which comparison rule (model.questions) answers which.
HTTP2 = "HTTP/2 vs HTTP/1.1"
GRPC_VS_REST = "gRPC vs REST"
HTTP3 = "HTTP/3 vs HTTP/2 and HTTP/1.1"
DRIVER_VS_K6 = "Python driver vs k6"
SERVERS = "server vs server"
STREAMING = "gRPC streaming vs unary"
RESPONSE_MODEL = "response model"
METRICS_OVERHEAD = "metrics on vs off"
MULTIPLEXING = "multiplexing"
CHURN = "churn"
COMPRESSION = "compression"  # answered by findings.compression, on every network (not a pair's line)
_RULE_QUESTION = {
    "HTTP/2 vs HTTP/1.1": HTTP2,
    "gRPC vs REST": GRPC_VS_REST,
    "HTTP/3 vs HTTP/2": HTTP3,
    "HTTP/3 vs HTTP/1.1": HTTP3,
    "Python driver vs k6": DRIVER_VS_K6,
    "REST server vs REST server": SERVERS,
    "gRPC server vs gRPC server": SERVERS,
    "gRPC streaming vs unary": STREAMING,
    "build vs prebuilt": RESPONSE_MODEL,
    "metrics on vs off": METRICS_OVERHEAD,
    "multiplexed vs connections": MULTIPLEXING,
    "HTTP/2 multiplexed vs HTTP/1.1": MULTIPLEXING,
    "new connections vs kept": CHURN,
}
# An open-model group carried its offered rate when it served at least this share of it.
CARRIED_SHARE = 0.95


def findings(evidence: Evidence) -> list[Finding]:
    """A line per pair the rules compare, and why streaming was compared with nothing when it was.

    Each pair's saturation throughput and its latency at the highest load both targets carried (a
    ladder's rungs: the same share of each one's capacity) are tested; every such test of the run is
    corrected together (Holm), which is why one builder answers all the pairs' questions.
    """
    loaded: dict[tuple[str, str, str, int, str, str, str], Comparison] = {}
    for c in compare_groups(open_groups(evidence.groups)):
        key = _pair_key(c)
        if c.kind in _RULE_QUESTION and (key not in loaded or _preferred(c) > _preferred(loaded[key])):
            loaded[key] = c
    pairs = [
        (question, c, loaded.get(_pair_key(c))) for question, c in saturation_comparisons(evidence.groups)
    ]
    families: dict[str, list[Ratio]] = {}  # metric -> the run's tests of it
    for _, c, at_load in pairs:
        for metric, r in _tested(c, at_load):
            families.setdefault(metric, []).append(r)
    judged = {key: r for family in families.values() for key, r in corrected(family).items()}
    found = [_finding(question, c, at_load, judged) for question, c, at_load in pairs]
    return found + _streaming_alone(closed_groups(evidence.groups))


def saturation_comparisons(groups: Sequence[Group]) -> list[tuple[str, Comparison]]:
    """(question, comparison) of every pair of closed-model groups on loopback a question compares."""
    return [
        (_RULE_QUESTION[c.kind], c)
        for c in compare_groups([g for g in closed_groups(groups) if g.network == "loopback"])
        if c.kind in _RULE_QUESTION
    ]


def _tested(closed: Comparison, at_load: Comparison | None) -> list[tuple[str, Ratio]]:
    """(metric, ratio) a pair's finding judges: saturation req/s (CPU per request at saturation is its
    reciprocal again, so it is shown, not tested again) and latency at load. Each metric is a family
    of its own, corrected over the run's pairs: req/s, p50 and p99 answer three questions."""
    tested = [("rps", closed.ratios.get("rps"))]
    if at_load is not None:
        tested += [(metric, at_load.ratios.get(metric)) for metric in ("p50", "p99")]
    return [(metric, r) for metric, r in tested if r is not None and r.p_value is not None]


def _figure(r: Ratio | None, what: str) -> str:
    """A ratio shown without a verdict or an interval of its own: 'CPU/req 2.63x' (the req/s beside
    it carries the test and the interval), '—' when there is none or its interval decides nothing."""
    if r is None or ratio_too_wide(r):
        return f"{what} —"
    return f"{what} {r.estimate:.2f}x"


def _finding(
    question: str, closed: Comparison, at_load: Comparison | None, judged: dict[int, Ratio]
) -> Finding:
    """A pair's line: req/s with its interval and verdict, CPU per request, and latency's p50 and p99
    verdicts at the highest load both carried; its caveats as notes (_notes)."""
    c, b = closed.candidate, closed.baseline

    def verdict(r: Ratio | None) -> Ratio | None:
        return None if r is None else judged.get(id(r), r)

    rps = verdict(closed.ratios.get("rps"))
    candidate, baseline = side_names(c, b)
    pair = f"{candidate} vs {baseline}"
    if c.direction == UPLOAD == b.direction:  # the same records per request: records/s is req/s's ratio
        cell, notes = glance(rps, "records/s accepted", pair)
        line = f"{pair}, uploading: {cell}"
    else:
        cell, notes = glance(rps, "req/s", pair)
        line = f"{pair}: {cell}"
    line += f", {_figure(closed.ratios.get('cpu_per_1k'), 'CPU/req')}"
    load = ""
    if at_load is not None:
        load = _load(at_load)
        for metric in ("p50", "p99"):
            r = verdict(at_load.ratios.get(metric))
            if metric == "p99" and (r is None or r.low is None) and _short_batches(at_load):
                cell, why = "p99 —", [Note(_P99_SHORT, rank=VERDICT)]
            elif r is None:
                cell, why = f"{metric} —", [Note(_unsupported(at_load, metric), f"{metric} —", VERDICT)]
            else:
                cell, why = glance(r, metric, pair, undecided=_to_decide(r, at_load.candidate))
            line += f", {cell}"
            notes += why
    decided = rps is not None and rps.significant and not ratio_too_wide(rps)
    effect = abs(math.log(rps.estimate)) if rps is not None and decided else 0.0
    notes = _notes(c, b, at_load, (rps, closed.ratios.get("cpu_per_1k")), pair) + notes
    return Finding(question, line, effect, held_fixed=held_fixed(closed), notes=tuple(notes), load=load)


def _load(c: Comparison) -> str:
    """Where a latency comparison ran: a ladder rung's share of each side's capacity ("50% load"),
    else the offered rate both had ("100 req/s")."""
    share = c.candidate.results[0].scenario.load_model.share if c.candidate.results else None
    return f"{share:.0%} load" if share else f"{_rate(c)} req/s"


def _at(g: Group) -> str:
    """A latency group by its target and offered rate: the subject of every note about it."""
    return f"{g.target} at {_offered_rate(g)} req/s"


def _conditions(g: Group) -> Note:
    """A latency group's service CPU there (a share of its quota), its throttled seconds, and the
    samples of its smallest latency batch when too few for p99, with the window that would hold enough
    at its rate: near a full quota p99 measures the CPU quota's throttling, not the protocol."""
    s, throttled = g.summary("service_cpu"), g.summary("throttled_s")
    parts = [f"CPU {s.centre:.0%}" if s is not None else "CPU ?"]
    if throttled is not None and throttled.centre > 0:
        parts.append(f"throttled {throttled.centre:.2f} s")
    fewest, needed = g.fewest_in_a_batch, samples_needed(PERCENTILES["p99"])
    if fewest is not None and fewest < needed:
        seconds = _window_s(g, needed / max(fewest, 1))
        parts.append(
            f"{fewest:,} samples a batch"
            + (f", p99 needs {seconds:,} s windows (--duration)" if seconds else "")
        )
    return Note(", ".join(parts), _at(g), CONDITIONS)


# The window a note asks for is rounded up to this many seconds.
WINDOW_STEP_S = 5


def _window_s(g: Group, factor: float) -> int | None:
    """The measured window `factor` times the group's, rounded up to WINDOW_STEP_S; None for a result
    written before its window was recorded."""
    window = g.results[0].scenario.duration_s
    if window is None:
        return None
    return WINDOW_STEP_S * math.ceil(window * factor / WINDOW_STEP_S - 1e-9)


def _to_decide(r: Ratio, g: Group) -> str:
    """What would decide a latency ratio should it stay inconclusive, if its centre held: an interval
    narrow enough to exclude 1 or to lie within ±EQUIVALENCE_MARGIN, and to be shown at all (within
    trust.MAX_INTERVAL_WIDTH, which a ratio far from 1 asks first). Paired over rounds: about N
    rounds (trust.rounds_needed). Over one window's latency batches (g's window): a window
    (now / needed)² as long, since a batch's percentile moves about as 1/√ of its samples. Nothing
    when there is no interval, or no more than is there would do."""
    if r.low is None or r.high is None or r.low <= 0:
        return ""
    off = abs(math.log(r.estimate))
    goal = min(max(off, math.log(1 + EQUIVALENCE_MARGIN) - off), math.log(MAX_INTERVAL_WIDTH) / 2)
    half = max(math.log(r.high / r.estimate), math.log(r.estimate / r.low))
    if r.rounds is not None:
        needed = rounds_needed(half, r.rounds, math.expm1(goal), r.prior_df) if r.rounds >= 2 else 0
        return f"about {needed:,} rounds to decide (--repeats)" if needed > r.rounds else ""
    seconds, window = _window_s(g, (half / goal) ** 2), g.results[0].scenario.duration_s
    return (
        f"about {seconds:,} s windows to decide (--duration)"
        if seconds and window and seconds > window
        else ""
    )


def _short_batches(c: Comparison) -> bool:
    """Whether a side's latency batches held too few samples for p99 (its note says how many)."""
    needed = samples_needed(PERCENTILES["p99"])
    return any(
        g.fewest_in_a_batch is not None and g.fewest_in_a_batch < needed for g in (c.candidate, c.baseline)
    )


# Why a pair's p99 has no interval when its latency batches were too small: the same for every pair.
_P99_SHORT = (
    f"p99 —: latency batches under the {samples_needed(PERCENTILES['p99']):,} samples p99 needs "
    "(each side's note: the window that holds them)"
)


def _unsupported(c: Comparison, metric: str) -> str:
    """Why a percentile of a latency comparison has no ratio: too few samples on a side."""
    short = [g for g in (c.candidate, c.baseline) if not g.supports(metric)]
    if not short:
        return f"no {metric} figure"
    return f"no {metric} ({short[0].target}: {short[0].fewest_samples:,} samples in a repeat, too few)"


def side_names(candidate: Group, baseline: Group) -> tuple[str, str]:
    """The two sides by target, and by what differs when the target is the same on both (a response
    model, a profile, a network): 'aiohttp-h1 (build)' against 'aiohttp-h1 (prebuilt)'; and by their
    connection models or churns when those differ: 'quart-h2-tls (1x10)' against 'quart-h1-tls (10x1)',
    'grpc (new connection every 10 calls)' against 'grpc (connections kept)'."""
    if candidate.streams != baseline.streams:
        return (
            f"{candidate.target} ({candidate.connection_model})",
            f"{baseline.target} ({baseline.connection_model})",
        )
    if candidate.churn != baseline.churn:
        return (
            f"{candidate.target} ({churn_words(candidate.churn)})",
            f"{baseline.target} ({churn_words(baseline.churn)})",
        )
    if candidate.target != baseline.target:
        return candidate.target, baseline.target
    for side in ("compression", "response_model", "direction", "shape", "profile", "network"):
        ours, theirs = getattr(candidate, side), getattr(baseline, side)
        if ours != theirs:
            return f"{candidate.target} ({ours})", f"{baseline.target} ({theirs})"
    return candidate.target, baseline.target


def _notes(
    candidate: Group,
    baseline: Group,
    at_load: Comparison | None,
    throughput: tuple[Ratio | None, Ratio | None],
    pair: str,
) -> list[Note]:
    """A pair's caveats: its saturated groups' suspect repeats; how many rounds would bring req/s and
    CPU per request (`throughput`) to ±SETTLED_HALF_WIDTH; each latency side at its load (suspect
    repeats, whether it carried the rate, its service CPU, throttling and batch size), one note per
    side combining them. A duet's groups ran for this pair alone: what is said of them is said of the
    pair, in one note with its rounds."""
    notes = [n for g in (candidate, baseline) if (n := _saturated_suspect(g, pair))]
    if needed := _rounds_needed(*throughput):
        notes.append(Note(needed, pair, PRECISION))
    if at_load is not None:
        for g in (at_load.candidate, at_load.baseline):
            notes += [n for n in (_suspect(g, _at(g)), _not_carried(g)) if n] + [_conditions(g)]
    return notes


def _saturated_suspect(g: Group, pair: str) -> Note | None:
    """A closed-model group's suspect repeats: said of the pair when the group is a duet's (it ran
    beside the pair's other side only), else of the target's closed model (every pair it is in)."""
    if g.partner is None:
        return _suspect(g, f"{g.target}, closed model")
    flagged = sum(1 for r in g.results if r.suspect)
    detail = f"{flagged} of {len(g.results)} repeats of {g.target} suspect, see summary.md"
    return Note(detail, pair, SUSPECT) if flagged else None


def _rounds_needed(rps: Ratio | None, cpu: Ratio | None) -> str:
    """About how many rounds would bring the wider of the req/s and CPU per request ratios' intervals
    to ±SETTLED_HALF_WIDTH (trust.rounds_needed; --precision asks both), when it is wider now and not
    so wide that the line says it already."""
    widths = [(w, what, r) for what, r in (("req/s", rps), ("CPU/req", cpu)) if r and (w := _width(r))]
    if not widths:
        return ""
    width, what, r = max(widths, key=lambda found: found[0])
    if width - 1 <= SETTLED_HALF_WIDTH or ratio_too_wide(r) or r.rounds is None:
        return ""
    needed = rounds_needed(math.log(width), r.rounds, prior_df=r.prior_df)
    return f"{what} ±{width - 1:.0%}: about {needed} rounds for ±{SETTLED_HALF_WIDTH:.0%} (--precision)"


def _width(r: Ratio) -> float | None:
    """high / centre or centre / low, the wider, of a ratio paired over two rounds or more."""
    share = relative_half_width(r)
    return None if share is None or r.rounds is None or r.rounds < 2 else 1 + share


def _suspect(group: Group, subject: str) -> Note | None:
    """'1 of 2 repeats suspect, see summary.md' about the group, when any of its repeats is."""
    flagged = [r for r in group.results if r.suspect]
    if not flagged:
        return None
    return Note(f"{len(flagged)} of {len(group.results)} repeats suspect, see summary.md", subject, SUSPECT)


def _not_carried(group: Group) -> Note | None:
    """'did not carry it (served 30): its latency is a queue's' when a repeat served less than
    CARRIED_SHARE of the offered rate."""
    rate = _offered_rate(group)
    served = group.values("rps")
    if rate is None or not served or min(served) >= CARRIED_SHARE * rate:
        return None
    return Note(f"did not carry it (served {min(served):.0f}): its latency is a queue's", _at(group), VERDICT)


def _offered_rate(group: Group) -> int | None:
    rate = group.results[0].scenario.load_model.rate if group.results else None
    return int(rate) if rate else None


def _preferred(c: Comparison) -> tuple[bool, int]:
    """Which latency comparison of a pair a finding reads: the highest load both sides carried, else
    the highest load (its note says who did not carry it)."""
    carried = _not_carried(c.candidate) is None and _not_carried(c.baseline) is None
    return carried, _rate(c)


def _rate(c: Comparison) -> int:
    return _offered_rate(c.candidate) or 0


def _pair_key(c: Comparison) -> tuple[str, str, str, int, str, str, str]:
    return (
        c.kind,
        c.candidate.target,
        c.baseline.target,
        c.candidate.count,
        c.candidate.profile,
        c.candidate.response_model,
        c.candidate.direction,
    )


def _streaming_alone(closed: Sequence[Group]) -> list[Finding]:
    """Streaming measured without unary gRPC on the same records: compared with nothing."""
    streams = [g for g in closed if is_streaming(g)]
    if not streams or any(not is_streaming(g) and g.protocol == "grpc" for g in closed):
        return []
    return [
        Finding(
            STREAMING,
            "Streaming was measured without unary gRPC on the same records: it is compared with "
            "nothing (a stream of N messages is not one response of N records).",
        )
    ]
