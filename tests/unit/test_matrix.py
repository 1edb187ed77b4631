"""Unit tests: matrix loading, expansion, overrides, validation errors, the k6 invocation, dry-run."""

import copy
import re
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from labrunner.backends.base import Endpoint, ServiceHandle
from labrunner.backends.cgroups import split_cpus
from labrunner.cli import run_matrix as cli
from labrunner.model.matrix import expand, load_matrix, parse_matrix, split_list
from labrunner.model.scenario import Overrides, format_duration
from labrunner.model.schema import MatrixError
from labrunner.run.k6.invocation import K6Setup

from tests.support import ALL_TARGETS, FLOOR_TARGETS, IMPLEMENTATION_TARGETS, LAB_TARGETS, ROOT

MATRIX = ROOT / "matrix.toml"


@pytest.fixture(scope="module")
def matrix_data() -> dict[str, Any]:
    return tomllib.loads(MATRIX.read_text())


# The servers with a metrics-off twin: each stack the lab measures, over HTTP/1.1 or gRPC (its lab
# target, the one its floor copies).
INSTRUMENTED = LAB_TARGETS


# matrix.toml's units, read here by hand: memory docker-style in binary units.
MEMORY_UNITS = {"k": 2**10, "m": 2**20, "g": 2**30}


def _memory_bytes(text: str) -> int:
    return round(float(text[:-1]) * MEMORY_UNITS[text[-1].lower()])


def test_repo_matrix_profiles_are_the_files_tables(matrix_data: dict[str, Any]) -> None:
    """Every [profiles.*] table of the file loads, in its order, with its CPUs and memory."""
    profiles = load_matrix(MATRIX).profiles
    tables = matrix_data["profiles"]
    assert tables and list(profiles) == list(tables)
    for name, table in tables.items():
        assert set(table) == {"cpus", "memory"}, name  # what a profile is: nothing the loader may drop
        assert profiles[name].name == name
        assert profiles[name].cpus == float(table["cpus"]) > 0, name
        assert profiles[name].memory_bytes == _memory_bytes(table["memory"]) > 0, name


def test_repo_matrix_targets_are_the_files_tables(matrix_data: dict[str, Any]) -> None:
    """Every [targets.*] table loads, in its order, each key it sets carried onto the target."""
    matrix = load_matrix(MATRIX)
    tables = matrix_data["targets"]
    assert tables and list(matrix.targets) == list(tables)
    for name, table in tables.items():
        target = matrix.targets[name]
        assert target.name == name
        for key, value in table.items():
            loaded = getattr(target, key)
            assert (dict(loaded) if key == "env" else loaded) == value, (name, key)
        assert (ROOT / target.script).is_file(), target.script
        assert (target.expect_proto is None) == (target.protocol == "grpc"), name  # REST only
        if "ALPN_PROTOCOLS" in dict(target.env):  # a REST server offering one protocol, the one expected
            alpn = {"h2": "HTTP/2.0", "http/1.1": "HTTP/1.1"}[dict(target.env)["ALPN_PROTOCOLS"]]
            assert target.tls and target.expect_proto == alpn, name
    # The tests' own lists of targets (tests/support.py) are the file's.
    assert list(ALL_TARGETS) == matrix_data["defaults"]["targets"]
    assert list(FLOOR_TARGETS) == [name for name in tables if name.startswith("floor-")]
    assert set(IMPLEMENTATION_TARGETS) <= set(tables)
    assert matrix.targets["grpc-stream"].script == "k6/grpc_stream.js"
    # Each instrumented server has a twin with metrics off and nothing else changed.
    for name in INSTRUMENTED:
        assert f"{name}-nometrics" in matrix.targets, f"{name} has no metrics-off twin {name}-nometrics"
        twin = matrix.targets[f"{name}-nometrics"]
        assert dict(twin.env) == {"METRICS_ENABLED": "0"}
        assert replace(twin, name=name, env=()) == replace(matrix.targets[name], env=()), name


