"""valvey's control behaviour in lock-step with the plant (issue 4): the dew-point floor of
the min/max selector, shadow mode, the supply loop's fail-safe on lost measurements, the
maximum-pressure override on the pumps, lead/lag rotation by run hours."""

from __future__ import annotations

from typing import Any

from harness.lockstep_valvey import run_valvey
from sims.scenario import EnvironmentSpec, FaultSpec, ScenarioRun, load_scenario
from valvey.config import ValveyConfig
from valvey.core.controller import ValveyCore
from valvey.core.output import dew_point_c


def _steady(duration_s: float, **upd: Any) -> Any:
    """S5's plant (79.2 kW constant, warm) without faults."""
    return load_scenario("sensor-dropout").model_copy(
        update={"faults": [], "duration_s": duration_s, **upd})


def test_dew_point_floor_wins_and_is_visible() -> None:
    """Humid warm room: dew point + margin above the setpoint → the floor wins, the supply
    is held at the floor, the constraint and the alarm say so."""
    env = EnvironmentSpec(room_temp_c=45.0, relative_humidity_pct=95.0)
    floor = dew_point_c(45.0, 95.0) + ValveyConfig().selector.dew_point_margin_k
    assert floor > 45.5
    res = run_valvey(_steady(400.0, environment=env))
    tr = res.trace
    assert tr.constraint[-1] == "dew_point_floor"
    assert abs(tr.setpoint_c[-1] - floor) < 0.3  # measured by the simulated sensors
    assert abs(tr.true_supply_temp_c[-1] - tr.setpoint_c[-1]) < 0.5
    assert "dew_point_floor_active" in {a for _, a in res.alarms_raised()}


def test_shadow_mode_computes_but_writes_nothing() -> None:
    """In shadow the loop still computes its command through a load step, but the CDU's
    valve demand register never follows it (and no heartbeat: the CDU goes local)."""
    seen: list[tuple[float, float | None, float]] = []

    def act(run: ScenarioRun, core: ValveyCore, t_s: float, now: float) -> None:
        if abs(t_s - 30.0) < 0.05:
            core.loop.set_shadow(True)
        if t_s > 30.5:
            seen.append((t_s, core.loop.command_pct, run.plant.readings()["valve_command_pct"]))

    res = run_valvey(load_scenario("load-step"), model="cdu", duration_s=150.0, on_tick=act)
    computed = [c for _, c, _ in seen if c is not None]
    written = [w for *_, w in seen]
    assert max(computed) - min(computed) > 10.0  # the loop answered the step (computed only)
    # the register moves only under the CDU's own local control, never to valvey's value
    assert res.trace.mode[-1] == "shadow"
    after_step = [(c, w) for t, c, w in seen if t > 65.0 and c is not None]
    assert sum(1 for c, w in after_step if abs(c - w) < 0.05) < len(after_step) / 4
    assert written


def test_supply_loop_fail_safe_when_every_supply_sensor_is_lost() -> None:
    """All three supply sensors NaN → the valve goes to its declared fail-safe (100 %) within
    its declared number of periods (+ the PV's own 2-sample BAD detection)."""
    faults = [FaultSpec.model_validate({"at_s": 60.0, "kind": "sensor", "point": p,
                                        "mode": "dropout"})
              for p in ("supply_temp_c", "supply_temp_b_c", "supply_temp_c_c")]
    cfg = ValveyConfig()
    res = run_valvey(_steady(120.0, faults=faults), cfg, model="cdu")
    tr = res.trace
    periods = cfg.supply_loop.failsafe_after_periods
    t_fs = next(t for t, m in zip(tr.t_s, tr.mode, strict=True) if t >= 60.0 and m == "failsafe")
    assert t_fs - 60.0 <= (periods + 2) * cfg.supply_loop.period_s
    after = [c for t, c in zip(tr.t_s, tr.valve_command_pct, strict=True) if t > t_fs + 1.0]
    assert after and all(c == 100.0 for c in after)
    assert "supply_loop_failsafe" in {a for _, a in res.alarms_raised()}


