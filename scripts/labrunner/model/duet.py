"""Duet rounds: the closed model's compared pairs measured at the same time (docs/measurement.md).

Two services share the host's slow and fast spells when they run at once, so the ratio of their
req/s keeps a precision that sequential rounds lose to the host's drift (Bulej et al., ICPE 2020).
A block is one repeat of a pair: both services start fresh at once (the one in slot 1 a moment
first), and their measured windows run together; the next block swaps the slots, since a fresh
process's own speed and its start order bias a side by a few percent. The A/A control, one dueted
target beside itself (the preset's `control`, else the run's first), shows what bias is left.
"""

import itertools
from dataclasses import dataclass, replace

from labrunner.model.questions import pairs
from labrunner.model.scenario import LOOPBACK, SERVICE, Duet, Plan, Profile, Scenario, round_of

# Two quotas fit beside each other when they take at most this share of the service CPUs: the rest
# is left for the kernel's and the services' own work outside the quotas (softirqs, the supervisor).
FITS_SHARE = 0.8
AUTO, ON, OFF = "auto", "on", "off"
MODES = (AUTO, ON, OFF)


class DuetError(ValueError):
    """--duet on asked for a pair whose two quotas do not fit on the service CPUs."""


def fits(profile: Profile) -> bool:
    """Whether two services at the profile's quota fit on its service CPUs with room to spare."""
    return 2 * profile.cpus <= FITS_SHARE * profile.whole_cpus


def fallback_line(profile: Profile) -> str:
    """The one line a run says when a profile's pairs run one after the other."""
    return (
        f"duet: profile {profile.name}'s two quotas ({2 * profile.cpus:g} CPUs) exceed "
        f"{FITS_SHARE:.0%} of its {profile.whole_cpus} service CPU(s): its closed rounds run one "
        "target at a time"
    )


def dueted(scenario: Scenario) -> bool:
    """Whether a scenario of this kind may run in a duet: the closed model on loopback (an emulated
    link's namespaces are one per scenario), not a capacity search or a ladder rung."""
    model = scenario.load_model
    return (
        model.executor == "constant-vus"
        and model.search is None
        and model.rung is None
        and scenario.network == LOOPBACK
    )


@dataclass(frozen=True)
class PlannedSide:
    """A planned scenario as model.questions reads a side."""

    scenario: Scenario
    order: int

    @property
    def target(self) -> str:
        return self.scenario.target.name

    @property
    def service(self) -> str:
        return self.scenario.target.service

    @property
    def protocol(self) -> str:
        return self.scenario.target.protocol

    @property
    def script(self) -> str:
        return self.scenario.target.script

    @property
    def tls(self) -> bool:
        return self.scenario.target.tls

    @property
    def instrumented(self) -> bool:
        return dict(self.scenario.target.env).get("METRICS_ENABLED") != "0"

    @property
    def profile(self) -> str:
        return self.scenario.profile.name

    @property
    def count(self) -> int:
        return self.scenario.count

    @property
    def load_model(self) -> str:
        return self.scenario.load_model.name

    @property
    def response_model(self) -> str:
        return self.scenario.response_model

    @property
    def direction(self) -> str:
        return self.scenario.direction

    @property
    def shape(self) -> str:
        return self.scenario.shape

    @property
    def network(self) -> str:
        return self.scenario.network.name

    @property
    def streams(self) -> int:
        return self.scenario.streams

    @property
    def churn(self) -> int | None:
        return self.scenario.churn

    @property
    def compression(self) -> str:
        return self.scenario.compression


