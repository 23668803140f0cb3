"""rlc's validation campaigns (issue 17 items 1-2, the pure core): the plan and its checks on
the topology, the scheduler's limits, the gate, quarantine with parts named, multi-rack
regrouping, and the JSON record a new leader continues from. Random properties:
test_rlc_campaign_properties.py."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from pydantic import ValidationError

from rlc.core.campaign import Campaign, FailedCriterion, StageResult
from rlc.core.campaign_codec import dumps, loads
from rlc.core.campaign_plan import (
    CampaignPlan,
    PlanError,
    check_plan,
    racky_start_args,
    revalidation_plan,
)
from rlc.core.campaign_schedule import schedule
from rlc.core.topology import Topology, TopologySettings, compile_topology

T0 = 1_800_000_000.0


def _topo(rows: dict[str, dict[str, Any]], feed_w: float = 10_000.0) -> Topology:
    return compile_topology(TopologySettings.model_validate(
        {"site": "dc1", "halls": {"h1": {"feed_limit_w": feed_w, "rows": rows}}}))


def _row(limit_w: float, *racks: str, floor: float = 10.0, mx: float = 100.0) -> dict[str, Any]:
    return {"limit_w": limit_w, "racks": {r: {"floor_w": floor, "max_w": mx} for r in racks}}


def _stage(name: str, kind: str = "rack", power_w: float = 80.0, **kw: Any) -> dict[str, Any]:
    return {"name": name, "kind": kind, "power_w": power_w,
            "phases": [{"kind": "burn_in", "duration_s": 600.0},
                       {"kind": "backend_only", "duration_s": 300.0}], **kw}


def _plan(racks: list[str], stages: list[dict[str, Any]], cdu: dict[str, str] | None = None,
          **kw: Any) -> CampaignPlan:
    return CampaignPlan.model_validate({
        "racks": racks, "cdu_of": {r: f"cdu-{r}" for r in racks} if cdu is None else cdu,
        "stages": stages, **kw})


def _res(c: Campaign, run_id: str, rack: str, passed: bool = True, epoch: int = 1,
         parts: tuple[str, ...] = (), **measured: float) -> str:
    failed = () if passed else (FailedCriterion("link errors", "link alarms 1", "none", parts),)
    return c.on_result(StageResult(run_id, rack, epoch, passed, failed, measured, T0), T0)


def _start_all(c: Campaign, orders: Any, now: float = T0) -> None:
    for o in orders.starts:
        c.on_started(o.run_id, o.rack, now)


ROWS = {"r1": _row(1000.0, "a", "b", "c"), "r2": _row(1000.0, "d", "e", "f")}


# --- the plan -------------------------------------------------------------------------------


def test_plan_refuses_a_rack_or_group_that_can_never_fit() -> None:
    topo = _topo(ROWS)
    plan = _plan(["a", "b", "d", "e"],
                 [_stage("m", "multi_rack", groups=[["a", "b"], ["d", "e"]])])
    with pytest.raises(PlanError) as e:
        check_plan(plan, topo)
    assert "group ['a', 'b']: 2 racks in row h1/r1, above max_racks_per_row 1" in str(e.value)
    assert "group ['d', 'e']: 2 racks in row h1/r2" in str(e.value)
    check_plan(plan.model_copy(update={"max_racks_per_row": 2}), topo)
    plan = _plan(["a", "d"], [_stage("m", "multi_rack", groups=[["a", "d"]])],
                 cdu={"a": "x", "d": "x"})
    with pytest.raises(PlanError, match=r"group \['a', 'd'\]: 2 racks on CDU x"):
        check_plan(plan, topo)
    # power: the other racks at their 10 W floors, a at 80 W: 100 W in a 95 W row
    tight = _topo({"r1": _row(95.0, "a", "b", "c"), "r2": _row(1000.0, "d")})
    plan = _plan(["a", "d"], [_stage("s")])
    with pytest.raises(PlanError, match=r"stage s rack a: 100 W in row h1/r1 .* limit 95 W"):
        check_plan(plan, tight)
    check_plan(plan, _topo({"r1": _row(100.0, "a", "b", "c"), "r2": _row(1000.0, "d")}))
    plan = _plan(["a", "d"], [_stage("s", power_w=120.0)])
    with pytest.raises(PlanError, match="power_w 120 W above rack a's max_w 100 W"):
        check_plan(plan, topo)
    # the hall: 4 racks at 10 W, a and d at 80 W: 200 W
    plan = _plan(["a", "d"], [_stage("m", "multi_rack", groups=[["a", "d"]])])
    with pytest.raises(PlanError, match=r"200 W in hall h1 .* above its limit 150 W"):
        check_plan(plan, _topo(ROWS, feed_w=150.0))
    check_plan(plan, _topo(ROWS, feed_w=200.0))
    with pytest.raises(PlanError):
        Campaign.new("c", plan, _topo(ROWS, feed_w=150.0))


def test_plan_itself_is_checked() -> None:
    with pytest.raises(ValidationError, match="racks in no group"):
        _plan(["a", "b", "c"], [_stage("m", "multi_rack", groups=[["a", "b"]])])
    with pytest.raises(ValidationError, match="racks in more than one group"):
        _plan(["a", "b", "c"], [_stage("m", "multi_rack", groups=[["a", "b"], ["b", "c"]])])
    with pytest.raises(ValidationError, match="fewer than 2 racks"):
        _plan(["a"], [_stage("m", "multi_rack", groups=[["a"]])])
    with pytest.raises(ValidationError, match="without a CDU"):
        _plan(["a"], [_stage("s")], cdu={})
    with pytest.raises(ValidationError, match="stage names not unique"):
        _plan(["a"], [_stage("s"), _stage("s")])
    with pytest.raises(ValidationError, match=r"min 0\.9 above max 0\.5"):
        _plan(["a"], [_stage("s", expected={"nvlink_fraction": {"min": 0.9, "max": 0.5}})])
    with pytest.raises(ValidationError, match="trays only for a node stage"):
        _plan(["a"], [_stage("s", trays=[1])])
    with pytest.raises(ValidationError):
        _plan(["a"], [_stage("s", phases=[{"kind": "burn_in", "duration_s": 90_000.0}])])
    with pytest.raises(PlanError, match="not in the topology"):
        check_plan(_plan(["zz"], [_stage("s")]), _topo(ROWS))


def test_racky_args_and_revalidation_plan() -> None:
    s = _plan(["a"], [_stage("n", "node", trays=[0, 3], phases=[
        {"kind": "burn_in", "duration_s": 100.0}, {"kind": "agentic", "duration_s": 50.0},
        {"kind": "backend_only", "duration_s": 30.0}])]).stages[0]
    assert racky_start_args(s) == {"stage": "node", "load_s": 150.0, "backend_s": 30.0,
                                   "trays": [0, 3]}
    plan = _plan(["a", "b", "d", "e"],
                 [_stage("n", "node"), _stage("r"),
                  _stage("m", "multi_rack", groups=[["a", "d"], ["b", "e"]])],
                 max_racks_per_row=2)
    rp = revalidation_plan(plan, ["a", "e"], "link_flap")
    assert [s.name for s in rp.stages] == ["r", "m"]
    assert rp.racks == ["a", "e"] and rp.stages[1].groups == [["a", "e"]]
    assert [s.name for s in revalidation_plan(plan, ["b"], "overheating").stages] == ["n", "r"]
    assert len(revalidation_plan(plan, ["a", "b", "d"], "maintenance").stages) == 3
    with pytest.raises(ValueError, match="needs 2 racks"):
        revalidation_plan(plan, ["a"], "crc_creep")
    with pytest.raises(ValueError, match="not in the plan"):
        revalidation_plan(plan, ["q"], "maintenance")


# --- the scheduler --------------------------------------------------------------------------


def test_schedule_blast_radius_cdu_and_power() -> None:
    rows = {"r1": _row(250.0, "a", "b", "c", "g"), "r2": _row(1000.0, "d", "e", "f")}
    topo = _topo(rows)
    plan = _plan(["a", "b", "c", "g", "d", "e", "f"], [_stage("s")],
                 cdu={"a": "x", "b": "y", "c": "z", "g": "w", "d": "x", "e": "v", "f": "u"},
                 max_racks_per_row=2)
    c = Campaign.new("c1", plan, topo)
    committed = {r: 10.0 for r in topo.rack_ids}
    got = [u for _, u in schedule(c, topo, committed, T0)]
    # r1: a (CDU x), b, then 2 a row; r2: d shares CDU x with a -> e, f
    assert got == [("a",), ("b",), ("e",), ("f",)]
    # r1 (250 W): c already committed 100 W: 10 + 10 + 100 + 10 = 130 W; a to 80 W: 200 W;
    # b would make 270 W; c validates within what it holds (no extra)
    committed["c"] = 100.0
    got = [u for _, u in schedule(c, topo, committed, T0)]
    assert got == [("a",), ("c",), ("e",), ("f",)]
    # unknown or implausible committed power counts as the rack's max_w (100 W): r1 at 220 W
    committed = {r: 10.0 for r in topo.rack_ids}
    committed["g"] = math.nan
    del committed["c"]
    got = [u for _, u in schedule(c, topo, committed, T0)]
    assert got == [("c",), ("g",), ("d",), ("e",)]  # a not started: CDU x free for d
    committed["b"] = -5.0  # r1 now 310 W, already over its 250 W: nothing starts there
    got = [u for _, u in schedule(c, topo, committed, T0)]
    assert got == [("d",), ("e",)]
    # the hall feed
    topo2 = _topo(rows, feed_w=300.0)  # 7 × 10 W floors; each start adds 70 W
    c2 = Campaign.new("c2", plan.model_copy(update={"stages": [plan.stages[0].model_copy(
        update={"power_w": 40.0})]}), topo2)
    got = [u for _, u in schedule(c2, topo2, {r: 10.0 for r in topo2.rack_ids}, T0)]
    assert got == [("a",), ("b",), ("e",), ("f",)]  # 70 + 4 × 30 = 190 W
    c3 = Campaign.new("c3", plan, topo)
    got = [u for _, u in schedule(c3, _topo(rows, feed_w=250.0),
                                  {r: 10.0 for r in topo.rack_ids}, T0)]
    assert got == [("a",), ("b",)]  # 70 + 2 × 70 = 210; a third: 280 W > 250 W


# --- runs, the gate, quarantine -------------------------------------------------------------


def _two_stage(racks: list[str], **kw: Any) -> tuple[Topology, Campaign]:
    topo = _topo(ROWS)
    plan = _plan(racks, [_stage("node", "node", trays=[0, 1]),
                         _stage("rack", expected={"nvlink_fraction": {"min": 0.8}})],
                 max_racks_per_row=3, **kw)
    return topo, Campaign.new("c1", plan, topo)


def _committed(topo: Topology) -> dict[str, float]:
    return {r: 10.0 for r in topo.rack_ids}


def test_gate_needs_every_stage_passed_under_the_current_judge_epoch() -> None:
    topo, c = _two_stage(["a", "b"])
    o = c.step(topo, _committed(topo), T0, rlc_epoch=7)
    assert [(s.run_id, s.rack, s.args["stage"]) for s in o.starts] == \
        [("node.1", "a", "node"), ("node.2", "b", "node")]
    assert {(x.rack, x.state) for x in o.lifecycle} == {("a", "validating"),
                                                       ("b", "validating")}
    _start_all(c, o)
    assert c.runs["node.1"].rlc_epoch == 7 and c.runs["node.1"].state == "running"
    # a result from a fenced judge (epoch below the current) never gates
    c.on_judge_epoch("a", 3)
    assert _res(c, "node.1", "a", epoch=2) == "stale"
    assert c.runs["node.1"].state == "running" and c.stale_results == 1
    assert _res(c, "node.1", "a", epoch=3) == "taken"
    assert _res(c, "node.1", "a", epoch=3) == "ignored"  # once per rack and run
    assert c.current_pass("a", "node") is not None
    assert _res(c, "node.2", "b", epoch=1) == "taken"
    o = c.step(topo, _committed(topo), T0 + 1, rlc_epoch=7)
    assert [s.run_id for s in o.starts] == ["rack.3", "rack.4"]
    _start_all(c, o)
    # a figure the stage's expected range needs, missing or implausible: refused
    assert _res(c, "rack.3", "a", epoch=3) == "unusable"
    assert _res(c, "rack.3", "a", epoch=3, nvlink_fraction=math.inf) == "unusable"
    assert _res(c, "rack.3", "a", epoch=3, nvlink_fraction=0.95) == "taken"
    assert _res(c, "rack.4", "b", epoch=1, nvlink_fraction=0.9) == "taken"
    # b's judge fails over before the promotion: b's passes no longer count
    c.on_judge_epoch("b", 2)
    assert c.gate_open("a") and not c.gate_open("b")
    o = c.step(topo, _committed(topo), T0 + 2, rlc_epoch=7)
    prod = [x for x in o.lifecycle if x.state == "production"]
    assert [x.rack for x in prod] == ["a"]
    assert prod[0].evidence["passes"] == {"node": {"run_id": "node.1", "judge_epoch": 3},
                                          "rack": {"run_id": "rack.3", "judge_epoch": 3}}
    assert [(s.rack, s.run_id) for s in o.starts] == [("b", "node.5")]
    assert c.status("a", T0 + 2) == "promoting"
    # a's judge fails over before racky confirmed: the order is withdrawn, not re-sent
    c.on_judge_epoch("a", 4)
    assert [x for x in c.lifecycle_orders() if x.state == "production"] == []
    assert c.status("a", T0 + 2) == "pending"
    c.on_lifecycle("a", "validating")
    c.on_lifecycle("b", "validating")
    assert c.lifecycle_orders() == []


def test_a_failing_rack_is_quarantined_with_criterion_and_part_the_others_proceed() -> None:
    topo, c = _two_stage(["a", "b", "d"])
    o = c.step(topo, _committed(topo), T0, rlc_epoch=1)
    _start_all(c, o)
    _res(c, "node.1", "a", passed=False, parts=("tray:1", "port:tray1/nic0"))
    _res(c, "node.2", "b")
    _res(c, "node.3", "d")
    q = c.racks["a"].quarantine
    assert q is not None and q.criterion == "link errors"
    assert q.parts == ("tray:1", "port:tray1/nic0") and q.judge_epoch == 1
    o = c.step(topo, _committed(topo), T0 + 1, rlc_epoch=1)
    assert [s.rack for s in o.starts] == ["b", "d"]
    assert [(x.rack, x.state) for x in o.lifecycle if x.rack == "a"] == [("a", "quarantined")]
    assert "tray:1, port:tray1/nic0" in o.lifecycle[0].reason
    _start_all(c, o, T0 + 1)
    _res(c, "rack.4", "b", nvlink_fraction=0.5)  # below the expected range
    _res(c, "rack.5", "d", nvlink_fraction=0.9)
    q = c.racks["b"].quarantine
    assert q is not None and (q.criterion, q.measured, q.limit, q.parts) == \
        ("nvlink_fraction", "0.500", "[0.8, 1]", ())
    assert "part not named" in q.reason
    c.step(topo, _committed(topo), T0 + 2, rlc_epoch=1)
    assert [c.status(r, T0 + 2) for r in ("a", "b", "d")] == \
        ["quarantined", "quarantined", "promoting"]


def test_lost_runs_retry_then_block_never_quarantine() -> None:
    topo, c = _two_stage(["a"], max_attempts=2, start_timeout_s=60.0, settle_s=30.0)
    o = c.step(topo, _committed(topo), T0, rlc_epoch=1)
    assert [s.run_id for s in o.starts] == ["node.1"]
    o = c.step(topo, _committed(topo), T0 + 60, rlc_epoch=1)  # start never confirmed
    assert [(x.run_id, x.rack) for x in o.aborts] == [("node.1", "a")] and not o.starts
    assert c.runs["node.1"].state == "lost" and c.racks["a"].attempts == {"node": 1}
    # the lost run still holds its slot (the burn-in may run) until the abort is confirmed
    assert c.active_run("a", T0 + 61) is not None
    c.on_aborted("node.1", "a")
    assert c.active_run("a", T0 + 61) is None
    assert not c.step(topo, _committed(topo), T0 + 89, rlc_epoch=1).starts  # settling
    o = c.step(topo, _committed(topo), T0 + 90, rlc_epoch=1)
    assert [s.run_id for s in o.starts] == ["node.2"]
    _start_all(c, o)
    run = c.runs["node.2"]
    assert run.deadline_s == T0 + 90 + 60 + 900 + 600
    o = c.step(topo, _committed(topo), run.deadline_s, rlc_epoch=1)
    assert [x.run_id for x in o.aborts] == ["node.2"]
    assert c.racks["a"].blocked is not None and c.racks["a"].quarantine is None
    assert c.status("a", run.deadline_s) == "blocked"
    # a lost run whose abort is never confirmed frees its slot at its deadline
    assert c.active_run("a", run.deadline_s) is None


def test_multi_rack_failure_quarantines_the_named_rack_and_regroups_the_healthy() -> None:
    topo = _topo({"r1": _row(1000.0, "a", "b", "c"), "r2": _row(1000.0, "d", "e", "f")})
    plan = _plan(["a", "b", "d", "e"],
                 [_stage("m", "multi_rack", groups=[["a", "d"], ["b", "e"]],
                         expected={"backend_fraction": {"min": 0.3}})],
                 max_racks_per_row=2)
    c = Campaign.new("c1", plan, topo)
    o = c.step(topo, _committed(topo), T0, rlc_epoch=1)
    assert [(s.run_id, s.rack, s.args["stage"]) for s in o.starts] == [
        ("m.1", "a", "multi-rack"), ("m.1", "d", "multi-rack"),
        ("m.2", "b", "multi-rack"), ("m.2", "e", "multi-rack")]
    _start_all(c, o)
    # a's NIC port underperforms: a names it; d's backend figure suffers with it (no part)
    _res(c, "m.1", "a", passed=False, parts=("port:tray4/nic1",), backend_fraction=0.1)
    _res(c, "m.1", "d", backend_fraction=0.2)
    # group b-e: b fails a cross-rack figure without naming a part: not attributed
    _res(c, "m.2", "b", backend_fraction=0.2)
    _res(c, "m.2", "e", backend_fraction=0.6)
    assert c.racks["a"].quarantine is not None
    assert c.racks["a"].quarantine.parts == ("port:tray4/nic1",)
    assert c.racks["d"].quarantine is None and c.racks["b"].quarantine is None
    assert c.racks["b"].attempts == {"m": 1} and c.racks["d"].attempts == {}
    assert c.current_pass("e", "m") is None  # its group failed: e's pass does not count
    o = c.step(topo, _committed(topo), T0 + 1, rlc_epoch=1)
    # d lost its partner: it joins the b-e group (a row has room for 2)
    assert c.groups["m"] == [("b", "e", "d")]
    assert [(s.run_id, s.rack) for s in o.starts] == [("m.3", "b"), ("m.3", "e"),
                                                      ("m.3", "d")]
    assert c.status("d", T0 + 1) == "validating"


def test_a_network_part_never_quarantines_the_rack_it_showed_on() -> None:
    """A backend deficit racky blames on the network (``net:rail5``: one rail of every tray)
    names the part but is the rack's fault neither in the reason nor in the verdict: the group
    runs again, and after max_attempts the rack is blocked (an operator looks) with the part
    in the reason; a rack part in the same result would quarantine."""
    topo = _topo({"r1": _row(1000.0, "a", "b", "c"), "r2": _row(1000.0, "d", "e", "f")})
    plan = _plan(["a", "d"], [_stage("m", "multi_rack", groups=[["a", "d"]])],
                 max_racks_per_row=2, max_attempts=2)
    c = Campaign.new("c1", plan, topo)
    for k in (1, 2):
        o = c.step(topo, _committed(topo), T0 + k, rlc_epoch=1)
        assert [s.run_id for s in o.starts] == [f"m.{k}", f"m.{k}"]
        _start_all(c, o)
        _res(c, f"m.{k}", "a", passed=False, parts=("net:rail5",))
        _res(c, f"m.{k}", "d")
        assert c.racks["a"].quarantine is None and c.racks["d"].quarantine is None
    assert c.status("a", T0 + 3) == "blocked" and "net:rail5" in (c.racks["a"].blocked or "")
    assert c.racks["d"].attempts == {}
    # the same with a part of the rack alongside: quarantined on that part
    c = Campaign.new("c1", plan, topo)
    _start_all(c, c.step(topo, _committed(topo), T0, rlc_epoch=1))
    _res(c, "m.1", "a", passed=False, parts=("net:rail5", "port:gpu07/nic1"))
    _res(c, "m.1", "d")
    q = c.racks["a"].quarantine
    assert q is not None and "port:gpu07/nic1" in q.reason.split(":", 2)[2][:60]


def test_a_rack_alone_needs_regroup() -> None:
    topo = _topo({"r1": _row(1000.0, "a", "b"), "r2": _row(1000.0, "d", "e")})
    plan = _plan(["a", "d"], [_stage("m", "multi_rack", groups=[["a", "d"]])])
    c = Campaign.new("c1", plan, topo)
    o = c.step(topo, _committed(topo), T0, rlc_epoch=1)
    _start_all(c, o)
    _res(c, "m.1", "a", passed=False, parts=("gpu:tray2/3",))
    _res(c, "m.1", "d")
    o = c.step(topo, _committed(topo), T0 + 1, rlc_epoch=1)
    assert not o.starts and c.status("d", T0 + 1) == "needs_regroup"


# --- the record a new leader continues from -------------------------------------------------


def test_record_round_trip_and_a_new_leader_continues_without_double_counting() -> None:
    topo, c = _two_stage(["a", "b"])
    c.on_judge_epoch("a", 2)
    o = c.step(topo, _committed(topo), T0, rlc_epoch=1)
    c.on_started("node.1", "a", T0)
    data = dumps(c)
    assert json.loads(data)["version"] == 1
    c2 = loads(data, topo)
    assert dumps(c2) == data
    # the new leader re-sends what was not confirmed: b's start, same run id
    again = c2.outstanding(T0 + 1)
    assert [(s.run_id, s.rack) for s in again.starts] == [("node.2", "b")]
    assert again.starts[0].args == o.starts[1].args
    c2.on_started("node.2", "b", T0 + 1)
    c2.on_started("node.2", "b", T0 + 2)  # the old leader's confirmation, too
    o2 = c2.step(topo, _committed(topo), T0 + 2, rlc_epoch=2)
    assert not o2.starts and len(c2.runs) == 2 and c2.seq == 2
    _res(c2, "node.1", "a", epoch=2)
    _res(c2, "node.1", "a", epoch=2)
    assert c2.current_pass("a", "node") is not None
    o2 = c2.step(topo, _committed(topo), T0 + 3, rlc_epoch=2)
    assert [s.run_id for s in o2.starts] == ["rack.3"]
    assert c2.runs["rack.3"].rlc_epoch == 2
    c3 = loads(dumps(c2), topo)
    assert c3.current_pass("a", "node") == c2.current_pass("a", "node")
    assert c3.judge_epoch == {"a": 2}


@pytest.mark.parametrize("mutate", [
    lambda d: d.update(version=2),
    lambda d: d.update(format="other"),
    lambda d: d["racks"].pop("a"),
    lambda d: d["runs"][0].update(state="sleeping"),
    lambda d: d["runs"][0].update(rlc_epoch="1"),
    lambda d: d.pop("seq"),
    lambda d: d["plan"].update(max_racks_per_row=0),
])
def test_record_refused_when_not_one(mutate: Any) -> None:
    topo, c = _two_stage(["a", "b"])
    c.step(topo, _committed(topo), T0, rlc_epoch=1)
    d = json.loads(dumps(c))
    mutate(d)
    with pytest.raises(ValueError, match="campaign record"):
        loads(json.dumps(d).encode(), topo)
    with pytest.raises(ValueError):
        loads(b"\xff", topo)


def test_abort_stops_every_run_and_starts_nothing() -> None:
    topo, c = _two_stage(["a", "b"])
    _start_all(c, c.step(topo, _committed(topo), T0, rlc_epoch=1))
    o = c.abort("operator: facility work", T0 + 5)
    assert sorted((x.run_id, x.rack) for x in o.aborts) == [("node.1", "a"), ("node.2", "b")]
    assert not c.step(topo, _committed(topo), T0 + 10_000, rlc_epoch=1).starts
    assert c.racks["a"].attempts == {}
    assert _res(c, "node.1", "a") == "ignored"


def test_result_record_and_a_clock_that_is_not_a_number() -> None:
    r = StageResult("rack.3", "a", 4, False,
                    (FailedCriterion("thermal under load", "min 1.0 K", ">= 3 K", ("gpu:3/1",)),),
                    {"nvlink_fraction": 0.91, "backend_fraction": math.nan}, T0)
    d = r.as_record()
    assert d["measured"] == {"nvlink_fraction": 0.91}
    assert StageResult.from_record(json.loads(json.dumps(d))) == StageResult(
        "rack.3", "a", 4, False, r.failed, {"nvlink_fraction": 0.91}, T0)
    for bad in ({**d, "judge_epoch": True}, {**d, "judge_epoch": -1}, {**d, "passed": 1},
                {k: v for k, v in d.items() if k != "rack"}):
        with pytest.raises(ValueError, match="stage result"):
            StageResult.from_record(bad)
    topo, c = _two_stage(["a"])
    with pytest.raises(ValueError, match="must be finite"):
        c.step(topo, _committed(topo), math.nan, rlc_epoch=1)
