"""Modbus register maps as validated data: decode, encode and read planning (pure).

Nothing here does I/O, reads a clock or imports pymodbus: `rackplane.io.modbus` (the daemon's
owner task) and `sims.modbus_face` (the simulators' server) both build on these functions, so
the daemon and the simulator read the same map the same way (DESIGN §4).

Register map TOML (format defined by ``config/registers/cdu-generic.toml``)::

    [device]
    name = "cdu-generic"          # topic/tag safe
    description = "..."
    default_order = "ABCD"        # applies to multi-register types without their own `order`

    [[points]]
    name = "supply_temp_c"        # time-series field name: lower-case snake case, unit in name
    table = "input"               # holding FC03/06/16, input FC04, coil FC01/05, discrete FC02
    address = 0                   # 0-based protocol address ("30001" only in comments)
    type = "float32"              # int16 uint16 int32 uint32 float32 int64 uint64 float64 bool
    order = "CDAB"                # see "Word and byte order" below
    scale = 1.0                   # engineering = raw * scale + offset  (scale > 0)
    offset = 0.0
    unit = "degC"
    valid_min = -10.0             # outside [valid_min, valid_max] -> Quality.OUT_OF_RANGE
    valid_max = 95.0
    sentinels = [0x8000]          # raw "no sensor" values -> Quality.BAD, reason "sentinel"
    writable = false              # only holding / coil; requires write_min / write_max
    write_min = 0.0               # every write is refused outside these (engineering units)
    write_max = 100.0

Word and byte order (exact definition). Take the value's big-endian byte string: ``A B C D``
for 32-bit types (A most significant), ``A B C D E F G H`` for 64-bit types. An order is two
independent properties:

========  ===================  =====================  ==============================
order     word order           bytes in each word     32-bit registers / 64-bit
========  ===================  =====================  ==============================
ABCD      high word first      as sent (big-endian)   [AB, CD] / [AB, CD, EF, GH]
CDAB      low word first       as sent                [CD, AB] / [GH, EF, CD, AB]
BADC      high word first      swapped                [BA, DC] / [BA, DC, FE, HG]
DCBA      low word first       swapped                [DC, BA] / [HG, FE, DC, BA]
========  ===================  =====================  ==============================

So for 64-bit types "CDAB" means *low word first* (word order 4-3-2-1, what pymodbus calls
``word_order="little"`` and Modbus Poll "little-endian byte swap"), the analogue of the 32-bit
word swap of FIELD-CASES BR-01; it is not the "3412" half swap. 16-bit types have one word:
only the byte-swap part can apply, and only when the point sets ``order`` itself (BADC or
DCBA); the device's ``default_order`` applies to multi-register types only, so a device whose
floats are DCBA never has its int16 registers byte-swapped by accident.

Sentinels are compared with the raw *unsigned* value after the order is undone: the 16-bit
register for 16-bit types (0x8000, not -32768), the whole 32/64-bit unsigned integer for wider
types (for floats: the IEEE bit pattern, e.g. 0x7FC00000).

Values are Python floats (``Sample.value``): 64-bit integer points beyond 2**53 lose precision.

Read planning merges points of one table into requests of at most 125 registers or 2000 bits
(MODBUS Application Protocol Specification V1.1b3 §6.1-6.4) and at most the device's own
limit, across unimplemented gaps of at most ``max_gap`` addresses. What a device rejected is
remembered in a `ReadMemory` (FIELD-CASES BR-05): exception 2 marks the gap addresses of the
failed request as never to be covered again (or, without gaps, reads those points alone);
exception 3 shrinks the request size along `SHRINK_LADDER`.
"""

from __future__ import annotations

import importlib.resources
import itertools
import math
import re
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import Field, field_validator, model_validator

from rackplane.config import StrictModel, read_toml, validate_data
from rackplane.core.samples import Quality, Sample, good, invalid, make_sample
from rackplane.errors import ConfigError, WriteRejected

Table = Literal["holding", "input", "coil", "discrete"]
DataType = Literal[
    "int16", "uint16", "int32", "uint32", "float32", "int64", "uint64", "float64", "bool"
]
WordOrder = Literal["ABCD", "CDAB", "BADC", "DCBA"]

TABLES: tuple[Table, ...] = get_args(Table)
BIT_TABLES: frozenset[str] = frozenset({"coil", "discrete"})
REGISTER_TABLES: frozenset[str] = frozenset({"holding", "input"})

#: Registers per value of each type (a bool is one register, or one bit in a bit table).
TYPE_WORDS: Mapping[str, int] = {
    "int16": 1, "uint16": 1, "bool": 1,
    "int32": 2, "uint32": 2, "float32": 2,
    "int64": 4, "uint64": 4, "float64": 4,
}
_SIGNED = frozenset({"int16", "int32", "int64"})
_FLOATS = frozenset({"float32", "float64"})
_WORD_SWAP = frozenset({"CDAB", "DCBA"})
_BYTE_SWAP = frozenset({"BADC", "DCBA"})

#: Read function code of each table (Modbus spec §6.1-6.4).
READ_FUNCTION: Mapping[str, int] = {"coil": 1, "discrete": 2, "holding": 3, "input": 4}

