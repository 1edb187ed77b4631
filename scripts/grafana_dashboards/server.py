"""The two dashboards of the system under test from its own metrics (Prometheus): the service
(HTTP, CPU, memory) and the gRPC server (the go-grpc-prometheus views)."""

from grafana_dashboards.dashboard import dashboard, prom_variables
from grafana_dashboards.panels import Panel, hide_columns, row, stat, table, timeseries
from grafana_dashboards.queries import Json, prom, prom_max, prom_quantiles, prom_rate, prom_selector

HTTP_DURATION = "http_server_request_duration_seconds"
BY_VERSION = "scenario, network_protocol_version"
CPU_USED = prom_rate("protolab_cgroup_cpu_usage_seconds_total", "scenario")
CPU_QUOTA = prom_max("protolab_cgroup_cpu_limit_cores")
HANDLED = "grpc_server_handled_total"
BY_METHOD = "scenario, grpc_method"


# The service ---------------------------------------------------------------------------------------


def service() -> Json:
    return dashboard(
        "protolab-service",
        "protolab / service",
        "The system under test from its own metrics (Prometheus): requests, latency, CPU, memory.",
        prom_variables("protolab_workers"),
        [*_service_http(), *_service_cpu(), *_service_memory_and_build()],
    )


def _service_http() -> list[Panel]:
    return [
        row("HTTP"),
        timeseries(
            "Requests/s by protocol version",
            "Requests the REST services handled, by HTTP version.",
            [
                prom(
                    prom_rate(f"{HTTP_DURATION}_count", BY_VERSION),
                    "{{scenario}} HTTP/{{network_protocol_version}}",
                )
            ],
            "reqps",
            8,
        ),
        timeseries(
            "Latency quantiles",
            "Server-side request duration from the histogram, by HTTP version.",
            prom_quantiles(HTTP_DURATION, BY_VERSION, "{{scenario}} HTTP/{{network_protocol_version}}"),
            "s",
            8,
        ),
        timeseries(
            "Responses/s by status code",
            "Responses per second by HTTP status code.",
            [
                prom(
                    prom_rate(f"{HTTP_DURATION}_count", "scenario, http_response_status_code"),
                    "{{scenario}} {{http_response_status_code}}",
                )
            ],
            "reqps",
            8,
        ),
    ]


def _service_cpu() -> list[Panel]:
    return [
        row("CPU"),
        timeseries(
            "CPU used vs quota",
            "Cores the service's cgroup used, against its CPU quota (no quota line: unlimited).",
            [prom(CPU_USED, "used {{scenario}}"), prom(CPU_QUOTA, "quota {{scenario}}")],
            "short",
            6,
        ),
        timeseries(
            "CPU used / quota",
            "Share of the CPU quota in use; near 100% the service is CPU bound.",
            [prom(f"{CPU_USED} / {CPU_QUOTA}", "{{scenario}}")],
            "percentunit",
            6,
        ),
        timeseries(
            "Throttled periods",
            "Share of CFS periods in which the quota throttled the service.",
            [
                prom(
                    f"{prom_rate('protolab_cgroup_cpu_throttled_periods_total', 'scenario')}"
                    f" / {prom_rate('protolab_cgroup_cpu_periods_total', 'scenario')}",
                    "{{scenario}}",
                )
            ],
            "percentunit",
            6,
        ),
        timeseries(
            "Throttled time",
            "Seconds per second the service's threads spent throttled (summed over CPUs).",
            [prom(prom_rate("protolab_cgroup_cpu_throttled_seconds_total", "scenario"), "{{scenario}}")],
            "s",
            6,
        ),
    ]


def _service_memory_and_build() -> list[Panel]:
    return [
        row("Memory and build"),
        timeseries(
            "Memory vs limit",
            "The cgroup's memory in use and its peak, against its limit (no limit line: unlimited).",
            [
                prom(prom_max(f"protolab_cgroup_memory_{m}_bytes"), f"{m} {{{{scenario}}}}")
                for m in ("usage", "peak", "limit")
            ],
            "bytes",
            16,
        ),
        stat(
            "Workers",
            "Worker processes serving, sized from the CPU quota.",
            [prom(prom_max("protolab_workers"), "{{scenario}}")],
            width=8,
        ),
        table(
            "Build info",
            "What each scenario's service ran with.",
            # Over the whole range: the series of a stopped service are stale at its end.
            [
                prom(
                    f"last_over_time({prom_selector('protolab_build_info')}[$__range])",
                    instant=True,
                    table=True,
                )
            ],
            transformations=[hide_columns("Time", "Value", "__name__", "instance", "job")],
            height=6,
        ),
    ]


# The gRPC server -----------------------------------------------------------------------------------


def grpc_server() -> Json:
    return dashboard(
        "protolab-grpc-server",
        "protolab / gRPC server",
        "The gRPC service from its go-grpc-prometheus style metrics (Prometheus).",
        prom_variables("grpc_server_started_total"),
        [*_grpc_rpcs(), *_grpc_latency(), *_grpc_messages()],
    )


def _grpc_rpcs() -> list[Panel]:
    non_ok = prom_rate(HANDLED, BY_METHOD, 'grpc_code!="OK"')
    return [
        row("RPCs"),
        timeseries(
            "Handled RPCs/s by method and code",
            "Completed RPCs per second (a stream counts once).",
            [
                prom(
                    prom_rate(HANDLED, f"{BY_METHOD}, grpc_code"),
                    "{{scenario}} {{grpc_method}} {{grpc_code}}",
                )
            ],
            "reqps",
        ),
        timeseries(
            "Non-OK ratio",
            "Share of RPCs that ended with a code other than OK (0 when there are none).",
            [
                prom(
                    f"({non_ok} or {prom_rate(HANDLED, BY_METHOD)} * 0) / {prom_rate(HANDLED, BY_METHOD)}",
                    "{{scenario}} {{grpc_method}}",
                )
            ],
            "percentunit",
        ),
    ]


def _grpc_latency() -> list[Panel]:
    return [
        row("Latency"),
        timeseries(
            "Handling time quantiles",
            "Time from receiving the call to sending its status, by method.",
            prom_quantiles("grpc_server_handling_seconds", BY_METHOD, "{{scenario}} {{grpc_method}}"),
            "s",
        ),
        timeseries(
            "Started vs handled RPCs/s",
            "Started RPCs running ahead of handled ones means calls are queueing.",
            [
                prom(
                    prom_rate("grpc_server_started_total", BY_METHOD), "started {{scenario}} {{grpc_method}}"
                ),
                prom(prom_rate(HANDLED, BY_METHOD), "handled {{scenario}} {{grpc_method}}"),
            ],
            "reqps",
        ),
    ]


def _grpc_messages() -> list[Panel]:
    return [
        row("Messages"),
        timeseries(
            "Messages/s",
            "Messages received and sent per second, by method.",
            [
                prom(
                    prom_rate("grpc_server_msg_received_total", BY_METHOD),
                    "received {{scenario}} {{grpc_method}}",
                ),
                prom(prom_rate("grpc_server_msg_sent_total", BY_METHOD), "sent {{scenario}} {{grpc_method}}"),
            ],
        ),
        timeseries(
            "In flight",
            "RPCs started and not yet handled.",
            [
                prom(
                    f"sum by ({BY_METHOD}) ({prom_selector('grpc_server_started_total')})"
                    f" - sum by ({BY_METHOD}) ({prom_selector(HANDLED)})",
                    "{{scenario}} {{grpc_method}}",
                )
            ],
        ),
    ]
