"""Leases: who may move an output, and for how long (DESIGN §1 "Outputs are owned").

A pure core: no I/O, no clock (every method takes ``now``, monotonic seconds), no asyncio.

Rules, in the order `LeaseTable.check` applies them:

1. **Active safety interlocks override every lease.** While an interlock holds an output
   (`LeaseTable.set_interlocks`, fed by the daemon's tick), no command moves it, whoever holds
   the lease: ``interlock_active``. The lease itself is kept (the holder is still shown) and
   applies again once the interlock clears.
2. **Below the interlocks, a lease is exclusive.** An output leased to another user cannot be
   moved by a command: ``lease_held`` (the message names the holder, role and time left).
3. A verb that moves an output only under a lease (valvey's manual valve output, racky's
   node cap override) calls ``check(..., require_lease=True)``: without one, ``lease_required``.

Leases are taken and given back by the generic verbs ``acquire_lease`` / ``release_lease``
(`rackplane.commands.register_lease_verbs`):

- **Priority: operator > automation** (DESIGN §1). An operator's ``acquire`` preempts an
  automation lease (event ``preempted``); the reverse is refused with ``lease_held``. Equal
  priority never preempts: the holder must release it or let it expire.
- **Expiry:** every lease has one (``ttl_s``, default `CommandSettings.lease_default_ttl_s`,
  at most ``lease_max_ttl_s``). The same user acquiring again renews it. `expire` (called by
  the tick) drops expired leases and reports them once.
- **Explicit release** by the holder; an operator may break any lease with ``force`` (event
  ``broken``; audited like every command). Releasing an output nobody holds is a no-op.
- Readers never hold leases (``forbidden``).

Every change is returned as `LeaseEvent`s (and kept for `drain_events`), so the daemon logs
each change once and re-publishes the `snapshot` (its ``state/leases``: the holder of each
output, DESIGN §1 "the state shows the holder").

Errors: every refusal is a `rackplane.errors.CommandError` whose ``code`` goes into the
command reply (`LEASE_CODES`); ``ValueError`` only for programming errors (bad config).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

from rackplane.errors import CommandError
from rackplane.settings import Role

__all__ = [
    "LEASE_CODES",
    "OUTPUT_PATTERN",
    "PRIORITY",
    "Lease",
    "LeaseEvent",
    "LeaseTable",
]

INTERLOCK_ACTIVE: Final = "interlock_active"
LEASE_HELD: Final = "lease_held"
LEASE_REQUIRED: Final = "lease_required"
UNKNOWN_OUTPUT: Final = "unknown_output"
INVALID_LEASE_TTL: Final = "invalid_lease_ttl"
FORBIDDEN: Final = "forbidden"

LEASE_CODES: frozenset[str] = frozenset({
    INTERLOCK_ACTIVE, LEASE_HELD, LEASE_REQUIRED, UNKNOWN_OUTPUT, INVALID_LEASE_TTL, FORBIDDEN,
})
"""The ``error.code`` values a lease refusal carries."""

PRIORITY: Mapping[str, int] = {"reader": 0, "automation": 1, "operator": 2}
"""Lease priority by role (DESIGN §1: operator > automation; readers hold none)."""

OUTPUT_PATTERN: Final = r"^[a-z0-9][a-z0-9_.:-]{0,63}$"
"""An output name (also a JSON key and a log field): e.g. ``valve``, ``pump_lead``,
``tray:07``."""
_OUTPUT_RE = re.compile(OUTPUT_PATTERN)

EventKind = Literal["acquired", "renewed", "preempted", "released", "broken", "expired"]


@dataclass(frozen=True, slots=True)
class Lease:
    """One lease.

    Attributes:
        output: the output it covers; holder: the broker username; role: the holder's role.
        priority: `PRIORITY` of the role. acquired_mono / expires_mono: monotonic s.
        reason: free text from the client (shown in the state), or None.
    """

    output: str
    holder: str
    role: Role
    priority: int
    acquired_mono: float
    expires_mono: float
    reason: str | None = None

    def remaining_s(self, now: float) -> float:
        """Seconds until it expires (0 when expired)."""
        return max(0.0, self.expires_mono - now)

    def as_dict(self, now: float) -> dict[str, Any]:
        """JSON-ready: ``holder, role, priority, expires_in_s, held_for_s, reason``."""
        return {
            "holder": self.holder,
            "role": self.role,
            "priority": self.priority,
            "expires_in_s": round(self.remaining_s(now), 3),
            "held_for_s": round(max(0.0, now - self.acquired_mono), 3),
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class LeaseEvent:
    """One change of a lease, for the log (once per change) and the state.

    Attributes:
        kind: ``acquired``, ``renewed``, ``preempted`` (an operator took it from automation),
            ``released``, ``broken`` (released by force by an operator), ``expired``.
        output, holder, role: the lease concerned (for ``preempted`` and ``broken``, the
            holder that lost it).
        by: the user who caused it (None for ``expired``).
        t_mono: when [monotonic s]. expires_in_s: for acquired/renewed, else None.
    """

    kind: EventKind
    output: str
    holder: str
    role: Role
    by: str | None
    t_mono: float
    expires_in_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields (also the log event's fields)."""
        return {
            "kind": self.kind, "output": self.output, "holder": self.holder, "role": self.role,
            "by": self.by, "expires_in_s": self.expires_in_s,
        }


