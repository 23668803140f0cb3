"""Alarms per monitored thing (a port, a tray, a shelf) on the shared alarm engine.

racky watches 1,440 ports, 72 GPUs, 18 trays and dozens of PSUs; an alarm definition per
thing and kind up front would be thousands of mostly idle alarms. `AlarmBank` keeps one
`rackplane.core.alarms.AlarmEngine` (with one `AlarmDef`) per alarm that exists, creating it when
its condition first becomes true and dropping it once it is back to normal, so every alarm
still has the shared lifecycle (on/off delays, latch, ack, shelve, start-up inhibit) and the
cost per tick is proportional to the alarms that exist, not to the things watched.

Alarm ids are ``<kind>:<thing>`` (``link_flapping:gpu07-nic1``, ``cap_drift:tray05``) or the
kind alone for rack-wide alarms, built by `rackplane.core.names.alarm_id` ('/' and '.' in a
thing's name become '-'; an id is an MQTT topic level, docs/CONTRACTS.md "Alarm ids").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rackplane.core.alarms import AlarmDef, AlarmEngine, AlarmEvent, AlarmSnapshot, Severity
from rackplane.core.names import alarm_id
from rackplane.errors import CommandError

__all__ = ["AlarmBank", "AlarmKind", "alarm_id", "kind_of_def"]


@dataclass(frozen=True, slots=True)
class AlarmKind:
    """A kind of alarm: its id prefix, severity, delays and message template.

    ``message`` may use ``{thing}`` and ``{detail}`` (the detail string given with the
    condition, e.g. the cause of an overheat).
    """

    kind: str
    severity: Severity
    message: str
    on_delay_s: float = 0.0
    off_delay_s: float = 0.0
    latch: bool = False
    startup_inhibit_s: float = 0.0
    runbook: str | None = None


def kind_of_def(d: AlarmDef) -> AlarmKind:
    """An `AlarmDef` of a rack-wide alarm (e.g. `rackplane.io.selfmetrics.TELEMETRY_ALARMS`) as
    an `AlarmKind` (fed with the thing ``""``: its id stays the def's id)."""
    msg = d.message.replace("{", "{{").replace("}", "}}")  # a template here: keep it literal
    return AlarmKind(kind=d.id, severity=d.severity, message=msg,
                     on_delay_s=d.on_delay_s, off_delay_s=d.off_delay_s, latch=d.latch,
                     startup_inhibit_s=d.startup_inhibit_s, runbook=d.runbook)


class AlarmBank:
    """Alarms created on demand per (kind, thing) (see the module docstring).

    Args:
        kinds: the alarm kinds (unique ``kind``).
        start_mono: the daemon's start, monotonic s (start-up inhibit origin).
    """

    def __init__(self, kinds: Iterable[AlarmKind], start_mono: float) -> None:
        self.kinds: dict[str, AlarmKind] = {}
        self.add_kinds(kinds)
        self._start = float(start_mono)
        self._engines: dict[str, AlarmEngine] = {}
        self._kind_of: dict[str, str] = {}
        self._thing_of: dict[str, str] = {}
        self._cond: dict[str, bool] = {}
        self._shelved_until: dict[str, float] = {}
        self._now = float(start_mono)

    def add_kinds(self, kinds: Iterable[AlarmKind]) -> None:
        """Register more kinds (the daemon's own, e.g. the telemetry alarms the pure core does
        not know).

        Raises:
            ValueError: a duplicate kind or an invalid id prefix.
        """
        for k in kinds:
            if k.kind in self.kinds:
                raise ValueError(f"duplicate alarm kind {k.kind!r}")
            AlarmDef(id=k.kind, severity=k.severity, message="x")  # validates the prefix
            self.kinds[k.kind] = k

    # --- queries -------------------------------------------------------------------------

    def active(self) -> list[AlarmSnapshot]:
        """Every alarm not normal, most severe first, then oldest."""
        out = [s for e in self._engines.values() for s in e.active()]
        rank = {"critical": 0, "major": 1, "minor": 2, "warning": 3}
        out.sort(key=lambda s: (rank[s.severity], s.raised_t_mono, s.id))
        return out

    def snapshot(self, aid: str) -> AlarmSnapshot | None:
        """The alarm's snapshot when it is not normal."""
        e = self._engines.get(aid)
        if e is None:
            return None
        snaps = e.active()
        return snaps[0] if snaps else None

    def is_active(self, aid: str) -> bool:
        """True while the alarm is active or latched."""
        e = self._engines.get(aid)
        return e is not None and e.is_active(aid)

    def things(self, kind: str) -> set[str]:
        """Things with an alarm of ``kind`` that is not normal."""
        return {self._thing_of[a] for a, k in self._kind_of.items()
                if k == kind and self.is_active(a)}

    def known(self, aid: str) -> bool:
        """An alarm with this id exists now (not necessarily active)."""
        return aid in self._engines

    # --- the cycle -----------------------------------------------------------------------

    def update(
        self,
        now_mono: float,
        kind: str,
        true_things: Mapping[str, float | None] | Iterable[str],
        details: Mapping[str, str] | None = None,
    ) -> list[AlarmEvent]:
        """Feed the conditions of one kind: ``true_things`` are the things whose condition is
        true now (a mapping gives each its value); every other existing alarm of the kind gets
        a false condition. Returns the events.

        Raises:
            KeyError: unknown kind. ValueError: time going backwards.
        """
        k = self.kinds[kind]
        self._now = max(self._now, now_mono)
        vals: Mapping[str, float | None] = (
            true_things if isinstance(true_things, Mapping)
            else dict.fromkeys(true_things)
        )
        events: list[AlarmEvent] = []
        seen: set[str] = set()
        for thing, value in vals.items():
            aid = alarm_id(kind, thing)
            seen.add(aid)
            eng = self._engines.get(aid)
            detail = (details or {}).get(thing, "")
            if eng is None or (not eng.is_active(aid) and not self._cond.get(aid, False)
                               and aid not in self._shelved_until):
                eng = self._make(k, aid, thing, detail)
            self._cond[aid] = True
            v = {aid: value} if value is not None else None
            events += eng.update(now_mono, {aid: True}, v)
        for aid in [a for a, kk in self._kind_of.items() if kk == kind and a not in seen]:
            self._cond[aid] = False
            events += self._engines[aid].update(now_mono, {aid: False})
            self._maybe_drop(aid, now_mono)
        return events

    def tick(self, now_mono: float) -> list[AlarmEvent]:
        """Advance every alarm's timers (delays, shelve expiry) without new conditions."""
        self._now = max(self._now, now_mono)
        events: list[AlarmEvent] = []
        for aid in list(self._engines):
            events += self._engines[aid].update(now_mono, {})
            self._maybe_drop(aid, now_mono)
        return events

    def _make(self, k: AlarmKind, aid: str, thing: str, detail: str) -> AlarmEngine:
        msg = k.message.format(thing=thing or "rack", detail=detail).strip()
        d = AlarmDef(id=aid, severity=k.severity, message=msg, on_delay_s=k.on_delay_s,
                     off_delay_s=k.off_delay_s, latch=k.latch,
                     startup_inhibit_s=k.startup_inhibit_s, runbook=k.runbook)
        eng = AlarmEngine([d], self._start)
        self._engines[aid] = eng
        self._kind_of[aid] = k.kind
        self._thing_of[aid] = thing
        return eng

    def _maybe_drop(self, aid: str, now: float) -> None:
        until = self._shelved_until.get(aid)
        if until is not None and now >= until:
            del self._shelved_until[aid]
            until = None
        if until is None and not self._cond.get(aid, False) and not self.is_active(aid):
            self._engines.pop(aid, None)
            self._kind_of.pop(aid, None)
            self._thing_of.pop(aid, None)
            self._cond.pop(aid, None)

    # --- operator actions ----------------------------------------------------------------

    def _engine(self, aid: str) -> AlarmEngine:
        e = self._engines.get(aid)
        if e is None:
            raise CommandError("unknown_alarm", f"no alarm {aid!r} is active")
        return e

    def ack(self, aid: str, user: str, now_mono: float) -> list[AlarmEvent]:
        """Acknowledge (see `rackplane.core.alarms.AlarmEngine.ack`).

        Raises:
            CommandError: ``unknown_alarm`` when no such alarm exists now.
        """
        ev = self._engine(aid).ack(aid, user, max(now_mono, self._now))
        self._maybe_drop(aid, now_mono)
        return ev

    def shelve(self, aid: str, user: str, until_mono: float, now_mono: float
               ) -> list[AlarmEvent]:
        """Shelve until ``until_mono`` (see `rackplane.core.alarms.AlarmEngine.shelve`).

        Raises:
            CommandError: ``unknown_alarm``, ``invalid_shelve_time``.
        """
        ev = self._engine(aid).shelve(aid, user, until_mono, max(now_mono, self._now))
        self._shelved_until[aid] = until_mono
        return ev
