"""The command path: MQTT commands validated, authorised, de-duplicated, applied, answered and
audited (DESIGN §1 "MQTT commands -> validate -> lease -> core -> reply", §3 MQTT contract).

A client named ``<user>`` by the broker publishes (QoS 1, not retained) to
``<root>/<site>/<rack>/<daemon>/cmd/<user>/<verb>``::

    {"request_id": "op-42", "issued_at": "2026-01-01T12:00:00Z", "args": {"setpoint_c": 40}}

and gets exactly one reply ``{request_id, ok, error: {code, message} | null, state}`` on its
MQTT v5 Response Topic (with its Correlation Data), else on ``cmd/<user>/<verb>/result``. The
JSON Schemas of the envelope, the reply and every verb's args ship in ``rackplane/schemas/``
(`schema_documents`, `write_schemas`; regenerate with ``python -m valvey.commands
--write-schemas``).

The checks, in order, each refusing with its ``error.code`` (`ROUTER_CODES`):

1. ``retained``: a command delivered from the broker's retained store is never executed.
2. ``too_large``: payload above ``max_payload_bytes`` (not parsed at all).
3. ``bad_json``: not UTF-8 JSON, NaN/Infinity literals, duplicate keys, nested deeper than 32
   levels, not an object.
4. ``invalid_envelope``: `CommandEnvelope` refused it (key paths in the message). The reply
   carries the request_id if it could be read, else null.
5. A (user, request_id) already seen among the last ``dedup_entries``: answered with the first
   reply, never applied again (FIELD-CASES BR-22 a, a QoS 1 redelivery with DUP, or a client
   retry). The same request_id with another verb or other args: ``request_id_reused``.
6. ``expired`` / ``from_future``: ``issued_at`` older than ``ttl_s`` or more than
   ``clock_skew_s`` ahead of our wall clock (``Clock.wall_ns``: a timestamp comparison, the
   only wall-clock use here).
7. ``unknown_verb`` (the message lists the known verbs).
8. ``forbidden``: the user's role (``CommandSettings.users``, else ``default_role``; never from
   the payload) is below the verb's least role (reader < automation < operator).
9. ``invalid_args``: the verb's args model refused them (key paths ``args.<field>``).
10. The handler: a `CommandError` becomes ``ok: false`` with its code; any other exception is
    ``internal_error`` (logged with its traceback); otherwise ``ok: true`` and ``state`` is the
    handler's dict.

**Handler contract.** ``handler(args, ctx) -> dict`` is synchronous and quick (it runs on the
event loop, BR-24: no I/O, no sleeps; hand slow work to a task and report it in ``state``). It
must *validate before it mutates*: when it raises, nothing may have changed, so a refusal or an
``internal_error`` reply always means "not applied". Side effects after the mutation (publishing
events) must not raise. It reads time from ``ctx.now_mono`` / ``ctx.wall_ns``, never a clock.

Every command, accepted or refused, is audited once: one ``command`` log event and one call of
the ``audit`` callback with a `CommandAudit` (a daemon writes it to the time series as
measurement ``command``, DESIGN §3, via `CommandAudit.tags` / `CommandAudit.fields`).
`CommandRouter.stats` counts received, applied, refused by code and duplicates. The message
handler never raises and never blocks: every step is bounded by ``max_payload_bytes``.

Later (the full contract): leases (owner, priority, expiry) sit between step 9 and 10; TLS and
broker ACLs (``pattern write .../cmd/%u/#``) make ``<user>`` unforgeable; a client CLI uses the
schemas. The envelope forbids unknown keys, so new fields arrive with a schema change.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import math
import re
import sys
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any, Final, TypeVar

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, field_validator

from rackplane.clock import Clock
from rackplane.config import StrictModel
from rackplane.errors import CommandError
from rackplane.log import get_logger
from rackplane.mqtt import Message, MqttLink, encode_json
from rackplane.settings import CommandSettings, Role

__all__ = [
    "ROLE_RANK",
    "ROUTER_CODES",
    "SCHEMA_DIR",
    "CommandArgs",
    "CommandAudit",
    "CommandContext",
    "CommandEnvelope",
    "CommandErrorBody",
    "CommandReply",
    "CommandRouter",
    "CommandStats",
    "NoArgs",
    "load_schema",
    "schema_documents",
    "stale_schemas",
    "write_schemas",
]

# --- refusal codes (the reply's error.code) -----------------------------------------------------

RETAINED: Final = "retained"
TOO_LARGE: Final = "too_large"
BAD_JSON: Final = "bad_json"
INVALID_ENVELOPE: Final = "invalid_envelope"
REQUEST_ID_REUSED: Final = "request_id_reused"
EXPIRED: Final = "expired"
FROM_FUTURE: Final = "from_future"
UNKNOWN_VERB: Final = "unknown_verb"
FORBIDDEN: Final = "forbidden"
INVALID_ARGS: Final = "invalid_args"
INTERNAL_ERROR: Final = "internal_error"

ROUTER_CODES: frozenset[str] = frozenset({
    RETAINED, TOO_LARGE, BAD_JSON, INVALID_ENVELOPE, REQUEST_ID_REUSED, EXPIRED, FROM_FUTURE,
    UNKNOWN_VERB, FORBIDDEN, INVALID_ARGS, INTERNAL_ERROR,
})
"""Codes the router itself refuses with; handlers add their own (`CommandError.code`)."""

OUTCOME_OK: Final = "ok"
OUTCOME_DUPLICATE: Final = "duplicate"

ROLE_RANK: Mapping[str, int] = {"reader": 0, "automation": 1, "operator": 2}
"""Roles, least to most privileged (DESIGN §1: operator > automation)."""

REQUEST_ID_PATTERN: Final = r"^[A-Za-z0-9._:-]{1,64}$"
_REQUEST_ID_RE = re.compile(REQUEST_ID_PATTERN)
_VERB_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")  # a topic level (rackplane.mqtt)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MESSAGE_MAX_CHARS = 1000  # bound on error.message (it may quote client input)
_NAME_MAX_CHARS = 64  # users and verbs quoted in logs, audit and messages
_MAX_DEPTH = 32  # JSON nesting accepted (commands are flat; bounds every later recursion)
_SLOW_HANDLER_S = 0.05  # a handler slower than this is logged: it holds up the event loop

SCHEMA_DIR = Path(__file__).with_name("schemas")
"""Where the committed ``*.schema.json`` files live (package data of ``rackplane``)."""
_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


# --- payload models ---------------------------------------------------------------------------


class CommandArgs(StrictModel):
    """Base of every verb's args model: unknown keys refused, strict types (a number is a JSON
    number, never a string or a boolean; NaN and infinities are refused by each float field's
    ``allow_inf_nan=False``)."""

    model_config = ConfigDict(strict=True)


class NoArgs(CommandArgs):
    """No arguments: ``args`` is ``{}`` or left out."""


class CommandEnvelope(StrictModel):
    """A rackplane command request, published (QoS 1, not retained) to
    ``<root>/<site>/<rack>/<daemon>/cmd/<user>/<verb>``. The ``<user>`` level is the broker
    username; the role comes from the daemon's config, never from the payload."""

    model_config = ConfigDict(title="rackplane command request")

    request_id: str = Field(
        min_length=1, max_length=64, pattern=REQUEST_ID_PATTERN,
        description="client-chosen id, unique per user: a repeat with the same id is answered "
        "with the first reply and never applied twice",
    )
    issued_at: AwareDatetime = Field(
        description="when the client issued the command, RFC 3339 with a timezone, e.g. "
        "2026-01-01T12:00:00Z; refused as expired after the daemon's ttl_s",
    )
    args: dict[str, Any] = Field(
        default_factory=dict, description="the verb's arguments (see <daemon>.<verb>.args)"
    )

    @field_validator("issued_at", mode="before")
    @classmethod
    def _rfc3339_text(cls, v: object) -> object:
        if not isinstance(v, str):
            raise ValueError(
                "must be an RFC 3339 timestamp string with a timezone, e.g. 2026-01-01T12:00:00Z"
            )
        return v


