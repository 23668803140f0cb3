"""Config models shared by both daemons: identity, MQTT, time series, spool, Modbus targets.

These are pure pydantic models (no I/O library imported here), composed by each daemon's own
config model. Paths given relative to a config file are resolved against that file's folder
(the loader passes ``base_dir`` in the validation context).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from rackplane.config import StrictModel
from rackplane.core.names import check_client_id, check_topic_level
from rackplane.paths import in_state_directory, state_directory

__all__ = [
    "ClientId",
    "CommandSettings",
    "DaemonSettings",
    "Identity",
    "LogSettings",
    "MetricsSettings",
    "ModbusTargetSettings",
    "MqttSettings",
    "SpoolSettings",
    "TlsSettings",
    "TopicLevel",
    "TsdbSettings",
    "default_spool_directory",
    "effective_spool",
    "environment_checks",
    "parse_listen",
    "resolve_path",
    "spool_folder",
]


def _level(v: str) -> str:
    return check_topic_level(v, "value")


TopicLevel = Annotated[str, AfterValidator(_level)]
"""A config value that becomes one MQTT topic level (site, rack, a daemon name, a broker
username, a thing name): `rackplane.core.names.TOPIC_LEVEL_PATTERN`."""

ClientId = Annotated[str, AfterValidator(check_client_id)]
"""An MQTT client id: the topic-level alphabet, up to `rackplane.core.names.CLIENT_ID_MAX`."""


def resolve_path(value: Path, info: ValidationInfo) -> Path:
    """Resolve a relative path against the config file's folder (``base_dir`` in context)."""
    base = (info.context or {}).get("base_dir")
    if value.is_absolute() or base is None:
        return value
    return (Path(base) / value).resolve()


class Identity(StrictModel):
    """Where this daemon sits: the first MQTT topic levels and the time-series tags."""

    site: TopicLevel = "lab"
    row: TopicLevel = "row1"
    rack: TopicLevel = "rack1"


class TlsSettings(StrictModel):
    """TLS for the MQTT connection. Files are PEM."""

    ca_file: Path
    cert_file: Path | None = None
    key_file: Path | None = None

    @field_validator("ca_file", "cert_file", "key_file")
    @classmethod
    def _resolve(cls, v: Path | None, info: ValidationInfo) -> Path | None:
        # None (no client certificate) passes: validate_default runs this on the defaults.
        return None if v is None else resolve_path(v, info)

    @model_validator(mode="after")
    def _pair(self) -> TlsSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together (client certificate auth)")
        return self


class MqttSettings(StrictModel):
    """Broker connection. The password comes from the environment variable ``password_env``."""

    host: str = Field("127.0.0.1", min_length=1)
    port: int = Field(1883, ge=1, le=65535)
    protocol: Literal["3.1.1", "5"] = "5"
    client_id: ClientId | None = Field(
        None, description="fixed client id; default '<daemon>-<site>-<rack>'. 1-200 "
        "characters of letters, digits, '_', ':', '-' (no '/', '+', '#', '$', '.', spaces)"
    )
    username: TopicLevel | None = Field(
        None, description="broker username; it is the <user> level of this daemon's requests "
        "to its peers (cmd/<user>/<verb>), so a topic level: 1-64 letters, digits, '_', ':', "
        "'-'"
    )
    password_env: str | None = Field(None, description="name of the env var holding the password")
    tls: TlsSettings | None = None
    keepalive_s: int = Field(15, ge=5, le=3600)
    clean_session: bool = Field(
        False,
        description="False keeps a persistent session so QoS 1 commands queued while the "
        "daemon is away are delivered (FIELD-CASES BR-22)",
    )
    session_expiry_s: int = Field(3600, ge=0, le=604_800,
                                   description="MQTT v5 session expiry interval (at most a week)")
    reconnect_min_s: float = Field(0.5, gt=0, le=60)
    reconnect_max_s: float = Field(5.0, gt=0, le=3600)
    topic_root: str = Field(
        "rackplane", description="first topic level(s); no wildcards, no leading or trailing '/'"
    )
    telemetry_queue_max: int = Field(
        10_000, ge=10, le=1_000_000, description="outgoing QoS 0 telemetry kept while "
        "disconnected; the oldest is dropped and counted beyond this (state and alarms are "
        "never dropped)"
    )

    ack_timeout_s: float = Field(
        10.0, gt=0, le=120, description="bound on waiting for the TCP connect, CONNACK, SUBACK "
        "and PUBACK of one request; a connection that does not answer in time is dropped and "
        "reconnected"
    )
    stop_timeout_s: float = Field(
        3.0, gt=0, le=60, description="budget of MqttLink.stop(): publish 'stopping', send what "
        "is queued, publish 'offline' and disconnect; keep it inside the service stop budget"
    )
    outbox_max: int = Field(
        1000, ge=10, le=1_000_000, description="outgoing QoS 1 command replies kept while "
        "disconnected; the oldest is dropped and counted beyond this"
    )

    @field_validator("topic_root")
    @classmethod
    def _root(cls, v: str) -> str:
        for level in v.split("/"):
            check_topic_level(level, "topic_root level")
        return v

    @model_validator(mode="after")
    def _backoff(self) -> MqttSettings:
        if self.reconnect_max_s < self.reconnect_min_s:
            raise ValueError("reconnect_max_s must be >= reconnect_min_s")
        return self


