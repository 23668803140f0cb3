"""Dynamic feedforward from the rack heat load to the facility valve (REFERENCE §2.2, §4.5).

Power is the *measured* disturbance: racky publishes the rack power (``racky/state/rack_power``,
1 Hz, docs/CONTRACTS.md); the heat reaches the CDU's heat exchanger only after the supply-pipe
transport, the rack's thermal mass and the return pipe (≈ 6 s + 14 s + 6 s, REFERENCE §1.7).
A *static* feedforward therefore over-reacts (the valve opens before the heat arrives,
REFERENCE §4.5: 1.18 K on the down-step); a dynamic one, a pure delay about the transport
delay followed by a first-order lag, works much better. The lag trades tracking for valve
wear: REFERENCE §4.5 found 10 s gives 0.15 K on S1 but moves the valve 53 % of the time on
the agentic burst train, and recommends **a 30 s lag with a 0.1 K deadband and a 1 % minimum
step** (the deadband and step are `valvey.core.supply_loop`'s defaults; the delay and lag
defaults here were chosen on the plant family of `sims.cdu.variants`: ``delay_s``, ``lag_s``).

The filtered power is turned into a valve position by a characteristic (``valve_map``:
rack IT power kW → valve %, linear between points). Its default is REFERENCE §4.4's steady
state at 45 °C supply and 40 °C facility water [D], the commissioning data a real site
replaces. Only its *slope* matters dynamically: the PID's integrator holds the offset (the
map's error at another facility-water temperature), and every change of the FF is added to
the valve command at once (``u = P + I + D + FF``).

**A row CDU** (``racks``: the racks it cools, by name): the power is the *sum* of every
listed rack's racky ``state/rack_power`` (samples ``rack_power_w.<rack>``, `sample_names`),
used only while *every one* is fresh: a rack whose power is stale, missing or implausible is
never counted as 0 W (that would close the valve under a rack at full load); the whole sum
falls back as one source (below), ``missing_racks`` names the racks at fault (the state's
``feedforward.missing_racks``) and ``feedforward_source_lost`` alarms. ``valve_map``'s powers
are per rack (``map_per_rack``, default): REFERENCE §4.4's map is that of a CDU sized for
one rack, and a row CDU is sized for its racks, so the map is read at the total over the
number of racks (the mean rack power; the heat_removed fallback likewise). The filtered power,
the state's ``power_kw`` / ``filtered_kw`` and the learned map are then per rack.

Source selection: racky's rack power while fresh (``stale_after_s``); otherwise the CDU's
heat-removed figure (``heat_removed_kw`` / the liquid fraction, learned from the plant by
`valvey.core.capacity`), which lags the load by the
loop's own delays (so no extra delay is applied to it); otherwise the filter holds its last
value (the loop goes on as PID-only from there). A source change feeds the same filter, so
the FF never jumps.

**The map learned online** (``adapt_map``, issue 21). ``valve_map`` is only the cold-start
prior: the plant a site really has (another valve rangeability, a fouled exchanger, starved
facility water) needs other positions. `DynamicFeedforward.observe` is fed each loop period;
after a steady state of ``adapt_steady_s`` (supply within ``adapt_band_k``, power within
``adapt_power_pct``, valve within ±``adapt_band_pct``, the loop in auto and nothing holding
it) the two map points around the filtered power move ``adapt_rate`` of the way to the valve
seen (weighted by distance), within ``adapt_max_correction_pct`` of the prior, 0–100 %, never
falling with power. The change at the present power is taken into an offset so that the
valve sees no step, and the offset fades with ``adapt_blend_s`` (the integrator takes it
over). The learned map is in the state, persisted by the daemon (valvey.persist) and
forgotten by `reset_map` (``reset_learned``).

Pure: `DynamicFeedforward.update` is called once per supply-loop period with the time.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import Field, model_validator

from rackplane.config import StrictModel
from rackplane.core.names import check_topic_level
from rackplane.core.samples import Sample

__all__ = ["REFERENCE_VALVE_MAP", "DynamicFeedforward", "FeedforwardSettings", "FfSource",
           "sample_names"]

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
        0.0, ge=0, le=120, description="pure delay on the rack power, s. 0 (default): no "
        "assumption about the plant's transport delay; the nominal plant's 6 s supply-pipe "
        "transport (REFERENCE §1.7) fails S1 on a plant with half the pipe volume or a slower "
        "valve (docs/VALVEY.md, tuning)"
    )
    lag_s: float = Field(
        20.0, ge=0, le=600, description="first-order lag, s [D]: REFERENCE §4.5 recommends 30 s "
        "as the starting point; 20 s with no delay holds S1 within 0.44 K on every plant "
        "variant of sims.cdu.variants (docs/VALVEY.md, tuning)"
    )
    gain: float = Field(1.0, ge=0, le=3, description="scales the map's change (1 = as mapped)")
    valve_map: list[tuple[float, float]] = Field(
        default_factory=lambda: list(REFERENCE_VALVE_MAP),
        min_length=2,
        description="rack IT power [kW] -> valve [%], rising in both (REFERENCE §4.4 [D])",
    )
    racks: list[str] = Field(
        default_factory=list, max_length=32, description="the racks this CDU cools (a row "
        "CDU), by the rack names racky publishes under: the feedforward sums their "
        "state/rack_power (the sensors.rack_power topic with {rack} = each name, samples "
        "rack_power_w.<rack>), and falls back (feedforward_source_lost) while any one is "
        "stale, missing or implausible. Empty (default): the one rack of safety.rack_power"
    )
    map_per_rack: bool = Field(
        True, description="valve_map's powers are one rack's (REFERENCE §4.4: a CDU sized for "
        "its racks): on a row CDU the map is read at the total power / the number of "
        "feedforward.racks. false: valve_map is the whole CDU's (a CDU not sized per rack)"
    )
    stale_after_s: float = Field(
        5.0, gt=0, le=60, description="rack power older than this falls back (racky: 1 Hz)"
    )
    fallback_heat_removed: bool = Field(
        True, description="use the CDU's heat_removed_kw / liquid_fraction when rack power is "
        "stale (it already lags: no delay applied)"
    )
    liquid_fraction: float | None = Field(
        None, gt=0, le=1, description="share of IT power to liquid for the heat_removed "
        "source, 0-1. None (default): the one the capacity guard uses, learned from the plant "
        "as heat removed / rack power at steady state (capacity.liquid_fraction until then); "
        "a value here overrides it"
    )
    adapt_map: bool = Field(
        True, description="adapt valve_map online from the steady states seen (valve_map is "
        "the cold-start prior; module docstring)"
    )
    adapt_steady_s: float = Field(
        120.0, ge=10, le=3600, description="a steady state lasts this long: supply within "
        "adapt_band_k of the setpoint, power within adapt_power_pct, valve within 2 × "
        "adapt_band_pct"
    )
    adapt_band_k: float = Field(0.15, gt=0, le=2, description="steady supply error band, K")
    adapt_power_pct: float = Field(
        3.0, gt=0, le=50, description="steady power band, % of the window's first power")
    adapt_band_pct: float = Field(1.0, gt=0, le=10, description="steady valve half-band, %")
    adapt_rate: float = Field(
        0.5, gt=0, le=1, description="share of a steady state's map error corrected at once")
    adapt_blend_s: float = Field(
        600.0, ge=0, le=7200, description="a learned map change at the present power fades "
        "into the feedforward with this time constant, s (the integrator takes it over "
        "smoothly); 0: it stays as an offset"
    )
    adapt_max_correction_pct: float = Field(
        30.0, ge=0, le=100, description="bound of the learned map's departure from valve_map "
        "at each point, %"
    )

    @model_validator(mode="after")
    def _check(self) -> FeedforwardSettings:
        for r in self.racks:
            check_topic_level(r, "feedforward.racks: rack name")
        if len(set(self.racks)) != len(self.racks):
            raise ValueError("feedforward.racks: names must be distinct")
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


def sample_names(settings: FeedforwardSettings, base: str) -> list[str]:
    """The sample name of each rack of ``settings.racks`` (``<base>.<rack>``; ``base``: the
    rack power sensor's name, ``rack_power_w`` by default); empty for one rack."""
    return [f"{base}.{r}" for r in settings.racks]


class DynamicFeedforward:
    """Delay + first-order lag on the rack power, mapped to a valve position.

    Args:
        settings: `FeedforwardSettings`.
        rack_sample: the rack power sensor's sample name (``sensors.rack_power``): a row
            CDU's racks are ``<rack_sample>.<rack>`` (`sample_names`, `rack_input`).
    """

    def __init__(self, settings: FeedforwardSettings, rack_sample: str | None = "rack_power_w"):
        self._s = settings
        self._rack_samples = [] if rack_sample is None else sample_names(settings, rack_sample)
        self._xs = [float(p[0]) for p in settings.valve_map]
        self._ys = [float(p[1]) for p in settings.valve_map]
        self._buf: deque[tuple[float, float]] = deque()
        self._filt_kw: float | None = None
        self._t: float | None = None
        self.source: FfSource = "none"
        self.power_kw: float | None = None  # the input used in the last update
        self.missing_racks: list[str] = []  # row CDU: racks whose power was not fresh
        self.ff_pct = 0.0
        self._prior = list(self._ys)
        self._offset = 0.0  # keeps the FF continuous when the map is corrected (bumpless)
        self._win: list[float] | None = None  # steady window: t0, p0, v_min, v_max
        self.adaptations = 0  # steady states learned from (saturates at 10**9)

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

    def set_gain(self, gain: float) -> None:
        """A new ``gain`` (commissioning; the caller re-bases the PID: bumpless).

        Raises:
            ValueError: outside the settings' bounds (0..3).
        """
        self._s = type(self._s).model_validate({**self._s.model_dump(), "gain": gain})

    def map_pct(self, power_kw: float) -> float:
        """The valve characteristic at ``power_kw`` (linear, clamped at the ends)."""
        xs, ys = self._xs, self._ys
        if power_kw <= xs[0]:
            return ys[0]
        if power_kw >= xs[-1]:
            return ys[-1]
        i = bisect.bisect_right(xs, power_kw) - 1
        return ys[i] + (ys[i + 1] - ys[i]) * (power_kw - xs[i]) / (xs[i + 1] - xs[i])

    def update(self, now: float, rack_power: Sample | Sequence[Sample | None] | None,
               heat_removed: Sample | None, liquid_fraction: float = 1.0) -> float:
        """Feed the inputs at monotonic time ``now`` [s]; returns the FF term [%] (0 when
        disabled or before any input).

        ``liquid_fraction`` (0-1): the share of the rack power reaching the liquid, which turns
        the heat_removed source [kW] into rack power; the caller passes the one it learned
        (`valvey.core.liquid_fraction.LiquidFraction`); ``settings.liquid_fraction``, when set,
        overrides it. Outside (0, 1.05] it is not used (1.0 then).

        ``rack_power``: the rack's power sample [W], or on a row CDU one sample (or None)
        per rack of ``settings.racks``, in that order: their sum while every one is fresh,
        else the fallback (``missing_racks`` names the others).

        Raises:
            ValueError: a sequence of another length than ``settings.racks``.
        """
        s = self._s
        dt = 0.0 if self._t is None else max(0.0, now - self._t)
        self._t = now
        p_kw: float | None = None
        delayed = True
        rack_w = self._rack_power_w(now, rack_power)
        per = len(s.racks) if s.map_per_rack and s.racks else 1  # the map's powers per rack
        if s.source == "rack_power" and rack_w is not None:
            p_kw = rack_w / 1000.0 / per
            self.source = "rack_power"
        elif ((s.fallback_heat_removed or s.source == "heat_removed") and heat_removed is not None
              and heat_removed.fresh(now, s.stale_after_s)):
            assert heat_removed.value is not None
            f_liq = s.liquid_fraction if s.liquid_fraction is not None else liquid_fraction
            if not 0.0 < f_liq <= 1.05:  # NaN too
                f_liq = 1.0
            p_kw = max(0.0, heat_removed.value) / f_liq / per
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
        if self._offset and s.adapt_blend_s > 0.0:  # a map change fades in (module docstring)
            self._offset *= math.exp(-dt / s.adapt_blend_s)
            if abs(self._offset) < 1e-6:
                self._offset = 0.0
        if not s.enabled or self._filt_kw is None:
            self.ff_pct = 0.0
        else:
            self.ff_pct = s.gain * self.map_pct(self._filt_kw) + self._offset
        return self.ff_pct

    def rack_input(self, samples: Mapping[str, Sample], point: str
                   ) -> Sample | list[Sample | None] | None:
        """The rack power input of `update` from ``samples``: the sample of ``point`` (one
        rack), or on a row CDU each listed rack's sample (None where there is none)."""
        if self._rack_samples:
            return [samples.get(n) for n in self._rack_samples]
        return samples.get(point)

    def _rack_power_w(self, now: float, rack_power: Sample | Sequence[Sample | None] | None
                      ) -> float | None:
        """The rack power [W] while fresh: one sample, or the sum over a row's racks while
        every one is fresh (module docstring); None otherwise."""
        s = self._s
        if rack_power is None or isinstance(rack_power, Sample):
            self.missing_racks = []
            if rack_power is not None and rack_power.fresh(now, s.stale_after_s):
                assert rack_power.value is not None
                return rack_power.value
            return None
        if len(rack_power) != len(s.racks):
            raise ValueError(f"{len(rack_power)} rack power samples for "
                             f"{len(s.racks)} racks in feedforward.racks")
        total = 0.0
        missing = []
        for name, x in zip(s.racks, rack_power, strict=True):
            if x is None or not x.fresh(now, s.stale_after_s):
                missing.append(name)
            else:
                assert x.value is not None
                total += x.value
        self.missing_racks = missing
        return None if missing or not s.racks else total

    # --- the map learned online -----------------------------------------------------------

    @property
    def valve_map(self) -> list[tuple[float, float]]:
        """The map in use (learned over the prior), ``[(power_kw, valve_pct), ...]``."""
        return list(zip(self._xs, self._ys, strict=True))

    @property
    def map_learned(self) -> bool:
        """The map departs from the configured prior."""
        return self._ys != self._prior

    def observe(self, now: float, valve_pct: float | None, error_k: float | None,
                steady_ok: bool) -> bool:
        """Feed one loop period: the valve command [%] and the supply error [K];
        ``steady_ok`` False (not in auto, held, interlock, step test, no power source)
        restarts the window. After ``adapt_steady_s`` of a steady state the map point(s)
        around the filtered power move ``adapt_rate`` of the way to the valve seen, within
        ``adapt_max_correction_pct`` of the prior, monotone, 0–100 %; the FF stays
        continuous (the change is taken into an offset). Returns True when it learned."""
        s = self._s
        p = self._filt_kw if self.source != "none" else None
        if (not (s.adapt_map and steady_ok) or p is None or valve_pct is None
                or error_k is None or not math.isfinite(valve_pct)
                or abs(error_k) > s.adapt_band_k):
            self._win = None
            return False
        w = self._win
        if (w is None or abs(p - w[1]) > 0.01 * s.adapt_power_pct * max(w[1], 1.0)
                or max(w[3], valve_pct) - min(w[2], valve_pct) > 2.0 * s.adapt_band_pct):
            self._win = [now, p, valve_pct, valve_pct]
            return False
        w[2] = min(w[2], valve_pct)
        w[3] = max(w[3], valve_pct)
        if now - w[0] < s.adapt_steady_s:
            return False
        self._win = None
        self._learn(p, 0.5 * (w[2] + w[3]))
        return True

    def _learn(self, p_kw: float, valve_pct: float) -> None:
        s = self._s
        xs, ys = self._xs, self._ys
        before = self.map_pct(p_kw)
        # the map is the valve that holds the setpoint at a power: what was seen, less it
        err = valve_pct - before
        i = max(0, min(len(xs) - 2, bisect.bisect_right(xs, p_kw) - 1))
        t = min(1.0, max(0.0, (p_kw - xs[i]) / (xs[i + 1] - xs[i])))
        for k, wk in ((i, 1.0 - t), (i + 1, t)):
            lo = max(0.0, self._prior[k] - s.adapt_max_correction_pct)
            hi = min(100.0, self._prior[k] + s.adapt_max_correction_pct)
            ys[k] = min(hi, max(lo, ys[k] + s.adapt_rate * wk * err))
        for k in range(1, len(ys)):  # monotone: more power never needs less valve
            if ys[k] < ys[k - 1]:
                ys[k] = ys[k - 1]
        if self.adaptations < 10**9:
            self.adaptations += 1
        self._rebase(p_kw, before)

    def _rebase(self, p_kw: float, before: float) -> None:
        """Keep the FF where it was after a map change (bumpless: the loop sees no step)."""
        g = self._s.gain
        self._offset -= g * (self.map_pct(p_kw) - before)
        if self._filt_kw is not None and self._s.enabled:
            self.ff_pct = g * self.map_pct(self._filt_kw) + self._offset

    def restore_map(self, valve_pct: list[float] | tuple[float, ...]) -> bool:
        """Lay a saved learned map (valve % at the prior's powers) over the prior; refused
        (False, nothing changes) unless it has one finite value per point, each within
        ``adapt_max_correction_pct`` of the prior and 0–100 %, not falling with power."""
        s = self._s
        if len(valve_pct) != len(self._prior):
            return False
        vals = []
        for v, pr in zip(valve_pct, self._prior, strict=True):
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
                    or not 0.0 <= v <= 100.0 or abs(v - pr) > s.adapt_max_correction_pct + 0.01:
                return False
            vals.append(float(v))
        if any(b < a for a, b in itertools.pairwise(vals)):
            return False
        p = self._filt_kw
        before = None if p is None else self.map_pct(p)
        self._ys = vals
        if p is not None and before is not None:
            self._rebase(p, before)
        return True

    def reset_map(self) -> None:
        """Back to the configured prior (bumpless)."""
        p = self._filt_kw
        before = None if p is None else self.map_pct(p)
        self._ys = list(self._prior)
        self.adaptations = 0
        self._win = None
        if p is not None and before is not None:
            self._rebase(p, before)
