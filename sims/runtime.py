"""The virtual rack in real time behind real protocols (DESIGN §4).

The plant (`sims.scenario.ScenarioRun`, the whole virtual rack by default) steps at 10 Hz on
the monotonic clock: its time keeps up with real time. A tick that ran late (the host was busy)
runs the plant steps it owes back to back, at most `CATCH_UP_STEPS_PER_TICK` a tick, so the plant
never falls behind for good as a plant that skipped them would; a backlog beyond
`MAX_BACKLOG_S` (the process was stopped or starved for that long) is dropped rather than
replayed, counted in ``steps_dropped`` and logged. After each tick's steps:

* the CDU's readings are served by a Modbus TCP face built from ``cdu-generic`` (the register
  map valvey reads; client writes: valve command, pump speed, heartbeat, local setpoint go
  into the plant), on ``modbus_port`` / ``unit_id``; every write passes the controller-epoch
  gate first (`sims.epoch_gate`: a controller of a pair claims its epoch on its connection,
  a write on a connection with an older claim, or none once an epoch is held, is refused
  with exception 1 and counted), `epoch_gate`;
* the power shelves are served by a second face from ``power-shelf``, one unit id per shelf
  (default 1..8), on ``shelf_modbus_port`` (0: a free port, see ``state/faces``);
* with a broker configured, once per ``telemetry_interval_s`` (1 s): ``telemetry/plant``
  (CDU truth, as the first CDU simulator published it), ``telemetry/rack``, one
  ``telemetry/trayNN`` per compute tray (its node agent, 4 GPUs and their link ports),
  ``telemetry/power``, ``telemetry/env``, ``telemetry/truth`` (the trays' simulator truth,
  never in the node-agent contract); retained ``state/scenario``, ``state/faults`` (the
  ground truth), ``state/faces`` and ``state/node_agents`` (on change). The node agents take
  ``cmd/<user>/set_power_limits`` and ``get_power_limits`` (rackplane's command envelope and
  reply; the contract racky uses). Payloads: `sims.telemetry` (JSON Schemas in
  ``sims/schemas``; docs/SIMULATORS.md).

Protocol faults of the scenario (`ScenarioRun.protocol`) are applied to the faces and
publishers as they start and end: exception replies, half-open connections, slow replies,
unimplemented-register gaps, a per-request register limit, sentinel raw values, stopped
publishers. A reading that is NaN (a dropped transmitter) is served as NaN by a float
register and as its sentinel by an integer register with one; an integer register without a
sentinel keeps its last value.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from rackplane.clock import SYSTEM_CLOCK, Clock
from rackplane.commands import CommandContext, CommandRouter
from rackplane.core.registers import (
    RegisterMap,
    encode_value,
    load_register_map,
    raw_to_registers,
)
from rackplane.errors import CommandError, WriteRejected
from rackplane.io.mqtt import MqttLink
from rackplane.io.service import TickStats, run_ticker
from rackplane.log import get_logger
from rackplane.settings import CommandSettings, Identity, MqttSettings
from sims.agent_reply import set_power_limits_reply
from sims.epoch_gate import EPOCH_POINT, EpochGate
from sims.modbus_face import ModbusFace
from sims.row import VirtualRack
from sims.scenario import ModbusFaultState, Scenario, ScenarioRun
from sims.telemetry import (
    GetPowerLimitsArgs,
    SetPowerLimitsArgs,
    apply_power_limits,
    env_payload,
    node_agents_payload,
    power_payload,
    rack_payload,
    tray_payloads,
    truth_payload,
)

__all__ = ["SIM_DT_S", "CduSimulator", "VirtualRackSimulator", "apply_set_power_limits",
           "encode_readings", "plant_payload", "serve_values"]

SIM_DT_S = 0.1
CATCH_UP_STEPS_PER_TICK = 10
"""Plant steps one late tick may run to catch up with real time (1 s of plant time; the
next ticks run the rest)."""
STEP_EARLY_FRACTION = 0.25
"""A tick this fraction of a step before a step's time on ``t0 + k dt`` runs that step (the
ticker's own schedule drifts from it by float rounding)."""
MAX_BACKLOG_S = 10.0
"""Plant time owed beyond this (s) is dropped, not replayed (``steps_dropped``)."""


