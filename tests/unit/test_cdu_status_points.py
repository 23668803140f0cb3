"""Issue 3's CDU status points as the register map carries them (sims/cdu/): pump running /
fault bits and speed feedback (a trip is seen before the flow falls), run hours, reservoir
level, filter dP, the second facility valve, the rack isolation valves."""

from __future__ import annotations

import pytest

from sims.cdu import CduParams, CduPlant
from tests.unit.test_cdu_plant import Runner, warm


def test_pump_trip_sets_the_fault_bit_before_the_flow_falls() -> None:
    plant, run = warm(132_000.0)
    r0 = plant.readings()
    assert r0["pump_a_running"] == 1 and r0["pump_a_fault"] == 0 and r0["pump_b_running"] == 0
    assert r0["pump_a_speed_pct"] == pytest.approx(r0["pump_speed_pct"], abs=1.0)
    q0 = plant.truth().flow_lps
    plant.trip_pump(0)
    run.run(0.1, 132_000.0)
    r = plant.readings()
    assert r["pump_a_fault"] == 1  # the VFD trip bit, one step after the trip
    assert plant.truth().flow_lps > 0.9 * q0  # the flow has barely started to fall
    run.run(5.0, 132_000.0)
    r = plant.readings()
    assert r["pump_a_speed_pct"] < 0.5 * r0["pump_a_speed_pct"]  # coasting down
    plant.set_duty_pump(1)
    run.run(10.0, 132_000.0)
    r = plant.readings()
    assert r["pump_b_running"] == 1 and r["pump_b_fault"] == 0 and r["pump_a_fault"] == 1


def test_run_hours_count_only_for_the_running_pump() -> None:
    plant, run = warm(79_200.0)
    a0, b0 = plant.readings()["pump_a_run_hours_h"], plant.readings()["pump_b_run_hours_h"]
    run.run(720.0, 79_200.0)  # 0.2 h
    r = plant.readings()
    assert r["pump_a_run_hours_h"] - a0 == pytest.approx(0.2, abs=0.02)
    assert r["pump_b_run_hours_h"] == pytest.approx(b0, abs=1e-6)


def test_second_valve_and_isolation_valves_follow_their_commands() -> None:
    plant, run = warm(79_200.0)
    assert plant.readings()["valve_b_position_pct"] == pytest.approx(0.0, abs=0.5)
    plant.write("valve_b_command_pct", 40.0)
    run.run(60.0, 79_200.0)
    assert plant.readings()["valve_b_position_pct"] == pytest.approx(40.0, abs=1.0)
    r = plant.readings()
    assert r["rack_isolation_open"] == 1 and r["rack_isolation_closed"] == 0
    plant.write("rack_isolation_command", 0)
    run.run(30.0, 79_200.0)
    r = plant.readings()
    assert r["rack_isolation_open"] == 0 and r["rack_isolation_closed"] == 1
    assert plant.truth().flow_lps < 0.2 * plant.params.design_flow_lps


def test_reservoir_level_falls_with_a_leak_and_filter_dp_rises_with_fouling() -> None:
    plant, run = warm(79_200.0)
    lvl0 = plant.readings()["reservoir_level_pct"]
    dp0 = plant.readings()["filter_diff_pressure_kpa"]
    plant.set_leak_lpm(2.0)
    plant.set_filter_fouling(3.0)
    run.run(120.0, 79_200.0)
    r = plant.readings()
    assert r["reservoir_level_pct"] < lvl0 - 1.0
    assert r["filter_diff_pressure_kpa"] > 2.0 * dp0


def test_three_supply_sensors_and_loop_pressure_are_read() -> None:
    plant = CduPlant(CduParams(), seed=3)
    plant.warm_start(79_200.0)
    Runner(plant).run(5.0, 79_200.0)
    r = plant.readings()
    vals = [r[k] for k in ("supply_temp_c", "supply_temp_b_c", "supply_temp_c_c")]
    assert max(vals) - min(vals) < 0.5 and len(set(vals)) > 1  # independent noise
    assert r["loop_pressure_kpa"] > 0.0
