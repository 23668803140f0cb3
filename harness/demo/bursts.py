"""The demo's burst figures: how valvey held the supply through agentic bursts (REFERENCE §5
S2), from what a rack of the demo recorded (`harness.demo.record.Recorder`).

A rack whose scenario's load is ``agentic`` (config/scenarios/demo-agentic-bursts.toml: the
row's burst rack) has no load step to score; its figures (`burst_figures`) are S2's over one
window (`burst_window`): from `BURSTS_FROM_S` (the daemons' start is over, as the step rack's
40 s before its step) to the first scripted fault after it (a fault's effect is not the
bursts'; as the step windows, `harness.demo.summary.scoring_windows`, are cut), else the
run's end:

* the supply error (PV − setpoint, K): RMS and max |error| of valvey's PV (its
  ``state/supply_loop``, sensor noise included, as the step items) and of the plant truth
  beside it (the simulator's supply temperature against the scenario's setpoint);
* the rack load the bursts drew (plant truth, W): p5, p95, max and the largest rise between
  two plant samples;
* valvey's valve command (`sims.metrics.valve_activity`): moves (control periods in which it
  moved by more than `VALVE_DEADBAND_PCT`), the active share, travel and strokes per hour.

The checklist's item (`harness.demo.checklist`) holds these against S2's targets,
`BURST_RMS_K` and `BURST_MAX_K`.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from typing import Any

from harness.demo.record import Recorder
from sims.metrics import step_metrics, valve_activity
from sims.scenario import FaultSpec, Scenario

__all__ = ["BURSTS_FROM_S", "BURST_MAX_K", "BURST_MIN_WINDOW_S", "BURST_RMS_K",
           "VALVE_DEADBAND_PCT", "burst_figures", "burst_window", "is_burst_load",
           "setpoints_at"]

BURSTS_FROM_S = 40.0
"""Start of the burst window, plant s: valvey and racky are up, valvey's feedforward is on
racky's rack power (the step rack's first 40 s, before its step, are the same start)."""
BURST_MIN_WINDOW_S = 20.0
"""A window shorter than this is not scored, s (a few bursts at least: median 6 s + 4 s)."""
BURST_RMS_K = 0.15  # REFERENCE §5 S2: RMS ≤ 0.15 K
BURST_MAX_K = 0.5  # REFERENCE §5 S2: max |ΔT_supply| ≤ 0.5 K
VALVE_DEADBAND_PCT = 0.1
"""A valve command change larger than this between two control periods is a move, %."""


def setpoints_at(loop_t: Sequence[float], loop_sp: Sequence[float], at: Sequence[float],
                 default_c: float) -> list[float]:
    """The setpoint in force at each of ``at`` (plant time, s): valvey's published setpoint
    (``loop_t``/``loop_sp``, in time order) at or before it, ``default_c`` before the first.
    The plant truth is scored against it, as valvey's PV is: an operator's ``set_setpoint``
    moves both."""
    out: list[float] = []
    i, cur = 0, default_c
    for t in at:
        while i < len(loop_t) and loop_t[i] <= t:
            cur = loop_sp[i]
            i += 1
        out.append(cur)
    return out


def is_burst_load(sc: Scenario) -> bool:
    """Whether ``sc``'s load is agentic bursts (scored by `burst_figures`, not as steps)."""
    return sc.load.kind == "agentic"


def burst_window(sc: Scenario, end_t: float) -> tuple[float, float, FaultSpec | None]:
    """(t0, t1, the fault that ends it or None), plant s: from `BURSTS_FROM_S` to the first
    scripted fault after it, else to the run's end (``end_t``, s; at most the scenario's
    duration). ``t1 <= t0`` when the run ended before the window began."""
    t0 = BURSTS_FROM_S
    t_end = min(end_t, sc.duration_s)
    cut = min((f for f in sc.faults if t0 < f.at_s < t_end), key=lambda f: f.at_s,
              default=None)
    return t0, (cut.at_s if cut is not None else t_end), cut