class CommandErrorBody(StrictModel):
    """Why a command was refused."""

    code: str = Field(description="machine-readable, e.g. forbidden, invalid_args, out_of_range")
    message: str = Field(description="for people; names the offending key paths")


class CommandReply(StrictModel):
    """The daemon's one reply to a command: on the MQTT v5 Response Topic (with the request's
    Correlation Data), else on ``cmd/<user>/<verb>/result``; QoS 1, not retained."""

    model_config = ConfigDict(title="rackplane command reply")

    request_id: str | None = Field(
        pattern=REQUEST_ID_PATTERN, description="the request's id; null when it was unreadable"
    )
    ok: bool = Field(description="true: applied (or, for a repeat, it was applied before)")
    error: CommandErrorBody | None = Field(description="null when ok")
    state: dict[str, Any] | None = Field(
        description="the verb's result (e.g. the loop state after the change); null when refused"
    )


A = TypeVar("A", bound=BaseModel)


# --- what handlers and the audit get ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CommandContext:
    """What a handler knows about the request besides its args.

    Attributes:
        user: the broker username (topic level); role: its configured role.
        verb, request_id: from the topic and the envelope.
        issued_at_ns: the envelope's ``issued_at`` [ns since the epoch].
        now_mono: `Clock.monotonic()` when the command is applied [s]: use it for expiries.
        wall_ns: `Clock.wall_ns()` at the same moment (timestamps only).
        received_mono: when the link received the message [monotonic s].
        dup: the MQTT DUP flag (a QoS 1 redelivery; first sighting of this request_id here).
    """

    user: str
    role: Role
    verb: str
    request_id: str
    issued_at_ns: int
    now_mono: float
    wall_ns: int
    received_mono: float
    dup: bool = False


