"""A session's run-wide choices from the command line."""

from dataclasses import dataclass
from typing import Any

from labrunner.run import calibration
from labrunner.run.runner import RunConfig


@dataclass(frozen=True)
class SessionConfig:
    """Run-wide choices from the command line."""

    run: RunConfig
    resume: bool
    argv: tuple[str, ...]
    backend_reason: str
    provenance: dict[str, Any]  # git, versions, host (see labrunner.results.provenance)
    # --precision: add rounds of the closed groups until every compared req/s ratio's interval is
    # within this share of its estimate, while --budget (seconds of rounds added) lasts.
    precision: float | None = None
    budget_s: float = 0.0
    # --calibration-rounds: rounds of each calibration workload before and after the run.
    calibration_rounds: int = calibration.ROUNDS
    # --calibration-attempts: how often a calibration is taken while others keep the host busy.
    calibration_attempts: int = calibration.CALIBRATION_ATTEMPTS