class SpoolSettings(StrictModel):
    """The on-disk telemetry spool (and, with no database configured, the embedded store)."""

    directory: Path | None = Field(
        None, description="the spool folder; unset: spool/<daemon>-<site>-<row>-<rack> (a "
        "folder per daemon and rack, so two daemons started from one folder never share "
        "one; under systemd inside $STATE_DIRECTORY). One process per folder: a folder held "
        "by another process is reported by --check-config"
    )
    max_bytes: int = Field(
        512 * 2**20, ge=2**20, le=2**40, description="bound on the whole spool (at most 1 "
        "TiB); the oldest segments are removed (and counted) beyond it"
    )
    segment_bytes: int = Field(8 * 2**20, ge=4096, le=2**30)
    fsync_interval_s: float = Field(1.0, gt=0, le=60)
    append_interval_s: float = Field(
        0.1, gt=0, le=1.0, description="longest a written line waits in the writer's memory "
        "before it is appended to the spool file: the most a SIGKILL can lose"
    )
    memory_max_lines: int = Field(
        10_000, ge=100, le=10_000_000, description="lines kept in memory while the spool "
        "cannot be written (disk full, unwritable); the oldest are dropped and counted "
        "beyond it (REFERENCE §8 Telemetry buffering: >= 10,000 points in RAM)"
    )

    @field_validator("directory")
    @classmethod
    def _resolve(cls, v: Path | None, info: ValidationInfo) -> Path | None:
        # Under systemd a relative spool lives in $STATE_DIRECTORY (the one writable place
        # under ProtectSystem=strict), never next to a config file in /etc.
        if v is None:
            return None  # the default: `effective_spool` names it per daemon and rack
        state_dir = state_directory()
        if not v.is_absolute() and state_dir is not None:
            return (state_dir / v).resolve()
        return resolve_path(v, info)

    @model_validator(mode="after")
    def _sizes(self) -> SpoolSettings:
        if self.segment_bytes * 2 > self.max_bytes:
            raise ValueError("max_bytes must hold at least two segments (2 * segment_bytes)")
        return self


