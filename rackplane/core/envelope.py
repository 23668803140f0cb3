"""The command contract's pure part: refusal codes, roles, the envelope, reply and payload
models, what a handler and the audit get, and the strict JSON reading of a command (no I/O,
no clock). The router that uses them is `rackplane.commands` (see its docstring for the
checks and their order).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    RootModel,
    ValidationError,
    field_validator,
)

from rackplane.config import StrictModel
from rackplane.core.alarms import AlarmSnapshot, Severity
from rackplane.core.leases import OUTPUT_PATTERN
from rackplane.settings import Role

__all__ = [
    "GENERIC_VERBS",
    "INTERNAL_ERROR",
    "MAX_INPUT_BYTES",
    "OUT_OF_RANGE",
    "REQUEST_ID_PATTERN",
    "ROLE_RANK",
    "ROUTER_CODES",
    "AcquireLeaseArgs",
    "AlarmPayload",
    "ArgCheck",
    "ArgProblem",
    "CommandArgs",
    "CommandAudit",
    "CommandContext",
    "CommandEnvelope",
    "CommandErrorBody",
    "CommandReply",
    "CommandStats",
    "HandlerResult",
    "JsonError",
    "LeasesState",
    "NoArgs",
    "OutputLease",
    "ReleaseLeaseArgs",
    "StatusPayload",
    "alarm_payload",
    "args_refusal_code",
    "finite_int",
    "read_json",
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
NON_FINITE: Final = "non_finite"
DUPLICATE_KEY: Final = "duplicate_key"
TOO_DEEP: Final = "too_deep"
WRONG_TYPE: Final = "wrong_type"

ROUTER_CODES: frozenset[str] = frozenset({
    RETAINED, TOO_LARGE, BAD_JSON, NON_FINITE, DUPLICATE_KEY, TOO_DEEP, WRONG_TYPE,
    INVALID_ENVELOPE, REQUEST_ID_REUSED, EXPIRED, FROM_FUTURE, UNKNOWN_VERB, FORBIDDEN,
    INVALID_ARGS, OUT_OF_RANGE, INTERNAL_ERROR, IN_PROGRESS,
})
"""Codes the router itself refuses with; handlers add their own (`CommandError.code`).

Hostile or malformed input is refused with the most specific code (issue 14 item 13):
``too_large`` (over the byte bound), ``bad_json`` (not UTF-8, not JSON), ``non_finite``
(NaN/Infinity literals, or a number beyond a double's range such as ``1e400``),
``duplicate_key``, ``too_deep`` (nested deeper than 32 levels), ``wrong_type`` (a payload
that is not an object, an argument of the wrong JSON type), ``out_of_range`` (an argument
outside its bounds), ``invalid_args`` (anything else the args model refuses: a missing or
unknown key, a bad pattern or enum value)."""

_ARG_TYPE_CODES: Mapping[str, str] = {
    "finite_number": NON_FINITE,
    "greater_than": OUT_OF_RANGE, "greater_than_equal": OUT_OF_RANGE,
    "less_than": OUT_OF_RANGE, "less_than_equal": OUT_OF_RANGE,
    "multiple_of": OUT_OF_RANGE,
}
"""pydantic error types -> refusal code (besides the ``*_type`` family: ``wrong_type``)."""


def _problem_code(kind: str) -> str:
    """The refusal code of one pydantic error type."""
    code = _ARG_TYPE_CODES.get(kind)
    if code is not None:
        return code
    if kind.endswith("_type") or kind in ("int_from_float", "model_attributes_type"):
        return WRONG_TYPE
    return INVALID_ARGS


def args_refusal_code(err: ValidationError) -> str:
    """The refusal code of an args model's `ValidationError`: that of its first problem
    (``non_finite``, ``out_of_range``, ``wrong_type``), else ``invalid_args``."""
    problems = err.errors(include_url=False)
    return _problem_code(str(problems[0]["type"])) if problems else INVALID_ARGS


ArgProblem = tuple[str, str, str]
"""One problem of a command's args: (field name, refusal code, ``args.<field>: ...`` text)."""

ArgCheck = Callable[[Mapping[str, Any], Collection[str]], list[ArgProblem]]
"""``check(raw_args, skip)``: the problems a verb's further argument checks (its bounds,
`rackplane.commands.bounds`) find in the raw args, fields in ``skip`` left out (the model
already refused them); never raises."""


def args_refusal(err: ValidationError, model: type[BaseModel], raw: Mapping[str, Any],
                 more: ArgCheck | None = None) -> tuple[str, str]:
    """``(code, message)`` refusing args the model refused: every problem at once, the
    model's and those ``more`` finds in the fields the model did not refuse (a budget out of
    range *and* a missing reason), in the order of the model's fields (problems of no field,
    unknown keys, last); the code is that of the first, the message lists them all."""
    problems: list[ArgProblem] = []
    for e in err.errors(include_url=False):
        loc = e["loc"]
        problems.append((str(loc[0]) if loc else "", _problem_code(str(e["type"])),
                         _problem_text(e, "args")))
    if more is not None:
        problems += more(raw, {p[0] for p in problems})
    order = {name: k for k, name in enumerate(model.model_fields)}
    problems.sort(key=lambda p: order.get(p[0], len(order)))  # stable: model's order kept
    if not problems:
        return INVALID_ARGS, "args refused"
    return problems[0][1], join_problems([p[2] for p in problems])


def join_problems(texts: Sequence[str]) -> str:
    """Problem texts as one refusal message: at most 8, then ``and N more``."""
    return "; ".join([*texts[:8], *([f"and {len(texts) - 8} more"] if len(texts) > 8 else [])])


OUTCOME_OK: Final = "ok"
OUTCOME_DUPLICATE: Final = "duplicate"

ROLE_RANK: Mapping[str, int] = {"reader": 0, "automation": 1, "operator": 2}
"""Roles, least to most privileged (DESIGN §1: operator > automation)."""

REQUEST_ID_PATTERN: Final = r"^[A-Za-z0-9._:-]{1,64}$"
_REQUEST_ID_RE = re.compile(REQUEST_ID_PATTERN)
_NUMBER_RE = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
"""A number written as a string: never a time here (pydantic reads one as unix seconds or
milliseconds)."""
_VERB_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")  # a topic level (rackplane.io.mqtt)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MESSAGE_MAX_CHARS = 1000  # bound on error.message (it may quote client input)
_NAME_MAX_CHARS = 64  # users and verbs quoted in logs, audit and messages
_MAX_DEPTH = 32  # JSON nesting accepted (commands are flat; bounds every later recursion)
_SLOW_HANDLER_S = 0.05  # a handler slower than this is logged: it holds up the event loop


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
        # a string of digits is no RFC 3339 time: pydantic would read "1767225600" as unix
        # seconds, "1767225600000" as milliseconds and "-1" as 1969
        if not isinstance(v, str) or _NUMBER_RE.fullmatch(v.strip()) is not None:
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
        None, allow_inf_nan=False,
        description="lease length [s], > 0; default commands.lease_default_ttl_s, at most "
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

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_:-]{0,63}$",  # rackplane.core.names
                    description="alarm id: <kind> or <kind>:<subject>")
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



