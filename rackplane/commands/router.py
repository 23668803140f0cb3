"""`CommandRouter`: one daemon's command messages validated, authorised, de-duplicated,
applied, answered and audited (the checks are listed in the `rackplane.commands` docstring).
It talks to the broker only through a `CommandTransport` (`rackplane.io.mqtt.MqttLink` is
one; a test passes a fake), so it runs and is tested without a broker.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, Final, Literal, Protocol, TypeVar

from pydantic import BaseModel, Field, ValidationError

from rackplane.clock import Clock
from rackplane.core.envelope import (
    _EPOCH,
    _MESSAGE_MAX_CHARS,
    _REQUEST_ID_RE,
    _SLOW_HANDLER_S,
    _VERB_RE,
    BAD_JSON,
    EXPIRED,
    FORBIDDEN,
    FROM_FUTURE,
    IN_PROGRESS,
    INTERNAL_ERROR,
    INVALID_ENVELOPE,
    OUTCOME_DUPLICATE,
    OUTCOME_OK,
    REQUEST_ID_REUSED,
    RETAINED,
    ROLE_RANK,
    TOO_LARGE,
    UNKNOWN_VERB,
    WRONG_TYPE,
    ArgCheck,
    CommandArgs,
    CommandAudit,
    CommandContext,
    CommandEnvelope,
    CommandStats,
    HandlerResult,
    JsonError,
    _clip,
    _describe,
    _fingerprint,
    _json_safe,
    _json_type,
    args_refusal,
    read_json,
)
from rackplane.core.names import check_topic_level
from rackplane.core.topics import Handler, Message, Topics, encode_json
from rackplane.errors import CommandError
from rackplane.log import get_logger
from rackplane.settings import CommandSettings, Role

__all__ = ["RESPONSE_TOPIC_REFUSED", "TEST_VERBS_ENV", "CommandRouter", "CommandTransport",
           "ReplyFn"]

RESPONSE_TOPIC_REFUSED: Final = "response_topic_refused"
"""Audit outcome (never a reply code: nothing is replied) of a command whose MQTT v5 Response
Topic is outside the sender's own reply space: it is not executed and not answered."""
_CORRELATION_LOG_BYTES = 64  # correlation data logged (hex) with the audit line, at most

LOGGER: Final = "rackplane.commands"
"""The logger name of the router's events (unchanged by the package split)."""

TEST_VERBS_ENV: Final = "RACKPLANE_TEST_VERBS"
"""Environment flag (value ``1``) that makes `CommandRouter.attach` register ``test_block``
(tests of FIELD-CASES BR-24 only; see the `rackplane.commands` docstring)."""
_TEST_BLOCK_MAX_S = 30.0

A = TypeVar("A", bound=BaseModel)


class CommandTransport(Protocol):
    """What the router needs from a message transport: `rackplane.io.mqtt.MqttLink` provides
    it; a unit test passes a fake that records subscriptions and replies.

    Attributes:
        daemon: the daemon name (logs, `rackplane.commands.contract_of`).
        topics: the daemon's topic names (``cmd_filter``, ``parse_cmd``, ``base``).
    """

    @property
    def daemon(self) -> str: ...

    @property
    def topics(self) -> Topics: ...

    def subscribe(self, topic_filter: str, handler: Handler, qos: int = 1, *,
                  retain_as_published: bool = False) -> None:
        """Route the messages matching ``topic_filter`` to ``handler`` (kept across
        reconnects). ``retain_as_published``: keep the RETAIN flag of live deliveries."""

    async def reply(self, request: Message, payload: Mapping[str, Any]) -> str:
        """Queue the reply to ``request`` on its ``response_topic`` (with its correlation
        data), else on ``<request topic>/result``, at QoS ``min(1, request.qos)`` (never
        above the request's); returns the topic used. Raises ValueError or TypeError for a
        payload that is not JSON."""
        ...

    def publish_state(self, thing: str, payload: Mapping[str, Any]) -> None:
        """Set the retained ``state/<thing>`` (latest wins). Raises ValueError or TypeError
        for a bad thing name or a payload that is not JSON."""


