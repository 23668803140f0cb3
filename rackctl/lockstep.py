"""Lock-step runs: valvey's pure core stepped together with the plant, no sockets, fake clock.

This is where daemons and simulators meet (DESIGN §2: the daemons never import ``sims``).
Each control tick: the plant's readings become `Sample`s (as the Modbus adapter would deliver
them, with the register resolution of the point), the core decides, its writes go to the
plant, the plant advances one tick. A scenario of hours runs in seconds and every figure is
deterministic for the scenario's seed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rackplane.clock import FakeClock
from rackplane.errors import WriteRejected
from rackplane.samples import Sample, good
from sims.scenario import FaultRecord, Scenario, ScenarioRun
from valvey.config import ValveyConfig
from valvey.core import ValveyCore

# Register resolution of the points the core reads (config/registers/cdu-generic.toml).
_RESOLUTION = {"valve_command_pct": 0.1, "valve_position_pct": 0.1}
_UNITS = {"supply_temp_c": "degC", "valve_command_pct": "%", "valve_position_pct": "%"}


@dataclass
class Trace:
    """Columns recorded once per ``record_every_s`` of plant time."""

    t_s: list[float] = field(default_factory=list)
    supply_temp_c: list[float] = field(default_factory=list)  # what valvey sees (sensor)
    true_supply_temp_c: list[float] = field(default_factory=list)  # plant truth
    setpoint_c: list[float] = field(default_factory=list)
    valve_command_pct: list[float | None] = field(default_factory=list)
    valve_position_pct: list[float] = field(default_factory=list)
    rack_power_w: list[float] = field(default_factory=list)
    facility_supply_temp_c: list[float] = field(default_factory=list)
    hottest_gpu_tj_c: list[float] = field(default_factory=list)
    flow_lpm: list[float] = field(default_factory=list)
    mode: list[str] = field(default_factory=list)

    def columns(self) -> dict[str, list[Any]]:
        return dict(self.__dict__)


@dataclass
class LockstepResult:
    """A finished lock-step run."""

    scenario: Scenario
    trace: Trace
    ground_truth: list[FaultRecord]
    rejected_writes: list[tuple[float, str, float, str]]
    alarm_events: list[tuple[float, str, str]]  # (plant t, alarm id, kind)
    control_periods_cmd: list[float | None]  # valve command at each loop period (activity)
    loop_period_s: float


def _sample(point: str, value: float, ts_ns: int, t_mono: float) -> Sample:
    res = _RESOLUTION.get(point)
    if res is not None:
        value = round(value / res) * res
    return good(point, value, _UNITS.get(point, ""), ts_ns, t_mono)


def run_valvey(
    scenario: Scenario,
    cfg: ValveyConfig | None = None,
    *,
    dt_s: float = 0.1,
    record_every_s: float = 1.0,
    progress: Callable[[float], None] | None = None,
) -> LockstepResult:
    """Run ``scenario`` with valvey's core in lock-step at ``dt_s`` (the 10 Hz tick).

    Args:
        cfg: valvey config (default: the embedded defaults).
        record_every_s: trace resolution in plant seconds.
        progress: called with the fraction done (0..1) about once per plant minute.
    """
    cfg = cfg or ValveyConfig()
    run = ScenarioRun(scenario)
    plant = run.plant
    clock = FakeClock()
    core = ValveyCore(cfg.supply_loop, cfg.points, cfg.control, start_mono=clock.monotonic())
    wanted = [
        p
        for p in (cfg.points.supply_temp, cfg.points.valve_command, cfg.points.valve_position)
        if p
    ]
    trace = Trace()
    rejected: list[tuple[float, str, float, str]] = []
    alarms: list[tuple[float, str, str]] = []
    period_cmds: list[float | None] = []
    next_record = 0.0
    next_progress = 0.0
    steps_per_period = max(1, round(cfg.supply_loop.period_s / dt_s))
    n = 0
    while not run.done:
        now = clock.monotonic()
        ts = clock.wall_ns()
        r = plant.readings()
        samples = {p: _sample(p, r[p], ts, now) for p in wanted}
        out = core.step(now, samples)
        for point, value in out.writes:
            try:
                plant.write(point, value)
            except WriteRejected as err:
                rejected.append((run.t_s, point, value, str(err)))
        for ev in out.alarm_events:
            alarms.append((run.t_s, ev.id, ev.kind))
        if n % steps_per_period == 0:
            period_cmds.append(out.loop.command_pct)
        if run.t_s >= next_record - 1e-9:
            tr = plant.truth()
            trace.t_s.append(run.t_s)
            trace.supply_temp_c.append(r[cfg.points.supply_temp])
            trace.true_supply_temp_c.append(tr.supply_temp_c)
            trace.setpoint_c.append(out.loop.setpoint_c)
            trace.valve_command_pct.append(out.loop.command_pct)
            trace.valve_position_pct.append(tr.valve_position_pct)
            trace.rack_power_w.append(tr.rack_power_w)
            trace.facility_supply_temp_c.append(tr.facility_supply_temp_c)
            trace.hottest_gpu_tj_c.append(tr.hottest_gpu_tj_c)
            trace.flow_lpm.append(tr.flow_lpm)
            trace.mode.append(out.loop.mode)
            next_record += record_every_s
        if progress is not None and run.t_s >= next_progress:
            progress(run.t_s / scenario.duration_s)
            next_progress += 60.0
        run.step(dt_s)
        clock.advance(dt_s)
        n += 1
    return LockstepResult(
        scenario,
        trace,
        list(run.ground_truth),
        rejected,
        alarms,
        period_cmds,
        cfg.supply_loop.period_s,
    )
