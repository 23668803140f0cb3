"""The plant family (sims/cdu/variants.py, issue 21): each named variant really makes the plant
behave that way, measured on the plant (not read back from its parameters)."""

from __future__ import annotations

import math
import statistics

import pytest
from pydantic import ValidationError

from sims.cdu import CduParams, CduPlant
from sims.cdu.variants import VARIANTS, apply_variant, variant_names
from sims.scenario import load_scenario

DT = 0.1
LOAD_W = 100_000.0


def plant_of(variant: str, seed: int = 1, load_w: float = LOAD_W) -> CduPlant:
    p = CduPlant(apply_variant(CduParams(), variant), seed=seed)
    assert p.warm_start(load_w).holds_setpoint
    return p


def run(plant: CduPlant, seconds: float, load_w: float = LOAD_W, dt: float = DT) -> None:
    for i in range(round(seconds / dt)):
        if i % round(1.0 / dt) == 0:  # a live heartbeat: the plant stays in remote control
            plant.write("heartbeat", (i // 10) % 65536)
        plant.step(load_w, 40.0, dt)


def stroke_time_s(variant: str) -> float:
    """From closed, commanded full open: the time until the position reads 100 %."""
    p = CduPlant(apply_variant(CduParams(), variant), seed=1)
    p.warm_start(0.0)
    assert p.truth().valve_position_pct == 0.0
    p.write("valve_command_pct", 100.0)
    t = 0.0
    hb = 0
    while p.truth().valve_position_pct < 100.0 - 1e-9:
        hb += 1
        p.write("heartbeat", hb)
        p.step(0.0, 40.0, DT)
        t += DT
        assert t < 600.0
    return t


def test_registry_names_and_unknown_variant() -> None:
    names = variant_names()
    assert names[0] == "nominal"
    for n in ("stroke_30s", "stroke_90s", "stroke_120s", "rangeability_15", "rangeability_50",
              "backlash_stiction", "hx_fouled_30", "transport_slow_50", "transport_fast_50",
              "sensor_lag_2s", "sensor_lag_10s", "pink_noise", "common_bias",
              "facility_starved"):
        assert n in VARIANTS
        apply_variant(CduParams(), n)  # every variant is a valid parameter set
    with pytest.raises(KeyError, match="unknown plant variant"):
        apply_variant(CduParams(), "stroke_7s")
    assert apply_variant(CduParams(), None) == CduParams()


def test_scenario_selects_variant_and_rejects_unknown() -> None:
    sc = load_scenario("load-step")
    assert sc.cdu_params().valve_stroke_time_s == 60.0
    spec = sc.plant.model_dump()
    v = type(sc.plant).model_validate({**spec, "variant": "stroke_120s"})
    assert sc.model_copy(update={"plant": v}).cdu_params().valve_stroke_time_s == 120.0
    with pytest.raises(ValidationError, match="unknown plant variant"):
        type(sc.plant).model_validate({**spec, "variant": "nope"})


def test_scaled_variant_keeps_its_relative_change_on_a_bigger_rack() -> None:
    big = CduParams.for_rack_power(230_000.0)
    assert apply_variant(big, "hx_fouled_30").hx_ua_kw_per_k == pytest.approx(
        0.7 * big.hx_ua_kw_per_k)


@pytest.mark.parametrize(("variant", "stroke_s"), [
    ("nominal", 60.0), ("stroke_30s", 30.0), ("stroke_90s", 90.0), ("stroke_120s", 120.0)])
def test_stroke_time_measured_from_full_open_command(variant: str, stroke_s: float) -> None:
    assert stroke_time_s(variant) == pytest.approx(stroke_s, abs=DT + 1e-6)


@pytest.mark.parametrize("variant", ["rangeability_15", "rangeability_50"])
def test_rangeability_is_the_open_to_minimum_flow_ratio(variant: str) -> None:
    r = VARIANTS[variant].set["valve_rangeability"]
    p = plant_of(variant)
    flows = []
    for cmd in (100.0, 0.1):  # fully open, then just off the seat
        p.write("valve_command_pct", cmd)
        run(p, 130.0)
        flows.append(p.truth().facility_flow_lps)
    assert flows[0] / flows[1] == pytest.approx(r * r ** -0.001, rel=1e-3)


def test_backlash_and_stiction() -> None:
    p = plant_of("backlash_stiction")
    x0 = p.truth().valve_position_pct
    # a demand change inside the 0.5 % stick band does not move the valve at all
    p.write("valve_command_pct", x0 + 0.4)
    run(p, 5.0)
    assert p.truth().valve_position_pct == x0
    # beyond the band it moves, to the demand less half the backlash (the plug lags)
    p.write("valve_command_pct", x0 + 5.0)
    run(p, 10.0)
    up = p.truth().valve_position_pct
    assert up == pytest.approx(x0 + 5.0 - 0.5, abs=1e-6)
    # a reversal smaller than the backlash leaves the plug where it was
    p.write("valve_command_pct", x0 + 4.2)  # 0.8 %: beyond the stick band, within backlash
    run(p, 10.0)
    assert p.truth().valve_position_pct == pytest.approx(up, abs=1e-9)
    assert p.readings()["valve_position_pct"] == pytest.approx(up, abs=1e-9)  # feedback: plug
    # a larger one moves it, lagging by half the backlash the other way
    p.write("valve_command_pct", x0)
    run(p, 10.0)
    assert p.truth().valve_position_pct == pytest.approx(x0 + 0.5, abs=1e-6)
    # the nominal valve follows every small change exactly
    n = plant_of("nominal")
    xn = n.truth().valve_position_pct
    n.write("valve_command_pct", xn + 0.8)
    run(n, 5.0)
    assert n.truth().valve_position_pct == pytest.approx(xn + 0.8, abs=1e-9)


def test_fouled_hx_needs_more_valve_and_removes_less() -> None:
    nom, foul = plant_of("nominal"), plant_of("hx_fouled_30")
    assert foul.truth().valve_position_pct > nom.truth().valve_position_pct + 5.0
    cap_n = nom.capacity_w(45.0, 40.0)
    cap_f = foul.capacity_w(45.0, 40.0)
    assert 0.6 * cap_n < cap_f < 0.85 * cap_n


def inlet_delay_s(variant: str) -> float:
    """Time from a CDU supply change (valve slammed open) until the rack inlet moves 0.2 K."""
    p = plant_of(variant)
    t_in0 = p.truth().rack_inlet_temp_c
    ss0 = p.truth().supply_temp_c
    p.write("valve_command_pct", 100.0)
    t = t_cdu = 0.0
    hb = 0
    while p.truth().rack_inlet_temp_c > t_in0 - 0.2:
        hb += 1
        p.write("heartbeat", hb)
        p.step(LOAD_W, 40.0, DT)
        t += DT
        if not t_cdu and p.truth().supply_temp_c < ss0 - 0.2:
            t_cdu = t
        assert t < 300.0
    return t - t_cdu


def test_transport_delay_variants() -> None:
    nom = inlet_delay_s("nominal")
    slow = inlet_delay_s("transport_slow_50")
    fast = inlet_delay_s("transport_fast_50")
    assert nom > 4.0
    assert slow / nom == pytest.approx(1.5, abs=0.15)
    assert fast / nom == pytest.approx(0.5, abs=0.15)


@pytest.mark.parametrize(("variant", "tau_s"), [("sensor_lag_2s", 2.0), ("sensor_lag_10s", 10.0)])
def test_supply_sensor_lag(variant: str, tau_s: float) -> None:
    """A step of the true supply temperature through the plant's own supply sensors: 63 %
    after τ (noise-free draws)."""
    p = plant_of(variant)
    for name in ("supply_temp_c", "supply_temp_b_c", "supply_temp_c_c"):
        s = p.sensors[name]
        s.reset(45.0)
        for _ in range(round(tau_s / DT)):
            s.update(46.0, DT, 0.0)
        assert s.lagged - 45.0 == pytest.approx(1.0 - math.exp(-1.0), abs=1e-6)
    # the other temperature transmitters keep the nominal 2 s
    assert p.sensors["return_temp_c"].tau_s == 2.0


def _error_means(variant: str, seconds: float, block_s: float) -> tuple[float, float]:
    """Sensor A minus truth at steady state: overall σ and σ of the block means."""
    p = plant_of(variant, load_w=LOAD_W)
    errs = []
    for i in range(round(seconds / 1.0)):
        p.write("heartbeat", i % 65536)
        p.step(LOAD_W, 40.0, 1.0)
        errs.append(p.readings()["supply_temp_c"] - p.truth().supply_temp_c)
    n = round(block_s)
    means = [statistics.fmean(errs[k:k + n]) for k in range(0, len(errs) - n + 1, n)]
    return statistics.pstdev(errs), statistics.pstdev(means)


def test_pink_noise_is_low_frequency_heavy() -> None:
    """White noise averages away over 100 s blocks (σ/10); 1/f noise does not."""
    sd_w, sd_blocks_w = _error_means("nominal", 4000.0, 100.0)
    sd_p, sd_blocks_p = _error_means("pink_noise", 4000.0, 100.0)
    assert sd_blocks_w < 0.3 * sd_w
    assert sd_p > sd_w
    assert sd_blocks_p > 0.3 * sd_p  # a large share is slow wander
    assert sd_blocks_p > 4.0 * sd_blocks_w


def test_common_bias_on_all_supply_sensors() -> None:
    p = plant_of("common_bias")
    run(p, 60.0)
    r = p.readings()
    true = p.truth().supply_temp_c
    for name in ("supply_temp_c", "supply_temp_b_c", "supply_temp_c_c"):
        assert r[name] - true == pytest.approx(0.3, abs=0.15)
    assert r["return_temp_c"] - p.truth().return_temp_c == pytest.approx(0.0, abs=0.15)


def test_facility_flow_starvation() -> None:
    nom, starved = plant_of("nominal"), plant_of("facility_starved")
    for p in (nom, starved):
        p.write("valve_command_pct", 100.0)
        run(p, 70.0)
    assert starved.truth().facility_flow_lps == pytest.approx(
        0.6 * nom.truth().facility_flow_lps, rel=1e-9)
    assert starved.capacity_w(45.0, 40.0) < 0.9 * nom.capacity_w(45.0, 40.0)


def test_second_valve_can_be_stuck_too() -> None:
    p = plant_of("nominal")
    p.set_valve_stuck(True, valve=1)
    p.write("valve_b_command_pct", 50.0)
    run(p, 10.0)
    assert p.truth().valve_b_position_pct == 0.0
    p.set_valve_stuck(False, valve=1)
    run(p, 10.0)
    assert p.truth().valve_b_position_pct > 10.0
    with pytest.raises(ValueError, match="no valve"):
        p.set_valve_stuck(True, valve=2)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_row_cdu_variant_cools_n_racks_sized_for_them(n: int) -> None:
    """racks_N: N racks on one CDU scaled × N (flows, UA, facility flow): N racks at a power
    need the valve one rack needs at it on the nominal CDU, up to near full open; racks at
    different powers are separate racks (the return mixes them)."""
    p = CduPlant(apply_variant(CduParams(), f"racks_{n}"), seed=1)
    assert len(p.racks) == n
    for load_w in (250_000.0, LOAD_W):
        assert p.warm_start([load_w] * n).holds_setpoint
        one = plant_of("nominal", load_w=load_w).truth().valve_position_pct
        assert p.truth().valve_position_pct == pytest.approx(one, abs=0.1)
    uneven = [LOAD_W * (0.4 + 0.6 * k / (n - 1)) for k in range(n)]
    assert p.warm_start(uneven).holds_setpoint
    assert p.truth().rack_power_w == pytest.approx(sum(uneven), rel=1e-6)
    assert p.truth().valve_position_pct < one - 5.0  # less heat than N racks at 100 kW
