"""The leadership fence is asked again right before a write goes out (issue 15: an active
paused past its renew deadline, then resumed, "writes nothing, not even a queued write").
`ModbusDevice.write` checks ``write_gate`` when called; a write that then waits — queued to the
owner task, or for the shared connection's lock held by another unit's request — while the
lease is lost must never reach the device. Real TCP against `sims.modbus_face`, which records
every request it receives."""

from __future__ import annotations

import asyncio

import pytest

from rackplane.core.registers import RegisterMap, parse_register_map
from rackplane.errors import WriteFenced
from rackplane.io.modbus import ModbusDevice, ModbusLinks
from sims.modbus_face import ModbusFace
from tests.adapters.test_modbus_gateway import CLOCK, Sink, target, until

WRITE_FCS = {5, 6, 15, 16}


def heartbeat_map() -> RegisterMap:
    return parse_register_map({"device": {"name": "cdu"}, "points": [
        {"name": "supply_temp_c", "table": "input", "address": 0, "type": "uint16"},
        {"name": "heartbeat", "table": "holding", "address": 10, "type": "uint16",
         "writable": True, "write_min": 0, "write_max": 65535},
    ]})


def writes_of(face: ModbusFace) -> int:
    return sum(1 for r in face.requests if r.function_code in WRITE_FCS)


@pytest.mark.parametrize("waiting_for", ["connection_lock", "owner_queue"])
async def test_a_write_waiting_when_the_lease_is_lost_never_reaches_the_device(
        waiting_for: str) -> None:
    face = ModbusFace(heartbeat_map(), unit_ids=(1,))
    face.update({"supply_temp_c": 45}, unit=1)
    await face.start()
    holding = {"lease": True}
    try:
        s = target(face.port, 1, register_map="cdu", poll_interval_s=0.05)
        links = ModbusLinks()
        dev = ModbusDevice(s, face.regmap, clock=CLOCK, on_samples=Sink(), link=links.get(s))
        dev.write_gate = lambda: holding["lease"]
        task = asyncio.create_task(dev.run())
        try:
            await until(lambda: dev.stats.available and face.requests)
            await dev.write("heartbeat", 1)  # holding the lease: written
            assert writes_of(face) == 1
            if waiting_for == "connection_lock":
                await dev._link.lock.acquire()  # another unit's request on the shared link
            pending = asyncio.create_task(dev.write("heartbeat", 2))  # gate open when called
            await asyncio.sleep(0.02 if waiting_for == "connection_lock" else 0)
            holding["lease"] = False  # the renew deadline passes while the write waits
            if waiting_for == "connection_lock":
                dev._link.lock.release()
            with pytest.raises(WriteFenced, match="lease was lost while the write waited"):
                await asyncio.wait_for(pending, 5.0)
            await asyncio.sleep(0.2)  # polls go on; nothing else is written
            assert writes_of(face) == 1, [r for r in face.requests
                                          if r.function_code in WRITE_FCS]
            assert dev.stats.errors.get("write_fenced") == 1
            assert "internal_error" not in dev.stats.errors
            with pytest.raises(WriteFenced):  # and a new write is refused when called
                await dev.write("heartbeat", 3)
            holding["lease"] = True
            await dev.write("heartbeat", 4)
            assert writes_of(face) == 2
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    finally:
        await face.stop()
