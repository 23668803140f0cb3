"""A campaign in lock-step with racky on the virtual rack (issue 17): rlc's driver and campaign
core drive racky's real command router and handlers over racky's tick (`racky.tick.RackyTick`
in `harness.lockstep_racky.run_racky`), racky's real judge passes a healthy rack under a
burn-in, and rlc's production order with the evidence passes racky's fleet-mode gate. The
harness is the burn-in tool and the transport (command envelopes and ``state/rack`` JSON
handed over each tick); everything that decides is the daemons' code."""

from __future__ import annotations

import json
from typing import Any

from harness.lockstep_campaign.rig import racky_command_rig
from harness.lockstep_racky.run import WALL0_NS, run_racky
from harness.lockstep_racky.validation import burn_in_scenario
from rackplane.clock import FakeClock
from racky.config import RackyConfig
from racky.core.controller import RackyCore
from sims.scenario import ScenarioRun
from tests.unit.test_commands import CaptureLog
from tests.unit.test_racky_campaign_gate import USERS, Rig
from tests.unit.test_rlc_campaign_driver import T0, RlcRig

START_S = 20.0


class RackyFace(Rig):
    """racky's command side on the lock-step run's own core (the harness's wiring,
    `harness.lockstep_campaign.rig.racky_command_rig`; `Rig.call`)."""

    def __init__(self, core: RackyCore) -> None:
        super().__init__(fleet=True, rack="rack1")
        self.core = core
        self.clock = FakeClock(0.0, WALL0_NS)  # the command's time is the run's (plant s)
        self.verbs = racky_command_rig(core, "rack1", USERS, clock=self.clock,
                                       log=CaptureLog())
        self.audits = self.verbs.audits


def test_a_healthy_rack_passes_its_campaign_on_the_simulator_and_rlc_promotes_it() -> None:
    cfg = RackyConfig.model_validate({
        "fleet": {"enabled": True, "floor_w": 60_000.0},
        "campaign_gate": {"required_stages": ["rack"]},
        "identity": {"site": "lab", "rack": "rack1"}})
    rlc = RlcRig()
    plan = {"racks": ["rack1"], "cdu_of": {"rack1": "cdu1"}, "start_timeout_s": 10.0,
            "result_grace_s": 10.0,
            "stages": [{"name": "rack", "kind": "rack", "power_w": 120_000.0,
                        "expected": {"nvlink_fraction": {"min": 0.0, "max": 1.0}},
                        "phases": [{"kind": "burn_in", "duration_s": 30.0}]}]}
    seen: dict[str, Any] = {"face": None, "orders": [], "refused": []}

    def hook(now: float, _run: ScenarioRun, core: RackyCore) -> None:
        if seen["face"] is None:
            seen["face"] = RackyFace(core)
        face: RackyFace = seen["face"]
        face.clock.advance(now - face.clock.monotonic())
        if abs(now - START_S) < 1e-6:
            r = rlc.call("campaign_start", {"campaign_id": "c1", "plan": plan})
            assert r["ok"], r
        if now < START_S:
            return
        rlc.driver.on_racky_state("rack1", json.dumps(core.state()).encode())
        orders = rlc.cycle(T0 + now)
        if now % 5 < 1e-6:  # the daemon's re-send of unconfirmed orders
            orders += rlc.driver.commands(rlc.driver.outstanding(T0 + now))
        for o in orders:
            seen["orders"].append((now, o.verb, o.args.get("state"), o.args.get("run_id")))
            rep = face.call(o.verb, o.args, "rlc")
            if not rep["ok"]:
                seen["refused"].append((now, o.verb, rep["error"]))

    res = run_racky(burn_in_scenario(45.0, 0.0, warm_s=START_S), cfg, plant_dt_s=0.5,
                    hook=hook)
    core = res.core
    lc = core.persisted.lifecycle
    assert seen["refused"] == [], (seen["refused"], seen["orders"], lc.history,
                                   core.persisted.last_validation)
    (j,) = core.persisted.judged_runs
    assert j.run_id == "rack.1" and j.passed and j.stage == "rack", [
        c for c in (core.persisted.last_validation or {}).get("criteria", []) if not c["passed"]]
    assert lc.state == "production" and lc.by == "rlc", (lc.state, seen["orders"])
    prod = [o for o in seen["orders"] if o[2] == "production"]
    assert len(prod) >= 1
    c = rlc.driver.campaign
    assert c is not None and c.status("rack1", T0 + 1e6) == "production"
    assert c.racks["rack1"].passes["rack"].run_id == "rack.1"
    # an operator afterwards: still refused in fleet mode, the rack stays in production
    face: RackyFace = seen["face"]
    r = face.call("set_lifecycle", {"state": "production", "reason": "x"}, "alice")
    assert r["error"]["code"] == "production_gated" and lc.state == "production"
