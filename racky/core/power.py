"""Rack power: shelves, limits, the cap loop, sequencing, reconciliation (pure).

**Shelves** (`read_shelves`): the rack's measured power is the sum of the shelves' DC output
(``state/rack_power``, valvey's feedforward input), its live capacity and redundancy come from
the shelves' registers (``config/registers/power-shelf.toml``; REFERENCE §1.2, §5 S10).

**The rack limit** is the lowest of: the budget (config or ``set_budget``); the capacity
ceiling (`CapacityGuard`: when the load exceeds the live capacity, cap to capacity less a
margin within one tick, S10; released when capacity is back); the facility-water derate
(`Derate`: P_max(T_fws) of REFERENCE §4.4, applied at once, released with hysteresis and a
ramp, S9); caps requested by other daemons (``cap_rack`` from valvey, each with a TTL).

**The cap loop** (`CapAllocator`): the limit less the power outside the trays becomes per-tray
caps: every powered tray gets at least its minimum (the agents' minimum power limit), then
priority classes in rank order get their demand (peak over ``demand_hold_s``) plus headroom,
water-filled within a class; what is left is spread over every tray in proportion to its room
up to its maximum (headroom redistribution, so an idle tray can burst without waiting a tick).
Cap rises are ramp-limited and never exceed the limit even transiently: a rise is granted only
from room left by caps the agents already *report* lower (so whatever order the agents apply
a batch, Σ caps stays within the limit). Falls are immediate when the rack is over its limit,
or when the caps themselves must fit a hard limit (``hard_limit_w``: in fleet mode rlc's
lease bounds what the trays may draw, not only what they draw), else ramp-limited too. The
loop runs on the real time between ticks (dt; a tick run early by an input,
`rackplane.daemon.DaemonFrame.wake_tick`, is as good as any): the ramps scale with dt and the
demand's peak hold is a time window.

**Sequencing, desired settings, reconciliation** (`racky.core.agent_settings`, re-exported
here): `Sequencer`: tray power on/off (not the safety power-downs, which are
immediate) is staggered so that at most ``inrush_limit_w`` is switched per ``stagger_s``.

**Reconciliation** (`Reconciler`): the desired settings of every tray against what its agent
reports; a mismatch older than ``reconcile_confirm_s`` is re-asserted (at most once per that
period, counted), one older than ``drift_alarm_s`` raises ``cap_drift:<tray>`` naming it.
Caps carry a TTL on the wire (node-agent contract v1, ``CAP_TTL_S``): a capped tray's
settings are re-sent when nothing went to it for ``CAP_REFRESH_S``.

**Blast radius** (`BlastRadius`): at most ``max_actions`` automated actions per ``window_s``;
safety actions are exempt (DESIGN §3 Safety).
"""

from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from rackplane.core.samples import Quality, Sample
from racky.config import (
    BlastRadiusSettings,
    DerateSettings,
    NodeAgentsSettings,
    PowerSettings,
    ShelfPoints,
)
from racky.core.agent_settings import (
    with_powered,
)
from racky.core.alarmbank import AlarmKind
from racky.core.telemetry import TrayTable

__all__ = ["GRID_EFFICIENCY", "POWER_ALARM_KINDS",
           "BlastRadius", "CapAllocator", "CapacityGuard", "Derate",
           "LimitState", "NonTrayEstimate", "RequestedCap",
           "ShelfView", "SmoothingSettings", "TrayPowerView", "rack_limit",
           "read_shelves", "smoothing", "smoothing_weight", "with_powered"]