#: Protocol limits per read request: 125 registers (FC03/FC04), 2000 bits (FC01/FC02),
#: MODBUS Application Protocol Specification V1.1b3 §6.1-6.4.
MAX_READ_REGISTERS = 125
MAX_READ_BITS = 2000

#: Request sizes tried after an exception 3 (illegal data value) on a multi-point read: the
#: next value below the rejected count. Common device limits (125 protocol maximum, 120, 100,
#: 64 ...) come first so a device limited to 100 (FIELD-CASES BR-05) is found exactly.
SHRINK_LADDER: tuple[int, ...] = (125, 120, 100, 64, 50, 32, 16, 8, 4, 2, 1)

#: |value| below this from a float point is taken as a probable byte/word-order
#: misconfiguration (FIELD-CASES BR-01: 1.0 read with the wrong word order is ~2.3e-41).
TINY_FLOAT_ABS = 1e-30

_POINT_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_DEVICE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
_REL_TOL = 1e-9


# --- models ----------------------------------------------------------------------------------


class DeviceInfo(StrictModel):
    """The ``[device]`` table of a register map."""

    name: str
    description: str = ""
    default_order: WordOrder = "ABCD"

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _DEVICE_NAME_RE.match(v):
            raise ValueError(
                "must be 1-64 characters of letters, digits, '_', '.', ':' or '-', starting "
                "with a letter or digit (it is a topic level and a tag value)"
            )
        return v


class PointSpec(StrictModel):
    """One point of a register map (see the module docstring for the TOML keys).

    ``order`` is always concrete once the point belongs to a validated `RegisterMap` (the
    device's ``default_order`` is filled in for multi-register types).
    """

    name: str
    table: Table
    address: int = Field(ge=0, le=65535, description="0-based protocol address")
    type: DataType
    order: WordOrder = "ABCD"
    scale: float = Field(1.0, gt=0, allow_inf_nan=False)
    offset: float = Field(0.0, allow_inf_nan=False)
    unit: str = ""
    description: str = ""
    valid_min: float | None = Field(None, allow_inf_nan=False)
    valid_max: float | None = Field(None, allow_inf_nan=False)
    sentinels: tuple[int, ...] = ()
    writable: bool = False
    write_min: float | None = Field(None, allow_inf_nan=False)
    write_max: float | None = Field(None, allow_inf_nan=False)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _POINT_NAME_RE.match(v):
            raise ValueError(
                "point names are time-series field names and topic levels: 1-64 characters "
                "of lower-case letters, digits and '_', starting with a letter"
            )
        return v

    @model_validator(mode="after")
    def _consistent(self) -> PointSpec:
        width = 1 if self.table in BIT_TABLES else TYPE_WORDS[self.type]
        if self.address + width - 1 > 65535:
            raise ValueError(
                f"address {self.address} + {width} registers runs past 65535"
            )
        if self.table in BIT_TABLES and self.type != "bool":
            raise ValueError(f"a {self.table} point holds one bit: type must be 'bool'")
        if self.type == "bool" and (self.scale != 1.0 or self.offset != 0.0):
            raise ValueError("a bool point has no scale or offset")
        if self.writable and self.table not in ("holding", "coil"):
            raise ValueError(f"only holding and coil points can be writable, not {self.table}")
        if (
            self.valid_min is not None
            and self.valid_max is not None
            and self.valid_min > self.valid_max
        ):
            raise ValueError("valid_min must be <= valid_max")
        if self.writable and self.type != "bool" and (
            self.write_min is None or self.write_max is None
        ):
            raise ValueError("a writable point needs write_min and write_max")
        if (self.write_min is not None or self.write_max is not None) and not self.writable:
            raise ValueError("write_min / write_max given on a point that is not writable")
        if self.write_min is not None and self.write_max is not None:
            if self.write_min > self.write_max:
                raise ValueError("write_min must be <= write_max")
            lo = -math.inf if self.valid_min is None else self.valid_min
            hi = math.inf if self.valid_max is None else self.valid_max
            if self.write_min < lo or self.write_max > hi:
                raise ValueError(
                    f"write limits [{self.write_min}, {self.write_max}] must lie inside the "
                    f"valid range [{self.valid_min}, {self.valid_max}]"
                )
        bits = 16 * TYPE_WORDS[self.type]
        for s in self.sentinels:
            if self.type == "bool":
                raise ValueError("a bool point cannot have sentinels")
            if not 0 <= s < 2**bits:
                raise ValueError(
                    f"sentinel {s} does not fit {self.type}: give the raw unsigned value "
                    f"(0 .. {2**bits - 1:#x}), e.g. 0x8000 for an int16 -32768"
                )
        return self

    @property
    def words(self) -> int:
        """Registers the point occupies (1 for a bit-table point: one bit)."""
        return 1 if self.table in BIT_TABLES else TYPE_WORDS[self.type]

    @property
    def end(self) -> int:
        """Last address the point occupies (inclusive)."""
        return self.address + self.words - 1


