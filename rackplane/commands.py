"""The command path: MQTT commands validated, authorised, de-duplicated, applied, answered and
audited (DESIGN §1 "MQTT commands -> validate -> lease -> core -> reply", §3 MQTT contract).

A client named ``<user>`` by the broker publishes (QoS 1, not retained) to
``<root>/<site>/<rack>/<daemon>/cmd/<user>/<verb>``::

    {"request_id": "op-42", "issued_at": "2026-01-01T12:00:00Z", "args": {"setpoint_c": 40}}

and gets exactly one reply ``{request_id, ok, error: {code, message} | null, state}`` on its
MQTT v5 Response Topic (with its Correlation Data), else on ``cmd/<user>/<verb>/result``.

**Response topics** follow one convention, so a broker ACL can grant them (config/mosquitto):
``<base>/cmd/<user>/<verb>/result`` or below it (``.../result/<client nonce>``), i.e. inside
the sender's own reply space. Any other response topic (another user's, another daemon's,
one outside the topic root) is not used: the reply goes to ``.../result`` and a warning is
logged, so a client can never make a daemon publish onto a topic of its choosing.

The JSON Schemas of the envelope, the reply, every verb's args, the ``status`` and ``alarm``
payloads and ``state/leases`` ship in ``rackplane/schemas/`` (`schema_documents`,
`write_schemas`) and are rendered into docs/COMMANDS.md (`render_markdown`); regenerate both
with ``rackctl schemas --write`` (a test fails when either is stale).

The checks, in order, each refusing with its ``error.code`` (`ROUTER_CODES`):

1. ``retained``: a command delivered from the broker's retained store is never executed (the
   reply carries its request_id when it can be read, so the sender can match it). On
   MQTT v5 the router subscribes with Retain As Published, so a command *published* retained
   is refused even when it arrives live; on MQTT 3.1.1 a live delivery cannot be told apart
   (the broker clears the flag) and only deliveries from the retained store are refused
   (docs/COMMANDS.md "Retained commands").
2. ``too_large``: payload above ``max_payload_bytes`` (not parsed at all).
3. ``bad_json``: not UTF-8 JSON, NaN/Infinity literals, duplicate keys, nested deeper than 32
   levels, not an object.
4. ``invalid_envelope``: `CommandEnvelope` refused it (key paths in the message). The reply
   carries the request_id if it could be read, else null.
5. A (user, request_id) already seen among the last ``dedup_entries``: answered with the first
   reply, never applied again (FIELD-CASES BR-22 a, a QoS 1 redelivery with DUP, or a client
   retry). The same request_id with another verb or other args: ``request_id_reused``; the
   same one while its first copy is still being handled (an async handler): ``in_progress``.
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

**Handler contract.** ``handler(args, ctx) -> dict`` runs on the event loop. A synchronous
handler must be quick (BR-24: no I/O, no sleeps). Blocking work (a synchronous driver call, a
file) goes through an *async* handler: ``handler(args, ctx)`` returns an awaitable (e.g. a
coroutine that ``await asyncio.to_thread(...)``) which the router awaits, so the event loop,
the control tick, the MQTT keepalive and the watchdog keep running (FIELD-CASES BR-24 b).
Commands are still handled one at a time, in arrival order (BR-22 a): a slow async handler
delays the next command, never the loop. Either kind must *validate before it mutates*: when
it raises, nothing may have changed, so a refusal or an ``internal_error`` reply always means
"not applied" (an async handler validates and mutates after its last ``await``, or treats the
awaited work as the change). Side effects after the mutation (publishing events) must not
raise. It reads time from ``ctx.now_mono`` / ``ctx.wall_ns``, never a clock.

**Limits, interlocks and leases** are checked by the handler before it mutates: the value
against its config limits (e.g. `require_within`), the output against the daemon's
`rackplane.core.leases.LeaseTable` (``table.check(output, ctx.user, ctx.role, ctx.now_mono)``:
active interlocks first, then leases). `register_lease_verbs` adds the generic verbs
``acquire_lease`` / ``release_lease`` for any daemon; `LeaseGate` wires the whole of it in
one object (the verbs, ``check(output, ctx)`` for the handlers, ``tick(now, interlocks)`` for
the control tick, ``state/leases`` published on change).

Every command, accepted or refused, is audited once: one ``command`` log event and one call of
the ``audit`` callback with a `CommandAudit` (a daemon writes it to the time series as
measurement ``command``, DESIGN §3, via `CommandAudit.tags` / `CommandAudit.fields`).
`CommandRouter.stats` counts received, applied, refused by code and duplicates. The message
handler never raises and never blocks: every step is bounded by ``max_payload_bytes``.

The broker's ACL (config/mosquitto/acl: each operator may write only
``rackplane/+/+/+/cmd/<own username>/+``) makes ``<user>`` unforgeable; ``rackctl cmd`` is
the client. The envelope forbids unknown keys, so new fields arrive with a schema change.

**Test-only verb.** With ``RACKPLANE_TEST_VERBS=1`` in the daemon's environment, `attach`
also registers ``test_block {seconds, mode: sync | thread}`` (operator): ``sync`` blocks the
event loop with ``time.sleep`` (the broken design of BR-24 b), ``thread`` does the same sleep
through ``asyncio.to_thread`` (the fixed design). Never set in production; the integration
tests of BR-24 use it.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import inspect
import json
import math
import os
import re
import sys
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    RootModel,
    ValidationError,
    field_validator,
)

from rackplane.clock import Clock
from rackplane.config import StrictModel
from rackplane.core.alarms import AlarmSnapshot, Severity
from rackplane.core.leases import LEASE_CODES, OUTPUT_PATTERN, LeaseTable
from rackplane.errors import CommandError
from rackplane.io.mqtt import Message, MqttLink, encode_json
from rackplane.log import get_logger
from rackplane.settings import CommandSettings, Role

__all__ = [
    "GENERIC_VERBS",
    "ROLE_RANK",
    "ROUTER_CODES",
    "SCHEMA_DIR",
    "TEST_VERBS_ENV",
    "AcquireLeaseArgs",
    "AlarmPayload",
    "CommandArgs",
    "CommandAudit",
    "CommandContext",
    "CommandEnvelope",
    "CommandErrorBody",
    "CommandReply",
    "CommandRouter",
    "CommandStats",
    "DaemonContract",
    "LeaseGate",
    "LeasesState",
    "NoArgs",
    "ReleaseLeaseArgs",
    "StatusPayload",
    "alarm_payload",
    "contract_of",
    "load_schema",
    "register_lease_verbs",
    "render_markdown",
    "require_within",
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
IN_PROGRESS: Final = "in_progress"
OUT_OF_RANGE: Final = "out_of_range"

ROUTER_CODES: frozenset[str] = frozenset({
    RETAINED, TOO_LARGE, BAD_JSON, INVALID_ENVELOPE, REQUEST_ID_REUSED, EXPIRED, FROM_FUTURE,
    UNKNOWN_VERB, FORBIDDEN, INVALID_ARGS, INTERNAL_ERROR, IN_PROGRESS,
})
"""Codes the router itself refuses with; handlers add their own (`CommandError.code`)."""

OUTCOME_OK: Final = "ok"
OUTCOME_DUPLICATE: Final = "duplicate"

ROLE_RANK: Mapping[str, int] = {"reader": 0, "automation": 1, "operator": 2}
"""Roles, least to most privileged (DESIGN §1: operator > automation)."""

REQUEST_ID_PATTERN: Final = r"^[A-Za-z0-9._:-]{1,64}$"
_REQUEST_ID_RE = re.compile(REQUEST_ID_PATTERN)
_VERB_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")  # a topic level (rackplane.io.mqtt)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MESSAGE_MAX_CHARS = 1000  # bound on error.message (it may quote client input)
_NAME_MAX_CHARS = 64  # users and verbs quoted in logs, audit and messages
_MAX_DEPTH = 32  # JSON nesting accepted (commands are flat; bounds every later recursion)
_SLOW_HANDLER_S = 0.05  # a handler slower than this is logged: it holds up the event loop

SCHEMA_DIR = Path(__file__).with_name("schemas")
"""Where the committed ``*.schema.json`` files live (package data of ``rackplane``)."""
_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

TEST_VERBS_ENV: Final = "RACKPLANE_TEST_VERBS"
"""Environment flag (value ``1``) that makes `CommandRouter.attach` register ``test_block``
(tests of FIELD-CASES BR-24 only; see the module docstring)."""
_TEST_BLOCK_MAX_S = 30.0


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


class AcquireLeaseArgs(CommandArgs):
    """``acquire_lease``: take (or renew) the lease on one output, so that only you may move
    it until it expires or you release it (DESIGN §1; rackplane.leases). An operator preempts
    an automation lease; equal or higher priority refuses with ``lease_held``. An active
    safety interlock does not stop the acquire, but no command moves the output while it is
    active."""

    output: str = Field(pattern=OUTPUT_PATTERN, description="output name, e.g. valve")
    ttl_s: float | None = Field(
        None, gt=0, le=86_400, allow_inf_nan=False,
        description="lease length [s]; default commands.lease_default_ttl_s, at most "
        "commands.lease_max_ttl_s (else invalid_lease_ttl)",
    )
    reason: str | None = Field(None, max_length=200, description="shown in state/leases")


class ReleaseLeaseArgs(CommandArgs):
    """``release_lease``: give an output back (a no-op when nobody holds it). ``force``
    (operators only) breaks another user's lease."""

    output: str = Field(pattern=OUTPUT_PATTERN, description="output name, e.g. valve")
    force: bool = Field(False, description="operator only: release another user's lease")


