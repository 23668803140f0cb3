"""Partial register maps (issue 14 item 6): addresses a device refuses are learned and not
read again until a slow re-probe; a block read across a refused address is split so the good
points keep reading. Real TCP against the simulators' pymodbus server (`sims.modbus_face`):
the face serves a map without some of the points the device's map names (exception 2), or
refuses one point's value (exception 3)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import structlog

from rackplane.clock import SystemClock
from rackplane.core.registers import RegisterMap, parse_register_map
from rackplane.core.samples import Quality, Sample
from rackplane.io.modbus import ModbusDevice
from rackplane.settings import ModbusTargetSettings
from sims.modbus_face import ModbusFace

CLOCK = SystemClock()

GOOD_POINTS = [
    {"name": "supply_temp_c", "table": "input", "address": 0, "type": "uint16"},
    {"name": "flow_lpm", "table": "input", "address": 2, "type": "uint16"},
    {"name": "return_temp_c", "table": "input", "address": 10, "type": "uint16"},
]
#: Points the daemon's map names that this device does not have.
ABSENT_POINTS = [
    {"name": "dp_kpa", "table": "input", "address": 1, "type": "uint16"},  # inside a block
    {"name": "heat_kw", "table": "input", "address": 30, "type": "uint16"},  # alone
]


def rmap(points: list[dict[str, Any]]) -> RegisterMap:
    return parse_register_map({"device": {"name": "cdu"}, "points": points})


def target(port: int, **kw: Any) -> ModbusTargetSettings:
    base: dict[str, Any] = {
        "name": "cdu", "host": "127.0.0.1", "port": port, "unit_id": 1,
        "register_map": "cdu", "poll_interval_s": 0.02, "timeout_s": 0.3,
        "max_gap_registers": 8, "refused_reprobe_s": 600.0,
    }
    base.update(kw)
    return ModbusTargetSettings.model_validate(base)


class Sink:
    def __init__(self) -> None:
        self.polls: list[dict[str, Sample]] = []

    def __call__(self, samples: list[Sample]) -> None:
        self.polls.append({s.point: s for s in samples})


async def until(cond: Any, within: float = 10.0) -> None:
    async with asyncio.timeout(within):
        while not cond():  # noqa: ASYNC110 (polling counters of the objects under test)
            await asyncio.sleep(0.01)


def exception_replies(face: ModbusFace, address: int) -> int:
    """Requests the face received that cover ``address`` (each answered 2 or 3)."""
    return sum(1 for r in face.requests
               if r.address is not None and r.count is not None
               and r.address <= address < r.address + r.count)


async def test_refused_addresses_are_not_read_every_poll() -> None:
    face = ModbusFace(rmap(GOOD_POINTS))
    face.update({"supply_temp_c": 30, "flow_lpm": 400, "return_temp_c": 40})
    sink = Sink()
    await face.start()
    try:
        with structlog.testing.capture_logs() as logs:
            dev = ModbusDevice(target(face.port), rmap(GOOD_POINTS + ABSENT_POINTS),
                               clock=CLOCK, on_samples=sink)
            task = asyncio.create_task(dev.run())
            try:
                await until(lambda: len(sink.polls) >= 40)
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
    finally:
        await face.stop()
    # the plan learns (block 0-10 -> 0-2 -> each point alone), each absent address is refused
    # alone once, then never asked again within the re-probe interval: 4 exception replies in
    # 40 polls (was: 2 per poll, forever)
    assert exception_replies(face, 1) == 3
    assert exception_replies(face, 30) == 1
    assert dev.stats.exception_replies == 4
    assert dev.stats.refused_points == 2
    last = sink.polls[-1]
    for p in GOOD_POINTS:  # the good points of the split block keep reading
        assert last[p["name"]].quality is Quality.GOOD, last[p["name"]]
    assert last["supply_temp_c"].value == 30 and last["flow_lpm"].value == 400
    for p in ABSENT_POINTS:  # refused: BAD with the device's reason, not STALE, not GOOD
        s = last[p["name"]]
        assert (s.quality, s.reason) == (Quality.BAD, "illegal_data_address")
    refused = [e for e in logs if e["event"] == "modbus_point_refused"]
    assert sorted(e["point"] for e in refused) == ["dp_kpa", "heat_kw"]


async def test_refused_value_exception_3_and_slow_reprobe() -> None:
    """A point refused with 3 is refused too; after ``refused_reprobe_s`` it is read again,
    and read from then on once the device answers it."""
    points = [*GOOD_POINTS,
              {"name": "level_pct", "table": "input", "address": 40, "type": "uint16"}]
    face = ModbusFace(rmap(points))
    face.update({"level_pct": 77})
    face.inject_exception(3, table="input", address=40)
    sink = Sink()
    await face.start()
    try:
        dev = ModbusDevice(target(face.port, refused_reprobe_s=0.3), rmap(points),
                           clock=CLOCK, on_samples=sink)
        task = asyncio.create_task(dev.run())
        try:
            await until(lambda: dev.stats.refused_points == 1)
            asked = exception_replies(face, 40)
            assert sink.polls[-1]["level_pct"].reason == "illegal_data_value"
            await until(lambda: exception_replies(face, 40) > asked)  # the re-probe
            face.clear_exceptions()
            await until(lambda: sink.polls[-1]["level_pct"].quality is Quality.GOOD)
            assert sink.polls[-1]["level_pct"].value == 77
            assert dev.stats.refused_points == 0
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    finally:
        await face.stop()


@pytest.mark.parametrize("reprobe_s", [0.0, -1.0, float("nan")])
def test_reprobe_interval_is_bounded(reprobe_s: float) -> None:
    with pytest.raises(ValueError, match=r"refused_reprobe_s\n.*(greater than|finite)"):
        target(1, refused_reprobe_s=reprobe_s)