class RegisterMap(StrictModel):
    """A validated register map: ``[device]`` and ``[[points]]``.

    Validation (errors name the key path): unique point names; no two points of one table
    share a register; bit tables hold only bools; writable only on holding/coil, with write
    limits inside the valid range; sentinels fit the type width; names are topic/field safe.
    """

    device: DeviceInfo
    points: tuple[PointSpec, ...] = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _fill_orders(cls, data: Any) -> Any:
        """Give multi-register points without ``order`` the device's ``default_order``."""
        if not isinstance(data, dict):
            return data
        device = data.get("device")
        points = data.get("points")
        default = device.get("default_order", "ABCD") if isinstance(device, dict) else "ABCD"
        if not isinstance(points, list | tuple):
            return data
        filled: list[Any] = []
        for p in points:
            if isinstance(p, dict) and "order" not in p:
                words = TYPE_WORDS.get(str(p.get("type")), 1)
                if words > 1 and p.get("table") not in BIT_TABLES:
                    p = {**p, "order": default}
            filled.append(p)
        return {**data, "points": filled}

    @model_validator(mode="after")
    def _cross_point(self) -> RegisterMap:
        problems: list[str] = []
        seen: dict[str, int] = {}
        for i, p in enumerate(self.points):
            if p.name in seen:
                problems.append(
                    f"points[{i}].name: duplicate point name {p.name!r} "
                    f"(first at points[{seen[p.name]}])"
                )
            else:
                seen[p.name] = i
        for table in TABLES:
            spans = sorted(
                (p.address, p.end, i, p.name)
                for i, p in enumerate(self.points)
                if p.table == table
            )
            for (a0, e0, i0, n0), (a1, e1, i1, n1) in itertools.pairwise(spans):
                if a1 <= e0:
                    problems.append(
                        f"points[{i1}].address: {n1!r} ({table} {a1}-{e1}) overlaps "
                        f"points[{i0}] {n0!r} ({table} {a0}-{e0})"
                    )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @cached_property
    def by_name(self) -> Mapping[str, PointSpec]:
        """Points by name."""
        return {p.name: p for p in self.points}

    def point(self, name: str) -> PointSpec:
        """The point called ``name``.

        Raises:
            KeyError: no such point (the message lists nothing else: maps can be large).
        """
        try:
            return self.by_name[name]
        except KeyError:
            raise KeyError(f"register map {self.device.name!r} has no point {name!r}") from None


# --- loading ---------------------------------------------------------------------------------


def bundled_register_maps() -> list[str]:
    """Names of the register maps shipped in ``rackplane_config/registers``."""
    folder = importlib.resources.files("rackplane_config") / "registers"
    return sorted(
        e.name[: -len(".toml")] for e in folder.iterdir() if e.name.endswith(".toml")
    )


def parse_register_map(data: dict[str, Any], source: str = "<register map>") -> RegisterMap:
    """Validate a parsed TOML mapping into a `RegisterMap`.

    Raises:
        ConfigError: every problem, as ``<source>: <key.path>: <message>``.
    """
    return validate_data(RegisterMap, data, source)


def load_register_map(ref: str | Path) -> RegisterMap:
    """Load a register map.

    Args:
        ref: a bare name (one path part, no suffix, e.g. ``"cdu-generic"``) is a bundled map,
            ``rackplane_config/registers/<name>.toml`` (found with importlib.resources, so it
            works from a checkout and from an installed wheel); anything else is a file path.

    Raises:
        ConfigError: unknown bundled name (the available ones are listed), file missing or
            unreadable, invalid TOML, or any validation problem (file and key path named).
    """
    p = Path(ref)
    if len(p.parts) == 1 and p.suffix == "":
        resource = importlib.resources.files("rackplane_config") / "registers" / f"{p.name}.toml"
        if not resource.is_file():
            raise ConfigError(
                f"no bundled register map {p.name!r}; bundled maps: "
                f"{', '.join(bundled_register_maps()) or '(none)'}",
                path=str(ref),
            )
        with importlib.resources.as_file(resource) as real:
            return parse_register_map(read_toml(real), str(real))
    return parse_register_map(read_toml(p), str(p))


# --- decode / encode -------------------------------------------------------------------------


def _to_words(raw_u: int, words: int, order: WordOrder) -> list[int]:
    """Unsigned integer -> registers in wire order."""
    data = raw_u.to_bytes(2 * words, "big")
    regs = [data[2 * i : 2 * i + 2] for i in range(words)]
    if order in _BYTE_SWAP:
        regs = [w[::-1] for w in regs]
    if order in _WORD_SWAP:
        regs.reverse()
    return [int.from_bytes(w, "big") for w in regs]


def _from_words(regs: Sequence[int], order: WordOrder) -> int:
    """Registers in wire order -> unsigned integer."""
    ws = [int(r).to_bytes(2, "big") for r in regs]
    if order in _WORD_SWAP:
        ws.reverse()
    if order in _BYTE_SWAP:
        ws = [w[::-1] for w in ws]
    return int.from_bytes(b"".join(ws), "big")