class TsdbSettings(StrictModel):
    """The InfluxDB the telemetry goes to: the v2 write API (``/api/v2/write``: InfluxDB 2.x,
    3.x, 1.8+) or the 1.x one (``/write``: every InfluxDB 1.x). ``url = None`` keeps
    everything in the spool only. Both APIs share the spool, batching, retry and refusal
    rules (`rackplane.io.tsdb`)."""

    url: str | None = Field(None, description="e.g. http://influx:8086; None: embedded store")
    api: Literal["v2", "v1"] = Field(
        "v2", description="'v2': POST /api/v2/write with org, bucket and token_env (InfluxDB "
        "2.x, 3.x, and 1.8+ through its compatibility API); 'v1': POST /write with database, "
        "retention_policy and optionally username + password_env (every InfluxDB 1.x, e.g. "
        "Debian's 1.6, which has no /api/v2/write). Timestamps are always sent as ns"
    )
    org: str = Field("rackplane", description="api = 'v2': the organisation")
    bucket: str = Field("rackplane", description="api = 'v2': the bucket")
    token_env: str | None = Field(
        None, description="api = 'v2': env var holding the API token"
    )
    database: str = Field(
        "rackplane", min_length=1, description="api = 'v1': the database (/write?db=). It "
        "must exist (CREATE DATABASE): a missing one is a configuration error (404), logged, "
        "the data kept and retried"
    )
    retention_policy: str | None = Field(
        None, min_length=1, description="api = 'v1': the retention policy (/write?rp=); "
        "None: the database's default"
    )
    username: str | None = Field(
        None, min_length=1, description="api = 'v1' on a server with auth-enabled: the user "
        "(HTTP Basic authentication; the password comes from password_env)"
    )
    password_env: str | None = Field(
        None, description="api = 'v1': env var holding username's password"
    )
    batch_lines: int = Field(1000, ge=1, le=100_000)
    flush_interval_s: float = Field(1.0, gt=0, le=60)
    timeout_s: float = Field(10.0, gt=0, le=120)
    # Faster than influxdb-client's 5 s / 125 s defaults (REFERENCE §8): the spool holds every
    # line through any outage, so retrying sooner only shortens recovery; the cap keeps a
    # returning database from waiting more than 30 s for the first retry.
    retry_initial_s: float = Field(1.0, gt=0, le=60)
    retry_max_s: float = Field(30.0, gt=0, le=3600)
    stop_budget_s: float = Field(
        5.0, ge=0, le=600, description="time allowed at shutdown to drain the spool; the rest is "
        "sent after restart. Keep it below systemd's TimeoutStopSec"
    )
    ts_out_of_window: Literal["restamp", "drop"] = Field(
        "restamp", description="a line whose timestamp is outside 2020..2100 (seconds or ms "
        "taken for ns, an unsynchronised clock) is never written as is: restamp gives it its "
        "arrival time (lines written while the wall clock itself is outside the window are "
        "held and restamped with their real time once it is in), drop drops it; both counted "
        "(ts_out_of_window) and logged once per change"
    )
    replay_give_up_s: float = Field(
        180.0, gt=0, le=86_400, description="rackctl replay stops after this long without progress "
        "(REFERENCE §8 InfluxDB retries: give up after 180 s); its cursor lets a later replay "
        "resume. The daemon's writer never gives up: the spool keeps the data"
    )

    @model_validator(mode="after")
    def _retry(self) -> TsdbSettings:
        if self.retry_max_s < self.retry_initial_s:
            raise ValueError("retry_max_s must be >= retry_initial_s")
        if self.api == "v1":
            if self.token_env is not None:
                raise ValueError("token_env is for api = 'v2'; InfluxDB 1.x authenticates "
                                 "with username + password_env")
            if (self.username is None) != (self.password_env is None):
                raise ValueError("api = 'v1': give both username and password_env, or neither "
                                 "(a server without auth)")
        else:
            v1_only = {k: v for k, v in (("retention_policy", self.retention_policy),
                                          ("username", self.username),
                                          ("password_env", self.password_env)) if v is not None}
            if self.database != "rackplane":
                v1_only["database"] = self.database
            if v1_only:
                raise ValueError(f"{', '.join(v1_only)} are for api = 'v1' (InfluxDB 1.x "
                                 "/write); api = 'v2' uses org, bucket and token_env")
        return self

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://[^\s/]+", v):
            raise ValueError("must be an http:// or https:// URL")
        return v