def encode_readings(
    regmap: RegisterMap,
    values: Mapping[str, float],
    sentinel_points: frozenset[str] | set[str] = frozenset(),
) -> tuple[dict[str, float], dict[str, list[int]], list[str]]:
    """Split plant readings into what `ModbusFace.update` takes and raw registers.

    Returns ``(values, raw, held)``: encodable engineering values; raw registers for
    sentinels (a NaN reading of an integer point with a sentinel, or a point in
    ``sentinel_points``); names of points neither can represent (NaN without a sentinel, or
    out of the type's range), which keep their last registers. Points not in the map are
    ignored.
    """
    enc, raw, held = _encode_readings(regmap, values, sentinel_points)
    return {name: values[name] for name in enc}, raw, held


def _encode_readings(
    regmap: RegisterMap,
    values: Mapping[str, float],
    sentinel_points: frozenset[str] | set[str],
) -> tuple[dict[str, list[int]], dict[str, list[int]], list[str]]:
    """`encode_readings` with the registers of the encodable values (name -> registers)."""
    ok: dict[str, list[int]] = {}
    raw: dict[str, list[int]] = {}
    held: list[str] = []
    by_name = regmap.by_name
    for name, v in values.items():
        p = by_name.get(name)
        if p is None:
            continue
        if name in sentinel_points and p.sentinels:
            raw[name] = raw_to_registers(p, p.sentinels[0])
            continue
        if not math.isfinite(v) and p.type not in ("float32", "float64"):
            if p.sentinels:
                raw[name] = raw_to_registers(p, p.sentinels[0])
            else:
                held.append(name)
            continue
        try:
            ok[name] = encode_value(p, float(v))
        except ValueError:
            held.append(name)
    return ok, raw, held


def _check_trays(rack: VirtualRack, trays: Sequence[int]) -> None:
    n = rack.compute.n_trays
    bad = [t for t in trays if not 0 <= t < n]
    if bad:
        raise CommandError("unknown_tray", f"trays {bad} do not exist (0..{n - 1})")


def apply_set_power_limits(rack: VirtualRack, args: SetPowerLimitsArgs) -> dict[str, Any]:
    """The node agents' ``set_power_limits`` handler (`sims.telemetry.apply_power_limits`:
    contract v1, all trays or none, stale epochs dropped, caps armed for ``ttl_s``). Returns
    the changes applied (a released limit maps to None).

    Raises:
        CommandError: ``invalid_args``, ``unknown_tray``, ``stale_epoch``, ``out_of_range``;
            nothing changes when it raises.
    """
    apply_power_limits(rack, args)
    return {**args.changes(), **dict.fromkeys(args.release)}


def plant_payload(run: ScenarioRun, ts_ns: int) -> dict[str, Any]:
    """``telemetry/plant`` (`sims.telemetry.PlantTelemetry`): the CDU's truth at ``ts_ns``."""
    tr = run.plant.truth()
    return {
        "t_s": round(run.t_s, 3),
        "rack_power_w": tr.rack_power_w,
        "facility_supply_temp_c": tr.facility_supply_temp_c,
        "supply_temp_c": tr.supply_temp_c,
        "return_temp_c": tr.return_temp_c,
        "flow_lpm": tr.flow_lpm,
        "valve_position_pct": tr.valve_position_pct,
        "valve_command_pct": tr.valve_command_pct,
        "hottest_gpu_tj_c": tr.hottest_gpu_tj_c,
        "local_control": tr.local_control,
        "ts_ns": ts_ns,
    }


def serve_values(face: ModbusFace, regmap: RegisterMap, values: Mapping[str, float],
                 sentinel_points: frozenset[str] | set[str] = frozenset(),
                 unit: int | None = None) -> list[str]:
    """Put plant readings into ``face``'s registers as the simulator serves them (the rules
    of `encode_readings`: sentinels raw, unrepresentable values held), through the map's
    compiled encoders (`RegisterMap.encoders`). Returns the held names."""
    encoders = regmap.encoders
    by_name = regmap.by_name
    held: list[str] = []
    for name, v in values.items():
        enc = encoders.get(name)
        if enc is None:
            continue
        regs = enc(float(v), name in sentinel_points)
        if regs is None:
            held.append(name)
            continue
        p = by_name[name]
        face.set_registers(p.table, p.address, list(regs), unit=unit)
    return held


