"""Issue 17 items 3-4: validation campaigns in lock-step on the multi-rack simulator, each rack
with its own racky (the daemon's tick and command handlers), driven by rlc's campaign driver
through racky's command router (`harness.lockstep_campaign`). The short version of the scenario
set (phases 10 s + 20 s): every injected cross-rack fault is found with its failing part named
and blamed on the right side (the rack, or the network), no healthy rack is quarantined, the
healthy racks reach production. Also racky's part naming (`backend_parts`) and the pre-FEC
criterion's Poisson tail on their own."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from harness.lockstep_campaign import SCENARIOS, figures, run_campaign, write_summary
from racky.config import ValidationSettings
from racky.core.validation import ValidationRun, ValidationSample, backend_parts, poisson_tail


def _ports(low: dict[str, float]) -> dict[str, float]:
    names = [f"gpu{g:02d}/nic{k}" for g in range(72) for k in range(2)]
    return {n: low.get(n, 0.95) for n in names}


def test_backend_parts_name_a_port_the_racks_nics_or_a_rail_outside_the_rack() -> None:
    assert backend_parts(_ports({}), 0.8) == ()
    assert backend_parts(_ports({"gpu07/nic1": 0.47}), 0.8) == ("port:gpu07/nic1",)
    every = {n: 0.55 for n in _ports({})}
    assert backend_parts(every, 0.8) == ("nics:all",)
    # rail 5 = GPU slot 2 of every tray, NIC 1: 18 ports, one per tray
    rail5 = {f"gpu{t * 4 + 2:02d}/nic1": 0.25 for t in range(18)}
    assert backend_parts(_ports(rail5), 0.8) == ("net:rail5",)
    # two ports of one rail are not a rail; a NaN reading is low
    two = {"gpu02/nic1": 0.2, "gpu06/nic1": 0.2, "gpu09/nic0": math.nan}
    assert backend_parts(_ports(two), 0.8) == (
        "port:gpu02/nic1", "port:gpu06/nic1", "port:gpu09/nic0")


def test_pre_fec_judged_as_each_ports_mean_over_the_run_not_one_noisy_minute() -> None:
    assert poisson_tail(3, 0.7) == pytest.approx(0.034141584, rel=1e-6)
    assert poisson_tail(1, 0.5) == pytest.approx(1 - math.exp(-0.5))
    assert poisson_tail(0, 3.0) == 1.0 and poisson_tail(2, 0.0) == 0.0

    def run(bins: list[dict[str, float]]) -> str:
        v = ValidationRun("rack", "rack1", ValidationSettings(), 0.0, [("load", 600.0)])
        for k, rates in enumerate([{}, *bins]):  # the first: a bin closed before the run
            s = ValidationSample(float(k), "load", None, None, None, 60.0, 20.0, 0, 0.0, 0.0,
                                 0.0, 0, 0, 0.0, pre_fec_bin=(k, 1.0, tuple(rates.items())))
            v.add(s)
        assert all(s.pre_fec_bin is None for s in v.samples)
        (c,) = [c for c in v.judge().criteria if c.name == "link errors"]
        return ("pass " if c.passed else "FAIL ") + ",".join(c.parts)

    healthy = {f"p{i}": 0.0 for i in range(1400)}
    noisy = [dict(healthy, p3=4.0), dict(healthy, p9=5.0)]  # a 4 and a 5 in one minute each
    assert run(noisy) == "pass "
    creep = [dict(healthy, p7=30.0) for _ in range(5)]  # 30/min for 5 min
    assert run(creep) == "FAIL port:p7"


@pytest.mark.parametrize("sc", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_a_4_rack_campaign_finds_each_fault_with_its_part_and_quarantines_no_healthy_rack(
        sc: object, tmp_path: Path) -> None:
    scenario = next(s for s in SCENARIOS if s is sc)
    r = run_campaign(scenario, load_s=10.0, backend_s=20.0, warm_s=10.0)
    assert r.finished, (r.runs, {k: v.reason for k, v in r.verdicts.items()})
    assert r.refused == []
    assert [ok for _, ok, _ in r.found] == [True] * len(scenario.expected), [
        (e.part, reason) for e, _, reason in r.found]
    assert r.false_quarantines == []
    blamed = {e.rack for e in scenario.expected}
    for rack, v in r.verdicts.items():
        if rack not in blamed:
            assert v.status == "production" and v.passed, (rack, v.reason, v.findings)
    for e in scenario.expected:
        v = r.verdicts[e.rack]
        assert v.status == ("quarantined" if e.blame == "rack" else "blocked"), v.reason
        assert e.part in v.reason  # the part reaches racky's lifecycle reason
    f = figures([r])
    assert f["found_pct"] == (100.0 if scenario.expected else None)  # never "0/0 = 100 %"
    assert f["false_quarantines"] == 0
    page = write_summary([r], tmp_path)
    text = (tmp_path / f"{scenario.name}.md").read_text()
    assert page.name == "summary.md" and all(rk in text for rk in r.verdicts)


def test_racky_and_rlc_command_wiring_is_built_once_by_the_rig() -> None:
    """The campaign harness and its tests wire racky's and rlc's command routers one way
    (`harness.lockstep_campaign.rig`): a change to it (users, audit, clock) reaches the tests
    too. The rig's router is the real one: it refuses a reader and audits the refusal."""
    from harness.lockstep_campaign.rig import racky_command_rig
    from rackplane.clock import FakeClock
    from racky.config import RackyConfig
    from racky.core.controller import RackyCore
    from racky.core.lifecycle import Lifecycle, PersistedState

    core = RackyCore(RackyConfig(), 0.0, PersistedState(Lifecycle("maintenance", 0, "new",
                                                                  "test")))
    rig = racky_command_rig(core, "r1", {"alice": "operator", "bob": "reader"},
                            clock=FakeClock())
    r = rig.call("set_lifecycle", {"state": "quarantined", "reason": "x"}, "bob")
    assert r["error"]["code"] == "forbidden", r
    assert [(a.user, a.outcome) for a in rig.audits] == [("bob", "forbidden")]
    assert rig.call("get_state", {}, "alice")["ok"]
    here = Path(__file__).parent
    for name in ("test_racky_campaign_gate", "test_rlc_campaign_driver",
                 "test_rlc_campaign_lockstep"):
        src = (here / f"{name}.py").read_text()
        for wiring in ("CommandRouter(", "register_racky_commands(", "register_rlc_commands("):
            assert wiring not in src, f"{name} wires its own router ({wiring}): use the rig's"


