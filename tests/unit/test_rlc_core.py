"""rlc's pure core (issue 16 items 1-3): topology validation, allocation edge cases, budget
leases and the re-grant rule. The random properties: test_rlc_allocation_properties.py."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rackplane.config import validate_data
from rackplane.errors import ConfigError
from rlc.core.allocation import AllocationSettings, CycleInput, allocate
from rlc.core.leases import (
    BudgetLease,
    LeaseTiming,
    RackLedger,
    is_released,
    rack_lease_valid,
)
from rlc.core.topology import TopologySettings, compile_topology


def _site(rows: dict[str, Any], feed_w: float = 1000.0) -> dict[str, Any]:
    return {"site": "dc1", "halls": {"h1": {"feed_limit_w": feed_w, "rows": rows}}}


def _row(limit_w: float, racks: dict[str, Any], ramp: float | None = None) -> dict[str, Any]:
    d: dict[str, Any] = {"limit_w": limit_w, "racks": racks}
    if ramp is not None:
        d["ramp_w_per_s"] = ramp
    return d


def _rack(floor: float, mx: float, **kw: Any) -> dict[str, Any]:
    return {"floor_w": floor, "max_w": mx, **kw}


def _topo(data: dict[str, Any]) -> Any:
    return compile_topology(TopologySettings.model_validate(data))


# --- topology ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("data", "needles"), [
    (_site({"r1": _row(100.0, {"a": _rack(60.0, 90.0), "b": _rack(50.0, 90.0)})}),
     ["halls.h1.rows.r1", "limit_w 100", "a 60", "b 50"]),
    (_site({"r1": _row(100.0, {"a": _rack(60.0, 90.0)}),
            "r2": _row(100.0, {"b": _rack(60.0, 90.0)})}, feed_w=100.0),
     ["halls.h1", "feed_limit_w 100", "r1.a 60", "r2.b 60"]),
    (_site({"r1": _row(100.0, {"a": _rack(60.0, 50.0)})}),
     ["halls.h1.rows.r1.racks.a", "floor_w 60 W exceeds max_w 50"]),
    (_site({"r1": _row(100.0, {"a": _rack(60.0, 90.0, cooling_capacity_w=40.0)})}),
     ["halls.h1.rows.r1.racks.a", "cooling_capacity_w 40 W is below floor_w 60"]),
    (_site({"r1": _row(100.0, {"a": _rack(10.0, 90.0, priority="urgent")})}),
     ["halls.h1.rows.r1.racks.a.priority", "'urgent'"]),
    (_site({"r1": _row(100.0, {"a": _rack(10.0, 90.0)}),
            "r2": _row(100.0, {"a": _rack(10.0, 90.0)})}),
     ["halls.h1.rows.r2.racks.a", "also at halls.h1.rows.r1.racks.a"]),
    (_site({"r/1": _row(100.0, {"a": _rack(10.0, 90.0)})}), ["rows", "'r/1'"]),
    (_site({"r1": _row(100.0, {"a": _rack(10.0, 90.0, floor_typo=1.0)})}),
     ["halls.h1.rows.r1.racks.a.floor_typo"]),
])
def test_config_errors_name_the_keys(data: dict[str, Any], needles: list[str]) -> None:
    with pytest.raises(ConfigError) as ei:
        validate_data(TopologySettings, data, "rlc.toml")
    text = str(ei.value)
    for needle in needles:
        assert needle in text, (needle, text)


def test_floors_equal_to_the_limits_are_accepted_and_compiled_in_order() -> None:
    t = _topo({"site": "dc1", "classes": {"hi": 0, "lo": 5}, "halls": {
        "h1": {"feed_limit_w": 100.0, "rows": {
            "r1": _row(60.0, {"a": _rack(30.0, 50.0, priority="lo"),
                              "b": _rack(30.0, 50.0, priority="hi")}, ramp=10.0),
            "r2": _row(40.0, {"c": _rack(40.0, 45.0, priority="lo")})}},
        "h2": {"feed_limit_w": 50.0, "rows": {"r1": _row(50.0, {"d": _rack(0.0, 9.0,
                                                                         priority="hi")})}}}})
    assert t.rack_ids == ("a", "b", "c", "d")
    assert t.row_ids == ("h1/r1", "h1/r2", "h2/r1")
    assert t.row_of.tolist() == [0, 0, 1, 2] and t.hall_of.tolist() == [0, 0, 0, 1]
    assert t.rank.tolist() == [5, 0, 5, 0] and t.ranks == (0, 5)
    assert t.row_ramp_w_per_s[0] == 10.0 and math.isinf(t.row_ramp_w_per_s[1])
    assert t.index("c") == 2


# --- allocation edge cases ----------------------------------------------------------------------

TWO = _site({"r1": _row(100.0, {"a": _rack(20.0, 80.0), "b": _rack(20.0, 80.0)})})


def _alloc(topo: Any, demand: list[float], grant: list[float] | None = None,
           committed: list[float] | None = None, cooling: list[float] | None = None,
           spread: bool = True, dt_s: float = 1.0) -> Any:
    g = np.asarray(grant if grant is not None else topo.floor_w, dtype=float)
    c = np.asarray(committed if committed is not None else g, dtype=float)
    return allocate(topo, CycleInput(np.asarray(demand, dtype=float), g, c, dt_s,
                                     None if cooling is None else np.asarray(cooling)),
                    AllocationSettings(spread_spare=spread))


def test_all_unreachable_are_held_where_they_are() -> None:
    topo = _topo(TWO)
    a = _alloc(topo, [math.nan, math.nan], grant=[50.0, 30.0])
    assert a.grant_w.tolist() == [50.0, 30.0] and a.held.all()
    # never raised, even with the row's headroom free
    a = _alloc(topo, [math.nan, math.nan], grant=[20.0, 20.0])
    assert a.grant_w.tolist() == [20.0, 20.0]


def test_zero_headroom_leaves_everyone_at_the_floor() -> None:
    topo = _topo(_site({"r1": _row(40.0, {"a": _rack(20.0, 80.0),
                                          "b": _rack(20.0, 80.0, priority="critical")})}))
    a = _alloc(topo, [80.0, 80.0])
    assert a.grant_w.tolist() == [20.0, 20.0] and a.target_w.tolist() == [20.0, 20.0]
    assert a.row_committed_w.tolist() == [40.0]


def test_cooling_capacity_below_the_floor_the_floor_wins_and_is_flagged() -> None:
    topo = _topo(TWO)
    a = _alloc(topo, [70.0, 70.0], cooling=[10.0, math.nan])
    assert a.grant_w[0] == 20.0 and a.cooling_below_floor.tolist() == [True, False]
    assert a.grant_w[1] == 70.0 + 10.0  # b: its demand, then the spare (a is capped)
    # a reported capacity of -1 or inf is none: the configured one (none) applies
    a = _alloc(topo, [70.0, 30.0], cooling=[-1.0, math.inf], spread=False)
    assert a.grant_w.tolist() == [70.0, 30.0] and not a.cooling_below_floor.any()
    # 0 is a capacity (facility water at the setpoint): the floor, flagged
    a = _alloc(topo, [70.0, 30.0], cooling=[0.0, math.nan], spread=False)
    assert a.grant_w.tolist() == [20.0, 30.0] and a.cooling_below_floor.tolist() == [True, False]


def test_the_lower_of_configured_and_reported_cooling_caps_the_rack() -> None:
    topo = _topo(_site({"r1": _row(200.0, {"a": _rack(20.0, 90.0, cooling_capacity_w=60.0),
                                           "b": _rack(20.0, 90.0, cooling_capacity_w=60.0)})}))
    # a reported 50 W < configured 60 W caps a at 50; b's reported 75 W never lifts its
    # configured 60 W (the report cannot raise a rack past its configured bound)
    a = _alloc(topo, [80.0, 80.0], cooling=[50.0, 75.0], spread=False)
    assert a.grant_w.tolist() == [50.0, 60.0]
    # none reported: the configured ones
    a = _alloc(topo, [80.0, 80.0], cooling=[math.nan, math.nan], spread=False)
    assert a.grant_w.tolist() == [60.0, 60.0]


def test_priority_first_then_max_min_fair() -> None:
    topo = _topo(_site({"r1": _row(150.0, {"a": _rack(10.0, 100.0),
                                           "b": _rack(10.0, 100.0),
                                           "c": _rack(10.0, 100.0, priority="high")})}))
    a = _alloc(topo, [100.0, 20.0, 70.0])
    # c (high) gets its 70; a and b share 150 − 70 − 20 = 60 max-min fair: b its 20, a 50
    assert a.grant_w.tolist() == pytest.approx([60.0, 20.0, 70.0])


def test_implausible_demand_is_held() -> None:
    topo = _topo(TWO)
    a = _alloc(topo, [-1.0, math.inf], grant=[30.0, 25.0])
    assert a.held.all() and a.implausible.all()
    assert a.grant_w.tolist() == [30.0, 25.0]


def test_ramp_limits_the_rows_rise() -> None:
    topo = _topo(_site({"r1": _row(200.0, {"a": _rack(20.0, 80.0), "b": _rack(20.0, 80.0)},
                                   ramp=10.0)}))
    a = _alloc(topo, [80.0, 80.0], dt_s=2.0)
    assert a.grant_w.tolist() == pytest.approx([30.0, 30.0])  # 10 W/s × 2 s, split fairly
    assert a.short_w.tolist() == pytest.approx([50.0, 50.0])
    # decreases are not ramp-limited
    a = _alloc(topo, [20.0, 20.0], grant=[80.0, 80.0], spread=False)
    assert a.grant_w.tolist() == [20.0, 20.0]


def test_a_raise_waits_until_the_decrease_is_acknowledged_or_expired() -> None:
    """b's raise is paid only from headroom a has released (issue 16 item 2)."""
    topo = _topo(_site({"r1": _row(100.0, {"a": _rack(20.0, 80.0), "b": _rack(20.0, 80.0)})}))
    timing = LeaseTiming(ttl_s=10.0, clock_margin_s=2.0, agent_cap_ttl_s=60.0)
    led = [RackLedger("a", 20.0), RackLedger("b", 20.0)]
    led[0].issue(80.0, 1, 1000.0, 0.0, timing)
    led[1].issue(20.0, 1, 1000.0, 0.0, timing)

    def cycle(t: float) -> np.ndarray:
        for x in led:
            x.release(1000.0 + t, t, timing)
        g = np.array([x.grant_w for x in led])
        c = np.array([x.committed_w() for x in led])
        a = allocate(topo, CycleInput(np.array([20.0, 80.0]), g, c, 1.0),
                     AllocationSettings(spread_spare=False))
        for x, v in zip(led, a.grant_w, strict=True):
            x.issue(float(v), 1, 1000.0 + t, t, timing)
        return a.grant_w

    assert cycle(1.0).tolist() == [20.0, 20.0]           # a lowered; b not raised yet
    assert cycle(2.0).tolist() == [20.0, 20.0]
    # a never acknowledges: its 80 W lease (issued at 0 s, expires 10 s) counts until
    # 10 + 2 + 60 s by both clocks
    assert cycle(71.9).tolist() == [20.0, 20.0]
    assert cycle(72.0).tolist() == [20.0, 80.0]
    # with an acknowledgement instead, at once
    led = [RackLedger("a", 20.0), RackLedger("b", 20.0)]
    led[0].issue(80.0, 1, 1000.0, 0.0, timing)
    led[1].issue(20.0, 1, 1000.0, 0.0, timing)
    assert cycle(1.0).tolist() == [20.0, 20.0]
    assert led[0].current is not None and led[0].on_ack(*led[0].current.key)
    assert cycle(2.0).tolist() == [20.0, 80.0]


