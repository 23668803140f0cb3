"""rlc drives a validation campaign against racky over the real broker and the real NATS
cluster (issue 17 items 1, 2 and 5).

rlc runs as a real process (``python -m rlc``) with its budget cycle on the fleet bucket (the
racks' budget side: `tests.integration.test_rlc_fleet.fleet`, racky's own `FleetLink`). Each
rack's racky command side runs in this process on its own MQTT connection: racky's real
command router and handlers (`racky.commands.register_racky_commands`) over a fleet-mode
`RackyCore`, stepped every 0.2 s, publishing its real ``state/rack`` (retained). No load
reaches these cores, so racky's judge fails each run on its thermal criterion: the campaign
must quarantine every rack with that criterion, one rack of the row at a time.

Adversarial: rlc SIGKILLed while a rack validates and started again: it continues from the
KV record (no run id issued twice, no rack started twice, never two racks of the row at
once); an operator's ``set_lifecycle production`` to racky in fleet mode is refused
(``production_gated``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from harness.daemons import (
    MqttClient,
    Proc,
    command_envelope,
    daemon_proc,
    until,
    write_config,
)
from harness.servers import Mosquitto, NatsCluster
from rackplane.clock import SYSTEM_CLOCK
from rackplane.commands import CommandRouter
from rackplane.io.mqtt import MqttLink
from rackplane.io.nats.kv import NatsKv
from rackplane.settings import CommandSettings, Identity, MqttSettings
from racky.commands import register_racky_commands
from racky.config import RackyConfig
from racky.core.controller import RackyCore, RackyInputs
from racky.core.lifecycle import Lifecycle, PersistedState
from rlc.campaign_driver import campaign_key
from rlc.core.campaign_codec import loads
from rlc.core.topology import TopologySettings, compile_topology
from tests.integration.test_rlc_fleet import (
    CAP_TTL_S,
    MARGIN_S,
    TTL_S,
    _ids,
    _steady,
    _topology,
    fleet,
)

pytestmark = [pytest.mark.servers]


def _rlc(tmp: Path, tag: str, site: str, bucket: str, nats: NatsCluster,
         mosquitto: Mosquitto) -> Proc:
    cfg = write_config(
        tmp / f"rlc-{tag}.toml",
        identity={"site": site, "row": "fleet", "rack": "rlc"},
        mqtt={"host": "127.0.0.1", "port": mosquitto.port},
        spool={"directory": str(tmp / "spool")},
        control={"tick_s": 0.5, "state_interval_s": 0.5},
        fleet={"servers": nats.urls, "bucket": bucket, "request_timeout_s": 0.5,
               "cycle_s": 0.5, "unreachable_after_s": 2.0, "reclaim_after_s": 3.0,
               "write_deadband_w": 100.0},
        leases={"ttl_s": TTL_S, "clock_margin_s": MARGIN_S, "agent_cap_ttl_s": CAP_TTL_S},
        campaign={"resend_s": 1.0},
        commands={"users": {"alice": "operator"}},
        topology=_topology(site, 50_000.0),
    )
    return daemon_proc("rlc", tmp, cfg, tag=tag).start()


class RackySide:
    """One racky's command side (module docstring): router + handlers + core, real MQTT."""

    def __init__(self, port: int, site: str, rack: str,
                 persisted: PersistedState | None = None) -> None:
        self.ident = Identity(site=site, rack=rack)
        cfg = RackyConfig.model_validate({"fleet": {"enabled": True, "floor_w": 60_000.0},
                                          "identity": {"site": site, "rack": rack}})
        self.core = RackyCore(cfg, SYSTEM_CLOCK.monotonic(), persisted or
                              PersistedState(Lifecycle("provisioning", 0, "new", "test")))
        self.link = MqttLink(MqttSettings(port=port, clean_session=True,
                                          client_id=f"racky-{site}-{rack}"),
                             self.ident, "racky", clock=SYSTEM_CLOCK)
        self.router = CommandRouter(self.link, CommandSettings(
            users={"rlc": "operator", "alice": "operator"}), clock=SYSTEM_CLOCK,
            audit=self._audit)
        register_racky_commands(self.router, self.core, send=lambda _c: None)
        self.router.attach()
        self.audits: list[tuple[str, str, str]] = []
        self.started: list[str] = []  # run ids started (a fresh recording each)

    def _audit(self, a: Any) -> None:
        self.audits.append((a.user, a.verb, a.outcome))

    def step(self) -> None:
        self.core.drop_lost_validation(SYSTEM_CLOCK.wall_ns())  # as racky.app does, active
        self.core.step(SYSTEM_CLOCK.monotonic(), RackyInputs())
        self.link.publish_state("rack", self.core.state())

    def note_start(self) -> None:
        v = self.core.validation
        if v is not None and v.run_id is not None and v.run_id not in self.started:
            self.started.append(v.run_id)


