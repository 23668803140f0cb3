"""racky's facility-water derate on the exchanger valvey measures (issue 21): P_max(T_fws) =
valvey's ``capacity_w_per_k`` × (setpoint − T_fws) in place of the nominal table, which stays
only the cold prior; the measurement is a cooling input with a plausibility window."""

from __future__ import annotations

import json

import pytest

from racky.config import DerateSettings, RackyConfig
from racky.core.controller import RackyCore
from racky.core.lifecycle import Lifecycle, PersistedState
from racky.core.power import Derate
from racky.tick import RackyTick
from valvey.core.capacity import CapacityGuard, CapacitySettings, open_capacity_w_per_k

WALL = 1_800_000_000 * 10**9


def test_a_measured_capacity_replaces_the_table_and_the_table_is_the_cold_prior() -> None:
    d = Derate(DerateSettings())
    # cold: the nominal table (REFERENCE §4.4: 52 kW at 44 °C, margin 0.1 K)
    cold = d.step(44.0, True, 1.0, 132_000.0)
    assert cold == pytest.approx(d.p_max(44.1)) and 46_000.0 < cold < 52_000.0
    # a fouled exchanger measured at 36.4 kW/K (UA −30 %): the derate follows it down
    fouled = Derate(DerateSettings())
    cap = fouled.step(44.0, True, 1.0, 132_000.0, 36_400.0, 45.0)
    assert cap == pytest.approx(36_400.0 * (45.0 - 44.1))
    assert cap < 0.75 * cold
    # kept while a fresh reading lacks it (valvey restarted), not dropped back to the table
    assert fouled.step(44.0, True, 1.0, 132_000.0) == pytest.approx(cap)
    # the setting off: the table, whatever valvey says
    off = Derate(DerateSettings(measured=False))
    assert off.step(44.0, True, 1.0, 132_000.0, 36_400.0, 45.0) == pytest.approx(cold)


def test_valveys_guard_measures_the_open_capacity_per_k() -> None:
    s = CapacitySettings()
    g = CapacityGuard(s)
    # valve open, 132 kW × 0.85 liquid removed across 13.4 K (return 53.4, water 40)
    kw = 132.0 * s.liquid_fraction
    st = g.step(0.0, pv_c=45.0, setpoint_c=45.0, valve_demand_pct=100.0,
                valve_position_pct=100.0, valve_stuck=False, heat_removed_kw=kw,
                return_c=53.4, facility_c=40.0, flow_lpm=198.0, rack_power_w=132_000.0,
                no_standby=False, low_flow=False, over_temperature=False)
    k = kw / 13.4
    want = open_capacity_w_per_k(k, 198.0, s.coolant_rho_c_kj_per_l_k, s.liquid_fraction)
    assert st.open_w_per_k == pytest.approx(want)
    cs = s.coolant_rho_c_kj_per_l_k * 198.0 / 60.0
    assert st.open_w_per_k == pytest.approx(1000.0 * k / (1.0 - k / cs) / s.liquid_fraction)
    # the valve throttled: nothing measured (a throttled valve is not the open exchanger)
    g2 = CapacityGuard(s)
    st2 = g2.step(0.0, pv_c=45.0, setpoint_c=45.0, valve_demand_pct=60.0,
                  valve_position_pct=60.0, valve_stuck=False, heat_removed_kw=kw,
                  return_c=53.4, facility_c=40.0, flow_lpm=198.0, rack_power_w=132_000.0,
                  no_standby=False, low_flow=False, over_temperature=False)
    assert st2.open_w_per_k is None


def _tick() -> RackyTick:
    cfg = RackyConfig()
    ps = PersistedState(Lifecycle(cfg.lifecycle.initial_state, WALL, "new", "test"))
    return RackyTick(cfg, RackyCore(cfg, 0.0, ps), 0.0)


def _cooling(t: RackyTick, now: float, **vals: float | None) -> None:
    body = {"supply_temp_c": 45.0, "setpoint_c": 45.0, "flow_lpm": 198.0,
            "facility_supply_temp_c": 44.0, **vals}
    t.message(t.topics.cooling, json.dumps(body).encode(), retain=False, received_mono=now,
              wall_ns=WALL)


def test_racky_reads_valveys_capacity_and_derates_on_it() -> None:
    t = _tick()
    _cooling(t, 1.0, capacity_w_per_k=36_400.0)
    c = t.cooling_reading()
    assert c is not None and c.capacity_w_per_k == 36_400.0
    t.step(1.0, WALL)
    assert t.core.derate.cap_w == pytest.approx(36_400.0 * (45.0 - 44.1))


@pytest.mark.parametrize("value", [36.4, -5.0, 5e7])  # kW/K for W/K, negative, absurd
def test_an_implausible_capacity_makes_the_cooling_unknown_and_the_derate_holds(
        value: float) -> None:
    t = _tick()
    _cooling(t, 1.0)
    t.step(1.0, WALL)
    before = t.core.derate.cap_w
    _cooling(t, 2.0, capacity_w_per_k=value)
    assert t.cooling_reading() is None
    assert "capacity_w_per_k" in t.implausible_inputs()
    t.step(2.0, WALL)
    assert t.core.derate.cap_w == before  # held, never raised on a value not believed
