"""The host's fingerprint: what a number measured here depends on besides the code (CPU, kernel, VM).

Read from /proc and /sys (a root other than "/" reads a recorded tree, for tests). Every field is
None when this host does not expose it; two fingerprints are compared field by field.
"""

import json
import platform
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# What must match for absolute figures (req/s, CPU s per request) of two runs to be compared.
COMPARED = (
    "cpu_model",
    "cpu_family_model_stepping",
    "microcode",
    "cores",
    "threads",
    "governor",
    "kernel",
    "virtualisation",
    "mitigations",
    "cgroup",
    "interpreter",
)


def read(root: Path = Path("/"), interpreter: str | None = None) -> dict[str, Any]:
    """This host's fingerprint; interpreter: the line provenance records for the Python build."""
    cpuinfo = _cpuinfo(root / "proc/cpuinfo")
    first = cpuinfo[0] if cpuinfo else {}
    flags = first.get("flags", "").split()
    return {
        "cpu_model": first.get("model name"),
        "cpu_vendor": first.get("vendor_id"),
        "cpu_family_model_stepping": _family_model_stepping(first),
        "microcode": first.get("microcode"),
        "cores": _cores(cpuinfo),
        "threads": len(cpuinfo) or None,
        "governor": _text(root / "sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"),
        "kernel": _kernel(root),
        "virtualisation": _virtualisation(root, "hypervisor" in flags),
        "mitigations": _mitigations(root / "sys/devices/system/cpu/vulnerabilities"),
        "cgroup": _cgroup_version(root / "sys/fs/cgroup"),
        "interpreter": interpreter,
    }


def differences(current: Mapping[str, Any], baseline: Mapping[str, Any]) -> list[str]:
    """What differs between two fingerprints, one phrase per field ("kernel: 6.1.0 -> 6.18.44")."""
    found = []
    for field in COMPARED:
        now, then = current.get(field), baseline.get(field)
        if now == then:
            continue
        if field == "mitigations" and isinstance(now, Mapping) and isinstance(then, Mapping):
            changed = sorted(k for k in set(now) | set(then) if now.get(k) != then.get(k))
            found.append(f"mitigations: {', '.join(changed)}")
        else:
            found.append(f"{field}: {_show(then)} -> {_show(now)}")
    return found


def _cpuinfo(path: Path) -> list[dict[str, str]]:
    """/proc/cpuinfo as one mapping per logical CPU."""
    text = _text(path, strip=False) or ""
    cpus: list[dict[str, str]] = []
    for block in text.split("\n\n"):
        fields = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        if "processor" in fields:
            cpus.append(fields)
    return cpus


def _family_model_stepping(cpu: Mapping[str, str]) -> str | None:
    family, model, stepping = cpu.get("cpu family"), cpu.get("model"), cpu.get("stepping")
    if family is None or model is None or stepping is None:
        return None
    return f"{family}/{model}/{stepping}"


def _cores(cpus: list[dict[str, str]]) -> int | None:
    """Physical cores: distinct (package, core) pairs, else "cpu cores" per package."""
    pairs = {(c.get("physical id"), c.get("core id")) for c in cpus if "core id" in c}
    if pairs:
        return len(pairs)
    return int(cpus[0]["cpu cores"]) if cpus and cpus[0].get("cpu cores", "").isdigit() else None


def _kernel(root: Path) -> str | None:
    release = _text(root / "proc/sys/kernel/osrelease")
    if release is None and root == Path("/"):
        release = platform.release()
    return release


def _virtualisation(root: Path, hypervisor_flag: bool) -> dict[str, Any]:
    """Whether the CPU reports a hypervisor, and whose: lscpu reads it from CPUID, else /sys and DMI."""
    vendor = _text(root / "sys/hypervisor/type") or _text(root / "sys/class/dmi/id/sys_vendor")
    if vendor is None and hypervisor_flag and root == Path("/"):
        vendor = _lscpu_hypervisor()
    return {"hypervisor": hypervisor_flag, "vendor": vendor}


def _lscpu_hypervisor() -> str | None:
    lscpu = shutil.which("lscpu")
    if lscpu is None:
        return None
    try:
        out = subprocess.run([lscpu, "-J"], capture_output=True, text=True, timeout=10, check=True).stdout
        for entry in json.loads(out).get("lscpu", []):
            if entry.get("field") == "Hypervisor vendor:":
                return str(entry.get("data"))
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    return None


def _mitigations(directory: Path) -> dict[str, str] | None:
    """Each CPU vulnerability the kernel knows and its state ("Not affected", "Mitigation: ...")."""
    if not directory.is_dir():
        return None
    return {p.name: _text(p) or "" for p in sorted(directory.iterdir()) if p.is_file()}


def _cgroup_version(mount: Path) -> str | None:
    if (mount / "cgroup.controllers").exists():
        return "v2"
    if (mount / "cpu").exists() or (mount / "memory").exists():
        return "v1"
    return None


def _text(path: Path, strip: bool = True) -> str | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    return text.strip() if strip else text


def _show(value: object) -> str:
    return "unknown" if value is None else str(value)
