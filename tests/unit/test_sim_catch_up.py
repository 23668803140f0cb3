"""The real-time simulator keeps its plant time with real time (`sims.runtime`): a late tick runs
the steps it owes (bounded per tick), a backlog past `MAX_BACKLOG_S` is dropped and counted,
and the step hooks see each step's own time. Driven tick by tick with chosen monotonic times
(no event loop, no sockets: the faces are built but never started)."""

from __future__ import annotations

import asyncio

import pytest

from rackplane.config import validate_data
from sims.row import VirtualRack
from sims.runtime import (
    CATCH_UP_STEPS_PER_TICK,
    MAX_BACKLOG_S,
    SIM_DT_S,
    VirtualRackSimulator,
)
from sims.scenario import Scenario


def _sim() -> tuple[VirtualRackSimulator, list[float]]:
    sc = validate_data(Scenario, {
        "name": "catch-up", "duration_s": 600.0, "seed": 3, "plant": {"model": "rack"},
        "load": {"kind": "constant", "power_w": 120_000.0}, "fabric": {"enabled": "off"},
    }, "test")
    sim = VirtualRackSimulator(sc, modbus_port=0, shelf_modbus_port=0)
    seen: list[float] = []

    def hook(_vr: VirtualRack, now: float) -> None:
        seen.append(now)

    sim.step_hooks.append(hook)
    return sim, seen


def _tick(sim: VirtualRackSimulator, now: float) -> None:
    sim._tick(now, asyncio.Event())


def test_on_time_ticks_step_once_each() -> None:
    sim, seen = _sim()
    for k in range(20):
        _tick(sim, 100.0 + k * SIM_DT_S + 0.002)  # 2 ms late: still its own step only
    assert sim.steps_run == 20 and sim.steps_caught_up == 0 and sim.steps_dropped == 0
    assert sim.run_.t_s == pytest.approx(20 * SIM_DT_S)
    assert seen == pytest.approx([100.0 + k * SIM_DT_S for k in range(20)], abs=0.003)


def test_a_late_tick_runs_the_steps_it_owes_at_their_own_times() -> None:
    sim, seen = _sim()
    _tick(sim, 50.0)
    _tick(sim, 50.0 + 0.45)  # the ticks at +0.1 .. +0.3 never ran: 4 steps due
    assert sim.steps_run == 5 and sim.steps_caught_up == 3
    assert sim.run_.t_s == pytest.approx(5 * SIM_DT_S)
    assert seen == pytest.approx([50.0, 50.1, 50.2, 50.3, 50.4])
    _tick(sim, 50.5)  # back on schedule: one step
    assert sim.steps_run == 6 and sim.steps_caught_up == 3


def test_a_long_stall_is_caught_up_over_several_ticks_without_a_burst_past_the_bound() -> None:
    sim, _ = _sim()
    _tick(sim, 0.0)
    stall_s = 3.0  # 30 steps owed at the next tick
    _tick(sim, stall_s)
    assert sim.steps_run == 1 + CATCH_UP_STEPS_PER_TICK  # bounded: the rest on the next ticks
    t = stall_s
    while sim.steps_run < round(t / SIM_DT_S) + 1:  # steps due by t
        t += SIM_DT_S
        before = sim.steps_run
        _tick(sim, t)
        assert sim.steps_run - before <= CATCH_UP_STEPS_PER_TICK
        assert t < stall_s + 1.0, "never caught up"
    # caught up: plant time == real time since the first tick (+ the first step)
    assert sim.run_.t_s == pytest.approx(t + SIM_DT_S, abs=1e-6)
    assert sim.steps_dropped == 0


def test_a_backlog_past_the_bound_is_dropped_and_counted_not_replayed() -> None:
    sim, _ = _sim()
    _tick(sim, 0.0)
    stopped_s = MAX_BACKLOG_S + 25.0  # e.g. SIGSTOP / a suspended VM
    _tick(sim, stopped_s)
    owed = round(stopped_s / SIM_DT_S)
    assert sim.steps_dropped == owed - round(MAX_BACKLOG_S / SIM_DT_S)
    t = stopped_s
    for _ in range(200):
        t += SIM_DT_S
        _tick(sim, t)
    # the plant runs behind real time by exactly the dropped steps, no more
    lag_s = (t + SIM_DT_S) - sim.run_.t_s
    assert lag_s == pytest.approx(sim.steps_dropped * SIM_DT_S, abs=1e-6)
    assert sim.steps_run + sim.steps_dropped == round(t / SIM_DT_S) + 1


def test_ticks_a_little_early_on_the_step_grid_still_step_once_each() -> None:
    """The ticker keeps its schedule by adding the period, which drifts from t0 + k dt by
    float rounding (a fraction of a ms after a day on a clock of weeks): a tick that early,
    or that late, runs its one step, never 0 then 2."""
    sim, _ = _sim()
    t0 = 5.0e6  # a monotonic clock of ~58 days
    counts = []
    for k in range(50):
        drift = -0.0004 if k % 2 else 0.0004  # either side of the grid
        before = sim.steps_run
        _tick(sim, t0 + k * SIM_DT_S + (drift if k else 0.0))
        counts.append(sim.steps_run - before)
    assert counts == [1] * 50
