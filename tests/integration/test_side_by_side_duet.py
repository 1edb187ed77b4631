"""benchmarks/side_by_side.py run for real, briefly: aiohttp's lab server beside its floor and the A/A
control, two duet blocks of 1 s windows, real services in cgroups on 127.0.0.1 and real k6. Checks
what the JSON file says happened: both sides of every block measured at the same time, slots swapped
and processes fresh from block to block, and a ratio over the blocks."""

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT

# Judged on what its file says happened (overlapping windows, slots, processes), never a figure.
pytestmark = [pytest.mark.timeout(300), pytest.mark.paired]


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    path = tmp_path_factory.mktemp("side-by-side") / "duet.json"
    command = [sys.executable, "benchmarks/side_by_side.py", "--stack", "rest_aiohttp", "--aa"]
    command += ["--blocks", "2", "--warmup", "1", "--duration", "1", "--json", str(path)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded: dict[str, Any] = json.loads(Path(path).read_text())
    return loaded, done.stdout


def test_it_runs_the_lab_server_beside_its_floor_and_the_aa_control(ran: tuple[dict[str, Any], str]) -> None:
    loaded, stdout = ran
    assert loaded["conditions"]["design"] == "duet" and loaded["conditions"]["blocks_done"] == 2
    control, pair = loaded["groups"]
    assert (control["control"], pair["control"]) == (True, False)
    assert [s["module"] for s in pair["sides"]] == ["services.rest_aiohttp", "benchmarks.floor.rest_aiohttp"]
    assert [s["module"] for s in control["sides"]] == ["services.rest_aiohttp"] * 2
    assert pair["script"] == "k6/rest.js" and pair["ratio"] == "lab / floor"
    for group in (control, pair):
        assert len(group["blocks"]) == 2
        for block in group["blocks"]:
            for side in block["sides"].values():
                assert side["requests"] > 0 and side["errors"] == 0 and side["cpu_seconds"] > 0
        ratio = group["ratios"]["requests_per_second"]
        assert ratio["estimate"] > 0 and ratio["rounds"] == 2
    assert control["verdict"] in stdout and "| rest_aiohttp | lab / floor |" in stdout


def test_both_sides_of_a_block_ran_at_the_same_time(ran: tuple[dict[str, Any], str]) -> None:
    loaded, _ = ran
    windows = []
    for group in loaded["groups"]:
        for block in group["blocks"]:
            first, second = block["sides"].values()
            assert max(first["window_start"], second["window_start"]) < min(
                first["window_end"], second["window_end"]
            )
            windows.append(
                (
                    min(first["window_start"], second["window_start"]),
                    max(first["window_end"], second["window_end"]),
                )
            )
    # Blocks one after another: no block's windows overlap another's.
    ordered = sorted(windows)
    assert all(earlier[1] < later[0] for earlier, later in itertools.pairwise(ordered))


def test_slots_swap_and_processes_restart_from_block_to_block(ran: tuple[dict[str, Any], str]) -> None:
    loaded, _ = ran
    pids = []
    for group in loaded["groups"]:
        one, two = (list(block["sides"].values()) for block in group["blocks"])
        assert [side["slot"] for side in one] == [1, 2]  # side 1 starts first in odd blocks
        assert [side["slot"] for side in two] == [2, 1]
        pids += [side["pid"] for side in (*one, *two)]
    assert len(set(pids)) == len(pids) == 8
