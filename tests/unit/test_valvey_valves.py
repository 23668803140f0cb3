"""Valve diagnosis (valvey/core/valves.py, issue 21): a slow valve is told apart from a stuck
one; the stroke time is learned from command vs feedback; failover never leaves the loop
worse off. Pure: the valves are simulated here as rate-limited positions fed back as samples.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from rackplane.core.samples import good
from valvey.core.valves import ValveManager, ValveSettings, ValveUnit

DT = 0.1


class Bench:
    """Two parallel valves: each moves towards its last written command at its own stroke
    time (None: stuck where it is); the manager sees their commands and positions."""

    def __init__(self, stroke_s: tuple[float | None, float | None] = (60.0, 60.0),
                 **settings: Any) -> None:
        self.m = ValveManager(ValveSettings(**settings),
                              ValveUnit(name="a", command="valve_command_pct",
                                        position="valve_position_pct"))
        self.stroke_s = list(stroke_s)
        self.pos = [30.0, 0.0]
        self.cmd = [30.0, 0.0]
        self.t = 0.0
        self.transitions: list[str] = []
        self.conditions: dict[str, bool] = {}
        self.fb_offset = 0.0  # valve A's feedback reads its position + this

    def samples(self) -> dict[str, Any]:
        pts = ("valve_command_pct", "valve_position_pct", "valve_b_command_pct",
               "valve_b_position_pct")
        vals = (self.cmd[0], self.pos[0] + self.fb_offset, self.cmd[1], self.pos[1])
        return {p: good(p, v, "%", 0, self.t) for p, v in zip(pts, vals, strict=True)}

    def run(self, seconds: float, demand: float) -> None:
        for _ in range(round(seconds / DT)):
            self.cmd[self.m.active] = demand
            self.m.note_written(self.m.active, demand)
            st = self.m.step(self.t, self.samples(), demand)
            for point, v in st.writes:
                self.cmd[0 if point == "valve_command_pct" else 1] = v
            self.transitions += st.transitions
            self.conditions = dict(st.conditions)
            for i in range(2):
                s = self.stroke_s[i]
                if s is not None:
                    step = 100.0 * DT / s
                    d = self.cmd[i] - self.pos[i]
                    self.pos[i] += max(-step, min(step, d))
            self.t += DT


@pytest.mark.parametrize("stroke_s", [90.0, 120.0, 300.0])
def test_slow_valve_is_never_declared_stuck_and_its_stroke_is_learned(stroke_s: float) -> None:
    b = Bench((stroke_s, 60.0), stroke_time_s=60.0)  # the data sheet says 60 s
    for demand in (90.0, 20.0, 80.0):  # full-range moves far slower than the rated 60 s
        b.run(stroke_s, demand)
    assert b.m.failed == {}
    assert b.m.active == 0
    assert not any("failed" in t or "failover" in t for t in b.transitions)
    assert b.m.stroke_time_s(0) == pytest.approx(stroke_s, rel=0.05)
    assert b.conditions["valve_actuator_slow:a"]
    assert not b.conditions["valve_a_fault"]
    assert b.m.state(b.t, b.samples())["units"][0]["stroke_time_s"] == pytest.approx(
        stroke_s, rel=0.05)


def test_without_a_rating_the_stroke_is_learned_and_no_valve_is_called_slow() -> None:
    """No data-sheet stroke (the default: the simulated plant's 60 s was one): the cold
    estimate is the short stroke_prior_s, the valve's own stroke is learned, a slow valve
    is never stuck, and "slow" has no reference to be judged by."""
    assert ValveSettings().stroke_time_s is None
    for stroke_s in (15.0, 60.0, 120.0):
        b = Bench((stroke_s, 60.0))
        assert b.m.stroke_time_s(0) == ValveSettings().stroke_prior_s
        for demand in (90.0, 20.0, 80.0):
            b.run(stroke_s, demand)
        assert b.m.failed == {}, stroke_s
        assert b.m.stroke_time_s(0) == pytest.approx(stroke_s, rel=0.05)
        assert not b.conditions["valve_actuator_slow:a"]


def test_a_valve_at_its_rated_speed_or_faster_raises_no_slow_alarm() -> None:
    for stroke_s in (30.0, 60.0):
        b = Bench((stroke_s, 60.0), stroke_time_s=60.0)
        b.run(90.0, 95.0)
        b.run(90.0, 5.0)
        assert not b.conditions["valve_actuator_slow:a"], stroke_s
        assert b.m.failed == {}


def test_stuck_valve_fails_over_and_the_spare_is_checked_by_its_response() -> None:
    b = Bench((None, 120.0))  # A stuck, B healthy but slow
    b.run(5.0, 30.0)
    b.run(60.0, 80.0)
    assert b.m.failed == {"a": "stuck"}
    assert b.m.active == 1
    t_fail = next(t for t in b.transitions if t.startswith("valves:failed:a"))
    assert "no motion" in t_fail
    # the slow spare takes 60 s to get there: it is moving, so it is not declared failed
    b.run(120.0, 80.0)
    assert "b" not in b.m.failed
    assert b.pos[1] == pytest.approx(80.0, abs=0.5)


def test_stuck_detected_soon_after_the_demand_moves() -> None:
    b = Bench((None, 60.0))
    b.run(30.0, 30.0)  # at rest at its demand: nothing expected of it
    assert b.m.failed == {}
    t0 = b.t
    b.run(30.0, 80.0)
    assert b.m.detected_t is not None
    # 10 % mismatch at 60 s stroke (6 s) or 5 s without motion, + 1 s confirmation
    assert b.m.detected_t - t0 <= 8.0


def test_no_healthy_valve_holds_the_more_open_one_and_reports_no_spare() -> None:
    b = Bench((None, None))
    b.pos = [40.0, 0.0]
    b.cmd = [40.0, 0.0]
    b.run(2.0, 40.0)
    b.run(30.0, 90.0)  # A stuck → failover to B, B stuck at 0 → B failed too
    assert b.m.failed == {"a": "stuck", "b": "stuck"}
    assert b.m.active == 0  # A (40 % open) delivers more cooling than B (closed)
    assert b.conditions["valve_no_spare"]
    assert any(t.startswith("valves:no_spare:b") for t in b.transitions)


def test_learned_stroke_persists_within_bounds_and_resets() -> None:
    b = Bench((120.0, 60.0))
    b.run(120.0, 95.0)
    learned = b.m.learned()
    assert learned["a"] == pytest.approx(120.0, rel=0.05)
    fresh = Bench()
    prior = ValveSettings().stroke_prior_s
    assert fresh.m.stroke_time_s(0) == prior
    assert fresh.m.restore_learned({"a": learned["a"], "b": 1e9, "c": 50.0}) == ["a"]
    assert fresh.m.stroke_time_s(0) == learned["a"]
    assert fresh.m.stroke_time_s(1) == prior  # 1e9 s is outside stroke_max_s
    assert fresh.m.restore_learned({"a": "slow", "b": True, "x": float("nan")}) == []
    fresh.m.reset_learned()
    assert fresh.m.stroke_time_s(0) == prior and fresh.m.learned() == {}
    assert Bench(stroke_time_s=90.0).m.stroke_time_s(0) == 90.0  # a rating: the cold one


def test_a_stuck_valve_teaches_no_stroke_time() -> None:
    b = Bench((None, 60.0), second_valve=False)
    b.run(60.0, 90.0)
    assert b.m.learned() == {}
    assert b.m.failed == {"a": "stuck"}


def test_stroke_bounds_are_checked() -> None:
    with pytest.raises(ValidationError, match="stroke_min_s"):
        ValveSettings(stroke_time_s=4.0)
    with pytest.raises(ValidationError, match="stroke_min_s"):
        ValveSettings(stroke_time_s=120.0, stroke_max_s=100.0)


def test_rest_characteristic_learned_from_command_vs_feedback() -> None:
    b = Bench()
    b.fb_offset = 2.0  # a positioner reading 2 % high
    b.run(10.0, 50.0)
    b.run(200.0, 40.0)  # travel, then at rest
    off, band = b.m.learned_rest()["a"]
    assert off == pytest.approx(2.0, abs=0.05)
    assert band == pytest.approx(0.0, abs=0.05)
    st = b.m.state(b.t, b.samples())["units"][0]
    assert st["rest_offset_pct"] == pytest.approx(2.0, abs=0.05)
    assert b.m.failed == {}
    # an offset beyond mismatch_pct / 2 is never learned (that valve is judged, not excused)
    far = Bench()
    far.fb_offset = 7.0
    far.run(60.0, 30.0)
    assert "a" not in far.m.learned_rest()
    fresh = Bench()
    assert fresh.m.restore_learned_rest({"a": [1.5, 0.4], "b": [9.0, 0.1], "x": [0, 0]}) == ["a"]
    assert fresh.m.restore_learned_rest({"a": "bad", "b": [True, 0.0]}) == []
    fresh.m.reset_learned()
    assert fresh.m.learned_rest() == {}