POWER_ALARM_KINDS: tuple[AlarmKind, ...] = (
    # 3 missed 1 s polls, and not before the first reads had time to come (start-up inhibit)
    AlarmKind("shelf_offline", "major", "power shelf {thing} not answering ({detail})",
              on_delay_s=3.0, startup_inhibit_s=10.0),
    AlarmKind("psu_failed", "major", "{thing} failed ({detail})", runbook="psu"),
    AlarmKind("psu_derated", "minor", "{thing} derated ({detail})", runbook="psu"),
    AlarmKind("shelf_ac_lost", "major", "power shelf {thing} lost AC input ({detail})",
              runbook="psu"),
    AlarmKind("feed_redundancy_lost", "major", "rack lost feed redundancy (N+N): {detail}",
              runbook="psu"),
    AlarmKind("redundancy_lost", "major", "rack power has no spare PSU left: {detail}",
              runbook="psu"),
    AlarmKind("capacity_exceeded", "critical", "rack load above live PSU capacity: {detail}",
              runbook="psu"),
    # a cap binds: a tray held below what it would draw (racky/core/cap_binding.py), not
    # merely a cap allocated
    AlarmKind("power_capped", "warning", "rack power held below demand by racky's caps: "
              "{detail}"),
    AlarmKind("budget_exceeded", "major", "rack power above its limit: {detail}", on_delay_s=5.0),
    AlarmKind("budget_infeasible", "major", "rack limit below the trays' minimum power: "
              "{detail}"),
    AlarmKind("budget_out_of_range", "warning", "the persisted operator budget is outside its "
              "bounds: {detail}"),
    AlarmKind("cap_drift", "major", "{thing}: node agent does not hold the cap racky set "
              "({detail})", runbook="cap-drift"),
    AlarmKind("agent_refused", "major", "{thing}: node agent refused racky's settings "
              "({detail})"),
    AlarmKind("tray_stale", "major", "{thing}: no node-agent telemetry ({detail})"),
    AlarmKind("blast_radius_limit", "major", "automated actions limited: {detail}"),
)


# --- shelves ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShelfView:
    """The shelves now. Power in W; None when no shelf reports it. ``rack_power_w`` is the
    sum over the shelves reporting (``shelves_reporting`` of ``shelves_configured``): use
    `load_w` for the rack's load."""

    rack_power_w: float | None
    rack_load_w: float | None
    rack_input_w: float | None
    shelves_reporting: int
    shelves_configured: int
    capacity_w: float | None
    redundant_feeds: bool | None
    spare_psus: int | None
    offline: list[str]
    ac_lost: list[str]
    psu_failed: list[str]
    psu_derated: list[str]
    psu_temp_c: dict[str, float]
    overloaded: bool = False
    shelves_input_reporting: int = 0
    """Shelves whose AC input is in ``rack_input_w`` (the sum is partial below
    ``shelves_configured``)."""

    @property
    def load_w(self) -> float | None:
        """The rack's DC load, W: the shelves' rack-load register (BBU share included), else
        the sum of the shelves' outputs when every shelf reports; None otherwise (a shelf
        offline or stale is never counted as 0 W: a partial sum would understate the rack,
        hide an over-limit and let the non-tray estimate, then the caps, rise)."""
        if self.rack_load_w is not None:
            return self.rack_load_w
        if self.shelves_reporting < self.shelves_configured:
            return None
        return self.rack_power_w