def raw_from_registers(point: PointSpec, regs: Sequence[int]) -> int:
    """The point's raw unsigned value from its registers (wire order undone).

    Raises:
        ValueError: wrong number of registers, or a register outside 0..0xFFFF.
    """
    if len(regs) != point.words:
        raise ValueError(f"{point.name}: expected {point.words} registers, got {len(regs)}")
    if any(not 0 <= int(r) <= 0xFFFF for r in regs):
        raise ValueError(f"{point.name}: register value outside 0..0xFFFF in {list(regs)}")
    if point.table in BIT_TABLES:
        return 1 if regs[0] else 0
    return _from_words(regs, point.order)


def raw_to_registers(point: PointSpec, raw_u: int) -> list[int]:
    """Registers (wire order) carrying the raw unsigned value ``raw_u``.

    Raises:
        ValueError: ``raw_u`` does not fit the type width.
    """
    bits = 16 * point.words
    if not 0 <= raw_u < 2**bits:
        raise ValueError(f"{point.name}: raw value {raw_u} does not fit {bits} bits")
    if point.table in BIT_TABLES:
        return [1 if raw_u else 0]
    return _to_words(raw_u, point.words, point.order)


def _reciprocal(scale: float) -> int | None:
    """``n`` when ``scale`` is 1/n for an integer n >= 2 (0.1, 0.01 ...), else None."""
    inv = 1.0 / scale
    n = round(inv)
    return n if n >= 2 and abs(inv - n) <= 1e-9 * n else None


def to_engineering(point: PointSpec, number: float) -> float:
    """``number * scale + offset``; decimal scales divide (250 * 0.1 -> 25.0, 424 -> 42.4)."""
    n = _reciprocal(point.scale)
    scaled = number / n if n is not None else number * point.scale
    return scaled + point.offset


def from_engineering(point: PointSpec, value: float) -> float:
    """Inverse of `to_engineering`: ``(value - offset) / scale`` (unrounded)."""
    n = _reciprocal(point.scale)
    base = value - point.offset
    return base * n if n is not None else base / point.scale


def _shortest_float32(b: bytes) -> float:
    """The shortest decimal that is the same float32 (44.43, not 44.43000030517578).

    A device that stores 44.43 in a float32 register meant 44.43; the binary expansion's
    extra digits are noise in state payloads and logs. The result packs back to the same four
    bytes, so nothing is lost.
    """
    v = float(struct.unpack(">f", b)[0])
    if not math.isfinite(v):
        return v
    for digits in (6, 7, 8, 9):
        c = float(f"{v:.{digits}g}")
        if struct.pack(">f", c) == b:
            return c
    return v


def _typed(point: PointSpec, raw_u: int) -> float:
    """Raw unsigned -> the type's number (two's complement for signed, IEEE for floats)."""
    t = point.type
    bits = 16 * TYPE_WORDS[t]
    if t == "float32":
        return _shortest_float32(raw_u.to_bytes(4, "big"))
    if t == "float64":
        return float(struct.unpack(">d", raw_u.to_bytes(8, "big"))[0])
    if t in _SIGNED and raw_u >= 2 ** (bits - 1):
        return float(raw_u - 2**bits)
    return float(raw_u)


@dataclass(frozen=True, slots=True)
class Decoded:
    """What one point's registers mean.

    Attributes:
        value: engineering value (raw * scale + offset); ``None`` for BAD results; kept for
            OUT_OF_RANGE (diagnostics: consumers must check ``quality``).
        quality: GOOD, BAD (reasons ``sentinel``, ``nan``, ``not_boolean``, ``decode_error``)
            or OUT_OF_RANGE (reason ``out_of_range``).
        reason: why not GOOD, else ``None``.
        raw: the raw unsigned value (after the word/byte order is undone).
        suspect_order: a finite, non-zero float with |value| < `TINY_FLOAT_ABS`: probably the
            wrong byte/word order (FIELD-CASES BR-01). The quality is not changed by it; the
            adapter logs it once per point.
    """

    value: float | None
    quality: Quality
    reason: str | None
    raw: int
    suspect_order: bool = False


def decode_point(point: PointSpec, regs: Sequence[int]) -> Decoded:
    """Decode one point from its registers (or one bit, as ``[0|1]`` / ``[bool]``).

    Checks, in order: register count (BAD ``decode_error``), sentinels on the raw unsigned
    value (BAD ``sentinel``, FIELD-CASES BR-09), NaN/Inf (BAD ``nan``), bool registers other
    than 0/1 (BAD ``not_boolean``), the valid range (OUT_OF_RANGE). int16 and the other
    signed types are two's complement (BR-09: 0xFF38 with scale 0.1 is -20.0, never 6533.6).
    Never raises.
    """
    try:
        raw = raw_from_registers(point, regs)
    except ValueError:
        return Decoded(None, Quality.BAD, "decode_error", 0)
    if raw in point.sentinels:
        return Decoded(None, Quality.BAD, "sentinel", raw)
    if point.type == "bool":
        if raw not in (0, 1):
            return Decoded(None, Quality.BAD, "not_boolean", raw)
        return Decoded(float(raw), Quality.GOOD, None, raw)
    number = _typed(point, raw)
    if not math.isfinite(number):
        return Decoded(None, Quality.BAD, "nan", raw)
    value = to_engineering(point, number)
    if not math.isfinite(value):
        return Decoded(None, Quality.BAD, "nan", raw)
    suspect = point.type in _FLOATS and number != 0.0 and abs(number) < TINY_FLOAT_ABS
    if (point.valid_min is not None and value < point.valid_min) or (
        point.valid_max is not None and value > point.valid_max
    ):
        return Decoded(value, Quality.OUT_OF_RANGE, "out_of_range", raw, suspect)
    return Decoded(value, Quality.GOOD, None, raw, suspect)


