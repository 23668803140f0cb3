"""What a daemon's tick hands to its adapters, as plain data (DESIGN §2: a tick maps inputs and
time to effects; the daemon applies them, the lock-step harness applies them to the plant).

The effect types every daemon's tick shares: a time-series point (`TsLine`) and a log record
(`LogRecord`), and the alarm effects built from them (`alarm_event`, `alarm_snapshot_line`).
Each daemon's own ``TickEffects`` (valvey.tick, racky.tick) lists them beside
its actuator writes and MQTT publishes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rackplane.core.alarms import AlarmEvent, AlarmSnapshot

__all__ = ["ALARM_LOG_LEVEL", "EVENT_CODE", "SEVERITY_CODE", "FieldValue", "LogRecord", "TsLine",
           "alarm_event", "alarm_log_level", "alarm_snapshot_line"]

FieldValue = float | None
"""A numeric time-series field; None is omitted by the writer (never written as NaN)."""


@dataclass(frozen=True, slots=True)
class TsLine:
    """One time-series point: ``measurement`` with ``tags`` (the writer adds the identity
    tags site/row/rack), ``fields`` (None values are omitted by the writer) at ``wall_ns``
    [ns since the epoch]."""

    measurement: str
    tags: Mapping[str, str]
    fields: Mapping[str, FieldValue]
    wall_ns: int


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One log line: ``level`` (debug | info | warning | error | critical), the ``event``
    name and its key/value ``fields``.

    Raises:
        ValueError: a field named ``event`` (structlog's own argument: emitting the record
            would raise TypeError in the daemon's tick).
    """

    level: str
    event: str
    fields: Mapping[str, Any]

    def __post_init__(self) -> None:
        if "event" in self.fields:
            raise ValueError(f"log record {self.event!r}: a field named 'event' collides with "
                             "the event name")


SEVERITY_CODE = {"warning": 1.0, "minor": 2.0, "major": 3.0, "critical": 4.0}
"""``alarm`` measurement: ``severity_code`` of each severity (unknown: 0)."""
EVENT_CODE = {k: float(i) for i, k in enumerate(
    ("raised", "cleared", "acked", "shelved", "unshelved", "returned"))}
"""``alarm`` measurement: ``event_code`` of each alarm event kind."""


ALARM_LOG_LEVEL = {"critical": "critical", "major": "error", "minor": "warning",
                   "warning": "warning"}
"""Log level of an alarm's ``raised`` event (also after a shelve expires on an active alarm),
by severity; its other events (returned to normal awaiting reset, cleared, acked, shelved,
unshelved) are logged at info."""


def alarm_log_level(ev: AlarmEvent) -> str:
    """The log level of an alarm event (`ALARM_LOG_LEVEL`): a log-based pager sees a critical
    alarm at ``critical``, not at the level of a minor one; an unknown severity is logged at
    ``error`` (never below what it might be)."""
    if ev.kind == "raised":
        return ALARM_LOG_LEVEL.get(ev.severity, "error")
    return "info"


def alarm_event(ev: AlarmEvent, snap: AlarmSnapshot | None, wall_ns: int
                ) -> tuple[LogRecord, dict[str, Any] | None, TsLine]:
    """The effects of one alarm event: its log record, the retained ``alarm/<id>`` payload
    (None clears the retained message: the alarm is no longer shown) and its ``alarm`` line.

    Args:
        ev: the event; snap: the alarm's snapshot after it (None: back to normal);
        wall_ns: the payload's and the line's time [ns since the epoch].
    """
    log = LogRecord(alarm_log_level(ev), "alarm", {"alarm": ev.id, "kind": ev.kind,
                                                   "severity": ev.severity,
                                                   "message": ev.message})
    payload = None if snap is None else {
        "id": snap.id, "severity": snap.severity, "message": snap.message,
        "state": snap.state, "acked": snap.acked, "shelved": snap.shelved,
        "runbook": snap.runbook, "value": snap.value, "ts_ns": wall_ns}
    line = TsLine("alarm", {"alarm": ev.id, "severity": ev.severity}, {
        "active": 1.0 if snap is not None and snap.state == "active" else 0.0,
        "severity_code": SEVERITY_CODE.get(ev.severity, 0.0),
        "event_code": EVENT_CODE[ev.kind],
    }, wall_ns)
    return log, payload, line


def alarm_snapshot_line(a: AlarmSnapshot, wall_ns: int) -> TsLine:
    """An active alarm's ``alarm`` line for the periodic snapshot (a query at any time finds
    what was active then, not only the raise/clear events)."""
    return TsLine("alarm", {"alarm": a.id, "severity": a.severity}, {
        "active": 1.0 if a.state == "active" else 0.0,
        "severity_code": SEVERITY_CODE.get(a.severity, 0.0),
        "acked": 1.0 if a.acked else 0.0,
        "shelved": 1.0 if a.shelved else 0.0,
    }, wall_ns)