# --- helpers ----------------------------------------------------------------------------------


MAX_INPUT_BYTES = 1 << 20
"""Largest MQTT payload a daemon parses from a sensor, a peer or a node agent (bytes): an NVL72
tray message is ~13 kB; a larger one is refused before it is decoded (parsing tens of MB
would stall the tick). Commands have their own configured ``commands.max_payload_bytes``."""


class JsonError(ValueError):
    """A payload that is not strict JSON (`read_json`); the message says why.

    Attributes:
        code: the refusal code of the kind of problem: ``too_large``, ``bad_json`` (not
            UTF-8, not JSON), ``non_finite`` (NaN/Infinity, or a number beyond a double's
            range), ``duplicate_key``, ``too_deep``.
    """

    def __init__(self, message: str, code: str = BAD_JSON) -> None:
        super().__init__(message)
        self.code = code


def _reject_constant(name: str) -> Any:
    raise JsonError(f"{name} is not valid JSON (numbers must be finite)", NON_FINITE)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400: JSON allows it, a double cannot hold it
        raise JsonError(f"number {_clip(text, 40)} is beyond a double's range (numbers must "
                        "be finite)", NON_FINITE)
    return value


_DOUBLE_MAX_INT = int(float.fromhex("0x1.fffffffffffffp+1023"))  # the largest double


def finite_int(text: str) -> int:
    """``int(text)`` for `json.loads`'s ``parse_int``, refusing an integer no double holds.

    Raises:
        JsonError: ``non_finite`` (a 400-digit literal: ``float`` of it would raise).
    """
    value = int(text)
    if abs(value) > _DOUBLE_MAX_INT:  # 400 digits: no double holds it, float() would raise
        raise JsonError(f"number {_clip(text, 40)} is beyond a double's range (numbers must "
                        "be finite)", NON_FINITE)
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise JsonError(f"duplicate key {_clip(k, 40)!r} in a JSON object", DUPLICATE_KEY)
        out[k] = v
    return out


def read_json(payload: bytes, *, max_bytes: int | None = None) -> Any:
    """Strict JSON from an MQTT payload: at most ``max_bytes`` (None: the caller checked),
    UTF-8, no NaN/Infinity and no number beyond a double's range (``1e400``, or an integer of
    more than 308 digits: `float` of it raises), no duplicate
    keys, nested at most 32 levels. Every daemon input that is JSON (commands, sensor topics,
    peers' states and replies) is read through it, so every input of the kind has the same
    bounds.

    Raises:
        JsonError: with a message for the reply or the log and the kind's ``code``.
    """
    if max_bytes is not None and len(payload) > max_bytes:
        raise JsonError(f"payload of {len(payload)} bytes, more than {max_bytes}", TOO_LARGE)
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as err:
        raise JsonError(f"payload is not UTF-8 ({err.reason} at byte {err.start})") from None
    try:
        data = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float,
                          parse_int=finite_int, object_pairs_hook=_unique_keys)
    except JsonError:
        raise
    except RecursionError:
        raise JsonError(f"JSON nested deeper than {_MAX_DEPTH} levels", TOO_DEEP) from None
    except ValueError as err:  # JSONDecodeError, int digits limit
        raise JsonError(f"payload is not valid JSON: {_clip(str(err), 200)}") from None
    if _depth(data) > _MAX_DEPTH:
        raise JsonError(f"JSON nested deeper than {_MAX_DEPTH} levels", TOO_DEEP)
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


def _problem_text(e: Any, prefix: str = "") -> str:
    """``key.path: message (got value)`` of one pydantic error."""
    loc = ".".join(_clip(str(p), 40) if not isinstance(p, int) else f"[{p}]"
                   for p in e["loc"]).replace(".[", "[")
    path = ".".join(x for x in (prefix, loc) if x) or "<payload>"
    got = e.get("input")
    shown = "" if isinstance(got, dict | list) or got is None or e["type"] == "missing" \
        else f" (got {_clip(repr(got), 60)})"
    return f"{path}: {e['msg']}{shown}"


def _describe(err: ValidationError, prefix: str = "") -> str:
    """One ``key.path: message (got value)`` per problem, at most 8, for the reply."""
    return join_problems([_problem_text(e, prefix) for e in err.errors(include_url=False)])


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
