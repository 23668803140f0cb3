"""Config models shared by both daemons: identity, MQTT, time series, spool, Modbus targets.

These are pure pydantic models (no I/O library imported here), composed by each daemon's own
config model. Paths given relative to a config file are resolved against that file's folder
(the loader passes ``base_dir`` in the validation context).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from rackplane.config import StrictModel

# A topic level and a tag value: no MQTT wildcards or separators, no control characters.
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")


def resolve_path(value: Path, info: ValidationInfo) -> Path:
    """Resolve a relative path against the config file's folder (``base_dir`` in context)."""
    base = (info.context or {}).get("base_dir")
    if value.is_absolute() or base is None:
        return value
    return (Path(base) / value).resolve()


class Identity(StrictModel):
    """Where this daemon sits: the first MQTT topic levels and the time-series tags."""

    site: str = "lab"
    row: str = "row1"
    rack: str = "rack1"

    @field_validator("site", "row", "rack")
    @classmethod
    def _topic_safe(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError(
                "must be 1-64 characters of letters, digits, '_', '.', ':' or '-', starting "
                "with a letter or digit (it is an MQTT topic level and a time-series tag)"
            )
        return v


class TlsSettings(StrictModel):
    """TLS for the MQTT connection. Files are PEM."""

    ca_file: Path
    cert_file: Path | None = None
    key_file: Path | None = None

    _resolve = field_validator("ca_file", "cert_file", "key_file")(resolve_path)

    @model_validator(mode="after")
    def _pair(self) -> TlsSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together (client certificate auth)")
        return self


class MqttSettings(StrictModel):
    """Broker connection. The password comes from the environment variable ``password_env``."""

    host: str = "127.0.0.1"
    port: int = Field(1883, ge=1, le=65535)
    protocol: Literal["3.1.1", "5"] = "5"
    client_id: str | None = Field(
        None, description="fixed client id; default '<daemon>-<site>-<rack>'"
    )
    username: str | None = None
    password_env: str | None = Field(None, description="name of the env var holding the password")
    tls: TlsSettings | None = None
    keepalive_s: int = Field(15, ge=5, le=3600)
    clean_session: bool = Field(
        False,
        description="False keeps a persistent session so QoS 1 commands queued while the "
        "daemon is away are delivered (FIELD-CASES BR-22)",
    )
    session_expiry_s: int = Field(3600, ge=0, description="MQTT v5 session expiry interval")
    reconnect_min_s: float = Field(0.5, gt=0)
    reconnect_max_s: float = Field(5.0, gt=0)
    topic_root: str = "rackplane"
    telemetry_queue_max: int = Field(
        10_000, ge=10, description="outgoing QoS 0 telemetry kept while disconnected; the "
        "oldest is dropped and counted beyond this (state and alarms are never dropped)"
    )

    @model_validator(mode="after")
    def _backoff(self) -> MqttSettings:
        if self.reconnect_max_s < self.reconnect_min_s:
            raise ValueError("reconnect_max_s must be >= reconnect_min_s")
        return self


class SpoolSettings(StrictModel):
    """The on-disk telemetry spool (and, with no database configured, the embedded store)."""

    directory: Path = Path("spool")
    max_bytes: int = Field(
        512 * 2**20, ge=2**20, description="bound on the whole spool; the oldest segments "
        "are removed (and counted) beyond it"
    )
    segment_bytes: int = Field(8 * 2**20, ge=4096)
    fsync_interval_s: float = Field(1.0, gt=0, le=60)

    _resolve = field_validator("directory")(resolve_path)

    @model_validator(mode="after")
    def _sizes(self) -> SpoolSettings:
        if self.segment_bytes * 2 > self.max_bytes:
            raise ValueError("max_bytes must hold at least two segments (2 * segment_bytes)")
        return self


class TsdbSettings(StrictModel):
    """InfluxDB v2 write API target. ``url = None`` keeps everything in the spool only."""

    url: str | None = Field(None, description="e.g. http://influx:8086; None: embedded store")
    org: str = "rackplane"
    bucket: str = "rackplane"
    token_env: str | None = Field(None, description="env var holding the API token")
    batch_lines: int = Field(1000, ge=1, le=100_000)
    flush_interval_s: float = Field(1.0, gt=0, le=60)
    timeout_s: float = Field(10.0, gt=0, le=120)
    retry_initial_s: float = Field(1.0, gt=0)
    retry_max_s: float = Field(30.0, gt=0)
    stop_budget_s: float = Field(
        5.0, ge=0, description="time allowed at shutdown to drain the spool; the rest is "
        "sent after restart. Keep it below systemd's TimeoutStopSec"
    )

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://[^\s/]+", v):
            raise ValueError("must be an http:// or https:// URL")
        return v


class ModbusTargetSettings(StrictModel):
    """One Modbus TCP device: one owner task, one connection."""

    name: str
    host: str = "127.0.0.1"
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
    reconnect_min_s: float = Field(0.5, gt=0)
    reconnect_max_s: float = Field(30.0, gt=0)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError("device name must be topic/tag safe (letters, digits, _ . : -)")
        return v

    @field_validator("register_map")
    @classmethod
    def _map(cls, v: Path, info: ValidationInfo) -> Path:
        if len(v.parts) == 1 and v.suffix == "":
            return v  # bundled map name, resolved by rackplane.registers.load_register_map
        return resolve_path(v, info)

    @model_validator(mode="after")
    def _backoff(self) -> ModbusTargetSettings:
        if self.reconnect_max_s < self.reconnect_min_s:
            raise ValueError("reconnect_max_s must be >= reconnect_min_s")
        return self


class LogSettings(StrictModel):
    """Logging: console renderer on a TTY, JSON lines otherwise (``format = 'auto'``)."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "console", "json"] = "auto"
