"""A validating rack's grant is raised to its stage's draw (issue 17; rlc/core/allocation.py
``reserve_w``, rlc/core/campaign_schedule.py ``plan_starts``).

The allocator serves a validating rack's stage draw before every priority class (clipped to
the rack's cap, never for a held rack); the scheduler starts a stage only on racks whose cap
reaches its draw, and reports the units that wait for power, whose draw rlc reserves ahead so
that other racks' targets fall and the stage can start. Property (hypothesis, random sites): a
feasible set of reserves is reached within the ramp's time and every row and hall stays
within its limit at every cycle. Closed loop (campaign + allocator, acks at once): a rack whose
row is full of another rack's demand starts its stage once rlc reserved its draw, and only
then; without the reserve it never would.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlc.campaign_driver import CampaignDriver
from rlc.core.allocation import AllocationSettings, CycleInput, allocate, rack_cap_w
from rlc.core.campaign import Campaign
from rlc.core.campaign_schedule import plan_starts, schedule
from rlc.core.topology import Topology, TopologySettings, compile_topology
from tests.unit.rlc_helpers import EPS_W, compiled, sums, topologies
from tests.unit.test_rlc_campaign import _plan, _stage

T0 = 1_800_000_000.0


def _two(limit_w: float = 100_000.0, cooling_w: float | None = None) -> Topology:
    rack: dict[str, Any] = {"floor_w": 20_000.0, "max_w": 90_000.0}
    rb = dict(rack) if cooling_w is None else {**rack, "cooling_capacity_w": cooling_w}
    return compile_topology(TopologySettings.model_validate({"site": "s", "halls": {"h": {
        "feed_limit_w": 1e6, "rows": {"row": {"limit_w": limit_w,
                                              "racks": {"ra": rack, "rb": rb}}}}}}))


def _alloc(topo: Topology, demand: list[float], reserve: list[float] | None,
           grant: list[float] | None = None) -> Any:
    g = np.asarray(grant if grant is not None else [20_000.0] * topo.n)
    return allocate(topo, CycleInput(np.asarray(demand), g, g.copy(), 100.0,
                                     reserve_w=None if reserve is None else np.asarray(reserve)))


def test_reserve_served_before_the_classes_clipped_to_the_cap_never_for_a_held_rack() -> None:
    topo = _two()
    a = _alloc(topo, [90_000.0, 20_000.0], None)
    assert list(a.target_w) == [80_000.0, 20_000.0]            # without: ra takes the row
    a = _alloc(topo, [90_000.0, 20_000.0], [math.nan, 50_000.0])
    assert list(a.target_w) == [50_000.0, 50_000.0] and not a.reserve_short.any()
    assert list(a.grant_w) == [50_000.0, 50_000.0]             # ra is cut at once; rb rises
    a = _alloc(topo, [90_000.0, math.nan], [math.nan, 50_000.0])  # rb held: not raised
    assert a.target_w[1] == 20_000.0 and not a.reserve_short[1]
    topo_c = _two(cooling_w=40_000.0)                          # rb's cap 40 kW < 50 kW
    a = _alloc(topo_c, [90_000.0, 20_000.0], [math.nan, 50_000.0])
    assert a.target_w[1] == 40_000.0 and a.reserve_short[1]


def test_a_running_stage_is_served_before_one_waiting_for_power() -> None:
    topo = _two(limit_w=110_000.0)  # floors 40 kW; 70 kW to share
    # ra runs a 60 kW stage, rb waits for a 60 kW one: ra gets its draw, rb what is left
    a = allocate(topo, CycleInput(np.array([20_000.0, 20_000.0]), np.full(2, 20_000.0),
                                  np.full(2, 20_000.0), 100.0,
                                  reserve_w=np.array([60_000.0, 60_000.0]),
                                  reserve_waiting=np.array([False, True])))
    assert a.reserve_short is not None and list(a.reserve_short) == [False, True]
    assert list(a.target_w) == [60_000.0, 50_000.0]
    # both running (the same tier): max-min fair, neither gets its draw
    a = allocate(topo, CycleInput(np.array([20_000.0, 20_000.0]), np.full(2, 20_000.0),
                                  np.full(2, 20_000.0), 100.0,
                                  reserve_w=np.array([60_000.0, 60_000.0])))
    assert list(a.target_w) == [55_000.0, 55_000.0]


def test_a_stage_above_the_racks_cap_is_not_scheduled_and_one_short_of_power_waits() -> None:
    plan = _plan(["rb"], [_stage("s", power_w=50_000.0)])
    c = Campaign.new("c", plan, _two(cooling_w=40_000.0))
    assert schedule(c, _two(cooling_w=40_000.0), {"ra": 20_000.0, "rb": 20_000.0}, T0) == []
    c = Campaign.new("c", plan, _two())
    starts, waiting = plan_starts(c, _two(), {"ra": 80_000.0, "rb": 20_000.0}, T0)
    assert starts == [] and [u for _, u in waiting] == [("rb",)]
    starts, waiting = plan_starts(c, _two(), {"ra": 50_000.0, "rb": 50_000.0}, T0)
    assert [u for _, u in starts] == [("rb",)] and waiting == []


def _loop(reserve_on: bool, cycles: int = 40) -> tuple[int | None, list[float], list[float]]:
    """Campaign + allocator, acks at once (module docstring): the cycle rb's run opened (None:
    never), Σ committed per cycle, rb's grant per cycle."""
    topo = _two()
    plan = _plan(["rb"], [_stage("s", power_w=50_000.0)])
    d = CampaignDriver(topo, "rackplane", "rlc")
    d.restore(None)
    d.campaign = Campaign.new("c", plan, topo)
    grant = np.array([20_000.0, 20_000.0])
    committed = grant.copy()
    sums_w: list[float] = []
    rb_w: list[float] = []
    opened = None
    for k in range(cycles):
        now = T0 + k
        res = d.reserve_w(now) if reserve_on else {}
        rv = np.array([res.get(r, (math.nan, False))[0] for r in topo.rack_ids])
        wt = np.array([res.get(r, (math.nan, False))[1] for r in topo.rack_ids])
        a = allocate(topo, CycleInput(np.array([90_000.0, 20_000.0]), grant, committed, 1.0,
                                      reserve_w=rv, reserve_waiting=wt),
                     AllocationSettings(spread_spare=True))
        sums_w.append(float(a.committed_w.sum()))
        rb_w.append(float(a.grant_w[1]))
        grant, committed = a.grant_w, a.grant_w.copy()     # acknowledged at once
        d.campaign.step(topo, dict(zip(topo.rack_ids, committed.tolist(), strict=True)), now, 1)
        if opened is None and d.campaign.runs:
            opened = k
    return opened, sums_w, rb_w


