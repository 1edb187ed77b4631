"""scripts/gen_dashboards.py as users run it: what it writes is the committed dashboards, byte for
byte, and --check names what drifted."""

import shutil
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT

GRAFANA = ROOT / "grafana"
GENERATED = ("dashboards", "import")


def _generate(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "scripts/gen_dashboards.py", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)


def _tree(root: Path) -> dict[Path, bytes]:
    """Every file under root's generated folders, by its path below root."""
    return {
        p.relative_to(root): p.read_bytes()
        for d in GENERATED
        for p in sorted((root / d).rglob("*"))
        if p.is_file()
    }


def test_the_generator_writes_the_committed_dashboards_byte_for_byte(tmp_path: Path):
    result = _generate("--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    committed, written = _tree(GRAFANA), _tree(tmp_path)
    assert {p.parent.name for p in committed} == set(GENERATED)
    assert sorted(written) == sorted(committed)
    for path, data in committed.items():
        assert written[path] == data, f"{path} differs from grafana/{path}"


def test_check_names_a_changed_and_a_stale_file_and_a_run_repairs_them(tmp_path: Path):
    tmp_path = tmp_path.resolve()  # as the generator names it
    for folder in GENERATED:
        shutil.copytree(GRAFANA / folder, tmp_path / folder)
    changed = tmp_path / "dashboards" / "matrix.json"
    changed.write_text(changed.read_text().replace('"protolab-matrix"', '"renamed"', 1))
    stale = tmp_path / "import" / "removed.json"
    stale.write_text("{}\n")

    check = _generate("--check", "--out", str(tmp_path))
    assert check.returncode == 1
    assert f"out of date: {changed}" in check.stderr.splitlines()
    assert f"out of date: {stale}" in check.stderr.splitlines()

    repair = _generate("--out", str(tmp_path))
    assert repair.returncode == 0, repair.stderr
    assert repair.stdout.splitlines() == [f"wrote {changed}", f"removed {stale}"]
    assert _tree(tmp_path) == _tree(GRAFANA)
    assert _generate("--check", "--out", str(tmp_path)).returncode == 0
