"""The campaign record against the KV store's bound (rlc/core/campaign_size.py): the bounded
extent's encoded size is an upper bound of real records of the same plan, a plan whose record
could exceed the bound is refused by ``campaign_start`` (``invalid_args`` naming both sizes)
and by ``rackctl campaign start`` before anything is sent; at write time ended runs are
compacted away, and a record still too large is never written and sends nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rackctl.campaign import PlanRefused, load_plan
from rlc.config import RlcConfig, example_topology
from rlc.core.campaign import Campaign, FailedCriterion, StageResult
from rlc.core.campaign_codec import dumps, loads
from rlc.core.campaign_plan import CampaignPlan, PlanError
from rlc.core.campaign_size import (
    DEFAULT_MAX_RECORD_BYTES,
    NATS_MAX_PAYLOAD_BYTES,
    check_record_size,
    compact,
    worst_case_record_bytes,
)
from rlc.core.topology import TopologySettings, compile_topology
from tests.unit.test_rlc_campaign_driver import RlcRig, _plan

T0 = 1_800_000_000.0


def _big_topo(n: int) -> dict[str, Any]:
    rack = {"floor_w": 1_000.0, "max_w": 80_000.0}
    return {"site": "lab", "halls": {"h1": {"feed_limit_w": 1e9, "rows": {
        f"row{k}": {"limit_w": 1e8, "racks": {f"r{k}_{i}": dict(rack) for i in range(10)}}
        for k in range(n // 10)}}}}


def _plan_n(n: int, stages: int = 2, attempts: int = 3) -> dict[str, Any]:
    racks = [f"r{k}_{i}" for k in range(n // 10) for i in range(10)]
    return {"racks": racks, "cdu_of": {r: f"c-{r}" for r in racks}, "max_attempts": attempts,
            "max_racks_per_row": 10,
            "stages": [{"name": f"s{j}", "kind": "rack", "power_w": 2_000.0,
                        "phases": [{"kind": "burn_in", "duration_s": 5.0}]}
                       for j in range(stages)]}


def test_default_bound_is_nats_max_payload_less_the_margin() -> None:
    assert NATS_MAX_PAYLOAD_BYTES == 1 << 20
    assert DEFAULT_MAX_RECORD_BYTES < NATS_MAX_PAYLOAD_BYTES
    cfg = RlcConfig(topology=example_topology())
    assert cfg.campaign.max_record_bytes == DEFAULT_MAX_RECORD_BYTES


def test_bound_grows_with_racks_stages_attempts_and_is_refused_past_the_limit() -> None:
    sizes = {n: worst_case_record_bytes(CampaignPlan.model_validate(_plan_n(n)))
             for n in (10, 20, 40)}
    assert sizes[10] < sizes[20] < sizes[40]
    per_rack = (sizes[40] - sizes[20]) / 20
    assert abs((sizes[20] - sizes[10]) / 10 - per_rack) < 0.05 * per_rack  # linear in racks
    more = worst_case_record_bytes(CampaignPlan.model_validate(_plan_n(10, attempts=6)))
    assert more > sizes[10]
    p = CampaignPlan.model_validate(_plan_n(40))
    assert check_record_size(p, sizes[40]) == sizes[40]      # exactly at the bound: fits
    with pytest.raises(PlanError, match=f"{sizes[40]} bytes, above .* {sizes[40] - 1} bytes"):
        check_record_size(p, sizes[40] - 1)


def test_the_bound_covers_a_real_record_at_the_same_extent() -> None:
    """A campaign driven to its end (every rack quarantined after max_attempts lost runs and a
    failing one, with racky-sized results) encodes below the bounded extent."""
    topo = compile_topology(TopologySettings.model_validate(_big_topo(20)))
    plan = CampaignPlan.model_validate({**_plan_n(20, stages=1), "start_timeout_s": 1.0,
                                        "result_grace_s": 1.0, "max_attempts": 3})
    c = Campaign.new("c" * 64, plan, topo)
    now, committed = T0, dict.fromkeys(topo.rack_ids, 1_000.0)
    for _ in range(2):  # two lost runs per rack (start never confirmed)
        c.step(topo, committed, now, 7)
        now += 2.0
        c.step(topo, committed, now, 7)
        now += 2.0
    c.step(topo, committed, now, 7)
    for run in list(c.runs.values()):
        if run.state == "starting":
            for r in run.racks:
                c.on_started(run.run_id, r, now)
                c.on_result(StageResult(run.run_id, r, 3, False, (FailedCriterion(
                    "thermal under load", "min T.Limit margin 1.2 K, hottest 88.1 °C",
                    "limit margin >= 3 K", ("gpu:3", "tray:7")),), {}, now), now)
    assert all(c.status(r, now) == "quarantined" for r in plan.racks)
    real = len(dumps(c))
    assert real < worst_case_record_bytes(plan), (real, worst_case_record_bytes(plan))


def test_campaign_start_refuses_a_plan_whose_record_could_exceed_the_bound() -> None:
    rlc = RlcRig()
    plan = _plan(["rack1", "rack2"], ["rack"])
    n = worst_case_record_bytes(CampaignPlan.model_validate(plan))
    rlc.driver.max_record_bytes = n - 1
    r = rlc.call("campaign_start", {"campaign_id": "c1", "plan": plan})
    assert not r["ok"] and r["error"]["code"] == "invalid_args"
    assert f"{n} bytes" in r["error"]["message"] and "max_record_bytes" in \
        r["error"]["message"]
    rlc.driver.max_record_bytes = n
    assert rlc.call("campaign_start", {"campaign_id": "c1", "plan": plan})["ok"]


def test_rackctl_refuses_it_locally_with_the_reason(tmp_path: Path) -> None:
    plan = _plan(["rack1", "rack2"], ["rack"])
    n = worst_case_record_bytes(CampaignPlan.model_validate(plan))
    f = tmp_path / "p.json"
    f.write_text(json.dumps(plan), encoding="utf-8")
    assert load_plan(f, None, n)["racks"] == ["rack1", "rack2"]
    with pytest.raises(PlanRefused, match="could reach"):
        load_plan(f, None, n - 1)
    big = tmp_path / "big.json"
    big.write_text(json.dumps(_plan_n(200)), encoding="utf-8")
    with pytest.raises(PlanRefused, match="above the KV store's bound of 1044480 bytes"):
        load_plan(big)


def _ended_campaign(n_runs: int) -> tuple[Campaign, Any, float]:
    topo = compile_topology(example_topology())
    plan = CampaignPlan.model_validate({**_plan(["rack1"], ["rack"]), "start_timeout_s": 1.0,
                                        "max_attempts": 100})
    c = Campaign.new("c1", plan, topo)
    now = T0
    for _ in range(n_runs):  # runs lost, one after the other (an attempt each)
        c.step(topo, dict.fromkeys(topo.rack_ids, 20_000.0), now, 1)
        now += 40.0  # lost at issue + 1 s; its slot held until its deadline (34 s)
    c.step(topo, dict.fromkeys(topo.rack_ids, 20_000.0), now, 1)
    return c, topo, now


def test_compaction_drops_ended_runs_oldest_first_and_keeps_the_active_one() -> None:
    c, topo, now = _ended_campaign(30)
    full = dumps(c)
    active = [rid for rid, r in c.runs.items() if r.state == "starting"]
    for run in c.runs.values():
        run.abort_pending.clear()
    limit = len(full) // 2
    data = compact(c, now, limit)
    assert len(data) <= limit < len(full)
    assert set(active) <= set(c.runs) and c.compacted_runs > 0
    kept = [int(rid.split(".")[1]) for rid in c.runs]
    assert kept == sorted(kept) and kept[-1] == 31 and min(kept) > 1  # the oldest went
    back = loads(data, topo)
    assert back.compacted_runs == c.compacted_runs and back.seq == c.seq  # ids never reused
    assert compact(c, now, 10 * len(full)) == data  # fits: unchanged


def test_a_record_still_too_large_is_not_written_and_sends_nothing() -> None:
    rlc = RlcRig()
    assert rlc.call("campaign_start", {"campaign_id": "c1",
                                       "plan": _plan(["rack1"], ["rack"])})["ok"]
    assert rlc.cycle(T0)  # the start written and sent
    rev = rlc.kv["rev"]
    rlc.driver.max_record_bytes = 100  # nothing left to compact: the active run holds a slot
    assert rlc.call("campaign_abort", {"reason": "x"})["ok"]
    assert rlc.cycle(T0 + 1.0) == []
    assert rlc.kv["rev"] == rev and rlc.driver.counts["record_too_large"] == 1
    st = rlc.driver.status(T0 + 1.0)
    assert st["record_too_large_bytes"] > 100 and not rlc.driver.loaded
    rlc.driver.max_record_bytes = DEFAULT_MAX_RECORD_BYTES  # the bound raised: the abort lands
    orders = rlc.cycle(T0 + 2.0)
    assert rlc.kv["rev"] == rev + 1 and loads(rlc.kv["data"], rlc.driver.topo).aborted
    assert orders == [] or all(o.verb == "abort_validation" for o in orders)