GENERIC_VERBS: Mapping[str, type[CommandArgs]] = {
    "acquire_lease": AcquireLeaseArgs,
    "release_lease": ReleaseLeaseArgs,
}
"""Verbs any daemon may register with `register_lease_verbs` (schemas ``lease.<verb>``)."""


# --- published payloads (the rest of the MQTT contract, DESIGN §3) ----------------------------


class StatusPayload(StrictModel):
    """``<base>/status`` (retained, QoS 1), published by `rackplane.mqtt.MqttLink`: ``online``
    after each connect, ``stopping`` at shutdown, ``offline`` as the last message or as the
    broker's Last Will when the daemon vanished."""

    model_config = ConfigDict(title="rackplane daemon status")

    status: Literal["online", "stopping", "offline"]
    daemon: str = Field(description="daemon name, e.g. valvey")
    site: str
    row: str
    rack: str
    client_id: str = Field(description="MQTT client id of the daemon")
    since_ns: int | None = Field(
        description="when this status was published [ns since the epoch]; null in the Will "
        "(the broker publishes it when it notices the loss)"
    )
    online_since_ns: int | None = Field(
        description="when the connection this status belongs to was made [ns since the epoch]"
    )


class AlarmPayload(StrictModel):
    """``<base>/alarm/<id>`` (retained, QoS 1) while an alarm is not normal; an empty retained
    message clears it. Built by `alarm_payload` from a `rackplane.alarms.AlarmSnapshot`."""

    model_config = ConfigDict(title="rackplane alarm")

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$", description="alarm id")
    severity: Severity
    message: str
    state: Literal["active", "returned"] = Field(
        description="active: condition present; returned: latched, awaiting an ack to reset"
    )
    acked: bool
    shelved: bool
    runbook: str | None = Field(description="what to do, or a link to it")
    value: float | None = Field(description="the value that raised it, in the alarm's unit")
    ts_ns: int = Field(description="when this payload was published [ns since the epoch]")


