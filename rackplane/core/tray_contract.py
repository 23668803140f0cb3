"""The node-agent contract v1: one ``telemetry/trayNN`` message per compute tray per interval
(1 s), as a node agent (or the virtual rack, `sims.telemetry.tray_payloads`) publishes it and
racky reads it (`racky.core.telemetry.TelemetryIngest`); and the command side's constants
(``set_power_limits``: caps with a TTL and the sender's epoch; the args model is
`sims.telemetry.SetPowerLimitsArgs`). docs/CONTRACTS.md "Node-agent contract v1" is the
interface for third-party agents.

Only what an agent on a real tray can observe is in the telemetry (per-GPU power,
temperatures and T.Limit margin, clock-event (throttle) reasons, utilisation, the enforced
caps and limits, link counters with their widths, leak states and sensor faults, uptime and
boot id, the agent's own timestamp ``ts_ns``); never simulator truth (plant time, demand,
cold-plate fouling: the simulator publishes those on its own topic, ``sim/telemetry/truth``).

Versioning: every message carries ``schema_version`` ``"MAJOR.MINOR"`` (this is
`SCHEMA_VERSION`). A different MAJOR is refused (`UnsupportedVersion`). A newer MINOR may add
fields: racky accepts such a message, ignores the fields it does not know and reports their
key paths (`DecodedTray.ignored`); a message of this MINOR or older with an unknown field is
refused (it is a mistake, not an extension). Wrong types and missing required fields are
refused whatever the version.

These models are the one definition of the payload: the simulator validates against them, the
``sim.telemetry.tray`` JSON Schema is generated from them (``rackctl schemas
--write``), and racky keeps the agent block as an `AgentStruct`. racky does not run
pydantic per message (a 13 kB message every few ms): it decodes and type-checks with msgspec
Structs generated from these models (`decode_tray`, `convert_tray`: one definition, the
Structs cannot drift), refuses a payload whole naming the key path, and additionally refuses
the out-of-range values the field descriptions name (non-finite numbers, negative powers, a
``ts_ns`` outside [0, 2**63), a repeated GPU index, a missing counter it keeps;
docs/CONTRACTS.md). This module is the only importer of msgspec.

Units are in the field names (W, W/s, °C, K, s, MB/s, bytes/s). A value that is not known is
``null`` (JSON has no NaN). Tray and GPU indices are 0-based (GPU ``g`` is on tray
``g // gpus_per_tray``). Link ports are per GPU, columnar (`PortBlock`): one list per quantity,
one entry per port in ``names`` order, counters unsigned in their native widths
(``counter_bits``).
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

import msgspec
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rackplane.core.envelope import CommandArgs

__all__ = [
    "AGENT_GPU_MAX_POWER_LIMIT_W",
    "AGENT_SAFE_GPU_CAP_W",
    "CAP_FIELDS",
    "CLOCK_EVENT_REASONS",
    "COMMAND_TTL_MAX_S",
    "COMMAND_TTL_MIN_S",
    "GPU_POWER_LIMIT_PLAUSIBLE_MAX_W",
    "PAIR_EPOCH_BASE",
    "POWER_CAP_REASONS",
    "RACKY_CAP_TTL_S",
    "RELEASABLE_FIELDS",
    "SCHEMA_MAJOR",
    "SCHEMA_MINOR",
    "SCHEMA_VERSION",
    "THERMAL_REASONS",
    "AgentStruct",
    "AgentTelemetry",
    "DecodedTray",
    "GpuTelemetry",
    "NotJsonError",
    "PortBlock",
    "SetPowerLimitsArgs",
    "TrayShapeError",
    "TrayStruct",
    "TrayTelemetry",
    "UnsupportedVersion",
    "command_epoch",
    "convert_tray",
    "decode_json",
    "decode_tray",
    "encode_tray",
    "is_tray_struct",
    "no_null_defaults",
    "parse_version",
    "struct_to_builtins",
    "unknown_fields",
]

RACKY_CAP_TTL_S = 60.0
"""The TTL racky gives the caps it sends to the node agents, s: an agent releases a cap racky
stopped refreshing this long after the last command that set it. Shared because rlc's re-grant
rule waits this long after a rack's lease expired (`rlc.core.leases.LeaseTiming`)."""

