"""The ideal beside every matrix cell (issue 21 item 5): what a controller with perfect
knowledge of *that* plant achieves, computed by the harness from the plant model.

The ideal controller reads the plant's true state every 0.1 s step and sets the valve for
the heat actually arriving at the exchanger: the return water now at the CDU (temperature
T_rc, flow Q) must leave it at the target, so the exchanger has to remove
``q = C_s (T_rc − T_target) + C_cdu (T_ss − T_target) / τ`` (C_s = ρc·Q; the second term
returns the CDU node's stored heat in τ = 2 s) and, with ``q = k(x)·(T_rc − T_fws)``, the
valve position x is the one whose conductance k(x) (`sims.cdu.hx.hx_conductance_kw_per_k` of
the plant's own parameters: UA with fouling, rangeability, starved facility flow) is
``q / (T_rc − T_fws)``. The command goes to the plant's real actuator, which moves it at its
own speed (stroke time, backlash, stiction): nothing is faster than the plant allows, and it
never moves the valve ahead of the heat (moving at full speed at the step would cool the
supply 20–30 s before the heat arrives). The target is the setpoint, except with a bias common
to the supply sensors: a controller sees only its sensors, so its best is the setpoint minus
the bias (the bias is the floor).

Scored like the cells (`harness.lockstep_valvey.plant_steps`): max / RMS error at every plant
step, valve running time and strokes per hour at the plant.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from harness.lockstep_valvey.plant_steps import PlantSteps
from sims.cdu import CduParams, CduPlant
from sims.cdu.hx import hx_conductance_kw_per_k
from sims.cdu.variants import apply_variant
from sims.metrics import step_metrics
from sims.scenario import Scenario, ScenarioRun

__all__ = ["ideal_figures", "ideal_valve_pct", "run_ideal"]

_TAU_NODE_S = 2.0


def _common_bias_k(plant: CduPlant) -> float:
    b = plant.params.supply_sensor_bias_k
    return b[0] if len(set(b)) == 1 else 0.0


def _valve_for(plant: CduPlant, flow_lps: float, return_c: float, facility_c: float,
               need_kw: float) -> float:
    """The valve position (0–1) whose exchanger conductance removes ``need_kw`` from return
    water at ``return_c`` against facility water at ``facility_c``."""
    p = plant.params
    if need_kw <= 0.0 or flow_lps <= 1e-9:
        return 0.0
    if return_c - facility_c <= 1e-6:
        return 1.0
    k_need = need_kw / (return_c - facility_c)
    qp_max = p.facility_max_flow_lps * p.facility_flow_available_fraction
    ln_r = math.log(p.valve_rangeability)

    def k_at(x: float) -> float:
        return hx_conductance_kw_per_k(flow_lps, qp_max * math.exp((x - 1.0) * ln_r), p)

    if k_at(1.0) <= k_need:
        return 1.0
    lo, hi = 0.0, 1.0  # k_at rises with x
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        if k_at(mid) < k_need:
            lo = mid
        else:
            hi = mid
    return hi


def ideal_valve_pct(plant: CduPlant, target_c: float, node: bool = True) -> float:
    """The valve position (%) that removes the heat arriving at the exchanger now and (with
    ``node``) brings the CDU node to ``target_c`` (module docstring); 0–100."""
    p = plant.params
    tr = plant.truth()
    q = tr.flow_lps
    cs = p.coolant_rho_c_kj_per_l_k * q
    need_kw = cs * (tr.return_temp_c - target_c)
    if node:
        c_node = p.coolant_rho_c_kj_per_l_k * p.cdu_volume_l
        need_kw += c_node * (tr.supply_temp_c - target_c) / _TAU_NODE_S
    return 100.0 * _valve_for(plant, q, tr.return_temp_c, tr.facility_supply_temp_c, need_kw)


def _rate_limited_path(want: list[float], x0: float, rate: float) -> list[float]:
    """The path from ``x0`` moving at most ``rate`` per step that stays closest to ``want``
    in the worst case (minimax: bisection on the band ±e with a forward pass of the reachable
    interval, then a backward pass choosing, within it, the point nearest ``want``); it
    starts moving before a change as early as staying centred on it needs."""
    n = len(want)

    def reach(e: float) -> list[tuple[float, float]] | None:
        lo = hi = x0
        out = []
        for w in want:
            lo, hi = max(lo - rate, w - e, 0.0), min(hi + rate, w + e, 1.0)
            if lo > hi + 1e-12:
                return None
            out.append((lo, hi))
        return out

    lo_e, hi_e = 0.0, 1.0
    best = reach(hi_e)
    assert best is not None
    for _ in range(24):
        mid = 0.5 * (lo_e + hi_e)
        r = reach(mid)
        if r is None:
            lo_e = mid
        else:
            hi_e, best = mid, r
    path = [0.0] * n
    nxt: float | None = None
    for i in range(n - 1, -1, -1):
        a, b = best[i]
        if nxt is not None:
            a, b = max(a, nxt - rate), min(b, nxt + rate)
        x = min(max(want[i], a), b)
        path[i] = x
        nxt = x
    return path


def run_ideal(scenario: Scenario, *, variant: str | None = None,
              model: Literal["rack", "cdu"] | None = "rack",
              duration_s: float | None = None) -> tuple[Scenario, PlantSteps]:
    """Run ``scenario`` (on ``variant``) under the ideal controller; returns the scenario and
    its `PlantSteps` (errors against the setpoint, not the target).

    Two passes with perfect knowledge: the first records the valve position the heat
    arriving at the exchanger needs at every step (the valve set for it as it arrives, within
    the actuator's speed); the second commands the actuator along the path, within its speed,
    that stays closest to that need throughout (`_rate_limited_path`: knowing the heat to
    come, it starts moving as early as staying centred on the change needs, never at full
    speed at the step itself)."""
    if variant is not None:
        scenario = scenario.model_copy(update={"plant": type(scenario.plant).model_validate(
            {**scenario.plant.model_dump(), "variant": variant})})
    end = scenario.duration_s if duration_s is None else min(duration_s, scenario.duration_s)
    sp = scenario.plant.supply_setpoint_c

    def one_pass(plan: list[float] | None) -> tuple[list[float], PlantSteps]:
        run = ScenarioRun(scenario, model=model)
        plant = run.plant
        target = sp - _common_bias_k(plant)
        c = plant.params.coolant_rho_c_kj_per_l_k
        steps = PlantSteps()
        want: list[float] = []
        n = 0
        while run.t_s < end - 1e-9:
            if n % 10 == 0:  # the heartbeat keeps the CDU in remote control
                plant.write("heartbeat", float((n // 10) % 1000))
            tr = plant.truth()
            want.append(_valve_for(plant, tr.flow_lps, tr.return_temp_c,
                                   tr.facility_supply_temp_c,
                                   c * tr.flow_lps * (tr.return_temp_c - target)))
            cmd = ideal_valve_pct(plant, target) if plan is None else 100.0 * plan[n]
            plant.write("valve_command_pct", cmd)
            run.step(0.1)
            steps.record(plant, sp)
            n += 1
        return want, steps

    want, _ = one_pass(None)
    p = apply_variant(CduParams(), scenario.plant.variant)
    plan = _rate_limited_path(want, want[0], 0.1 / p.valve_stroke_time_s)
    _, steps = one_pass(plan)
    return scenario, steps


def ideal_figures(scenario: Scenario, *, variant: str | None = None,
                  model: Literal["rack", "cdu"] | None = "rack") -> dict[str, Any]:
    """The ideal's figures in the cells' terms: ``max_abs_error_k`` (a step load: from the
    first step on; bursts and square waves: after 60 s), ``rms_error_k`` (the latter),
    ``valve_active_pct`` and ``valve_strokes_per_h`` (same windows)."""
    sc, st = run_ideal(scenario, variant=variant, model=model)
    ld = sc.load
    t0 = (ld.step_at_s or 0.0) if ld.kind == "step" else 60.0
    m = step_metrics(list(st.t_s), list(st.error_k), 0.0, t0)
    act = st.activity(0.0 if ld.kind == "step" else 60.0)
    out: dict[str, Any] = {"max_abs_error_k": round(m.max_abs_error_k, 3),
                           "valve_active_pct": round(act.running_pct, 1),
                           "valve_strokes_per_h": round(act.strokes_per_h, 2)}
    if ld.kind != "step":
        out["rms_error_k"] = round(m.rms_error_k, 3)
    return out
