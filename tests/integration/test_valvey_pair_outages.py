"""A valvey pair through NATS outages (issue 15, item 4): two valvey processes, a private
3-node NATS JetStream cluster per test (its nodes killed, stopped and paused), Mosquitto, and
the simulated CDU in this process behind Modbus TCP with its controller-epoch gate
(sims/epoch_gate.py), whose records give every figure: when each epoch's writes were accepted,
from which connection, and every write refused as stale.

- **the KV stream's leader killed**: no change of active (one epoch, one connection), no
  fencing, the writes go on (the largest gap between accepted writes stays a tick-scale
  figure), while the holder's renewals did stall through the stream's election;
- **quorum lost** (the 2 nodes that do not lead the KV stream killed): the active stops
  writing by its renew deadline, counted from the kill (and not before its last confirmed
  renewal could have run out), the CDU falls back to local control on its heartbeat, the
  standby does not take over, both instances keep running; quorum back → one active again,
  with a newer epoch, and the CDU back under remote control;
- **the active's host partitioned from the bus**: each instance reaches one NATS node of its
  own, and the active's node is paused (SIGSTOP: its TCP connections stay open and nothing
  answers, as for a host whose network is cut), while the standby's node and the third
  still make a quorum. The active fences itself, the standby takes over after the lease (not
  before the old active's last accepted write; when the cut node led the KV stream, also
  after the stream's election, which this test's 3 s lease does not cover), the CDU accepts
  nothing from the old epoch; the node resumed, the old active finds itself standby.

Why not an ``ip netns`` test host: an unprivileged user namespace (``unshare -rn``) gives a
network namespace with only its own loopback; joining it to the cluster needs a veth pair in
the parent namespace (CAP_NET_ADMIN there, i.e. root) or a user-mode stack (slirp4netns,
pasta: not packaged here), so such a test could not run as an ordinary user in CI. Pausing
the only node the active's host reaches cuts that host off the bus the same way, unprivileged.

Every figure is computed from the run, printed, and put in the assertion messages.
"""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path
from typing import Any

import pytest

from harness.chaos import (
    LEASE,
    RIDE_THROUGH,
    RIDE_WATCHDOG_S,
    SHORT_WATCHDOG_S,
    events_after,
    first_tenure,
    max_gap_s,
    pair,
    pair_states,
)
from harness.daemons import until
from harness.servers import Mosquitto, NatsCluster

pytestmark = [pytest.mark.servers, pytest.mark.slow]


def _spool_bytes(tmp: Path, inst: str) -> int:
    """Bytes in instance ``inst``'s spool folder (no store configured: telemetry stays there)."""
    return sum(f.stat().st_size for f in (tmp / f"spool-{inst}").rglob("*") if f.is_file())


