"""The loop's design flow [L/min]: the site's figure when configured, else learned from the
plant (pure).

The design flow is what the low-flow and no-flow interlocks (`valvey.core.safety`) and the
energy-balance estimate of the supply temperature (`valvey.core.sensors`) measure the flow
against. It is a site figure (the rack vendor's flow: REFERENCE §1.4, 1.5 L/min per kW of
rack power, 1.2-2.0 in use); a controller must not assume the nominal simulated plant's
(198 L/min). Unset, `DesignFlow` learns it as the **highest steady flow** the loop has
delivered while healthy: the flow averaged over blocks of ``steady_s``, a block counting when
every sample in it was within ``band`` (3 %) of its mean and nothing marked it unhealthy (a
pump changeover, an isolated rack); the highest such mean is kept, never followed down (a
slowly clogging loop is low flow, not a new design). Before the first steady block the
highest flow seen stands in; before any flow, None (the interlocks cannot judge a fraction:
the pump manager's running and trip checks still act). A learned value outside
[``min_lpm``, ``max_lpm``] (a meter in m³/h or L/s) is not taken.
"""

from __future__ import annotations

import math

__all__ = ["DesignFlow"]


class DesignFlow:
    """The design flow in use (module docstring).

    Args:
        configured_lpm: the site's design flow [L/min]; None: learned.
        steady_s: length of a steady block [s].
        band: a block is steady when every sample is within this share of its mean.
        min_lpm, max_lpm: plausibility window of a learned value [L/min].
    """

    __slots__ = ("_blk", "band", "configured_lpm", "max_lpm", "min_lpm", "seen_max_lpm",
                 "steady_lpm", "steady_s")

    def __init__(self, configured_lpm: float | None, *, steady_s: float = 30.0,
                 band: float = 0.03, min_lpm: float = 20.0, max_lpm: float = 5000.0):
        self.configured_lpm = configured_lpm
        self.steady_s = steady_s
        self.band = band
        self.min_lpm = min_lpm
        self.max_lpm = max_lpm
        self.steady_lpm: float | None = None  # highest steady block mean
        self.seen_max_lpm: float | None = None  # highest plausible sample
        self._blk: list[float] | None = None  # t0, sum, n, min, max

    @property
    def learned(self) -> bool:
        """A steady block has been seen (or the value is configured)."""
        return self.configured_lpm is not None or self.steady_lpm is not None

    @property
    def value_lpm(self) -> float | None:
        """The design flow [L/min] in use: configured, else the highest steady flow, else the
        highest flow seen, else None."""
        if self.configured_lpm is not None:
            return self.configured_lpm
        return self.steady_lpm if self.steady_lpm is not None else self.seen_max_lpm

    def update(self, now: float, flow_lpm: float | None, healthy: bool = True) -> None:
        """One fresh flow reading [L/min] at monotonic ``now`` [s]; ``healthy`` False (a
        pump changeover, the rack isolated) or a missing reading restarts the block."""
        if self.configured_lpm is not None:
            return
        if flow_lpm is None or not math.isfinite(flow_lpm) or not healthy:
            self._blk = None
            return
        if self.min_lpm <= flow_lpm <= self.max_lpm:
            self.seen_max_lpm = max(flow_lpm, self.seen_max_lpm or 0.0)
        b = self._blk
        if b is None:
            self._blk = [now, flow_lpm, 1.0, flow_lpm, flow_lpm]
            return
        b[1] += flow_lpm
        b[2] += 1.0
        b[3] = min(b[3], flow_lpm)
        b[4] = max(b[4], flow_lpm)
        if now - b[0] < self.steady_s:
            return
        mean = b[1] / b[2]
        self._blk = None
        if (b[2] >= 3 and b[4] - mean <= self.band * mean and mean - b[3] <= self.band * mean
                and self.min_lpm <= mean <= self.max_lpm):
            self.steady_lpm = max(mean, self.steady_lpm or 0.0)
