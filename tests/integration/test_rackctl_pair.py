"""``rackctl pair``, ``rackctl handover`` and ``rackctl watch`` against a real valvey pair
(issue 15 item 5): two valvey processes on the 3-node NATS cluster, real Mosquitto, the
simulated CDU with its epoch gate (the pair fixture of tests/integration/test_valvey_pair.py).
rackctl runs as the real console entry point (a subprocess)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from harness.chaos import LEASE, Pair, first_tenure, pair
from harness.daemons import until
from harness.servers import Mosquitto, NatsCluster
from tests.integration.rackctl_proc import rackctl, rackctl_json

pytestmark = [pytest.mark.servers]


def _flags(pr: Pair, mosquitto: Mosquitto) -> list[str]:
    return ["--host", "127.0.0.1", "--port", str(mosquitto.port), "--site", "lab",
            "--rack", pr.rack]


async def _pair_json(pr: Pair, mosquitto: Mosquitto) -> tuple[int, dict[str, Any]]:
    return await rackctl_json("pair", "valvey", "--json", "--wait", "1.5", *_flags(pr, mosquitto))


async def test_pair_view_and_handover_through_rackctl(
        tmp_path: Any, mosquitto: Mosquitto, nats_cluster: NatsCluster) -> None:
    async with pair(tmp_path, mosquitto, nats_cluster) as pr:
        e1, active = await first_tenure(pr)
        standby = "b" if active == "a" else "a"
        base = f"rackplane/lab/{pr.rack}/valvey"
        await until(lambda: all(pr.status.get(f"{base}/state/pair_{i}") for i in "ab"), 10.0,
                    "both instances' pair state")
        await asyncio.sleep(1.5)  # the standby's first sync records applied
        code, s = await _pair_json(pr, mosquitto)
        print(f"\nrackctl pair before: {json.dumps(s)}")
        assert code == 0, s
        assert (s["mode"], s["status"], s["active"], s["epoch"]) == ("pair", "online", active,
                                                                      e1)
        assert 0 < s["lease_remaining_s"] <= LEASE["renew_deadline_s"]
        assert s["instances"][standby]["role"] == "standby"
        assert s["instances"][standby]["status"] == "online"
        assert 0 <= s["instances"][standby]["synced_age_s"] < LEASE["lease_s"]
        assert pr.status.get(f"{base}/status") is None  # no rack-level status from a pair
        code, out, err = await rackctl("watch", "valvey", "--duration", "1.0",
                                       *_flags(pr, mosquitto))
        assert code == 0 and "valvey: online (pair: a " in out, out + err
        # the human pair view
        code, out, err = await rackctl("pair", "valvey", "--wait", "1.0", *_flags(pr, mosquitto))
        assert code == 0 and f"epoch {e1}" in out, out + err

        sent = time.monotonic()
        code, out, err = await rackctl("handover", "valvey", "--reason", "maintenance",
                                       "--user", "alice", *_flags(pr, mosquitto))
        print(f"rackctl handover: exit {code}: {out.strip()}")
        assert code == 0, out + err
        assert f"instance {active} released its lease (epoch {e1})" in " ".join(out.split())
        await until(lambda: any((r.epoch or 0) > e1 for r in pr.writes(sent)), 10.0,
                    "the other instance writing with a newer epoch", *pr.procs.values())
        await asyncio.sleep(1.5)  # its pair state published (every second)
        code, s = await _pair_json(pr, mosquitto)
        print(f"rackctl pair after: {json.dumps(s)}")
        assert code == 0 and s["active"] == standby and s["epoch"] > e1, s
        assert s["acquisitions"] == 1, s
        # why: the key was absent (released by the handover), not an expired record
        assert s["last_change"] == (f"acquired: epoch {s['epoch']} after key absent "
                                    "(released, or never held)"), s
        assert s["instances"][active]["role"] == "standby"

        # a standby killed: the pair stays online; the active killed: offline is reported
        pr.procs[active].stop()
        await asyncio.sleep(1.0)
        code, s = await _pair_json(pr, mosquitto)
        assert code == 0 and s["status"] == "online" and s["active"] == standby, s
        assert s["instances"][active]["status"] == "offline"