AGENT_SAFE_GPU_CAP_W = 200.0
"""The default per-GPU safe cap, W: what a node agent holds from its start until racky's first
command and whenever racky's caps expire (tray-agent ``[caps] safe_gpu_cap_w``), and what racky
assumes of its agents in fleet mode (racky ``[fleet] agent_safe_gpu_cap_w``). One constant so
the two defaults agree: Σ of a default rack's safe caps (72 GPUs × 200 W × 1.486 + 3.6 kW ≈
25 kW) fits the default rack floor (`rackplane.core.budget_leases.DEFAULT_RACK_FLOOR_W`).
200 W is the lowest limit a B200 accepts (racky's ``node_agents.gpu_min_power_limit_w``): an
agent clamps a lower one up. Each agent states its own in its telemetry (``safe_gpu_cap_w``,
since 1.2), so racky checks what its agents really do against what it assumes."""

AGENT_GPU_MAX_POWER_LIMIT_W = 1200.0
"""The default highest per-GPU power limit a node agent's GPUs accept, W (tray-agent ``[caps]
gpu_max_power_limit_w``): a B200's 1,200 W TGP (REFERENCE §1.1; racky's
``node_agents.gpu_tgp_w``). Every per-GPU cap or limit in the agent's config must be at most
this (a host of GB300s at 1.4 kW says so): above it a value is a typo the GPUs would only be
clamped from."""

GPU_POWER_LIMIT_PLAUSIBLE_MAX_W = 3000.0
"""The highest per-GPU power limit any GPU plausibly has, W: B200 1.2 kW, GB300 1.4 kW, Rubin
≈1.8-2.3 kW per GPU (REFERENCE §1.1); the same window as racky's plausibility bound of a GPU's
power (``gpu_power_w`` ≤ 3,000 W). The static bound of ``gpu_max_power_limit_w``."""

SCHEMA_MAJOR = 1
SCHEMA_MINOR = 3
SCHEMA_VERSION = f"{SCHEMA_MAJOR}.{SCHEMA_MINOR}"
"""The contract version this code speaks (telemetry ``schema_version``, command args too)."""

CLOCK_EVENT_REASONS = ("gpu_idle", "applications_clocks_setting", "sw_power_cap",
                       "hw_slowdown", "sync_boost", "sw_thermal_slowdown",
                       "hw_thermal_slowdown", "hw_power_brake_slowdown",
                       "display_clock_setting")
"""The clock-event (throttle) reason names of ``throttle_reasons``: NVML's
``nvmlClocksEventReason*`` bits (0x1 ... 0x100, in this order) in snake case. Other names are
accepted and ignored (a newer driver may report more)."""

THERMAL_REASONS = frozenset({"hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown"})
"""Reasons racky counts as a (thermal / hardware) slowdown of the GPU."""

POWER_CAP_REASONS = frozenset({"sw_power_cap"})
"""Reasons that say the GPU is held at its enforced power limit (racky infers demand >= cap)."""

CAP_FIELDS = ("power_cap_w", "gpu_power_cap_w")
"""The command fields that expire at the command's ``ttl_s``."""

RELEASABLE_FIELDS = ("power_cap_w", "gpu_power_cap_w", "ramp_up_w_per_s", "ramp_down_w_per_s")
"""The limits a command may remove by naming them in ``release`` (never by ``null``)."""

COMMAND_TTL_MIN_S = 1.0
COMMAND_TTL_MAX_S = 3600.0
"""The range of a command's ``ttl_s``, s."""

