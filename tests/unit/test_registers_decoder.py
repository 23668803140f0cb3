"""The compiled block decoder (`rackplane.core.registers.BlockDecoder`, the Modbus poll hot path)
gives exactly the samples of the reference path, `decode_point` + `decoded_sample` per point,
for every type, word/byte order, scale, sentinel and range (pure)."""

from __future__ import annotations

import math
import struct
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from rackplane.core.registers import (
    TYPE_WORDS,
    BlockDecode,
    BlockDecoder,
    ReadBlock,
    decode_point,
    decoded_sample,
    load_register_map,
    parse_register_map,
    plan_reads,
    samples_from_block,
)
from rackplane.core.samples import Quality

ORDERS = ("ABCD", "CDAB", "BADC", "DCBA")
REG_TYPES = ("int16", "uint16", "int32", "uint32", "float32", "int64", "uint64", "float64",
             "bool")
#: Register values that hit sentinels, sign bits, NaN/Inf patterns, bools and tiny floats.
SPECIAL = (0, 1, 2, 0x00FA, 0x7F80, 0x7FC0, 0x7FFF, 0x8000, 0xFF38, 0xFF80, 0xFFFF, 0x3F80)


def reference(block: ReadBlock, data: list[int], ts_ns: int, t_mono: float) -> BlockDecode:
    """`decode_point` + `decoded_sample` for each point: the definition of a block decode."""
    out = BlockDecode()
    for p in block.points:
        chunk = block.slice_for(p, data) if len(data) >= block.count else []
        d = decode_point(p, chunk)
        out.samples.append(decoded_sample(p, d, ts_ns, t_mono))
        if d.suspect_order:
            out.suspect_order.append(p.name)
    return out


def same(a: BlockDecode, b: BlockDecode) -> None:
    assert a.suspect_order == b.suspect_order
    assert len(a.samples) == len(b.samples)
    for x, y in zip(a.samples, b.samples, strict=True):
        assert x == y, (x, y)
        # -0.0 == 0.0: compare the sign too, and the value's type
        if x.value is not None and y.value is not None:
            assert math.copysign(1.0, x.value) == math.copysign(1.0, y.value)
            assert type(x.value) is type(y.value) is float


@st.composite
def register_points(draw: Any) -> list[dict[str, Any]]:
    n = draw(st.integers(1, 8))
    pts: list[dict[str, Any]] = []
    addr = 0
    for i in range(n):
        typ = draw(st.sampled_from(REG_TYPES))
        words = TYPE_WORDS[typ]
        p: dict[str, Any] = {"name": f"p{i}", "table": "input", "address": addr, "type": typ}
        if draw(st.booleans()):
            p["order"] = draw(st.sampled_from(ORDERS))
        if typ != "bool":
            p["scale"] = draw(st.sampled_from((1.0, 0.1, 0.01, 0.5, 2.5, 1e-3, 3.0)))
            p["offset"] = draw(st.sampled_from((0.0, -40.0, 273.15, 0.5)))
            if draw(st.booleans()):
                lo = draw(st.floats(-1e6, 1e6, allow_nan=False))
                p["valid_min"] = lo
                p["valid_max"] = lo + draw(st.floats(0, 1e6, allow_nan=False))
            bits = 16 * words
            p["sentinels"] = draw(st.lists(
                st.sampled_from((0, 0x8000, 0xFFFF, 2 ** bits - 1, 2 ** (bits - 1), 0x7FC00000
                                 if bits >= 32 else 0x7FFF)), max_size=2, unique=True))
        pts.append(p)
        addr += words + draw(st.integers(0, 2))
    return pts


@settings(max_examples=400, deadline=None)
@given(pts=register_points(), seed=st.randoms(use_true_random=False),
       default_order=st.sampled_from(ORDERS))
