"""racky's side of rlc's budget leases (issue 16 item 2): the follower (order, validity on both
clocks, floor, acknowledgement only on enforced read-back), the fleet budget bounding the rack
budget, set_budget beyond the grant refused, the floor checks of ``[fleet]``."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from rackplane.core.budget_leases import BudgetLease, RackReport
from racky.config import RackyConfig
from racky.core.budget import BudgetFollower, FleetSide, InputRatio
from racky.fleet_settings import BEYOND_GRANT, agents_safe_total_w
from tests.unit.test_racky_commands import make_rack

WALL = 1.8e9


def lease(value_w: float, epoch: int = 3, seq: int = 1, at: float = WALL, ttl: float = 10.0,
          rack: str = "r1") -> BudgetLease:
    return BudgetLease(rack, value_w, at, at + ttl, epoch, seq)


def test_follower_takes_newer_leases_only_and_refuses_another_racks() -> None:
    f = BudgetFollower("r1", 20_000.0, 1.0)
    assert f.budget_w(WALL, 0.0) == 20_000.0             # no lease: the floor
    assert f.offer(lease(50_000.0, seq=2), 0.0)
    assert not f.offer(lease(90_000.0, seq=1), 0.1)       # older, read late: ignored
    assert not f.offer(lease(90_000.0, seq=2), 0.1)       # same key: ignored
    assert f.offer(lease(30_000.0, epoch=4, seq=3), 0.2)  # a decrease: at once
    assert f.budget_w(WALL + 0.2, 0.2) == 30_000.0
    assert not f.offer(lease(90_000.0, seq=9, rack="r2"), 0.3)
    assert f.refused == 1
    assert f.budget_w(WALL + 0.3, 0.3) == 30_000.0


def test_follower_falls_to_the_floor_by_either_clock() -> None:
    f = BudgetFollower("r1", 20_000.0, 1.0)
    f.offer(lease(50_000.0, ttl=10.0), 100.0)
    assert f.budget_w(WALL + 9.9, 109.9) == 50_000.0
    assert f.budget_w(WALL + 10.0, 110.0) == 20_000.0     # expired on the wall clock
    assert f.budget_w(WALL + 1.0, 110.0) == 20_000.0      # wall stepped back: monotonic wins
    g = BudgetFollower("r1", 20_000.0, 1.0)
    g.offer(lease(50_000.0, at=WALL + 5.0), 0.0)          # issued 5 s in racky's future
    assert g.budget_w(WALL, 0.0) == 20_000.0
    assert g.budget_w(WALL + 4.5, 0.0) == 50_000.0         # within the margin


def test_ack_only_once_the_enforced_caps_are_within_the_lease() -> None:
    f = BudgetFollower("r1", 20_000.0, 1.0)
    f.offer(lease(50_000.0, seq=1), 0.0)
    assert f.observe(48_000.0, 60_000.0, WALL, 0.0)
    assert f.acked == (3, 1)
    f.offer(lease(30_000.0, seq=2), 1.0)
    assert not f.observe(48_000.0, 60_000.0, WALL + 1, 1.0)   # caps not down yet
    assert not f.observe(None, 60_000.0, WALL + 1, 1.0)       # a tray not reporting
    assert f.acked == (3, 1)
    assert f.observe(30_000.0, 60_000.0, WALL + 1.2, 1.2)
    assert f.acked == (3, 2)
    assert not f.observe(30_000.0, 60_000.0, WALL + 1.3, 1.3)  # once
    assert not f.observe(30_000.0, 60_000.0, WALL + 20, 20.0)  # expired: nothing to ack
    rep = f.report(WALL + 20, 20.0)
    assert rep.budget_w == 20_000.0 and not rep.lease_valid and rep.acked == (3, 2)
    assert RackReport.from_record(json.loads(json.dumps(rep.as_record()))) == rep


def test_fleet_budget_bounds_the_rack_budget_and_set_budget_beyond_grant_is_refused() -> None:
    rig = make_rack()
    core = rig.core
    own = core.budget_w
    assert core.fleet_budget_w is None                    # single rack: as before
    core.fleet_budget_w = 60_000.0
    assert core.budget_w == (60_000.0 if own is None else min(own, 60_000.0))
    r = rig.call("set_budget", {"power_w": 70_000.0, "reason": "t"})
    assert r["error"]["code"] == BEYOND_GRANT, r
    assert "fleet grant 60000 W" in r["error"]["message"]
    assert rig.call("set_budget", {"power_w": 55_000.0, "reason": "t"})["ok"]
    assert core.budget_w == 55_000.0
    core.fleet_budget_w = 40_000.0                        # a lower lease wins over it
    assert core.budget_w == 40_000.0


def test_fleet_floor_is_checked_against_the_agents_safe_caps() -> None:
    base = RackyConfig()
    ok = RackyConfig.model_validate({"fleet": {"enabled": True, "floor_w": 60_000.0,
                                               "agent_safe_gpu_cap_w": 200.0}})
    assert agents_safe_total_w(ok) <= 60_000.0
    with pytest.raises(ValidationError, match=r"fleet.floor_w = 40000 W is below Σ of the "
                       r"agents' safe caps 46"):
        RackyConfig.model_validate({"fleet": {"enabled": True, "floor_w": 40_000.0,
                                              "agent_safe_gpu_cap_w": 400.0}})
    # Σ safe caps 24,998 W fits 25 kW, but every tray at its lowest cap needs 25,020 W
    with pytest.raises(ValidationError, match="below the rack's own floor"):
        RackyConfig.model_validate({"fleet": {"enabled": True, "floor_w": 25_000.0,
                                              "agent_safe_gpu_cap_w": 200.0}})
    # not in a fleet: nothing checked (single rack exactly as before)
    assert RackyConfig.model_validate({"fleet": {"floor_w": 1.0}}).power == base.power


def test_input_ratio_learned_within_its_window_else_the_fallback() -> None:

    r = InputRatio(1.10, window_s=60.0)
    assert r.value(0.0) == 1.10                            # nothing measured: the fallback
    r.update(105_000.0, 100_000.0, 1.0)
    r.update(52_000.0, 50_000.0, 2.0)
    assert r.value(2.0) == pytest.approx(1.05)             # the largest of the window
    r.update(200_000.0, 100_000.0, 3.0)                    # 50 % efficiency: implausible
    r.update(90_000.0, 100_000.0, 3.0)                     # output above input: implausible
    r.update(None, 100_000.0, 3.0)
    r.update(600.0, 500.0, 3.0)                            # too little load to tell
    assert r.implausible == 2 and r.value(3.0) == pytest.approx(1.05)
    assert r.value(62.5) == 1.10                           # aged out
    f = BudgetFollower("r1", 20_000.0, 1.0)
    side = FleetSide(f, InputRatio(1.10))
    f.offer(lease(66_000.0), 0.0)
    assert side.dc_budget_w(WALL, 0.0) == pytest.approx(60_000.0)
    assert not side.observe(60_001.0, None, None, None, WALL, 0.0)  # × 1.10 > 66 kW
    assert side.observe(60_000.0, None, None, None, WALL, 0.0)


def test_fleet_floor_above_the_racks_capacity_is_refused() -> None:
    # floor_w is AC input; rack_capacity_w is shelf DC output: compared at the fallback ratio
    def cfg(floor_w: float) -> RackyConfig:
        return RackyConfig.model_validate({
            "power": {"rack_capacity_w": 100_000.0},
            "fleet": {"enabled": True, "floor_w": floor_w, "input_ratio_fallback": 1.1}})

    assert cfg(110_000.0).fleet.floor_w == 110_000.0          # exactly the capacity: allowed
    with pytest.raises(ValidationError, match=r"fleet.floor_w = 110100 W .* above "
                       r"power.rack_capacity_w 100000 W"):
        cfg(110_100.0)
    with pytest.raises(ValidationError, match=r"above power\.rack_capacity_w"):
        cfg(9_000_000.0)                                       # a typo (an extra zero)
    # a single rack (fleet off) is not checked
    assert RackyConfig.model_validate({"power": {"rack_capacity_w": 100_000.0},
                                       "fleet": {"floor_w": 9_000_000.0}}).fleet.floor_w


def test_the_report_says_the_budget_racky_enforces_not_only_its_lease() -> None:
    """An operator's lower budget (or the derate, or the cooling) is what racky enforces: the
    report's budget_w is min(lease, racky's limit in force × the input ratio), so rlc's view
    (`rackctl fleet status`, 'enforced') does not show the lease as enforced."""
    f = BudgetFollower("r1", 20_000.0, 1.0)
    side = FleetSide(f, InputRatio(1.10))
    f.offer(lease(66_000.0), 0.0)
    side.observe(None, None, None, None, WALL, 0.0)  # racky's limit unknown: the lease
    assert f.report(WALL, 0.0).budget_w == pytest.approx(66_000.0)
    side.observe(None, None, None, None, WALL, 0.0, limit_dc_w=50_000.0)  # operator: 50 kW DC
    assert f.report(WALL, 0.0).budget_w == pytest.approx(55_000.0)  # × 1.10, AC
    side.observe(None, None, None, None, WALL, 0.0, limit_dc_w=90_000.0)  # above the lease
    assert f.report(WALL, 0.0).budget_w == pytest.approx(66_000.0)
    side.observe(None, None, None, None, WALL, 0.0, limit_dc_w=float("nan"))
    assert f.report(WALL, 0.0).budget_w == pytest.approx(66_000.0)
