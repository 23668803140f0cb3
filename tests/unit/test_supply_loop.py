"""valvey supply-temperature loop core (valvey/core/supply_loop.py), pure and in lock-step with a
small first-order-plus-dead-time plant (REFERENCE §1.7: K ≈ −37 K per unit stroke, τ 35 s,
θ 2 s)."""

from __future__ import annotations

import itertools
import math
from collections import deque
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rackplane.config import validate_data
from rackplane.core.alarms import AlarmEngine
from rackplane.core.samples import Quality, Sample, good, invalid
from rackplane.errors import CommandError, ConfigError
from valvey.core.supply_loop import SupplyLoop
from valvey.core.supply_loop_settings import (
    SUPPLY_LOOP_FAILSAFE,
    SUPPLY_PV_INVALID,
    SUPPLY_TEMP_DEVIATION,
    LoopStep,
    SupplyLoopSettings,
    default_alarm_defs,
)

T0 = 5000.0
TICK = 0.1


def pv(value: float, t: float) -> Sample:
    return good("supply_temp_c", value, "degC", 0, t)


def mk(**kw: Any) -> SupplyLoop:
    """The raw loop: no PV filter, no setpoint ramp unless a test asks (they have own tests)."""
    return SupplyLoop(SupplyLoopSettings(**{"pv_filter_tau_s": 0.0,
                                            "setpoint_ramp_k_per_min": None, **kw}))


def ticks(start: float, seconds: float) -> list[float]:
    return [start + k * TICK for k in range(round(seconds / TICK))]


class Fopdt:
    """Supply temperature vs valve stroke: T' = (T0 + K·x(t−θ) + d − T)/τ (REFERENCE §1.7)."""

    def __init__(self, k_per_unit: float = -37.0, tau_s: float = 35.0, theta_s: float = 2.0,
                 x0: float = 0.8, temp_c: float = 45.0, dt_s: float = TICK):
        self.k, self.tau, self.dt = k_per_unit, tau_s, dt_s
        self.base = temp_c - k_per_unit * x0
        self.delay = deque([x0] * round(theta_s / dt_s))
        self.temp_c = temp_c
        self.disturbance_k = 0.0

    def step(self, valve_pct: float) -> float:
        self.delay.append(valve_pct / 100.0)
        x = self.delay.popleft()
        target = self.base + self.k * x + self.disturbance_k
        self.temp_c += self.dt * (target - self.temp_c) / self.tau
        return self.temp_c


Trace = list[tuple[float, float, float]]


def run_plant(
    loop: SupplyLoop, seconds: float, disturbance_at_s: float, disturbance_k: float,
    sensor_tau_s: float = 0.0,
) -> tuple[Trace, int, list[LoopStep]]:
    """10 Hz lock-step: plant, sensor lag, loop; the valve follows written commands only."""
    plant = Fopdt()
    valve = 80.0
    sensed = plant.temp_c
    trace: Trace = []
    steps: list[LoopStep] = []
    writes = 0
    for k, now in enumerate(ticks(T0, seconds)):
        t_rel = k * TICK
        if abs(t_rel - disturbance_at_s) < 1e-9:
            plant.disturbance_k = disturbance_k
        temp = plant.step(valve)
        sensed = sensed + (TICK / sensor_tau_s) * (temp - sensed) if sensor_tau_s else temp
        s = loop.step(now, pv(sensed, now), valve)
        if s.write:
            assert s.command_pct is not None
            valve = s.command_pct
            writes += 1
        trace.append((t_rel, temp, valve))
        steps.append(s)
    return trace, writes, steps


# --- settings ----------------------------------------------------------------------------


def test_default_gains_are_the_simc_tuning() -> None:
    """REFERENCE §2.2: k = 37 K/unit = 0.37 K/%, τ1 = 35 s, θ = 2 s, τc = 3 s."""
    k_per_pct, tau1, theta, tau_c = 0.37, 35.0, 2.0, 3.0
    s = SupplyLoopSettings()
    assert s.kc_pct_per_k == pytest.approx(tau1 / (k_per_pct * (tau_c + theta)), abs=0.05)
    assert s.ti_s == min(tau1, 4 * (tau_c + theta))
    p = s.pid_settings()
    assert p.action == "direct"
    assert p.ki == pytest.approx(18.9 / 20.0)
    assert p.error_deadband == 0.1
    assert s.setpoint_c == 45.0
    assert s.output_rate_limit_pct_per_s <= 100.0 / 60.0  # not faster than the valve strokes


