"""The CLI's MQTT client: send a command and wait for its reply, or watch a daemon's topics.

Built on `rackplane.io.mqtt.MqttLink` (no second MQTT client library) with ``announce=False``:
a client publishes no ``status`` and sets no Will, so a user whose broker ACL only lets it
command (or only read) never publishes outside its rights. The contract it speaks is
docs/COMMANDS.md (DESIGN §3):

- the envelope ``{request_id, issued_at, args}`` goes QoS 1, not retained, to
  ``<root>/<site>/<rack>/<daemon>/cmd/<user>/<verb>`` (``<user>`` = the broker username);
- on MQTT v5 it carries a Response Topic in the user's own reply space,
  ``.../cmd/<user>/<verb>/result/<nonce>`` (one nonce per client), and Correlation Data (16
  random bytes per request); on 3.1.1 the reply comes on ``.../cmd/<user>/<verb>/result``.
  The client subscribes ``.../cmd/<user>/+/result/#`` (both cases) before it publishes.
- A reply is matched, on v5, by its Correlation Data alone (a refusal of an unreadable
  envelope, ``too_large`` or ``invalid_envelope``, has ``request_id`` null and is still
  matched; one whose ``request_id`` is another request's is not); a reply without Correlation
  Data (a daemon on MQTT 3.1.1 never sees the request's, and answers on ``.../result``) and
  every reply on 3.1.1 are matched by ``request_id``. A retained message on a reply topic is
  never a reply (a daemon never retains one): it is ignored and counted
  (`CommandClient.ignored_replies`).
- Protocol ``auto`` (the default) negotiates: MQTT v5 first; when that gets no CONNACK within
  half of ``connect_timeout_s`` (a 3.1.1-only broker such as amqtt never answers a v5 CONNECT)
  or a CONNACK refusing the protocol version, it reconnects on 3.1.1 for the rest of
  ``connect_timeout_s`` (replies then on ``.../result``). A refused login is never retried on
  the other version. `CommandClient.protocol` says which one it got.
- Waiting for the broker only goes on while waiting can help (no answer yet, a slow CONNACK,
  the v5 -> 3.1.1 fallback): a connection the network refuses outright, nothing listening on
  ``host:port`` (ECONNREFUSED), the host or its network unreachable, or a host name that does
  not resolve, fails at once (`BrokerUnreachable`), on either protocol, without the fallback.

Connection settings (`ClientSettings`) come from, highest first: command-line flags,
``RACKCTL_<FIELD>`` environment variables (e.g. ``RACKCTL_HOST``, ``RACKCTL_CA_FILE``), a TOML
file (``--config``, else ``$RACKCTL_CONFIG``, else ``~/.config/rackctl/config.toml`` if it
exists), then the defaults. The password never comes from a flag or a file: only from the
environment variable named by ``password_env`` (default ``RACKCTL_PASSWORD``).

Errors (and the CLI's exit codes, rackctl/cli.py): `BrokerUnavailable` (3: no connection
within ``connect_timeout_s``; its subclass `BrokerUnreachable` at once, when the connection
itself is refused or the host unreachable or unknown), `BrokerRefused` (2: the broker refused
the login: credentials or TLS settings), `rackplane.io.mqtt.PublishRefused` (1: a v5 broker's
ACL refused the command), `ReplyTimeout` (3: no reply within ``timeout_s``; the command may
still be applied later, until its TTL: retry with the same request id, it is never applied
twice). rackctl's ``cmd`` and ``watch`` also read the addressed daemon's retained ``status``
(rackctl/presence.py): a rack where that daemon never connected is said in about a second
(``cmd``: `rackctl.presence.DaemonNeverConnected`, exit 3), an offline one in the timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import getpass
import json
import math
import os
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rackplane.clock import SYSTEM_CLOCK, Clock
from rackplane.commands import REQUEST_ID_PATTERN
from rackplane.config import StrictModel, read_toml, validate_data
from rackplane.core.names import check_topic_level, check_topic_levels
from rackplane.errors import ConfigError
from rackplane.io.mqtt import Handler, Message, MqttLink, Topics, encode_json
from rackplane.settings import CommandSettings, Identity, MqttSettings, TlsSettings, TopicLevel

__all__ = [
    "ENV_PREFIX",
    "BrokerRefused",
    "BrokerUnavailable",
    "BrokerUnreachable",
    "ClientSettings",
    "CommandClient",
    "PayloadTooLarge",
    "ReplyTimeout",
    "default_config_path",
    "load_client_settings",
    "parse_args",
    "validate_request_id",
    "watch_filters",
]

ENV_PREFIX = "RACKCTL_"
"""Environment variables ``RACKCTL_<FIELD>`` (upper case) set `ClientSettings` fields."""


class ClientSettings(StrictModel):
    """Where rackctl connects and whom it addresses (flags > ``RACKCTL_*`` env > file >
    these defaults)."""

    host: str = Field("127.0.0.1", description="broker host")
    port: int = Field(1883, ge=1, le=65535, description="broker port (TLS: usually 8883)")
    protocol: Literal["auto", "3.1.1", "5"] = Field(
        "auto", description="MQTT protocol version; auto: v5, falling back to 3.1.1 when the "
        "broker does not speak v5")
    username: TopicLevel | None = Field(
        None, description="broker username (also the <user> level): a topic level")
    password_env: str = Field(
        "RACKCTL_PASSWORD", description="environment variable holding the password (never a "
        "flag or a file); unset: no password"
    )
    ca_file: Path | None = Field(None, description="CA certificate (PEM): enables TLS")
    cert_file: Path | None = Field(None, description="client certificate (PEM), optional")
    key_file: Path | None = Field(None, description="client key (PEM), with cert_file")
    site: TopicLevel = Field("lab", description="topic level <site>")
    rack: TopicLevel = Field("rack1", description="topic level <rack>")
    topic_root: str = Field("rackplane", description="first topic level(s)")
    user: TopicLevel | None = Field(
        None, description="the cmd/<user> level; default the username, else the login name "
        "(without broker authentication it proves nothing)"
    )
    timeout_s: float = Field(10.0, gt=0, le=3600, description="wait for a reply [s]")
    connect_timeout_s: float = Field(5.0, gt=0, le=120, description="wait for the broker [s]")
    max_payload_bytes: int = Field(
        CommandSettings.model_fields["max_payload_bytes"].default, ge=1024, le=262_144,
        description="a command envelope larger than this is refused here (the daemons refuse "
        "it unread, 'too_large'); set it to the daemons' commands.max_payload_bytes [bytes]")

    @field_validator("topic_root")
    @classmethod
    def _root_levels(cls, v: str) -> str:
        return check_topic_levels(v, "topic_root")

    @model_validator(mode="after")
    def _tls_pair(self) -> ClientSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together (client certificate auth)")
        if self.cert_file is not None and self.ca_file is None:
            raise ValueError("a client certificate needs TLS: set ca_file too")
        return self

    @property
    def topic_user(self) -> str:
        """The ``cmd/<user>`` level: ``user``, else ``username``, else the login name.

        Raises:
            ValueError: the login name is not a valid topic level (set ``user``)."""
        return self.user or self.username or check_topic_level(getpass.getuser(),
                                                               "login name (set --user)")

    def identity(self) -> Identity:
        """The site and rack addressed (the row is not a topic level)."""
        return Identity(site=self.site, rack=self.rack)

    def topics(self, daemon: str) -> Topics:
        """Topic names of ``daemon`` at this site and rack.

        Raises:
            ValueError: ``daemon`` is not a valid topic level.
        """
        return Topics(self.topic_root, self.identity(), daemon)

    def mqtt(self, environ: Mapping[str, str] | None = None) -> MqttSettings:
        """The `MqttSettings` of a client link: clean session, a unique client id (two
        rackctl runs never take over each other's connection), quick reconnects, the password
        from ``password_env`` if that variable is set."""
        env = os.environ if environ is None else environ
        # The client id only names the connection: a login name that is no topic level
        # (e.g. "john.doe") is made safe here; commanding needs a valid `topic_user`.
        who = re.sub(r"[^A-Za-z0-9_:-]", "_", self.user or self.username or getpass.getuser())
        tls = None
        if self.ca_file is not None:
            tls = TlsSettings(ca_file=self.ca_file, cert_file=self.cert_file,
                              key_file=self.key_file)
        return MqttSettings(
            host=self.host, port=self.port, protocol="5" if self.protocol == "auto" else
            self.protocol,
            client_id=f"rackctl-{who[:24]}-{uuid.uuid4().hex[:10]}",
            username=self.username,
            password_env=self.password_env if self.password_env in env else None,
            tls=tls, clean_session=True, reconnect_min_s=0.2, reconnect_max_s=1.0,
            ack_timeout_s=min(self.connect_timeout_s, 120.0), stop_timeout_s=1.0,
            topic_root=self.topic_root,
        )


def default_config_path(environ: Mapping[str, str] | None = None) -> Path | None:
    """``$RACKCTL_CONFIG``, else ``$XDG_CONFIG_HOME/rackctl/config.toml`` (default
    ``~/.config``) if that file exists, else None."""
    env = os.environ if environ is None else environ
    named = env.get(f"{ENV_PREFIX}CONFIG")
    if named:
        return Path(named)
    base = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else \
        Path(env.get("HOME", str(Path.home()))) / ".config"
    path = base / "rackctl" / "config.toml"
    return path if path.is_file() else None


def load_client_settings(
    flags: Mapping[str, Any] | None = None,
    *,
    config: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> ClientSettings:
    """Merge flags > ``RACKCTL_<FIELD>`` env > the TOML file > defaults.

    Args:
        flags: field -> value; None values count as "not given".
        config: the TOML file (flat keys named like the fields); None: `default_config_path`.
        environ: default ``os.environ``.

    Raises:
        ConfigError: unreadable or invalid file, or an invalid value from any source (the
            message names the field and where values came from).
    """
    env = os.environ if environ is None else environ
    path = Path(config) if config is not None else default_config_path(env)
    data: dict[str, Any] = {}
    if path is not None:
        data.update(read_toml(path))
        base_dir = path.parent
        for key in ("ca_file", "cert_file", "key_file"):  # relative to the file's folder
            if isinstance(data.get(key), str) and not Path(data[key]).is_absolute():
                data[key] = str(base_dir / data[key])
        if "password" in data:
            raise ConfigError(f"{path}: password: secrets never go in files; set the "
                              f"environment variable named by password_env (default "
                              f"{ENV_PREFIX}PASSWORD)")
    for name in ClientSettings.model_fields:
        value = env.get(f"{ENV_PREFIX}{name.upper()}")
        if value not in (None, ""):
            data[name] = _env_value(name, value)
    data.update({k: v for k, v in (flags or {}).items() if v is not None})
    source = "rackctl settings (flags, RACKCTL_* environment" + (f", {path})" if path else ")")
    return validate_data(ClientSettings, data, source)


def _env_value(name: str, text: str) -> Any:
    """An environment string as the field's type (the settings models are type-strict: a
    string never fills a number); left as text when it does not parse, so validation names
    the field."""
    annotation = ClientSettings.model_fields[name].annotation
    for kind in (int, float):
        if annotation is kind:
            try:
                return kind(text)
            except ValueError:
                return text
    return text


def parse_args(pairs: Sequence[str], args_json: str | None = None) -> dict[str, Any]:
    """The ``args`` object from ``--args JSON`` and ``--arg k=v`` (later ones win).

    A value is read as JSON when it parses (``40`` a number, ``true`` a boolean, ``null``,
    ``"40"`` a string, ``[1,2]`` an array), else taken as a plain string (``mode=manual``).

    Raises:
        ValueError: ``--args`` is not a JSON object, or a pair has no ``=`` or an empty key.
    """
    out: dict[str, Any] = {}
    if args_json is not None:
        try:
            obj = json.loads(args_json)
        except ValueError as err:
            raise ValueError(f"--args is not valid JSON: {err}") from None
        if not isinstance(obj, dict):
            raise ValueError("--args must be a JSON object, e.g. '{\"setpoint_c\": 40}'")
        try:
            _check_finite(obj)
        except _NonFinite as err:
            raise ValueError(f"--args: {err}") from None
        out.update(obj)
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--arg {pair!r}: expected key=value")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        try:
            out[key] = _check_finite(value)
        except _NonFinite as err:
            raise ValueError(f"--arg {pair!r}: {err}") from None
    return out


class _NonFinite(ValueError):
    """A number JSON cannot carry (NaN, Infinity, or one overflowing a double)."""


def _check_finite(value: Any) -> Any:
    """``value`` unchanged if every number in it is finite (JSON cannot carry NaN or
    Infinity; ``1e400`` parses as Infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise _NonFinite(f"{value} is out of range (finite numbers only)")
    if isinstance(value, dict):
        for v in value.values():
            _check_finite(v)
    elif isinstance(value, list):
        for v in value:
            _check_finite(v)
    return value


def validate_request_id(request_id: str) -> str:
    """Check a ``--request-id`` locally, by the daemon's own envelope rule
    (`rackplane.commands.REQUEST_ID_PATTERN`: 1 to 64 of ``A-Z a-z 0-9 . _ : -``).

    Raises:
        ValueError: it breaks that rule (the daemon would refuse it as invalid_envelope).
    """
    if re.fullmatch(REQUEST_ID_PATTERN, request_id) is None:
        raise ValueError(f"--request-id {request_id!r}: use 1 to 64 characters among "
                         "A-Z a-z 0-9 . _ : - (no spaces)")
    return request_id


def watch_filters(topics: Topics) -> list[str]:
    """What ``rackctl watch`` subscribes: ``status``, ``status/+`` (a pair's instances),
    ``state/+``, ``alarm/+``."""
    return [topics.status, f"{topics.base}/status/+", f"{topics.base}/state/+",
            f"{topics.base}/alarm/+"]


class BrokerUnavailable(Exception):
    """No connection to the broker within ``connect_timeout_s`` (exit 3)."""


class BrokerUnreachable(BrokerUnavailable):
    """The connection to the broker failed in a way waiting cannot fix soon (exit 3, at once,
    not after ``connect_timeout_s``): refused (nothing listening on ``host:port``), host or
    network unreachable, host name not resolved. ``errno``: the OS error's number (a negative
    ``socket.EAI_*`` code for a name that did not resolve)."""

    def __init__(self, message: str, errno_: int) -> None:
        super().__init__(message)
        self.errno = errno_


_UNREACHABLE = {errno.ECONNREFUSED: "connection refused",
                errno.EHOSTUNREACH: "host unreachable", errno.ENETUNREACH: "network unreachable"}
"""The OS errors of a connect that retrying within the connect timeout cannot fix soon."""


def _unreachable(host: str, port: int, code: int | None, why: str | None) -> str | None:
    """The message of a connect failure with errno ``code`` that waiting cannot fix, None
    when waiting may help (see `BrokerUnreachable`)."""
    if code is None:
        return None
    detail = why or os.strerror(code)
    if code < 0:  # socket.gaierror: the EAI_* codes are negative
        return (f"cannot resolve the broker host {host!r} (port {port}): {detail}; check "
                "--host / RACKCTL_HOST")
    what = _UNREACHABLE.get(code)
    if what is None:
        return None
    if code == errno.ECONNREFUSED:
        return (f"connection refused: is a broker listening on {host}:{port}? ({detail}; "
                "check --host / --port, RACKCTL_HOST / RACKCTL_PORT)")
    return f"{what}: cannot reach the broker at {host}:{port} ({detail})"


class BrokerRefused(Exception):
    """The broker refused the login in its CONNACK: bad username or password, not authorised
    (exit 2: fix the settings)."""


class PayloadTooLarge(ValueError):
    """The command envelope is larger than ``max_payload_bytes`` (exit 2): a daemon would
    refuse it unread (``too_large``, request_id null), which over MQTT 3.1.1 looks like no
    reply at all."""

    def __init__(self, size_bytes: int, limit_bytes: int):
        super().__init__(
            f"command too large: the envelope is {size_bytes} bytes, over the daemons' limit "
            f"of {limit_bytes} bytes (commands.max_payload_bytes; rackctl's max_payload_bytes "
            "setting if a daemon allows more); not sent")
        self.size_bytes = size_bytes
        self.limit_bytes = limit_bytes


class ReplyTimeout(Exception):
    """No reply within ``timeout_s`` (exit 3). The command may still be applied later (it
    may be queued for a daemon that is away) until its TTL; sending it again with the same
    ``request_id`` is safe."""


class CommandClient:
    """One broker connection for rackctl: ``async with CommandClient(settings) as c``.

    Args:
        settings: connection and addressing.
        clock: wall time for ``issued_at``; monotonic time for the link.

    Use `subscribe` (before entering) for extra filters (``watch``), `call` to send commands.

    Raises (on entering):
        BrokerUnavailable, BrokerRefused: see the module docstring.
        ConfigError: the password variable is named but unset, TLS files unreadable.
    """

    def __init__(self, settings: ClientSettings, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.requested_protocol = settings.protocol
        """The protocol asked for (``auto``, ``3.1.1`` or ``5``)."""
        if settings.protocol == "auto":
            settings = settings.model_copy(update={"protocol": "5"})
        self.settings = settings
        """The settings in use; ``protocol`` is the one connected with (after `__aenter__`)."""
        self._clock = clock
        self.link = MqttLink(settings.mqtt(), settings.identity(), "rackctl", clock=clock,
                             announce=False)
        self._nonce = uuid.uuid4().hex[:12]
        self._pending: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._by_correlation: dict[bytes, str] = {}
        self.ignored_replies: dict[str, int] = {}
        """Messages on the reply topics that were not taken as a reply, by reason
        (``retained``, ``not_json``, ``unmatched``)."""
        self._reply_filters: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self.arrivals: list[str] = []
        """Request ids in the order their replies arrived."""

    def subscribe(self, topic_filter: str, handler: Handler, qos: int = 1) -> None:
        """Add a subscription (before entering: it is then live once entered)."""
        self.link.subscribe(topic_filter, handler, qos=qos)

    def expect_replies_from(self, daemon: str) -> None:
        """Subscribe to this user's reply space of ``daemon`` (``call`` does it too; calling
        it before entering saves a round trip)."""
        topics = self.settings.topics(daemon)
        flt = f"{topics.base}/cmd/{self.settings.topic_user}/+/result/#"
        if flt not in self._reply_filters:
            self._reply_filters.add(flt)
            self.link.subscribe(flt, self._on_reply, qos=1)

    @property
    def protocol(self) -> str:
        """The MQTT protocol version in use: ``5`` or ``3.1.1``."""
        return self.settings.protocol

    async def __aenter__(self) -> CommandClient:
        s = self.settings
        if self.requested_protocol != "auto":
            await self._start(s.connect_timeout_s)
            return self
        half_s = s.connect_timeout_s / 2
        try:
            await self._start(half_s)
            return self
        except BrokerUnreachable:
            raise  # the same host and port on 3.1.1 would fail the same way
        except BrokerUnavailable as err:
            first = str(err)
        except BrokerRefused as err:
            if "protocol version" not in str(err).lower():
                raise
            first = str(err)
        # the broker did not take v5: the same subscriptions on a fresh 3.1.1 link
        old = self.link
        self.settings = s.model_copy(update={"protocol": "3.1.1"})
        self.link = MqttLink(self.settings.mqtt(), self.settings.identity(), "rackctl",
                             clock=self._clock, announce=False)
        for flt in old.configured_topics:
            sub = old._subs[flt]
            for handler in sub.handlers:
                self.link.subscribe(flt, handler, qos=sub.qos)
        try:
            await self._start(s.connect_timeout_s - half_s)
        except BrokerUnavailable as err:
            raise BrokerUnavailable(f"MQTT v5: {first}; MQTT 3.1.1: {err}") from None
        return self

    async def _start(self, timeout_s: float) -> None:
        """Run the link and wait up to ``timeout_s`` for its connection."""
        self._task = asyncio.create_task(self.link.run(), name="rackctl-mqtt")
        try:
            await self._wait_connected(timeout_s)
        except BaseException:
            await self._close()
            raise

    async def __aexit__(self, *exc: object) -> None:
        await self._close()

    async def _close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.link.stop(1.0), 3.0)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        for fut in self._pending.values():
            fut.cancel()

    async def _wait_connected(self, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        s = self.settings
        while True:
            with contextlib.suppress(TimeoutError):
                await self.link.wait_ready(0.05)
                return
            st = self.link.stats
            if st.connack_refusals:
                raise BrokerRefused(f"the broker at {s.host}:{s.port} refused the login as "
                                    f"{s.username or '(anonymous)'}: {st.last_connect_error}")
            unreachable = _unreachable(s.host, s.port, st.last_connect_errno,
                                       st.last_connect_error)
            if unreachable is not None and st.last_connect_errno is not None:
                raise BrokerUnreachable(unreachable, st.last_connect_errno)
            if self._task is not None and self._task.done():
                err = self._task.exception() if not self._task.cancelled() else None
                raise BrokerUnavailable(f"MQTT link ended: {err!r}")
            if loop.time() >= deadline:
                why = st.last_connect_error or "no answer"
                raise BrokerUnavailable(
                    f"no connection to the broker at {s.host}:{s.port} within "
                    f"{timeout_s:g} s ({why})"
                )

    async def _wait_subscribed(self, topic_filter: str, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while topic_filter not in self.link.subscribed_topics:
            if loop.time() >= deadline:
                raise BrokerUnavailable(f"the broker did not confirm the subscription to "
                                        f"{topic_filter} within {timeout_s:g} s")
            await asyncio.sleep(0.01)

    def _ignore(self, why: str) -> None:
        self.ignored_replies[why] = self.ignored_replies.get(why, 0) + 1

    def _on_reply(self, msg: Message) -> None:
        """Match one message on a reply topic to a pending request (module docstring)."""
        if msg.retain:
            self._ignore("retained")  # a reply is never retained: a stale or forged one
            return
        try:
            body = msg.json()
        except ValueError:
            self._ignore("not_json")
            return
        if not isinstance(body, dict):
            self._ignore("not_json")
            return
        rid = body.get("request_id")
        if self.settings.protocol == "5" and msg.correlation_data is not None:
            match = self._by_correlation.get(msg.correlation_data)
            if match is None or (rid is not None and rid != match):
                self._ignore("unmatched")
                return
            rid = match
        elif not isinstance(rid, str):
            self._ignore("unmatched")
            return
        fut = self._pending.get(rid)
        if fut is None or fut.done():
            self._ignore("unmatched")
            return
        self.arrivals.append(rid)
        fut.set_result(body)

    def envelope(self, args: Mapping[str, Any], request_id: str) -> dict[str, Any]:
        """The command envelope with ``issued_at`` = now (wall clock, RFC 3339 UTC)."""
        issued = datetime.fromtimestamp(self._clock.wall_ns() / 1e9, tz=UTC)
        return {"request_id": request_id,
                "issued_at": issued.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                "args": dict(args)}

    async def send(
        self,
        daemon: str,
        verb: str,
        args: Mapping[str, Any] | None = None,
        *,
        request_id: str | None = None,
    ) -> asyncio.Future[dict[str, Any]]:
        """Publish a command (once the broker acknowledged it) and return the future of its
        reply, without waiting for it: for scripts that send several at once (the replies
        are matched by ``request_id``; `arrivals` records their order).

        Raises:
            ValueError: daemon or verb not a valid topic level, args not JSON-serialisable,
                the envelope over ``max_payload_bytes`` (`PayloadTooLarge`),
                the request id already waiting for a reply.
            PublishRefused: a v5 broker refused the publish (ACL).
            BrokerUnavailable: the reply subscription was not confirmed in time.
            MqttError: the connection was lost while publishing.
        """
        s = self.settings
        topics = s.topics(daemon)
        topic = topics.cmd(s.topic_user, verb)
        rid = request_id or f"rc-{uuid.uuid4().hex[:16]}"
        if rid in self._pending:
            raise ValueError(f"request_id {rid!r} is already waiting for its reply")
        data = encode_json(self.envelope(args or {}, rid))
        if len(data) > s.max_payload_bytes:
            raise PayloadTooLarge(len(data), s.max_payload_bytes)
        self.expect_replies_from(daemon)
        await self._wait_subscribed(f"{topics.base}/cmd/{s.topic_user}/+/result/#",
                                    max(s.timeout_s, 1.0))
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        corr = uuid.uuid4().bytes if s.protocol == "5" else None
        self._pending[rid] = fut
        if corr is not None:
            self._by_correlation[corr] = rid

        def done(_f: object) -> None:
            self._pending.pop(rid, None)
            if corr is not None:
                self._by_correlation.pop(corr, None)

        fut.add_done_callback(done)
        response_topic = f"{topic}/result/{self._nonce}" if s.protocol == "5" else None
        try:
            await self.link.publish(topic, data, qos=1, response_topic=response_topic,
                                    correlation_data=corr)
        except BaseException:
            fut.cancel()
            raise
        return fut

    async def call(
        self,
        daemon: str,
        verb: str,
        args: Mapping[str, Any] | None = None,
        *,
        request_id: str | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """Send ``verb`` to ``daemon`` and return its reply ``{request_id, ok, error, state}``
        (``ok: false`` is a reply too: the caller decides).

        Raises:
            ValueError: daemon or verb not a valid topic level, args not JSON-serialisable.
            PublishRefused: a v5 broker refused the publish (ACL).
            MqttError: the connection was lost while publishing.
            ReplyTimeout: no reply in ``timeout_s`` (default ``settings.timeout_s``).
        """
        s = self.settings
        timeout = s.timeout_s if timeout_s is None else timeout_s
        rid = request_id or f"rc-{uuid.uuid4().hex[:16]}"
        fut = await self.send(daemon, verb, args, request_id=rid)
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            hint = "" if s.protocol == "5" else (
                "; on MQTT 3.1.1 a command the broker's ACL refuses is dropped silently: "
                "check that your user may command this daemon")
            raise ReplyTimeout(
                f"no reply from {daemon} ({s.topics(daemon).base}) to {verb} within "
                f"{timeout:g} s: the daemon may be down or away; it may still apply the "
                f"command within its TTL (retry with the same --request-id {rid}, it is "
                f"never applied twice){hint}"
            ) from None


def on_json(callback: Callable[[Message, Any], None]) -> Handler:
    """A `Handler` that decodes the payload as JSON (None for an empty or invalid one)."""

    def handler(msg: Message) -> None:
        try:
            body = msg.json() if msg.payload else None
        except ValueError:
            body = None
        callback(msg, body)

    return handler