def decoded_sample(point: PointSpec, d: Decoded, ts_ns: int, t_mono: float) -> Sample:
    """The `Sample` for a decoded point (OUT_OF_RANGE keeps the value for diagnostics)."""
    if d.quality is Quality.GOOD and d.value is not None:
        return good(point.name, d.value, point.unit, ts_ns, t_mono)
    if d.quality is Quality.OUT_OF_RANGE and d.value is not None:
        return Sample(point.name, d.value, point.unit, ts_ns, t_mono, d.quality, d.reason)
    return invalid(point.name, point.unit, ts_ns, t_mono, d.quality, d.reason or "bad")


def _raw_for_integer(point: PointSpec, number: int) -> int:
    """Type-range-checked integer -> raw unsigned. Raises ValueError (never wraps)."""
    bits = 16 * TYPE_WORDS[point.type]
    if point.type in _SIGNED:
        lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    else:
        lo, hi = 0, 2**bits - 1
    if not lo <= number <= hi:
        raise ValueError(
            f"{point.name}: raw {number} outside the {point.type} range {lo}..{hi}"
        )
    return number % (2**bits)


def _round_half_away(x: float) -> int:
    """Round to the nearest integer, halves away from zero (after trimming float noise)."""
    x = round(x, 9)
    a = abs(x)
    whole = math.floor(a)
    n = int(whole) + (1 if a - whole >= 0.5 else 0)
    return -n if x < 0 else n


def encode_value(point: PointSpec, value: float) -> list[int]:
    """Registers (wire order) for an engineering value; no write limits (simulator side).

    Integers are rounded to the register resolution (``scale``) half away from zero; floats
    are packed as IEEE (NaN and Inf are allowed for float types, to simulate them).

    Raises:
        ValueError: not representable in the type (out of range, non-finite for an integer
            type, overflow to Inf in float32) -- values never wrap.
    """
    if point.type == "bool":
        if value not in (0, 1):
            raise ValueError(f"{point.name}: a bool takes 0 or 1, not {value!r}")
        return raw_to_registers(point, int(value))
    if point.type in _FLOATS:
        number = from_engineering(point, value) if math.isfinite(value) else value
        if point.type == "float32":
            try:
                packed = struct.pack(">f", number)
            except OverflowError:
                raise ValueError(f"{point.name}: {value!r} overflows float32") from None
            return raw_to_registers(point, int.from_bytes(packed, "big"))
        return raw_to_registers(point, int.from_bytes(struct.pack(">d", number), "big"))
    if not math.isfinite(value):
        raise ValueError(f"{point.name}: {value!r} cannot be encoded as {point.type}")
    raw = _round_half_away(from_engineering(point, value))
    return raw_to_registers(point, _raw_for_integer(point, raw))


@dataclass(frozen=True, slots=True)
class EncodedWrite:
    """A validated write.

    Attributes:
        point: the point written.
        registers: register values in wire order (holding), or ``[0|1]`` (coil).
        value: the engineering value the device will hold (after rounding to the register
            resolution), e.g. 42.4 for a request of 42.37 with scale 0.1.
    """

    point: PointSpec
    registers: tuple[int, ...]
    value: float


def encode_write(point: PointSpec, value: float) -> EncodedWrite:
    """Validate and encode a write to ``point``.

    The value is rounded to the register resolution; if rounding lands just outside the write
    limits it steps one count back inside. The written raw value is never a sentinel.

    Raises:
        WriteRejected: not writable, not a finite number, outside [write_min, write_max], not
            representable in the type (never wraps), or equal to a sentinel.
    """
    if not point.writable:
        raise WriteRejected(f"{point.name} is not writable")
    if isinstance(value, bool):
        value = float(value)
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise WriteRejected(f"{point.name}: {value!r} is not a finite number")
    if point.type == "bool":
        if value not in (0, 1):
            raise WriteRejected(f"{point.name}: a bool takes 0 or 1, not {value!r}")
        return EncodedWrite(point, tuple(raw_to_registers(point, int(value))), float(value))
    lo = point.write_min if point.write_min is not None else -math.inf
    hi = point.write_max if point.write_max is not None else math.inf
    tol = _REL_TOL * max(1.0, abs(lo), abs(hi))
    if not lo - tol <= value <= hi + tol:
        raise WriteRejected(
            f"{point.name}: {value} {point.unit} is outside the write limits [{lo}, {hi}]"
        )
    try:
        if point.type in _FLOATS:
            regs = encode_value(point, value)
        else:
            raw = _round_half_away(from_engineering(point, value))
            eng = to_engineering(point, raw)
            if eng > hi + tol:
                raw -= 1
            elif eng < lo - tol:
                raw += 1
            eng = to_engineering(point, raw)
            if not lo - tol <= eng <= hi + tol:
                raise WriteRejected(
                    f"{point.name}: no register value within [{lo}, {hi}] near {value} "
                    f"(resolution {point.scale})"
                )
            regs = raw_to_registers(point, _raw_for_integer(point, raw))
    except ValueError as err:
        raise WriteRejected(str(err)) from None
    back = decode_point(point, regs)
    if back.reason == "sentinel":
        raise WriteRejected(f"{point.name}: {value} encodes to a sentinel (raw {back.raw:#x})")
    if back.value is None or not math.isfinite(back.value):
        raise WriteRejected(f"{point.name}: {value} cannot be represented ({back.reason})")
    return EncodedWrite(point, tuple(regs), back.value)