@pytest.mark.parametrize(
    "data, fragment",
    [
        ({"stop_action": "failsafe", "failsafe_output_pct": None}, "stop_action"),
        ({"failsafe_output_pct": 120.0}, "failsafe_output_pct"),
        ({"period_s": 0.25}, "period_s"),
        ({"setpoint_c": 60.0}, "setpoint_c"),
        ({"stale_after_s": 0.5}, "stale_after_s"),
        ({"deviation_hysteresis_k": 3.0}, "deviation_hysteresis_k"),
        ({"output_min_pct": 50.0, "output_max_pct": 40.0}, "output_min_pct"),
        ({"failsafe_after_periods": 0}, "failsafe_after_periods"),
        ({"kc_pct_per_k": float("inf")}, "kc_pct_per_k"),
        ({"setpoint": 45.0}, "setpoint"),
    ],
)
def test_settings_validation(data: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate_data(SupplyLoopSettings, data, "valvey.toml")
    assert fragment in str(err.value)


def test_hold_failsafe_is_an_explicit_choice() -> None:
    s = validate_data(SupplyLoopSettings, {"failsafe_output_pct": None}, "valvey.toml")
    assert s.failsafe_output_pct is None and s.stop_action == "hold"
    assert mk(stop_action="failsafe").stop_command_pct() == 100.0
    assert mk().stop_command_pct() is None
    assert mk(stop_action="failsafe", shadow=True).stop_command_pct() is None


# --- start-up ----------------------------------------------------------------------------


def test_initialises_bumplessly_from_readback_and_writes_nothing_without_it() -> None:
    loop = mk()
    for now in ticks(T0, 5.0):
        s = loop.step(now, pv(45.0, now), None)
        assert s.mode == "initialising" and s.command_pct is None and not s.write
        assert s.conditions["supply_loop_initialising"]
    now = T0 + 5.0
    s = loop.step(now, pv(45.0, now), 63.0)
    assert s.mode == "auto" and s.command_pct == 63.0 and s.write  # takes ownership, no move
    assert s.transitions == ("mode:initialising->auto",)
    for t in ticks(now + TICK, 20.0):
        s = loop.step(t, pv(45.0, t), 63.0)
        assert s.command_pct == pytest.approx(63.0) and not s.write


def test_pid_runs_once_per_period_with_the_real_elapsed_time() -> None:
    loop = mk(deadband_k=0.0, output_rate_limit_pct_per_s=100.0, min_step_pct=0.0)
    loop.step(T0, pv(45.0, T0), 50.0)
    ki = loop.settings.pid_settings().ki
    updates: list[tuple[float, float]] = []
    for k in range(1, 101):
        now = T0 + k * TICK + (0.004 if k % 7 == 0 else 0.0) + (0.03 if k % 13 == 0 else 0.0)
        s = loop.step(now, pv(46.0, now), 50.0)
        if s.pid_updated:
            assert s.pid is not None
            updates.append((now, s.pid.i))
    assert 9 <= len(updates) <= 10  # 10 Hz steps, 1 s period
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(updates)]
    assert any(abs(g - 1.0) > 1e-3 for g in gaps)  # jittered ticks: dt is measured
    for (t1, i1), (t2, i2) in itertools.pairwise(updates):
        assert i2 - i1 == pytest.approx(ki * 1.0 * (t2 - t1))


# --- closed loop -------------------------------------------------------------------------