def test_max_pressure_override_limits_the_pump_speed() -> None:
    """A maximum loop pressure below the normal operating point: the override wins the pump
    min-select, visible as the pump constraint, and the speed falls below the dP loop's."""
    cfg = ValveyConfig()
    normal = run_valvey(_steady(180.0), cfg, model="cdu")
    speed_normal = normal.trace.pump_speed_cmd_pct[-1]
    capped_cfg = cfg.model_copy(update={"pump_loop": cfg.pump_loop.model_copy(
        update={"max_pressure_kpa": 300.0})})  # normal: ≈ 190 + 150 kPa
    seen: list[str] = []

    def act(run: ScenarioRun, core: ValveyCore, t_s: float, now: float) -> None:
        if int(t_s * 10) % 10 == 0:
            seen.append(core.pumps.state(now, {})["constraint"])

    capped = run_valvey(_steady(180.0), capped_cfg, model="cdu", on_tick=act)
    assert seen[-1] == "max_pressure"
    assert speed_normal is not None and capped.trace.pump_speed_cmd_pct[-1] is not None
    assert capped.trace.pump_speed_cmd_pct[-1] < speed_normal - 2.0


def test_lead_lag_rotates_to_the_standby_by_run_hours_bumplessly() -> None:
    """Duty pump A has run 300 h more than B (> rotate_after_h 100 h): soon after start the
    standby B becomes duty (a planned changeover), without a flow dip."""

    def act(run: ScenarioRun, core: ValveyCore, t_s: float, now: float) -> None:
        if t_s == 0.0:
            run.plant._run_h[0] = run.plant._run_h[1] + 300.0  # test set-up: an old duty pump

    res = run_valvey(_steady(60.0), model="cdu", on_tick=act)
    writes = [d for _, k, d in res.events if k == "write" and d[0] == "duty_pump_select"]
    assert writes and writes[0][1] == 1.0
    q = res.trace.flow_lpm
    assert min(q[5:]) > 0.95 * q[4]  # planned changeover: the old pump runs until B is at speed
    # no pump alarm (the CDU model alone publishes no room or leak sensors: those go stale)
    assert not [a for _, a in res.alarms_raised() if "pump" in a]


def test_pump_loop_fail_safe_when_the_dp_measurement_is_lost() -> None:
    """dP transmitter NaN → the pump speed goes to its declared fail-safe (85 %) within its
    declared periods, and comes back to the dP loop when the measurement returns."""
    cfg = ValveyConfig()
    faults = [FaultSpec.model_validate({"at_s": 60.0, "until_s": 90.0, "kind": "sensor",
                                        "point": "diff_pressure_kpa", "mode": "dropout"})]
    res = run_valvey(_steady(150.0, faults=faults), cfg, model="cdu")
    tr = res.trace
    fs = cfg.pump_loop.failsafe_speed_pct
    t_fs = next((t for t, v in zip(tr.t_s, tr.pump_speed_cmd_pct, strict=True)
                 if t >= 60.0 and v == fs), None)
    assert t_fs is not None
    assert t_fs - 60.0 <= (cfg.pump_loop.failsafe_after_periods + 2) * cfg.pump_loop.period_s
    assert "pump_loop_failsafe" in {a for _, a in res.alarms_raised()}
    assert tr.pump_speed_cmd_pct[-1] != fs  # back on the dP loop after the transmitter heals


def test_max_pressure_limit_holds_when_the_loop_pressure_is_lost() -> None:
    """The maximum-pressure override is winning; then the loop-pressure transmitter drops out
    (NaN): the limit cannot be judged, so the speed may not rise (its safe side), instead of
    the override silently letting go and the dP loop driving the speed (and pressure) up."""
    cfg = ValveyConfig()
    capped_cfg = cfg.model_copy(update={"pump_loop": cfg.pump_loop.model_copy(
        update={"max_pressure_kpa": 300.0})})
    faults = [FaultSpec.model_validate({"at_s": 120.0, "kind": "sensor",
                                        "point": "loop_pressure_kpa", "mode": "dropout"})]
    res = run_valvey(_steady(200.0, faults=faults), capped_cfg, model="cdu")
    tr = res.trace
    at = [v for t, v in zip(tr.t_s, tr.pump_speed_cmd_pct, strict=True)
          if 118.0 <= t <= 120.0 and v is not None]
    after = [v for t, v in zip(tr.t_s, tr.pump_speed_cmd_pct, strict=True)
             if t > 121.0 and v is not None]
    assert at and after
    assert max(after) <= max(at) + 0.5
