"""The Modbus polling benchmark's two pollers: rackplane's `ModbusDevice` (its owner task at
10 Hz, every reply decoded into Samples) and the raw pymodbus client reading the same blocks
(`ModbusDevice.read_plan`) at the same rate.

Usage: ``python -m harness.benchkids.modbus_poll rackplane|raw HOST PORT SECONDS OUT_JSON`` — writes
``{polls, cpu_s, cpu_s_per_poll, polls_per_s}`` (process CPU over the polling window). The raw
poller decodes every register point with pymodbus's ``convert_from_registers`` and its scale,
as a user of the bare client would; rackplane's adds quality, ranges and sentinels.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from pymodbus.client import AsyncModbusTcpClient

from rackplane.clock import SYSTEM_CLOCK
from rackplane.core.samples import Sample
from rackplane.io.modbus import ModbusDevice
from rackplane.settings import ModbusTargetSettings

PERIOD_S = 0.1
CALLS = {"coil": "read_coils", "discrete": "read_discrete_inputs",
         "holding": "read_holding_registers", "input": "read_input_registers"}


def _settings(host: str, port: int) -> ModbusTargetSettings:
    return ModbusTargetSettings(name="cdu", host=host, port=port, unit_id=1,
                                register_map=Path("cdu-generic"), poll_interval_s=PERIOD_S)


async def rackplane(host: str, port: int, seconds: float) -> tuple[int, float, float]:
    """Polls, CPU s and wall s of the polling window (from the owner task's start)."""
    polls = 0

    def on_samples(samples: list[Sample]) -> None:
        nonlocal polls
        polls += 1

    dev = ModbusDevice(_settings(host, port), clock=SYSTEM_CLOCK, on_samples=on_samples)
    c0, t0 = time.process_time(), time.monotonic()
    task = asyncio.create_task(dev.run())
    await asyncio.sleep(seconds)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return polls, time.process_time() - c0, time.monotonic() - t0


WIDTH = {"int16": 1, "uint16": 1, "int32": 2, "uint32": 2, "float32": 2, "int64": 4,
         "uint64": 4, "float64": 4}


def _decoders(dev: ModbusDevice) -> list[list[tuple[int, int, Any, Any, float, float]]]:
    """Per read block: (offset, width, pymodbus data type, word order, scale, offset) of each
    register point (bits are used as read)."""
    dt = AsyncModbusTcpClient.DATATYPE
    out = []
    for b in dev.read_plan:
        pts = []
        for p in b.points:
            w = WIDTH.get(p.type)
            if w is None or b.table in ("coil", "discrete"):
                continue
            order = "little" if p.order in ("CDAB", "DCBA") else "big"
            pts.append((p.address - b.start, w, dt[p.type.upper()], order, p.scale, p.offset))
        out.append(pts)
    return out


async def raw(host: str, port: int, seconds: float) -> tuple[int, float, float]:
    """Polls, CPU s and wall s of the polling window (from the connect). Each register point is
    decoded with pymodbus's own ``convert_from_registers`` and scaled, as a user of the raw
    client would."""
    dev = ModbusDevice(_settings(host, port), clock=SYSTEM_CLOCK, on_samples=lambda s: None)
    await dev.read_once()  # learn the plan the device accepts (it refuses reads across gaps)
    blocks = [(CALLS[b.table], b.start, b.count) for b in dev.read_plan]
    errors = 0
    decoders = _decoders(dev)
    conv = AsyncModbusTcpClient.convert_from_registers
    values: dict[int, float] = {}
    c0, t0 = time.process_time(), time.monotonic()
    client = AsyncModbusTcpClient(host, port=port, timeout=1.0)
    await client.connect()
    polls = 0
    t_next = time.monotonic()
    end = t_next + seconds
    while time.monotonic() < end:
        for (call, start, count), pts in zip(blocks, decoders, strict=True):
            rr = await getattr(client, call)(start, count=count, device_id=1)
            if rr.isError():
                errors += 1
                continue
            regs = rr.registers
            for k, (off, w, typ, order, scale, offset) in enumerate(pts):
                v = conv(regs[off:off + w], typ, word_order=order)
                if isinstance(v, int | float):
                    values[k] = v * scale + offset
        polls += 1
        t_next += PERIOD_S
        await asyncio.sleep(max(0.0, t_next - time.monotonic()))
    client.close()
    if errors:
        raise RuntimeError(f"{errors} raw reads refused: the plan is not the device's")
    return polls, time.process_time() - c0, time.monotonic() - t0


def main(argv: list[str]) -> int:
    mode, host, port, seconds, out = argv[0], argv[1], int(argv[2]), float(argv[3]), argv[4]
    fn = rackplane if mode == "rackplane" else raw
    polls, cpu, wall = asyncio.run(fn(host, port, seconds))
    Path(out).write_text(json.dumps({"polls": polls, "cpu_s": cpu, "wall_s": wall,
                                     "cpu_s_per_poll": cpu / max(polls, 1),
                                     "polls_per_s": polls / wall}))
    return 0 if polls else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
