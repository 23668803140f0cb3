"""racky's tick: its inputs, one call per tick, its effects as plain data (issue 13).

The daemon (`racky.app.Racky`) and the lock-step harness (``harness/lockstep_racky/``) drive
the same `RackyTick`, so a lock-step figure is a figure of the daemon's code. Pure: no
asyncio, no sockets, no clock (times are passed in), no `rackplane.io` import.

Inputs (between ticks, in any order):

* `RackyTick.shelf_samples` (a shelf's Modbus samples as the register-map decoder made them;
  the daemon's Modbus adapter, or the harness's register image);
* `RackyTick.message` (an MQTT message racky subscribes to: ``<agents>/telemetry/trayNN`` node
  agent telemetry through `racky.core.telemetry.TelemetryIngest`,
  ``<agents>/cmd/<user>/set_power_limits/result`` replies, valvey's ``state/<state_thing>``,
  the optional plant topic), with its retain flag and monotonic receive time.

`RackyTick.step` (``now_mono``, ``wall_ns``) calls `racky.core.controller.RackyCore.step` and
returns `TickEffects`: the ``set_power_limits`` publishes to the node agents, the state
publishes, the alarm publishes, the telemetry lines (measurement, tags, fields, wall ns; the
writer adds the identity tags), log records, whether the persisted state changed, a finished
validation. The caller applies them (the daemon: MQTT, the telemetry writer, a worker thread
for the state file; the harness: the simulator's node agents).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from rackplane.core.alarms import AlarmEvent
from rackplane.core.effects import LogRecord, TsLine, alarm_event
from rackplane.core.envelope import MAX_INPUT_BYTES, JsonError, read_json
from rackplane.core.polling import hold_good
from rackplane.core.samples import Quality, Sample
from rackplane.core.topics import Topics
from rackplane.core.tray_reply import ReplyReading, ReplyStateError, parse_reply_state
from racky.config import RackyConfig
from racky.core.agent_settings import AgentCommand
from racky.core.alarmbank import AlarmKind
from racky.core.controller import CoreOutput, RackyCore, RackyInputs
from racky.core.linkframe import PayloadError
from racky.core.telemetry import StaleMessage, TelemetryIngest, decode_payload
from racky.core.thermal import CoolingReading
from racky.core.validation import ValidationResult

__all__ = ["AgentPublish", "RackyTick",
           "TickEffects", "TickTopics", "sample_fields"]


@dataclass(frozen=True, slots=True)
class AgentPublish:
    """One ``set_power_limits`` command racky publishes (QoS 1, not retained).

    Attributes:
        topic: ``<agents>/cmd/<user>/set_power_limits``.
        payload: rackplane's command envelope (``request_id``, ``issued_at``, ``args``).
        trays: the trays it addresses; reason: why (logged).
    """

    topic: str
    payload: dict[str, Any]
    trays: tuple[int, ...]
    reason: str


@dataclass
class TickEffects:
    """What one tick (or one command handler's agent commands / alarm events) decided.

    Attributes:
        agent_commands: publishes to the node agents, in order.
        states: ``state/<thing>`` publishes (retained), in order; after ``rack`` the daemon
            also publishes its ``state/health``.
        alarms: ``alarm/<id>`` publishes: the alarm's payload, or None (cleared: the retained
            message is removed).
        alarm_events: the alarm events behind ``alarms`` (core and telemetry-path alarms).
        lines: telemetry points, in order.
        logs: log records, in order.
        save_state: the persisted state changed (write the state file).
        validation_result: a validation finished this tick (write its report).
        output: the core's output (None for effects outside a tick).
    """

    agent_commands: list[AgentPublish] = field(default_factory=list)
    states: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    alarms: list[tuple[str, dict[str, Any] | None]] = field(default_factory=list)
    alarm_events: list[AlarmEvent] = field(default_factory=list)
    lines: list[TsLine] = field(default_factory=list)
    logs: list[LogRecord] = field(default_factory=list)
    save_state: bool = False
    validation_result: ValidationResult | None = None
    output: CoreOutput | None = None


@dataclass(frozen=True, slots=True)
class TickTopics:
    """The topics racky reads and writes besides its own ``state``/``alarm``/``cmd`` ones,
    built once from the config (`rackplane.core.topics.Topics` of its peers)."""

    agents: Topics
    agent_user: str
    tray_prefix: str
    cooling: str
    plant: str | None

    @classmethod
    def of(cls, cfg: RackyConfig) -> TickTopics:
        """From the config (``mqtt.topic_root``, identity, ``node_agents``, ``cooling``)."""
        root, ident, c = cfg.mqtt.topic_root, cfg.identity, cfg.cooling
        return cls(Topics(root, ident, cfg.node_agents.daemon), cfg.command_user,
                   cfg.node_agents.tray_thing_prefix,
                   Topics(root, ident, c.daemon).state(c.state_thing), c.plant_topic or None)

    @property
    def agent_base(self) -> str:
        """``<root>/<site>/<rack>/<node agents' daemon>``."""
        return self.agents.base

    @property
    def telemetry(self) -> str:
        """The node agents' telemetry topics (a filter)."""
        return self.agents.telemetry_filter

    @property
    def command(self) -> str:
        """Where racky sends ``set_power_limits``."""
        return self.agents.cmd(self.agent_user, "set_power_limits")

    @property
    def replies(self) -> str:
        """The agents' replies to racky's commands (a filter)."""
        return self.agents.cmd_results(self.agent_user)


