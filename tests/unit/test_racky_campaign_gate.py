"""racky's gate to production in fleet mode (issue 17 item 2) through the real command router:
an operator's ``set_lifecycle production`` refused (``production_gated``, audited, nothing
changed); rlc's order refused without evidence, with a run racky never judged, a failed run, a
pass judged under an older epoch, or a required stage missing; accepted with every stage's
pass under the current epoch. A pass of a validation in fleet mode does not promote by itself.
A campaign's start re-issued with the same run id is answered, not started twice. Without
fleet mode an operator still promotes a validated rack as before."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from harness.lockstep_campaign.rig import racky_command_rig
from rackplane.clock import FakeClock
from rackplane.commands import CommandReply
from racky.config import RackyConfig
from racky.core.campaign_gate import JudgedRun
from racky.core.controller import RackyCore, RackyInputs
from racky.core.lifecycle import Lifecycle, PersistedState
from tests.unit.test_commands import CaptureLog

USERS = {"alice": "operator", "rlc": "operator"}


class Rig:
    """racky's real router and handlers on a core in maintenance (validated), through the
    lock-step harness's wiring (`harness.lockstep_campaign.rig.racky_command_rig`)."""

    def __init__(self, *, fleet: bool, rack: str = "r1", **extra: Any) -> None:
        self.clock = FakeClock()
        cfg = RackyConfig.model_validate({"fleet": {"enabled": fleet, "floor_w": 60_000.0},
                                          "identity": {"site": "lab", "rack": rack}, **extra})
        lc = Lifecycle("maintenance", 0, "validated", "test", validated=True)
        self.core = RackyCore(cfg, self.clock.monotonic(), PersistedState(lc))
        self.verbs = racky_command_rig(self.core, rack, USERS, clock=self.clock,
                                       log=CaptureLog())
        self.audits = self.verbs.audits
        self.core.step(self.clock.monotonic(), RackyInputs())

    def call(self, verb: str, args: Mapping[str, Any], user: str) -> dict[str, Any]:
        reply = self.verbs.call(verb, args, user)
        CommandReply.model_validate(reply)
        return reply

    def judged(self, *runs: tuple[str, str, bool, int]) -> None:
        self.core.persisted.judged_runs[:] = [JudgedRun(r, s, p, e, 1) for r, s, p, e in runs]


def _production(passes: dict[str, tuple[str, int]] | None) -> dict[str, Any]:
    a: dict[str, Any] = {"state": "production", "reason": "campaign c1: every stage passed"}
    if passes is not None:
        a["evidence"] = {"campaign": "c1", "passes": {
            s: {"run_id": r, "judge_epoch": e} for s, (r, e) in passes.items()}}
    return a


ALL = {"n": ("n.1", 7), "r": ("r.2", 7), "m": ("m.3", 7)}
RUNS = [("n.1", "node", True, 7), ("r.2", "rack", True, 7), ("m.3", "multi-rack", True, 7)]


def _refused(rig: Rig, args: dict[str, Any], user: str, code: str, says: str) -> None:
    before = json.dumps(rig.core.persisted.to_json(), sort_keys=True)
    r = rig.call("set_lifecycle", args, user)
    assert not r["ok"] and r["error"]["code"] == code, r
    assert says in r["error"]["message"], r["error"]["message"]
    assert rig.audits[-1].outcome == code and rig.audits[-1].user == user
    assert json.dumps(rig.core.persisted.to_json(), sort_keys=True) == before
    assert rig.core.persisted.lifecycle.state == "maintenance"


