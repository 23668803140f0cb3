"""State sync and alarms of a redundant controller pair (issue 15): the pure parts.

No I/O, no clock (every method takes ``now``, the caller's monotonic seconds). The frame's
sync task (`rackplane.pair.PairSync`) carries the records over the KV store.

**The record** (`SyncRecord`, JSON under the key ``<site>.<rack>.<daemon>.sync``): the
active's tenure ``epoch``, a write counter ``seq`` (per process, growing), its ``owner`` id,
the command request-ids it applied with their first replies (``commands``: the router's
de-duplication entries still inside the command TTL, `rackplane.commands.CommandRouter.
export_seen`), the operator/automation leases on its outputs with the seconds left
(``leases``, `rackplane.core.leases.LeaseTable.export`) and the daemon's own state
(``state``: valvey's command state, learned state and the supply loop's output).

**Writer rule** (`SyncPacer`): the active writes a record when its content changed, at most
every ``min_interval_s``, and at least every ``heartbeat_s`` (so a standby can tell an old
record from a quiet active). **Reader rule** (`SyncFollower`): a record from an older epoch
than the newest seen is ignored; within one epoch only a higher ``seq`` is applied (a stale
read, a repeated poll). A record of a newer epoch with any ``seq`` is applied.

**Pair alarms** (`PairAlarms`, each as far as this one instance can see):

- ``standby_not_in_sync``: a standby whose last applied record is older than
  ``sync_max_age_s`` (or none applied that long after start);
- ``lease_renewals_late``: the holder's last lease renewal took longer than
  ``renew_late_s`` (request sent → answer);
- ``no_active_controller``: a standby that sees the lease key absent, or its record expired
  by its own timing, continuously for more than ``lease_s + no_active_margin_s``.

Errors: ``ValueError`` for a record that does not decode (`SyncRecord.decode`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

from pydantic import Field

from rackplane.core.alarms import AlarmDef
from rackplane.core.envelope import CommandArgs, CommandContext
from rackplane.errors import CommandError

__all__ = ["NOT_ACTIVE", "NOT_PAIRED", "PAIR_ALARM_IDS", "HandoverArgs", "PairAlarms",
           "SyncFollower", "SyncPacer", "SyncRecord", "is_pair_alarm", "pair_alarm_defs",
           "unpaired_handover"]

NOT_ACTIVE: Final = "not_active"
"""Refusal code of ``handover`` on an instance that does not hold the lease."""

NOT_PAIRED: Final = "not_paired"
"""Refusal code of ``handover`` on a single instance (``[leadership]`` off): it is not part of a
redundant pair, there is no standby to hand over to (`unpaired_handover`)."""

PAIR_ALARM_IDS: Final = ("standby_not_in_sync", "lease_renewals_late", "no_active_controller")

_MAX_ENTRIES: Final = 4096


@dataclass(frozen=True, slots=True)
class SyncRecord:
    """One sync record (module docstring).

    Attributes:
        epoch: the writer's tenure epoch (>= 1). seq: its write counter (>= 1).
        owner: the writer's lease owner id. commands: de-duplication entries
            (``{user, request_id, fingerprint (hex), reply, outcome}``). leases: lease entries
            (``{output, holder, role, remaining_s, reason}``). state: the daemon's state.
    """

    epoch: int
    seq: int
    owner: str
    commands: tuple[dict[str, Any], ...] = ()
    leases: tuple[dict[str, Any], ...] = ()
    state: dict[str, Any] = field(default_factory=dict)
    released: bool = False

    def content(self) -> tuple[Any, ...]:
        """What a change is judged on, as comparable JSON text: not ``seq``, and not a
        lease's ``remaining_s`` (it counts down all the time: the heartbeat carries it)."""
        leases = [{k: v for k, v in e.items() if k != "remaining_s"} for e in self.leases]
        return (self.epoch, json.dumps([self.commands, leases, self.state],
                                       sort_keys=True, default=str))

    def encode(self) -> bytes:
        return json.dumps({"epoch": self.epoch, "seq": self.seq, "owner": self.owner,
                           "commands": list(self.commands), "leases": list(self.leases),
                           "state": self.state, "released": self.released}, separators=(",", ":"),
                          allow_nan=False).encode()

    @classmethod
    def decode(cls, raw: bytes) -> SyncRecord:
        """The record in ``raw``.

        Raises:
            ValueError: not JSON of that shape (epoch, seq ints >= 1; owner a string;
                commands and leases lists of objects, at most 4096 each; state an object).
        """
        try:
            d = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"sync record is not JSON: {err}") from None
        if not isinstance(d, dict):
            raise ValueError("sync record is not a JSON object")
        for key in ("epoch", "seq"):
            v = d.get(key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"sync record {key}: expected an int >= 1, got {v!r}")
        if not isinstance(d.get("owner"), str):
            raise ValueError("sync record owner: expected a string")
        lists = []
        for key in ("commands", "leases"):
            v = d.get(key, [])
            if not isinstance(v, list) or len(v) > _MAX_ENTRIES or any(
                    not isinstance(e, dict) for e in v):
                raise ValueError(f"sync record {key}: expected a list of objects")
            lists.append(tuple(v))
        state = d.get("state", {})
        if not isinstance(state, dict):
            raise ValueError("sync record state: expected an object")
        released = d.get("released", False)
        if not isinstance(released, bool):
            raise ValueError("sync record released: expected true/false")
        return cls(d["epoch"], d["seq"], d["owner"], lists[0], lists[1], state, released)


