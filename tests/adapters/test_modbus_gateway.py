"""Devices behind one Modbus TCP gateway (issue 14 item 5): units at one host:port share one
connection, each with its own bulkhead. Real TCP against the simulators' pymodbus server
(`sims.modbus_face`), which counts the connections it accepts."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import structlog

from rackplane.clock import SystemClock
from rackplane.core.registers import RegisterMap, parse_register_map
from rackplane.core.samples import Quality, Sample
from rackplane.io.modbus import ModbusDevice, ModbusLinks
from rackplane.settings import ModbusTargetSettings
from sims.modbus_face import ModbusFace

CLOCK = SystemClock()
UNITS = (1, 2, 3)


def shelf_map() -> RegisterMap:
    return parse_register_map({"device": {"name": "shelf"}, "points": [
        {"name": "power_w", "table": "input", "address": 0, "type": "uint16"},
        {"name": "voltage_v", "table": "input", "address": 1, "type": "uint16"},
    ]})


def target(port: int, unit: int, **kw: Any) -> ModbusTargetSettings:
    base: dict[str, Any] = {
        "name": f"shelf{unit}", "host": "127.0.0.1", "port": port, "unit_id": unit,
        "register_map": "shelf", "poll_interval_s": 0.05, "timeout_s": 0.2,
        "reconnect_min_s": 0.1, "reconnect_max_s": 0.5, "dormant_reprobe_s": 30.0,
    }
    base.update(kw)
    return ModbusTargetSettings.model_validate(base)


class Sink:
    def __init__(self) -> None:
        self.polls: list[list[Sample]] = []

    def __call__(self, samples: list[Sample]) -> None:
        self.polls.append(samples)

    def good(self) -> int:
        return sum(all(s.quality is Quality.GOOD for s in p) for p in self.polls)


@contextlib.asynccontextmanager
async def gateway(face: ModbusFace, **kw: Any
                  ) -> AsyncIterator[tuple[dict[int, ModbusDevice], dict[int, Sink]]]:
    """Three shelves (units 1-3) behind the face's port, wired as racky wires them."""
    m = face.regmap
    links = ModbusLinks()
    sinks = {u: Sink() for u in UNITS}
    devs = {}
    for u in UNITS:
        s = target(face.port, u, **kw)
        devs[u] = ModbusDevice(s, m, clock=CLOCK, on_samples=sinks[u], link=links.get(s))
    assert len(links) == 1
    tasks = [asyncio.create_task(d.run()) for d in devs.values()]
    try:
        yield devs, sinks
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def until(cond: Any, within: float = 10.0) -> None:
    async with asyncio.timeout(within):
        while not cond():  # noqa: ASYNC110 (polling counters of the objects under test)
            await asyncio.sleep(0.01)


def requests_of(face: ModbusFace, unit: int) -> int:
    return sum(1 for r in face.requests if r.unit == unit)


@pytest.mark.parametrize("dead", ["silent", "exception_11", "exception_10"])
async def test_three_units_one_connection_dead_unit_costs_its_own_slots(dead: str) -> None:
    """Unit 2 dead (no answer, or the gateway answers 10/11 for it): one TCP connection for
    the whole run; units 1 and 3 keep polling GOOD; unit 2 is unavailable after a few
    failures and not read again before its dormant re-probe (30 s here)."""
    face = ModbusFace(shelf_map(), unit_ids=UNITS)
    for u in UNITS:
        face.update({"power_w": 1000 * u, "voltage_v": 50}, unit=u)
    if dead == "silent":
        face.silent_units.add(2)
    else:
        face.inject_exception(10 if dead == "exception_10" else 11, unit=2)
    await face.start()
    try:
        with structlog.testing.capture_logs() as logs:
            async with gateway(face) as (devs, sinks):
                await until(lambda: not devs[2].stats.available)
                sent_when_unavailable = requests_of(face, 2)
                await until(lambda: sinks[1].good() >= 30 and sinks[3].good() >= 30)
                assert requests_of(face, 2) == sent_when_unavailable  # dormant: not read
                assert devs[2].stats.dormant_polls > 0
                last = sinks[2].polls[-1]
                assert all(s.quality is Quality.STALE for s in last)
    finally:
        await face.stop()
    assert face.connections == 1
    # "silent": unavailable after `unavailable_after_failures` (3) timeouts; 10/11: at once
    assert sent_when_unavailable == (3 if dead == "silent" else 1)
    assert all(devs[u].stats.available for u in (1, 3))
    assert devs[1].stats.reconnects == devs[3].stats.reconnects == 0
    assert len([e for e in logs if e["event"] == "modbus_unit_unavailable"]) == 1


async def test_unavailable_unit_is_reprobed_and_comes_back() -> None:
    face = ModbusFace(shelf_map(), unit_ids=UNITS)
    face.inject_exception(11, unit=2)
    await face.start()
    try:
        async with gateway(face, dormant_reprobe_s=0.3) as (devs, sinks):
            await until(lambda: not devs[2].stats.available)
            face.clear_exceptions()
            await until(lambda: devs[2].stats.available)
            await until(lambda: sinks[2].polls[-1][0].quality is Quality.GOOD)
    finally:
        await face.stop()
    assert face.connections == 1


async def test_every_unit_silent_replaces_the_shared_connection() -> None:
    """When no unit answers any more, it is the gateway or the connection: replaced (once per
    silence, not per unit), and every unit recovers on the new one."""
    face = ModbusFace(shelf_map(), unit_ids=UNITS)
    await face.start()
    try:
        async with gateway(face, unavailable_after_failures=50) as (_devs, sinks):
            await until(lambda: all(s.good() >= 2 for s in sinks.values()))
            face.blackhole = True
            await until(lambda: face.connections >= 2)
            face.blackhole = False
            n = {u: sinks[u].good() for u in UNITS}
            await until(lambda: all(sinks[u].good() > n[u] for u in UNITS))
    finally:
        await face.stop()
    assert face.connections <= 3


async def test_units_on_different_ports_keep_their_own_connections() -> None:
    a, b = ModbusFace(shelf_map()), ModbusFace(shelf_map())
    await a.start()
    await b.start()
    try:
        links = ModbusLinks()
        devs = []
        for face in (a, b):
            s = target(face.port, 1, name=f"d{face.port}")
            devs.append(ModbusDevice(s, face.regmap, clock=CLOCK, on_samples=lambda x: None,
                                     link=links.get(s)))
        assert len(links) == 2
        for d in devs:
            assert [x.quality for x in await d.read_once()] == [Quality.GOOD] * 2
    finally:
        await a.stop()
        await b.stop()
