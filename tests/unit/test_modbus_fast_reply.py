"""The strict framer's fast path (rackplane/io/modbus/client.py `_StrictSocketFramer.handleFrame`):
for the one frame that answers the outstanding register read it builds the reply itself;
the reply must equal what pymodbus' own framer and decoder make of the same bytes, and any
other buffer must take the BR-03 frame walk (the guard drops and counts)."""

from __future__ import annotations

import random
import struct

import pytest
from pymodbus.framer import FramerSocket
from pymodbus.pdu import DecodePDU

from rackplane.io.modbus import ModbusStats
from rackplane.io.modbus.client import _Expect, _FastReply, _ReplyGuard, _StrictSocketFramer


def _frame(tid: int, unit: int, fc: int, regs: list[int]) -> bytes:
    pdu = struct.pack(f">BB{len(regs)}H", fc, 2 * len(regs), *regs)
    return struct.pack(">HHHB", tid, 0, 1 + len(pdu), unit) + pdu


def _strict(unit: int, fc: int, count: int) -> tuple[_StrictSocketFramer, ModbusStats]:
    stats = ModbusStats()
    guard = _ReplyGuard(stats)
    fast = _FastReply.of_read(unit, fc, count)
    assert fast is not None  # the fast path is armed for every register read
    guard.begin(_Expect(unit, fc, count), fast)
    return _StrictSocketFramer(guard), stats


@pytest.mark.parametrize("fc", [3, 4])
@pytest.mark.parametrize("count", [1, 2, 7, 125])
def test_fast_reply_equals_pymodbus_decode(fc: int, count: int) -> None:
    rng = random.Random(count * 10 + fc)
    regs = [rng.randrange(0, 0x10000) for _ in range(count)]
    data = _frame(0x1234, 7, fc, regs)
    framer, _ = _strict(7, fc, count)
    used, mine = framer.handleFrame(data, 7, 0x1234)
    theirs_used, theirs = FramerSocket(DecodePDU(False)).handleFrame(data, 7, 0x1234)
    assert mine is not None and theirs is not None
    assert used == theirs_used == len(data)
    assert type(mine) is type(theirs)
    assert vars(mine) == vars(theirs)
    assert mine.registers == regs


def test_any_other_buffer_takes_the_guarded_frame_walk() -> None:
    regs = [1, 2, 3]
    # a stray reply (old tid) before the expected one: dropped and counted, the right one kept
    data = _frame(0x0001, 7, 3, [9, 9, 9]) + _frame(0x0002, 7, 3, regs)
    framer, stats = _strict(7, 3, 3)
    used, pdu = framer.handleFrame(data, 7, 0x0002)
    assert pdu is not None and pdu.registers == regs and used == len(data)
    assert sum(stats.dropped_frames.values()) == 1, stats.dropped_frames
    # the right tid but the wrong unit or register count: never accepted
    for bad in (_frame(0x0002, 8, 3, regs), _frame(0x0002, 7, 3, [1, 2])):
        framer, stats = _strict(7, 3, 3)
        _, pdu = framer.handleFrame(bad, 7, 0x0002)
        assert pdu is None
        assert sum(stats.dropped_frames.values()) == 1, stats.dropped_frames
