"""Worker counts from the cgroup CPU quota: fake v1/v2 trees, and a real v1 cgroup where one can be made."""

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.common.cgroup import own_cgroup, worker_count
from tests.support import launch_service

# Sockets on ephemeral ports, its own files, no CPU measured: beside other tests (tests/conftest.py).
pytestmark = pytest.mark.parallel

AFFINITY = len(os.sched_getaffinity(0))


def _proc_cgroup(tmp_path: Path, lines: list[str]) -> Path:
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("\n".join(lines) + "\n")
    return proc


def _v1(tmp_path: Path, quota: int, period: int, mount: str = "cpu", path: str = "/lab/svc") -> Path:
    """A cgroup v1 tree whose process sits at path; returns /proc/self/cgroup."""
    root = tmp_path / "cgroup"
    cpu = root / mount / path.lstrip("/")
    cpu.mkdir(parents=True)
    (cpu / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (cpu / "cpu.cfs_period_us").write_text(f"{period}\n")
    controllers = "cpu,cpuacct" if mount == "cpu,cpuacct" else "cpu"
    return _proc_cgroup(tmp_path, [f"4:memory:{path}", f"2:{controllers}:{path}", "0::/"])


def _v2(tmp_path: Path, cpu_max: str, path: str = "/lab.slice/svc.scope") -> Path:
    root = tmp_path / "cgroup"
    group = root / path.lstrip("/")
    group.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (group / "cpu.max").write_text(f"{cpu_max}\n")
    return _proc_cgroup(tmp_path, [f"0::{path}"])


def test_v1_quota_is_rounded_up(tmp_path: Path) -> None:
    proc = _v1(tmp_path, 150_000, 100_000)
    cgroup = own_cgroup(tmp_path / "cgroup", proc)
    assert cgroup.version == 1 and cgroup.cpu == tmp_path / "cgroup" / "cpu" / "lab" / "svc"
    assert worker_count(cgroup) == 2


def test_v1_combined_cpu_cpuacct_mount(tmp_path: Path) -> None:
    proc = _v1(tmp_path, 250_000, 100_000, mount="cpu,cpuacct")
    assert worker_count(own_cgroup(tmp_path / "cgroup", proc)) == 3


def test_v1_without_quota_uses_the_cpus_we_may_run_on(tmp_path: Path) -> None:
    proc = _v1(tmp_path, -1, 100_000)
    assert worker_count(own_cgroup(tmp_path / "cgroup", proc)) == AFFINITY


def test_v2_cpu_max(tmp_path: Path) -> None:
    proc = _v2(tmp_path, "50000 100000")
    cgroup = own_cgroup(tmp_path / "cgroup", proc)
    assert cgroup.version == 2 and cgroup.cpu == tmp_path / "cgroup" / "lab.slice" / "svc.scope"
    assert worker_count(cgroup) == 1


def test_v2_unlimited_uses_the_cpus_we_may_run_on(tmp_path: Path) -> None:
    proc = _v2(tmp_path, "max 100000")
    assert worker_count(own_cgroup(tmp_path / "cgroup", proc)) == AFFINITY


def test_container_without_cgroupns_uses_the_mount_root(tmp_path: Path) -> None:
    # /proc/self/cgroup shows the host's path, which does not exist under the container's mount.
    _v1(tmp_path / "v1", 200_000, 100_000, path="/")
    proc = _proc_cgroup(tmp_path / "v1", ["2:cpu:/docker/0123abcd", "0::/"])
    cgroup = own_cgroup(tmp_path / "v1" / "cgroup", proc)
    assert cgroup.cpu == tmp_path / "v1" / "cgroup" / "cpu"
    assert worker_count(cgroup) == 2

    root = tmp_path / "v2" / "cgroup"
    root.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    (root / "cpu.max").write_text("150000 100000\n")
    proc = _proc_cgroup(tmp_path / "v2", ["0::/system.slice/docker-0123abcd.scope"])
    cgroup = own_cgroup(root, proc)
    assert cgroup.cpu == root
    assert worker_count(cgroup) == 2


@pytest.fixture
def real_cpu_cgroup() -> Iterator[Path]:
    """A child of this process's cgroup v1 cpu group, limited to 2.5 CPUs; removed afterwards."""
    cgroup = own_cgroup()
    parent = cgroup.cpu
    if cgroup.version != 1 or not os.access(parent / "cgroup.procs", os.W_OK):
        pytest.skip("needs a writable cgroup v1 cpu hierarchy (root on a v1 or hybrid host)")
    group = parent / f"protolab-test-{os.getpid()}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text("250000")
        yield group
    finally:
        deadline = time.monotonic() + 10
        while True:  # the kernel empties a cgroup a moment after its last process exits
            try:
                group.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


@pytest.mark.serial  # a real cgroup's CPU quota and accounting: alone
def test_service_in_a_real_cgroup_sizes_its_workers_from_the_quota(real_cpu_cgroup: Path) -> None:
    procs = real_cpu_cgroup / "cgroup.procs"

    def join_cgroup() -> None:
        fd = os.open(procs, os.O_WRONLY)
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)

    service = launch_service("grpc_aio", {"WORKERS": ""}, preexec_fn=join_cgroup)
    try:
        assert service.workers == 3  # ceil(250000 / 100000)
        members = {int(pid) for pid in procs.read_text().split()}
        assert service.process.pid in members and len(members) == 1 + 3  # supervisor and workers
    finally:
        assert service.stop() == 0


@pytest.mark.serial  # a real cgroup's CPU quota and accounting: alone
def test_a_real_cgroup_splits_its_cpu_time_into_user_and_system(real_cpu_cgroup: Path) -> None:
    """A child that spins in Python, then in syscalls: both halves show, and they add up to the usage."""
    from services.common.cgroup import CgroupPaths, read_stats  # noqa: PLC0415

    cpuacct = own_cgroup().cpuacct / real_cpu_cgroup.name
    cpuacct.mkdir(exist_ok=True)
    paths = CgroupPaths(1, real_cpu_cgroup, cpuacct, real_cpu_cgroup)
    before = read_stats(paths)
    child = os.fork()
    if child == 0:
        for group in (real_cpu_cgroup, cpuacct):
            (group / "cgroup.procs").write_text(str(os.getpid()))
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            sum(range(1000))
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            os.stat("/")
        os._exit(0)
    os.waitpid(child, 0)
    after = read_stats(paths)
    if cpuacct.resolve() != real_cpu_cgroup.resolve():  # a separate cpuacct hierarchy: ours to remove
        deadline = time.monotonic() + 10
        while cpuacct.exists():
            try:
                cpuacct.rmdir()
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    assert before.cpu_user_seconds is not None and after.cpu_user_seconds is not None
    assert before.cpu_system_seconds is not None and after.cpu_system_seconds is not None
    assert before.cpu_usage_seconds is not None and after.cpu_usage_seconds is not None
    user = after.cpu_user_seconds - before.cpu_user_seconds
    system = after.cpu_system_seconds - before.cpu_system_seconds
    usage = after.cpu_usage_seconds - before.cpu_usage_seconds
    assert user > 0.1 and system > 0.1
    assert user + system == pytest.approx(usage, rel=0.1)
