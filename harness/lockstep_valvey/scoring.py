"""Figures of one lock-step run of valvey (issue 4's definitions, issue 21's honest scoring):
`figures` (control scenarios), `sensor_figures` (S5), `leak_figures` (S6), and `report`, the
printed table of the standard set."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from harness.lockstep_valvey.run import LockstepResult, run_valvey
from sims.metrics import step_metrics
from sims.scenario import load_scenario
from valvey.config import ValveyConfig

__all__ = ["figures", "leak_figures", "median_p90", "over_capping", "report", "seeded",
           "sensor_figures"]

def _max_abs_err(res: LockstepResult, t0: float, t1: float | None = None,
                 truth: bool = True) -> tuple[float, float]:
    tr = res.trace
    pv = tr.true_supply_temp_c if truth else tr.supply_temp_c
    m = step_metrics(tr.t_s, pv, tr.setpoint_c, t0, t1)
    return m.max_abs_error_k, m.rms_error_k


def figures(res: LockstepResult) -> dict[str, Any]:
    """Issue 4's figures of one run, scored at the plant (issue 21 item 4): errors, extremes
    and settling on the plant's true supply temperature at every plant step (0.1 s,
    `LockstepResult.steps`), valve activity from the valves' actual movement.

    Definitions: valve active = share of plant steps in which an actuator ran (its running
    time); strokes per hour = Σ|Δ plug position| / 100 % per hour (both valves); both over the
    scored window (S2: after 60 s; otherwise the whole run); back inside ±0.5 K = settling
    time of `sims.metrics.step_metrics` on the 0.1 s error; over-capping = the most a cap
    asked of racky fell below the physical reference (`cap_reference_w`, the lesser of it and
    the rack's demand), % of that reference, over the 1 s samples while a cap was active.
    """
    sc = res.scenario
    tr = res.trace
    st = res.steps
    t_err = list(st.t_s)
    err = list(st.error_k)
    out: dict[str, Any] = {"scenario": sc.name, "seed": sc.seed, "model": res.model,
                           "feedforward": res.feedforward}
    ld = sc.load
    t_act = 60.0 if ld.kind in ("agentic", "training", "trace") else 0.0
    va = st.activity(t_act)
    out["valve_active_pct"] = round(va.running_pct, 1)
    out["valve_strokes_per_h"] = round(va.strokes_per_h, 2)
    out["max_gpu_tj_c"] = round(max(st.hottest_gpu_tj_c), 2)
    out["valves_declared_stuck"] = sum(1 for _, k, d in res.events
                                       if k == "transition" and str(d).startswith("valves:failed"))
    out["throttle_events"] = max(tr.throttled_trays)
    if ld.kind == "step" and ld.step_at_s is not None and ld.back_at_s is not None:
        up = step_metrics(t_err, err, 0.0, ld.step_at_s, ld.back_at_s)
        down = step_metrics(t_err, err, 0.0, ld.back_at_s)
        out["max_abs_error_k"] = round(max(up.max_abs_error_k, down.max_abs_error_k), 3)
        out["max_abs_error_up_down_k"] = [round(up.max_abs_error_k, 3),
                                          round(down.max_abs_error_k, 3)]
        out["back_within_0_5k_s"] = [up.settling_s, down.settling_s]
    elif ld.kind in ("agentic", "training", "trace"):
        m = step_metrics(t_err, err, 0.0, 60.0)
        out["max_abs_error_k"] = round(m.max_abs_error_k, 3)
        out["rms_error_k"] = round(m.rms_error_k, 3)
    gt = {f.kind: f for f in res.ground_truth}
    if "pump_trip" in gt:
        t0 = gt["pump_trip"].start_s
        trip = res.first("event", t0, "pump_trip")
        cmd = res.first("write", t0, "duty_pump_select")
        before = st.window(0.0, t0 - 1e-6)
        after = st.window(t0)
        q0 = st.flow_lpm[before.stop - 1] if before else st.flow_lpm[0]
        tj0 = max(st.hottest_gpu_tj_c[i] for i in before) if before else st.hottest_gpu_tj_c[0]
        out["fault_detected_s"] = None if trip is None else round(trip - t0, 2)
        out["standby_commanded_s"] = None if cmd is None else round(cmd - t0, 2)
        out["min_flow_pct"] = round(100.0 * min(st.flow_lpm[i] for i in after) / q0, 1)
        out["gpu_tj_rise_k"] = round(max(st.hottest_gpu_tj_c[i] for i in after) - tj0, 2)
        out["pump_alarm"] = sorted({a for _, a in res.alarms_raised(t0) if "pump" in a})
        cap = res.first("request", t0, "cap_rack")
        out["no_standby_cap_s"] = None if cap is None else round(cap - t0, 2)
    if "valve_stuck" in gt:
        t_stuck = gt["valve_stuck"].start_s
        t_step = sc.load.step_at_s or 0.0
        det = res.first("transition", t_stuck, "valves:failed")
        fo = res.first("write", t_stuck, "valve_b_command_pct")
        cap = res.first("request", t_stuck, "cap_rack")
        out["mismatch_detected_after_step_s"] = None if det is None else round(det - t_step, 1)
        out["second_valve_after_step_s"] = None if fo is None else round(fo - t_step, 1)
        out["cap_after_step_s"] = None if cap is None else round(cap - t_step, 1)
        out["time_above_sp_plus_2k_s"] = round(st.longest_above_s(2.0), 1)
        out["max_supply_c"] = round(max(tr.setpoint_c) + st.max_above_k(), 2)
        caps = [c for c in tr.cap_w if c is not None]
        out["cap_w"] = round(min(caps)) if caps else None
    if "facility_water_rise" in gt:
        out["max_above_sp_k"] = round(st.max_above_k(), 3)
        caps = [c for c in tr.cap_w if c is not None]
        out["min_cap_w"] = round(min(caps)) if caps else None
        released = res.first("request", 2400.0, "release_cap")
        out["cap_released_at_s"] = released
    out.update(over_capping(res))
    return out


def over_capping(res: LockstepResult) -> dict[str, Any]:
    """``over_capping_pct``: the most any cap asked of racky fell below the physical
    reference (the trace's ``cap_reference_w``), % of the reference, 0 when no cap went below
    it; None when no cap was applied. ``lowest_cap_w`` and ``cap_reference_at_min_cap_w``: the
    lowest cap and the reference while it was in force."""
    tr = res.trace
    pairs = [(c, r) for c, r in zip(tr.cap_w, tr.cap_reference_w, strict=True)
             if c is not None and r is not None]
    if not pairs:
        return {"over_capping_pct": None, "cap_reference_at_min_cap_w": None,
                "lowest_cap_w": None}
    worst = max((100.0 * (r - c) / r if r > 0.0 else 0.0) for c, r in pairs)
    c_min, r_at = min(pairs)
    return {"over_capping_pct": round(max(0.0, worst), 1),
            "cap_reference_at_min_cap_w": round(r_at), "lowest_cap_w": round(c_min)}


def _longest_run(ts: list[float], step: float) -> float:
    best = cur = 0.0
    prev = None
    for t in ts:
        cur = cur + step if prev is not None and t - prev <= step + 1e-6 else step
        best = max(best, cur)
        prev = t
    return round(best, 1)


def sensor_figures(res: LockstepResult, point: str = "supply_temp_c") -> dict[str, Any]:
    """S5: when each fault of ``point`` was detected, relative to its start (s): freeze,
    dropout (also in samples at 10 Hz), drift (energy balance or disagreement)."""
    out: dict[str, Any] = {}
    faults = [f for f in res.ground_truth if f.kind == "sensor" and f.target == point]
    spec = {(f.at_s, f.mode) for f in res.scenario.faults if f.kind == "sensor"}
    for f in faults:
        mode = next((m for a, m in spec if abs(a - f.start_s) < 1.0), None)
        if mode is None:
            continue
        want = {"stale": "frozen", "freeze": "frozen", "dropout": "bad", "nan": "bad",
                "drift": "drift", "spike": "spike"}.get(mode or "", mode)
        if want == "spike":
            continue
        res.first("transition", f.start_s, f"sensor:{point}:")
        t_kind = None
        for tt, k, d in res.events:
            if k == "transition" and tt >= f.start_s and str(d).startswith(
                    f"sensor:{point}:") and (str(d).endswith(f"->{want}")
                                             or (want == "drift" and str(d).endswith("disagree"))):
                t_kind = tt
                break
        out[f"{mode}_detected_s"] = None if t_kind is None else round(t_kind - f.start_s, 2)
        if want == "bad" and t_kind is not None:
            # samples received from the first NaN one (read 0.1 s after the fault starts, at
            # the 10 Hz poll) to the one that raised the detection, inclusive
            out["dropout_detected_samples"] = round((t_kind - f.start_s - 0.1) / 0.1) + 1
    stops = [f.start_s for f in res.ground_truth if f.kind == "mqtt_stop"]
    if stops:
        t_stale = next((t for t, a in res.alarms_raised(stops[0]) if a == "room_sensors_stale"),
                       None)
        out["republish_detected_s"] = None if t_stale is None else round(t_stale - stops[0], 1)
    tr = res.trace
    out["max_abs_true_error_k"] = round(max(abs(v - sp) for v, sp in zip(
        tr.true_supply_temp_c, tr.setpoint_c, strict=True)), 3)
    return out


def seeded(scenario: str, seeds: Iterable[int], **kw: Any) -> list[dict[str, Any]]:
    """`figures` of ``scenario`` for each seed."""
    sc = load_scenario(scenario)
    return [figures(run_valvey(sc, seed=s, **kw)) for s in seeds]


def median_p90(values: Sequence[float]) -> tuple[float, float]:
    """Median and 90th percentile (nearest rank)."""
    v = sorted(values)
    p90 = v[min(len(v) - 1, math.ceil(0.9 * len(v)) - 1)]
    return statistics.median(v), p90


def report(seeds: int = 10, out: Callable[[str], None] = print) -> dict[str, Any]:
    """Run issue 4's scenario set in lock-step and print the figures table (median and p90
    over ``seeds`` seeds where noise matters; S1 and S2 with PID-only beside PID + dynamic
    feedforward). Takes minutes: the benchmark of the figures the scenario tests assert on a
    smaller seed set."""
    rows: dict[str, Any] = {}
    seed_list = list(range(1, seeds + 1))
    for name in ("load-step", "agentic-bursts"):
        for ff in (False, True):
            figs = seeded(name, seed_list, feedforward=ff)
            key = f"{name} {'PID+FF' if ff else 'PID-only'}"
            agg: dict[str, Any] = {}
            for k in ("max_abs_error_k", "rms_error_k", "valve_active_pct",
                      "valve_strokes_per_h"):
                vals = [f[k] for f in figs if f.get(k) is not None]
                if vals:
                    agg[k] = tuple(round(x, 3) for x in median_p90(vals))
            if name == "load-step":
                settle = [max(s or 0.0 for s in f["back_within_0_5k_s"]) for f in figs]
                agg["back_within_0_5k_s"] = tuple(median_p90(settle))
            rows[key] = agg
            out(f"{key:32s} {agg}")
    for name in ("pump-trip", "valve-stuck", "facility-water-rise"):
        rows[name] = figures(run_valvey(load_scenario(name)))
        out(f"{name:32s} {rows[name]}")
    cfg = ValveyConfig()
    no_b = cfg.model_copy(update={"valves": cfg.valves.model_copy(
        update={"second_valve": False})})
    rows["valve-stuck (no second valve)"] = figures(run_valvey(load_scenario("valve-stuck"),
                                                               no_b))
    out(f"{'valve-stuck (no second valve)':32s} {rows['valve-stuck (no second valve)']}")
    s5 = run_valvey(load_scenario("sensor-dropout"))
    rows["sensor-dropout"] = sensor_figures(s5)
    out(f"{'sensor-dropout':32s} {rows['sensor-dropout']}")
    for name in ("leak", "leak-qd-failure", "leak-second-tray", "leak-cdu-rope",
                 "leak-sensor-fault"):
        res = run_valvey(load_scenario(name))
        rows[name] = leak_figures(res)
        out(f"{name:32s} {rows[name]}")
    h = run_valvey(load_scenario("healthy-24h"), model="cdu")
    rows["healthy-24h"] = {"false_alarms": h.alarms_raised(), **figures(h)}
    out(f"{'healthy-24h':32s} {rows['healthy-24h']}")
    return rows


def leak_figures(res: LockstepResult) -> dict[str, Any]:
    """S6: from the first leak fault's start: leak sensor trip (plant), tray power-down
    request and tray off, rack power-down, isolation (or none)."""
    starts = [f.start_s for f in res.ground_truth if f.kind in ("tray_leak", "cdu_leak",
                                                                  "leak_sensor_fault")]
    t0 = min(starts) if starts else 0.0
    out: dict[str, Any] = {}
    td = res.first("request", t0, "power_down_trays")
    out["power_down_trays_s"] = None if td is None else round(td - t0, 1)
    rd = res.first("request", t0, "power_down_rack")
    out["power_down_rack_s"] = None if rd is None else round(rd - t0, 1)
    iso = res.first("write", t0, "rack_isolation_command")
    out["isolation_s"] = None if iso is None else round(iso - t0, 1)
    out["min_trays_powered"] = min(res.trace.trays_powered) if res.trace.trays_powered else None
    out["tray_leak_request_s"] = out["power_down_trays_s"]
    m = res.plant_marks
    trips = sorted((t, k.split(".")[1]) for k, t in m.items() if k.startswith("tray_wet."))
    offs = [m[f"tray_off.{k}"] - t for t, k in trips if f"tray_off.{k}" in m]
    out["tray_off_after_trip_s"] = round(max(offs), 2) if offs and len(offs) == len(
        trips) else None
    iso_t = m.get("isolated")
    # the last sensor trip before the isolation (the one that completed the rack tier)
    last_trip = max((t for t in [t for t, _ in trips] + [m[k] for k in ("rope_wet",
                     "drip_pan_wet") if k in m] if iso_t is None or t <= iso_t), default=None)
    out["isolated_after_trip_s"] = (None if iso_t is None or last_trip is None
                                    else round(iso_t - last_trip, 2))
    rack_ev = [d for t, k, d in res.events if k == "event" and isinstance(d, dict)
               and d.get("kind") == "rack_leak"]
    out["why_rack"] = rack_ev[0].get("reason") if rack_ev else None
    out["alarms"] = sorted({a for _, a in res.alarms_raised()})
    return out


