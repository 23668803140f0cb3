"""The simulated CDU's controller-epoch fence on its Modbus face (sims/epoch_gate.py, issue 15):
real Modbus TCP clients (`rackplane.io.modbus.ModbusDevice`, each its own connection) against
the virtual rack's CDU face. A controller claims its epoch on its connection; once an epoch is
held, writes on a connection that claimed none or an older one are answered with exception 1,
change nothing and are counted, and the count and the held epoch are readable as registers.
The "old active" here is a client whose own lease gate is open (forced stale: it believes it
still holds) and whose write goes out on its old connection after the new active claimed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rackplane.core.registers import raw_from_registers
from rackplane.errors import ModbusExceptionResponse
from rackplane.io.modbus import ModbusDevice
from rackplane.settings import ModbusTargetSettings
from sims.runtime import VirtualRackSimulator
from tests.adapters.test_sim_faces import CLOCK, scenario, static_faces


@contextlib.asynccontextmanager
async def controller(port: int) -> AsyncIterator[ModbusDevice]:
    dev = ModbusDevice(ModbusTargetSettings(name="cdu", port=port, register_map=Path(
        "cdu-generic"), timeout_s=2.0, poll_enabled=False), clock=CLOCK,
        on_samples=lambda s: None)
    task = asyncio.create_task(dev.run())
    try:
        for _ in range(100):
            if dev.stats.connected:
                break
            await asyncio.sleep(0.02)
        yield dev
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def refused(dev: ModbusDevice, point: str, value: float) -> None:
    with pytest.raises(ModbusExceptionResponse) as err:
        await dev.write(point, value)
    assert err.value.code == 1


def served(sim: VirtualRackSimulator, point: str) -> int:
    p = sim.regmap.point(point)
    return raw_from_registers(p, sim.face.registers(p.table, p.address, p.words))


async def test_claims_per_connection_fence_an_old_active_and_count_it() -> None:
    async with static_faces(scenario()) as sim:
        gate, plant = sim.epoch_gate, sim.run_.plant
        assert gate is not None
        async with controller(sim.face.port) as old, controller(sim.face.port) as new:
            # no epoch claimed yet: a single controller writes as it always has
            await old.write("valve_command_pct", 30.0)
            assert plant.truth().valve_command_pct == pytest.approx(30.0)
            await old.write("controller_epoch", 5)
            await old.write("valve_command_pct", 40.0)
            await refused(new, "valve_command_pct", 90.0)  # never claimed: refused, counted
            assert plant.fence.stale_writes == 1
            await new.write("controller_epoch", 7)         # the takeover
            claimed_at = CLOCK.monotonic()
            await new.write("valve_command_pct", 60.0)
            # the old active's write, already past its own lease check, on its old connection
            await refused(old, "valve_command_pct", 10.0)
            await refused(old, "heartbeat", 3)
            await refused(old, "controller_epoch", 5)      # and its claim of the old epoch
            await new.write("heartbeat", 4)
            sim.serve()
            assert plant.truth().valve_command_pct == pytest.approx(60.0)
            assert plant.fence.stale_writes == 4
            assert served(sim, "controller_stale_writes") == 4
            assert served(sim, "controller_epoch") == 7
            after = gate.accepted_after(claimed_at)
            assert after and all(r.epoch == 7 for r in after)  # nothing from epoch 5 accepted
            assert gate.claim_of(1) == 5 and gate.claim_of(2) == 7
        # a restarted controller (a new connection) must claim again, and only a newer epoch
        async with controller(sim.face.port) as again:
            await refused(again, "valve_command_pct", 20.0)
            await again.write("controller_epoch", 7)
            await again.write("valve_command_pct", 20.0)
        assert plant.fence.stale_writes == 5


async def test_the_registers_hold_the_exact_64_bit_epoch() -> None:
    async with static_faces(scenario()) as sim:
        big = 2**63 + 12345  # not exact as a float: served from the fence's int
        sim.run_.plant.write("controller_epoch", 1.0)
        sim.run_.plant.fence.admit("controller_epoch", big)
        sim.serve()
        assert served(sim, "controller_epoch") == big
        assert sim.run_.plant.readings()["controller_epoch"] == float(big)
