"""A `rackplane.io.nats.kv.NatsKv` operation cancelled at any point ends cancelled, on a real
3-node NATS cluster.

nats-py swallows a cancellation in places (its ``_flush_pending`` under every publish catches
``CancelledError`` and returns; its close and reconnect loops too): the operation then went on
as if nothing had happened, and a task that loops over them (racky's ``fleet`` task: its
reader and reporter) never ended, so a daemon's stop, or a test's cancel, waited on it without
end (seen: `racky.fleet.FleetLink` cancelled 2-5 ms into its start, 3 of 40 tries). The
adapter re-raises the cancellation after every nats-py call. Here each operation is started
and cancelled after 0, 1, 2, ... event-loop iterations (150 each: the swallowing points move
with the network's timing, so the sweep is wide); before the fix some of them went on (e.g.
``read`` at 4, 6, 56 and 119 iterations; ``put`` at 19) in every run.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable

import pytest

from harness.servers import NatsCluster
from rackplane.io.nats.kv import KvUnknown, NatsKv

pytestmark = [pytest.mark.servers]

SWEEP = 150


async def _sweep(c: NatsCluster) -> dict[str, list[int]]:
    kv = None
    for _ in range(20):  # a fresh cluster's JetStream may need seconds to make a bucket
        with contextlib.suppress(KvUnknown):
            kv = await NatsKv.connect(c.urls, f"cancel_{uuid.uuid4().hex[:8]}",
                                      request_timeout_s=1.0)
            break
        await asyncio.sleep(0.5)
    assert kv is not None, "no bucket"
    await kv.put("a.b", b"x")
    ops: dict[str, Callable[[], Awaitable[object]]] = {
        "read": lambda: kv.read("a.b"), "put": lambda: kv.put("a.b", b"y"),
        "subscribe_key": lambda: kv.subscribe_key("a.b", lambda _v, _d: None)}
    went_on: dict[str, list[int]] = {}
    try:
        for name, op in ops.items():
            went_on[name] = []
            for k in range(SWEEP):
                async def body(op: Callable[[], Awaitable[object]] = op) -> None:
                    await op()
                    await asyncio.sleep(30)  # a swallowed cancel leaves the task here

                task = asyncio.create_task(body())
                for _ in range(k):
                    await asyncio.sleep(0)
                task.cancel()
                done, _ = await asyncio.wait({task}, timeout=2.0)
                if task not in done or not task.cancelled():
                    went_on[name].append(k)
                    task.cancel()
                    await asyncio.wait({task}, timeout=2.0)
    finally:
        await kv.close()
    return went_on


def test_an_operation_cancelled_at_any_point_ends_cancelled(nats_cluster: NatsCluster) -> None:
    went_on = asyncio.run(_sweep(nats_cluster))
    assert went_on == {"read": [], "put": [], "subscribe_key": []}, went_on
