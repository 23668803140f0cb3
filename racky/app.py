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
import json
import math
import os
from collections.abc import Coroutine, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Unpack

import numpy as np

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
from rackplane.topics import PeerTopics
from racky.commands import register_racky_commands
from racky.config import RackyConfig, ShelfPoints, state_path
from racky.core.alarmbank import kind_of_def
from racky.core.controller import CoreOutput, RackyCore, RackyInputs
from racky.core.discovery import DiscoveryPlan
from racky.core.power import AgentCommand
from racky.core.telemetry import PayloadError, StaleMessage, TelemetryIngest, decode_payload
from racky.core.thermal import CoolingReading
from racky.core.validation import ValidationResult
from racky.persist import StateStore
from racky.report import write_report

DAEMON = "racky"

__all__ = ["DAEMON", "MAX_INPUT_PAYLOAD_BYTES", "Racky", "load_racky_config", "shelf_target"]
_SEVERITY_CODE = {"warning": 1.0, "minor": 2.0, "major": 3.0, "critical": 4.0}
_EVENT_KINDS = ["raised", "cleared", "acked", "shelved", "unshelved", "returned"]
MAX_INPUT_PAYLOAD_BYTES = 1 << 20
"""Largest node-agent / cooling payload racky parses (bytes): a tray message of an NVL72
tray is ~13 kB; a larger one is refused before it is decoded (parsing tens of MB would stall
the tick)."""


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
        ident = cfg.identity
        self.store = StateStore(state_path(cfg.lifecycle.state_file),
                                cfg.lifecycle.initial_state)
        persisted = self.store.load(clock.wall_ns())
        for note in persisted.notes:
            self.log.error("state_file_unusable", note=note,
                           lifecycle=persisted.lifecycle.state)
        self.core = RackyCore(cfg, clock.monotonic(), persisted)
        # The telemetry path's alarms (issue 7) are the daemon's, not the pure core's: fed
        # from the writer's stats in the tick.
        self.core.bank.add_kinds(kind_of_def(d) for d in TELEMETRY_ALARMS)
        self._saved_version = 0
        self.latest: dict[str, dict[str, Sample]] = {}
        self.devices: dict[str, ModbusDevice] = {}
        for s in cfg.power_shelves:
            self._add_device(s)
        self.plan: DiscoveryPlan | None = None
        if cfg.discovery.enabled:
            ex = [s.unit_id for s in cfg.power_shelves
                  if s.host == cfg.discovery.host and s.port == cfg.discovery.port]
            self.plan = DiscoveryPlan(cfg.discovery, ex)
        self._device_started: dict[str, float] = {}
        a = cfg.node_agents
        self.ingest = TelemetryIngest(a.trays, a.gpus_per_tray, tuple(cfg.links.counters))
        root = cfg.mqtt.topic_root
        self.agent_topics = PeerTopics.of(root, ident, a.daemon)
        self.agent_base = self.agent_topics.base
        self.agent_user = cfg.command_user
        self.mqtt.subscribe(self.agent_topics.telemetry(), self._on_agent_telemetry, qos=0)
        self.mqtt.subscribe(self.agent_topics.cmd_results(self.agent_user), self._on_agent_reply,
                            qos=1)
        c = cfg.cooling
        self.cooling_topic = PeerTopics.of(root, ident, c.daemon).state(c.state_thing)
        self.mqtt.subscribe(self.cooling_topic, self._on_cooling, qos=1)
        if c.plant_topic:
            self.mqtt.subscribe(c.plant_topic, self._on_plant, qos=0)
        self._cooling: dict[str, float | None] = {}
        self._plant: dict[str, float | None] = {}
        self._cooling_t: float | None = None
        self._plant_t: float | None = None
        self._payload_problem: dict[str, str] = {}
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
        self._request_n = 0
        self._pending: dict[str, tuple[tuple[int, ...], float]] = {}
        self.agent_stats = {"sent": 0, "ok": 0, "refused": 0, "lost": 0, "send_errors": 0}
        self._send_failing = False
        self._bg: set[asyncio.Task[Any]] = set()
        self._next_state = 0.0
        self._next_node = 0.0
        self._next_link = 0.0
        self._started = self.started_mono
        # node-agent contract v1: racky's epoch (its start, ms since the Unix epoch): agents
        # drop commands of an older racky
        self.agent_epoch = self.clock.wall_ns() // 1_000_000
        self.reports: list[Path] = []

    @classmethod
    def load_config(cls, path: str | os.PathLike[str]) -> RackyConfig:
        """`load_racky_config` (for SIGHUP reload)."""
        return load_racky_config(path)

    # --- acquisition --------------------------------------------------------------------

    def _add_device(self, s: ModbusTargetSettings) -> ModbusDevice:
        self.latest[s.name] = {}

        def collect(samples: list[Sample], name: str = s.name) -> None:
            self.latest[name] = {x.point: x for x in samples}

        dev = ModbusDevice(s, clock=self.clock, on_samples=collect)
        self.devices[s.name] = dev
        return dev

    def _on_agent_telemetry(self, msg: Message) -> None:
        thing = msg.topic.rsplit("/", 1)[-1]
        if not thing.startswith(self.cfg.node_agents.tray_thing_prefix):
            return
        t = msg.received_mono or self.clock.monotonic()
        suffix = thing[len(self.cfg.node_agents.tray_thing_prefix):]
        ingested = False  # tray_payload counts its own refusals in ingest.errors
        try:
            if not (suffix.isascii() and suffix.isdigit()):
                raise PayloadError(f"topic {thing!r}: not <prefix><tray index>")
            if len(msg.payload) > MAX_INPUT_PAYLOAD_BYTES:
                raise PayloadError(f"payload: more than {MAX_INPUT_PAYLOAD_BYTES} bytes")
            payload = decode_payload(msg.payload)
            ingested = True
            self.ingest.tray_payload(payload, t, retained=msg.retain,
                                     expected_tray=int(suffix))
        except StaleMessage as err:
            # counted (``stale_messages`` in the status); logged once per kind per tray
            key = f"{thing}:stale:{err}"
            if key not in self._payload_problem:
                self._payload_problem[key] = str(err)
                self.log.warning("agent_telemetry_not_newest", thing=thing, error=str(err),
                                 note="refused, not taken as fresh; counted in stale_messages")
            return
        except (ValueError, RecursionError) as err:  # PayloadError is a ValueError
            if not ingested or not isinstance(err, PayloadError):  # not counted yet: a bad
                # topic, oversize, not JSON, not the contract
                self.ingest.errors += 1  # every refused tray message counts (state/health)
            why = str(err)[:200]
            if self._payload_problem.get(thing) != why:
                self._payload_problem[thing] = why
                self.log.warning("agent_telemetry_refused", thing=thing, error=why,
                                 note="the tray's last reading ages and goes stale")
            return
        if self._payload_problem.pop(thing, None) is not None:
            self.log.info("agent_telemetry_recovered", thing=thing)

    def _on_agent_reply(self, msg: Message) -> None:
        try:
            data = json.loads(msg.payload.decode("utf-8"))
        except ValueError:
            return
        if not isinstance(data, dict):
            return
        rid = data.get("request_id")
        entry = self._pending.pop(rid, None) if isinstance(rid, str) else None
        if entry is None:
            return
        trays, _ = entry
        ok = data.get("ok") is True  # bool("false") is True: only a JSON true is success
        err = data.get("error") or {}
        why = f"{err.get('code')}: {err.get('message')}" if isinstance(err, dict) else str(err)
        self.core.agent_reply(trays, ok, None if ok else why)
        self.agent_stats["ok" if ok else "refused"] += 1
        if not ok:
            self.log.warning("agent_refused", trays=list(trays), error=why[:300])

    @staticmethod
    def _num(d: Mapping[str, Any], *keys: str) -> float | None:
        for k in keys:
            v = d.get(k)
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
                return float(v)
        return None

    def _arrival(self, msg: Message, d: Mapping[str, Any]) -> float:
        """When a cooling/plant message counts as read (monotonic s). A message from the
        broker's retained store may be old (valvey stopped an hour ago): its age comes from the
        payload's ``ts_ns``, else it counts as stale at once; a dead publisher's last value is
        never taken as fresh (it would let the derate release on old facility water)."""
        now = msg.received_mono or self.clock.monotonic()
        if not msg.retain:
            return now
        age = self.cfg.power.derate.stale_after_s + self.cfg.cooling.stale_after_s + 1.0
        ts = d.get("ts_ns")
        if isinstance(ts, int) and not isinstance(ts, bool):
            wall = self.clock.wall_ns()  # wall-clock: age of a retained value
            age = max(0.0, (wall - ts) / 1e9)
        return now - age

    def _json_object(self, msg: Message, what: str) -> dict[str, Any] | None:
        """The payload as a JSON object, or None (logged once per distinct problem)."""
        try:
            if len(msg.payload) > MAX_INPUT_PAYLOAD_BYTES:
                raise ValueError(f"more than {MAX_INPUT_PAYLOAD_BYTES} bytes")
            d = json.loads(msg.payload.decode("utf-8"))
        except (ValueError, RecursionError) as err:
            why = f"not JSON: {str(err)[:120]}"
        else:
            if isinstance(d, dict):
                self._payload_problem.pop(what, None)
                return d
            why = "not a JSON object"
        if self._payload_problem.get(what) != why:
            self._payload_problem[what] = why
            self.log.warning(f"{what}_refused", topic=msg.topic, error=why,
                             note="the previous reading ages and goes stale")
        return None

    def _on_cooling(self, msg: Message) -> None:
        d = self._json_object(msg, "cooling_state")
        if d is None:
            return
        self._cooling = {
            "supply_temp_c": self._num(d, "supply_temp_c"),
            "setpoint_c": self._num(d, "setpoint_c"),
            "flow_lpm": self._num(d, "flow_lpm"),
            "facility_supply_temp_c": self._num(d, "facility_supply_temp_c"),
            "valve_position_pct": self._num(d, "valve_position_pct", "valve_command_pct"),
        }
        self._cooling_t = self._arrival(msg, d)

    def _on_plant(self, msg: Message) -> None:
        d = self._json_object(msg, "plant_telemetry")
        if d is not None:
            self._plant = {"flow_lpm": self._num(d, "flow_lpm"),
                           "facility_supply_temp_c": self._num(d, "facility_supply_temp_c")}
            self._plant_t = self._arrival(msg, d)

    def cooling_reading(self) -> CoolingReading | None:
        """valvey's state (and the plant topic's flow / facility water when valvey's lacks
        them), stamped with when it arrived (the older of the two when both are used)."""
        if self._cooling_t is None:
            return None
        c = dict(self._cooling)
        t = self._cooling_t
        for k in ("flow_lpm", "facility_supply_temp_c"):
            if c.get(k) is None and self._plant.get(k) is not None and self._plant_t is not None:
                c[k] = self._plant[k]
                t = min(t, self._plant_t)  # the reading is as old as its oldest part
        return CoolingReading(
            t_mono=t, supply_temp_c=c.get("supply_temp_c"),
            setpoint_c=c.get("setpoint_c"), flow_lpm=c.get("flow_lpm"),
            facility_supply_temp_c=c.get("facility_supply_temp_c"),
            valve_position_pct=c.get("valve_position_pct"),
        )

    # --- node-agent commands ------------------------------------------------------------

    def _send_agent_commands(self, cmds: list[AgentCommand]) -> None:
        """Queue ``set_power_limits`` for each command (never raises)."""
        for c in cmds:
            self._request_n += 1
            rid = f"racky-{self._started:.0f}-{self._request_n}"[:64]
            issued = datetime.fromtimestamp(self.clock.wall_ns() / 1e9, UTC)  # wall-clock: envelope
            payload = {"request_id": rid, "issued_at": issued.isoformat().replace("+00:00", "Z"),
                       "args": c.wire_args(self.agent_epoch)}
            topic = f"{self.agent_base}/cmd/{self.agent_user}/set_power_limits"
            self._pending[rid] = (c.trays, self.clock.monotonic())
            self.agent_stats["sent"] += 1
            self.log.info("agent_command", trays=list(c.trays), args=c.args, reason=c.reason,
                          request_id=rid)
            try:
                task = asyncio.get_running_loop().create_task(self._publish(topic, payload))
            except RuntimeError:  # no loop (tests driving the core directly)
                continue
            self._bg.add(task)
            task.add_done_callback(self._bg.discard)

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

    def _expire_pending(self, now: float) -> None:
        lim = self.cfg.node_agents.reply_timeout_s
        for rid in [r for r, (_, t) in self._pending.items() if now - t > lim]:
            del self._pending[rid]
            self.agent_stats["lost"] += 1

    # --- the tick -----------------------------------------------------------------------

    def _tick(self, now: float) -> None:
        wall = self.clock.wall_ns()
        self.ingest.update_gpu_columns()
        inp = RackyInputs(self.latest, dict(self.ingest.trays), self.ingest.frame,
                          self.cooling_reading())
        out = self.core.step(now, inp, wall)
        self.leases.tick(now, {})  # racky's safety acts through SAFETY_VERBS, not leases
        self._send_agent_commands(out.commands)
        self._expire_pending(now)
        events = list(out.alarm_events)
        for aid, cond in telemetry_alarm_conditions(self.writer.stats).items():
            events += self.core.bank.update(now, aid, [""] if cond else [])
        self._alarms(events)
        self.selfmetrics.tick(now, tick_stats=self.tick_stats, writer=self.writer,
                              mqtt=self.mqtt, commands=self.commands,
                              devices=list(self.devices.values()),
                              pv_age_s=self.pv_age_s(now))
        self.mqtt.publish_state("rack_power", self.core.rack_power_payload(wall))
        self._telemetry(now, wall, out)
        if now >= self._next_state:
            self._next_state = now + self.cfg.control.state_interval_s
            self._publish_state(wall)
        if self.core.persist_version != self._saved_version:
            self._saved_version = self.core.persist_version
            self._spawn(self._save_state())
            self._publish_state(wall)
        if out.validation_result is not None:
            self._spawn(self._write_report(out.validation_result, wall))
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

    def tick(self, now: float) -> None:
        """The frame's tick hook: `_tick` (READY and the watchdog are the frame's)."""
        self._tick(now)

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

    def _telemetry(self, now: float, wall: int, out: CoreOutput) -> None:
        w = self.writer
        for name, samples in self.latest.items():
            if samples:
                w.write_samples("power_shelf", {"device": name}, samples.values(), wall)
        lim = out.limit
        w.write("rack", {"device": "rack"}, {
            "rack_power_w": out.rack_power_w, "it_power_w": out.it_power_w,
            "limit_w": lim.limit_w, "capacity_w": out.shelves.capacity_w,
            "derate_w": self.core.derate.cap_w,
            "caps_total_w": None if np.isnan(out.caps_w).all()
            else float(np.nansum(out.caps_w)),
            "min_t_limit_c": out.thermal.min_margin_c
            if math.isfinite(out.thermal.min_margin_c) else None,
            "trays_off": float(sum(1 for x in self.core.desired_powered if x is False)),
        }, wall)
        if now >= self._next_node:
            self._next_node = now + self.cfg.control.node_telemetry_interval_s
            for k, r in self.core.readings.items():
                cap = out.caps_w[k] if 0 <= k < len(out.caps_w) else math.nan
                w.write("node", {"device": f"tray{k:02d}"}, {
                    "power_w": r.power_w, "powered": 1.0 if r.powered else 0.0,
                    "cap_w": None if math.isnan(cap) else float(cap),
                    "enforced_tray_cap_w": r.agent.enforced_tray_cap_w,
                    "coolant_out_temp_c": r.coolant_out_temp_c
                    if math.isfinite(r.coolant_out_temp_c) else None,
                    "hottest_gpu_temp_c": float(np.nanmax(r.gpu_temp_c))
                    if np.isfinite(r.gpu_temp_c).any() else None,
                }, wall)
        lk = self.core.links
        if lk is not None and now >= self._next_link:
            self._next_link = now + self.cfg.control.link_telemetry_interval_s
            figs = lk.port_figures()
            for i, name in enumerate(lk.names):
                w.write("link", {"port": name}, {
                    k: (None if not math.isfinite(v[i]) else float(v[i]))
                    for k, v in figs.items()}, wall)

    def _alarms(self, events: list[AlarmEvent]) -> None:
        if not events:
            return
        for ev in events:
            self.log.warning("alarm", alarm=ev.id, kind=ev.kind, severity=ev.severity,
                             message=ev.message)
            snap = self.core.bank.snapshot(ev.id)
            if snap is None:
                self.mqtt.publish_alarm(ev.id, None)
            else:
                self.mqtt.publish_alarm(ev.id, {
                    "id": snap.id, "severity": snap.severity, "message": snap.message,
                    "state": snap.state, "acked": snap.acked, "shelved": snap.shelved,
                    "runbook": snap.runbook, "value": snap.value,
                    "ts_ns": self.clock.wall_ns(),  # wall-clock: payload timestamp
                })
            self.writer.write("alarm", {"alarm": ev.id, "severity": ev.severity}, {
                "active": 1.0 if snap is not None and snap.state == "active" else 0.0,
                "severity_code": _SEVERITY_CODE.get(ev.severity, 0.0),
                "event_code": float(_EVENT_KINDS.index(ev.kind)),
            })

    def _publish_state(self, wall: int) -> None:
        st = self.core.state()
        st["ts_ns"] = wall
        self.mqtt.publish_state("rack", st)
        self.mqtt.publish_state("health", self.health())

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
                    self.latest[name] = {
                        k: s.as_stale("dormant") if s.quality is Quality.GOOD else s
                        for k, s in self.latest.get(name, {}).items()}
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