def alarm_payload(snapshot: AlarmSnapshot, ts_ns: int) -> dict[str, Any]:
    """The ``alarm/<id>`` payload (`AlarmPayload`) of an alarm that is not normal.

    Args:
        snapshot: from `rackplane.core.alarms.AlarmEngine.active()`.
        ts_ns: publication time [ns since the epoch] (the daemon's ``Clock.wall_ns()``).

    Returns:
        A JSON-ready dict; a non-finite value is sent as null (DESIGN §3).
    """
    value = snapshot.value
    if value is not None and not math.isfinite(value):
        value = None
    return {
        "id": snapshot.id, "severity": snapshot.severity, "message": snapshot.message,
        "state": snapshot.state, "acked": snapshot.acked, "shelved": snapshot.shelved,
        "runbook": snapshot.runbook, "value": value, "ts_ns": int(ts_ns),
    }


class OutputLease(StrictModel):
    """One output in ``state/leases`` (rackplane.leases.LeaseTable.snapshot)."""

    holder: str | None = Field(description="broker username holding the lease; null if free")
    role: Role | None = Field(description="the holder's role")
    priority: int | None = Field(description="2 operator, 1 automation (DESIGN §1)")
    expires_in_s: float | None = Field(description="seconds until the lease expires")
    held_for_s: float | None = Field(description="seconds since it was taken")
    reason: str | None = Field(description="the holder's reason, if given")
    interlock: str | None = Field(
        description="the active safety interlock holding this output (it overrides every "
        "lease: no command moves the output), or null"
    )
    description: str | None = Field(description="what the output is")


class LeasesState(RootModel[dict[str, OutputLease]]):
    """``<base>/state/leases`` (retained): every leasable output of the daemon with its holder
    (DESIGN §1 "the state shows the holder")."""

    model_config = ConfigDict(title="rackplane leases state")


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


HandlerResult = Mapping[str, Any] | Awaitable[Mapping[str, Any]]
"""What a handler returns: the reply's ``state`` dict, or an awaitable of it (async work)."""


