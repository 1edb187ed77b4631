"""--resume: which results on disk the run keeps, when the run started and was resumed, and which code
measured it."""

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from labrunner.model.scenario import Scenario
from labrunner.results.store import (
    read_manifest,
    resumable,
)
from labrunner.say import Say

# Where --resume moves the result files it does not trust: kept, out of the run's results.
IGNORED_DIR = "ignored"


def resumed(out: Path, scenarios: Sequence[Scenario], say: Say) -> frozenset[str]:
    """--resume: the scenarios whose ok result on disk is the planned one (store.resumable), which the
    run skips; every result file it does not trust is named with why and moved to scenarios/ignored/,
    out of the summaries and the report (its scenario, when planned, runs again)."""
    found = resumable(out, scenarios)
    if found.ignored:
        aside = out / "scenarios" / IGNORED_DIR
        aside.mkdir(exist_ok=True)
        say(f"resume: {len(found.ignored)} result file(s) not trusted, moved to {aside}:")
        for name, why in found.ignored.items():
            (out / "scenarios" / name).replace(aside / name)
            say(f"  {name}: {why}")
    return found.done


def sessions(out_dir: Path, resume: bool) -> tuple[datetime, list[str]]:
    """When the run started and when it was resumed: a resumed run keeps its first start."""
    now = datetime.now(UTC)
    if not resume:
        return now, []
    previous = read_manifest(out_dir)
    try:
        return datetime.fromisoformat(previous["started_at"]), [*previous["resumed_at"], now.isoformat()]
    except (ValueError, KeyError, TypeError):
        return now, [now.isoformat()]


# What says which code measured a run: a resumed run keeps its first session's, and lists each
# resuming session's under resumed_by.
_ORIGIN = ("release", "methodology", "git")


def resumed_provenance(
    out_dir: Path, resume: bool, provenance: dict[str, Any], resumed_at: list[str]
) -> dict[str, Any]:
    """The manifest's provenance: this session's, but on --resume the release, methodology and git of
    the session that started the run (its results were measured by that code), with this session's
    added to resumed_by. A manifest without a release was written before 0.2.0."""
    if not resume:
        return provenance
    previous = read_manifest(out_dir)
    this_session = {"at": resumed_at[-1], **{key: provenance.get(key) for key in _ORIGIN}}
    return {
        **provenance,
        **{key: previous.get(key) for key in _ORIGIN},
        "resumed_by": [*previous.get("resumed_by", []), this_session],
    }
