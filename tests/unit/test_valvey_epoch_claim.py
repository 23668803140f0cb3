"""valvey.pair.EpochClaimer: the epoch is claimed before any other write of a tenure and of a
connection; writes wait (latest per point) until the claim is confirmed; a failed claim is
retried at the next tick, a claim that straddles a reconnect is made again; standby drops it."""

from __future__ import annotations

import asyncio
from typing import Any

from rackplane.errors import ModbusExceptionResponse
from rackplane.log import get_logger
from valvey.pair import EpochClaimer


class FakeDevice:
    def __init__(self) -> None:
        self.connection_serial = 1
        self.sent: list[tuple[str, float]] = []
        self.refuse = False
        self.reconnect_during_write = False

    async def write(self, point: str, value: float) -> None:
        await asyncio.sleep(0)
        if self.reconnect_during_write:
            self.connection_serial += 1
            self.reconnect_during_write = False
        if self.refuse:
            raise ModbusExceptionResponse(1)
        self.sent.append((point, value))


class Outputs:
    def __init__(self, dev: FakeDevice) -> None:
        self.dev = dev

    def submit(self, point: str, value: float) -> None:
        self.dev.sent.append((point, value))


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def claimer(dev: FakeDevice) -> EpochClaimer:
    out: Any = Outputs(dev)
    return EpochClaimer(dev, "controller_epoch", out, 1.0, get_logger("test"))  # type: ignore[arg-type]


async def test_claim_first_then_held_writes_then_direct() -> None:
    dev = FakeDevice()
    c = claimer(dev)
    c.route(7, [("valve_command_pct", 40.0), ("heartbeat", 1.0)])
    c.route(7, [("valve_command_pct", 41.0)])  # while the claim is in flight: latest wins
    assert dev.sent == []
    await settle()
    assert dev.sent == [("controller_epoch", 7.0), ("valve_command_pct", 41.0), ("heartbeat", 1.0)]
    c.route(7, [("heartbeat", 2.0)])
    assert dev.sent[-1] == ("heartbeat", 2.0) and c.claims_ok == 1
    # a new connection: claim again before the next write
    dev.connection_serial = 2
    c.route(7, [("heartbeat", 3.0)])
    await settle()
    assert dev.sent[-2:] == [("controller_epoch", 7.0), ("heartbeat", 3.0)]
    # a new tenure: its epoch first
    c.route(9, [("heartbeat", 4.0)])
    await settle()
    assert dev.sent[-2:] == [("controller_epoch", 9.0), ("heartbeat", 4.0)]
    assert c.claims_ok == 3


async def test_a_refused_claim_holds_the_writes_and_is_retried() -> None:
    dev = FakeDevice()
    c = claimer(dev)
    dev.refuse = True
    c.route(5, [("heartbeat", 1.0)])
    await settle()
    assert dev.sent == [] and c.claims_failed == 1 and c.held == {"heartbeat": 1.0}
    dev.refuse = False
    c.route(5, [("heartbeat", 2.0)])
    await settle()
    assert dev.sent == [("controller_epoch", 5.0), ("heartbeat", 2.0)]


async def test_a_claim_across_a_reconnect_is_made_again_and_standby_drops_it() -> None:
    dev = FakeDevice()
    c = claimer(dev)
    dev.reconnect_during_write = True
    c.route(5, [("heartbeat", 1.0)])
    await settle()
    assert c.claimed is None and dev.sent == [("controller_epoch", 5.0)]
    c.route(5, [])
    await settle()
    assert c.claimed == (5, 2) and dev.sent[-1] == ("heartbeat", 1.0)
    c.standby()
    assert c.claimed is None and not c.held


async def test_an_epoch_not_exact_as_a_float_is_never_written() -> None:
    dev = FakeDevice()
    c = claimer(dev)
    c.route(2**53 + 1, [("heartbeat", 1.0)])
    await settle()
    assert dev.sent == [] and c.claims_failed == 1