PAIR_EPOCH_BASE = 2**62
"""Where a redundant pair's command epochs start (docs/CONTRACTS.md "Command epochs"): one
instance's epoch is its start time in ms since the Unix epoch (about 1.8e12 in 2027, below
2**62 until the year 146 million), a pair member's is ``2**62 + `` its lease epoch (the
JetStream revision of its acquisition, monotonic per bucket, < 2**62). So every pair epoch
is newer than every single-instance epoch, a takeover is newer than its predecessor, and a
single instance restarted later is newer than its earlier start."""


def command_epoch(start_ms: int, lease_epoch: int) -> int:
    """The epoch a sender's commands carry: ``start_ms`` (ms since the Unix epoch, the
    sender's start) for a single instance (``lease_epoch`` 0), else ``PAIR_EPOCH_BASE +
    lease_epoch`` (a pair member holding the lease of that epoch).

    Raises:
        ValueError: ``start_ms`` not in [0, 2**62) or ``lease_epoch`` not in [0, 2**62)
            (neither happens on a real clock or bucket; the epoch spaces would overlap).
    """
    if not 0 <= lease_epoch < PAIR_EPOCH_BASE:
        raise ValueError(f"lease epoch {lease_epoch} is not in [0, 2**62)")
    if lease_epoch:
        return PAIR_EPOCH_BASE + lease_epoch
    if not 0 <= start_ms < PAIR_EPOCH_BASE:
        raise ValueError(f"start time {start_ms} ms is not in [0, 2**62)")
    return start_ms


_VERSION_RE = re.compile(r"^(0|[1-9][0-9]{0,5})\.(0|[1-9][0-9]{0,5})$")


def parse_version(v: str) -> tuple[int, int] | None:
    """``"MAJOR.MINOR"`` as (major, minor); None when ``v`` is not of that form."""
    m = _VERSION_RE.fullmatch(v)
    return None if m is None else (int(m.group(1)), int(m.group(2)))


