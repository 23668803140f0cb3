"""valvey's over-temperature interlock on a lock-step loss of heat rejection.

Stimulus: the S9 scenario (132 kW, supply setpoint 45 °C) with the facility water stepped
40 → 52 °C over 60 s at t = 120 s (a chiller trip: the facility water is hotter than the
setpoint, so no valve position can hold it) and back to 40 °C at t = 600 s. Defaults from
`valvey.core.safety.SafetySettings`: interlock at setpoint + 5 K for 5 s, cleared below
setpoint + 2 K for 60 s (module docstring of `valvey.core.safety`).

Right values: the interlock trips within its delay of the measured supply crossing
setpoint + 5 K; while the supply is above setpoint + 2 K the facility valve is fully open;
racky is asked for a cap so no GPU throttles; once the facility water is back the valve is
handed back to the loop without a deep undershoot (≥ setpoint − 2 K: before this test the
forced-open valve overcooled the supply to 41.1 °C), the interlock clears and the cap is
released.
"""

from __future__ import annotations

from typing import Any

import pytest

from harness.lockstep_valvey import LockstepResult, run_valvey
from sims.scenario import load_scenario
from valvey.core.safety import SafetySettings

SETPOINT_C = 45.0


@pytest.fixture(scope="module")
def run() -> LockstepResult:
    sc = load_scenario("facility-water-rise")
    fault = sc.faults[0].model_copy(update={"at_s": 120.0, "until_s": 600.0,
                                            "magnitude": 12.0, "ramp_s": 60.0})
    sc = sc.model_copy(update={"faults": [fault], "duration_s": 1500.0})
    assert sc.plant.supply_setpoint_c == SETPOINT_C
    return run_valvey(sc)


def _cols(res: LockstepResult) -> dict[str, list[Any]]:
    return res.trace.columns()


def test_interlock_trips_within_its_delay_and_alarms(run: LockstepResult) -> None:
    s = SafetySettings()
    tr = _cols(run)
    crossed = next(t for t, pv in zip(tr["t_s"], tr["pv_c"], strict=True)
                   if pv is not None and pv >= SETPOINT_C + s.overtemp_k)
    on = run.first("transition", contains="safety:over_temperature:on")
    assert on is not None, run.events[:20]
    # the trace is at 1 s: the crossing is known to within a second
    assert crossed - 1.0 <= on <= crossed + s.overtemp_delay_s + 1.0, (crossed, on)
    assert "supply_temp_high_interlock" in {a for _, a in run.alarms_raised()}


def test_valve_fully_open_while_hot_and_no_gpu_throttles(run: LockstepResult) -> None:
    s = SafetySettings()
    tr = _cols(run)
    on = run.first("transition", contains="safety:over_temperature:on")
    off = run.first("transition", contains="safety:over_temperature:off")
    assert on is not None and off is not None
    hot = [(t, pos) for t, pv, pos in zip(tr["t_s"], tr["pv_c"], tr["valve_position_pct"],
                                          strict=True)
           if on + 1.0 <= t < off and pv is not None and pv >= SETPOINT_C + s.overtemp_clear_k]
    assert len(hot) > 100, "the stimulus must hold the supply hot for minutes"
    assert min(pos for _, pos in hot) >= 99.0, [h for h in hot if h[1] < 99.0][:5]
    caps = [c for t, c in zip(tr["t_s"], tr["cap_w"], strict=True) if on <= t < off]
    assert caps and all(c is not None and c < 132_000 for c in caps)
    assert max(tr["throttled_trays"]) == 0


def test_recovery_bounded_undershoot_then_interlock_clears_and_cap_released(
        run: LockstepResult) -> None:
    tr = _cols(run)
    off = run.first("transition", contains="safety:over_temperature:off")
    assert off is not None and off < 900.0, off
    after = [pv for t, pv in zip(tr["t_s"], tr["true_supply_temp_c"], strict=True) if t >= 600.0]
    assert min(after) >= SETPOINT_C - 2.0, min(after)
    # back in the ±0.5 K band at the end and the rack at full power again
    assert abs(tr["true_supply_temp_c"][-1] - SETPOINT_C) <= 0.5
    assert tr["cap_w"][-1] is None, tr["cap_w"][-10:]
