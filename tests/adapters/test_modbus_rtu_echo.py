"""RS-485 adapters with local echo, and the RTU inter-frame discipline (issue 14 item 7).

A pseudo-terminal pair stands in for the adapter: the responder on the master side echoes
every byte the client sends (as a 2-wire RS-485 adapter with its receiver enabled does) and
answers as the small RTU slave of `tests.adapters.test_modbus_rtu` (real RTU frames,
CRC-16/MODBUS, independent of pymodbus). pymodbus 3.16.1 has ``handle_local_echo`` for
serial clients, but it does not check the echo: bytes that differ from the request are
passed on as the reply, so rackplane checks it itself (`rackplane.io.modbus.client._RtuLine`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import termios
import tty
from collections.abc import AsyncIterator

import pytest

from rackplane.clock import SystemClock
from rackplane.core.samples import Quality
from rackplane.errors import ModbusDecodeError, ModbusTimeout
from rackplane.io.modbus import ModbusDevice
from rackplane.io.modbus.client import t35_s
from rackplane.settings import ModbusTargetSettings
from tests.adapters.test_modbus import Polls, running, until
from tests.adapters.test_modbus_rtu import MAP, RtuSlave, serial_target

CLOCK = SystemClock()


class Line:
    """What the responder does on the wire; times are the loop's."""

    def __init__(self, slave: RtuSlave, *, echo: str = "exact", reply_delay_s: float = 0.0,
                 tail_after_s: float | None = None) -> None:
        self.slave = slave
        self.echo = echo  # "exact", "corrupt" (one byte flipped) or "none"
        self.reply_delay_s = reply_delay_s
        self.tail_after_s = tail_after_s  # a stale partial frame this long after each reply
        self.request_at: list[float] = []  # first byte of each chunk from the client
        self.reply_end_at: list[float] = []  # each reply written


@contextlib.asynccontextmanager
async def echoing_pty(line: Line) -> AsyncIterator[str]:
    master, peer = os.openpty()
    tty.setraw(peer)
    attrs = termios.tcgetattr(peer)
    attrs[3] &= ~termios.ECHO  # the echo is the responder's, byte for byte, not the tty's
    termios.tcsetattr(peer, termios.TCSANOW, attrs)
    name = os.ttyname(peer)
    loop = asyncio.get_running_loop()
    os.set_blocking(master, False)

    def write(data: bytes) -> None:
        with contextlib.suppress(OSError):
            os.write(master, data)

    def reply(data: bytes) -> None:
        write(data)
        line.reply_end_at.append(loop.time())
        if line.tail_after_s is not None:  # the tail of a late reply, noise: 3 bytes
            loop.call_later(line.tail_after_s, write, bytes([line.slave.unit, 3, 4]))

    def readable() -> None:
        try:
            data = os.read(master, 4096)
        except OSError:
            return
        line.request_at.append(loop.time())
        if line.echo == "exact":
            write(data)
        elif line.echo == "corrupt":
            write(data[:-1] + bytes([data[-1] ^ 0xFF]))
        for r in line.slave.feed(data):
            if line.reply_delay_s > 0:
                loop.call_later(line.reply_delay_s, reply, r)
            else:
                reply(r)

    loop.add_reader(master, readable)
    try:
        yield name
    finally:
        loop.remove_reader(master)
        os.close(master)
        os.close(peer)


def test_local_echo_is_a_setting_for_rtu_only() -> None:
    s = serial_target("/dev/null", local_echo=True)
    assert s.local_echo
    with pytest.raises(ValueError, match="local_echo"):
        ModbusTargetSettings.model_validate({"name": "x", "register_map": "m",
                                             "local_echo": True})  # Modbus TCP: no echo


async def test_echo_is_read_back_and_discarded() -> None:
    slave = RtuSlave(unit=7)
    slave.input[:2] = [4512, 1980]
    line = Line(slave)
    polls = Polls()
    async with echoing_pty(line) as port_name:
        dev = ModbusDevice(serial_target(port_name, local_echo=True), MAP, clock=CLOCK,
                           on_samples=polls)
        async with running(dev):
            await polls.until(lambda: polls.last("flow_lpm").quality is Quality.GOOD)
            await dev.write("valve_command_pct", 42.5)
            await polls.more(3)
    assert slave.holding[10] == 425
    assert polls.last("flow_lpm").value == pytest.approx(198.0)
    assert polls.last("supply_temp_c").value == pytest.approx(45.12)
    assert all(s.quality is Quality.GOOD for s in polls.polls[-1])
    assert "echo_mismatch" not in dev.stats.dropped_frames
    assert dev.stats.errors.get("timeout", 0) == 0


