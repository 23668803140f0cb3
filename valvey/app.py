"""valvey the daemon: adapters around the pure core (DESIGN §1), on the daemon frame
(`rackplane.daemon.DaemonFrame`: MQTT link, telemetry writer, commands with leases and audit,
self-metrics, TaskGroup, ordered stop, SIGHUP reload, sd_notify).

Tasks in one TaskGroup: ``modbus`` (the CDU's owner task), ``mqtt`` (broker link),
``tsdb`` (spool and writer), ``control`` (the 10 Hz tick). The tick never awaits the network:
it reads the latest samples, calls `ValveyCore.step`, hands output writes to the device's
owner task (one in flight per point, the newest value wins), and queues state, alarms and
telemetry. READY goes out after the first tick; the watchdog is fed by the tick.

One instance of a redundant pair (``[leadership] enabled = true``, issue 15; the frame runs
the lease): only while active does it write the CDU, claiming its epoch there first
(`valvey.pair.EpochClaimer`), answer commands, and publish the daemon's shared state, alarms,
telemetry and requests to racky; as standby its core runs in shadow (reads the CDU, computes,
writes and publishes nothing but ``status/<instance>`` and ``state/pair_<instance>``).

Shutdown (SIGTERM): the tick stops, the outputs get their declared stop writes (bounded by
``control.stop_budget_s``), ``stopping`` is published, the spool is fsynced and drained within
``tsdb.stop_budget_s``; what is left goes after restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Unpack

from rackplane.config import check_environment, check_writable_dir, load_config
from rackplane.config_errors import ProblemList
from rackplane.core.alarms import AlarmEvent
from rackplane.core.envelope import alarm_payload
from rackplane.core.registers import RegisterMap, load_register_map
from rackplane.core.samples import Sample
from rackplane.daemon import DaemonFrame, FrameOptions, OwnerTask, ReloadOutcome
from rackplane.errors import ModbusError, WriteRejected
from rackplane.io.modbus import ModbusDevice
from rackplane.io.mqtt import Message
from rackplane.io.selfmetrics import (
    TELEMETRY_ALARMS,
    pv_age_s,
    telemetry_alarm_conditions,
)
from rackplane.io.spool import check_spool_config
from rackplane.io.statefile import StateFileError
from rackplane.settings import environment_checks, spool_folder
from valvey.commands import VALVEY_OUTPUTS, register_valvey_commands
from valvey.config import ValveyConfig, check_points_against_map, required_parts
from valvey.learned_age import LearnedAges
from valvey.pair import EpochClaimer
from valvey.persist import (
    CommandState,
    LearnedState,
    apply_command_state,
    apply_learned,
    open_state_file,
    state_file_path,
    sync_command_state,
)
from valvey.tick import Publish, TickEffects, ValveyTick

__all__ = ["DAEMON", "OutputWriter", "Valvey", "load_valvey_config"]

DAEMON = "valvey"



def load_valvey_config(path: str | os.PathLike[str] | None) -> tuple[ValveyConfig, RegisterMap]:
    """Load and cross-check the config: register map, points, secrets, TLS files, spool.

    The file must name valvey's identity and its CDU (`valvey.config.required_parts`).
    Everything that would stop the daemon later is checked here, so ``--check-config`` and
    start-up refuse it with the key path named (exit 2) instead of failing at run time.

    Raises:
        ConfigError: any problem, with the key path named.
    """
    problems = ProblemList()  # every problem at once (rackplane.config_errors)
    cfg = load_config(ValveyConfig, path, required=required_parts,
                      example="config/valvey.example.toml", problems=problems)
    regmap = None
    with problems.check("cdu.register_map"):
        regmap = load_register_map(cfg.cdu.register_map)
    if regmap is not None:
        with problems.check():
            check_points_against_map(cfg, regmap)
    with problems.check():
        check_environment({**environment_checks(cfg.mqtt, cfg.tsdb),
                           **cfg.leadership.environment_checks()})
    if cfg.mqtt.tls is not None:
        for key in ("ca_file", "cert_file", "key_file"):
            f = getattr(cfg.mqtt.tls, key)
            if f is not None and not Path(f).is_file():
                problems.add(f"mqtt.tls.{key}: {f} is not a readable file")
    spool_dir = spool_folder(cfg.spool, daemon="valvey", identity=cfg.identity)
    with problems.check():
        check_writable_dir("spool.directory", spool_dir)
        check_spool_config("spool.directory", spool_dir)
    with problems.check():
        check_writable_dir("control.state_file",
                           state_file_path(cfg.control.state_file, cfg.spool,
                                           cfg.identity.rack).parent)
    problems.raise_if_any()
    assert regmap is not None  # a map that did not load is a problem raised above
    return cfg, regmap


@dataclass
class OutputWriter:
    """At most one write in flight per point; a newer value replaces a pending one.

    The tick calls `submit` and never waits; failures are logged once per change of
    outcome and counted.
    """

    device: ModbusDevice
    timeout_s: float
    log: Any
    pending: dict[str, float] = field(default_factory=dict)
    inflight: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    ok: int = 0
    errors: int = 0
    last_written: dict[str, float] = field(default_factory=dict)

    def submit(self, point: str, value: float) -> None:
        self.pending[point] = value
        if point not in self.inflight:
            self._start(point)

    def _start(self, point: str) -> None:
        value = self.pending.pop(point)
        task = asyncio.get_running_loop().create_task(
            self._write(point, value), name=f"write:{point}"
        )
        self.inflight[point] = task

    async def _write(self, point: str, value: float) -> None:
        try:
            await asyncio.wait_for(self.device.write(point, value), self.timeout_s)
            self.ok += 1
            self.last_written[point] = value
            if self.failed.pop(point, None) is not None:
                self.log.info("output_write_recovered", point=point, value=value)
        except (ModbusError, WriteRejected, TimeoutError) as err:
            self.errors += 1
            reason = getattr(err, "reason", type(err).__name__)
            if self.failed.get(point) != reason:
                self.failed[point] = reason
                self.log.warning("output_write_failed", point=point, value=value, error=str(err))
        finally:
            self.inflight.pop(point, None)
            if point in self.pending:
                self._start(point)

    async def drain(self, budget_s: float) -> None:
        """Wait (bounded) for writes in flight and pending."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget_s
        while self.inflight and loop.time() < deadline:
            await asyncio.wait(list(self.inflight.values()), timeout=deadline - loop.time())


