"""The two dashboards of what k6 saw (InfluxDB): of the REST targets and of the gRPC targets."""

from grafana_dashboards.dashboard import dashboard, influx_variables
from grafana_dashboards.panels import Panel, row, timeseries
from grafana_dashboards.queries import (
    Json,
    clock_buckets,
    influx,
    influx_buckets,
    per_second,
    percentile_columns,
)

HTTP_PHASES = (
    "http_req_blocked",
    "http_req_connecting",
    "http_req_tls_handshaking",
    "http_req_sending",
    "http_req_waiting",
    "http_req_receiving",
)
BY_PROTO = ("scenario", "proto")
BY_METHOD = ("scenario", "method")


# Panels on both dashboards -------------------------------------------------------------------------


def vus_panel(note: str) -> Panel:
    return timeseries(
        "Virtual users",
        f"k6 `vus`, sampled once a second. {note}",
        [influx(influx_buckets('max("value")', "vus"), "$tag_scenario")],
        width=8,
    )


def k6_data_transfer(width: int = 12) -> Panel:
    """Bytes per second k6 received and sent: the same panel on both k6 dashboards."""
    return timeseries(
        "Data transfer",
        "Bytes per second on the wire, as k6 counts them.",
        [
            per_second("data_received", "received $tag_scenario"),
            per_second("data_sent", "sent $tag_scenario"),
        ],
        "Bps",
        width,
    )


def k6_checks(width: int = 12) -> Panel:
    """The share of passed k6 checks, by check: the same panel on both k6 dashboards."""
    return timeseries(
        "Checks passed",
        "Share of passed checks, by check (1 response in CHECK_EVERY is decoded and checked).",
        [
            influx(
                influx_buckets('mean("value")', "checks", ("scenario", "check")),
                "$tag_scenario $tag_check",
            )
        ],
        "percentunit",
        width,
    )


# HTTP ----------------------------------------------------------------------------------------------


def k6_http() -> Json:
    return dashboard(
        "protolab-k6-http",
        "protolab / k6 client: HTTP",
        "What k6 saw of the REST targets (HTTP/1.1 and HTTP/2), from InfluxDB.",
        influx_variables("http_reqs"),
        [*_http_load(), *_http_errors(), *_http_latency()],
    )


def _http_load() -> list[Panel]:
    return [
        row("Load"),
        vus_panel("REST scenarios only."),
        timeseries(
            "Requests/s by protocol version",
            "Every HTTP response (`http_reqs`), per second, by negotiated protocol (`proto`).",
            [per_second("http_reqs", "$tag_scenario $tag_proto", BY_PROTO)],
            "reqps",
            8,
        ),
        timeseries(
            "Successful requests/s",
            "`protolab_reqs`: requests that passed (status 200, checks when sampled), per second. "
            "The same metric as the gRPC dashboard, so the numbers compare.",
            [per_second("protolab_reqs", "$tag_scenario")],
            "reqps",
            8,
        ),
    ]


def _http_errors() -> list[Panel]:
    return [
        row("Errors"),
        timeseries(
            "Failure rate",
            "Share of failed requests: k6's `http_req_failed` (non-2xx/3xx or network error) and "
            "protolab's `protolab_req_failed` (also counts failed checks).",
            [
                influx(
                    influx_buckets('mean("value")', "http_req_failed", BY_PROTO),
                    "http $tag_scenario $tag_proto",
                ),
                influx(influx_buckets('mean("value")', "protolab_req_failed"), "protolab $tag_scenario"),
            ],
            "percentunit",
            8,
        ),
        timeseries(
            "Responses/s by status",
            "HTTP status codes per second (status 0: no response).",
            [per_second("http_reqs", "$tag_scenario $tag_status", ("scenario", "status"))],
            "reqps",
            8,
        ),
        k6_checks(width=8),
    ]


def _phase_targets(select: str, phases: tuple[str, ...]) -> list[Json]:
    """One target per HTTP request phase, by scenario and negotiated protocol."""
    return [
        influx(
            influx_buckets(select, phase, BY_PROTO),
            f"{phase.removeprefix('http_req_')} $tag_scenario $tag_proto",
        )
        for phase in phases
    ]