# --- read planning ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReadBlock:
    """One read request: ``count`` registers (or bits) of ``table`` from ``start``.

    ``points`` are the points inside, in address order; addresses in the block not occupied
    by a point are unimplemented gaps the request reads across.
    """

    table: Table
    start: int
    count: int
    points: tuple[PointSpec, ...]

    @property
    def end(self) -> int:
        """Last address read (inclusive)."""
        return self.start + self.count - 1

    @property
    def function_code(self) -> int:
        """Modbus read function code (1, 2, 3 or 4)."""
        return READ_FUNCTION[self.table]

    def gaps(self) -> list[int]:
        """Addresses read that no point occupies."""
        used: set[int] = set()
        for p in self.points:
            used.update(range(p.address, p.end + 1))
        return [a for a in range(self.start, self.end + 1) if a not in used]

    def slice_for(self, point: PointSpec, data: Sequence[int]) -> Sequence[int]:
        """The registers (or bits) of ``point`` inside the block's reply ``data``."""
        i = point.address - self.start
        return data[i : i + point.words]


@dataclass(frozen=True, slots=True)
class ReadMemory:
    """What one device taught the planner (remembered per device, FIELD-CASES BR-05).

    Attributes:
        bad: ``(table, address)`` the device rejected (exception 2): never read across again.
        isolated: point names read on their own (exception 2 on a block without gaps).
        max_registers: a reduced request size after exception 3 (``None``: not reduced).
    """

    bad: frozenset[tuple[str, int]] = frozenset()
    isolated: frozenset[str] = frozenset()
    max_registers: int | None = None


def plan_reads(
    points: Iterable[PointSpec],
    max_registers: int,
    max_gap: int,
    known_bad: ReadMemory | None = None,
    *,
    max_bits: int = MAX_READ_BITS,
) -> list[ReadBlock]:
    """Merge points into read requests.

    Points of one table are merged in address order while the request stays within the size
    limit (``max_registers`` capped at 125 and at ``known_bad.max_registers`` for register
    tables; ``max_bits`` capped at 2000 for bit tables) and each gap is at most ``max_gap``
    addresses containing no remembered bad address. Isolated points, and points occupying a
    bad address, are read alone. A point is never split; a point wider than the limit is read
    alone at its own width.

    Returns:
        Blocks ordered by table (holding, input, coil, discrete) then address; every point is
        in exactly one block.

    Raises:
        ValueError: ``max_registers`` or ``max_bits`` < 1, ``max_gap`` < 0, or two points of
            one table overlap.
    """
    if max_registers < 1 or max_bits < 1 or max_gap < 0:
        raise ValueError("max_registers and max_bits must be >= 1 and max_gap >= 0")
    memory = known_bad or ReadMemory()
    reg_limit = min(max_registers, MAX_READ_REGISTERS)
    if memory.max_registers is not None:
        reg_limit = min(reg_limit, memory.max_registers)
    bit_limit = min(max_bits, MAX_READ_BITS)
    by_table: dict[str, list[PointSpec]] = {}
    for p in points:
        by_table.setdefault(p.table, []).append(p)

    blocks: list[ReadBlock] = []
    for table in TABLES:
        pts = sorted(by_table.get(table, []), key=lambda p: p.address)
        limit = bit_limit if table in BIT_TABLES else reg_limit
        bad = sorted(a for t, a in memory.bad if t == table)
        bad_set = frozenset(bad)
        current: list[PointSpec] = []
        for p in pts:
            if current:
                first, last = current[0], current[-1]
                if p.address <= last.end:
                    raise ValueError(f"points {last.name} and {p.name} overlap in {table}")
                gap = p.address - last.end - 1
                fits = (
                    not _alone(p, memory, bad_set)
                    and not _alone(first, memory, bad_set)
                    and gap <= max_gap
                    and p.end - first.address + 1 <= limit
                    and not any(last.end < a < p.address for a in bad)
                )
                if fits:
                    current.append(p)
                    continue
                blocks.append(_block(table, current))
            current = [p]
        if current:
            blocks.append(_block(table, current))
    return blocks