async def test_killing_the_kv_stream_leader_changes_no_active_and_stops_no_write(
    tmp_path: Any, mosquitto: Mosquitto, nats_cluster_private: NatsCluster,
) -> None:
    cluster = nats_cluster_private
    async with pair(tmp_path, mosquitto, cluster, leadership=RIDE_THROUGH,
                    cdu={"watchdog_timeout_s": RIDE_WATCHDOG_S},
                    cdu_heartbeat_timeout_s=RIDE_WATCHDOG_S) as pr:
        e1, active = await first_tenure(pr)
        standby = "b" if active == "a" else "a"
        bucket_stream = f"KV_{pr.bucket}"
        leader = await asyncio.to_thread(cluster.wait_stream_leader, bucket_stream)
        await asyncio.sleep(2.0)
        conns = {r.connection for r in pr.writes()}
        seen_before = len(pair_states(pr, active))
        killed_at, killed_wall = time.monotonic(), time.time()
        await asyncio.to_thread(cluster.node(leader).kill)
        new_leader = await asyncio.to_thread(cluster.wait_stream_leader, bucket_stream,
                                             leader, 30.0)
        elected_s = time.monotonic() - killed_at
        # then as long again as a whole election, and a renewal period on top
        await asyncio.sleep(RIDE_THROUGH["election_max_s"] + RIDE_THROUGH["renew_every_s"])
        end = time.monotonic()
        writes = pr.writes(killed_at - 1.0)
        gap_s = max_gap_s(writes, killed_at, end)
        fence_in = [s["fence_in_s"] for s in pair_states(pr, active)[seen_before:]
                    if s.get("role") == "active" and s.get("fence_in_s") is not None]
        min_fence_in = min(fence_in, default=math.nan)
        changes = events_after(pr, killed_wall, "leadership_fenced", "leadership_lost",
                                "leadership_acquired", "pair_role", "cdu_epoch_claimed")
        figures = (f"stream leader {leader} killed -> {new_leader} elected after "
                   f"{elected_s:.2f} s; longest time without an accepted write "
                   f"{gap_s:.2f} s over {end - killed_at:.1f} s; least fence_in_s of the "
                   f"active {min_fence_in:.2f} s (deadline {RIDE_THROUGH['renew_deadline_s']}"
                   f" s); role/lease changes {changes}; epochs "
                   f"{sorted({r.epoch for r in writes})}; stale "
                   f"{pr.gate.summary()['stale_writes']}")
        print("\n" + figures)
        assert new_leader != leader, figures
        assert not changes, figures  # 0 leader changes, 0 fencings
        assert {r.epoch for r in writes} == {e1}, figures
        assert {r.connection for r in writes} == conns and len(conns) == 1, figures
        assert not [r for r in pr.gate.records if not r.accepted], figures
        # the writes went on: no gap longer than two heartbeat periods (1 s each)
        assert gap_s <= 2.0, figures
        # the kill was felt: the renewals stalled (the renew deadline ran down by more than
        # two renewal periods) and never reached it
        assert 0.0 < min_fence_in <= (RIDE_THROUGH["renew_deadline_s"]
                                      - 2 * RIDE_THROUGH["renew_every_s"]), figures
        assert pr.last(f"rackplane/lab/{pr.rack}/valvey/state/pair_{standby}")["role"] \
            == "standby", figures