def _http_latency() -> list[Panel]:
    return [
        row("Latency"),
        timeseries(
            "Latency percentiles (http_req_duration)",
            "Sending + waiting + receiving, by negotiated protocol; connection setup is excluded.",
            [
                influx(
                    influx_buckets(percentile_columns(), "http_req_duration", BY_PROTO),
                    "$tag_scenario $tag_proto $col",
                )
            ],
            "ms",
        ),
        timeseries(
            "Request phases (mean)",
            "Where the time of a request goes: blocked (waiting for a connection), connecting, TLS "
            "handshaking, sending, waiting (time to first byte) and receiving.",
            _phase_targets('mean("value")', HTTP_PHASES),
            "ms",
        ),
        timeseries(
            "Connection setup (max)",
            "The slowest blocked, connecting and TLS handshake times per bucket: reused connections "
            "report 0, so means hide the handshakes.",
            _phase_targets('max("value")', HTTP_PHASES[:3]),
            "ms",
        ),
        k6_data_transfer(),
    ]


# gRPC ----------------------------------------------------------------------------------------------


def k6_grpc() -> Json:
    return dashboard(
        "protolab-k6-grpc",
        "protolab / k6 client: gRPC",
        "What k6 saw of the gRPC targets (unary and server streaming), from InfluxDB.",
        influx_variables("grpc_req_duration"),
        [*_grpc_load(), *_grpc_errors(), *_grpc_latency(), *_grpc_streaming()],
    )


def _grpc_load() -> list[Panel]:
    return [
        row("Load"),
        vus_panel("gRPC scenarios only."),
        timeseries(
            "Successful requests/s",
            "`protolab_reqs`: unary calls or completed streams that passed, per second. k6 has no "
            "gRPC request counter; this is the same metric as on the HTTP dashboard.",
            [per_second("protolab_reqs", "$tag_scenario")],
            "reqps",
            8,
        ),
        timeseries(
            "Calls/s by gRPC status",
            "`grpc_req_duration` samples per second by status code (0 = OK).",
            [
                influx(
                    influx_buckets(
                        'count("value") * 1000 / $__interval_ms', "grpc_req_duration", ("scenario", "status")
                    ),
                    "$tag_scenario status $tag_status",
                )
            ],
            "reqps",
            8,
        ),
    ]


def _grpc_errors() -> list[Panel]:
    return [
        row("Errors"),
        timeseries(
            "Failure rate",
            "`protolab_req_failed`: share of calls or streams that failed (status, message count or checks).",
            [influx(influx_buckets('mean("value")', "protolab_req_failed"), "$tag_scenario")],
            "percentunit",
        ),
        k6_checks(),
    ]


def _grpc_latency() -> list[Panel]:
    return [
        row("Latency"),
        timeseries(
            "Latency percentiles (the lab's clock)",
            "grpc_req_duration of the calls k6 did not decode: the unary call, or the whole stream to "
            "its last message, on the wire; what the runner's results and findings use.",
            [influx(clock_buckets(percentile_columns()), "$tag_scenario $col")],
            "ms",
        ),
        timeseries(
            "Latency percentiles (grpc_req_duration)",
            "k6's own gRPC timing, by method.",
            [
                influx(
                    influx_buckets(percentile_columns((50, 90, 99)), "grpc_req_duration", BY_METHOD),
                    "$tag_scenario $tag_method $col",
                )
            ],
            "ms",
        ),
    ]


def _grpc_streaming() -> list[Panel]:
    return [
        row("Streaming"),
        timeseries(
            "Streams/s",
            "Server streams opened per second (`grpc_streams`).",
            [per_second("grpc_streams", "$tag_scenario $tag_method", BY_METHOD)],
            "reqps",
            8,
        ),
        timeseries(
            "Stream messages/s",
            "Messages received and sent on streams per second (`grpc_streams_msgs_*`).",
            [
                per_second("grpc_streams_msgs_received", "received $tag_scenario", BY_METHOD),
                per_second("grpc_streams_msgs_sent", "sent $tag_scenario", BY_METHOD),
            ],
            "short",
            8,
        ),
        k6_data_transfer(width=8),
    ]
