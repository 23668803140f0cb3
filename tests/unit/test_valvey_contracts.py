"""valvey's side of docs/CONTRACTS.md: ``racky/state/rack_power.rack_power_w`` is null while a
shelf is offline (a partial sum would understate the rack). valvey then never uses a stale or
partial power: the sample is BAD (``null``), the feedforward falls back to the CDU's heat
figure, and the capacity caps fall back to ``capacity.rack_max_power_w``."""

from __future__ import annotations

import json
from typing import Any

from rackplane.core.samples import Sample, good
from valvey.core.capacity import CapacityGuard, CapacitySettings
from valvey.core.feedforward import DynamicFeedforward, FeedforwardSettings
from valvey.core.sensors import SensorMap, parse_sensor_message

WALL_NS = 1_767_225_600 * 10**9


def null_rack_power_sample(now: float) -> Sample:
    rp = SensorMap().rack_power
    assert rp is not None and rp.field == "rack_power_w"
    payload = json.dumps({"rack_power_w": None, "it_power_w": None, "shelves_reporting": 5,
                          "shelves_configured": 6, "ts_ns": WALL_NS}).encode()
    (smp,) = parse_sensor_message([rp], payload, now, WALL_NS)
    return smp


def test_null_rack_power_is_a_bad_sample_never_a_number() -> None:
    smp = null_rack_power_sample(10.0)
    assert smp.value is None and not smp.usable and smp.reason == "null"


def test_feedforward_falls_back_to_heat_removed_on_null_rack_power() -> None:
    ff = DynamicFeedforward(FeedforwardSettings())
    now = 10.0
    heat = good("heat_removed_kw", 90.0, "kW", WALL_NS, now)
    ff.update(now, null_rack_power_sample(now), heat)
    assert ff.source == "heat_removed" and ff.power_kw is not None
    ff.update(now + 0.5, null_rack_power_sample(now + 0.5), None)
    assert ff.source == "none" and ff.power_kw is None


def test_capacity_caps_fall_back_to_rack_max_power_on_null_rack_power() -> None:
    s = CapacitySettings(rack_max_power_w=150_000.0)  # the site's nameplate (not the sim's)
    common: dict[str, Any] = dict(
        pv_c=50.0, setpoint_c=45.0, valve_demand_pct=100.0, valve_position_pct=100.0,
        heat_removed_kw=None, return_c=None, facility_c=None, flow_lpm=None,
        rack_power_w=None, no_standby=False, low_flow=False)
    over = CapacityGuard(s).step(0.0, valve_stuck=False, over_temperature=True, **common)
    assert over.cap_w == round(s.overtemp_cap_fraction * 150_000.0, -2)
    stuck = CapacityGuard(s).step(0.0, valve_stuck=True, over_temperature=False, **common)
    assert stuck.cap_w == round(0.9 * 150_000.0, -2)
    # with a number the cap follows the measured power instead (the fallback is not a default)
    measured = CapacityGuard(s).step(0.0, valve_stuck=True, over_temperature=False,
                                     **{**common, "rack_power_w": 60_000.0})
    assert measured.cap_w == round(0.9 * 60_000.0, -2)


def test_an_unknown_rack_max_power_is_the_highest_rack_power_seen() -> None:
    """No nameplate configured (the shipped default: the nominal plant's 132 kW was one):
    the caps that are shares of the rack's maximum use the highest rack power seen, never
    above the true maximum; before any, every such cap is at min_cap_w."""
    s = CapacitySettings()
    assert s.rack_max_power_w is None
    common: dict[str, Any] = dict(
        pv_c=45.0, setpoint_c=45.0, valve_demand_pct=50.0, valve_position_pct=50.0,
        valve_stuck=False, heat_removed_kw=None, return_c=None, facility_c=None, flow_lpm=None,
        low_flow=False, over_temperature=False)
    blind = CapacityGuard(s).step(0.0, rack_power_w=None, no_standby=True, **common)
    assert blind.cap_w == s.min_cap_w
    g = CapacityGuard(s)
    for t, p in enumerate((90_000.0, 118_000.0, 104_000.0)):
        g.step(float(t), rack_power_w=p, no_standby=False, **common)
    assert g.rack_max_w(None) == 118_000.0
    st = g.step(3.0, rack_power_w=100_000.0, no_standby=True, **common)
    assert st.cap_w == round(s.no_standby_cap_fraction * 118_000.0, -2)
    # configured: the nameplate, whatever was seen
    named = CapacityGuard(CapacitySettings(rack_max_power_w=142_000.0))
    named.step(0.0, rack_power_w=118_000.0, no_standby=False, **common)
    st = named.step(1.0, rack_power_w=118_000.0, no_standby=True, **common)
    assert st.cap_w == round(named.s.no_standby_cap_fraction * 142_000.0, -2)
