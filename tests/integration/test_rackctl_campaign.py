"""``rackctl campaign start|status|abort|report`` (the real console entry point, a subprocess)
against a real rlc process on the real broker and the real NATS cluster (issue 17), with each
rack's racky command side as in tests/integration/test_rlc_campaign.py (racky's real router,
handlers and fleet-mode core; no load reaches them, so racky's judge fails each run on its
thermal criterion and rlc quarantines both racks).

Covered: a plan refused locally with the reason, exit 2, nothing sent (a field out of range;
a rack not in rlc's topology, with ``--rlc-config``); a TOML plan started (exit 0) and a second
start refused by rlc (``campaign_running``, exit 1); ``status`` (table and ``--json``: per rack
stage, run, verdict, quarantine reason) until both racks are quarantined; ``report`` from the
KV record (``--rlc-config``: Markdown with every result) and from the status reply (Markdown
only); ``abort`` accepted, then refused (``no_campaign``, exit 1).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.daemons import MqttClient, Proc
from harness.servers import Mosquitto, NatsCluster
from rackplane.settings import Identity, MqttSettings
from tests.integration.test_rlc_campaign import RackySide, _rlc, _run_rackies
from tests.integration.test_rlc_fleet import _ids, _steady, fleet

pytestmark = [pytest.mark.servers]


async def rackctl(*argv: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rackctl", *argv, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ, "HOME": "/nonexistent",
                                             "COLUMNS": "250"})
    out, err = await asyncio.wait_for(proc.communicate(), 60.0)
    return proc.returncode or 0, out.decode(), err.decode()


PLAN_TOML = """
racks = ["ra", "rb"]
max_racks_per_row = 1
start_timeout_s = 20.0
result_grace_s = 20.0

[cdu_of]
ra = "cdu1"
rb = "cdu2"

[[stages]]
name = "rack"
kind = "rack"
power_w = 40000.0
phases = [{ kind = "burn_in", duration_s = 3.0 }]
"""


async def test_rackctl_campaign_verbs_against_rlc(
        tmp_path: Path, mosquitto: Mosquitto, nats_cluster: NatsCluster) -> None:
    site, bucket = _ids()
    sides = {r: RackySide(mosquitto.port, site, r) for r in ("ra", "rb")}
    tasks = [asyncio.create_task(s.link.run()) for s in sides.values()]
    stop = asyncio.Event()
    procs: list[Proc] = []
    flags = ["--host", "127.0.0.1", "--port", str(mosquitto.port), "--site", site,
             "--user", "alice", "--timeout", "10"]
    seen: list[str] = []
    try:
        for s in sides.values():
            await s.link.wait_ready(10)
        tasks.append(asyncio.create_task(_run_rackies(sides, stop, [])))
        async with fleet(nats_cluster, site, bucket, {"ra": 60_000.0, "rb": 60_000.0}) as fl, \
                MqttClient(MqttSettings(port=mosquitto.port, clean_session=True,
                                        client_id=f"spy-{site}"),
                           Identity(site=site, rack="rlc")) as spy:
            spy.link.subscribe(f"rackplane/{site}/rlc/rlc/cmd/+/+",
                               lambda m: seen.append(m.topic.rsplit("/", 1)[-1]), qos=1)
            procs.append(_rlc(tmp_path, "a", site, bucket, nats_cluster, mosquitto))
            rlc_cfg = str(tmp_path / "rlc-a.toml")
            await _steady(fl, procs, 50_000.0)

            # refused locally: nothing reaches rlc
            good = tmp_path / "plan.toml"
            good.write_text(PLAN_TOML, encoding="utf-8")
            bad = tmp_path / "bad.json"
            bad.write_text(json.dumps({"racks": ["ra"], "cdu_of": {"ra": "c"}, "stages": [
                {"name": "s", "kind": "rack", "power_w": 1.0,
                 "phases": [{"kind": "burn_in", "duration_s": 0.0}]}]}), encoding="utf-8")
            code, _out, err = await rackctl("campaign", "start", str(bad), "--id", "c0",
                                            *flags)
            assert code == 2 and "plan refused" in err and "duration_s" in err, err
            unknown = tmp_path / "unknown.toml"
            unknown.write_text(PLAN_TOML.replace('"rb"]', '"rz"]').replace(
                'rb = "cdu2"', 'rz = "cdu2"'), encoding="utf-8")
            code, _out, err = await rackctl("campaign", "start", str(unknown), "--id", "c0",
                                            "--rlc-config", rlc_cfg, *flags)
            assert code == 2 and "not in the topology" in err and "rz" in err, err
            await asyncio.sleep(0.5)
            assert seen == [], f"a refused plan reached rlc: {seen}"

            code, out, err = await rackctl("campaign", "start", str(good), "--id", "c1",
                                           "--rlc-config", rlc_cfg, *flags)
            assert code == 0 and "accepted" in out, (code, out, err)
            code, out, err = await rackctl("campaign", "start", str(good), "--id", "c2",
                                           "--json", *flags)
            assert code == 1 and json.loads(out)["error"]["code"] == "campaign_running", out

            async def status() -> tuple[int, dict[str, Any]]:
                code, out, err = await rackctl("campaign", "status", "--json", *flags)
                assert code in (0, 1), err
                return code, json.loads(out)

            last: dict[str, Any] = {}

            async def both_quarantined() -> bool:
                nonlocal last
                _c, last = await status()
                return all(r["status"] == "quarantined"
                           for r in (last.get("racks") or {}).values()) and bool(last["racks"])

            for _ in range(150):
                if await both_quarantined():
                    break
                await asyncio.sleep(0.3)
            else:
                raise AssertionError(f"not both quarantined: {last}")
            assert last["campaign_id"] == "c1"
            runs = {r["run"] for r in last["racks"].values()}
            assert runs == {"rack.1", "rack.2"}, last
            for r in last["racks"].values():
                assert r["stage"] == "rack" and r["verdict"] == "fail" and \
                    r["run_state"] == "done", r
                assert "thermal under load" in r["quarantine"], r
            code, out, err = await rackctl("campaign", "status", *flags)
            assert code == 0 and "quarantined" in out and "thermal under load" in out, out

            rep_kv, rep_st = tmp_path / "rep-kv", tmp_path / "rep-st"
            code, out, err = await rackctl("campaign", "report", "--out", str(rep_kv),
                                           "--rlc-config", rlc_cfg)
            assert code == 0, err
            page = (rep_kv / "c1.md").read_text(encoding="utf-8")
            assert "## Results (racky's verdicts)" in page and "thermal under load" in page
            assert page.count("| FAIL |") == 2 and "`rack` (rack, 40 kW per rack)" in page
            code, out, err = await rackctl("campaign", "report", "--out", str(rep_st), *flags)
            assert code == 0, err
            page = (rep_st / "c1.md").read_text(encoding="utf-8")
            assert "campaign_status reply" in page and "quarantined 2" in page
            assert not list(rep_st.glob("*.png"))

            code, out, err = await rackctl("campaign", "abort", "--reason", "done here",
                                           *flags)
            assert code == 0, (out, err)
            for _ in range(50):
                code, st = await status()
                if st.get("aborted"):
                    break
                await asyncio.sleep(0.2)
            assert code == 1 and "done here (by alice)" in st["aborted"], st
            code, out, err = await rackctl("campaign", "abort", "--reason", "again", *flags)
            assert code == 1 and "no_campaign" in err, (out, err)
            print(f"\n[rackctl campaign] verbs sent to rlc: {seen}; quarantines: "
                  f"{[r['quarantine'] for r in last['racks'].values()]}")
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