@dataclass(frozen=True, slots=True)
class CommandAudit:
    """One audited command (accepted or refused), handed to the ``audit`` callback.

    Attributes:
        user, verb: from the topic (truncated to 64 characters); verb_known: a registered verb.
        request_id: None when unreadable.
        outcome: ``ok``, ``duplicate`` (answered from the cache) or the refusal code.
        ok: the reply's ``ok``.
        role: the user's role.
        latency_s: from the link's receipt to the reply being queued [s, monotonic].
        wall_ns: when it was handled [ns since the epoch] (the time-series timestamp).
        retained, dup: the MQTT flags of the request.
        reply_topic: where the reply went (None if it could not be queued).
        message: the error message of a refusal, else None.
    """

    user: str
    verb: str
    verb_known: bool
    request_id: str | None
    outcome: str
    ok: bool
    role: Role
    latency_s: float
    wall_ns: int
    retained: bool = False
    dup: bool = False
    reply_topic: str | None = None
    message: str | None = None

    def tags(self) -> dict[str, str]:
        """Time-series tags ``user``, ``verb``, ``outcome`` (DESIGN §3 measurement ``command``).

        Bounded cardinality: a verb that is not registered is tagged ``_unknown`` and a user
        name that is not printable is tagged ``_invalid`` (the raw values are in the log)."""
        user = self.user if _tag_safe(self.user) else "_invalid"
        return {"user": user, "verb": self.verb if self.verb_known else "_unknown",
                "outcome": self.outcome}

    def fields(self) -> dict[str, float]:
        """Numeric fields only (DESIGN §3): ``ok`` 1.0/0.0 and ``latency_s``."""
        return {"ok": 1.0 if self.ok else 0.0, "latency_s": float(self.latency_s)}


def _tag_safe(value: str) -> bool:
    return 0 < len(value) <= _NAME_MAX_CHARS and value.isprintable() and not value.endswith("\\")