def test_default_preset_depends_on_backend() -> None:
    matrix = load_matrix(MATRIX)
    local = expand(matrix, "local")
    docker = expand(matrix, "docker")
    # Interleaved repeats: every target once per round, repeats outermost; the ladders' rounds
    # after every closed round (tests/unit/test_ladder.py holds the ladders).
    closed = [s for s in local.scenarios if s.load_model.name == "closed"]
    assert [s.target.name for s in closed] == list(ALL_TARGETS) * 3
    assert [s.repeat for s in closed[:: len(ALL_TARGETS)]] == [1, 2, 3]
    assert local.scenarios[: len(closed)] == tuple(closed)
    assert {s.load_model.rung.ladder for s in local.scenarios[len(closed) :] if s.load_model.rung} == {
        "loaded",
        "loaded-stream",
    }
    assert {s.profile.name for s in local.scenarios} == {"quarter"}
    assert {s.profile.name for s in docker.scenarios} == {"p1"}
    assert {(s.count, s.duration_s, s.warmup_s) for s in local.scenarios} == {(100, 5.0, 1.0)}
    assert {s.repeats for s in closed} == {3} and {s.repeats for s in local.scenarios} == {1, 3}


def test_ci_preset_is_short_and_small() -> None:
    plan = expand(load_matrix(MATRIX), "local", "ci")
    assert len(plan.scenarios) == len(ALL_TARGETS)
    assert {(s.profile.name, s.duration_s, s.warmup_s) for s in plan.scenarios} == {("small", 3.0, 1.0)}
    assert plan.estimated_seconds == 8 * 4.0


def test_overrides_filter_and_multiply_with_repeats_outermost() -> None:
    overrides = Overrides(
        targets=split_list(["quart-h1,quart-*-tls", "grpc"]),
        counts=(100, 10),
        repeats=2,
        duration="1m30s",
        warmup="0",
    )
    overrides = replace(overrides, load_models=("closed",))
    plan = expand(load_matrix(MATRIX), "docker", "default", overrides)
    ids = [s.id for s in plan.scenarios]
    assert len(ids) == 4 * 2 * 2
    assert ids[:5] == [
        "quart-h1.p1.c10.closed.r1",
        "quart-h1-tls.p1.c10.closed.r1",
        "quart-h2-tls.p1.c10.closed.r1",
        "grpc.p1.c10.closed.r1",
        "quart-h1.p1.c100.closed.r1",
    ]
    assert all(s.repeat == 1 for s in plan.scenarios[:8]) and all(s.repeat == 2 for s in plan.scenarios[8:])
    assert {(s.duration_s, s.warmup_s) for s in plan.scenarios} == {(90.0, 0.0)}
    assert plan.scenarios[0].group == "quart-h1.p1.c10.closed"


def test_response_models_multiply_and_a_target_can_pin_one(matrix_data: dict[str, Any]) -> None:
    overrides = Overrides(targets=("grpc", "aiohttp-h1"), response_models=("build", "prebuilt"))
    plan = expand(load_matrix(MATRIX), "local", "ci", overrides)
    assert [(s.target.name, s.response_model) for s in plan.scenarios] == [
        ("aiohttp-h1", "build"),
        ("grpc", "build"),
        ("aiohttp-h1", "prebuilt"),
        ("grpc", "prebuilt"),
    ]
    # The default model keeps the group ids of runs made before the models existed.
    assert [s.group for s in plan.scenarios][::2] == [
        "aiohttp-h1.small.c100.closed",
        "aiohttp-h1.small.c100.closed.prebuilt",
    ]
    data = copy.deepcopy(matrix_data)
    data["targets"]["grpc"]["response_model"] = "prebuilt"
    pinned = expand(parse_matrix(data, MATRIX), "local", "ci", overrides)
    assert [(s.target.name, s.response_model) for s in pinned.scenarios if s.target.name == "grpc"] == [
        ("grpc", "prebuilt")
    ]
    data["targets"]["grpc"]["response_model"] = "cached"
    with pytest.raises(
        MatrixError, match=r"\[targets.grpc\] response_model: 'cached' must be one of 'build' or 'prebuilt'"
    ):
        parse_matrix(data, MATRIX)


def test_a_load_model_with_fewer_repeats_is_a_follow_up_of_the_first_rounds() -> None:
    selection = Overrides(targets=("grpc",), load_models=("closed", "equal-load"), repeats=3)
    plan = expand(load_matrix(MATRIX), "local", "default", selection)
    runs = [(s.load_model.name, s.repeat, s.repeats) for s in plan.scenarios]
    assert runs == [
        ("closed", 1, 3),
        ("equal-load", 1, 2),
        ("closed", 2, 3),
        ("equal-load", 2, 2),
        ("closed", 3, 3),
    ]
    # Never more than the preset's: --repeats 1 runs each model once.
    once = expand(load_matrix(MATRIX), "local", "default", replace(selection, repeats=1))
    assert [(s.load_model.name, s.repeats) for s in once.scenarios] == [("closed", 1), ("equal-load", 1)]


