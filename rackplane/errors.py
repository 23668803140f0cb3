"""Typed errors shared by the runtime. Adapters raise these, never library exceptions."""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "CommandError",
    "ConfigError",
    "ModbusConnectionError",
    "ModbusDecodeError",
    "ModbusError",
    "ModbusExceptionResponse",
    "ModbusTimeout",
    "MqttError",
    "RackplaneError",
    "SpoolError",
    "TsdbError",
    "TsdbRejected",
    "WriteFenced",
    "WriteRejected",
]


class RackplaneError(Exception):
    """Base of every error this project raises on purpose."""


class ConfigError(RackplaneError):
    """Invalid configuration. ``str()`` names the file and every failing key path."""

    def __init__(self, message: str, *, path: str | None = None, problems: list[str] | None = None):
        self.path = path
        self.problems = problems or []
        super().__init__(message)


# --- Modbus -------------------------------------------------------------------------------


class ModbusError(RackplaneError):
    """A Modbus transaction failed. ``reason`` is a short machine-readable code."""

    reason = "modbus_error"


class ModbusTimeout(ModbusError):
    """No (valid) reply within the timeout."""

    reason = "timeout"


class ModbusConnectionError(ModbusError):
    """Not connected, connection refused or lost."""

    reason = "not_connected"


class ModbusExceptionResponse(ModbusError):
    """The device answered with a Modbus exception (function code | 0x80).

    Attributes:
        code: the exception code (1 illegal function, 2 illegal data address, 3 illegal data
            value, 4 server device failure, 6 server busy, 10 gateway path unavailable,
            11 gateway target failed to respond).
    """

    NAMES: ClassVar[dict[int, str]] = {
        1: "illegal_function",
        2: "illegal_data_address",
        3: "illegal_data_value",
        4: "server_device_failure",
        5: "acknowledge",
        6: "server_busy",
        8: "memory_parity_error",
        10: "gateway_path_unavailable",
        11: "gateway_target_no_response",
    }

    def __init__(self, code: int, message: str = ""):
        self.code = code
        self.reason = self.NAMES.get(code, f"exception_{code}")
        super().__init__(message or f"Modbus exception {code} ({self.reason})")


class ModbusDecodeError(ModbusError):
    """A reply could not be decoded as the register map says (wrong length, bad type)."""

    reason = "decode_error"


class WriteRejected(RackplaneError):
    """A write was refused before reaching the device (limits, not writable, unknown point)."""


class WriteFenced(WriteRejected):
    """A write refused because this instance of a redundant pair does not hold the leadership
    lease now (standby, or past its renew deadline: `rackplane.core.leadership`)."""


# --- MQTT / commands ------------------------------------------------------------------------


class MqttError(RackplaneError):
    """MQTT publish or subscribe failed (not connected, broker refused)."""


class CommandError(RackplaneError):
    """A command was refused. ``code`` goes into the reply's ``error.code``."""

    def __init__(self, code: str, message: str):
        self.code = code
        super().__init__(message)


# --- Time series ----------------------------------------------------------------------------


class TsdbError(RackplaneError):
    """Writing to the time-series database failed."""


class TsdbRejected(TsdbError):
    """The database rejected a batch as invalid (HTTP 4xx): never retried."""

    def __init__(self, status: int, message: str):
        self.status = status
        super().__init__(f"HTTP {status}: {message}")


class SpoolError(RackplaneError):
    """The on-disk spool cannot be written or read (disk full, unwritable, corrupt)."""