class ModbusTargetSettings(StrictModel):
    """One Modbus device (one unit): one owner task. Targets with the same host, port and
    framer (or serial port) share one connection in a daemon that passes a
    `rackplane.io.modbus.ModbusLinks` (racky does), each unit with its own bulkhead."""

    name: TopicLevel
    host: str = Field("127.0.0.1", min_length=1)
    port: int = Field(502, ge=1, le=65535)
    unit_id: int = Field(1, ge=0, le=255, description="0 is a real device over TCP (BR-06)")
    register_map: Path = Field(
        description="register-map TOML; a bare name (e.g. 'cdu-generic') is a bundled map"
    )
    poll_interval_s: float = Field(1.0, gt=0, le=3600)
    timeout_s: float = Field(1.0, gt=0, le=60)
    max_registers_per_read: int = Field(125, ge=1, le=125)
    max_gap_registers: int = Field(
        8, ge=0, le=64, description="merge reads across unimplemented gaps up to this size"
    )
    reconnect_min_s: float = Field(0.5, gt=0, le=60)
    reconnect_max_s: float = Field(30.0, gt=0, le=3600)
    framer: Literal["socket", "rtu"] = Field(
        "socket",
        description="'socket' is Modbus TCP (MBAP header); 'rtu' is RTU frames over TCP, for "
        "serial gateways in transparent mode (unit 0 is then broadcast, FIELD-CASES BR-06)",
    )
    poll_enabled: bool = Field(
        True,
        description="False for a write-only target (e.g. an RTU broadcast, unit 0): no reads",
    )
    unavailable_after_failures: int = Field(
        3, ge=1, le=100,
        description="a unit that shares its connection (same host:port) with other units is "
        "marked unavailable after this many timeouts in a row (its connection is kept; alone "
        "on a connection, a timeout replaces the connection instead, BR-07)",
    )
    dormant_reprobe_s: float = Field(
        30.0, ge=0.05, le=86_400, allow_inf_nan=False,
        description="an unavailable unit (timeouts as above, or a gateway answering exception "
        "10/11 for it: at once) is read again no more often than this, s; its points stay "
        "STALE meanwhile",
    )
    refused_reprobe_s: float = Field(
        600.0, ge=0.05, le=86_400, allow_inf_nan=False,
        description="a point the device refused alone (exception 2 illegal address, 3 illegal "
        "value) is not read again before this, s (its samples stay BAD with the refusal's "
        "reason); block reads across a refused address are split at once",
    )
    local_echo: bool = Field(
        False,
        description="RTU only: the RS-485 adapter echoes every byte sent; the echo is read "
        "back, checked against the request and discarded",
    )

    @field_validator("register_map")
    @classmethod
    def _map(cls, v: Path, info: ValidationInfo) -> Path:
        if len(v.parts) == 1 and v.suffix == "":
            return v  # bundled map name, resolved by rackplane.core.registers.load_register_map
        return resolve_path(v, info)

    @model_validator(mode="after")
    def _backoff(self) -> ModbusTargetSettings:
        if self.reconnect_max_s < self.reconnect_min_s:
            raise ValueError("reconnect_max_s must be >= reconnect_min_s")
        if self.local_echo and self.framer != "rtu":
            raise ValueError("local_echo is for RTU (RS-485) lines: it needs framer = 'rtu'")
        if self.framer == "rtu":
            if self.unit_id == 0 and self.poll_enabled:
                raise ValueError(
                    "unit_id 0 on an RTU line is the broadcast address: no device answers "
                    "reads (FIELD-CASES BR-06); give the device's own unit id, or set "
                    "poll_enabled = false for a broadcast-write target"
                )
            if self.unit_id > 247:
                raise ValueError("RTU unit ids are 1-247 (0 is broadcast; 248-255 reserved)")
        return self


Role = Literal["reader", "automation", "operator"]
"""Command roles, least to most privileged (DESIGN §1: operator > automation; reader reads)."""


class CommandSettings(StrictModel):
    """The command path (DESIGN §1 commands, §3 MQTT ``cmd/<user>/<verb>``).

    The ``<user>`` topic level is the broker username (the broker's ACL makes it unforgeable);
    its role comes from ``users`` here, never from a payload field. The defaults need no config:
    every user is a ``reader`` (``get_state`` only) until named in ``users``.
    """

    users: dict[TopicLevel, Role] = Field(
        default_factory=dict,
        description="broker username -> role (operator | automation | reader), e.g. "
        "{ alice = 'operator', bms = 'automation' }",
    )
    default_role: Role = Field("reader", description="role of a username not in `users`")
    ttl_s: float = Field(
        300.0, gt=0, le=86_400, allow_inf_nan=False,
        description="a command whose issued_at is older than this is refused as 'expired'. "
        "Long enough that QoS 1 commands queued by the broker through a short outage or a "
        "daemon restart still apply (FIELD-CASES BR-22 a); short enough that a forgotten "
        "one does not",
    )
    clock_skew_s: float = Field(
        30.0, ge=0, le=3600, allow_inf_nan=False,
        description="a command issued further than this in the future (by our wall clock) "
        "is refused as 'from_future' (a client clock far ahead would otherwise outlive ttl_s)",
    )
    max_payload_bytes: int = Field(
        16_384, ge=1024, le=262_144,
        description="larger payloads are refused ('too_large') before they are parsed",
    )
    dedup_entries: int = Field(
        1024, ge=16, le=1_000_000,
        description="(user, request_id) pairs remembered: a redelivered or repeated command is "
        "answered with its first reply and never applied twice (BR-22 a). Keep it above the "
        "number of commands expected within ttl_s",
    )
    lease_default_ttl_s: float = Field(
        600.0, gt=0, le=86_400, allow_inf_nan=False,
        description="expiry of a lease taken without ttl_s (acquire_lease): an operator who "
        "forgets to release hands the output back to automation after this long",
    )
    lease_max_ttl_s: float = Field(
        28_800.0, gt=0, le=86_400, allow_inf_nan=False,
        description="longest lease a client may ask for (8 h, the same bound as ISA-18.2 "
        "time-limited alarm shelving in rackplane.core.alarms); renew to keep it longer",
    )

    @model_validator(mode="after")
    def _lease_ttls(self) -> CommandSettings:
        if self.lease_default_ttl_s > self.lease_max_ttl_s:
            raise ValueError("lease_default_ttl_s must be <= lease_max_ttl_s")
        return self