def read_shelves(latest: Mapping[str, Mapping[str, Sample]], pts: ShelfPoints, now: float,
                 stale_after_s: float) -> ShelfView:
    """Summarise the latest samples of every shelf (device name -> point -> sample)."""
    out_w = in_w = 0.0
    n_out = n_in = 0
    cap_rack: float | None = None
    cap_sum, n_cap = 0.0, 0
    red: bool | None = None
    spare: int | None = None
    load: float | None = None
    overloaded = False
    offline, ac_lost, failed, derated = [], [], [], []
    temps: dict[str, float] = {}

    oldest = now - stale_after_s
    psu_pts = _psu_points(pts)

    def val(s: Mapping[str, Sample], point: str) -> float | None:
        x = s.get(point)
        if x is None or x.value is None or x.quality is not Quality.GOOD or x.t_mono < oldest:
            return None
        v = x.value
        return v if math.isfinite(v) else None

    for name, s in latest.items():
        o = val(s, pts.output_power)
        if o is None:
            offline.append(name)
            continue
        out_w += o
        n_out += 1
        i = val(s, pts.input_power)
        if i is not None:
            in_w += i
            n_in += 1
        c = val(s, pts.rack_capacity)
        if c is not None:
            cap_rack = c if cap_rack is None else min(cap_rack, c)
        a = val(s, pts.available)
        if a is not None:
            cap_sum += a
            n_cap += 1
        r = val(s, pts.rack_redundant_feeds)
        if r is not None:
            red = r >= 0.5 if red is None else red and r >= 0.5
        sp = val(s, pts.rack_spare_psus)
        if sp is not None:
            spare = int(sp) if spare is None else min(spare, int(sp))
        ld = val(s, pts.rack_load)
        if ld is not None:
            load = ld if load is None else max(load, ld)
        st = val(s, pts.status)
        if st is not None:
            if (int(st) >> pts.shelf_ac_lost_bit) & 1:
                ac_lost.append(name)
            if (int(st) >> pts.shelf_overloaded_bit) & 1 or (int(st) >> pts.shelf_bbu_bit) & 1:
                overloaded = True
        for k, p_status, p_temp in psu_pts:
            ps = val(s, p_status)
            if ps is not None and (int(ps) >> pts.psu_failed_bit) & 1:
                failed.append(f"{name}/psu{k}")
            elif ps is not None and (int(ps) >> pts.psu_derated_bit) & 1:
                derated.append(f"{name}/psu{k}")
            t = val(s, p_temp)
            if t is not None:
                temps[f"{name}/psu{k}"] = t
    capacity = cap_rack if cap_rack is not None else (cap_sum if n_cap else None)
    return ShelfView(
        rack_power_w=out_w if n_out else None, rack_load_w=load,
        rack_input_w=in_w if n_in else None,
        shelves_reporting=n_out, shelves_configured=len(latest), capacity_w=capacity,
        redundant_feeds=red, spare_psus=spare, offline=offline, ac_lost=ac_lost,
        psu_failed=failed, psu_derated=derated, psu_temp_c=temps, overloaded=overloaded,
        shelves_input_reporting=n_in,
    )


@functools.lru_cache(maxsize=8)
def _psu_points(pts: ShelfPoints) -> tuple[tuple[int, str, str], ...]:
    return tuple((k, pts.psu_status.format(n=k), pts.psu_temp.format(n=k))
                 for k in range(1, pts.psus_per_shelf + 1))


# --- limits ----------------------------------------------------------------------------------


class CapacityGuard:
    """Caps the rack to its live PSU capacity less ``margin_pct`` when the load exceeds that
    capacity (redundancy gone, S10); released once capacity × (1 − margin) can carry
    ``release_w`` (the rack's uncapped maximum) or a spare PSU is back."""

    def __init__(self, margin_pct: float) -> None:
        self.margin = margin_pct / 100.0
        self.engaged = False
        self.cap_w: float | None = None

    def step(self, view: ShelfView, release_w: float) -> float | None:
        """The capacity ceiling now, W (None: not engaged). Engages when the shelves say
        overloaded or the load exceeds live capacity; held on missing capacity data.

        Args:
            view: the shelves now; release_w: the rack's uncapped maximum, W.
        """
        cap = view.capacity_w
        load = view.load_w
        if cap is None:
            return self.cap_w if self.engaged else None  # hold on missing data
        ceiling = cap * (1.0 - self.margin)
        if not self.engaged and (view.overloaded or (load is not None and load > cap * 1.001)):
            self.engaged = True
        if self.engaged and (ceiling >= release_w or (view.spare_psus or 0) >= 1):
            self.engaged = False
        self.cap_w = ceiling if self.engaged else None
        return self.cap_w


