"""The host fingerprint from recorded /proc and /sys trees of two CPU models, and how two compare."""

from pathlib import Path

from labrunner.observe import fingerprint

EPYC_CPU = """processor\t: {n}
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC
stepping\t: 1
microcode\t: 0x1000065
physical id\t: 0
siblings\t: 2
core id\t\t: {n}
cpu cores\t: 2
flags\t\t: fpu vme hypervisor avx2
"""
XEON_CPU = """processor\t: {n}
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
stepping\t: 8
microcode\t: 0xffffffff
physical id\t: 0
siblings\t: 2
core id\t\t: 0
cpu cores\t: 1
flags\t\t: fpu vme hypervisor avx512f
"""


def _tree(root: Path, cpu: str, threads: int, vulnerabilities: dict[str, str], cgroup: str) -> Path:
    (root / "proc/sys/kernel").mkdir(parents=True)
    (root / "proc/cpuinfo").write_text("\n".join(cpu.format(n=n) for n in range(threads)))
    (root / "proc/sys/kernel/osrelease").write_text("6.18.44-fc\n")
    vuln = root / "sys/devices/system/cpu/vulnerabilities"
    vuln.mkdir(parents=True)
    for name, state in vulnerabilities.items():
        (vuln / name).write_text(state + "\n")
    (root / "sys/fs/cgroup").mkdir(parents=True)
    if cgroup == "v2":
        (root / "sys/fs/cgroup/cgroup.controllers").write_text("cpu memory\n")
    else:
        (root / "sys/fs/cgroup/cpu").mkdir()
    return root


def test_a_recorded_epyc_host(tmp_path: Path) -> None:
    root = _tree(
        tmp_path, EPYC_CPU, 2, {"meltdown": "Not affected", "spectre_v1": "Mitigation: usercopy"}, "v1"
    )
    found = fingerprint.read(root, interpreter="CPython 3.11.2")
    assert found["cpu_model"] == "AMD EPYC"
    assert found["cpu_family_model_stepping"] == "25/1/1"
    assert found["microcode"] == "0x1000065"
    assert (found["cores"], found["threads"]) == (2, 2)
    assert found["governor"] is None  # no cpufreq in a VM like this one
    assert found["kernel"] == "6.18.44-fc"
    assert found["virtualisation"] == {"hypervisor": True, "vendor": None}
    assert found["mitigations"] == {"meltdown": "Not affected", "spectre_v1": "Mitigation: usercopy"}
    assert found["cgroup"] == "v1"
    assert found["interpreter"] == "CPython 3.11.2"


def test_two_threads_on_one_core_and_a_governor(tmp_path: Path) -> None:
    root = _tree(tmp_path, XEON_CPU, 2, {"meltdown": "Not affected"}, "v2")
    freq = root / "sys/devices/system/cpu/cpu0/cpufreq"
    freq.mkdir(parents=True)
    (freq / "scaling_governor").write_text("performance\n")
    (root / "sys/class/dmi/id").mkdir(parents=True)
    (root / "sys/class/dmi/id/sys_vendor").write_text("Google\n")
    found = fingerprint.read(root)
    assert (found["cores"], found["threads"]) == (1, 2)
    assert found["governor"] == "performance"
    assert found["virtualisation"] == {"hypervisor": True, "vendor": "Google"}
    assert found["cgroup"] == "v2"


def test_differences_name_each_field_and_each_changed_mitigation(tmp_path: Path) -> None:
    epyc = fingerprint.read(
        _tree(tmp_path / "a", EPYC_CPU, 2, {"meltdown": "Not affected", "mds": "Not affected"}, "v1")
    )
    xeon = fingerprint.read(
        _tree(
            tmp_path / "b",
            XEON_CPU,
            2,
            {"meltdown": "Not affected", "mds": "Mitigation: Clear CPU buffers"},
            "v1",
        )
    )
    assert fingerprint.differences(epyc, epyc) == []
    changes = fingerprint.differences(xeon, epyc)
    assert "cpu_model: AMD EPYC -> Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz" in changes
    assert "cpu_family_model_stepping: 25/1/1 -> 6/143/8" in changes
    assert "cores: 2 -> 1" in changes
    assert "mitigations: mds" in changes
    assert not [c for c in changes if c.startswith(("kernel", "cgroup", "threads"))]


def test_this_host_is_readable() -> None:
    found = fingerprint.read()
    assert found["threads"] and found["kernel"] and found["cgroup"] in ("v1", "v2")