def test_power_is_judged_against_the_limit_after_the_caps_response_time() -> None:
    """A lease lowered for one tick while the rack draws the old limit (seen in the demo's
    campaign: limit 132 -> 123 -> 132 kW, rack 132 kW) is within the caps' response time
    (``power_settle_s``); a rack still above a lowered limit after it fails."""

    def run(limits_kw: list[float], power_kw: list[float], settle_s: float) -> str:
        v = ValidationRun("rack", "rack1", ValidationSettings(power_settle_s=settle_s), 0.0,
                          [("load", 600.0)])
        for k, (lim, pw) in enumerate(zip(limits_kw, power_kw, strict=True)):
            v.add(ValidationSample(float(k), "load", pw * 1e3, lim * 1e3, 264e3, 60.0, 20.0, 0,
                                   0.0, 0.0, 0.0, 0, 0, 0.0))
        (c,) = [c for c in v.judge().criteria if c.name == "power within budget"]
        return ("pass " if c.passed else "FAIL ") + c.measured

    dip = [132.0, 132.0, 132.0, 123.0, 132.0, 132.0, 132.0, 132.0]
    held = [132.0] * 8
    assert run(dip, held, 5.0).startswith("pass ")
    assert run(dip, held, 0.0) == "FAIL peak 132.0 kW, 7.3 % over the limit"
    lowered = [132.0, 132.0] + [110.0] * 10  # the rack never follows a lowered lease
    assert run(lowered, [132.0] * 12, 5.0).startswith("FAIL peak 132.0 kW, 20.0 %")
    follows = [132.0, 132.0, 132.0, 132.0, 120.0, 110.0] + [110.0] * 6  # within 4 s
    assert run(lowered, follows, 5.0).startswith("pass ")
