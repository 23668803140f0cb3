"""rlc's campaign driver in lock-step with racky's real command handlers (issue 17 item 1): the
driver's orders go through racky's command router as the rlc user, racky's real ``state/rack``
(JSON, as published) comes back to the driver. What runs is the daemons' code: the driver
(`rlc.campaign_driver`), the campaign core and codec, racky's router, handlers, core, judge
and gate; only the transport (MQTT, the KV bucket) is replaced by handing bytes over.

Covered: rlc's verbs (leader only, plan checked against the topology, one campaign at a time,
abort); write before send (a refused write sends nothing and the campaign is read again);
a failing validation judged by racky quarantines the rack with racky's criterion; a rack
promoted only with evidence racky accepts; an operator's production refused in fleet mode;
a stale-epoch result never gates; rlc restarted mid-campaign continues from the record, and
a re-issued start is answered by racky without a second run."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from harness.lockstep_campaign.rig import rlc_command_rig
from rackplane.clock import FakeClock
from racky.core.campaign_gate import JudgedRun
from racky.core.controller import RackyInputs
from rlc.campaign_driver import CampaignDriver, Order
from rlc.config import example_topology
from rlc.core.topology import compile_topology
from tests.unit.test_commands import CaptureLog
from tests.unit.test_racky_campaign_gate import Rig

T0 = 1_800_000_000.0
TOPO = compile_topology(example_topology())  # site lab, row1: rack1, rack2


def _plan(racks: list[str], stages: list[str]) -> dict[str, Any]:
    return {"racks": racks, "cdu_of": {r: f"cdu-{r}" for r in racks},
            "start_timeout_s": 30.0, "result_grace_s": 30.0,
            "stages": [{"name": s, "kind": s, "power_w": 50_000.0,
                        "phases": [{"kind": "burn_in", "duration_s": 3.0}]} for s in stages]}


class RlcRig:
    """rlc's verbs through a real router (the lock-step harness's wiring,
    `harness.lockstep_campaign.rig.rlc_command_rig`), and the driver; ``kv`` holds the
    record's bytes."""

    def __init__(self, kv: dict[str, Any] | None = None) -> None:
        self.clock = FakeClock()
        self.driver = CampaignDriver(TOPO, "rackplane", "rlc")
        self.lead = True
        self.verbs = rlc_command_rig(self.driver, lambda: self.lead, {"alice": "operator"},
                                     clock=self.clock, log=CaptureLog())
        self.kv: dict[str, Any] = kv if kv is not None else {"rev": 0, "data": None}
        self.driver.restore(None if self.kv["data"] is None
                            else (self.kv["rev"], self.kv["data"]))

    def call(self, verb: str, args: Mapping[str, Any], user: str = "alice") -> dict[str, Any]:
        return self.verbs.call(verb, args, user)

    def cycle(self, now: float, epoch: int = 1, *, refuse: bool = False) -> list[Order]:
        """One leader cycle: step, write before send (``refuse``: the write is refused)."""
        d = self.driver
        if not d.loaded:
            d.restore(None if self.kv["data"] is None else (self.kv["rev"], self.kv["data"]))
        data, orders = d.step(now, epoch, {r: 20_000.0 for r in TOPO.rack_ids})
        if data is None:
            return []
        if refuse:
            d.write_failed(unknown=False)
            return []
        self.kv["rev"] += 1
        self.kv["data"] = data
        d.written(self.kv["rev"], data)
        return d.commands(orders)


def _deliver(orders: list[Order], rackies: dict[str, Rig]) -> list[dict[str, Any]]:
    """Each order through its racky's command router as user rlc."""
    return [rackies[o.rack].call(o.verb, o.args, "rlc") for o in orders]


def _publish(rackies: dict[str, Rig], rlc: RlcRig) -> None:
    """Each racky's state/rack as published (JSON) to the driver."""
    for name, rig in rackies.items():
        rlc.driver.on_racky_state(name, json.dumps(rig.core.state()).encode())


