"""Property tests of rlc's validation campaigns (issue 17), with hypothesis.

Random sites (rows, halls, power limits, CDUs shared by racks of one or several rows), random
plans (node, rack and multi-rack stages, groups, draws, expected ranges, the blast-radius
limit) and random runs of a campaign: racks whose start or abort is confirmed late, twice or
never; results that pass, fail naming a part or not, lack a figure, or come from a fenced
judge (stale epoch); judges failing over; racks with a real fault and healthy racks that suffer
a cross-rack figure beside a faulty one; committed power of every rack changing; time jumping;
and rlc leaders replaced at random points (the campaign serialised and restored, every
unconfirmed order sent again). After every step:

- never more than ``max_racks_per_row`` racks of a row validating, never two of one CDU, a rack
  in at most one run;
- a start never puts a row or hall past its limit (loads computed here, independently);
- a production order only for a rack whose every stage has a pass sent under the judge's
  current epoch (multi-rack: every rack of that run passed), never for a faulty rack (whose
  only passes are stale ones);
- a healthy rack never quarantined;
- a plan refused by `check_plan` exactly when some rack or group could never fit.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rlc.core.campaign import Campaign, FailedCriterion, LifecycleOrder, StageResult, StepOrders
from rlc.core.campaign_codec import dumps, loads
from rlc.core.campaign_plan import CampaignPlan, PlanError, check_plan
from rlc.core.topology import Topology, TopologySettings, compile_topology

SETTINGS = settings(max_examples=120, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])
EPS_W = 1e-9
T0 = 1_800_000_000.0


@st.composite
def sites(draw: Any) -> tuple[TopologySettings, dict[str, str]]:
    """A topology and each rack's CDU (drawn among fewer CDUs than racks at times)."""
    halls: dict[str, Any] = {}
    names: list[str] = []
    for h in range(draw(st.integers(1, 2))):
        rows: dict[str, Any] = {}
        floors_h = 0.0
        limits_h = 0.0
        for r in range(draw(st.integers(1, 3))):
            racks = {}
            for k in range(draw(st.integers(1, 4))):
                f = draw(st.floats(0.0, 20.0))
                racks[f"h{h}r{r}k{k}"] = {"floor_w": f, "max_w": f + draw(st.floats(40.0, 80.0))}
            sf = math.fsum(x["floor_w"] for x in racks.values())
            tight = draw(st.integers(0, 3)) == 0
            limit = max(sf + draw(st.floats(0.0 if tight else 120.0, 300.0)), 1.0)
            rows[f"row{r}"] = {"limit_w": limit, "racks": racks}
            floors_h += sf
            limits_h += limit
            names += list(racks)
        feed = floors_h + draw(st.floats(0.3 if draw(st.booleans()) else 0.8, 1.0)) * (
            limits_h - floors_h)
        halls[f"hall{h}"] = {"feed_limit_w": max(feed, 1.0), "rows": rows}
    n_cdu = draw(st.integers(max(1, len(names) // 2), len(names)))
    cdu = {r: f"cdu{draw(st.integers(0, n_cdu - 1))}" for r in names}
    return TopologySettings.model_validate({"site": "t", "halls": halls}), cdu


def _phases(draw: Any, backend: bool) -> list[dict[str, Any]]:
    out = [{"kind": "burn_in", "duration_s": draw(st.sampled_from([60.0, 600.0, 3600.0]))}]
    if draw(st.booleans()):
        out.append({"kind": "agentic", "duration_s": 300.0})
    if backend:
        out.append({"kind": "backend_only", "duration_s": 300.0})
    return out


def _groups(draw: Any, chosen: list[str], cdu: dict[str, str], n_row: int,
            row_of: dict[str, str]) -> list[list[str]]:
    """Groups of 2-3: at random, or (mostly) packed so that no group has two racks of a CDU
    or more than ``n_row`` of a row (a group may still be refused for power)."""
    order = draw(st.permutations(chosen))
    groups: list[list[str]] = []
    if draw(st.integers(0, 3)) == 0:
        i = 0
        while i < len(order):
            n = draw(st.integers(2, 3))
            groups.append(list(order[i:i + n]))
            i += n
    else:
        size = draw(st.integers(2, 3))
        for r in order:
            for g in groups:
                if len(g) < size and cdu[r] not in {cdu[x] for x in g} and \
                        sum(row_of[x] == row_of[r] for x in g) < n_row:
                    g.append(r)
                    break
            else:
                groups.append([r])
    singles = [g[0] for g in groups if len(g) == 1]
    groups = [g for g in groups if len(g) > 1]
    if len(singles) > 1:
        groups.append(singles)
    elif singles and groups:
        groups[-1].append(singles[0])
    elif singles:
        groups.append([*singles, next(r for r in chosen if r != singles[0])])
    return groups


@st.composite
def plans(draw: Any, racks: list[str], cdu: dict[str, str],
          row_of: dict[str, str]) -> CampaignPlan:
    chosen = [r for r in racks if draw(st.integers(0, 4)) > 0] or racks[:1]
    kinds = [k for k in ("node", "rack", "multi_rack")
             if draw(st.integers(0, 3 if k == "multi_rack" else 1))] or ["rack"]
    if len(chosen) < 2:
        kinds = [k for k in kinds if k != "multi_rack"] or ["rack"]
    stages = []
    n_row = draw(st.integers(1, 3))
    for k in kinds:
        s: dict[str, Any] = {"name": f"s_{k}", "kind": k, "power_w": draw(st.floats(1.0, 40.0)),
                             "phases": _phases(draw, k == "multi_rack")}
        if k == "rack" and draw(st.booleans()):
            s["expected"] = {"nvlink_fraction": {"min": 0.7, "max": 1.0}}
        if k == "multi_rack":
            s["expected"] = {"backend_fraction": {"min": 0.3, "max": 1.0}}
            s["groups"] = _groups(draw, chosen, cdu, n_row, row_of)
        stages.append(s)
    return CampaignPlan.model_validate({
        "racks": chosen, "cdu_of": {r: cdu[r] for r in chosen}, "stages": stages,
        "max_racks_per_row": n_row, "start_timeout_s": 60.0,
        "result_grace_s": 300.0, "settle_s": draw(st.sampled_from([0.0, 30.0])),
        "max_attempts": draw(st.integers(1, 3))})


def _never_fits(plan: CampaignPlan, t: TopologySettings) -> bool:
    """Whether some rack or group of the plan could never run, computed from the settings."""
    where = {}
    row_floor: dict[str, float] = {}
    hall_floor: dict[str, float] = {}
    row_lim: dict[str, float] = {}
    for hn, hall in t.halls.items():
        for rn, row in hall.rows.items():
            row_lim[rn + hn] = row.limit_w
            for k, spec in row.racks.items():
                where[k] = (rn + hn, hn, spec)
                row_floor[rn + hn] = row_floor.get(rn + hn, 0.0) + spec.floor_w
                hall_floor[hn] = hall_floor.get(hn, 0.0) + spec.floor_w
    for s in plan.stages:
        for unit in s.groups or [[r] for r in plan.racks]:
            if Counter(where[r][0] for r in unit).most_common(1)[0][1] > plan.max_racks_per_row:
                return True
            if len({plan.cdu_of[r] for r in unit}) < len(unit):
                return True
            if any(s.power_w > where[r][2].max_w for r in unit):
                return True
            rows = dict(row_floor)
            halls = dict(hall_floor)
            for r in unit:
                rows[where[r][0]] += s.power_w - where[r][2].floor_w
                halls[where[r][1]] += s.power_w - where[r][2].floor_w
            if any(rows[k] > row_lim[k] for k in rows) or \
                    any(halls[h] > t.halls[h].feed_limit_w for h in halls):
                return True
    return False


class Sim:
    """The racks, their judges and the oracle's record of what was sent."""

    def __init__(self, topo: Topology, plan: CampaignPlan, faulty: set[str],
                 cross_only: set[str]) -> None:
        self.topo = topo
        self.plan = plan
        self.faulty = faulty
        self.cross_only = cross_only   # faulty racks whose fault shows only across racks
        self.epoch = {r: 1 for r in plan.racks}
        self.running: dict[str, str] = {}          # rack -> run id racky runs
        self.sent_pass: dict[tuple[str, str], int] = {}
        self.promoted: set[str] = set()
        self.max_at_once = 0

    def check_gate(self, c: Campaign, orders: list[LifecycleOrder]) -> None:
        for o in orders:
            if o.state != "production":
                continue
            assert o.rack not in self.faulty, o
            passes = o.evidence["passes"]
            assert set(passes) == {s.name for s in self.plan.stages}
            for p in passes.values():
                assert p["judge_epoch"] == self.epoch[o.rack], (o, self.epoch)
                assert self.sent_pass.get((p["run_id"], o.rack)) == p["judge_epoch"]
                for other in c.runs[p["run_id"]].racks:
                    assert (p["run_id"], other) in self.sent_pass
            self.promoted.add(o.rack)

    def check_limits(self, c: Campaign, committed: dict[str, float], now: float,
                     started: list[str]) -> None:
        topo, plan = self.topo, self.plan
        holding = [run for run in c.runs.values() if run.holds_slots(now)]
        racks = [r for run in holding for r in run.racks]
        assert len(racks) == len(set(racks)), "a rack in two runs"
        rows = Counter(int(topo.row_of[topo.index(r)]) for r in racks)
        assert all(n <= plan.max_racks_per_row for n in rows.values()), rows
        cdus = Counter(plan.cdu_of[r] for r in racks)
        assert all(n == 1 for n in cdus.values()), cdus
        load = {}
        for i, r in enumerate(topo.rack_ids):
            v = committed.get(r, math.nan)
            load[r] = v if math.isfinite(v) and v >= 0 else float(topo.max_w[i])
        for run in holding:
            for r in run.racks:
                load[r] = max(load[r], plan.stage(run.stage).power_w)
        for r in started:
            i = topo.index(r)
            j, h = int(topo.row_of[i]), int(topo.hall_of[i])
            row = math.fsum(load[k] for k in topo.rack_ids if int(topo.row_of[topo.index(k)]) == j)
            hall = math.fsum(load[k] for k in topo.rack_ids
                             if int(topo.hall_of[topo.index(k)]) == h)
            assert row <= float(topo.row_limit_w[j]) + EPS_W, (r, row)
            assert hall <= float(topo.hall_limit_w[h]) + EPS_W, (r, hall)

    def result(self, c: Campaign, data: Any, run_id: str, rack: str, now: float) -> None:
        run = c.runs[run_id]
        stage = self.plan.stage(run.stage)
        faulty = rack in self.faulty and (stage.kind == "multi_rack"
                                          or rack not in self.cross_only)
        peer_faulty = any(r in self.faulty for r in run.racks if r != rack)
        measured = {"nvlink_fraction": 0.9, "backend_fraction": 0.6}
        failed: tuple[FailedCriterion, ...] = ()
        passed = True
        if faulty:
            passed = False
            parts = ("tray:2", "port:tray2/nic0") if data.draw(st.integers(0, 3)) else ()
            failed = (FailedCriterion("backend traffic", "NIC min 0.10", "NIC >= 0.3", parts),)
            measured = {"nvlink_fraction": 0.5, "backend_fraction": 0.1}
        elif peer_faulty and stage.kind == "multi_rack" and data.draw(st.booleans()):
            measured["backend_fraction"] = 0.2             # collateral: no part of its own
        if data.draw(st.integers(0, 9)) == 0:
            measured = {}                                   # unusable when a range needs it
        if self.epoch[rack] > 1 and data.draw(st.integers(0, 3)) == 0:
            # a fenced judge claims a pass first: never taken
            stale = StageResult(run_id, rack, self.epoch[rack] - 1, True, (),
                                {"nvlink_fraction": 0.9, "backend_fraction": 0.6}, now)
            assert c.on_result(stale, now) == "stale"
        res = StageResult(run_id, rack, self.epoch[rack], passed, failed, measured, now)
        got = c.on_result(res, now)
        in_range = all(rng.holds(measured.get(f, math.nan)) for f, rng in stage.expected.items())
        if got == "taken" and passed and in_range:
            self.sent_pass[(run_id, rack)] = self.epoch[rack]
        if got in ("taken", "ignored"):
            self.running.pop(rack, None)
        # a fenced judge of a faulty rack claims a pass: never taken
        if faulty and self.epoch[rack] > 1:
            stale = StageResult(run_id, rack, self.epoch[rack] - 1, True, (),
                                {"nvlink_fraction": 0.9, "backend_fraction": 0.6}, now)
            assert c.on_result(stale, now) in ("stale", "ignored")

    def deliver(self, c: Campaign, data: Any, orders: StepOrders, now: float) -> None:
        for s in orders.starts:
            k = data.draw(st.integers(0, 5))
            if k == 0:
                continue                                    # lost in transit
            self.running[s.rack] = s.run_id
            if k > 1:
                c.on_started(s.run_id, s.rack, now)
            if k == 5:
                c.on_started(s.run_id, s.rack, now)         # confirmed twice
        for a in orders.aborts:
            if data.draw(st.booleans()):
                if self.running.get(a.rack) == a.run_id:
                    del self.running[a.rack]
                c.on_aborted(a.run_id, a.rack)
        for o in orders.lifecycle:
            if data.draw(st.integers(0, 3)):
                c.on_lifecycle(o.rack, o.state)


def _committed(data: Any, topo: Topology) -> dict[str, float]:
    scale = data.draw(st.sampled_from([0.0, 0.3, 0.7, 1.0]))
    out = {}
    for i, r in enumerate(topo.rack_ids):
        f, m = float(topo.floor_w[i]), float(topo.max_w[i])
        out[r] = f + scale * (m - f) * data.draw(st.floats(0.0, 1.0))
    if data.draw(st.integers(0, 4)) == 0:
        out[topo.rack_ids[0]] = math.nan
    return out


@SETTINGS
@given(site=sites(), data=st.data())
def test_campaign_limits_gate_and_quarantine_under_random_runs(
        site: tuple[TopologySettings, dict[str, str]], data: Any) -> None:
    t, cdu = site
    topo = compile_topology(t)
    row_of = {r: topo.row_ids[int(topo.row_of[i])] for i, r in enumerate(topo.rack_ids)}
    plan = data.draw(plans(list(topo.rack_ids), cdu, row_of))
    try:
        check_plan(plan, topo)
    except PlanError:
        assert _never_fits(plan, t)
        event("plan refused")
        return
    assert not _never_fits(plan, t)
    faulty = {r for r in plan.racks if data.draw(st.integers(0, 3)) == 0}
    multi = any(s.kind == "multi_rack" for s in plan.stages)
    cross = {r for r in faulty if multi and data.draw(st.booleans())}
    sim = Sim(topo, plan, faulty, cross)
    c = Campaign.new("camp", plan, topo)
    for r in plan.racks:
        c.on_judge_epoch(r, 1)
    now, epoch = T0, 1
    for _ in range(data.draw(st.integers(5, 80))):
        committed = _committed(data, topo)
        before = {r for run in c.runs.values() for r in run.racks}
        n_runs = len(c.runs)
        orders = c.step(topo, committed, now, epoch)
        started = [s.rack for s in orders.starts]
        assert len({s.run_id for s in orders.starts}) == len(c.runs) - n_runs
        sim.check_limits(c, committed, now, started)
        sim.max_at_once = max(sim.max_at_once, sum(len(run.racks) for run in c.runs.values()
                                                   if run.holds_slots(now)))
        sim.check_gate(c, orders.lifecycle)
        sim.deliver(c, data, orders, now)
        del before
        for rack, run_id in list(sim.running.items()):
            if data.draw(st.booleans()) and rack in c.runs[run_id].racks:
                sim.result(c, data, run_id, rack, now)
        if data.draw(st.integers(0, 7)) == 0:               # a judge fails over
            r = data.draw(st.sampled_from(plan.racks))
            sim.epoch[r] += 1
            c.on_judge_epoch(r, sim.epoch[r])
            sim.running.pop(r, None)                        # a new racky knows no run
        if data.draw(st.integers(0, 5)) == 0:               # a new rlc leader
            data_b = dumps(c)
            c = loads(data_b, topo)
            assert dumps(c) == data_b
            epoch += 1
            again = c.outstanding(now)
            sim.check_gate(c, again.lifecycle)
            n_runs = len(c.runs)
            sim.deliver(c, data, again, now)
            assert len(c.runs) == n_runs
        for r in plan.racks:
            if r not in faulty:
                assert c.racks[r].quarantine is None, (r, c.racks[r].quarantine)
        now += data.draw(st.sampled_from([1.0, 30.0, 400.0, 5000.0]))
    assert not (sim.promoted & faulty)
    event(f"promoted {min(len(sim.promoted), 3)}")
    event(f"quarantined {min(sum(c.racks[r].quarantine is not None for r in plan.racks), 3)}")
    event(f"multi-rack runs {min(sum(run.stage == 's_multi_rack' for run in c.runs.values()), 3)}")
    event(f"max validating at once {sim.max_at_once}")
    regrouped = any(c.groups[s.name] != [tuple(g) for g in s.groups]
                    for s in plan.stages if s.groups)
    event(f"regrouped {regrouped}")
    event(f"blocked {any(c.racks[r].blocked for r in plan.racks)}")
