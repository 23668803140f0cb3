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

**Smoothed inputs**: near saturation ``1 − k/C_s`` is small (≈ 0.23 on the nominal plant),
so the estimate amplifies its inputs' noise about fourfold: the facility water sensor's
0.03 K over a 1.85 K approach, the flow meter's 0.5 %, k's 1 %. A cap that follows that
estimate down at once is the running minimum of its noise (S9 in lock-step: 8 % under its
mean over 30 min, most of the 14.6 % over-capping measured there). So: every poll (10 Hz,
`CapacityGuard.observe`) is averaged into the once-a-second step; the facility temperature
is smoothed with a double exponential (2·E1 − E2, ``facility_tau_s``: no lag on a ramp such
as S9's 0.4 K/min, a small overshoot when it stops); k_open, the stuck valve's k and the
flow are the mean of their samples turning into an average of ``estimate_tau_s``, restarted
from the last 10 s when those leave it by 3 % (a real change is followed in ≈ 10 s).

**Liquid fraction**: the rack power is the heat over the share of it reaching the liquid,
learned at steady state (`valvey.core.liquid_fraction.LiquidFraction`), else the configured
``liquid_fraction``.

The estimate is for the supply at setpoint + ``hold_above_setpoint_k`` (0.85 K): the band the
targets allow (≤ SP + 1 K, REFERENCE §5 S4/S9) is power the rack keeps; a cap for exactly the
setpoint over-caps by 30-60 % against the physical reference (issue 21). The band left above
the hold is what the supply overshoots it by when a facility-water ramp stops (the rack's
heat reaches the exchanger ≈ 25-30 s after its power changes: S9, 0.4 K/min, overshoots the
steady supply by 0.13 K nominal, 0.14 K with the exchanger fouled, measured in lock-step).

**Cap** = the lowest of the reasons' caps, applied at once when lower (safety first), raised
at most ``raise_w_per_s`` (and only while the supply is at or below the hold + 0.3 K), trimmed
by 5 % every ``trim_s`` while the supply stays above the hold + ``trim_k`` (the estimate's
own error). The estimate is corrected (×/÷ 1.01 every ``correct_s``, within
``correction_max``) until the supply, averaged over 5 s, sits within ``correct_band_k`` of
the hold. The correction and the trim act on the estimate's steady error only: not while the
supply is already moving toward the hold (the cap's own transient, e.g. S4's overshoot
decaying after the cap engaged, ratcheted the cap down) nor, for the correction, while the
facility water moves faster than 0.15 K/min. A lower estimate alone, less than 5 % under
the cap, is not followed while the supply is above the hold and falling (the cap in force is
already bringing it down: following the estimate's noise there is over-capping); any other
reason's cap, or a larger drop, applies at once. The cap is released (``release_cap``) once
no reason has held for ``release_hold_s`` and the cap has risen to the rack's maximum power:
hysteresis by time and by level.

**Published** (``state/supply_loop.capacity_w_per_k``): the measured valve-open capacity per K
of approach, `open_capacity_w_per_k`; racky's facility-water derate uses it in place of its
nominal P_max(T_fws) table (the table stays the cold prior until valvey has measured).

**Persisted** (valvey.persist): k_open (`CapacityGuard.k_open_saved`) is laid back at start
(`CapacityGuard.restore_k_open`) within `k_open_window`, a plausibility window from the config,
so a restart does not leave racky on its table until the valve is next fully open; it weighs
as a 10 s average once this run's first valve-open sample confirms it (within 3 %), else
that sample replaces it (the exchanger changed meanwhile: this run's samples only).
``supply_loop.capacity_w_per_k_source`` says ``restored`` until this run has measured it
(then ``measured``); ``reset_learned`` forgets it (`CapacityGuard.forget_k_open`). One last
confirmed longer ago than ``control.learned_max_age_s``, or of unknown age, is not restored
(valvey.learned_age: measured before the exchanger fouled, it would overstate the capacity).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import Field

from rackplane.config import StrictModel
from valvey.core.liquid_fraction import LiquidFraction

__all__ = ["CapacityGuard", "CapacitySettings", "CapacityStep", "LiquidFraction", "capacity_w",
           "k_open_window", "open_capacity_w_per_k"]


_ESTIMATE_REASONS = frozenset({"valve_saturated", "valve_stuck"})
"""The reasons whose cap is the capacity estimate."""
_K_SEED_N = 10
"""A restored k_open weighs as this many 1 s samples (the jump rule's 10 s average)."""
_FWS_MOVING_K_PER_S = 0.0025
"""The facility water moving faster than this (0.15 K/min; S9's ramp: 0.4 K/min) is a
transient for the estimate's correction, not its error."""


class CapacitySettings(StrictModel):
    """Derating requests (module docstring)."""

    enabled: bool = Field(True, description="ask racky for caps (false: alarms only)")
    rack_max_power_w: float | None = Field(
        None, gt=0, description="the rack's maximum IT power, W: a nameplate figure from the "
        "rack vendor's spec, the site's to give (REFERENCE §1.1: GB200 NVL72 ≈120-132 kW, "
        "GB300 ≈120-142 kW, Vera Rubin 130-230 kW [S2]). The no-standby and low-flow caps are "
        "shares of it and a cap is released once it has risen to it. None: unknown "
        "(--check-config warns): the highest rack power racky has published since start "
        "stands in for it, never above the true maximum (a cap that is a share of it is the "
        "lower: the safe side); before any, min_cap_w"
    )
    min_cap_w: float = Field(
        26_000.0, gt=0, description="lowest cap asked: the node agents refuse per-GPU caps "
        "below their minimum power limit (sims: 200 W per GPU → ≈ 25 kW per rack) [U]"
    )
    liquid_fraction: float = Field(
        0.85, gt=0, le=1, description="share of the rack power reaching the liquid, the prior "
        "and fallback until learned (learn_liquid_fraction; REFERENCE §4.3 [U])"
    )
    learn_liquid_fraction: bool = Field(
        True, description="learn the liquid fraction as heat removed / rack power at steady "
        "state (false: liquid_fraction always)"
    )
    liquid_fraction_min: float = Field(
        0.5, gt=0, le=1, description="plausibility window of the learned liquid fraction: a "
        "steady ratio outside [min, max] is not learned (heat meter or rack power wrong) [U]"
    )
    liquid_fraction_max: float = Field(1.0, gt=0, le=1.05, description="see liquid_fraction_min")
    liquid_steady_s: float = Field(
        120.0, ge=10, le=3600, description="rack power, heat removed and supply each steady "
        "(rack power and heat within 3 %, supply within 0.05 K of their averages) this long "
        "before a ratio is learned; also the learned average's time constant [D]"
    )
    estimate_tau_s: float = Field(
        120.0, ge=10, le=1800, description="smoothing of the estimate's noisy flow and "
        "conductance k: the mean of the samples, turning into an average of this time "
        "constant, restarted from the last 10 s when they leave it by 3 % (a real change) [D]"
    )
    facility_tau_s: float = Field(
        5.0, ge=1, le=120, description="smoothing of the facility water temperature (its "
        "polls averaged over each second) in the estimate: double exponential, no lag on a "
        "ramp; it overshoots by ≈ ½ × this × the ramp's slope when a ramp stops (S9: "
        "0.4 K/min), so short [D]"
    )
    coolant_rho_c_kj_per_l_k: float = Field(4.03, gt=0, description="PG25 (REFERENCE §1.4)")
    margin_fraction: float = Field(
        0.01, ge=0, le=0.5, description="cap this share below the power that holds the "
        "supply at setpoint + hold_above_setpoint_k with the valve open (the estimate's "
        "error before the correction has measured it) [D]; none with a stuck valve (the cap "
        "itself sets the supply temperature). With the hold it sets how far the supply "
        "overshoots when a facility-water ramp stops (S9 fouled, lock-step: 1 % → 0.985 K, "
        "2 % → 0.964 K above setpoint) against the over-capping there (9.7 %, 10.6 %)"
    )
    hold_above_setpoint_k: float = Field(
        0.85, ge=0, le=2, description="the cap is the power that holds the supply this far "
        "above setpoint (0: at it). The band the targets allow (REFERENCE §5 S4/S9: ≤ SP + "
        "1 K; §4.5: ≈ 48 kW holds ≤ 46 °C with the valve stuck) is power the rack keeps; the "
        "trim and the raise thresholds move up with it"
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
        500.0, gt=0, description="how fast a cap may rise (0 → 132 kW in 4.4 min; racky's "
        "derate release ramp) [U]: the facility water can fall 0.4 K/min (REFERENCE §5 S9), "
        "the capacity then rises ≈ 350 W/s"
    )
    correction_max: float = Field(
        1.15, ge=1, le=1.5, description="the capacity estimate is corrected by the supply "
        "temperature it yields while capped: ×1.01 every correct_s while the supply stays "
        "more than correct_band_k below the hold, ÷1.01 while above it, within [1/this, this]; "
        "back to 1 when the cap is released [D]"
    )
    correct_band_k: float = Field(
        0.02, ge=0, le=1, description="dead band of the correction around the hold, on the "
        "supply averaged over 5 s (its noise ≈ 0.005 K): the steady supply sits within it of "
        "the hold, not 0.1 K under it (2 % of the cap at a 2 K approach) [D]"
    )
    correct_s: float = Field(20.0, gt=0)
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


def k_open_window(s: CapacitySettings, setpoint_max_c: float,
                  flow_max_lpm: float) -> tuple[float, float]:
    """Plausibility window [kW/K] of a valve-open conductance restored from the state file
    (module docstring), from the config: ``setpoint_max_c`` (supply_loop.setpoint_max_c, °C)
    and ``flow_max_lpm`` (the most flow the config lets the loop run, L/min).

    Low: ``liquid_fraction_min × min_cap_w`` over ``setpoint_max_c`` K: below it the open
    exchanger could not carry the lowest cap's heat even with facility water at 0 °C (a heat
    meter in MW, a dead return sensor). High: 0.95 × ρc × ``flow_max_lpm`` / 60: k = ε·C_min
    is at most the coolant's heat capacity rate, and `capacity_w` refuses k ≥ 0.95 C_s."""
    lo = s.liquid_fraction_min * s.min_cap_w / 1000.0 / max(setpoint_max_c, 1.0)
    return lo, 0.95 * s.coolant_rho_c_kj_per_l_k * flow_max_lpm / 60.0


def open_capacity_w_per_k(k_open_kw_per_k: float | None, flow_lpm: float | None,
                          rho_c: float, liquid_fraction: float) -> float | None:
    """Rack power [W] the cooling holds per K of approach (setpoint − facility water) with
    the valve open: `capacity_w` of the measured valve-open conductance for a 1 K approach
    (the exchanger as measured: fouling, starved facility flow and all). None until the
    valve has been open long enough to measure it, or without a flow."""
    if k_open_kw_per_k is None or flow_lpm is None:
        return None
    return capacity_w(k_open_kw_per_k, 1.0, 0.0, flow_lpm, rho_c, liquid_fraction)


class _Dema:
    """Double exponential smoothing (Brown): ``2·E1 − E2`` of time constant ``tau_s``, which
    follows a ramp without lag; restarts from the sample after a gap of more than 3 τ."""

    __slots__ = ("e1", "e2", "t", "tau")

    def __init__(self, tau_s: float):
        self.tau = tau_s
        self.e1: float | None = None
        self.e2 = 0.0
        self.t = 0.0

    def update(self, now: float, x: float) -> float:
        """Add the sample ``x`` at ``now`` [s]; the smoothed value."""
        if self.e1 is None or now - self.t > 3.0 * self.tau or now < self.t:
            self.e1 = self.e2 = x
        else:
            a = min(1.0, (now - self.t) / self.tau)
            self.e1 += a * (x - self.e1)
            self.e2 += a * (self.e1 - self.e2)
        self.t = now
        return 2.0 * self.e1 - self.e2

    def slope_per_s(self) -> float:
        """The trend [unit/s] (Brown: (E1 − E2) / τ), 0 before the first sample."""
        return 0.0 if self.e1 is None else (self.e1 - self.e2) / self.tau


class _Slow:
    """A slowly varying quantity from 1 s samples: the mean of the samples, turning into an
    exponential average of ``tau_s``; restarted from a 10 s average when that one leaves it
    by more than ``jump`` (a real change: a starved facility flow, a new pump speed, is
    followed in ≈ 10 s, not τ). ``value`` None before the first sample."""

    __slots__ = ("fast", "jump", "n", "tau", "value")

    def __init__(self, tau_s: float, jump: float = 0.03):
        self.tau = tau_s
        self.jump = jump
        self.value: float | None = None
        self.fast = 0.0
        self.n = 0

    def update(self, x: float) -> float:
        """Add a sample; the smoothed value."""
        if self.value is None:
            self.value = self.fast = x
            self.n = 1
            return x
        self.fast += (x - self.fast) / min(float(self.n + 1), 10.0)
        self.n += 1
        self.value += (x - self.value) / min(float(self.n), self.tau)
        if abs(self.fast - self.value) > self.jump * abs(self.value):
            self.value = self.fast
            self.n = 10
        return self.value


@dataclass(frozen=True, slots=True)
class CapacityStep:
    """The guard's decision: ``cap_w`` (None: no cap wanted), the reasons in force, the
    capacity estimate [W] and the valve-open conductance [kW/K] it used, the measured
    valve-open capacity per K of approach [W/K] (`open_capacity_w_per_k`; what racky's
    facility-water derate uses instead of its nominal table, docs/CONTRACTS.md), and the
    liquid fraction in use (learned, else configured; 0–1)."""

    cap_w: float | None
    reasons: tuple[str, ...]
    capacity_w: float | None
    k_open_kw_per_k: float | None
    open_w_per_k: float | None = None
    liquid_fraction: float | None = None


class CapacityGuard:
    """Decides the rack power cap (module docstring)."""

    def __init__(self, settings: CapacitySettings):
        self.s = settings
        self.k_open: float | None = None
        self.k_open_saved: float | None = None  # k_open to persist (4 digits, 1 % steps)
        self._k_restored = False  # k_open started from a saved value (restore_k_open)
        self._k_own = 0  # valve-open samples of this run averaged into k_open
        self.k_now: float | None = None
        self.cap_w: float | None = None
        self._sat_since: float | None = None
        self._trim_since: float | None = None
        self._clear_since: float | None = None
        self._t: float | None = None
        self.engaged_t: float | None = None
        self.reasons: tuple[str, ...] = ()
        self._engaged: set[str] = set()  # reasons since the cap engaged (until released)
        self.correction = 1.0  # of the capacity estimate (CapacitySettings.correction_max)
        self._k_stuck: _Slow | None = None
        self._k_open = _Slow(settings.estimate_tau_s)
        self._facility = _Dema(settings.facility_tau_s)
        self._flow = _Slow(settings.estimate_tau_s)
        self.liquid = LiquidFraction(settings)
        self._obs = [0.0] * 8  # sums and counts of the polls since the last step (observe)
        self._corr_t: float | None = None
        self._pv_avg: float | None = None  # the supply, averaged over ≈ 5 s
        self._pv_slow: float | None = None  # the supply, averaged over ≈ 15 s
        self._corr_pv: float | None = None  # _pv_avg at the last correction period
        self._trim_pv: float | None = None  # _pv_avg at the last trim period
        self._seen_max_w: float | None = None  # highest rack power seen (rack_max_w)

    def observe(self, facility_c: float | None, flow_lpm: float | None,
                heat_removed_kw: float | None, return_c: float | None) -> None:
        """One poll's fresh readings (°C, L/min, kW, °C; None: missing), at the poll rate
        (10 Hz): `step` uses their means since the last step, not one poll in ten (the
        transmitters' white noise averages down by √10, with 0.5 s of lag)."""
        o = self._obs
        if facility_c is not None:
            o[0] += facility_c
            o[4] += 1.0
        if flow_lpm is not None:
            o[1] += flow_lpm
            o[5] += 1.0
        if heat_removed_kw is not None:
            o[2] += heat_removed_kw
            o[6] += 1.0
        if return_c is not None:
            o[3] += return_c
            o[7] += 1.0

    def _means(self, *now_values: float | None) -> list[float | None]:
        """``now_values`` (facility, flow, heat, return) replaced by the means of the polls
        since the last step (`observe`); a value missing now stays missing (stale)."""
        o = self._obs
        out = [None if v is None or o[i + 4] == 0.0 else o[i] / o[i + 4]
               for i, v in enumerate(now_values)]
        out = [v if m is None else m for v, m in zip(now_values, out, strict=True)]
        self._obs = [0.0] * 8
        return out

    def _settling_on_estimate(self, caps: dict[str, float], target: float,
                              hold_c: float) -> bool:
        """Whether a lower ``target`` is the capacity estimate's alone, less than 5 % under
        the cap, while the supply is above the hold and falling (its 5 s average 5 mK under
        its 15 s one: ≈ 0.5 mK/s): the cap in force is already bringing the supply down,
        and following the estimate's noise (and the facility-water filter's overshoot when
        a ramp stops) down then is over-capping, not safety. Any other reason's cap, or a
        larger drop, applies at once."""
        if self.cap_w is None or target < 0.95 * self.cap_w:
            return False
        if any(v <= target and r not in _ESTIMATE_REASONS for r, v in caps.items()):
            return False
        pv, slow = self._pv_avg, self._pv_slow
        return pv is not None and slow is not None and pv > hold_c and pv < slow - 0.005

    def _toward_hold(self, then: float | None, hold_c: float) -> bool:
        """Whether the averaged supply moved toward ``hold_c`` since ``then`` by more than its
        noise (0.01 K): a transient settling, not the estimate's steady error."""
        pv = self._pv_avg
        if then is None or pv is None:
            return False
        return (pv - then) * (hold_c - then) > 0.0 and abs(pv - then) > 0.01

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
        facility_c, flow_lpm, heat_removed_kw, return_c = self._means(
            facility_c, flow_lpm, heat_removed_kw, return_c)
        hold_c = setpoint_c + s.hold_above_setpoint_k  # where a cap holds the supply
        # conductance now, and valve-open conductance
        k = None
        if (heat_removed_kw is not None and return_c is not None and facility_c is not None
                and return_c - facility_c > 0.5 and heat_removed_kw > 1.0):
            k = heat_removed_kw / (return_c - facility_c)
        self.k_now = k
        if pv_c is not None:
            self._pv_avg = pv_c if self._pv_avg is None else self._pv_avg + min(
                1.0, dt / 5.0) * (pv_c - self._pv_avg)
            self._pv_slow = pv_c if self._pv_slow is None else self._pv_slow + min(
                1.0, dt / 15.0) * (pv_c - self._pv_slow)
        self.liquid.update(now, heat_removed_kw, rack_power_w, pv_c)
        rack_max_w = self.rack_max_w(rack_power_w)  # counts this step's power
        f_liq = self.liquid.value
        # the stuck valve's conductance, smoothed like k_open (the raw ratio carries the
        # sensors' noise, and a cap lowered at once on every dip ratchets down on it)
        if k is not None and valve_stuck:
            if self._k_stuck is None:
                self._k_stuck = _Slow(s.estimate_tau_s)
            self._k_stuck.update(k)
        elif not valve_stuck:
            self._k_stuck = None
        if k is not None and valve_position_pct is not None and (
                valve_position_pct >= s.saturated_pct and not valve_stuck):
            if self._k_restored and self._k_own == 0 and self.k_open is not None and (
                    abs(k - self.k_open) > 0.03 * self.k_open):
                self._k_open = _Slow(s.estimate_tau_s)  # changed since: this run's only
                self._k_restored = False
            self.k_open = self._k_open.update(k)
            self._k_own += 1
            if self.k_open_saved is None or abs(self.k_open - self.k_open_saved) > (
                    0.01 * self.k_open_saved):
                self.k_open_saved = float(f"{self.k_open:.4g}")
        # the estimate's noisy inputs, smoothed (module docstring); a missing one: no estimate
        fws = None if facility_c is None else self._facility.update(now, facility_c)
        flow = None if flow_lpm is None else self._flow.update(flow_lpm)
        est = None
        k_use = (None if self._k_stuck is None else self._k_stuck.value) if valve_stuck else (
            self.k_open)
        if k_use is not None and fws is not None and flow is not None:
            est = capacity_w(k_use, setpoint_c + s.hold_above_setpoint_k, fws, flow,
                             s.coolant_rho_c_kj_per_l_k, f_liq)
            if est is not None and not valve_stuck:
                est *= 1.0 - s.margin_fraction
            if est is not None:
                est *= self.correction
        # the estimate's correction by the supply temperature it yields (while capped)
        if self.cap_w is not None and pv_c is not None:
            if self._corr_t is None:
                self._corr_t, self._corr_pv = now, self._pv_avg
            elif now - self._corr_t >= s.correct_s:
                settling = self._toward_hold(self._corr_pv, hold_c) or (
                    abs(self._facility.slope_per_s()) > _FWS_MOVING_K_PER_S)
                self._corr_t, self._corr_pv = now, self._pv_avg
                if settling:
                    pass  # a transient (the cap's own, the facility water's): no error
                elif self._pv_avg is not None and self._pv_avg < hold_c - s.correct_band_k:
                    self.correction = min(s.correction_max, self.correction * 1.01)
                elif self._pv_avg is not None and self._pv_avg > hold_c + s.correct_band_k:
                    self.correction = max(1.0 / s.correction_max, self.correction / 1.01)
        else:
            self._corr_t = self._corr_pv = None
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
            caps["no_standby_pump"] = s.no_standby_cap_fraction * rack_max_w
        if low_flow:
            caps["low_flow"] = s.low_flow_cap_fraction * rack_max_w
        if over_temperature:
            p = rack_power_w if rack_power_w is not None else rack_max_w
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
                if not self._settling_on_estimate(caps, target, hold_c):
                    self.cap_w = target  # lower at once
            elif pv_c is not None and pv_c <= hold_c + 0.3:
                self.cap_w = min(target, self.cap_w + s.raise_w_per_s * dt)
            # the estimate's own error: trim while the supply stays high
            if pv_c is not None and pv_c > hold_c + s.trim_k:
                if self._trim_since is None:
                    self._trim_since, self._trim_pv = now, self._pv_avg
                elif now - self._trim_since >= s.trim_s:
                    settling = self._toward_hold(self._trim_pv, hold_c)
                    self._trim_since, self._trim_pv = now, self._pv_avg
                    if not settling:
                        self.cap_w = max(s.min_cap_w, 0.95 * self.cap_w)
            else:
                self._trim_since = self._trim_pv = None
        elif self.cap_w is not None:
            if self._clear_since is None:
                self._clear_since = now
            if est is not None and est < self.cap_w:
                self.cap_w = max(s.min_cap_w, est)  # follow the capacity down (T_fws rising)
            rising_ok = pv_c is None or pv_c <= hold_c + 0.3
            if rising_ok and now - self._clear_since >= s.release_hold_s:
                top = rack_max_w if est is None else est
                self.cap_w = max(self.cap_w, min(top, self.cap_w + s.raise_w_per_s * dt))
            if self.cap_w >= rack_max_w - 1e-6 and (
                    now - self._clear_since >= s.release_hold_s):
                self.cap_w = None
                self.engaged_t = None
                self._engaged = set()
                self.correction = 1.0
                reasons = ()
        self.reasons = reasons
        cap = None if self.cap_w is None else round(self.cap_w, -2)
        per_k = open_capacity_w_per_k(self.k_open, flow, s.coolant_rho_c_kj_per_l_k, f_liq)
        return CapacityStep(cap, reasons, est, self.k_open, per_k, f_liq)

    @property
    def k_open_source(self) -> str | None:
        """Where ``k_open`` comes from: None (not measured), ``restored`` (saved by an earlier
        run, not yet re-confirmed: this run has averaged in fewer than 10 s of valve-open
        samples, the weight the saved value starts with) or ``measured`` (this run has)."""
        if self.k_open is None:
            return None
        return "restored" if self._k_restored and self._k_own < _K_SEED_N else "measured"

    @property
    def k_open_samples(self) -> int:
        """Valve-open samples this run has averaged into ``k_open`` since the last restore or
        forget: grows with each measurement confirming it (valvey.learned_age)."""
        return self._k_own

    def restore_k_open(self, k_kw_per_k: float, window: tuple[float, float]) -> bool:
        """Lay a saved valve-open conductance [kW/K] over the unmeasured one: taken (True)
        only when finite and within ``window`` (`k_open_window`). This run's first valve-open
        sample re-confirms it (within 3 %: it then weighs as a 10 s average of this run's
        samples) or replaces it (the exchanger changed meanwhile, e.g. fouled: this run's
        samples only, as at a cold start)."""
        lo, hi = window
        if (isinstance(k_kw_per_k, bool) or not isinstance(k_kw_per_k, int | float)
                or not math.isfinite(k_kw_per_k) or not lo <= k_kw_per_k <= hi):
            return False
        self.forget_k_open()
        k = float(k_kw_per_k)
        self._k_open.value = self._k_open.fast = self.k_open = k
        self._k_open.n = _K_SEED_N
        self._k_restored = True
        self.k_open_saved = float(f"{k:.4g}")
        return True

    def forget_learned(self) -> None:
        """``reset_learned``: the configured liquid fraction, the exchanger unmeasured."""
        self.liquid.forget()
        self.forget_k_open()

    def forget_k_open(self) -> None:
        """Forget the measured valve-open conductance (``reset_learned``): unmeasured until
        the valve is open again (racky's derate falls back to its table meanwhile)."""
        self._k_open = _Slow(self.s.estimate_tau_s)
        self.k_open = self.k_open_saved = None
        self._k_restored = False
        self._k_own = 0

    def _fallback(self, rack_power_w: float | None) -> float:
        """No estimate: 90 % of the power when the cap engaged, then held (never 90 % of an
        already capped power: that would ratchet down; the trim lowers it if needed)."""
        if self.cap_w is not None:
            return self.cap_w
        p = rack_power_w if rack_power_w is not None and math.isfinite(rack_power_w) else (
            self.rack_max_w(None))
        return 0.9 * p

    def rack_max_w(self, rack_power_w: float | None) -> float:
        """The rack's maximum power [W]: ``rack_max_power_w`` when configured; else the
        highest rack power seen so far (``rack_power_w`` [W], this step's, counted), never
        above the true maximum; before any, ``min_cap_w`` (every cap at its floor)."""
        if self.s.rack_max_power_w is not None:
            return self.s.rack_max_power_w
        if rack_power_w is not None and math.isfinite(rack_power_w) and (
                rack_power_w > (self._seen_max_w or 0.0)):
            self._seen_max_w = rack_power_w
        return self._seen_max_w if self._seen_max_w is not None else self.s.min_cap_w
