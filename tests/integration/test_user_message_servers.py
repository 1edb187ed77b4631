"""The user's own message served by every lab stack over real sockets (--proto, issue 38 item 2): each
server started with SHAPE=proto and the run's SHAPE_DIR passes the runner's check before measuring
(run/service_checks.verify: its bytes decode into the pool's records, by canonical checksum; an upload's
reply holds the records' checksum), every server the same checksums; bad input gets a 400 with a JSON
body naming the place, or INVALID_ARGUMENT, never a 500 or UNKNOWN."""

import re
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from labrunner.model.matrix import expand, load_matrix
from labrunner.model.scenario import DEFAULT_DIRECTION, UPLOAD, USER_SHAPE, Overrides, Scenario
from labrunner.run.service_checks import verify
from labrunner.run.uploads import upload_body
from labrunner.run.user_proto import prepare

from services.common import user_message
from services.common.user_message import Generator, UserMessage
from tests.support import CERTS, ROOT, RunningService, launch_service, service_handle

COUNT = 10
CA_FILE = CERTS / "ca.pem"
TARGETS = ("aiohttp-h1", "quart-h1", "granian-h1", "grpc", "grpclib")
CHECKSUM = re.compile(r"the pool's records \(canonical checksum ([0-9a-f]{8})\)")
# Sockets on ephemeral ports, its own files, no CPU measured: beside other tests (tests/conftest.py).
pytestmark = [pytest.mark.timeout(300), pytest.mark.parallel]


@pytest.fixture(scope="module", autouse=True)
def _built_in_shapes_after() -> Iterator[None]:
    """This module installs the user's message in its worker process; the modules after it there
    (the docker flow's containers among them) must see the built-in shapes only."""
    yield
    user_message.uninstall()


@pytest.fixture(scope="module")
def user(tmp_path_factory: pytest.TempPathFactory) -> UserMessage:
    return prepare(
        ROOT / "tests" / "fixtures" / "user_proto" / "weather.proto",
        "weather.v1.Observation",
        None,
        directory=tmp_path_factory.mktemp("shape"),
        lab_proto_dir=ROOT / "proto",
        generator=Generator(),
    )


def _scenario(target: str, direction: str) -> Scenario:
    overrides = Overrides(
        targets=(target,), counts=(COUNT,), directions=(direction,), shapes=(USER_SHAPE,), repeats=1
    )
    (scenario,) = expand(load_matrix(ROOT / "matrix.toml"), "local", "upload", overrides).scenarios
    return scenario


def test_every_stack_serves_the_message_with_the_same_records(
    user: UserMessage, started: list[RunningService], tmp_path: Path
) -> None:
    checksums: dict[str, set[str]] = {}
    for target in TARGETS:
        download, upload = _scenario(target, DEFAULT_DIRECTION), _scenario(target, UPLOAD)
        env = {**dict(download.target.env), "SHAPE": USER_SHAPE, "SHAPE_DIR": str(user.directory)}
        service = launch_service(download.target.service, env)
        started.append(service)
        verification = verify(service_handle(download, service), download, CA_FILE)
        assert verification.ok, (target, verification.failures)
        checksums[target] = {m[1] for check in verification.checks if (m := CHECKSUM.search(check))}
        body = upload_body(tmp_path, upload)
        assert body is not None
        verification = verify(service_handle(upload, service), upload, CA_FILE, body)
        assert verification.ok, (target, verification.failures)
        _bad_input(target, service, user)
    assert len(set().union(*checksums.values())) == 1, checksums
    assert all(checksums.values())


def _bad_input(target: str, service: RunningService, user: UserMessage) -> None:
    address = f"127.0.0.1:{service.port}"
    if not target.startswith(("grpc", "grpclib")):
        response = httpx.post(
            f"http://{address}/records",
            content=b'{"records": [{"sky": "FOGGY"}]}',
            headers={"content-type": "application/json"},
        )
        assert response.status_code == 400, (target, response.text)
        assert response.json()["error"].startswith("records[0].sky: expected one of"), target
        return
    name = f"/{user.shape.service.full_name}/CreateRecords"
    with grpc.insecure_channel(address) as channel:
        create: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
            name, request_serializer=None, response_deserializer=None
        )
        with pytest.raises(grpc.RpcError) as refused:
            create(b"\x0a\x03\xff\xff\xff", timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, target
