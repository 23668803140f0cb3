"""The node-agent tray telemetry contract: one ``telemetry/trayNN`` message per compute tray
per interval (1 s), as a node agent (or the virtual rack, `sims.telemetry.tray_payloads`)
publishes it and racky reads it (`racky.core.telemetry.TelemetryIngest`).

These models are the one definition of the payload: the simulator validates against them, the
``sim.telemetry.tray`` JSON Schema is generated from them (``python -m sims.telemetry
--write-schemas``; docs/CONTRACTS.md), and racky keeps the agent block as an `AgentStruct`
(the same fields; racky never imports ``sims``). racky does not run pydantic per message (a
13 kB message every few ms): it decodes and type-checks with msgspec Structs generated from
these models (`decode_tray`, `convert_tray`: one definition, the Structs cannot drift),
refuses a payload whole naming the key path (any missing required field, wrong type or
unknown field), and additionally refuses non-finite numbers, negative powers (marked below),
negative agent figures, a ``ts_ns`` outside [0, 2**63), a repeated GPU index and a missing
counter of those it keeps (docs/CONTRACTS.md). This module is the only importer of msgspec.

Units are in the field names (W, W/s, °C, s, MB/s, bytes/s). A value that is not known is
``null`` (JSON has no NaN). Tray and GPU indices are 0-based (GPU ``g`` is on tray
``g // gpus_per_tray``). Link ports are per GPU, columnar (`PortBlock`): one list per quantity,
one entry per port in ``names`` order, counters in their native widths (unsigned, < 2**64).
"""

from __future__ import annotations

import types
import typing
from typing import Any

import msgspec
from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = ["AgentStruct", "AgentTelemetry", "GpuTelemetry", "NotJsonError", "PortBlock",
           "TrayShapeError", "TrayStruct", "TrayTelemetry", "convert_tray", "decode_json",
           "decode_tray", "is_tray_struct", "struct_to_builtins"]