async def _run_rackies(sides: Mapping[str, RackySide], stop: asyncio.Event,
                       overlap: list[float]) -> None:
    while not stop.is_set():
        for s in sides.values():
            s.note_start()
            s.step()
        n = sum(s.core.validation is not None for s in sides.values())
        overlap.append(n)
        await asyncio.sleep(0.2)


async def test_rlc_runs_a_campaign_against_racky_and_continues_after_a_kill(
        tmp_path: Path, mosquitto: Mosquitto, nats_cluster: NatsCluster) -> None:
    site, bucket = _ids()
    sides = {r: RackySide(mosquitto.port, site, r) for r in ("ra", "rb")}
    tasks = [asyncio.create_task(s.link.run()) for s in sides.values()]
    stop = asyncio.Event()
    overlap: list[float] = []
    replies: list[dict[str, Any]] = []
    procs: list[Proc] = []
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
                                "phases": [{"kind": "burn_in", "duration_s": 3.0}]}]}
            await alice.link.publish(f"rackplane/{site}/rlc/rlc/cmd/alice/campaign_start",
                                     command_envelope("c-1", {"campaign_id": "c1",
                                                              "plan": plan}), qos=1)
            await until(lambda: any(r.get("request_id") == "c-1" for r in replies), 10.0,
                        "rlc answers campaign_start", *procs)
            rep = next(r for r in replies if r.get("request_id") == "c-1")
            assert rep["ok"], rep
            # the first run starts on one rack; rlc is killed while it validates
            await until(lambda: any(s.started for s in sides.values()), 15.0,
                        "a rack starts its validation", *procs)
            procs[0].signal(signal.SIGKILL)
            procs[0].wait(10)
            procs.append(_rlc(tmp_path, "b", site, bucket, nats_cluster, mosquitto))
            await until(lambda: all(s.core.persisted.lifecycle.state == "quarantined"
                                    and s.started for s in sides.values()), 60.0,
                        "both racks validated (and failed) after the restart", procs[1])
            kv = await NatsKv.connect(nats_cluster.urls, bucket, request_timeout_s=2.0)
            try:
                async def record() -> Any:
                    got = await kv.read(campaign_key(site))
                    assert got is not None
                    return loads(got[1], compile_topology(TopologySettings.model_validate(
                        _topology(site, 50_000.0))))
                c = await record()
                for _ in range(50):
                    if all(c.racks[r].quarantine is not None for r in ("ra", "rb")):
                        break
                    await asyncio.sleep(0.2)
                    c = await record()
            finally:
                await kv.close()
            for r in ("ra", "rb"):
                q = c.racks[r].quarantine
                assert q is not None and q.criterion == "thermal under load", (r, q)
            # one run per rack, never issued twice, never started twice by racky
            assert sorted(c.runs) == ["rack.1", "rack.2"] and c.seq == 2
            assert [len(s.started) for s in sides.values()] == [1, 1]
            assert max(overlap) == 1, "two racks of the row validated at once"
            # an operator cannot put a rack into production in fleet mode
            await alice.link.publish(f"rackplane/{site}/ra/racky/cmd/alice/set_lifecycle",
                                     command_envelope("p-1", {"state": "production",
                                                              "reason": "ship it"}), qos=1)
            await until(lambda: any(r.get("request_id") == "p-1" for r in replies), 10.0,
                        "racky answers the operator")
            rep = next(r for r in replies if r.get("request_id") == "p-1")
            assert not rep["ok"] and rep["error"]["code"] == "production_gated", rep
            assert ("alice", "set_lifecycle", "production_gated") in sides["ra"].audits
            print(f"\n[rlc campaign] 2 racks quarantined ({c.racks['ra'].quarantine.reason}); "
                  f"rlc killed mid-run and restarted; runs {sorted(c.runs)}; max racks "
                  f"validating at once {max(overlap):g}")
    finally:
        stop.set()
        for p in procs:
            with contextlib.suppress(Exception):
                p.stop()
        for s in sides.values():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(s.link.stop(), 5)
        for t in tasks:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
