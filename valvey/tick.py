"""valvey's one tick: inputs in, effects out; used by the daemon and by the lock-step harness.

`ValveyTick` owns the pure core (`valvey.core.controller.ValveyCore`) and the latest sample
of every point and sensor. Its input methods take what the adapters deliver:

* `ValveyTick.on_samples`: Modbus samples, as `rackplane.io.modbus.ModbusDevice` hands them
  to its ``on_samples`` callback;
* `ValveyTick.on_sensor_message`: one MQTT message (topic, payload bytes or mapping, retain
  flag, monotonic reception time): the configured sensor mapping, the payload parse
  (`valvey.core.sensors.parse_sensor_message`) and the ageing of retained values;
* `ValveyTick.on_racky_reply`: racky's reply to one of valvey's requests.

`ValveyTick.step` runs one 10 Hz control tick and returns its `TickEffects` as plain data:
actuator writes, MQTT publishes (state, telemetry events, alarms, requests to racky with
their envelope and topic), time-series lines and log records. Applying them is the caller's
job: the daemon (valvey/app.py) hands them to its adapters; the lock-step harness
(harness/lockstep_valvey/) applies the writes to the plant and the requests to its racky
seam. Nothing here does I/O or reads a clock: times come in as arguments.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal

from rackplane.core.alarms import AlarmDef, AlarmEvent
from rackplane.core.effects import (
    FieldValue,
    LogRecord,
    TsLine,
    alarm_event,
    alarm_snapshot_line,
)
from rackplane.core.envelope import MAX_INPUT_BYTES, JsonError, read_json
from rackplane.core.samples import Quality, Sample, slots_constructor
from rackplane.core.topics import Topics
from valvey.config import ValveyConfig
from valvey.core.controller import ValveyCore
from valvey.core.output import PUMP_CONSTRAINT_CODES, VALVE_CONSTRAINT_CODES, CoreOutput
from valvey.core.requests import RackyReply, RackyRequest
from valvey.core.sensors import SensorTopic, parse_sensor_message, resolve_topic

__all__ = [
    "MEASUREMENT_OF_POINT",
    "Publish",
    "TickEffects",
    "ValveyTick",
]

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
_QUALITY_CODE = {q: float(q.code) for q in Quality}
_QUALITY_FIELD: dict[str, str] = {}  # point -> "<point>_quality" (built once per name)



@dataclass(frozen=True, slots=True)
class Publish:
    """One MQTT publication.

    Attributes:
        kind: ``state`` (retained ``state/<name>``), ``telemetry`` (``telemetry/<name>``,
            QoS 0), ``alarm`` (retained ``alarm/<name>``; ``payload`` None clears it) or
            ``request`` (a request to racky: QoS 1, not retained, on ``topic``; ``name`` is
            its verb).
        name: the thing, alarm id or verb.
        payload: JSON-ready mapping (None: clear a retained alarm).
        topic: the full topic of a ``request`` (None for the others: the link builds it).
    """

    kind: Literal["state", "telemetry", "alarm", "request"]
    name: str
    payload: Mapping[str, Any] | None
    topic: str | None = None


@dataclass(slots=True)
class TickEffects:
    """What one tick (or one input) asks of the adapters, in the order to apply them.

    Attributes:
        out: the core's output of the tick (None for effects outside a tick).
        writes: ``(point, value)`` actuator writes, in order.
        publishes: MQTT publications, in order.
        lines: time-series points, in order.
        logs: log records, in order.
        state_published: the retained states went out in this tick (the daemon adds its
            ``state/health`` beside them).
        interlocks: outputs an active interlock holds -> its alarm id
            (`ValveyCore.interlocks`; the daemon's lease gate takes it).
    """

    out: CoreOutput | None = None
    writes: list[tuple[str, float]] = field(default_factory=list)
    publishes: list[Publish] = field(default_factory=list)
    lines: list[TsLine] = field(default_factory=list)
    logs: list[LogRecord] = field(default_factory=list)
    state_published: bool = False
    interlocks: Mapping[str, str] = field(default_factory=dict)


_new_effects = slots_constructor(TickEffects)  # TickEffects(...) on every tick, all fields


def _iso(wall_ns: int) -> str:
    return datetime.fromtimestamp(wall_ns / 1e9, tz=UTC).isoformat().replace("+00:00", "Z")


class ValveyTick:
    """valvey's tick (module docstring).

    Args:
        cfg: the validated config.
        start_mono: monotonic time the daemon started [s] (the alarms' start-up inhibit
            counts from it).
        request_prefix: prefix of request ids to racky (unique per process start).
        extra_alarms: alarms fed through ``step(telemetry_alarm_conditions=...)`` (the
            daemon's telemetry-path alarms).

    Attributes:
        core: the pure core (command handlers act on it between ticks).
        latest: the latest sample of each point and sensor, by name.
        sensor_topics: the MQTT topics the sensors are mapped to (subscribe to each).
        racky_reply_topic: the topic filter of racky's replies (subscribe to it).
    """

    def __init__(self, cfg: ValveyConfig, start_mono: float, *,
                 request_prefix: str = "valvey", extra_alarms: Iterable[AlarmDef] = ()):
        self.cfg = cfg
        self.core = ValveyCore.from_config(cfg, start_mono, request_prefix=request_prefix,
                                           extra_alarms=extra_alarms)
        self.latest: dict[str, Sample] = {}
        ident = cfg.identity
        root = cfg.mqtt.topic_root
        self._sensor_topics: dict[str, list[SensorTopic]] = {}
        for t in cfg.sensor_topics():
            self._sensor_topics.setdefault(
                resolve_topic(t.topic, root, ident.site, ident.rack), []).append(t)
        self._stale_retained_s = {
            topic: max(t.stale_after_s for t in mapped) + 1.0
            for topic, mapped in self._sensor_topics.items()}
        racky_user = cfg.racky.user or cfg.mqtt.username or "valvey"
        racky = Topics(root, ident, cfg.racky.daemon)
        self._racky_base = racky.cmd_base(racky_user)
        self.racky_reply_topic = racky.cmd_results(racky_user)
        self._next_state = -math.inf
        self._next_telemetry = -math.inf
        self._next_pid_telemetry = -math.inf

    def reload(self, cfg: ValveyConfig) -> None:
        """After SIGHUP: the config the tick's telemetry reads (the loop period, the
        intervals, names). The sensor mapping and topics keep their start-up values (they
        need a restart, like the MQTT section); the core's loop settings are reloaded by
        `ValveyCore.reload`."""
        self.cfg = cfg

    @property
    def sensor_topics(self) -> list[str]:
        """Every MQTT topic a sensor is mapped to."""
        return list(self._sensor_topics)

    # -- inputs ------------------------------------------------------------------------------

    def on_samples(self, samples: Iterable[Sample]) -> None:
        """Modbus samples (one poll's, as the device adapter delivers them)."""
        # judged (plausibility) and held through failed polls (valvey.core.inputs)
        self.core.inputs.enter(self.latest, samples, polled=True)

    def on_sensor_message(self, topic: str, payload: bytes | Mapping[str, Any], *,
                          retain: bool, received_mono: float, wall_ns: int) -> bool:
        """One MQTT message on a sensor topic: parsed into samples (a bad payload gives BAD
        samples with the reason, never a silent drop). A message from the broker's retained
        store may be old: its age comes from the payload's ``ts_ns`` when it has one, else
        it counts as stale at once (a dead publisher's last value is never taken as fresh);
        so does a ``ts_ns`` in the future by more than the topic's stale limit (a publisher's
        clock or unit error: such a stamp says nothing about the value's age).

        Args:
            payload: the raw bytes (JSON) or an already decoded mapping.
            retain: the broker delivered it from its retained store.
            received_mono: monotonic time of reception [s].
            wall_ns: wall-clock time now [ns] (the samples' time-series timestamp).

        Returns:
            False when no sensor is mapped to ``topic`` (nothing changed).
        """
        mapped = self._sensor_topics.get(topic)
        if not mapped:
            return False
        if retain and not isinstance(payload, Mapping):
            # decoded once: the samples and the retained value's age both read it
            with contextlib.suppress(JsonError):
                decoded = read_json(payload, max_bytes=MAX_INPUT_BYTES)
                if isinstance(decoded, Mapping):
                    payload = decoded
        samples = parse_sensor_message(mapped, payload, received_mono, wall_ns)
        if retain:
            stale_age = self._stale_retained_s[topic]
            age = stale_age
            ts = _payload_ts_ns(payload)
            # a stamp later than now by more than the value's stale limit (a clock or unit
            # error: year 2200, µs taken for ns) gives no age: stale at once, never fresh
            if ts is not None and ts - wall_ns <= stale_age * 1e9:
                age = max(0.0, (wall_ns - ts) / 1e9)  # age of a retained value
            samples = [replace(smp, t_mono=received_mono - age) for smp in samples]
        self.core.inputs.enter(self.latest, samples, polled=False)
        return True

    def on_racky_reply(self, topic: str, payload: bytes | Mapping[str, Any],
                       now_mono: float) -> list[LogRecord]:
        """racky's reply ``{request_id, ok, error, state}`` on ``.../cmd/<user>/<verb>/result``
        to the core. Returns the log records (an unreadable reply: one warning)."""
        try:
            data = _json_mapping(payload)
            reply = RackyReply(str(data["request_id"]), bool(data["ok"]), data.get("error"),
                               data.get("state"))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            return [LogRecord("warning", "racky_reply_unreadable",
                              {"topic": topic, "error": str(err)})]
        self.core.on_racky_reply(reply, now_mono)
        return []

    # -- the tick ----------------------------------------------------------------------------

    def step(self, now_mono: float, wall_ns: int,
             telemetry_alarm_conditions: Mapping[str, bool] | None = None) -> TickEffects:
        """One control tick at monotonic ``now_mono`` [s], wall-clock ``wall_ns`` [ns].

        ``telemetry_alarm_conditions``: the conditions of the ``extra_alarms`` (alarm id ->
        bool). Telemetry lines come once per loop period (PID, pumps, capacity, room) and
        once per ``control.telemetry_interval_s`` (CDU points, active alarms); the retained
        states once per ``control.state_interval_s``.

        Raises:
            ValueError: ``now_mono`` not finite or going backwards (a caller bug).
        """
        core = self.core
        out = core.step(now_mono, self.latest, telemetry_alarm_conditions)
        fx = _new_effects(out, out.writes, [], [], [], False, core.interlocks())
        if out.transitions:
            for tr in out.transitions:
                fx.logs.append(LogRecord("info", "valvey_transition",
                                         {"change": tr, "pv_status": out.loop.pv_status}))
        if out.events:
            self._events(out.events, wall_ns, fx)
        if out.requests:
            self._requests(out.requests, wall_ns, fx)
        if out.alarm_events:
            self._alarm_events(out.alarm_events, wall_ns, fx)
        cfg = self.cfg
        if now_mono >= self._next_pid_telemetry:
            # Every loop period, whatever the mode: fail-safe, a bad PV and the output the
            # valve was given must reach the time series too (not only PID updates).
            self._next_pid_telemetry = now_mono + cfg.supply_loop.period_s - 1e-6
            self._pid_lines(out, wall_ns, fx.lines)
        if now_mono >= self._next_telemetry:
            self._next_telemetry = now_mono + cfg.control.telemetry_interval_s
            self._cdu_lines(wall_ns, fx.lines)
            self._alarm_snapshot(wall_ns, fx.lines)
        if now_mono >= self._next_state:
            self._next_state = now_mono + cfg.control.state_interval_s
            self._states(now_mono, wall_ns, fx.publishes)
            fx.state_published = True
        return fx

    def alarm_effects(self, events: list[AlarmEvent], wall_ns: int) -> TickEffects:
        """The effects of alarm changes outside the tick (an operator's ack or shelve)."""
        fx = TickEffects()
        if events:
            self._alarm_events(events, wall_ns, fx)
        return fx

    def state_effects(self, now_mono: float, wall_ns: int) -> TickEffects:
        """The retained states now (at shutdown, or on demand)."""
        fx = TickEffects(state_published=True)
        self._states(now_mono, wall_ns, fx.publishes)
        return fx

    # -- effects -----------------------------------------------------------------------------

    def _events(self, events: list[dict[str, Any]], wall_ns: int, fx: TickEffects) -> None:
        for ev in events:
            kind = ev.get("kind")
            fx.logs.append(LogRecord("warning", "valvey_event", dict(ev)))  # kind: its kind
            fx.publishes.append(Publish("telemetry", "event", {**ev, "ts_ns": wall_ns}))
            if str(kind or "").endswith("leak") or kind == "isolation":
                fx.publishes.append(Publish("state", "leak", {
                    "last_event": ev, **self.core.safety.state(), "ts_ns": wall_ns}))

    def _requests(self, requests: list[RackyRequest], wall_ns: int, fx: TickEffects) -> None:
        """valvey's requests to racky in rackplane's envelope (QoS 1, not retained)."""
        issued = _iso(wall_ns)
        for req in requests:
            args = req.envelope_args()
            fx.logs.append(LogRecord("info", "racky_request", {
                "verb": req.verb, "request_id": req.request_id, "safety": req.safety,
                "args": args}))
            fx.publishes.append(Publish(
                "request", req.verb,
                {"request_id": req.request_id, "issued_at": issued, "args": args},
                f"{self._racky_base}/{req.verb}"))

    def _alarm_events(self, events: list[AlarmEvent], wall_ns: int, fx: TickEffects) -> None:
        active = {a.id: a for a in self.core.alarms.active()}
        for ev in events:
            log, payload, line = alarm_event(ev, active.get(ev.id), wall_ns)
            fx.logs.append(log)
            fx.publishes.append(Publish("alarm", ev.id, payload))
            fx.lines.append(line)

    def _alarm_snapshot(self, wall_ns: int, lines: list[TsLine]) -> None:
        """Active alarms into the time series every telemetry interval."""
        lines.extend(alarm_snapshot_line(a, wall_ns) for a in self.core.alarms.active())

    def _pid_lines(self, out: CoreOutput, wall_ns: int, lines: list[TsLine]) -> None:
        """``pid`` of the supply loop and the pump loop, ``cdu`` (valve, cap, isolation),
        ``environment`` (room air, dew point)."""
        ls = out.loop
        pid = ls.pid
        cdu = self.cfg.cdu.name
        lines.append(TsLine("pid", {"loop": "supply_temp", "device": cdu}, {
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
            "output_reasserts": float(out.output_reasserts),
            "constraint_code": VALVE_CONSTRAINT_CODES.get(out.valve_constraint, -1.0),
            "effective_setpoint_c": ls.setpoint_c,
        }, wall_ns))
        ps = out.pump
        lines.append(TsLine("pid", {"loop": self.cfg.pump_loop.mode, "device": cdu}, {
            "setpoint": out.pump_setpoint,
            "output_pct": None if ps is None else ps.speed_command_pct,
            "constraint_code": None if ps is None
            else PUMP_CONSTRAINT_CODES.get(ps.constraint, -1.0),
            "duty_pump_index": None if ps is None else float(ps.duty),
        }, wall_ns))
        cap = out.cap
        lines.append(TsLine("cdu", {"device": cdu, "loop": "secondary"}, {
            "valve_active_index": float(out.valve_active_index),
            "rack_power_cap_w": None if cap is None else cap.cap_w,
            "capacity_estimate_w": None if cap is None else cap.capacity_w,
            "liquid_fraction": cap.liquid_fraction if cap is not None else None,
            "isolated_code": 1.0 if out.leak_isolation in ("closing", "closed") else 0.0,
            # what the core learned of its plant (issue 21): the active valve's stroke time in
            # use (learned, else configured) and the steady states the FF map learned from
            "valve_stroke_s": self.core.valves.stroke_time_s(out.valve_active_index),
            "ff_map_adaptations": float(self.core.ff.adaptations),
        }, wall_ns))
        room: dict[str, FieldValue] = {}
        sel = self.cfg.selector
        for name in (sel.room_temp, sel.room_rh):
            smp = self.latest.get(name)
            room[name] = smp.value if smp is not None and smp.usable else None
        room["dew_point_c"] = out.dew_point_c
        lines.append(TsLine("environment", {"device": "room"}, room, wall_ns))

    def _cdu_lines(self, wall_ns: int, lines: list[TsLine]) -> None:
        """Every point's latest sample, one line per measurement: ``<point>`` = value
        (usable samples) and ``<point>_quality`` = quality code (all: DESIGN §3)."""
        cdu = self.cfg.cdu.name
        groups: dict[str, dict[str, FieldValue]] = {}
        measurement_of = MEASUREMENT_OF_POINT.get
        good = Quality.GOOD
        qnames = _QUALITY_FIELD
        for s in self.latest.values():
            point, q, v = s.point, s.quality, s.value
            f = groups.get(m := measurement_of(point, "cdu"))
            if f is None:
                f = groups[m] = {}
            if q is good and v is not None and v - v == 0.0:  # Sample.usable
                f[point] = v
            qname = qnames.get(point)
            if qname is None:
                qname = qnames[point] = point + "_quality"
            f[qname] = _QUALITY_CODE[q]
        for measurement, fields in groups.items():
            lines.append(TsLine(measurement, {"device": cdu, "loop": "secondary"}, fields,
                                wall_ns))

    def _states(self, now_mono: float, wall_ns: int, publishes: list[Publish]) -> None:
        for thing, state in self.core.states(now_mono, self.latest).items():
            state["ts_ns"] = wall_ns
            if thing == "supply_loop":
                state["valve_position_pct"] = self.value(self.cfg.points.valve_position)
            publishes.append(Publish("state", thing, state))

    def value(self, point: str | None) -> float | None:
        """The latest usable value of ``point`` (None: none, or not usable)."""
        s = self.latest.get(point) if point else None
        return s.value if s is not None and s.usable else None


def _json_mapping(payload: bytes | Mapping[str, Any]) -> Mapping[str, Any]:
    """The payload as a mapping (`read_json`: bounded, strict). Raises ValueError (not JSON,
    too large, too deep) or TypeError (not an object)."""
    if isinstance(payload, Mapping):
        return payload
    data = read_json(payload, max_bytes=MAX_INPUT_BYTES)
    if not isinstance(data, Mapping):
        raise TypeError(f"a JSON object is expected, got {type(data).__name__}")
    return data


def _payload_ts_ns(payload: bytes | Mapping[str, Any]) -> int | None:
    """The payload's integer ``ts_ns`` (None: none, or not a JSON object)."""
    try:
        ts = _json_mapping(payload).get("ts_ns")
    except (ValueError, TypeError, AttributeError):
        return None
    return ts if isinstance(ts, int) and not isinstance(ts, bool) else None