@dataclass(frozen=True, slots=True)
class _Verb:
    name: str
    model: type[BaseModel]
    handler: Callable[[Any, CommandContext], HandlerResult]
    role: Role
    arg_check: ArgCheck | None = None


@dataclass(slots=True)
class _Seen:
    fingerprint: bytes
    reply: dict[str, Any]
    outcome: str
    at_mono: float = 0.0  # when it was remembered (monotonic s): for `export_seen`


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
    no_reply: bool = False  # the response topic was refused: audit only

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
"""How a reply is sent: ``transport.reply`` (tests may pass a capture with the same shape)."""


class CommandRouter:
    """Routes ``cmd/<user>/<verb>`` messages of one daemon to registered handlers (see the
    module docstring for the checks, the reply and the handler contract).

    Args:
        link: the daemon's transport (`CommandTransport`: topics, subscription, replies;
            `rackplane.io.mqtt.MqttLink` in a daemon).
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
        link: CommandTransport,
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
        self._log = log if log is not None else get_logger(LOGGER, daemon=link.daemon)
        self._reply: ReplyFn = reply if reply is not None else link.reply
        self._verbs: dict[str, _Verb] = {}
        self._seen: OrderedDict[tuple[str, str], _Seen] = OrderedDict()
        self._inflight: set[tuple[str, str]] = set()
        self._stats = CommandStats()
        self._attached = False
        #: Redundant pairs (issue 15): asked for each incoming message; False ignores it (no
        #: reply, no audit: the pair's active instance answers), counted in `standby_ignored`.
        self.accept: Callable[[], bool] | None = None
        self.standby_ignored = 0
        #: bumped on every change of the de-duplication entries (a pair's sync: issue 15)
        self.seen_version = 0

    # --- set-up ---------------------------------------------------------------------------

    def register(
        self,
        verb: str,
        args_model: type[A],
        handler: Callable[[A, CommandContext], HandlerResult],
        role: Role = "operator",
        arg_check: ArgCheck | None = None,
    ) -> None:
        """Add a verb.

        Args:
            verb: topic level (letters, digits, ``_ . : -``, at most 64 characters).
            args_model: validates ``args`` (a `CommandArgs` subclass: strict, no unknown keys).
            handler: ``handler(args, ctx) -> dict`` (the reply's ``state``), or an awaitable of
                it for blocking work run off the loop (module docstring, BR-24 b); validates
                before it mutates, raises `CommandError` to refuse.
            role: the least role allowed to use it.
            arg_check: its bounds, checked on the raw args too when the model refuses them.

        Raises:
            ValueError: invalid or duplicate verb, unknown role.
            TypeError: ``args_model`` is not a pydantic model.
        """
        if not _VERB_RE.fullmatch(verb):
            raise ValueError(
                f"verb {verb!r} must be 1-64 letters, digits, '_', '.', ':' or '-' (a topic level)"
            )
        if verb in self._verbs:
            raise ValueError(f"verb {verb!r} is already registered")
        if role not in ROLE_RANK:
            raise ValueError(f"role {role!r} must be one of {sorted(ROLE_RANK)}")
        if not (isinstance(args_model, type) and issubclass(args_model, BaseModel)):
            raise TypeError(f"args_model of {verb!r} must be a pydantic model class")
        self._verbs[verb] = _Verb(verb, args_model, handler, role, arg_check)

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
        ``internal_error``). With `accept` set and False, the message is ignored (the
        pair's standby: the active instance answers it)."""
        if self.accept is not None and not self.accept():
            self.standby_ignored += 1
            return
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
            o.no_reply = self._response_topic_problem(msg) is not None
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
        why = self._response_topic_problem(msg)
        if why is not None:
            o.no_reply = True
            o.request_id = self._peek_request_id(msg.payload)  # for the audit line only
            self._log.warning("command_response_topic_refused", user=_clip(user),
                              verb=_clip(verb), response_topic=_clip(msg.response_topic or "", 200),
                              why=why, note="not executed and not answered (audit only)")
            return o.refuse(RESPONSE_TOPIC_REFUSED, f"response topic refused: {why}")
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
            data = read_json(msg.payload)
        except JsonError as err:
            return o.refuse(err.code, str(err))
        if not isinstance(data, dict):
            return o.refuse(WRONG_TYPE, f"payload must be a JSON object, got {_json_type(data)}")
        try:
            env = CommandEnvelope.model_validate(data)
        except ValidationError as err:
            rid = data.get("request_id")
            o.request_id = rid if isinstance(rid, str) and _REQUEST_ID_RE.fullmatch(rid) else None
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
            data = read_json(payload)
        except JsonError:
            return None
        rid = data.get("request_id") if isinstance(data, dict) else None
        return rid if isinstance(rid, str) and _REQUEST_ID_RE.fullmatch(rid) else None

    def _remember(self, o: _Outcome) -> None:
        assert o.key is not None
        self._seen[o.key] = _Seen(o.fingerprint, o.reply(), o.code, self._clock.monotonic())
        self.seen_version += 1
        self._trim_seen()

    # --- a redundant pair's sync (issue 15) --------------------------------------------------

    def export_seen(self, now_mono: float, limit: int) -> list[dict[str, Any]]:
        """The de-duplication entries a retry could still hit: remembered within ``ttl_s +
        clock_skew_s`` before ``now_mono`` (an older request is refused as expired anyway),
        the newest ``limit`` of them, oldest first: ``{user, request_id, fingerprint (hex),
        reply, outcome}``."""
        s = self._settings
        horizon = now_mono - (s.ttl_s + s.clock_skew_s)
        out: list[dict[str, Any]] = []
        for (user, rid), seen in reversed(self._seen.items()):
            if len(out) >= limit or seen.at_mono < horizon:
                break
            out.append({"user": user, "request_id": rid, "fingerprint": seen.fingerprint.hex(),
                        "reply": seen.reply, "outcome": seen.outcome})
        out.reverse()
        return out

    def remember_applied(self, user: str, request_id: str, verb: str, args: Mapping[str, Any],
                         reply: dict[str, Any]) -> dict[str, Any]:
        """The de-duplication entry (`export_seen`'s shape) a command being applied will
        leave: for a handler that must hand it on before the router remembers it (the pair's
        ``handover``). ``args`` as sent (the envelope's ``args``)."""
        return {"user": user, "request_id": request_id,
                "fingerprint": _fingerprint(verb, args).hex(), "reply": reply,
                "outcome": OUTCOME_OK}

    def import_seen(self, entries: list[dict[str, Any]], now_mono: float) -> int:
        """Lay the pair's active's entries (`export_seen`) over this router's: a retried
        request-id is then answered with the first reply, never applied again. Entries
        already known are kept; malformed ones skipped. Returns how many were added."""
        added = 0
        for e in entries:
            user, rid, fp = e.get("user"), e.get("request_id"), e.get("fingerprint")
            reply, outcome = e.get("reply"), e.get("outcome")
            if not (isinstance(user, str) and isinstance(rid, str) and isinstance(fp, str)
                    and isinstance(reply, dict) and isinstance(outcome, str)
                    and "ok" in reply):
                continue
            try:
                if (user, rid) not in self._seen:
                    self._seen[(user, rid)] = _Seen(bytes.fromhex(fp), reply, outcome, now_mono)
                    added += 1
            except ValueError:  # not hex
                continue
        if added:
            self.seen_version += 1
            self._trim_seen()
        return added

    async def _complete(self, o: _Outcome) -> None:
        """Await an async handler's result and settle the outcome (same rules as `_decide`).
        Cancellation (shutdown) propagates: nothing is replied or remembered, and the
        request may be sent again."""
        assert o.pending is not None and o.key is not None
        pending, o.pending = o.pending, None
        try:
            result = await pending
        except Exception as err:
            self._handler_failed(o, err)
        else:
            o.ok, o.code, o.state = True, OUTCOME_OK, self._state_of(o.verb, result)
        finally:
            self._inflight.discard(o.key)
        self._remember(o)

    def _handler_failed(self, o: _Outcome, err: Exception) -> None:
        """A handler raised: a `CommandError` refuses with its code; anything else is
        ``internal_error``, logged with its traceback (handlers validate before they mutate,
        so nothing was applied)."""
        if isinstance(err, CommandError):
            code = err.code if isinstance(err.code, str) and err.code else INTERNAL_ERROR
            o.refuse(code, str(err) or code)
            return
        self._log.error(
            "command_handler_failed", user=_clip(o.user), verb=o.verb,
            request_id=o.request_id, error=repr(err), exc_info=True,  # called in the except
            note="handlers validate before they mutate: nothing was applied",
        )
        o.refuse(INTERNAL_ERROR, f"{o.verb} failed ({type(err).__name__}); nothing was "
                 "applied; the daemon's log has the details")

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
            o.refuse(*args_refusal(err, spec.model, env.args, spec.arg_check))
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
        except Exception as err:
            self._handler_failed(o, err)
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

    def _response_topic_problem(self, msg: Message) -> str | None:
        """Why the request's MQTT v5 Response Topic is refused, or None (none given, or one in
        the sender's own reply space: ``<base>/cmd/<user>/<verb'>/result[/<level>...]`` with
        ``<user>`` the request's own user level and every level after ``<base>`` a valid
        topic level, `rackplane.core.names`). So a client can never make the daemon publish
        onto a wildcard, a command topic, another user's replies, one of the daemon's own
        state topics, ``$SYS`` or anything outside its tree."""
        rt = msg.response_topic
        if rt is None:
            return None
        parsed = self.topics.parse_cmd(msg.topic)
        user = parsed[0] if parsed else ""
        own = f"{self.topics.base}/cmd/{user}/"
        if not rt.startswith(own):
            return f"not below {own} (the sender's own reply space)"
        rest = rt[len(own):].split("/")
        if len(rest) < 2 or rest[1] != "result":
            return "not <base>/cmd/<user>/<verb>/result[/...]"
        for level in rest:
            try:
                check_topic_level(level)
            except ValueError as err:
                return str(err)
        return None

    def _reply_target(self, msg: Message) -> Message:
        """The request as handed to ``reply``: with its response topic (already checked by
        `_response_topic_problem`), else, without one (MQTT 3.1.1, or a v5 client that gave
        none), with ``<request topic>/result``."""
        if msg.response_topic is not None:
            return msg
        return replace(msg, response_topic=f"{msg.topic}/result")

    async def _send(self, msg: Message, o: _Outcome) -> str | None:
        if o.no_reply:
            return None
        try:
            result = self._reply(self._reply_target(msg), o.reply())
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
        corr = msg.correlation_data
        log("command", user=audit.user, verb=audit.verb, request_id=audit.request_id,
            outcome=audit.outcome, ok=audit.ok, role=audit.role,
            latency_s=round(audit.latency_s, 6), retained=audit.retained, dup=audit.dup,
            reply_topic=reply_topic, message=message, qos=msg.qos,
            correlation_data=None if corr is None else corr[:_CORRELATION_LOG_BYTES].hex(),
            response_topic=None if msg.response_topic is None else _clip(msg.response_topic,
                                                                         200))
        if self._audit is None:
            return
        try:
            self._audit(audit)
        except Exception as err:
            st.audit_errors += 1
            n = st.audit_errors
            if n <= 3 or (n & (n - 1)) == 0:
                self._log.error("command_audit_failed", error=repr(err), audit_errors=n)


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

