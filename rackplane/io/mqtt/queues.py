"""What the MQTT link keeps in process: the publish queues (state and alarms latest-wins per
key, command replies and telemetry in bounded FIFOs), the subscriptions and the dispatch of
incoming messages to handlers (the `_Queues` part of `rackplane.io.mqtt.link.MqttLink`; see the
package docstring for the guarantees). No MQTT library here.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import inspect
import time
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from rackplane.clock import Clock
from rackplane.core.topics import (
    Handler,
    Message,
    Topics,
    encode_json,
    topic_matches,
    validate_topic,
    validate_topic_filter,
)
from rackplane.errors import MqttError
from rackplane.settings import Identity, MqttSettings

__all__ = ["MqttStats", "PublishRefused"]

_SEND_BATCH = 32  # publishes kept in flight at once by the sender (see module docstring)
_DISPATCH_SLICE_S = 0.002
"""The dispatcher yields to the event loop once it has run handlers this long without a break
(monotonic s). Yielding after every message cost an event-loop iteration (a poll and a task
switch) per message of a flood; 2 ms plus one handler keeps the loop lag far below BR-24 d's
100 ms."""
_ROUTES_KEPT = 4096  # topics whose matching filters are cached (cleared when full)


class PublishRefused(MqttError):
    """`MqttLink.publish` was refused by an MQTT v5 broker (PUBACK reason code >= 0x80, e.g.
    0x87 not authorized: the ACL does not let this user write the topic). ``reason`` is the
    broker's reason, e.g. ``Not authorized (0x87)``."""

    def __init__(self, message: str, *, reason: str) -> None:
        self.reason = reason
        super().__init__(message)


class _PublishRefused(Exception):
    """The broker acknowledged a QoS 1/2 publish with a failure reason code (MQTT v5, e.g.
    0x87 not authorized by the ACL). Never retried: it would be refused again."""

    def __init__(self, topic: str, reason: str) -> None:
        self.topic = topic
        self.reason = reason
        super().__init__(f"the broker refused the publish to {topic}: {reason}")



def _payload_bytes(payload: bytes | str | Mapping[str, Any] | Sequence[Any]) -> bytes:
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, str):
        return payload.encode()
    return encode_json(payload)



@dataclass
class MqttStats:
    """Counters and gauges of a link (health metrics). Read `MqttLink.stats` for a snapshot.

    Attributes:
        connected: a CONNACK was accepted and the connection is up.
        connect_attempts / connects / reconnects: TCP+MQTT connects tried / accepted /
            accepted after the first.
        last_connect_mono / last_disconnect_mono: `Clock.monotonic()` of the last accepted
            connect / of the last loss, None before.
        messages_in: messages received (before dispatch); messages_out: publishes the broker
            acknowledged (QoS 1) or that were written to the socket (QoS 0).
        telemetry_dropped / outbox_dropped: oldest entries dropped from the bounded telemetry
            queue / command-reply outbox.
        handler_errors: handler calls that raised. unrouted: messages no handler matched.
        publish_errors / subscribe_errors: publishes not confirmed (they are retried except
            generic `publish()`), filters the broker refused.
        publish_refused: publishes a v5 broker refused in its PUBACK (ACL); dropped, never
            retried, logged once per topic.
        inbox_depth / inbox_max_depth: messages waiting for dispatch now / at most so far.
        last_connect_error: why the last connect attempt failed (None after a success).
        last_connect_errno: the errno of the OS error that failed the last connect attempt
            (``errno.ECONNREFUSED`` ...; a negative ``socket.EAI_*`` code when the host name
            did not resolve); None after a success, or when the attempt failed otherwise (no
            CONNACK in time, refused login, TLS).
        connack_refusals: connects the broker refused in its CONNACK (bad credentials, not
            authorised): a client that cannot log in, not a network problem.
    """

    connected: bool = False
    connect_attempts: int = 0
    connects: int = 0
    reconnects: int = 0
    last_connect_mono: float | None = None
    last_disconnect_mono: float | None = None
    messages_in: int = 0
    messages_out: int = 0
    telemetry_dropped: int = 0
    outbox_dropped: int = 0
    handler_errors: int = 0
    unrouted: int = 0
    publish_errors: int = 0
    subscribe_errors: int = 0
    inbox_depth: int = 0
    inbox_max_depth: int = 0
    last_connect_error: str | None = None
    last_connect_errno: int | None = None
    connack_refusals: int = 0
    publish_refused: int = 0