@pytest.mark.parametrize("disturbance_k", [3.0, -3.0])
@pytest.mark.parametrize("sensor_tau_s", [0.0, 2.0])
def test_settles_within_half_a_kelvin_after_a_disturbance_step(
    disturbance_k: float, sensor_tau_s: float
) -> None:
    """A 3 K disturbance (≈ 8 % of valve travel) at t = 60 s; SIMC τc = 3 s defaults."""
    loop = mk()
    trace, writes, _ = run_plant(loop, 600.0, 60.0, disturbance_k, sensor_tau_s)
    before = [abs(temp - 45.0) for t, temp, _ in trace if t < 60.0]
    after = [abs(temp - 45.0) for t, temp, _ in trace if t >= 60.0]
    settled = [abs(temp - 45.0) for t, temp, _ in trace if t >= 60.0 + 90.0]
    assert max(before) < 0.05
    assert max(after) < 1.0
    assert max(settled) <= 0.5
    valve_end = trace[-1][2]
    assert valve_end == pytest.approx(80.0 + disturbance_k / 0.37, abs=2.0)
    assert writes < 60  # minimum step: a write every ~10 s at most on average


# --- fail-safe ---------------------------------------------------------------------------


def _healthy(loop: SupplyLoop, seconds: float = 10.0, start: float = T0) -> float:
    for now in ticks(start, seconds):
        loop.step(now, pv(45.2, now), 60.0)
    return start + seconds


FAULTS = ["nan", "missing", "bad_quality", "stale_quality", "not_refreshed", "out_of_range",
          "frozen"]


def _faulty_sample(kind: str, now: float, t_fault: float) -> Sample | None:
    if kind == "nan":
        return pv(math.nan, now)  # good() turns NaN into a BAD sample
    if kind == "missing":
        return None
    if kind == "bad_quality":
        return invalid("supply_temp_c", "degC", 0, now, Quality.BAD, "timeout")
    if kind == "stale_quality":
        return pv(45.2, now).as_stale()
    if kind == "not_refreshed":
        return pv(45.2, t_fault)  # the same last sample, never refreshed
    if kind == "out_of_range":
        return pv(-3276.8, now)  # a 0x8000 sentinel decoded as a value (BR-09)
    if kind == "frozen":
        return pv(45.2, now)  # fresh timestamps, bit-identical value
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", FAULTS)
def test_failsafe_within_n_periods_of_an_invalid_pv(kind: str) -> None:
    extra = {"pv_frozen_after_s": 10.0} if kind == "frozen" else {}
    loop = mk(**extra)
    s_ = loop.settings
    if kind == "frozen":
        t = T0
        for k, now in enumerate(ticks(T0, 10.0)):  # noisy, alive sensor
            loop.step(now, pv(45.2 + (0.01 if k % 2 else 0.0), now), 60.0)
        t = T0 + 10.0
    else:
        t = _healthy(loop)
    t_fault = t
    # When the PV becomes unusable: at once, or after stale_after_s / pv_frozen_after_s.
    t_invalid = {"not_refreshed": t_fault + s_.stale_after_s,
                 "frozen": t_fault + 10.0}.get(kind, t_fault)
    last_pid = loop.step(t, pv(45.2, t), 60.0).pid
    first_invalid: float | None = None
    failsafe_at: float | None = None
    for now in ticks(t + TICK, 30.0):
        s = loop.step(now, _faulty_sample(kind, now, t_fault), 60.0)
        if s.pv_status != "ok":
            assert s.pv_c is None
            assert not s.pid_updated and s.pid is last_pid  # invalid samples never reach the PID
        else:
            last_pid = s.pid
        if s.conditions[SUPPLY_PV_INVALID] and first_invalid is None:
            first_invalid = now
        if s.mode == "failsafe" and failsafe_at is None:
            failsafe_at = now
            assert s.command_pct == 100.0 and s.write  # at once, past the rate limit
            assert s.conditions[SUPPLY_LOOP_FAILSAFE]
            assert s.bad_periods == s_.failsafe_after_periods
            assert "mode:auto->failsafe" in s.transitions
    assert first_invalid is not None and failsafe_at is not None
    assert t_invalid - 1e-6 <= first_invalid <= t_invalid + s_.period_s + TICK
    assert failsafe_at <= t_invalid + s_.failsafe_after_periods * s_.period_s + TICK
    assert failsafe_at >= first_invalid + (s_.failsafe_after_periods - 1) * s_.period_s - TICK


