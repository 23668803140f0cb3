"""Adversarial campaigns in lock-step on the multi-rack simulator (issue 17;
`harness.lockstep_campaign`: four healthy racks, each with its own racky, rlc's driver behind
its command router; one multi-rack stage of 10 s burn-in + 20 s backend-only).

- **racky restarted mid-stage**: rack2's racky restarts (a new core from its persisted state;
  the validation under way was only in memory) 8 s into run ``multi.1``. rlc drops the run at
  once (not at its deadline, 40 s later), never passes anyone on it, aborts the other racks'
  recordings, re-runs the group as ``multi.2`` and promotes every rack on that complete run; no
  racky starts a run id twice, no rack is counted twice.
- **racky restarted before confirming a start**: the start is re-sent with the same run id,
  the new process records it afresh, rlc counts one run (one result per rack, no attempt).
- **pair failover raising racky's epoch**: rack3's racky fails over to a standby with judge
  epoch 2 in the middle of ``multi.1``; the fenced old leader then publishes a late pass of
  ``multi.1`` under epoch 1 while ``multi.2`` runs. That pass never gates (counted stale), the
  fenced state neither confirms nor drops ``multi.2``, the run is repeated under the new epoch,
  and rack3 enters production with evidence judged under epoch 2 (racky's own gate agrees).
"""

from __future__ import annotations

import json
from typing import Any

from harness.lockstep_campaign import SCENARIOS, run_campaign
from harness.lockstep_campaign.rig import RackyRack, RlcSide
from harness.lockstep_campaign.run import CampaignRun
from harness.lockstep_racky.run import WALL0_NS

HEALTHY = SCENARIOS[0]
WALL0_S = WALL0_NS / 1e9


def _starts(run: CampaignRun) -> dict[str, list[str]]:
    """rack -> run ids its racky started (a fresh recording: not answered ``again``)."""
    out: dict[str, list[str]] = {}
    for _t, rack, verb, st in run.orders:
        v = st.get("validation") or {}
        if verb == "start_validation" and v.get("run_id") and not v.get("again"):
            out.setdefault(rack, []).append(v["run_id"])
    return out


def _evidence(run: CampaignRun) -> dict[str, dict[str, Any]]:
    """rack -> the evidence of the production order racky accepted."""
    out = {}
    for _t, rack, verb, st in run.orders:
        if verb == "set_lifecycle" and (st.get("changed") or {}).get(
                "lifecycle", {}).get("to") == "production":
            out[rack] = st
    return out


def _mid_run(r: RackyRack, run_id: str, now: float, after_s: float) -> bool:
    v = r.core.validation
    return v is not None and v.run_id == run_id and now - v.start >= after_s


def _running(rlc: RlcSide, run_id: str) -> bool:
    c = rlc.driver.campaign
    return c is not None and run_id in c.runs and c.runs[run_id].state == "running"


def test_racky_restarted_mid_stage_run_dropped_repeated_and_counted_once() -> None:
    ev: dict[str, Any] = {}

    def on_tick(now: float, rackies: list[RackyRack], rlc: RlcSide) -> None:
        r2 = rackies[1]
        if "restart" not in ev and _mid_run(r2, "multi.1", now, 8.0):
            r2.restart(now)
            ev["restart"] = now
            rlc.driver.on_racky_state(r2.name, r2.state_bytes())  # its first state

    run = run_campaign(HEALTHY, load_s=10.0, backend_s=20.0, judge_epoch=1, on_tick=on_tick)
    assert "restart" in ev and run.finished
    assert all(v.status == "production" for v in run.verdicts.values()), run.verdicts
    c = run.rlc.driver.campaign
    lost, done = c.runs["multi.1"], c.runs["multi.2"]
    assert lost.state == "lost" and lost.results == {}      # no pass without a complete run
    assert lost.ended_at_s - (WALL0_S + ev["restart"]) <= 1.0 < lost.deadline_s - \
        lost.ended_at_s                                     # at once, not at its deadline
    assert done.state == "done" and set(done.results) == set(c.plan.racks)
    assert sorted(c.runs) == ["multi.1", "multi.2"] and c.seq == 2
    for r in c.plan.racks:
        assert c.racks[r].passes["multi"].run_id == "multi.2"
        assert c.racks[r].attempts == {"multi": 1}           # the lost run, counted once
    assert _starts(run) == {r: ["multi.1", "multi.2"] for r in c.plan.racks}
    aborted = {rack for _t, rack, verb, _s in run.orders if verb == "abort_validation"}
    assert aborted == {"rack1", "rack3", "rack4"}           # rack2 records nothing to abort
    ev_ = _evidence(run)
    assert set(ev_) == set(c.plan.racks)
    print(f"\n[campaign adversarial] racky rack2 restarted at plant {ev['restart']:.0f} s: "
          f"multi.1 lost {lost.ended_at_s - WALL0_S - ev['restart']:.0f} s later (deadline "
          f"{lost.deadline_s - WALL0_S:.0f} s), multi.2 passed, all 4 in production at "
          f"{run.plant_s:.0f} s")


