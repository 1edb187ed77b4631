"""Unit tests: matrix.toml's [networks] (units, errors naming the key) and the emulators' tc/ip commands."""

import json
import os
import re
import sys
import textwrap
import tomllib
from collections.abc import Mapping
from ipaddress import IPv4Network
from pathlib import Path

import pytest
from labrunner.cli import run_matrix as cli
from labrunner.model.matrix import parse_matrix
from labrunner.model.schema import NetworkSpec
from labrunner.network import docker_probe, emulators
from labrunner.network.emulators import NetemEmulator, UserspaceEmulator, choose_emulator, kernel_has_netem
from labrunner.network.link_checks import LinkMeasurement
from labrunner.network.namespaces import NetworkError, namespace_names, plan_link
from labrunner.network.profiles import NetworkProfile

ISSUE_PROFILES = """
[networks.loopback]
[networks.lan]
delay = "0.25ms"
[networks.wan]
delay = "25ms"
jitter = "5ms"
[networks.lossy]
delay = "25ms"
loss = "1%"
[networks.narrow]
delay = "10ms"
rate = "10mbit"
"""
# The least a matrix file holds, so that its [networks] are all a test varies.
A_MATRIX = """
[defaults]
preset = "one"
targets = ["grpc"]
profiles = ["small"]
counts = [1]
load_models = ["closed"]
response_models = ["build"]
duration = "1s"
warmup = "0s"
repeats = 1
start_timeout = "5s"
stop_timeout = "5s"

[profiles.small]
cpus = 0.5
memory = "512m"

[targets.grpc]
service = "grpc_aio"
script = "k6/grpc_unary.js"
protocol = "grpc"
tls = false

[load_models.closed]
executor = "constant-vus"
vus = 1

[presets.one]
"""
LINK = plan_link("run1", "grpc-tls.small.c100.closed.r1")
SVC, K6 = LINK.namespaces


def _profiles(networks: str = ISSUE_PROFILES) -> Mapping[str, NetworkProfile]:
    """The profiles a matrix file with these [networks] tables runs."""
    return parse_matrix(tomllib.loads(networks + A_MATRIX), Path("matrix.toml")).networks


def _table(name: str, values: Mapping[str, object]) -> str:
    return f"[networks.{name}]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in values.items())


def test_the_issue_profiles() -> None:
    profiles = _profiles()
    assert {n: (p.rtt_s, p.jitter_s, p.loss_percent, p.rate_bps) for n, p in profiles.items()} == {
        "loopback": (0.0, 0.0, 0.0, None),
        "lan": (0.0005, 0.0, 0.0, None),
        "wan": (0.05, 0.005, 0.0, None),
        "lossy": (0.05, 0.0, 1.0, None),
        "narrow": (0.02, 0.0, 0.0, 10_000_000),
    }
    assert [n for n, p in profiles.items() if not p.emulated] == ["loopback"]


def test_the_documented_example_is_what_the_issue_asks() -> None:
    # The NetworkSpec docstring is what someone copies into matrix.toml: it must stay true.
    doc = NetworkSpec.__doc__ or ""
    example = textwrap.dedent(doc.split("::", 1)[1])
    assert _profiles(example) == _profiles()


@pytest.mark.parametrize(
    ("key", "text", "value"),
    [
        ("delay", "50ms", 0.05),
        ("delay", "0.5ms", 0.0005),
        ("delay", "250us", 0.00025),
        ("delay", "1s", 1.0),
        ("delay", " 25 MS ", 0.025),
        ("loss", "1%", 1.0),
        ("loss", "0.5%", 0.5),
        ("loss", "100%", 100.0),
        ("rate", "10mbit", 10_000_000),
        ("rate", "10Mbit", 10_000_000),
        ("rate", "512kbit", 512_000),
        ("rate", "1.5gbit", 1_500_000_000),
    ],
)
def test_units(key: str, text: str, value: float) -> None:
    table = {"delay": "1s", key: text} if key != "delay" else {key: text}
    profile = _profiles(_table("x", table))["x"]
    field = {"delay": "delay_s", "loss": "loss_percent", "rate": "rate_bps"}[key]
    assert getattr(profile, field) == pytest.approx(value)