def test_rlc_verbs_leader_only_plan_checked_one_at_a_time_and_abort() -> None:
    rlc = RlcRig()
    ok: dict[str, Any] = {"campaign_id": "c1", "plan": _plan(["rack1"], ["rack"])}
    rlc.lead = False
    r = rlc.call("campaign_start", ok)
    assert r["error"]["code"] == "not_leader", r
    rlc.lead = True
    r = rlc.call("campaign_start", {"campaign_id": "c1", "plan": _plan(["rack9"], ["rack"])})
    assert r["error"]["code"] == "invalid_args" and "rack9" in r["error"]["message"], r
    too_big = _plan(["rack1"], ["rack"])
    too_big["stages"][0]["power_w"] = 500_000.0  # above the rack's max_w: never runs
    r = rlc.call("campaign_start", {"campaign_id": "c1", "plan": too_big})
    assert r["error"]["code"] == "invalid_args" and "max_w" in r["error"]["message"], r
    r = rlc.call("campaign_start", {**ok, "plan": {**ok["plan"], "max_attempts": 0}})
    assert r["error"]["code"] in ("out_of_range", "invalid_args"), r
    r = rlc.call("campaign_start", ok)
    assert r["ok"] and r["state"]["pending"] == "start c1", r
    assert rlc.call("campaign_start", ok)["error"]["code"] == "campaign_running"
    assert rlc.call("campaign_status", {}, user="viewer")["ok"]  # a reader may look
    orders = rlc.cycle(T0)
    assert [(o.rack, o.verb, o.args["run_id"]) for o in orders] == \
        [("rack1", "start_validation", "rack.1")]
    assert rlc.call("campaign_start", ok)["error"]["code"] == "campaign_running"
    assert rlc.call("campaign_abort", {"reason": "change window"})["ok"]
    rlc.cycle(T0 + 1)
    st = rlc.call("campaign_status", {})["state"]
    assert st["aborted"] and "change window" in st["aborted"]
    assert rlc.call("campaign_abort", {"reason": "again"})["error"]["code"] == "no_campaign"


def test_a_refused_write_sends_nothing_and_the_record_is_read_again() -> None:
    rlc = RlcRig()
    assert rlc.call("campaign_start", {"campaign_id": "c1",
                                       "plan": _plan(["rack1"], ["rack"])})["ok"]
    assert rlc.cycle(T0) != []  # written: the start goes out
    rev = rlc.kv["rev"]
    rlc.driver.on_racky_state("rack1", json.dumps({"judge_epoch": 0, "validation": {
        "run_id": "rack.1"}, "lifecycle": {"state": "validating"}}).encode())
    assert rlc.cycle(T0 + 1, refuse=True) == []  # another leader wrote first: nothing sent
    assert rlc.driver.campaign is None and not rlc.driver.loaded
    assert rlc.kv["rev"] == rev
    rlc.cycle(T0 + 2)  # read again, continues from the record
    c = rlc.driver.campaign
    assert c is not None and c.runs["rack.1"].state == "running"


def test_a_failing_validation_judged_by_racky_quarantines_the_rack_with_its_criterion() -> None:
    rlc = RlcRig()
    racky = {"rack1": Rig(fleet=True, rack="rack1")}
    core = racky["rack1"].core
    assert rlc.call("campaign_start", {"campaign_id": "c1",
                                       "plan": _plan(["rack1"], ["rack"])})["ok"]
    (rep,) = _deliver(rlc.cycle(T0), racky)
    assert rep["ok"] and core.validation is not None and core.validation.run_id == "rack.1"
    _publish(racky, rlc)
    rlc.cycle(T0 + 1)
    assert rlc.driver.campaign is not None
    assert rlc.driver.campaign.runs["rack.1"].state == "running"
    t = racky["rack1"].clock.monotonic()
    for k in range(1, 6):  # racky records and judges (no load reached it: thermal fails)
        core.step(t + k, RackyInputs())
    assert core.validation is None and core.persisted.lifecycle.state == "quarantined"
    _publish(racky, rlc)
    orders = rlc.cycle(T0 + 6)
    st = rlc.driver.status(T0 + 6)["racks"]["rack1"]
    assert st["status"] == "quarantined" and "thermal under load" in st["quarantine"], st
    # racky quarantined the rack by its own verdict: rlc's order is confirmed, not re-sent
    assert orders == [] and rlc.driver.campaign is not None
    assert rlc.driver.campaign.racks["rack1"].lifecycle_confirmed == "quarantined"
    core.persisted.lifecycle.state = "maintenance"  # had racky not: rlc orders it
    _publish(racky, rlc)
    rlc.cycle(T0 + 7)
    orders = rlc.driver.commands(rlc.driver.outstanding(T0 + 8))  # the daemon's re-send
    assert [(o.verb, o.args["state"]) for o in orders] == [("set_lifecycle", "quarantined")]
    assert all(r["ok"] for r in _deliver(orders, racky))
    assert core.persisted.lifecycle.state == "quarantined"


def _judged_pass(rig: Rig, run_id: str, stage: str, epoch: int, at_ns: int) -> None:
    """Stands in for the burn-in on the simulator (test_racky_core runs the real one): the
    pass racky's judge records for a campaign run."""
    core = rig.core
    core.validation = None
    core.persisted.judged_runs.append(JudgedRun(run_id, stage, True, epoch, at_ns))
    core.persisted.last_validation = {
        "stage": stage, "rack": core.cfg.identity.rack, "trays": None, "passed": True,
        "started_ns": at_ns, "criteria": [], "link_alarms": [], "run_id": run_id,
        "judge_epoch": epoch, "measured": {"nvlink_fraction": 0.8}}
    lc = core.persisted.lifecycle
    lc.validation_result(True, "passed", at_ns, promote=not core.cfg.fleet.enabled)