def test_bad_shapes_and_dt_are_programming_errors() -> None:
    topo = _topo(TWO)
    with pytest.raises(ValueError, match="demand_w"):
        allocate(topo, CycleInput(np.zeros(3), np.zeros(2), np.zeros(2), 1.0))
    with pytest.raises(ValueError, match="dt_s"):
        allocate(topo, CycleInput(np.zeros(2), np.zeros(2), np.zeros(2), -1.0))


# --- leases ------------------------------------------------------------------------------------


def test_ledger_acks_and_records() -> None:
    timing = LeaseTiming(ttl_s=10.0)
    led = RackLedger("a", 10.0)
    l1 = led.issue(50.0, 3, 100.0, 5.0, timing)
    assert (l1.key, l1.expires_at_s) == ((3, 1), 110.0)
    l2 = led.issue(30.0, 3, 101.0, 6.0, timing)
    assert led.committed_w() == 50.0 and len(led.unreleased) == 1
    assert not led.on_ack(3, 9)                       # never issued
    assert led.on_ack(*l2.key) and not led.on_ack(*l1.key)
    assert led.release(101.0, 6.0, timing) == 1 and led.committed_w() == 30.0
    led.issue(20.0, 3, 102.0, 7.0, timing)
    rec = led.as_record()
    back = RackLedger.restore(rec, 10.0, now_mono_s=500.0)
    assert back.committed_w() == 30.0 and back.unreleased[0].seen_mono_s == 500.0
    assert back.as_record() == rec
    with pytest.raises(ValueError):
        led.issue(20.0, 2, 103.0, 8.0, timing)      # an older epoch
    with pytest.raises(ValueError):
        BudgetLease.from_record({"rack": "a", "value_w": 1.0})
    with pytest.raises(ValueError):
        RackLedger.restore({"rack": "a"}, 10.0, 0.0)
    # a raise covers what it replaces: nothing stays committed above it
    led2 = RackLedger("b", 0.0)
    led2.issue(10.0, 1, 0.0, 0.0, timing)
    led2.issue(40.0, 1, 1.0, 1.0, timing)
    assert led2.unreleased == [] and led2.committed_w() == 40.0