class VirtualRackSimulator:
    """The virtual rack in real time: Modbus faces (CDU, power shelves) + MQTT.

    Args:
        scenario: what to run.
        modbus_host, modbus_port, unit_id: where the CDU answers (port 0 picks a free one).
        shelf_modbus_port: where the power shelves answer (0: a free port; None: no shelf
            face). Only with the rack model.
        shelf_unit_ids: unit id of each shelf (default 1..shelves).
        mqtt: broker to publish on (None: no MQTT).
        identity: site/row/rack of the topics and payloads.
        register_map, shelf_register_map: the maps (default: bundled ``cdu-generic`` and
            ``power-shelf``).
        exit_at_end: stop when the scenario's duration is reached (else keep running on the
            scenario's last inputs).
        ground_truth_path: where to write the faults' ground truth (JSON) at the end.
        clock: monotonic for the 10 Hz tick, wall for payload timestamps.
        model: ``rack`` (default: the whole virtual rack) or ``cdu`` (the §4 model only: no
            shelf face, trays, power or env telemetry).
        telemetry_interval_s: publish period, s.
        link_ports: include every GPU's link ports in ``telemetry/trayNN``.
        commands: roles for the node-agent commands (default: every broker user is
            ``automation``, so racky and any lab tool may command the agents).
        node_agents: ``sim`` (default): the simulator's own node agents publish
            ``telemetry/trayNN`` and take ``set_power_limits``; ``external``: neither (a real
            tray agent reads the trays in this process through `step_hooks` and caps the GPUs'
            power limits, `sims.rack.NodeAgents.set_gpu_power_limit`; harness.simagent).

    ``step_hooks``: callables ``hook(rack, now_mono)`` run after every plant step (in the
    loop, synchronously; they must be quick); ``now_mono`` is the step's own time on the
    monotonic clock (the tick's start for an on-time step; earlier for the steps a late tick
    runs to catch up).

    Counters: ``steps_run`` (plant steps), ``steps_caught_up`` (of them, run by a late tick
    beyond its own), ``steps_dropped`` (owed beyond `MAX_BACKLOG_S`, never run).

    Raises:
        ValueError: ``model="cdu"`` for a scenario that needs the rack, bad unit ids.
        ConfigError: a register map cannot be loaded.
    """

    def __init__(
        self,
        scenario: Scenario,
        *,
        modbus_host: str = "127.0.0.1",
        modbus_port: int = 5020,
        unit_id: int = 1,
        shelf_modbus_port: int | None = 0,
        shelf_unit_ids: Sequence[int] | None = None,
        mqtt: MqttSettings | None = None,
        identity: Identity | None = None,
        register_map: RegisterMap | None = None,
        shelf_register_map: RegisterMap | None = None,
        exit_at_end: bool = False,
        ground_truth_path: Path | None = None,
        clock: Clock = SYSTEM_CLOCK,
        model: Literal["rack", "cdu"] = "rack",
        telemetry_interval_s: float = 1.0,
        link_ports: bool = True,
        commands: CommandSettings | None = None,
        node_agents: Literal["sim", "external"] = "sim",
    ):
        self.scenario = scenario
        self.run_ = ScenarioRun(scenario, model=model)
        self.rack = self.run_.rack
        self.clock = clock
        self.log = get_logger("sims.rack", scenario=scenario.name)
        self.regmap = register_map or load_register_map("cdu-generic")
        self._points = {p.name for p in self.regmap.points}
        # the controller-epoch fence on the Modbus face (sims.epoch_gate), when the map has
        # the register block
        self.epoch_gate: EpochGate | None = None
        if EPOCH_POINT in self.regmap.by_name:
            self.epoch_gate = EpochGate(lambda: self.run_.plant.fence, self.regmap,
                                        now=clock.monotonic, log=self.log)
        self.face = ModbusFace(
            self.regmap,
            unit_ids=(unit_id,),
            host=modbus_host,
            port=modbus_port,
            on_write=self._on_write,
            admit_write=self.epoch_gate.admit if self.epoch_gate is not None else None,
        )
        self.shelf_face: ModbusFace | None = None
        self.shelf_regmap: RegisterMap | None = None
        self.shelf_unit_ids: tuple[int, ...] = ()
        if self.rack is not None and shelf_modbus_port is not None:
            n = self.rack.shelves.params.shelves
            units = tuple(shelf_unit_ids) if shelf_unit_ids is not None else tuple(
                range(1, n + 1)
            )
            if len(units) != n or len(set(units)) != n:
                raise ValueError(f"shelf_unit_ids needs {n} distinct unit ids, got {units!r}")
            self.shelf_regmap = shelf_register_map or load_register_map("power-shelf")
            self.shelf_unit_ids = units
            self.shelf_face = ModbusFace(
                self.shelf_regmap, unit_ids=units, host=modbus_host, port=shelf_modbus_port
            )
        self.identity = identity or Identity()
        self.mqtt = MqttLink(mqtt, self.identity, "sim", clock=clock) if mqtt else None
        self.router: CommandRouter | None = None
        if self.mqtt is not None and self.rack is not None:
            self.router = CommandRouter(
                self.mqtt,
                commands or CommandSettings(default_role="automation"),
                clock=clock,
            )
            if node_agents == "sim":
                self.router.register("set_power_limits", SetPowerLimitsArgs,
                                     self._set_power_limits, role="automation")
            self.router.register(
                "get_power_limits", GetPowerLimitsArgs, self._get_power_limits, role="reader"
            )
            self.router.attach()
        if not telemetry_interval_s > 0.0:
            raise ValueError("telemetry_interval_s must be > 0")
        self.telemetry_interval_s = telemetry_interval_s
        self.link_ports = link_ports
        self.node_agents = node_agents
        self.step_hooks: list[Callable[[VirtualRack, float], None]] = []
        self.tick_cpu_s = 0.0  # CPU time of the plant ticks (step, hooks, faces, publish), s
        self.exit_at_end = exit_at_end
        self.ground_truth_path = ground_truth_path
        self.tick_stats = TickStats()
        self.steps_run = 0
        self.steps_caught_up = 0
        self.steps_dropped = 0
        self._step_index = 0  # steps of the schedule run or dropped
        self._t0_mono: float | None = None  # the first tick's time: step k is due at t0 + k dt
        self.rejected_writes = 0
        self._next_publish = 0.0
        self._announced_end = False
        self._faults_published = -1
        self._agents_version = -1
        self._protocol_version = -1
        self._local = False
        self._held: set[str] = set()

    # --- Modbus -------------------------------------------------------------------------------

    def _on_write(self, point: str, value: float) -> None:
        gate = self.epoch_gate
        try:
            # the epoch the face's gate admitted this write with (the plant's fence agrees)
            self.run_.plant.write(point, value,
                                  epoch=gate.current_epoch if gate is not None else None)
        except WriteRejected as err:
            self.rejected_writes += 1
            self.log.warning("plant_write_rejected", point=point, value=value, error=str(err))

    def _update(self, face: ModbusFace, regmap: RegisterMap, values: Mapping[str, float],
                unit: int | None = None) -> None:
        held = serve_values(face, regmap, values, self.run_.protocol.sentinel_points, unit)
        new_held = set(held) - self._held
        if new_held:
            self.log.warning("modbus_value_held", points=sorted(new_held),
                             note="not representable; the register keeps its last value")
        self._held = set(held)

    def serve(self) -> None:
        """Push the plant's current readings to the Modbus faces (done after every tick)."""
        readings = self.run_.plant.readings()
        self._update(self.face, self.regmap, {k: v for k, v in readings.items()
                                              if k in self._points})
        if self.epoch_gate is not None:
            self.epoch_gate.serve(self.face)
        local = bool(readings.get("local_control", 0.0))
        if local != self._local:
            self._local = local
            self.log.warning(
                "cdu_control_source",
                local_control=local,
                note="heartbeat lost" if local else "heartbeat back",
            )
        if self.shelf_face is not None and self.rack is not None and self.shelf_regmap:
            sh = self.rack.shelves
            for i, u in enumerate(self.shelf_unit_ids):
                self._update(self.shelf_face, self.shelf_regmap, sh.shelf_readings(i), unit=u)

    def apply_protocol(self) -> None:
        """Apply the scenario's protocol faults to the faces when they changed (every tick)."""
        pr = self.run_.protocol
        if pr.version == self._protocol_version:
            return
        self._protocol_version = pr.version
        for device, face in (("cdu", self.face), ("power", self.shelf_face)):
            if face is None:
                continue
            st: ModbusFaultState = pr.modbus[device]
            face.blackhole = st.blackhole
            face.reply_delay_s = st.reply_delay_s
            face.max_registers_per_request = st.max_registers
            face.clear_exceptions()
            for code, unit, table, address, count in st.exceptions.values():
                face.inject_exception(code, unit=unit, table=table,  # type: ignore[arg-type]
                                      address=address, count=count)
        if pr.version == 0:
            return  # the initial (healthy) state: nothing to report
        self.log.info(
            "protocol_faults",
            cdu=_describe(pr.modbus["cdu"]),
            power=_describe(pr.modbus["power"]),
            sentinels=sorted(pr.sentinel_points),
            mqtt_stopped=sorted(pr.mqtt_stopped),
        )

    # --- node-agent commands ------------------------------------------------------------------

    def _check_trays(self, trays: Sequence[int]) -> None:
        assert self.rack is not None
        _check_trays(self.rack, trays)

    def _set_power_limits(self, args: SetPowerLimitsArgs, ctx: CommandContext
                          ) -> dict[str, Any]:
        assert self.rack is not None
        apply_power_limits(self.rack, args)  # CommandError: the reply's code
        self.log.info("node_agents_set", user=ctx.user, trays=list(args.trays),
                      changes=args.changes(), release=list(args.release), epoch=args.epoch,
                      ttl_s=args.ttl_s)
        return set_power_limits_reply(self.rack.agents, args.trays, args.epoch)

    def _get_power_limits(self, args: GetPowerLimitsArgs, ctx: CommandContext
                          ) -> dict[str, Any]:
        assert self.rack is not None
        if args.trays is not None:
            self._check_trays(args.trays)
        return node_agents_payload(self.rack, args.trays)

    # --- ticking and publishing ---------------------------------------------------------------

    def _tick(self, now: float, done: asyncio.Event) -> None:
        c0 = time.thread_time()
        try:
            self._tick_body(now, done)
        finally:
            self.tick_cpu_s += time.thread_time() - c0

    def _tick_body(self, now: float, done: asyncio.Event) -> None:
        run = self.run_
        if run.done and not self._announced_end:
            self._announced_end = True
            self.log.info("scenario_complete", t_s=round(run.t_s, 1))
            self._write_ground_truth()
            if self.exit_at_end:
                done.set()
        for t_step in self._steps_due(now):
            run.step(SIM_DT_S)  # past the end: the scenario's last inputs, no new faults
            if self.rack is not None:
                for hook in self.step_hooks:
                    hook(self.rack, t_step)
        self.apply_protocol()
        self.serve()
        if self.mqtt is not None and now >= self._next_publish:
            self._next_publish = now + self.telemetry_interval_s
            self._publish()

    def _steps_due(self, now: float) -> list[float]:
        """The monotonic times of the plant steps this tick runs: every step due by ``now``
        and not run yet (at most `CATCH_UP_STEPS_PER_TICK`; a backlog beyond `MAX_BACKLOG_S`
        is dropped and counted first)."""
        if self._t0_mono is None:
            self._t0_mono = now
        # steps due by now; a tick may come a little before its step's time on this count
        # (the ticker's schedule, kept by adding the period, drifts from t0 + k dt by float
        # rounding: ~0.4 ms a day at a monotonic clock of weeks), so a quarter step counts
        due = math.floor((now - self._t0_mono) / SIM_DT_S + STEP_EARLY_FRACTION) + 1
        owed = due - self._step_index
        limit = round(MAX_BACKLOG_S / SIM_DT_S)
        if owed > limit:
            dropped = owed - limit
            self.steps_dropped += dropped
            self._step_index += dropped
            owed = limit
            self.log.warning("plant_backlog_dropped", dropped_s=round(dropped * SIM_DT_S, 1),
                             steps_dropped=self.steps_dropped,
                             note=f"the process was held up for more than {MAX_BACKLOG_S} s; "
                             "the plant's time now lags real time by the dropped steps")
        n = max(0, min(owed, CATCH_UP_STEPS_PER_TICK))
        if n > 1:
            self.steps_caught_up += n - 1
        first = self._step_index
        self._step_index += n
        self.steps_run += n
        t0 = self._t0_mono
        return [min(now, t0 + (first + i) * SIM_DT_S) for i in range(n)]

    def _publish(self) -> None:
        assert self.mqtt is not None
        run = self.run_
        pr = run.protocol
        ts = self.clock.wall_ns()
        ident = self.identity
        if pr.publishing("plant"):
            self.mqtt.publish_telemetry("plant", plant_payload(run, ts))
        vr = self.rack
        if vr is not None:
            if pr.publishing("rack"):
                self.mqtt.publish_telemetry("rack", rack_payload(vr, ident, ts))
            if pr.publishing("trays"):
                if self.node_agents == "sim":
                    for thing, payload in tray_payloads(vr, ident, ts, ports=self.link_ports):
                        self.mqtt.publish_telemetry(thing, payload)
                self.mqtt.publish_telemetry("truth", truth_payload(vr, ident, ts))
            if pr.publishing("power"):
                self.mqtt.publish_telemetry("power", power_payload(vr, ident, ts))
            if pr.publishing("env"):
                self.mqtt.publish_telemetry("env", env_payload(vr, ident, ts))
            if vr.agents.version != self._agents_version:
                self._agents_version = vr.agents.version
                self.mqtt.publish_state("node_agents", node_agents_payload(vr))
        self.mqtt.publish_state(
            "scenario",
            {
                "name": self.scenario.name,
                "t_s": round(run.t_s, 1),
                "duration_s": self.scenario.duration_s,
                "done": run.done,
            },
        )
        if len(run.ground_truth) != self._faults_published or run.done:
            self._faults_published = len(run.ground_truth)
            self.mqtt.publish_state("faults", {"faults": self.ground_truth()})

    def faces_state(self) -> dict[str, Any]:
        """Where the Modbus faces answer (``state/faces``)."""
        out: dict[str, Any] = {
            "cdu": {"host": self.face.host, "port": self.face.port,
                    "unit_ids": list(self.face.unit_ids),
                    "register_map": self.regmap.device.name},
            "power": None,
        }
        if self.shelf_face is not None and self.shelf_regmap is not None:
            out["power"] = {"host": self.shelf_face.host, "port": self.shelf_face.port,
                            "unit_ids": list(self.shelf_unit_ids),
                            "register_map": self.shelf_regmap.device.name}
        return out

    def ground_truth(self) -> list[dict[str, Any]]:
        """Faults injected so far, with plant-time start and end (s)."""
        return [
            {"kind": f.kind, "target": f.target, "start_s": f.start_s, "end_s": f.end_s}
            for f in self.run_.ground_truth
        ]

    def _write_ground_truth(self) -> None:
        if self.ground_truth_path is not None:
            self.ground_truth_path.write_text(
                json.dumps({"scenario": self.scenario.name, "faults": self.ground_truth()},
                           indent=2)
            )

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set (or the scenario ends with ``exit_at_end``).

        Raises:
            OSError: a Modbus port cannot be bound.
        """
        self.apply_protocol()
        self.serve()
        await self.face.start()
        try:
            if self.shelf_face is not None:
                await self.shelf_face.start()
        except BaseException:
            await self.face.stop()
            raise
        self.log.info(
            "simulator_started",
            scenario=self.scenario.name,
            model=self.run_.model,
            modbus_port=self.face.port,
            shelf_modbus_port=self.shelf_face.port if self.shelf_face else None,
            fabric=self.rack.has_fabric if self.rack is not None else False,
            duration_s=self.scenario.duration_s,
            load=self.run_.load.describe()
            if self.rack is None
            else self.rack.workload.describe(),
            mqtt=(f"{self.mqtt.settings.host}:{self.mqtt.settings.port}" if self.mqtt else None),
        )
        if self.mqtt is not None:
            self.mqtt.publish_state("faces", self.faces_state())
        done = asyncio.Event()
        async with asyncio.TaskGroup() as tg:
            mqtt_task = tg.create_task(self.mqtt.run(), name="mqtt") if self.mqtt else None
            ticker = tg.create_task(
                run_ticker(
                    SIM_DT_S, lambda now: self._tick(now, done), self.clock, self.tick_stats
                ),
                name="plant",
            )
            waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(done.wait())]
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for w in waiters:
                w.cancel()
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
            self._write_ground_truth()
            await self.face.stop()
            if self.shelf_face is not None:
                await self.shelf_face.stop()
            if self.mqtt is not None and mqtt_task is not None:
                await self.mqtt.stop()
                mqtt_task.cancel()
        self.log.info(
            "simulator_stopped", t_s=round(self.run_.t_s, 1), rejected_writes=self.rejected_writes
        )

    def reload(self) -> None:
        self.log.info("reload_ignored", note="the simulator has no reloadable config")


CduSimulator = VirtualRackSimulator
"""The first simulator's name (a CDU only); the virtual rack serves the same CDU face."""


def _describe(st: ModbusFaultState) -> dict[str, Any]:
    return {
        "half_open": st.blackhole,
        "reply_delay_s": st.reply_delay_s,
        "max_registers": st.max_registers,
        "exceptions": [list(e) for e in st.exceptions.values()],
    }
