"""The MQTT link, the only module importing aiomqtt and paho. DESIGN §3, FIELD-CASES BR-22/24.

One `MqttLink` per daemon owns one broker connection and keeps it up for the daemon's whole
life. It never makes the daemon depend on the broker: `run()` starts with no broker at all,
reconnects forever with a capped, jittered exponential backoff, and everything published while
disconnected is kept (state and alarms latest-wins per key, command replies and telemetry in
bounded FIFOs whose drops are counted and logged) and sent after the next connect.

Topics (DESIGN §3), ``<base> = <topic_root>/<site>/<rack>/<daemon>`` (the row is in payloads and
tags, not in the topic)::

    <base>/status                      retained, QoS 1: online / stopping; Last Will offline
    <base>/state/<thing>               retained JSON, QoS 1, latest wins, re-sent on every connect
    <base>/telemetry/<thing>           JSON, QoS 0, queued while disconnected (drop-oldest)
    <base>/alarm/<id>                  retained JSON, QoS 1 while active; empty retained = cleared
                                       (reconciled on every connect, see `MqttLink` "alarms")
    <base>/cmd/<user>/<verb>           incoming commands (subscribe to `Topics.cmd_filter`)
    <base>/cmd/<user>/<verb>/result    replies when the request has no MQTT v5 response topic

What the link guarantees (and how it is tested, tests/adapters/test_mqtt.py):

- Every registered subscription is re-sent on *every* successful connect, whatever the CONNACK's
  session-present flag says, so a broker restarted without persistence never leaves the daemon
  deaf (BR-22 b). `subscribed_topics` (filters granted on the current connection) equals
  `configured_topics` after each reconnect.
- Incoming messages are taken straight from paho's callback into an unbounded in-process FIFO
  that exists for the link's whole life, so messages a persistent session delivers right after
  CONNACK are never lost (aiomqtt#95, BR-22 a). One dispatcher task hands them to the handlers
  in arrival order and yields to the event loop whenever handlers ran 2 ms without a break
  (`_DISPATCH_SLICE_S`, BR-24 d). Nothing is ever discarded on the way in; the FIFO's depth
  and high-water mark are in `stats`.
- A handler exception is logged and counted (`stats.handler_errors`); dispatch goes on.
- On MQTT v5 a subscription may ask for Retain As Published (``subscribe(...,
  retain_as_published=True)``, MQTT 5.0 §3.8.3.1): the broker then keeps the RETAIN flag of a
  message delivered live, so a command *published* retained is seen as retained and refused
  even when it arrives on an established subscription. MQTT 3.1.1 has no such option: there a
  live delivery always carries RETAIN 0 (MQTT 3.1.1 §3.3.1.3) and only deliveries from the
  retained store (at subscribe time) are flagged (docs/COMMANDS.md, "Retained commands").
- ``announce=False`` makes a client link (the ``rackctl`` CLI): no ``status`` topic, no Will.
- Nothing here blocks the event loop: the TCP/TLS connect runs in a worker thread (aiomqtt),
  everything else is non-blocking socket I/O driven by the loop.

Library facts this module relies on (aiomqtt 2.5.1, paho-mqtt 2.2.0; pyproject pins aiomqtt
<2.6 because `_Client` overrides three private aiomqtt callbacks and reads its paho client to
reach the socket; tests/adapters/test_mqtt.py fails if any of that changes):

- aiomqtt's `Message` drops paho's DUP flag; `_Client._on_message` keeps it, so redeliveries
  surface with ``Message.dup = True``.
- aiomqtt ignores a connection closed before CONNACK and then waits the whole timeout in
  ``__aenter__``; `_Client._on_disconnect` fails the connect at once instead.
- aiomqtt's `_on_connect` drops the CONNACK session-present flag; `_Client._on_connect` keeps it.
- paho never sets TCP_NODELAY; we pass it as a socket option (TEST-SERVERS.md: worst-case
  latency ~42 ms without, 5-16 ms with, at 1 k msg/s).
- aiomqtt's `publish()` waits for paho's send callback even at QoS 0 (~2.5 k msg/s one at a
  time, TEST-SERVERS.md); the sender therefore keeps a batch of publishes in flight at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import enum
import inspect
import json
import logging
import random
import re
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import aiomqtt
import paho.mqtt.client as paho
from aiomqtt.exceptions import MqttConnectError
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from rackplane.clock import Clock
from rackplane.config import secret_from_env
from rackplane.errors import MqttError
from rackplane.log import get_logger
from rackplane.settings import Identity, MqttSettings

__all__ = [
    "Handler",
    "Message",
    "MqttLink",
    "MqttStats",
    "PublishRefused",
    "Topics",
    "encode_json",
    "topic_matches",
    "validate_topic",
    "validate_topic_filter",
]

# A topic level we build ourselves (thing, alarm id, verb, daemon): the same alphabet as
# settings.Identity, so it is also a safe time-series tag value.
_LEVEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
_SEND_BATCH = 32  # publishes kept in flight at once by the sender (see module docstring)
_FAILED_BATCH_PAUSE_S = 0.2  # pause after a batch with failures, so a stuck publish never spins

# aiomqtt/paho log every failed read of a dropped connection at ERROR ("failed to receive on
# socket"), once per reconnect attempt during an outage. Connection state is reported by our
# own mqtt_* events (once per change), so the library's logger only passes CRITICAL through.
_LIB_LOG = logging.getLogger("rackplane.io.mqtt.lib")
_LIB_LOG.setLevel(logging.CRITICAL)

# The packet id of the last publish started in this task (set by `_Client`'s wrapper around
# paho's publish, which aiomqtt calls synchronously inside its own publish coroutine): how
# `_publish_raw` finds the MQTT v5 PUBACK reason code of its own message.
_PUBLISH_MID: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "rackplane_publish_mid", default=None
)
_REFUSALS_KEPT = 1000  # PUBACK refusals nobody waited for (cancelled publishes) are bounded
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


def encode_json(payload: Any) -> bytes:
    """Compact UTF-8 JSON, as every rackplane payload is (DESIGN §3).

    Raises:
        TypeError: a value is not JSON-serialisable (e.g. a datetime or a set).
        ValueError: a float is NaN or infinite (not JSON; the caller must send a quality
            instead, DESIGN §3 "a bad value is never written as NaN").
    """
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def _payload_bytes(payload: bytes | str | Mapping[str, Any] | Sequence[Any]) -> bytes:
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, str):
        return payload.encode()
    return encode_json(payload)


def validate_topic(topic: str) -> str:
    """Check a topic to publish to: non-empty UTF-8, no wildcards, no NUL, <= 65535 bytes.

    Raises:
        ValueError: naming what is wrong.
    """
    if not topic:
        raise ValueError("MQTT topic must not be empty")
    if "+" in topic or "#" in topic:
        raise ValueError(f"MQTT topic {topic!r} must not contain wildcards (+ or #)")
    if "\x00" in topic:
        raise ValueError(f"MQTT topic {topic!r} must not contain NUL")
    if len(topic.encode()) > 65535:
        raise ValueError("MQTT topic longer than 65535 bytes")
    return topic


def validate_topic_filter(topic_filter: str) -> str:
    """Check a subscription filter: ``+`` only as a whole level, ``#`` only as the last level.

    Raises:
        ValueError: naming what is wrong.
    """
    if not topic_filter or "\x00" in topic_filter:
        raise ValueError(f"invalid MQTT topic filter {topic_filter!r}")
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            raise ValueError(f"MQTT filter {topic_filter!r}: '#' must be a whole, last level")
        if "+" in level and level != "+":
            raise ValueError(f"MQTT filter {topic_filter!r}: '+' must be a whole level")
    return topic_filter


def topic_matches(topic_filter: str, topic: str) -> bool:
    """MQTT filter matching (MQTT 3.1.1 §4.7): ``+`` one level, ``#`` this level and below
    (``a/#`` matches ``a``); wildcards at the first level never match ``$`` topics."""
    if topic[:1] == "$" and topic_filter[:1] in ("+", "#"):
        return False
    f_levels = topic_filter.split("/")
    t_levels = topic.split("/")
    for i, level in enumerate(f_levels):
        if level == "#":
            return True
        if i >= len(t_levels) or (level != "+" and level != t_levels[i]):
            return False
    return len(f_levels) == len(t_levels)


def _level(value: str, what: str) -> str:
    if not _LEVEL_RE.match(value):
        raise ValueError(
            f"{what} {value!r} must be 1-64 characters of letters, digits, '_', '.', ':' or '-', "
            "starting with a letter or digit (it is an MQTT topic level)"
        )
    return value


def _user_level(user: str) -> str:
    # The user level is the broker username (DESIGN §3): any non-empty level without wildcards.
    if not user or any(c in user for c in "/+#\x00"):
        raise ValueError(f"command user {user!r} must be one non-empty topic level without + or #")
    return user


class Topics:
    """Topic names of one daemon (DESIGN §3): ``<root>/<site>/<rack>/<daemon>/...``.

    Args:
        root: topic root (settings.MqttSettings.topic_root), one or more levels, no wildcards.
        identity: site and rack become topic levels; the row travels in payloads and tags.
        daemon: daemon name, e.g. ``valvey``.

    Raises:
        ValueError: root, daemon or a level passed to a builder is not topic-safe.
    """

    def __init__(self, root: str, identity: Identity, daemon: str) -> None:
        validate_topic(root)
        if root.startswith("/") or root.endswith("/") or "//" in root:
            raise ValueError(f"topic root {root!r} must not have empty levels")
        self.root = root
        self.identity = identity
        self.daemon = _level(daemon, "daemon name")
        self.base = f"{root}/{identity.site}/{identity.rack}/{daemon}"
        self._cmd_prefix = f"{self.base}/cmd/"

    @property
    def status(self) -> str:
        """``<base>/status`` (retained online / stopping / offline)."""
        return f"{self.base}/status"

    def state(self, thing: str) -> str:
        """``<base>/state/<thing>`` (retained JSON)."""
        return f"{self.base}/state/{_level(thing, 'state thing')}"

    def telemetry(self, thing: str) -> str:
        """``<base>/telemetry/<thing>`` (QoS 0 JSON)."""
        return f"{self.base}/telemetry/{_level(thing, 'telemetry thing')}"

    def alarm(self, alarm_id: str) -> str:
        """``<base>/alarm/<id>`` (retained JSON while active)."""
        return f"{self.base}/alarm/{_level(alarm_id, 'alarm id')}"

    @property
    def alarm_filter(self) -> str:
        """``<base>/alarm/+``: every alarm topic of this daemon."""
        return f"{self.base}/alarm/+"

    def cmd(self, user: str, verb: str) -> str:
        """``<base>/cmd/<user>/<verb>``: where a client named ``user`` sends ``verb``."""
        return f"{self._cmd_prefix}{_user_level(user)}/{_level(verb, 'command verb')}"

    def cmd_result(self, user: str, verb: str) -> str:
        """``<base>/cmd/<user>/<verb>/result``: the reply topic of the MQTT 3.1.1 path."""
        return f"{self.cmd(user, verb)}/result"

    @property
    def cmd_filter(self) -> str:
        """``<base>/cmd/+/+``: every command request and none of our own ``/result`` replies."""
        return f"{self._cmd_prefix}+/+"

    def parse_cmd(self, topic: str) -> tuple[str, str] | None:
        """``(user, verb)`` of a command request topic of this daemon, else None.

        A ``/result`` topic, another daemon's topic or an empty level gives None.
        """
        if not topic.startswith(self._cmd_prefix):
            return None
        parts = topic[len(self._cmd_prefix) :].split("/")
        if len(parts) != 2 or not parts[0] or not parts[1]:
            return None
        return parts[0], parts[1]


@dataclass(frozen=True, slots=True)
class Message:
    """One incoming MQTT message.

    Attributes:
        topic: the topic it was published to.
        payload: raw bytes (rackplane payloads are UTF-8 JSON; see `json()`).
        qos: QoS of the delivery (min of publish and subscription QoS).
        retain: True when delivered from the broker's retained store (e.g. at subscribe
            time); a retained command must never be acted on (DESIGN §3).
        dup: the DUP flag: a QoS 1 redelivery of a message the broker may have sent before
            (BR-22 a: the command layer de-duplicates by command id).
        received_mono: `Clock.monotonic()` seconds when the link received it.
        response_topic: MQTT v5 Response Topic property, if any.
        correlation_data: MQTT v5 Correlation Data property, if any.
        message_expiry_s: MQTT v5 Message Expiry Interval as forwarded by the broker
            (remaining seconds), if any.
        mid: packet id (0 for QoS 0); for diagnostics only, ids are reused.
    """

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    dup: bool = False
    received_mono: float = 0.0
    response_topic: str | None = None
    correlation_data: bytes | None = None
    message_expiry_s: int | None = None
    mid: int = 0

    def json(self) -> Any:
        """The payload decoded as JSON.

        Raises:
            ValueError: not UTF-8 or not valid JSON (json.JSONDecodeError is a ValueError).
        """
        return json.loads(self.payload.decode("utf-8"))


Handler = Callable[[Message], Awaitable[None] | None]
"""A message handler: a plain function or a coroutine function taking a `Message`.

It runs on the event loop, one message at a time in arrival order: blocking work belongs in
``asyncio.to_thread`` (BR-24 b). Exceptions are logged and counted, never propagated."""


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


class _Client(aiomqtt.Client):
    """aiomqtt.Client with three callbacks overridden (see the module docstring)."""

    def __init__(
        self,
        *args: Any,
        on_paho_message: Callable[[paho.MQTTMessage], None],
        connect_timeout_s: float,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._rp_on_message = on_paho_message
        self.session_present: bool | None = None
        self._client.connect_timeout = connect_timeout_s
        # Our sender keeps a batch of publishes in flight: aiomqtt would warn past 10.
        self.pending_calls_threshold = 10 * _SEND_BATCH
        # mid -> reason of a v5 PUBACK with a failure code (aiomqtt ignores reason codes).
        self.publish_refusals: dict[int, str] = {}
        paho_publish = self._client.publish

        def publish_noting_mid(*args: Any, **kwargs: Any) -> paho.MQTTMessageInfo:
            info = paho_publish(*args, **kwargs)
            _PUBLISH_MID.set(info.mid)
            return info

        self._client.publish = publish_noting_mid  # type: ignore[method-assign]

    def _on_publish(
        self,
        client: paho.Client,
        userdata: Any,
        mid: int,
        reason_code: ReasonCode,
        properties: Properties,
    ) -> None:
        if isinstance(reason_code, ReasonCode) and reason_code.is_failure:
            self.publish_refusals[mid] = f"{reason_code} (0x{reason_code.value:02x})"
            while len(self.publish_refusals) > _REFUSALS_KEPT:
                del self.publish_refusals[next(iter(self.publish_refusals))]
        super()._on_publish(client, userdata, mid, reason_code, properties)

    def _on_connect(
        self,
        client: paho.Client,
        userdata: Any,
        flags: paho.ConnectFlags,
        reason_code: ReasonCode,
        properties: Properties | None = None,
    ) -> None:
        self.session_present = bool(flags.session_present)
        super()._on_connect(client, userdata, flags, reason_code, properties)

    def _on_disconnect(
        self,
        client: paho.Client,
        userdata: Any,
        flags: paho.DisconnectFlags,
        reason_code: ReasonCode,
        properties: Properties | None = None,
    ) -> None:
        if not self._connected.done():
            # Closed before CONNACK (broker full, TLS or proxy refusal): fail now, not after
            # the whole timeout.
            self._connected.set_exception(
                aiomqtt.MqttError(f"connection closed before CONNACK ({reason_code})")
            )
            return
        super()._on_disconnect(client, userdata, flags, reason_code, properties)

    def _on_message(self, client: paho.Client, userdata: Any, message: paho.MQTTMessage) -> None:
        # Runs on the event loop thread (paho's loop_read is driven by add_reader). Must never
        # raise: paho would re-raise into aiomqtt's reader callback and wedge the connection.
        with contextlib.suppress(Exception):
            self._rp_on_message(message)

    def raw_socket(self) -> socket.socket | None:
        """paho's socket (an ssl.SSLSocket with TLS), None when closed."""
        sock = self._client.socket()
        return sock if isinstance(sock, socket.socket) else None

    def abort(self) -> None:
        """Drop the TCP connection without DISCONNECT, so the broker publishes the Will."""
        sock = self.raw_socket()
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


@dataclass
class _Conn:
    """One accepted connection."""

    client: _Client
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    lost_reason: str = ""
    subscribed: set[str] = field(default_factory=set)  # granted on this connection
    attempted: set[str] = field(default_factory=set)  # SUBSCRIBE sent (granted or refused)


class MqttLink:
    """The daemon's broker connection: status + Will, subscriptions, dispatch, publishing.

    Args:
        settings: broker, credentials (password from the env var ``password_env``), TLS,
            session, backoff, queue bounds.
        identity: site/row/rack (topics and status payload).
        daemon: daemon name (topic level, default client id ``<daemon>-<site>-<rack>``).
        clock: monotonic time for stats and `Message.received_mono`; wall time for
            ``since_ns`` in status payloads.
        log: structlog logger; default ``get_logger("rackplane.io.mqtt", daemon=daemon)``.
        announce: True (a daemon): publish ``status`` online/stopping/offline and set the
            Will. False (a client such as the rackctl CLI): neither, so a client that may only
            command or read (broker ACL) never publishes outside its rights.

    Raises:
        ConfigError: ``settings.password_env`` is named but not set.
        ValueError: ``daemon`` or ``settings.topic_root`` is not topic-safe.

    Alarms: on every connect a daemon link (``announce=True``) reconciles the broker's
    retained ``<base>/alarm/+`` topics with the alarms it holds: it subscribes to that filter,
    collects the retained messages, unsubscribes (Mosquitto sends the retained messages of a
    SUBSCRIBE before it handles the next packet, so they all arrive before the UNSUBACK), and
    clears (empty retained publish) every one it does not hold, e.g. left by an earlier process
    of the same daemon; then its own alarms are re-published. `wait_ready()` returns after it.

    Use: register handlers with `subscribe()`, run `run()` as a supervised task, publish with
    `publish_state` / `publish_telemetry` / `publish_alarm` (never raise for connectivity),
    `reply()` to commands, and call `stop()` at shutdown.
    """

    def __init__(
        self,
        settings: MqttSettings,
        identity: Identity,
        daemon: str,
        *,
        clock: Clock,
        log: Any = None,
        announce: bool = True,
    ) -> None:
        self.settings = settings
        self.identity = identity
        self.daemon = daemon
        self.announce = announce
        self.topics = Topics(settings.topic_root, identity, daemon)
        self.client_id = settings.client_id or f"{daemon}-{identity.site}-{identity.rack}"
        self._clock = clock
        self._log = log if log is not None else get_logger(__name__, daemon=daemon)
        self._password = secret_from_env(settings.password_env)
        self._stats = MqttStats()
        self._rng = random.Random()

        self._subs: dict[str, _Sub] = {}
        # topic -> the (filter, subscription) pairs matching it; cleared on every subscribe()
        self._routes: dict[str, list[tuple[str, _Sub]]] = {}
        self._inbox: deque[Message] = deque()
        self._inbox_event = asyncio.Event()

        self._state: dict[str, bytes] = {}
        self._state_dirty: dict[str, None] = {}  # ordered set
        self._alarms: dict[str, bytes] = {}
        self._alarm_dirty: dict[str, None] = {}
        self._outbox: deque[_Out] = deque()
        self._telemetry: deque[_Out] = deque()
        self._telemetry_dropping = False
        self._outbox_dropping = False
        self._wake = asyncio.Event()

        self._conn: _Conn | None = None
        self._ready = asyncio.Event()
        self._session_present: bool | None = None
        self._subscribed: list[str] = []
        self._online_since_ns: int | None = None
        self._stop_requested = asyncio.Event()
        self._stop_budget_s = settings.stop_timeout_s
        self._run_done = asyncio.Event()
        self._running = False
        self._background: set[asyncio.Future[Any]] = set()  # abandoned connects being closed
        self._refused_topics: set[str] = set()
        # Retained alarm topics seen during the reconciliation after a connect (None otherwise).
        self._alarm_scan: set[str] | None = None

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

    def connection_info(self) -> dict[str, Any] | None:
        """Diagnostics of the current connection, None while disconnected: ``client_id``,
        ``protocol``, ``session_present``, ``local`` and ``peer`` (``host:port``) and
        ``tcp_nodelay`` (Nagle off, TEST-SERVERS.md)."""
        conn = self._conn
        if conn is None:
            return None
        info: dict[str, Any] = {
            "client_id": self.client_id,
            "protocol": self.settings.protocol,
            "session_present": self._session_present,
        }
        sock = conn.client.raw_socket()
        if sock is not None:
            with contextlib.suppress(OSError):
                local, peer = sock.getsockname(), sock.getpeername()
                info["local"] = f"{local[0]}:{local[1]}"
                info["peer"] = f"{peer[0]}:{peer[1]}"
                info["tcp_nodelay"] = bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        return info

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
        """Queue the reply to a command (QoS 1, not retained) and return its topic.

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
        out = _Out(topic, data, qos=1, correlation_data=request.correlation_data)
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

    # --- lifecycle ------------------------------------------------------------------------

    async def run(self) -> None:
        """Own the connection until cancelled or `stop()`; never raises otherwise.

        Connects, subscribes, publishes ``online``, re-sends state and alarms, then sends
        queued messages until the connection is lost; then backs off (capped, jittered
        exponential between ``reconnect_min_s`` and ``reconnect_max_s``) and reconnects.
        Cancelling drops the connection without DISCONNECT, so the broker publishes the Will
        (``offline``). A link is single-use: after `stop()`, `run()` returns at once.

        Raises:
            RuntimeError: already running.
        """
        if self._running:
            raise RuntimeError("MqttLink.run() is already running")
        self._running = True
        self._run_done.clear()
        dispatcher = asyncio.create_task(self._dispatch_loop(), name=f"mqtt-dispatch-{self.daemon}")
        attempt = 0
        failing_since: float | None = None
        last_error = ""
        loop = asyncio.get_running_loop()
        try:
            while not self._stop_requested.is_set():
                try:
                    conn = await self._connect()
                except Exception as err:  # refused, timeout, CONNACK refusal, TLS files, ...
                    text = str(err) if isinstance(err, aiomqtt.MqttError) else repr(err)
                    self._stats.last_connect_error = text
                    if isinstance(err, MqttConnectError):
                        self._stats.connack_refusals += 1
                    if failing_since is None or text != last_error:
                        # Logged once per kind of failure, not once per attempt.
                        failing_since = failing_since or self._clock.monotonic()
                        self._log.warning(
                            "mqtt_connect_failed", host=self.settings.host,
                            port=self.settings.port, error=text,
                            note="retrying with backoff; the same failure again is logged at debug",
                        )
                    else:
                        self._log.debug("mqtt_connect_failed", error=text)
                    last_error = text
                    await self._backoff(attempt)
                    attempt += 1
                    continue
                if conn is None:  # stop requested while connecting
                    break
                if failing_since is not None:
                    self._log.info(
                        "mqtt_connect_recovered",
                        outage_s=round(self._clock.monotonic() - failing_since, 3),
                    )
                    failing_since, last_error = None, ""
                up_at = loop.time()
                try:
                    await self._session(conn)
                except Exception:  # a bug here must not end the link: log, back off, go on
                    self._log.exception("mqtt_session_bug")
                if loop.time() - up_at > self.settings.reconnect_max_s:
                    attempt = 0  # a connection that lasted: start the backoff over
                if not self._stop_requested.is_set():
                    await self._backoff(attempt)
                    attempt += 1
        finally:
            dispatcher.cancel()
            with contextlib.suppress(BaseException):
                await dispatcher
            self._running = False
            self._run_done.set()

    async def stop(self, timeout_s: float | None = None) -> None:
        """Publish ``stopping``, send what is queued, publish ``offline``, disconnect cleanly.

        Bounded by ``timeout_s`` (default ``settings.stop_timeout_s``); never hangs when the
        broker is gone (then the broker's Will says ``offline``). `run()` returns afterwards.
        Calling it when `run()` is not running only marks the link stopped.
        """
        budget = self.settings.stop_timeout_s if timeout_s is None else timeout_s
        self._stop_budget_s = budget
        self._stop_requested.set()
        self._wake.set()
        if not self._running:
            return
        try:
            await asyncio.wait_for(self._run_done.wait(), budget + 2.0)
        except TimeoutError:
            self._log.warning("mqtt_stop_timeout", budget_s=budget)

    # --- internals: connection ------------------------------------------------------------

    def _make_client(self, attempt_ns: int) -> _Client:
        s = self.settings
        v5 = s.protocol == "5"
        will = aiomqtt.Will(
            topic=self.topics.status,
            payload=encode_json(self._status_payload("offline", None, online_since_ns=attempt_ns)),
            qos=1,
            retain=True,
        ) if self.announce else None
        props: Properties | None = None
        if v5:
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = 0 if s.clean_session else s.session_expiry_s
        tls = None
        if s.tls is not None:
            tls = aiomqtt.TLSParameters(
                ca_certs=str(s.tls.ca_file),
                certfile=str(s.tls.cert_file) if s.tls.cert_file else None,
                keyfile=str(s.tls.key_file) if s.tls.key_file else None,
            )
        return _Client(
            s.host,
            s.port,
            username=s.username,
            password=self._password,
            identifier=self.client_id,
            protocol=aiomqtt.ProtocolVersion.V5 if v5 else aiomqtt.ProtocolVersion.V311,
            will=will,
            clean_session=None if v5 else s.clean_session,
            clean_start=s.clean_session if v5 else paho.MQTT_CLEAN_START_FIRST_ONLY,
            properties=props,
            keepalive=s.keepalive_s,
            timeout=s.ack_timeout_s,
            logger=_LIB_LOG,
            tls_params=tls,
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
            on_paho_message=self._on_paho_message,
            connect_timeout_s=s.ack_timeout_s,
        )

    async def _connect(self) -> _Conn | None:
        """One connect attempt. None when stop() was requested meanwhile."""
        self._stats.connect_attempts += 1
        attempt_ns = self._clock.wall_ns()
        client = self._make_client(attempt_ns)
        enter = asyncio.ensure_future(client.__aenter__())
        stop = asyncio.ensure_future(self._stop_requested.wait())
        try:
            await asyncio.wait({enter, stop}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            stop.cancel()
            self._abandon(client, enter)
            raise
        stop.cancel()
        if not enter.done():
            self._abandon(client, enter)
            return None
        err = enter.exception()
        if err is not None:
            if isinstance(err, aiomqtt.MqttError):
                raise err
            raise aiomqtt.MqttError(f"connect failed: {err!r}") from err
        now = self._clock.monotonic()
        self._stats.last_connect_error = None
        self._stats.connects += 1
        if self._stats.connects > 1:
            self._stats.reconnects += 1
        self._stats.connected = True
        self._stats.last_connect_mono = now
        self._session_present = client.session_present
        self._online_since_ns = attempt_ns
        conn = _Conn(client)
        self._conn = conn
        self._log.info(
            "mqtt_connected", host=self.settings.host, port=self.settings.port,
            client_id=self.client_id, protocol=self.settings.protocol,
            session_present=client.session_present, reconnects=self._stats.reconnects,
        )
        return conn

    def _abandon(self, client: _Client, enter: asyncio.Future[Any]) -> None:
        """A connect we no longer want. It is not cancelled (paho's connect may still be
        running in a worker thread and would open its socket afterwards): its socket is
        dropped now if it is open, which fails the CONNACK wait at once, and a connect that
        still succeeds is closed at once, so no zombie connection keeps our client id."""
        client.abort()

        def _done(fut: asyncio.Future[Any]) -> None:
            self._background.discard(fut)
            if fut.cancelled() or fut.exception() is not None:
                return
            task = asyncio.ensure_future(self._close(_Conn(client), graceful=False))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

        self._background.add(enter)
        enter.add_done_callback(_done)

    async def _session(self, conn: _Conn) -> None:
        """Serve one connection until it is lost or stop() is requested."""
        watcher = asyncio.create_task(self._watch(conn), name="mqtt-watch")
        worker = asyncio.create_task(self._work(conn), name="mqtt-send")
        stop = asyncio.create_task(self._stop_requested.wait(), name="mqtt-stop-wait")
        graceful = False
        try:
            await asyncio.wait({watcher, worker, stop}, return_when=asyncio.FIRST_COMPLETED)
            if worker.done() and not worker.cancelled() and worker.exception() is not None:
                err = worker.exception()
                self._log.warning("mqtt_session_failed", error=repr(err))
            graceful = stop.done() and not conn.lost.is_set()
        finally:
            for t in (worker, stop):
                t.cancel()
            for t in (worker, stop):
                with contextlib.suppress(BaseException):
                    await t
            try:
                if graceful:
                    await self._shutdown(conn)
                else:
                    await self._close(conn, graceful=False)
            finally:
                watcher.cancel()
                with contextlib.suppress(BaseException):
                    await watcher
                reason = "stopped" if graceful else (conn.lost_reason or "closed by the daemon")
                self._mark_disconnected(conn, reason)

    def _mark_disconnected(self, conn: _Conn, reason: str) -> None:
        if self._conn is conn:
            self._conn = None
        self._ready.clear()
        self._subscribed = []
        self._stats.connected = False
        self._stats.last_disconnect_mono = self._clock.monotonic()
        self._log.info("mqtt_disconnected", reason=reason)

    async def _watch(self, conn: _Conn) -> None:
        """Return when the connection is lost (aiomqtt's iterator raises on disconnect; it
        never yields a message because `_Client._on_message` bypasses aiomqtt's queue)."""
        try:
            async for _ in conn.client.messages:
                pass
        except aiomqtt.MqttError as err:
            cause = err.__cause__
            conn.lost_reason = f"{err}: {cause}" if cause else str(err)
        finally:
            conn.lost.set()

    async def _close(self, conn: _Conn, *, graceful: bool, timeout_s: float = 1.0) -> None:
        """Close a connection, bounded. Not graceful: no DISCONNECT, so the Will fires."""
        client = conn.client
        if not graceful:
            client.abort()
        try:
            await asyncio.wait_for(client.__aexit__(None, None, None), max(timeout_s, 0.1))
        except (TimeoutError, aiomqtt.MqttError, OSError) as err:
            client.abort()
            self._log.debug("mqtt_close_forced", error=repr(err))

    async def _shutdown(self, conn: _Conn) -> None:
        """stop(): stopping, drain, offline, DISCONNECT; all within the stop budget."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._stop_budget_s

        def left() -> float:
            return max(deadline - loop.time(), 0.0)

        try:
            if self.announce:
                await asyncio.wait_for(self._publish_status(conn, "stopping"), left())
            while left() > 0 and not conn.lost.is_set():
                batch = self._next_batch()
                if not batch:
                    break
                await asyncio.wait_for(self._send_batch(conn, batch), left())
            if self.announce:
                await asyncio.wait_for(self._publish_status(conn, "offline"), left())
        except (TimeoutError, aiomqtt.MqttError, OSError) as err:
            self._log.warning("mqtt_stop_incomplete", error=repr(err))
        await self._close(conn, graceful=not conn.lost.is_set(), timeout_s=max(left(), 0.5))

    async def _backoff(self, attempt: int) -> None:
        """Sleep a capped, jittered exponential delay; wake at once on stop()."""
        s = self.settings
        cap = min(s.reconnect_max_s, s.reconnect_min_s * (2 ** min(attempt, 30)))
        delay = max(s.reconnect_min_s, self._rng.uniform(cap / 2, cap))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop_requested.wait(), delay)

    # --- internals: sending ---------------------------------------------------------------

    async def _work(self, conn: _Conn) -> None:
        """Subscribe, announce online, re-send state/alarms, then send queued messages."""
        await self._sync_subscriptions(conn)
        if self.announce:
            await self._publish_status(conn, "online")
            await self._reconcile_alarms(conn)
        for thing in self._state:
            self._state_dirty[thing] = None
        for alarm_id in self._alarms:
            self._alarm_dirty[alarm_id] = None
        self._ready.set()
        dropped = self._stats.telemetry_dropped
        if self._telemetry_dropping:
            self._log.info("mqtt_telemetry_dropped_total", telemetry_dropped=dropped)
        while True:
            if any(f not in conn.attempted for f in self._subs):
                await self._sync_subscriptions(conn)
            batch = self._next_batch()
            if batch:
                if not await self._send_batch(conn, batch):
                    await asyncio.sleep(_FAILED_BATCH_PAUSE_S)
                continue
            self._wake.clear()
            if self._has_pending() or any(f not in conn.attempted for f in self._subs):
                continue
            await self._wake.wait()

    async def _reconcile_alarms(self, conn: _Conn) -> None:
        """Clear every retained ``<base>/alarm/<id>`` this link does not hold (stale, from an
        earlier process). Subscribe, collect the retained messages, unsubscribe: the broker
        sends a SUBSCRIBE's retained messages before its next reply (Mosquitto 2.0), so they
        are all in by the UNSUBACK. A refused subscription (ACL) is logged; nothing cleared."""
        topic_filter = self.topics.alarm_filter
        self._alarm_scan = set()
        try:
            request: list[tuple[str, Any]] = [
                (topic_filter, SubscribeOptions(qos=0) if self.settings.protocol == "5" else 0)
            ]
            codes: Sequence[ReasonCode | int] = await conn.client.subscribe(request)
            code = codes[0] if codes else 0x80
            if code.is_failure if isinstance(code, ReasonCode) else code >= 0x80:
                self._log.warning("mqtt_alarm_reconcile_refused", topic_filter=topic_filter,
                                  code=str(code), note="stale retained alarms are not cleared")
                return
            if topic_filter not in self._subs:  # never drop a filter a handler registered
                await conn.client.unsubscribe(topic_filter)
            seen = set(self._alarm_scan)
        finally:
            self._alarm_scan = None
        stale = sorted(t for t in seen if t.rsplit("/", 1)[-1] not in self._alarms)
        for topic in stale:
            self._log.warning("mqtt_stale_alarm_cleared", topic=topic,
                              note="retained alarm not held by this daemon: cleared")
            try:
                await self._publish_raw(conn, topic, b"", 1, True)
            except _PublishRefused as err:
                self._refused_once(err)
                continue
            self._stats.messages_out += 1

    async def _sync_subscriptions(self, conn: _Conn) -> None:
        """One SUBSCRIBE for every registered filter not yet sent on this connection. A filter
        the broker refuses (ACL) is logged and counted, and tried again on the next connect."""
        todo = [(f, sub) for f, sub in self._subs.items() if f not in conn.attempted]
        if not todo:
            return
        conn.attempted.update(f for f, _ in todo)
        request: list[tuple[str, Any]]
        if self.settings.protocol == "5":
            request = [(f, SubscribeOptions(qos=sub.qos,
                                            retainAsPublished=sub.retain_as_published))
                       for f, sub in todo]
        else:
            request = [(f, sub.qos) for f, sub in todo]
        codes: Sequence[ReasonCode | int] = await conn.client.subscribe(request)
        for (topic_filter, _qos), code in zip(todo, codes, strict=False):
            failed = code.is_failure if isinstance(code, ReasonCode) else code >= 0x80
            if failed:
                self._stats.subscribe_errors += 1
                self._log.error("mqtt_subscribe_refused", topic_filter=topic_filter, code=str(code))
            else:
                conn.subscribed.add(topic_filter)
        self._subscribed = [f for f in self._subs if f in conn.subscribed]
        self._log.info(
            "mqtt_subscribed", topics=self._subscribed, session_present=self._session_present
        )

    async def _publish_status(self, conn: _Conn, status: Literal["online", "stopping", "offline"]
                              ) -> None:
        since = self._clock.wall_ns()
        data = encode_json(self._status_payload(status, since))
        try:
            await self._publish_raw(conn, self.topics.status, data, 1, True)
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
        return {
            "status": status,
            "daemon": self.daemon,
            "site": self.identity.site,
            "row": self.identity.row,
            "rack": self.identity.rack,
            "client_id": self.client_id,
            "since_ns": since_ns,
            "online_since_ns": online_since_ns or self._online_since_ns,
        }

    async def _publish_raw(
        self, conn: _Conn, topic: str, data: bytes, qos: int, retain: bool,
        correlation_data: bytes | None = None, response_topic: str | None = None,
    ) -> None:
        props: Properties | None = None
        if self.settings.protocol == "5" and (correlation_data is not None or response_topic):
            props = Properties(PacketTypes.PUBLISH)
            if correlation_data is not None:
                props.CorrelationData = correlation_data
            if response_topic:
                props.ResponseTopic = response_topic
        _PUBLISH_MID.set(None)
        await conn.client.publish(topic, data, qos, retain, props)
        mid = _PUBLISH_MID.get()
        if qos > 0 and mid is not None:
            reason = conn.client.publish_refusals.pop(mid, None)
            if reason is not None:
                self._stats.publish_refused += 1
                raise _PublishRefused(topic, reason)

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

    async def _send_one(self, conn: _Conn, item: _Item) -> None:
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

    async def _send_one_raw(self, conn: _Conn, item: _Item) -> None:
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

    async def _send_batch(self, conn: _Conn, batch: list[_Item]) -> bool:
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

    def _on_paho_message(self, m: paho.MQTTMessage) -> None:
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

