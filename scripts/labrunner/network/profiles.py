"""Network profiles (delay, jitter, loss, rate per direction), from matrix.toml's [networks.<name>]."""

from dataclasses import dataclass


@dataclass(frozen=True)
class NetworkProfile:
    """Conditions applied to each direction of the link, as netem takes them.

    A round trip therefore sees twice the delay and a loss chance in each direction.
    """

    name: str
    delay_s: float = 0.0  # one way
    jitter_s: float = 0.0  # one way: each packet's delay is uniform in delay +/- jitter
    loss_percent: float = 0.0  # per packet, per direction
    rate_bps: int | None = None  # bits per second per direction; None: unlimited

    @property
    def rtt_s(self) -> float:
        """The round trip the profile promises (jitter averages out)."""
        return 2 * self.delay_s

    @property
    def emulated(self) -> bool:
        """False for a profile without conditions (loopback): no namespaces or emulator needed."""
        return bool(self.delay_s or self.jitter_s or self.loss_percent or self.rate_bps)
