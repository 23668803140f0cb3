"""Alarm lifecycle engine (raise, latch, ack, shelve, clear) and a debounced threshold
detector. Pure: no clock, no I/O; every call gets the monotonic time in seconds.

Shared by valvey and racky. Condition producers (detectors, loop cores) decide *whether* a
condition is true, including hysteresis (`rackplane.core.detect.threshold.ThresholdDetector`);
the engine decides *what the operator sees*: delays, latching, acknowledgement, shelving and
the start-up inhibit.

Lifecycle of one alarm (ISA-18.2 simplified)::

    normal --condition true for on_delay_s (and not start-up inhibited)--> active (unacked)
    active --ack--> active (acked)
    active --condition false for off_delay_s--> normal             (latch = False)  "cleared"
                                             --> returned          (latch = True)   "returned"
    returned --ack--> normal                                        "acked" + "cleared"
    returned --condition true for on_delay_s--> active (unacked)    "raised"

A latched alarm needs an acknowledgement *after* its condition has returned to normal (an ack
while still active acknowledges it but does not reset it); ack after return = reset.

Shelving takes an alarm out of annunciation until ``until_mono`` (at most ``max_shelve_s``
ahead). A shelved alarm keeps tracking its condition; while shelved it emits no raised,
returned or cleared events. When the shelve expires (or `AlarmEngine.unshelve`), an
"unshelved" event is followed by "raised" if the alarm is active (unacknowledged again) or
"returned" if it is latched awaiting reset, so it reappears.

Start-up inhibit (``startup_inhibit_s``, counted from the engine's ``start_mono``) delays only
the *raising* of an alarm (REFERENCE §8: supply-temperature alarms masked for 20 min at
start-up, Coolcentric/Vertiv). Conditions are tracked during the inhibit, so an alarm whose
condition has held for its on-delay is raised the moment the inhibit ends.
**Interlocks never use this inhibit**: they act on their own inputs from the first cycle; this
engine only governs what is annunciated.

Events carry ``(id, kind, severity, message, value, t_mono)`` plus the user for operator
actions; `AlarmEngine.active` gives the snapshot to publish retained (DESIGN §3:
``alarm/<id>`` retained while active).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import compress
from typing import Literal

from pydantic import Field, field_validator

from rackplane.config import StrictModel
from rackplane.core.names import ALARM_ID_PATTERN
from rackplane.core.samples import slots_constructor
from rackplane.errors import CommandError

__all__ = ["DEFAULT_MAX_SHELVE_S", "AlarmDef", "AlarmEngine", "AlarmEvent", "AlarmSnapshot"]

Severity = Literal["critical", "major", "minor", "warning"]
EventKind = Literal["raised", "cleared", "acked", "shelved", "unshelved", "returned"]
Phase = Literal["normal", "active", "returned"]

_SEVERITY_RANK: dict[str, int] = {"critical": 0, "major": 1, "minor": 2, "warning": 3}
_ID_RE = re.compile(ALARM_ID_PATTERN)

DEFAULT_MAX_SHELVE_S = 8 * 3600.0
"""Longest shelve accepted by default: one shift (ISA-18.2 wants shelving time-limited)."""


class AlarmDef(StrictModel):
    """Definition of one alarm (from config or a daemon's built-in table).

    Attributes:
        id: alarm id, also the MQTT topic level ``alarm/<id>``: lowercase letters, digits,
            ``_ : -``, at most 64 characters; ``<kind>`` or ``<kind>:<subject>``, built by
            `rackplane.core.names.alarm_id` (docs/CONTRACTS.md "Alarm ids").
        severity: ``critical``, ``major``, ``minor`` or ``warning``.
        on_delay_s: the condition must hold this long before the alarm is raised [s].
        off_delay_s: the condition must be false this long before the alarm clears [s].
        latch: stays (as "returned") after the condition clears until acknowledged.
        startup_inhibit_s: no raising until this long after the engine's start [s].
        message: operator text.
        runbook: runbook key (where the operator finds what to do), or None.
    """

    id: str
    severity: Severity
    on_delay_s: float = Field(0.0, ge=0.0, allow_inf_nan=False)
    off_delay_s: float = Field(0.0, ge=0.0, allow_inf_nan=False)
    latch: bool = False
    startup_inhibit_s: float = Field(0.0, ge=0.0, allow_inf_nan=False)
    message: str
    runbook: str | None = None

    @field_validator("id")
    @classmethod
    def _id_topic_safe(cls, v: str) -> str:
        if not _ID_RE.fullmatch(v):
            raise ValueError(
                f"alarm id {v!r} must be 1-64 characters of a-z, 0-9, '_', ':', '-' starting "
                "with a letter or digit (it is an MQTT topic level: no '.', rackplane.core.names)"
            )
        return v


@dataclass(frozen=True, slots=True)
class AlarmEvent:
    """One change in an alarm's state.

    Attributes:
        id, severity, message: from the definition.
        kind: raised | cleared | acked | shelved | unshelved | returned.
        value: the latest value reported for the alarm (`AlarmEngine.update` ``values``).
        t_mono: monotonic time of the change [s].
        user: who acknowledged / shelved / unshelved (None for condition-driven events and
            shelve expiry).
    """

    id: str
    kind: EventKind
    severity: Severity
    message: str
    value: float | None
    t_mono: float
    user: str | None = None


@dataclass(frozen=True, slots=True)
class AlarmSnapshot:
    """An alarm that is not normal, for retained publication.

    Attributes:
        state: ``active`` (condition present) or ``returned`` (latched, awaiting reset ack).
        acked: acknowledged since it was last raised; acked_by the user.
        shelved: shelved now (until ``shelved_until`` monotonic s).
        raised_t_mono: when it was last raised [monotonic s].
    """

    id: str
    severity: Severity
    message: str
    runbook: str | None
    state: Literal["active", "returned"]
    acked: bool
    acked_by: str | None
    shelved: bool
    shelved_until: float | None
    raised_t_mono: float
    value: float | None
    latch: bool


_new_snapshot = slots_constructor(AlarmSnapshot)  # built once per active alarm per query


@dataclass(slots=True)
class _State:
    condition: bool = False
    cond_since: float | None = None  # condition true since (while true)
    clear_since: float | None = None  # condition false since (while false)
    phase: Phase = "normal"
    acked: bool = False
    acked_by: str | None = None
    raised_t: float | None = None
    shelved_until: float | None = None
    value: float | None = None


def _check_time(name: str, t: float) -> float:
    if t.__class__ is float and math.isfinite(t):
        return t  # the 10 Hz callers' case, without the ABC isinstance checks below
    if isinstance(t, bool) or not isinstance(t, numbers.Real) or not math.isfinite(t):
        raise ValueError(f"{name} must be a finite number of monotonic seconds, got {t!r}")
    return float(t)


class AlarmEngine:
    """The alarm state of one daemon.

    Args:
        defs: the alarm definitions (ids unique, else ValueError).
        start_mono: monotonic time the daemon started [s] (start-up inhibit origin).
        max_shelve_s: longest accepted shelve [s] (default 8 h).

    Time must not go backwards between calls (ValueError): it is monotonic time.
    """

    def __init__(
        self,
        defs: Iterable[AlarmDef],
        start_mono: float,
        *,
        max_shelve_s: float = DEFAULT_MAX_SHELVE_S,
    ):
        self._defs: dict[str, AlarmDef] = {}
        for d in defs:
            if d.id in self._defs:
                raise ValueError(f"duplicate alarm id {d.id!r}")
            self._defs[d.id] = d
        self._start = _check_time("start_mono", start_mono)
        if not (math.isfinite(max_shelve_s) and max_shelve_s > 0):
            raise ValueError("max_shelve_s must be > 0")
        self._max_shelve_s = float(max_shelve_s)
        self._states: dict[str, _State] = {i: _State() for i in self._defs}
        self._now = self._start
        self._shelved: set[str] = set()  # ids with a shelve in force (expiry checks)
        self._order = {aid: i for i, aid in enumerate(self._defs)}
        # Ids `update` must look at even when their condition is falsy: not (condition False,
        # normal and clear_since set). Every other id is quiet: a falsy condition cannot
        # change it (the fast path in `update`), so a 10 Hz update visits only these and the
        # ids whose condition is true. Only `update` can make an id un-quiet.
        self._hot: set[str] = set(self._defs)
        self._known_keys: tuple[str, ...] = ()  # the last key set of `update` found valid

    # --- queries ---------------------------------------------------------------------------

    @property
    def defs(self) -> Mapping[str, AlarmDef]:
        """The definitions by id."""
        return dict(self._defs)

    def is_active(self, alarm_id: str) -> bool:
        """True when the alarm is active or latched-returned (not normal)."""
        return self._state(alarm_id).phase != "normal"

    def inhibited(self, alarm_id: str, now_mono: float) -> bool:
        """True while the alarm's start-up inhibit lasts."""
        return now_mono < self._start + self._def(alarm_id).startup_inhibit_s

    def active_ids(self) -> list[str]:
        """The ids of every alarm that is not normal (those `active` lists), sorted by id."""
        return sorted(aid for aid, st in self._states.items() if st.phase != "normal")

    def active(self) -> list[AlarmSnapshot]:
        """Every alarm that is not normal (shelved ones included, flagged), most severe first,
        then oldest first."""
        out: list[AlarmSnapshot] = []
        for aid, st in self._states.items():
            if st.phase == "normal":
                continue
            d = self._defs[aid]
            assert st.raised_t is not None
            out.append(_new_snapshot(  # AlarmSnapshot(id=..., ...), every field in order
                aid, d.severity, d.message, d.runbook,
                "active" if st.phase == "active" else "returned", st.acked, st.acked_by,
                st.shelved_until is not None, st.shelved_until, st.raised_t, st.value, d.latch))
        out.sort(key=lambda s: (_SEVERITY_RANK[s.severity], s.raised_t_mono, s.id))
        return out

    # --- the cycle -------------------------------------------------------------------------

    def update(
        self,
        now_mono: float,
        conditions: Mapping[str, bool],
        values: Mapping[str, float] | None = None,
    ) -> list[AlarmEvent]:
        """Feed the current conditions; returns the events this call produced, in definition
        order (shelve expiries first).

        Args:
            now_mono: monotonic time [s], not before the previous call.
            conditions: alarm id -> condition. An id left out keeps its last condition (its
                producer had nothing new to say); an unknown id is a caller bug.
            values: alarm id -> the value behind the condition (e.g. the deviation in K),
                carried by events and snapshots. Non-finite values are stored as None.

        Raises:
            ValueError: unknown ids, time going backwards or non-finite.
        """
        if now_mono.__class__ is float and self._now <= now_mono < math.inf:
            now = self._now = now_mono  # `_advance` for the 10 Hz caller's finite float
        else:
            now = self._advance(now_mono)
        defs = self._defs
        keys = tuple(conditions)
        bad_keys = False
        if keys != self._known_keys:  # a 10 Hz caller repeats its key set: check it once
            bad_keys = not conditions.keys() <= defs.keys()
            if not bad_keys:
                self._known_keys = keys
        if bad_keys or (values and not values.keys() <= defs.keys()):
            unknown = [k for k in conditions if k not in defs]
            if values:
                unknown += [k for k in values if k not in defs]
            raise ValueError(f"unknown alarm ids: {sorted(set(unknown))}")
        events: list[AlarmEvent] = []
        if self._shelved:
            self._expire_shelves(now, events)
        states = self._states
        if values:
            for aid, v in values.items():
                states[aid].value = float(v) if v is not None and math.isfinite(v) else None
        hot = self._hot
        visit = hot.union(compress(conditions, conditions.values()))  # + ids true now
        if not visit:
            return events
        order = self._order
        for aid in sorted(visit, key=order.__getitem__):  # definition order (a copy of hot)
            st = states[aid]
            c = conditions.get(aid)
            if (not c and not st.condition and st.phase == "normal"
                    and (c is None or st.clear_since is not None)):
                continue  # fast path (10 Hz callers): normal, quiet, nothing can change
            if st.condition and st.phase == "active" and (c is None or c):
                continue  # active and still true: nothing can change (it stays hot)
            if c is not None:
                c = bool(c)
                if c and not st.condition:
                    st.cond_since, st.clear_since = now, None
                elif not c and st.condition:
                    st.cond_since, st.clear_since = None, now
                elif not c and st.clear_since is None:
                    st.clear_since = now
                st.condition = c
            self._evaluate(defs[aid], st, now, events)
            if st.condition or st.phase != "normal" or st.clear_since is None:
                hot.add(aid)
            else:
                hot.discard(aid)
        return events

    def ack(self, alarm_id: str, user: str, now_mono: float) -> list[AlarmEvent]:
        """Acknowledge. On an active alarm: "acked" (it stays active). On a latched alarm
        whose condition has returned: "acked" then "cleared" (reset). On a normal or already
        acknowledged active alarm: no events (acks are idempotent).

        Raises:
            CommandError: code ``unknown_alarm`` for an id not defined.
        """
        d = self._def(alarm_id)
        now = self._advance(now_mono)
        st = self._states[alarm_id]
        events: list[AlarmEvent] = []
        if st.phase == "active" and not st.acked:
            st.acked, st.acked_by = True, user
            events.append(self._event(d, st, "acked", now, user))
        elif st.phase == "returned":
            st.acked, st.acked_by = True, user
            events.append(self._event(d, st, "acked", now, user))
            self._to_normal(d, st, now, events)
        return events

    def shelve(
        self, alarm_id: str, user: str, until_mono: float, now_mono: float
    ) -> list[AlarmEvent]:
        """Shelve until ``until_mono`` (now < until <= now + max_shelve_s). Shelving again
        moves the expiry. Returns the "shelved" event.

        Raises:
            CommandError: ``unknown_alarm``; ``invalid_shelve_time`` for an expiry not in
                (now, now + max_shelve_s] or not finite.
        """
        d = self._def(alarm_id)
        now = self._advance(now_mono)
        if (
            isinstance(until_mono, bool)
            or not isinstance(until_mono, numbers.Real)
            or not math.isfinite(until_mono)
            or not now < until_mono <= now + self._max_shelve_s
        ):
            raise CommandError(
                "invalid_shelve_time",
                f"shelve of {alarm_id!r} must end after now and within "
                f"{self._max_shelve_s:.0f} s, got until={until_mono!r} (now={now})",
            )
        st = self._states[alarm_id]
        st.shelved_until = float(until_mono)
        self._shelved.add(alarm_id)
        return [self._event(d, st, "shelved", now, user)]

    def unshelve(self, alarm_id: str, user: str, now_mono: float) -> list[AlarmEvent]:
        """End a shelve early ("unshelved", then "raised"/"returned" if not normal). No events
        if the alarm is not shelved.

        Raises:
            CommandError: ``unknown_alarm``.
        """
        d = self._def(alarm_id)
        now = self._advance(now_mono)
        st = self._states[alarm_id]
        events: list[AlarmEvent] = []
        if st.shelved_until is not None:
            self._unshelve(d, st, now, events, user)
        return events

    # --- internals -------------------------------------------------------------------------

    def _def(self, alarm_id: str) -> AlarmDef:
        try:
            return self._defs[alarm_id]
        except KeyError:
            raise CommandError("unknown_alarm", f"no alarm with id {alarm_id!r}") from None

    def _state(self, alarm_id: str) -> _State:
        self._def(alarm_id)
        return self._states[alarm_id]

    def _advance(self, now_mono: float) -> float:
        now = _check_time("now_mono", now_mono)
        if now < self._now:
            raise ValueError(f"monotonic time went backwards: {now} < {self._now}")
        self._now = now
        return now

    def _event(
        self, d: AlarmDef, st: _State, kind: EventKind, now: float, user: str | None = None
    ) -> AlarmEvent:
        return AlarmEvent(d.id, kind, d.severity, d.message, st.value, now, user)

    def _expire_shelves(self, now: float, events: list[AlarmEvent]) -> None:
        for aid, st in self._states.items():
            if st.shelved_until is not None and now >= st.shelved_until:
                self._unshelve(self._defs[aid], st, now, events, None)

    def _unshelve(
        self, d: AlarmDef, st: _State, now: float, events: list[AlarmEvent], user: str | None
    ) -> None:
        st.shelved_until = None
        self._shelved.discard(d.id)
        events.append(self._event(d, st, "unshelved", now, user))
        if st.phase == "active":
            st.acked, st.acked_by = False, None
            events.append(self._event(d, st, "raised", now))
        elif st.phase == "returned":
            events.append(self._event(d, st, "returned", now))

    def _evaluate(self, d: AlarmDef, st: _State, now: float, events: list[AlarmEvent]) -> None:
        shelved = st.shelved_until is not None
        if st.phase in ("normal", "returned"):
            if (
                st.condition
                and st.cond_since is not None
                and now - st.cond_since >= d.on_delay_s
                and now >= self._start + d.startup_inhibit_s
            ):
                st.phase, st.acked, st.acked_by, st.raised_t = "active", False, None, now
                if not shelved:
                    events.append(self._event(d, st, "raised", now))
        elif (
            st.phase == "active"
            and not st.condition
            and st.clear_since is not None
            and now - st.clear_since >= d.off_delay_s
        ):
            if d.latch:
                st.phase = "returned"
                if not shelved:
                    events.append(self._event(d, st, "returned", now))
            else:
                self._to_normal(d, st, now, events)

    def _to_normal(self, d: AlarmDef, st: _State, now: float, events: list[AlarmEvent]) -> None:
        st.phase, st.acked, st.acked_by, st.raised_t = "normal", False, None, None
        if st.shelved_until is None:
            events.append(self._event(d, st, "cleared", now))
