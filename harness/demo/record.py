"""What the demo sees on MQTT (`Recorder`) and how the summary names what ran."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rackplane.io.mqtt import Message

__all__ = [
    "EXPECTED_DEMO_ALARMS",
    "FF_SOURCE_NAMES",
    "Recorder",
    "alarm_note",
    "control_mode_from_states",
]


@dataclass
class Recorder:
    """What the demo saw on MQTT, on the plant's time axis (plant time, s).

    ``alarms``/``alarm_log`` key alarms as ``<daemon>:<alarm id>`` (valvey's and racky's);
    ``rack`` is racky's latest ``state/rack``, ``rack_power`` its ``state/rack_power``
    samples (with ``t_s``)."""

    plant_t0_mono: float | None = None  # monotonic time at plant t = 0 (estimated)
    plant: list[dict[str, Any]] = field(default_factory=list)
    loop: list[dict[str, Any]] = field(default_factory=list)
    alarms: dict[str, dict[str, Any]] = field(default_factory=dict)
    alarm_log: list[tuple[float, str, str]] = field(default_factory=list)
    health: dict[str, Any] = field(default_factory=dict)
    valvey_status: str = "?"
    racky_status: str = "?"
    rack: dict[str, Any] = field(default_factory=dict)
    rack_power: list[dict[str, Any]] = field(default_factory=list)
    limit_log: list[tuple[float, float | None, str | None]] = field(default_factory=list)
    """racky's power limit as it changed: (plant s, ``limit_w`` [W] or None, its
    ``limit_source``), from each ``state/rack``; the first entry is the first one seen."""
    commands: list[tuple[float, str, str, str]] = field(default_factory=list)
    """Commands sent to the daemons during the run: (plant s, daemon, user, verb)."""
    command_ids: list[str | None] = field(default_factory=list)
    """Each command's ``request_id`` (None: the payload had none), in ``commands``' order."""
    replies: dict[tuple[str, str, str], tuple[bool, str | None]] = field(default_factory=dict)
    """The daemons' replies (``cmd/<user>/<verb>/result[/...]``): (daemon, user, request_id)
    -> (ok, the error code when refused)."""
    pumps: list[dict[str, Any]] = field(default_factory=list)
    """valvey's ``state/pumps`` samples (with ``t_s``): the duty pump and each unit's
    running bit."""
    lifecycle_log: list[tuple[float, str, str, str, bool]] = field(default_factory=list)
    """racky's lifecycle as it changed: (plant s, state, by, reason, validated); the first
    entry is the first ``state/rack`` seen."""
    alarm_messages: dict[str, str] = field(default_factory=dict)
    """The message of each alarm when it was (last) raised."""
    events: list[tuple[float, str]] = field(default_factory=list)
    """What happened, for the live view: alarms raised and cleared, the duty pump changing,
    racky's lifecycle changing (plant s, text)."""

    def plant_t(self, mono: float) -> float | None:
        return None if self.plant_t0_mono is None else mono - self.plant_t0_mono

    def on_message(self, msg: Message) -> None:
        topic = msg.topic
        try:
            payload = msg.json() if msg.payload else None
        except ValueError:
            return
        if topic.endswith("/sim/telemetry/plant") and isinstance(payload, dict):
            t0 = msg.received_mono - float(payload["t_s"])
            self.plant_t0_mono = t0 if self.plant_t0_mono is None else min(self.plant_t0_mono, t0)
            self.plant.append(payload)
        elif topic.endswith("/valvey/state/supply_loop") and isinstance(payload, dict):
            t = self.plant_t(msg.received_mono)
            if t is not None:
                self.loop.append({"t_s": t, **payload})
        elif topic.endswith("/valvey/state/health") and isinstance(payload, dict):
            self.health = payload
        elif topic.endswith("/valvey/state/pumps") and isinstance(payload, dict):
            t = self.plant_t(msg.received_mono)
            if t is not None:
                self._pumps(t, payload)
        elif topic.endswith("/racky/state/rack") and isinstance(payload, dict):
            self.rack = payload
            t = self.plant_t(msg.received_mono)
            if t is not None:
                self._lifecycle(t, payload.get("lifecycle"))
                self._limit(t, payload.get("limit_w"), payload.get("limit_source"))
        elif topic.endswith("/racky/state/rack_power") and isinstance(payload, dict):
            t = self.plant_t(msg.received_mono)
            if t is not None:
                self.rack_power.append({"t_s": t, **payload})
        elif topic.endswith("/status") and isinstance(payload, dict):
            status = str(payload.get("status", "?"))
            if topic.endswith("/valvey/status"):
                self.valvey_status = status
            elif topic.endswith("/racky/status"):
                self.racky_status = status
        elif "/cmd/" in topic:  # <daemon>/cmd/<user>/<verb>[/result/...]: asked, answered
            head, _, tail = topic.partition("/cmd/")
            daemon = head.rsplit("/", 1)[-1]
            parts = tail.split("/")
            rid = payload.get("request_id") if isinstance(payload, dict) else None
            if len(parts) == 2 and all(parts):
                t = self.plant_t(msg.received_mono) or 0.0
                self.commands.append((t, daemon, parts[0], parts[1]))
                self.command_ids.append(None if rid is None else str(rid))
            elif len(parts) >= 3 and parts[2] == "result" and isinstance(payload, dict) \
                    and rid is not None:
                err = payload.get("error")
                code = err.get("code") if isinstance(err, dict) else None
                self.replies[(daemon, parts[0], str(rid))] = (
                    payload.get("ok") is True, None if code is None else str(code))
        elif "/alarm/" in topic:
            daemon = topic.split("/alarm/", 1)[0].rsplit("/", 1)[-1]
            key = f"{daemon}:{topic.rsplit('/', 1)[-1]}"
            t = self.plant_t(msg.received_mono) or 0.0
            if payload:
                if key not in self.alarms:
                    self.alarm_log.append((t, key, "raised"))
                    msg_text = payload.get("message") if isinstance(payload, dict) else None
                    self.alarm_messages[key] = str(msg_text or "")
                    self.events.append((t, f"alarm {key} raised"
                                           f"{f': {msg_text}' if msg_text else ''}"))
                self.alarms[key] = payload
            elif key in self.alarms:
                self.alarms.pop(key)
                self.alarm_log.append((t, key, "cleared"))
                self.events.append((t, f"alarm {key} cleared"))

    def _pumps(self, t: float, payload: dict[str, Any]) -> None:
        units = payload.get("units")
        running = {str(u.get("name")): u.get("running") for u in units
                   if isinstance(u, dict)} if isinstance(units, list) else {}
        duty = payload.get("duty")
        prev = self.pumps[-1]["duty"] if self.pumps else None
        self.pumps.append({"t_s": t, "duty": duty, "running": running,
                           "handoff": payload.get("handoff")})
        if prev is not None and duty != prev:
            self.events.append((t, f"valvey: duty pump {prev} -> {duty} (running: "
                                   f"{running.get(str(duty))})"))

    def command_outcomes(self) -> list[tuple[str, str | None]]:
        """Per command (``commands``' order): ``accepted``, ``refused`` (with the reply's
        error code) or ``unanswered`` (no reply seen: whether it acted is unknown)."""
        out: list[tuple[str, str | None]] = []
        for (_, daemon, user, _), rid in zip(self.commands, self.command_ids, strict=True):
            reply = None if rid is None else self.replies.get((daemon, user, rid))
            if reply is None:
                out.append(("unanswered", None))
            else:
                out.append(("accepted", None) if reply[0] else ("refused", reply[1]))
        return out

    def _limit(self, t: float, limit_w: Any, source: Any) -> None:
        w = float(limit_w) if isinstance(limit_w, (int, float)) else None
        src = None if source is None else str(source)
        last = self.limit_log[-1] if self.limit_log else None
        if last is None or last[1:] != (w, src):
            self.limit_log.append((t, w, src))

    def limit_at(self, t: float) -> float | None:
        """racky's power limit [W] in force at plant ``t`` [s]: the last one published at or
        before ``t`` (None: none yet, or racky published no limit)."""
        w: float | None = None
        for t_s, lim, _ in self.limit_log:
            if t_s > t:
                break
            w = lim
        return w

    def _lifecycle(self, t: float, lc: Any) -> None:
        if not isinstance(lc, dict):
            return
        row = (t, str(lc.get("state")), str(lc.get("by", "")), str(lc.get("reason", "")),
               lc.get("validated") is True)
        last = self.lifecycle_log[-1] if self.lifecycle_log else None
        if last is None or last[1:] != row[1:]:
            self.lifecycle_log.append(row)
            if last is not None and last[1] != row[1]:
                self.events.append((t, f"racky: lifecycle {last[1]} -> {row[1]} by {row[2]}"
                                       f" ({row[3]})"))