def test_vus_and_rate_overrides_touch_only_their_executors() -> None:
    plan = expand(
        load_matrix(MATRIX),
        "local",
        overrides=Overrides(targets=("grpc",), load_models=("closed", "ramp", "open"), vus=64, rate=500),
    )
    models = {s.load_model.name: s.load_model for s in plan.scenarios}
    assert models["closed"].vus == 64
    assert models["open"].rate == 500 and models["open"].vus is None
    assert models["ramp"].vus is None
    assert plan.scenarios[1].measured_seconds == 30.0  # the ramp's stages, not --duration


def test_split_list_flattens_commas_and_repeats() -> None:
    assert split_list(["a,b", " c ", "d,,"]) == ("a", "b", "c", "d")
    assert split_list(None) is None


def test_format_duration_round_trips() -> None:
    assert [format_duration(s) for s in (30.0, 0.5, 90.0)] == ["30s", "500ms", "90s"]


def _mutated(data: dict[str, Any], path: str, value: object) -> dict[str, Any]:
    data = copy.deepcopy(data)
    *parents, key = path.split("/")
    node = data
    for parent in parents:
        node = node.setdefault(parent, {})
    if value is None:
        del node[key]
    else:
        node[key] = value
    return data


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("500ms", 0.5), ("30s", 30.0), ("1m30s", 90.0), ("2h", 7200.0), ("3", 3.0), (0, 0.0)],
)
def test_durations_in_the_file(matrix_data: dict[str, Any], text: object, seconds: float) -> None:
    matrix = parse_matrix(_mutated(matrix_data, "presets/ci/warmup", text), MATRIX)
    assert {s.warmup_s for s in expand(matrix, "local", "ci").scenarios} == {seconds}


@pytest.mark.parametrize("bad", ["3 s", "s", "-1s", "1x", True, -2])
def test_durations_that_are_not(matrix_data: dict[str, Any], bad: object) -> None:
    with pytest.raises(MatrixError, match=r"^\[presets.ci\] warmup: .* is not a duration"):
        parse_matrix(_mutated(matrix_data, "presets/ci/warmup", bad), MATRIX)