def test_recovery_from_failsafe_is_bumpless_and_rate_limited() -> None:
    loop = mk()
    t = _healthy(loop)
    for now in ticks(t, 6.0):
        s = loop.step(now, None, 60.0)
    assert s.mode == "failsafe" and s.command_pct == 100.0
    t += 6.0
    prev_cmd, prev_t = 100.0, t - loop.settings.period_s  # the last fail-safe period
    recovered = False
    for now in ticks(t, 60.0):
        s = loop.step(now, pv(44.0, now), 100.0)  # 1 K below setpoint: the valve should close
        assert s.command_pct is not None
        if s.pid_updated:
            limit = loop.settings.output_rate_limit_pct_per_s * (now - prev_t) + 1e-9
            assert abs(s.command_pct - prev_cmd) <= limit
            prev_cmd, prev_t = s.command_pct, now
        if s.mode == "auto" and not recovered:
            recovered = True
            assert not s.conditions[SUPPLY_PV_INVALID] and not s.conditions[SUPPLY_LOOP_FAILSAFE]
    assert recovered
    assert prev_cmd < 100.0 - 50.0  # it did move, at the rate limit


def test_failsafe_hold_keeps_the_last_command() -> None:
    loop = mk(failsafe_output_pct=None)
    t = _healthy(loop)
    cmd = loop.command_pct
    for now in ticks(t, 10.0):
        s = loop.step(now, None, 60.0)
    assert s.mode == "failsafe" and s.command_pct == cmd and not s.write


def test_failsafe_without_any_readback_then_recovery() -> None:
    loop = mk()
    for now in ticks(T0, 2.0):  # bad periods 1 (at T0) and 2
        s = loop.step(now, None, None)
        assert s.mode == "initialising" and not s.write
    s = loop.step(T0 + 2.0, None, None)  # 3rd bad period
    assert s.mode == "failsafe" and s.command_pct == 100.0 and s.write
    for now in ticks(T0 + 2.1, 5.0):
        s = loop.step(now, pv(45.0, now), None)
    assert s.mode == "auto" and s.command_pct is not None and s.command_pct > 90.0


def test_failsafe_hold_without_readback_stays_initialising() -> None:
    loop = mk(failsafe_output_pct=None)
    for now in ticks(T0, 10.0):
        s = loop.step(now, None, None)
    assert s.mode == "initialising" and s.command_pct is None and not s.write
    assert s.conditions[SUPPLY_PV_INVALID]


def test_a_short_dropout_holds_without_failsafe() -> None:
    loop = mk()
    t = _healthy(loop)
    cmd = loop.command_pct
    for now in ticks(t, 1.5):  # < failsafe_after_periods
        s = loop.step(now, None, 60.0)
        assert s.command_pct == cmd and s.mode == "auto"
    assert s.conditions[SUPPLY_PV_INVALID]
    for now in ticks(t + 1.5, 2.0):
        s = loop.step(now, pv(45.2, now), 60.0)
    assert s.mode == "auto" and not s.conditions[SUPPLY_PV_INVALID]


def test_rate_limit_does_not_wind_up_the_integrator() -> None:
    """The PID tracks the rate-limited command: its integral does not store the travel the
    rate limit withheld, so after the error shrinks it continues from the applied command."""
    loop = mk()
    loop.step(T0, pv(45.0, T0), 50.0)
    for now in ticks(T0 + TICK, 20.0):
        # 2.5 K above setpoint (after the 0.1 K dead zone): I alone asks 2.36 %/s > 1.6 %/s.
        s = loop.step(now, pv(47.6, now), 50.0)
    climbed = s.command_pct
    assert climbed is not None and 75.0 < climbed < 85.0  # rate-limited all the way
    for now in ticks(T0 + 20.1, 1.5):
        s = loop.step(now, pv(45.6, now), 50.0)  # error shrinks to 0.5 K
        if s.pid_updated:
            break
    assert s.pid_updated and s.pid is not None
    kc, ki = 18.9, 18.9 / 20.0
    # Continuity from the applied command: u = climbed + ΔP + ki·e·dt (no stored windup).
    assert s.pid.output == pytest.approx(climbed + kc * (0.5 - 2.5) + ki * 0.5 * 1.0, abs=0.3)


