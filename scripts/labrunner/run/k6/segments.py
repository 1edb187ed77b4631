"""k6 split into instances: how many a scenario runs, and each one's execution segment, CPU and files."""

import itertools
from collections.abc import Sequence
from dataclasses import replace

from labrunner.backends.base import K6Invocation, ScenarioFailed, cpu_list, k6_instances_problem
from labrunner.model.scenario import K6Instances, LoadModel


def instances_for(setting: K6Instances, k6_cpus: Sequence[int], model: LoadModel) -> int:
    """How many k6 processes a scenario runs, one per CPU of the k6 side.

    "auto": as many as k6 has CPUs, never more than the load model has VUs to share. An explicit
    count the k6 side cannot hold, one CPU each, or that would leave an instance without VUs,
    fails the scenario before any load.
    """
    vus = splittable_vus(model)
    if isinstance(setting, str):  # AUTO_INSTANCES, the only string the matrix accepts
        return max(1, min(len(k6_cpus), vus))
    if setting == 1:
        return 1
    if problem := k6_instances_problem(setting, len(k6_cpus), f"k6's side is CPU {cpu_list(k6_cpus)}"):
        raise ScenarioFailed("start", problem)
    if setting > vus:
        raise ScenarioFailed(
            "start",
            f"k6_instances = {setting}: load model {model.name} has {vus} VUs to share, "
            "so an instance would have none",
        )
    return setting


def splittable_vus(model: LoadModel) -> int:
    """The VUs a load model has to share among instances (an arrival-rate model: its pre-allocated)."""
    if model.executor == "ramping-vus":
        return max((stage.target for stage in model.stages), default=0)
    if model.executor == "constant-arrival-rate":
        return min(model.pre_allocated_vus or 0, model.rate or 0)
    return model.vus or 0


def execution_segments(instances: int) -> tuple[str, tuple[str, ...]]:
    """k6's --execution-segment-sequence for `instances` equal parts, and each part's --execution-segment.

    3 -> ("0,1/3,2/3,1", ("0:1/3", "1/3:2/3", "2/3:1")).
    """
    if instances < 1:
        raise ValueError(f"instances must be >= 1, got {instances}")
    points = ["0", *(f"{i}/{instances}" for i in range(1, instances)), "1"]
    return ",".join(points), tuple(f"{a}:{b}" for a, b in itertools.pairwise(points))


def split(
    invocation: K6Invocation, instances: int, k6_cpus: Sequence[int], raw: bool
) -> tuple[K6Invocation, ...]:
    """One invocation per execution segment, the i-th on k6_cpus[i] when there is one CPU each; raw:
    each writes its raw output (--out csv: every sample, for percentiles merged over all of them)."""
    sequence, segments = execution_segments(instances)
    return tuple(
        _instance(
            invocation,
            index,
            segment,
            sequence,
            cpus=(k6_cpus[index - 1],) if len(k6_cpus) >= instances else None,
            raw=raw,
        )
        for index, segment in enumerate(segments, start=1)
    )


def _instance(
    invocation: K6Invocation,
    index: int,
    segment: str,
    sequence: str,
    *,
    cpus: tuple[int, ...] | None,
    raw: bool,
) -> K6Invocation:
    """The index-th instance: the whole run's options, then its segment and tag; its own summary, log
    and raw output.

    The k6_instance tag keeps the instances' InfluxDB points apart (points with equal tags and
    timestamps would overwrite each other).
    """
    stem = invocation.summary_file.name.removesuffix(".json")
    summary = invocation.summary_file.with_name(f"{stem}.k6-{index}.json")
    raw_file = invocation.summary_file.with_name(f"{stem}.k6-{index}.csv") if raw else None
    args = (
        *invocation.args,
        "--execution-segment",
        segment,
        "--execution-segment-sequence",
        sequence,
        "--tag",
        f"k6_instance={index}",
    )
    if raw_file is not None:
        args = (*args, "--out", f"csv={raw_file}")
    log = invocation.log_file
    return replace(
        invocation,
        args=args,
        env={**invocation.env, "SUMMARY_FILE": str(summary)},
        summary_file=summary,
        log_file=log.with_name(f"{log.stem}-{index}{log.suffix}"),
        segment=segment,
        cpus=cpus,
        raw_file=raw_file,
    )