class Valvey(DaemonFrame[ValveyConfig]):
    """The valvey daemon.

    Args:
        cfg: validated config; regmap: its CDU register map.
        options: the frame's (`rackplane.daemon.FrameOptions`): ``clock`` (injected clocks),
            ``notifier`` (systemd notification, default from the environment),
            ``config_path`` (the file to re-read on SIGHUP; None: embedded defaults).
    """

    daemon = DAEMON
    tick_task_name = "control"
    stopping_status = "stopping: outputs to their stop state, draining telemetry"

    def __init__(
        self,
        cfg: ValveyConfig,
        regmap: RegisterMap,
        **options: Unpack[FrameOptions],
    ):
        super().__init__(cfg, **options)
        clock = self.clock
        self.regmap = regmap
        ident = cfg.identity
        # Request ids to racky must not repeat across restarts (racky de-duplicates by id):
        # wall-clock: a per-start unique prefix, never used for timing.
        # The telemetry path's alarms (issue 7) are the daemon's: the core keeps their state,
        # the tick feeds their conditions from the writer's stats.
        # The tick (valvey.tick) owns the core and the latest samples; the lock-step harness
        # drives the same class.
        self.valvey_tick = ValveyTick(cfg, clock.monotonic(),
                                      request_prefix=f"valvey-{clock.wall_ns():x}",
                                      extra_alarms=TELEMETRY_ALARMS)
        self.core = self.valvey_tick.core
        self.latest = self.valvey_tick.latest
        self.device = ModbusDevice(cfg.cdu, regmap, clock=clock, on_samples=self._on_samples)
        self.outputs = OutputWriter(self.device, cfg.control.write_timeout_s, self.log)
        # one of a pair: the epoch claim at the CDU before any other write (valvey.pair)
        self.claimer: EpochClaimer | None = None
        if self.leadership_settings() is not None and cfg.points.controller_epoch:
            self.claimer = EpochClaimer(self.device, cfg.points.controller_epoch, self.outputs,
                                        cfg.control.write_timeout_s, self.log)
        self.standby_withheld_writes = 0  # writes the standby's shadow core computed
        self._sync_refused: str | None = None
        self._sync_superseded: list[str] = []
        self._synced_learned: LearnedState | None = None
        # when each learned value was last confirmed (valvey.learned_age); wall-clock: the
        # ages must survive a restart (a saved time in the future: age unknown)
        self.learned_ages = LearnedAges(lambda: self.clock.wall_ns() / 1e9)
        # The setpoint and loop mode set by command survive a restart (valvey.persist).
        # the owner names the rack whole (site/row/rack): racks of one name in two rows must
        # never take each other's setpoint, manual output or learned valve map
        self._owner = f"{ident.site}/{ident.row}/{ident.rack}"
        self._legacy_owner = f"{ident.site}/{ident.rack}"  # files saved before the row was in
        self.statefile = open_state_file(
            state_file_path(cfg.control.state_file, cfg.spool, ident.rack), log=self.log)
        self._saved_state: CommandState | None = self._restore_command_state()
        self._save_task: asyncio.Task[None] | None = None
        self._save_retry_at = 0.0
        self._save_failing: str | None = None
        # Commands (DESIGN §1, §3): cmd/<user>/<verb> -> validate -> core -> reply; each one
        # audited to the time series. Leases: operator > automation, each with an expiry; the
        # manual valve output only under one; interlocks (from the tick) override every lease.
        self.attach_commands(
            lease_outputs=VALVEY_OUTPUTS,
            register=lambda router, leases: register_valvey_commands(
                router, self.core, on_alarm_events=self._alarms, leases=leases))
        # Sensors over MQTT (room air, leak sensors, racky's rack power: DESIGN §3 "sensor
        # topics are mapped in config") and racky's replies to valvey's requests.
        for topic in self.valvey_tick.sensor_topics:
            self.mqtt.subscribe(topic, self._on_sensor_message, qos=0)
        self.racky_user = cfg.racky.user or cfg.mqtt.username or "valvey"
        self.mqtt.subscribe(self.valvey_tick.racky_reply_topic, self._on_racky_reply, qos=1)
        self._request_failing: str | None = None
        self._pending_sends: set[asyncio.Task[None]] = set()

    @classmethod
    def load_config(cls, path: str | os.PathLike[str]) -> ValveyConfig:
        """`load_valvey_config` (for SIGHUP reload)."""
        return load_valvey_config(path)[0]

    # -- acquisition -----------------------------------------------------------------------

    def _on_samples(self, samples: list[Sample]) -> None:
        self.valvey_tick.on_samples(samples)

    def _on_sensor_message(self, msg: Message) -> None:
        """An MQTT sensor message to the tick (`ValveyTick.on_sensor_message`: the mapping,
        the parse and the ageing of retained values)."""
        self.valvey_tick.on_sensor_message(
            msg.topic, msg.payload, retain=msg.retain,
            received_mono=msg.received_mono or self.clock.monotonic(),
            wall_ns=self.clock.wall_ns())  # wall-clock: the samples' time-series timestamp

    def _on_racky_reply(self, msg: Message) -> None:
        """racky's reply ``{request_id, ok, error, state}`` on ``.../cmd/<user>/<verb>/result``."""
        self.log_records(self.valvey_tick.on_racky_reply(msg.topic, msg.payload,
                                                   self.clock.monotonic()))

    def _send_requests(self, requests: list[Publish]) -> None:
        """Publish valvey's requests to racky (QoS 1, not retained; the tick built the
        envelope and topic). The tick never waits: each publish is its own task; a failure is
        logged once per change (the tracker re-sends without an acknowledgement)."""
        for req in requests:
            assert req.topic is not None and req.payload is not None
            task = asyncio.get_running_loop().create_task(
                self._publish_request(req.topic, dict(req.payload), req.name))
            self._pending_sends.add(task)
            task.add_done_callback(self._pending_sends.discard)

    async def _publish_request(self, topic: str, env: dict[str, Any], verb: str) -> None:
        try:
            await self.mqtt.publish(topic, env, qos=1)
        except Exception as err:  # MqttError, PublishRefused: the tracker re-sends
            reason = type(err).__name__
            if self._request_failing != reason:
                self._request_failing = reason
                self.log.warning("racky_request_failed", verb=verb, error=str(err))
            return
        if self._request_failing is not None:
            self._request_failing = None
            self.log.info("racky_request_recovered", verb=verb)

    # -- the tick ----------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """The control tick (the frame adds self-metrics, the watchdog and READY):
        `ValveyTick.step`, leases, its effects applied, the command state saved."""
        if self.role == "standby":
            self._track_cdu()
        fx = self.valvey_tick.step(now, self.clock.wall_ns(),
                                   telemetry_alarm_conditions(self.writer.stats))
        if self.is_active:
            self.leases.tick(now, dict(fx.interlocks))
        else:  # a pair's standby: the same lease rules, nothing published (the active's)
            self.leases.table.set_interlocks(dict(fx.interlocks))
            self.leases.table.expire(now)
            self.leases.table.drain_events()
        self._apply(fx)
        self._persist_tick(now)
        if fx.state_published and self.is_active:
            self.mqtt.publish_state("health", self.health())

    def modbus_devices(self) -> Sequence[ModbusDevice]:
        return (self.device,)

    def input_invalid_samples(self) -> int:
        return self.core.inputs.invalid_samples

    def ready_status(self) -> tuple[str, Mapping[str, Any]]:
        loop = self.core.loop
        mode = "shadow" if loop.shadow else loop.control_mode
        return (f"control running, loop {mode}",
                {"mode": mode, "cdu": f"{self.cfg.cdu.host}:{self.cfg.cdu.port}"})

    # -- command state across restarts (valvey.persist) --------------------------------------

    def _restore_command_state(self) -> CommandState | None:
        """Load the state file and lay it over the loop (see valvey.persist for the rule);
        an unusable file is moved aside and logged, the config's values are used."""
        wall = self.clock.wall_ns()  # wall-clock: the .bad-<ns> name of a damaged file
        data = self.statefile.load_or_default({}, wall)
        if not data:
            return None
        try:
            saved = CommandState.from_data(data)
            if saved.owner not in (self._owner, self._legacy_owner):
                raise ValueError(f"saved by {saved.owner!r}, this valvey is {self._owner!r} "
                                 "(set control.state_file per daemon)")
        except ValueError as err:
            aside = self.statefile.move_aside(wall)
            self.log.error("state_file_unusable", path=str(self.statefile.path),
                           error=f"bad data: {err}", moved_to=str(aside),
                           effect="starting from the configuration")
            return None
        restored, superseded = apply_command_state(self.core.loop, self.cfg.supply_loop, saved)
        if saved.learned is not None:  # what the controller learned of its plant (issue 21)
            got, dropped = apply_learned(self.core, saved.learned, self.learned_ages)
            restored += got
            superseded += dropped
        if restored:
            ages = {} if saved.learned is None else saved.learned.ages_s(
                self.learned_ages.wall_s())
            names = [n.split(":")[0] for n in restored]
            self.log.info("command_state_restored", restored=restored,
                          setpoint_c=self.core.loop.setpoint_c, shadow=self.core.loop.shadow,
                          manual_output_pct=self.core.loop.manual_target_pct,
                          learned_age_s={n: ages[n] for n in names if n in ages},
                          path=str(self.statefile.path))
        if superseded:
            self.log.warning("command_state_superseded", superseded=superseded,
                             setpoint_c=self.core.loop.setpoint_c,
                             note="the configuration's values apply")
        return saved

    def _command_state(self) -> CommandState:
        """What is saved now: the command state and what the core learned."""
        self.learned_ages.observe(self.core)
        return CommandState.of(self._owner, self.core.loop, self.cfg.supply_loop,
                               LearnedState.of(self.core, self.learned_ages))

    def _persist_tick(self, now: float) -> None:
        """Save the command state when it changed (one save in flight, off the event loop;
        a failing save is logged once per change and retried every 10 s)."""
        cur = self._command_state()
        if cur == self._saved_state or self._save_task is not None or now < self._save_retry_at:
            return
        self._save_task = asyncio.get_running_loop().create_task(self._save_state(cur, now))

    async def _save_state(self, cur: CommandState, now: float) -> None:
        try:
            await asyncio.to_thread(self.statefile.save, cur.data(), self.clock.wall_ns())
        except StateFileError as err:
            self._save_retry_at = now + 10.0
            if self._save_failing != str(err):
                self._save_failing = str(err)
                self.log.error("state_file_save_failed", error=str(err),
                               effect="a restart would use the last saved state; retrying")
            return
        finally:
            self._save_task = None
        self._saved_state = cur
        if self._save_failing is not None:
            self._save_failing = None
            self.log.info("state_file_save_recovered", path=str(self.statefile.path))
        self.log.info("command_state_saved", **cur.data())

    def _save_state_now(self) -> None:
        """At shutdown: a last synchronous save when the state changed since the last one."""
        cur = self._command_state()
        if cur == self._saved_state:
            return
        try:
            self.statefile.save(cur.data(), self.clock.wall_ns())  # wall-clock: saved_wall_ns
            self._saved_state = cur
        except StateFileError as err:
            self.log.error("state_file_save_failed", error=str(err), effect="at shutdown")

    def pv_age_s(self, now: float) -> float | None:
        """Age of the supply temperature the loop controls on (``points.supply_temp``), s;
        None before the first read. Redundant sensors dropped from the vote are alarms of
        their own (``supply_sensor_fault:*``), not PV age."""
        return pv_age_s([self.latest.get(self.cfg.points.supply_temp)], now)

    def _submit_writes(self, writes: Sequence[tuple[str, float]]) -> None:
        """Writes to the CDU's owner task; one of a pair: only while active (the standby
        counts them), behind the epoch claim."""
        if not writes and not (self.claimer is not None and self.claimer.held):
            return  # (held writes: their claim is tried again below)
        epoch = self.controller_epoch
        if not self.is_active or (self.role is not None and epoch == 0):
            self.standby_withheld_writes += len(writes)
        elif self.claimer is not None:
            self.claimer.route(epoch, writes)
        else:
            for point, value in writes:
                self.outputs.submit(point, value)

    # -- one of a pair: the state sync (rackplane.pair) --------------------------------------

    def sync_state(self) -> dict[str, Any]:
        """valvey's part of the pair's sync record: ``command`` (the state file's ``data``:
        setpoint, shadow, manual output, learned state) and ``command_pct`` (the supply
        loop's output now, %, None before it has one)."""
        return {"command": self._command_state().data(),
                "command_pct": self.core.loop.command_pct}

    def _track_cdu(self) -> None:
        """A pair's standby: its loop continues from the valve demand the CDU holds (the
        active valve's command register, else its position feedback: what the active
        wrote), so its shadow never runs ahead of the valve while nobody writes (the active
        dead, the lease not yet expired) and its first write as active is bumpless: the
        core's read-back reconciliation follows it too (`ValveyCore.track_active_output`),
        so no value the standby computed earlier is re-asserted after a takeover."""
        rb = self._readback()
        if rb is not None and rb != self.core.loop.command_pct:
            self.core.track_active_output(rb)

    def _readback(self) -> float | None:
        """The CDU's valve demand as last read (`ValveyCore.readback_pct`), None if unknown."""
        rb = self.core.readback_pct(self.latest)
        return rb if rb is not None and math.isfinite(rb) else None

    def apply_sync_state(self, state: Mapping[str, Any], now: float) -> None:
        """The standby follows the active: its command state by `sync_command_state`,
        its learned state by `apply_learned` (when it changed), and its shadow loop tracks the
        active's output and its reconciliation what the CDU holds
        (`ValveyCore.track_active_output`), so the first write after a takeover continues
        from where the valve was sent. A record that does not parse or names
        another rack is logged once and skipped."""
        try:
            synced = CommandState.from_data(dict(state.get("command") or {}))
            if synced.owner != self._owner:
                raise ValueError(f"from {synced.owner!r}, this valvey is {self._owner!r}")
        except ValueError as err:
            if self._sync_refused != str(err):
                self._sync_refused = str(err)
                self.log.error("pair_sync_state_refused", error=str(err))
            return
        self._sync_refused = None
        loop = self.core.loop
        changed, superseded = sync_command_state(loop, self.cfg.supply_loop, synced)
        if synced.learned is not None and synced.learned != self._synced_learned:
            self._synced_learned = synced.learned
            got, dropped = apply_learned(self.core, synced.learned, self.learned_ages)
            changed += got
            superseded += dropped
        pct = state.get("command_pct")
        if isinstance(pct, int | float) and not isinstance(pct, bool) and math.isfinite(pct):
            self.core.track_active_output(float(pct), self._readback())
        if changed:
            self.log.info("pair_sync_applied", changed=changed, setpoint_c=loop.setpoint_c,
                          shadow=loop.shadow, manual_output_pct=loop.manual_target_pct)
        if superseded and superseded != self._sync_superseded:
            self.log.warning("pair_sync_superseded", superseded=superseded,
                             note="this instance's configuration applies")
        self._sync_superseded = superseded

    def pair_state(self) -> dict[str, Any]:
        """The frame's ``state/pair_<instance>``, plus ``withheld_writes`` (writes the shadow
        core computed while standby), ``epoch_claims_ok`` / ``epoch_claims_failed``."""
        c = self.claimer
        return {**super().pair_state(), "withheld_writes": self.standby_withheld_writes,
                "epoch_claims_ok": c.claims_ok if c else 0,
                "epoch_claims_failed": c.claims_failed if c else 0}

    def on_role_change(self, active: bool) -> None:
        """Became active: the retained alarms the shadow core holds and the retained states
        are published now (the frame's reconciliation then clears only what the old active
        left and this one does not hold). Became standby: the claim is dropped."""
        super().on_role_change(active)
        if active:
            wall = self.clock.wall_ns()
            for a in self.core.alarms.active():
                self.mqtt.publish_alarm(a.id, alarm_payload(a, wall))
            self._publish_state()
        elif self.claimer is not None:
            self.claimer.standby()

    def _apply(self, fx: TickEffects) -> None:
        """The tick's effects to the adapters: writes to the CDU's owner task, log records,
        MQTT publishes, time-series lines (never waits). A pair's standby applies only its
        log records."""
        self._submit_writes(fx.writes)
        self.log_records(fx.logs)
        if not self.is_active:
            return
        requests: list[Publish] = []
        mqtt = self.mqtt
        for pub in fx.publishes:
            if pub.kind == "state":
                assert pub.payload is not None
                mqtt.publish_state(pub.name, pub.payload)
            elif pub.kind == "telemetry":
                assert pub.payload is not None
                mqtt.publish_telemetry(pub.name, pub.payload)
            elif pub.kind == "alarm":
                mqtt.publish_alarm(pub.name, pub.payload)
            else:
                requests.append(pub)
        if requests:
            self._send_requests(requests)
        self.write_lines(fx.lines)


    def _alarms(self, events: list[AlarmEvent]) -> None:
        """Alarm changes outside the tick (an operator's ack or shelve)."""
        self._apply(self.valvey_tick.alarm_effects(events, self.clock.wall_ns()))

    def _publish_state(self) -> None:
        self._apply(self.valvey_tick.state_effects(self.clock.monotonic(), self.clock.wall_ns()))
        if self.is_active:
            self.mqtt.publish_state("health", self.health())

    def health(self) -> dict[str, Any]:
        """Self-metrics for the retained ``state/health`` topic."""
        w = self.writer.stats
        return {
            "uptime_s": self.uptime_s(),
            "tick_late_last_s": round(self.tick_stats.late_last_s, 4),
            "tick_late_max_s": round(self.tick_stats.late_max_s, 4),
            "tick_overruns": self.tick_stats.overruns,
            "cdu": self.device.stats.as_dict(),
            "mqtt_subscribed": self.mqtt.subscribed_topics,
            "mqtt_configured": self.mqtt.configured_topics,
            "mqtt_reconnects": self.mqtt.stats.reconnects,
            "commands": {
                "received": self.commands.stats.received,
                "applied": self.commands.stats.applied,
                "refused": dict(self.commands.stats.refused),
                "duplicates": self.commands.stats.duplicates,
            },
            "output_writes_ok": self.outputs.ok,
            "output_writes_failed": self.outputs.errors,
            **({"pair": self.pair_state()} if self.role is not None else {}),
            "self": self.selfmetrics.status(),
            "spool": {
                "directory": str(self.writer.spool_directory),
                "spooled_lines": w.spooled,
                "sent_lines": w.sent,
                "depth_lines": w.depth_lines,
                "rejected_lines": w.rejected,
                "dropped_lines": w.dropped,
                "last_error": w.last_error,
            },
        }

    # -- lifecycle (the frame's hooks) -------------------------------------------------------

    def start_fields(self) -> Mapping[str, Any]:
        c = self.cfg
        return {"site": c.identity.site, "rack": c.identity.rack,
                "cdu": f"{c.cdu.host}:{c.cdu.port}/{c.cdu.unit_id}",
                "broker": f"{c.mqtt.host}:{c.mqtt.port}", "tsdb": c.tsdb.url or "embedded spool",
                "shadow": c.supply_loop.shadow}

    def owner_tasks(self) -> Sequence[OwnerTask]:
        return [OwnerTask("modbus", self.device.run)]

    async def stop_outputs(self) -> None:
        """The outputs' declared stop writes, bounded by ``control.stop_budget_s``."""
        await self._stop_outputs()

    async def save_state_at_stop(self) -> None:
        """The save in flight, then a last one when the command state changed since."""
        if self._save_task is not None:
            with contextlib.suppress(Exception):
                await self._save_task
        self._save_state_now()

    def publish_final_state(self) -> None:
        self._publish_state()

    async def _stop_outputs(self) -> None:
        writes = self.core.stop_writes()
        if not self.is_active:  # a pair's standby: the active instance keeps the outputs
            self.log.info("stop_action_standby", note="standby: no stop writes")
            return
        for point, value in writes:
            self.log.info("stop_action_write", point=point, value=value)
        self._submit_writes(writes)
        await self.outputs.drain(self.cfg.control.stop_budget_s)
        if not writes:
            self.log.info("stop_action_hold", note="outputs hold their last value")

    def final_counts(self) -> Mapping[str, Any]:
        w = self.writer.stats
        return {
            "spooled_lines": w.spooled,
            "sent_lines": w.sent,
            "depth_lines": w.depth_lines,
        }

    def config_reloaded(self) -> None:
        """The tick's telemetry reads the config now in force."""
        self.valvey_tick.reload(self.cfg)

    def apply_reload(self, cfg: ValveyConfig) -> ReloadOutcome:
        """SIGHUP: loop settings apply without bumping the output; identity, mqtt, tsdb,
        spool, cdu, points and control only after a restart."""
        old_sp, old_shadow = self.cfg.supply_loop.setpoint_c, self.cfg.supply_loop.shadow
        shadow_now = self.core.loop.shadow
        self.core.reload(cfg.supply_loop)
        # The newer decision wins (valvey.persist): a setpoint (shadow flag) changed in the
        # file applies; an unchanged file keeps the value set by command since.
        if cfg.supply_loop.setpoint_c != old_sp:
            self.core.loop.set_setpoint(cfg.supply_loop.setpoint_c)
        if cfg.supply_loop.shadow == old_shadow:
            self.core.loop.set_shadow(shadow_now)
        return ReloadOutcome(
            applied=("supply_loop",),
            restart_sections=("identity", "mqtt", "tsdb", "spool", "cdu", "points", "control"),
            fields={"setpoint_c": self.core.loop.setpoint_c})
