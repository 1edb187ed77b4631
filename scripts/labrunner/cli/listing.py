"""The --dry-run and --list tables: the expanded plan and what the matrix file offers."""

from collections.abc import Mapping, Sequence

from labrunner.model.scenario import LoadModel, Matrix, Plan, format_duration
from labrunner.network.profiles import NetworkProfile


def describe_plan(plan: Plan) -> str:
    """The dry-run table: one line per scenario in the order it would run, then the k6 time."""
    header: tuple[str, ...] = (
        "#",
        "scenario",
        "service",
        "protocol",
        "tls",
        "cpus",
        "memory",
        "load",
        "time",
    )
    split = any(s.k6_instances != 1 for s in plan.scenarios)
    if split:
        header = (*header, "k6 instances")
    rows = [header]
    for index, s in enumerate(plan.run_order, start=1):
        rows.append(
            (
                str(index),
                s.id,
                s.target.module or s.target.service,
                s.target.protocol,
                "yes" if s.target.tls else "no",
                f"{s.profile.cpus:g}",
                f"{s.profile.memory_bytes // 2**20}Mi",
                _describe_load(s.load_model),
                f"{format_duration(s.warmup_s)}+{format_duration(s.measured_seconds)}",
                *([str(s.k6_instances)] if split else []),
            )
        )
    lines = _table(rows)
    lines.append(
        f"{len(plan.scenarios)} scenarios from {plan.matrix_path.name} preset {plan.preset!r}; "
        f"k6 time {_minutes(plan.estimated_seconds)} plus start/verify/stop overhead per scenario"
    )
    if plan.seed is not None:
        lines.append(f"each round shuffled by seed {plan.seed}: --seed {plan.seed} runs this order")
    rungs = sum(1 for s in plan.scenarios if s.load_model.rung is not None)
    if rungs:
        lines.append(
            f"{rungs} of them ladder rungs, each at its share of the target's closed-model req/s "
            "measured earlier in the run, and not run without one"
        )
    return "\n".join(lines)


def describe_matrix(matrix: Matrix) -> str:
    """--list: each section a table with aligned columns, values as the matrix file writes them."""
    profiles = [
        (p.name, f"{p.cpus:g} CPUs", f"{p.memory_bytes // 2**20} MiB") for p in matrix.profiles.values()
    ]
    targets = [
        (
            t.name,
            t.module or t.service,
            t.protocol,
            "tls" if t.tls else "plain",
            str(t.script),
            " ".join(f"{k}={v}" for k, v in t.env),
        )
        for t in matrix.targets.values()
    ]
    presets = [
        (name, "; ".join(f"{key} {_value(value)}" for key, value in preset.items()) or "the [defaults]")
        for name, preset in matrix.presets.items()
    ]
    sections: list[tuple[str, Sequence[Sequence[str]]]] = [
        ("profiles:", profiles),
        ("targets:", targets),
        ("load models:", [(m.name, _describe_load(m)) for m in matrix.load_models.values()]),
        ("networks:", [(n.name, _describe_network(n)) for n in matrix.networks.values()]),
        (f"presets (default {matrix.default_preset}):", presets),
    ]
    lines = [f"matrix {matrix.path}"]
    for title, rows in sections:
        lines += ["", title, *("  " + line for line in _table(rows))]
    return "\n".join(lines)


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows as lines with every column as wide as its widest cell (two spaces between)."""
    if not rows:
        return []
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def _value(value: object) -> str:
    """A preset's setting as a person writes it: lists comma-separated, not as Python reprs."""
    if isinstance(value, Mapping):
        return ",".join(f"{key}={_value(item)}" for key, item in value.items())
    if isinstance(value, list | tuple):
        return ",".join(_value(item) for item in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _minutes(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s"


def _describe_network(network: NetworkProfile) -> str:
    if not network.emulated:
        return "loopback, no emulation"
    parts = [f"RTT {network.rtt_s * 1000:g} ms"]
    if network.jitter_s:
        parts.append(f"jitter {network.jitter_s * 1000:g} ms each way")
    if network.loss_percent:
        parts.append(f"loss {network.loss_percent:g}% each way")
    if network.rate_bps:
        parts.append(f"rate {network.rate_bps / 1e6:g} Mbit/s each way")
    return ", ".join(parts)


def _describe_load(model: LoadModel) -> str:
    if model.executor == "constant-vus":
        return f"{model.name} ({model.vus} VUs)"
    if model.executor == "ramping-vus":
        stages = ",".join(f"{format_duration(s.duration_s)}:{s.target}" for s in model.stages)
        return f"{model.name} (VUs {stages})"
    if model.executor == "shared-iterations":
        return f"{model.name} ({model.iterations} requests, {model.vus} VU)"
    if model.search is not None:
        return f"{model.name} (search from {model.rate}/s, p99 <= {model.search.slo_p99_ms:g} ms)"
    if model.rung is not None:
        rung = model.rung
        return (
            f"{model.name} ({rung.share:.0%} of the {rung.capacity_model} req/s, "
            f"{model.pre_allocated_vus}-{model.max_vus} VUs; rung of {rung.ladder})"
        )
    return f"{model.name} ({model.rate}/s, {model.pre_allocated_vus}-{model.max_vus} VUs)"