def test_derivative_never_spans_a_gap_in_the_pv() -> None:
    loop = mk(td_s=10.0, output_rate_limit_pct_per_s=100.0)
    t = _healthy(loop)
    for now in ticks(t, 2.0):
        loop.step(now, None, 60.0)
    s = loop.step(t + 2.0, pv(46.2, t + 2.0), 60.0)  # +1 K across the gap
    assert s.pid_updated and s.pid is not None and s.pid.d == 0.0
    s = loop.step(t + 3.0, pv(46.3, t + 3.0), 60.0)
    assert s.pid is not None and s.pid.d == pytest.approx(18.9 * 10.0 * 0.1)


# --- manual, shadow, deadband ------------------------------------------------------------


def test_manual_is_rate_limited_and_back_to_auto_is_bumpless() -> None:
    loop = mk()
    t = _healthy(loop)
    loop.set_manual(30.0)
    written: list[float] = []
    for now in ticks(t, 40.0):
        s = loop.step(now, pv(45.2, now), 60.0)
        if s.write:
            assert s.command_pct is not None
            written.append(s.command_pct)
    assert s.mode == "manual" and s.command_pct == 30.0 and written[-1] == 30.0
    assert all(abs(b - a) <= 1.6 + 1e-9 for a, b in itertools.pairwise(written))
    loop.set_auto()
    t += 40.0
    prev = 30.0
    for now in ticks(t, 10.0):
        s = loop.step(now, pv(45.2, now), 30.0)
        assert s.mode == "auto"
        assert s.command_pct is not None
        assert abs(s.command_pct - prev) <= 1.6 + 1e-9
        prev = s.command_pct


def test_manual_target_below_min_step_is_still_written() -> None:
    loop = mk()
    t = _healthy(loop)
    cmd = loop.command_pct
    assert cmd is not None
    loop.set_manual(cmd + 0.3)
    s = loop.step(t, pv(45.2, t), 60.0)
    assert s.write and s.command_pct == pytest.approx(cmd + 0.3)


def test_manual_and_setpoint_commands_are_validated() -> None:
    loop = mk()
    for bad, code in ((120.0, "out_of_range"), (-1.0, "out_of_range"), (math.nan, "invalid_value")):
        with pytest.raises(CommandError) as err:
            loop.set_manual(bad)
        assert err.value.code == code
    for bad, code in ((60.0, "out_of_range"), (20.0, "out_of_range"), (math.inf, "invalid_value")):
        with pytest.raises(CommandError) as err:
            loop.set_setpoint(bad)
        assert err.value.code == code
    assert loop.control_mode == "initialising" and loop.setpoint_c == 45.0


def test_setpoint_step_has_no_derivative_kick() -> None:
    loop = mk(td_s=5.0, output_rate_limit_pct_per_s=100.0)
    t = _healthy(loop)
    loop.set_setpoint(44.0)
    for now in ticks(t, 1.0):
        s = loop.step(now, pv(45.2, now), 60.0)
        if s.pid_updated:
            assert s.pid is not None and s.pid.d == 0.0
            assert s.setpoint_c == 44.0


def test_shadow_computes_from_the_real_valve_and_writes_nothing() -> None:
    loop = mk(shadow=True)
    for now in ticks(T0, 30.0):
        s = loop.step(now, pv(46.0, now), 40.0)  # someone else holds the valve at 40 %
        assert not s.write and s.mode == "shadow"
    assert s.control_mode == "auto"
    assert s.command_pct is not None and 40.0 < s.command_pct <= 40.0 + 1.6 + 1e-9
    for now in ticks(T0 + 30.0, 10.0):  # the fail-safe is computed but not written either
        s = loop.step(now, None, 40.0)
        assert not s.write
    assert s.control_mode == "failsafe" and s.mode == "shadow"
    loop.set_shadow(False)
    s = loop.step(T0 + 40.0, None, 40.0)
    assert s.write and s.command_pct == 100.0
    assert "shadow:off" in s.transitions


def test_leaving_shadow_is_bumpless() -> None:
    loop = mk(shadow=True)
    for now in ticks(T0, 10.0):
        loop.step(now, pv(45.5, now), 40.0)
    loop.set_shadow(False)
    s = loop.step(T0 + 10.0, pv(45.5, T0 + 10.0), 40.0)
    assert s.write and s.command_pct is not None and abs(s.command_pct - 40.0) <= 1.6 + 1e-9


