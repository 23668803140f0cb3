"""PidLoop (rackplane/core/pid.py): FIELD-CASES BR-14, BR-16, BR-25 and the anti-windup,
tracking, feedforward and bumpless-transfer properties.

The ``raw_*`` tests drive simple-pid 2.0.1 directly to document the library behaviour our
wrapper exists to fix (they pin the case numbers measured with that version).
"""

from __future__ import annotations

import math
from importlib.metadata import version

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from simple_pid import PID

from rackplane.clock import FakeClock
from rackplane.config import validate_data
from rackplane.core.pid import PidLoop, PidNotInitialisedError, PidOutput, PidSettings
from rackplane.errors import ConfigError

# FIELD-CASES cooling loop: simple-pid Kp=-5, Ki=-0.1 (Kd=-50) == direct acting 5, 0.1 (50).
BR_SETTINGS = PidSettings(kp=5.0, ki=0.1, kd=0.0, action="direct")
BR25_SETTINGS = PidSettings(kp=5.0, ki=0.1, kd=50.0, action="direct")


def test_simple_pid_version_and_private_integral() -> None:
    """The wrapper writes PID._integral (not in the public API): pin what it relies on."""
    assert version("simple-pid").startswith("2.0."), "re-check the wrapper against the new version"
    pid = PID(Kp=1.0, sample_time=None, time_fn=lambda: 0.0)
    assert hasattr(pid, "_integral")
    pid._integral = 7.0
    assert pid(0.0, dt=1.0) == pytest.approx(7.0)