@pytest.mark.parametrize(
    ("networks", "message"),
    [
        (_table("bad", {"delay": "-5ms"}), "[networks.bad] delay: '-5ms' must not be negative"),
        (_table("bad", {"loss": "101%"}), "[networks.bad] loss: '101%' must be between 0% and 100%"),
        (_table("bad", {"loss": "-1%"}), "[networks.bad] loss: '-1%' must not be negative"),
        (
            _table("bad", {"delay": "50xs"}),
            "[networks.bad] delay: unknown unit 'xs' in '50xs' (known: us, ms, s)",
        ),
        (
            _table("bad", {"rate": "10mbps"}),
            "[networks.bad] rate: unknown unit 'mbps' in '10mbps' (known: bit, kbit, mbit, gbit)",
        ),
        (_table("bad", {"loss": "1"}), "[networks.bad] loss: unknown unit 'none' in '1' (known: %)"),
        (_table("bad", {"delay": 50}), "[networks.bad] delay: 50 must be a string with a unit (e.g. '25ms')"),
        (
            _table("bad", {"delay": "fast"}),
            "[networks.bad] delay: 'fast' is not a number with a unit (e.g. '25ms')",
        ),
        (
            _table("bad", {"rate": "0mbit"}),
            "[networks.bad] rate: '0mbit' must be above zero (leave rate out for an unlimited link)",
        ),
        (
            _table("bad", {"delay": "1ms", "jitter": "2ms"}),
            "[networks.bad] jitter: '2ms' must not exceed delay",
        ),
        (
            _table("bad", {"dealy": "1ms"}),
            "[networks.bad]: unknown key 'dealy' (known: delay, jitter, loss, rate)",
        ),
        ('[networks."w an"]', "[networks.w an]: name must be letters, digits, '-' or '_'"),
        ('[networks]\nwan = "25ms"', "[networks.wan]: '25ms' must be a table"),
        ('networks = "wan"', "[networks]: 'wan' must be a table"),
    ],
)
def test_a_bad_network_is_reported_naming_the_table_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], networks: str, message: str
) -> None:
    # What someone running their own matrix file reads, and all they read.
    matrix = tmp_path / "matrix.toml"
    matrix.write_text(networks + A_MATRIX)  # a top-level key must come before the tables
    assert cli.main(["--matrix", str(matrix), "--dry-run"]) == 2
    assert capsys.readouterr() == ("", f"run_matrix.py: error: {message}\n")


def test_profiles_are_frozen() -> None:
    profile = _profiles()["wan"]
    with pytest.raises(AttributeError):
        profile.delay_s = 0  # type: ignore[misc]


def test_names_and_addresses_of_a_link() -> None:
    assert namespace_names("run 1", "grpc/tls") == (
        "protolab-run-1-grpc-tls-svc",
        "protolab-run-1-grpc-tls-k6",
    )
    assert (SVC, K6) == (
        "protolab-run1-grpc-tls.small.c100.closed.r1-svc",
        "protolab-run1-grpc-tls.small.c100.closed.r1-k6",
    )
    assert (LINK.service.address, LINK.client.address) == ("198.18.0.1", "198.18.0.2")
    assert max(len(LINK.service.device), len(LINK.client.device)) <= 15  # IFNAMSIZ - 1
    other = plan_link("r", "s", IPv4Network("198.19.255.252/30"))
    assert (other.service.address, other.client.address) == ("198.19.255.253", "198.19.255.254")
    for subnet in ("10.0.0.0/30", "198.18.0.0/29", "198.20.0.0/30"):
        with pytest.raises(NetworkError, match=re.escape("must be a /30 inside 198.18.0.0/15")):
            plan_link("r", "s", IPv4Network(subnet))


