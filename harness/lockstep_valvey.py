"""Lock-step runs: valvey's own tick stepped together with the plant, no sockets, fake clock.

This is where daemons and simulators meet (DESIGN §2: the daemons never import ``sims``).
The harness drives `valvey.tick.ValveyTick`, the class the daemon (valvey/app.py) runs every
10 Hz tick, and feeds it what the daemon's adapters would deliver:

* **Modbus** (every tick, the daemon's 10 Hz poll): the plant's readings encoded into the CDU
  face's registers as the simulator serves them, decoded by the daemon's decoder
  (`harness.cdu_face.CduFace`: `rackplane.core.registers.BlockDecoder` over the planned
  read blocks; sentinel faults, NaN, out-of-range and a half-open face as
  `rackplane.io.modbus` delivers them), handed to `ValveyTick.on_samples`;
* **MQTT** (once a second, the simulator's and racky's publish rate): the simulator's
  ``sim/telemetry/env`` and ``sim/telemetry/rack`` payloads (`sims.telemetry`) and racky's
  ``racky/state/rack_power`` (the shape `racky.core.controller.RackyCore.rack_power_payload`
  publishes, with the plant's rack power), through `ValveyTick.on_sensor_message` (the
  configured topic mapping, the payload parse, retained-message ageing; live messages
  carry no retain flag); a scenario's ``mqtt_stop`` stops a publisher (its samples then go
  stale in valvey);
* **racky's replies**: the tick's request effects (``power_down_trays``, ``power_down_rack``,
  ``cap_rack``, ``release_cap``, docs/CONTRACTS.md: topic and envelope) go to a *racky
  seam*, a callable ``(request, plant_time_s) -> RackyReply | None``, and its reply reaches
  the tick as racky's reply payload (`ValveyTick.on_racky_reply`) on the next tick. The
  default seam, `SimRacky`, does what racky does with them on the simulator's node agents
  (docs/SIMULATORS.md §5): trays switched off, per-tray power caps, cap TTL expiry. A later
  joint harness passes racky's real core here instead.

Then the tick's writes go to the plant and the plant advances one tick. The tick also
computes its telemetry lines and publishes at their intervals (the telemetry path counts as
healthy: `rackplane.io.selfmetrics.telemetry_alarm_conditions` of a writer without
backlog). Scenarios run with the whole virtual rack (``model = "rack"``) by default; alarms
start as after a warm start (the daemon has been running: the 20 min start-up inhibit is
over).

`figures` computes issue 4's figures from a run; `report` runs the standard set and prints
them (`report`; ``rackctl scenarios`` runs the full scenario report).
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal, Protocol

from harness.cdu_face import CduFace
from harness.figures import Figure, Progress, no_progress
from rackplane.clock import FakeClock
from rackplane.core.registers import RegisterMap, load_register_map
from rackplane.core.topics import Topics
from rackplane.errors import WriteRejected
from rackplane.io.selfmetrics import TELEMETRY_ALARMS, telemetry_alarm_conditions
from rackplane.settings import Identity
from sims.metrics import step_metrics, valve_activity
from sims.scenario import FaultRecord, Scenario, ScenarioRun, load_scenario
from sims.telemetry import env_payload, rack_payload
from valvey.config import ValveyConfig
from valvey.core.controller import ValveyCore
from valvey.core.requests import RackyReply, RackyRequest
from valvey.tick import Publish, ValveyTick

__all__ = [
    "LockstepResult",
    "RackySeam",
    "SimRacky",
    "Trace",
    "figures",
    "report",
    "run_valvey",
    "valvey_scenario_figures",
]


class RackySeam(Protocol):
    """Receives valvey's requests to racky; returns racky's reply (None: no reply)."""

    def __call__(self, request: RackyRequest, t_s: float) -> RackyReply | None: ...


class SimRacky:
    """racky's side of valvey's requests, applied to the simulator's node agents as
    docs/CONTRACTS.md and docs/SIMULATORS.md §5 describe (what racky does with them):

    * ``power_down_trays {trays}``: those trays' agents ``powered = false``;
    * ``power_down_rack``: every tray ``powered = false``;
    * ``cap_rack {power_w, ttl_s}``: each compute tray's ``power_cap_w`` =
      (power_w − switch trays) / trays, not below the agents' minimum; it expires after
      ``ttl_s`` unless re-sent;
    * ``release_cap``: the caps removed.

    Replies carry ``rack_power_w``, ``power_confirmed_low`` (IT power ≤ ``power_low_w``) and
    the active cap. Safety verbs are never refused (no blast-radius limit, no lease). Without
    a rack model (the §4 CDU model alone) nothing can act: every request is refused
    ``no_node_agents``.
    """

    def __init__(self, run: ScenarioRun, power_low_w: float = 15_000.0):
        self.run = run
        self.power_low_w = power_low_w
        self.cap_w: float | None = None
        self.cap_until_s: float | None = None
        self.log: list[tuple[float, str, dict[str, Any]]] = []

    def _state(self) -> dict[str, Any]:
        p = self.run.plant.racks[0].power_w
        return {"rack_power_w": round(p, 1), "power_confirmed_low": p <= self.power_low_w,
                "cap_w": self.cap_w}

    def expire(self, t_s: float) -> None:
        """Drop a cap whose TTL passed (racky's own expiry)."""
        if self.cap_until_s is not None and t_s >= self.cap_until_s:
            self._apply_cap(None)
            self.log.append((t_s, "cap_expired", {}))

    def _apply_cap(self, power_w: float | None) -> None:
        rack = self.run.rack
        assert rack is not None
        comp = rack.compute
        per_tray = None
        if power_w is not None:
            lo = comp.params.gpu_min_power_limit_w * (1.0 + comp.other_share) * comp.gpus_per_tray
            per_tray = max(lo, (power_w - comp.switch_power_w) / comp.n_trays)
        ag = rack.agents
        for k in range(comp.n_trays):
            s = ag.settings(k)
            if s.power_cap_w != per_tray:
                ag.configure(k, _replace(s, power_cap_w=per_tray))
        self.cap_w = power_w
        self.cap_until_s = None if power_w is None else self.cap_until_s

    def __call__(self, request: RackyRequest, t_s: float) -> RackyReply | None:
        self.log.append((t_s, request.verb, dict(request.args)))
        rack = self.run.rack
        if rack is None:
            return RackyReply(request.request_id, False,
                              {"code": "no_node_agents", "message": "CDU model only"}, None)
        a = request.args
        ag = rack.agents
        if request.verb == "power_down_trays":
            for k in a["trays"]:
                ag.set_powered(int(k), False)
        elif request.verb == "power_down_rack":
            for k in range(rack.compute.n_trays):
                ag.set_powered(k, False)
        elif request.verb == "cap_rack":
            self._apply_cap(float(a["power_w"]))
            self.cap_until_s = t_s + float(a.get("ttl_s", 60.0))
        elif request.verb == "release_cap":
            self._apply_cap(None)
        else:
            return RackyReply(request.request_id, False,
                              {"code": "unknown_verb", "message": request.verb}, None)
        return RackyReply(request.request_id, True, None, self._state())


def _replace(settings: Any, **kw: Any) -> Any:
    from dataclasses import replace

    return replace(settings, **kw)


@dataclass
class Trace:
    """Columns recorded once per ``record_every_s`` of plant time."""

    t_s: list[float] = field(default_factory=list)
    supply_temp_c: list[float] = field(default_factory=list)  # sensor A as read
    pv_c: list[float | None] = field(default_factory=list)  # valvey's voted, filtered PV
    true_supply_temp_c: list[float] = field(default_factory=list)  # plant truth
    setpoint_c: list[float] = field(default_factory=list)
    valve_command_pct: list[float | None] = field(default_factory=list)
    valve_position_pct: list[float] = field(default_factory=list)
    valve_b_position_pct: list[float] = field(default_factory=list)
    ff_pct: list[float] = field(default_factory=list)
    rack_power_w: list[float] = field(default_factory=list)
    facility_supply_temp_c: list[float] = field(default_factory=list)
    hottest_gpu_tj_c: list[float] = field(default_factory=list)
    throttled_trays: list[int] = field(default_factory=list)
    flow_lpm: list[float] = field(default_factory=list)
    pump_speed_cmd_pct: list[float | None] = field(default_factory=list)
    rack_isolation_open_pct: list[float] = field(default_factory=list)
    trays_powered: list[int] = field(default_factory=list)
    cap_w: list[float | None] = field(default_factory=list)
    constraint: list[str] = field(default_factory=list)
    mode: list[str] = field(default_factory=list)

    def columns(self) -> dict[str, list[Any]]:
        return dict(self.__dict__)


@dataclass
class LockstepResult:
    """A finished lock-step run.

    ``events`` are ``(plant t, kind, detail)``: the core's transitions, its events, every
    request to racky, writes to the pump/valve/isolation selection registers.
    ``control_periods_cmd`` is the loop's valve command at each loop period;
    ``written_periods_cmd`` the value last written to the active valve at each period (what
    the actuator saw: the valve-activity figures use it).
    """

    scenario: Scenario
    trace: Trace
    ground_truth: list[FaultRecord]
    rejected_writes: list[tuple[float, str, float, str]]
    alarm_events: list[tuple[float, str, str]]  # (plant t, alarm id, kind)
    control_periods_cmd: list[float | None]
    loop_period_s: float
    written_periods_cmd: list[float | None] = field(default_factory=list)
    events: list[tuple[float, str, Any]] = field(default_factory=list)
    racky: SimRacky | None = None
    model: str = "rack"
    feedforward: bool = True
    detections: dict[str, float] = field(default_factory=dict)
    plant_marks: dict[str, float] = field(default_factory=dict)
    """Plant truth, first plant time of: ``tray_wet.K`` (tray K's leak sensor trips),
    ``tray_off.K`` (tray K switched off), ``drip_pan_wet``, ``rope_wet``, ``isolated`` (the
    rack isolation valve below 5 % open). Recorded only in scenarios with leak faults."""

    def alarms_raised(self, t_from: float = 0.0) -> list[tuple[float, str]]:
        """``(t, alarm id)`` of every raise at or after ``t_from``."""
        return [(t, a) for t, a, k in self.alarm_events if k == "raised" and t >= t_from]

    def first(self, kind: str, t_from: float = 0.0, contains: str = "") -> float | None:
        """Plant time of the first event of ``kind`` (whose detail contains ``contains``)."""
        for t, k, d in self.events:
            if k == kind and t >= t_from and contains in str(d):
                return t
        return None


_MAPS: dict[tuple[str, int | None], RegisterMap] = {}


def _register_map(ref: str | Path) -> RegisterMap:
    """`rackplane.core.registers.load_register_map` of ``ref``, loaded and validated once per
    file version: a scenario report makes dozens of runs on the same map (~2 ms each)."""
    try:
        stamp: int | None = Path(ref).stat().st_mtime_ns
    except OSError:
        stamp = None  # a bundled map's bare name
    key = (str(ref), stamp)
    hit = _MAPS.get(key)
    if hit is None:
        hit = _MAPS[key] = load_register_map(ref)
    return hit


# The telemetry path of a lock-step run is healthy (no spool, no database to fail): the
# daemon's own function gives the conditions of its telemetry alarms from such a writer.
_TELEMETRY_OK = telemetry_alarm_conditions(SimpleNamespace(spool_ok=True, depth_lines=0,
                                                           backoff_s=0.0))



_LEAK_FAULTS = ("tray_leak", "cdu_leak", "leak_sensor_fault")


def _mark_leaks(run: ScenarioRun, t_s: float, marks: dict[str, float]) -> None:
    """Record first times of the plant's leak-sensor trips, trays off and isolation."""
    rack = run.rack
    assert rack is not None
    lk = rack.leaks.state()
    for k in lk.leaking_trays():
        marks.setdefault(f"tray_wet.{k}", t_s)
    if lk.drip_pan_leak:
        marks.setdefault("drip_pan_wet", t_s)
    if lk.rope_leak:
        marks.setdefault("rope_wet", t_s)
    n = rack.compute.n_trays
    grid = rack.agents.powered.reshape(n, -1)
    powered = [bool(grid[k].any()) for k in range(n)]
    for k, on in enumerate(powered):
        if not on:
            marks.setdefault(f"tray_off.{k}", t_s)
    if run.plant.truth().rack_isolation_open_pct < 5.0:
        marks.setdefault("isolated", t_s)


def _rack_power_payload(rack_power_w: float, ts_ns: int) -> dict[str, Any]:
    """racky's ``state/rack_power`` (`racky.core.controller.RackyCore.rack_power_payload`'s
    shape) for the plant's rack power with every shelf reporting."""
    return {"rack_power_w": rack_power_w, "it_power_w": round(rack_power_w, 1) + 0.0,
            "shelves_reporting": 8, "shelves_configured": 8, "ts_ns": ts_ns}


def _request_of(pub: Publish, now_mono: float) -> RackyRequest:
    """The request racky receives: the verb of the topic, the envelope's id and args."""
    assert pub.payload is not None
    env = pub.payload
    return RackyRequest(str(env["request_id"]), pub.name, dict(env["args"]), False, now_mono,
                        pub.name)


def run_valvey(
    scenario: Scenario,
    cfg: ValveyConfig | None = None,
    *,
    dt_s: float = 0.1,
    record_every_s: float = 1.0,
    progress: Callable[[float], None] | None = None,
    model: Literal["rack", "cdu"] | None = "rack",
    racky: Callable[[ScenarioRun], RackySeam] | None = None,
    seed: int | None = None,
    feedforward: bool | None = None,
    duration_s: float | None = None,
    warm: bool = True,
    on_tick: Callable[[ScenarioRun, ValveyCore, float, float], None] | None = None,
) -> LockstepResult:
    """Run ``scenario`` with valvey's core in lock-step at ``dt_s`` (the 10 Hz tick).

    Args:
        cfg: valvey config (default: the embedded defaults).
        record_every_s: trace resolution in plant seconds.
        progress: called with the fraction done (0..1) about once per plant minute.
        model: ``rack`` (the whole virtual rack, default), ``cdu`` (the §4 model alone) or
            None (the scenario's own choice).
        racky: builds the racky seam for the run (default `SimRacky`).
        seed: overrides the scenario's seed (noise, workload).
        feedforward: overrides ``cfg.feedforward.enabled`` (False: PID only).
        duration_s: stop earlier than the scenario's duration.
        warm: alarms as after a warm start (the start-up inhibit is over).
        on_tick: ``on_tick(run, core, plant_t_s, now_mono)`` every tick before the plant
            steps (tests: operator actions on the core at its clock).
    """
    cfg = cfg or ValveyConfig()
    if feedforward is not None:
        cfg = cfg.model_copy(update={"feedforward": cfg.feedforward.model_copy(
            update={"enabled": feedforward})})
    if seed is not None:
        scenario = scenario.model_copy(update={"seed": seed})
    run = ScenarioRun(scenario, model=model)
    plant = run.plant
    seam: RackySeam = racky(run) if racky is not None else SimRacky(
        run, cfg.safety.power_low_w)
    clock = FakeClock()
    start = clock.monotonic() - (3600.0 if warm else 0.0)
    # the daemon's tick (valvey.tick): the core, the latest samples, message handling, effects
    tick = ValveyTick(cfg, start, request_prefix="lockstep", extra_alarms=TELEMETRY_ALARMS)
    core = tick.core
    face = CduFace(_register_map(cfg.cdu.register_map), cfg.cdu)
    ident = cfg.identity
    root = cfg.mqtt.topic_root
    sim = Topics(root, ident, "sim")
    racky_topic = Topics(root, ident, cfg.racky.daemon).state("rack_power")
    sim_ident = Identity(site=ident.site, row=ident.row, rack=ident.rack)
    trace = Trace()
    rejected: list[tuple[float, str, float, str]] = []
    alarms: list[tuple[float, str, str]] = []
    events: list[tuple[float, str, Any]] = []
    period_cmds: list[float | None] = []
    written_cmds: list[float | None] = []
    last_written: float | None = None
    replies: list[tuple[str, dict[str, Any]]] = []
    next_record = 0.0
    next_progress = 0.0
    next_mqtt = 0.0
    steps_per_period = max(1, round(cfg.supply_loop.period_s / dt_s))
    end_s = scenario.duration_s if duration_s is None else min(duration_s, scenario.duration_s)
    watched = {cfg.pumps.duty_select, cfg.valves.second_command, cfg.safety.isolation_command}
    marks: dict[str, float] = {}
    watch_leaks = any(f.kind in _LEAK_FAULTS for f in scenario.faults)
    n = 0
    sim_racky = seam if isinstance(seam, SimRacky) else None
    end_at = end_s - 1e-9
    readings, tick_step, run_step, advance = plant.readings, tick.step, run.step, clock.advance
    on_samples, on_message, poll = tick.on_samples, tick.on_sensor_message, face.poll
    while (t_s := run.t_s) < end_at:
        now = clock.monotonic()
        ts = clock.wall_ns()
        # --- Modbus: the face's registers through the daemon's decoder ---
        pr = run.protocol
        r = readings()
        mqtt_due = t_s >= next_mqtt - 1e-9
        samples = poll(r, pr.sentinel_points, pr.modbus["cdu"].blackhole, ts, now, mqtt_due)
        if samples is not None:
            on_samples(samples)
        # --- MQTT: the simulator's and racky's publications, once a second (live messages:
        # the broker delivers them to a subscriber with the retain flag clear) ---
        if mqtt_due:
            next_mqtt += 1.0
            if run.rack is not None:
                if pr.publishing("env"):
                    on_message(sim.telemetry("env"), env_payload(run.rack, sim_ident, ts),
                               retain=False, received_mono=now, wall_ns=ts)
                if pr.publishing("rack"):
                    on_message(sim.telemetry("rack"), rack_payload(run.rack, sim_ident, ts),
                               retain=False, received_mono=now, wall_ns=ts)
            on_message(racky_topic, _rack_power_payload(plant.racks[0].power_w, ts),
                       retain=False, received_mono=now, wall_ns=ts)
        for topic, reply in replies:
            tick.on_racky_reply(topic, reply, now)
        replies = []
        if sim_racky is not None:
            sim_racky.expire(t_s)
        # --- the daemon's tick; its effects go to the plant and the racky seam ---
        fx = tick_step(now, ts, _TELEMETRY_OK)
        out = fx.out
        assert out is not None
        active_cmd = core.valves.active_unit.command
        for point, value in fx.writes:
            if point in watched:
                events.append((t_s, "write", (point, value)))
            if point == active_cmd:
                last_written = value
            try:
                plant.write(point, value)
            except WriteRejected as err:
                rejected.append((t_s, point, value, str(err)))
        for pub in fx.publishes:
            if pub.kind == "request":
                req = _request_of(pub, now)
                events.append((t_s, "request", (req.verb, dict(req.args))))
                rep = seam(req, t_s)
                if rep is not None:
                    replies.append((f"{pub.topic}/result", {
                        "request_id": rep.request_id, "ok": rep.ok, "error": rep.error,
                        "state": rep.state}))
        for tr in out.transitions:
            events.append((t_s, "transition", tr))
        for event in out.events:
            events.append((t_s, "event", event))
        for ae in out.alarm_events:
            alarms.append((t_s, ae.id, ae.kind))
        if n % steps_per_period == 0:
            period_cmds.append(out.loop.command_pct)
            written_cmds.append(last_written)
        if t_s >= next_record - 1e-9:
            tr_ = plant.truth()
            trace.t_s.append(t_s)
            trace.supply_temp_c.append(r[cfg.points.supply_temp])
            trace.pv_c.append(out.loop.pv_c)
            trace.true_supply_temp_c.append(tr_.supply_temp_c)
            trace.setpoint_c.append(out.loop.setpoint_c)
            trace.valve_command_pct.append(out.loop.command_pct)
            trace.valve_position_pct.append(tr_.valve_position_pct)
            trace.valve_b_position_pct.append(tr_.valve_b_position_pct)
            trace.ff_pct.append(out.ff_pct)
            trace.rack_power_w.append(tr_.rack_power_w)
            trace.facility_supply_temp_c.append(tr_.facility_supply_temp_c)
            trace.hottest_gpu_tj_c.append(tr_.hottest_gpu_tj_c)
            trace.throttled_trays.append(tr_.throttled_trays)
            trace.flow_lpm.append(tr_.flow_lpm)
            trace.pump_speed_cmd_pct.append(
                None if out.pump is None else out.pump.speed_command_pct)
            trace.rack_isolation_open_pct.append(tr_.rack_isolation_open_pct)
            trace.trays_powered.append(
                int(run.rack.agents.powered.reshape(run.rack.compute.n_trays, -1).all(
                    axis=1).sum()) if run.rack is not None else 0)
            trace.cap_w.append(seam.cap_w if isinstance(seam, SimRacky) else None)
            trace.constraint.append(out.valve_constraint)
            trace.mode.append(out.loop.mode)
            next_record += record_every_s
        if progress is not None and t_s >= next_progress:
            progress(t_s / end_s)
            next_progress += 60.0
        if watch_leaks and run.rack is not None:
            _mark_leaks(run, t_s, marks)
        if on_tick is not None:
            on_tick(run, core, t_s, now)
        run_step(dt_s)
        advance(dt_s)
        n += 1
    det = {f"safety.{k}": v - start - 3600.0 * warm for k, v in core.safety.detected.items()}
    return LockstepResult(
        scenario, trace, list(run.ground_truth), rejected, alarms, period_cmds,
        cfg.supply_loop.period_s, written_cmds, events,
        seam if isinstance(seam, SimRacky) else None, run.model or "rack",
        core.ff.settings.enabled, det, marks,
    )


# --- figures ------------------------------------------------------------------------------------


def _max_abs_err(res: LockstepResult, t0: float, t1: float | None = None,
                 truth: bool = True) -> tuple[float, float]:
    tr = res.trace
    pv = tr.true_supply_temp_c if truth else tr.supply_temp_c
    m = step_metrics(tr.t_s, pv, tr.setpoint_c, t0, t1)
    return m.max_abs_error_k, m.rms_error_k


def figures(res: LockstepResult) -> dict[str, Any]:
    """Issue 4's figures of one run (by scenario; errors on the plant's true supply
    temperature; valve activity on the commands written to the valve, deadband 0.1 %).

    Definitions (issue 4): valve active = share of control periods in which the valve
    command moves by more than its deadband; strokes per hour = total travel / 100 % per
    hour; back inside ±0.5 K = settling time of `sims.metrics.step_metrics`.
    """
    sc = res.scenario
    tr = res.trace
    out: dict[str, Any] = {"scenario": sc.name, "seed": sc.seed, "model": res.model,
                           "feedforward": res.feedforward}
    va = valve_activity(res.written_periods_cmd, res.loop_period_s)
    out["valve_active_pct"] = round(100.0 * va.active_fraction, 1)
    out["valve_strokes_per_h"] = round(va.strokes_per_h, 2)
    out["max_gpu_tj_c"] = round(max(tr.hottest_gpu_tj_c), 2)
    out["throttle_events"] = max(tr.throttled_trays)
    ld = sc.load
    name = sc.name
    if ld.kind == "step" and ld.step_at_s is not None and ld.back_at_s is not None:
        up = step_metrics(tr.t_s, tr.true_supply_temp_c, tr.setpoint_c, ld.step_at_s,
                          ld.back_at_s)
        down = step_metrics(tr.t_s, tr.true_supply_temp_c, tr.setpoint_c, ld.back_at_s)
        out["max_abs_error_k"] = round(max(up.max_abs_error_k, down.max_abs_error_k), 3)
        out["max_abs_error_up_down_k"] = [round(up.max_abs_error_k, 3),
                                          round(down.max_abs_error_k, 3)]
        out["back_within_0_5k_s"] = [up.settling_s, down.settling_s]
    elif ld.kind in ("agentic", "training"):
        m = step_metrics(tr.t_s, tr.true_supply_temp_c, tr.setpoint_c, 60.0)
        out["max_abs_error_k"] = round(m.max_abs_error_k, 3)
        out["rms_error_k"] = round(m.rms_error_k, 3)
    gt = {f.kind: f for f in res.ground_truth}
    if name == "pump-trip":
        t0 = gt["pump_trip"].start_s
        trip = res.first("event", t0, "pump_trip")
        cmd = res.first("write", t0, "duty_pump_select")
        flows = [f for t, f in zip(tr.t_s, tr.flow_lpm, strict=True) if t < t0]
        q0 = flows[-1] if flows else tr.flow_lpm[0]
        after = [(t, f, tj) for t, f, tj in zip(tr.t_s, tr.flow_lpm, tr.hottest_gpu_tj_c,
                                                strict=True) if t >= t0]
        tj0 = max(tj for t, tj in zip(tr.t_s, tr.hottest_gpu_tj_c, strict=True) if t < t0)
        out["fault_detected_s"] = None if trip is None else round(trip - t0, 2)
        out["standby_commanded_s"] = None if cmd is None else round(cmd - t0, 2)
        out["min_flow_pct"] = round(100.0 * min(f for _, f, _ in after) / q0, 1)
        out["gpu_tj_rise_k"] = round(max(tj for *_, tj in after) - tj0, 2)
        out["pump_alarm"] = sorted({a for _, a in res.alarms_raised(t0) if "pump" in a})
        cap = res.first("request", t0, "cap_rack")
        out["no_standby_cap_s"] = None if cap is None else round(cap - t0, 2)
    if name == "valve-stuck":
        t_stuck = gt["valve_stuck"].start_s
        t_step = sc.load.step_at_s or 0.0
        det = res.first("transition", t_stuck, "valves:failed")
        fo = res.first("write", t_stuck, "valve_b_command_pct")
        cap = res.first("request", t_stuck, "cap_rack")
        out["mismatch_detected_after_step_s"] = None if det is None else round(det - t_step, 1)
        out["second_valve_after_step_s"] = None if fo is None else round(fo - t_step, 1)
        out["cap_after_step_s"] = None if cap is None else round(cap - t_step, 1)
        over = [t for t, v, sp in zip(tr.t_s, tr.true_supply_temp_c, tr.setpoint_c,
                                      strict=True) if v > sp + 2.0]
        out["time_above_sp_plus_2k_s"] = _longest_run(over, 1.0)
        out["max_supply_c"] = round(max(tr.true_supply_temp_c), 2)
        caps = [c for c in tr.cap_w if c is not None]
        out["cap_w"] = round(min(caps)) if caps else None
    if name == "facility-water-rise":
        over = [v - sp for v, sp in zip(tr.true_supply_temp_c, tr.setpoint_c, strict=True)]
        out["max_above_sp_k"] = round(max(over), 3)
        caps = [c for c in tr.cap_w if c is not None]
        out["min_cap_w"] = round(min(caps)) if caps else None
        released = res.first("request", 2400.0, "release_cap")
        out["cap_released_at_s"] = released
    return out


def _longest_run(ts: list[float], step: float) -> float:
    best = cur = 0.0
    prev = None
    for t in ts:
        cur = cur + step if prev is not None and t - prev <= step + 1e-6 else step
        best = max(best, cur)
        prev = t
    return round(best, 1)


def sensor_figures(res: LockstepResult, point: str = "supply_temp_c") -> dict[str, Any]:
    """S5: when each fault of ``point`` was detected, relative to its start (s): freeze,
    dropout (also in samples at 10 Hz), drift (energy balance or disagreement)."""
    out: dict[str, Any] = {}
    faults = [f for f in res.ground_truth if f.kind == "sensor" and f.target == point]
    spec = {(f.at_s, f.mode) for f in res.scenario.faults if f.kind == "sensor"}
    for f in faults:
        mode = next((m for a, m in spec if abs(a - f.start_s) < 1.0), None)
        if mode is None:
            continue
        want = {"stale": "frozen", "freeze": "frozen", "dropout": "bad", "nan": "bad",
                "drift": "drift", "spike": "spike"}.get(mode or "", mode)
        if want == "spike":
            continue
        res.first("transition", f.start_s, f"sensor:{point}:")
        t_kind = None
        for tt, k, d in res.events:
            if k == "transition" and tt >= f.start_s and str(d).startswith(
                    f"sensor:{point}:") and (str(d).endswith(f"->{want}")
                                             or (want == "drift" and str(d).endswith("disagree"))):
                t_kind = tt
                break
        out[f"{mode}_detected_s"] = None if t_kind is None else round(t_kind - f.start_s, 2)
        if want == "bad" and t_kind is not None:
            # samples received from the first NaN one (read 0.1 s after the fault starts, at
            # the 10 Hz poll) to the one that raised the detection, inclusive
            out["dropout_detected_samples"] = round((t_kind - f.start_s - 0.1) / 0.1) + 1
    stops = [f.start_s for f in res.ground_truth if f.kind == "mqtt_stop"]
    if stops:
        t_stale = next((t for t, a in res.alarms_raised(stops[0]) if a == "room_sensors_stale"),
                       None)
        out["republish_detected_s"] = None if t_stale is None else round(t_stale - stops[0], 1)
    tr = res.trace
    out["max_abs_true_error_k"] = round(max(abs(v - sp) for v, sp in zip(
        tr.true_supply_temp_c, tr.setpoint_c, strict=True)), 3)
    return out


def seeded(scenario: str, seeds: Iterable[int], **kw: Any) -> list[dict[str, Any]]:
    """`figures` of ``scenario`` for each seed."""
    sc = load_scenario(scenario)
    return [figures(run_valvey(sc, seed=s, **kw)) for s in seeds]


def median_p90(values: Sequence[float]) -> tuple[float, float]:
    """Median and 90th percentile (nearest rank)."""
    v = sorted(values)
    p90 = v[min(len(v) - 1, math.ceil(0.9 * len(v)) - 1)]
    return statistics.median(v), p90


def report(seeds: int = 10, out: Callable[[str], None] = print) -> dict[str, Any]:
    """Run issue 4's scenario set in lock-step and print the figures table (median and p90
    over ``seeds`` seeds where noise matters; S1 and S2 with PID-only beside PID + dynamic
    feedforward). Takes minutes: the benchmark of the figures the scenario tests assert on a
    smaller seed set."""
    rows: dict[str, Any] = {}
    seed_list = list(range(1, seeds + 1))
    for name in ("load-step", "agentic-bursts"):
        for ff in (False, True):
            figs = seeded(name, seed_list, feedforward=ff)
            key = f"{name} {'PID+FF' if ff else 'PID-only'}"
            agg: dict[str, Any] = {}
            for k in ("max_abs_error_k", "rms_error_k", "valve_active_pct",
                      "valve_strokes_per_h"):
                vals = [f[k] for f in figs if f.get(k) is not None]
                if vals:
                    agg[k] = tuple(round(x, 3) for x in median_p90(vals))
            if name == "load-step":
                settle = [max(s or 0.0 for s in f["back_within_0_5k_s"]) for f in figs]
                agg["back_within_0_5k_s"] = tuple(median_p90(settle))
            rows[key] = agg
            out(f"{key:32s} {agg}")
    for name in ("pump-trip", "valve-stuck", "facility-water-rise"):
        rows[name] = figures(run_valvey(load_scenario(name)))
        out(f"{name:32s} {rows[name]}")
    cfg = ValveyConfig()
    no_b = cfg.model_copy(update={"valves": cfg.valves.model_copy(
        update={"second_valve": False})})
    rows["valve-stuck (no second valve)"] = figures(run_valvey(load_scenario("valve-stuck"),
                                                               no_b))
    out(f"{'valve-stuck (no second valve)':32s} {rows['valve-stuck (no second valve)']}")
    s5 = run_valvey(load_scenario("sensor-dropout"))
    rows["sensor-dropout"] = sensor_figures(s5)
    out(f"{'sensor-dropout':32s} {rows['sensor-dropout']}")
    for name in ("leak", "leak-qd-failure", "leak-second-tray", "leak-cdu-rope",
                 "leak-sensor-fault"):
        res = run_valvey(load_scenario(name))
        rows[name] = leak_figures(res)
        out(f"{name:32s} {rows[name]}")
    h = run_valvey(load_scenario("healthy-24h"), model="cdu")
    rows["healthy-24h"] = {"false_alarms": h.alarms_raised(), **figures(h)}
    out(f"{'healthy-24h':32s} {rows['healthy-24h']}")
    return rows


def leak_figures(res: LockstepResult) -> dict[str, Any]:
    """S6: from the first leak fault's start: leak sensor trip (plant), tray power-down
    request and tray off, rack power-down, isolation (or none)."""
    starts = [f.start_s for f in res.ground_truth if f.kind in ("tray_leak", "cdu_leak",
                                                                  "leak_sensor_fault")]
    t0 = min(starts) if starts else 0.0
    out: dict[str, Any] = {}
    td = res.first("request", t0, "power_down_trays")
    out["power_down_trays_s"] = None if td is None else round(td - t0, 1)
    rd = res.first("request", t0, "power_down_rack")
    out["power_down_rack_s"] = None if rd is None else round(rd - t0, 1)
    iso = res.first("write", t0, "rack_isolation_command")
    out["isolation_s"] = None if iso is None else round(iso - t0, 1)
    out["min_trays_powered"] = min(res.trace.trays_powered) if res.trace.trays_powered else None
    out["tray_leak_request_s"] = out["power_down_trays_s"]
    m = res.plant_marks
    trips = sorted((t, k.split(".")[1]) for k, t in m.items() if k.startswith("tray_wet."))
    offs = [m[f"tray_off.{k}"] - t for t, k in trips if f"tray_off.{k}" in m]
    out["tray_off_after_trip_s"] = round(max(offs), 2) if offs and len(offs) == len(
        trips) else None
    iso_t = m.get("isolated")
    # the last sensor trip before the isolation (the one that completed the rack tier)
    last_trip = max((t for t in [t for t, _ in trips] + [m[k] for k in ("rope_wet",
                     "drip_pan_wet") if k in m] if iso_t is None or t <= iso_t), default=None)
    out["isolated_after_trip_s"] = (None if iso_t is None or last_trip is None
                                    else round(iso_t - last_trip, 2))
    rack_ev = [d for t, k, d in res.events if k == "event" and isinstance(d, dict)
               and d.get("kind") == "rack_leak"]
    out["why_rack"] = rack_ev[0].get("reason") if rack_ev else None
    out["alarms"] = sorted({a for _, a in res.alarms_raised()})
    return out


# --- the scenario report: issue 4's figure table ------------------------------------------------

FULL_SEEDS = 10
"""Seeds of the noisy figures (S1, S2) in the full report: issue 4 asks for median and p90
over at least 10."""
HEALTHY_SEGMENTS = 4
"""The healthy 24 h run is this many segments of 24 h / HEALTHY_SEGMENTS (own seeds)."""


@dataclass(frozen=True)
class _Job:
    """One lock-step run of the report (picklable: it runs in a worker process)."""

    key: str
    scenario: str
    kind: Literal["control", "sensor", "leak", "healthy"] = "control"
    seed: int | None = None
    feedforward: bool | None = None
    model: Literal["rack", "cdu"] = "rack"
    duration_s: float | None = None
    second_valve: bool = True
    one_pump: bool = False
    trace: bool = False


def _run_job(job: _Job) -> tuple[_Job, dict[str, Any], dict[str, list[Any]] | None]:
    """Run ``job`` and compute its figures (in a worker process)."""
    cfg = ValveyConfig()
    if not job.second_valve:
        cfg = cfg.model_copy(update={"valves": cfg.valves.model_copy(
            update={"second_valve": False})})
    if job.one_pump:
        cfg = cfg.model_copy(update={"pumps": cfg.pumps.model_copy(update={"names": ["a"]})})
    res = run_valvey(load_scenario(job.scenario), cfg, seed=job.seed,
                     feedforward=job.feedforward, model=job.model, duration_s=job.duration_s)
    figs: dict[str, Any]
    if job.kind == "sensor":
        figs = sensor_figures(res)
    elif job.kind == "leak":
        figs = leak_figures(res)
    elif job.kind == "healthy":
        figs = {"false_alarms": len(res.alarms_raised()),
                "alarm_ids": sorted({a for _, a in res.alarms_raised()}),
                "hours": round(res.trace.t_s[-1] / 3600.0, 2) if res.trace.t_s else 0.0}
    else:
        figs = figures(res)
    return job, figs, (res.trace.columns() if job.trace else None)


def _jobs(quick: bool) -> list[_Job]:
    seeds = [1] if quick else list(range(1, FULL_SEEDS + 1))
    jobs: list[_Job] = []
    for sc, tag in (("load-step", "S1"), ("agentic-bursts", "S2")):
        for ff in (False, True):
            for s in seeds:
                jobs.append(_Job(f"{tag}.{'ff' if ff else 'pid'}.{s}", sc, seed=s,
                                 feedforward=ff, trace=(s == seeds[0])))
    jobs += [
        _Job("S3", "pump-trip", trace=True),
        _Job("S3.no_standby", "pump-trip", one_pump=True, duration_s=150.0),
        _Job("S4", "valve-stuck", trace=True),
        _Job("S4.no_second_valve", "valve-stuck", second_valve=False, trace=True),
        _Job("S5", "sensor-dropout", "sensor", trace=True),
        _Job("S6a", "leak", "leak", duration_s=300.0 if quick else None),
        _Job("S6b", "leak-qd-failure", "leak", duration_s=120.0 if quick else None),
        _Job("S6c", "leak-second-tray", "leak", duration_s=240.0 if quick else None),
        _Job("S6d", "leak-cdu-rope", "leak", duration_s=120.0 if quick else None),
        _Job("S6e", "leak-sensor-fault", "leak", duration_s=300.0 if quick else None),
        _Job("S9", "facility-water-rise", trace=True),
    ]
    # healthy 24 h: HEALTHY_SEGMENTS warm-started segments of the scenario's agentic load with
    # their own seeds (24 h of plant time in all), so the pool can share them out
    seg_s = 1200.0 if quick else 86400.0 / HEALTHY_SEGMENTS
    jobs += [_Job(f"healthy.{k}", "healthy-24h", "healthy", seed=15 + k, duration_s=seg_s)
             for k in range(1 if quick else HEALTHY_SEGMENTS)]
    if quick:
        jobs = [j for j in jobs if j.key != "S9"] + [
            _Job("S9", "facility-water-rise", duration_s=1200.0, trace=True)]
    # longest first: the pool's makespan
    return sorted(jobs, key=lambda j: -_cost(j))


def _cost(job: _Job) -> float:
    """Rough CPU cost (plant seconds weighted by the model) for scheduling."""
    d = job.duration_s or load_scenario(job.scenario).duration_s
    return d * (0.5 if job.model == "cdu" else 1.0)


def _agg(name: str, values: Sequence[float | None], unit: str, comparison: str,
         target: float | None, aim: float | None = None, what: str = "") -> list[Figure]:
    """Median and p90 figures of ``values`` (None: the run could not produce it)."""
    cmp_: Any = comparison
    if any(v is None for v in values) or not values:
        return [Figure(f"{name}.median", None, unit, target, cmp_, aim,
                       f"{what}: {sum(v is None for v in values)} of {len(values)} runs gave "
                       "no value")]
    vals = [float(v) for v in values if v is not None]
    med, p90 = median_p90(vals)
    detail = f"{what}; {len(vals)} seeds" + (f", range {min(vals):.3g}…{max(vals):.3g}"
                                              if len(vals) > 1 else "")
    return [Figure(f"{name}.median", round(med, 4), unit, target, cmp_, aim, detail),
            Figure(f"{name}.p90", round(p90, 4), unit, target, cmp_, aim, detail)]


def _fig(name: str, value: float | None, unit: str, comparison: str = "info",
         target: float | None = None, aim: float | None = None, detail: str = "") -> Figure:
    cmp_: Any = comparison
    return Figure(name, None if value is None else float(value), unit, target, cmp_, aim,
                  detail)


def _control_figures(tag: str, variant: str, runs: list[dict[str, Any]]) -> list[Figure]:
    """S1/S2 figures of one variant (``ff`` PID + dynamic feedforward, ``pid`` PID-only)."""
    base = f"valvey.{tag}" if variant == "ff" else f"valvey.{tag}.pid_only"
    label = "PID + dynamic feedforward" if variant == "ff" else "PID only"
    ff = variant == "ff"
    out: list[Figure] = []
    if tag == "S1":
        # PID-only: REFERENCE §5 S1 "PI-only baseline must be ≤ 1.5 K" (§4.5: about 1.4 K)
        out += _agg(f"{base}.max_abs_error_k", [r.get("max_abs_error_k") for r in runs], "K",
                    "<=", 0.5 if ff else 1.5, 0.3 if ff else None,
                    f"{label}; true supply vs setpoint, both steps")
        settle = [max(s or 0.0 for s in r["back_within_0_5k_s"]) if r.get(
            "back_within_0_5k_s") and None not in r["back_within_0_5k_s"] else None
            for r in runs]
        out += _agg(f"{base}.back_within_0_5k_s", settle, "s", "<=" if ff else "info",
                    30.0 if ff else None, 0.0 if ff else None,
                    f"{label}; longest of up/down step")
    else:
        out += _agg(f"{base}.max_abs_error_k", [r.get("max_abs_error_k") for r in runs], "K",
                    "<=" if ff else "info", 0.5 if ff else None, 0.3 if ff else None,
                    f"{label}; 30 min burst train after 60 s")
        out += _agg(f"{base}.rms_error_k", [r.get("rms_error_k") for r in runs], "K",
                    "<=" if ff else "info", 0.15 if ff else None, 0.1 if ff else None,
                    f"{label}; 30 min burst train after 60 s")
    out += _agg(f"{base}.valve_active_pct", [r.get("valve_active_pct") for r in runs], "%",
                "<=" if ff else "info", 20.0 if ff else None, 15.0 if ff else None,
                f"{label}; share of 1 s periods the written command moved > 0.1 %")
    out += _agg(f"{base}.valve_strokes_per_h", [r.get("valve_strokes_per_h") for r in runs],
                "1/h", "<=" if ff else "info", 10.0 if ff else None, None,
                f"{label}; total travel / 100 % per hour")
    return out


def _figures_of(results: dict[str, dict[str, Any]]) -> list[Figure]:
    """Issue 4's table from the jobs' figures."""
    out: list[Figure] = []
    for tag in ("S1", "S2"):
        for variant in ("pid", "ff"):
            runs = [v for k, v in sorted(results.items())
                    if k.startswith(f"{tag}.{variant}.")]
            if runs:
                out += _control_figures(tag, variant, runs)
    if (s3 := results.get("S3")) is not None:
        one = "one seed (the fault is deterministic; sensor noise only)"
        out += [
            _fig("valvey.S3.fault_detected_s", s3.get("fault_detected_s"), "s", "<=", 0.5,
                 0.25, f"pump trip at 132 kW to valvey's pump_trip event; {one}"),
            _fig("valvey.S3.standby_commanded_s", s3.get("standby_commanded_s"), "s", "<=",
                 1.0, 0.25, "pump trip to the duty_pump_select write"),
            _fig("valvey.S3.min_flow_pct", s3.get("min_flow_pct"), "%", ">=", 45.0, None,
                 "lowest true flow after the trip / flow before"),
            _fig("valvey.S3.gpu_tj_rise_k", s3.get("gpu_tj_rise_k"), "K", "<=", 5.0, None,
                 "hottest GPU Tj after the trip minus before"),
            _fig("valvey.S3.pump_alarm_raised", float(bool(s3.get("pump_alarm"))), "bool",
                 "==", 1.0, None, f"alarms: {s3.get('pump_alarm')}"),
        ]
    if (s3n := results.get("S3.no_standby")) is not None:
        out += [
            _fig("valvey.S3.no_standby.cap_s", s3n.get("no_standby_cap_s"), "s", "<=", 2.0,
                 None, "one pump only: trip to cap_rack sent to racky (REFERENCE §5 S3)"),
            _fig("valvey.S3.no_standby.max_gpu_tj_c", s3n.get("max_gpu_tj_c"), "°C", "info",
                 None, None, "hottest GPU (no-flow power-down follows; no shutdown)"),
            _fig("valvey.S3.no_standby.throttle_events", s3n.get("throttle_events"), "trays",
                 "==", 0.0, None, "most trays throttled at once"),
        ]
    if (s4 := results.get("S4")) is not None:
        out += [
            _fig("valvey.S4.mismatch_detected_s", s4.get("mismatch_detected_after_step_s"), "s",
                 "<=", 15.0, 10.0, "load step (the stuck valve's first command move) to "
                 "the valve's failed transition"),
            _fig("valvey.S4.second_valve_s", s4.get("second_valve_after_step_s"), "s", "<=",
                 30.0, None, "load step to the first write of the second valve"),
            _fig("valvey.S4.time_above_sp_plus_2k_s", s4.get("time_above_sp_plus_2k_s"), "s",
                 "<=", 60.0, None, "longest run of true supply > SP + 2 K (REFERENCE §5 S4)"),
        ]
    if (s4n := results.get("S4.no_second_valve")) is not None:
        out += [
            _fig("valvey.S4.no_second_valve.cap_s", s4n.get("cap_after_step_s"), "s", "<=",
                 30.0, None, "load step to cap_rack sent to racky (no second valve)"),
            _fig("valvey.S4.no_second_valve.cap_w", s4n.get("cap_w"), "W", "info", None, None,
                 "lowest cap asked (REFERENCE §5 S4: ≈ 36 % of 132 kW sustainable)"),
            _fig("valvey.S4.no_second_valve.time_above_sp_plus_2k_s",
                 s4n.get("time_above_sp_plus_2k_s"), "s", "<=", 60.0, None,
                 "longest run of true supply > SP + 2 K"),
        ]
    if (s5 := results.get("S5")) is not None:
        drift = s5.get("drift_detected_s")
        out += [
            _fig("valvey.S5.freeze_detected_s", s5.get("stale_detected_s"), "s", "<=", 10.0,
                 None, "sensor A frozen to its 'frozen' status"),
            _fig("valvey.S5.dropout_detected_samples", s5.get("dropout_detected_samples"),
                 "samples", "<=", 2.0, None, "10 Hz samples from the first NaN to 'bad'"),
            _fig("valvey.S5.drift_detected_min", None if drift is None else drift / 60.0,
                 "min", "<=", 25.0, 10.0, "+0.05 K/min drift to 'drift' (energy-balance "
                 "residual) or 'disagree'"),
            _fig("valvey.S5.republish_missing_detected_s", s5.get("republish_detected_s"),
                 "s", "<=", 200.0, None, "room-air publisher stops to room_sensors_stale "
                 "(REFERENCE §5 S5: ≤ 2 × 100 s)"),
            _fig("valvey.S5.max_abs_true_error_k", s5.get("max_abs_true_error_k"), "K", "info",
                 None, None, "true supply vs setpoint over the run (falls back to B/C)"),
        ]
    out += _leak_table(results)
    if (s9 := results.get("S9")) is not None:
        out += [
            _fig("valvey.S9.max_above_sp_k", s9.get("max_above_sp_k"), "K", "<=", 1.0, None,
                 "true supply − SP, facility water 40→44 °C at 132 kW, racky cap via SimRacky"),
            _fig("valvey.S9.throttle_events", s9.get("throttle_events"), "trays", "==", 0.0,
                 None, "most trays throttled at once"),
            _fig("valvey.S9.min_cap_w", s9.get("min_cap_w"), "W", "info", None, None,
                 "lowest cap asked of racky"),
        ]
    segs = [v for k, v in sorted(results.items()) if k.startswith("healthy.")]
    if segs:
        hours = round(sum(float(h["hours"]) for h in segs), 2)
        ids = sorted({a for h in segs for a in h["alarm_ids"]})
        out.append(_fig("valvey.healthy.false_alarms", sum(int(h["false_alarms"]) for h in segs),
                        "alarms", "==", 0.0, 0.0, f"{hours} h healthy agentic load (rack "
                        f"model, {len(segs)} warm-started segments); raised: {ids}"))
    return out


def _leak_table(results: dict[str, dict[str, Any]]) -> list[Figure]:
    out: list[Figure] = []
    if (a := results.get("S6a")) is not None:
        out.append(_fig("valvey.S6a.weep_detected_s", a.get("tray_leak_request_s"), "s", "<=",
                        600.0, None, "0.2 L/min weep start to power_down_trays"))
    if (b := results.get("S6b")) is not None:
        out.append(_fig("valvey.S6b.tray_off_after_trip_s", b.get("tray_off_after_trip_s"),
                        "s", "<=", 5.0, None, "tray sensor trip (plant) to the tray off (plant)"))
    if (c := results.get("S6c")) is not None:
        out += [
            _fig("valvey.S6c.rack_isolation_requested", float(c.get("power_down_rack_s")
                                                               is not None), "bool", "==",
                 1.0, None, f"second tray wet → power_down_rack: {c.get('why_rack')}"),
            _fig("valvey.S6c.isolated_after_second_trip_s", c.get("isolated_after_trip_s"), "s",
                 "info", None, None, "second tray's sensor trip to isolation valve closed"),
        ]
    if (d := results.get("S6d")) is not None:
        out.append(_fig("valvey.S6d.isolated_after_trip_s", d.get("isolated_after_trip_s"),
                        "s", "<=", 15.0, None, "rope sensor trip to isolation valve closed "
                        "(power-down first, isolation on confirmation or 10 s)"))
    if (e := results.get("S6e")) is not None:
        out += [
            _fig("valvey.S6e.isolations", float(e.get("isolation_s") is not None), "count",
                 "==", 0.0, None, "leak-sensor fault: no isolation write"),
            _fig("valvey.S6e.sensor_fault_alarmed", float("leak_sensor_fault" in e.get(
                "alarms", [])), "bool", "==", 1.0, None, "leak_sensor_fault raised"),
        ]
    return out


def plot_run(trace: Mapping[str, Sequence[Any]], path: Path, title: str) -> None:
    """One PNG of a control run: supply temperature vs setpoint, valve command/positions,
    pump speed command and rack power (matplotlib, Agg). Raises OSError on write."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [x / 60.0 for x in trace["t_s"]]
    fig, ax = plt.subplots(4, 1, figsize=(10, 9), sharex=True)
    ax[0].plot(t, trace["true_supply_temp_c"], label="supply (true)", lw=1)
    ax[0].plot(t, trace["setpoint_c"], label="setpoint", lw=1, ls="--")
    ax[0].set_ylabel("°C")
    ax[0].legend(loc="upper right", fontsize=8)
    ax[1].plot(t, [math.nan if v is None else v for v in trace["valve_command_pct"]],
               label="valve command", lw=1)
    ax[1].plot(t, trace["valve_position_pct"], label="valve A position", lw=1)
    ax[1].plot(t, trace["valve_b_position_pct"], label="valve B position", lw=1)
    ax[1].set_ylabel("%")
    ax[1].legend(loc="upper right", fontsize=8)
    ax[2].plot(t, [math.nan if v is None else v for v in trace["pump_speed_cmd_pct"]],
               label="pump speed command", lw=1)
    ax[2].plot(t, [100.0 * f / 198.0 for f in trace["flow_lpm"]], label="flow (% of 198 L/min)",
               lw=1)
    ax[2].set_ylabel("%")
    ax[2].legend(loc="upper right", fontsize=8)
    ax[3].plot(t, [p / 1000.0 for p in trace["rack_power_w"]], label="rack power", lw=1)
    caps = [math.nan if c is None else c / 1000.0 for c in trace["cap_w"]]
    if any(not math.isnan(c) for c in caps):
        ax[3].plot(t, caps, label="cap asked of racky", lw=1, ls="--")
    ax[3].set_ylabel("kW")
    ax[3].set_xlabel("plant time (min)")
    ax[3].legend(loc="upper right", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


_PLOTS = {"S1.ff.": "S1-load-step-pid-ff", "S1.pid.": "S1-load-step-pid-only",
          "S2.ff.": "S2-agentic-bursts-pid-ff", "S2.pid.": "S2-agentic-bursts-pid-only",
          "S3": "S3-pump-trip", "S4": "S4-valve-stuck",
          "S4.no_second_valve": "S4-valve-stuck-no-second-valve",
          "S5": "S5-sensor-dropout", "S9": "S9-facility-water-rise"}


def valvey_scenario_figures(out: Path | None = None, progress: Progress = no_progress,
                            quick: bool = False) -> list[Figure]:
    """Run issue 4's standard valvey scenarios in lock-step and return every figure of its
    table (S1 and S2 with PID-only beside PID + dynamic feedforward; median and p90 over
    `FULL_SEEDS` seeds for those noisy figures, one seed for the fault scenarios).

    Args:
        out: when given, one PNG per control scenario is written there (supply temperature vs
            setpoint, valve, pump speed, rack power), named ``valvey-<scenario>.png``.
        progress: ``progress(label, fraction)`` after each run.
        quick: one seed and shortened runs (leaks to their first actions, S9 20 min,
            healthy 20 min): a smoke test of the wiring (every figure name is produced), not
            the figures. About 100 s of CPU.

    Runs in a process pool (one worker per core). Cost (measured, python 3.11): about
    1,170 s of CPU for the full set (measured on a loaded 2-core host), two thirds of it the
    24 h healthy run on the whole rack model (4 segments of 6 h, ≈ 190 s each) and the 20
    S2 runs (≈ 14 s each): ≈ 10 min on 2 idle cores. Returns the
    figures in table order; raises OSError when ``out`` cannot be written.
    """
    import os
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from multiprocessing import get_context

    jobs = _jobs(quick)
    results: dict[str, dict[str, Any]] = {}
    traces: dict[str, dict[str, list[Any]]] = {}
    workers = max(1, min(len(jobs), os.cpu_count() or 1))
    # fork: the workers only run pure lock-step code, and it needs no ``__main__`` guard in
    # the caller (spawn re-imports the caller's main module)
    ctx = get_context("fork" if sys.platform.startswith("linux") else "spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        futs = [pool.submit(_run_job, j) for j in jobs]
        for i, fut in enumerate(as_completed(futs)):
            job, figs, trace = fut.result()
            results[job.key] = figs
            if trace is not None:
                traces[job.key] = trace
            progress(f"valvey {job.key}", (i + 1) / len(jobs))
    figs_out = _figures_of(results)
    if out is not None:
        for key, trace in traces.items():
            name = next((v for k, v in _PLOTS.items() if key == k or (
                k.endswith(".") and key.startswith(k))), None)
            if name is not None:
                plot_run(trace, out / f"valvey-{name}.png", f"valvey {name} (seed "
                         f"{key.rsplit('.', 1)[-1] if key.count('.') == 2 else 'default'})")
    return figs_out
