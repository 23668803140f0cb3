"""ModbusDevice's guard against a library hang (rackplane.io.modbus ``_RequestWatchdog``): a
request pymodbus never finishes is abandoned ``timeout_s + OUTER_TIMEOUT_MARGIN_S`` after it
started, as a timeout (points STALE, connection replaced, polling resumes), while a real
cancel of the owner still stops it at once.

Real TCP on loopback against the simulators' ModbusFace; only the *library* hang is made up
(the connected client's read method never returns), since no server can make pymodbus hang.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from rackplane.core.samples import Quality
from rackplane.io.modbus import OUTER_TIMEOUT_MARGIN_S, ModbusDevice
from sims.modbus_face import ModbusFace
from tests.adapters.test_modbus import CLOCK, Polls, regmap, running, serving, target, until


def _hang_reads(dev: ModbusDevice) -> asyncio.Event:
    """Make the device's current client hang on every read (a pymodbus hang); returns an
    event set when a hung read started."""
    started = asyncio.Event()

    async def hang(*args: Any, **kwargs: Any) -> Any:
        started.set()
        await asyncio.Event().wait()  # never set

    client = dev._client
    assert client is not None
    client.read_input_registers = hang  # type: ignore[method-assign]
    return started


async def test_hung_request_is_abandoned_as_a_timeout_and_polling_recovers() -> None:
    m = regmap({"name": "x", "table": "input", "address": 0, "type": "uint16"})
    face = ModbusFace(m)
    face.update({"x": 5})
    polls = Polls()
    async with serving(face):
        dev = ModbusDevice(target(face.port, poll_interval_s=0.05, timeout_s=0.2), m,
                           clock=CLOCK, on_samples=polls)
        async with running(dev):
            await polls.until(lambda: polls.last("x").quality is Quality.GOOD)
            started = _hang_reads(dev)
            await asyncio.wait_for(started.wait(), 5.0)
            t0 = time.monotonic()
            await polls.until(lambda: polls.last("x").quality is Quality.STALE, within=10.0)
            waited = time.monotonic() - t0
            assert polls.last("x").reason == "timeout"
            assert dev.stats.errors.get("timeout", 0) >= 1
            # not before the guard's deadline (pymodbus' own timeout never ran: it hung)
            assert waited >= 0.2 + OUTER_TIMEOUT_MARGIN_S - 0.1
            # a new client (not hung) reads again
            await polls.until(lambda: polls.last("x").quality is Quality.GOOD, within=10.0)
            assert polls.last("x").value == 5.0
            assert dev.stats.reconnects >= 1
            # the owner still polls at its rate afterwards
            await polls.more(3)


async def test_cancel_during_a_hung_request_stops_the_owner_at_once() -> None:
    m = regmap({"name": "x", "table": "input", "address": 0, "type": "uint16"})
    face = ModbusFace(m)
    face.update({"x": 1})
    async with serving(face):
        dev = ModbusDevice(target(face.port, poll_interval_s=0.05, timeout_s=5.0), m,
                           clock=CLOCK, on_samples=lambda s: None)
        task = asyncio.create_task(dev.run())
        try:
            await until(lambda: dev.stats.ok >= 1)
            started = _hang_reads(dev)
            await asyncio.wait_for(started.wait(), 5.0)
            t0 = time.monotonic()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                async with asyncio.timeout(3.0):  # far before the 6 s request guard
                    await task
            assert time.monotonic() - t0 < 3.0
            assert dev.stats.errors.get("timeout", 0) == 0  # a cancel is not a timeout
        finally:
            task.cancel()


async def test_requests_after_many_polls_keep_one_guard_timer() -> None:
    """The guard costs no timer per request: the loop's scheduled timers stay few while the
    owner polls fast (one asyncio.timeout per request left one cancelled timer each)."""
    m = regmap({"name": "x", "table": "input", "address": 0, "type": "uint16"})
    face = ModbusFace(m)
    async with serving(face):
        dev = ModbusDevice(target(face.port, poll_interval_s=0.005, timeout_s=2.0), m,
                           clock=CLOCK, on_samples=lambda s: None)
        async with running(dev):
            await until(lambda: dev.stats.requests >= 60)
            loop: Any = asyncio.get_running_loop()
            guard_timers = [h for h in loop._scheduled
                            if getattr(h._callback, "__qualname__", "").startswith(
                                "_RequestWatchdog")]
            assert len(guard_timers) <= 1
