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

One instance of a redundant pair (``[leadership] enabled = true``, issue 15; the frame runs
the lease and the state sync, `racky.pair` holds racky's part): only while active does it
send commands to the node agents (epoch ``2**62 + `` its lease epoch; on each new tenure
every tray gets its settings at the first tick, so the agents learn the epoch at once and
refuse the old active's), answer commands, and publish the rack's shared state, alarms and
telemetry; as standby its core runs in shadow (reads the shelves and the agents' telemetry,
computes, counts the commands it would send) and follows the active's state record;
it publishes only ``status/<instance>`` and ``state/pair_<instance>``.

Shutdown (SIGTERM): the tick stops, state is persisted, ``stopping`` is published, the spool is
fsynced and drained within ``tsdb.stop_budget_s``. The node agents keep the settings racky gave
them (caps stay in force without racky; a safety power-down stays down).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, Unpack

from rackplane.config import (
    check_environment,
    check_writable_dir,
    identity_required,
    load_config,
    require_keys,
)
from rackplane.config_errors import ProblemList
from rackplane.core.alarms import AlarmEvent
from rackplane.core.budget_leases import PairTag
from rackplane.core.envelope import alarm_payload
from rackplane.core.registers import RegisterMap, load_register_map
from rackplane.core.samples import Quality, Sample
from rackplane.daemon import DaemonFrame, FrameOptions, OwnerTask
from rackplane.errors import ConfigError, MqttError
from rackplane.io.modbus import ModbusDevice, ModbusLinks
from rackplane.io.mqtt import Message, validate_topic
from rackplane.io.selfmetrics import (
    TELEMETRY_ALARMS,
    pv_age_s,
    telemetry_alarm_conditions,
)
from rackplane.io.spool import check_spool_config
from rackplane.settings import ModbusTargetSettings, environment_checks, spool_folder
from racky.commands import register_racky_commands
from racky.config import RackyConfig, ShelfPoints, state_path
from racky.core.agent_settings import AgentCommand
from racky.core.alarmbank import kind_of_def
from racky.core.controller import RackyCore
from racky.core.discovery import DiscoveryPlan
from racky.core.linkrate import RateDesign
from racky.core.links import rate_design
from racky.core.thermal import CoolingReading
from racky.core.validation import ValidationResult
from racky.fleet import FleetLink
from racky.pair import agent_epoch, apply_sync_state, sync_state
from racky.persist import LEGACY_STATE_FILE, StateStore, lifecycle_state_file
from racky.report import write_report
from racky.tick import RackyTick, TickEffects

DAEMON = "racky"

__all__ = ["DAEMON", "Racky", "input_warnings", "load_racky_config", "shelf_target"]


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


def input_warnings(cfg: RackyConfig) -> list[str]:
    """What is unusual in racky's inputs but not fatal (``--check-config`` prints it, the
    daemon logs it at start): no power shelf configured and discovery off (the node agents
    alone are read: racky can still cap the trays)."""
    if cfg.power_shelves or cfg.discovery.enabled:
        return []
    return ["no power shelves: power_shelves is empty and discovery is off; racky reads no "
            "rack power, PSU or AC status (no psu_*, shelf_*, capacity alarms; the rack power "
            "is the trays' sum + node_agents.non_tray_power_w only while every tray reports): "
            "configure [[power_shelves]] or enable [discovery]"]


def load_racky_config(path: str | os.PathLike[str] | None) -> RackyConfig:
    """Load the config and cross-check everything that would stop the daemon later: the file
    names racky's identity (``identity.site``, ``identity.rack``: the defaults are examples,
    `rackplane.config.identity_required`), every shelf's (and discovery's) register map loads
    and has the points racky reads, secrets are set, TLS files exist, the spool, state-file and
    report directories are usable.

    Raises:
        ConfigError: with the key path named.
    """
    problems = ProblemList()  # every problem at once (rackplane.config_errors)
    cfg = load_config(RackyConfig, path,
                      required=lambda d: require_keys(d, identity_required("racky")),
                      example="config/racky.example.toml", problems=problems)
    targets = [(f"power_shelves[{i}]", s.register_map) for i, s in enumerate(cfg.power_shelves)]
    if cfg.discovery.enabled:
        targets.append(("discovery", cfg.discovery.register_map))
    for key, rm in targets:
        try:
            regmap = load_register_map(rm)
        except ConfigError as err:
            problems.add(f"{key}.register_map: {err}")
            continue
        problems.lines += _check_shelf_points(key, regmap, cfg.shelf_points)
    if cfg.mqtt.tls is not None:
        for k in ("ca_file", "cert_file", "key_file"):
            f = getattr(cfg.mqtt.tls, k)
            if f is not None and not Path(f).is_file():
                problems.add(f"mqtt.tls.{k}: {f} is not a readable file")
    if cfg.cooling.plant_topic is not None:
        try:
            validate_topic(cfg.cooling.plant_topic)
        except ValueError as err:
            problems.add(f"cooling.plant_topic: {err}")
    with problems.check():
        check_environment({**environment_checks(cfg.mqtt, cfg.tsdb),
                           **cfg.leadership.environment_checks(),
                           **(cfg.fleet.password_env_check("fleet") if cfg.fleet.enabled
                              else {})})
    spool_dir = spool_folder(cfg.spool, daemon="racky", identity=cfg.identity)
    with problems.check():
        check_writable_dir("spool.directory", spool_dir)
        check_spool_config("spool.directory", spool_dir)
    with problems.check():
        check_writable_dir("lifecycle.state_file", lifecycle_state_file(cfg).parent)
    with problems.check():
        check_writable_dir("validation.report_dir", state_path(cfg.validation.report_dir))
    problems.raise_if_any()
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

    def _state_file(self) -> Path:
        """`lifecycle_state_file`; on the default per-rack name, a state file left under the
        old shared default name (``racky-state.json``) beside it and no per-rack one yet is
        taken over (renamed) and logged, so an upgrade keeps its lifecycle and the trays
        safety requests powered off."""
        path = lifecycle_state_file(self.cfg)
        if self.cfg.lifecycle.state_file is not None:
            return path
        legacy = path.with_name(LEGACY_STATE_FILE.name)
        if legacy.exists() and not path.exists():
            try:
                os.replace(legacy, path)
            except OSError as err:
                self.log.error("state_file_legacy_left", legacy=str(legacy), path=str(path),
                               error=str(err), fix="rename it, or set lifecycle.state_file")
            else:
                self.log.warning(
                    "state_file_legacy_adopted", legacy=str(legacy), path=str(path),
                    note="the state file is one per rack now; if another racky ran from "
                    "this folder, check the lifecycle state (get_state) is this rack's")
        return path

    def __init__(
        self,
        cfg: RackyConfig,
        **options: Unpack[FrameOptions],
    ):
        super().__init__(cfg, **options)
        clock = self.clock
        self.store = StateStore(self._state_file(), cfg.lifecycle.initial_state)
        persisted = self.store.load(clock.wall_ns())
        for note in persisted.notes:
            self.log.error("state_file_unusable", note=note,
                           lifecycle=persisted.lifecycle.state)
        self._started = self.started_mono
        self.core = RackyCore(cfg, self._started, persisted)
        # The telemetry path's alarms (issue 7) are the daemon's, not the pure core's: fed
        # from the writer's stats in the tick.
        self.core.bank.add_kinds(kind_of_def(d) for d in TELEMETRY_ALARMS)
        # node-agent contract v1: racky's epoch is its start (ms since the Unix epoch; one of
        # a pair: 2**62 + its lease epoch, racky.pair): agents drop commands of an older one
        self._start_ms = clock.wall_ns() // 1_000_000  # wall-clock: the epoch, not timing
        ls = self.leadership_settings()
        self.racky_tick = RackyTick(
            cfg, self.core, self._started, agent_epoch=agent_epoch(self._start_ms, 0),
            request_prefix="racky" if ls is None else f"racky-{ls.instance}")
        self.racky_tick.sending = ls is None  # one of a pair: once active
        self._sync_refused: str | None = None
        self.latest: dict[str, dict[str, Sample]] = self.racky_tick.latest
        self.devices: dict[str, ModbusDevice] = {}
        # shelves behind one gateway (same host:port) share one connection (issue 14 item 5)
        self.links = ModbusLinks()
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
        #: learned-rate threshold grids handed to the worker thread (`_prepare_grids`; a few
        #: keys per process: the per-port design and one pooled design per part size)
        self._grids_tried: set[tuple[Any, ...]] = set()
        self._grid_thread: threading.Thread | None = None
        self.reports: list[Path] = []
        #: fleet mode (issue 16, ``[fleet] enabled``): rlc's budget lease (`racky.fleet`)
        self.fleet: FleetLink | None = None
        if cfg.fleet.enabled:
            self.fleet = FleetLink(cfg.fleet, cfg.identity.site, cfg.identity.rack,
                                   clock=clock)
            self.fleet.wake_tick = self.wake_tick  # a decrease, its read-back: tick now
            self.core.fleet_budget_w = self.fleet.dc_budget_w()
            if ls is not None:  # one of a pair: only the active writes the report
                self.fleet.reporting = False
                self.fleet.fence = lambda: self.may_write(self.clock.monotonic())

    @classmethod
    def load_config(cls, path: str | os.PathLike[str]) -> RackyConfig:
        """`load_racky_config` (for SIGHUP reload)."""
        return load_racky_config(path)

    # --- acquisition --------------------------------------------------------------------

    def _add_device(self, s: ModbusTargetSettings) -> ModbusDevice:
        self.latest[s.name] = {}

        def collect(samples: list[Sample], name: str = s.name) -> None:
            self.racky_tick.shelf_samples(name, samples)

        link = self.links.get(s)
        old = self.devices.get(s.name)
        if old is not None:  # restarted after discovery found it again
            link.leave(old)
        dev = ModbusDevice(s, clock=self.clock, on_samples=collect, link=link)
        self.devices[s.name] = dev
        return dev

    def _on_message(self, msg: Message) -> None:
        """Any of racky's input subscriptions: into the tick (`RackyTick.message`)."""
        self.racky_tick.message(msg.topic, msg.payload, retain=msg.retain,
                          received_mono=msg.received_mono or self.clock.monotonic(),
                          wall_ns=self.clock.wall_ns())  # wall-clock: age of a retained value
        self.log_records(self.racky_tick.take_logs())

    _on_agent_reply = _on_cooling = _on_plant = _on_message

    def _on_agent_telemetry(self, msg: Message) -> None:
        """A tray's telemetry (`_on_message`); a cap read back lower goes to the fleet side."""
        self._on_message(msg)
        if self.racky_tick.take_readback_lowered() and self.fleet is not None:
            self.fleet.readback_lowered()

    def cooling_reading(self) -> CoolingReading | None:
        """The cooling reading the next tick uses (`RackyTick.cooling_reading`)."""
        return self.racky_tick.cooling_reading()

    def _apply(self, eff: TickEffects) -> None:
        """Apply a tick's effects: logs, agent commands (queued), alarms, states, lines (a
        pair's standby: logs only; its commands were withheld by the tick)."""
        self.log_records(eff.logs)
        if not self.is_active:
            return
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
        if self.role is not None:
            self._pair_epoch()
        if self.fleet is not None:
            self.core.fleet_budget_w = self.fleet.dc_budget_w()
        self.core.judge_epoch = self.controller_epoch  # a campaign result's judge epoch
        if self.is_active and self.core.drop_lost_validation(wall):
            self.log.warning("validation_lost", reason="racky restarted or failed over while "
                             "validating: the run is gone, the lifecycle went back")
        eff = self.racky_tick.step(now, wall, telemetry_alarm_conditions(self.writer.stats))
        if self.fleet is not None:  # a standby reports nothing to rlc
            if self.is_active:
                ls, epoch = self.leadership_settings(), self.controller_epoch
                pair = PairTag(ls.instance, epoch) if ls is not None and epoch >= 1 else None
                self.fleet.observe_core(self.core, pair)
            self.fleet.reporting = self.is_active
        if self.is_active:
            self.leases.tick(now, {})  # racky's safety acts through SAFETY_VERBS, not leases
        else:  # a pair's standby: the same lease rules, nothing published (the active's)
            self.leases.table.expire(now)
            self.leases.table.drain_events()
        self._apply(eff)
        self._prepare_grids()
        if eff.save_state:
            self._spawn(self._save_state())
        if eff.validation_result is not None and self.is_active:
            self._spawn(self._write_report(eff.validation_result, wall))

    # --- one of a pair (racky.pair) --------------------------------------------------------

    def _pair_epoch(self) -> None:
        """One of a pair, each tick: commands go out only while active, with the epoch of
        this tenure; a new tenure forgets what was sent (the shadow's or an earlier
        tenure's), so this tick sends every tray its settings with the new epoch."""
        rt = self.racky_tick
        rt.sending = self.is_active and self.controller_epoch > 0
        if not rt.sending:
            return
        epoch = agent_epoch(self._start_ms, self.controller_epoch)
        if epoch != rt.agent_epoch:
            rt.agent_epoch = epoch
            self.core.last_sent = [None] * self.core.n_trays
            self.log.warning("agent_epoch", epoch=epoch, lease_epoch=self.controller_epoch,
                             note="every tray gets its settings with this epoch now")

    def sync_state(self) -> dict[str, Any]:
        """racky's part of the pair's sync record (`racky.pair.sync_state`)."""
        return sync_state(self.core, self.clock.monotonic())

    def apply_sync_state(self, state: Mapping[str, Any], now: float) -> None:
        """The standby follows the active (`racky.pair.apply_sync_state`); a record that does
        not parse is logged once per problem and skipped."""
        try:
            changed = apply_sync_state(self.core, state, now)
        except ValueError as err:
            if self._sync_refused != str(err):
                self._sync_refused = str(err)
                self.log.error("pair_sync_state_refused", error=str(err))
            return
        self._sync_refused = None
        if changed:
            self.log.info("pair_sync_applied", changed=changed,
                          budget_w=self.core.budget_w,
                          lifecycle=self.core.persisted.lifecycle.state)

    def pair_state(self) -> dict[str, Any]:
        """The frame's ``state/pair_<instance>``, plus ``agent_epoch`` (the epoch racky's
        commands carry now; 0 while standby) and ``withheld_commands`` (agent commands the
        shadow core decided while standby)."""
        rt = self.racky_tick
        return {**super().pair_state(), "agent_epoch": rt.agent_epoch if rt.sending else 0,
                "withheld_commands": rt.withheld_commands}

    def on_role_change(self, active: bool) -> None:
        """Became active: the shadow core's retained alarms and the rack's state are published
        now (the frame's reconciliation then clears what the old active left and this one does
        not hold)."""
        super().on_role_change(active)
        self._pair_epoch()
        if active:
            wall = self.clock.wall_ns()
            for a in self.core.bank.active():
                self.mqtt.publish_alarm(a.id, alarm_payload(a, wall))
            self._publish_state(wall)

    def pv_age_s(self, now: float) -> float | None:
        """Age of the rack power racky controls on, s: per shelf its newest sample, the
        oldest of those (None before any shelf reported)."""
        return pv_age_s([max(pts.values(), key=lambda x: x.t_mono)
                         for pts in self.latest.values() if pts], now)

    def modbus_devices(self) -> Sequence[ModbusDevice]:
        return tuple(self.devices.values())

    def input_invalid_samples(self) -> int:
        return self.racky_tick.ingest.errors + self.racky_tick.invalid_inputs

    def ready_status(self) -> tuple[str, Mapping[str, Any]]:
        return "racky running", {"shelves": len(self.devices),
                                 "lifecycle": self.core.persisted.lifecycle.state}

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` in the background (awaited, bounded, at stop)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    def _prepare_grids(self) -> None:
        """Each tick: the first learned-rate design whose threshold grid is not computed yet
        (the per-port design from the config from the first tick, then the parts' pooled one
        once the trays' layout is known) is computed in a worker thread, one at a time, each
        design once. Measured on a 2-core host before the chain's solve was reworked
        (`racky.core.arlchain`): 1.9 s for the per-port grid, 26.5 s for the pooled one of 18
        trays (its rates reach 72 ports' worth); in the tick these held the event loop (issue
        15). Now ~0.5 s and ~2.6 s of one core (scripts/bench_rate_grids.py; a threshold
        solved per grid point since, ~3x the one chain per point before), still off the
        loop. The thread is a daemon thread, not the default executor's: a stop never waits for
        it (asyncio's shutdown joins executor threads, and a grid may take longer than the
        unit's TimeoutStopSec on a loaded host). The core needs a grid only once a link or part
        is armed (a restored baseline, or ``baseline_min_min`` of learning); if that comes
        first, the tick computes it itself too, with the same result. A design the
        trays' layout replaced while its grid was computed is computed all the same (wasted,
        not wrong); the layout settles as the first telemetry of every tray arrives, before the
        per-port grid is done."""
        if self._grid_thread is not None and self._grid_thread.is_alive():
            return
        links = self.core.links
        designs = (links.rate_designs() if links is not None
                   else [rate_design(self.cfg.links)] if self.cfg.links.enabled else [])
        for d in designs:
            if d.grid_ready or d.grid_key in self._grids_tried:
                continue
            self._grids_tried.add(d.grid_key)
            self._grid_thread = threading.Thread(target=self._prepare_grid, args=(d,),
                                                 name="racky-rate-grid", daemon=True)
            self._grid_thread.start()
            return

    def _prepare_grid(self, design: RateDesign) -> None:
        """In the worker thread: one grid; a failure is logged and not retried here (the
        tick computes the grid when it needs it, and fails there as it would have)."""
        try:
            design.prepare_grid()
        except (ValueError, ArithmeticError) as err:
            self.log.error("link_grid_failed", error=repr(err), grid_key=list(design.grid_key))

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
            **({"pair": self.pair_state()} if self.role is not None else {}),
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
        target = shelf_target(self.cfg, unit)
        link = self.links.get(target)  # through the gateway connection the shelves use
        dev = ModbusDevice(target, regmap, clock=self.clock, on_samples=lambda s: None,
                           link=link)
        try:
            samples = await asyncio.wait_for(dev.read_once(), self.cfg.discovery.timeout_s * 4)
        except Exception as err:  # a probe failing is the normal case (no such unit)
            self.log.debug("probe_failed", unit=unit, error=repr(err))
            return False
        finally:
            link.leave(dev)
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
        if self.fleet is not None:
            tasks.append(OwnerTask("fleet", self.fleet.run))
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
        if self.is_active:
            self._publish_state(self.clock.wall_ns())

    def final_counts(self) -> Mapping[str, Any]:
        return {"agent_commands": self.agent_stats}