@dataclass
class CommandStats:
    """Counters of a router (health metrics).

    Attributes:
        received: command messages (topics parsed as ``cmd/<user>/<verb>``).
        applied: handled with ``ok: true`` (duplicates not counted again).
        refused: refusal code -> count (router and handler codes, ``internal_error`` included).
        duplicates: answered from the de-duplication cache.
        ignored: messages on topics that are not command requests (e.g. ``/result``).
        reply_errors: replies that could not be queued; audit_errors: audit callbacks that
            raised.
    """

    received: int = 0
    applied: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    duplicates: int = 0
    ignored: int = 0
    reply_errors: int = 0
    audit_errors: int = 0

    @property
    def refused_total(self) -> int:
        """All refusals, whatever the code."""
        return sum(self.refused.values())

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready counters."""
        return {
            "received": self.received, "applied": self.applied, "refused": dict(self.refused),
            "duplicates": self.duplicates, "ignored": self.ignored,
            "reply_errors": self.reply_errors, "audit_errors": self.audit_errors,
        }


@dataclass(frozen=True, slots=True)
class _Verb:
    name: str
    model: type[BaseModel]
    handler: Callable[[Any, CommandContext], Mapping[str, Any]]
    role: Role


@dataclass(slots=True)
class _Seen:
    fingerprint: bytes
    reply: dict[str, Any]
    outcome: str


@dataclass(slots=True)
class _Outcome:
    """The decision about one command message (built by `CommandRouter._process`)."""

    user: str
    verb: str
    verb_known: bool
    role: Role
    started_mono: float
    request_id: str | None = None
    ok: bool = False
    code: str = OUTCOME_OK
    message: str | None = None
    state: dict[str, Any] | None = None
    duplicate: bool = False
    cached_reply: dict[str, Any] | None = None

    def refuse(self, code: str, message: str) -> _Outcome:
        self.ok, self.code, self.state = False, code, None
        self.message = _clip(message, _MESSAGE_MAX_CHARS)
        return self

    def reply(self) -> dict[str, Any]:
        if self.cached_reply is not None:
            return self.cached_reply
        error = None if self.ok else {"code": self.code, "message": self.message or self.code}
        return {"request_id": self.request_id, "ok": self.ok, "error": error, "state": self.state}


ReplyFn = Callable[[Message, Mapping[str, Any]], Awaitable[Any] | Any]
"""How a reply is sent: `MqttLink.reply` (tests may pass a capture with the same shape)."""


class CommandRouter:
    """Routes ``cmd/<user>/<verb>`` messages of one daemon to registered handlers (see the
    module docstring for the checks, the reply and the handler contract).

    Args:
        link: the daemon's MQTT link (topics, subscription, replies).
        settings: roles, TTL, clock skew, payload bound, de-duplication size.
        clock: ``monotonic()`` for latency and ``ctx.now_mono``; ``wall_ns()`` for the expiry
            check and timestamps.
        audit: called once per command with its `CommandAudit` (exceptions are logged and
            counted, never propagated).
        log: structlog logger; default ``rackplane.commands`` bound with the daemon name.
        reply: how replies are sent; default ``link.reply``.
    """

    def __init__(
        self,
        link: MqttLink,
        settings: CommandSettings,
        *,
        clock: Clock,
        audit: Callable[[CommandAudit], None] | None = None,
        log: Any = None,
        reply: ReplyFn | None = None,
    ) -> None:
        self.link = link
        self.topics = link.topics
        self._settings = settings
        self._clock = clock
        self._audit = audit
        self._log = log if log is not None else get_logger(__name__, daemon=link.daemon)
        self._reply: ReplyFn = reply if reply is not None else link.reply
        self._verbs: dict[str, _Verb] = {}
        self._seen: OrderedDict[tuple[str, str], _Seen] = OrderedDict()
        self._stats = CommandStats()
        self._attached = False

    # --- set-up ---------------------------------------------------------------------------

    def register(
        self,
        verb: str,
        args_model: type[A],
        handler: Callable[[A, CommandContext], Mapping[str, Any]],
        role: Role = "operator",
    ) -> None:
        """Add a verb.

        Args:
            verb: topic level (letters, digits, ``_ . : -``, at most 64 characters).
            args_model: validates ``args`` (a `CommandArgs` subclass: strict, no unknown keys).
            handler: ``handler(args, ctx) -> dict`` (the reply's ``state``); synchronous,
                validates before it mutates, raises `CommandError` to refuse.
            role: the least role allowed to use it.

        Raises:
            ValueError: invalid or duplicate verb, unknown role.
            TypeError: ``args_model`` is not a pydantic model.
        """
        if not _VERB_RE.match(verb):
            raise ValueError(
                f"verb {verb!r} must be 1-64 letters, digits, '_', '.', ':' or '-' (a topic level)"
            )
        if verb in self._verbs:
            raise ValueError(f"verb {verb!r} is already registered")
        if role not in ROLE_RANK:
            raise ValueError(f"role {role!r} must be one of {sorted(ROLE_RANK)}")
        if not (isinstance(args_model, type) and issubclass(args_model, BaseModel)):
            raise TypeError(f"args_model of {verb!r} must be a pydantic model class")
        self._verbs[verb] = _Verb(verb, args_model, handler, role)

    def attach(self) -> None:
        """Subscribe the router to ``link.topics.cmd_filter`` (QoS 1). The link re-subscribes
        on every connect (BR-22 b). Calling it again does nothing."""
        if self._attached:
            return
        self.link.subscribe(self.topics.cmd_filter, self.handle, qos=1)
        self._attached = True

    def update_settings(self, settings: CommandSettings) -> None:
        """Apply new settings (SIGHUP): roles, TTL and bounds at once; the de-duplication
        cache is kept (trimmed to the new size)."""
        self._settings = settings
        self._trim_seen()

    @property
    def settings(self) -> CommandSettings:
        """The settings in force."""
        return self._settings

    @property
    def verbs(self) -> dict[str, Role]:
        """Registered verb -> least role, in registration order."""
        return {v.name: v.role for v in self._verbs.values()}

    def verb_args(self) -> dict[str, type[BaseModel]]:
        """Registered verb -> args model (for the schemas)."""
        return {v.name: v.model for v in self._verbs.values()}

    @property
    def stats(self) -> CommandStats:
        """A snapshot of the counters."""
        s = self._stats
        return replace(s, refused=dict(s.refused))

    def role_of(self, user: str) -> Role:
        """The configured role of a broker username (``default_role`` if not listed)."""
        return self._settings.users.get(user, self._settings.default_role)

    # --- the message handler ----------------------------------------------------------------

    async def handle(self, msg: Message) -> None:
        """Handle one message from the link: exactly one reply and one audit per command
        message; other topics are ignored. Never raises (a router bug is logged and answered
        ``internal_error``)."""
        try:
            outcome = self._process(msg)
        except Exception:
            self._log.exception("command_router_bug", topic=_clip(msg.topic, 200))
            outcome = self._bug_outcome(msg)
        if outcome is None:
            return
        try:
            reply_topic = await self._send(msg, outcome)
            self._record(msg, outcome, reply_topic)
        except Exception:
            self._log.exception("command_router_bug", topic=_clip(msg.topic, 200))

    def _bug_outcome(self, msg: Message) -> _Outcome | None:
        try:
            parsed = self.topics.parse_cmd(msg.topic)
            if parsed is None:
                return None
            user, verb = parsed
            o = _Outcome(user, verb, verb in self._verbs, self.role_of(user),
                         self._clock.monotonic())
            return o.refuse(INTERNAL_ERROR, "the command router failed; the daemon's log has "
                            "the details (get_state shows what is in force)")
        except Exception:
            return None

    def _process(self, msg: Message) -> _Outcome | None:
        parsed = self.topics.parse_cmd(msg.topic)
        if parsed is None:
            self._stats.ignored += 1
            self._log.debug("command_topic_ignored", topic=_clip(msg.topic, 200))
            return None
        user, verb = parsed
        self._stats.received += 1
        o = _Outcome(user, verb, verb in self._verbs, self.role_of(user), self._clock.monotonic())
        s = self._settings
        if msg.retain:
            return o.refuse(RETAINED, "a retained command is never executed (it may be stale): "
                            "publish commands with retain=false")
        if len(msg.payload) > s.max_payload_bytes:
            return o.refuse(TOO_LARGE, f"payload of {len(msg.payload)} bytes exceeds "
                            f"max_payload_bytes = {s.max_payload_bytes}")
        if not msg.payload:
            return o.refuse(BAD_JSON, "empty payload (clearing a retained message is not a "
                            "command; commands are never retained)")
        try:
            data = _loads(msg.payload)
        except _BadJson as err:
            return o.refuse(BAD_JSON, str(err))
        if not isinstance(data, dict):
            return o.refuse(BAD_JSON, f"payload must be a JSON object, got {_json_type(data)}")
        try:
            env = CommandEnvelope.model_validate(data)
        except ValidationError as err:
            rid = data.get("request_id")
            o.request_id = rid if isinstance(rid, str) and _REQUEST_ID_RE.match(rid) else None
            return o.refuse(INVALID_ENVELOPE, _describe(err))
        o.request_id = env.request_id
        key = (user, env.request_id)
        fingerprint = _fingerprint(verb, env.args)
        seen = self._seen.get(key)
        if seen is not None:
            if seen.fingerprint != fingerprint:
                return o.refuse(
                    REQUEST_ID_REUSED,
                    f"request_id {env.request_id!r} was already used by {_clip(user)!r} for "
                    "another command (other verb or args); use a new request_id",
                )
            self._seen.move_to_end(key)
            o.duplicate, o.cached_reply, o.ok = True, seen.reply, bool(seen.reply["ok"])
            o.code = OUTCOME_DUPLICATE
            return o
        self._decide(o, env, msg)
        self._seen[key] = _Seen(fingerprint, o.reply(), o.code)
        self._trim_seen()
        return o

    def _decide(self, o: _Outcome, env: CommandEnvelope, msg: Message) -> None:
        """Checks 6-10 of the module docstring; fills ``o``."""
        s = self._settings
        try:
            issued_ns = (env.issued_at - _EPOCH) // timedelta(microseconds=1) * 1000
        except (OverflowError, ValueError) as err:
            o.refuse(INVALID_ENVELOPE, f"issued_at: {err}")
            return
        now_ns = self._clock.wall_ns()  # wall-clock: compared with the client's timestamp
        age_s = (now_ns - issued_ns) / 1e9
        if age_s > s.ttl_s:
            o.refuse(EXPIRED, f"issued_at is {age_s:.1f} s old, more than ttl_s = {s.ttl_s:g} s "
                     "(check the client's clock if it was just sent)")
            return
        if -age_s > s.clock_skew_s:
            o.refuse(FROM_FUTURE, f"issued_at is {-age_s:.1f} s ahead of the daemon's clock, "
                     f"more than clock_skew_s = {s.clock_skew_s:g} s (check the client's clock)")
            return
        spec = self._verbs.get(o.verb)
        if spec is None:
            known = ", ".join(self._verbs) or "none"
            o.refuse(UNKNOWN_VERB, f"unknown verb {_clip(o.verb)!r}; known verbs: {known}")
            return
        if ROLE_RANK[o.role] < ROLE_RANK[spec.role]:
            o.refuse(FORBIDDEN, f"user {_clip(o.user)!r} has role {o.role}; {o.verb} needs "
                     f"{spec.role} (roles come from the daemon's [commands.users] config)")
            return
        try:
            args = spec.model.model_validate(env.args)
        except ValidationError as err:
            o.refuse(INVALID_ARGS, _describe(err, prefix="args"))
            return
        now_mono = self._clock.monotonic()
        ctx = CommandContext(
            user=o.user, role=o.role, verb=o.verb, request_id=env.request_id,
            issued_at_ns=issued_ns, now_mono=now_mono,
            wall_ns=self._clock.wall_ns(),  # wall-clock: timestamps for the handler
            received_mono=msg.received_mono, dup=msg.dup,
        )
        try:
            result = spec.handler(args, ctx)
        except CommandError as err:
            code = err.code if isinstance(err.code, str) and err.code else INTERNAL_ERROR
            o.refuse(code, str(err) or code)
            return
        except Exception as err:
            self._log.error(
                "command_handler_failed", user=_clip(o.user), verb=o.verb,
                request_id=env.request_id, error=repr(err), exc_info=True,
                note="handlers validate before they mutate: nothing was applied",
            )
            o.refuse(INTERNAL_ERROR, f"{o.verb} failed ({type(err).__name__}); nothing was "
                     "applied; the daemon's log has the details")
            return
        finally:
            took = self._clock.monotonic() - now_mono
            if took > _SLOW_HANDLER_S:
                self._log.warning("command_handler_slow", verb=o.verb, took_s=round(took, 4),
                                  note="handlers run on the event loop (BR-24)")
        o.ok, o.code, o.state = True, OUTCOME_OK, self._state_of(o.verb, result)

    def _state_of(self, verb: str, result: object) -> dict[str, Any] | None:
        """The handler's dict as JSON (non-finite floats become null). The command *was*
        applied, so a result that cannot be sent is logged and replaced by null, never turned
        into a refusal (that would invite a second application)."""
        if not isinstance(result, Mapping):
            self._log.error("command_state_invalid", verb=verb, got=type(result).__name__)
            return None
        try:
            state = _json_safe(dict(result))
            encode_json(state)
        except (TypeError, ValueError, RecursionError) as err:
            self._log.error("command_state_invalid", verb=verb, error=repr(err))
            return None
        assert isinstance(state, dict)
        return state

    def _trim_seen(self) -> None:
        while len(self._seen) > self._settings.dedup_entries:
            self._seen.popitem(last=False)

    # --- reply and audit ----------------------------------------------------------------------

    def _reply_target(self, msg: Message, user: str) -> Message:
        """The request as handed to ``reply``: its response topic if acceptable, else (none,
        or one inside this daemon's namespace that is not the user's own reply space) the
        ``/result`` topic. A response topic may never be a command topic (which would make
        the daemon publish commands on someone's behalf) or another of our topics."""
        rt = msg.response_topic
        if rt:
            base = self.topics.base + "/"
            own = f"{base}cmd/{user}/"
            if not rt.startswith(base) or (
                rt.startswith(own) and self.topics.parse_cmd(rt) is None
            ):
                return msg
            self._log.warning("command_response_topic_refused", user=_clip(user),
                              response_topic=_clip(rt, 200), note="replying on /result")
        return replace(msg, response_topic=f"{msg.topic}/result")

    async def _send(self, msg: Message, o: _Outcome) -> str | None:
        try:
            result = self._reply(self._reply_target(msg, o.user), o.reply())
            if inspect.isawaitable(result):
                result = await result
        except Exception as err:
            self._stats.reply_errors += 1
            self._log.error("command_reply_failed", user=_clip(o.user), verb=_clip(o.verb),
                            request_id=o.request_id, error=repr(err))
            return None
        return result if isinstance(result, str) else None

    def _record(self, msg: Message, o: _Outcome, reply_topic: str | None) -> None:
        now = self._clock.monotonic()
        start = msg.received_mono if 0.0 < msg.received_mono <= now else o.started_mono
        st = self._stats
        if o.duplicate:
            st.duplicates += 1
        elif o.ok:
            st.applied += 1
        else:
            st.refused[o.code] = st.refused.get(o.code, 0) + 1
        message = None
        if not o.ok:
            err = o.reply().get("error")
            message = err.get("message") if isinstance(err, dict) else None
        audit = CommandAudit(
            user=_clip(o.user), verb=_clip(o.verb), verb_known=o.verb_known,
            request_id=o.request_id, outcome=o.code, ok=o.ok, role=o.role,
            latency_s=max(0.0, now - start),
            wall_ns=self._clock.wall_ns(),  # wall-clock: audit timestamp
            retained=msg.retain, dup=msg.dup, reply_topic=reply_topic, message=message,
        )
        log = self._log.info if o.ok else (
            self._log.error if o.code == INTERNAL_ERROR else self._log.warning
        )
        log("command", user=audit.user, verb=audit.verb, request_id=audit.request_id,
            outcome=audit.outcome, ok=audit.ok, role=audit.role,
            latency_s=round(audit.latency_s, 6), retained=audit.retained, dup=audit.dup,
            reply_topic=reply_topic, message=message)
        if self._audit is None:
            return
        try:
            self._audit(audit)
        except Exception as err:
            st.audit_errors += 1
            n = st.audit_errors
            if n <= 3 or (n & (n - 1)) == 0:
                self._log.error("command_audit_failed", error=repr(err), audit_errors=n)


# --- helpers ----------------------------------------------------------------------------------


class _BadJson(ValueError):
    pass


def _reject_constant(name: str) -> Any:
    raise _BadJson(f"{name} is not valid JSON (numbers must be finite)")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _BadJson(f"duplicate key {_clip(k, 40)!r} in a JSON object")
        out[k] = v
    return out


def _loads(payload: bytes) -> Any:
    """Strict JSON: UTF-8, no NaN/Infinity, no duplicate keys; bounded nesting.

    Raises:
        _BadJson: with a message for the reply.
    """
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as err:
        raise _BadJson(f"payload is not UTF-8 ({err.reason} at byte {err.start})") from None
    try:
        data = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except _BadJson:
        raise
    except RecursionError:
        raise _BadJson(f"JSON nested deeper than {_MAX_DEPTH} levels") from None
    except ValueError as err:  # JSONDecodeError, int digits limit
        raise _BadJson(f"payload is not valid JSON: {_clip(str(err), 200)}") from None
    if _depth(data) > _MAX_DEPTH:
        raise _BadJson(f"JSON nested deeper than {_MAX_DEPTH} levels")
    return data


def _depth(data: Any) -> int:
    """Nesting depth of parsed JSON, iteratively (no recursion on client input)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        node, d = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, d)
            if d > _MAX_DEPTH:
                return d
            children = node.values() if isinstance(node, dict) else node
            stack.extend((c, d + 1) for c in children)
    return deepest


def _json_type(v: object) -> str:
    if isinstance(v, list):
        return "an array"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, bool):
        return "a boolean"
    if v is None:
        return "null"
    return "a number"


def _clip(text: str, limit: int = _NAME_MAX_CHARS) -> str:
    """``text`` cut to ``limit`` characters (an ellipsis marks the cut)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _describe(err: ValidationError, prefix: str = "") -> str:
    """One ``key.path: message (got value)`` per problem, at most 8, for the reply."""
    problems = err.errors(include_url=False)
    parts = []
    for e in problems[:8]:
        loc = ".".join(_clip(str(p), 40) if not isinstance(p, int) else f"[{p}]"
                       for p in e["loc"]).replace(".[", "[")
        path = ".".join(x for x in (prefix, loc) if x) or "<payload>"
        got = e.get("input")
        shown = "" if isinstance(got, dict | list) or got is None or e["type"] == "missing" \
            else f" (got {_clip(repr(got), 60)})"
        parts.append(f"{path}: {e['msg']}{shown}")
    if len(problems) > 8:
        parts.append(f"and {len(problems) - 8} more")
    return "; ".join(parts)


def _fingerprint(verb: str, args: Mapping[str, Any]) -> bytes:
    """What a repeat of the same command must match: verb and args (not issued_at)."""
    canon = json.dumps([verb, args], sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.blake2b(canon.encode(), digest_size=16).digest()


def _json_safe(value: Any, depth: int = 0) -> Any:
    """Non-finite floats -> None, tuples -> lists (bounded depth; deeper raises)."""
    if depth > 32:
        raise ValueError("state nested too deeply")
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v, depth + 1) for v in value]
    return value


# --- JSON Schemas -----------------------------------------------------------------------------

VerbArgs = Mapping[str, Mapping[str, type[BaseModel]]]
"""daemon -> verb -> args model."""


def _schema_text(model: type[BaseModel], file_name: str) -> str:
    schema: dict[str, Any] = {
        "$schema": _SCHEMA_DIALECT,
        "$id": f"urn:rackplane:schema:{file_name.removesuffix('.schema.json')}",
        **model.model_json_schema(),
    }
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def schema_documents(verb_args: VerbArgs | None = None) -> dict[str, str]:
    """The JSON Schema files generated from the models: file name -> text.

    ``command-envelope.schema.json`` and ``command-reply.schema.json``, plus one
    ``<daemon>.<verb>.args.schema.json`` per verb in ``verb_args`` (e.g.
    ``{"valvey": router.verb_args()}``). Draft 2020-12, keys sorted, stable text.
    """
    docs = {
        "command-envelope.schema.json": _schema_text(CommandEnvelope,
                                                     "command-envelope.schema.json"),
        "command-reply.schema.json": _schema_text(CommandReply, "command-reply.schema.json"),
    }
    for daemon, verbs in (verb_args or {}).items():
        for verb, model in verbs.items():
            name = f"{daemon}.{verb}.args.schema.json"
            docs[name] = _schema_text(model, name)
    return docs


def write_schemas(
    directory: str | Path = SCHEMA_DIR, verb_args: VerbArgs | None = None
) -> list[Path]:
    """Write the files of `schema_documents` that are missing or differ; returns those."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in schema_documents(verb_args).items():
        p = d / name
        if not p.exists() or p.read_text(encoding="utf-8") != text:
            p.write_text(text, encoding="utf-8")
            written.append(p)
    return written


def stale_schemas(directory: str | Path = SCHEMA_DIR, verb_args: VerbArgs | None = None
                  ) -> list[str]:
    """Names of schema files missing from ``directory`` or differing from the models."""
    d = Path(directory)
    out = []
    for name, text in schema_documents(verb_args).items():
        p = d / name
        if not p.exists() or p.read_text(encoding="utf-8") != text:
            out.append(name)
    return out


def load_schema(name: str) -> dict[str, Any]:
    """A shipped schema by file name (from the installed package), e.g.
    ``load_schema("command-envelope.schema.json")``.

    Raises:
        FileNotFoundError: no such schema.
    """
    text = resources.files("rackplane").joinpath("schemas", name).read_text(encoding="utf-8")
    doc = json.loads(text)
    assert isinstance(doc, dict)
    return doc


def main(argv: Sequence[str] | None = None, verb_args: VerbArgs | None = None) -> int:
    """``python -m rackplane.commands --write-schemas | --check-schemas [--dir DIR]``: the
    generic envelope and reply schemas (a daemon's module adds its verbs, e.g.
    ``python -m valvey.commands --write-schemas``). Exit 1 when ``--check-schemas`` finds
    stale files."""
    ap = argparse.ArgumentParser(prog="python -m rackplane.commands")
    ap.add_argument("--write-schemas", action="store_true", help="(re)write the schema files")
    ap.add_argument("--check-schemas", action="store_true", help="exit 1 if any is stale")
    ap.add_argument("--dir", type=Path, default=SCHEMA_DIR, help="default: %(default)s")
    ns = ap.parse_args(argv)
    if ns.write_schemas:
        for p in write_schemas(ns.dir, verb_args):
            print(f"wrote {p}")
        return 0
    if ns.check_schemas:
        stale = stale_schemas(ns.dir, verb_args)
        for name in stale:
            print(f"stale: {name}", file=sys.stderr)
        return 1 if stale else 0
    ap.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
