"""racky's ``power_capped`` means a cap binds (racky/core/cap_binding.py), not that caps are
allocated: it used to be raised whenever the allocator had set any cap, e.g. a rack limit of
120 kW on a rack drawing 40 kW (every tray's cap far above its demand)."""

from __future__ import annotations

import math

import numpy as np

from harness.lockstep_racky import run_racky
from racky.core.agent_settings import DesiredTray
from racky.core.cap_binding import HeldTray, held_detail, held_trays, tray_cap_w
from racky.core.controller import RackyCore
from racky.core.power import LimitState
from racky.core.telemetry import AgentReading, TrayReading
from sims.scenario import ScenarioRun, load_scenario

NAN = math.nan


def _reading(tray: int, *, capping: bool = False, sw_power_cap: bool = False,
             powered: bool = True) -> TrayReading:
    agent = AgentReading(
        enforced_gpu_cap_w=NAN, enforced_tray_cap_w=NAN, floor_w=0.0, power_cap_w=None,
        gpu_power_cap_w=None, power_floor_pct=0.0, ramp_up_w_per_s=None,
        ramp_down_w_per_s=None, ramp_down_hysteresis_s=0.0, capping=capping, flooring=False,
        ramp_limited=False)
    g = np.full(4, 1000.0)
    return TrayReading(
        tray=tray, t_mono=0.0, powered=powered, power_w=4000.0, coolant_out_temp_c=40.0,
        leak=False, leak_sensor_fault=False, agent=agent, gpu_index=np.arange(4) + 4 * tray,
        gpu_power_w=g, gpu_demand_w=g, gpu_temp_c=g * 0.05, gpu_t_limit_c=g * 0.02,
        gpu_throttled=np.zeros(4, dtype=bool), gpu_shut_down=np.zeros(4, dtype=bool),
        gpu_traffic=g * 0.0, gpu_uptime_s=g, gpu_boot_id=np.zeros(4, dtype=np.uint64),
        gpu_power_capped=np.array([sw_power_cap, False, False, False]))


def _held(desired: list[DesiredTray], demand: list[float], readings: dict[int, TrayReading],
          fresh: list[bool] | None = None) -> list[int]:
    f = np.array(fresh if fresh is not None else [True] * len(desired))
    return [h[0] for h in held_trays(desired, np.array(demand), readings, f, 4, 0.5)]


def test_a_cap_above_demand_does_not_bind_one_at_or_below_it_does() -> None:
    r = {0: _reading(0), 1: _reading(1), 2: _reading(2)}
    caps = [DesiredTray(power_cap_w=6000.0), DesiredTray(power_cap_w=4000.0),
            DesiredTray(power_cap_w=None)]
    # tray 0: room above its 4 kW demand; tray 1: demand 4.4 kW at a 4 kW cap; tray 2: uncapped
    assert _held(caps, [4000.0, 4400.0, 9000.0], r) == [1]
    assert _held(caps, [4000.0, 3900.0, 9000.0], r) == []


def test_the_agent_reporting_a_cap_acting_makes_it_bind() -> None:
    caps = [DesiredTray(power_cap_w=6000.0)] * 3
    r = {0: _reading(0, capping=True), 1: _reading(1, sw_power_cap=True), 2: _reading(2)}
    assert _held(caps, [4000.0] * 3, r) == [0, 1]
    # an agent capping on its own (its safe cap; no racky cap on the tray) is not racky's
    assert _held([DesiredTray()] * 3, [4000.0] * 3, r) == []


def test_stale_unpowered_and_unread_trays_are_not_judged() -> None:
    caps = [DesiredTray(power_cap_w=1000.0)] * 3
    r = {0: _reading(0), 1: _reading(1, powered=False)}  # tray 2: no reading
    assert _held(caps, [4000.0] * 3, r, fresh=[False, True, True]) == []
    assert _held(caps, [4000.0] * 3, r) == [0]


