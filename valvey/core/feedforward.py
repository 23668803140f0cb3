"""Dynamic feedforward from the rack heat load to the facility valve (REFERENCE §2.2, §4.5).

Power is the *measured* disturbance: racky publishes the rack power (``racky/state/rack_power``,
1 Hz, docs/CONTRACTS.md); the heat reaches the CDU's heat exchanger only after the supply-pipe
transport, the rack's thermal mass and the return pipe (≈ 6 s + 14 s + 6 s, REFERENCE §1.7).
A *static* feedforward therefore over-reacts (the valve opens before the heat arrives,
REFERENCE §4.5: 1.18 K on the down-step); a dynamic one, a pure delay about the transport
delay followed by a first-order lag, works much better. The lag trades tracking for valve
wear: REFERENCE §4.5 found 10 s gives 0.15 K on S1 but moves the valve 53 % of the time on
the agentic burst train, and recommends **a 30 s lag with a 0.1 K deadband and a 1 % minimum
step** (the defaults here and in `valvey.core.supply_loop`).

The filtered power is turned into a valve position by a characteristic (``valve_map``:
rack IT power kW → valve %, linear between points). Its default is REFERENCE §4.4's steady
state at 45 °C supply and 40 °C facility water [D], the commissioning data a real site
replaces. Only its *slope* matters dynamically: the PID's integrator holds the offset (the
map's error at another facility-water temperature), and every change of the FF is added to
the valve command at once (``u = P + I + D + FF``).

Source selection: racky's rack power while fresh (``stale_after_s``); otherwise the CDU's
heat-removed figure (``heat_removed_kw`` / liquid fraction), which lags the load by the
loop's own delays (so no extra delay is applied to it); otherwise the filter holds its last
value (the loop goes on as PID-only from there). A source change feeds the same filter, so
the FF never jumps.

Pure: `DynamicFeedforward.update` is called once per supply-loop period with the time.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from typing import Literal

from pydantic import Field, model_validator

from rackplane.config import StrictModel
from rackplane.core.samples import Sample

__all__ = ["REFERENCE_VALVE_MAP", "DynamicFeedforward", "FeedforwardSettings", "FfSource"]

REFERENCE_VALVE_MAP: tuple[tuple[float, float], ...] = (
    (0.0, 0.0),
    (20.0, 47.0),
    (40.0, 63.0),
    (80.0, 77.0),
    (132.0, 87.0),
    (160.0, 91.0),
    (208.0, 100.0),
)
"""Rack IT power [kW] → valve position [%] holding 45 °C supply with 40 °C facility water:
REFERENCE §4.4 [D] (20–160 kW rows) and the valve-open capacity at 41 °C → 45 °C (≈ 208 kW
at 40 °C is beyond the table: 100 %)."""

FfSource = Literal["rack_power", "heat_removed", "none"]


class FeedforwardSettings(StrictModel):
    """Dynamic feedforward (module docstring). ``enabled = false`` is PID-only."""

    enabled: bool = Field(True, description="false: PID only (REFERENCE §4.5 comparison)")
    source: Literal["rack_power", "heat_removed"] = Field(
        "rack_power", description="primary input: racky's rack power (leads the heat by the "
        "transport delay), or the CDU's heat_removed_kw for sites without racky (it already "
        "lags: less benefit); feedforward_source_lost alarms when the primary is not in use"
    )
    delay_s: float = Field(
        6.0, ge=0, le=120, description="pure delay ≈ supply-pipe transport (REFERENCE §1.7)"
    )
    lag_s: float = Field(
        15.0, ge=0, le=600, description="first-order lag [D]: REFERENCE §4.5 recommends 30 s "
        "as the starting point; on the §4 plant 15 s halves the S1 error at no cost in valve "
        "activity on S2 (docs/VALVEY.md, tuning)"
    )
    gain: float = Field(1.0, ge=0, le=3, description="scales the map's change (1 = as mapped)")
    valve_map: list[tuple[float, float]] = Field(
        default_factory=lambda: list(REFERENCE_VALVE_MAP),
        min_length=2,
        description="rack IT power [kW] -> valve [%], rising in both (REFERENCE §4.4 [D])",
    )
    stale_after_s: float = Field(
        5.0, gt=0, le=60, description="rack power older than this falls back (racky: 1 Hz)"
    )
    fallback_heat_removed: bool = Field(
        True, description="use the CDU's heat_removed_kw / liquid_fraction when rack power is "
        "stale (it already lags: no delay applied)"
    )
    liquid_fraction: float = Field(
        0.85, gt=0, le=1, description="share of IT power to liquid (REFERENCE §1.1, §4.3 [U])"
    )

    @model_validator(mode="after")
    def _check(self) -> FeedforwardSettings:
        pts = [tuple(p) for p in self.valve_map]
        if any(len(p) != 2 for p in pts):
            raise ValueError("valve_map points are [power_kw, valve_pct]")
        xs = [p[0] for p in pts]
        ys = [p[1] for p in pts]
        if any(b <= a for a, b in itertools.pairwise(xs)):
            raise ValueError("valve_map powers must rise strictly")
        if any(b < a for a, b in itertools.pairwise(ys)):
            raise ValueError("valve_map valve positions must not fall with power")
        if any(not 0.0 <= y <= 100.0 for y in ys) or xs[0] < 0.0:
            raise ValueError("valve_map valve positions must be 0..100 % and powers >= 0")
        return self


class DynamicFeedforward:
    """Delay + first-order lag on the rack power, mapped to a valve position.

    Args:
        settings: `FeedforwardSettings`.
    """

    def __init__(self, settings: FeedforwardSettings):
        self._s = settings
        self._xs = [float(p[0]) for p in settings.valve_map]
        self._ys = [float(p[1]) for p in settings.valve_map]
        self._buf: deque[tuple[float, float]] = deque()
        self._filt_kw: float | None = None
        self._t: float | None = None
        self.source: FfSource = "none"
        self.power_kw: float | None = None  # the input used in the last update
        self.ff_pct = 0.0

    @property
    def settings(self) -> FeedforwardSettings:
        """The settings."""
        return self._s

    @property
    def filtered_kw(self) -> float | None:
        """The delayed, lagged power [kW], None before the first input."""
        return self._filt_kw

    def set_enabled(self, on: bool) -> None:
        """Switch feedforward on or off (the caller re-bases the PID: bumpless)."""
        self._s = self._s.model_copy(update={"enabled": on})

    def map_pct(self, power_kw: float) -> float:
        """The valve characteristic at ``power_kw`` (linear, clamped at the ends)."""
        xs, ys = self._xs, self._ys
        if power_kw <= xs[0]:
            return ys[0]
        if power_kw >= xs[-1]:
            return ys[-1]
        i = bisect.bisect_right(xs, power_kw) - 1
        return ys[i] + (ys[i + 1] - ys[i]) * (power_kw - xs[i]) / (xs[i + 1] - xs[i])

    def update(self, now: float, rack_power: Sample | None, heat_removed: Sample | None
               ) -> float:
        """Feed the inputs at monotonic time ``now`` [s]; returns the FF term [%] (0 when
        disabled or before any input)."""
        s = self._s
        dt = 0.0 if self._t is None else max(0.0, now - self._t)
        self._t = now
        p_kw: float | None = None
        delayed = True
        if (s.source == "rack_power" and rack_power is not None
                and rack_power.fresh(now, s.stale_after_s)):
            assert rack_power.value is not None
            p_kw = rack_power.value / 1000.0
            self.source = "rack_power"
        elif ((s.fallback_heat_removed or s.source == "heat_removed") and heat_removed is not None
              and heat_removed.fresh(now, s.stale_after_s)):
            assert heat_removed.value is not None
            p_kw = max(0.0, heat_removed.value) / s.liquid_fraction
            self.source = "heat_removed"
            delayed = False
        else:
            self.source = "none"
        self.power_kw = p_kw
        if p_kw is not None and math.isfinite(p_kw):
            x = p_kw
            if delayed and s.delay_s > 0.0:
                self._buf.append((now, p_kw))
                while len(self._buf) > 1 and self._buf[1][0] <= now - s.delay_s + 1e-9:
                    self._buf.popleft()
                x = self._buf[0][1]
            else:
                self._buf.clear()
                self._buf.append((now, p_kw))
            if self._filt_kw is None:
                self._filt_kw = x
            elif s.lag_s > 0.0:
                self._filt_kw += (x - self._filt_kw) * (1.0 - math.exp(-dt / s.lag_s))
            else:
                self._filt_kw = x
        if not s.enabled or self._filt_kw is None:
            self.ff_pct = 0.0
        else:
            self.ff_pct = s.gain * self.map_pct(self._filt_kw)
        return self.ff_pct
