"""MQTT topic names, topic checks and the incoming `Message`: pure (no socket, no library),
shared by the MQTT adapter (`rackplane.io.mqtt`) and the transport-independent command router
(`rackplane.commands`). DESIGN §3.

``<base> = <topic_root>/<site>/<rack>/<daemon>`` (the row is in payloads and tags)::

    <base>/status  <base>/state/<thing>  <base>/telemetry/<thing>  <base>/alarm/<id>
    <base>/cmd/<user>/<verb>  <base>/cmd/<user>/<verb>/result
    <base>/status/<instance>   (one instance of a redundant pair, issue 15)
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from rackplane.core.names import check_topic_level
from rackplane.settings import Identity

__all__ = [
    "Handler",
    "Message",
    "Topics",
    "encode_json",
    "topic_matches",
    "validate_topic",
    "validate_topic_filter",
]



def encode_json(payload: Any) -> bytes:
    """Compact UTF-8 JSON, as every rackplane payload is (DESIGN §3).

    Raises:
        TypeError: a value is not JSON-serialisable (e.g. a datetime or a set).
        ValueError: a float is NaN or infinite (not JSON; the caller must send a quality
            instead, DESIGN §3 "a bad value is never written as NaN").
    """
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


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
    # A topic level we build (thing, alarm id, verb, daemon, user): rackplane.core.names, the
    # same rule as every topic level in config, so it is also a safe time-series tag value.
    return check_topic_level(value, what)


def _user_level(user: str) -> str:
    # The user level is the broker username (DESIGN §3), a topic level like any other.
    return check_topic_level(user, "command user")


class Topics:
    """Topic names of one daemon (DESIGN §3): ``<root>/<site>/<rack>/<daemon>/...``, built in
    one place for the daemon itself and for its peers (valvey sends requests to racky's
    ``cmd/<user>/<verb>``; racky reads valvey's ``state/<thing>`` and commands the node agents).

    Args:
        root: topic root (settings.MqttSettings.topic_root), one or more levels, no wildcards.
        identity: site and rack become topic levels; the row travels in payloads and tags.
        daemon: daemon name, e.g. ``valvey``.

    Raises:
        ValueError: root, daemon or a level passed to a builder is not topic-safe.
    """

    def __init__(self, root: str, identity: Identity, daemon: str) -> None:
        for level in root.split("/"):
            check_topic_level(level, f"topic root {root!r}: level")
        self.root = root
        self.identity = identity
        self.daemon = _level(daemon, "daemon name")
        self.base = f"{root}/{identity.site}/{identity.rack}/{daemon}"
        self._cmd_prefix = f"{self.base}/cmd/"

    @property
    def status(self) -> str:
        """``<base>/status`` (retained online / stopping / offline)."""
        return f"{self.base}/status"

    def instance_status(self, instance: str) -> str:
        """``<base>/status/<instance>``: the status of one instance of a redundant pair
        (retained online / stopping / offline, its own Last Will), issue 15."""
        return f"{self.base}/status/{_level(instance, 'instance')}"

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

    @property
    def telemetry_filter(self) -> str:
        """``<base>/telemetry/+``: every telemetry topic of this daemon (a peer subscribes)."""
        return f"{self.base}/telemetry/+"

    def cmd_base(self, user: str) -> str:
        """``<base>/cmd/<user>``: below it, the requests a client named ``user`` sends."""
        return f"{self._cmd_prefix}{_user_level(user)}"

    def cmd_results(self, user: str) -> str:
        """``<base>/cmd/<user>/+/result``: the replies to every verb ``user`` sent (a peer
        sending requests subscribes to it)."""
        return f"{self.cmd_base(user)}/+/result"

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

