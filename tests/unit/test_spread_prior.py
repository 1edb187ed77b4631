"""A run's duet pairs moderate one another's spread (limma's moderated t, report/stats.SpreadPrior):
the prior's fit against an independent root finder, its two limits, the moderated ratio and its
degrees of freedom, its coverage on simulated runs, the rounds a moderated ratio needs, and which of
a run's duet pairs borrow and lend (not the A/A control)."""

import math
import random
import statistics
from typing import Any

import pytest
from labrunner.model import duet
from labrunner.model.matrix import expand, load_matrix
from labrunner.model.scenario import Overrides
from labrunner.report import precision
from labrunner.report.compare import AA_CONTROL, MODERATED, compare_groups, group_results, paired_rounds
from labrunner.report.stats import (
    SPREAD_PRIOR_PAIRS,
    SpreadPrior,
    paired_ratio,
    relative_half_width,
    spread_prior,
)
from labrunner.results.result import parse_results
from labrunner.results.trust import rounds_needed
from scipy import optimize, special

from tests.support import ROOT, ok_result


def _limma(variances: list[float], dfs: list[int]) -> tuple[float, float]:
    """fitFDist as limma writes it, its trigamma inverted by scipy's root finder."""
    e = [math.log(v) - special.digamma(d / 2) + math.log(d / 2) for v, d in zip(variances, dfs, strict=True)]
    excess = statistics.variance(e) - statistics.fmean([special.polygamma(1, d / 2) for d in dfs])
    d0 = 2 * optimize.brentq(lambda y: special.polygamma(1, y) - excess, 1e-6, 1e6)
    return d0, math.exp(statistics.fmean(e) + special.digamma(d0 / 2) - math.log(d0 / 2))


def test_the_prior_is_limmas_fit() -> None:
    variances, dfs = [0.0004, 0.0036, 0.0009, 0.0081, 0.0001, 0.0025], [2, 2, 4, 3, 2, 6]
    prior = spread_prior(variances, dfs)
    assert prior is not None
    d0, s0 = _limma(variances, dfs)
    assert (prior.df, prior.variance) == (pytest.approx(d0, rel=1e-6), pytest.approx(s0, rel=1e-6))
    assert prior.pooled_df == sum(dfs)


def test_variances_as_alike_as_sampling_makes_them_pool_fully() -> None:
    prior = spread_prior([0.0010, 0.0011, 0.0009, 0.0010], [2, 2, 2, 2])
    assert prior is not None and math.isinf(prior.df) and prior.pooled_df == 8
    moderated, df = prior.moderate(0.0100, 2)
    assert (moderated, df) == (prior.variance, 8)


def test_too_few_pairs_or_no_spread_give_no_prior() -> None:
    assert spread_prior([0.001] * (SPREAD_PRIOR_PAIRS - 1), [2] * (SPREAD_PRIOR_PAIRS - 1)) is None
    # A pair without spread (the same ratio in every block) tells nothing of a log variance.
    assert spread_prior([0.001, 0.002, 0.0, 0.003], [2, 2, 2, 2]) is None


def test_a_moderated_ratio_weighs_its_own_spread_against_the_runs() -> None:
    prior = SpreadPrior(df=6.0, variance=0.03**2, pooled_df=20.0)
    blocks = [1.00, 1.12, 0.90]  # a pair whose three blocks spread about 11%
    plain = paired_ratio(blocks, [1.0] * 3)
    moderated = paired_ratio(blocks, [1.0] * 3, prior=prior)
    logs = [math.log(b) for b in blocks]
    variance = (6 * 0.03**2 + 2 * statistics.variance(logs)) / 8
    margin = float(special.stdtrit(8, 0.975)) * math.sqrt(variance / 3)
    assert moderated.estimate == plain.estimate
    assert moderated.high == pytest.approx(math.exp(statistics.fmean(logs) + margin))
    assert moderated.prior_df == 6 and plain.prior_df == 0 and moderated.rounds == 3
    assert plain.high is not None and moderated.high < plain.high
    # The degrees of freedom stop at the pooled.
    assert paired_ratio(blocks, [1.0] * 3, prior=SpreadPrior(50.0, 0.0009, 10.0)).prior_df == 8


