"""Leadership leases on a real 3-node NATS JetStream cluster (Debian nats-server 2.9.10):
the KV adapter's contract, two contenders → exactly one holder, takeover after expiry with a
higher epoch. Node kills and lost quorum are in test_nats_lease_outages.py (a cluster each).

The timing here is shortened (no election happens in these tests, so ``election_max_s`` is
set below the renew deadline); the outage tests use the defaults where elections matter."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable

import pytest

from harness.servers import NatsCluster
from rackplane.clock import SYSTEM_CLOCK
from rackplane.core.leadership import LeaseTiming
from rackplane.io.nats.errors import KvConflict, KvError
from rackplane.io.nats.kv import NatsKv
from rackplane.io.nats.lease import LeaseRunner, lease_key

pytestmark = pytest.mark.servers

FAST = LeaseTiming(lease_s=3.0, renew_every_s=0.5, renew_deadline_s=2.0, retry_every_s=0.2,
                   election_max_s=1.0)
_n = itertools.count()


@pytest.fixture
async def kvs(nats_cluster: NatsCluster) -> AsyncIterator[list[NatsKv]]:
    """Two clients (two contenders' connections) on a bucket of this test's own."""
    bucket = f"leases{next(_n)}"
    a = await NatsKv.connect(nats_cluster.urls, bucket)
    b = await NatsKv.connect(list(reversed(nats_cluster.urls)), bucket)
    yield [a, b]
    await a.close()
    await b.close()


async def test_kv_contract_create_cas_delete_and_the_bucket_shape(
    nats_cluster: NatsCluster, kvs: list[NatsKv],
) -> None:
    kv = kvs[0]
    key = lease_key("site1", "r01", "valvey")
    assert await kv.read(key) is None
    r1 = await kv.create(key, b"one")
    with pytest.raises(KvConflict):
        await kvs[1].create(key, b"two")
    with pytest.raises(KvConflict):
        await kv.update(key, b"stale", last=r1 + 100)
    r2 = await kvs[1].update(key, b"two", last=r1)
    assert r2 > r1
    assert await kv.read(key) == (r2, b"two")
    with pytest.raises(KvConflict):
        await kv.delete(key, last=r1)
    await kv.delete(key, last=r2)
    assert await kv.read(key) is None
    r3 = await kv.create(key, b"three")  # create-if-absent over a deleted key
    assert r3 > r2
    with pytest.raises(ValueError, match="key"):
        await kv.read("has space")
    # the bucket: 3 replicas, history 1, no TTL, no direct gets; reopening with others refused
    stream = f"KV_{kv.bucket}"
    assert await asyncio.to_thread(nats_cluster.wait_stream_leader, stream)
    info = next(s for d in nats_cluster._ask("accounts=true&streams=true&config=true")
                for acc in d.get("account_details", []) for s in acc.get("stream_detail", [])
                if s["name"] == stream)
    assert info["config"]["num_replicas"] == 3
    assert info["config"]["max_msgs_per_subject"] == 1
    assert info["config"].get("max_age", 0) == 0
    assert not info["config"].get("allow_direct", False)
    with pytest.raises(KvError, match="replicas"):
        await NatsKv.connect(nats_cluster.urls, kv.bucket, replicas=1)


async def wait_until(pred: Callable[[float], bool], timeout_s: float = 30.0) -> float:
    """Poll ``pred(now)`` every 10 ms until true (bounded); the time it became true.

    Raises:
        TimeoutError: not within ``timeout_s``.
    """
    for _ in range(int(timeout_s / 0.01)):
        now = SYSTEM_CLOCK.monotonic()
        if pred(now):
            return now
        await asyncio.sleep(0.01)
    raise TimeoutError(f"not within {timeout_s} s")


async def _watch(runners: list[LeaseRunner], seconds: float) -> list[tuple[float, list[bool]]]:
    """Sample every runner's `may_write` every 10 ms for ``seconds``."""
    samples = []
    end = SYSTEM_CLOCK.monotonic() + seconds
    while (now := SYSTEM_CLOCK.monotonic()) < end:
        samples.append((now, [r.may_write(now) for r in runners]))
        await asyncio.sleep(0.01)
    return samples


async def test_two_contenders_exactly_one_holder(kvs: list[NatsKv]) -> None:
    key = lease_key("site1", "r02", "valvey")
    runners = [LeaseRunner(kv, key, inst, FAST) for kv, inst in zip(kvs, "ab", strict=True)]
    tasks = [asyncio.create_task(r.run()) for r in runners]
    try:
        samples = await _watch(runners, 4.0)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert all(sum(s) <= 1 for _, s in samples)
    holders = {i for _, s in samples for i, w in enumerate(s) if w}
    assert len(holders) == 1  # one holder throughout: no flapping
    holder = runners[holders.pop()]
    other = next(r for r in runners if r is not holder)
    assert sum(s[runners.index(holder)] for _, s in samples) > 0.9 * len(samples)
    assert other.status().holder_seen == holder.owner
    got = await kvs[0].read(key)
    assert got is not None and holder.owner.encode() in got[1]


async def test_holder_stops_renewing_the_other_acquires_after_expiry_with_a_higher_epoch(
    kvs: list[NatsKv],
) -> None:
    key = lease_key("site1", "r03", "racky")
    a = LeaseRunner(kvs[0], key, "a", FAST)
    ta = asyncio.create_task(a.run())
    await wait_until(a.may_write)
    b = LeaseRunner(kvs[1], key, "b", FAST)
    tb = asyncio.create_task(b.run())
    try:
        await asyncio.sleep(1.0)
        assert not b.may_write(SYSTEM_CLOCK.monotonic())
        epoch_a = a.epoch
        ta.cancel()  # a dies: no more renewals
        await asyncio.gather(ta, return_exceptions=True)
        fence_a = SYSTEM_CLOCK.monotonic() + a.status().fence_in_s  # a's own fence time
        acquired = await wait_until(b.may_write)
    finally:
        tb.cancel()
        await asyncio.gather(tb, return_exceptions=True)
    assert acquired >= fence_a  # never before a fenced itself
    assert b.epoch > epoch_a
    assert not a.may_write(acquired)