class MetricsSettings(StrictModel):
    """Self-metrics (issue 7): tick lateness, PV age, spool depth, drops, reconnects, rejected
    commands. Always in ``state/health`` and in the time series (measurement ``daemon``);
    ``listen`` also serves them on a Prometheus ``/metrics`` endpoint (off by default)."""

    listen: str | None = Field(
        None, description='host:port of the Prometheus /metrics endpoint, e.g. '
        '"127.0.0.1:9108"; unset: no endpoint (keep it on loopback or a management network: '
        "it has no authentication)",
    )
    interval_s: float = Field(
        10.0, ge=1.0, le=300.0, allow_inf_nan=False,
        description="how often self-metrics go into the time series",
    )

    @field_validator("listen")
    @classmethod
    def _host_port(cls, v: str | None) -> str | None:
        if v is None:
            return v
        parse_listen(v)
        return v


def parse_listen(value: str) -> tuple[str, int]:
    """``"host:port"`` (IPv6 as ``"[::1]:9108"``) -> (host, port).

    Raises:
        ValueError: no port, a port outside 0..65535, or an empty host.
    """
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"must be host:port with a port 0-65535 (0: any free port), not {value!r}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not host:
        raise ValueError(f"must name a host (e.g. 127.0.0.1:{port}), not {value!r}")
    return host, int(port)


class LogSettings(StrictModel):
    """Logging: console renderer on a TTY, JSON lines otherwise (``format = 'auto'``)."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "console", "json"] = "auto"


def environment_checks(mqtt: MqttSettings, tsdb: TsdbSettings) -> dict[str, str | None]:
    """Key paths of the env vars a daemon's config names (for `check_environment`)."""
    return {"mqtt.password_env": mqtt.password_env, "tsdb.token_env": tsdb.token_env,
            "tsdb.password_env": tsdb.password_env}


def default_spool_directory(daemon: str, identity: Identity) -> Path:
    """The spool folder when ``spool.directory`` is unset: one per daemon and rack,
    ``spool/<daemon>-<site>-<row>-<rack>`` (relative: the working directory, or
    ``$STATE_DIRECTORY`` under systemd)."""
    return Path("spool") / f"{daemon}-{identity.site}-{identity.row}-{identity.rack}"


def effective_spool(spool: SpoolSettings, environ: dict[str, str] | None = None, *,
                    daemon: str | None = None,
                    identity: Identity | None = None) -> SpoolSettings:
    """The spool settings with the folder the daemon uses: `default_spool_directory` when
    unset (``daemon`` and ``identity`` needed then); under systemd (``$STATE_DIRECTORY``) a
    relative folder lives in the state dir (`rackplane.paths.in_state_directory`).

    Raises:
        ValueError: ``spool.directory`` unset and ``daemon`` or ``identity`` not given.
    """
    directory = spool.directory
    if directory is None:
        if daemon is None or identity is None:
            raise ValueError("spool.directory is unset: effective_spool needs the daemon "
                             "name and identity to name its default folder")
        directory = default_spool_directory(daemon, identity)
    directory = in_state_directory(directory, environ)
    if directory != spool.directory:
        return spool.model_copy(update={"directory": directory})
    return spool


def spool_folder(spool: SpoolSettings, *, daemon: str, identity: Identity,
                 environ: dict[str, str] | None = None) -> Path:
    """The folder the daemon ``daemon`` spools to (`effective_spool`'s ``directory``)."""
    directory = effective_spool(spool, environ, daemon=daemon, identity=identity).directory
    assert directory is not None  # effective_spool names the default folder
    return directory


class DaemonSettings(StrictModel):
    """The sections every daemon's config file starts with (`rackplane.daemon.DaemonFrame`
    reads them); a daemon's model adds its own after them."""

    identity: Identity = Identity()
    log: LogSettings = LogSettings()
    mqtt: MqttSettings = MqttSettings()
    tsdb: TsdbSettings = TsdbSettings()
    spool: SpoolSettings = SpoolSettings()
    metrics: MetricsSettings = Field(
        default_factory=MetricsSettings,
        description="self-metrics: state/health, time series, optional Prometheus /metrics")
