"""What racky's core shows: the ``state/rack`` and ``state/rack_power`` payloads and the
validation figures of one tick, computed from a `racky.core.controller.RackyCore`'s public
attributes (split from the controller so no module is over ~700 lines). Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from racky.core.alarmbank import alarm_id
from racky.core.links import LINK_ALARM_KINDS
from racky.core.power import LimitState, ShelfView
from racky.core.validation import ValidationSample

if TYPE_CHECKING:
    from racky.core.controller import RackyCore

__all__ = ["LINK_KINDS", "power_confirmed_low", "rack_power_payload", "rack_state",
           "validation_sample"]

LINK_KINDS = frozenset(k.kind for k in LINK_ALARM_KINDS if k.kind not in (
    "port_silent", "gpu_stalled", "gpu_burst", "counter_unknown"))
"""Link alarm kinds a validation counts against its ports."""


def validation_sample(core: RackyCore, t_s: float, phase: str, trays: Sequence[int],
                      view: ShelfView, limit: LimitState, rack_w: float | None
                      ) -> tuple[ValidationSample, set[str]]:
    """The figures of one tick over ``trays`` (and their GPUs' ports): the sample and the ids
    of the link alarms active on those ports."""
    tj, margin, thr = [], [], 0
    for k in trays:
        r = core.readings.get(k)
        if r is None or not core.fresh[k]:
            continue
        tj += [x for x in r.gpu_temp_c.tolist() if math.isfinite(x)]
        margin += [x for x in r.gpu_t_limit_c.tolist() if math.isfinite(x)]
        thr += int(r.gpu_throttled.sum())
    nvl = nic_mean = nic_min = 0.0
    down = 0
    pre = 0.0
    alarms: set[str] = set()
    nic_ports: tuple[tuple[str, float], ...] = ()
    pre_bin = None
    lk = core.links
    if lk is not None:
        gmask = np.zeros(core.n_gpus, dtype=bool)
        for k in trays:
            gmask[k * core.gpt:(k + 1) * core.gpt] = True
        pm = gmask[lk.gpu]
        fr = core.frame
        if fr is not None:
            frac = _line_fractions(fr.speed_mb_per_s, fr.tx_bytes_per_s, fr.rx_bytes_per_s,
                                   fr.is_nvlink, fr.link_up)
            up = fr.link_up
            nv = pm & fr.is_nvlink & up
            ni = pm & ~fr.is_nvlink & up
            nvl = float(frac[nv].mean()) if nv.any() else 0.0
            nic_mean = float(frac[ni].mean()) if ni.any() else 0.0
            nics = pm & ~fr.is_nvlink
            nic_min = float(frac[nics].min()) if nics.any() else 0.0
            down = int((pm & ~up).sum())
            if phase == "backend" and nics.any():
                nic_ports = tuple((lk.names[i], round(float(frac[i]), 4))
                                  for i in np.flatnonzero(nics))
        rates = lk.pre_fec_rate_per_min[pm]
        pre = float(np.nanmax(rates)) if np.isfinite(rates).any() else 0.0
        run = core.validation
        if run is not None and lk.bins_closed != run.pre_fec_seq:
            pre_bin = (lk.bins_closed, lk.cfg.bin_s / 60.0, tuple(
                (lk.names[i], float(lk.pre_fec_rate_per_min[i])) for i in np.flatnonzero(pm)))
        names = {lk.names[i] for i in np.flatnonzero(pm)}
        for kind in LINK_KINDS:
            for thing in core.bank.things(kind):
                if thing in names:
                    alarms.add(alarm_id(kind, thing))
    s = ValidationSample(
        t_s=t_s, phase=phase, rack_power_w=rack_w, limit_w=limit.limit_w,
        capacity_w=view.capacity_w, hottest_tj_c=max(tj) if tj else math.nan,
        min_margin_c=min(margin) if margin else math.nan, throttled_gpus=thr,
        nvlink_fraction=nvl, nic_fraction_mean=nic_mean, nic_fraction_min=nic_min,
        ports_down=down, link_alarms=len(alarms), pre_fec_max_per_min=pre,
        nic_ports=nic_ports, pre_fec_bin=pre_bin,
        thermal_protected=tuple(sorted(k for k in trays if k in core.thermal.protect)),
    )
    return s, alarms


def _line_fractions(speed_mb_per_s: np.ndarray, tx_bytes_per_s: np.ndarray,
                    rx_bytes_per_s: np.ndarray, is_nvlink: np.ndarray,
                    link_up: np.ndarray) -> np.ndarray:
    """Each port's throughput, (tx + rx) / 2, as a fraction of its kind's **line rate**: the
    highest speed any port of that kind (NVLink, NIC) of the rack reads up (learned from the
    plant, not a nominal constant), so a port trained at a lower rate (400G → 200G) reads
    0.5 of line when it carries all it can. Shape (ports,); 0 where no speed is known."""
    line = np.zeros_like(speed_mb_per_s, dtype=np.float64)
    for kind in (is_nvlink, ~is_nvlink):
        sp = speed_mb_per_s[kind & link_up]
        sp = sp[np.isfinite(sp)]
        if sp.size:
            line[kind] = float(sp.max()) * 1e6
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = np.where(line > 0, 0.5 * (tx_bytes_per_s + rx_bytes_per_s) / line, 0.0)
    return np.nan_to_num(frac, nan=0.0, posinf=0.0, neginf=0.0)


def power_confirmed_low(core: RackyCore) -> bool:
    """Every tray racky switched off reports off, and the rack power is below
    ``confirmed_low_w`` when all trays are off (S6 c/d: valvey may isolate the liquid)."""
    off = [k for k in range(core.n_trays) if core.desired_powered[k] is False]
    if not off:
        return False
    for k in off:
        r = core.readings.get(k)
        if r is None or not core.fresh[k] or r.powered or r.power_w > 50.0:
            return False
    if len(off) == core.n_trays and core.last is not None:
        rw = core.last.rack_power_w
        return rw is not None and rw <= core.cfg.power.confirmed_low_w
    return True

def rack_power_payload(core: RackyCore, wall_ns: int) -> dict[str, Any]:
    """``state/rack_power`` (CONTRACTS.md; valvey's feedforward input)."""
    o = core.last
    shelves = o.shelves if o is not None else None
    return {
        # a partial sum (a shelf offline) would understate the rack to valvey: unknown
        "rack_power_w": None if shelves is None
        or shelves.shelves_reporting < shelves.shelves_configured else shelves.rack_power_w,
        # the AC input (rlc's leases and a row's feed limit are on it): unknown when partial
        "rack_input_w": None if shelves is None
        or shelves.shelves_input_reporting < shelves.shelves_configured
        else shelves.rack_input_w,
        "it_power_w": None if o is None else _r(o.it_power_w),
        "shelves_reporting": 0 if shelves is None else shelves.shelves_reporting,
        "shelves_configured": 0 if shelves is None else shelves.shelves_configured,
        "ts_ns": wall_ns,
    }

def rack_state(core: RackyCore) -> dict[str, Any]:
    """``state/rack``: lifecycle, limits and caps, redundancy, trays, validation."""
    o = core.last
    lc = core.persisted.lifecycle
    lim = o.limit if o is not None else LimitState()
    v = o.shelves if o is not None else None
    caps = {} if o is None else {f"tray{k:02d}": float(c) for k, c in enumerate(o.caps_w)
                                 if not math.isnan(c)}
    now = o.t_mono if o is not None else 0.0
    return {
        "lifecycle": {"state": lc.state, "since_ns": lc.since_ns, "reason": lc.reason,
                      "by": lc.by, "validated": lc.validated},
        "rack_power_w": None if o is None else _r(o.rack_power_w),
        "power_confirmed_low": power_confirmed_low(core),
        "limit_w": _r(lim.limit_w), "limit_source": lim.source,
        "limits": {k: _r(x) for k, x in lim.parts.items()},
        "budget_w": core.budget_w,
        "requested_caps": {u: {"power_w": rc.power_w, "reason": rc.reason,
                               "expires_in_s": round(max(rc.until_mono - now, 0.0), 1)}
                           for u, rc in core.requested.items()},
        "derate_w": _r(core.derate.cap_w),
        "capacity_cap_w": _r(core.capacity.cap_w),
        "tray_caps_w": caps,
        "protective_gpu_caps_w": {f"tray{k:02d}": round(c, 1)
                                  for k, c in core.thermal.protect.items()},
        "redundancy": None if v is None else {
            "capacity_w": v.capacity_w, "spare_psus": v.spare_psus,
            "redundant_feeds": v.redundant_feeds, "shelves_reporting": v.shelves_reporting},
        "trays_off": sorted(k for k in range(core.n_trays)
                            if core.desired_powered[k] is False),
        "safety_off": {str(k): x for k, x in core.persisted.safety_off.items()},
        "sequencing": [{"tray": t, "powered": p} for t, p in core.seq.pending],
        "tray_cap_overrides": {
            f"tray{k:02d}": {"power_w": rc.power_w, "by": rc.user, "reason": rc.reason,
                             "expires_in_s": round(max(rc.until_mono - now, 0.0), 1)}
            for k, rc in sorted(core.cap_overrides.items())},
        "cycling": [{"tray": k, "on_in_s": round(max(at - now, 0.0), 1)}
                    for k, at in sorted(core.cycle_on_at.items())],
        "validation": None if core.validation is None else {
            "stage": core.validation.stage,
            "elapsed_s": round(now - core.validation.start, 1),
            "duration_s": core.validation.duration_s,
            "phase": core.validation.phase_at(now), "run_id": core.validation.run_id},
        "last_validation": core.persisted.last_validation,
        "judge_epoch": core.judge_epoch,
        "cap_reasserts": core.recon.reasserts,
        "blast_radius_used": core.blast.used(now),
        "alarms": [a.id for a in core.bank.active()][:50],
        "links": None if o is None or o.links is None else {
            **o.links.summary, "watch": o.links.watch[:20]},
        "thermal": None if o is None else {
            "cause": o.thermal.cause, "hot_trays": o.thermal.hot_trays,
            "min_t_limit_c": _r(o.thermal.min_margin_c)},
    }


def _r(x: float | None, nd: int = 1) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return round(float(x), nd) + 0.0