def test_promotion_with_evidence_stale_epoch_never_gates_operator_refused_and_restart() -> None:
    kv: dict[str, Any] = {"rev": 0, "data": None}
    rlc = RlcRig(kv)
    rig = Rig(fleet=True, rack="rack1", campaign_gate={"required_stages": ["rack"]})
    racky = {"rack1": rig}
    lc = rig.core.persisted.lifecycle
    lc.state, lc.validated = "provisioning", False
    rig.core.judge_epoch = 5
    assert rlc.call("campaign_start", {"campaign_id": "c1",
                                       "plan": _plan(["rack1"], ["rack"])})["ok"]
    (rep,) = _deliver(rlc.cycle(T0), racky)
    assert rep["ok"]
    _publish(racky, rlc)
    rlc.cycle(T0 + 1)
    # rlc restarts mid-stage: a new driver continues from the record; the start it re-sends
    # is the same run, which racky answers without starting again
    rlc = RlcRig(kv)
    run = rig.core.validation
    c = rlc.driver.campaign
    assert c is not None and c.runs["rack.1"].state == "running" and c.seq == 1
    assert rlc.driver.commands(rlc.driver.outstanding(T0 + 2)) == []  # confirmed: not re-sent
    for r in _deliver([Order("rack1", "start_validation",
                             {"stage": "rack", "load_s": 3.0, "backend_s": 0.0,
                              "run_id": "rack.1"})], racky):
        assert r["ok"] and r["state"]["validation"]["again"] is True
    assert rig.core.validation is run
    # a result judged under an older epoch (a fenced racky leader) never gates
    _judged_pass(rig, "rack.1", "rack", 4, 3 * 10**9)
    _publish(racky, rlc)
    assert rlc.driver.seen["rack1"].judge_epoch == 5
    orders = rlc.cycle(T0 + 4) + rlc.driver.commands(rlc.driver.outstanding(T0 + 4))
    assert all(o.args.get("state") != "production" for o in orders)
    c = rlc.driver.campaign
    assert c is not None and c.stale_results == 1 and not c.gate_open("rack1")
    # the operator tries production in fleet mode: refused, audited
    r = rig.call("set_lifecycle", {"state": "production", "reason": "ship it"}, "alice")
    assert r["error"]["code"] == "production_gated" and rig.audits[-1].outcome == \
        "production_gated"
    # racky judges the run under its current epoch: rlc promotes with evidence racky accepts
    rig.core.persisted.judged_runs.clear()
    rig.core.persisted.lifecycle.state = "validating"
    _judged_pass(rig, "rack.1", "rack", 5, 4 * 10**9)
    assert lc.state == "maintenance" and lc.validated  # a pass alone does not promote
    rlc.driver.fed.clear()
    _publish(racky, rlc)
    orders = rlc.cycle(T0 + 5)
    prod = [o for o in orders if o.args.get("state") == "production"]
    assert len(prod) == 1 and prod[0].args["evidence"]["passes"]["rack"] == {
        "run_id": "rack.1", "judge_epoch": 5}
    (rep,) = _deliver(prod, racky)
    assert rep["ok"], rep
    assert lc.state == "production" and lc.by == "rlc"
    _publish(racky, rlc)
    rlc.cycle(T0 + 6)
    assert rlc.driver.status(T0 + 6)["racks"]["rack1"]["status"] == "production"
    assert rlc.driver.finished()


def test_a_new_leader_starts_nothing_before_it_read_the_record_and_keeps_a_bad_one() -> None:
    rlc = RlcRig()
    ok: dict[str, Any] = {"campaign_id": "c1", "plan": _plan(["rack1"], ["rack"])}
    rlc.driver.forget()  # a new tenure: the record is not read yet
    r = rlc.call("campaign_start", ok)
    assert r["error"]["code"] == "not_ready" and "not read yet" in r["error"]["message"], r
    rlc.driver.restore((7, b'{"format": "rlc.campaign", "version": 99}'))
    assert rlc.driver.bad_record and rlc.driver.counts["bad_records"] == 1
    r = rlc.call("campaign_start", ok)
    assert r["error"]["code"] == "not_ready" and "does not decode" in r["error"]["message"], r
    data, orders = rlc.driver.step(T0, 1, {})
    assert data is None and not orders.starts  # never overwritten, nothing runs
