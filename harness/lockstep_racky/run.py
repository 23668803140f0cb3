"""The lock-step run: racky's tick with the virtual rack, the shelf face and the agents' messages
(`run_racky`); see the package docstring."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from rackplane.commands import CommandEnvelope
from rackplane.core.names import ALARM_SUBJECT_SEPARATOR, alarm_id
from rackplane.core.registers import (
    BlockDecoder,
    ReadBlock,
    ReadMemory,
    RegisterMap,
    learn_from_exception,
    load_register_map,
    plan_reads,
)
from rackplane.core.samples import Sample
from rackplane.core.tray_contract import encode_tray
from rackplane.errors import CommandError
from rackplane.io.mqtt import Topics, encode_json
from rackplane.settings import ModbusTargetSettings
from racky.config import RackyConfig
from racky.core.controller import RackyCore
from racky.core.lifecycle import Lifecycle, PersistedState
from racky.fleet import FleetLink
from racky.tick import AgentPublish, RackyTick
from sims.agent_reply import set_power_limits_reply
from sims.modbus_face import ModbusFace
from sims.runtime import apply_set_power_limits, plant_payload, serve_values
from sims.scenario import (
    FABRIC_KINDS,
    FabricSpec,
    FaultRecord,
    Scenario,
    ScenarioRun,
    load_scenario,
)
from sims.telemetry import SetPowerLimitsArgs, tray_payloads
from valvey.core.capacity import CapacityGuard, CapacitySettings

WALL0_NS = 1_767_225_600 * 10**9  # 2026-01-01T00:00:00Z: wall clock of plant time 0


@dataclass(frozen=True, slots=True)
class AlarmRecord:
    """One alarm event of a run (plant s)."""

    t_s: float
    id: str
    kind: str
    severity: str
    message: str


@dataclass
class RackyLockstepResult:
    """A finished run: the 1 Hz trace, alarm events, commands, ground truth, the core."""

    scenario: Scenario
    trace: dict[str, list[Any]]
    alarms: list[AlarmRecord]
    commands: list[tuple[float, tuple[int, ...], dict[str, Any], str]]
    ground_truth: list[FaultRecord]
    core: RackyCore
    fine: dict[str, list[float]] = field(default_factory=dict)
    refused: list[tuple[float, tuple[int, ...], str]] = field(default_factory=list)
    ticks: list[float] = field(default_factory=list)
    """Plant time of every tick (ticks woken early included)."""
    fleet_acks: list[tuple[float, tuple[int, int]]] = field(default_factory=list)
    """(plant s, lease key) of every acknowledgement of the ``fleet`` link."""

    def raised(self, kind: str | None = None) -> list[AlarmRecord]:
        """Raise events (of ``kind``, an id prefix, when given)."""
        return [a for a in self.alarms if a.kind == "raised"
                and (kind is None or a.id == kind
                     or a.id.startswith(kind + ALARM_SUBJECT_SEPARATOR))]

    def first_alarm(self, kind: str, thing: str = "", after_s: float = -math.inf
                    ) -> float | None:
        """Plant time of the first raise of alarm ``kind`` on ``thing`` after ``after_s``."""
        aid = alarm_id(kind, thing)
        for a in self.alarms:
            if a.kind == "raised" and a.id == aid and a.t_s >= after_s:
                return a.t_s
        return None


# --- racky's inputs from the simulator, its effects back ------------------------------------------


class _ShelfFace:
    """One power shelf as racky's Modbus adapter sees it: the simulator's readings put into a
    register image exactly as the shelf face serves them (`sims.runtime.serve_values` into a
    `sims.modbus_face.ModbusFace`, not started), read back in the daemon's read plan
    (`rackplane.core.registers.plan_reads` with the target's request size and gap; an
    unimplemented address is learned from as the adapter learns from exception 2) and decoded
    by `rackplane.core.registers.BlockDecoder`, the adapter's decoder."""

    def __init__(self, target: ModbusTargetSettings, regmap: RegisterMap) -> None:
        self.target = target
        self.regmap = regmap
        self.face = ModbusFace(self.regmap, unit_ids=(target.unit_id,))
        self.order = {p.name: i for i, p in enumerate(self.regmap.points)}
        memory = ReadMemory()
        while True:  # the adapter's first polls: exception 2 on a gap -> re-plan
            blocks = plan_reads(self.regmap.points, target.max_registers_per_read,
                                target.max_gap_registers, memory)
            bad = next((b for b in blocks if not self._implemented(b)), None)
            if bad is None:
                break
            memory = learn_from_exception(bad, 2, memory, target.max_registers_per_read).memory
        self.decoders = [BlockDecoder(b) for b in blocks]
        self._served: dict[str, float] = {}
        self._sentinels: frozenset[str] = frozenset()

    def _implemented(self, b: ReadBlock) -> bool:
        try:
            self.face.registers(b.table, b.start, b.count, unit=self.target.unit_id)
        except KeyError:
            return False
        return True

    def poll(self, values: Mapping[str, float], sentinels: frozenset[str] | set[str],
             wall_ns: int, now: float) -> list[Sample]:
        """Serve ``values`` and read every point back (map order)."""
        unit = self.target.unit_id
        sent = frozenset(sentinels)
        if sent != self._sentinels:  # the scenario changed its sentinel points: all again
            self._sentinels, self._served = sent, {}
        served = self._served
        changed = {k: v for k, v in values.items()
                   if k not in served or not _same(served[k], v)}
        if changed:  # an unchanged value has the same registers already
            serve_values(self.face, self.regmap, changed, sent, unit)
            served.update(changed)
        out: list[Sample] = []
        for d in self.decoders:
            b = d.block
            out += d.decode_words(self.face.registers(b.table, b.start, b.count, unit=unit),
                                  wall_ns, now).samples
        out.sort(key=lambda x: self.order[x.point])
        return out


