"""Register maps: validation, decode/encode, read planning (pure; rackplane.core.registers)."""

from __future__ import annotations

import decimal
import math
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rackplane.core.registers import (
    MAX_READ_REGISTERS,
    TYPE_WORDS,
    PointSpec,
    ReadBlock,
    ReadMemory,
    RegisterMap,
    bundled_register_maps,
    decode_point,
    encode_value,
    encode_write,
    learn_from_exception,
    load_register_map,
    parse_register_map,
    plan_reads,
    raw_from_registers,
    raw_to_registers,
    samples_from_block,
)
from rackplane.core.samples import Quality
from rackplane.errors import ConfigError, WriteRejected
from rackplane.settings import ModbusTargetSettings

ORDERS = ("ABCD", "CDAB", "BADC", "DCBA")


def pt(**kw: Any) -> PointSpec:
    """A point with defaults (input uint16 at 0)."""
    base: dict[str, Any] = {"name": "p", "table": "input", "address": 0, "type": "uint16"}
    base.update(kw)
    return PointSpec.model_validate(base)


def rmap(*points: dict[str, Any], default_order: str = "ABCD") -> RegisterMap:
    return parse_register_map(
        {"device": {"name": "t", "default_order": default_order}, "points": list(points)}
    )


# --- loading and validation ------------------------------------------------------------------


def test_bundled_cdu_generic_loads() -> None:
    m = load_register_map("cdu-generic")
    assert "cdu-generic" in bundled_register_maps()
    assert m.device.name == "cdu-generic"
    assert len(m.points) >= 16
    sup = m.point("supply_temp_c")
    assert (sup.table, sup.address, sup.type, sup.order) == ("input", 0, "float32", "CDAB")
    assert m.point("return_temp_c").sentinels == (0x8000,)
    assert m.point("heat_removed_kw").order == "ABCD"
    assert m.point("valve_command_pct").writable
    # default_order fills multi-register types only
    assert m.point("uptime_s").order == "ABCD"


def test_bare_name_path_and_settings_path_agree(tmp_path: Path) -> None:
    src = importlib_text("cdu-generic")
    f = tmp_path / "my-map.toml"
    f.write_text(src)
    assert load_register_map(f) == load_register_map("cdu-generic")
    assert load_register_map(Path("cdu-generic")) == load_register_map("cdu-generic")
    s = ModbusTargetSettings.model_validate({"name": "cdu", "register_map": "cdu-generic"})
    assert load_register_map(s.register_map).device.name == "cdu-generic"


def importlib_text(name: str) -> str:
    import importlib.resources

    folder = importlib.resources.files("rackplane_config") / "registers"
    return (folder / f"{name}.toml").read_text()


def test_unknown_bundled_name_lists_the_available_ones() -> None:
    with pytest.raises(ConfigError) as err:
        load_register_map("no-such-map")
    assert "cdu-generic" in str(err.value)


def test_errors_name_file_and_key_path(tmp_path: Path) -> None:
    f = tmp_path / "bad.toml"
    f.write_text(
        '[device]\nname = "x"\n\n'
        '[[points]]\nname = "a_c"\ntable = "input"\naddress = 0\ntype = "uint16"\n\n'
        '[[points]]\nname = "b_c"\ntable = "input"\naddress = "zero"\ntype = "uint16"\n'
    )
    with pytest.raises(ConfigError) as err:
        load_register_map(f)
    text = str(err.value)
    assert str(f) in text and "points[1].address" in text


