"""``rackctl fleet status`` (the real console entry point, a subprocess) against a real 3-node
NATS cluster (issue 16): the row's limit, the leases in force, what the racks may draw by
rlc's rule (an older higher grant not yet released counts), each rack's report and rlc's
cross-checks, read from the fleet bucket as rlc and racky write it; exit 1 for a rack without
a lease, a row over its limit or a floor that contradicts the topology, 3 for a bucket that
does not exist, which the command never makes (read-only)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from harness.daemons import write_config
from harness.servers import NatsCluster
from rackplane.core.budget_leases import BudgetLease, RackReport
from rackplane.io.nats.errors import KvError
from rackplane.io.nats.kv import NatsKv
from tests.integration.rackctl_proc import entry_point, rackctl, rackctl_json

pytestmark = [pytest.mark.servers]

SITE = "lab"
ROW = "h1/row1"


def _config(tmp: Path, nats: NatsCluster, bucket: str) -> Path:
    rack = {"floor_w": 20_000.0, "max_w": 80_000.0}
    return write_config(
        tmp / "rlc.toml", identity={"site": SITE, "row": "fleet", "rack": "rlc"},
        spool={"directory": str(tmp / "spool")},
        fleet={"servers": nats.urls, "bucket": bucket, "request_timeout_s": 1.0},
        topology={"site": SITE, "halls": {"h1": {"feed_limit_w": 1e6, "rows": {"row1": {
            "limit_w": 100_000.0, "racks": {"ra": rack, "rb": dict(rack)}}}}}})


def _budget(rack: str, value_w: float, seq: int, unreleased: tuple[float, ...] = ()) -> bytes:
    now = time.time()
    lease = BudgetLease(rack, value_w, now, now + 30.0, 7, seq)
    ledger = {"rack": rack, "current": lease.as_record(),
              "unreleased": [{"value_w": v, "expires_at_s": now + 20.0, "life_s": 30.0,
                              "released_by": [7, seq]} for v in unreleased],
              "acked": None, "last_seq": seq}
    return json.dumps({"lease": lease.as_record(), "ledger": ledger}).encode()


def _report(rack: str, floor_w: float) -> bytes:
    rep = RackReport(rack, 55_000.0, 40_000.0, floor_w, 39_000.0, (7, 1), True, time.time(),
                     15_000.0)
    return json.dumps(rep.as_record()).encode()


async def _status(cfg: Path) -> tuple[int, dict[str, Any]]:
    return await rackctl_json("fleet", "status", "--rlc-config", str(cfg), "--json")


async def _rlc_dry_connect(cfg: Path) -> tuple[int, str, str]:
    return await entry_point("rlc", "--config", str(cfg), "--dry-connect")


async def _scenario(tmp: Path, nats: NatsCluster) -> None:
    bucket = f"fleet_{uuid.uuid4().hex[:8]}"
    cfg = _config(tmp, nats, bucket)
    # no bucket: exit 3, and the command did not make it
    code, out, err = await rackctl("fleet", "status", "--rlc-config", str(cfg))
    assert code == 3 and "does not exist" in err, (code, out, err)
    # rlc's dry connect reached no bucket: exit 1, saying so, and made none
    code, out, err = await _rlc_dry_connect(cfg)
    assert code == 1 and "does not exist" in err, (code, out, err)
    with pytest.raises(KvError, match="does not exist"):
        await NatsKv.connect(nats.urls, bucket, create=False)

    kv = await NatsKv.connect(nats.urls, bucket, request_timeout_s=2.0)   # rlc makes it
    try:
        # ra: a 60 kW lease while an older 70 kW grant is not yet released; rb: no lease
        await kv.create(f"{SITE}.ra.budget", _budget("ra", 60_000.0, 2, (70_000.0,)))
        await kv.put(f"{SITE}.ra.rack", _report("ra", 20_000.0))
        code, out, err = await _rlc_dry_connect(cfg)
        assert code == 0, (out, err)
        assert "rack ra: budget lease present, racky report present" in out, out
        assert "rack rb: budget lease none, racky report none" in out, out
        code, s = await _status(cfg)
        row = s["rows"][ROW]
        ra, rb = row["racks"]["ra"], row["racks"]["rb"]
        assert code == 1 and not s["ok"], s
        assert ra["lease"]["value_w"] == 60_000.0 and ra["lease"]["in_force"]
        assert (ra["lease"]["epoch"], ra["lease"]["seq"]) == (7, 2)
        assert 25.0 < ra["lease"]["expires_in_s"] <= 30.0
        assert [u["value_w"] for u in ra["unreleased"]] == [70_000.0]
        assert ra["bound_w"] == 70_000.0 and ra["problems"] == []
        assert ra["report"]["demand_w"] == 55_000.0 and ra["report"]["acked"] == [7, 1]
        assert ra["report"]["agents_safe_w"] == 15_000.0
        assert rb["lease"] is None and rb["problems"] == ["no_lease"]
        assert rb["bound_w"] == 20_000.0                   # without a lease: its floor
        assert (row["limit_w"], row["leased_w"], row["bound_w"]) == (100_000.0, 60_000.0,
                                                                    90_000.0)

        # rb leased 30 kW: 70 + 30 = the limit exactly; all well
        rev = await kv.create(f"{SITE}.rb.budget", _budget("rb", 30_000.0, 1))
        await kv.put(f"{SITE}.rb.rack", _report("rb", 20_000.0))
        code, s = await _status(cfg)
        assert code == 0 and s["ok"], s
        assert s["rows"][ROW]["bound_w"] == 100_000.0 and not s["rows"][ROW]["over_limit"]
        code, out, err = await rackctl("fleet", "status", "--rlc-config", str(cfg))
        assert code == 0 and "row h1/row1: limit 100.0 kW" in out, (out, err)

        # a lease rlc would never write (70 kW unreleased + 40 kW), and rb's racky falling
        # to more than rlc counts for it: both flagged
        await kv.update(f"{SITE}.rb.budget", _budget("rb", 40_000.0, 2), rev)
        await kv.put(f"{SITE}.rb.rack", _report("rb", 30_000.0))
        code, s = await _status(cfg)
        row = s["rows"][ROW]
        assert code == 1 and row["over_limit"] and row["bound_w"] == 110_000.0, s
        assert row["racks"]["rb"]["problems"] == ["floor_above"], s
        code, out, err = await rackctl("fleet", "status", "--rlc-config", str(cfg))
        assert code == 1 and "OVER THE LIMIT" in out and "floor_above" in out, (out, err)
    finally:
        await kv.close()


def test_fleet_status_reads_the_bucket_as_rlc_and_racky_write_it(
        tmp_path: Path, nats_cluster: NatsCluster) -> None:
    asyncio.run(_scenario(tmp_path, nats_cluster))