def test_closed_loop_the_stage_starts_once_its_draw_is_reserved_and_only_with_it() -> None:
    opened, sums_w, rb_w = _loop(reserve_on=True)
    assert opened is not None and opened >= 1  # cycle 0: ra took the row; rb waits
    assert rb_w[opened] < 50_000.0             # it starts on the headroom freed for it ...
    assert min(rb_w[opened + 1:]) >= 50_000.0 - EPS_W  # ... and holds its draw from then on
    assert max(sums_w) <= 100_000.0 + EPS_W
    opened_without, sums_w, _ = _loop(reserve_on=False)
    assert opened_without is None and max(sums_w) <= 100_000.0 + EPS_W
    print(f"\n[rlc reserve] stage opened at cycle {opened}, rb granted {rb_w[opened + 1]:.0f} W "
          f"the cycle after (without the reserve: never in 40 cycles)")


SETTINGS = settings(max_examples=120, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@SETTINGS
@given(t=topologies(), data=st.data())
def test_feasible_reserves_are_reached_and_limits_hold_every_cycle(t: TopologySettings,
                                                                   data: Any) -> None:
    topo = compiled(t)
    cap, _ = rack_cap_w(topo, None)
    f = topo.floor_w
    row_left = topo.row_limit_w - sums(topo, f)[0]
    hall_left = topo.hall_limit_w - sums(topo, f)[1]
    reserve = np.full(topo.n, math.nan)
    for i in range(topo.n):  # a feasible set: Σ (reserve − floor) within every row and hall
        if not data.draw(st.booleans()):
            continue
        want = float(f[i]) + data.draw(st.floats(0.0, 1.0)) * float(cap[i] - f[i])
        j, h = int(topo.row_of[i]), int(topo.hall_of[i])
        extra = min(want - float(f[i]), float(row_left[j]), float(hall_left[h]))
        if extra <= 0:
            continue
        reserve[i] = float(f[i]) + extra
        row_left[j] -= extra
        hall_left[h] -= extra
    demand = np.array([data.draw(st.floats(0.0, 150.0)) for _ in range(topo.n)])
    grant = np.array([data.draw(st.floats(float(f[i]), float(cap[i])))
                      for i in range(topo.n)])
    rows, halls = sums(topo, grant)
    if np.any(rows > topo.row_limit_w) or np.any(halls > topo.hall_limit_w):
        grant = f.copy()  # start within the limits (the allocator's precondition)
    committed = grant.copy()
    spread = data.draw(st.booleans())
    # the ramp: at most Σ (cap − floor) / ramp seconds to move; 60 cycles of 10 s
    for _ in range(60):
        a = allocate(topo, CycleInput(demand, grant, committed, 10.0, reserve_w=reserve),
                     AllocationSettings(spread_spare=spread))
        rows, halls = sums(topo, a.committed_w)
        assert np.all(rows <= topo.row_limit_w + EPS_W)
        assert np.all(halls <= topo.hall_limit_w + EPS_W)
        grant, committed = a.grant_w, a.grant_w.copy()
    has = np.isfinite(reserve)
    assert np.all(grant[has] >= reserve[has] - 1e-3), (grant[has], reserve[has])
    assert a.reserve_short is not None and not a.reserve_short.any()