def test_deadband_and_minimum_step() -> None:
    loop = mk()
    loop.step(T0, pv(45.0, T0), 50.0)
    writes = 0
    for k, now in enumerate(ticks(T0 + TICK, 300.0)):  # noise inside the 0.1 K dead zone
        s = loop.step(now, pv(45.0 + (0.08 if k % 3 else -0.08), now), 50.0)
        writes += s.write
    assert writes == 0 and s.command_pct == pytest.approx(50.0)
    # A small steady error integrates below the 1 % step and is written in >= 1 % steps.
    loop2 = mk()
    loop2.step(T0, pv(45.0, T0), 50.0)
    written = [50.0]
    for now in ticks(T0 + TICK, 120.0):
        s = loop2.step(now, pv(45.15, now), 50.0)
        if s.write:
            assert s.command_pct is not None
            written.append(s.command_pct)
    steps = [b - a for a, b in itertools.pairwise(written)]
    assert steps and all(d >= 1.0 - 1e-9 for d in steps)
    assert loop2.command_pct is not None and loop2.command_pct - written[-1] < 1.0


def test_reaching_an_output_limit_is_written_even_below_the_minimum_step() -> None:
    loop = mk()
    loop.step(T0, pv(45.0, T0), 99.5)
    last_written = None
    for now in ticks(T0 + TICK, 10.0):
        s = loop.step(now, pv(47.0, now), 99.5)
        if s.write:
            last_written = s.command_pct
    assert last_written == 100.0


def test_track_applied_continues_from_an_interlock_output() -> None:
    loop = mk()
    t = _healthy(loop)
    loop.track_applied(0.0)  # e.g. a leak interlock closed the valve
    prev = 0.0
    for now in ticks(t, 5.0):
        s = loop.step(now, pv(46.0, now), 0.0)
        assert s.command_pct is not None and abs(s.command_pct - prev) <= 1.6 + 1e-9
        prev = s.command_pct


def test_track_applied_before_initialisation_and_numpy_readback() -> None:
    loop = mk()
    loop.track_applied(30.0)  # an interlock wrote before the loop ever saw a read-back
    assert loop.control_mode == "auto"
    for now in ticks(T0, 3.0):
        s = loop.step(now, pv(45.5, now), None)
    assert s.pid is not None and s.command_pct is not None
    assert abs(s.command_pct - 30.0) <= 2 * 1.6 + 1e-9
    other = mk()
    s = other.step(T0, pv(45.0, T0), np.float32(42.5))  # type: ignore[arg-type]
    assert s.command_pct == pytest.approx(42.5)  # a numpy scalar is a number, not "unknown"


def test_caller_bugs_raise_without_changing_state() -> None:
    loop = mk()
    t = _healthy(loop)
    cmd = loop.command_pct
    with pytest.raises(ValueError, match="backwards"):
        loop.step(t - 5.0, pv(45.0, t), 60.0)
    with pytest.raises(ValueError):
        loop.step(t, pv(45.0, t), 60.0, feedforward_pct=math.nan)
    with pytest.raises(ValueError):
        loop.step(math.nan, pv(45.0, t), 60.0)
    assert loop.command_pct == cmd and loop.control_mode == "auto"
    s = loop.step(t, pv(45.2, t), math.nan)  # a NaN read-back is just "unknown"
    assert s.mode == "auto"


def test_transitions_are_reported_once() -> None:
    loop = mk()
    t = _healthy(loop)
    seen: list[str] = []
    for now in ticks(t, 10.0):
        seen += loop.step(now, None, 60.0).transitions
    for now in ticks(t + 10.0, 5.0):
        seen += loop.step(now, pv(45.0, now), 60.0).transitions
    assert seen == ["pv:ok->missing", "mode:auto->failsafe", "pv:missing->ok",
                    "mode:failsafe->auto"]


