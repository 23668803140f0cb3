"""Commissioning step test (issue 4): manual, step the valve, identify K, τ, θ on the plant in
lock-step, propose SIMC PI gains (REFERENCE §2.2), accept them, back to auto bumplessly."""

from __future__ import annotations

import math

import pytest

from harness.lockstep_valvey import run_valvey
from rackplane.errors import CommandError
from sims.scenario import ScenarioRun, load_scenario
from valvey.core.controller import ValveyCore
from valvey.core.step_test import identify_fopdt, simc_pi


def test_identify_fopdt_recovers_a_known_first_order_dead_time_response() -> None:
    k, tau, theta = -0.3, 35.0, 3.0
    t = [0.5 * i for i in range(800)]
    y = [45.0 + (k * 10.0 * (1 - math.exp(-(ti - 10.0 - theta) / tau))
                 if ti >= 10.0 + theta else 0.0) for ti in t]
    got = identify_fopdt(t, y, 10.0, 45.0, y[-1])
    assert got is not None
    assert got[0] == pytest.approx(tau, rel=0.05) and got[1] == pytest.approx(theta, abs=1.0)
    kc, ti = simc_pi(k, tau, theta, 10.0)
    assert kc == pytest.approx(35.0 / (0.3 * 13.0)) and ti == pytest.approx(35.0)
    with pytest.raises(ValueError):
        simc_pi(0.0, 35.0, 3.0, 10.0)


def test_step_test_on_the_plant_identifies_reference_figures_and_is_accepted() -> None:
    """§1.7 expects K ≈ −0.25…−0.37 K/%, τ ≈ 35 s, θ ≈ 1–3 s on the §4 model (the wider
    bounds here allow for the transport delays and the sensor lag of this plant)."""
    sc = load_scenario("sensor-dropout").model_copy(update={"faults": [],
                                                            "duration_s": 900.0})
    seen: dict[str, object] = {}

    def act(run: ScenarioRun, core: ValveyCore, t_s: float, now: float) -> None:
        if abs(t_s - 60.0) < 0.05:
            with pytest.raises(CommandError, match="manual"):
                core.start_step_test(now, 10.0)
            u = core.loop.command_pct
            assert u is not None
            core.loop.set_manual(u)
        if abs(t_s - 120.0) < 0.05:
            seen["target"] = core.start_step_test(now, 10.0)
        r = core.step_test.result
        if r is not None and "result" not in seen:
            seen["result"] = r
            seen["gains"] = core.accept_step_test()
            core.loop.set_auto()

    res = run_valvey(sc, model="cdu", on_tick=act)
    r = seen.get("result")
    assert r is not None, "step test produced no result"
    assert -0.5 <= r.k_k_per_pct <= -0.15, r  # type: ignore[attr-defined]
    assert 15.0 <= r.tau_s <= 90.0, r  # type: ignore[attr-defined]
    assert 0.0 <= r.theta_s <= 15.0, r  # type: ignore[attr-defined]
    gains = seen["gains"]
    assert isinstance(gains, dict) and gains["kc_pct_per_k"] > 0 and gains["ti_s"] > 0
    # back in auto on the new gains: the supply returns to its setpoint
    tail = [abs(v - sp) for t, v, sp in zip(res.trace.t_s, res.trace.true_supply_temp_c,
                                             res.trace.setpoint_c, strict=True) if t > 800]
    assert max(tail) < 0.5
    assert res.trace.mode[-1] == "auto"


def test_a_start_without_enough_pv_history_says_what_it_needs() -> None:
    # the history is recorded in any mode (start_commissioning starts from auto): the refusal
    # used to say "in manual", which sent an operator of auto-commissioning the wrong way
    from valvey.core.step_test import StepTest, StepTestSettings

    st = StepTest(StepTestSettings(baseline_s=30.0), valve_rate_pct_per_s=1.0)
    for i in range(11):                       # 10 s of valid PV, 1 Hz: a third of the baseline
        st.record(float(i), 45.0)
    with pytest.raises(ValueError) as err:
        st.start(10.0, 50.0, 5.0)
    assert str(err.value) == "need 30 s of valid PV before the step (step_test.baseline_s)"
    for i in range(11, 41):                   # now 40 s: the same start goes ahead
        st.record(float(i), 45.0)
    assert st.start(40.0, 50.0, 5.0) == 55.0