def _alone(p: PointSpec, memory: ReadMemory, bad: frozenset[int]) -> bool:
    """True when ``p`` must be read on its own (isolated, or occupying a bad address)."""
    return p.name in memory.isolated or any(a in bad for a in range(p.address, p.end + 1))


def _block(table: Table, pts: list[PointSpec]) -> ReadBlock:
    start = pts[0].address
    return ReadBlock(table, start, pts[-1].end - start + 1, tuple(pts))


@dataclass(frozen=True, slots=True)
class Learned:
    """Result of `learn_from_exception`.

    Attributes:
        memory: the updated memory (the same object when nothing was learned).
        retry: True when the block's points should be planned again with ``memory`` and read
            again (the new plan avoids what failed); False when the failure belongs to the
            block's single point (mark it invalid with the exception's reason).
    """

    memory: ReadMemory
    retry: bool


def learn_from_exception(
    block: ReadBlock, code: int, memory: ReadMemory, max_registers: int
) -> Learned:
    """Update the device's `ReadMemory` after ``block`` was answered with exception ``code``.

    - 2 (illegal data address), block with gaps: its gap addresses become bad, so the same
      request is never sent again (FIELD-CASES BR-05); without gaps: its points are read alone
      from now on. A single point: nothing to learn (the point is invalid).
    - 3 (illegal data value), several points: the request size shrinks to the next
      `SHRINK_LADDER` value below ``block.count`` (never below the widest point of the block)
      and is remembered. A single point: nothing to learn.
    - any other code: nothing to learn.

    ``max_registers`` is the configured size, used when no reduced size is remembered yet.
    """
    if len(block.points) <= 1 or code not in (2, 3):
        return Learned(memory, False)
    if code == 2:
        gaps = block.gaps()
        if gaps:
            bad = memory.bad | {(block.table, a) for a in gaps}
            return Learned(ReadMemory(bad, memory.isolated, memory.max_registers), True)
        isolated = memory.isolated | {p.name for p in block.points}
        return Learned(ReadMemory(memory.bad, isolated, memory.max_registers), True)
    if block.table in BIT_TABLES:
        isolated = memory.isolated | {p.name for p in block.points}
        return Learned(ReadMemory(memory.bad, isolated, memory.max_registers), True)
    widest = max(p.words for p in block.points)
    current = min(max_registers, MAX_READ_REGISTERS)
    if memory.max_registers is not None:
        current = min(current, memory.max_registers)
    target = next((n for n in SHRINK_LADDER if n < block.count), 1)
    new_max = max(widest, min(target, current))
    if new_max >= block.count:
        # cannot shrink below this block's widest point: read its points alone instead
        isolated = memory.isolated | {p.name for p in block.points}
        return Learned(ReadMemory(memory.bad, isolated, memory.max_registers), True)
    return Learned(ReadMemory(memory.bad, memory.isolated, new_max), True)


@dataclass(slots=True)
class BlockDecode:
    """Samples decoded from one block reply, plus the points that look mis-ordered."""

    samples: list[Sample] = field(default_factory=list)
    suspect_order: list[str] = field(default_factory=list)


def samples_from_block(
    block: ReadBlock, data: Sequence[int] | Sequence[bool], ts_ns: int, t_mono: float
) -> BlockDecode:
    """Decode every point of ``block`` from the reply ``data`` (registers, or bits).

    ``data`` must hold at least ``block.count`` entries (extra bits of a coil reply padded to
    a byte are ignored). Never raises: a short reply gives BAD ``decode_error`` samples.
    Exactly ``BlockDecoder(block).decode(data, ts_ns, t_mono)``; a poller that reads the same
    block every cycle keeps the `BlockDecoder` instead of compiling it per reply.
    """
    return BlockDecoder(block).decode(data, ts_ns, t_mono)


def _decode_block_by_point(
    block: ReadBlock, values: list[int], ts_ns: int, t_mono: float
) -> BlockDecode:
    """The reference path: `decode_point` + `decoded_sample` for each point of the block."""
    out = BlockDecode()
    for p in block.points:
        chunk = block.slice_for(p, values) if len(values) >= block.count else []
        d = decode_point(p, chunk)
        out.samples.append(decoded_sample(p, d, ts_ns, t_mono))
        if d.suspect_order:
            out.suspect_order.append(p.name)
    return out


# Point kinds of the compiled decoder.
_K_BIT, _K_BOOL, _K_UNSIGNED, _K_SIGNED, _K_FLOAT32, _K_FLOAT64 = range(6)
_BAD = Quality.BAD
_OUT_OF_RANGE = Quality.OUT_OF_RANGE
_isfinite = math.isfinite
_unpack_f64 = struct.Struct(">d").unpack


def _bswap16(r: int) -> int:
    return ((r & 0xFF) << 8) | (r >> 8)