# --- settings ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data, fragment",
    [
        ({"kp": 1, "action": "direct", "output_min": 10, "output_max": 10}, "output_min"),
        ({"kp": 0, "ki": 0, "action": "direct"}, "cannot both be 0"),
        ({"kp": -1, "action": "direct"}, "kp"),
        ({"kp": 1, "action": "sideways"}, "action"),
        ({"kp": float("nan"), "action": "direct"}, "kp"),
        ({"kp": 1, "action": "direct", "typo_gain": 3}, "typo_gain"),
    ],
)
def test_settings_validation_names_the_key(data: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate_data(PidSettings, data, "pid.toml")
    assert fragment in str(err.value)


def test_direct_and_reverse_action_signs() -> None:
    direct = PidLoop(PidSettings(kp=2.0, action="direct", output_min=-100), 10.0)
    reverse = PidLoop(PidSettings(kp=2.0, action="reverse", output_min=-100), 10.0)
    direct.set_auto(0.0)
    reverse.set_auto(0.0)
    direct.update(10.0, 1.0)
    reverse.update(10.0, 1.0)
    # PV 1 above setpoint: a direct-acting (cooling) output rises, a reverse-acting one falls.
    assert direct.update(11.0, 1.0).output == pytest.approx(2.0)
    assert reverse.update(11.0, 1.0).output == pytest.approx(-2.0)


def test_update_before_initialisation_raises() -> None:
    loop = PidLoop(BR_SETTINGS, 30.0)
    with pytest.raises(PidNotInitialisedError):
        loop.update(30.0, 1.0)
    with pytest.raises(ValueError):
        loop.set_auto()  # no output known


# --- BR-14: integral windup while the valve is saturated --------------------------------


def test_br14_raw_simple_pid_clamping_numbers() -> None:
    """simple-pid 2.0.1's own clamping: I pinned at 100, first output at 28 °C 89.8, the valve
    closes 450 s later (the case's numbers)."""
    pid = PID(Kp=-5, Ki=-0.1, Kd=0, setpoint=30, output_limits=(0, 100), sample_time=None)
    for _ in range(600):
        out = pid(40, dt=1.0)
    assert out == 100
    assert pid.components[1] == 100
    out = pid(28, dt=1.0)
    assert out == pytest.approx(89.8)
    assert pid.components[0] == pytest.approx(-10) and pid.components[1] == pytest.approx(99.8)
    samples = 1
    while out is not None and out > 0:
        out = pid(28, dt=1.0)
        samples += 1
    assert samples == 450


def test_br14_integral_windup_conditional_integration() -> None:
    """Our anti-windup: the integral stops where the output first reached the limit, never
    exceeds the span, and the output leaves the limit on the first sample after the error
    changes sign (39.8 here instead of simple-pid's 89.8)."""
    loop = PidLoop(BR_SETTINGS, 30.0)
    loop.set_auto(0.0)
    for _ in range(600):
        out = loop.update(40.0, 1.0)
        assert out.output <= 100.0
        assert 0.0 <= out.i <= BR_SETTINGS.span
    assert out.output == 100.0
    assert out.i == pytest.approx(50.0)  # P 50 + I 50 = exactly the limit: nothing stored beyond
    first = loop.update(28.0, 1.0)
    assert first.output < 100.0, "output still pinned after the error changed sign"
    assert first.p == pytest.approx(-10.0)
    assert first.i == pytest.approx(49.8)
    assert first.output == pytest.approx(39.8)
    samples = 1
    while first.output > 0.0:
        first = loop.update(28.0, 1.0)
        samples += 1
    assert samples <= 200  # vs 450 with simple-pid's clamping, ~2,450 unclamped


def test_br14_low_limit_is_symmetric() -> None:
    loop = PidLoop(BR_SETTINGS, 30.0)
    loop.set_auto(100.0)
    for _ in range(600):
        out = loop.update(20.0, 1.0)  # far below setpoint: valve driven shut
    assert out.output == 0.0
    assert out.i == pytest.approx(50.0)  # P −50 + I 50 = 0: no negative demand stored
    assert loop.update(31.0, 1.0).output > 0.0  # leaves the limit at once


# --- BR-16: wall-clock step -------------------------------------------------------------


class MonotonicDriver:
    """How a daemon drives the loop: dt from the injected clock's *monotonic* time."""

    def __init__(self, loop: PidLoop, clock: FakeClock):
        self.loop, self.clock = loop, clock
        self.last = clock.monotonic()

    def tick(self, pv: float) -> PidOutput:
        now = self.clock.monotonic()
        dt, self.last = now - self.last, now
        return self.loop.update(pv, dt)


def _br16_loop_at_60s() -> tuple[MonotonicDriver, FakeClock]:
    clock = FakeClock()
    loop = PidLoop(BR_SETTINGS, 30.0)
    loop.set_auto(25.0)  # the output at 35 °C with I = 0 (P = 25)
    drv = MonotonicDriver(loop, clock)
    for _ in range(60):
        clock.advance(1.0)
        out = drv.tick(35.0)
    assert out.output == pytest.approx(55.0)
    assert out.i == pytest.approx(30.0)
    return drv, clock


def test_br16_wall_clock_step_variant_a_output_not_frozen() -> None:
    drv, clock = _br16_loop_at_60s()
    clock.step_wall(-3600.0)
    clock.advance(1.0)
    out = drv.tick(36.0)
    assert out.output == pytest.approx(60.6)  # same as without the step; simple-pid: 55.0 frozen
    clock.advance(1.0)
    assert drv.tick(36.0).output == pytest.approx(61.2)  # and it keeps moving
    clock.step_wall(+3600.0)
    clock.advance(1.0)
    assert drv.tick(36.0).output == pytest.approx(61.8)


def test_br16_wall_clock_step_variant_b_no_integral_collapse() -> None:
    drv, clock = _br16_loop_at_60s()
    clock.step_wall(-3600.0)
    clock.advance(1.0)
    out = drv.tick(35.0)
    assert out.output == pytest.approx(55.5)  # simple-pid on the wall clock: 25.0
    assert out.i == pytest.approx(30.5)


def test_br16_variant_c_negative_dt_is_a_loud_harmless_caller_bug() -> None:
    """A negative dt passed explicitly raises before touching state; the loop then continues
    exactly as if the bad call never happened."""
    drv, clock = _br16_loop_at_60s()
    before = (drv.loop.integral, drv.loop.output)
    for bad in (-3599.0, 0.0, math.nan, math.inf):
        with pytest.raises(ValueError):
            drv.loop.update(35.0, bad)
    assert (drv.loop.integral, drv.loop.output) == before
    clock.advance(1.0)
    assert drv.tick(35.0).output == pytest.approx(55.5)


def test_br16_raw_simple_pid_on_the_wall_clock_freezes_or_collapses() -> None:
    """Documents the failure with simple-pid 2.0.1 driven by a wall clock (the case's A/B)."""
    clock = FakeClock()

    def wall() -> float:
        return clock.wall_ns() / 1e9

    a = PID(Kp=-5, Ki=-0.1, setpoint=30, output_limits=(0, 100), sample_time=1, time_fn=wall)
    for _ in range(60):
        clock.advance(1.0)
        out = a(35)
    assert out == pytest.approx(55.0)
    clock.step_wall(-3600.0)
    for _ in range(3):
        clock.advance(1.0)
        assert a(36) == pytest.approx(55.0)  # frozen (should rise)

    clock = FakeClock()
    b = PID(Kp=-5, Ki=-0.1, setpoint=30, output_limits=(0, 100), sample_time=None, time_fn=wall)
    for _ in range(60):
        clock.advance(1.0)
        b(35)
    clock.step_wall(-3600.0)
    clock.advance(1.0)
    assert b(35) == pytest.approx(25.0)  # integral clamped from 30 to 0


# --- BR-25: derivative kick; bumpless manual -> auto; bumpless restart -------------------


def _br25_loop_at_11_2() -> PidLoop:
    loop = PidLoop(BR25_SETTINGS, 30.0)
    loop.set_auto(10.0)  # P = 10 at 32 °C: I starts at 0
    for _ in range(6):
        out = loop.update(32.0, 1.0)
    assert out.output == pytest.approx(11.2)
    return loop


def test_br25a_setpoint_step_has_no_derivative_kick() -> None:
    loop = _br25_loop_at_11_2()
    loop.set_setpoint(28.0)
    out = loop.update(32.0, 1.0)
    assert out.output == pytest.approx(21.6)
    assert (out.p, out.i, out.d) == (pytest.approx(20.0), pytest.approx(1.6), 0.0)


def test_br25a_raw_derivative_on_error_gives_the_kick() -> None:
    """The failure to detect: derivative on error turns the same step into D = +100."""
    pid = PID(Kp=-5, Ki=-0.1, Kd=-50, setpoint=30, output_limits=(0, 100), sample_time=None,
              differential_on_measurement=False)
    for _ in range(6):
        pid(32, dt=1.0)
    pid.setpoint = 28
    assert pid(32, dt=1.0) == 100
    assert pid.components[2] == pytest.approx(100.0)


def test_br25b_manual_to_auto_is_bumpless() -> None:
    loop = PidLoop(BR25_SETTINGS, 30.0)
    loop.set_manual(55.0)
    for _ in range(20):
        out = loop.update(30.0, 1.0)
        assert out.output == 55.0 and out.mode == "manual"
    loop.set_auto()
    first = loop.update(30.0, 1.0)
    assert first.output == pytest.approx(55.0)
    for _ in range(10):
        assert loop.update(30.0, 1.0).output == pytest.approx(55.0, abs=1.0)


def test_br25b_manual_to_auto_off_setpoint_is_bumpless() -> None:
    """Bumpless also when the PV is off setpoint (the integral absorbs P and D)."""
    loop = PidLoop(BR25_SETTINGS, 30.0)
    loop.set_manual(55.0)
    loop.update(31.0, 1.0)
    loop.update(32.0, 1.0)  # D ≠ 0 on this sample
    loop.set_auto()
    first = loop.update(32.0, 1.0)
    assert first.output == pytest.approx(55.0 + 0.2)  # 55 + one step of integral action
    assert first.p == pytest.approx(10.0)


def test_br25c_restart_from_persisted_output() -> None:
    loop = PidLoop(BR25_SETTINGS, 30.0)
    loop.set_auto(55.0)  # the read-back valve position
    assert loop.update(30.0, 1.0).output == pytest.approx(55.0)


def test_br25c_set_auto_on_a_loop_already_in_auto_still_applies() -> None:
    """The simple-pid pitfall (issue #26) cannot happen through our API."""
    loop = PidLoop(BR25_SETTINGS, 30.0)
    loop.set_auto(0.0)
    loop.update(30.0, 1.0)
    assert loop.mode == "auto"
    loop.set_auto(55.0)  # already in auto
    assert loop.update(30.0, 1.0).output == pytest.approx(55.0)


def test_br25c_raw_simple_pid_pitfalls() -> None:
    kwargs = dict(Kp=-5, Ki=-0.1, Kd=-50, setpoint=30, output_limits=(0, 100), sample_time=None)
    in_auto = PID(**kwargs)  # type: ignore[arg-type]
    in_auto.set_auto_mode(True, last_output=55)
    assert in_auto(30, dt=1.0) == 0.0  # the bug: the start output is ignored
    manual_first = PID(auto_mode=False, **kwargs)  # type: ignore[arg-type]
    manual_first.set_auto_mode(True, last_output=55)
    assert manual_first(30, dt=1.0) == pytest.approx(55.0)
    started = PID(starting_output=55, **kwargs)  # type: ignore[arg-type]
    assert started(30, dt=1.0) == pytest.approx(55.0)
    # ...but starting_output is I, not u: off setpoint simple-pid bumps by P (65.2), ours not.
    off = PID(starting_output=55, **kwargs)  # type: ignore[arg-type]
    assert off(32, dt=1.0) == pytest.approx(65.2)
    ours = PidLoop(BR25_SETTINGS, 30.0)
    ours.set_auto(55.0)
    assert ours.update(32.0, 1.0).output == pytest.approx(55.2)


# --- tracking, feedforward, dead zone, retune --------------------------------------------


def test_track_prevents_windup_against_a_downstream_rate_limit() -> None:
    loop = PidLoop(PidSettings(kp=2.0, ki=0.5, action="direct"), 45.0)
    loop.set_auto(20.0)
    applied = 20.0
    for _ in range(60):  # 5 K above setpoint, downstream limiter allows 1 %/s
        out = loop.update(50.0, 1.0)
        applied = min(out.output, applied + 1.0)
        loop.track(applied)
        assert loop.integral <= 100.0
    assert applied == pytest.approx(80.0)
    # Error reverses: the command comes down from the applied 80, not from a wound-up 100.
    out = loop.update(44.0, 1.0)
    assert out.output < applied


def test_feedforward_is_additive_and_clamped() -> None:
    loop = PidLoop(PidSettings(kp=2.0, ki=0.0, action="direct"), 45.0)
    loop.set_auto(50.0)
    base = loop.update(45.0, 1.0)  # P = 0: I absorbs the start output
    assert base.output == pytest.approx(50.0)
    with_ff = loop.update(45.0, 1.0, feedforward=20.0)
    assert with_ff.output == pytest.approx(70.0)
    assert with_ff.ff == 20.0
    big = loop.update(45.0, 1.0, feedforward=500.0)
    assert big.output == 100.0 and big.saturated
    assert -100.0 <= big.i <= 100.0


def test_error_deadband_stops_integration_and_keeps_p_continuous() -> None:
    loop = PidLoop(PidSettings(kp=10.0, ki=1.0, action="direct", error_deadband=0.1), 45.0)
    loop.set_auto(50.0)
    for _ in range(100):
        out = loop.update(45.08, 1.0)  # inside the dead zone: nothing moves
    assert out.output == pytest.approx(50.0)
    edge = loop.update(45.1001, 1.0)
    assert edge.p == pytest.approx(0.001, abs=1e-6)  # no step of kp·deadband at the edge


def test_set_settings_retunes_without_a_bump() -> None:
    loop = PidLoop(BR_SETTINGS, 30.0)
    loop.set_auto(40.0)
    for _ in range(5):
        before = loop.update(31.0, 1.0)
    loop.set_settings(PidSettings(kp=20.0, ki=0.5, action="direct"))
    after = loop.update(31.0, 1.0)
    assert after.output == pytest.approx(before.output + 0.5)  # only one step of new I action


def test_invalid_inputs_raise_before_state_changes() -> None:
    loop = PidLoop(BR_SETTINGS, 30.0)
    loop.set_auto(40.0)
    loop.update(31.0, 1.0)
    snapshot = (loop.integral, loop.output, loop.last)
    with pytest.raises(ValueError):
        loop.update(math.nan, 1.0)
    with pytest.raises(ValueError):
        loop.update(31.0, 1.0, feedforward=math.inf)
    with pytest.raises(ValueError):
        loop.set_setpoint(math.nan)
    with pytest.raises(ValueError):
        loop.track(math.nan)
    with pytest.raises(ValueError):
        loop.set_manual(120.0)
    assert (loop.integral, loop.output, loop.last) == snapshot
    assert loop.setpoint == 30.0


# --- properties (hypothesis) -------------------------------------------------------------

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("update"), st.floats(-50, 150), st.floats(0.01, 30),
                  st.floats(-150, 150)),
        st.tuples(st.just("track"), st.floats(-20, 120)),
        st.tuples(st.just("manual"), st.floats(0, 100)),
        st.tuples(st.just("auto"), st.floats(-20, 120)),
        st.tuples(st.just("setpoint"), st.floats(0, 100)),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(
    ops=_ops,
    kp=st.floats(0, 50),
    ki=st.floats(0.001, 5),
    kd=st.floats(0, 50),
    action=st.sampled_from(["direct", "reverse"]),
)
def test_output_within_limits_and_integral_within_span(
    ops: list[tuple[object, ...]], kp: float, ki: float, kd: float, action: str
) -> None:
    s = PidSettings(kp=kp, ki=ki, kd=kd, action=action, output_min=0.0, output_max=100.0)
    loop = PidLoop(s, 45.0)
    loop.set_auto(50.0)
    for op in ops:
        name = op[0]
        if name == "update":
            _, pv, dt, ff = op
            out = loop.update(pv, dt, feedforward=ff)  # type: ignore[arg-type]
            assert 0.0 <= out.output <= 100.0
            assert math.isclose(out.p + out.i + out.d + out.ff, out.output) or out.saturated \
                or out.mode == "manual"
        elif name == "track":
            loop.track(op[1])  # type: ignore[arg-type]
        elif name == "manual":
            loop.set_manual(op[1])  # type: ignore[arg-type]
        elif name == "auto":
            loop.set_auto(op[1])  # type: ignore[arg-type]
        else:
            loop.set_setpoint(op[1])  # type: ignore[arg-type]
        assert -s.span <= loop.integral <= s.span
        assert loop.output is None or 0.0 <= loop.output <= 100.0


@settings(max_examples=300, deadline=None)
@given(
    pvs=st.lists(st.floats(20, 70), min_size=2, max_size=80),
    kp=st.floats(0.1, 30),
    ki=st.floats(0.01, 3),
    start=st.floats(0, 100),
)
def test_output_leaves_the_limit_on_the_first_sample_after_the_error_changes_sign(
    pvs: list[float], kp: float, ki: float, start: float
) -> None:
    """BR-14 kind: whenever the output sat at a limit with the error pushing into it, the
    first sample with the error reversed is off that limit (no stored demand)."""
    loop = PidLoop(PidSettings(kp=kp, ki=ki, action="direct"), 45.0)
    loop.set_auto(start)
    prev: PidOutput | None = None
    prev_pv = 0.0
    for pv in pvs:
        out = loop.update(pv, 1.0)
        if prev is not None:
            if prev.output == 100.0 and prev_pv > 45.0 and pv < 45.0:
                assert out.output < 100.0
            if prev.output == 0.0 and prev_pv < 45.0 and pv > 45.0:
                assert out.output > 0.0
        prev, prev_pv = out, pv