class _RackyIO:
    """What racky's adapters hand its tick, made from the virtual rack each tick, and the tick's
    effects applied back (the daemon's code in between is `racky.tick.RackyTick`'s):

    * power shelves: `_ShelfFace` (register words and the adapter's decoder);
    * node agents: `sims.telemetry.tray_payloads` encoded as an agent sends them
      (`rackplane.core.tray_contract.encode_tray`, msgspec: bytes that decode to the same
      values as ``encode_json``'s; ``encode_json`` itself when a float is not finite), given to
      the tick as ``<agents>/telemetry/trayNN`` messages (racky's decoder and ingest parse
      them);
    * cooling: valvey's ``state/<state_thing>`` (the CDU's supply temperature and valve as
      valvey reads them, the scenario's setpoint) and the simulator's ``telemetry/plant``
      (`sims.runtime.plant_payload`: flow, facility water) on ``cooling.plant_topic``;
    * agent commands: each ``set_power_limits`` publish goes through the command envelope
      and args models to the simulator's handler (`sims.runtime.apply_set_power_limits`); its
      reply goes back to the tick on ``.../result``.

    A publisher the scenario stops (``mqtt_stopped``) sends nothing while stopped.
    """

    def __init__(self, run: ScenarioRun, cfg: RackyConfig, tick: RackyTick) -> None:
        rack = run.rack
        assert rack is not None
        self.run = run
        self.rack = rack
        self.tick = tick
        self.ident = cfg.identity
        n = rack.shelves.params.shelves
        targets = list(cfg.power_shelves[:n]) or [
            ModbusTargetSettings(name=f"shelf{i}", unit_id=i + 1,
                                 register_map=Path("power-shelf"))
            for i in range(n)]
        maps: dict[Path, RegisterMap] = {}
        for t in targets:
            if t.register_map not in maps:
                maps[t.register_map] = load_register_map(t.register_map)
        self.shelves = [_ShelfFace(t, maps[t.register_map]) for t in targets]
        root = cfg.mqtt.topic_root
        self.agents = Topics(root, cfg.identity, cfg.node_agents.daemon)
        self.cooling_topic = Topics(root, cfg.identity, cfg.cooling.daemon).state(
            cfg.cooling.state_thing)
        self.plant_topic = cfg.cooling.plant_topic
        self.setpoint_c = run.scenario.plant.supply_setpoint_c
        self.capacity = CapacityGuard(CapacitySettings())  # valvey's measurement (see there)

    def feed(self, now: float, wall_ns: int) -> None:
        """Everything the daemon would have received since the last tick (one poll, one
        message per publisher)."""
        run, tick, pr = self.run, self.tick, self.run.protocol
        sh = self.rack.shelves
        for i, face in enumerate(self.shelves):
            tick.shelf_samples(face.target.name,
                               face.poll(sh.shelf_readings(i), pr.sentinel_points, wall_ns, now))
        self.feed_agents(now, wall_ns)
        r = run.plant.readings()
        tick.message(self.cooling_topic, encode_json({
            "supply_temp_c": _finite(r.get("supply_temp_c")), "setpoint_c": self.setpoint_c,
            "valve_command_pct": _finite(r.get("valve_command_pct")),
            "valve_position_pct": _finite(r.get("valve_position_pct")), "ts_ns": wall_ns,
            "capacity_w_per_k": self._measured_capacity(now, r),
        }), retain=False, received_mono=now, wall_ns=wall_ns)
        if self.plant_topic is not None and pr.publishing("plant"):
            tick.message(self.plant_topic, encode_json(plant_payload(run, wall_ns)),
                         retain=False, received_mono=now, wall_ns=wall_ns)

    def feed_agents(self, now: float, wall_ns: int) -> None:
        """The node agents' ``telemetry/trayNN`` messages now."""
        if self.run.protocol.publishing("trays"):
            for thing, payload in tray_payloads(self.rack, self.ident, wall_ns):
                self.tick.message(self.agents.telemetry(thing), _encode_tray(payload),
                                  retain=False, received_mono=now, wall_ns=wall_ns)

    def _measured_capacity(self, now: float, r: Mapping[str, float]) -> float | None:
        """What valvey's state carries as ``capacity_w_per_k``: valvey's own capacity guard
        (`valvey.core.capacity.CapacityGuard`, its default settings) on the CDU's readings,
        measuring the exchanger while the valve is open (None until it has)."""
        f = {k: _finite(r.get(k)) for k in ("supply_temp_c", "valve_command_pct",
                                             "valve_position_pct", "heat_removed_kw",
                                             "return_temp_c", "facility_supply_temp_c",
                                             "flow_lpm")}
        st = self.capacity.step(
            now, pv_c=f["supply_temp_c"], setpoint_c=self.setpoint_c,
            valve_demand_pct=f["valve_command_pct"], valve_position_pct=f["valve_position_pct"],
            valve_stuck=False, heat_removed_kw=f["heat_removed_kw"], return_c=f["return_temp_c"],
            facility_c=f["facility_supply_temp_c"], flow_lpm=f["flow_lpm"], rack_power_w=None,
            no_standby=False, low_flow=False, over_temperature=False)
        return None if st.open_w_per_k is None else round(st.open_w_per_k, -1)

    def command(self, c: AgentPublish, now: float, wall_ns: int) -> str | None:
        """Deliver one ``set_power_limits`` to the node agents and its reply to the tick; the
        refusal (``code: message``), if any."""
        env = CommandEnvelope.model_validate(json.loads(encode_json(c.payload)))
        error: dict[str, str] | None = None
        state: dict[str, Any] | None = None
        try:
            args = SetPowerLimitsArgs.model_validate(env.args)
            apply_set_power_limits(self.rack, args)
            state = set_power_limits_reply(self.rack.agents, args.trays, args.epoch)
        except ValidationError as err:
            error = {"code": "invalid_args", "message": str(err)[:300]}
        except CommandError as err:
            error = {"code": str(err.code), "message": str(err)}
        reply = {"request_id": env.request_id, "ok": error is None, "error": error,
                 "state": state}
        self.tick.message(f"{c.topic}/result", encode_json(reply), retain=False,
                          received_mono=now, wall_ns=wall_ns)
        return None if error is None else f"{error['code']}: {error['message']}"