@pytest.fixture
def fake_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Fake `tc` and `ip` first on PATH: each appends its argv (JSON) to calls.jsonl and exits with
    FAKE_EXIT, printing FAKE_STDERR, when the command contains FAKE_FAIL_ON."""
    log = tmp_path / "calls.jsonl"
    script = textwrap.dedent(f"""\
        #!{sys.executable}
        import json, os, sys
        argv = [os.path.basename(sys.argv[0]), *sys.argv[1:]]
        with open({str(log)!r}, "a") as log:
            log.write(json.dumps(argv) + "\\n")
        if os.environ.get("FAKE_FAIL_ON", "\\0") in " ".join(argv):
            sys.stderr.write(os.environ.get("FAKE_STDERR", ""))
            sys.exit(int(os.environ.get("FAKE_EXIT", "2")))
    """)
    for tool in ("tc", "ip"):
        (tmp_path / tool).write_text(script)
        (tmp_path / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return log


def _calls(log: Path) -> list[str]:
    return [" ".join(json.loads(line)) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.parametrize(
    ("profile", "netem"),
    [
        ("lan", "netem limit 10000 delay 250us"),
        ("wan", "netem limit 10000 delay 25000us 5000us"),
        ("lossy", "netem limit 10000 delay 25000us loss 1%"),
        ("narrow", "netem limit 10000 delay 10000us"),
    ],
)
def test_netem_runs_these_tc_commands_on_both_ends(fake_tools: Path, profile: str, netem: str) -> None:
    NetemEmulator().apply(LINK, _profiles()[profile])
    expected = [
        f"tc -n {SVC} qdisc replace dev plab-svc root handle 1: {netem}",
        f"tc -n {K6} qdisc replace dev plab-k6 root handle 1: {netem}",
    ]
    if profile == "narrow":
        # 1 ms of 10 Mbit/s is 1250 bytes, less than two full frames; the queue is 64 KiB
        # (the bandwidth-delay product, 25 kB, is smaller) plus the burst.
        tbf = "parent 1:1 handle 10: tbf rate 10000000bit burst 3028 limit 68564"
        expected = [expected[0], f"tc -n {SVC} qdisc replace dev plab-svc {tbf}",
                    expected[1], f"tc -n {K6} qdisc replace dev plab-k6 {tbf}"]  # fmt: skip
    assert _calls(fake_tools) == expected


def test_netem_removes_its_qdiscs(fake_tools: Path) -> None:
    NetemEmulator().remove(LINK)
    assert _calls(fake_tools) == [
        f"tc -n {SVC} qdisc del dev plab-svc root",
        f"tc -n {K6} qdisc del dev plab-k6 root",
    ]


def test_a_failed_tc_command_fails_apply_and_cleans_up(
    fake_tools: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_FAIL_ON", f"-n {K6} qdisc replace")
    monkeypatch.setenv("FAKE_STDERR", "Error: Specified qdisc kind is unknown.")
    with pytest.raises(NetworkError, match="Specified qdisc kind is unknown"):
        NetemEmulator().apply(LINK, _profiles()["wan"])
    assert _calls(fake_tools)[-2:] == [
        f"tc -n {SVC} qdisc del dev plab-svc root",
        f"tc -n {K6} qdisc del dev plab-k6 root",
    ]


def test_permission_errors_say_root_is_needed(fake_tools: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_FAIL_ON", "qdisc")
    monkeypatch.setenv("FAKE_STDERR", "RTNETLINK answers: Operation not permitted")
    with pytest.raises(NetworkError, match=re.escape("network scenarios need root (CAP_NET_ADMIN)")):
        NetemEmulator().apply(LINK, _profiles()["wan"])


def test_no_emulator_for_a_profile_without_conditions(fake_tools: Path) -> None:
    with pytest.raises(ValueError, match="'loopback' sets no condition"):
        NetemEmulator().apply(LINK, _profiles()["loopback"])
    assert _calls(fake_tools) == []


@pytest.mark.parametrize(
    ("stderr", "exit_code", "has_netem"),
    [("", 0, True), ("Error: Specified qdisc kind is unknown.", 2, False)],
)
def test_the_netem_probe_uses_a_scratch_namespace(
    fake_tools: Path, monkeypatch: pytest.MonkeyPatch, stderr: str, exit_code: int, has_netem: bool
) -> None:
    monkeypatch.setattr(emulators, "require_net_admin", lambda: None)
    monkeypatch.setenv("FAKE_FAIL_ON", "netem")
    monkeypatch.setenv("FAKE_STDERR", stderr)
    monkeypatch.setenv("FAKE_EXIT", str(exit_code))
    kernel_has_netem.cache_clear()
    try:
        assert kernel_has_netem() is has_netem
        assert choose_emulator([1]).name == ("netem" if has_netem else "userspace")
    finally:
        kernel_has_netem.cache_clear()
    scratch = f"protolab-probe-{os.getpid()}"
    assert _calls(fake_tools) == [
        f"ip netns add {scratch}",
        f"ip -n {scratch} link add plab-probe type veth peer name plab-peer",
        f"tc -n {scratch} qdisc add dev plab-probe root netem delay 1ms",
        f"ip netns del {scratch}",
    ]


def test_userspace_routes_each_side_through_its_tun_device() -> None:
    emulator = UserspaceEmulator([1])
    commands = [" ".join(c) for c in emulator.route_commands(LINK, _profiles()["narrow"])]
    tbf = "tbf rate 10000000bit burst 3028 limit 68564"
    assert commands == [
        f"ip -n {SVC} link set plab-emu up",
        f"ip -n {SVC} route add 198.18.0.2/32 dev plab-emu src 198.18.0.1 metric 10",
        f"ip -n {SVC} route add unreachable 198.18.0.2/32 metric 1000",
        f"tc -n {SVC} qdisc replace dev plab-emu root {tbf}",
        f"ip -n {K6} link set plab-emu up",
        f"ip -n {K6} route add 198.18.0.1/32 dev plab-emu src 198.18.0.2 metric 10",
        f"ip -n {K6} route add unreachable 198.18.0.1/32 metric 1000",
        f"tc -n {K6} qdisc replace dev plab-emu root {tbf}",
    ]
    argv = emulator.relay_argv(LINK, _profiles()["wan"])
    assert argv[1:] == [
        "-m", "labrunner.network.relay", "--namespaces", SVC, K6, "--device", "plab-emu",
        "--delay-us", "25000", "--jitter-us", "5000", "--loss-percent", "0", "--limit", "10000",
        "--cpus", "1", "--parent", str(os.getpid()),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("profile", "rtt_ms", "rate_mbit", "ok"),
    [
        ("wan", 54.9, None, True),
        ("wan", 55.1, None, False),
        ("wan", 44.9, None, False),
        ("lan", 0.74, None, True),  # the absolute floor: 0.25 ms
        ("lan", 0.26, None, True),
        ("lan", 0.76, None, False),
        ("lan", 0.01, None, False),  # no emulator on the path
        ("narrow", 20.5, 9.1, True),
        ("narrow", 20.5, 8.9, False),
        ("narrow", 20.5, 11.1, False),
    ],
)
def test_verification_tolerance(profile: str, rtt_ms: float, rate_mbit: float | None, ok: bool) -> None:
    rate = rate_mbit * 1e6 if rate_mbit else None
    problems = LinkMeasurement(rtt_ms / 1000, (), rate).problems(_profiles()[profile])
    assert (problems == []) is ok, problems


@pytest.mark.parametrize(
    ("profile", "icmp_ms", "udp_ms", "problems"),
    [
        ("lossy", 50.2, None, []),  # not asked for: not checked
        ("lossy", 50.2, 54.9, []),
        ("lossy", 50.2, 55.1, ["UDP RTT 55.100 ms is more than 5.000 ms off lossy's 50.000 ms"]),
        ("lan", 0.52, 0.74, []),  # the same absolute floor: 0.25 ms
        ("lan", 0.52, 0.01, ["UDP RTT 0.010 ms is more than 0.250 ms off lan's 0.500 ms"]),
        (
            "wan",
            0.01,
            0.02,
            [
                "RTT 0.010 ms is more than 5.000 ms off wan's 50.000 ms",
                "UDP RTT 0.020 ms is more than 5.000 ms off wan's 50.000 ms",
            ],
        ),
    ],
)
def test_the_udp_rtt_is_held_to_the_same_tolerance(
    profile: str, icmp_ms: float, udp_ms: float | None, problems: list[str]
) -> None:
    udp = None if udp_ms is None else udp_ms / 1000
    measured = LinkMeasurement(icmp_ms / 1000, (), None, udp, () if udp is None else (udp,))
    assert measured.problems(_profiles()[profile]) == problems


def _arrivals(pattern: list[tuple[float, float]], start: float = 1_000.0) -> list[tuple[float, int]]:
    """Reads every millisecond of `pattern`'s (seconds, bytes per second) periods, in turn."""
    arrivals, now = [], start
    for seconds, rate in pattern:
        for _ in range(round(seconds * 1000)):
            now += 0.001
            if rate:
                arrivals.append((now, round(rate / 1000)))
    return arrivals


def test_the_rate_is_the_median_slice_so_a_stall_and_the_burst_after_it_do_not_move_it() -> None:
    steady = 1.25e6  # 10 Mbit/s
    assert docker_probe.median_slice_rate(_arrivals([(2.0, steady)]), 8) == pytest.approx(steady, rel=0.01)
    # The sender stopped for 0.1 s (nothing arrives), then a 500 kB bucket is spent in 10 ms:
    # over the whole time that is 15% above the rate.
    stalled = _arrivals([(0.8, steady), (0.1, 0), (0.01, 50e6), (1.0, steady)])
    assert sum(size for _, size in stalled[1:]) / (stalled[-1][0] - stalled[0][0]) > 1.1 * steady
    assert docker_probe.median_slice_rate(stalled, 8) == pytest.approx(steady, rel=0.01)
    with pytest.raises(RuntimeError, match="3 reads to count, too few"):
        docker_probe.median_slice_rate(_arrivals([(0.003, steady)]), 8)