class Derate:
    """P_max(T_fws) derating with margin, release hysteresis and a release ramp (S9)."""

    def __init__(self, cfg: DerateSettings) -> None:
        self.cfg = cfg
        self._t = np.array([t for t, _ in cfg.table])
        self._p = np.array([p for _, p in cfg.table])
        self.cap_w: float | None = None
        self.applied_at_c: float | None = None
        self.measured_w_per_k: float | None = None  # valvey's, once seen (`step`)
        self.setpoint_c: float | None = None

    def p_max(self, t_fws_c: float) -> float:
        """P_max at ``t_fws_c``, W: from the measured capacity when one is in use (the last
        `step`'s, see there), else linear in the table (held at its ends)."""
        if self.measured_w_per_k is not None and self.setpoint_c is not None:
            return max(0.0, self.measured_w_per_k * (self.setpoint_c - t_fws_c))
        return float(np.interp(t_fws_c, self._t, self._p))

    def measured_capacity_w(self, t_fws_c: float) -> float | None:
        """The rack power (W, the shelves' DC output) the cooling carries at facility water
        ``t_fws_c`` (°C) by valvey's measurement: `p_max` at ``t_fws_c`` + ``margin_k``, the
        figure the derate works to; None while no measurement is in use (never the table:
        the nominal prior is no measurement of this rack's cooling)."""
        if self.measured_w_per_k is None or self.setpoint_c is None:
            return None
        return self.p_max(t_fws_c + self.cfg.margin_k)

    def step(self, t_fws_c: float | None, fresh: bool, dt: float, uncapped_w: float,
             capacity_w_per_k: float | None = None, setpoint_c: float | None = None,
             ) -> float | None:
        """The derate cap (None: none) for facility water ``t_fws_c`` (°C); ``uncapped_w`` is
        the rack's uncapped maximum (a P_max above it is no derate).

        ``capacity_w_per_k`` (valvey's measured valve-open capacity, W per K of approach) and
        ``setpoint_c`` (its supply setpoint), both fresh with ``t_fws_c``: with ``measured``
        on, P_max = capacity × (setpoint − T_fws) in place of the table (the exchanger as it
        is: fouled, starved); without them the table, the cold prior. A measurement once
        seen is kept while a fresh reading lacks it (valvey restarted: it measures again)."""
        c = self.cfg
        if not c.enabled:
            self.cap_w = None
            return None
        if t_fws_c is None or not fresh:
            return self.cap_w  # never released on missing data
        if c.measured and capacity_w_per_k is not None and setpoint_c is not None:
            self.measured_w_per_k = capacity_w_per_k
            self.setpoint_c = setpoint_c
        target = self.p_max(t_fws_c + c.margin_k)
        if self.cap_w is None:
            if target < uncapped_w:
                self.cap_w = target
                self.applied_at_c = t_fws_c
            return self.cap_w
        if target <= self.cap_w:
            self.cap_w = target
            self.applied_at_c = t_fws_c if self.applied_at_c is None else max(
                self.applied_at_c, t_fws_c)
            return self.cap_w
        # releasing: only as the water falls below where it was applied, and ramped
        allowed = self.p_max(t_fws_c + c.margin_k + c.release_hysteresis_k)
        if allowed > self.cap_w:
            self.cap_w = min(allowed, self.cap_w + c.release_ramp_w_per_s * dt)
        if self.cap_w >= uncapped_w:
            self.cap_w = None
            self.applied_at_c = None
        return self.cap_w


@dataclass
class RequestedCap:
    """A cap asked for by another daemon (``cap_rack``)."""

    user: str
    power_w: float
    until_mono: float
    reason: str


# --- the cap loop ----------------------------------------------------------------------------


@dataclass
class TrayPowerView:
    """Per tray (trays,): powered (reported and desired), measured power, demand estimate,
    reported enforced tray cap, fresh, priority rank."""

    powered: np.ndarray
    power_w: np.ndarray
    demand_w: np.ndarray
    enforced_w: np.ndarray
    fresh: np.ndarray
    rank: np.ndarray


