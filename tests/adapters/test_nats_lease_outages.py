"""Leadership leases through NATS outages, each on a 3-node cluster of its own (Debian
nats-server 2.9.10): the KV stream's leader killed → no change of holder and no fencing (the
default timing: renew every 2 s, deadline 10 s, a stream election of 4–9 s); quorum lost with
the stream leader left alone → the holder fences itself within the renew deadline and nobody
acquires; quorum back → one holder again, with a higher epoch (before the probes, this case
gave two: every compare-and-set queued during the outage committed)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from harness.servers import NatsCluster
from rackplane.clock import SYSTEM_CLOCK
from rackplane.core.leadership import LeadershipEvent, LeaseTiming
from rackplane.io.nats.kv import NatsKv
from rackplane.io.nats.lease import LeaseRunner, lease_key
from tests.adapters.test_nats_lease import wait_until

pytestmark = [pytest.mark.servers, pytest.mark.slow]

BUCKET = "leases"
KEY = lease_key("site1", "r01", "valvey")


class Pair:
    """Two contenders (a, b) on the cluster, their events, their tasks."""

    def __init__(self, kvs: list[NatsKv], timing: LeaseTiming) -> None:
        self.kvs = kvs
        self.events: list[tuple[str, LeadershipEvent]] = []
        self.runners = [
            LeaseRunner(kv, KEY, inst, timing,
                        on_event=lambda ev, inst=inst: self.events.append((inst, ev)))
            for kv, inst in zip(kvs, "ab", strict=True)]
        self.tasks = [asyncio.create_task(r.run()) for r in self.runners]

    def holder(self, now: float) -> LeaseRunner | None:
        held = [r for r in self.runners if r.may_write(now)]
        assert len(held) <= 1, "two writers"
        return held[0] if held else None

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for kv in self.kvs:
            await kv.close()


@pytest.fixture
async def pair_factory(nats_cluster_private: NatsCluster) -> AsyncIterator[object]:
    made: list[Pair] = []

    async def make(timing: LeaseTiming) -> Pair:
        urls = nats_cluster_private.urls
        kvs = [await NatsKv.connect(urls, BUCKET),
               await NatsKv.connect(list(reversed(urls)), BUCKET)]
        made.append(Pair(kvs, timing))
        return made[-1]

    yield make
    for p in made:
        await p.close()


async def test_killing_the_kv_stream_leader_changes_no_holder_and_fences_nobody(
    nats_cluster_private: NatsCluster, pair_factory: object,
) -> None:
    cluster = nats_cluster_private
    pair: Pair = await pair_factory(LeaseTiming())  # type: ignore[operator]
    await wait_until(lambda now: pair.holder(now) is not None)
    holder = pair.holder(SYSTEM_CLOCK.monotonic())
    assert holder is not None
    epoch, revision = holder.epoch, holder.lease.revision
    # kill right after a confirmed renewal (the deadline then has the most room left)
    await wait_until(lambda now: holder.lease.revision > revision)
    revision = holder.lease.revision
    leader = await asyncio.to_thread(cluster.wait_stream_leader, f"KV_{BUCKET}")
    events_before = len(pair.events)
    killed_at = SYSTEM_CLOCK.monotonic()
    await asyncio.to_thread(cluster.node(leader).kill)
    # until the holder's renewals are confirmed again (by a new stream leader)
    renewed_at = await wait_until(
        lambda now: pair.holder(now) is holder and holder.lease.revision > revision,
        timeout_s=30)
    new_leader = await asyncio.to_thread(cluster.wait_stream_leader, f"KV_{BUCKET}", leader)
    assert new_leader != leader
    # watch two more renewal periods: still the same holder, same epoch
    end = SYSTEM_CLOCK.monotonic() + 4.0
    await wait_until(lambda now: pair.holder(now) is not holder or now > end)
    assert pair.holder(SYSTEM_CLOCK.monotonic()) is holder
    assert holder.epoch == epoch
    after = [(inst, ev.kind) for inst, ev in pair.events[events_before:]]
    assert not [e for e in after if e[1] in ("fenced", "lost", "acquired")], after
    print(f"stream leader {leader} killed: renewals confirmed again after "
          f"{renewed_at - killed_at:.1f} s, holder kept epoch {epoch}")


async def test_quorum_lost_the_holder_fences_within_the_deadline_and_nobody_acquires(
    nats_cluster_private: NatsCluster, pair_factory: object,
) -> None:
    cluster = nats_cluster_private
    # shorter than the defaults: no election is ridden through here
    timing = LeaseTiming(lease_s=6.0, renew_every_s=1.0, renew_deadline_s=4.0,
                         retry_every_s=0.25, election_max_s=3.5)
    pair: Pair = await pair_factory(timing)  # type: ignore[operator]
    await wait_until(lambda now: pair.holder(now) is not None)
    holder = pair.holder(SYSTEM_CLOCK.monotonic())
    assert holder is not None
    epoch = holder.epoch
    # the two nodes that do not lead the KV stream: the leader, alone, still answers reads
    # (stale) while no write commits — the case where 2.9.10 commits every queued
    # compare-and-set once the quorum returns (nats-server issue 4320)
    leader = await asyncio.to_thread(cluster.wait_stream_leader, f"KV_{BUCKET}")
    killed = [n for n in cluster.nodes if n.name != leader]
    killed_at = SYSTEM_CLOCK.monotonic()
    for n in killed:
        await asyncio.to_thread(n.kill)
    fenced_at = await wait_until(lambda now: pair.holder(now) is None, timeout_s=30)
    assert fenced_at <= killed_at + timing.renew_deadline_s + 0.05  # one poll of slack
    # nobody acquires while the quorum is lost: watch past a whole lease
    end = fenced_at + timing.lease_s + 2.0
    await wait_until(lambda now: pair.holder(now) is not None or now > end, timeout_s=30)
    assert pair.holder(SYSTEM_CLOCK.monotonic()) is None
    assert [ev.kind for _, ev in pair.events].count("acquired") == 1
    # quorum back: a holder again, with a higher epoch
    for n in killed:
        await asyncio.to_thread(n.start)
    back_at = await wait_until(lambda now: pair.holder(now) is not None, timeout_s=60)
    again = pair.holder(back_at)
    assert again is not None and again.epoch > epoch
    # queued writes committing late must not make a second writer: watch a while
    end = SYSTEM_CLOCK.monotonic() + 3 * timing.renew_every_s
    await wait_until(lambda now: pair.holder(now) is not again or now > end, timeout_s=30)
    assert pair.holder(SYSTEM_CLOCK.monotonic()) is again
    print(f"quorum lost: fenced {fenced_at - killed_at:.1f} s after the kill; "
          f"a holder again {back_at - killed_at:.1f} s after it (epoch {epoch} -> {again.epoch})")