def _encode_tray(payload: dict[str, Any]) -> bytes:
    """A tray payload as the node agent's bytes: `rackplane.core.tray_contract.encode_tray`
    (msgspec; the same values as ``encode_json``'s bytes) when every float in it is finite,
    else ``encode_json`` (which refuses NaN / inf with ValueError, as before: msgspec would
    write null)."""
    return encode_tray(payload) if _tray_finite(payload) else encode_json(payload)


def _tray_finite(p: Mapping[str, Any]) -> bool:
    """Every float of a `sims.telemetry.tray_payloads` payload is finite (a sum of finite
    floats is finite unless it overflows: then False, and ``encode_json`` decides)."""
    isfinite = math.isfinite
    if not isfinite(p["power_w"] + p["coolant_out_temp_c"]):
        return False
    if not isfinite(sum(v for v in p["agent"].values()
                        if isinstance(v, float))):
        return False
    for g in p["gpus"]:
        up = g["uptime_s"]
        if not isfinite(g["power_w"] + g["temp_c"] + g["t_limit_c"] + g["utilization"]
                        + (0.0 if up is None else up)):
            return False
        pb = g["ports"]
        if pb is not None and not isfinite(sum(pb["speed_mb_per_s"]) + sum(pb["tx_bytes_per_s"])
                                           + sum(pb["rx_bytes_per_s"])):
            return False  # ber: finite or None (finite_or_none); counters: ints
    return True


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _finite(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)