FF_SOURCE_NAMES = {
    "rack_power": "racky's rack power",
    "heat_removed": "the CDU's heat removed (racky's rack power missing or stale)",
}
"""How the summary names valvey's feedforward sources (valvey.core.feedforward.FfSource)."""

EXPECTED_DEMO_ALARMS: dict[str, str] = {}
"""Alarms (``<daemon>:<id>``) the demo's set-up raises by design, with the note the summary
prints beside them (none: racky runs in the demo, so valvey's feedforward has its primary
source)."""


def control_mode_from_states(loop: Sequence[Mapping[str, Any]]) -> str:
    """The control mode that actually ran, from valvey's ``state/supply_loop`` payloads:
    ``PI only`` (feedforward off or never had a source), else ``PI + feedforward from
    <source>`` (several sources joined with "then", in the order first seen)."""
    sources: list[str] = []
    enabled = False
    for r in loop:
        ff = r.get("feedforward")
        if not isinstance(ff, dict) or not ff.get("enabled"):
            continue
        enabled = True
        src = ff.get("source")
        if isinstance(src, str) and src != "none" and src not in sources:
            sources.append(src)
    if not sources:
        return "PI only" + (" (feedforward on but no source)" if enabled else "")
    return "PI + feedforward from " + " then ".join(FF_SOURCE_NAMES.get(x, x) for x in sources)


def alarm_note(alarm_key: str) -> str:
    """`` (note)`` for an alarm the demo raises by design, else ``""``."""
    note = EXPECTED_DEMO_ALARMS.get(alarm_key)
    return f" ({note})" if note else ""