@pytest.mark.parametrize(
    ("size", "size_bytes"), [("512m", 512 * 2**20), ("2g", 2 * 2**30), ("1.5G", 3 * 2**29), (1024, 1024)]
)
def test_memory_sizes_in_the_file(matrix_data: dict[str, Any], size: object, size_bytes: int) -> None:
    matrix = parse_matrix(_mutated(matrix_data, "profiles/small/memory", size), MATRIX)
    assert matrix.profiles["small"].memory_bytes == size_bytes


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("targets/grpc/tsl", True, r"\[targets.grpc\]: unknown key 'tsl'"),
        ("targets/quart-h2-tls/tls", False, "http2 needs tls = true"),
        ("targets/quart-h1/expect_proto", "HTTP/2.0", "must be 'HTTP/1.1' for http1.1"),
        ("targets/grpc/expect_proto", "HTTP/2.0", "only REST targets"),
        ("targets/grpc/protocol", "h3", "protocol: 'h3' must be one of"),
        ("targets/grpc/service", "grpc-aio", "must be a services/ package name"),
        ("targets/grpc/env", {"X": 1}, r"\[targets.grpc\] env X: 1 must be a valid string"),
        ("targets/bad name", {}, "name must be letters"),
        ("profiles/small/memory", "lots", r"\[profiles.small\] memory: 'lots' is not a memory size"),
        ("profiles/small/cpus", 0, "must be a positive number"),
        ("profiles/small/memory", None, "missing key 'memory'"),
        ("load_models/closed/executor", "per-vu", "executor: 'per-vu' must be one of"),
        ("load_models/closed/rate", 5, r"\[load_models.closed\]: unknown key 'rate'"),
        ("load_models/ramp/stages", [], "must list at least one stage"),
        ("load_models/ramp/stages", [{"duration": "5s"}], "missing key 'target'"),
        ("load_models/open/max_vus", 5, "max_vus must be >= pre_allocated_vus"),
        ("load_models/equal-load/repeats", 0, r"\[load_models.equal-load\] repeats: 0 must be a positive"),
        ("presets/ci/profiles", ["tiny"], "preset 'ci' .*unknown profile 'tiny'"),
        ("presets/ci/duration", "soon", r"\[presets.ci\] duration: 'soon' is not a duration"),
        ("presets/ci/counts", [0], r"\[presets.ci\] counts\[0\]: 0 must be a positive integer"),
        ("presets/ci/local", {"vus": 3}, r"\[presets.ci.local\]: unknown key 'vus'"),
        ("defaults/preset", "nightly", "preset = 'nightly' is not a"),
        ("defaults/duration", None, "'duration' is not set"),
        ("extra", {}, "unknown key 'extra'"),
    ],
)
def test_validation_errors_name_the_place(
    matrix_data: dict[str, Any], path: str, value: object, message: str
) -> None:
    with pytest.raises(MatrixError, match=message):
        parse_matrix(_mutated(matrix_data, path, value), MATRIX)


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        # A wrong key.
        ("profiles/small/cpu", 1, r"^\[profiles.small\]: unknown key 'cpu' \(known: cpus, memory\)$"),
        ("load_models/capacity/search/slo", "1s", r"^\[load_models.capacity\] search: unknown key 'slo'"),
        ("defaults/local/duraton", "3s", r"^\[defaults.local\]: unknown key 'duraton'"),
        # A wrong type.
        ("targets/grpc/tls", "yes", r"^\[targets.grpc\] tls: 'yes' must be a valid boolean$"),
        ("load_models/closed/vus", "10", r"^\[load_models.closed\] vus: '10' must be a valid integer$"),
        ("presets/ci/repeats", 1.5, r"^\[presets.ci\] repeats: 1.5 must be a valid integer$"),
        ("load_models/capacity/search", 1, r"^\[load_models.capacity\] search: 1 must be a table$"),
        # A wrong unit.
        ("profiles/p1/memory", "2x", r"^\[profiles.p1\] memory: '2x' is not a memory size"),
        ("presets/ci/warmup", "1sec", r"^\[presets.ci\] warmup: '1sec' is not a duration"),
        ("load_models/capacity/search/slo_p99", "1us", r"^\[load_models.capacity\] search slo_p99: '1us'"),
    ],
)
def test_wrong_key_type_or_unit_names_table_and_key(
    matrix_data: dict[str, Any], path: str, value: object, message: str
) -> None:
    with pytest.raises(MatrixError, match=message):
        parse_matrix(_mutated(matrix_data, path, value), MATRIX)


def test_unknown_names_on_the_command_line() -> None:
    matrix = load_matrix(MATRIX)
    with pytest.raises(MatrixError, match=r"unknown target 'quic' .*known: aiohttp-h1"):
        expand(matrix, "local", overrides=Overrides(targets=("quic",)))
    with pytest.raises(MatrixError, match="unknown preset 'nightly'"):
        expand(matrix, "local", "nightly")
    with pytest.raises(MatrixError, match="--vus: 0 must be a positive integer"):
        expand(matrix, "local", overrides=Overrides(vus=0))


def test_split_cpus_gives_k6_the_rest_or_shares() -> None:
    assert split_cpus([0, 1, 2, 3], 1) == split_cpus([3, 1, 2, 0], 1)
    split = split_cpus([0, 1, 2, 3], 2)
    assert (split.service, split.k6, split.shared) == ((2, 3), (0, 1), False)
    shared = split_cpus([0, 1], 2)
    assert (shared.service, shared.k6, shared.shared) == ((0, 1), (0, 1), True)


def _handle(port: int = 8443) -> ServiceHandle:
    address = Endpoint("127.0.0.1", port)
    return ServiceHandle("s", "rest_quart", address, address, None, None, 1, "cgroup-v1", (1,), (0,))