def test_fleet_mode_refuses_an_operator_and_every_bad_evidence_then_takes_rlc_with_passes(
) -> None:
    rig = Rig(fleet=True)
    rig.core.judge_epoch = 7
    rig.judged(*RUNS)
    # an operator: refused whatever evidence it carries (a copy of rlc's included)
    _refused(rig, _production(ALL), "alice", "production_gated", "only rlc")
    _refused(rig, _production(None), "alice", "production_gated", "only rlc")
    # rlc without evidence, or with a run never judged here, failed, or of a fenced judge
    _refused(rig, _production(None), "rlc", "evidence_refused", "no evidence")
    _refused(rig, _production({**ALL, "r": ("r.9", 7)}), "rlc", "evidence_refused",
             "not judged by this racky")
    rig.judged(*RUNS[:2], ("m.3", "multi-rack", False, 7))
    _refused(rig, _production(ALL), "rlc", "evidence_refused", "failed here")
    rig.judged(*RUNS[:2], ("m.3", "multi-rack", True, 6))  # judged by the fenced leader
    _refused(rig, _production({**ALL, "m": ("m.3", 6)}), "rlc", "evidence_refused", "epoch 6")
    _refused(rig, _production(ALL), "rlc", "evidence_refused", "epoch 6")
    rig.judged(*RUNS)
    rig.core.judge_epoch = 8  # racky's leadership moved on: every pass of epoch 7 is stale
    _refused(rig, _production(ALL), "rlc", "evidence_refused", "current epoch 8")
    rig.core.judge_epoch = 7
    _refused(rig, _production({"n": ALL["n"], "r": ALL["r"]}), "rlc", "evidence_refused",
             "multi-rack")
    r = rig.call("set_lifecycle", _production(ALL), "rlc")
    assert r["ok"], r
    assert rig.core.persisted.lifecycle.state == "production"
    assert rig.core.persisted.lifecycle.by == "rlc"


def test_an_operator_quarantine_forgets_the_judged_runs() -> None:
    rig = Rig(fleet=True)
    rig.judged(("n.1", "node", True, 0))
    assert rig.call("set_lifecycle", {"state": "quarantined", "reason": "leak"}, "alice")["ok"]
    assert rig.core.persisted.judged_runs == []


def test_without_fleet_mode_an_operator_promotes_a_validated_rack_as_before() -> None:
    rig = Rig(fleet=False)
    r = rig.call("set_lifecycle", _production(None), "alice")
    assert r["ok"], r
    assert rig.core.persisted.lifecycle.state == "production"


def test_a_fleet_pass_waits_in_maintenance_and_a_run_id_is_started_once() -> None:
    rig = Rig(fleet=True)
    rig.core.judge_epoch = 3
    args = {"stage": "rack", "load_s": 2.0, "backend_s": 0.0, "run_id": "r.1"}
    r = rig.call("start_validation", args, "rlc")
    assert r["ok"] and r["state"]["validation"]["run_id"] == "r.1", r
    run = rig.core.validation
    r = rig.call("start_validation", args, "rlc")  # re-issued by a new rlc leader
    assert r["ok"] and r["state"]["validation"]["again"] is True
    assert rig.core.validation is run
    assert rig.core.state()["validation"]["run_id"] == "r.1"
    t = rig.clock.monotonic()
    for k in range(1, 5):  # the plan ends; racky judges (no readings here: a fail)
        rig.core.step(t + k, RackyInputs())
    assert rig.core.validation is None
    (j,) = rig.core.persisted.judged_runs
    assert (j.run_id, j.stage, j.judge_epoch) == ("r.1", "rack", 3)
    lv = rig.core.persisted.last_validation
    assert lv is not None and lv["run_id"] == "r.1" and lv["judge_epoch"] == 3
    r = rig.call("start_validation", args, "rlc")  # once more after the verdict: answered
    assert r["ok"] and r["state"]["judged"]["run_id"] == "r.1"
    assert rig.core.validation is None
    # a pass does not promote in fleet mode: it waits in maintenance, validated
    lc = rig.core.persisted.lifecycle
    lc.start_validation("rack", "rlc", 5)
    lc.validation_result(True, "passed", 6, promote=False)
    assert lc.state == "maintenance" and lc.validated


def test_judged_runs_survive_the_state_file_and_a_bad_entry_is_refused() -> None:
    st = PersistedState(Lifecycle("maintenance", 0, "x", "t", validated=True))
    st.judged_runs = [JudgedRun("rack.1", "rack", True, 3, 5)]
    doc = json.loads(json.dumps(st.to_json()))
    assert PersistedState.from_json(doc).judged_runs == st.judged_runs
    for bad in ({"run_id": "r", "stage": "rack", "passed": "yes", "judge_epoch": 1},
                {"run_id": "r", "stage": "rack", "passed": True, "judge_epoch": True},
                {"run_id": "r", "stage": "rack", "passed": True, "judge_epoch": -1}, "x"):
        with pytest.raises(ValueError, match="judged_runs"):
            PersistedState.from_json({**doc, "judged_runs": [bad]})
    old = {k: v for k, v in doc.items() if k != "judged_runs"}  # a file of an older racky
    assert PersistedState.from_json(old).judged_runs == []
