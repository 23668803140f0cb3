"""racky the daemon: adapters around the pure core (DESIGN §1), on the daemon frame like
valvey (`rackplane.daemon.DaemonFrame`: MQTT link, telemetry writer, commands with leases and
audit, self-metrics, TaskGroup, ordered stop, SIGHUP reload, sd_notify).

Tasks in one TaskGroup: ``modbus:<shelf>`` (one owner task per power shelf, configured or
discovered), ``discovery`` (the unit-id scan, `racky.core.discovery`), ``mqtt`` (broker link),
``tsdb`` (spool and writer), ``tick`` (the 1 Hz tick). The tick never awaits the network: it
reads the latest shelf samples, tray readings (`racky.core.telemetry.TelemetryIngest`, fed by the
``<agents>/telemetry/trayNN`` subscription), the link frame and the cooling state (valvey's
``state/supply_loop``), calls `racky.core.controller.RackyCore.step`, and queues what it decided:
``set_power_limits`` commands to the node agents (``<agents>/cmd/<user>/set_power_limits``,
replies on ``.../result``), alarms, state and telemetry. READY goes out after the first tick;
the watchdog is fed by the tick.

Persisted state (`racky.persist.StateStore`: lifecycle, trays powered off by safety
requests, budget override, last validation) is written atomically in a worker thread whenever
the core says it changed; validation reports (`racky.report`) are written the same way.

Shutdown (SIGTERM): the tick stops, state is persisted, ``stopping`` is published, the spool is
fsynced and drained within ``tsdb.stop_budget_s``. The node agents keep the settings racky gave
them (caps stay in force without racky; a safety power-down stays down).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, Unpack

from rackplane.config import check_environment, check_writable_dir, load_config
from rackplane.core.alarms import AlarmEvent
from rackplane.core.registers import RegisterMap, load_register_map
from rackplane.core.samples import Quality, Sample
from rackplane.daemon import DaemonFrame, FrameOptions, OwnerTask
from rackplane.errors import ConfigError, MqttError
from rackplane.io.modbus import ModbusDevice
from rackplane.io.mqtt import Message, validate_topic
from rackplane.io.selfmetrics import (
    TELEMETRY_ALARMS,
    pv_age_s,
    telemetry_alarm_conditions,
)
from rackplane.io.spool import check_spool_config
from rackplane.settings import ModbusTargetSettings, effective_spool, environment_checks
from racky.commands import register_racky_commands
from racky.config import RackyConfig, ShelfPoints, state_path
from racky.core.agent_settings import AgentCommand
from racky.core.alarmbank import kind_of_def
from racky.core.controller import RackyCore
from racky.core.discovery import DiscoveryPlan
from racky.core.thermal import CoolingReading
from racky.core.validation import ValidationResult
from racky.persist import StateStore
from racky.report import write_report
from racky.tick import RackyTick, TickEffects

DAEMON = "racky"

__all__ = ["DAEMON", "Racky", "load_racky_config", "shelf_target"]


def _check_shelf_points(key: str, regmap: RegisterMap, pts: ShelfPoints) -> list[str]:
    names = {p.name for p in regmap.points}
    problems = []
    for field_name in ("output_power", "input_power", "available", "status", "rack_capacity",
                       "rack_load", "rack_redundant_feeds", "rack_spare_psus", "psus_ok"):
        point = getattr(pts, field_name)
        if point not in names:
            problems.append(f"shelf_points.{field_name}: point {point!r} is not in {key}'s "
                            f"register map {regmap.device.name}")
    for k in range(1, pts.psus_per_shelf + 1):
        for field_name in ("psu_temp", "psu_status"):
            point = getattr(pts, field_name).format(n=k)
            if point not in names:
                problems.append(f"shelf_points.{field_name}: point {point!r} is not in "
                                f"{key}'s register map {regmap.device.name}")
    return problems


def load_racky_config(path: str | os.PathLike[str] | None) -> RackyConfig:
    """Load the config and cross-check everything that would stop the daemon later: every
    shelf's (and discovery's) register map loads and has the points racky reads, secrets are
    set, TLS files exist, the spool, state-file and report directories are usable.

    Raises:
        ConfigError: with the key path named.
    """
    cfg = load_config(RackyConfig, path)
    problems: list[str] = []
    targets = [(f"power_shelves[{i}]", s.register_map) for i, s in enumerate(cfg.power_shelves)]
    if cfg.discovery.enabled:
        targets.append(("discovery", cfg.discovery.register_map))
    for key, rm in targets:
        try:
            regmap = load_register_map(rm)
        except ConfigError as err:
            problems.append(f"{key}.register_map: {err}")
            continue
        problems += _check_shelf_points(key, regmap, cfg.shelf_points)
    if cfg.mqtt.tls is not None:
        for k in ("ca_file", "cert_file", "key_file"):
            f = getattr(cfg.mqtt.tls, k)
            if f is not None and not Path(f).is_file():
                problems.append(f"mqtt.tls.{k}: {f} is not a readable file")
    if cfg.cooling.plant_topic is not None:
        try:
            validate_topic(cfg.cooling.plant_topic)
        except ValueError as err:
            problems.append(f"cooling.plant_topic: {err}")
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems),
                          problems=problems)
    check_environment(environment_checks(cfg.mqtt, cfg.tsdb))
    check_writable_dir("spool.directory", effective_spool(cfg.spool).directory)
    check_spool_config("spool.directory", effective_spool(cfg.spool).directory)
    check_writable_dir("lifecycle.state_file", state_path(cfg.lifecycle.state_file).parent)
    check_writable_dir("validation.report_dir", state_path(cfg.validation.report_dir))
    return cfg


def shelf_target(cfg: RackyConfig, unit: int) -> ModbusTargetSettings:
    """The Modbus target of discovery unit id ``unit`` (name ``<name_prefix><unit>``)."""
    d = cfg.discovery
    return ModbusTargetSettings(
        name=f"{d.name_prefix}{unit}", host=d.host, port=d.port, unit_id=unit,
        register_map=d.register_map, poll_interval_s=d.poll_interval_s, timeout_s=d.timeout_s,
        reconnect_max_s=max(d.poll_interval_s, 2.0),
    )


class Racky(DaemonFrame[RackyConfig]):
    """The racky daemon (see the module docstring).

    Args:
        cfg: validated config (`load_racky_config`).
        options: the frame's (`rackplane.daemon.FrameOptions`): ``clock``, ``notifier``,
            ``config_path`` (for SIGHUP).
    """

    daemon = DAEMON

    def __init__(
        self,
        cfg: RackyConfig,
        **options: Unpack[FrameOptions],
    ):
        super().__init__(cfg, **options)
        clock = self.clock
        self.store = StateStore(state_path(cfg.lifecycle.state_file),
                                cfg.lifecycle.initial_state)
        persisted = self.store.load(clock.wall_ns())
        for note in persisted.notes:
            self.log.error("state_file_unusable", note=note,
                           lifecycle=persisted.lifecycle.state)
        self._started = self.started_mono
        self.core = RackyCore(cfg, self._started, persisted)
        # The telemetry path's alarms (issue 7) are the daemon's, not the pure core's: fed
        # from the writer's stats in the tick.
        self.core.bank.add_kinds(kind_of_def(d) for d in TELEMETRY_ALARMS)
        # node-agent contract v1: racky's epoch is its start (ms since the Unix epoch): agents
        # drop commands of an older racky
        self.racky_tick = RackyTick(cfg, self.core, self._started,
                                   agent_epoch=clock.wall_ns() // 1_000_000)
        self.latest: dict[str, dict[str, Sample]] = self.racky_tick.latest
        self.devices: dict[str, ModbusDevice] = {}
        for s in cfg.power_shelves:
            self._add_device(s)
        self.plan: DiscoveryPlan | None = None
        if cfg.discovery.enabled:
            ex = [s.unit_id for s in cfg.power_shelves
                  if s.host == cfg.discovery.host and s.port == cfg.discovery.port]
            self.plan = DiscoveryPlan(cfg.discovery, ex)
        self._device_started: dict[str, float] = {}
        self.ingest = self.racky_tick.ingest
        topics = self.racky_tick.topics
        self.agent_base = topics.agent_base
        self.mqtt.subscribe(topics.telemetry, self._on_agent_telemetry, qos=0)
        self.mqtt.subscribe(topics.replies, self._on_agent_reply, qos=1)
        c = cfg.cooling
        self.cooling_topic = topics.cooling
        self.mqtt.subscribe(self.cooling_topic, self._on_cooling, qos=1)
        if c.plant_topic:
            self.mqtt.subscribe(c.plant_topic, self._on_plant, qos=0)
        # Leases (DESIGN §1, rackplane.core.leases): operator > automation, each with an expiry;
        # the safety verbs (power_down_*) never check them.
        outputs = {"rack_cap": "rack power cap requests", "rack_budget": "rack power budget",
                   "lifecycle": "rack lifecycle and validation",
                   **{f"tray:{k:02d}": f"tray {k} power" for k in range(self.core.n_trays)}}
        self.attach_commands(
            lease_outputs=outputs,
            register=lambda router, leases: register_racky_commands(
                router, self.core, send=self._send_agent_commands,
                on_alarm_events=self._alarms, lease_check=leases.check))
        self._pending = self.racky_tick.pending
        self.agent_stats = self.racky_tick.agent_stats
        self._send_failing = False
        self._bg: set[asyncio.Task[Any]] = set()
        self.reports: list[Path] = []

    @classmethod
    def load_config(cls, path: str | os.PathLike[str]) -> RackyConfig:
        """`load_racky_config` (for SIGHUP reload)."""
        return load_racky_config(path)

    # --- acquisition --------------------------------------------------------------------

    def _add_device(self, s: ModbusTargetSettings) -> ModbusDevice:
        self.latest[s.name] = {}

        def collect(samples: list[Sample], name: str = s.name) -> None:
            self.racky_tick.shelf_samples(name, samples)

        dev = ModbusDevice(s, clock=self.clock, on_samples=collect)
        self.devices[s.name] = dev
        return dev

    def _on_message(self, msg: Message) -> None:
        """Any of racky's input subscriptions: into the tick (`RackyTick.message`)."""
        self.racky_tick.message(msg.topic, msg.payload, retain=msg.retain,
                          received_mono=msg.received_mono or self.clock.monotonic(),
                          wall_ns=self.clock.wall_ns())  # wall-clock: age of a retained value
        self.log_records(self.racky_tick.take_logs())

    _on_agent_telemetry = _on_agent_reply = _on_cooling = _on_plant = _on_message

    def cooling_reading(self) -> CoolingReading | None:
        """The cooling reading the next tick uses (`RackyTick.cooling_reading`)."""
        return self.racky_tick.cooling_reading()

    def _apply(self, eff: TickEffects) -> None:
        """Apply a tick's effects: logs, agent commands (queued), alarms, states, lines."""
        self.log_records(eff.logs)
        for c in eff.agent_commands:
            try:
                task = asyncio.get_running_loop().create_task(
                    self._publish(c.topic, c.payload))
            except RuntimeError:  # no loop (tests driving the core directly)
                continue
            self._bg.add(task)
            task.add_done_callback(self._bg.discard)
        for aid, payload in eff.alarms:
            self.mqtt.publish_alarm(aid, payload)
        for thing, st in eff.states:
            self.mqtt.publish_state(thing, st)
            if thing == "rack":
                self.mqtt.publish_state("health", self.health())
        self.write_lines(eff.lines)

    # --- node-agent commands ------------------------------------------------------------

    def _send_agent_commands(self, cmds: list[AgentCommand]) -> None:
        """Queue ``set_power_limits`` for each command (never raises)."""
        self._apply(self.racky_tick.command_effects(cmds, self.clock.monotonic(),
                                                   self.clock.wall_ns()))

    async def _publish(self, topic: str, payload: dict[str, Any]) -> None:
        try:
            await self.mqtt.publish(topic, payload, qos=1)
            if self._send_failing:
                self._send_failing = False
                self.log.info("agent_command_send_recovered")
        except (MqttError, ValueError) as err:
            self.agent_stats["send_errors"] += 1
            if not self._send_failing:
                self._send_failing = True
                self.log.warning("agent_command_send_failed", error=str(err),
                                 note="reconciliation re-asserts once the agents report again")

    # --- the tick -----------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """The 1 Hz tick (the frame adds self-metrics, the watchdog and READY):
        `RackyTick.step`, its effects applied, state saves and reports spawned."""
        wall = self.clock.wall_ns()
        eff = self.racky_tick.step(now, wall, telemetry_alarm_conditions(self.writer.stats))
        self.leases.tick(now, {})  # racky's safety acts through SAFETY_VERBS, not leases
        self._apply(eff)
        if eff.save_state:
            self._spawn(self._save_state())
        if eff.validation_result is not None:
            self._spawn(self._write_report(eff.validation_result, wall))

    def pv_age_s(self, now: float) -> float | None:
        """Age of the rack power racky controls on, s: per shelf its newest sample, the
        oldest of those (None before any shelf reported)."""
        return pv_age_s([max(pts.values(), key=lambda x: x.t_mono)
                         for pts in self.latest.values() if pts], now)

    def modbus_devices(self) -> Sequence[ModbusDevice]:
        return tuple(self.devices.values())

    def ready_status(self) -> tuple[str, Mapping[str, Any]]:
        return "racky running", {"shelves": len(self.devices),
                                 "lifecycle": self.core.persisted.lifecycle.state}

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` in the background (awaited, bounded, at stop)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    async def _save_state(self) -> None:
        try:
            await asyncio.to_thread(self.store.save, self.core.persisted)
        except OSError as err:
            self.log.error("state_save_failed", path=str(self.store.path), error=str(err))

    async def _write_report(self, res: ValidationResult, wall: int) -> None:
        d = state_path(self.cfg.validation.report_dir) / f"{wall}-{res.stage}"
        try:
            p = await asyncio.to_thread(write_report, [res], d)
            self.reports.append(p)
            self.log.info("validation_report", passed=res.passed, stage=res.stage, path=str(p))
        except OSError as err:
            self.log.error("validation_report_failed", error=str(err), directory=str(d))

    def _alarms(self, events: list[AlarmEvent]) -> None:
        if events:
            self._apply(self.racky_tick.alarm_effects(events, self.clock.wall_ns()))

    def _publish_state(self, wall: int) -> None:
        self._apply(self.racky_tick.state_effects(wall))

    def health(self) -> dict[str, Any]:
        """Self-metrics for the retained ``state/health`` topic (``agents.payload_errors``:
        every refused tray message since start, whatever the reason: bad topic, oversize, not
        JSON, not the contract, a bad value; ``agents.stale_messages``: retained, duplicate
        and out-of-order ones)."""
        w = self.writer.stats
        return {
            "uptime_s": self.uptime_s(),
            "tick_late_max_s": round(self.tick_stats.late_max_s, 4),
            "tick_overruns": self.tick_stats.overruns,
            "shelves": {n: d.stats.as_dict() for n, d in self.devices.items()},
            "discovery": None if self.plan is None else {
                "found": self.plan.found(),
                "dormant": sorted(u for u, s in self.plan.state.items() if s == "dormant")},
            "agents": dict(self.agent_stats, pending=len(self._pending),
                           payload_errors=self.ingest.errors,
                           stale_messages=self.ingest.stale_messages,
                           ignored_fields=sorted(self.ingest.ignored_fields),
                           ignored_field_count=self.ingest.ignored_field_count),
            "mqtt_reconnects": self.mqtt.stats.reconnects,
            "commands": self.commands.stats.as_dict(),
            "spool": {"spooled_lines": w.spooled, "sent_lines": w.sent,
                      "depth_lines": w.depth_lines, "dropped_lines": w.dropped},
            "self": self.selfmetrics.status(),
        }

    # --- discovery ----------------------------------------------------------------------

    async def _discovery(self) -> None:
        plan = self.plan
        assert plan is not None
        cfg = self.cfg
        regmap = load_register_map(cfg.discovery.register_map)
        while True:
            now = self.clock.monotonic()
            for unit in plan.due(now):
                ok = await self._probe(unit, regmap)
                if plan.probe_result(unit, ok, self.clock.monotonic()):
                    self.log.info("shelf_found", unit=unit, host=cfg.discovery.host)
                    self._start_device(shelf_target(cfg, unit))
            for unit in plan.found():
                name = f"{cfg.discovery.name_prefix}{unit}"
                dev = self.devices.get(name)
                if dev is None:
                    continue
                last = dev.stats.last_ok_mono
                started = self._device_started.get(name, now)
                silent_since = last if last is not None else started
                if now - silent_since > cfg.discovery.dormant_after_s:
                    plan.went_dormant(unit, now)
                    self.log.warning("shelf_dormant", unit=unit,
                                     note=f"re-probed every {cfg.discovery.reprobe_dormant_s} s")
                    self.stop_task(f"modbus:{name}")
                    self.racky_tick.shelf_samples(name, [
                        s.as_stale("dormant") if s.quality is Quality.GOOD else s
                        for s in self.latest.get(name, {}).values()])
            await asyncio.sleep(1.0)

    async def _probe(self, unit: int, regmap: RegisterMap) -> bool:
        dev = ModbusDevice(shelf_target(self.cfg, unit), regmap, clock=self.clock,
                           on_samples=lambda s: None)
        try:
            samples = await asyncio.wait_for(dev.read_once(), self.cfg.discovery.timeout_s * 4)
        except Exception as err:  # a probe failing is the normal case (no such unit)
            self.log.debug("probe_failed", unit=unit, error=repr(err))
            return False
        return any(s.usable for s in samples)

    def _start_device(self, s: ModbusTargetSettings) -> None:
        dev = self._add_device(s)
        self._device_started[s.name] = self.clock.monotonic()
        self.start_task(f"modbus:{s.name}", dev.run)

    # --- lifecycle (the frame's hooks) ---------------------------------------------------

    def start_fields(self) -> Mapping[str, Any]:
        c = self.cfg
        return {"shelves": list(self.devices), "discovery": c.discovery.enabled,
                "agents": self.agent_base, "broker": f"{c.mqtt.host}:{c.mqtt.port}",
                "tsdb": c.tsdb.url or "embedded spool",
                "lifecycle": self.core.persisted.lifecycle.state,
                "state_file": str(self.store.path)}

    def owner_tasks(self) -> Sequence[OwnerTask]:
        tasks = [OwnerTask(f"modbus:{name}", d.run) for name, d in self.devices.items()]
        if self.plan is not None:
            tasks.append(OwnerTask("discovery", self._discovery))
        return tasks

    @property
    def _device_tasks(self) -> dict[str, asyncio.Task[Any]]:
        """The running shelf owner tasks by shelf name."""
        return {n.removeprefix("modbus:"): t for n, t in self.tasks.items()
                if n.startswith("modbus:")}

    async def stop_outputs(self) -> None:
        """No stop writes: the node agents keep the settings racky gave them. A stop
        mid-sequence says what was not switched; discovery stops."""
        pending = self.core.seq.pending
        if pending:  # a stop mid-sequence: say what was not switched (not persisted)
            self.log.warning("sequence_interrupted",
                             not_switched=[{"tray": k, "on": on} for k, on in pending],
                             note="these trays keep their state; re-send the power command")
        self.stop_task("discovery")

    async def save_state_at_stop(self) -> None:
        """The persisted state, then the background saves and reports, each within
        ``control.stop_budget_s``."""
        with contextlib.suppress(OSError, TimeoutError):
            await asyncio.wait_for(asyncio.to_thread(self.store.save, self.core.persisted),
                                   self.cfg.control.stop_budget_s)
        if self._bg:
            await asyncio.wait(list(self._bg), timeout=self.cfg.control.stop_budget_s)

    def publish_final_state(self) -> None:
        self._publish_state(self.clock.wall_ns())

    def final_counts(self) -> Mapping[str, Any]:
        return {"agent_commands": self.agent_stats}