def default_config(**power: Any) -> RackyConfig:
    """racky's embedded defaults with ``[power]`` overrides (lock-step runs)."""
    cfg = RackyConfig()
    if power:
        cfg = cfg.model_copy(update={"power": cfg.power.model_copy(update=power)})
    return cfg


def lockstep_config(cfg: RackyConfig) -> RackyConfig:
    """``cfg`` with ``cooling.plant_topic`` set to the simulator's ``telemetry/plant`` when it
    is unset (as the demo wires racky: valvey's state carries no flow or facility water)."""
    if cfg.cooling.plant_topic is not None:
        return cfg
    topic = Topics(cfg.mqtt.topic_root, cfg.identity, "sim").telemetry("plant")
    return cfg.model_copy(update={"cooling": cfg.cooling.model_copy(
        update={"plant_topic": topic})})


def run_racky(
    scenario: Scenario | str,
    cfg: RackyConfig | None = None,
    *,
    plant_dt_s: float = 0.1,
    duration_s: float | None = None,
    fine_trace: bool = False,
    persisted: PersistedState | None = None,
    hook: Callable[[float, ScenarioRun, RackyCore], None] | None = None,
    progress: Callable[[float], None] | None = None,
    tick_factory: Callable[[RackyConfig, RackyCore], RackyTick] | None = None,
    fleet: FleetLink | None = None,
    between: Callable[[float, ScenarioRun, RackyCore], None] | None = None,
    agents_every_s: float | None = None,
) -> RackyLockstepResult:
    """Run ``scenario`` (the whole virtual rack, fabric on when the scenario has link faults or
    asks for it) with racky's tick (`racky.tick.RackyTick`, the daemon's) at 1 Hz by default.

    Args:
        cfg: racky's config (default: embedded defaults; `lockstep_config` is applied).
        plant_dt_s: plant step, s (a divisor of the tick; <= 1).
        duration_s: stop here (default: the scenario's duration).
        fine_trace: also record rack power at every plant step (``fine``).
        persisted: racky's persisted state at start (default: a new rack in the config's
            ``lifecycle.initial_state``).
        hook: called before each tick with (plant s, the run, the core) to inject actions.
        tick_factory: builds the tick from (config, core) (default `RackyTick` started at 0;
            tests substitute a faulty one to show the figures come from the tick).
        fleet: racky's fleet link (`racky.fleet.FleetLink`, never connected: the test hands
            it leases with ``take``), wired as the daemon wires it (`racky.app.Racky.tick`:
            its budget before each step, the step's read-back after; its ``wake_tick`` runs
            the next tick at the next plant step, the schedule going on a tick after it, as
            `rackplane.io.service.run_ticker` does); its clock is set to plant time.
        between: called after every plant step between ticks with (plant s, the run, the
            core): inputs that arrive between ticks (e.g. leases).
        agents_every_s: the node agents also publish their telemetry between ticks, every
            this many plant s (as real agents do on their own period; a cap read back lower
            goes to ``fleet`` as the daemon hands it, `racky.app.Racky._on_agent_telemetry`);
            None: once per tick only.

    Raises:
        ValueError: a plant step that does not divide the tick.
    """
    sc = load_scenario(scenario) if isinstance(scenario, str) else scenario
    cfg = lockstep_config(cfg or RackyConfig())
    tick_s = cfg.control.tick_s
    n_sub = round(tick_s / plant_dt_s)
    if n_sub < 1 or abs(n_sub * plant_dt_s - tick_s) > 1e-9:
        raise ValueError(f"plant_dt_s {plant_dt_s} must divide the tick {tick_s}")
    if not cfg.links.enabled and not any(f.kind in FABRIC_KINDS for f in sc.faults):
        sc = sc.model_copy(update={"fabric": FabricSpec(enabled="off")})  # nothing reads it
    run = ScenarioRun(sc, model="rack")
    ps = persisted or PersistedState(Lifecycle(cfg.lifecycle.initial_state, WALL0_NS, "new",
                                               "lockstep"))
    core = RackyCore(cfg, 0.0, ps)
    tick = (tick_factory or (lambda c, k: RackyTick(c, k, 0.0, agent_epoch=WALL0_NS // 10**6)))(
        cfg, core)
    io = _RackyIO(run, cfg, tick)
    end = sc.duration_s if duration_s is None else duration_s
    keys = ("t_s", "rack_power_w", "rack_input_w", "it_power_w", "limit_w", "limit_source",
            "caps_total_w", "capacity_w", "hottest_tj_c", "min_t_limit_c", "throttled",
            "supply_temp_c", "facility_supply_temp_c", "derate_w", "trays_powered")
    trace: dict[str, list[Any]] = {k: [] for k in keys}
    fine: dict[str, list[float]] = {"t_s": [], "rack_power_w": [], "rack_input_w": []}
    alarms: list[AlarmRecord] = []
    commands: list[tuple[float, tuple[int, ...], dict[str, Any], str]] = []
    refused: list[tuple[float, tuple[int, ...], str]] = []
    rack = run.rack
    assert rack is not None
    woken = [False]
    clock = _PlantClock()
    if fleet is not None:
        fleet.clock = clock
        fleet.wake_tick = lambda: woken.__setitem__(0, True)
    ticks: list[float] = []
    acks: list[tuple[float, tuple[int, int]]] = []
    next_agents = math.inf if agents_every_s is None else agents_every_s
    while True:
        now = round(run.t_s, 6)
        clock.t = now
        if now > end + 1e-9:
            break
        if hook is not None:
            hook(now, run, core)
        wall = WALL0_NS + round(now * 1e9)
        io.feed(now, wall)
        tick.take_readback_lowered()  # fed with the tick: read at this step
        woken[0] = False
        ticks.append(now)
        if fleet is not None:
            core.fleet_budget_w = fleet.dc_budget_w()
        eff = tick.step(now, wall)
        if fleet is not None:
            acked = fleet.follower.acked
            fleet.observe_core(core)
            if fleet.follower.acked != acked and fleet.follower.acked is not None:
                acks.append((now, fleet.follower.acked))
        out = eff.output
        assert out is not None
        for c in eff.agent_commands:
            err = io.command(c, now, wall)
            args = {k: v for k, v in c.payload["args"].items() if k != "trays"}
            commands.append((now, c.trays, args, c.reason))
            if err is not None:
                refused.append((now, c.trays, err))
        for ev in eff.alarm_events:
            alarms.append(AlarmRecord(now, ev.id, ev.kind, ev.severity, ev.message))
        tr = rack.truth()
        st = rack.shelves.state
        caps = out.caps_w
        cool = tick.cooling_reading()
        trace["t_s"].append(now)
        trace["rack_power_w"].append(out.rack_power_w)
        trace["rack_input_w"].append(st.input_w)
        trace["it_power_w"].append(tr.it_power_w)
        trace["limit_w"].append(out.limit.limit_w)
        trace["limit_source"].append(out.limit.source)
        trace["caps_total_w"].append(None if np.isnan(caps).all() else float(np.nansum(caps)))
        trace["capacity_w"].append(st.capacity_w)
        trace["hottest_tj_c"].append(float(tr.gpu_tj_c.max()))
        trace["min_t_limit_c"].append(float(tr.gpu_t_limit_c.min()))
        trace["throttled"].append(int(tr.gpu_throttled.sum()))
        trace["supply_temp_c"].append(None if cool is None else cool.supply_temp_c)
        trace["facility_supply_temp_c"].append(run.facility_supply_temp_c)
        trace["derate_w"].append(out.derate_w)
        trace["trays_powered"].append(int(tr.tray_powered.sum()))
        if progress is not None:
            progress(now)
        if now >= end - 1e-9:
            break
        for _ in range(n_sub):  # to the next tick, or the next plant step when woken
            run.step(plant_dt_s)
            t = round(run.t_s, 6)
            clock.t = t
            if fine_trace:
                fine["t_s"].append(t)
                fine["rack_power_w"].append(rack.shelves.state.load_w)
                fine["rack_input_w"].append(rack.shelves.flows.input_w)
            if between is not None:
                between(t, run, core)
            if t >= next_agents - 1e-9:
                next_agents = t + (agents_every_s or math.inf)
                io.feed_agents(t, WALL0_NS + round(t * 1e9))
                if tick.take_readback_lowered() and fleet is not None:
                    fleet.readback_lowered()
            if woken[0]:
                break
    return RackyLockstepResult(sc, trace, alarms, commands, list(run.ground_truth), core, fine,
                               refused, ticks, acks)


class _PlantClock:
    """Plant time as a `rackplane.clock.Clock` (monotonic s; wall: `WALL0_NS` + it)."""

    def __init__(self) -> None:
        self.t = 0.0

    def monotonic(self) -> float:
        return self.t

    def wall_ns(self) -> int:
        return WALL0_NS + round(self.t * 1e9)


# --- validation on the simulator -----------------------------------------------------------------