def sample_fields(samples: Iterable[Sample]) -> dict[str, float | None]:
    """The fields of one ``power_shelf`` line as the writer's ``write_samples`` makes them at
    one timestamp: ``<point> = value`` (usable samples) and ``<point>_quality = code`` (all)."""
    f: dict[str, float | None] = {}
    for s in samples:
        if s.usable:
            f[s.point] = s.value
        f[f"{s.point}_quality"] = float(s.quality.code)
    return f


def _num(d: Mapping[str, Any], *keys: str) -> float | None:
    for k in keys:
        v = d.get(k)
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            return float(v)
    return None


INPUT_IMPLAUSIBLE = AlarmKind(
    "input_implausible", "major", "input {thing} outside its plausibility window ({detail}): "
    "not believed, cooling counts as unknown (the derate holds)",
    runbook="racky.input_implausible")


class RackyTick:
    """racky's inputs, tick and effects (see the module docstring).

    Args:
        cfg: the validated config.
        core: the core it drives (`RackyCore`, constructed by the caller with its persisted
            state and start time).
        started_mono: when the daemon started, monotonic s (request ids; the first state
            publish is due at once).
        agent_epoch: the epoch every ``set_power_limits`` carries (node-agent contract v1:
            agents drop a command of an older epoch than the newest they have seen); the
            daemon passes `rackplane.core.tray_contract.command_epoch` (a single instance:
            its start time in ms since the Unix epoch; one of a pair: 2**62 + its lease
            epoch, set again on each takeover).
        request_prefix: the request ids' prefix (``racky``; one of a pair adds its instance:
            the two instances' ids never collide at the agents' de-duplication).

    Attributes:
        latest: per shelf device name, point -> the newest `Sample`.
        ingest: the node agents' telemetry (`TelemetryIngest`).
        pending: request id -> (trays, sent at monotonic s) of unanswered agent commands.
        agent_stats: sent / ok / refused / lost / send_errors counts (``state/health``);
            ``deferred``: tray-ticks the cap loop sent a tray nothing new because its last
            command was still unanswered (`awaiting_trays`; one command in flight per tray);
            of the ok replies, ``unconfirmed`` (the agent could not read its limits back yet),
            ``legacy_replies`` (an agent older than contract 1.3: the older reply layout,
            read during the deprecation window) and ``bad_reply_state`` (a state racky cannot
            read: the command counts as ok, the read-back is not kept).
        agent_readback: tray -> the newest ok reply's read-back (`ReplyReading`: per-GPU
            enforced limits and the tray figure, W).
        sending: False while one of a pair is standby: the commands its shadow core decides
            are counted in ``withheld_commands`` and go nowhere (no publish, no pending).
        payload_problems: what is wrong with an input now (``trayNN``, ``cooling_state``,
            ``plant_telemetry`` -> why), so each problem is logged once until it clears.
    """

    def __init__(self, cfg: RackyConfig, core: RackyCore, started_mono: float, *,
                 agent_epoch: int = 0, request_prefix: str = "racky") -> None:
        self.cfg = cfg
        self.agent_epoch = agent_epoch
        self.request_prefix = request_prefix
        self.sending = True
        self.withheld_commands = 0
        self.core = core
        self.topics = TickTopics.of(cfg)
        a = cfg.node_agents
        self.ingest = TelemetryIngest(a.trays, a.gpus_per_tray, tuple(cfg.links.counters))
        self.latest: dict[str, dict[str, Sample]] = {}
        self.pending: dict[str, tuple[tuple[int, ...], float]] = {}
        self.agent_stats = {"sent": 0, "ok": 0, "refused": 0, "lost": 0, "send_errors": 0,
                            "unconfirmed": 0, "legacy_replies": 0, "bad_reply_state": 0,
                            "deferred": 0}
        self.agent_readback: dict[int, ReplyReading] = {}
        self.started_mono = started_mono
        self._request_n = 0
        self._cooling: dict[str, float | None] = {}
        self._cooling_alarms: tuple[str, ...] | None = None  # valvey's active alarm ids
        self._plant: dict[str, float | None] = {}
        self._cooling_t: float | None = None
        self._plant_t: float | None = None
        self.payload_problems: dict[str, str] = {}
        self.readback_lowered = False
        """A tray's telemetry read its enforced cap back lower than its previous message did
        (set by `agent_telemetry`, cleared by `take_readback_lowered`): racky's fleet side wakes
        the tick on it while a decrease awaits its acknowledgement (`racky.fleet`)."""
        self.invalid_inputs = 0
        """Cooling / plant / agent-reply messages refused (not a JSON object) and cooling
        values outside their windows, since start (self-metric ``input_invalid_samples``
        with the refused tray messages, ``ingest.errors``)."""
        self._logs: list[LogRecord] = []
        self._saved_version = 0
        self._next_state = 0.0
        self._next_node = 0.0
        self._next_link = 0.0
        self._telemetry_prefix = self.topics.telemetry.removesuffix("+")
        self._reply_prefix = self.topics.agents.cmd_base(self.topics.agent_user) + "/"
        # the shelves' stale limit as the core applies it (RackyCore.step: read_shelves)
        self._shelf_hold_s = cfg.shelf_stale_after_s
        self._implausible: dict[str, dict[str, str]] = {"cooling": {}, "plant": {},
                                                         "trays": {}}
        if "input_implausible" not in core.bank.kinds:
            core.bank.add_kinds([INPUT_IMPLAUSIBLE])

    # --- inputs -----------------------------------------------------------------------------

    def shelf_samples(self, device: str, samples: Iterable[Sample]) -> None:
        """A shelf's newest poll: one sample per point (replaces the previous poll's). A
        failed poll's STALE samples (no value) do not end a good value before the shelves'
        stale limit (`rackplane.core.polling.hold_good`: a value is good until its stale limit
        after its last good read; the core judges the age)."""
        prev = self.latest.get(device, {})
        hold_s = self._shelf_hold_s
        self.latest[device] = {
            x.point: hold_good(prev.get(x.point), x, hold_s) if (
                x.quality is Quality.STALE and x.value is None) else x
            for x in samples}

    def take_readback_lowered(self) -> bool:
        """Whether an enforced cap was read back lower since the last call (then cleared)."""
        out, self.readback_lowered = self.readback_lowered, False
        return out

    def take_logs(self) -> list[LogRecord]:
        """The log records the input methods made since the last call (then cleared)."""
        out, self._logs = self._logs, []
        return out

    def _log(self, level: str, event: str, **fields: Any) -> None:
        self._logs.append(LogRecord(level, event, fields))

    def message(self, topic: str, payload: bytes, *, retain: bool, received_mono: float,
                wall_ns: int) -> None:
        """An MQTT message on one of racky's input subscriptions (dispatched by topic; others
        are ignored). ``received_mono``: when it arrived (monotonic s); ``wall_ns``: the wall
        clock then (the age of a retained cooling value). Never raises: a bad message is
        counted / logged (`take_logs`)."""
        if topic == self.topics.cooling:
            self.cooling_state(topic, payload, retain=retain, received_mono=received_mono,
                               wall_ns=wall_ns)
        elif self.topics.plant is not None and topic == self.topics.plant:
            # before the agents' telemetry: the simulator's plant topic may share its level
            self.plant_telemetry(topic, payload, retain=retain, received_mono=received_mono,
                                 wall_ns=wall_ns)
        elif topic.startswith(self._telemetry_prefix):
            self.agent_telemetry(topic, payload, retain=retain, received_mono=received_mono)
        elif topic.startswith(self._reply_prefix) and topic.endswith("/result"):
            self.agent_reply(topic, payload)

    def agent_telemetry(self, topic: str, payload: bytes, *, retain: bool,
                        received_mono: float) -> None:
        """``<agents>/telemetry/<thing>``: a ``trayNN`` message into the ingest (refusals are
        counted in ``ingest.errors`` / ``ingest.stale_messages`` and logged once per kind)."""
        thing = topic.rsplit("/", 1)[-1]
        prefix = self.topics.tray_prefix
        if not thing.startswith(prefix):
            return
        suffix = thing[len(prefix):]
        ingested = False  # tray_payload counts its own refusals in ingest.errors
        try:
            if not (suffix.isascii() and suffix.isdigit()):
                raise PayloadError(f"topic {thing!r}: not <prefix><tray index>")
            if len(payload) > MAX_INPUT_BYTES:
                raise PayloadError(f"payload: more than {MAX_INPUT_BYTES} bytes")
            data = decode_payload(payload)
            ingested = True
            prev = self.ingest.trays.get(int(suffix))
            self.ingest.tray_payload(data, received_mono, retained=retain,
                                     expected_tray=int(suffix))
            why_implausible = self._tray_implausible(int(suffix))
            if why_implausible is not None:
                # not believed: the tray keeps its previous reading, which ages and goes stale
                # (the same fate as any refused tray message); alarm input_implausible
                if prev is None:
                    self.ingest.trays.pop(int(suffix), None)
                else:
                    self.ingest.trays[int(suffix)] = prev
                self.ingest.errors += 1
                self._implausible["trays"][thing] = why_implausible
                raise PayloadError(why_implausible)
            self._implausible["trays"].pop(thing, None)
            new = self.ingest.trays.get(int(suffix))
            if prev is not None and new is not None and \
                    new.agent.enforced_tray_cap_w < prev.agent.enforced_tray_cap_w:
                self.readback_lowered = True
        except StaleMessage as err:
            key = f"{thing}:stale:{err}"
            if key not in self.payload_problems:
                self.payload_problems[key] = str(err)
                self._log("warning", "agent_telemetry_not_newest", thing=thing, error=str(err),
                          note="refused, not taken as fresh; counted in stale_messages")
            return
        except (ValueError, RecursionError) as err:  # PayloadError is a ValueError
            if not ingested or not isinstance(err, PayloadError):  # not counted yet: a bad
                # topic, oversize, not JSON, not the contract
                self.ingest.errors += 1  # every refused tray message counts (state/health)
            why = str(err)[:200]
            if self.payload_problems.get(thing) != why:
                self.payload_problems[thing] = why
                self._log("warning", "agent_telemetry_refused", thing=thing, error=why,
                          note="the tray's last reading ages and goes stale")
            return
        if self.payload_problems.pop(thing, None) is not None:
            self._log("info", "agent_telemetry_recovered", thing=thing)

    def agent_reply(self, topic: str, payload: bytes) -> None:
        """A node agent's reply to a ``set_power_limits`` racky sent (others are ignored; an
        oversize, non-JSON or non-object reply is logged once per problem, as every input)."""
        data = self._json_object(topic, payload, "agent_reply")
        if data is None:
            return
        rid = data.get("request_id")
        entry = self.pending.pop(rid, None) if isinstance(rid, str) else None
        if entry is None:
            return
        trays, _ = entry
        ok = data.get("ok") is True  # bool("false") is True: only a JSON true is success
        err = data.get("error") or {}
        why = f"{err.get('code')}: {err.get('message')}" if isinstance(err, dict) else str(err)
        self.core.agent_reply(trays, ok, None if ok else why)
        self.agent_stats["ok" if ok else "refused"] += 1
        if not ok:
            self._log("warning", "agent_refused", trays=list(trays), error=why[:300])
            return
        self._reply_state(trays, data.get("state"))

    def _reply_state(self, trays: Sequence[int], state: Any) -> None:
        """Keep an ok reply's read-back (`rackplane.core.tray_reply.parse_reply_state`: the
        contract 1.3 layout, or an older agent's); a state racky cannot read is counted and
        logged once per problem."""
        try:
            r = parse_reply_state(state)
        except ReplyStateError as err:
            self.agent_stats["bad_reply_state"] += 1
            why = str(err)[:300]
            if self.payload_problems.get("agent_reply_state") != why:
                self.payload_problems["agent_reply_state"] = why
                self._log("warning", "agent_reply_state_refused", trays=list(trays), error=why)
            return
        self.payload_problems.pop("agent_reply_state", None)
        self.agent_stats["legacy_replies"] += r.legacy
        self.agent_stats["unconfirmed"] += r.confirmed is False
        for k in trays:
            if k in r.enforced_gpu_w:
                self.agent_readback[k] = r

    def _arrival(self, retain: bool, received_mono: float, wall_ns: int,
                 d: Mapping[str, Any]) -> float:
        """When a cooling/plant message counts as read (monotonic s). A message from the
        broker's retained store may be old (valvey stopped an hour ago): its age comes from the
        payload's ``ts_ns``, else it counts as stale at once; a dead publisher's last value is
        never taken as fresh (it would let the derate release on old facility water). A
        ``ts_ns`` later than now by more than that stale age (a publisher's clock or unit
        error) gives no age either: stale at once."""
        if not retain:
            return received_mono
        stale_age = self.cfg.power.derate.stale_after_s + self.cfg.cooling.stale_after_s + 1.0
        age = stale_age
        ts = d.get("ts_ns")
        if isinstance(ts, int) and not isinstance(ts, bool) and ts - wall_ns <= stale_age * 1e9:
            age = max(0.0, (wall_ns - ts) / 1e9)
        return received_mono - age

    def _json_object(self, topic: str, payload: bytes, what: str) -> dict[str, Any] | None:
        """The payload as a JSON object (`rackplane.core.envelope.read_json`: bounded size and
        depth, strict), or None (logged once per distinct problem)."""
        try:
            d = read_json(payload, max_bytes=MAX_INPUT_BYTES)
        except JsonError as err:
            why = f"not JSON: {str(err)[:120]}"
        else:
            if isinstance(d, dict):
                self.payload_problems.pop(what, None)
                return d
            why = "not a JSON object"
        self.invalid_inputs += 1
        if self.payload_problems.get(what) != why:
            self.payload_problems[what] = why
            self._log("warning", f"{what}_refused", topic=topic, error=why,
                      note="the previous reading ages and goes stale")
        return None

    def cooling_state(self, topic: str, payload: bytes, *, retain: bool, received_mono: float,
                      wall_ns: int) -> None:
        """valvey's ``state/<state_thing>`` (supply temperature, setpoint, valve, its active
        alarm ids: ``alarms``, a list of strings; anything else there: not reported)."""
        d = self._json_object(topic, payload, "cooling_state")
        if d is None:
            return
        self._cooling = self._judged("cooling", {
            "supply_temp_c": _num(d, "supply_temp_c"),
            "setpoint_c": _num(d, "setpoint_c"),
            "flow_lpm": _num(d, "flow_lpm"),
            "facility_supply_temp_c": _num(d, "facility_supply_temp_c"),
            "valve_position_pct": _num(d, "valve_position_pct", "valve_command_pct"),
            "capacity_w_per_k": _num(d, "capacity_w_per_k"),
        })
        al = d.get("alarms")
        self._cooling_alarms = (tuple(a for a in al if isinstance(a, str))[:64]
                                if isinstance(al, list) else None)
        self._cooling_t = self._arrival(retain, received_mono, wall_ns, d)

    def plant_telemetry(self, topic: str, payload: bytes, *, retain: bool,
                        received_mono: float, wall_ns: int) -> None:
        """The plant topic (``cooling.plant_topic``): flow and facility water."""
        d = self._json_object(topic, payload, "plant_telemetry")
        if d is not None:
            self._plant = self._judged("plant", {
                "flow_lpm": _num(d, "flow_lpm"),
                "facility_supply_temp_c": _num(d, "facility_supply_temp_c")})
            self._plant_t = self._arrival(retain, received_mono, wall_ns, d)

    def _judged(self, source: str, values: dict[str, float | None]
                ) -> dict[str, float | None]:
        """``values`` with every one outside its plausibility window (``plausibility``) set
        to None and noted (alarm ``input_implausible``; `cooling_reading` is then None)."""
        bad: dict[str, str] = {}
        windows = self.cfg.plausibility
        for k, v in values.items():
            w = windows.get(k)
            if v is not None and w is not None and not w.contains(v):
                bad[k] = f"{source}: {v:g} outside [{w.min:g}, {w.max:g}]"
                values[k] = None
                self.invalid_inputs += 1
        if bad != self._implausible[source]:
            for k, why in bad.items():
                if k not in self._implausible[source]:
                    self._log("warning", "input_implausible", input=k, detail=why,
                              note="not believed: cooling counts as unknown, the derate holds")
            self._implausible[source] = bad
        return values

    def implausible_inputs(self) -> dict[str, str]:
        """Inputs outside their plausibility windows now (cooling values; trays whose last
        message was refused for one): name -> why."""
        return {**self._implausible["plant"], **self._implausible["cooling"],
                **self._implausible["trays"]}

    def _tray_implausible(self, tray: int) -> str | None:
        """Why tray ``tray``'s newest reading is implausible (a tray or GPU figure outside its
        window: ``tray_power_w``, ``tray_coolant_out_temp_c``, ``gpu_power_w``,
        ``gpu_temp_c``), or None. Unknown values (NaN) are not judged."""
        r = self.ingest.trays.get(tray)
        if r is None:
            return None
        w = self.cfg.plausibility
        checks = (("tray_power_w", np.asarray([r.power_w])),
                  ("tray_coolant_out_temp_c", np.asarray([r.coolant_out_temp_c])),
                  ("gpu_power_w", r.gpu_power_w), ("gpu_temp_c", r.gpu_temp_c))
        for name, vals in checks:
            win = w.get(name)
            if win is None:
                continue
            v = vals[np.isfinite(vals)]
            out = v[(v < win.min) | (v > win.max)]
            if out.size:
                return (f"{name} {float(out[0]):g} outside its plausibility window "
                        f"[{win.min:g}, {win.max:g}]")
        return None

    def implausible_shelf_points(self) -> dict[str, str]:
        """Shelf points whose latest sample is outside the register map's valid range
        (``<shelf>/<point>`` -> why): never used (`racky.core.power.read_shelves` takes GOOD
        samples only; a shelf without a plausible output power counts as offline, so the rack
        power is unknown rather than understated)."""
        out: dict[str, str] = {}
        for dev, pts in self.latest.items():
            for name, x in pts.items():
                if x.quality is Quality.OUT_OF_RANGE:
                    v = "?" if x.value is None else f"{x.value:g}"
                    out[f"{dev}/{name}"] = f"{v} outside the register map's valid range"
        return out

    def cooling_reading(self) -> CoolingReading | None:
        """valvey's state (and the plant topic's flow / facility water when valvey's lacks
        them), stamped with when it arrived (the older of the two when both are used). None
        while any of them is implausible (unknown: the safe side, the derate holds)."""
        if self._cooling_t is None or self.implausible_inputs():
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
            capacity_w_per_k=c.get("capacity_w_per_k"), alarms=self._cooling_alarms,
        )

    # --- the tick ---------------------------------------------------------------------------

    def step(self, now_mono: float, wall_ns: int,
             extra_alarms: Mapping[str, bool] | None = None) -> TickEffects:
        """One tick at monotonic ``now_mono`` (wall clock ``wall_ns``): the core's step on the
        latest inputs, then its effects. ``extra_alarms``: conditions of alarms the caller
        owns (the daemon's telemetry-path alarms, kind -> active), updated in the core's bank.

        Raises:
            ValueError: ``now_mono`` going backwards (a caller bug).
        """
        core = self.core
        eff = TickEffects(logs=self.take_logs())
        self.ingest.update_gpu_columns()
        self._expire_pending(now_mono)  # an expired command no longer holds its trays
        inp = RackyInputs(self.latest, dict(self.ingest.trays), self.ingest.frame,
                          self.cooling_reading(), awaiting=self.awaiting_trays())
        out = core.step(now_mono, inp, wall_ns)
        self.agent_stats["deferred"] += len(core.deferred_trays)
        eff.output = out
        self._commands(out.commands, now_mono, wall_ns, eff)
        self._expire_pending(now_mono)
        events = list(out.alarm_events)
        bad = {**self.implausible_inputs(), **self.implausible_shelf_points()}
        events += core.bank.update(now_mono, "input_implausible", list(bad), bad)
        for aid, cond in (extra_alarms or {}).items():
            events += core.bank.update(now_mono, aid, [""] if cond else [])
        self._alarms(events, wall_ns, eff)
        eff.states.append(("rack_power", core.rack_power_payload(wall_ns)))
        self._telemetry(now_mono, wall_ns, out, eff)
        state_due = now_mono >= self._next_state
        if state_due:
            self._next_state = now_mono + self.cfg.control.state_interval_s
            self._state(wall_ns, eff)
        if core.persist_version != self._saved_version:
            self._saved_version = core.persist_version
            eff.save_state = True
            self._state(wall_ns, eff)
        eff.validation_result = out.validation_result
        eff.logs += self.take_logs()
        return eff

    def command_effects(self, cmds: Sequence[AgentCommand], now_mono: float, wall_ns: int
                        ) -> TickEffects:
        """The publishes of agent commands decided outside the tick (a safety verb's, sent at
        once)."""
        eff = TickEffects()
        self._commands(cmds, now_mono, wall_ns, eff)
        return eff

    def alarm_effects(self, events: Sequence[AlarmEvent], wall_ns: int) -> TickEffects:
        """The publishes and lines of alarm events raised outside the tick (ack, shelve)."""
        eff = TickEffects()
        self._alarms(events, wall_ns, eff)
        return eff

    def state_effects(self, wall_ns: int) -> TickEffects:
        """The ``state/rack`` publish now (e.g. at stop)."""
        eff = TickEffects()
        self._state(wall_ns, eff)
        return eff

    def _commands(self, cmds: Sequence[AgentCommand], now_mono: float, wall_ns: int,
                  eff: TickEffects) -> None:
        issued = datetime.fromtimestamp(wall_ns / 1e9, UTC)  # wall-clock: envelope
        issued_at = issued.isoformat().replace("+00:00", "Z")
        topic = self.topics.command
        if not self.sending:
            self.withheld_commands += len(cmds)
            return
        for c in cmds:
            self._request_n += 1
            rid = f"{self.request_prefix}-{self.started_mono:.0f}-{self._request_n}"[:64]
            payload = {"request_id": rid, "issued_at": issued_at,
                       "args": c.wire_args(self.agent_epoch)}
            self.pending[rid] = (c.trays, now_mono)
            self.agent_stats["sent"] += 1
            eff.logs.append(LogRecord("info", "agent_command", {
                "trays": list(c.trays), "args": c.args, "reason": c.reason,
                "request_id": rid}))
            eff.agent_commands.append(AgentPublish(topic, payload, c.trays, c.reason))

    def awaiting_trays(self) -> frozenset[int]:
        """The trays with an agent command racky sent and that is still unanswered (at most
        ``node_agents.reply_timeout_s`` old: `_expire_pending` drops older ones)."""
        return frozenset(k for trays, _ in self.pending.values() for k in trays)

    def _expire_pending(self, now_mono: float) -> None:
        lim = self.cfg.node_agents.reply_timeout_s
        for rid in [r for r, (_, t) in self.pending.items() if now_mono - t > lim]:
            del self.pending[rid]
            self.agent_stats["lost"] += 1

    def _alarms(self, events: Sequence[AlarmEvent], wall_ns: int, eff: TickEffects) -> None:
        bank = self.core.bank
        for ev in events:
            eff.alarm_events.append(ev)
            log, payload, line = alarm_event(ev, bank.snapshot(ev.id), wall_ns)
            eff.logs.append(log)
            eff.alarms.append((ev.id, payload))
            eff.lines.append(line)

    def _state(self, wall_ns: int, eff: TickEffects) -> None:
        st = self.core.state()
        st["ts_ns"] = wall_ns
        eff.states.append(("rack", st))

    def _telemetry(self, now_mono: float, wall_ns: int, out: CoreOutput, eff: TickEffects
                   ) -> None:
        lines = eff.lines
        for name, samples in self.latest.items():
            if samples:
                lines.append(TsLine("power_shelf", {"device": name},
                                  sample_fields(samples.values()), wall_ns))
        lim = out.limit
        lines.append(TsLine("rack", {"device": "rack"}, {
            "rack_power_w": out.rack_power_w, "it_power_w": out.it_power_w,
            "limit_w": lim.limit_w, "capacity_w": out.shelves.capacity_w,
            "derate_w": out.derate_w,
            "caps_total_w": None if np.isnan(out.caps_w).all()
            else float(np.nansum(out.caps_w)),
            "min_t_limit_c": out.thermal.min_margin_c
            if math.isfinite(out.thermal.min_margin_c) else None,
            "trays_off": float(out.trays_off),
        }, wall_ns))
        if now_mono >= self._next_node:
            self._next_node = now_mono + self.cfg.control.node_telemetry_interval_s
            for k, r in out.readings.items():
                cap = out.caps_w[k] if 0 <= k < len(out.caps_w) else math.nan
                lines.append(TsLine("node", {"device": f"tray{k:02d}"}, {
                    "power_w": r.power_w, "powered": 1.0 if r.powered else 0.0,
                    "cap_w": None if math.isnan(cap) else float(cap),
                    "enforced_tray_cap_w": r.agent.enforced_tray_cap_w,
                    "coolant_out_temp_c": r.coolant_out_temp_c
                    if math.isfinite(r.coolant_out_temp_c) else None,
                    "hottest_gpu_temp_c": float(np.nanmax(r.gpu_temp_c))
                    if np.isfinite(r.gpu_temp_c).any() else None,
                }, wall_ns))
        lk = out.link_health
        if lk is not None and now_mono >= self._next_link:
            self._next_link = now_mono + self.cfg.control.link_telemetry_interval_s
            figs = lk.port_figures()
            cols = [(k, v.tolist()) for k, v in figs.items()]
            for i, name in enumerate(lk.names):
                lines.append(TsLine("link", {"port": name}, {
                    k: (v[i] if math.isfinite(v[i]) else None) for k, v in cols}, wall_ns))