def plan_duets(plan: Plan, mode: str) -> Plan:
    """The plan with each compared pair of closed scenarios as duet blocks, where the pair's quotas fit
    (auto), everywhere (on: DuetError where they don't) or nowhere (off). Every repeat of a pair is a
    block, slots swapped from block to block; one dueted target also runs beside itself (the A/A
    control: _control). A target left in no duet keeps its own rounds."""
    if mode == OFF or plan.measure != SERVICE:  # a caller run measures its callers one at a time
        return plan
    first_round = [s for s in plan.scenarios if s.repeat == 1 and dueted(s)]
    order = {name: i for i, name in enumerate(dict.fromkeys(s.target.name for s in first_round))}
    named = {name: i for i, name in enumerate(dict.fromkeys(s.duet_name for s in first_round))}
    asked = plan.duet_questions
    # A duet names its partner by duet_name (the target, and its connection model, churn and
    # compression when not the default): the sides of a pair with one name (build vs prebuilt) keep
    # their own rounds.
    found = [
        (q, c, b)
        for q, c, b in pairs([PlannedSide(s, order[s.target.name]) for s in first_round])
        if (not asked or q.kind in asked) and c.scenario.duet_name != b.scenario.duet_name
    ]
    too_big = {
        c.scenario.profile.name: c.scenario.profile for _, c, _ in found if not fits(c.scenario.profile)
    }
    lines = [fallback_line(profile) for profile in too_big.values()]
    if lines and mode == ON:
        raise DuetError("; ".join(line.removeprefix("duet: ") for line in lines))
    plan = replace(plan, notes=(*plan.notes, *lines))
    chosen = [(c.scenario, b.scenario) for _, c, b in found if fits(c.scenario.profile)]
    if not chosen:
        return plan
    in_duets = {s.target_group for pair in chosen for s in pair}
    control, line = _control([s for s in first_round if s.target_group in in_duets], plan.control)
    plan = replace(plan, notes=(*plan.notes, line)) if line else plan
    chosen.insert(0, (control, control))
    scenarios: list[Scenario] = []
    for (rungs, repeat), members in itertools.groupby(plan.scenarios, key=round_of):
        scenarios += [s for s in members if not (dueted(s) and s.target_group in in_duets)]
        if not rungs:
            blocks = [
                replace(scenario, repeat=repeat, duet=Duet(partner.duet_name, side, slot_of(side, repeat)))
                for candidate, baseline in chosen
                if repeat <= min(candidate.repeats, baseline.repeats)
                for side, scenario, partner in ((1, candidate, baseline), (2, baseline, candidate))
            ]
            # The matrix's order is by target, as without duets: it says which side of a question is
            # which (report/compare.py); Plan.run_units pairs each block's sides whatever their places.
            scenarios += sorted(blocks, key=lambda s: _by_target(s, named))
    return replace(plan, scenarios=tuple(scenarios))


def _control(dueted_sides: list[Scenario], asked: str | None) -> tuple[Scenario, str]:
    """The A/A control's side: the asked target's (the preset's `control`, or --control) when the run
    duets it, else the run's first dueted target, with the line that says so."""
    named = next((s for s in dueted_sides if s.target.name == asked), None)
    if named is not None:
        return named, ""
    first = dueted_sides[0]
    if asked is None:
        return first, ""
    return (
        first,
        f"duet: the A/A control {asked} is in no compared pair of this run: {first.target.name} instead",
    )


def _by_target(scenario: Scenario, order: dict[str, int]) -> tuple[int, int, int]:
    """A duet scenario's place in the matrix's order (`order`: by duet name): its target's, its
    partner's, its side."""
    assert scenario.duet is not None
    return order[scenario.duet_name], order[scenario.duet.partner], scenario.duet.side


def slot_of(side: int, repeat: int) -> int:
    """Side 1 starts first in odd blocks, side 2 in even ones."""
    return 1 if (side == 1) == (repeat % 2 == 1) else 2


def next_block(scenario: Scenario, repeat: int) -> Scenario:
    """The scenario one more repeat on (--precision), its duet's slot swapped as that block's."""
    duet = scenario.duet
    if duet is None:
        return replace(scenario, repeat=repeat)
    return replace(scenario, repeat=repeat, duet=replace(duet, slot=slot_of(duet.side, repeat)))
