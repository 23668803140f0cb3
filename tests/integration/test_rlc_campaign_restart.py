"""racky restarted in the middle of a campaign's run, with a real rlc process on the real
broker and the real NATS cluster (issue 17): the racky side of rack ``ra``
(tests/integration/test_rlc_campaign.py's `RackySide`: racky's real router, handlers and
fleet-mode core) is stopped while it records run ``rack.1`` and started again from its persisted
state (its JSON document) on a new MQTT connection; its retained ``state/rack`` still names the
run until the new process publishes.

rlc must drop ``rack.1`` as soon as the restarted racky's state records neither the run nor
its result (not at the run's deadline), never judge the rack on it, run the stage again on
``ra`` under a new run id, and count it once: no run id started twice by any racky, never two
racks of the row validating at once, one attempt counted. No load reaches these cores, so
every complete run fails on racky's thermal criterion and both racks end quarantined.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

from harness.daemons import MqttClient, Proc, command_envelope, until
from harness.servers import Mosquitto, NatsCluster
from rackplane.io.nats.kv import NatsKv
from rackplane.settings import Identity, MqttSettings
from racky.core.lifecycle import PersistedState
from rlc.campaign_driver import campaign_key
from rlc.core.campaign_codec import loads
from rlc.core.topology import TopologySettings, compile_topology
from tests.integration.test_rlc_campaign import RackySide, _rlc, _run_rackies
from tests.integration.test_rlc_fleet import _ids, _steady, _topology, fleet

pytestmark = [pytest.mark.servers]


async def test_racky_restarted_mid_run_rlc_drops_it_and_runs_it_again(
        tmp_path: Path, mosquitto: Mosquitto, nats_cluster: NatsCluster) -> None:
    site, bucket = _ids()
    sides = {r: RackySide(mosquitto.port, site, r) for r in ("ra", "rb")}
    old = sides["ra"]
    tasks = [asyncio.create_task(s.link.run()) for s in sides.values()]
    stop = asyncio.Event()
    overlap: list[float] = []
    replies: list[dict[str, Any]] = []
    procs: list[Proc] = []
    new: RackySide | None = None
    try:
        for s in sides.values():
            await s.link.wait_ready(10)
        tasks.append(asyncio.create_task(_run_rackies(sides, stop, overlap)))
        async with fleet(nats_cluster, site, bucket, {"ra": 60_000.0, "rb": 60_000.0}) as fl, \
                MqttClient(MqttSettings(port=mosquitto.port, clean_session=True,
                                        client_id=f"alice-{site}"),
                           Identity(site=site, rack="rlc")) as alice:
            alice.link.subscribe(f"rackplane/{site}/+/+/cmd/alice/+/result",
                                 lambda m: replies.append(json.loads(m.payload)), qos=1)
            procs.append(_rlc(tmp_path, "a", site, bucket, nats_cluster, mosquitto))
            await _steady(fl, procs, 50_000.0)
            plan = {"racks": ["ra", "rb"], "cdu_of": {"ra": "cdu1", "rb": "cdu2"},
                    "max_racks_per_row": 1, "start_timeout_s": 20.0, "result_grace_s": 20.0,
                    "stages": [{"name": "rack", "kind": "rack", "power_w": 40_000.0,
                                "phases": [{"kind": "burn_in", "duration_s": 8.0}]}]}
            await alice.link.publish(f"rackplane/{site}/rlc/rlc/cmd/alice/campaign_start",
                                     command_envelope("c-1", {"campaign_id": "c1",
                                                              "plan": plan}), qos=1)
            await until(lambda: any(r.get("request_id") == "c-1" for r in replies), 10.0,
                        "rlc answers campaign_start", *procs)
            # ra records rack.1 (plan order: ra first); restart it 1 s into the run
            await until(lambda: old.started == ["rack.1"], 15.0, "ra starts rack.1", *procs)
            await asyncio.sleep(1.0)
            assert old.core.validation is not None and old.core.validation.run_id == "rack.1"
            await asyncio.wait_for(old.link.stop(), 5)
            restarted_at = time.time()
            ps = PersistedState.from_json(json.loads(json.dumps(old.core.persisted.to_json())))
            new = RackySide(mosquitto.port, site, "ra", ps)
            tasks.append(asyncio.create_task(new.link.run()))
            await new.link.wait_ready(10)
            sides["ra"] = new
            kv = await NatsKv.connect(nats_cluster.urls, bucket, request_timeout_s=2.0)
            topo = compile_topology(TopologySettings.model_validate(_topology(site, 50_000.0)))
            try:
                async def record() -> Any:
                    got = await kv.read(campaign_key(site))
                    assert got is not None
                    return loads(got[1], topo)

                lost_seen_at = None
                for _ in range(150):
                    c = await record()
                    if lost_seen_at is None and c.runs["rack.1"].state == "lost":
                        lost_seen_at = time.time()
                    if all(c.racks[r].quarantine is not None for r in ("ra", "rb")):
                        break
                    await asyncio.sleep(0.2)
            finally:
                await kv.close()
            assert lost_seen_at is not None
            r1 = c.runs["rack.1"]
            assert r1.state == "lost" and r1.results == {}   # never judged on the lost run
            assert r1.ended_at_s - restarted_at < 5.0 < r1.deadline_s - r1.ended_at_s
            for r in ("ra", "rb"):
                q = c.racks[r].quarantine
                assert q is not None and q.criterion == "thermal under load", (r, q)
            qa = c.racks["ra"].quarantine
            assert qa is not None and qa.run_id != "rack.1"
            assert c.racks["ra"].attempts == {"rack": 1}
            started = old.started + new.started + sides["rb"].started
            assert len(started) == len(set(started)) == 3, started  # none twice
            assert old.started == ["rack.1"] and new.started == [qa.run_id]
            assert max(overlap) == 1, "two racks of the row validated at once"
            print(f"\n[rlc campaign restart] racky ra restarted 1 s into rack.1: rlc ended it "
                  f"lost {r1.ended_at_s - restarted_at:.1f} s later (deadline "
                  f"{r1.deadline_s - restarted_at:.0f} s away); ra re-run as {qa.run_id}; runs "
                  f"{sorted(c.runs)}")
    finally:
        stop.set()
        for p in procs:
            with contextlib.suppress(Exception):
                p.stop()
        for s in [*sides.values(), old, *([new] if new is not None else [])]:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(s.link.stop(), 5)
        for t in tasks:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