async def test_quorum_lost_the_active_fences_the_cdu_falls_back_and_one_active_returns(
    tmp_path: Any, mosquitto: Mosquitto, nats_cluster_private: NatsCluster,
) -> None:
    cluster = nats_cluster_private
    async with pair(tmp_path, mosquitto, cluster, cdu={"watchdog_timeout_s": SHORT_WATCHDOG_S},
                    cdu_heartbeat_timeout_s=SHORT_WATCHDOG_S) as pr:
        e1, active = await first_tenure(pr)
        await asyncio.sleep(2.0)
        before = pr.writes()
        steady_gap_s = max_gap_s(before, before[0].t_mono, before[-1].t_mono)
        # the two nodes that do not lead the KV stream (the leader alone still answers reads)
        leader = await asyncio.to_thread(cluster.wait_stream_leader, f"KV_{pr.bucket}")
        lost = [n for n in cluster.nodes if n.name != leader]
        published = {inst: len(pair_states(pr, inst)) for inst in "ab"}
        spooled = {inst: _spool_bytes(tmp_path, inst) for inst in "ab"}
        killed_at = time.monotonic()
        for n in lost:
            await asyncio.to_thread(n.kill)
        # the CDU falls back to local control once its heartbeat stops changing
        await until(lambda: pr.sim.run_.plant.local_control, 30.0, "the CDU in local control",
                    *pr.procs.values())
        local_at = time.monotonic()
        # and nobody takes over: watch a whole lease and a renewal more
        await asyncio.sleep(LEASE["lease_s"] + 1.0)
        outage_end = time.monotonic()
        last_e1 = max(r.t_mono for r in pr.writes() if r.epoch == e1)
        fenced_s = last_e1 - killed_at
        during = [r for r in pr.gate.records if killed_at + fenced_s < r.t_mono]
        roles = {inst: pair_states(pr, inst)[-1].get("role") for inst in "ab"}
        # both instances keep running and publishing their own state (on Mosquitto)
        published = {inst: len(pair_states(pr, inst)) - published[inst] for inst in "ab"}
        spooled = {inst: _spool_bytes(tmp_path, inst) - spooled[inst] for inst in "ab"}
        figures = (f"quorum lost ({[n.name for n in lost]} killed; {leader} leads the KV "
                   f"stream): the active's last accepted write {fenced_s:.2f} s after the "
                   f"kill (deadline {LEASE['renew_deadline_s']} s, renewal "
                   f"{LEASE['renew_every_s']} s, steady gap between writes {steady_gap_s:.2f}"
                   f" s); CDU in local control {local_at - killed_at:.2f} s after the kill "
                   f"(watchdog {SHORT_WATCHDOG_S} s); write attempts after that during "
                   f"{outage_end - killed_at:.1f} s: {len(during)}; roles {roles}; pair states "
                   f"published since {published}; spool bytes since {spooled}")
        print("\n" + figures)
        # fenced by the deadline, counted from the kill (the last confirmed renewal was sent
        # before it), and not before that renewal could have run out
        assert fenced_s <= LEASE["renew_deadline_s"] + 0.2, figures
        assert fenced_s >= (LEASE["renew_deadline_s"] - LEASE["renew_every_s"]
                            - steady_gap_s - 0.2), figures
        assert local_at - killed_at >= SHORT_WATCHDOG_S, figures  # not before the watchdog
        assert not during, figures  # no takeover, no attempt from either
        assert roles == {"a": "standby", "b": "standby"}, figures
        assert all(p.alive() for p in pr.procs.values()), figures
        assert min(published.values()) >= 3, figures
        assert min(spooled.values()) > 0, figures  # both keep their telemetry

        # quorum back: one active again, with a newer epoch; the CDU back in remote control
        back_at = time.monotonic()
        for n in lost:
            await asyncio.to_thread(n.start)
        await until(lambda: any((r.epoch or 0) > e1 for r in pr.writes(back_at)), 60.0,
                    "one active writing again with a newer epoch", *pr.procs.values())
        first = next(r for r in pr.writes(back_at) if (r.epoch or 0) > e1)
        e2 = first.epoch or 0
        await until(lambda: not pr.sim.run_.plant.local_control, 10.0,
                    "the CDU back in remote control", *pr.procs.values())
        await asyncio.sleep(2 * LEASE["renew_every_s"] + 1.0)
        after = pr.writes(first.t_mono)
        figures += (f"; quorum back -> first accepted write of epoch {e2} after "
                    f"{first.t_mono - back_at:.2f} s (by {pr.instance_of(e2)}, active before: "
                    f"{active}); epochs since {sorted({r.epoch for r in after})}, connections "
                    f"{len({r.connection for r in after})}; stale "
                    f"{pr.gate.summary()['stale_writes']}")
        print(figures)
        assert {r.epoch for r in after} == {e2}, figures
        assert len({r.connection for r in after}) == 1, figures
        assert pr.gate.summary()["stale_writes"] == 0, figures


