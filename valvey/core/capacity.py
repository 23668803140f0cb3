"""Cooling capacity and the rack power cap valvey asks racky for (``cap_rack`` /
``release_cap``, docs/CONTRACTS.md). Pure; `CapacityGuard.step` runs once per second.

When the cooling cannot hold the setpoint, the heat load has to come down: the facility water
too warm for the valve (REFERENCE §5 S9, racky derates along P_max(T_fws)), the valve stuck
with no spare (§5 S4: cap to the sustainable power, ≈ 36 % in the model), no standby pump
(§5 S3: cap within 2 s), the over-temperature interlock.

**Capacity estimate** [D] from the CDU's own measurements: the heat exchanger's conductance
``k = q_hx / (T_ret − T_fws)`` (q_hx = ``heat_removed_kw``, T_ret the return at the CDU, T_fws
the facility water; ε·C_min of REFERENCE §4.2 item 3, which depends on the two flows only).
Holding the supply at ``T_sp`` means ``T_ret = T_sp + q/C_s`` (C_s = ρc·Q), so the heat that
can be removed is ``q = k (T_sp − T_fws) / (1 − k/C_s)`` and the rack power is q over the
liquid fraction. With the valve fully open, k is the valve-open conductance ``k_open``
(remembered while the valve is at ≥ 99 %: measuring k with the valve throttled by the cap
itself would ratchet the cap down); with a stuck valve, k is measured at the stuck position.
The estimate follows T_fws, so a rising facility water temperature lowers the cap before the
supply temperature moves ("valve saturation anticipated", §5 S9).

**Cap** = the lowest of the reasons' caps, applied at once when lower (safety first), raised
at most ``raise_w_per_s`` (and only while the supply is at or below setpoint + 0.3 K), trimmed
by 5 % every ``trim_s`` while the supply stays above setpoint + ``trim_k`` (the estimate's
own error). The cap is released (``release_cap``) once no reason has held for
``release_hold_s`` and the cap has risen to the rack's maximum power: hysteresis by time and
by level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import Field

from rackplane.config import StrictModel

__all__ = ["CapacityGuard", "CapacitySettings", "CapacityStep", "capacity_w"]


class CapacitySettings(StrictModel):
    """Derating requests (module docstring)."""

    enabled: bool = Field(True, description="ask racky for caps (false: alarms only)")
    rack_max_power_w: float = Field(132_000.0, gt=0, description="REFERENCE §4.3: 132 kW")
    min_cap_w: float = Field(
        26_000.0, gt=0, description="lowest cap asked: the node agents refuse per-GPU caps "
        "below their minimum power limit (sims: 200 W per GPU → ≈ 25 kW per rack) [U]"
    )
    liquid_fraction: float = Field(0.85, gt=0, le=1, description="REFERENCE §4.3 [U]")
    coolant_rho_c_kj_per_l_k: float = Field(4.03, gt=0, description="PG25 (REFERENCE §1.4)")
    margin_fraction: float = Field(
        0.05, ge=0, le=0.5, description="cap this share below the power that holds the "
        "setpoint with the valve open, so the valve comes off its limit and the loop keeps "
        "control [D]; none with a stuck valve (no headroom to win back: the cap itself sets "
        "the supply temperature)"
    )
    saturated_pct: float = Field(
        99.0, gt=50, le=100, description="valve demand at/above this (and its position within "
        "2 % of it: a valve still travelling is not saturated): saturated"
    )
    engage_k: float = Field(0.2, ge=0, description="saturated and this far above setpoint")
    engage_s: float = Field(5.0, ge=0)
    trim_k: float = Field(0.5, ge=0)
    trim_s: float = Field(30.0, gt=0)
    raise_w_per_s: float = Field(
        200.0, gt=0, description="how fast a cap may rise (0 → 132 kW in 11 min) [U]"
    )
    release_hold_s: float = Field(120.0, ge=0)
    no_standby_cap_fraction: float = Field(
        0.4, gt=0, le=1, description="cap with no standby pump, of rack_max_power_w [U]"
    )
    low_flow_cap_fraction: float = Field(0.4, gt=0, le=1, description="low-flow interlock [U]")
    overtemp_cap_fraction: float = Field(
        0.7, gt=0, le=1, description="over-temperature: at most this share of the power now"
    )
    ttl_s: float = Field(60.0, ge=5, le=3600, description="cap_rack ttl_s (re-sent at ttl/3)")


def capacity_w(k_kw_per_k: float, setpoint_c: float, facility_c: float, flow_lpm: float,
               rho_c: float, liquid_fraction: float) -> float | None:
    """Rack power [W] the cooling holds at ``setpoint_c`` (module docstring), None when the
    inputs make no physical sense (no flow, k ≥ C_s)."""
    cs = rho_c * flow_lpm / 60.0
    if cs <= 0.0 or k_kw_per_k <= 0.0 or k_kw_per_k >= 0.95 * cs:
        return None
    q = k_kw_per_k * (setpoint_c - facility_c) / (1.0 - k_kw_per_k / cs)
    return max(0.0, 1000.0 * q / liquid_fraction)


@dataclass(frozen=True, slots=True)
class CapacityStep:
    """The guard's decision: ``cap_w`` (None: no cap wanted), the reasons in force, the
    capacity estimate [W] and the valve-open conductance [kW/K] it used."""

    cap_w: float | None
    reasons: tuple[str, ...]
    capacity_w: float | None
    k_open_kw_per_k: float | None


class CapacityGuard:
    """Decides the rack power cap (module docstring)."""

    def __init__(self, settings: CapacitySettings):
        self.s = settings
        self.k_open: float | None = None
        self.k_now: float | None = None
        self.cap_w: float | None = None
        self._sat_since: float | None = None
        self._trim_since: float | None = None
        self._clear_since: float | None = None
        self._t: float | None = None
        self.engaged_t: float | None = None
        self.reasons: tuple[str, ...] = ()
        self._engaged: set[str] = set()  # reasons since the cap engaged (until released)

    def step(
        self,
        now: float,
        *,
        pv_c: float | None,
        setpoint_c: float,
        valve_demand_pct: float | None,
        valve_position_pct: float | None,
        valve_stuck: bool,
        heat_removed_kw: float | None,
        return_c: float | None,
        facility_c: float | None,
        flow_lpm: float | None,
        rack_power_w: float | None,
        no_standby: bool,
        low_flow: bool,
        over_temperature: bool,
    ) -> CapacityStep:
        """One decision (once per second; module docstring)."""
        s = self.s
        dt = 0.0 if self._t is None else max(0.0, now - self._t)
        self._t = now
        # conductance now, and valve-open conductance
        k = None
        if (heat_removed_kw is not None and return_c is not None and facility_c is not None
                and return_c - facility_c > 0.5 and heat_removed_kw > 1.0):
            k = heat_removed_kw / (return_c - facility_c)
        self.k_now = k
        if k is not None and valve_position_pct is not None and (
                valve_position_pct >= s.saturated_pct and not valve_stuck):
            self.k_open = k if self.k_open is None else self.k_open + 0.1 * (k - self.k_open)
        est = None
        k_use = k if valve_stuck else self.k_open
        if k_use is not None and facility_c is not None and flow_lpm is not None:
            est = capacity_w(k_use, setpoint_c, facility_c, flow_lpm,
                             s.coolant_rho_c_kj_per_l_k, s.liquid_fraction)
            if est is not None and not valve_stuck:
                est *= 1.0 - s.margin_fraction
        # reasons and their caps
        caps: dict[str, float] = {}
        saturated = (valve_demand_pct is not None and valve_demand_pct >= s.saturated_pct
                     and valve_position_pct is not None
                     and valve_position_pct >= s.saturated_pct - 2.0
                     and pv_c is not None and pv_c > setpoint_c + s.engage_k)
        if saturated:
            if self._sat_since is None:
                self._sat_since = now
        else:
            self._sat_since = None
        if self._sat_since is not None and now - self._sat_since >= s.engage_s:
            caps["valve_saturated"] = est if est is not None else self._fallback(rack_power_w)
        if valve_stuck and pv_c is not None and pv_c > setpoint_c + s.engage_k:
            caps["valve_stuck"] = est if est is not None else self._fallback(rack_power_w)
        if valve_stuck and "valve_stuck" not in caps and self.cap_w is not None and (
                "valve_stuck" in self.reasons):
            caps["valve_stuck"] = est if est is not None else self.cap_w
        if no_standby:
            caps["no_standby_pump"] = s.no_standby_cap_fraction * s.rack_max_power_w
        if low_flow:
            caps["low_flow"] = s.low_flow_cap_fraction * s.rack_max_power_w
        if over_temperature:
            p = rack_power_w if rack_power_w is not None else s.rack_max_power_w
            c = s.overtemp_cap_fraction * p
            caps["over_temperature"] = min(c, est) if est is not None else c
        if caps:
            self._engaged |= set(caps)
        reasons = tuple(sorted(self._engaged if self.cap_w is not None or caps else ()))
        if caps:
            target = max(s.min_cap_w, min(caps.values()))
            self._clear_since = None
            if self.cap_w is None:
                self.cap_w = target
                self.engaged_t = now
            elif target < self.cap_w:
                self.cap_w = target  # lower at once
            elif pv_c is not None and pv_c <= setpoint_c + 0.3:
                self.cap_w = min(target, self.cap_w + s.raise_w_per_s * dt)
            # the estimate's own error: trim while the supply stays high
            if pv_c is not None and pv_c > setpoint_c + s.trim_k:
                if self._trim_since is None:
                    self._trim_since = now
                elif now - self._trim_since >= s.trim_s:
                    self._trim_since = now
                    self.cap_w = max(s.min_cap_w, 0.95 * self.cap_w)
            else:
                self._trim_since = None
        elif self.cap_w is not None:
            if self._clear_since is None:
                self._clear_since = now
            if est is not None and est < self.cap_w:
                self.cap_w = max(s.min_cap_w, est)  # follow the capacity down (T_fws rising)
            rising_ok = pv_c is None or pv_c <= setpoint_c + 0.3
            if rising_ok and now - self._clear_since >= s.release_hold_s:
                top = s.rack_max_power_w if est is None else est
                self.cap_w = max(self.cap_w, min(top, self.cap_w + s.raise_w_per_s * dt))
            if self.cap_w >= s.rack_max_power_w - 1e-6 and (
                    now - self._clear_since >= s.release_hold_s):
                self.cap_w = None
                self.engaged_t = None
                self._engaged = set()
                reasons = ()
        self.reasons = reasons
        cap = None if self.cap_w is None else round(self.cap_w, -2)
        return CapacityStep(cap, reasons, est, self.k_open)

    def _fallback(self, rack_power_w: float | None) -> float:
        """No estimate: 90 % of the power when the cap engaged, then held (never 90 % of an
        already capped power: that would ratchet down; the trim lowers it if needed)."""
        if self.cap_w is not None:
            return self.cap_w
        p = rack_power_w if rack_power_w is not None and math.isfinite(rack_power_w) else (
            self.s.rack_max_power_w)
        return 0.9 * p
