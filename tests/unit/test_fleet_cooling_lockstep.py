"""rlc and racky in closed loop on the simulated rack with warming facility water (S9
compressed, issue 16): the rack's cooling capacity reaches rlc's allocation.

The exchanger is fouled (plant variant ``hx_fouled_30``, UA −30 %): the nominal plant's
capacity would over-grant it, and racky knows the real one only through valvey's measurement
(the harness runs valvey's `CapacityGuard` on the CDU's readings). Each second rlc's real
`rlc.core.cycle.FleetState` reads the rack's report (`racky.fleet.FleetLink`, wired as the
daemon wires it) and issues leases that the link takes. The topology configures no cooling
capacity: the reported one is the only cooling limit. Figures are printed (``-s``).
"""

from __future__ import annotations

import json
import math

from harness.lockstep_racky import run_racky
from racky.config import RackyConfig
from racky.core.controller import RackyCore
from racky.fleet import FleetLink
from rlc.core.allocation import AllocationSettings
from rlc.core.cycle import FleetState
from rlc.core.leases import LeaseTiming
from rlc.core.topology import TopologySettings, compile_topology
from sims.scenario import ScenarioRun, load_scenario

RISE_AT_S, RAMP_S, DURATION_S = 30.0, 120.0, 240.0


def test_rlc_grants_follow_the_racks_measured_cooling_down_as_the_water_warms() -> None:
    sc = load_scenario("facility-water-rise")
    fault = sc.faults[0].model_copy(update={"at_s": RISE_AT_S, "until_s": None,
                                            "ramp_s": RAMP_S})
    sc = sc.model_copy(update={
        "faults": [fault], "duration_s": DURATION_S,
        "plant": type(sc.plant).model_validate({**sc.plant.model_dump(),
                                                "variant": "hx_fouled_30"})})
    cfg = RackyConfig.model_validate({"fleet": {"enabled": True, "floor_w": 40_000.0,
                                                "agent_safe_gpu_cap_w": 200.0}})
    link = FleetLink(cfg.fleet, "lab", "rack1")
    topo = compile_topology(TopologySettings.model_validate({"site": "lab", "halls": {"h": {
        "feed_limit_w": 1e6, "rows": {"r": {"limit_w": 300_000.0, "racks": {
            "rack1": {"floor_w": 40_000.0, "max_w": 200_000.0}}}}}}}))
    st = FleetState(topo, LeaseTiming(ttl_s=10.0, clock_margin_s=0.5, agent_cap_ttl_s=2.0),
                    AllocationSettings(), 5.0, 15.0, 100.0)
    st.restore(1, {"rack1": None}, 0.0)
    rev = [0]
    log: list[tuple[float, float | None, float, float | None]] = []  # t, cooling, grant, demand
    ac: list[tuple[float, float | None]] = []

    def hook(now: float, run: ScenarioRun, core: RackyCore) -> None:
        if now > 0 and abs(now - round(now)) < 1e-6:  # rlc's 1 s cycle
            wall = link.clock.wall_ns() / 1e9
            rep = link.follower.report(wall, now)
            rev[0] += 1
            st.on_report("rack1", (rev[0], json.dumps(rep.as_record()).encode()), now)
            for w in st.cycle(1, wall, now):
                rev[0] += 1
                st.write_done(w.rack, rev[0])
                link.take(w.record)
            led = st.ledgers["rack1"]
            assert led.current is not None
            shelves = core.last.shelves if core.last is not None else None
            log.append((now, rep.cooling_w, led.current.value_w, rep.demand_w))
            ac.append((now, None if shelves is None else shelves.rack_input_w))

    r = run_racky(sc, cfg, plant_dt_s=0.5, hook=hook, fleet=link)
    known = [(t, c, g, d) for t, c, g, d in log if c is not None]
    assert known, "racky never reported a cooling capacity"
    t_first, c_first, _, _ = known[0]
    # rlc caps the grant at the reported capacity once it is known (one cycle later: the
    # grant follows the report it read)
    # grant follows the report it read), never below the floor (the rack's own fallback wins)
    floor = float(topo.floor_w[0])
    over = [(t, c, g) for (t, c, g, _), (_, c_prev, _, _) in zip(known[1:], known, strict=False)
            if g > max(c, c_prev, floor) + 100.0]
    assert not over, over[:5]
    t_end, c_end, g_end, _ = log[-1]
    assert c_end is not None and c_end < c_first               # it followed the water down
    assert g_end <= max(c_end, floor) + 100.0
    if c_end < floor:
        assert st.last is not None and bool(st.last.cooling_below_floor[0])
    # while the capacity fell from its first figure to the floor, the demand stayed above it
    # and the grant sat on it (two-sided: the cooling, not the demand, set the grant)
    falling = [(t, c, g, d) for (t, c, g, d), (_, cp, _, _) in zip(known[1:], known,
                                                                  strict=False)
               if c is not None and cp is not None and min(c, cp) > floor + 1_000.0]
    assert len(falling) >= 30, falling
    assert all(d is not None and d > g for _, _, g, d in falling), falling[:5]
    assert all(abs(g - c) <= 100.0 for _, c, g, _ in falling), falling[:5]  # the deadband
    demand = known[-1][3]
    sp = r.scenario.plant.supply_setpoint_c
    late = [x for t, x in zip(r.trace["t_s"], r.trace["supply_temp_c"], strict=True)
            if x is not None and t >= t_first]
    over_sp = max(late) - sp
    ac_after = [p for t, p in ac if p is not None and t >= t_end - 20.0]
    print(f"\n[fleet cooling lockstep] hx_fouled_30, water +{fault.magnitude:g} K from "
          f"{RISE_AT_S:g} s over {RAMP_S:g} s: cooling first reported at {t_first:.0f} s "
          f"{c_first:.0f} W; at {t_end:.0f} s reported {c_end:.0f} W, rlc grant {g_end:.0f} W "
          f"(demand {demand:.0f} W); {len(falling)} cycles with the grant on the falling "
          f"capacity, |grant - capacity| max "
          f"{max(abs(g - c) for _, c, g, _ in falling):.0f} W; AC input last 20 s max "
          f"{max(ac_after):.0f} W; supply "
          f"over setpoint max {over_sp:.2f} K after the first report")
    assert max(ac_after) <= max(c_end, floor) + 1_000.0
    assert math.isfinite(over_sp) and over_sp <= 1.0