async def test_the_active_cut_off_the_bus_fences_and_the_standby_takes_over(
    tmp_path: Any, mosquitto: Mosquitto, nats_cluster_private: NatsCluster,
) -> None:
    cluster = nats_cluster_private
    own = {"a": cluster.nodes[0], "b": cluster.nodes[1]}  # nodes[2]: neither's, the quorum's
    async with pair(tmp_path, mosquitto, cluster,
                    servers={i: [n.url] for i, n in own.items()},
                    cdu={"watchdog_timeout_s": SHORT_WATCHDOG_S},
                    cdu_heartbeat_timeout_s=SHORT_WATCHDOG_S) as pr:
        e1, active = await first_tenure(pr)
        standby = "b" if active == "a" else "a"
        await asyncio.sleep(2.0)
        before = pr.writes()
        steady_gap_s = max_gap_s(before, before[0].t_mono, before[-1].t_mono)
        leader = await asyncio.to_thread(cluster.wait_stream_leader, f"KV_{pr.bucket}")
        cut = own[active]
        local_s = [0.0]  # time the CDU spent in local control (0.1 s samples)

        async def sample_local() -> None:
            while True:
                await asyncio.sleep(0.1)
                local_s[0] += 0.1 if pr.sim.run_.plant.local_control else 0.0

        sampler = asyncio.create_task(sample_local())
        cut_at = time.monotonic()
        await asyncio.to_thread(cut.pause)
        try:
            await until(lambda: any((r.epoch or 0) > e1 for r in pr.writes(cut_at)), 40.0,
                        "the standby writing with a newer epoch", pr.procs[standby])
            await asyncio.sleep(1.0)  # the new active's heartbeat reached the CDU
        finally:
            sampler.cancel()
        first = next(r for r in pr.writes(cut_at) if (r.epoch or 0) > e1)
        e2 = first.epoch or 0
        last_e1 = max(r.t_mono for r in pr.writes() if r.epoch == e1)
        claim2 = pr.claim_at(e2) or math.inf
        no_writer_s = first.t_mono - last_e1
        # the cut node back: the old active hears it lost the lease
        resumed_at, resumed_wall = time.monotonic(), time.time()
        await asyncio.to_thread(cut.resume)
        await until(lambda: events_after(pr, resumed_wall, "leadership_holder_seen"), 30.0,
                    "the old active seeing the new holder", pr.procs[active])
        await asyncio.sleep(2.0)
        old = [r for r in pr.gate.records if r.t_mono >= claim2 and r.epoch != e2]
        figures = (f"{active}'s node {cut.name} paused ({leader} led the KV stream): the old "
                   f"active's last accepted write {last_e1 - cut_at:.2f} s after the cut "
                   f"(deadline {LEASE['renew_deadline_s']} s, steady gap "
                   f"{steady_gap_s:.2f} s); {standby}'s claim of epoch {e2} at "
                   f"{claim2 - cut_at:.2f} s, first write {first.t_mono - cut_at:.2f} s "
                   f"(lease {LEASE['lease_s']} s); no writer for {no_writer_s:.2f} s; old "
                   f"active's write attempts after the claim {len(old)} (accepted "
                   f"{sum(r.accepted for r in old)}); node paused "
                   f"{resumed_at - cut_at:.1f} s; CDU in local control {local_s[0]:.1f} s of it "
                   f"(watchdog {SHORT_WATCHDOG_S} s); stale {pr.gate.summary()['stale_writes']}")
        print("\n" + figures)
        assert pr.instance_of(e2) == standby, figures
        assert last_e1 - cut_at <= LEASE["renew_deadline_s"] + 0.2, figures
        assert last_e1 - cut_at >= (LEASE["renew_deadline_s"] - LEASE["renew_every_s"]
                                    - steady_gap_s - 0.2), figures
        assert last_e1 < claim2, figures  # never two writers
        # not before the lease could have run out; within lease + a stream election + 2 s
        assert claim2 - cut_at >= LEASE["lease_s"] - LEASE["renew_every_s"] - 0.1, figures
        assert first.t_mono - cut_at <= LEASE["lease_s"] + 9.0 + 2.0, figures
        assert not [r for r in old if r.accepted], figures
        assert {r.epoch for r in pr.writes(claim2)} == {e2}, figures
        assert pr.gate.summary()["stale_writes"] == len(
            [r for r in pr.gate.records if not r.accepted]), figures
        assert pair_states(pr, standby)[-1]["role"] == "active", figures
        assert pair_states(pr, active)[-1]["role"] == "standby", figures
