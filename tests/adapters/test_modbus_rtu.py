"""Modbus RTU: over a serial line (a pseudo-terminal pair stands in for the RS-485 adapter)
and over TCP (a transparent serial gateway). The device side is a small hand-written RTU
slave (CRC-16/MODBUS, FC03/FC04/FC06/FC16), independent of pymodbus, so the frames on the
wire are checked against the specification, not against the library under test."""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
import termios
import tty
from collections.abc import AsyncIterator
from typing import Any

import pytest

from rackplane.clock import SystemClock
from rackplane.core.registers import RegisterMap, parse_register_map
from rackplane.core.samples import Quality
from rackplane.errors import WriteRejected
from rackplane.io.modbus import ModbusDevice, ModbusSerialTargetSettings
from rackplane.settings import ModbusTargetSettings
from tests.adapters.test_modbus import Polls, crc16_modbus, running, until

CLOCK = SystemClock()

MAP: RegisterMap = parse_register_map({"device": {"name": "rtu-cdu"}, "points": [
    {"name": "supply_temp_c", "table": "input", "address": 0, "type": "int16",
     "scale": 0.01, "unit": "degC"},
    {"name": "flow_lpm", "table": "input", "address": 1, "type": "uint16", "scale": 0.1,
     "unit": "L/min"},
    {"name": "valve_command_pct", "table": "holding", "address": 10, "type": "uint16",
     "scale": 0.1, "writable": True, "write_min": 0.0, "write_max": 100.0},
]})


class RtuSlave:
    """An RTU slave for one unit: input and holding registers, FC03/04/06/16; frames with a
    bad CRC or another unit are ignored (as on a shared RS-485 line)."""

    def __init__(self, unit: int) -> None:
        self.unit = unit
        self.input = [0] * 32
        self.holding = [0] * 32
        self.frames: list[bytes] = []  # every request frame received
        self.bad_crc = 0
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        """Bytes from the line -> replies to send."""
        self._buf += data
        out: list[bytes] = []
        while len(self._buf) >= 8:
            fc = self._buf[1]
            n = 9 + self._buf[6] if fc == 16 and len(self._buf) >= 7 else 8
            if len(self._buf) < n:
                break
            frame, self._buf = self._buf[:n], self._buf[n:]
            if crc16_modbus(frame[:-2]) != frame[-2:]:
                self.bad_crc += 1
                self._buf = b""  # resynchronise on the next frame
                break
            self.frames.append(frame)
            if frame[0] != self.unit:
                continue
            out.append(self._answer(frame[:-2]))
        return out

    def _answer(self, pdu: bytes) -> bytes:
        unit, fc = pdu[0], pdu[1]
        addr, count = struct.unpack(">HH", pdu[2:6])
        if fc in (3, 4):
            regs = (self.holding if fc == 3 else self.input)[addr:addr + count]
            body = bytes([unit, fc, 2 * count]) + struct.pack(f">{count}H", *regs)
        elif fc == 6:
            self.holding[addr] = count
            body = pdu[:6]
        elif fc == 16:
            vals = struct.unpack(f">{count}H", pdu[7:7 + 2 * count])
            self.holding[addr:addr + count] = list(vals)
            body = pdu[:6]
        else:
            body = bytes([unit, fc | 0x80, 1])
        return body + crc16_modbus(body)


@contextlib.asynccontextmanager
async def pty_line(slave: RtuSlave) -> AsyncIterator[str]:
    """A pseudo-terminal pair: the client opens the returned port name, the slave answers
    on the master side."""
    master, peer = os.openpty()
    tty.setraw(peer)
    attrs = termios.tcgetattr(peer)
    attrs[3] &= ~termios.ECHO
    termios.tcsetattr(peer, termios.TCSANOW, attrs)
    name = os.ttyname(peer)
    loop = asyncio.get_running_loop()
    os.set_blocking(master, False)

    def readable() -> None:
        try:
            data = os.read(master, 4096)
        except OSError:
            return
        for reply in slave.feed(data):
            os.write(master, reply)

    loop.add_reader(master, readable)
    try:
        yield name
    finally:
        loop.remove_reader(master)
        os.close(master)
        os.close(peer)


@contextlib.asynccontextmanager
async def tcp_gateway(slave: RtuSlave) -> AsyncIterator[int]:
    """A transparent serial gateway: RTU frames over a TCP socket."""

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await r.read(4096):
                for reply in slave.feed(data):
                    w.write(reply)
                await w.drain()
        w.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield port
    finally:
        server.close()
        await server.wait_closed()


def serial_target(port_name: str, **kw: Any) -> ModbusSerialTargetSettings:
    # parity N, 2 stop bits (the specification's no-parity framing): a Linux pty refuses
    # PARENB (termios EINVAL, measured with pyserial 3.5), the even-parity default
    base: dict[str, Any] = {"name": "cdu-rtu", "serial_port": port_name, "unit_id": 7,
                            "parity": "N", "stopbits": 2,
                            "register_map": "rtu-cdu", "poll_interval_s": 0.1,
                            "timeout_s": 0.5, "reconnect_min_s": 0.1, "reconnect_max_s": 0.5}
    base.update(kw)
    return ModbusSerialTargetSettings.model_validate(base)


