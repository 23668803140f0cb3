"""Decode registers into values with their quality, and encode values into registers (word
and byte order, scale and offset, sentinels, limits; the `rackplane.core.registers`
docstring defines them).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from rackplane.core.registers.maps import (
    _BYTE_SWAP,
    _FLOATS,
    _REL_TOL,
    _SIGNED,
    _WORD_SWAP,
    BIT_TABLES,
    TINY_FLOAT_ABS,
    TYPE_WORDS,
    PointSpec,
    WordOrder,
)
from rackplane.core.samples import Quality, Sample, good, invalid
from rackplane.errors import WriteRejected

__all__ = [
    "Decoded",
    "EncodedWrite",
    "decode_point",
    "decoded_sample",
    "encode_value",
    "encode_write",
    "from_engineering",
    "raw_from_registers",
    "raw_to_registers",
    "to_engineering",
]

# --- decode / encode -------------------------------------------------------------------------


def _to_words(raw_u: int, words: int, order: WordOrder | str) -> list[int]:
    """Unsigned integer (``raw_u`` < 2**(16*words)) -> registers in wire order (the word
    swap and the byte swap commute)."""
    regs = [(raw_u >> (16 * (words - 1 - i))) & 0xFFFF for i in range(words)]
    if order in _WORD_SWAP:
        regs.reverse()
    if order in _BYTE_SWAP:
        regs = [((r & 0xFF) << 8) | (r >> 8) for r in regs]
    return regs


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