def test_compiled_decoder_equals_reference(pts: list[dict[str, Any]], seed: Any,
                                           default_order: str) -> None:
    m = parse_register_map({"device": {"name": "t", "default_order": default_order},
                            "points": pts})
    [block] = plan_reads(m.points, 125, 8)
    dec = BlockDecoder(block)
    for _ in range(8):
        data = [seed.choice(SPECIAL) if seed.random() < 0.5 else seed.randrange(0x10000)
                for _ in range(block.count)]
        same(dec.decode(data, 123, 4.5), reference(block, data, 123, 4.5))
        assert samples_from_block(block, data, 123, 4.5) == dec.decode(data, 123, 4.5)


@settings(max_examples=100, deadline=None)
@given(bits=st.lists(st.sampled_from((0, 1, True, False, 3)), min_size=1, max_size=20),
       table=st.sampled_from(("coil", "discrete")))
def test_compiled_decoder_bits_equal_reference(bits: list[Any], table: str) -> None:
    pts = [{"name": f"b{i}", "table": table, "address": 2 * i, "type": "bool"}
           for i in range(len(bits))]
    m = parse_register_map({"device": {"name": "t"}, "points": pts})
    [block] = plan_reads(m.points, 125, 8)
    data = [bits[i // 2] if i % 2 == 0 else 0 for i in range(block.count)] + [0] * 7  # padded
    same(BlockDecoder(block).decode(data, 1, 2.0), reference(block, [int(b) for b in data], 1,
                                                             2.0))


def test_compiled_decoder_cdu_generic_map() -> None:
    """Every block of the bundled CDU map, sweeping each register through the special values."""
    m = load_register_map("cdu-generic")
    for block in plan_reads(m.points, 125, 8):
        dec = BlockDecoder(block)
        for v in SPECIAL:
            for k in range(block.count):
                data = [0x4148] * block.count
                data[k] = v
                same(dec.decode(data, 7, 8.0), reference(block, data, 7, 8.0))


def test_compiled_decoder_br09_int16_sign_and_sentinel() -> None:
    """BR-09 through the compiled path: 0xFF38 x0.1 is -20.0, 0x8000 is BAD sentinel."""
    m = parse_register_map({"device": {"name": "t"}, "points": [
        {"name": "return_temp_c", "table": "input", "address": 0, "type": "int16",
         "scale": 0.1, "sentinels": [0x8000]},
        {"name": "valve_pos_pct", "table": "input", "address": 1, "type": "uint16",
         "scale": 0.1, "sentinels": [0xFFFF]}]})
    [block] = plan_reads(m.points, 125, 8)
    dec = BlockDecoder(block)
    a, b = dec.decode([0xFF38, 0x03E8], 0, 0.0).samples
    assert (a.value, a.quality, b.value) == (-20.0, Quality.GOOD, 100.0)
    a, b = dec.decode([0x8000, 0xFFFF], 0, 0.0).samples
    assert (a.quality, a.reason, a.value) == (Quality.BAD, "sentinel", None)
    assert (b.quality, b.reason) == (Quality.BAD, "sentinel")


def test_compiled_decoder_short_or_impossible_reply_is_decode_error() -> None:
    m = parse_register_map({"device": {"name": "t"}, "points": [
        {"name": "a", "table": "input", "address": 0, "type": "uint16"},
        {"name": "f", "table": "input", "address": 1, "type": "float32", "order": "CDAB"}]})
    [block] = plan_reads(m.points, 125, 8)
    dec = BlockDecoder(block)
    short = dec.decode([7], 0, 0.0)
    assert [s.reason for s in short.samples] == ["decode_error", "decode_error"]
    one, two = struct.unpack(">HH", struct.pack(">f", 25.0))
    for data in ([7, two, 0x10000], [-1, two, one]):
        got = dec.decode(data, 0, 0.0)
        same(got, reference(block, data, 0, 0.0))
        assert any(s.reason == "decode_error" for s in got.samples)
    good = dec.decode([7, two, one], 0, 0.0).samples
    assert [s.value for s in good] == [7.0, 25.0]


def test_compiled_decoder_names_match_its_samples() -> None:
    m = load_register_map("cdu-generic")
    for block in plan_reads(m.points, 125, 8):
        dec = BlockDecoder(block)
        got = dec.decode([0] * block.count, 0, 0.0).samples
        assert dec.names == tuple(s.point for s in got) == tuple(p.name for p in block.points)