class _Payload(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PortBlock(_Payload):
    """One GPU's link ports, columnar: every list has one entry per port, in ``names`` order
    (`sims.fabric.LinkFabric.snapshot`; counters in their native widths). racky refuses
    non-finite and negative rates and BER, and counters outside [0, 2**64)."""

    names: list[str]
    nvlink: list[bool]
    link_up: list[bool]
    speed_mb_per_s: list[float]
    tx_bytes_per_s: list[float]
    rx_bytes_per_s: list[float]
    ber: list[float | None] = Field(description="pre-FEC BER since the last reset; null: unknown")
    cable_temp_c: list[float | None] | None = Field(
        None, description="cable / transceiver temperature where the port reports one; null: "
        "unknown (the simulator sends none)")
    counters: dict[str, list[int]]


class GpuTelemetry(_Payload):
    """One GPU of a tray."""

    gpu: int = Field(description="rack-wide GPU index, 0-based")
    power_w: float = Field(description="drawn (after throttling); racky refuses < 0")
    demand_w: float = Field(description="what the workload asked; racky refuses < 0")
    request_w: float = Field(description="what the node agent let through")
    temp_c: float = Field(description="junction temperature")
    plate_temp_c: float
    t_limit_c: float = Field(description="T.Limit margin = T_maxop − Tj (REFERENCE §1.6)")
    throttled: bool
    shut_down: bool
    traffic: float = Field(description="offered link traffic, 0..1")
    uptime_s: float | None = None
    boot_id: int | None = None
    ports: PortBlock | None = None


class AgentTelemetry(_Payload):
    """The tray's node agent as it reports itself: the caps it enforces and the settings in
    force (`sims.rack.NodeAgentStatus`; per-GPU watts and W/s, REFERENCE §1.3). ``null``
    caps and ramp limits: none set. racky keeps this block of every accepted tray message."""

    model_config = ConfigDict(frozen=True)

    enforced_gpu_cap_w: float
    enforced_tray_cap_w: float
    floor_w: float
    power_cap_w: float | None
    gpu_power_cap_w: float | None
    power_floor_pct: float
    ramp_up_w_per_s: float | None
    ramp_down_w_per_s: float | None
    ramp_down_hysteresis_s: float
    capping: bool
    flooring: bool
    ramp_limited: bool


class TrayTelemetry(_Payload):
    """``telemetry/trayNN``: one compute tray, its agent and GPUs (one message per tray per
    interval). racky refuses a message whose ``ts_ns`` is not newer than the tray's last."""

    model_config = ConfigDict(title="sim telemetry/tray")

    ts_ns: int = Field(description="wall-clock timestamp, ns since the epoch")
    t_s: float = Field(description="plant time, s since the scenario started")
    site: str
    row: str
    rack: str
    tray: int
    powered: bool
    power_w: float = Field(description="racky refuses < 0")
    coolant_out_temp_c: float
    leak: bool
    leak_sensor_fault: bool
    cold_plate_conductance_factor: float = Field(description="1 = clean (simulator truth)")
    agent: AgentTelemetry
    gpus: list[GpuTelemetry]


# --- the same contract as msgspec Structs (racky's decoder) ----------------------------------


class NotJsonError(ValueError):
    """Bytes that are not one JSON value (not UTF-8, malformed, NaN / Infinity literals, a
    number beyond a double's range, nesting deeper than msgspec's recursion limit); the
    message says where."""


class TrayShapeError(ValueError):
    """JSON that is not a `TrayTelemetry` (a wrong type, a missing required or an unknown
    field, an integer beyond a double's range in a float field); the message names the key
    path (msgspec's, e.g. ``$.gpus[0].power_w``)."""


def _msgspec_type(ann: Any, structs: dict[type[BaseModel], Any]) -> Any:
    """A pydantic field annotation with its models replaced by their Structs."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return structs[ann]
    origin = typing.get_origin(ann)
    if origin is None:
        return ann
    args = tuple(_msgspec_type(a, structs) for a in typing.get_args(ann))
    if origin in (types.UnionType, typing.Union):
        return typing.Union[args]  # noqa: UP007 - built from a tuple of types
    return origin[args if len(args) > 1 else args[0]]


def _struct_of(model: type[BaseModel], structs: dict[type[BaseModel], Any]) -> Any:
    """A msgspec Struct with ``model``'s fields (same names, types, defaults, ``extra=forbid``
    as unknown fields forbidden, ``frozen`` kept)."""
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    for name, info in model.model_fields.items():
        typ = _msgspec_type(info.annotation, structs)
        fields.append((name, typ) if info.is_required() else (name, typ, info.default))
    struct = msgspec.defstruct(
        f"{model.__name__}Struct", fields, module=__name__, kw_only=True,
        forbid_unknown_fields=model.model_config.get("extra") == "forbid",
        frozen=bool(model.model_config.get("frozen")))
    structs[model] = struct
    return struct


_STRUCTS: dict[type[BaseModel], Any] = {}
PortBlockStruct: Any = _struct_of(PortBlock, _STRUCTS)
GpuStruct: Any = _struct_of(GpuTelemetry, _STRUCTS)
if typing.TYPE_CHECKING:  # to mypy the Struct is the model: same fields, keyword construction
    AgentStruct = AgentTelemetry
else:
    AgentStruct = _struct_of(AgentTelemetry, _STRUCTS)
    """`AgentTelemetry` as a frozen msgspec Struct (keyword construction, same attributes,
    no validation on construction)."""
TrayStruct: Any = _struct_of(TrayTelemetry, _STRUCTS)
"""`TrayTelemetry` as a msgspec Struct, generated from the models above (the types are
``Any`` to mypy: they are built at import time)."""

_TRAY_DECODER = msgspec.json.Decoder(TrayStruct)
_JSON_DECODER = msgspec.json.Decoder()


def _shape_error(err: msgspec.ValidationError, src: bytes | object) -> TrayShapeError:
    """msgspec's message, or, where it elides a dict key (``$.gpus[3].ports.counters[...][4]``),
    the pydantic contract's first error with the full key path (strict mode; only run on a
    refused message)."""
    text = str(err)
    if "[...]" in text:
        try:
            if isinstance(src, bytes):
                TrayTelemetry.model_validate_json(src, strict=True)
            else:
                TrayTelemetry.model_validate(src, strict=True)
        except ValidationError as perr:
            first = perr.errors()[0]
            path = "$" + "".join(f"[{k}]" if isinstance(k, int) else f".{k}"
                                 for k in first["loc"])
            text = f"{first['msg']} - at `{path}`"
        except Exception:  # keep msgspec's message (e.g. nesting too deep)
            pass
    return TrayShapeError(text)


def decode_tray(raw: bytes) -> Any:
    """A ``telemetry/trayNN`` message's bytes as a `TrayStruct`: decoded and type-checked in
    one pass (msgspec 0.23, ~25 µs for a 13 kB tray message). Strict like pydantic's strict
    mode, except that an int is accepted for a float field (as JSON does); integers are not
    range-checked (racky does that); NaN / Infinity are not JSON and are refused.

    Duplicate keys are not detected (msgspec reads the last one; detecting them would need a
    second parse): the last value of a repeated key wins.

    Raises:
        NotJsonError: not JSON (see there).
        TrayShapeError: JSON of the wrong shape, naming the key path.
    """
    try:
        return _TRAY_DECODER.decode(raw)
    except msgspec.ValidationError as err:  # also an integer beyond a double in a float field
        raise _shape_error(err, raw) from None
    except msgspec.DecodeError as err:
        raise NotJsonError(str(err)) from None
    except RecursionError:  # msgspec raises it for very deep nesting (100k levels)
        raise NotJsonError("nesting too deep") from None


def decode_json(raw: bytes) -> Any:
    """Any JSON value as Python objects (dict, list, str, int, float, bool, None).

    Raises:
        NotJsonError: not JSON (see there).
    """
    try:
        return _JSON_DECODER.decode(raw)
    except msgspec.DecodeError as err:  # ValidationError too: a number beyond a double
        raise NotJsonError(str(err)) from None
    except RecursionError:  # msgspec raises it for very deep nesting (100k levels)
        raise NotJsonError("nesting too deep") from None


def convert_tray(obj: Any) -> Any:
    """Already-decoded JSON (a dict, as the lock-step runner passes the simulator's payloads)
    as a `TrayStruct`, with the same strictness as `decode_tray` (but a float NaN / inf in
    ``obj`` passes: the caller checks finiteness).

    Raises:
        TrayShapeError: the wrong shape, naming the key path.
    """
    try:
        return msgspec.convert(obj, TrayStruct)
    except msgspec.ValidationError as err:
        raise _shape_error(err, obj) from None
    except RecursionError:
        raise TrayShapeError("nesting too deep") from None


def is_tray_struct(obj: object) -> bool:
    """``obj`` is a `TrayStruct` (as `decode_tray` returns)."""
    return type(obj) is TrayStruct


def struct_to_builtins(obj: Any) -> Any:
    """A Struct (or containers of them) back as plain JSON-like objects (every field, nulls
    included)."""
    return msgspec.to_builtins(obj)
