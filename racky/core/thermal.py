"""Overheating: GPUs, trays and PSUs, with the cause told by the cooling loop (pure).

Per GPU (vectorised over the rack's GPUs; REFERENCE §1.6, §3.4):

* **margin**: the T.Limit margin (T_maxop − Tj, DCGM field 153) at or below
  ``gpu_warn_margin_c`` for ``gpu_warn_for_s`` (hysteresis ``gpu_hysteresis_c``);
* **rate of rise**: dTj/dt (least squares over the last 3 reads) above ``rise_k_per_s`` for
  ``rise_for_s`` while the GPU's power is flat (REFERENCE §3.4: 2 K/s for 2 s), i.e. within
  ``flat_power_pct`` of its level for ``rise_flat_s`` (after a power step the junction rises
  for ~3 plate time constants: that is load, not a failing cold plate);
* **prediction**: the first-order steady state Tj + τ·dTj/dt (τ: the GPU's plate time constant,
  learned from its response to power steps, `racky.core.plate_tau`; no prediction for a GPU
  until its τ is learned, the margin and rate-of-rise checks acting alone: the long prior
  predicted a healthy load step's rise as an overheat) at or
  beyond the warning margin, with the HW-slowdown threshold (margin −``gpu_slowdown_offset_c``)
  reached within ``predict_horizon_s`` by linear extrapolation (the "predicted time to the
  limit" the alarm states), judged only when the power has been steady for
  ``predict_steady_s`` (a power step moves the die at once: a slope across it extrapolates a
  jump);
* **slowdown** (critical, ``gpu_slowdown``): margin below −offset or the GPU reports throttling
  (NVSentinel ADR-042's fatal).

A tray is overheating (``tray_overheat``) while any of its GPUs is warned; the tray outlet
(``tray_outlet_hot``), PSUs (``psu_hot`` / ``psu_overtemp``) have thresholds with delay and
hysteresis. The **cause** comes from the cooling loop's state (valvey's supply temperature vs
its setpoint, flow when known, and valvey's active alarms: one of ``cooling.fault_alarms``, a
pump or valve fault, lost flow, makes it abnormal): cooling abnormal → ``cooling``; cooling
normal and a few trays hot → ``tray`` (a fouled cold plate, a blocked tray); cooling normal and
``many_trays`` or more hot → ``rack-wide`` (load or loop distribution); no cooling state, or
one older than ``cooling.stale_after_s`` → ``unknown``. With ``many_trays`` trays hot one rack
alarm (``rack_overheat``) replaces the tray alarms. Each alarm's cooling text
(`ThermalWatch.cooling_text`) states what racky knows: valvey's state and its age, its figures
and active alarms, and never calls stale or missing data normal.

**Protection** (``protect``): a tray whose cause is ``tray`` and whose hottest GPU is predicted
to reach slowdown within ``protect_horizon_s`` gets a per-GPU power cap aimed at
``protect_target_margin_c``: P' = P × (Tj_target − T_ref)/(Tj_pred − T_ref), with Tj_pred the
rise extrapolated 2τ ahead and T_ref the coolant supply (the cold plate's conductance G falls
with fouling, so its time constant C/G grows: a τ learned before the fouling errs short).
The cap is lowered again while the margin stays below target and raised by
``protect_release_w_per_s`` while it is comfortably above, up to TGP, where it is removed.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from rackplane.core.detect import RateOfRise, VectorThreshold, time_to_limit
from racky.config import CoolingSettings, ThermalSettings
from racky.core.alarmbank import AlarmKind
from racky.core.plate_tau import PlateTau

__all__ = ["THERMAL_ALARM_KINDS", "CoolingReading", "ThermalInputs", "ThermalStep", "ThermalWatch"]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

THERMAL_ALARM_KINDS: tuple[AlarmKind, ...] = (
    AlarmKind("gpu_slowdown", "critical", "{thing}: HW slowdown (T.Limit below the slowdown "
              "offset) ({detail})", runbook="gpu-thermal"),
    AlarmKind("tray_overheat", "major", "{thing} overheating: {detail}", runbook="tray-thermal"),
    AlarmKind("rack_overheat", "critical", "rack overheating: {detail}", runbook="rack-thermal"),
    AlarmKind("tray_outlet_hot", "major", "{thing}: coolant outlet hot ({detail})"),
    AlarmKind("psu_hot", "minor", "{thing}: PSU temperature high ({detail})"),
    AlarmKind("psu_overtemp", "major", "{thing}: PSU over-temperature ({detail})"),
)


@dataclass(frozen=True, slots=True)
class CoolingReading:
    """The cooling loop as valvey reports it (°C, L/min; None: not reported)."""

    t_mono: float
    supply_temp_c: float | None
    setpoint_c: float | None
    flow_lpm: float | None = None
    facility_supply_temp_c: float | None = None
    valve_position_pct: float | None = None
    capacity_w_per_k: float | None = None
    """valvey's measured valve-open capacity: rack W per K of approach (setpoint − facility
    water); None until valvey has measured it."""
    alarms: tuple[str, ...] | None = None
    """valvey's active alarm ids as its state lists them (``alarms``); None: not reported."""