def _error_figures(t: list[float], pv: list[float | None], sp: list[float] | float,
                   t0: float, t1: float) -> dict[str, Any] | None:
    try:
        m = step_metrics(t, pv, sp, t0, t1)
    except ValueError:  # no sample in the window
        return None
    return {"rms_error_k": m.rms_error_k, "max_abs_error_k": m.max_abs_error_k,
            "t_max_error_s": t0 + m.t_max_error_s, "samples": m.samples}


def _load_figures(rec: Recorder, t0: float, t1: float) -> dict[str, Any] | None:
    pts = [(float(r["t_s"]), float(r["rack_power_w"])) for r in rec.plant
           if t0 <= float(r["t_s"]) <= t1 and isinstance(r.get("rack_power_w"), (int, float))]
    if len(pts) < 2:
        return None
    w = [p for _, p in pts]
    q = statistics.quantiles(w, n=20, method="inclusive")  # q[0] p5, q[18] p95
    return {"p5_w": q[0], "p95_w": q[18], "max_w": max(w), "mean_w": statistics.fmean(w),
            "largest_rise_w": max(b - a for a, b in itertools.pairwise(w))}


def _valve_figures(rec: Recorder, t0: float, t1: float) -> dict[str, Any] | None:
    rows = [r for r in rec.loop if t0 <= r["t_s"] <= t1
            and isinstance(r.get("valve_command_pct"), (int, float))
            and math.isfinite(r["valve_command_pct"])]
    if len(rows) < 2:
        return None
    period_s = (rows[-1]["t_s"] - rows[0]["t_s"]) / (len(rows) - 1)
    if period_s <= 0:
        return None
    va = valve_activity([r["valve_command_pct"] for r in rows], period_s, VALVE_DEADBAND_PCT)
    return {"moves": round(va.active_fraction * va.periods), "periods": va.periods,
            "period_s": period_s, "active_fraction": va.active_fraction,
            "travel_pct": va.travel_pct, "strokes_per_h": va.strokes_per_h}


def burst_figures(sc: Scenario, rec: Recorder, end_t: float) -> dict[str, Any] | None:
    """The burst figures of a rack's run (see the module docstring); None when ``sc``'s load
    is not agentic bursts.

    Returns a dict: ``t0_s``, ``t1_s`` (the window, plant s), ``cut_by`` (the fault that ends
    it, ``"<kind> <target> at t = <s> s"``, or None), ``valvey_pv`` and ``plant_truth``
    (``rms_error_k``, ``max_abs_error_k`` [K], ``t_max_error_s`` [plant s], ``samples``; None
    when the window is shorter than `BURST_MIN_WINDOW_S` or has no sample), ``load``
    (``p5_w``, ``p95_w``, ``max_w``, ``mean_w``, ``largest_rise_w`` [W]; None likewise) and
    ``valve`` (``moves``, ``periods``, ``period_s``, ``active_fraction`` [0..1],
    ``travel_pct``, ``strokes_per_h``; None likewise)."""
    if not is_burst_load(sc):
        return None
    t0, t1, cut = burst_window(sc, end_t)
    out: dict[str, Any] = {
        "t0_s": t0, "t1_s": t1,
        "cut_by": None if cut is None else f"{cut.kind} {cut.target()} at t = {cut.at_s:g} s",
        "valvey_pv": None, "plant_truth": None, "load": None, "valve": None}
    if t1 - t0 < BURST_MIN_WINDOW_S:
        return out
    sp_c = sc.plant.supply_setpoint_c
    loop_t = [r["t_s"] for r in rec.loop]
    loop_sp = [r.get("setpoint_c") or sp_c for r in rec.loop]
    out["valvey_pv"] = _error_figures(
        loop_t, [r.get("supply_temp_c") for r in rec.loop], loop_sp, t0, t1)
    plant_t = [float(r["t_s"]) for r in rec.plant]
    out["plant_truth"] = _error_figures(  # against the setpoint in force, as the PV
        plant_t, [r.get("supply_temp_c") for r in rec.plant],
        setpoints_at(loop_t, loop_sp, plant_t, sp_c), t0, t1)
    out["load"] = _load_figures(rec, t0, t1)
    out["valve"] = _valve_figures(rec, t0, t1)
    return out