@dataclass(frozen=True, slots=True)
class _Verb:
    name: str
    model: type[BaseModel]
    handler: Callable[[Any, CommandContext], HandlerResult]
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
    pending: Awaitable[Any] | None = None  # an async handler's result, awaited by handle()
    key: tuple[str, str] | None = None
    fingerprint: bytes = b""
    request_id_for_log: str | None = None

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
        self._inflight: set[tuple[str, str]] = set()
        self._stats = CommandStats()
        self._attached = False

    # --- set-up ---------------------------------------------------------------------------

    def register(
        self,
        verb: str,
        args_model: type[A],
        handler: Callable[[A, CommandContext], HandlerResult],
        role: Role = "operator",
    ) -> None:
        """Add a verb.

        Args:
            verb: topic level (letters, digits, ``_ . : -``, at most 64 characters).
            args_model: validates ``args`` (a `CommandArgs` subclass: strict, no unknown keys).
            handler: ``handler(args, ctx) -> dict`` (the reply's ``state``), or an awaitable of
                it for blocking work run off the loop (module docstring, BR-24 b); validates
                before it mutates, raises `CommandError` to refuse.
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

    def attach(self, environ: Mapping[str, str] | None = None) -> None:
        """Subscribe the router to ``link.topics.cmd_filter`` (QoS 1; on MQTT v5 with Retain As
        Published, so a command published retained is refused even when delivered live). The
        link re-subscribes on every connect (BR-22 b). Calling it again does nothing.

        Args:
            environ: where to look for `TEST_VERBS_ENV` (default ``os.environ``): when it is
                ``1``, the test-only verb ``test_block`` is registered first (module
                docstring).
        """
        if self._attached:
            return
        env = os.environ if environ is None else environ
        if env.get(TEST_VERBS_ENV) == "1" and "test_block" not in self._verbs:
            self._log.warning("command_test_verbs_enabled", verb="test_block",
                              note=f"{TEST_VERBS_ENV}=1: for tests only, never in production")
            self.register("test_block", _TestBlockArgs, _test_block, role="operator")
        self.link.subscribe(self.topics.cmd_filter, self.handle, qos=1,
                            retain_as_published=True)
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
            if outcome is not None and outcome.pending is not None:
                await self._complete(outcome)
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
            o.request_id = self._peek_request_id(msg.payload)  # so the client can match it
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
        if key in self._inflight:
            return o.refuse(IN_PROGRESS, f"request_id {env.request_id!r} is still being "
                            "handled; its reply will come once it is done")
        o.key, o.fingerprint = key, fingerprint
        self._decide(o, env, msg)
        if o.pending is not None:
            self._inflight.add(key)  # remembered once the handler is done (`_complete`)
            return o
        self._remember(o)
        return o

    def _peek_request_id(self, payload: bytes) -> str | None:
        """The request_id of a payload that will be refused anyway, if it is readable (within
        the size bound, valid JSON, a valid id), else None. Never raises."""
        if not payload or len(payload) > self._settings.max_payload_bytes:
            return None
        try:
            data = _loads(payload)
        except _BadJson:
            return None
        rid = data.get("request_id") if isinstance(data, dict) else None
        return rid if isinstance(rid, str) and _REQUEST_ID_RE.match(rid) else None

    def _remember(self, o: _Outcome) -> None:
        assert o.key is not None
        self._seen[o.key] = _Seen(o.fingerprint, o.reply(), o.code)
        self._trim_seen()

    async def _complete(self, o: _Outcome) -> None:
        """Await an async handler's result and settle the outcome (same rules as `_decide`).
        Cancellation (shutdown) propagates: nothing is replied or remembered, and the
        request may be sent again."""
        assert o.pending is not None and o.key is not None
        pending, o.pending = o.pending, None
        try:
            result = await pending
        except CommandError as err:
            code = err.code if isinstance(err.code, str) and err.code else INTERNAL_ERROR
            o.refuse(code, str(err) or code)
        except Exception as err:
            self._log.error(
                "command_handler_failed", user=_clip(o.user), verb=o.verb,
                request_id=o.request_id, error=repr(err), exc_info=True,
                note="handlers validate before they mutate: nothing was applied",
            )
            o.refuse(INTERNAL_ERROR, f"{o.verb} failed ({type(err).__name__}); nothing was "
                     "applied; the daemon's log has the details")
        else:
            o.ok, o.code, o.state = True, OUTCOME_OK, self._state_of(o.verb, result)
        finally:
            self._inflight.discard(o.key)
        self._remember(o)

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
                                  note="a synchronous handler blocks the event loop (BR-24): "
                                  "run blocking work through an async handler")
        if inspect.isawaitable(result):
            o.pending = result
            return
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
        """The request as handed to ``reply``: its response topic if it follows the
        convention (module docstring: ``<base>/cmd/<user>/<verb>/result[/...]``, the
        sender's own reply space), else the ``/result`` topic. So a client can never make the
        daemon publish onto a command topic, another user's replies, one of the daemon's own
        state topics or anything outside its tree (a broker ACL would refuse those anyway)."""
        rt = msg.response_topic
        if rt:
            own = f"{self.topics.base}/cmd/{user}/"
            rest = rt[len(own):].split("/") if rt.startswith(own) else []
            if len(rest) >= 2 and rest[1] == "result" and all(rest) \
                    and not any(c in rt for c in "+#\x00"):
                return msg
            self._log.warning("command_response_topic_refused", user=_clip(user),
                              response_topic=_clip(rt, 200),
                              note="not <base>/cmd/<user>/<verb>/result[/...]: replying on "
                              "/result")
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


# --- hooks for the daemons' verbs: limits, leases ---------------------------------------------


def require_within(name: str, value: float, low: float, high: float, unit: str = "") -> None:
    """Refuse a value outside its config limits (DESIGN §1: a command can never push an
    output past its config limits). Call it in a handler before mutating.

    Args:
        name: the argument's name as the client sent it (e.g. ``output_pct``).
        value, low, high: the value and its inclusive limits, in ``unit``.

    Raises:
        CommandError: ``out_of_range`` naming the value, the limits and the unit (also for a
            NaN or infinite value).
    """
    if not (math.isfinite(value) and low <= value <= high):
        u = f" {unit}" if unit else ""
        raise CommandError(OUT_OF_RANGE, f"{name} = {value:g}{u} is outside the configured "
                           f"limits [{low:g}, {high:g}]{u}")


LeaseChange = Callable[[LeaseTable], None]


def register_lease_verbs(
    router: CommandRouter,
    table: LeaseTable,
    *,
    on_change: LeaseChange | None = None,
    role: Role = "automation",
) -> None:
    """Register the generic verbs ``acquire_lease`` and ``release_lease`` on ``router``
    (DESIGN §1 leases; rules in rackplane.core.leases).

    Both reply ``state = {"output", "lease": {...} | null, "released": bool (release only),
    "leases": table.snapshot(now)}``. Refusals: the `rackplane.core.leases.LEASE_CODES`. The TTL
    bounds come from the router's settings (``commands.lease_default_ttl_s`` /
    ``lease_max_ttl_s``) at each call, so a SIGHUP reload applies at once.

    Args:
        router: the daemon's command router.
        table: the daemon's lease table (its tick calls ``table.expire(now)``, then logs and
            publishes ``table.drain_events()`` and ``table.snapshot(now)``).
        on_change: called after a lease changed (e.g. to publish ``state/leases`` at once);
            its exceptions are logged, never turned into a refusal (the change is made).
        role: least role of both verbs (readers never hold leases).

    Raises:
        ValueError: a verb is already registered on ``router``.
    """
    log = get_logger(__name__, daemon=router.link.daemon)

    def changed() -> None:
        if on_change is None:
            return
        try:
            on_change(table)
        except Exception as err:
            log.error("lease_on_change_failed", error=repr(err), exc_info=True)

    def limits() -> None:
        st = router.settings
        table.set_limits(st.lease_default_ttl_s, st.lease_max_ttl_s)

    def acquire(args: AcquireLeaseArgs, ctx: CommandContext) -> dict[str, Any]:
        limits()
        lease = table.acquire(args.output, ctx.user, ctx.role, ctx.now_mono, args.ttl_s,
                              args.reason)
        changed()
        return {"output": args.output, "lease": lease.as_dict(ctx.now_mono),
                "leases": table.snapshot(ctx.now_mono)}

    def release(args: ReleaseLeaseArgs, ctx: CommandContext) -> dict[str, Any]:
        lease = table.release(args.output, ctx.user, ctx.role, ctx.now_mono, force=args.force)
        if lease is not None:
            changed()
        return {"output": args.output, "released": lease is not None,
                "lease": lease.as_dict(ctx.now_mono) if lease is not None else None,
                "leases": table.snapshot(ctx.now_mono)}

    router.register("acquire_lease", AcquireLeaseArgs, acquire, role=role)
    router.register("release_lease", ReleaseLeaseArgs, release, role=role)


class LeaseGate:
    """A daemon's leases wired in one object (DESIGN §1): registers ``acquire_lease`` /
    ``release_lease`` on the router, checks a verb's outputs before its handler mutates,
    takes the active interlocks from the tick, expires leases, logs every change once and
    publishes ``state/leases`` (retained; `LeasesState`, "the state shows the holder").

    A daemon uses it in three lines::

        gate = LeaseGate(router, LeaseTable({"facility_valve": "...", ...}))
        # in a handler, before mutating (raises CommandError: interlock_active, lease_held,
        # lease_required, unknown_output):
        gate.check("facility_valve", ctx, require_lease=manual)
        # in the control tick: the outputs its safety interlocks hold now
        gate.tick(now, {"facility_valve": "supply_temp_high_interlock"} if hot else {})

    ``check`` has the ``lease_check(output, ctx)`` shape racky's commands take.
    ``state/leases`` is published when a lease or an interlock changes, and every
    ``refresh_s`` while a lease is held (its ``expires_in_s`` counts down), never once per tick.

    Args:
        router: the daemon's command router (its link publishes ``state/leases``).
        table: the daemon's `LeaseTable`.
        role: least role of the lease verbs (default automation: readers hold none).
        refresh_s: re-publication period while any lease is held [s].
        log: structlog logger; default ``rackplane.commands`` bound with the daemon name.

    Raises:
        ValueError: the lease verbs are already registered on ``router``.
    """

    STATE_THING: Final = "leases"

    def __init__(
        self,
        router: CommandRouter,
        table: LeaseTable,
        *,
        role: Role = "automation",
        refresh_s: float = 10.0,
        log: Any = None,
    ) -> None:
        self.router = router
        self.table = table
        self.refresh_s = float(refresh_s)
        self._log = log if log is not None else get_logger(__name__, daemon=router.link.daemon)
        self._dirty = True  # publish the initial (free) state once
        self._next_refresh = -math.inf
        self._last_now: float | None = None
        register_lease_verbs(router, table, on_change=self._changed, role=role)

    def check(self, output: str, ctx: CommandContext, *, require_lease: bool = False) -> None:
        """May the command's user move ``output`` now? (`LeaseTable.check` at
        ``ctx.now_mono``; interlocks first, then leases.) Call before mutating.

        Raises:
            CommandError: ``unknown_output``, ``interlock_active``, ``lease_held``,
                ``lease_required``.
        """
        self.table.check(output, ctx.user, ctx.role, ctx.now_mono, require_lease=require_lease)

    def tick(self, now: float, interlocks: Mapping[str, str] | None = None) -> None:
        """From the daemon's control tick: the interlocks holding outputs now (``None``
        keeps the previous set), lease expiry, one log event per change, and ``state/leases``
        when it changed (or every ``refresh_s`` while a lease is held). Never raises for a
        publication problem (logged)."""
        if interlocks is not None and dict(interlocks) != self.table.interlocks:
            before = self.table.interlocks
            self.table.set_interlocks(interlocks)
            after = self.table.interlocks
            if after != before:
                self._log.warning("lease_interlocks", active=after, previous=before,
                                  note="active interlocks override every lease")
                self._dirty = True
        self.table.expire(now)
        self._flush(now)

    def snapshot(self, now: float) -> dict[str, Any]:
        """The ``state/leases`` payload now (for a verb's ``get_state`` reply)."""
        return self.table.snapshot(now)

    def _changed(self, _table: LeaseTable) -> None:
        # A lease verb changed something: log it and publish at once (the command's time).
        now = self._last_now if self._last_now is not None else -math.inf
        self._dirty = True
        events = self.table.drain_events()
        for ev in events:
            now = max(now, ev.t_mono)
            self._log.info("lease", **ev.as_dict())
        if math.isfinite(now):
            self._publish(now)  # else (no time known yet): the next tick publishes it

    def _flush(self, now: float) -> None:
        for ev in self.table.drain_events():
            self._log.info("lease", **ev.as_dict())
            self._dirty = True
        held = any(self.table.holder(o, now) is not None for o in self.table.outputs)
        if self._dirty or (held and now >= self._next_refresh):
            self._publish(now)

    def _publish(self, now: float) -> None:
        self._last_now = now
        try:
            self.router.link.publish_state(self.STATE_THING, self.table.snapshot(now))
        except (TypeError, ValueError) as err:  # never for connectivity (MqttLink queues)
            self._log.error("lease_state_publish_failed", error=repr(err))
            return
        self._dirty = False
        self._next_refresh = now + self.refresh_s


# --- the test-only verb (FIELD-CASES BR-24 b) --------------------------------------------------


class _TestBlockArgs(CommandArgs):
    """``test_block`` (tests only, `TEST_VERBS_ENV`): block for ``seconds``."""

    seconds: float = Field(ge=0, le=_TEST_BLOCK_MAX_S, allow_inf_nan=False)
    mode: Literal["sync", "thread"] = Field(
        description="sync: time.sleep on the event loop (the broken design); thread: the same "
        "sleep through asyncio.to_thread (the fixed design)"
    )


def _test_block(args: _TestBlockArgs, ctx: CommandContext) -> HandlerResult:
    if args.mode == "sync":
        time.sleep(args.seconds)  # on purpose: BR-24 b, a handler that blocks the loop
        return {"slept_s": args.seconds, "mode": "sync"}

    async def off_loop() -> dict[str, Any]:
        await asyncio.to_thread(time.sleep, args.seconds)
        return {"slept_s": args.seconds, "mode": "thread"}

    return off_loop()


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

StateModels = Mapping[str, Mapping[str, type[BaseModel]]]
"""daemon -> state thing -> payload model (``<base>/state/<thing>``)."""

_BASE_SCHEMAS: dict[str, type[BaseModel]] = {
    "command-envelope.schema.json": CommandEnvelope,
    "command-reply.schema.json": CommandReply,
    "status.schema.json": StatusPayload,
    "alarm.schema.json": AlarmPayload,
    "state-leases.schema.json": LeasesState,
    **{f"lease.{verb}.args.schema.json": model for verb, model in GENERIC_VERBS.items()},
}


def _schema_text(model: type[BaseModel], file_name: str) -> str:
    schema: dict[str, Any] = {
        "$schema": _SCHEMA_DIALECT,
        "$id": f"urn:rackplane:schema:{file_name.removesuffix('.schema.json')}",
        **model.model_json_schema(),
    }
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def schema_documents(
    verb_args: VerbArgs | None = None, states: StateModels | None = None
) -> dict[str, str]:
    """The JSON Schema files generated from the models: file name -> text.

    Always: ``command-envelope``, ``command-reply``, ``status``, ``alarm``, ``state-leases``
    and the generic ``lease.acquire_lease.args`` / ``lease.release_lease.args``; plus one
    ``<daemon>.<verb>.args.schema.json`` per verb in ``verb_args`` (e.g.
    ``{"valvey": valvey_verb_args()}``; a generic lease verb registered by a daemon is not
    repeated) and one ``<daemon>.state.<thing>.schema.json`` per model in ``states``. Draft
    2020-12, keys sorted, stable text.
    """
    docs = {name: _schema_text(model, name) for name, model in _BASE_SCHEMAS.items()}
    for daemon, verbs in (verb_args or {}).items():
        for verb, model in verbs.items():
            if GENERIC_VERBS.get(verb) is model:
                continue
            name = f"{daemon}.{verb}.args.schema.json"
            docs[name] = _schema_text(model, name)
    for daemon, things in (states or {}).items():
        for thing, model in things.items():
            name = f"{daemon}.state.{thing}.schema.json"
            docs[name] = _schema_text(model, name)
    return docs


def write_schemas(
    directory: str | Path = SCHEMA_DIR,
    verb_args: VerbArgs | None = None,
    states: StateModels | None = None,
    *,
    prune: bool = False,
) -> list[Path]:
    """Write the files of `schema_documents` that are missing or differ; returns those.
    ``prune`` also removes ``*.schema.json`` files no model generates any more (only when
    ``verb_args`` and ``states`` cover every daemon, as ``rackctl schemas --write`` does)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    docs = schema_documents(verb_args, states)
    written = []
    for name, text in docs.items():
        p = d / name
        if not p.exists() or p.read_text(encoding="utf-8") != text:
            p.write_text(text, encoding="utf-8")
            written.append(p)
    if prune:
        for p in sorted(d.glob("*.schema.json")):
            if p.name not in docs:
                p.unlink()
                written.append(p)
    return written


def stale_schemas(
    directory: str | Path = SCHEMA_DIR,
    verb_args: VerbArgs | None = None,
    states: StateModels | None = None,
    *,
    complete: bool = False,
) -> list[str]:
    """Names of schema files missing from ``directory`` or differing from the models; with
    ``complete``, also files no model generates (a verb removed or renamed)."""
    d = Path(directory)
    docs = schema_documents(verb_args, states)
    out = []
    for name, text in docs.items():
        p = d / name
        if not p.exists() or p.read_text(encoding="utf-8") != text:
            out.append(name)
    if complete:
        out += [p.name for p in sorted(d.glob("*.schema.json")) if p.name not in docs]
    return out


# --- the contract, rendered (docs/COMMANDS.md) ---------------------------------------------------


@dataclass(frozen=True)
class DaemonContract:
    """What one daemon offers on MQTT, for the schemas and docs/COMMANDS.md.

    Attributes:
        daemon: topic level, e.g. ``valvey``.
        verbs: verb -> (args model, least role), in registration order.
        states: ``state/<thing>`` -> payload model (those the daemon has schematised).
        summary: one line for the docs.
    """

    daemon: str
    verbs: Mapping[str, tuple[type[BaseModel], Role]]
    states: Mapping[str, type[BaseModel]] = field(default_factory=dict)
    summary: str = ""


def contract_of(
    router: CommandRouter,
    states: Mapping[str, type[BaseModel]] | None = None,
    summary: str = "",
) -> DaemonContract:
    """The `DaemonContract` of a router with its verbs registered (the test-only verb is
    never part of it)."""
    verbs = {v.name: (v.model, v.role) for v in router._verbs.values()
             if v.model is not _TestBlockArgs}
    return DaemonContract(router.link.daemon, verbs, dict(states or {}), summary)


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_type(s: Mapping[str, Any]) -> str:
    if "$ref" in s:
        return f"`{str(s['$ref']).rsplit('/', 1)[-1]}`"
    if "const" in s:
        return f"`{json.dumps(s['const'])}`"
    if "enum" in s:
        return " | ".join(f"`{json.dumps(v)}`" for v in s["enum"])
    if "anyOf" in s:
        return " or ".join(_md_type(x) for x in s["anyOf"])
    t = s.get("type")
    if t == "array":
        return f"array of {_md_type(s.get('items', {}))}"
    if t == "object" and isinstance(s.get("additionalProperties"), Mapping):
        return f"object of {_md_type(s['additionalProperties'])}"
    if isinstance(t, list):
        return " or ".join(str(x) for x in t)
    return str(t) if t else "any"


_LIMIT_KEYS = (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="),
               ("exclusiveMaximum", "<"), ("minLength", "length >="),
               ("maxLength", "length <="), ("pattern", "matches"), ("format", "format"))


def _md_limits(s: Mapping[str, Any]) -> str:
    parts = []
    for sub in (s, *s.get("anyOf", ())):
        for key, label in _LIMIT_KEYS:
            if key in sub:
                v = sub[key]
                parts.append(f"{label} `{v}`" if key in ("pattern", "format") else
                             f"{label} {v:g}" if isinstance(v, float) else f"{label} {v}")
    if "default" in s:
        parts.append(f"default `{json.dumps(s['default'])}`")
    return _md_escape(", ".join(parts))


def _md_object(title: str, s: Mapping[str, Any]) -> list[str]:
    lines = [f"**{title}**" + (f": {_md_escape(s['description'])}"
                               if s.get("description") else ""), ""]
    props: Mapping[str, Any] = s.get("properties", {})
    if not props:
        extra = s.get("additionalProperties")
        if isinstance(extra, Mapping):
            lines += [f"An object; each key maps to {_md_type(extra)}.", ""]
        else:
            lines += ["No fields (`{}`).", ""]
        return lines
    required = set(s.get("required", ()))
    lines += ["| field | type | required | limits | description |",
              "|---|---|---|---|---|"]
    for name, ps in props.items():
        lines.append(f"| `{name}` | {_md_escape(_md_type(ps))} | "
                     f"{'yes' if name in required else 'no'} | {_md_limits(ps)} | "
                     f"{_md_escape(str(ps.get('description', '')))} |")
    lines.append("")
    if any(k in s for k in ("if", "allOf", "oneOf")):
        lines += ["Conditional rules apply (see the schema file).", ""]
    return lines


def _md_schema(name: str, text: str) -> list[str]:
    doc = json.loads(text)
    out = [f"Schema: `rackplane/schemas/{name}`", ""]
    out += _md_object(str(doc.get("title", name)), doc)
    for def_name, d in sorted(doc.get("$defs", {}).items()):
        out += _md_object(def_name, d)
    return out


_MD_INTRO = """\
# The rackplane MQTT contract

<!-- Generated by `rackctl schemas --write` from rackplane/commands.py and the daemons'
verb registrations; the JSON Schemas it renders are rackplane/schemas/*.schema.json. Do not
edit by hand: tests/unit/test_commands_contract.py fails when this file is stale. -->

DESIGN §3. Topic root `<root>/<site>/<rack>/<daemon>/` (`<root>` is `mqtt.topic_root`,
default `rackplane`; the row travels in payloads and tags):

| topic | retained | QoS | payload |
|---|---|---|---|
| `status` | yes | 1 | `status.schema.json`; Last Will `offline` |
| `state/<thing>` | yes | 1 | JSON per thing (below); `state/leases`: `state-leases.schema.json` |
| `telemetry/<thing>` | no | 0 | JSON |
| `alarm/<id>` | yes, while active | 1 | `alarm.schema.json`; an empty retained message clears it |
| `cmd/<user>/<verb>` | **never** | 1 | `command-envelope.schema.json` with the verb's args |
| `cmd/<user>/<verb>/result[/...]` | no | 1 | `command-reply.schema.json` |

## Sending a command

- Publish the envelope `{request_id, issued_at, args}` to `.../<daemon>/cmd/<user>/<verb>`,
  QoS 1, not retained. `<user>` is your broker username: the broker's ACL lets each operator
  write only below its own name (config/mosquitto/acl), so it cannot be forged. Your role
  (reader < automation < operator) comes from the daemon's `[commands] users` config, never
  from the payload; users not listed get `default_role` (reader: `get_state` only).
- The reply `{request_id, ok, error: {code, message} | null, state}` comes on your MQTT v5
  Response Topic with your Correlation Data, if the response topic is in your own reply space:
  `.../<daemon>/cmd/<user>/<verb>/result` or below it (e.g. `.../result/<nonce>`). Any other
  response topic is not used. Without one (MQTT 3.1.1) the reply comes on
  `.../<daemon>/cmd/<user>/<verb>/result`: match it by `request_id`.
- A repeated `request_id` (a QoS 1 redelivery, or your retry) is answered with the first
  reply and never applied twice (FIELD-CASES BR-22 a): retry with the same id when a reply
  did not come. The same id with another verb or args is refused (`request_id_reused`).
- `issued_at` older than `commands.ttl_s` (default 300 s, long enough that commands queued by
  the broker through a short outage still apply) is refused (`expired`); more than
  `commands.clock_skew_s` ahead (default 30 s) is refused (`from_future`).
- `rackctl cmd <daemon> <verb> --arg k=v` does all of this (exit 0 ok, 1 refused, 2 usage or
  config, 3 no broker or no reply in time).

## Retained commands

A retained command is never executed (DESIGN §3). Retained messages reach a subscriber in
two ways: from the broker's retained store when it subscribes (every MQTT version flags these
`retain=1`: refused), and live, as they are published. MQTT 3.1.1 clears the flag on live
deliveries (§3.3.1.3), so a 3.1.1 daemon cannot tell a live retained command from a normal
one: it is applied once, like any fresh command (and bounded by the TTL), and refused at every
later delivery from the store. MQTT v5 daemons subscribe with Retain As Published (§3.8.3.1),
so a command published retained is refused even live. Mosquitto 2.0 cannot refuse retained
publishes on some topics only: `retain_available false` applies to the whole broker (it would
also forbid the retained `status`, `state` and `alarm` topics) and `acl_file` rules do not
distinguish retained publishes. Run the daemons with `mqtt.protocol = "5"` (the default);
clear a stray retained command with an empty retained publish to its topic.

## Leases and interlocks

Who may move an output (rackplane/core/leases.py, DESIGN §1): active safety interlocks override
every lease (`interlock_active`); below them a lease is exclusive (`lease_held`), operator >
automation (an operator's `acquire_lease` preempts an automation lease), every lease has an
expiry (`ttl_s`, default `commands.lease_default_ttl_s`, at most `commands.lease_max_ttl_s`)
and an explicit `release_lease`. Verbs that move an output only under a lease refuse without
one (`lease_required`). `state/leases` (retained) shows every output's holder and any
interlock; it is published when a lease or an interlock changes and every 10 s while a lease
is held. A lease is taken by the broker username in the topic, like every command: an
operator's `acquire_lease` preempts an automation lease; automation never preempts.

## Error codes

Router: @ROUTER_CODES@. Leases: @LEASE_CODES@. Each verb adds its own (e.g.
`out_of_range` for a value outside its config limits).
"""


def render_markdown(contracts: Sequence[DaemonContract]) -> str:
    """docs/COMMANDS.md: the topic table and conventions, every daemon's verbs (least role,
    args) and every payload schema, rendered from `schema_documents` of ``contracts``."""
    verb_args = {c.daemon: {v: m for v, (m, _r) in c.verbs.items()} for c in contracts}
    states = {c.daemon: dict(c.states) for c in contracts}
    docs = schema_documents(verb_args, states)
    intro = _MD_INTRO.replace(
        "@ROUTER_CODES@", ", ".join(f"`{c}`" for c in sorted(ROUTER_CODES))
    ).replace("@LEASE_CODES@", ", ".join(f"`{c}`" for c in sorted(LEASE_CODES)))
    out = [intro.rstrip("\n"), ""]
    out += ["## Envelope and reply", ""]
    for name in ("command-envelope.schema.json", "command-reply.schema.json"):
        out += _md_schema(name, docs[name])
    for c in contracts:
        out += [f"## {c.daemon}", ""]
        if c.summary:
            out += [c.summary, ""]
        out += ["| verb | least role | args schema |", "|---|---|---|"]
        for verb, (model, role) in c.verbs.items():
            generic = GENERIC_VERBS.get(verb) is model
            schema = f"lease.{verb}.args" if generic else f"{c.daemon}.{verb}.args"
            out.append(f"| `{verb}` | {role} | `{schema}.schema.json` |")
        out.append("")
        for verb, (model, _role) in c.verbs.items():
            if GENERIC_VERBS.get(verb) is model:
                continue
            name = f"{c.daemon}.{verb}.args.schema.json"
            out += [f"### {c.daemon} `{verb}`", ""]
            out += _md_schema(name, docs[name])
        for thing in c.states:
            name = f"{c.daemon}.state.{thing}.schema.json"
            out += [f"### {c.daemon} `state/{thing}`", ""]
            out += _md_schema(name, docs[name])
    out += ["## Generic verbs (any daemon that registers them)", ""]
    for verb in GENERIC_VERBS:
        name = f"lease.{verb}.args.schema.json"
        out += [f"### `{verb}`", ""]
        out += _md_schema(name, docs[name])
    out += ["## Published payloads", ""]
    for name in ("status.schema.json", "alarm.schema.json", "state-leases.schema.json"):
        out += _md_schema(name, docs[name])
    while out and out[-1] == "":
        out.pop()
    return "\n".join(out) + "\n"


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
    generic schemas (envelope, reply, status, alarm, leases; a daemon's module adds its verbs,
    e.g. ``python -m valvey.commands --write-schemas``). Exit 1 when ``--check-schemas``
    finds stale files. ``rackctl schemas --write`` is the complete generator (every daemon,
    docs/COMMANDS.md, removal of schemas no model generates)."""
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