class BlockDecoder:
    """`samples_from_block` for one `ReadBlock`, compiled once (the poll hot path).

    Per point the register indices in significance order, the byte swap, the type, the
    sentinels, the scale/offset and the valid range are worked out once here; ``decode`` then
    assembles each raw value with shifts and applies the same checks, in the same order, as
    `decode_point` + `decoded_sample` (sentinel -> ``nan`` -> ``not_boolean`` ->
    OUT_OF_RANGE; two's complement for signed types, FIELD-CASES BR-09; the shortest
    float32 decimal; BR-01 suspect order), so its samples are equal to theirs (tests compare
    both on random registers of every type and order). A reply that is short or holds a value
    outside 0..0xFFFF takes the reference path point by point (BAD ``decode_error``).
    """

    __slots__ = ("_count", "_points", "block", "names")

    def __init__(self, block: ReadBlock) -> None:
        self.block = block
        #: The point names of the block in order: ``decode(...).samples[i].point == names[i]``.
        self.names: tuple[str, ...] = tuple(p.name for p in block.points)
        self._count = block.count
        pts: list[tuple[Any, ...]] = []
        for p in block.points:
            i = p.address - block.start
            idx: tuple[int, ...]
            if p.table in BIT_TABLES:
                kind, idx, swap = _K_BIT, (i,), False
            else:
                kind = {"bool": _K_BOOL, "float32": _K_FLOAT32, "float64": _K_FLOAT64}.get(
                    p.type, _K_SIGNED if p.type in _SIGNED else _K_UNSIGNED)
                idx_list = list(range(i, i + p.words))
                if p.order in _WORD_SWAP:
                    idx_list.reverse()
                idx, swap = tuple(idx_list), p.order in _BYTE_SWAP
            bits = 16 * len(idx)
            n = _reciprocal(p.scale)
            pts.append((
                p.name, p.unit, kind, idx, swap, frozenset(p.sentinels), bits,
                1 << bits, 1 << (bits - 1), n, p.scale, p.offset,
                -math.inf if p.valid_min is None else p.valid_min,
                math.inf if p.valid_max is None else p.valid_max,
            ))
        self._points = tuple(pts)

    def decode(
        self, data: Sequence[int] | Sequence[bool], ts_ns: int, t_mono: float
    ) -> BlockDecode:
        """Samples of every point of the block from the reply ``data`` (see
        `samples_from_block`: same contract, same results). Never raises."""
        values = [int(v) for v in data]
        if len(values) < self._count or (values and (min(values) < 0 or max(values) > 0xFFFF)):
            return _decode_block_by_point(self.block, values, ts_ns, t_mono)
        return self.decode_words(values, ts_ns, t_mono)

    def decode_words(self, values: Sequence[int], ts_ns: int, t_mono: float) -> BlockDecode:
        """`decode` for a reply already known to be well formed: at least ``block.count``
        ints, each 0..0xFFFF (registers), or 0/1 (bits). pymodbus' register replies are
        (unpacked as ``>H``), so a poller skips ``decode``'s copy and range check per reply;
        anything else must go through `decode`. Same samples as `decode`."""
        samples: list[Sample] = []
        append = samples.append
        suspect_order: list[str] = []
        for (name, unit, kind, idx, swap, sentinels, bits, span, half, n, scale, offset, lo,
             hi) in self._points:
            if kind == _K_BIT:
                append(make_sample(name, 1.0 if values[idx[0]] else 0.0, unit, ts_ns, t_mono))
                continue
            if bits == 16:
                raw = values[idx[0]]
                if swap:
                    raw = ((raw & 0xFF) << 8) | (raw >> 8)
            elif swap:
                raw = 0
                for j in idx:
                    raw = (raw << 16) | _bswap16(values[j])
            elif bits == 32:
                raw = (values[idx[0]] << 16) | values[idx[1]]
            else:
                raw = 0
                for j in idx:
                    raw = (raw << 16) | values[j]
            if sentinels and raw in sentinels:
                append(make_sample(name, None, unit, ts_ns, t_mono, _BAD, "sentinel"))
                continue
            if kind == _K_UNSIGNED:
                number = float(raw)
            elif kind == _K_SIGNED:
                number = float(raw - span) if raw >= half else float(raw)
            elif kind == _K_FLOAT32:
                number = _shortest_float32(raw.to_bytes(4, "big"))
            elif kind == _K_FLOAT64:
                number = float(_unpack_f64(raw.to_bytes(8, "big"))[0])
            else:  # _K_BOOL: 0/1 only, no scale, no range
                if raw > 1:
                    append(make_sample(name, None, unit, ts_ns, t_mono, _BAD, "not_boolean"))
                else:
                    append(make_sample(name, float(raw), unit, ts_ns, t_mono))
                continue
            value = (number / n if n is not None else number * scale) + offset
            if not _isfinite(value) or not _isfinite(number):
                append(make_sample(name, None, unit, ts_ns, t_mono, _BAD, "nan"))
                continue
            if kind >= _K_FLOAT32 and number != 0.0 and abs(number) < TINY_FLOAT_ABS:
                suspect_order.append(name)
            if value < lo or value > hi:
                append(make_sample(name, value, unit, ts_ns, t_mono, _OUT_OF_RANGE,
                                   "out_of_range"))
            else:
                append(make_sample(name, value, unit, ts_ns, t_mono))
        return BlockDecode(samples, suspect_order)
