"""racky as a redundant pair on real servers (issue 15, item 2): two racky processes (a, b)
with ``[leadership] enabled``, a real 3-node NATS JetStream cluster, a real Mosquitto, and the
virtual rack in this process (its 8 power shelves behind real Modbus TCP, found by racky's
discovery; its node agents on MQTT, the contract-v1 epoch rule, `sims.rack.NodeAgents`).

- exactly one instance commands the agents (every ``set_power_limits`` on the wire carries one
  instance's request ids and one epoch, ``2**62 +`` its lease epoch); the standby's shadow core
  decides commands and withholds them (``state/pair_<instance>``); an operator's budget set on
  the active reaches the standby through the KV store;
- the active killed (SIGKILL): the standby sends the agents commands with a newer epoch within
  lease + 2 s (and not before the lease could have run out), carrying the synced budget; a
  command of the old epoch is then refused by the agents (``stale_epoch``) and counted;
- a planned handover (``handover`` on the active): the standby commands every tray with a newer
  epoch well within the lease (the release, not the expiry), the released one sends nothing.

Timing: lease 6 s, renew 0.5 s, deadline 5 s (`LEASE`). The failover figures are computed from
the commands seen on the broker and printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.daemons import (
    InProcessRack,
    MqttClient,
    Proc,
    command_envelope,
    in_process_rack,
    racky_proc,
    until,
    write_config,
)
from harness.servers import Mosquitto, NatsCluster
from rackplane.core.tray_contract import PAIR_EPOCH_BASE
from rackplane.io.mqtt import Message
from rackplane.settings import MqttSettings
from tests.adapters.mqtt_cli import mqtt_pub

pytestmark = [pytest.mark.servers]

# racky's first tick with a link frame holds its event loop for up to 1.8 s on the 2-core test
# host while both instances and the rack start (LinkHealth's run-length grid; a renewal
# deadline of 2 s was missed once in 5 runs: fenced, re-acquired). With the suite on 2
# pytest-xdist workers the other worker takes half the CPU (~3.6 s): a 3 s deadline was missed
# in both tests of the first parallel run (the first epoch re-acquired): the deadline is 5 s
LEASE = {"lease_s": 6.0, "renew_every_s": 0.5, "renew_deadline_s": 5.0, "retry_every_s": 0.2,
         "election_max_s": 1.0, "request_timeout_s": 0.5}
BUDGET_W = 150_000.0  # above the rack's draw: the budget travels, the caps stay off


@dataclass
class Sent:
    """A ``set_power_limits`` seen on the broker (monotonic s of arrival)."""

    t_mono: float
    request_id: str
    epoch: int
    trays: list[int]


@dataclass
class Pair:
    rr: InProcessRack
    procs: dict[str, Proc]
    sent: list[Sent] = field(default_factory=list)
    seen: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def last(self, topic: str) -> dict[str, Any]:
        return self.seen.get(topic, [{}])[-1]

    def instance_of(self, s: Sent) -> str:
        return s.request_id.split("-")[1]  # racky-<instance>-<start>-<n>


def _config(tmp: Path, inst: str, rr: InProcessRack, nats: NatsCluster, bucket: str) -> Path:
    face = rr.sim.shelf_face
    assert face is not None
    return write_config(
        tmp / f"racky-{inst}.toml",
        identity={"site": rr.ident.site, "rack": rr.ident.rack},
        mqtt={"port": rr.mqtt.port, "reconnect_min_s": 0.1, "reconnect_max_s": 1.0,
              "keepalive_s": 5},
        discovery={"enabled": True, "port": face.port, "unit_id_first": 1,
                   "unit_id_last": 8, "timeout_s": 0.3},
        commands={"users": {"alice": "operator"}},
        lifecycle={"state_file": str(tmp / f"racky-state-{inst}.json")},
        validation={"report_dir": str(tmp / f"reports-{inst}")},
        spool={"directory": str(tmp / f"spool-{inst}")},
        leadership={"enabled": True, "instance": inst, "servers": nats.urls,
                    "bucket": bucket, **LEASE},
        log={"format": "json"},
    )


@contextlib.asynccontextmanager
async def pair(tmp: Path, mosquitto: Mosquitto, nats: NatsCluster) -> AsyncIterator[Pair]:
    async with in_process_rack(mosquitto.port) as rr:
        procs: dict[str, Proc] = {}
        pr = Pair(rr, procs)
        agents = f"{rr.base}/sim"

        def on_cmd(msg: Message) -> None:
            env = json.loads(msg.payload)
            args = env.get("args", {})
            pr.sent.append(Sent(time.monotonic(), env.get("request_id", ""),
                                int(args.get("epoch", -1)), list(args.get("trays", []))))

        def on_seen(msg: Message) -> None:
            if msg.payload:
                pr.seen.setdefault(msg.topic, []).append(json.loads(msg.payload))

        watcher = MqttClient(MqttSettings(port=mosquitto.port, clean_session=True,
                                          client_id=f"rpwatch-{rr.ident.rack}"), rr.ident)
        watcher.link.subscribe(f"{agents}/cmd/racky/set_power_limits", on_cmd, qos=1)
        watcher.link.subscribe(f"{agents}/cmd/+/set_power_limits/result", on_seen, qos=1)
        base = f"{rr.base}/racky"
        for t in ("status", "status/+", "state/+", "cmd/+/+/result"):
            watcher.link.subscribe(f"{base}/{t}", on_seen, qos=1)
        try:
            async with watcher:
                bucket = f"rpair{uuid.uuid4().hex[:8]}"
                for inst in "ab":
                    p = racky_proc(tmp, _config(tmp, inst, rr, nats, bucket),
                                   env={"PYTHONUNBUFFERED": "1"}, tag=inst)
                    procs[inst] = p.start()
                yield pr
        finally:
            for p in procs.values():
                p.stop()


async def test_one_instance_commands_the_agents_and_the_standby_takes_over_with_a_newer_epoch(
    tmp_path: Path, mosquitto: Mosquitto, nats_cluster: NatsCluster,
) -> None:
    async with pair(tmp_path, mosquitto, nats_cluster) as pr:
        procs = list(pr.procs.values())
        rr = pr.rr
        assert rr.sim.rack is not None
        agents = rr.sim.rack.agents
        await until(lambda: len({t for s in pr.sent for t in s.trays}) == agents.n_trays,
                    40.0, "one instance sending every tray its settings", *procs)
        active = pr.instance_of(pr.sent[0])
        standby = "b" if active == "a" else "a"
        e1 = pr.sent[0].epoch
        assert e1 > PAIR_EPOCH_BASE  # a pair's epoch, above every start-time epoch
        base = f"{rr.base}/racky"
        await until(lambda: pr.last(f"{base}/state/pair_{standby}").get(
            "withheld_commands", 0) > 0, 10.0, "the standby's shadow commands", *procs)
        st = pr.last(f"{base}/state/pair_{standby}")
        assert (st["role"], st["epoch"], st["agent_epoch"]) == ("standby", 0, 0)
        # (the active's state may arrive after its commands: a tick held its loop meanwhile)
        await until(lambda: pr.last(f"{base}/state/pair_{active}").get("role") == "active",
                    5.0, "the active's pair state", *procs)
        st = pr.last(f"{base}/state/pair_{active}")
        assert (st["role"], st["agent_epoch"]) == ("active", e1)
        assert st["agent_epoch"] == PAIR_EPOCH_BASE + st["epoch"]

        # an operator's budget on the active reaches the standby (the KV store's record)
        await mqtt_pub(mosquitto.port, f"{base}/cmd/alice/set_budget",
                       command_envelope("budget-1", {"power_w": BUDGET_W, "reason": "test"}),
                       )
        await until(lambda: pr.last(f"{base}/cmd/alice/set_budget/result").get("ok"), 10.0,
                    "the budget's reply", *procs)
        await until(lambda: any(e.get("event") == "pair_sync_applied"
                                and e.get("budget_w") == BUDGET_W
                                for e in pr.procs[standby].events()), 10.0,
                    "the standby's synced budget", *procs)
        before = list(pr.sent)
        assert {pr.instance_of(s) for s in before} == {active}  # exactly one sender
        assert {s.epoch for s in before} == {e1}
        assert agents.stale_refused == 0

        killed_at = time.monotonic()
        pr.procs[active].proc.kill()  # type: ignore[union-attr]
        await until(lambda: any(s.epoch > e1 for s in pr.sent if s.t_mono >= killed_at),
                    20.0, "the standby commanding with a newer epoch", pr.procs[standby])
        first = next(s for s in pr.sent if s.t_mono >= killed_at and s.epoch > e1)
        e2 = first.epoch
        failover_s = first.t_mono - killed_at
        await until(lambda: {t for s in pr.sent if s.epoch == e2 for t in s.trays}
                    == set(range(agents.n_trays)), 5.0, "every tray told the new epoch",
                    pr.procs[standby])
        print(f"\nkill -> new active commanding the agents: {failover_s:.2f} s (lease "
              f"{LEASE['lease_s']} s; epochs 2**62+{e1 - PAIR_EPOCH_BASE} -> "
              f"2**62+{e2 - PAIR_EPOCH_BASE}; trays told the new epoch: {agents.n_trays})")
        assert pr.instance_of(first) == standby
        assert LEASE["lease_s"] - LEASE["renew_every_s"] - 0.1 <= failover_s
        assert failover_s <= LEASE["lease_s"] + 2.0
        assert {s.epoch for s in pr.sent if s.t_mono >= killed_at} == {e2}
        assert {pr.instance_of(s) for s in pr.sent if s.t_mono >= killed_at} == {standby}
        await until(lambda: pr.last(f"{base}/state/rack").get("budget_w") == BUDGET_W, 10.0,
                    "the new active's rack state with the synced budget", pr.procs[standby])
        await until(lambda: pr.last(f"{base}/state/pair_{standby}").get("agent_epoch") == e2,
                    5.0, "the new active's pair state", pr.procs[standby])
        assert pr.last(f"{base}/state/pair_{standby}")["role"] == "active"

        # a command of the old epoch (the dead active's, delayed): refused and counted
        n_refused = agents.stale_refused
        await mqtt_pub(mosquitto.port, f"{rr.base}/sim/cmd/racky/set_power_limits",
                       command_envelope("old-epoch-1", {
                           "schema_version": "1.0", "trays": [0], "epoch": e1,
                           "power_cap_w": 3000.0, "ttl_s": 60.0}))
        topic = f"{rr.base}/sim/cmd/racky/set_power_limits/result"
        await until(lambda: any(r.get("request_id") == "old-epoch-1"
                                for r in pr.seen.get(topic, [])), 10.0, "the agents' reply")
        reply = next(r for r in pr.seen[topic] if r.get("request_id") == "old-epoch-1")
        print(f"old-epoch command: {reply['error']}; refused at the agents: "
              f"{agents.stale_refused - n_refused}")
        assert not reply["ok"] and reply["error"]["code"] == "stale_epoch"
        assert agents.stale_refused == n_refused + 1
        assert agents.newest_epoch(0) == e2  # nothing of it applied
        assert agents.settings(0).power_cap_w != 3000.0
        # the old instance's Last Will on its own status topic; the rack's status untouched
        await until(lambda: pr.last(f"{base}/status/{active}").get("status") == "offline",
                    10.0, "the killed instance's Will")
        assert f"{base}/status" not in pr.seen
        assert pr.procs[standby].alive()
        pr.procs[standby].signal(signal.SIGTERM)
        rc = await asyncio.to_thread(pr.procs[standby].wait, 20)
        assert rc == 0


async def test_a_planned_handover_moves_the_commands_to_the_standby_with_a_newer_epoch(
    tmp_path: Path, mosquitto: Mosquitto, nats_cluster: NatsCluster,
) -> None:
    async with pair(tmp_path, mosquitto, nats_cluster) as pr:
        procs = list(pr.procs.values())
        rr = pr.rr
        assert rr.sim.rack is not None
        agents = rr.sim.rack.agents
        await until(lambda: len({t for s in pr.sent for t in s.trays}) == agents.n_trays,
                    40.0, "one instance sending every tray its settings", *procs)
        active = pr.instance_of(pr.sent[0])
        standby = "b" if active == "a" else "a"
        e1 = pr.sent[0].epoch
        base = f"{rr.base}/racky"
        await until(lambda: pr.last(f"{base}/state/pair_{standby}").get("synced_seq", 0) > 0,
                    10.0, "the standby in sync", *procs)
        asked_at = time.monotonic()
        await mqtt_pub(mosquitto.port, f"{base}/cmd/alice/handover",
                       command_envelope("handover-1", {"reason": "maintenance"}))
        await until(lambda: pr.last(f"{base}/cmd/alice/handover/result").get("ok"), 10.0,
                    "the handover's reply", *procs)
        reply = pr.last(f"{base}/cmd/alice/handover/result")
        assert reply["state"]["instance"] == active
        assert reply["state"]["released_epoch"] + PAIR_EPOCH_BASE == e1
        await until(lambda: any(s.epoch > e1 for s in pr.sent if s.t_mono >= asked_at), 10.0,
                    "the standby commanding with a newer epoch", *procs)
        first = next(s for s in pr.sent if s.t_mono >= asked_at and s.epoch > e1)
        gap_s = first.t_mono - asked_at
        print(f"\nhandover asked -> new active commanding the agents: {gap_s:.2f} s "
              f"(lease {LEASE['lease_s']} s)")
        assert pr.instance_of(first) == standby
        assert gap_s < LEASE["lease_s"]  # the release, not the lease's expiry
        after = [s for s in pr.sent if s.t_mono >= asked_at]
        assert {s.epoch for s in after} == {first.epoch}
        assert {pr.instance_of(s) for s in after} == {standby}
        await until(lambda: {t for s in pr.sent if s.epoch == first.epoch for t in s.trays}
                    == set(range(agents.n_trays)), 5.0, "every tray told the new epoch")
        assert agents.stale_refused == 0  # the released instance sent nothing after
        assert pr.procs[active].alive()
        await until(lambda: pr.last(f"{base}/state/pair_{active}").get("role") == "standby",
                    5.0, "the old active standing by", *procs)