@dataclass
class ThermalInputs:
    """Per GPU (gpus,): temperature, T.Limit margin, power, throttled, fresh; per tray
    (trays,): coolant outlet and fresh; PSU temperatures by name."""

    gpu_temp_c: FloatArray
    gpu_t_limit_c: FloatArray
    gpu_power_w: FloatArray
    gpu_throttled: BoolArray
    gpu_fresh: BoolArray
    tray_outlet_c: FloatArray
    tray_fresh: BoolArray
    psu_temp_c: Mapping[str, float]
    cooling: CoolingReading | None


@dataclass
class ThermalStep:
    """Conditions, the cause, protective caps (tray -> per-GPU W; None: remove) and, per
    tray, the hottest GPU's figures for the state."""

    conditions: dict[str, dict[str, float | None]] = field(default_factory=dict)
    details: dict[str, dict[str, str]] = field(default_factory=dict)
    cause: str = "none"
    protect_caps: dict[int, float | None] = field(default_factory=dict)
    hot_trays: list[int] = field(default_factory=list)
    min_margin_c: float = float("nan")
    max_slope_k_per_s: float = float("nan")


class ThermalWatch:
    """GPU / tray / PSU overheating detection and tray protection (module docstring).

    Args:
        cfg: thermal settings; cooling: what counts as abnormal cooling.
        n_trays, gpus_per_tray: geometry; tgp_w, min_cap_w: per-GPU power range.
        slope_gap_s: the slope fit takes a sample only this long after its last one, s (a
            tick run early, `rackplane.daemon.DaemonFrame.wake_tick`, evaluates the slope
            without adding one: samples a fraction of a tick apart would amplify the noise
            the prediction extrapolates).
    """

    def __init__(self, cfg: ThermalSettings, cooling: CoolingSettings, n_trays: int,
                 gpus_per_tray: int, tgp_w: float, min_cap_w: float,
                 slope_gap_s: float = 0.0) -> None:
        self.cfg = cfg
        self.ccfg = cooling
        self.n_trays = n_trays
        self.gpt = gpus_per_tray
        n = self.n = n_trays * gpus_per_tray
        self.tgp_w = tgp_w
        self.min_cap_w = min_cap_w
        self._warn = VectorThreshold(n, cfg.gpu_warn_margin_c, cfg.gpu_hysteresis_c,
                                     on_delay_s=cfg.gpu_warn_for_s, direction="below")
        self._slow = VectorThreshold(n, -cfg.gpu_slowdown_offset_c, cfg.gpu_hysteresis_c,
                                     direction="below")
        self._rise = VectorThreshold(n, cfg.rise_k_per_s, 0.5 * cfg.rise_k_per_s,
                                     on_delay_s=cfg.rise_for_s)
        self._pred = VectorThreshold(n, 0.5, 0.0, off_delay_s=10.0)
        self._slope = RateOfRise(n, points=3, max_span_s=10.0)
        self._slope_gap_s = slope_gap_s
        self._slope_t = -np.inf
        self._prev_power = np.full(n, np.nan)
        self._steady_since = np.full(n, np.nan)
        self.plate = PlateTau(n, cfg.plate_tau_s, min_s=cfg.plate_tau_min_s,
                              max_s=cfg.plate_tau_max_s)
        self._outlet = VectorThreshold(n_trays, cfg.tray_outlet_limit_c, cfg.hysteresis_c,
                                       on_delay_s=cfg.for_s)
        self._psu_names: list[str] = []
        self._psu_warn: VectorThreshold | None = None
        self._psu_lim: VectorThreshold | None = None
        self.protect: dict[int, float] = {}  # tray -> per-GPU cap W
        self._last_t: float | None = None

    def _psu_detectors(self, names: Sequence[str]) -> None:
        if list(names) != self._psu_names:
            self._psu_names = list(names)
            c = self.cfg
            self._psu_warn = VectorThreshold(len(names), c.psu_warn_c, c.hysteresis_c,
                                             on_delay_s=c.for_s)
            self._psu_lim = VectorThreshold(len(names), c.psu_limit_c, c.hysteresis_c,
                                            on_delay_s=c.for_s)

    def fault_alarms(self, cool: CoolingReading | None) -> list[str]:
        """valvey's active alarms that make the cooling abnormal (``cooling.fault_alarms``)."""
        if cool is None or not cool.alarms:
            return []
        pats = self.ccfg.fault_alarms
        return [a for a in cool.alarms  # an id is <kind> or <kind>:<subject>
                if any(fnmatch.fnmatchcase(a.split(":", 1)[0], p) for p in pats)]

    def cooling_state(self, now: float, cool: CoolingReading | None) -> str:
        """``abnormal``, ``normal`` or ``unknown`` (stale or missing cooling state)."""
        if cool is None or now - cool.t_mono > self.ccfg.stale_after_s:
            return "unknown"
        if self.fault_alarms(cool):
            return "abnormal"
        if cool.supply_temp_c is None or cool.setpoint_c is None:
            return "unknown"
        if cool.supply_temp_c - cool.setpoint_c > self.ccfg.supply_high_k:
            return "abnormal"
        lo = self.ccfg.flow_low_lpm
        if lo is not None and cool.flow_lpm is not None and cool.flow_lpm < lo:
            return "abnormal"
        return "normal"

    def step(self, now: float, x: ThermalInputs) -> ThermalStep:
        """One tick at monotonic ``now``."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self._step(now, x)

    def _step(self, now: float, x: ThermalInputs) -> ThermalStep:
        cfg = self.cfg
        dt = 0.0 if self._last_t is None else now - self._last_t
        self._last_t = now
        fresh = x.gpu_fresh
        margin = np.where(fresh, x.gpu_t_limit_c, np.nan)
        tj = np.where(fresh, x.gpu_temp_c, np.nan)
        p = np.where(fresh, x.gpu_power_w, np.nan)
        warn = self._warn.update(now, margin)
        slow_m = self._slow.update(now, margin)
        slowdown = (slow_m | (x.gpu_throttled & fresh))
        if now - self._slope_t >= self._slope_gap_s:
            self._slope_t = now
            slope = self._slope.update(now, tj)
        else:
            slope = self._slope.slope(now)
        # power steady: within flat_power_pct of the level it last settled at, for how long
        moved = fresh & ~(np.abs(p - self._prev_power) <= cfg.flat_power_pct / 100.0
                          * np.maximum(self._prev_power, 1.0))
        self._prev_power = np.where(moved, p, self._prev_power)
        self._steady_since = np.where(moved, now, self._steady_since)
        steady_s = now - self._steady_since
        if cfg.learn_plate_tau:
            self.plate.update(now, tj, moved, fresh)
        tau = self.plate.tau_s
        rise = self._rise.update(now, np.where(steady_s >= cfg.rise_flat_s, slope, np.nan))
        # prediction: the first-order steady state Tj + τ·dTj/dt reaching the warning margin,
        # and the time to the slowdown threshold (margin −offset) by linear extrapolation
        t_maxop = tj + margin
        slow_tj = t_maxop + cfg.gpu_slowdown_offset_c
        s_eff = np.where(slope >= cfg.predict_min_slope_k_per_s, slope, 0.0)
        ttl = time_to_limit(tj, s_eff, slow_tj)
        margin_ss = margin - tau * s_eff
        # a step of power moves Tj at once (die) and then with the plate's τ: the slope window
        # must not contain a power step, or it extrapolates the jump
        pred_raw = np.where(np.isnan(margin), np.nan,
                            np.where((margin_ss <= cfg.gpu_warn_margin_c)
                                     & (ttl <= cfg.predict_horizon_s)
                                     & (steady_s >= cfg.predict_steady_s)
                                     & (self.plate.learned | (not cfg.learn_plate_tau)),
                                     1.0, 0.0))
        pred = self._pred.update(now, pred_raw)
        hot = (warn | rise | pred | slowdown) & fresh

        cool_state = self.cooling_state(now, x.cooling)
        tray_hot = hot.reshape(self.n_trays, self.gpt).any(axis=1)
        hot_trays = [int(k) for k in np.flatnonzero(tray_hot)]
        held = sorted(k for k in self.protect if k not in set(hot_trays))
        out = ThermalStep(hot_trays=hot_trays)
        many = len(hot_trays) >= self.cfg.many_trays
        if not hot_trays:
            cause = "none"
        elif cool_state == "abnormal":
            cause = "cooling"
        elif cool_state == "unknown":
            cause = "unknown"
        else:
            cause = "rack-wide" if many else "tray"
        out.cause = cause
        cdesc = self.cooling_text(now, cool_state, x.cooling)
        tray_cond: dict[str, float | None] = {}
        tray_det: dict[str, str] = {}
        for k in hot_trays:
            g = slice(k * self.gpt, (k + 1) * self.gpt)
            mk = np.where(hot[g], margin[g], np.inf)
            i = k * self.gpt + int(np.argmin(mk))
            parts = [f"gpu{i:02d} T.Limit {margin[i]:.1f} K"]
            if not np.isnan(slope[i]) and slope[i] > 0.05:
                parts.append(f"rising {slope[i]:.1f} K/s")
            if np.isfinite(ttl[i]):
                parts.append(f"slowdown in ~{ttl[i]:.0f} s")
            tray_cond[f"tray{k:02d}"] = float(tj[i])
            tray_det[f"tray{k:02d}"] = "; ".join(parts) + f"; cause: {cause} ({cdesc})"
        for k in held:  # the incident lasts while a protective cap holds the tray back
            g0 = k * self.gpt
            tray_cond[f"tray{k:02d}"] = float(np.nanmax(tj[g0:g0 + self.gpt]))
            tray_det[f"tray{k:02d}"] = (f"held at {self.protect[k]:.0f} W per GPU by a "
                                        f"protective cap; cause: tray ({cdesc})")
        if many:
            worst = int(np.nanargmin(np.where(hot, margin, np.inf)))
            out.conditions["rack_overheat"] = {"": float(tj[worst])}
            out.details["rack_overheat"] = {"": f"{len(hot_trays)} trays hot, hottest gpu"
                                            f"{worst:02d} T.Limit {margin[worst]:.1f} K; cause: "
                                            f"{cause} ({cdesc})"}
            out.conditions["tray_overheat"] = {}
        else:
            out.conditions["rack_overheat"] = {}
            out.conditions["tray_overheat"] = tray_cond
            out.details["tray_overheat"] = tray_det
        out.conditions["gpu_slowdown"] = {f"gpu{i:02d}": float(margin[i])
                                          for i in np.flatnonzero(slowdown)}
        out.details["gpu_slowdown"] = {f"gpu{i:02d}": f"T.Limit {margin[i]:.1f} K; cause: "
                                       f"{cause} ({cdesc})" for i in np.flatnonzero(slowdown)}
        outlet = self._outlet.update(now, np.where(x.tray_fresh, x.tray_outlet_c, np.nan))
        out.conditions["tray_outlet_hot"] = {f"tray{k:02d}": float(x.tray_outlet_c[k])
                                             for k in np.flatnonzero(outlet)}
        out.details["tray_outlet_hot"] = {f"tray{k:02d}": f"{x.tray_outlet_c[k]:.1f} °C > "
                                          f"{cfg.tray_outlet_limit_c:g} °C"
                                          for k in np.flatnonzero(outlet)}
        names = sorted(x.psu_temp_c)
        self._psu_detectors(names)
        if names and self._psu_warn is not None and self._psu_lim is not None:
            temps = np.array([x.psu_temp_c[nm] for nm in names], dtype=np.float64)
            w = self._psu_warn.update(now, temps)
            lim = self._psu_lim.update(now, temps)
            out.conditions["psu_overtemp"] = {names[i]: float(temps[i])
                                              for i in np.flatnonzero(lim)}
            out.conditions["psu_hot"] = {names[i]: float(temps[i])
                                         for i in np.flatnonzero(w & ~lim)}
            out.details["psu_hot"] = {names[i]: f"{temps[i]:.1f} °C"
                                      for i in np.flatnonzero(w)}
            out.details["psu_overtemp"] = out.details["psu_hot"]
        else:
            out.conditions["psu_overtemp"] = {}
            out.conditions["psu_hot"] = {}
        out.min_margin_c = float(np.nanmin(margin)) if fresh.any() else float("nan")
        out.max_slope_k_per_s = float(np.nanmax(slope)) if np.isfinite(slope).any() \
            else float("nan")
        if cfg.protect:
            out.protect_caps = self._protect(dt, cause, hot_trays, tj, margin, slope, p, ttl,
                                             x.cooling, t_maxop)
        return out

    def cooling_text(self, now: float, state: str, c: CoolingReading | None) -> str:
        """What racky knows of the cooling, for the overheat alarms' cause (``state``: from
        `cooling_state` at monotonic ``now``): valvey's state and its age, its supply,
        setpoint and flow (or that one is not reported), its active alarms (those in
        ``cooling.fault_alarms`` named as faults). Stale or missing data is said to be so,
        never called normal: e.g. ``cooling unknown: valvey's state is 42 s old (stale after
        15 s); last: supply 45.1 °C, setpoint 45.0 °C, flow not reported``."""
        if c is None:
            return "cooling unknown: no state from valvey received"
        age = max(0.0, now - c.t_mono)

        def num(v: float | None, unit: str, nd: int = 1) -> str:
            return "not reported" if v is None else f"{v:.{nd}f} {unit}"

        figures = (f"supply {num(c.supply_temp_c, '°C')}, setpoint {num(c.setpoint_c, '°C')}, "
                   f"flow {num(c.flow_lpm, 'L/min', 0)}")
        faults = self.fault_alarms(c)
        others = [a for a in (c.alarms or ()) if a not in faults]
        alarms = ("valvey's alarms not reported" if c.alarms is None
                  else "no valvey alarm active" if not c.alarms
                  else "; ".join(p for p in (
                      f"valvey faults active: {', '.join(faults[:6])}" if faults else "",
                      f"other valvey alarms: {', '.join(others[:6])}" if others else "") if p))
        if age > self.ccfg.stale_after_s:
            return (f"cooling unknown: valvey's state is {age:.0f} s old (stale after "
                    f"{self.ccfg.stale_after_s:g} s); last: {figures}; {alarms}")
        if state == "unknown":
            return f"cooling unknown: valvey's state ({age:.0f} s old) lacks figures: {figures}"
        return f"cooling {state} per valvey's state {age:.0f} s old: {figures}; {alarms}"

    def _protect(self, dt: float, cause: str, hot_trays: list[int], tj: FloatArray,
                 margin: FloatArray, slope: FloatArray, p: FloatArray, ttl: FloatArray,
                 cool: CoolingReading | None, t_maxop: FloatArray) -> dict[int, float | None]:
        cfg = self.cfg
        changes: dict[int, float | None] = {}
        if cause != "tray" and not self.protect:
            return changes
        n, g = self.n_trays, self.gpt
        mr = np.where(np.isnan(margin), np.inf, margin).reshape(n, g)
        hot_i = np.arange(n) * g + mr.argmin(axis=1)  # each tray's hottest GPU
        look = 2.0 * self.plate.tau_s
        t_ref = cool.supply_temp_c if cool is not None and cool.supply_temp_c is not None \
            else None
        hot_set = set(hot_trays)
        for k in range(n):
            i = int(hot_i[k])
            if not np.isfinite(margin[i]):
                continue
            cur = self.protect.get(k)
            danger = (cause == "tray" and k in hot_set
                      and (ttl[i] <= cfg.protect_horizon_s or margin[i] < cfg.gpu_warn_margin_c))
            if danger or (cur is not None and margin[i] < cfg.protect_target_margin_c - 0.5):
                tgt_tj = t_maxop[i] - cfg.protect_target_margin_c
                s = slope[i] if np.isfinite(slope[i]) and slope[i] > 0 else 0.0
                tj_pred = tj[i] + s * look[i]
                ref = t_ref if t_ref is not None else tj[i] - 0.5 * (tj[i] - 25.0)
                gp = p[k * g:(k + 1) * g]
                power = float(np.nanmax(gp)) if np.isfinite(gp).any() else self.tgp_w
                if tj_pred > tgt_tj and tj_pred > ref + 1.0:
                    want = power * max(0.0, tgt_tj - ref) / (tj_pred - ref)
                    want = max(self.min_cap_w, min(want, cur if cur is not None else self.tgp_w))
                    if cur is None or want < cur - 1.0:
                        self.protect[k] = want
                        changes[k] = want
            elif cur is not None and margin[i] > cfg.protect_target_margin_c + 1.0 and (
                    not np.isfinite(slope[i]) or slope[i] <= 0.1):
                new = cur + cfg.protect_release_w_per_s * dt
                if new >= self.tgp_w:
                    del self.protect[k]
                    changes[k] = None
                else:
                    self.protect[k] = new
                    if int(new // 10) != int(cur // 10):
                        changes[k] = new
        return changes