async def test_a_write_echo_is_not_taken_for_the_reply() -> None:
    """FC06's reply repeats the request: with the device silent, the adapter's echo alone
    must not make the write succeed."""
    slave = RtuSlave(unit=9)  # another unit: the device at 7 never answers
    line = Line(slave)
    async with echoing_pty(line) as port_name:
        dev = ModbusDevice(serial_target(port_name, local_echo=True, timeout_s=0.2,
                                         poll_enabled=False), MAP,
                           clock=CLOCK, on_samples=lambda s: None)
        async with running(dev):
            await until(lambda: dev.stats.connected)
            with pytest.raises(ModbusTimeout):
                await dev.write("valve_command_pct", 10.0)


@pytest.mark.parametrize("echo", ["corrupt", "none"])
async def test_an_echo_that_differs_is_refused_and_counted(echo: str) -> None:
    """A corrupted echo (collision, broken adapter), or none (the setting is wrong for this
    adapter): the reply is not trusted, the request fails, the cause is counted. (Without an
    echo, an FC06 reply is indistinguishable from the echo it stands in for: the write times
    out, it never succeeds unconfirmed.)"""
    slave = RtuSlave(unit=7)
    line = Line(slave, echo=echo)
    polls = Polls()
    async with echoing_pty(line) as port_name:
        dev = ModbusDevice(serial_target(port_name, local_echo=True, timeout_s=0.2), MAP,
                           clock=CLOCK, on_samples=polls)
        async with running(dev):
            await until(lambda: dev.stats.errors.get("reply_mismatch", 0) >= 2)
        assert dev.stats.dropped_frames.get("echo_mismatch", 0) >= 2
        assert not any(s.quality is Quality.GOOD for p in polls.polls for s in p)
        wdev = ModbusDevice(serial_target(port_name, local_echo=True, timeout_s=0.2,
                                          poll_enabled=False), MAP,
                            clock=CLOCK, on_samples=lambda s: None)
        async with running(wdev):
            await until(lambda: wdev.stats.connected)
            with pytest.raises(ModbusDecodeError if echo == "corrupt" else ModbusTimeout):
                await wdev.write("valve_command_pct", 10.0)


async def test_stale_partial_frame_is_flushed_after_t35_silence() -> None:
    """A late tail of garbage arrives a few ms after each reply. The next request waits for
    t3.5 of silence on the line (32 ms at 1200 baud), discards the stale bytes and is
    answered cleanly; sent at once, the tail would be read in front of its reply."""
    slave = RtuSlave(unit=7)
    slave.input[:2] = [100, 200]
    slave.holding[10] = 300
    line = Line(slave, reply_delay_s=0.02, tail_after_s=0.003)
    polls = Polls()
    t35 = t35_s(1200)
    async with echoing_pty(line) as port_name:
        dev = ModbusDevice(serial_target(port_name, local_echo=True, baudrate=1200,
                                         timeout_s=0.5, poll_interval_s=0.05), MAP,
                           clock=CLOCK, on_samples=polls)
        async with running(dev):
            await polls.more(6)
    assert dev.stats.errors.get("timeout", 0) == 0
    assert all(s.quality is Quality.GOOD for p in polls.polls for s in p)
    assert dev.stats.dropped_frames.get("stale_input", 0) >= 5
    # every request started at least t3.5 after the end of the reply before it
    for end in line.reply_end_at:
        nxt = [t for t in line.request_at if t > end]
        if nxt:
            assert nxt[0] - end >= t35 - 1e-3


def test_t35_per_specification() -> None:
    assert t35_s(9600) == pytest.approx(3.5 * 11 / 9600)
    assert t35_s(19200) == pytest.approx(2.005e-3, rel=1e-3)
    assert t35_s(115200) == 1.75e-3
