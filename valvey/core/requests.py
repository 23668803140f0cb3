"""valvey's requests to racky (docs/CONTRACTS.md: ``racky/cmd/valvey/<verb>``) and their replies,
tracked purely (no I/O, no clock): the core says what it *wants* acknowledged; this tracker
decides when to (re)send, matches replies and reports what is outstanding.

Verbs (docs/CONTRACTS.md): ``power_down_trays {trays, reason}`` and ``power_down_rack
{reason}`` are **safety** requests (racky exempts them from blast-radius limits, leases and
start-up inhibits; valvey never holds them back either); ``cap_rack {power_w, reason, ttl_s}``
(re-sent while needed, expires after ``ttl_s``) and ``release_cap {reason}``.

Sending policy: a wanted request is sent at once; without a reply it is sent again (same
arguments, a new request id) every ``retry_s``; an ``ok`` reply satisfies it until the wanted
arguments change; a refusal is retried every ``retry_s`` too (racky may refuse while it
starts). ``cap_rack`` is re-sent every ``ttl_s / 3`` while wanted, so it never expires while
needed. Request ids are ``<prefix>-<n>``: the prefix must be unique per process start (the
receiver de-duplicates by id within its TTL: a restarted valvey reusing ids would be answered
with old replies and not obeyed, FIELD-CASES BR-22 a).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SAFETY_VERBS", "RackyReply", "RackyRequest", "RequestTracker"]

SAFETY_VERBS = frozenset({"power_down_trays", "power_down_rack"})
"""Verbs racky treats as safety actions (docs/CONTRACTS.md)."""


@dataclass(frozen=True, slots=True)
class RackyRequest:
    """One request to send: verb, args, id, whether it is a safety action, when it was made
    (monotonic s) and the key it satisfies."""

    request_id: str
    verb: str
    args: Mapping[str, Any]
    safety: bool
    t_mono: float
    key: str

    def envelope_args(self) -> dict[str, Any]:
        """The command envelope's ``args``."""
        return dict(self.args)


@dataclass(frozen=True, slots=True)
class RackyReply:
    """A reply from racky (``{request_id, ok, error, state}``)."""

    request_id: str
    ok: bool
    error: Mapping[str, Any] | None = None
    state: Mapping[str, Any] | None = None


@dataclass(slots=True)
class _Want:
    verb: str
    args: dict[str, Any]
    safety: bool
    since: float
    sent_id: str | None = None
    sent_t: float | None = None
    acked: bool = False
    acked_t: float | None = None
    refused: str | None = None
    resend_every_s: float | None = None


@dataclass
class RequestStats:
    """Counters (health)."""

    sent: int = 0
    acked: int = 0
    refused: int = 0
    unanswered: int = 0
    unknown_replies: int = 0
    errors: dict[str, int] = field(default_factory=dict)


class RequestTracker:
    """What valvey wants from racky and what racky said.

    Args:
        prefix: request-id prefix, unique per process start.
        retry_s: resend period without a reply, or after a refusal [s].
    """

    def __init__(self, prefix: str, retry_s: float = 2.0):
        self._prefix = prefix
        self._retry = retry_s
        self._n = 0
        self._wants: dict[str, _Want] = {}
        self._by_id: dict[str, str] = {}
        self._outbox: list[RackyRequest] = []
        self.stats = RequestStats()
        self.last_state: dict[str, Any] = {}
        self.last_state_t: float | None = None

    def want(self, key: str, verb: str, args: Mapping[str, Any], now: float, *,
             resend_every_s: float | None = None) -> None:
        """Want ``verb(args)`` acknowledged (idempotent; new args supersede the old ones)."""
        w = self._wants.get(key)
        a = dict(args)
        if w is not None and w.verb == verb and w.args == a:
            return
        self._wants[key] = _Want(verb, a, verb in SAFETY_VERBS, now,
                                 resend_every_s=resend_every_s)

    def drop(self, key: str) -> None:
        """No longer want ``key`` (replies to it are still recorded)."""
        self._wants.pop(key, None)

    def wanted(self, key: str) -> bool:
        """True while ``key`` is wanted."""
        return key in self._wants

    def acked(self, key: str) -> bool:
        """True when the current args of ``key`` were acknowledged ``ok``."""
        w = self._wants.get(key)
        return w is not None and w.acked

    def unanswered_s(self, key: str, now: float) -> float:
        """How long ``key`` has been wanted without an ``ok`` (0 when acked or not wanted)."""
        w = self._wants.get(key)
        if w is None or w.acked:
            return 0.0
        return now - w.since

    def step(self, now: float) -> list[RackyRequest]:
        """The requests to send now."""
        out: list[RackyRequest] = []
        for key, w in self._wants.items():
            due = w.sent_t is None
            if not due and not w.acked and w.sent_t is not None:
                due = now - w.sent_t >= self._retry - 1e-9
                if due:
                    self.stats.unanswered += 0 if w.refused else 1
            if not due and w.acked and w.resend_every_s is not None and w.sent_t is not None:
                due = now - w.sent_t >= w.resend_every_s - 1e-9
            if due:
                self._n += 1
                rid = f"{self._prefix}-{self._n}"
                w.sent_id, w.sent_t = rid, now
                self._by_id[rid] = key
                if len(self._by_id) > 4096:  # bound the id map (old replies are then unknown)
                    for old in list(self._by_id)[:1024]:
                        del self._by_id[old]
                out.append(RackyRequest(rid, w.verb, dict(w.args), w.safety, now, key))
                self.stats.sent += 1
        return out

    def on_reply(self, reply: RackyReply, now: float) -> str | None:
        """Record a reply; returns the key it answered (None: unknown id)."""
        key = self._by_id.get(reply.request_id)
        if reply.state is not None:
            self.last_state = dict(reply.state)
            self.last_state_t = now
        if key is None:
            self.stats.unknown_replies += 1
            return None
        w = self._wants.get(key)
        if w is None or w.sent_id != reply.request_id:
            return key  # an answer to superseded args
        if reply.ok:
            w.acked, w.acked_t, w.refused = True, now, None
            self.stats.acked += 1
        else:
            code = str((reply.error or {}).get("code", "refused"))
            w.refused = code
            self.stats.refused += 1
            self.stats.errors[code] = self.stats.errors.get(code, 0) + 1
        return key

    def state(self) -> dict[str, Any]:
        """JSON-ready: every wanted request and its status."""
        return {
            k: {"verb": w.verb, "args": w.args, "safety": w.safety, "acked": w.acked,
                "refused": w.refused, "request_id": w.sent_id}
            for k, w in self._wants.items()
        }
