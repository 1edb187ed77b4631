"""Container health check: exit 0 when the service in this container reports SERVING, 1 otherwise.

Usage: python -m services.common.healthcheck [--protocol http|grpc] [--port N] [--timeout S]

REST services answer GET /healthz, gRPC services the standard grpc.health.v1 Health/Check.
Defaults come from the container's own environment: PORT, HOST, TLS_CERT_FILE (TLS is verified
against ca.pem beside the server certificate, the layout scripts/gen_certs.py writes) and
PROTOLAB_SERVICE (a `grpc_*` implementation speaks gRPC, every other one HTTP). Slim images
have no curl, and this check runs inside the SUT's cgroup, so it stays a short stdlib request.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import urllib.error
import urllib.request
from pathlib import Path

DEFAULT_TIMEOUT_SECONDS = 3.0
_WILDCARD_HOSTS = {"", "0.0.0.0", "::"}


class HealthCheckError(RuntimeError):
    """The service did not report SERVING."""


def connect_host(host: str) -> str:
    """Address to reach a service bound to host: loopback when it listens on every interface."""
    return "127.0.0.1" if host in _WILDCARD_HOSTS else host


def _authority(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def check_http(host: str, port: int, ca_file: Path | None, timeout: float) -> None:
    """GET /healthz must answer 200 with {"status": "SERVING"}."""
    url = f"{'https' if ca_file else 'http'}://{_authority(host, port)}/healthz"
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]  # never via *_proxy
    if ca_file:
        handlers.append(urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=ca_file)))
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(url, timeout=timeout) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as exc:  # 503 {"status": "NOT_SERVING"} lands here
        raise HealthCheckError(f"GET {url}: HTTP {exc.code}") from None
    except (OSError, ValueError) as exc:
        raise HealthCheckError(f"GET {url}: {exc}") from None
    status = body.get("status") if isinstance(body, dict) else None
    if status != "SERVING":
        raise HealthCheckError(f"GET {url}: status {status!r}")


def check_grpc(host: str, port: int, ca_file: Path | None, timeout: float) -> None:
    """grpc.health.v1.Health/Check for the whole server (service "") must answer SERVING."""
    # Imported here so HTTP checks do not pay for loading grpc inside the SUT's CPU budget.
    import grpc  # noqa: PLC0415
    from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: PLC0415

    target = _authority(host, port)
    options = [("grpc.enable_http_proxy", 0)]
    if ca_file:
        credentials = grpc.ssl_channel_credentials(root_certificates=ca_file.read_bytes())
        channel = grpc.secure_channel(target, credentials, options=options)
    else:
        channel = grpc.insecure_channel(target, options=options)
    with channel:
        try:
            # types-grpcio-health-checking declares HealthStub without its methods.
            response = health_pb2_grpc.HealthStub(channel).Check(  # type: ignore[attr-defined]
                health_pb2.HealthCheckRequest(service=""), timeout=timeout
            )
        except grpc.RpcError as exc:
            raise HealthCheckError(f"grpc.health.v1.Health/Check {target}: {exc.code().name}") from None
    if response.status != health_pb2.HealthCheckResponse.SERVING:
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
        raise HealthCheckError(f"grpc.health.v1.Health/Check {target}: {status}")


def _default_protocol() -> str:
    return "grpc" if os.environ.get("PROTOLAB_SERVICE", "").startswith("grpc_") else "http"


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m services.common.healthcheck", description=__doc__)
    parser.add_argument("--protocol", choices=("http", "grpc"), default=_default_protocol())
    parser.add_argument("--port", type=int, default=None, help="default: $PORT")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_SECONDS, help="seconds")
    parser.add_argument("--ca-file", type=Path, default=None, help="default: ca.pem beside $TLS_CERT_FILE")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run one check; print why it failed (Docker keeps the output in the health log)."""
    args = _parse_args(argv)
    port = args.port if args.port is not None else int(os.environ.get("PORT", "0") or 0)
    if port <= 0:
        print("healthcheck: no port (set PORT or pass --port)", file=sys.stderr)
        return 1
    cert_file = os.environ.get("TLS_CERT_FILE", "").strip()
    ca_file = args.ca_file or (Path(cert_file).with_name("ca.pem") if cert_file else None)
    host = connect_host(os.environ.get("HOST", "").strip())
    check = check_grpc if args.protocol == "grpc" else check_http
    try:
        check(host, port, ca_file, args.timeout)
    except (HealthCheckError, OSError) as exc:  # OSError: an unreadable CA file
        print(f"healthcheck: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
