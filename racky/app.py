"""racky the daemon: adapters around the pure core (DESIGN §1), built like valvey.

Tasks in one TaskGroup: ``modbus:<shelf>`` (one owner task per power shelf, configured or
discovered), ``discovery`` (the unit-id scan, `racky.core.discovery`), ``mqtt`` (broker link),
``tsdb`` (spool and writer), ``tick`` (the 1 Hz tick). The tick never awaits the network: it
reads the latest shelf samples, tray readings (`racky.core.telemetry.TelemetryIngest`, fed by the
``<agents>/telemetry/trayNN`` subscription), the link frame and the cooling state (valvey's
``state/supply_loop``), calls `racky.core.controller.RackyCore.step`, and queues what it decided:
``set_power_limits`` commands to the node agents (``<agents>/cmd/<user>/set_power_limits``,
replies on ``.../result``), alarms, state and telemetry. READY goes out after the first tick;
the watchdog is fed by the tick.

Persisted state (`racky.core.lifecycle.StateStore`: lifecycle, trays powered off by safety
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
from pathlib import Path
from typing import Any

from rackplane.clock import SYSTEM_CLOCK, Clock
from rackplane.commands import CommandAudit, CommandRouter, LeaseGate
from rackplane.config import check_environment, check_writable_dir, load_config
from rackplane.core.alarms import AlarmEvent
from rackplane.core.leases import LeaseTable
from rackplane.core.registers import RegisterMap, load_register_map
from rackplane.core.samples import Quality, Sample
from rackplane.errors import ConfigError, MqttError
from rackplane.io.modbus import ModbusDevice
from rackplane.io.mqtt import Message, MqttLink, validate_topic
from rackplane.io.selfmetrics import (
    TELEMETRY_ALARMS,
    SelfMetrics,
    pv_age_s,
    telemetry_alarm_conditions,
)
from rackplane.io.service import Notifier, TickStats, run_ticker, supervised
from rackplane.io.spool import check_spool_config
from rackplane.io.tsdb import TelemetryWriter
from rackplane.log import configure_logging, get_logger
from rackplane.settings import ModbusTargetSettings, effective_spool, environment_checks
from racky.commands import register_racky_commands
from racky.config import RackyConfig, ShelfPoints, state_path
from racky.core.alarmbank import kind_of_def
from racky.core.controller import RackyCore
from racky.core.discovery import DiscoveryPlan
from racky.core.lifecycle import StateStore
from racky.core.power import AgentCommand
from racky.core.thermal import CoolingReading
from racky.core.validation import ValidationResult
from racky.report import write_report
from racky.tick import LogRecord, RackyTick, TickEffects

DAEMON = "racky"


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


def _shelf_target(cfg: RackyConfig, unit: int) -> ModbusTargetSettings:
    d = cfg.discovery
    return ModbusTargetSettings(
        name=f"{d.name_prefix}{unit}", host=d.host, port=d.port, unit_id=unit,
        register_map=d.register_map, poll_interval_s=d.poll_interval_s, timeout_s=d.timeout_s,
        reconnect_max_s=max(d.poll_interval_s, 2.0),
    )


class Racky:
    """The racky daemon (see the module docstring).

    Args:
        cfg: validated config (`load_racky_config`).
        clock: injected clocks; notifier: systemd notification; config_path: for SIGHUP.
    """

    def __init__(
        self,
        cfg: RackyConfig,
        *,
        clock: Clock = SYSTEM_CLOCK,
        notifier: Notifier | None = None,
        config_path: str | os.PathLike[str] | None = None,
    ):
        self.cfg = cfg
        self.clock = clock
        self.config_path = config_path
        self.notifier = notifier or Notifier(clock)
        self.log = get_logger(DAEMON)
        ident = cfg.identity
        self.tags_base = {"site": ident.site, "row": ident.row, "rack": ident.rack}
        self.store = StateStore(state_path(cfg.lifecycle.state_file),
                                cfg.lifecycle.initial_state)
        persisted = self.store.load(clock.wall_ns())
        for note in persisted.notes:
            self.log.error("state_file_unusable", note=note,
                           lifecycle=persisted.lifecycle.state)
        self._started = clock.monotonic()
        self.core = RackyCore(cfg, self._started, persisted)
        # The telemetry path's alarms (issue 7) are the daemon's, not the pure core's: fed
        # from the writer's stats in the tick.
        self.core.bank.add_kinds(kind_of_def(d) for d in TELEMETRY_ALARMS)
        self.rack_tick = RackyTick(cfg, self.core, self._started)
        self.latest: dict[str, dict[str, Sample]] = self.rack_tick.latest
        self.devices: dict[str, ModbusDevice] = {}
        for s in cfg.power_shelves:
            self._add_device(s)
        self.plan: DiscoveryPlan | None = None
        if cfg.discovery.enabled:
            ex = [s.unit_id for s in cfg.power_shelves
                  if s.host == cfg.discovery.host and s.port == cfg.discovery.port]
            self.plan = DiscoveryPlan(cfg.discovery, ex)
        self._device_tasks: dict[str, asyncio.Task[None]] = {}
        self._device_started: dict[str, float] = {}
        self._tg: asyncio.TaskGroup | None = None
        a = cfg.node_agents
        self.ingest = self.rack_tick.ingest
        self.mqtt = MqttLink(cfg.mqtt, ident, DAEMON, clock=clock)
        root = f"{cfg.mqtt.topic_root}/{ident.site}/{ident.rack}"
        self.agent_base = f"{root}/{a.daemon}"
        self.agent_user = cfg.command_user
        self.mqtt.subscribe(f"{self.agent_base}/telemetry/+", self._on_agent_telemetry, qos=0)
        self.mqtt.subscribe(f"{self.agent_base}/cmd/{self.agent_user}/+/result",
                            self._on_agent_reply, qos=1)
        c = cfg.cooling
        self.cooling_topic = f"{root}/{c.daemon}/state/{c.state_thing}"
        self.mqtt.subscribe(self.cooling_topic, self._on_cooling, qos=1)
        if c.plant_topic:
            self.mqtt.subscribe(c.plant_topic, self._on_plant, qos=0)
        self.writer = TelemetryWriter(
            cfg.tsdb, effective_spool(cfg.spool), identity_tags=self.tags_base, clock=clock
        )
        self.commands = CommandRouter(self.mqtt, cfg.commands, clock=clock,
                                      audit=self._audit_command)
        # Leases (DESIGN §1, rackplane.core.leases): operator > automation, each with an expiry;
        # the safety verbs (power_down_*) never check them.
        outputs = {"rack_cap": "rack power cap requests", "rack_budget": "rack power budget",
                   "lifecycle": "rack lifecycle and validation",
                   **{f"tray:{k:02d}": f"tray {k} power" for k in range(self.core.n_trays)}}
        self.leases = LeaseGate(self.commands, LeaseTable(
            outputs, default_ttl_s=cfg.commands.lease_default_ttl_s,
            max_ttl_s=cfg.commands.lease_max_ttl_s))
        register_racky_commands(self.commands, self.core, send=self._send_agent_commands,
                                on_alarm_events=self._alarms, lease_check=self.leases.check)
        self.commands.attach()
        self.tick_stats = TickStats()
        self.selfmetrics = SelfMetrics(DAEMON, cfg.metrics, clock=clock)
        self._pending = self.rack_tick.pending
        self.agent_stats = self.rack_tick.agent_stats
        self._send_failing = False
        self._bg: set[asyncio.Task[Any]] = set()
        self.first_step_done = asyncio.Event()
        self.reports: list[Path] = []

    # --- acquisition --------------------------------------------------------------------

    def _add_device(self, s: ModbusTargetSettings) -> ModbusDevice:
        self.latest[s.name] = {}

        def collect(samples: list[Sample], name: str = s.name) -> None:
            self.latest[name] = {x.point: x for x in samples}

        dev = ModbusDevice(s, clock=self.clock, on_samples=collect)
        self.devices[s.name] = dev
        return dev

    def _on_message(self, msg: Message) -> None:
        """Any of racky's input subscriptions: into the tick (`RackyTick.message`)."""
        self.rack_tick.message(msg.topic, msg.payload, retain=msg.retain,
                          received_mono=msg.received_mono or self.clock.monotonic(),
                          wall_ns=self.clock.wall_ns())  # wall-clock: age of a retained value
        self._log_records(self.rack_tick.take_logs())

    _on_agent_telemetry = _on_agent_reply = _on_cooling = _on_plant = _on_message

    def cooling_reading(self) -> CoolingReading | None:
        """The cooling reading the next tick uses (`RackyTick.cooling_reading`)."""
        return self.rack_tick.cooling_reading()

    def _log_records(self, records: list[LogRecord]) -> None:
        for r in records:
            getattr(self.log, r.level)(r.event, **r.fields)

    def _apply(self, eff: TickEffects) -> None:
        """Apply a tick's effects: logs, agent commands (queued), alarms, states, lines."""
        self._log_records(eff.logs)
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
        w = self.writer
        for ln in eff.lines:
            w.write(ln.measurement, ln.tags, ln.fields, ln.wall_ns)

    # --- node-agent commands ------------------------------------------------------------

    def _send_agent_commands(self, cmds: list[AgentCommand]) -> None:
        """Queue ``set_power_limits`` for each command (never raises)."""
        self._apply(self.rack_tick.command_effects(cmds, self.clock.monotonic(),
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

    def _tick(self, now: float) -> None:
        wall = self.clock.wall_ns()
        eff = self.rack_tick.step(now, wall, telemetry_alarm_conditions(self.writer.stats))
        self.leases.tick(now, {})  # racky's safety acts through SAFETY_VERBS, not leases
        self._apply(eff)
        self.selfmetrics.tick(now, tick_stats=self.tick_stats, writer=self.writer,
                              mqtt=self.mqtt, commands=self.commands,
                              devices=list(self.devices.values()),
                              pv_age_s=self.pv_age_s(now))
        if eff.save_state:
            self._spawn(self._save_state())
        if eff.validation_result is not None:
            self._spawn(self._write_report(eff.validation_result, wall))
        self.notifier.tick()
        if not self.first_step_done.is_set():
            self.first_step_done.set()
            self.notifier.ready("racky running")
            self.log.info("ready", shelves=len(self.devices),
                          lifecycle=self.core.persisted.lifecycle.state)

    def pv_age_s(self, now: float) -> float | None:
        """Age of the rack power racky controls on, s: per shelf its newest sample, the
        oldest of those (None before any shelf reported)."""
        return pv_age_s([max(pts.values(), key=lambda x: x.t_mono)
                         for pts in self.latest.values() if pts], now)

    def _spawn(self, coro: Any) -> None:
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
            self._apply(self.rack_tick.alarm_effects(events, self.clock.wall_ns()))

    def _audit_command(self, audit: CommandAudit) -> None:
        self.writer.write("command", audit.tags(), audit.fields(), audit.wall_ns)

    def _publish_state(self, wall: int) -> None:
        self._apply(self.rack_tick.state_effects(wall))

    def health(self) -> dict[str, Any]:
        """Self-metrics for the retained ``state/health`` topic (``agents.payload_errors``:
        every refused tray message since start, whatever the reason: bad topic, oversize, not
        JSON, not the contract, a bad value; ``agents.stale_messages``: retained, duplicate
        and out-of-order ones)."""
        w = self.writer.stats
        return {
            "uptime_s": round(self.clock.monotonic() - self._started, 1),
            "tick_late_max_s": round(self.tick_stats.late_max_s, 4),
            "tick_overruns": self.tick_stats.overruns,
            "shelves": {n: d.stats.as_dict() for n, d in self.devices.items()},
            "discovery": None if self.plan is None else {
                "found": self.plan.found(),
                "dormant": sorted(u for u, s in self.plan.state.items() if s == "dormant")},
            "agents": dict(self.agent_stats, pending=len(self._pending),
                           payload_errors=self.ingest.errors,
                           stale_messages=self.ingest.stale_messages),
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
                    self._start_device(_shelf_target(cfg, unit))
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
                    task = self._device_tasks.pop(name, None)
                    if task is not None:
                        task.cancel()
                    self.latest[name] = {
                        k: s.as_stale("dormant") if s.quality is Quality.GOOD else s
                        for k, s in self.latest.get(name, {}).items()}
            await asyncio.sleep(1.0)

    async def _probe(self, unit: int, regmap: RegisterMap) -> bool:
        dev = ModbusDevice(_shelf_target(self.cfg, unit), regmap, clock=self.clock,
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
        if self._tg is not None:
            self._device_tasks[s.name] = self._tg.create_task(
                supervised(f"modbus:{s.name}", dev.run, self.log)(), name=f"modbus:{s.name}")

    # --- lifecycle ----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set, then shut down (see the module docstring)."""
        self.log.info(
            "starting", shelves=list(self.devices), discovery=self.cfg.discovery.enabled,
            agents=self.agent_base, broker=f"{self.cfg.mqtt.host}:{self.cfg.mqtt.port}",
            tsdb=self.cfg.tsdb.url or "embedded spool",
            lifecycle=self.core.persisted.lifecycle.state, state_file=str(self.store.path),
        )
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            for name, d in self.devices.items():
                self._device_tasks[name] = tg.create_task(
                    supervised(f"modbus:{name}", d.run, self.log)(), name=f"modbus:{name}")
            disc = None
            if self.plan is not None:
                disc = tg.create_task(supervised("discovery", self._discovery, self.log)(),
                                      name="discovery")
            mqtt_task = tg.create_task(supervised("mqtt", self.mqtt.run, self.log)(), name="mqtt")
            writer_task = tg.create_task(supervised("tsdb", self.writer.run, self.log)(),
                                         name="tsdb")
            tick = tg.create_task(
                run_ticker(self.cfg.control.tick_s, self._tick, self.clock, self.tick_stats),
                name="tick",
            )
            await stop.wait()
            self.notifier.stopping("stopping")
            tick.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await tick
            pending = self.core.seq.pending
            if pending:  # a stop mid-sequence: say what was not switched (not persisted)
                self.log.warning("sequence_interrupted",
                                 not_switched=[{"tray": k, "on": on} for k, on in pending],
                                 note="these trays keep their state; re-send the power command")
            if disc is not None:
                disc.cancel()
            with contextlib.suppress(OSError):
                await asyncio.wait_for(asyncio.to_thread(self.store.save, self.core.persisted),
                                       self.cfg.control.stop_budget_s)
            if self._bg:
                await asyncio.wait(list(self._bg), timeout=self.cfg.control.stop_budget_s)
            self._publish_state(self.clock.wall_ns())
            await self.mqtt.stop()
            mqtt_task.cancel()
            await self.writer.close()
            writer_task.cancel()
            for t in self._device_tasks.values():
                t.cancel()
            self._tg = None
        self.log.info("stopped", agent_commands=self.agent_stats)

    def reload(self) -> None:
        """SIGHUP: command roles and logging apply at once; other sections need a restart."""
        if self.config_path is None:
            self.log.info("reload_skipped", reason="running on embedded defaults")
            return
        self.notifier.reloading()
        try:
            cfg = load_racky_config(self.config_path)
        except ConfigError as err:
            self.log.error("reload_rejected", error=str(err))
            self.notifier.status("reload rejected: config invalid; running config kept")
            return
        self.commands.update_settings(cfg.commands)
        if cfg.log != self.cfg.log:
            configure_logging(cfg.log.level, cfg.log.format)
        changed = [k for k in type(cfg).model_fields
                   if k not in ("commands", "log") and getattr(cfg, k) != getattr(self.cfg, k)]
        if changed:
            self.log.warning("reload_needs_restart", sections=changed)
        self.cfg = cfg.model_copy(update={k: getattr(self.cfg, k) for k in changed})
        self.log.info("reloaded", applied=["commands", "log"], kept=changed)
        self.notifier.reloaded()