class _Payload(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PortBlock(_Payload):
    """One GPU's link ports, columnar: every list has one entry per port, in ``names`` order.
    racky refuses non-finite and negative rates and BER, and counters outside [0, 2**64)."""

    names: list[str] = Field(description="port names, unique within the rack (e.g. gpu07/nvl03)")
    nvlink: list[bool] = Field(description="true: an NVLink port; false: a NIC port")
    link_up: list[bool] = Field(description="link state (NVLink: active)")
    speed_mb_per_s: list[float] = Field(description="line speed per direction, MB/s (0 while "
                                        "down); >= 0")
    tx_bytes_per_s: list[float] = Field(description="sent over the last interval, bytes/s; >= 0")
    rx_bytes_per_s: list[float] = Field(description="received over the last interval, bytes/s; "
                                        ">= 0")
    ber: list[float | None] = Field(description="pre-FEC bit error ratio since the last counter "
                                    "reset, >= 0; null: unknown")
    cable_temp_c: list[float | None] | None = Field(
        None, description="cable / transceiver temperature, °C, where the port reports one; "
        "null: unknown")
    counters: dict[str, list[int]] = Field(
        description="counter name -> one unsigned integer per port, in [0, 2**bits)")
    counter_bits: dict[str, int] | None = Field(
        None, description="counter name -> its native width in bits (8, 16, 32 or 64): the "
        "counter wraps (or saturates) at 2**bits − 1; null / absent: not stated")


class GpuTelemetry(_Payload):
    """One GPU of a tray, as the agent reads it (NVML / DCGM)."""

    gpu: int = Field(description="rack-wide GPU index, 0-based, on this tray")
    power_w: float = Field(description="drawn power, W, >= 0")
    temp_c: float | None = Field(description="junction temperature, °C; null: unknown")
    t_limit_c: float | None = Field(
        description="T.Limit margin, K: T_maxop − Tj (REFERENCE §1.6); null: unknown")
    throttle_reasons: list[str] = Field(
        description="active clock-event reasons (NVML nvmlClocksEventReason*, snake case: "
        "gpu_idle, applications_clocks_setting, sw_power_cap, hw_slowdown, sync_boost, "
        "sw_thermal_slowdown, hw_thermal_slowdown, hw_power_brake_slowdown, "
        "display_clock_setting); [] none; unknown names are ignored")
    shut_down: bool = Field(description="the GPU shut itself down (thermal) or fell off the bus")
    utilization: float | None = Field(
        None, description="busy fraction over the last interval, 0..1 (NVML utilization.gpu / "
        "100); null: unknown")
    uptime_s: float | None = Field(None, description="s since the GPU's last reset; null: "
                                   "unknown")
    boot_id: int | None = Field(None, description="changes on every reset of the GPU, "
                                "unsigned 64-bit; null: unknown")
    ports: PortBlock | None = Field(None, description="the GPU's link ports; null / absent: "
                                    "not read")
    # contract 1.1 (optional): what racky's cap-drift classification and the operators need
    power_kind: str | None = Field(
        None, description="since 1.1: which figure power_w is: instant (instantaneous "
        "reading), average (the driver's 1 s average, NVML power usage on current GPUs), "
        "energy (the energy counter's increase over the interval); null: not stated")
    energy_mj: int | None = Field(
        None, description="since 1.1: the GPU's energy counter, mJ, unsigned 64-bit (NVML "
        "total energy consumption; restarts with the driver); null: not read")
    power_limit_w: float | None = Field(
        None, description="since 1.1: this GPU's enforced power limit read back, W, >= 0; "
        "null: not read")
    power_limit_min_w: float | None = Field(
        None, description="since 1.1: the device's lowest settable power limit, W, >= 0; "
        "null: not read")
    power_limit_max_w: float | None = Field(
        None, description="since 1.1: the device's highest settable power limit, W, >= 0; "
        "null: not read")
    power_limit_default_w: float | None = Field(
        None, description="since 1.1: the device's default power limit, W, >= 0; null: not "
        "read")
    # contract 1.2 (optional): the GPU's health events (NVML ECC totals and Xid events)
    ecc_corrected_volatile: int | None = Field(
        None, description="since 1.2: corrected device-memory ECC errors since the driver "
        "loaded (NVML volatile total), unsigned 64-bit; null: not read (ECC off or not "
        "offered)")
    ecc_uncorrected_volatile: int | None = Field(
        None, description="since 1.2: uncorrected device-memory ECC errors since the driver "
        "loaded (NVML volatile total), unsigned 64-bit; null: not read (ECC off or not "
        "offered)")
    xid_total: int | None = Field(
        None, description="since 1.2: Xid critical errors the agent saw for this GPU since "
        "the agent started (NVML nvmlEventTypeXidCriticalError), unsigned 64-bit; null: the "
        "source offers no Xid events")
    xids: list[int] | None = Field(
        None, description="since 1.2: the Xid numbers seen since the tray's previous message, "
        "oldest first, at most 16 (xid_total counts them all); null: the source offers no "
        "Xid events")


class AgentTelemetry(_Payload):
    """The tray's node agent as it reports itself: the caps it enforces and the settings in
    force (per-GPU watts and W/s, REFERENCE §1.3). ``null`` caps and ramp limits: none set
    (reporting only; a command never uses null, it names what to ``release``). racky keeps
    this block of every accepted tray message."""

    model_config = ConfigDict(frozen=True)

    enforced_gpu_cap_w: float = Field(description="per-GPU power limit in force, W, >= 0")
    enforced_tray_cap_w: float = Field(description="the same as a tray figure, W, >= 0")
    floor_w: float = Field(description="per-GPU power floor in force, W, >= 0")
    power_cap_w: float | None = Field(description="tray cap set, W, >= 0; null: none")
    gpu_power_cap_w: float | None = Field(description="per-GPU cap set, W, >= 0; null: none")
    power_floor_pct: float = Field(description="per-GPU floor set, % of TGP, >= 0")
    ramp_up_w_per_s: float | None = Field(description="per-GPU ramp-up limit, W/s, >= 0; null: "
                                          "none")
    ramp_down_w_per_s: float | None = Field(description="per-GPU ramp-down limit, W/s, >= 0; "
                                            "null: none")
    ramp_down_hysteresis_s: float = Field(description="hold before a ramp-down, s, >= 0")
    capping: bool = Field(description="a cap holds some GPU below what it would draw")
    flooring: bool = Field(description="the floor makes some GPU draw more than it would")
    ramp_limited: bool = Field(description="a ramp limit holds some GPU away from its target")
    epoch: int | None = Field(None, description="newest command epoch the agent has seen "
                              "(older ones are dropped); null: no command yet")
    cap_expires_in_s: float | None = Field(
        None, description="s until the caps set expire (their command's ttl_s), >= 0; null: "
        "no cap set")
    cap_enforceable: bool | None = Field(
        None, description="since 1.1: false: this agent cannot apply caps (it reads the tray "
        "only, e.g. through DCGM): its enforced figures are what it reads, no command changes "
        "them; null: not stated")
    cap_clamped: bool | None = Field(
        None, description="since 1.1: a GPU's limit had to be moved into the device's "
        "[min, max] limits (the enforced figures are the clamped ones); null: not stated")
    safe_gpu_cap_w: float | None = Field(
        None, description="since 1.2: the per-GPU limit this agent falls to when its caps "
        "expire (and holds from its start until the first command), W, >= 0, as it would "
        "enforce it (raised to the device's lowest settable limit); null: not stated, or the "
        "agent cannot apply caps")


class TrayTelemetry(_Payload):
    """``telemetry/trayNN``: one compute tray, its agent and GPUs (one message per tray per
    interval). racky refuses a message whose ``ts_ns`` is not newer than the tray's last."""

    model_config = ConfigDict(title="node-agent telemetry/tray (contract v1)")

    schema_version: str = Field(description="contract version MAJOR.MINOR, e.g. \"1.0\"; "
                                "racky refuses another MAJOR")
    ts_ns: int = Field(description="the agent's wall-clock timestamp, ns since the epoch, in "
                       "[0, 2**63)")
    site: str
    row: str
    rack: str
    tray: int = Field(description="tray index, 0-based (the topic's NN)")
    powered: bool = Field(description="tray power on")
    power_w: float = Field(description="tray input power, W, >= 0")
    coolant_out_temp_c: float = Field(description="tray coolant outlet temperature, °C")
    leak: bool = Field(description="the tray's leak sensor reads wet")
    leak_sensor_fault: bool = Field(description="the tray's leak sensor is faulted (its leak "
                                    "reading means nothing)")
    agent: AgentTelemetry
    gpus: list[GpuTelemetry] = Field(description="every GPU of the tray, one entry each")


# --- the same contract as msgspec Structs (racky's decoder) ----------------------------------


class NotJsonError(ValueError):
    """Bytes that are not one JSON value (not UTF-8, malformed, NaN / Infinity literals, a
    number beyond a double's range, nesting deeper than msgspec's recursion limit); the
    message says where."""


class TrayShapeError(ValueError):
    """JSON that is not a `TrayTelemetry` (a wrong type, a missing required field, an unknown
    field in a message of this contract's minor version or older, an integer beyond a
    double's range in a float field); the message names the key path (msgspec's, e.g.
    ``$.gpus[0].power_w``)."""


class UnsupportedVersion(ValueError):
    """A message of another major contract version (or a ``schema_version`` that is not
    ``MAJOR.MINOR``); the message says which."""


class DecodedTray(NamedTuple):
    """A decoded tray message: the `TrayStruct` and the key paths of the fields it carried that
    this contract does not know (only ever non-empty for a newer minor version), e.g.
    ``gpus[].fan_rpm``."""

    struct: Any
    ignored: frozenset[str]


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


def _struct_of(model: type[BaseModel], structs: dict[type[BaseModel], Any], *,
               lenient: bool = False) -> Any:
    """A msgspec Struct with ``model``'s fields (same names, types, defaults, ``extra=forbid``
    as unknown fields forbidden unless ``lenient``, ``frozen`` kept)."""
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    for name, info in model.model_fields.items():
        typ = _msgspec_type(info.annotation, structs)
        fields.append((name, typ) if info.is_required() else (name, typ, info.default))
    struct = msgspec.defstruct(
        f"{model.__name__}{'Lenient' if lenient else ''}Struct", fields, module=__name__,
        kw_only=True,
        forbid_unknown_fields=not lenient and model.model_config.get("extra") == "forbid",
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

# a newer minor version: the same Structs with unknown fields ignored (the agent block is
# the strict one's type: racky keeps it as an `AgentStruct`, and its unknown fields are dropped
# by the lenient decode all the same)
_LENIENT: dict[type[BaseModel], Any] = {}
_struct_of(PortBlock, _LENIENT, lenient=True)
_struct_of(GpuTelemetry, _LENIENT, lenient=True)
_struct_of(AgentTelemetry, _LENIENT, lenient=True)
_TrayLenientStruct: Any = _struct_of(TrayTelemetry, _LENIENT, lenient=True)


class _VersionOnly(msgspec.Struct):
    schema_version: Any = None


_TRAY_DECODER = msgspec.json.Decoder(TrayStruct)
_LENIENT_DECODER = msgspec.json.Decoder(_TrayLenientStruct)
_VERSION_DECODER = msgspec.json.Decoder(_VersionOnly)
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


def _version_of(v: object) -> tuple[int, int] | None:
    """The (major, minor) of a ``schema_version`` value; None when it is not a string (the
    Struct decode names that)."""
    if not isinstance(v, str):
        return None
    mm = parse_version(v)
    if mm is None:
        raise UnsupportedVersion(f"schema_version {v!r} is not MAJOR.MINOR (this reader speaks "
                                 f"{SCHEMA_VERSION}) - at `$.schema_version`")
    if mm[0] != SCHEMA_MAJOR:
        raise UnsupportedVersion(f"schema_version {v!r}: major version {mm[0]} is not "
                                 f"supported (this reader speaks {SCHEMA_MAJOR}.x)")
    return mm


def unknown_fields(obj: Any, model: type[BaseModel] = TrayTelemetry, path: str = ""
                   ) -> set[str]:
    """Key paths of the fields in plain JSON ``obj`` that ``model`` (and its nested models)
    does not define: ``name``, ``agent.name``, ``gpus[].name``, ``gpus[].ports.name``."""
    out: set[str] = set()
    if not isinstance(obj, Mapping):
        return out
    fields = model.model_fields
    for k, v in obj.items():
        info = fields.get(k)
        if info is None:
            out.add(f"{path}{k}")
            continue
        sub = _model_in(info.annotation)
        if sub is None:
            continue
        if isinstance(v, list):
            for x in v:
                out |= unknown_fields(x, sub, f"{path}{k}[].")
        else:
            out |= unknown_fields(v, sub, f"{path}{k}.")
    return out


def _model_in(ann: Any) -> type[BaseModel] | None:
    """The model an annotation holds (``X``, ``X | None``, ``list[X]``), if any."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for a in typing.get_args(ann):
        m = _model_in(a)
        if m is not None:
            return m
    return None


def _lenient_retry(strict_err: msgspec.ValidationError, src: bytes | object) -> DecodedTray:
    """After the strict decode refused ``src``: a clearer refusal for another major version,
    or, for a newer minor version, the lenient decode with the ignored fields listed."""
    try:
        if isinstance(src, bytes):
            v = _VERSION_DECODER.decode(src).schema_version
        else:
            v = src.get("schema_version") if isinstance(src, Mapping) else None
    except (msgspec.DecodeError, RecursionError):
        raise _shape_error(strict_err, src) from None
    mm = _version_of(v)
    if mm is None or mm[1] <= SCHEMA_MINOR:
        raise _shape_error(strict_err, src)
    try:
        if isinstance(src, bytes):
            m = _LENIENT_DECODER.decode(src)
            plain = _JSON_DECODER.decode(src)
        else:
            m = msgspec.convert(src, _TrayLenientStruct)
            plain = src
    except msgspec.ValidationError as err:
        raise TrayShapeError(str(err)) from None
    return DecodedTray(_as_strict(m), frozenset(unknown_fields(plain)))


def _as_strict(m: Any) -> Any:
    """A lenient `_TrayLenientStruct` as the strict `TrayStruct` (same fields)."""
    return msgspec.convert(msgspec.to_builtins(m), TrayStruct)


def decode_tray(raw: bytes) -> DecodedTray:
    """A ``telemetry/trayNN`` message's bytes as a `TrayStruct` (and the unknown fields of a
    newer minor version): decoded and type-checked in one pass (msgspec 0.23, ~25 µs for a
    13 kB tray message). Strict like pydantic's strict mode, except that an int is accepted
    for a float field (as JSON does); integers are not range-checked (racky does that);
    NaN / Infinity are not JSON and are refused. A message of a newer minor version with
    fields this contract does not know is decoded a second time with them ignored (and a
    third, generically, to name them): slower, only for newer agents.

    Duplicate keys are not detected (msgspec reads the last one; detecting them would need a
    second parse): the last value of a repeated key wins.

    Raises:
        NotJsonError: not JSON (see there).
        UnsupportedVersion: another major version, or a version that is not MAJOR.MINOR.
        TrayShapeError: JSON of the wrong shape, naming the key path.
    """
    try:
        m = _TRAY_DECODER.decode(raw)
    except msgspec.ValidationError as err:  # also an integer beyond a double in a float field
        return _lenient_retry(err, raw)
    except msgspec.DecodeError as err:
        raise NotJsonError(str(err)) from None
    except RecursionError:  # msgspec raises it for very deep nesting (100k levels)
        raise NotJsonError("nesting too deep") from None
    _version_of(m.schema_version)
    return DecodedTray(m, frozenset())


_ENCODER = msgspec.json.Encoder()


def encode_tray(payload: Any) -> bytes:
    """A ``telemetry/trayNN`` payload (plain JSON objects: dicts, lists, str, int, float, bool,
    None) as compact UTF-8 JSON, as a node agent sends it: msgspec's encoder, ~5x faster than
    ``json.dumps`` for a 13 kB tray message. The bytes decode to the same values as
    `rackplane.core.topics.encode_json`'s (keys in the dict's order; floats in their shortest
    round-trip form, an exponent written ``1e16`` rather than ``1e+16``).

    Unlike ``encode_json`` a NaN or infinite float is written as ``null`` (msgspec has no
    ``allow_nan=False``): the caller keeps non-finite values out (the contract has none; the
    lock-step harness checks before encoding).

    Raises:
        TypeError: a value that is not JSON (msgspec's error is a TypeError).
    """
    return _ENCODER.encode(payload)


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


def convert_tray(obj: Any) -> DecodedTray:
    """Already-decoded JSON (a dict, as the lock-step runner passes the simulator's payloads)
    as a `TrayStruct` (and the unknown fields of a newer minor version), with the same
    strictness as `decode_tray` (but a float NaN / inf in ``obj`` passes: the caller checks
    finiteness).

    Raises:
        UnsupportedVersion: another major version, or a version that is not MAJOR.MINOR.
        TrayShapeError: the wrong shape, naming the key path.
    """
    try:
        m = msgspec.convert(obj, TrayStruct)
    except msgspec.ValidationError as err:
        return _lenient_retry(err, obj)
    except RecursionError:
        raise TrayShapeError("nesting too deep") from None
    _version_of(m.schema_version)
    return DecodedTray(m, frozenset())


def is_tray_struct(obj: object) -> bool:
    """``obj`` is a `TrayStruct` (as `decode_tray` returns in `DecodedTray.struct`)."""
    return type(obj) is TrayStruct


def struct_to_builtins(obj: Any) -> Any:
    """A Struct (or containers of them) back as plain JSON-like objects (every field, nulls
    included)."""
    return msgspec.to_builtins(obj)


# --- commands: set_power_limits args, shared by every agent and sender -----------------------


def no_null_defaults(schema: dict[str, Any]) -> None:
    """Drop ``"default": null`` from the properties of a model whose optional fields may be
    left out but never be null (a null default would read as "null allowed")."""
    for prop in schema.get("properties", {}).values():
        if prop.get("default", 0) is None:
            del prop["default"]


class SetPowerLimitsArgs(CommandArgs):
    """``set_power_limits`` args of the node-agent contract v1 (docs/CONTRACTS.md), the one
    definition every side reads: a field left out keeps its value; ``null`` is never a value
    (refused); a cap or ramp limit is removed by naming it in ``release``; ``epoch`` is the
    sender's; a command that sets a cap carries ``ttl_s``. The simulator's agents
    (`sims.telemetry`) and `trayagent.contract` subclass it with their own title and
    docstring (their JSON Schemas' descriptions).

    Raises:
        pydantic.ValidationError: a field out of its bounds, null, a limit both set and
            released, a cap without ``ttl_s``."""

    # validate_default off: a field left out is None (absent), never a value; a null sent is
    # refused by the field's type
    model_config = ConfigDict(strict=True, title="set_power_limits args (node-agent "
                              "contract v1)", json_schema_extra=no_null_defaults,
                              validate_default=False)

    schema_version: str = Field(pattern=r"^1\.(0|[1-9][0-9]{0,5})$",
                                description="contract version, MAJOR.MINOR (major 1)")
    trays: list[int] = Field(min_length=1, max_length=64, description="0-based tray indices")
    epoch: int = Field(ge=0, le=2**63 - 1, description="the sender's epoch: grows with every "
                       "start of the sender (racky: its start time, ms since the Unix epoch; "
                       "one of a pair: 2**62 + its lease epoch, `command_epoch`)")
    ttl_s: float = Field(None, ge=COMMAND_TTL_MIN_S, le=COMMAND_TTL_MAX_S,  # type: ignore[assignment]
                         allow_inf_nan=False, description="the caps set expire this long "
                         "after the agent applied the command, s (required with a cap)")
    power_cap_w: float = Field(None, gt=0, allow_inf_nan=False,  # type: ignore[assignment]
                               description="whole-tray cap, W")
    gpu_power_cap_w: float = Field(None, gt=0, allow_inf_nan=False,  # type: ignore[assignment]
                                   description="per-GPU cap, W")
    power_floor_pct: float = Field(None, ge=0, le=100,  # type: ignore[assignment]
                                   allow_inf_nan=False, description="per-GPU floor, % of TGP")
    ramp_up_w_per_s: float = Field(None, gt=0, allow_inf_nan=False,  # type: ignore[assignment]
                                   description="per-GPU ramp-up limit, W/s")
    ramp_down_w_per_s: float = Field(None, gt=0, allow_inf_nan=False,  # type: ignore[assignment]
                                     description="per-GPU ramp-down limit, W/s")
    ramp_down_hysteresis_s: float = Field(None, ge=0, le=3600,  # type: ignore[assignment]
                                          allow_inf_nan=False, description="hold before "
                                          "ramp-down, s")
    powered: bool = Field(None, description="tray power on/off")  # type: ignore[assignment]
    release: list[Literal["power_cap_w", "gpu_power_cap_w", "ramp_up_w_per_s",
                          "ramp_down_w_per_s"]] = Field(
        default_factory=list, max_length=4,
        description="limits to remove (no cap / no ramp limit); never also set in the command")

    @model_validator(mode="after")
    def _consistent(self) -> SetPowerLimitsArgs:
        given = self.model_fields_set
        if len(set(self.release)) != len(self.release):
            raise ValueError("release names a limit twice")
        both = sorted(set(self.release) & given)
        if both:
            raise ValueError(f"{both} both set and released")
        if given & set(CAP_FIELDS) and "ttl_s" not in given:
            raise ValueError("a cap needs ttl_s")
        return self
