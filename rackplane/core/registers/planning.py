"""Read planning (requests of at most 125 registers or 2000 bits, gaps, what a device
refused, `ReadMemory`) and the compiled block decoder of the poll's hot path.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rackplane.core.registers.codec import (
    _reciprocal,
    _shortest_float32,
    decode_point,
    decoded_sample,
)
from rackplane.core.registers.maps import (
    _BYTE_SWAP,
    _SIGNED,
    _WORD_SWAP,
    BIT_TABLES,
    MAX_READ_BITS,
    MAX_READ_REGISTERS,
    READ_FUNCTION,
    SHRINK_LADDER,
    TABLES,
    TINY_FLOAT_ABS,
    PointSpec,
    Table,
)
from rackplane.core.samples import Quality, Sample, make_sample

__all__ = [
    "BlockDecode",
    "BlockDecoder",
    "Learned",
    "ReadBlock",
    "ReadMemory",
    "learn_from_exception",
    "plan_reads",
    "samples_from_block",
]

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
        refused: point names the device refused when read alone (exception 2 or 3): not
            read at all (the poller re-probes them after its ``refused_reprobe_s`` by
            planning again without them here).
    """

    bad: frozenset[tuple[str, int]] = frozenset()
    isolated: frozenset[str] = frozenset()
    max_registers: int | None = None
    refused: frozenset[str] = frozenset()

    def refuse(self, names: Iterable[str]) -> ReadMemory:
        """A copy with ``names`` refused (not planned)."""
        return replace(self, refused=self.refused | frozenset(names))

    def reprobe(self, names: Iterable[str]) -> ReadMemory:
        """A copy with ``names`` planned again (read alone: they stay isolated)."""
        drop = frozenset(names)
        return replace(self, isolated=self.isolated | drop, refused=self.refused - drop)


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
    bad address, are read alone; refused points (``known_bad.refused``) are not read. A point
    is never split; a point wider than the limit is read alone at its own width.

    Returns:
        Blocks ordered by table (holding, input, coil, discrete) then address; every point
        not refused is in exactly one block.

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
        if p.name not in memory.refused:
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

    A single point refused with 2 or 3 is the poller's to remember (`ReadMemory.refuse`,
    with a re-probe time: a clock this pure function does not read).

    ``max_registers`` is the configured size, used when no reduced size is remembered yet.
    """
    if len(block.points) <= 1 or code not in (2, 3):
        return Learned(memory, False)
    if code == 2:
        gaps = block.gaps()
        if gaps:
            bad = memory.bad | {(block.table, a) for a in gaps}
            return Learned(replace(memory, bad=bad), True)
        isolated = memory.isolated | {p.name for p in block.points}
        return Learned(replace(memory, isolated=isolated), True)
    if block.table in BIT_TABLES:
        isolated = memory.isolated | {p.name for p in block.points}
        return Learned(replace(memory, isolated=isolated), True)
    widest = max(p.words for p in block.points)
    current = min(max_registers, MAX_READ_REGISTERS)
    if memory.max_registers is not None:
        current = min(current, memory.max_registers)
    target = next((n for n in SHRINK_LADDER if n < block.count), 1)
    new_max = max(widest, min(target, current))
    if new_max >= block.count:
        # cannot shrink below this block's widest point: read its points alone instead
        isolated = memory.isolated | {p.name for p in block.points}
        return Learned(replace(memory, isolated=isolated), True)
    return Learned(replace(memory, max_registers=new_max), True)


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