async def _read_write_roundtrip(dev: ModbusDevice, slave: RtuSlave, polls: Polls) -> None:
    slave.input[0] = 4512  # 45.12 °C
    slave.input[1] = 1980  # 198.0 L/min
    await polls.until(lambda: polls.last("flow_lpm").value == pytest.approx(198.0))
    t = polls.last("supply_temp_c")
    assert t.quality is Quality.GOOD and t.value == pytest.approx(45.12)
    slave.input[0] = struct.unpack(">H", struct.pack(">h", -120))[0]  # int16 sign survives
    await polls.until(lambda: polls.last("supply_temp_c").value == pytest.approx(-1.2))
    await dev.write("valve_command_pct", 42.5)
    assert slave.holding[10] == 425
    with pytest.raises(WriteRejected):
        await dev.write("valve_command_pct", 120.0)  # outside write_max: refused, not sent
    assert slave.holding[10] == 425


async def test_rtu_over_serial_reads_and_writes_through_a_pty_pair() -> None:
    slave = RtuSlave(unit=7)
    polls = Polls()
    async with pty_line(slave) as port_name:
        dev = ModbusDevice(serial_target(port_name), MAP, clock=CLOCK, on_samples=polls)
        async with running(dev):
            await until(lambda: dev.stats.connected)
            await _read_write_roundtrip(dev, slave, polls)
    assert slave.bad_crc == 0
    # every frame on the wire is a valid RTU frame to unit 7 (CRC checked by the slave)
    assert slave.frames and all(f[0] == 7 for f in slave.frames)
    fcs = {f[1] for f in slave.frames}
    assert 4 in fcs and (6 in fcs or 16 in fcs)


async def test_rtu_over_serial_silent_unit_goes_stale_then_recovers() -> None:
    """Another unit's address on the line: no reply, timeouts, every point STALE; the right
    unit again: GOOD. The serial port stays the same device file throughout."""
    slave = RtuSlave(unit=9)
    polls = Polls()
    async with pty_line(slave) as port_name:
        dev = ModbusDevice(serial_target(port_name, timeout_s=0.2), MAP, clock=CLOCK,
                           on_samples=polls)
        async with running(dev):
            await polls.until(lambda: polls.last("flow_lpm").quality is Quality.STALE)
            slave.unit = 7
            slave.input[1] = 500
            await polls.until(lambda: polls.last("flow_lpm").quality is Quality.GOOD,
                              within=20.0)
    assert polls.last("flow_lpm").value == pytest.approx(50.0)


async def test_rtu_over_tcp_gateway_reads_and_writes() -> None:
    slave = RtuSlave(unit=7)
    polls = Polls()
    async with tcp_gateway(slave) as port:
        s = ModbusTargetSettings.model_validate({
            "name": "cdu-gw", "host": "127.0.0.1", "port": port, "unit_id": 7,
            "register_map": "rtu-cdu", "poll_interval_s": 0.1, "timeout_s": 0.5,
            "framer": "rtu", "reconnect_min_s": 0.1, "reconnect_max_s": 0.5})
        dev = ModbusDevice(s, MAP, clock=CLOCK, on_samples=polls)
        async with running(dev):
            await until(lambda: dev.stats.connected)
            await _read_write_roundtrip(dev, slave, polls)
    assert slave.bad_crc == 0 and all(f[0] == 7 for f in slave.frames)


async def test_rtu_over_serial_port_refusing_its_settings_is_not_connected() -> None:
    """Even parity on a pty: termios refuses it; the device stays 'not connected' (counted,
    retried with backoff), never an internal error."""
    slave = RtuSlave(unit=7)
    async with pty_line(slave) as port_name:
        dev = ModbusDevice(serial_target(port_name, parity="E", stopbits=1), MAP, clock=CLOCK,
                           on_samples=Polls())
        async with running(dev):
            await until(lambda: dev.stats.connect_attempts >= 2)
    assert not dev.stats.connected and "internal_error" not in dev.stats.errors


async def test_valvey_cdu_target_on_a_serial_line() -> None:
    """valvey's own CDU target with ``serial_port`` set opens the serial client."""
    from valvey.config import CduTarget

    slave = RtuSlave(unit=7)
    polls = Polls()
    async with pty_line(slave) as port_name:
        cfg = CduTarget.model_validate({"serial_port": port_name, "framer": "rtu", "unit_id": 7,
                                        "parity": "N", "stopbits": 2, "register_map": "x"})
        dev = ModbusDevice(cfg, MAP, clock=CLOCK, on_samples=polls)
        slave.input[1] = 1234
        async with running(dev):
            await polls.until(lambda: polls.last("flow_lpm").value == pytest.approx(123.4))
    with pytest.raises(ValueError, match="framer"):
        CduTarget.model_validate({"serial_port": "/dev/ttyUSB0"})


def test_serial_settings_are_rtu_only() -> None:
    with pytest.raises(ValueError, match="RTU only"):
        serial_target("/dev/null", framer="socket")
    s = ModbusSerialTargetSettings.model_validate({"name": "x", "serial_port": "/dev/ttyUSB0",
                                                    "register_map": "rtu-cdu"})
    assert (s.baudrate, s.parity, s.bytesize, s.stopbits) == (19200, "E", 8, 1)