class CapAllocator:
    """Rack limit -> per-tray caps (module docstring).

    Args:
        cfg: power settings; agents: geometry and per-GPU limits; tick_s: the nominal tick,
            s (the demand's peak hold spans ``demand_hold_s`` rounded up to whole ticks).
    """

    def __init__(self, cfg: PowerSettings, agents: NodeAgentsSettings, tick_s: float = 1.0
                 ) -> None:
        self.cfg = cfg
        self.agents = agents
        n = agents.trays
        self.n = n
        self.other_share = agents.other_share
        self.caps: np.ndarray = np.full(n, np.nan)  # desired tray caps (NaN: none)
        # a quarter tick of slack: a tick's lateness never drops the oldest entry early
        self._hold_s = math.ceil(cfg.demand_hold_s / tick_s - 1e-9) * tick_s + 0.25 * tick_s
        self._demand_hist: deque[tuple[float, np.ndarray]] = deque()
        self.infeasible = False

    @property
    def tray_max_w(self) -> float:
        """A tray's largest draw, W: GPUs × TGP × (1 + the measured non-GPU share)."""
        a = self.agents
        return a.gpus_per_tray * a.gpu_tgp_w * (1.0 + self.other_share)

    @property
    def tray_min_w(self) -> float:
        """The lowest tray cap racky sends, W: GPUs × the GPUs' minimum power limit × (1 +
        the non-GPU share), rounded up (the agents refuse a cap below it)."""
        a = self.agents
        return math.ceil(a.gpus_per_tray * a.gpu_min_power_limit_w * (1.0 + self.other_share)
                         + 1.0)

    def demand(self, t: TrayTable, now: float) -> np.ndarray:
        """Per-tray demand estimate (W): the GPUs' demand scaled to the tray (their measured
        share) where known, else the power (+10 % when the agent says it is capping); peak
        over ``demand_hold_s``. No agent measures demand: the GPUs' figure is racky's
        inference from what they report (`racky.core.telemetry.infer_gpu_demand_w`: the
        power, or more than the cap for a GPU held at it by the power-cap reason). ``now``:
        monotonic s (the hold is a time window: ticks run early keep it as long)."""
        g = self.agents.gpus_per_tray
        gp = np.nansum(t.gpu_power_w.reshape(self.n, g), axis=1)
        dem = t.gpu_demand_w.reshape(self.n, g)
        dem_ok = np.isfinite(dem).all(axis=1) & (gp > 1.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            scaled = dem.sum(axis=1) * np.maximum(t.power_w / gp, 1.0)
        d = np.where(dem_ok, scaled, t.power_w * np.where(t.capping, 1.1, 1.0))
        d = np.where(t.fresh & t.powered, d, 0.0)
        hist = self._demand_hist
        hist.append((now, d))
        while now - hist[0][0] > self._hold_s:
            hist.popleft()
        out: np.ndarray = np.max([x for _, x in hist], axis=0)
        return out

    def allocate(self, limit_w: float | None, non_tray_w: float, v: TrayPowerView,
                 rack_power_w: float | None, dt: float, hard_limit_w: float | None = None
                 ) -> np.ndarray:
        """New desired caps (W per tray, NaN: none) for the rack limit ``limit_w`` (W), ``dt``
        s after the last call. ``hard_limit_w`` (W, fleet mode: rlc's lease in DC): while the
        powered trays' previous caps (uncapped: their maximum) + ``non_tray_w`` exceed it,
        every fall goes out at once, unramped (as when the rack is over its limit)."""
        cfg = self.cfg
        n = self.n
        mx, mn = self.tray_max_w, self.tray_min_w
        on = v.powered
        if limit_w is None:
            self.infeasible = False
            self.caps = np.full(n, np.nan)
            return self.caps.copy()
        budget = limit_w * (1.0 - cfg.budget_margin_pct / 100.0) - non_tray_w
        if on.sum() * mx <= budget:
            self.infeasible = False
            self.caps = np.full(n, np.nan)  # the limit cannot bind: no caps
            return self.caps.copy()
        a = np.where(on, float(mn), 0.0)
        rest = budget - a.sum()
        self.infeasible = rest < 0
        if rest > 0:
            want = np.where(on, np.clip(v.demand_w * (1.0 + cfg.headroom_pct / 100.0), mn, mx)
                            - mn, 0.0)
            for rank in sorted(set(v.rank[on].tolist())):
                sel = on & (v.rank == rank)
                w = np.where(sel, want, 0.0)
                tot = w.sum()
                if tot <= rest:
                    a += w
                    rest -= tot
                else:
                    a += _water_fill(w, rest)
                    rest = 0.0
                if rest <= 0:
                    break
            if rest > 0:
                room = np.where(on, mx - a, 0.0)
                if room.sum() > 0:
                    a += room * min(1.0, rest / room.sum())
        target = np.where(on, a, float(mn))  # an unpowered tray waits at its minimum
        prev_w = float(np.where(np.isnan(self.caps), mx, self.caps)[on].sum()) + non_tray_w
        fit_now = hard_limit_w is not None and prev_w > hard_limit_w
        self.caps = self._ramp(target, v, limit_w, rack_power_w, budget, dt, fit_now)
        return self.caps.copy()

    def _ramp(self, target: np.ndarray, v: TrayPowerView, limit_w: float,
              rack_power_w: float | None, budget: float, dt: float, fit_now: bool = False
              ) -> np.ndarray:
        cfg = self.cfg
        mx = self.tray_max_w
        prev = np.where(np.isnan(self.caps), mx, self.caps)
        over = fit_now or (rack_power_w is not None and rack_power_w > limit_w)
        down = target < prev
        if over:
            new = np.where(down, target, prev)
        else:
            new = np.where(down, np.maximum(target, prev - cfg.cap_ramp_down_w_per_s * dt), prev)
        up = target > prev
        inc = np.where(up, np.minimum(target, prev + cfg.cap_ramp_up_w_per_s * dt), new)
        enforced = np.where(np.isnan(v.enforced_w), mx, v.enforced_w)
        base = np.maximum(np.where(up, prev, new), enforced)
        room = budget - base.sum()
        extra = np.where(up, np.maximum(inc - np.maximum(prev, enforced), 0.0), 0.0)
        if extra.sum() > 0:
            share = min(1.0, max(room, 0.0) / extra.sum())
            new = np.where(up, np.minimum(inc, np.maximum(prev, enforced) + extra * share), new)
            new = np.where(up, np.maximum(new, prev), new)
        small = np.abs(new - prev) < cfg.cap_deadband_w
        if over:
            small &= new >= prev  # over the limit every decrease goes out
        new = np.where(small & ~np.isnan(self.caps), prev, new)
        return np.round(new, 0)


def _water_fill(want: np.ndarray, total: float) -> np.ndarray:
    """Split ``total`` over elements up to ``want`` each, equal level first (water filling)."""
    w = np.sort(want[want > 0])
    if w.size == 0 or total <= 0:
        return np.zeros_like(want)
    n = w.size
    cum = 0.0
    level = 0.0
    for i, x in enumerate(w):
        need = (x - (w[i - 1] if i else 0.0)) * (n - i)
        if cum + need >= total:
            level = (w[i - 1] if i else 0.0) + (total - cum) / (n - i)
            break
        cum += need
        level = x
    out: np.ndarray = np.minimum(want, level)
    return out



class BlastRadius:
    """At most ``max_actions`` automated actions per ``window_s`` (safety exempt)."""

    def __init__(self, cfg: BlastRadiusSettings) -> None:
        self.cfg = cfg
        self._times: deque[float] = deque()
        self.refused = 0

    def used(self, now: float) -> int:
        """Automated actions counted in the window ending at ``now`` (monotonic s)."""
        while self._times and now - self._times[0] >= self.cfg.window_s:
            self._times.popleft()
        return len(self._times)

    def allow(self, now: float, n: int = 1) -> bool:
        """Take ``n`` actions if the window has room (recorded); False (counted) otherwise."""
        if self.used(now) + n > self.cfg.max_actions:
            self.refused += 1
            return False
        self._times.extend([now] * n)
        return True


GRID_EFFICIENCY = 0.975
"""PSU efficiency used to turn the grid-side (AC) ramp limit into the DC one (REFERENCE §1.2:
97.5 % at full load, the curve's lowest point above 30 % load)."""


@dataclass
class SmoothingSettings:
    """Per-GPU agent settings derived from the rack's grid-side ramp limit (REF §1.3)."""

    power_floor_pct: float
    ramp_up_w_per_s: float | None
    ramp_down_w_per_s: float | None
    ramp_down_hysteresis_s: float


def smoothing(cfg: PowerSettings, agents: NodeAgentsSettings, other_share: float
              ) -> SmoothingSettings:
    """The agents' floor and ramps: the rack ramp split over every GPU and its tray share
    (rack W/s = GPUs × per-GPU W/s × (1 + other share))."""
    r = cfg.rack_ramp_w_per_s
    per_gpu = None
    if r is not None:
        # grid side is the AC input: DC ramp = AC ramp × η (REF §1.2: 97.5 % at full load)
        per_gpu = round(r * GRID_EFFICIENCY
                        / (agents.trays * agents.gpus_per_tray * (1.0 + other_share)), 1)
    return SmoothingSettings(cfg.power_floor_pct, per_gpu, per_gpu, cfg.ramp_down_hysteresis_s)


@dataclass
class LimitState:
    """The rack limit and where each part comes from (for state and alarms)."""

    limit_w: float | None = None
    source: str = "none"
    parts: dict[str, float] = field(default_factory=dict)


def rack_limit(budget_w: float | None, capacity_w: float | None, derate_w: float | None,
               requested: Mapping[str, RequestedCap]) -> LimitState:
    """The lowest of the budget, capacity ceiling, derate and requested caps."""
    parts: dict[str, float] = {}
    if budget_w is not None:
        parts["budget"] = budget_w
    if capacity_w is not None:
        parts["capacity"] = capacity_w
    if derate_w is not None:
        parts["derate"] = derate_w
    for user, rc in requested.items():
        parts[f"requested:{user}"] = rc.power_w
    if not parts:
        return LimitState()
    src = min(parts, key=lambda k: parts[k])
    return LimitState(parts[src], src, parts)


def smoothing_weight(alpha: float, ticks: float) -> float:
    """The weight of a new value in an average smoothed by ``alpha`` per nominal tick, after
    ``ticks`` nominal ticks (a tick run early: less than one, which moves the average as
    much less): ``1 - (1 - alpha)**ticks``."""
    return alpha if ticks == 1.0 else 1.0 - (1.0 - alpha) ** ticks


class NonTrayEstimate:
    """The rack's power outside the trays (switches, fans, BBU charging; W), learned as the
    shelves' load − Σ tray power: an average (weight ``alpha`` per nominal tick) of the
    **median of the last** ``window`` measurements.

    The shelves and the trays are read by different paths at different instants, so at a
    load step one tick's difference is the step itself (132 → 40 kW: trays already at 40 kW,
    shelves still at 132 kW gives 92 kW "outside the trays"); averaged in, one such tick
    raised the estimate by ~17 kW and the allocator capped every tray for seconds under a
    budget far above the load. A median of 5 ignores up to 2 skewed ticks in a row and
    follows a real change within 3 ticks, then the average.

    Args:
        initial_w: the configured figure until measured, W. alpha: weight per nominal tick
            (0, 1]. window: measurements in the median (odd, >= 1).
    Raises:
        ValueError: alpha outside (0, 1], window < 1.
    """

    def __init__(self, initial_w: float, alpha: float = 0.2, window: int = 5) -> None:
        if not 0.0 < alpha <= 1.0 or window < 1:
            raise ValueError(f"NonTrayEstimate: alpha {alpha} not in (0, 1] or window {window} < 1")
        self.value_w = float(initial_w)
        self.alpha = alpha
        self._recent: deque[float] = deque(maxlen=window)

    def update(self, measured_w: float, ticks: float = 1.0) -> float:
        """Take one measurement (W, >= 0) after ``ticks`` nominal ticks (< 1: a tick run
        early, which moves the average as much less); the new estimate, W."""
        self._recent.append(max(float(measured_w), 0.0))
        med = float(np.median(np.fromiter(self._recent, float, len(self._recent))))
        self.value_w += smoothing_weight(self.alpha, ticks) * (med - self.value_w)
        return self.value_w
