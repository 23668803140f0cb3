"""Leak tiers, rack liquid isolation and the over-temperature / low-flow interlocks. Pure;
`Safety.step` runs on every 10 Hz tick.

**Leak tiers** (REFERENCE §5 S6 and §8, following NVIDIA NICo / DSX practice):

* one tray's leak sensor wet → a leak event and ``power_down_trays {trays}`` to racky at once
  (S6 b: the tray is off ≤ 5 s after the sensor trips);
* ``rack_tier_tray_count`` (default 2: the safer reading of NICo's "> 2" / "≥ 2", §8) trays
  wet, or a rack-level sensor (the drip pan) or the CDU's rope sensor wet → ``power_down_rack``
  first, then the rack's liquid is isolated (``rack_isolation_command`` = 0) once racky
  confirms the power is low (its reply's ``power_confirmed_low``, or the rack power reading at
  or below ``power_low_w``) or after ``isolation_timeout_s``: a powered rack without flow
  reaches GPU shutdown in ≈ 16 s (REFERENCE §1.7, §4.5), which the GPUs survive; flooding is
  the worse harm;
* a leak-sensor fault (a sensor's fault flag, or a leak source gone stale) raises an alarm and
  **never** isolates (S6 e).

Every tier latches until the operator's ``reset_leak`` (and only when no sensor is wet);
reopening the isolation valves is a separate, explicit choice of that command.

**Interlocks** (no start-up inhibit, no lease, no blast-radius limit: they act from the first
tick on their own inputs):

* over-temperature: the supply ≥ setpoint + ``overtemp_k`` for ``overtemp_delay_s`` → the
  facility valves are forced fully open (while the supply is at or above setpoint +
  ``overtemp_clear_k``, or unknown) and racky is asked for a cap; cleared below setpoint
  + ``overtemp_clear_k`` for ``overtemp_clear_s``;
* low flow: flow < ``low_flow_fraction`` of design (the site's ``design_flow_lpm``, else
  learned: `valvey.core.design_flow`) for ``low_flow_delay_s`` (outside a pump
  changeover) → a cap; flow < ``no_flow_fraction`` for ``no_flow_delay_s`` → ``power_down_rack``
  (REFERENCE §4.5: slowdown ≈ 5 s and GPU shutdown ≈ 16 s after flow loss);
* rate of rise of the supply > ``rise_k_per_s`` for ``rise_s`` (REFERENCE §3.4: loss of heat
  rejection) → an alarm.

Inventory: a falling reservoir level (slope over ``level_window_s`` steeper than
``level_drop_pct_per_min``) raises ``coolant_inventory_loss`` (REFERENCE §5 S6 a: a weep found
by the inventory trend, ≤ 10 min); below ``level_low_pct``: ``reservoir_level_low``.
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

from pydantic import Field, model_validator

from rackplane.config import StrictModel
from rackplane.core.samples import Sample, fresh_value
from valvey.core.design_flow import DesignFlow

__all__ = ["Safety", "SafetySettings", "SafetyStep"]


class SafetySettings(StrictModel):
    """Leak response and interlocks (module docstring; REFERENCE §5 S6, §8, §3.4)."""

    n_trays: int = Field(18, ge=1, le=256, description="compute trays (NVL72: 18)")
    tray_leak: str = Field("leak_tray", description="MQTT sensor name (index list: .NN)")
    tray_sensor_fault: str = Field("leak_tray_sensor_fault")
    drip_pan_leak: str | None = Field("leak_drip_pan")
    drip_pan_sensor_fault: str | None = Field("leak_drip_pan_sensor_fault")
    rope_leak: str | None = Field("leak_rope_detected", description="CDU register")
    rope_sensor_fault: str | None = Field("leak_rope_sensor_fault", description="CDU register")
    rack_tier_tray_count: int = Field(
        2, ge=1, le=256, description="this many wet trays isolate the rack (REFERENCE §8)"
    )
    isolation_command: str | None = Field("rack_isolation_command")
    isolation_closed: str | None = Field("rack_isolation_closed")
    isolation_timeout_s: float = Field(
        10.0, ge=0, le=300, description="isolate without racky's confirmation after this [U]"
    )
    power_low_w: float = Field(
        15_000.0, ge=0, description="rack power at/below this counts as 'powered down' [U]"
    )
    rack_power: str = Field("rack_power_w", description="MQTT sensor name")
    overtemp_k: float = Field(5.0, gt=0, le=20, description="supply ≥ setpoint + this [U]")
    overtemp_delay_s: float = Field(5.0, ge=0)
    overtemp_clear_k: float = Field(2.0, ge=0)
    overtemp_clear_s: float = Field(60.0, ge=0)
    design_flow_lpm: float | None = Field(
        None, gt=0, description="the loop's design flow the low/no-flow interlocks and the "
        "flow warning judge against, L/min: the site's figure (the rack vendor's; REFERENCE "
        "§1.4: 1.5 L/min per kW, 1.2-2.0 in use). None: learned from the plant, the highest "
        "steady flow delivered while healthy (valvey.core.design_flow; before it, the highest "
        "flow seen), never followed down"
    )
    low_flow_fraction: float = Field(0.5, gt=0, lt=1)
    low_flow_delay_s: float = Field(2.0, ge=0)
    no_flow_fraction: float = Field(0.15, gt=0, lt=1)
    no_flow_delay_s: float = Field(5.0, ge=0)
    flow_warn_fraction: float = Field(
        0.9, gt=0, le=1, description="flow_low warning (Vertiv: 90 % of setpoint, 100 s)"
    )
    flow_warn_delay_s: float = Field(100.0, ge=0)
    rise_k_per_s: float = Field(0.2, gt=0, description="REFERENCE §3.4")
    rise_s: float = Field(5.0, gt=0)
    reservoir_level: str | None = Field("reservoir_level_pct")
    level_window_s: float = Field(120.0, gt=10, le=3600)
    level_drop_pct_per_min: float = Field(
        0.3, gt=0, description="a 0.2 L/min weep drains a 20 L reservoir at 1 %/min [D]"
    )
    level_low_pct: float = Field(20.0, ge=0, le=100)
    filter_dp: str | None = Field("filter_diff_pressure_kpa")
    filter_dp_high_kpa: float = Field(60.0, gt=0, description="Vertiv: 0.6 bar (REF §1.5)")
    stale_after_s: float = Field(
        3.0, gt=0, description="a CDU point (register map) is good until this long after its "
        "last good read (failed polls in between do not end it), for the safety functions, "
        "the selector and the capacity guard; MQTT sensors have their own"
    )

    @model_validator(mode="after")
    def _bands(self) -> SafetySettings:
        # the interlock forces the valves open only while the supply is at or above
        # setpoint + overtemp_clear_k: a clear band at or above the trip band would trip the
        # interlock without ever opening them; a no-flow band above the low-flow band would
        # power the rack down before the cap
        if self.overtemp_clear_k >= self.overtemp_k:
            raise ValueError(f"overtemp_clear_k ({self.overtemp_clear_k}) must be below "
                             f"overtemp_k ({self.overtemp_k})")
        if self.no_flow_fraction >= self.low_flow_fraction:
            raise ValueError(f"no_flow_fraction ({self.no_flow_fraction}) must be below "
                             f"low_flow_fraction ({self.low_flow_fraction})")
        return self


@dataclass(frozen=True, slots=True)
class SafetyStep:
    """What `Safety.step` decided: writes (isolation valves), valve override (%) or None,
    the requests wanted (key -> (verb, args)), events (leak events to publish), alarm
    conditions, transitions, and flags for the capacity guard."""

    writes: list[tuple[str, float]]
    valve_override_pct: float | None
    wants: dict[str, tuple[str, dict[str, Any]]]
    events: list[dict[str, Any]]
    conditions: Mapping[str, bool]
    transitions: tuple[str, ...]
    over_temperature: bool
    low_flow: bool
    isolated: bool


@dataclass(slots=True)
class _Timer:
    since: float | None = None

    def hold(self, cond: bool, now: float, delay: float) -> bool:
        if not cond:
            self.since = None
            return False
        if self.since is None:
            self.since = now
        return now - self.since >= delay - 1e-9


@dataclass(slots=True)
class _LeakState:
    trays_down: set[int] = field(default_factory=set)
    rack_tier: str | None = None
    rack_tier_t: float | None = None
    isolation: str = "open"  # open | pending | closing | closed
    isolation_t: float | None = None
    last_write_t: float = float("-inf")


def _on(s: Sample | None, now: float, stale: float) -> bool | None:
    """True/False for a fresh bool sample, None when unknown."""
    v = fresh_value(s, now, stale)
    return None if v is None else v >= 0.5


_num = fresh_value  # value if usable and fresh, else None


class Safety:
    """Leak tiers, isolation and interlocks (module docstring).

    Args:
        settings: `SafetySettings`.
        stale_of: per sample name, its stale limit [s] (MQTT sensors have their own).
    """

    def __init__(self, settings: SafetySettings, stale_of: Mapping[str, float] | None = None):
        self.s = settings
        self._stale = dict(stale_of or {})
        self.leak = _LeakState()
        self._overtemp = False
        self._ot_on = _Timer()
        self._ot_off = _Timer()
        self._low = _Timer()
        self._none = _Timer()
        self._warn = _Timer()
        self._rise = _Timer()
        self.design_flow = DesignFlow(settings.design_flow_lpm)
        self._last_pv: tuple[float, float] | None = None
        self._levels: deque[tuple[float, float]] = deque()
        self._pending: list[str] = []
        self._no_flow_latched = False
        self.detected: dict[str, float] = {}  # first detection times (figures)
        self._tray_names = [f"{settings.tray_leak}.{i:02d}" for i in range(settings.n_trays)]
        self._fault_names = [f"{settings.tray_sensor_fault}.{i:02d}"
                             for i in range(settings.n_trays)]
        self._scan_cache: list[tuple[Sample, set[int]] | None] = [None, None]
        self._losing = False

    def _st(self, name: str) -> float:
        return self._stale.get(name, self.s.stale_after_s)

    # --- operator --------------------------------------------------------------------------

    def reset_leak(self, samples: Mapping[str, Sample], now: float, *, reopen: bool
                   ) -> list[tuple[str, float]]:
        """Clear the leak latches (operator, after repair). Returns writes (the isolation
        valves opened when ``reopen``).

        Raises:
            ValueError: a leak sensor still reads wet.
        """
        wet = self._wet_trays(samples, now)
        rope = _on(samples.get(self.s.rope_leak), now, self._st(self.s.rope_leak)) \
            if self.s.rope_leak else None
        pan = _on(samples.get(self.s.drip_pan_leak), now, self._st(self.s.drip_pan_leak)) \
            if self.s.drip_pan_leak else None
        if wet or rope or pan:
            raise ValueError(f"leak sensors still wet (trays {sorted(wet)}, rope {bool(rope)}, "
                             f"drip pan {bool(pan)}): dry them first")
        self.leak = _LeakState() if reopen else _LeakState(isolation=self.leak.isolation)
        self._no_flow_latched = False
        self._pending.append("safety:leak_reset")
        writes: list[tuple[str, float]] = []
        if reopen and self.s.isolation_command is not None:
            writes.append((self.s.isolation_command, 1.0))
        return writes

    # --- the step --------------------------------------------------------------------------

    def _wet_trays(self, samples: Mapping[str, Sample], now: float) -> set[int]:
        return self._scan(samples, now, self._tray_names, self.s.tray_leak, 0)

    def _scan(self, samples: Mapping[str, Sample], now: float, names: list[str], key: str,
              slot: int) -> set[int]:
        """Indices whose bool sample is on. The per-index samples of one message arrive
        together: they are re-read only when the first one is a new object (1 Hz, not 10 Hz);
        staleness is judged on every call."""
        first = samples.get(names[0]) if names else None
        cached = self._scan_cache[slot]
        st = self._st(key)
        if first is None or first.age_s(now) > st:
            return set()
        if cached is not None and cached[0] is first:
            return cached[1]
        out = {i for i, n in enumerate(names) if _on(samples.get(n), now, st)}
        self._scan_cache[slot] = (first, out)
        return out

    def step(
        self,
        now: float,
        samples: Mapping[str, Sample],
        *,
        pv_c: float | None,
        setpoint_c: float,
        flow_lpm: float | None,
        pump_handoff: bool,
        racky_power_low: bool,
    ) -> SafetyStep:
        """One tick (module docstring)."""
        s = self.s
        writes: list[tuple[str, float]] = []
        wants: dict[str, tuple[str, dict[str, Any]]] = {}
        events: list[dict[str, Any]] = []
        cond: dict[str, bool] = {}
        lk = self.leak
        # --- leak sensors ---
        wet = self._wet_trays(samples, now)
        st_tray = self._st(s.tray_leak)
        tray_known = _on(samples.get(self._tray_names[0]), now, st_tray) is not None
        faults = sorted(self._scan(samples, now, self._fault_names, s.tray_sensor_fault, 1))
        rope = _on(samples.get(s.rope_leak), now, self._st(s.rope_leak)) if s.rope_leak \
            else None
        rope_fault = _on(samples.get(s.rope_sensor_fault), now,
                         self._st(s.rope_sensor_fault)) if s.rope_sensor_fault else None
        pan = _on(samples.get(s.drip_pan_leak), now, self._st(s.drip_pan_leak)) \
            if s.drip_pan_leak else None
        pan_fault = _on(samples.get(s.drip_pan_sensor_fault), now,
                        self._st(s.drip_pan_sensor_fault)) if s.drip_pan_sensor_fault else None
        unknown = [n for n, v in (("trays", tray_known or None), ("rope", rope),
                                  ("drip_pan", pan)) if v is None and self._configured(n)]
        new_trays = sorted(wet - lk.trays_down)
        if new_trays:
            lk.trays_down |= set(new_trays)
            self.detected.setdefault("tray_leak", now)
            events.append({"kind": "tray_leak", "trays": new_trays, "t_mono": now,
                           "action": "power_down_trays"})
            self._pending.append(f"safety:tray_leak:{new_trays}")
        if lk.trays_down:
            wants["power_down_trays"] = ("power_down_trays", {
                "trays": sorted(lk.trays_down), "reason": "tray leak sensor wet"})
        tier = None
        if len(lk.trays_down) >= s.rack_tier_tray_count:
            tier = f"{len(lk.trays_down)} trays leaking"
        elif rope:
            tier = "CDU rope leak sensor wet"
        elif pan:
            tier = "rack drip-pan leak sensor wet"
        if tier is not None and lk.rack_tier is None:
            lk.rack_tier, lk.rack_tier_t = tier, now
            lk.isolation = "pending"
            self.detected.setdefault("rack_leak", now)
            events.append({"kind": "rack_leak", "reason": tier, "t_mono": now,
                           "action": "power_down_rack, then isolate"})
            self._pending.append(f"safety:rack_leak:{tier}")
        if lk.rack_tier is not None:
            wants["power_down_rack"] = ("power_down_rack", {"reason": f"leak: {lk.rack_tier}"})
        # --- no flow: an orderly power-down beats a thermal shutdown ---
        isolated_now = lk.isolation in ("closing", "closed")
        self.design_flow.update(now, flow_lpm, healthy=not pump_handoff and lk.isolation == "open")
        design = self.design_flow.value_lpm
        flow_frac = None if flow_lpm is None or design is None else flow_lpm / design
        no_flow = self._none.hold(
            flow_frac is not None and flow_frac < s.no_flow_fraction and not isolated_now,
            now, s.no_flow_delay_s)
        if no_flow and not self._no_flow_latched:
            self._no_flow_latched = True
            self.detected.setdefault("no_flow", now)
            events.append({"kind": "no_flow", "t_mono": now, "action": "power_down_rack"})
            self._pending.append("safety:no_flow")
        if self._no_flow_latched and "power_down_rack" not in wants:
            wants["power_down_rack"] = ("power_down_rack", {"reason": "no coolant flow"})
        # --- isolation sequence ---
        rack_power = _num(samples.get(s.rack_power), now, self._st(s.rack_power))
        if lk.isolation == "pending":
            assert lk.rack_tier_t is not None
            confirmed = racky_power_low or (rack_power is not None
                                            and rack_power <= s.power_low_w)
            timeout = now - lk.rack_tier_t >= s.isolation_timeout_s - 1e-9
            if confirmed or timeout:
                lk.isolation, lk.isolation_t = "closing", now
                self.detected.setdefault("isolation", now)
                why = "power confirmed low" if confirmed else "timeout"
                events.append({"kind": "isolation", "t_mono": now, "why": why})
                self._pending.append(f"safety:isolate:{why}")
        if lk.isolation == "closing" and s.isolation_command is not None:
            closed = _on(samples.get(s.isolation_closed), now, s.stale_after_s) \
                if s.isolation_closed else None
            if closed:
                lk.isolation = "closed"
                self._pending.append("safety:isolated")
            elif now - lk.last_write_t >= 2.0 - 1e-9:
                lk.last_write_t = now
                writes.append((s.isolation_command, 0.0))
        # --- interlocks ---
        hot = pv_c is not None and pv_c >= setpoint_c + s.overtemp_k
        if not self._overtemp:
            if self._ot_on.hold(hot, now, s.overtemp_delay_s):
                self._overtemp = True
                self._ot_off = _Timer()
                self.detected.setdefault("over_temperature", now)
                self._pending.append("safety:over_temperature:on")
        else:
            cool = pv_c is not None and pv_c < setpoint_c + s.overtemp_clear_k
            if self._ot_off.hold(cool, now, s.overtemp_clear_s):
                self._overtemp = False
                self._ot_on = _Timer()
                self._pending.append("safety:over_temperature:off")
        low = self._low.hold(
            flow_frac is not None and flow_frac < s.low_flow_fraction and not pump_handoff
            and not isolated_now, now, s.low_flow_delay_s)
        warn = self._warn.hold(flow_frac is not None and flow_frac < s.flow_warn_fraction
                               and not isolated_now, now, s.flow_warn_delay_s)
        rising = False
        if pv_c is not None:
            if self._last_pv is not None and now > self._last_pv[0]:
                rate = (pv_c - self._last_pv[1]) / (now - self._last_pv[0])
                rising = self._rise.hold(rate > s.rise_k_per_s, now, s.rise_s)
            self._last_pv = (now, pv_c)
        # --- inventory ---
        lvl = _num(samples.get(s.reservoir_level), now, s.stale_after_s) \
            if s.reservoir_level else None
        if lvl is None:
            self._losing = False
        else:
            q = self._levels
            if not q or now - q[-1][0] >= 1.0 - 1e-9:  # the trend: one point a second
                q.append((now, lvl))
                while q and now - q[0][0] > s.level_window_s:
                    q.popleft()
                self._losing = (len(q) >= 10 and q[-1][0] - q[0][0] >= 0.8 * s.level_window_s
                                and self._slope_per_min(q) < -s.level_drop_pct_per_min)
        losing = self._losing
        fdp = _num(samples.get(s.filter_dp), now, s.stale_after_s) if s.filter_dp else None
        cond["leak_tray"] = bool(lk.trays_down)
        cond["leak_rack"] = lk.rack_tier is not None
        cond["rack_isolated"] = lk.isolation in ("closing", "closed")
        cond["leak_sensor_fault"] = bool(faults) or bool(rope_fault) or bool(pan_fault)
        cond["leak_sensor_unavailable"] = bool(unknown)
        cond["supply_temp_high_interlock"] = self._overtemp
        cond["flow_low_interlock"] = low
        cond["no_flow_power_down"] = self._no_flow_latched
        cond["flow_low"] = warn
        cond["supply_temp_rising"] = rising
        cond["coolant_inventory_loss"] = losing
        cond["reservoir_level_low"] = lvl is not None and lvl < s.level_low_pct
        cond["filter_dp_high"] = fdp is not None and fdp > s.filter_dp_high_kpa
        if cond["leak_sensor_fault"]:
            self.detected.setdefault("leak_sensor_fault", now)
        trans, self._pending = tuple(self._pending), []
        # the valves are forced open while the supply is still hot; below setpoint + clear_k
        # the loop has them back (bumpless from 100 %) while the interlock, its alarm and cap
        # stay on for overtemp_clear_s: holding them open to the end overcooled the supply
        # by ~4 K once the facility water recovered (tests/scenarios/test_valvey_overtemp_...)
        force_open = self._overtemp and not (
            pv_c is not None and pv_c < setpoint_c + s.overtemp_clear_k)
        return SafetyStep(writes, 100.0 if force_open else None, wants, events, cond, trans,
                          self._overtemp, low, lk.isolation in ("closing", "closed"))

    def _configured(self, what: str) -> bool:
        s = self.s
        return {"trays": True, "rope": s.rope_leak is not None,
                "drip_pan": s.drip_pan_leak is not None}[what]

    @staticmethod
    def _slope_per_min(q: deque[tuple[float, float]]) -> float:
        # Least-squares slope. Written with map() over C builtins (about 120 points once a
        # second); each term and each sum is the same operation in the same order as
        # ``sum((t - mt) * (v - mv) for t, v in q)`` and ``sum((t - mt) ** 2 ...)``.
        n = len(q)
        ts, vs = zip(*q, strict=True)
        mt = sum(ts) / n
        mv = sum(vs) / n
        dts = list(map(mt.__rsub__, ts))  # t - mt
        num = sum(map(operator.mul, dts, map(mv.__rsub__, vs)))
        den = sum(map(pow, dts, repeat(2)))  # (t - mt) ** 2
        return 0.0 if den <= 0 else 60.0 * num / den

    def state(self) -> dict[str, Any]:
        """JSON-ready state (retained ``state/safety``)."""
        lk = self.leak
        return {
            "trays_powered_down": sorted(lk.trays_down),
            "rack_leak": lk.rack_tier,
            "isolation": lk.isolation,
            "over_temperature": self._overtemp,
            "no_flow": self._no_flow_latched,
        }