def test_deviation_condition_after_120_s_and_alarm_defs() -> None:
    loop = mk()
    loop.step(T0, pv(45.0, T0), 60.0)
    loop.set_manual(60.0)  # hold the valve: the deviation persists
    eng = AlarmEngine(default_alarm_defs(), T0 - 2000.0)  # start-up mask already over
    raised_at = None
    for now in ticks(T0 + TICK, 130.0):
        s = loop.step(now, pv(47.5, now), 60.0)
        for ev in eng.update(now, s.conditions):
            if ev.id == SUPPLY_TEMP_DEVIATION and ev.kind == "raised":
                raised_at = now
    assert s.deviation_c == pytest.approx(2.5)
    assert raised_at is not None and 120.0 <= raised_at - T0 <= 121.0


def test_failsafe_raises_the_alarms() -> None:
    loop = mk()
    eng = AlarmEngine(default_alarm_defs(), T0)
    raised: list[str] = []
    for now in ticks(T0, 10.0):
        s = loop.step(now, pv(45.0, now) if now < T0 + 5.0 else None, 60.0)
        raised += [e.id for e in eng.update(now, s.conditions) if e.kind == "raised"]
    assert raised == [SUPPLY_PV_INVALID, SUPPLY_LOOP_FAILSAFE]


def test_reload_is_bumpless() -> None:
    loop = mk()
    t = _healthy(loop)
    cmd = loop.command_pct
    assert cmd is not None
    loop.set_setpoint(44.0)
    loop.reload(SupplyLoopSettings(kc_pct_per_k=7.9, ti_s=35.0))
    assert loop.setpoint_c == 44.0
    s = loop.step(t, pv(45.2, t), 60.0)
    assert s.command_pct is not None and abs(s.command_pct - cmd) < 1.0


# --- property: the command never jumps except into the fail-safe --------------------------

_pv_events = st.lists(
    st.one_of(st.none(), st.just(math.nan), st.floats(20.0, 70.0), st.just(-3276.8)),
    min_size=1,
    max_size=120,
)


@settings(max_examples=150, deadline=None)
@given(
    pvs=_pv_events,
    readback=st.one_of(st.none(), st.floats(0.0, 100.0)),
    ff=st.floats(-50.0, 50.0),
    shadow=st.booleans(),
)
def test_command_within_limits_and_rate_limited_except_failsafe(
    pvs: list[float | None], readback: float | None, ff: float, shadow: bool
) -> None:
    loop = mk(shadow=shadow)
    prev: float | None = None
    prev_t = T0
    for k, value in enumerate(pvs):
        now = T0 + k * 1.0  # every step is a period boundary
        sample = None if value is None else pv(value, now)
        s = loop.step(now, sample, readback, feedforward_pct=ff)
        if shadow:
            assert not s.write
        cmd = s.command_pct
        if cmd is not None:
            assert 0.0 <= cmd <= 100.0
            entered_failsafe = "mode:auto->failsafe" in s.transitions or (
                "mode:initialising->failsafe" in s.transitions)
            started = prev is None
            left_failsafe = "mode:failsafe->auto" in s.transitions
            if left_failsafe and readback is not None and not shadow:
                # Leaving fail-safe re-synchronises to the read-back (the fail-safe write may
                # never have reached the valve): bumpless with respect to the real valve.
                assert abs(cmd - readback) <= 1.6 * 1.0 + 1e-6
            elif not started and not entered_failsafe and not shadow:
                assert prev is not None
                assert abs(cmd - prev) <= 1.6 * (now - prev_t) + 1e-6
            prev, prev_t = cmd, now


def test_leaving_failsafe_resumes_from_the_readback_when_the_failsafe_write_was_lost() -> None:
    """Breaker finding C1: the CDU was unreachable, so the 100 % fail-safe write failed and the
    valve stayed at 62.7 %. When the PV returns the loop must continue from 62.7 % (where the
    valve is), not from the 100 % it believed it wrote."""
    loop = mk()
    t = T0
    loop.step(t, pv(45.0, t), 62.7)  # initialise from the read-back
    for k in range(1, 6):  # PV gone: fail-safe after 3 bad periods
        s = loop.step(t + k, None, 62.7)
    assert s.control_mode == "failsafe" and s.command_pct == 100.0
    s = loop.step(t + 6, pv(45.0, t + 6), 62.7)  # the CDU is back; the valve never moved
    assert "mode:failsafe->auto" in s.transitions
    assert s.command_pct is not None and abs(s.command_pct - 62.7) <= 1.6 + 1e-6
