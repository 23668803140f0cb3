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
  publishes, with the plant's rack power; on a row CDU, the ``racks_N`` plant variants, one
  racky per rack of ``feedforward.racks``, rack i of that list being the plant's rack i, as
  `row_config` sets it up; a rack listed beyond the plant's has no racky), through
  `ValveyTick.on_sensor_message` (the configured topic mapping, the payload parse,
  retained-message ageing; live messages carry no retain flag); a scenario's ``mqtt_stop``
  stops a publisher (its samples then go stale in valvey);
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

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal, Protocol

from harness.cdu_face import CduFace
from harness.lockstep_valvey.plant_steps import PlantSteps, cap_reference_w
from rackplane.clock import FakeClock
from rackplane.core.registers import RegisterMap, load_register_map
from rackplane.core.topics import Topics
from rackplane.errors import WriteRejected
from rackplane.io.selfmetrics import TELEMETRY_ALARMS, telemetry_alarm_conditions
from rackplane.settings import Identity
from sims.scenario import FaultRecord, Scenario, ScenarioRun
from sims.telemetry import env_payload, rack_payload
from valvey.config import ValveyConfig
from valvey.core.controller import ValveyCore
from valvey.core.requests import RackyReply, RackyRequest
from valvey.core.sensors import resolve_topic
from valvey.tick import Publish, ValveyTick

__all__ = ["LockstepResult", "RackySeam", "SimRacky", "Trace", "row_config",
           "run_valvey"]

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
    cap_reference_w: list[float | None] = field(default_factory=list)  # while capped
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
    steps: PlantSteps = field(default_factory=PlantSteps)
    """The plant's truth at every plant step (`PlantSteps`): extremes and valve activity are
    read there."""
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


def row_config(cfg: ValveyConfig, n_racks: int) -> ValveyConfig:
    """``cfg`` for a row CDU of ``n_racks`` racks: ``feedforward.racks`` lists valvey's own
    rack (``identity.rack``) and ``<rack>-2`` ... ``<rack>-N`` (the plant's racks 0..N−1
    in `run_valvey`); one rack: ``cfg`` unchanged."""
    if n_racks <= 1:
        return cfg
    own = cfg.identity.rack
    racks = [own, *(f"{own}-{k}" for k in range(2, n_racks + 1))]
    return cfg.model_copy(update={"feedforward": cfg.feedforward.model_copy(
        update={"racks": racks})})


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
    variant: str | None = None,
    nameplate: bool = True,
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
        variant: runs on this member of the plant family (`sims.cdu.variants.VARIANTS`)
            instead of the scenario's own; an unknown name raises `pydantic.ValidationError`.
        nameplate: a ``cfg`` without ``capacity.rack_max_power_w`` gets the scenario rack's
            (``plant.rack_max_power_w``), as a site's config gives its rack's vendor figure;
            False: left unknown (valvey then uses the highest rack power it has seen).
    """
    cfg = cfg or ValveyConfig()
    if nameplate and cfg.capacity.rack_max_power_w is None:
        cfg = cfg.model_copy(update={"capacity": cfg.capacity.model_copy(
            update={"rack_max_power_w": scenario.plant.rack_max_power_w})})
    if feedforward is not None:
        cfg = cfg.model_copy(update={"feedforward": cfg.feedforward.model_copy(
            update={"enabled": feedforward})})
    if seed is not None:
        scenario = scenario.model_copy(update={"seed": seed})
    if variant is not None:
        plant_spec = type(scenario.plant).model_validate(
            {**scenario.plant.model_dump(), "variant": variant})
        scenario = scenario.model_copy(update={"plant": plant_spec})
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
    # racky's rack power: valvey's own rack (the plant's rack 0) and, on a row CDU, each rack
    # of feedforward.racks (the plant's rack i; one listed beyond the plant's racks has no
    # racky: nothing is published for it)
    rp_sensor = cfg.sensors.rack_power
    rack_topics = [(racky_topic, plant.racks[0])] if ident.rack not in cfg.feedforward.racks \
        else []
    rack_topics += [(resolve_topic(rp_sensor.topic, root, ident.site, r), plant.racks[i])
                    for i, r in enumerate(cfg.feedforward.racks[:len(plant.racks)])
                    if rp_sensor is not None]
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
    steps = PlantSteps()
    record_step = steps.record
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
            for topic, rack_thermal in rack_topics:
                on_message(topic, _rack_power_payload(rack_thermal.power_w, ts),
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
        setpoint = out.loop.setpoint_c
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
            cap_now = seam.cap_w if isinstance(seam, SimRacky) else None
            trace.cap_w.append(cap_now)
            # the reference: what the plant can hold at SP + 1 K, but never above what the
            # scenario's load asks (a cap above the demand costs nothing)
            trace.cap_reference_w.append(None if cap_now is None else min(
                run.load.power_w(t_s), cap_reference_w(plant, out.loop.setpoint_c,
                                                       cfg.valves.second_valve)))
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
        record_step(plant, setpoint)
        advance(dt_s)
        n += 1
    det = {f"safety.{k}": v - start - 3600.0 * warm for k, v in core.safety.detected.items()}
    return LockstepResult(
        scenario, trace, list(run.ground_truth), rejected, alarms, period_cmds,
        cfg.supply_loop.period_s, written_cmds, events,
        seam if isinstance(seam, SimRacky) else None, run.model or "rack",
        core.ff.settings.enabled, det, marks, steps,
    )


