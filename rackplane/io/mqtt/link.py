"""The broker connection: `MqttLink`, the only module importing aiomqtt and paho (the package
docstring, `rackplane.io.mqtt`, lists the library facts it relies on)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import random
import socket
import ssl
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiomqtt
import paho.mqtt.client as paho
from aiomqtt.exceptions import MqttConnectError
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from rackplane.clock import Clock
from rackplane.config import secret_from_env
from rackplane.core.topics import Message, Topics, encode_json
from rackplane.io.mqtt.queues import (
    _SEND_BATCH,
    MqttStats,
    _Out,
    _PublishRefused,
    _Queues,
    _Sub,
)
from rackplane.log import get_logger
from rackplane.settings import Identity, MqttSettings

__all__ = ["MqttLink"]

_FAILED_BATCH_PAUSE_S = 0.2  # pause after a batch with failures, so a stuck publish never spins

# aiomqtt/paho log every failed read of a dropped connection at ERROR ("failed to receive on
# socket"), once per reconnect attempt during an outage. Connection state is reported by our
# own mqtt_* events (once per change), so the library's logger only passes CRITICAL through.
_LIB_LOG = logging.getLogger("rackplane.io.mqtt.lib")
_LIB_LOG.setLevel(logging.CRITICAL)


def _os_errno(err: BaseException) -> int | None:
    """The errno of the OS error behind a failed connect (aiomqtt raises ``MqttError(str(exc))
    from None``: the OS error is its ``__context__``), None when there is none or it is a TLS
    error (whose errno is an SSL error code, not an errno)."""
    seen: BaseException | None = err
    for _ in range(5):
        if seen is None:
            return None
        if isinstance(seen, OSError) and not isinstance(seen, ssl.SSLError):
            return seen.errno if isinstance(seen.errno, int) else None
        seen = seen.__cause__ or seen.__context__
    return None

# The packet id of the last publish started in this task (set by `_Client`'s wrapper around
# paho's publish, which aiomqtt calls synchronously inside its own publish coroutine): how
# `_publish_raw` finds the MQTT v5 PUBACK reason code of its own message.
_PUBLISH_MID: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "rackplane_publish_mid", default=None
)
_REFUSALS_KEPT = 1000  # PUBACK refusals nobody waited for (cancelled publishes) are bounded


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


class MqttLink(_Queues):
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
        instance: one instance of a redundant pair (issue 15), e.g. ``a``: the default client
            id is ``<daemon>-<site>-<rack>-<instance>``, ``status`` and the Will go to
            ``<base>/status/<instance>`` (a standby's death never marks the rack's daemon
            offline), and the retained alarms are not reconciled on connect (the other
            instance's would be cleared) but when asked (`request_alarm_reconcile`, by the
            instance that became active). None (default): one instance, as before.

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
        instance: str | None = None,
    ) -> None:
        self.settings = settings
        self.identity = identity
        self.daemon = daemon
        self.announce = announce
        self.topics = Topics(settings.topic_root, identity, daemon)
        self.instance = instance
        self.client_id = settings.client_id or f"{daemon}-{identity.site}-{identity.rack}" + (
            f"-{instance}" if instance is not None else "")
        self.status_topic = (self.topics.instance_status(instance) if instance is not None
                             else self.topics.status)
        self._reconcile_wanted = False
        #: alarm ids the reconciliation never clears (a pair's per-instance alarms: issue 15)
        self.alarm_reconcile_keep: Callable[[str], bool] | None = None
        self._clock = clock
        self._log = log if log is not None else get_logger("rackplane.io.mqtt", daemon=daemon)
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
                    self._stats.last_connect_errno = _os_errno(err)
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
            topic=self.status_topic,
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
        self._stats.last_connect_errno = None
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
        if reason == "stopped":
            self._log.info("mqtt_disconnected", reason=reason)
        else:  # the broker is lost: state, alarms and commands stop until it is back
            self._log.warning("mqtt_disconnected", reason=reason)

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
            if self.instance is None:
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
            if self._reconcile_wanted and self.announce:
                self._reconcile_wanted = False
                await self._reconcile_alarms(conn)
            if any(f not in conn.attempted for f in self._subs):
                await self._sync_subscriptions(conn)
            batch = self._next_batch()
            if batch:
                if not await self._send_batch(conn, batch):
                    await asyncio.sleep(_FAILED_BATCH_PAUSE_S)
                continue
            self._wake.clear()
            if (self._has_pending() or self._reconcile_wanted
                    or any(f not in conn.attempted for f in self._subs)):
                continue
            await self._wake.wait()

    def request_alarm_reconcile(self) -> None:
        """Reconcile the retained alarms (`_reconcile_alarms`) once, now if connected, else
        after the next connect: a pair's instance that became active clears what the old
        active left raised and it does not hold (issue 15)."""
        self._reconcile_wanted = True
        self._wake.set()

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
        keep = self.alarm_reconcile_keep
        stale = sorted(t for t in seen if t.rsplit("/", 1)[-1] not in self._alarms
                       and not (keep is not None and keep(t.rsplit("/", 1)[-1])))
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

