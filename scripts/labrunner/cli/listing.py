"""The --dry-run and --list tables: the expanded plan and what the matrix file offers."""

from labrunner.model.scenario import LoadModel, Matrix, Plan, format_duration
from labrunner.network.profiles import NetworkProfile


def describe_plan(plan: Plan) -> str:
    """The dry-run table: one line per scenario in execution order, then the k6 time."""
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
    for index, s in enumerate(plan.scenarios, start=1):
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
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.append(
        f"{len(plan.scenarios)} scenarios from {plan.matrix_path.name} preset {plan.preset!r}; "
        f"k6 time {_minutes(plan.estimated_seconds)} plus start/verify/stop overhead per scenario"
    )
    return "\n".join(lines)


def describe_matrix(matrix: Matrix) -> str:
    lines = [f"matrix {matrix.path}", "", "profiles:"]
    lines += [
        f"  {p.name:10} {p.cpus:g} CPUs, {p.memory_bytes // 2**20} MiB" for p in matrix.profiles.values()
    ]
    lines += ["", "targets:"]
    for t in matrix.targets.values():
        env = " ".join(f"{k}={v}" for k, v in t.env)
        tls = "tls" if t.tls else "plain"
        service = t.module or t.service
        lines.append(f"  {t.name:16} {service:13} {t.protocol:8} {tls:5} {t.script} {env}".rstrip())
    lines += ["", "load models:"]
    lines += [f"  {m.name:10} {_describe_load(m)}" for m in matrix.load_models.values()]
    lines += ["", "networks:"]
    lines += [f"  {n.name:10} {_describe_network(n)}" for n in matrix.networks.values()]
    lines += ["", f"presets (default {matrix.default_preset!r}):"]
    for name, preset in matrix.presets.items():
        settings = ", ".join(f"{k}={v}" for k, v in preset.items()) or "the [defaults]"
        lines.append(f"  {name:10} {settings}")
    return "\n".join(lines)


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
    return f"{model.name} ({model.rate}/s, {model.pre_allocated_vus}-{model.max_vus} VUs)"