class SyncPacer:
    """When the active writes its record (module docstring: on change, at most every
    ``min_interval_s``, at least every ``heartbeat_s``).

    Raises:
        ValueError: not 0 < min_interval_s <= heartbeat_s (finite).
    """

    def __init__(self, min_interval_s: float, heartbeat_s: float) -> None:
        if not (math.isfinite(min_interval_s) and math.isfinite(heartbeat_s)
                and 0 < min_interval_s <= heartbeat_s):
            raise ValueError(f"sync intervals must be 0 < min ({min_interval_s}) <= heartbeat "
                             f"({heartbeat_s})")
        self.min_interval_s = min_interval_s
        self.heartbeat_s = heartbeat_s
        self._last_s = -math.inf
        self._last_content: tuple[Any, ...] | None = None

    def due(self, now: float, content: tuple[Any, ...]) -> bool:
        """Is a write due at ``now`` for a record of ``content`` (`SyncRecord.content`)?"""
        if now - self._last_s >= self.heartbeat_s:
            return True
        return content != self._last_content and now - self._last_s >= self.min_interval_s

    def written(self, now: float, content: tuple[Any, ...]) -> None:
        """A record of ``content`` was handed to the store at ``now``."""
        self._last_s = now
        self._last_content = content

    def reset(self) -> None:
        """A new tenure: the first record goes out at once."""
        self._last_s = -math.inf
        self._last_content = None


class SyncFollower:
    """The reader's rule (module docstring): which records to apply."""

    def __init__(self) -> None:
        self.newest_epoch = 0
        self.last_seq = 0
        self.last_owner: str | None = None
        self.applied = 0
        self.ignored_stale = 0
        self.applied_at_s: float | None = None

    def offer(self, rec: SyncRecord, now: float) -> bool:
        """True when ``rec`` is to be applied (then ``applied_at_s`` is ``now``: the active
        writes a new record at least every heartbeat, so its age tells how far behind this
        copy may be); False for a record of an older epoch than the newest seen, or of the
        same epoch and writer without a higher ``seq`` (counted in ``ignored_stale`` when
        older)."""
        if rec.epoch < self.newest_epoch:
            self.ignored_stale += 1
            return False
        if (rec.epoch == self.newest_epoch and rec.owner == self.last_owner
                and rec.seq <= self.last_seq):
            # the same record read again says nothing of now (a dead active's last record
            # stays in the store): the age counts from the last new one
            if rec.seq < self.last_seq:
                self.ignored_stale += 1
            return False
        self.newest_epoch, self.last_seq, self.last_owner = rec.epoch, rec.seq, rec.owner
        self.applied += 1
        self.applied_at_s = now
        return True


@dataclass(frozen=True, slots=True)
class _Bounds:
    sync_max_age_s: float
    renew_late_s: float
    no_active_after_s: float