def test_pair_failover_mid_campaign_old_epoch_never_gates_run_repeated_under_new() -> None:
    ev: dict[str, Any] = {}

    def on_tick(now: float, rackies: list[RackyRack], rlc: RlcSide) -> None:
        r3 = rackies[2]
        if "failover" not in ev and _mid_run(r3, "multi.1", now, 8.0):
            ev["old"] = r3.restart(now, judge_epoch=2)
            ev["failover"] = now
            rlc.driver.on_racky_state(r3.name, r3.state_bytes())
        elif "failover" in ev and "late" not in ev and _running(rlc, "multi.2"):
            # the fenced leader (epoch 1) publishes late: multi.1 judged and passed
            st = ev["old"].state()
            st["validation"] = None
            st["last_validation"] = {
                "run_id": "multi.1", "stage": "multi-rack", "passed": True, "criteria": [],
                "measured": {"backend_fraction": 0.97, "nvlink_fraction": 0.97},
                "judge_epoch": 1, "started_ns": WALL0_NS + round((now - 20) * 1e9)}
            rlc.driver.on_racky_state(r3.name, json.dumps(st).encode())
            ev["late"] = now

    run = run_campaign(HEALTHY, load_s=10.0, backend_s=20.0, judge_epoch=1, on_tick=on_tick)
    assert "late" in ev and run.finished
    assert all(v.status == "production" for v in run.verdicts.values()), run.verdicts
    c = run.rlc.driver.campaign
    assert c.stale_results == 1 and c.judge_epoch["rack3"] == 2
    assert c.runs["multi.1"].state == "lost" and "rack3" not in c.runs["multi.1"].results
    assert c.runs["multi.2"].state == "done" and sorted(c.runs) == ["multi.1", "multi.2"]
    assert c.racks["rack3"].passes["multi"].run_id == "multi.2"
    assert c.racks["rack3"].passes["multi"].judge_epoch == 2
    assert {r: c.racks[r].passes["multi"].judge_epoch for r in ("rack1", "rack2", "rack4")} \
        == dict.fromkeys(("rack1", "rack2", "rack4"), 1)
    assert _starts(run) == {r: ["multi.1", "multi.2"] for r in c.plan.racks}
    prod = [o for o in run.orders if o[1] == "rack3" and o[2] == "set_lifecycle"]
    assert prod and run.verdicts["rack3"].status == "production"
    print(f"\n[campaign adversarial] rack3 failed over to epoch 2 at plant {ev['failover']:.0f}"
          f" s; the fenced leader's late pass of multi.1 (epoch 1) counted stale; multi.2 "
          f"judged under epoch 2; all 4 in production at {run.plant_s:.0f} s")


def test_racky_leaves_a_validating_lifecycle_whose_run_was_lost() -> None:
    """racky's side of the restart: its lifecycle says ``validating`` but no run is in memory
    (the run ended with the old process): the active instance goes back where the validation
    started, so that rlc's next start is accepted; a running validation is left alone."""
    from tests.unit.test_racky_campaign_gate import Rig

    rig = Rig(fleet=True, rack="rack1")
    lc = rig.core.persisted.lifecycle
    lc.state, lc.validated = "provisioning", False
    assert rig.call("start_validation", {"stage": "rack", "load_s": 5.0, "run_id": "s.1"},
                    "rlc")["ok"]
    assert not rig.core.drop_lost_validation(WALL0_NS)  # a run under way: untouched
    assert lc.state == "validating"
    rig.core.validation = None                          # the process that recorded it died
    r = rig.call("start_validation", {"stage": "rack", "load_s": 5.0, "run_id": "s.2"}, "rlc")
    assert r["error"]["code"] == "invalid_transition"   # what a restarted racky answered
    assert rig.core.drop_lost_validation(WALL0_NS) and lc.state == "provisioning"
    assert "validation lost" in lc.reason
    assert rig.call("start_validation", {"stage": "rack", "load_s": 5.0, "run_id": "s.2"},
                    "rlc")["ok"]


def test_racky_restarted_before_confirming_start_is_resent_and_counted_once() -> None:
    """racky restarts right after it took ``multi.1``'s start, before rlc saw it confirmed:
    rlc re-sends the start with the same run id (every ``resend_s``), the new process records
    it afresh (a complete run), and rlc counts one run, one result per rack."""
    ev: dict[str, Any] = {}

    def on_tick(now: float, rackies: list[RackyRack], rlc: RlcSide) -> None:
        rlc.resend_s = 3.0  # below the plan's 10 s start timeout (the daemon's: 10 s vs 120 s)
        r2 = rackies[1]
        c = rlc.driver.campaign
        if "restart" not in ev and c is not None and "multi.1" in c.runs \
                and r2.core.validation is not None:
            r2.restart(now)
            ev["restart"] = now
            rlc.driver.on_racky_state(r2.name, r2.state_bytes())

    run = run_campaign(HEALTHY, load_s=10.0, backend_s=20.0, judge_epoch=1, on_tick=on_tick)
    assert "restart" in ev and run.finished
    c = run.rlc.driver.campaign
    assert sorted(c.runs) == ["multi.1"] and c.runs["multi.1"].state == "done"
    assert set(c.runs["multi.1"].results) == set(c.plan.racks)
    starts = [(t, rack) for t, rack, verb, st in run.orders if verb == "start_validation"
              and (st.get("validation") or {}).get("run_id") == "multi.1"
              and not st["validation"].get("again")]
    assert [rack for _t, rack in starts].count("rack2") == 2   # once per racky process
    t2 = max(t for t, rack in starts if rack == "rack2")
    assert 0 < t2 - ev["restart"] <= run.rlc.resend_s + 1     # the re-send
    assert all(v.status == "production" for v in run.verdicts.values()), run.verdicts
    assert all(c.racks[r].attempts == {} for r in c.plan.racks)
