"""Register encoders compiled per point: what a Modbus face serves for a value (pure).

The compiled counterpart of `rackplane.core.registers.codec.encode_value`, as `BlockDecoder`
is of `decode_point`: everything that does not depend on the value (kind, words, order,
scale as an exact reciprocal, offset, range, the first sentinel) is worked out once per
point, so a face that serves dozens of points per 10 Hz tick (the simulator's faces, the
lock-step harness) pays a few operations per value. ``tests/unit/test_lockstep_cdu_face.py``
checks the compiled encoders word for word against `encode_value` (through
`sims.runtime.encode_readings`) on random and special values of every point of every
bundled map.

The encoder's contract: ``encoder(value, sentinel) -> registers | None``: the registers in
wire order (``(0,)``/``(1,)`` for a bit) for ``value``; the point's first sentinel when
``sentinel`` (a scenario's sentinel fault) or when ``value`` is NaN/±inf on an integer point
with sentinels; None when the point's type cannot represent ``value`` (NaN/±inf without a
sentinel, outside the type's range, a bool that is not 0/1): the face keeps its last
registers.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from typing import Any

from rackplane.core.registers.codec import _reciprocal, _to_words
from rackplane.core.registers.maps import BIT_TABLES, PointSpec

__all__ = ["PointEncoder", "compile_encoder", "compile_point_encoder", "encode_point"]

_pack_f32 = struct.Struct(">f").pack
_pack_f64 = struct.Struct(">d").pack
_floor = math.floor

PointEncoder = Callable[[float, bool], Sequence[int] | None]
"""``(value, sentinel) -> registers | None`` (module docstring)."""

Encoder = tuple[Any, ...]

_K_BIT, _K_BOOL, _K_INT, _K_F32, _K_F64 = range(5)
_SIGNED = frozenset({"int16", "int32", "int64"})


def compile_encoder(p: PointSpec) -> Encoder:
    """``p``'s encoder for `encode_point` (everything that does not depend on the value)."""
    if p.table in BIT_TABLES:
        kind = _K_BIT
    elif p.type == "bool":
        kind = _K_BOOL
    elif p.type == "float32":
        kind = _K_F32
    elif p.type == "float64":
        kind = _K_F64
    else:
        kind = _K_INT
    words = 1 if p.table in BIT_TABLES else p.words
    bits = 16 * p.words
    if p.type in _SIGNED:
        lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    else:
        lo, hi = 0, 2**bits - 1
    sent = None
    if p.sentinels:
        sent = tuple(_to_words(p.sentinels[0], p.words, p.order)) if kind != _K_BIT else (
            1 if p.sentinels[0] else 0,)
    return (p.name, kind, words, p.order, p.order == "ABCD", _reciprocal(p.scale), p.scale,
            p.offset, lo, hi, 1 << bits, sent)


def encode_point(enc: Encoder, v: float, sentinel: bool) -> Sequence[int] | None:
    """The registers (wire order; ``[0|1]`` for a bit) the face serves for value ``v``, or
    None when the point keeps its last registers: equal to `encode_value` of the reading
    after a face's sentinel and held rules (module docstring; ``sentinel``: the point is in
    the scenario's sentinel faults)."""
    _, kind, words, order, plain, n, scale, off, lo, hi, span, sent = enc
    if sentinel and sent is not None:
        return sent
    if kind >= _K_F32:
        number = ((v - off) * n if n is not None else (v - off) / scale) if v - v == 0.0 else v
        if kind == _K_F32:
            try:
                raw = int.from_bytes(_pack_f32(number), "big")
            except OverflowError:
                return None
            if plain:
                return (raw >> 16, raw & 0xFFFF)
            if order == "CDAB":
                return (raw & 0xFFFF, raw >> 16)
        else:
            raw = int.from_bytes(_pack_f64(number), "big")
        return _to_words(raw, words, order)
    if v - v != 0.0:  # NaN or ±inf of an integer type
        return sent
    if kind == _K_BIT:
        return None if v != 0 and v != 1 else ((1,) if v else (0,))
    if kind == _K_BOOL:
        return None if v != 0 and v != 1 else _to_words(int(v), words, order)
    x = (v - off) * n if n is not None else (v - off) / scale
    a = -x if x < 0 else x
    whole = _floor(a)
    frac = a - whole
    if 0.4999999 < frac < 0.5000001:  # near a half: `_round_half_away` exactly
        x = round(x, 9)
        a = -x if x < 0 else x
        whole = _floor(a)
        frac = a - whole
    # elsewhere rounding x to 9 decimals first changes neither the nearest integer nor
    # the side of the half
    r = whole + 1 if frac >= 0.5 else whole
    if x < 0:
        r = -r
    if not lo <= r <= hi:
        return None
    raw = r % span
    if words == 1:
        return ((((raw & 0xFF) << 8) | (raw >> 8)),) if order in ("BADC", "DCBA") else (raw,)
    if plain:
        return (raw >> 16, raw & 0xFFFF) if words == 2 else _to_words(raw, words, order)
    return _to_words(raw, words, order)


def compile_point_encoder(p: PointSpec) -> PointEncoder:
    """``p``'s encoder as one call ``(value, sentinel) -> registers | None``, the same
    results as `encode_point`; specialised for the common register kinds (a one-register
    integer without byte swap, a float32 in ABCD or CDAB order), else `encode_point`."""
    enc = compile_encoder(p)
    _, kind, words, order, _, n, scale, off, lo, hi, span, sent = enc

    def generic(v: float, sentinel: bool) -> Sequence[int] | None:
        return encode_point(enc, v, sentinel)

    if kind == _K_INT and words == 1 and order in ("ABCD", "CDAB") and n is not None:
        def int16(v: float, sentinel: bool) -> Sequence[int] | None:
            if (sentinel and sent is not None) or v - v != 0.0:
                return sent  # a sentinel fault, or NaN/inf: the sentinel (None: held)
            x = (v - off) * n
            a = -x if x < 0 else x
            whole = _floor(a)
            frac = a - whole
            if 0.4999999 < frac < 0.5000001:
                return generic(v, sentinel)
            r = whole + 1 if frac >= 0.5 else whole
            if x < 0:
                r = -r
            if r < lo or r > hi:
                return None
            return (r % span,)
        return int16
    if kind == _K_F32 and order in ("ABCD", "CDAB"):
        swap = order == "CDAB"

        def f32(v: float, sentinel: bool) -> Sequence[int] | None:
            if sentinel and sent is not None:
                return sent
            number = ((v - off) * n if n is not None else (v - off) / scale) if (
                v - v == 0.0) else v
            try:
                raw = int.from_bytes(_pack_f32(number), "big")
            except OverflowError:
                return None
            return (raw & 0xFFFF, raw >> 16) if swap else (raw >> 16, raw & 0xFFFF)
        return f32
    return generic