def test_rlc_monotonic_guard_holds_when_its_wall_clock_jumps_ahead() -> None:
    timing = LeaseTiming(ttl_s=10.0, clock_margin_s=2.0, agent_cap_ttl_s=60.0)
    led = RackLedger("a", 0.0)
    led.issue(50.0, 1, 1000.0, 0.0, timing)
    led.issue(10.0, 1, 1001.0, 1.0, timing)
    u = led.unreleased[0]
    assert not is_released(u, None, 1000.0 + 1e6, 30.0, timing)   # wall jumped, mono not
    assert is_released(u, None, 1072.0, 72.0, timing)


@settings(max_examples=300, deadline=None)
@given(skew_rack=st.floats(-1.0, 1.0), skew_rlc=st.floats(-1.0, 1.0),
       issued=st.floats(0.0, 100.0), read_delay=st.floats(0.0, 5.0),
       tick=st.floats(0.01, 1.0))
def test_the_margin_covers_the_clocks(skew_rack: float, skew_rlc: float, issued: float,
                                      read_delay: float, tick: float) -> None:
    """With |offsets| summing to at most the margin, rlc counts a lease released by expiry no
    earlier (true time) than the rack stops using it plus the agents' cap TTL."""
    timing = LeaseTiming(ttl_s=10.0, clock_margin_s=2.0, agent_cap_ttl_s=5.0)
    led = RackLedger("a", 0.0)
    lease = led.issue(50.0, 1, issued + skew_rlc, issued, timing)   # rlc wall = true + skew
    led.issue(0.0, 1, issued + skew_rlc + 0.1, issued + 0.1, timing)
    u = led.unreleased[0]
    recv = issued + read_delay
    # the rack's last instant of use, true time, sampled at its tick
    t = recv
    while rack_lease_valid(lease, t + skew_rack, recv, t, timing):
        t += tick
    stop = t
    # rlc's first instant of release, true time
    r = issued
    while not is_released(u, None, r + skew_rlc, r, timing):
        r += tick
    assert r >= stop + timing.agent_cap_ttl_s - tick - 1e-9