class _Kind(enum.Enum):
    STATE = "state"
    ALARM = "alarm"
    OUTBOX = "outbox"
    TELEMETRY = "telemetry"


@dataclass(slots=True)
class _Out:
    """One queued outgoing message (telemetry or outbox)."""

    topic: str
    payload: bytes
    qos: int
    retain: bool = False
    correlation_data: bytes | None = None


@dataclass(slots=True)
class _Item:
    """One publish of a sender batch: state/alarm by key (payload read at send time)."""

    kind: _Kind
    key: str = ""
    out: _Out | None = None
    sent: bool = False


@dataclass
class _Sub:
    qos: int
    handlers: list[Handler] = field(default_factory=list)
    errors: int = 0
    retain_as_published: bool = False



class _Queues:
    """The in-process half of `MqttLink` (a mixin: the link sets these attributes up and
    provides `_publish_raw`)."""

    settings: MqttSettings
    topics: Topics
    _clock: Clock
    _log: Any
    _stats: MqttStats
    _conn: Any
    _subs: dict[str, _Sub]
    _routes: dict[str, list[tuple[str, _Sub]]]
    _inbox: deque[Message]
    _inbox_event: asyncio.Event
    _state: dict[str, bytes]
    _state_dirty: dict[str, None]
    _alarms: dict[str, bytes]
    _alarm_dirty: dict[str, None]
    _outbox: deque[_Out]
    _telemetry: deque[_Out]
    _telemetry_dropping: bool
    _outbox_dropping: bool
    _wake: asyncio.Event
    _ready: asyncio.Event
    _session_present: bool | None
    _subscribed: list[str]
    _refused_topics: set[str]
    _alarm_scan: set[str] | None
    daemon: str
    identity: Identity
    client_id: str
    instance: str | None
    status_topic: str
    _online_since_ns: int | None

    async def _publish_raw(
        self, conn: Any, topic: str, data: bytes, qos: int, retain: bool,
        correlation_data: bytes | None = None, response_topic: str | None = None,
    ) -> None:
        raise NotImplementedError

    # --- subscriptions ------------------------------------------------------------------

    def subscribe(
        self,
        topic_filter: str,
        handler: Handler,
        qos: int = 1,
        *,
        retain_as_published: bool = False,
    ) -> None:
        """Route messages matching ``topic_filter`` to ``handler``; before or after `run()`.

        The filter is (re)subscribed on every successful connect. Several handlers may share
        a filter (the highest requested QoS is used; Retain As Published if any asks for it).
        Avoid overlapping filters: a broker may deliver one copy per matching subscription,
        and each copy goes to every handler whose filter matches.

        Args:
            retain_as_published: MQTT v5 only (ignored on 3.1.1): ask the broker to keep the
                RETAIN flag as published on live deliveries, so `Message.retain` tells a
                message published retained from one that was not (the command router uses
                it to refuse retained commands, DESIGN §3).

        Raises:
            ValueError: invalid filter or qos not 0, 1 or 2.
        """
        validate_topic_filter(topic_filter)
        if qos not in (0, 1, 2):
            raise ValueError(f"qos must be 0, 1 or 2, not {qos!r}")
        self._routes.clear()
        sub = self._subs.get(topic_filter)
        if sub is None:
            self._subs[topic_filter] = _Sub(qos=qos, handlers=[handler],
                                            retain_as_published=retain_as_published)
        else:
            sub.handlers.append(handler)
            changed = False
            if qos > sub.qos:
                sub.qos, changed = qos, True
            if retain_as_published and not sub.retain_as_published:
                sub.retain_as_published, changed = True, True
            if changed and self._conn is not None:
                self._conn.attempted.discard(topic_filter)  # re-subscribe with the new options
        self._wake.set()

    @property
    def configured_topics(self) -> list[str]:
        """Every registered filter, in registration order."""
        return list(self._subs)

    @property
    def subscribed_topics(self) -> list[str]:
        """Filters the broker granted on the current connection (registration order); empty
        while disconnected. Equals `configured_topics` after every reconnect (BR-22 b)."""
        return list(self._subscribed)

    @property
    def session_present(self) -> bool | None:
        """The session-present flag of the last accepted CONNACK (None before any)."""
        return self._session_present

    @property
    def connected(self) -> bool:
        """A connection is up (CONNACK accepted)."""
        return self._conn is not None

    @property
    def stats(self) -> MqttStats:
        """A snapshot of the counters and gauges."""
        self._stats.inbox_depth = len(self._inbox)
        return replace(self._stats)


    async def wait_ready(self, timeout_s: float | None = None) -> None:
        """Wait until connected, subscribed and ``online`` published.

        Raises:
            TimeoutError: not ready within ``timeout_s`` (None: wait forever).
        """
        await asyncio.wait_for(self._ready.wait(), timeout_s)

    # --- publishing -----------------------------------------------------------------------

    def publish_state(self, thing: str, payload: Mapping[str, Any]) -> None:
        """Set ``state/<thing>`` (retained, QoS 1). Latest wins per thing; every thing's last
        state is re-published after each connect (a broker without persistence forgets it).

        Raises:
            ValueError / TypeError: bad thing name or payload not JSON-serialisable.
        """
        self.topics.state(thing)
        self._state[thing] = encode_json(payload)
        self._state_dirty[thing] = None
        self._wake.set()

    def publish_alarm(self, alarm_id: str, payload: Mapping[str, Any] | None) -> None:
        """Raise or update (payload) or clear (None) ``alarm/<id>``: retained, QoS 1.

        Never dropped: queued while disconnected, latest wins per id; active alarms are
        re-published after each connect; a clear (empty retained payload) is retried until
        the broker acknowledges it.

        Raises:
            ValueError / TypeError: bad id or payload not JSON-serialisable.
        """
        self.topics.alarm(alarm_id)
        if payload is None:
            self._alarms.pop(alarm_id, None)
        else:
            self._alarms[alarm_id] = encode_json(payload)
        self._alarm_dirty[alarm_id] = None
        self._wake.set()

    def forget_held(self, keep_state: Collection[str] = ()) -> None:
        """Forget the state things (but ``keep_state``) and alarms held for re-publication
        after a connect, without publishing anything: a pair's instance turned standby must
        not re-publish, on its next connect, retained topics the active instance now owns
        (issue 15)."""
        for thing in [t for t in self._state if t not in keep_state]:
            del self._state[thing]
            self._state_dirty.pop(thing, None)
        self._alarms.clear()
        self._alarm_dirty.clear()

    def publish_telemetry(self, thing: str, payload: Mapping[str, Any] | Sequence[Any]) -> None:
        """Queue ``telemetry/<thing>`` (QoS 0, not retained). Batch samples into fewer,
        larger messages (TEST-SERVERS.md). While the queue holds ``telemetry_queue_max``
        messages the oldest is dropped and counted (`stats.telemetry_dropped`).

        Raises:
            ValueError / TypeError: bad thing name or payload not JSON-serialisable.
        """
        out = _Out(self.topics.telemetry(thing), encode_json(payload), qos=0)
        self._push_bounded(self._telemetry, out, self.settings.telemetry_queue_max, _Kind.TELEMETRY)
        self._wake.set()

    async def reply(
        self,
        request: Message,
        payload: Mapping[str, Any],
        user: str | None = None,
        verb: str | None = None,
    ) -> str:
        """Queue the reply to a command (not retained) and return its topic. Its QoS is
        ``min(1, request.qos)``: never above the request's (a QoS 0 request gets a QoS 0
        reply).

        MQTT v5 path: the request's Response Topic, with its Correlation Data. Otherwise (3.1.1,
        or a response topic that is not a valid topic) ``cmd/<user>/<verb>/result``; user and
        verb default to those parsed from ``request.topic``. Replies are sent in order and
        kept across disconnects in a bounded outbox (``outbox_max``, drop-oldest, counted).

        Raises:
            ValueError / TypeError: payload not JSON-serialisable, or no user/verb known.
        """
        data = encode_json(payload)
        topic: str | None = None
        if request.response_topic:
            try:
                topic = validate_topic(request.response_topic)
            except ValueError as err:
                self._log.warning("mqtt_bad_response_topic", topic=request.topic, error=str(err))
        if topic is None:
            if user is None or verb is None:
                parsed = self.topics.parse_cmd(request.topic)
                if parsed is None:
                    raise ValueError(
                        f"cannot reply to {request.topic!r}: not a command topic and no user/verb"
                    )
                user = user or parsed[0]
                verb = verb or parsed[1]
            topic = self.topics.cmd_result(user, verb)
        qos = 1 if request.qos >= 1 else 0
        out = _Out(topic, data, qos=qos, correlation_data=request.correlation_data)
        self._push_bounded(self._outbox, out, self.settings.outbox_max, _Kind.OUTBOX)
        self._wake.set()
        return topic

    async def publish(
        self,
        topic: str,
        payload: bytes | str | Mapping[str, Any] | Sequence[Any],
        qos: int = 1,
        retain: bool = False,
        *,
        response_topic: str | None = None,
        correlation_data: bytes | None = None,
    ) -> None:
        """Publish now and wait for the broker's PUBACK (QoS 1/2) or the socket write (QoS 0).

        Not queued: use it when the caller wants to know. bytes go as they are, str as
        UTF-8, anything else as compact JSON. ``response_topic`` and ``correlation_data`` are
        MQTT v5 properties (a request, e.g. a command from rackctl); on 3.1.1 they are not
        sent (the reply then comes on ``cmd/<user>/<verb>/result``).

        A v5 broker that refuses the publish (e.g. ACL: PUBACK reason 0x87 "not authorized")
        raises MqttError; a 3.1.1 broker cannot say so (Mosquitto acknowledges and drops it).

        Raises:
            ValueError / TypeError: invalid topic, response topic, qos or payload (at call
                time).
            PublishRefused: a v5 broker refused it (an `MqttError`).
            MqttError: not connected, connection lost or no acknowledgement within
                ``ack_timeout_s``.
        """
        validate_topic(topic)
        if response_topic is not None:
            validate_topic(response_topic)
        if qos not in (0, 1, 2):
            raise ValueError(f"qos must be 0, 1 or 2, not {qos!r}")
        data = _payload_bytes(payload)
        conn = self._conn
        if conn is None:
            raise MqttError(f"not connected to the MQTT broker; {topic} not published")
        pub = asyncio.ensure_future(self._publish_raw(
            conn, topic, data, qos, retain, correlation_data, response_topic))
        lost = asyncio.ensure_future(conn.lost.wait())
        try:
            await asyncio.wait({pub, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            if not pub.done():
                pub.cancel()
                with contextlib.suppress(BaseException):
                    await pub
        if pub.cancelled():
            self._stats.publish_errors += 1
            raise MqttError(f"connection lost before {topic} was acknowledged")
        err = pub.exception()
        if isinstance(err, _PublishRefused):
            raise PublishRefused(str(err), reason=err.reason) from None
        if err is not None:
            self._stats.publish_errors += 1
            raise MqttError(f"publish to {topic} failed: {err}") from err
        self._stats.messages_out += 1

    async def _publish_status(self, conn: Any, status: Literal["online", "stopping", "offline"]
                              ) -> None:
        since = self._clock.wall_ns()
        data = encode_json(self._status_payload(status, since))
        try:
            await self._publish_raw(conn, self.status_topic, data, 1, True)
        except _PublishRefused as err:
            self._refused_once(err)
            return
        self._stats.messages_out += 1

    def _status_payload(
        self, status: str, since_ns: int | None, online_since_ns: int | None = None
    ) -> dict[str, Any]:
        """The ``status`` JSON. For the Will, ``since_ns`` is None (the broker publishes it
        when it notices; the daemon cannot know when) and ``online_since_ns`` is when the
        connection that died was made."""
        out: dict[str, Any] = {
            "status": status,
            "daemon": self.daemon,
            "site": self.identity.site,
            "row": self.identity.row,
            "rack": self.identity.rack,
            "client_id": self.client_id,
            "since_ns": since_ns,
            "online_since_ns": online_since_ns or self._online_since_ns,
        }
        if self.instance is not None:
            out["instance"] = self.instance
        return out

    # --- internals: sending ---------------------------------------------------------------

    def _has_pending(self) -> bool:
        return bool(self._alarm_dirty or self._state_dirty or self._outbox or self._telemetry)

    def _next_batch(self) -> list[_Item]:
        """Up to _SEND_BATCH items: alarms, then state, then replies, then telemetry."""
        batch: list[_Item] = []
        while self._alarm_dirty and len(batch) < _SEND_BATCH:
            key = next(iter(self._alarm_dirty))
            del self._alarm_dirty[key]
            batch.append(_Item(_Kind.ALARM, key=key))
        while self._state_dirty and len(batch) < _SEND_BATCH:
            key = next(iter(self._state_dirty))
            del self._state_dirty[key]
            batch.append(_Item(_Kind.STATE, key=key))
        while self._outbox and len(batch) < _SEND_BATCH:
            batch.append(_Item(_Kind.OUTBOX, out=self._outbox.popleft()))
        while self._telemetry and len(batch) < _SEND_BATCH:
            batch.append(_Item(_Kind.TELEMETRY, out=self._telemetry.popleft()))
        return batch

    async def _send_one(self, conn: Any, item: _Item) -> None:
        try:
            await self._send_one_raw(conn, item)
        except _PublishRefused as err:
            item.sent = True  # refused, not lost in transit: never retried
            self._refused_once(err)
            return
        item.sent = True
        self._stats.messages_out += 1

    def _refused_once(self, err: _PublishRefused) -> None:
        """Log a refused publish once per topic (bounded), e.g. an ACL without the right."""
        if err.topic in self._refused_topics:
            return
        if len(self._refused_topics) < 1000:
            self._refused_topics.add(err.topic)
        self._log.error("mqtt_publish_refused", topic=err.topic, reason=err.reason,
                        note="check the broker's ACL for this user; not retried")

    async def _send_one_raw(self, conn: Any, item: _Item) -> None:
        if item.kind is _Kind.STATE:
            await self._publish_raw(
                conn, self.topics.state(item.key), self._state[item.key], 1, True
            )
        elif item.kind is _Kind.ALARM:
            data = self._alarms.get(item.key, b"")
            await self._publish_raw(conn, self.topics.alarm(item.key), data, 1, True)
        else:
            assert item.out is not None
            o = item.out
            await self._publish_raw(conn, o.topic, o.payload, o.qos, o.retain, o.correlation_data)

    async def _send_batch(self, conn: Any, batch: list[_Item]) -> bool:
        """Send a batch with all publishes in flight at once (paho keeps their order).
        Whatever is not confirmed, on failure or cancellation, goes back to its queue.
        Returns True when everything was confirmed."""
        try:
            results = await asyncio.gather(
                *(self._send_one(conn, it) for it in batch), return_exceptions=True
            )
        finally:
            self._requeue([it for it in batch if not it.sent])
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            self._stats.publish_errors += len(failures)
            self._log.debug("mqtt_publish_failed", count=len(failures), error=repr(failures[0]))
        return not failures

    def _requeue(self, items: list[_Item]) -> None:
        outbox = [it.out for it in items if it.kind is _Kind.OUTBOX and it.out is not None]
        telemetry = [it.out for it in items if it.kind is _Kind.TELEMETRY and it.out is not None]
        for it in items:
            if it.kind is _Kind.STATE and it.key not in self._state_dirty:
                self._state_dirty = {it.key: None, **self._state_dirty}
            elif it.kind is _Kind.ALARM and it.key not in self._alarm_dirty:
                self._alarm_dirty = {it.key: None, **self._alarm_dirty}
        # Back to the front, in their original order; the bounds still apply (drop oldest).
        for out in reversed(outbox):
            self._outbox.appendleft(out)
        for out in reversed(telemetry):
            self._telemetry.appendleft(out)
        self._trim(self._outbox, self.settings.outbox_max, _Kind.OUTBOX)
        self._trim(self._telemetry, self.settings.telemetry_queue_max, _Kind.TELEMETRY)
        if items:
            self._wake.set()

    def _push_bounded(self, q: deque[_Out], out: _Out, limit: int, kind: _Kind) -> None:
        q.append(out)
        self._trim(q, limit, kind)

    def _trim(self, q: deque[_Out], limit: int, kind: _Kind) -> None:
        dropped = 0
        while len(q) > limit:
            q.popleft()
            dropped += 1
        if kind is _Kind.TELEMETRY:
            if dropped:
                self._stats.telemetry_dropped += dropped
                if not self._telemetry_dropping:
                    self._telemetry_dropping = True
                    self._log.warning(
                        "mqtt_telemetry_dropping", queue_max=limit, connected=self.connected,
                        note="oldest telemetry dropped; counted in telemetry_dropped",
                    )
            elif len(q) < limit // 2:
                self._telemetry_dropping = False
        else:
            if dropped:
                self._stats.outbox_dropped += dropped
                if not self._outbox_dropping:
                    self._outbox_dropping = True
                    self._log.warning(
                        "mqtt_outbox_dropping", queue_max=limit, connected=self.connected,
                        note="oldest command replies dropped; counted in outbox_dropped",
                    )
            elif len(q) < limit // 2:
                self._outbox_dropping = False

    # --- internals: receiving -------------------------------------------------------------

    def _on_paho_message(self, m: Any) -> None:
        """paho's on_message (event loop thread): into the unbounded inbox, nothing dropped."""
        try:
            topic = m.topic
        except UnicodeDecodeError:
            self._stats.unrouted += 1
            self._log.warning("mqtt_bad_topic", error="topic is not valid UTF-8")
            return
        if (self._alarm_scan is not None and m.retain and m.payload
                and topic_matches(self.topics.alarm_filter, topic)):
            self._alarm_scan.add(topic)
            if not any(topic_matches(f, topic) for f in self._subs):
                return  # only the reconciliation asked for it: not a message for the handlers
        props = getattr(m, "properties", None)
        response_topic = getattr(props, "ResponseTopic", None) if props is not None else None
        corr = getattr(props, "CorrelationData", None) if props is not None else None
        expiry = getattr(props, "MessageExpiryInterval", None) if props is not None else None
        msg = Message(
            topic=topic,
            payload=bytes(m.payload),
            qos=int(m.qos),
            retain=bool(m.retain),
            dup=bool(m.dup),
            received_mono=self._clock.monotonic(),
            response_topic=response_topic,
            correlation_data=bytes(corr) if corr is not None else None,
            message_expiry_s=int(expiry) if expiry is not None else None,
            mid=int(m.mid),
        )
        self._stats.messages_in += 1
        self._inbox.append(msg)
        depth = len(self._inbox)
        if depth > self._stats.inbox_max_depth:
            self._stats.inbox_max_depth = depth
            if depth >= 1000 and (depth & (depth - 1)) == 0:  # 1024, 2048, ...: once per doubling
                self._log.warning("mqtt_inbox_backlog", depth=depth,
                                  note="handlers slower than arrivals; nothing is dropped")
        self._inbox_event.set()

    async def _dispatch_loop(self) -> None:
        since = time.monotonic()
        while True:
            if not self._inbox:
                self._inbox_event.clear()
                await self._inbox_event.wait()
                since = time.monotonic()
                continue
            msg = self._inbox.popleft()
            await self._dispatch(msg)
            if time.monotonic() - since >= _DISPATCH_SLICE_S:
                await asyncio.sleep(0)  # let the loop breathe (BR-24 d), see _DISPATCH_SLICE_S
                since = time.monotonic()

    def _routes_of(self, topic: str) -> list[tuple[str, _Sub]]:
        """The (filter, subscription) pairs matching ``topic``, in subscription order (cached:
        a daemon sees the same few hundred topics again and again)."""
        routes = self._routes.get(topic)
        if routes is None:
            if len(self._routes) >= _ROUTES_KEPT:
                self._routes.clear()
            routes = [(f, sub) for f, sub in self._subs.items() if topic_matches(f, topic)]
            self._routes[topic] = routes
        return routes

    async def _dispatch(self, msg: Message) -> None:
        routed = False
        for topic_filter, sub in self._routes_of(msg.topic):
            routed = True
            for handler in list(sub.handlers):
                try:
                    result = handler(msg)
                    if inspect.isawaitable(result):
                        await result
                except Exception as err:
                    self._stats.handler_errors += 1
                    sub.errors += 1
                    n = sub.errors
                    if n <= 10 or (n & (n - 1)) == 0:  # first ten, then at 16, 32, 64, ...
                        self._log.error(
                            "mqtt_handler_failed", topic=msg.topic, topic_filter=topic_filter,
                            handler=getattr(handler, "__qualname__", repr(handler)),
                            error=repr(err), errors_for_filter=n, exc_info=True,
                        )
        if not routed:
            self._stats.unrouted += 1
            self._log.debug("mqtt_unrouted", topic=msg.topic)