def test_moderated_intervals_keep_their_coverage_and_are_narrower() -> None:
    """Simulated runs of 9 pairs, 3 to 6 blocks each, whose true spreads differ 3x (2-6%): the
    moderated 95% intervals cover the true ratio at least as often as asked, and those of three
    blocks are narrower."""
    rng = random.Random(36)
    covered = plain_covered = total = 0
    widths, plain_widths = [], []
    for _ in range(400):
        pairs = [
            (rng.choice([3, 3, 4, 6]), math.exp(rng.uniform(math.log(0.02), math.log(0.06))))
            for _ in range(9)
        ]
        runs = [[math.exp(rng.gauss(0, sd)) for _ in range(n)] for n, sd in pairs]
        logs = [[math.log(v) for v in run] for run in runs]
        prior = spread_prior([statistics.variance(x) for x in logs], [len(x) - 1 for x in logs])
        for run in runs:
            moderated, plain = (
                paired_ratio(run, [1.0] * len(run), prior=prior),
                paired_ratio(run, [1.0] * len(run)),
            )
            assert moderated.low is not None and moderated.high is not None
            assert plain.low is not None and plain.high is not None
            covered += moderated.low <= 1 <= moderated.high
            plain_covered += plain.low <= 1 <= plain.high
            if len(run) == 3:  # where t(2) = 4.30 costs a pair alone the most
                widths.append(math.log(moderated.high / moderated.low))
                plain_widths.append(math.log(plain.high / plain.low))
            total += 1
    assert covered / total >= 0.94 and plain_covered / total >= 0.94, (covered / total, plain_covered / total)
    assert statistics.median(widths) < 0.8 * statistics.median(plain_widths)


def test_rounds_needed_count_the_borrowed_degrees_of_freedom() -> None:
    # ±20% from 3 rounds alone needs 12 rounds for ±5%. The same ±20% with 20 degrees of freedom
    # borrowed came from a t of 2.07, not 4.30, so a spread twice as wide: 40 rounds, each with t at
    # n - 1 + 20 (the search stops at the first n that reaches ±5%).
    alone, borrowed = rounds_needed(math.log(1.2), 3), rounds_needed(math.log(1.2), 3, prior_df=20)
    assert (alone, borrowed) == (12, 40)
    sd = math.log(1.2) * math.sqrt(3) / float(special.stdtrit(22, 0.975))
    n = borrowed
    assert float(special.stdtrit(n - 1 + 20, 0.975)) * sd / math.sqrt(n) <= math.log(1.05)
    assert float(special.stdtrit(n - 2 + 20, 0.975)) * sd / math.sqrt(n - 1) > math.log(1.05)


# The host's speed in each block: both sides of a block move with it.
HOST = {1: 1.0, 2: 0.8, 3: 1.2}


def _default_run(wide_target: str = "grpc-stream") -> list[dict[str, Any]]:
    """The default preset's closed duets over 3 blocks: each side moves by about 2% from block to
    block, `wide_target` by 15%, the A/A control's sides by 1%."""
    plan = duet.plan_duets(
        expand(load_matrix(ROOT / "matrix.toml"), "local", "default", Overrides(load_models=("closed",))),
        duet.AUTO,
    )
    rng = random.Random(7)
    results = []
    for s in plan.scenarios:
        assert s.duet is not None
        sd = 0.01 if s.duet.partner == s.target.name else 0.15 if s.target.name == wide_target else 0.02
        rps = 1000.0 * HOST[s.repeat] * math.exp(rng.gauss(0, sd))
        results.append(
            ok_result(
                s,
                requests=int(rps * 5),
                rps=rps,
                latency_ms={},
                received_bytes=0,
                window_s=5.0,
                cpu_seconds=1.25,
                quota_used=1.0,
            )
        )
    return results


def test_a_runs_duet_pairs_lend_one_another_their_spread_but_not_the_aa_control() -> None:
    groups = group_results(parse_results(_default_run()))
    priors = next(g.spread_priors for g in groups if g.partner)
    assert set(priors) == set(MODERATED)
    assert priors["rps"].pooled_df == 2 * 9  # the default's 9 pairs of 3 blocks; not the control's
    comparisons = compare_groups(groups)
    [wide] = [c for c in comparisons if c.candidate.target == "grpc-stream"]
    [control] = [c for c in comparisons if c.kind == AA_CONTROL]
    for c in (wide, control):
        rounds = paired_rounds(c.candidate, c.baseline, "rps")
        alone = paired_ratio([a for a, _ in rounds], [b for _, b in rounds])
        if c is control:
            assert c.ratios["rps"] == alone  # judged on its own blocks alone
        else:
            assert c.ratios["rps"].prior_df > 0
            assert c.ratios["rps"].high < alone.high  # type: ignore[operator]
    # --precision reads the moderated width and the borrowed degrees of freedom.
    [sharp] = [p for p in precision.sharpness(groups) if p.candidate.target == "grpc-stream"]
    wider = max((wide.ratios[m] for m in MODERATED), key=lambda r: relative_half_width(r) or 0.0)
    assert sharp.half_width == relative_half_width(wider)
    assert sharp.prior_df == wider.prior_df > 0