class PairAlarms:
    """The pair alarms' conditions (module docstring); `update` each tick.

    Args:
        sync_max_age_s: ``standby_not_in_sync`` bound, s. renew_late_s:
            ``lease_renewals_late`` bound, s. no_active_after_s: ``no_active_controller``
            bound (``lease_s + no_active_margin_s``), s. start_s: monotonic start, s.
    """

    def __init__(self, sync_max_age_s: float, renew_late_s: float, no_active_after_s: float,
                 start_s: float) -> None:
        self.bounds = _Bounds(sync_max_age_s, renew_late_s, no_active_after_s)
        self._start_s = start_s
        self._no_holder_since: float | None = None
        self.active: dict[str, bool] = dict.fromkeys(PAIR_ALARM_IDS, False)

    def update(self, now: float, *, standby: bool, synced_at_s: float | None,
               renew_latency_s: float | None, holder_seen: bool,
               holder_expired: bool) -> list[tuple[str, bool]]:
        """The conditions at ``now``: ``standby`` (this instance does not hold the lease),
        ``synced_at_s`` (when the last record was applied, None: never), ``renew_latency_s``
        (the last renewal's, None: none yet), ``holder_seen`` (the lease key names a holder),
        ``holder_expired`` (its record expired by this instance's timing). Returns the
        changes ``[(alarm id, raised)]``."""
        b = self.bounds
        since = synced_at_s if synced_at_s is not None else self._start_s
        no_holder = standby and (not holder_seen or holder_expired)
        if not no_holder:
            self._no_holder_since = None
        elif self._no_holder_since is None:
            self._no_holder_since = now
        cond = {
            "standby_not_in_sync": standby and now - since > b.sync_max_age_s,
            "lease_renewals_late": (not standby and renew_latency_s is not None
                                    and renew_latency_s > b.renew_late_s),
            "no_active_controller": (self._no_holder_since is not None
                                     and now - self._no_holder_since > b.no_active_after_s),
        }
        changes = [(k, v) for k, v in cond.items() if v != self.active[k]]
        self.active = cond
        return changes


_PAIR_ALARM_TEXT: Final = {
    "standby_not_in_sync": ("major", "the standby's copy of the active's state (setpoint, "
                            "modes, leases, applied commands) is older than "
                            "leadership.sync_max_age_s: a takeover now would not be bumpless"),
    "lease_renewals_late": ("warning", "the active's leadership lease renewals take longer "
                            "than leadership.renew_late_s: the NATS cluster is slow or "
                            "electing; past the renew deadline the active fences itself"),
    "no_active_controller": ("critical", "the standby sees no live leadership lease for longer "
                             "than lease_s + no_active_margin_s and cannot take over: the CDU "
                             "is on its local control (heartbeat)"),
}


def pair_alarm_defs(instance: str) -> list[AlarmDef]:
    """The pair alarms of one instance, ids ``<kind>:<instance>`` (`PAIR_ALARM_IDS`): each
    instance publishes its own (the conditions are already timed by `PairAlarms`: no
    on-delay here)."""
    return [AlarmDef(id=f"{kind}:{instance}", severity=sev, message=text,
                     runbook="operations-pairs")
            for kind, (sev, text) in _PAIR_ALARM_TEXT.items()]


def is_pair_alarm(alarm_id: str) -> bool:
    """Is ``alarm_id`` one of a pair's instance alarms (`pair_alarm_defs`, any instance)?
    The retained-alarm reconciliation of a new active leaves them to their instance."""
    return alarm_id.split(":", 1)[0] in PAIR_ALARM_IDS and ":" in alarm_id


class HandoverArgs(CommandArgs):
    """``handover`` (one of a redundant pair only; the active answers it): planned
    maintenance. The active writes its state record to the KV store, releases its lease and
    stops writing; the standby takes over from that state. Refused with ``not_active`` by an
    instance that does not hold the lease, and with ``not_paired`` by a single instance
    (``[leadership]`` off: no standby to hand over to)."""

    reason: str | None = Field(None, max_length=200,
                               description="why (logged with the handover)")


def unpaired_handover(daemon: str) -> Callable[[HandoverArgs, CommandContext],
                                               Awaitable[dict[str, Any]]]:
    """The ``handover`` handler of a single instance of ``daemon`` (``[leadership]`` off): it
    always refuses with `NOT_PAIRED`, so an operator reads why (the verb exists in pair mode;
    ``unknown_verb`` with the list of every verb buried the point).

    Raises (from the handler):
        CommandError: ``not_paired``, always.
    """
    async def refuse(args: HandoverArgs, ctx: CommandContext) -> dict[str, Any]:
        raise CommandError(NOT_PAIRED, f"this {daemon} is not part of a redundant pair (its "
                           "[leadership] is off: a single instance), there is no standby to "
                           "hand over to; nothing was changed")
    return refuse
