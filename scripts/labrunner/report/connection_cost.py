"""What a new connection costs a server: CPU per call = a + b·(1/N) for each target run at several churns.

Under churn N (model.scenario) a call pays for 1/N of a connection: its accept, its teardown and, with
TLS, its handshake. So CPU per call against connections per call is a line whose intercept a is a call
on a kept connection ("never": 1/N = 0) and whose slope b is one new connection; a TLS target's b
minus that of its cleartext twin (same server and protocol) is the TLS handshake alone. k6 never
resumes a TLS session (Go's crypto/tls without a session cache), so every handshake it makes is full.
The fit is payload_model's (weighted least squares, Student t intervals); costs are in ms per call.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from labrunner.report.compare import Group
from labrunner.report.payload_model import CPU, Estimate, Line, fit_line, per_record_difference, scaled
from labrunner.report.stats import CONFIDENCE

METHOD = (
    "CPU per call (ms) is fitted for each target as a + b·(1/N) over every repeat at every churn N (a "
    "new connection every N calls; never: 1/N = 0): a is a call on a kept connection, b one new "
    "connection (accept, teardown and, with TLS, the handshake). Weighted least squares, weights 1/m² "
    f"with m the mean at that churn; {CONFIDENCE:.0%} Student t intervals from the residuals. A TLS "
    "target's b minus its cleartext twin's (the same server and protocol) is the TLS handshake alone, "
    "its interval from both fits' variances at the fewer degrees of freedom. k6 never resumes a TLS "
    "session, so each handshake is a full one."
)


@dataclass(frozen=True)
class ConnectionCost:
    """One target's CPU per call against connections per call, over the churns it ran."""

    group: Group  # one of its groups: the target and the conditions the fit held
    churns: tuple[int | None, ...]  # the churns fitted, never (None) first
    points: tuple[tuple[float, float], ...]  # (1/N, ms per call) of every repeat
    line: Line  # fixed: ms per call on a kept connection; per_record: ms per new connection

    @property
    def target(self) -> str:
        return self.group.target

    @property
    def tls(self) -> bool:
        return self.group.tls

    @property
    def twin(self) -> tuple[str, str, tuple[int | None, ...]]:
        """What its cleartext twin shares with a TLS target: the server, the protocol, the churns."""
        return self.group.service, self.group.protocol, self.churns

    @property
    def per_connection(self) -> Estimate:
        return self.line.per_record

    @property
    def kept_call(self) -> Estimate:
        return self.line.fixed


@dataclass(frozen=True)
class Handshake:
    """A TLS target's full handshake: its per-connection cost over its cleartext twin's."""

    tls: ConnectionCost
    cleartext: ConnectionCost
    cost: Estimate  # ms


def connections_per_call(churn: int | None) -> float:
    return 0.0 if churn is None else 1 / churn


def _conditions(g: Group) -> tuple[str, ...]:
    """What a target's groups at its several churns share (a duet's partner aside)."""
    return (
        g.target,
        g.profile,
        str(g.count),
        g.load_model,
        g.response_model,
        g.direction,
        g.shape,
        g.network,
    )


def connection_costs(groups: Sequence[Group]) -> list[ConnectionCost]:
    """Each target, under each of its conditions, fitted over the churns it ran at one stream per
    connection; none where fewer than two churns have a positive CPU per call, or none churned."""
    by_conditions: dict[tuple[str, ...], list[Group]] = {}
    for g in groups:
        if g.streams == 1:
            by_conditions.setdefault(_conditions(g), []).append(g)
    costs = []
    for members in by_conditions.values():
        points = tuple(
            (connections_per_call(g.churn), cost) for g in members for cost in g.values(CPU) if cost > 0
        )
        churns = {g.churn for g in members if any(cost > 0 for cost in g.values(CPU))}
        if len(churns) < 2 or churns == {None}:
            continue
        costs.append(
            ConnectionCost(
                group=members[0],
                churns=tuple(sorted(churns, key=lambda c: (c is not None, c or 0))),
                points=points,
                line=fit_line([x for x, _ in points], [y for _, y in points]),
            )
        )
    return costs


def handshakes(costs: Sequence[ConnectionCost]) -> list[Handshake]:
    """Each TLS target's handshake against the cleartext target of its server and protocol fitted over
    the same churns."""
    found = []
    for tls in (c for c in costs if c.tls):
        for clear in costs:
            if not clear.tls and clear.twin == tls.twin:
                found.append(Handshake(tls, clear, per_record_difference(tls.line, clear.line)))
    return found


def microseconds(e: Estimate) -> str:
    """An estimate in ms as µs with its interval: '412 µs [380, 445]'."""
    return scaled(e, 1000).text("{:,.0f}", " µs")