@pytest.mark.parametrize("warmup", [False, True])
def test_k6_invocation_for_rest_h1_tls(tmp_path: Path, warmup: bool) -> None:
    plan = expand(load_matrix(MATRIX), "local", "ci", Overrides(targets=("quart-h1-tls",)))
    scenario = plan.scenarios[0]
    setup = K6Setup(
        scenario,
        _handle(),
        run_id="r1",
        root=ROOT,
        ca_file=tmp_path / "ca.pem",
        k6_dir=tmp_path,
        log_file=tmp_path / "k6.log",
        influxdb_url="http://127.0.0.1:8086/",
    )
    invocation = setup.warmup() if warmup else setup.window()
    env = invocation.env
    assert env["BASE_URL"] == "https://127.0.0.1:8443"
    assert env["EXPECT_PROTO"] == "HTTP/1.1"
    assert env["GODEBUG"] == "http2client=0"
    assert env["SSL_CERT_FILE"] == str(tmp_path / "ca.pem")
    assert env["K6_NO_USAGE_REPORT"] == "true"
    assert env["SUMMARY_FILE"] == str(tmp_path / f"{scenario.id}.{'warmup' if warmup else 'measure'}.json")
    assert (env["LOAD_MODEL"], env["VUS"], env["COUNT"]) == ("constant-vus", "10", "100")
    assert env["DURATION"] == ("1s" if warmup else "3s")
    args = list(invocation.args)
    tags = [args[i + 1] for i, a in enumerate(args) if a == "--tag"]
    assert tags == [
        "run=r1",
        f"scenario={scenario.id}",
        "target=quart-h1-tls",
        "protocol=http1.1",
        "profile=small",
        "connections=10x1",
        "churn=never",
        "compression=identity",
    ]
    outs = [args[i + 1] for i, a in enumerate(args) if a == "--out"]
    assert outs == ([] if warmup else ["influxdb=http://127.0.0.1:8086/myk6db"])
    assert invocation.script == ROOT / "k6" / "rest.js"


def test_k6_invocation_for_grpc_and_ramp_warmup(tmp_path: Path) -> None:
    overrides = Overrides(targets=("grpc",), load_models=("ramp",))
    scenario = expand(load_matrix(MATRIX), "local", "ci", overrides).scenarios[0]
    setup = K6Setup(
        scenario,
        _handle(50051),
        run_id="r1",
        root=ROOT,
        ca_file=tmp_path / "ca.pem",
        k6_dir=tmp_path,
        log_file=tmp_path / "k6.log",
        influxdb_url=None,
    )
    measured = setup.window().env
    assert measured["GRPC_ADDR"] == "127.0.0.1:50051"
    assert measured["PROTO_DIR"] == str(ROOT / "proto")
    assert measured["TLS"] == "0"
    assert "GODEBUG" not in measured and "SSL_CERT_FILE" not in measured and "BASE_URL" not in measured
    assert (measured["LOAD_MODEL"], measured["STAGES"]) == ("ramping-vus", "5s:10,20s:10,5s:0")
    warm = setup.warmup().env
    assert (warm["LOAD_MODEL"], warm["VUS"], warm["DURATION"]) == ("constant-vus", "10", "1s")


def test_dry_run_prints_every_scenario_in_the_order_its_seed_runs(capsys: pytest.CaptureFixture[str]) -> None:
    selection = ["--dry-run", "--preset", "ci", "--backend", "local", "--count", "10,100", "--seed", "5"]
    assert cli.main(selection) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("backend: local")
    # Two small profiles (0.5 CPU each) do not fit on one service CPU: no duet, said once.
    assert out[1].startswith("duet: profile small's two quotas (1 CPUs) exceed 80% of its 1 service CPU")
    assert out[2].split()[:3] == ["#", "scenario", "service"]
    rows = out[3:-2]
    plan = expand(load_matrix(MATRIX), "local", "ci", Overrides(counts=(10, 100)))
    assert [row.split()[1] for row in rows] == [s.id for s in replace(plan, seed=5).run_order]
    assert [row.split()[0] for row in rows] == [str(i) for i in range(1, 17)]
    assert out[-2].startswith("16 scenarios from matrix.toml preset 'ci'; k6 time 1m04s")
    assert out[-1] == "each round shuffled by seed 5: --seed 5 runs this order"
    # The same seed, the same order; without one, a fresh seed is said.
    assert cli.main(selection) == 0
    assert capsys.readouterr().out.splitlines()[3:-2] == rows
    assert cli.main(selection[:-2]) == 0
    assert re.fullmatch(
        r"each round shuffled by seed \d+: --seed \d+ runs this order",
        capsys.readouterr().out.splitlines()[-1],
    )