class LeaseTable:
    """The leases of one daemon's outputs (see the module docstring for the rules).

    Args:
        outputs: the outputs that can be leased (names matching `OUTPUT_PATTERN`), e.g.
            ``["valve"]`` or ``{"valve": "facility valve, manual output"}`` (descriptions go
            into the snapshot).
        default_ttl_s: expiry when ``acquire`` gets no ``ttl_s`` [s]
            (`CommandSettings.lease_default_ttl_s`).
        max_ttl_s: longest ``ttl_s`` accepted [s] (`CommandSettings.lease_max_ttl_s`).

    Raises:
        ValueError: an output name is invalid or repeated, or the TTLs are not
            0 < default_ttl_s <= max_ttl_s (finite).
    """

    def __init__(
        self,
        outputs: Iterable[str] | Mapping[str, str],
        *,
        default_ttl_s: float = 600.0,
        max_ttl_s: float = 28_800.0,
    ) -> None:
        items = (list(outputs.items()) if isinstance(outputs, Mapping)
                 else [(o, "") for o in outputs])
        names = [name for name, _ in items]
        if len(set(names)) != len(names):
            raise ValueError(f"lease outputs repeated: {names}")
        for name in names:
            if not isinstance(name, str) or not _OUTPUT_RE.fullmatch(name):
                raise ValueError(f"lease output {name!r} must match {OUTPUT_PATTERN}")
        self._outputs: dict[str, str] = {name: str(desc) for name, desc in items}
        self._leases: dict[str, Lease] = {}
        self._interlocks: dict[str, str] = {}
        self._events: list[LeaseEvent] = []
        self.default_ttl_s = default_ttl_s
        self.max_ttl_s = max_ttl_s
        self.set_limits(default_ttl_s, max_ttl_s)

    # --- configuration ----------------------------------------------------------------------

    def set_limits(self, default_ttl_s: float, max_ttl_s: float) -> None:
        """New TTL bounds (SIGHUP); leases already granted keep their expiry.

        Raises:
            ValueError: not 0 < default_ttl_s <= max_ttl_s, or not finite.
        """
        if not (math.isfinite(default_ttl_s) and math.isfinite(max_ttl_s)
                and 0 < default_ttl_s <= max_ttl_s):
            raise ValueError(f"lease TTLs must be 0 < default ({default_ttl_s}) <= max "
                             f"({max_ttl_s}), finite")
        self.default_ttl_s = float(default_ttl_s)
        self.max_ttl_s = float(max_ttl_s)

    @property
    def outputs(self) -> list[str]:
        """The leasable outputs, in configuration order."""
        return list(self._outputs)

    def set_interlocks(self, active: Mapping[str, str]) -> None:
        """The safety interlocks holding outputs now: ``{output: interlock id or reason}``
        (an empty mapping: none). Replaces the previous set; the daemon calls it from its tick
        with what its interlock core reports. Outputs not in the table are ignored (an
        interlock may act on outputs that are never leased)."""
        self._interlocks = {o: str(r) for o, r in active.items() if o in self._outputs}

    @property
    def interlocks(self) -> dict[str, str]:
        """Active interlocks by output (a copy)."""
        return dict(self._interlocks)

    # --- the checks the daemons' verbs call ---------------------------------------------------

    def check(
        self, output: str, user: str, role: Role, now: float, *, require_lease: bool = False
    ) -> None:
        """May ``user`` (``role``) move ``output`` now? Returns None if so.

        Call it in a verb's handler *before* changing anything (the router's handler
        contract: validate before mutating).

        Raises:
            CommandError: ``unknown_output``; ``interlock_active`` (always first: interlocks
                override every lease); ``lease_held`` (another user holds it);
                ``lease_required`` (``require_lease`` and the user holds no lease on it).
        """
        self._known(output)
        interlock = self._interlocks.get(output)
        if interlock is not None:
            raise CommandError(
                INTERLOCK_ACTIVE,
                f"{output} is held by the safety interlock {interlock!r}: no command moves it "
                "while the interlock is active (it overrides every lease)",
            )
        lease = self.holder(output, now)
        if lease is not None and lease.holder != user:
            raise CommandError(LEASE_HELD, self._held_message(lease, now))
        if require_lease and lease is None:
            raise CommandError(
                LEASE_REQUIRED,
                f"{output} moves only under a lease: send acquire_lease "
                f"{{\"output\": \"{output}\"}} first (role {role})",
            )

    def holder(self, output: str, now: float) -> Lease | None:
        """The lease in force on ``output`` (None if free or expired)."""
        lease = self._leases.get(output)
        if lease is None or lease.expires_mono <= now:
            return None
        return lease

    # --- the generic verbs -------------------------------------------------------------------

    def acquire(
        self,
        output: str,
        user: str,
        role: Role,
        now: float,
        ttl_s: float | None = None,
        reason: str | None = None,
    ) -> Lease:
        """Take (or renew) the lease on ``output`` for ``ttl_s`` seconds.

        Returns the new lease. An operator preempts an automation lease; the same user
        renews. An active interlock does not stop an acquire (the snapshot shows it; moves
        stay refused until it clears).

        Raises:
            CommandError: ``unknown_output``; ``forbidden`` (readers); ``invalid_lease_ttl``
                (not 0 < ttl_s <= max_ttl_s); ``lease_held`` (another user holds it with
                the same or a higher priority).
        """
        self._known(output)
        prio = self._priority(role, "acquire a lease")
        ttl = self.default_ttl_s if ttl_s is None else float(ttl_s)
        if not (math.isfinite(ttl) and 0 < ttl <= self.max_ttl_s):
            raise CommandError(
                INVALID_LEASE_TTL,
                f"ttl_s must be > 0 and <= {self.max_ttl_s:g} s (commands.lease_max_ttl_s); "
                f"got {ttl_s!r}",
            )
        self._expire_one(output, now)
        current = self._leases.get(output)
        kind: EventKind = "acquired"
        acquired = now
        if current is not None:
            if current.holder == user:
                kind, acquired = "renewed", current.acquired_mono
            elif prio > current.priority:
                self._emit(LeaseEvent("preempted", output, current.holder, current.role, user,
                                      now))
            else:
                raise CommandError(LEASE_HELD, self._held_message(current, now))
        lease = Lease(output, user, role, prio, acquired, now + ttl, reason)
        self._leases[output] = lease
        self._emit(LeaseEvent(kind, output, user, role, user, now, round(ttl, 3)))
        return lease

    def release(
        self, output: str, user: str, role: Role, now: float, *, force: bool = False
    ) -> Lease | None:
        """Give ``output`` back. Returns the lease released (None if nobody held it).

        Raises:
            CommandError: ``unknown_output``; ``forbidden`` (``force`` without the operator
                role); ``lease_held`` (another user holds it and ``force`` is not set).
        """
        self._known(output)
        self._expire_one(output, now)
        current = self._leases.get(output)
        if current is None:
            return None
        if current.holder != user:
            if not force:
                raise CommandError(
                    LEASE_HELD, self._held_message(current, now)
                    + "; an operator may break it with force: true",
                )
            if PRIORITY.get(role, 0) < PRIORITY["operator"]:
                raise CommandError(
                    FORBIDDEN, f"only an operator may break another user's lease (role {role})"
                )
        del self._leases[output]
        kind: EventKind = "released" if current.holder == user else "broken"
        self._emit(LeaseEvent(kind, output, current.holder, current.role, user, now))
        return current

    # --- time and state ------------------------------------------------------------------------

    def expire(self, now: float) -> list[LeaseEvent]:
        """Drop every lease expired at ``now``; returns their ``expired`` events (each once).
        The daemon calls it from its tick."""
        out: list[LeaseEvent] = []
        for output in list(self._leases):
            ev = self._expire_one(output, now)
            if ev is not None:
                out.append(ev)
        return out

    def drain_events(self) -> list[LeaseEvent]:
        """Every event since the last call (acquire, renew, preempt, release, break,
        expire), oldest first: for the daemon's log and its ``state/leases`` publication."""
        events, self._events = self._events, []
        return events

    def snapshot(self, now: float) -> dict[str, Any]:
        """The ``state/leases`` payload: ``{output: {holder, role, priority, expires_in_s,
        held_for_s, reason, interlock, description}}`` for every output (holder null when
        free; interlock null unless one holds the output). Schema:
        ``state-leases.schema.json``."""
        out: dict[str, Any] = {}
        for output, description in self._outputs.items():
            lease = self.holder(output, now)
            entry: dict[str, Any] = lease.as_dict(now) if lease is not None else {
                "holder": None, "role": None, "priority": None, "expires_in_s": None,
                "held_for_s": None, "reason": None,
            }
            entry["interlock"] = self._interlocks.get(output)
            entry["description"] = description or None
            out[output] = entry
        return out

    # --- a redundant pair's sync (issue 15) -----------------------------------------------------

    def export(self, now: float) -> list[dict[str, Any]]:
        """The leases in force at ``now``: ``{output, holder, role, remaining_s, reason}``
        each (seconds left rounded to 0.1 s), in output order."""
        return [{"output": o, "holder": lease.holder, "role": lease.role,
                 "remaining_s": round(lease.remaining_s(now), 1), "reason": lease.reason}
                for o in self._outputs if (lease := self.holder(o, now)) is not None]

    def restore(self, entries: Iterable[Mapping[str, Any]], now: float) -> list[str]:
        """Replace the leases by the pair's active's (`export`): each expires
        ``remaining_s`` after ``now`` (at most ``max_ttl_s``). Entries of unknown outputs,
        roles without lease priority or bad numbers are skipped. No events: the active
        logged and published each change (a standby publishes none). Returns the outputs
        now leased."""
        new: dict[str, Lease] = {}
        for e in entries:
            output, holder, role = e.get("output"), e.get("holder"), e.get("role")
            rem, reason = e.get("remaining_s"), e.get("reason")
            if (output not in self._outputs or not isinstance(holder, str)
                    or PRIORITY.get(str(role), 0) <= 0 or isinstance(rem, bool)
                    or not isinstance(rem, int | float) or not math.isfinite(rem) or rem <= 0
                    or not (reason is None or isinstance(reason, str))):
                continue
            old = self._leases.get(output)
            acquired = old.acquired_mono if old is not None and old.holder == holder else now
            new[output] = Lease(output, holder, cast(Role, role), PRIORITY[str(role)], acquired,
                                now + min(float(rem), self.max_ttl_s), reason)
        self._leases = new
        return sorted(new)

    # --- internals ----------------------------------------------------------------------------

    def _known(self, output: str) -> None:
        if output not in self._outputs:
            known = ", ".join(self._outputs) or "none"
            raise CommandError(UNKNOWN_OUTPUT,
                               f"unknown output {output[:64]!r}; leasable outputs: {known}")

    @staticmethod
    def _priority(role: Role, what: str) -> int:
        prio = PRIORITY.get(role, 0)
        if prio <= 0:
            raise CommandError(FORBIDDEN, f"role {role} may not {what} (automation or operator)")
        return prio

    def _expire_one(self, output: str, now: float) -> LeaseEvent | None:
        lease = self._leases.get(output)
        if lease is None or lease.expires_mono > now:
            return None
        del self._leases[output]
        ev = LeaseEvent("expired", output, lease.holder, lease.role, None, now)
        self._emit(ev)
        return ev

    def _emit(self, ev: LeaseEvent) -> None:
        self._events.append(ev)
        if len(self._events) > 10_000:  # a daemon that never drains must not grow forever
            del self._events[:-1000]

    @staticmethod
    def _held_message(lease: Lease, now: float) -> str:
        return (f"{lease.output} is leased to {lease.holder!r} ({lease.role}) for another "
                f"{lease.remaining_s(now):.0f} s")
