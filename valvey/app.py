"""valvey the daemon: adapters around the pure core (DESIGN §1), on the daemon frame
(`rackplane.daemon.DaemonFrame`: MQTT link, telemetry writer, commands with leases and audit,
self-metrics, TaskGroup, ordered stop, SIGHUP reload, sd_notify).

Tasks in one TaskGroup: ``modbus`` (the CDU's owner task), ``mqtt`` (broker link),
``tsdb`` (spool and writer), ``control`` (the 10 Hz tick). The tick never awaits the network:
it reads the latest samples, calls `ValveyCore.step`, hands output writes to the device's
owner task (one in flight per point, the newest value wins), and queues state, alarms and
telemetry. READY goes out after the first tick; the watchdog is fed by the tick.

Shutdown (SIGTERM): the tick stops, the outputs get their declared stop writes (bounded by
``control.stop_budget_s``), ``stopping`` is published, the spool is fsynced and drained within
``tsdb.stop_budget_s``; what is left goes after restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Unpack

from rackplane.config import check_environment, check_writable_dir, load_config
from rackplane.core.alarms import AlarmEvent
from rackplane.core.registers import RegisterMap, load_register_map
from rackplane.core.samples import Sample
from rackplane.daemon import DaemonFrame, FrameOptions, OwnerTask, ReloadOutcome
from rackplane.errors import ConfigError, ModbusError, WriteRejected
from rackplane.io.modbus import ModbusDevice
from rackplane.io.mqtt import Message
from rackplane.io.selfmetrics import (
    TELEMETRY_ALARMS,
    pv_age_s,
    telemetry_alarm_conditions,
)
from rackplane.io.spool import check_spool_config
from rackplane.io.statefile import StateFileError
from rackplane.settings import effective_spool, environment_checks
from rackplane.topics import PeerTopics
from valvey.commands import VALVEY_OUTPUTS, register_valvey_commands
from valvey.config import ValveyConfig, check_points_against_map
from valvey.core.controller import (
    PUMP_CONSTRAINT_CODES,
    VALVE_CONSTRAINT_CODES,
    CoreOutput,
    ValveyCore,
)
from valvey.core.requests import RackyReply, RackyRequest
from valvey.core.sensors import SensorTopic, parse_sensor_message, resolve_topic
from valvey.persist import (
    CommandState,
    apply_command_state,
    open_state_file,
    state_file_path,
)

DAEMON = "valvey"

__all__ = ["DAEMON", "MEASUREMENT_OF_POINT", "OutputWriter", "Valvey", "load_valvey_config"]

# Time-series measurement of each CDU point (DESIGN §3: measurements name the equipment);
# points not listed go to ``cdu``.
MEASUREMENT_OF_POINT = {
    "supply_temp_c": "coolant_loop",
    "supply_temp_b_c": "coolant_loop",
    "supply_temp_c_c": "coolant_loop",
    "return_temp_c": "coolant_loop",
    "flow_lpm": "coolant_loop",
    "diff_pressure_kpa": "coolant_loop",
    "loop_pressure_kpa": "coolant_loop",
    "heat_removed_kw": "coolant_loop",
    "facility_supply_temp_c": "coolant_loop",
    "valve_position_pct": "valve",
    "valve_command_pct": "valve",
    "pump_speed_pct": "pump",
    "pump_speed_command_pct": "pump",
    "pump_a_running": "pump",
    "pump_a_fault": "pump",
    "pump_a_speed_pct": "pump",
    "pump_a_run_hours_h": "pump",
    "pump_b_running": "pump",
    "pump_b_fault": "pump",
    "pump_b_speed_pct": "pump",
    "pump_b_run_hours_h": "pump",
    "duty_pump_select": "pump",
    "reservoir_level_pct": "coolant_loop",
    "filter_diff_pressure_kpa": "coolant_loop",
    "valve_b_position_pct": "valve",
    "valve_b_command_pct": "valve",
    "rack_isolation_open": "valve",
    "rack_isolation_closed": "valve",
    "rack_isolation_command": "valve",
}
_MODE_CODE = {"initialising": 0.0, "auto": 1.0, "manual": 2.0, "failsafe": 3.0, "shadow": 4.0}
_SEVERITY_CODE = {"warning": 1.0, "minor": 2.0, "major": 3.0, "critical": 4.0}


def load_valvey_config(path: str | os.PathLike[str] | None) -> tuple[ValveyConfig, RegisterMap]:
    """Load and cross-check the config: register map, points, secrets, TLS files, spool.

    Everything that would stop the daemon later is checked here, so ``--check-config`` and
    start-up refuse it with the key path named (exit 2) instead of failing at run time.

    Raises:
        ConfigError: any problem, with the key path named.
    """
    cfg = load_config(ValveyConfig, path)
    try:
        regmap = load_register_map(cfg.cdu.register_map)
    except ConfigError as err:
        raise ConfigError(f"cdu.register_map: {err}", problems=[f"cdu.register_map: {err}"]) \
            from None
    check_points_against_map(cfg, regmap)
    check_environment(environment_checks(cfg.mqtt, cfg.tsdb))
    if cfg.mqtt.tls is not None:
        for key in ("ca_file", "cert_file", "key_file"):
            f = getattr(cfg.mqtt.tls, key)
            if f is not None and not Path(f).is_file():
                msg = f"mqtt.tls.{key}: {f} is not a readable file"
                raise ConfigError(f"invalid configuration:\n  {msg}", problems=[msg])
    check_writable_dir("spool.directory", effective_spool(cfg.spool).directory)
    check_spool_config("spool.directory", effective_spool(cfg.spool).directory)
    check_writable_dir("control.state_file",
                       state_file_path(cfg.control.state_file, cfg.spool,
                                       cfg.identity.rack).parent)
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
        self.latest: dict[str, Sample] = {}
        # Request ids to racky must not repeat across restarts (racky de-duplicates by id):
        # wall-clock: a per-start unique prefix, never used for timing.
        # The telemetry path's alarms (issue 7) are the daemon's: the core keeps their state,
        # the tick feeds their conditions from the writer's stats.
        self.core = ValveyCore.from_config(cfg, clock.monotonic(),
                                           request_prefix=f"valvey-{clock.wall_ns():x}",
                                           extra_alarms=TELEMETRY_ALARMS)
        self.device = ModbusDevice(cfg.cdu, regmap, clock=clock, on_samples=self._on_samples)
        self.outputs = OutputWriter(self.device, cfg.control.write_timeout_s, self.log)
        # The setpoint and loop mode set by command survive a restart (valvey.persist).
        self._owner = f"{ident.site}/{ident.rack}"
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
        root, site, rack = cfg.mqtt.topic_root, ident.site, ident.rack
        self._sensor_topics: dict[str, list[SensorTopic]] = {}
        for t in cfg.sensors.topics():
            self._sensor_topics.setdefault(resolve_topic(t.topic, root, site, rack), []).append(t)
        for topic in self._sensor_topics:
            self.mqtt.subscribe(topic, self._on_sensor_message, qos=0)
        self.racky_user = cfg.racky.user or cfg.mqtt.username or "valvey"
        self.racky_topics = PeerTopics.of(root, ident, cfg.racky.daemon)
        self._racky_base = self.racky_topics.cmd_base(self.racky_user)
        self.mqtt.subscribe(self.racky_topics.cmd_results(self.racky_user), self._on_racky_reply,
                            qos=1)
        self._request_failing: str | None = None
        self._pending_sends: set[asyncio.Task[None]] = set()
        self._next_state = 0.0
        self._next_telemetry = 0.0
        self._next_pid_telemetry = 0.0

    @classmethod
    def load_config(cls, path: str | os.PathLike[str]) -> ValveyConfig:
        """`load_valvey_config` (for SIGHUP reload)."""
        return load_valvey_config(path)[0]

    # -- acquisition -----------------------------------------------------------------------

    def _on_samples(self, samples: list[Sample]) -> None:
        for s in samples:
            self.latest[s.point] = s

    def _on_sensor_message(self, msg: Message) -> None:
        """An MQTT sensor message: parsed into samples (a bad payload gives BAD samples with
        the reason, never a silent drop). A message from the broker's retained store may be
        old: its age comes from the payload's ``ts_ns`` when it has one, else it counts as
        stale at once (a dead publisher's last value is never taken as fresh)."""
        mapped = self._sensor_topics.get(msg.topic)
        if not mapped:
            return
        now = msg.received_mono or self.clock.monotonic()
        wall = self.clock.wall_ns()  # wall-clock: the samples' time-series timestamp
        samples = parse_sensor_message(mapped, msg.payload, now, wall)
        if msg.retain:
            age = max(t.stale_after_s for t in mapped) + 1.0
            try:
                ts = msg.json().get("ts_ns")
                if isinstance(ts, int) and not isinstance(ts, bool):
                    age = max(0.0, (wall - ts) / 1e9)  # wall-clock: age of a retained value
            except (ValueError, AttributeError):
                pass
            samples = [replace(smp, t_mono=now - age) for smp in samples]
        for smp in samples:
            self.latest[smp.point] = smp

    def _on_racky_reply(self, msg: Message) -> None:
        """racky's reply ``{request_id, ok, error, state}`` on ``.../cmd/<user>/<verb>/result``."""
        try:
            data = msg.json()
            reply = RackyReply(str(data["request_id"]), bool(data["ok"]), data.get("error"),
                               data.get("state"))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            self.log.warning("racky_reply_unreadable", topic=msg.topic, error=str(err))
            return
        self.core.on_racky_reply(reply, self.clock.monotonic())

    def _send_requests(self, requests: list[RackyRequest]) -> None:
        """Publish valvey's requests to racky (QoS 1, not retained; rackplane's envelope).
        The tick never waits: each publish is its own task; a failure is logged once per
        change (the tracker re-sends without an acknowledgement)."""
        for req in requests:
            wall = self.clock.wall_ns()  # wall-clock: the envelope's issued_at
            issued = datetime.fromtimestamp(wall / 1e9, tz=UTC).isoformat().replace(
                "+00:00", "Z")
            env = {"request_id": req.request_id, "issued_at": issued,
                   "args": req.envelope_args()}
            self.log.info("racky_request", verb=req.verb, request_id=req.request_id,
                          safety=req.safety, args=req.envelope_args())
            task = asyncio.get_running_loop().create_task(
                self._publish_request(f"{self._racky_base}/{req.verb}", env, req.verb))
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

    def _tick(self, now: float) -> None:
        out = self.core.step(now, self.latest, telemetry_alarm_conditions(self.writer.stats))
        self.leases.tick(now, self.core.interlocks())
        for point, value in out.writes:
            self.outputs.submit(point, value)
        for tr in out.transitions:
            self.log.info("valvey_transition", change=tr, pv_status=out.loop.pv_status)
        for ev in out.events:
            self.log.warning("valvey_event", **{k: v for k, v in ev.items() if k != "kind"},
                             event=ev.get("kind"))
            self.mqtt.publish_telemetry("event", {**ev, "ts_ns": self.clock.wall_ns()})
            if str(ev.get("kind", "")).endswith("leak") or ev.get("kind") == "isolation":
                self.mqtt.publish_state("leak", {"last_event": ev, **self.core.safety.state(),
                                                 "ts_ns": self.clock.wall_ns()})
        if out.requests:
            self._send_requests(out.requests)
        self._alarms(out.alarm_events)
        self._persist_tick(now)
        self.selfmetrics.tick(now, tick_stats=self.tick_stats, writer=self.writer,
                              mqtt=self.mqtt, commands=self.commands, devices=[self.device],
                              pv_age_s=self.pv_age_s(now))
        if now >= self._next_pid_telemetry:
            # Every loop period, whatever the mode: fail-safe, a bad PV and the output the
            # valve was given must reach the time series too (not only PID updates).
            self._next_pid_telemetry = now + self.cfg.supply_loop.period_s - 1e-6
            self._pid_telemetry(out)
        if now >= self._next_telemetry:
            self._next_telemetry = now + self.cfg.control.telemetry_interval_s
            self._cdu_telemetry()
            self._alarm_snapshot()
        if now >= self._next_state:
            self._next_state = now + self.cfg.control.state_interval_s
            self._publish_state()
        self.notifier.tick()
        if not self.first_step_done.is_set():
            self.first_step_done.set()
            self.notifier.ready(f"control running, loop {out.loop.mode}")
            self.log.info(
                "ready", mode=out.loop.mode, cdu=f"{self.cfg.cdu.host}:{self.cfg.cdu.port}"
            )

    def tick(self, now: float) -> None:
        """The frame's tick hook: `_tick` (READY and the watchdog are the frame's)."""
        self._tick(now)

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
            if saved.owner != self._owner:
                raise ValueError(f"saved by {saved.owner!r}, this valvey is {self._owner!r} "
                                 "(set control.state_file per daemon)")
        except ValueError as err:
            aside = self.statefile.move_aside(wall)
            self.log.error("state_file_unusable", path=str(self.statefile.path),
                           error=f"bad data: {err}", moved_to=str(aside),
                           effect="starting from the configuration")
            return None
        restored, superseded = apply_command_state(self.core.loop, self.cfg.supply_loop, saved)
        if restored:
            self.log.info("command_state_restored", restored=restored,
                          setpoint_c=self.core.loop.setpoint_c, shadow=self.core.loop.shadow,
                          manual_output_pct=self.core.loop.manual_target_pct,
                          path=str(self.statefile.path))
        if superseded:
            self.log.warning("command_state_superseded", superseded=superseded,
                             setpoint_c=self.core.loop.setpoint_c,
                             note="the configuration's values apply")
        return saved

    def _persist_tick(self, now: float) -> None:
        """Save the command state when it changed (one save in flight, off the event loop;
        a failing save is logged once per change and retried every 10 s)."""
        cur = CommandState.of(self._owner, self.core.loop, self.cfg.supply_loop)
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
        cur = CommandState.of(self._owner, self.core.loop, self.cfg.supply_loop)
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
        their own (``supply_sensor_fault.*``), not PV age."""
        return pv_age_s([self.latest.get(self.cfg.points.supply_temp)], now)

    def _pid_telemetry(self, out: CoreOutput) -> None:
        self._supply_pid_telemetry(out)
        core = self.core
        pl = core.pumps
        self.writer.write("pid", {"loop": pl.s.mode, "device": self.cfg.cdu.name}, {
            "setpoint": pl.setpoint,
            "output_pct": pl.speed_command_pct,
            "constraint_code": PUMP_CONSTRAINT_CODES.get(core._pump.constraint, -1.0)
            if core._pump is not None else None,
            "duty_pump_index": float(pl.duty),
        })
        cap = core._cap
        self.writer.write("cdu", {"device": self.cfg.cdu.name, "loop": "secondary"}, {
            "valve_active_index": float(core.valves.active),
            "rack_power_cap_w": None if cap is None else cap.cap_w,
            "capacity_estimate_w": None if cap is None else cap.capacity_w,
            "isolated_code": 1.0 if core.safety.leak.isolation in ("closing", "closed")
            else 0.0,
        })
        room: dict[str, float | None] = {}
        for name in (self.cfg.selector.room_temp, self.cfg.selector.room_rh):
            smp = self.latest.get(name)
            room[name] = smp.value if smp is not None and smp.usable else None
        room["dew_point_c"] = core._dew_point
        self.writer.write("environment", {"device": "room"}, room)

    def _supply_pid_telemetry(self, out: CoreOutput) -> None:
        ls = out.loop
        pid = ls.pid
        fields: dict[str, float | None] = {
            "process_variable_c": ls.pv_c,
            "setpoint_c": ls.setpoint_c,
            "output_pct": ls.command_pct,
            "p_term_pct": pid.p if pid else None,
            "i_term_pct": pid.i if pid else None,
            "d_term_pct": pid.d if pid else None,
            "ff_term_pct": pid.ff if pid else None,
            "pv_quality": float(ls.pv_quality.code) if ls.pv_quality else 2.0,
            "mode_code": _MODE_CODE.get(ls.mode, -1.0),
            "bad_periods": float(ls.bad_periods),
            "output_reasserts": float(self.core.reasserts),
            "constraint_code": VALVE_CONSTRAINT_CODES.get(self.core.valve_constraint, -1.0),
            "effective_setpoint_c": ls.setpoint_c,
        }
        self.writer.write("pid", {"loop": "supply_temp", "device": self.cfg.cdu.name}, fields)

    def _cdu_telemetry(self) -> None:
        groups: dict[str, list[Sample]] = {}
        for s in self.latest.values():
            groups.setdefault(MEASUREMENT_OF_POINT.get(s.point, "cdu"), []).append(s)
        now_ns = self.clock.wall_ns()  # one line per measurement per interval
        for measurement, samples in groups.items():
            self.writer.write_samples(
                measurement, {"device": self.cfg.cdu.name, "loop": "secondary"}, samples, now_ns
            )

    def _alarms(self, events: list[AlarmEvent]) -> None:
        if not events:
            return
        active = {a.id: a for a in self.core.alarms.active()}
        for ev in events:
            self.log.warning(
                "alarm", alarm=ev.id, kind=ev.kind, severity=ev.severity, message=ev.message
            )
            snap = active.get(ev.id)
            if snap is None:
                self.mqtt.publish_alarm(ev.id, None)
            else:
                self.mqtt.publish_alarm(
                    ev.id,
                    {
                        "id": snap.id,
                        "severity": snap.severity,
                        "message": snap.message,
                        "state": snap.state,
                        "acked": snap.acked,
                        "shelved": snap.shelved,
                        "runbook": snap.runbook,
                        "value": snap.value,
                        "ts_ns": self.clock.wall_ns(),  # wall-clock: payload timestamp
                    },
                )
            self.writer.write(
                "alarm",
                {"alarm": ev.id, "severity": ev.severity},
                {
                    "active": 1.0 if snap is not None and snap.state == "active" else 0.0,
                    "severity_code": _SEVERITY_CODE.get(ev.severity, 0.0),
                    "event_code": float(
                        ["raised", "cleared", "acked", "shelved", "unshelved", "returned"].index(
                            ev.kind
                        )
                    ),
                },
            )

    def _alarm_snapshot(self) -> None:
        """Active alarms into the time series every telemetry interval (a query at any time
        finds what was active then, not only the raise/clear events)."""
        for a in self.core.alarms.active():
            self.writer.write("alarm", {"alarm": a.id, "severity": a.severity}, {
                "active": 1.0 if a.state == "active" else 0.0,
                "severity_code": _SEVERITY_CODE.get(a.severity, 0.0),
                "acked": 1.0 if a.acked else 0.0,
                "shelved": 1.0 if a.shelved else 0.0,
            })

    def _publish_state(self) -> None:
        now = self.clock.monotonic()
        ts = self.clock.wall_ns()
        for thing, state in self.core.states(now, self.latest).items():
            state["ts_ns"] = ts
            if thing == "supply_loop":
                state["valve_position_pct"] = self._value(self.cfg.points.valve_position)
            self.mqtt.publish_state(thing, state)
        self.mqtt.publish_state("health", self.health())

    def _value(self, point: str | None) -> float | None:
        s = self.latest.get(point) if point else None
        return s.value if s is not None and s.usable else None

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
            "self": self.selfmetrics.status(),
            "spool": {
                "directory": str(effective_spool(self.cfg.spool).directory),
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
        for point, value in writes:
            self.log.info("stop_action_write", point=point, value=value)
            self.outputs.submit(point, value)
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