def test_cli_reports_bad_selection(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--dry-run", "--target", "nope"]) == 2
    assert "unknown target 'nope'" in capsys.readouterr().err
    assert cli.main(["--dry-run", "--count", "ten"]) == 2
    assert "--count takes integers" in capsys.readouterr().err


def test_help_documents_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for option in (
        "--backend",
        "--matrix",
        "--preset",
        "--profile",
        "--target",
        "--count",
        "--load-model",
        "--response-model",
        "--vus",
        "--rate",
        "--duration",
        "--warmup",
        "--repeats",
        "--seed",
        "--out",
        "--dry-run",
        "--resume",
        "--run-id",
        "--influxdb",
        "--prometheus-targets",
        "--k6",
        "--list",
        "--certs",
    ):
        assert option in text, option
    assert "{auto,docker,local}" in text


def test_list_shows_the_matrix(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--list"]) == 0
    text = capsys.readouterr().out
    assert all(name in text for name in ALL_TARGETS)
    assert re.search(r"\n  small +0\.5 CPUs +512 MiB\n", text)


def test_implementations_preset_pairs_servers_at_equal_protocol() -> None:
    matrix = load_matrix(MATRIX)
    # The second implementations take the first one's settings: the same app or messages, ALPN.
    for first, second in (("quart-h1-tls", "granian-h1-tls"), ("quart-h2-tls", "granian-h2-tls")):
        one, other = matrix.targets[first], matrix.targets[second]
        assert (one.protocol, one.tls, one.expect_proto, one.env) == (
            other.protocol,
            other.tls,
            other.expect_proto,
            other.env,
        )
    assert matrix.targets["grpclib"].script == matrix.targets["grpc"].script == "k6/grpc_unary.js"
    for backend in ("local", "docker"):
        plan = expand(matrix, backend, "implementations")
        assert {s.profile.name for s in plan.scenarios} == {"quarter"}
        assert {s.repeat for s in plan.scenarios} == {1, 2, 3}
    targets = [s.target.name for s in plan.scenarios if s.repeat == 1]
    assert sorted(targets) == sorted([
        "aiohttp-h1", "quart-h1-tls", "quart-h2-tls", "granian-h1", "granian-h1-tls", "granian-h2-tls",
        "grpc", "grpclib",
    ])  # fmt: skip
    # Not in the presets every run and CI take.
    for preset in ("default", "ci"):
        names = {s.target.name for s in expand(matrix, "local", preset).scenarios}
        assert names.isdisjoint(IMPLEMENTATION_TARGETS), preset


def test_metrics_overhead_preset_runs_at_a_quarter_cpu_locally() -> None:
    # At 0.5 CPU aiohttp comes close to what k6 on one CPU sends: the comparison would
    # measure k6. A quarter of a CPU keeps every server the bottleneck.
    matrix = load_matrix(MATRIX)
    local = expand(matrix, "local", "metrics-overhead")
    assert {s.profile.name for s in local.scenarios} == {"quarter"}
    assert {s.profile.name for s in expand(matrix, "docker", "metrics-overhead").scenarios} == {"p1"}
    assert {s.repeat for s in local.scenarios} == {1, 2, 3, 4, 5}
    # Every server the lab measures, with its metrics on and off.
    assert {s.target.name for s in local.scenarios} == {
        *INSTRUMENTED,
        *(f"{t}-nometrics" for t in INSTRUMENTED),
    }


def test_a_preset_sets_precision_and_budget_which_the_plan_carries(matrix_data: dict[str, Any]) -> None:
    matrix = parse_matrix(matrix_data, MATRIX)
    default = expand(matrix, "local", "default")
    assert (default.precision, default.budget_s) == (pytest.approx(0.05), 270.0)
    ci = expand(matrix, "local", "ci")  # no precision of its own: none, and --budget's 20 minutes
    assert (ci.precision, ci.budget_s) == (None, 1200.0)
    sharper = parse_matrix(_mutated(matrix_data, "presets/ci/precision", "0.5%"), MATRIX)
    assert expand(sharper, "local", "ci").precision == pytest.approx(0.005)


@pytest.mark.parametrize("bad", ["0%", "100%", "120%"])
def test_a_precision_that_is_no_share(matrix_data: dict[str, Any], bad: str) -> None:
    message = r"^\[presets.ci\] precision: .* must be (above 0% and below|between 0% and) 100%"
    with pytest.raises(MatrixError, match=message):
        parse_matrix(_mutated(matrix_data, "presets/ci/precision", bad), MATRIX)