def test_a_protective_per_gpu_cap_counts_as_tray_power_and_is_named() -> None:
    d = DesiredTray(power_cap_w=None, gpu_power_cap_w=800.0)
    assert tray_cap_w(d, 4, 0.5) == 4 * 800.0 * 1.5
    held = held_trays([d], np.array([5000.0]), {0: _reading(0)}, np.array([True]), 4, 0.5)
    assert [h[0] for h in held] == [0]
    text = held_detail(held, LimitState())
    assert "no rack limit" in text and "tray protection" in text and "tray00" in text
    text = held_detail([HeldTray(1, 5000.0, 4000.0, False), HeldTray(2, 5500.0, 4000.0, False)],
                       LimitState(120_000.0, "budget", {"budget": 120_000.0}))
    assert text == ("limit 120.0 kW from budget (the rack budget); 2 tray(s) held at their caps "
                    "(tray01, tray02): 2 trays demand 10.5 kW at or above caps 8.0 kW")


def test_a_tray_capped_by_its_agent_below_racky_s_estimate_never_reads_demand_below_caps(
        ) -> None:
    """The new-user trial's detail: an agent reporting its cap acting (sw_power_cap) while
    racky's demand estimate of the tray sat under the cap read "demand 3.6 kW against caps
    4.0 kW" under "rack power held below demand", which contradicts itself. Now such a tray
    is named as capping by its agent's report, the limits in force named (the budget is rlc's
    row lease here, a derating request above it)."""
    caps = [DesiredTray(power_cap_w=4000.0), DesiredTray(power_cap_w=4000.0)]
    r = {0: _reading(0, sw_power_cap=True), 1: _reading(1)}
    held = held_trays(caps, np.array([3600.0, 4400.0]), r, np.array([True, True]), 4, 0.5)
    assert [(h.tray, h.agent_capping) for h in held] == [(0, True), (1, False)]
    limit = LimitState(60_000.0, "budget", {"budget": 60_000.0, "requested:valvey": 70_000.0})
    text = held_detail(held, limit, fleet_budget_w=60_000.0)
    assert "demand 3.6" not in text and "against caps" not in text, text
    assert text == ("limit 60.0 kW from budget (the rack budget: rlc's row lease); also in "
                    "force: requested:valvey 70.0 kW; 2 tray(s) held at their caps (tray00, "
                    "tray01): 1 tray demand 4.4 kW at or above caps 4.0 kW; 1 tray reported "
                    "capping by its agent (the GPUs' power cap acts) at caps 4.0 kW")
    only = held_detail(held[:1], LimitState(110_000.0, "requested:valvey",
                                            {"requested:valvey": 110_000.0}))
    assert "valvey's derating request" in only and "demand" not in only, only


def test_the_core_raises_power_capped_only_once_the_limit_binds() -> None:
    """Lock-step with the rack simulator: a 110 kW rack limit (valvey's cap request) from
    t = 2 s; the load is 39.6 kW until 60 s, then 132 kW. Caps are allocated all along (the
    trays' maxima sum above the limit), but only the step makes them bind."""
    sc = load_scenario("load-step-short")
    sc = sc.model_copy(update={"duration_s": 90.0, "faults": [],
                               "load": sc.load.model_copy(update={"step_at_s": 60.0})})

    def hook(now: float, run: ScenarioRun, core: RackyCore) -> None:
        if abs(now - 2.0) < 1e-6:
            core.cap_rack("valvey", 110_000.0, 600.0, "facility water", now)

    r = run_racky(sc, hook=hook, plant_dt_s=0.5)
    tr = r.trace
    capped_at = [t for t, s in zip(tr["t_s"], tr["limit_source"], strict=True)
                 if s == "requested:valvey"]
    assert capped_at and min(capped_at) <= 5.0  # the limit (and caps) in force early
    raised = [a for a in r.raised("power_capped")]
    assert raised, "the 132 kW load against a 110 kW limit must raise power_capped"
    assert min(a.t_s for a in raised) >= 60.0, [(a.t_s, a.message) for a in raised]
    assert "held at their caps" in raised[0].message and "requested:valvey" in raised[0].message