def test_missing_file_and_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_register_map(tmp_path / "missing.toml")
    f = tmp_path / "broken.toml"
    f.write_text("[device\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_register_map(f)


@pytest.mark.parametrize(
    ("points", "fragment"),
    [
        ([{"name": "a", "table": "input", "address": 0, "type": "uint16"},
          {"name": "a", "table": "input", "address": 1, "type": "uint16"}], "duplicate point name"),
        ([{"name": "a", "table": "input", "address": 0, "type": "float32"},
          {"name": "b", "table": "input", "address": 1, "type": "uint16"}], "overlaps"),
        ([{"name": "a", "table": "coil", "address": 0, "type": "uint16"}], "type must be 'bool'"),
        ([{"name": "a", "table": "input", "address": 0, "type": "uint16", "writable": True,
           "write_min": 0, "write_max": 1}], "only holding and coil"),
        ([{"name": "a", "table": "holding", "address": 0, "type": "uint16", "writable": True}],
         "needs write_min and write_max"),
        ([{"name": "a", "table": "holding", "address": 0, "type": "uint16", "writable": True,
           "valid_min": 0, "valid_max": 50, "write_min": 0, "write_max": 60}], "inside the valid"),
        ([{"name": "a", "table": "input", "address": 0, "type": "int16",
           "sentinels": [0x10000]}], "does not fit int16"),
        ([{"name": "a", "table": "input", "address": 0, "type": "int16",
           "sentinels": [-32768]}], "raw unsigned"),
        ([{"name": "Bad Name", "table": "input", "address": 0, "type": "uint16"}],
         "field names"),
        ([{"name": "a/b", "table": "input", "address": 0, "type": "uint16"}], "field names"),
        ([{"name": "a", "table": "input", "address": 65535, "type": "float32"}], "past 65535"),
        ([{"name": "a", "table": "input", "address": 0, "type": "uint16", "scale": 0}],
         "greater than 0"),
        ([{"name": "a", "table": "input", "address": 0, "type": "uint16", "typo": 1}],
         "Extra inputs"),
        ([{"name": "a", "table": "input", "address": 0, "type": "uint16",
           "valid_min": 5, "valid_max": 1}], "valid_min must be <="),
    ],
)
def test_map_validation_rejects(points: list[dict[str, Any]], fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        rmap(*points)
    assert fragment in str(err.value)


def test_same_address_in_different_tables_is_fine() -> None:
    m = rmap({"name": "a", "table": "input", "address": 0, "type": "uint16"},
             {"name": "b", "table": "holding", "address": 0, "type": "uint16"},
             {"name": "c", "table": "coil", "address": 0, "type": "bool"})
    assert len(m.points) == 3


# --- order definitions -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("order", "regs32", "regs64"),
    [
        ("ABCD", [0x0102, 0x0304], [0x0102, 0x0304, 0x0506, 0x0708]),
        ("CDAB", [0x0304, 0x0102], [0x0708, 0x0506, 0x0304, 0x0102]),
        ("BADC", [0x0201, 0x0403], [0x0201, 0x0403, 0x0605, 0x0807]),
        ("DCBA", [0x0403, 0x0201], [0x0807, 0x0605, 0x0403, 0x0201]),
    ],
)
def test_word_and_byte_order_definition(order: str, regs32: list[int], regs64: list[int]) -> None:
    """The documented table: 32-bit A..D, 64-bit A..H; CDAB is low word first for both."""
    p32 = pt(type="uint32", order=order)
    p64 = pt(type="uint64", order=order)
    assert raw_to_registers(p32, 0x01020304) == regs32
    assert raw_to_registers(p64, 0x0102030405060708) == regs64
    assert raw_from_registers(p32, regs32) == 0x01020304
    assert raw_from_registers(p64, regs64) == 0x0102030405060708


def test_default_order_does_not_byte_swap_16_bit_points() -> None:
    m = rmap({"name": "f", "table": "input", "address": 0, "type": "float32"},
             {"name": "i", "table": "input", "address": 2, "type": "int16"},
             {"name": "s", "table": "input", "address": 3, "type": "uint16", "order": "BADC"},
             default_order="DCBA")
    assert m.point("f").order == "DCBA"
    assert m.point("i").order == "ABCD"
    assert decode_point(m.point("i"), [0x00FA]).value == 250
    assert decode_point(m.point("s"), [0xFA00]).value == 250  # explicit byte swap honoured


# --- decode: field cases -------------------------------------------------------------------------


def test_br01_cdab_float_word_order() -> None:
    """BR-01: 0x0000 0x41C8 in CDAB is exactly 25.0; as ABCD it is ~2.36e-41 (flagged)."""
    cdab = pt(name="supply_temp_c", type="float32", order="CDAB", valid_min=-50, valid_max=150)
    d = decode_point(cdab, [0x0000, 0x41C8])
    assert d.value == 25.0 and d.quality is Quality.GOOD and not d.suspect_order
    abcd = cdab.model_copy(update={"order": "ABCD"})
    wrong = decode_point(abcd, [0x0000, 0x41C8])
    assert wrong.value is not None and wrong.value == pytest.approx(2.36e-41, rel=1e-2)
    # a range check alone would not catch it: it is "valid" for -50..150 degC
    assert wrong.quality is Quality.GOOD
    assert wrong.suspect_order
    # 1.0 (0x3F800000) sent low word first and read high word first is also tiny
    assert decode_point(abcd, [0x0000, 0x3F80]).suspect_order
    assert not decode_point(abcd, [0x0000, 0x0000]).suspect_order  # zero is not suspect


def test_br01_float_block_in_register_order() -> None:
    """BR-01: registers 200-205 = [0, 16256, 0, 16384, 0, 16448] CDAB -> [1.0, 2.0, 3.0]."""
    m = rmap(*[{"name": f"sp{i}", "table": "holding", "address": 200 + 2 * i,
                "type": "float32", "order": "CDAB"} for i in range(3)])
    [block] = plan_reads(m.points, 125, 8)
    assert (block.start, block.count) == (200, 6)
    out = samples_from_block(block, [0, 16256, 0, 16384, 0, 16448], ts_ns=1, t_mono=2.0)
    assert [s.value for s in out.samples] == [1.0, 2.0, 3.0]
    assert [s.point for s in out.samples] == ["sp0", "sp1", "sp2"]


def test_br09_sentinel_and_int16_sign() -> None:
    """BR-09: int16 x0.1 with sentinel 0x8000; uint16 x0.1 with sentinel 0xFFFF."""
    temp = pt(name="return_temp_c", type="int16", scale=0.1, sentinels=[0x8000])
    seq = [0x00FA, 0xFF38, 0x8000, 0x8000, 0x00FA]
    got = [decode_point(temp, [r]) for r in seq]
    assert [d.value for d in got] == [25.0, -20.0, None, None, 25.0]
    assert [d.quality for d in got] == [Quality.GOOD, Quality.GOOD, Quality.BAD, Quality.BAD,
                                        Quality.GOOD]
    assert got[2].reason == "sentinel"
    assert all(d.value not in (-3276.8, 6533.6) for d in got)
    valve = pt(name="valve_pos_pct", type="uint16", scale=0.1, sentinels=[0xFFFF])
    v = [decode_point(valve, [r]) for r in (0x03E8, 0xFFFF, 0x03E8)]
    assert [d.value for d in v] == [100.0, None, 100.0]
    assert v[1].reason == "sentinel"


def test_sentinels_of_wide_types_use_the_whole_unsigned_value() -> None:
    p = pt(type="int32", order="CDAB", sentinels=[0x80000000])
    assert decode_point(p, [0x0000, 0x8000]).reason == "sentinel"
    assert decode_point(p, [0x0001, 0x8000]).value == -(2**31) + 1
    f = pt(type="float32", sentinels=[0xFFFFFFFF])
    assert decode_point(f, [0xFFFF, 0xFFFF]).reason == "sentinel"


def test_nan_inf_out_of_range_and_bool() -> None:
    f = pt(type="float32", valid_min=0, valid_max=10)
    nan = struct.unpack(">HH", struct.pack(">f", math.nan))
    inf = struct.unpack(">HH", struct.pack(">f", math.inf))
    assert decode_point(f, list(nan)).reason == "nan"
    assert decode_point(f, list(inf)).quality is Quality.BAD
    oor = decode_point(f, list(struct.unpack(">HH", struct.pack(">f", 11.0))))
    assert oor.quality is Quality.OUT_OF_RANGE and oor.value == 11.0
    b = pt(type="bool", table="holding")
    assert decode_point(b, [1]).value == 1.0
    assert decode_point(b, [2]).reason == "not_boolean"
    c = pt(type="bool", table="coil")
    assert decode_point(c, [True]).value == 1.0
    assert decode_point(pt(type="float32"), [1]).reason == "decode_error"


def test_samples_from_block_short_reply_is_bad_not_a_crash() -> None:
    m = rmap({"name": "a", "table": "input", "address": 0, "type": "uint16"},
             {"name": "b", "table": "input", "address": 1, "type": "uint16"})
    [block] = plan_reads(m.points, 125, 8)
    out = samples_from_block(block, [7], ts_ns=0, t_mono=0.0)
    assert [s.reason for s in out.samples] == ["decode_error", "decode_error"]
    assert all(s.value is None for s in out.samples)


# --- encode --------------------------------------------------------------------------------------


def test_encode_write_rounds_to_resolution_and_checks_limits() -> None:
    m = load_register_map("cdu-generic")
    valve = m.point("valve_command_pct")
    w = encode_write(valve, 42.37)
    assert w.registers == (424,) and w.value == 42.4
    assert encode_write(valve, 100.0).registers == (1000,)
    with pytest.raises(WriteRejected, match="outside the write limits"):
        encode_write(valve, 100.5)
    with pytest.raises(WriteRejected):
        encode_write(valve, -0.1)
    with pytest.raises(WriteRejected, match="not a finite"):
        encode_write(valve, math.nan)
    with pytest.raises(WriteRejected, match="not writable"):
        encode_write(m.point("supply_temp_c"), 20.0)
    pump = m.point("pump_speed_command_pct")
    with pytest.raises(WriteRejected):
        encode_write(pump, 14.9)  # write_min 15
    sp = m.point("supply_temp_setpoint_c")
    assert encode_write(sp, 32.5).value == 32.5
    assert encode_write(m.point("heartbeat"), 65535).registers == (0xFFFF,)


def test_encode_write_never_wraps_and_never_writes_a_sentinel() -> None:
    p = pt(table="holding", type="int16", writable=True, write_min=-5000.0, write_max=5000.0,
           scale=0.1)
    with pytest.raises(WriteRejected, match="int16 range"):
        encode_write(p, 4000.0)  # raw 40000 > 32767: refused, not wrapped to -25536
    s = pt(table="holding", type="uint16", writable=True, write_min=0.0, write_max=70000.0,
           sentinels=[0xFFFF])
    with pytest.raises(WriteRejected, match="sentinel"):
        encode_write(s, 65535.0)
    with pytest.raises(WriteRejected):
        encode_write(s, 65536.0)


def test_encode_write_rounding_steps_back_inside_limits() -> None:
    p = pt(table="holding", type="uint16", writable=True, write_min=0.0, write_max=100.0,
           scale=0.7)
    w = encode_write(p, 99.99)  # 142.84 -> 143 -> 100.1 > 100: one count back
    assert w.registers == (142,) and w.value <= 100.0


def test_encode_write_coil() -> None:
    c = pt(table="coil", type="bool", writable=True)
    assert encode_write(c, 1.0).registers == (1,)
    assert encode_write(c, False).registers == (0,)
    with pytest.raises(WriteRejected):
        encode_write(c, 0.5)


def test_encode_value_simulator_side() -> None:
    f = pt(type="float32", order="CDAB")
    assert encode_value(f, 25.0) == [0x0000, 0x41C8]
    assert math.isnan(struct.unpack(">f", struct.pack(">HH", *reversed(encode_value(
        f, math.nan))))[0])
    with pytest.raises(ValueError):
        encode_value(pt(type="uint16"), -1)
    with pytest.raises(ValueError):
        encode_value(pt(type="float32"), 1e39)


_INT_RANGES = {
    "int16": (-(2**15), 2**15 - 1), "uint16": (0, 2**16 - 1),
    "int32": (-(2**31), 2**31 - 1), "uint32": (0, 2**32 - 1),
    "int64": (-(2**53), 2**53), "uint64": (0, 2**53),  # exactly representable as float
}


@settings(max_examples=300, deadline=None)
@given(
    dtype=st.sampled_from(sorted(_INT_RANGES)),
    order=st.sampled_from(ORDERS),
    data=st.data(),
)
def test_roundtrip_integer_types(dtype: str, order: str, data: st.DataObject) -> None:
    lo, hi = _INT_RANGES[dtype]
    n = data.draw(st.integers(lo, hi))
    p = pt(type=dtype, order=order)
    regs = encode_value(p, float(n))
    assert len(regs) == TYPE_WORDS[dtype] and all(0 <= r <= 0xFFFF for r in regs)
    assert decode_point(p, regs).value == n


@settings(max_examples=300, deadline=None)
@given(
    order=st.sampled_from(ORDERS),
    x=st.floats(width=32, allow_nan=False, allow_infinity=False),
)
@example(order="ABCD", x=999999995904.0)  # decodes as 1e12: fewer digits, longer repr
def test_roundtrip_float32(order: str, x: float) -> None:
    p = pt(type="float32", order=order)
    regs = encode_value(p, x)
    d = decode_point(p, regs)
    # The decoded value is the shortest decimal of the same float32: bit-exact, not noisier.
    assert d.value is not None
    if x == 0.0:  # -0.0 comes back as 0.0 (scale and offset are applied); same number
        assert d.value == 0.0
        return
    assert struct.pack(">f", d.value) == struct.pack(">f", x)
    assert encode_value(p, d.value) == regs
    # Not noisier: no more significant digits (repr's length misleads: 1e12 prints as
    # "1000000000000.0", longer than "999999995904.0" though it has 1 digit, not 12).
    assert _sig_digits(d.value) <= _sig_digits(x)


def _sig_digits(v: float) -> int:
    return len(decimal.Decimal(repr(v)).normalize().as_tuple().digits)


@settings(max_examples=300, deadline=None)
@given(
    order=st.sampled_from(ORDERS),
    x=st.floats(allow_nan=False, allow_infinity=False),
)
def test_roundtrip_float64(order: str, x: float) -> None:
    p = pt(type="float64", order=order)
    assert decode_point(p, encode_value(p, x)).value == x


@settings(max_examples=300, deadline=None)
@given(
    dtype=st.sampled_from(["int16", "uint16", "int32", "uint32"]),
    scale=st.sampled_from([1.0, 0.1, 0.01, 0.5, 2.0, 0.25, 0.7]),
    offset=st.sampled_from([0.0, -40.0, 273.15]),
    frac=st.floats(0.0, 1.0),
)
def test_roundtrip_scaled_writes_stay_within_one_count(
    dtype: str, scale: float, offset: float, frac: float
) -> None:
    lo_raw, hi_raw = _INT_RANGES[dtype]
    lo = lo_raw * scale + offset
    hi = hi_raw * scale + offset
    p = pt(table="holding", type=dtype, scale=scale, offset=offset, writable=True,
           write_min=lo, write_max=hi)
    value = lo + frac * (hi - lo)
    w = encode_write(p, value)
    back = decode_point(p, list(w.registers))
    assert back.value is not None
    assert back.value == pytest.approx(w.value)
    assert abs(back.value - value) <= scale * 0.5 + 1e-6 * max(1.0, abs(value))
    assert lo - 1e-9 * abs(lo) <= back.value <= hi + 1e-9 * abs(hi)


# --- read planning -------------------------------------------------------------------------------

_TYPES = ["uint16", "int16", "float32", "uint32", "float64", "bool"]


@st.composite
def point_sets(draw: st.DrawFn) -> list[PointSpec]:
    """Non-overlapping points over two register tables and one bit table."""
    out: list[PointSpec] = []
    for table in ("holding", "input", "coil"):
        addr = draw(st.integers(0, 50))
        for _ in range(draw(st.integers(0, 25))):
            dtype = "bool" if table == "coil" else draw(st.sampled_from(_TYPES))
            p = pt(name=f"p{len(out)}", table=table, address=addr, type=dtype)
            out.append(p)
            addr = p.end + 1 + draw(st.integers(0, 12))
            if addr > 60000:
                break
    return out


@st.composite
def memories(draw: st.DrawFn, points: list[PointSpec]) -> ReadMemory:
    bad: set[tuple[str, int]] = set()
    for _ in range(draw(st.integers(0, 10))):
        bad.add((draw(st.sampled_from(["holding", "input", "coil"])), draw(st.integers(0, 400))))
    names = [p.name for p in points]
    isolated = draw(st.sets(st.sampled_from(names), max_size=5)) if names else set()
    limit = draw(st.one_of(st.none(), st.integers(4, 125)))
    return ReadMemory(frozenset(bad), frozenset(isolated), limit)


@settings(max_examples=250, deadline=None)
@given(data=st.data())
def test_plan_properties(data: st.DataObject) -> None:
    """Every point exactly once; no block over the limit; gaps <= max_gap; no block spans a
    remembered bad address unless it is that one point's own register; isolated alone."""
    points = data.draw(point_sets())
    memory = data.draw(memories(points))
    max_regs = data.draw(st.integers(4, 125))
    max_gap = data.draw(st.integers(0, 16))
    blocks = plan_reads(points, max_regs, max_gap, memory)
    seen = [p.name for b in blocks for p in b.points]
    assert sorted(seen) == sorted(p.name for p in points)
    assert len(seen) == len(set(seen))
    limit = min(max_regs, memory.max_registers or 125)
    for b in blocks:
        assert all(p.table == b.table for p in b.points)
        assert b.start == b.points[0].address and b.end == b.points[-1].end
        if b.table in ("holding", "input"):
            assert b.count <= limit or len(b.points) == 1
            assert b.count <= MAX_READ_REGISTERS
        for a, c in zip(b.points, b.points[1:], strict=False):
            assert 0 <= c.address - a.end - 1 <= max_gap
        covered_bad = [a for (t, a) in memory.bad if t == b.table and b.start <= a <= b.end]
        if covered_bad:
            assert len(b.points) == 1
        if len(b.points) > 1:
            assert not any(p.name in memory.isolated for p in b.points)


def test_br05_gap_split_after_one_failed_read_is_remembered() -> None:
    """BR-05: 11174, 11176-11177 configured, 11175 rejected: one failure, then two reads."""
    m = rmap({"name": "a", "table": "holding", "address": 11174, "type": "uint16"},
             {"name": "b", "table": "holding", "address": 11176, "type": "uint32"})
    mem = ReadMemory()
    [merged] = plan_reads(m.points, 125, 8, mem)
    assert (merged.start, merged.count) == (11174, 4)
    learned = learn_from_exception(merged, 2, mem, 125)
    assert learned.retry
    blocks = plan_reads(m.points, 125, 8, learned.memory)
    assert [(b.start, b.count) for b in blocks] == [(11174, 1), (11176, 2)]
    # and a single point answering 2 is the point's own problem: nothing more to learn
    assert not learn_from_exception(blocks[0], 2, learned.memory, 125).retry


def test_br05_exception_3_shrinks_and_converges() -> None:
    """BR-05: 200 input registers, device limit 100: size found within the first poll."""
    pts = [pt(name=f"w{i:03d}", address=i) for i in range(200)]
    mem = ReadMemory()
    device_limit = 100
    failed = 0
    queue = plan_reads(pts, 125, 8, mem)
    read: list[str] = []
    while queue:
        b = queue.pop(0)
        assert b.count <= 125
        if b.count > device_limit:
            failed += 1
            learned = learn_from_exception(b, 3, mem, 125)
            assert learned.retry
            mem = learned.memory
            queue[0:0] = plan_reads(b.points, 125, 8, mem)
            continue
        read.extend(p.name for p in b.points)
    assert sorted(read) == sorted(p.name for p in pts)
    assert mem.max_registers == 100 and failed == 2  # 125 -> 120 -> 100
    assert [b.count for b in plan_reads(pts, 125, 8, mem)] == [100, 100]


def test_exception_2_without_gaps_isolates_points() -> None:
    m = rmap({"name": "a", "table": "holding", "address": 9, "type": "float32"},
             {"name": "b", "table": "holding", "address": 11, "type": "uint16"})
    [b] = plan_reads(m.points, 125, 8)
    learned = learn_from_exception(b, 2, ReadMemory(), 125)
    assert learned.memory.isolated == {"a", "b"}
    assert [(x.start, x.count) for x in plan_reads(m.points, 125, 8, learned.memory)] == [
        (9, 2), (11, 1)]


def test_other_exceptions_teach_nothing() -> None:
    m = rmap({"name": "a", "table": "holding", "address": 0, "type": "uint16"},
             {"name": "b", "table": "holding", "address": 1, "type": "uint16"})
    [b] = plan_reads(m.points, 125, 8)
    memory = ReadMemory(frozenset({("input", 3)}), frozenset({"zz"}), 64)
    for code in (1, 4, 6, 10, 11):
        learned = learn_from_exception(b, code, memory, 125)
        assert learned.memory is memory and not learned.retry


def test_plan_limits_and_errors() -> None:
    pts = [pt(name=f"c{i}", table="coil", type="bool", address=i) for i in range(2500)]
    assert [b.count for b in plan_reads(pts, 125, 0)] == [2000, 500]
    with pytest.raises(ValueError):
        plan_reads(pts, 0, 0)
    block = ReadBlock("input", 0, 3, (pt(name="a", address=0), pt(name="b", address=2)))
    assert block.gaps() == [1] and block.function_code == 4


# --- settings (BR-06) --------------------------------------------------------------------------


def test_br06_rtu_unit0_reads_rejected_by_config() -> None:
    base: dict[str, Any] = {"name": "gw", "register_map": "cdu-generic"}
    ok_tcp0 = ModbusTargetSettings.model_validate({**base, "unit_id": 0})
    assert ok_tcp0.unit_id == 0 and ok_tcp0.framer == "socket"
    assert ModbusTargetSettings.model_validate({**base, "unit_id": 255}).unit_id == 255
    with pytest.raises(ValueError, match="broadcast"):
        ModbusTargetSettings.model_validate({**base, "unit_id": 0, "framer": "rtu"})
    write_only = ModbusTargetSettings.model_validate(
        {**base, "unit_id": 0, "framer": "rtu", "poll_enabled": False})
    assert not write_only.poll_enabled
    with pytest.raises(ValueError, match="1-247"):
        ModbusTargetSettings.model_validate({**base, "unit_id": 248, "framer": "rtu"})
    assert ModbusTargetSettings.model_validate(
        {**base, "unit_id": 17, "framer": "rtu"}).unit_id == 17
