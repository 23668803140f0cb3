"""The virtual rack (issue 3): rack, power shelves, room air, workloads, row composition,
faults and scenarios (sims/rack.py, power.py, environment.py, workloads/, row.py,
scenario/, telemetry.py). Everything here is pure and runs in lock-step; the real-time faces
are tests/adapters/test_sim_faces.py.

Bounds are the model's own figures (REFERENCE §1.2, §1.6, §4) or stated allowances; no timing
targets (speed lives in the benchmarks, harness/bench.py).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from rackplane.config import validate_data
from rackplane.errors import ConfigError
from rackplane.io.mqtt import encode_json
from rackplane.settings import Identity
from sims.cli import app as sim_cli
from sims.environment import (
    Environment,
    EnvironmentParams,
    dew_point_c,
    relative_humidity_pct,
)
from sims.loads import StepLoad
from sims.power import PSU_STATUS_BITS, SHELF_STATUS_BITS, PowerShelfParams, PowerShelves
from sims.rack import ComputeRack, LeakSensorParams, LeakSensors, NodeAgentSettings
from sims.row import VirtualRack, VirtualRackParams, VirtualRow
from sims.runtime import encode_readings
from sims.scenario import (
    FaultSpec,
    Scenario,
    ScenarioRun,
    list_scenarios,
    load_scenario,
)
from sims.telemetry import (
    EnvTelemetry,
    NodeAgentsState,
    PowerTelemetry,
    RackTelemetry,
    TrayTelemetry,
    env_payload,
    node_agents_payload,
    power_payload,
    rack_payload,
    schema_documents,
    stale_schemas,
    tray_payloads,
    write_schemas,
)
from sims.workloads import (
    AgenticWorkload,
    BurnInWorkload,
    IdleWorkload,
    RackPowerWorkload,
    TrainingWorkload,
)

DT = 0.1


def run(vr: VirtualRow, seconds: float, t_fws: float = 40.0,
        each: Callable[[VirtualRow], None] | None = None) -> None:
    """Step with a live heartbeat (once a second, as a controller writes it)."""
    for _ in range(round(seconds / DT)):
        k = round(vr.time_s / DT)
        if k % 10 == 0:
            vr.cdu.write("heartbeat", (k // 10) % 65536)
        vr.step(DT, t_fws)
        if each is not None:
            each(vr)


# --- energy, bounds, hydraulics ------------------------------------------------------------------


def test_energy_chain_closes_within_2_percent() -> None:
    # Agentic load for 10 min with a late valve move: AC in = PSU out + PSU loss; PSU out
    # (minus BBU recharge, plus BBU discharge) = IT power; IT = liquid + air; liquid = heat
    # removed by the HX + stored heat (REFERENCE §4.2 item 8 chain, issue 3: within 2 %).
    vr = VirtualRack(workload=AgenticWorkload(seed=2), seed=2, fabric="off")
    e_stored0 = vr.stored_energy_kj()
    powers: list[float] = []

    def each(v: VirtualRow) -> None:
        powers.append(v.racks[0].thermal.power_w)
        if abs(v.time_s - 300.0) < DT / 2:
            v.cdu.write("valve_command_pct", 95.0)

    run(vr, 600.0, each=each)
    e = vr.truth().energy_kj
    assert e["ac_in"] == pytest.approx(e["psu_out"] + e["psu_loss"], rel=1e-9)
    assert e["psu_out"] - e["bbu_recharge"] + e["bbu_out"] == pytest.approx(e["it"], rel=0.02)
    assert e["liquid"] + e["air"] == pytest.approx(e["it"], rel=1e-9)
    hx = vr.cdu_truth().hx_energy_kj
    d_stored = vr.stored_energy_kj() - e_stored0
    assert abs(e["liquid"] - (hx + d_stored)) <= 0.02 * e["liquid"]
    assert e["liquid"] / e["it"] == pytest.approx(0.85, abs=1e-9)  # f_liq (REFERENCE §4.3)
    assert 0.975 <= e["psu_out"] / e["ac_in"] <= 0.986  # shelf η band (REFERENCE §1.2)
    assert statistics.pstdev(powers) > 5_000.0  # a real transient: the load moved
    assert abs(d_stored) > 100.0  # and the loop's stored heat changed


def test_temperatures_pressures_and_powers_stay_physical_under_faults() -> None:
    vr = VirtualRack(workload=BurnInWorkload(), seed=4, fabric="off")
    prv = vr.cdu.params.relief_valve_kpa
    tgp = vr.compute.tgp_w
    room = vr.environment.room_temp_c
    shelf_p = vr.shelves.params

    def each(v: VirtualRow) -> None:
        t = v.time_s
        if abs(t - 20.0) < DT / 2:
            v.cdu.trip_pump(0)
        if abs(t - 23.0) < DT / 2:
            v.cdu.set_duty_pump(1)
        if abs(t - 40.0) < DT / 2:
            v.racks[0].compute.leaks.set_tray_leak(4, 20.0)
            v.racks[0].thermal.set_conductance_factor(9, 0.3)
            v.racks[0].shelves.lose_shelf(1)
        if abs(t - 70.0) < DT / 2:
            v.racks[0].compute.leaks.set_tray_leak(4, 0.0)
        ct = v.cdu_truth()
        tr = v.truth()
        for temp in (ct.supply_temp_c, ct.return_temp_c, ct.rack_inlet_temp_c,
                     ct.rack_outlet_temp_c):
            assert 39.99 <= temp < 80.0
        assert float(tr.gpu_tj_c.min()) >= 39.99 and float(tr.gpu_tj_c.max()) < 110.0
        assert 0.0 <= ct.loop_pressure_kpa <= prv and ct.flow_lps >= 0.0
        assert 0.0 <= ct.diff_pressure_kpa <= 600.0
        assert (tr.gpu_power_w >= 0.0).all() and (tr.gpu_power_w <= tgp + 1e-9).all()
        assert 0.0 <= tr.it_power_w <= tr.it_power_demand_w + 1e-6
        st = tr.shelves
        assert (st.psu_output_w <= st.psu_available_w + 1e-6).all()
        max_loss = shelf_p.psu_rating_w * (1 / 0.90 - 1)
        assert (st.psu_temp_c >= room - 1e-9).all()
        assert (st.psu_temp_c <= room + shelf_p.psu_thermal_resistance_k_per_w * max_loss).all()

    run(vr, 120.0, each=each)
    assert vr.cdu_truth().inventory_l == pytest.approx(110.0 - 10.0, abs=0.05)  # 30 s of 20 L/min


def test_flow_follows_the_pump_curve_in_the_rack() -> None:
    # REFERENCE §4.2 item 2: Q = Q_max·n, DP = K_sys·Q² (design 150 kPa at 3.3 L/s).
    vr = VirtualRack(workload=IdleWorkload(), seed=1, fabric="off")
    p = vr.cdu.params
    for n_pct in (50.0, 100.0):
        vr.cdu.write("pump_speed_command_pct", n_pct)
        run(vr, 20.0)
        ct = vr.cdu_truth()
        q = p.max_flow_lps * n_pct / 100.0
        assert ct.flow_lps == pytest.approx(q, rel=1e-3)
        assert ct.diff_pressure_kpa == pytest.approx(
            p.diff_pressure_design_kpa * (q / p.design_flow_lps) ** 2, rel=2e-3
        )


def test_rack_power_profile_reproduces_rack_power_and_ref_4_4() -> None:
    # The rack model driven by a rack-power profile draws that power; at 132 kW every GPU is at
    # TGP and the hottest Tj is §4.4's 79 °C (the per-GPU model at uniform power).
    vr = VirtualRack(fabric="off")
    comp = vr.compute
    vr.workload = RackPowerWorkload(StepLoad(39_600.0, 132_000.0, 5.0),
                                    comp.gpu_fraction_for_rack_power)
    vr.warm_start()
    assert vr.truth().it_power_w == pytest.approx(39_600.0, rel=1e-9)
    run(vr, 6.0)
    tr = vr.truth()
    assert tr.it_power_w == pytest.approx(132_000.0, rel=1e-9)
    assert np.allclose(tr.gpu_power_w, comp.tgp_w)
    vr.warm_start()
    assert float(vr.truth().gpu_tj_c.max()) == pytest.approx(79.0, abs=0.6)
    assert comp.other_share == pytest.approx((132.0 - 86.4 - 3.6) / 86.4)


# --- determinism ---------------------------------------------------------------------------------


def _trace(seed: int) -> list[np.ndarray]:
    vr = VirtualRack(workload=AgenticWorkload(seed=seed), seed=seed, fabric="on")
    vr.agents.configure(2, NodeAgentSettings(ramp_up_w_per_s=400.0, power_floor_pct=30.0))
    out: list[np.ndarray] = []

    def each(v: VirtualRow) -> None:
        tr = v.truth()
        r = v.cdu.readings()
        out.append(np.concatenate([tr.gpu_power_w, tr.gpu_tj_c, tr.gpu_traffic,
                                   [tr.shelves.input_w, r["supply_temp_c"], r["flow_lpm"],
                                    v.environment_state().sensed_room_temp_c]]))

    run(vr, 30.0, each=each)
    fab = vr.fabric
    assert fab is not None
    snap = fab.snapshot()
    out.append(np.concatenate([snap["tx_bytes"].astype(float), snap["symbol_error"]]))
    return out


def test_same_seed_same_trace_different_seed_different_trace() -> None:
    a, b, c = _trace(7), _trace(7), _trace(8)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


# --- workloads -----------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [
    lambda s: AgenticWorkload(seed=s),
    lambda s: TrainingWorkload(seed=s, period_s=3.0),
    lambda s: IdleWorkload(seed=s),
    lambda s: BurnInWorkload(),
])
def test_workloads_shapes_ranges_and_seeds(make: Callable[[int], Any]) -> None:
    w1, w2 = make(1), make(1)
    for t in np.arange(0.0, 60.0, 0.7):
        f, tr = w1.power_fraction(float(t)), w1.traffic_demand(float(t))
        assert f.shape == (72,) and tr.shape == (72,)
        assert ((f >= 0) & (f <= 1)).all() and ((tr >= 0) & (tr <= 1)).all()
        assert np.array_equal(f, w2.power_fraction(float(t)))
    with pytest.raises(ValueError, match="back"):
        w1.power_fraction(1.0)


def test_agentic_values_do_not_depend_on_the_step_size() -> None:
    fine, coarse = AgenticWorkload(seed=5), AgenticWorkload(seed=5)
    for k in range(6000):  # 10 min at 0.1 s
        t = k * 0.1
        f = fine.power_fraction(t)
        if k % 5 == 0:
            assert np.array_equal(f, coarse.power_fraction(t))


def test_agentic_states_follow_ref_4_6() -> None:
    # REFERENCE §4.6: burst 0.85-1.0 (median dwell 6 s), comm dip 0.6-0.7 with high traffic,
    # tool-wait 0.2-0.45, decode 0.5-0.7, idle 0.15-0.25; concurrency 0.3-1 over 5-15 min.
    w = AgenticWorkload(seed=11, spike_rate_per_h=0.0)
    ranges = {"burst": (0.85, 1.0), "comm": (0.6, 0.7), "decode": (0.5, 0.7),
              "tool_wait": (0.2, 0.45), "idle": (0.15, 0.25)}
    runs: list[int] = []
    current = [0] * 9
    seen: set[str] = set()
    for k in range(18_000):  # 30 min at 0.1 s
        t = k * 0.1
        f = w.power_fraction(t)
        tr = w.traffic_demand(t)
        states = w.instance_states(t)
        for i, s in enumerate(states):
            seen.add(s)
            lo, hi = ranges[s]
            assert (lo - 1e-12 <= f[i * 8:(i + 1) * 8]).all() and (f[i * 8:(i + 1) * 8]
                                                                  <= hi + 1e-12).all()
            if s == "comm":
                assert (tr[i * 8:(i + 1) * 8] >= 0.7).all()
            busy = s in ("burst", "comm")
            if busy:
                current[i] += 1
            elif current[i]:
                runs.append(current[i])
                current[i] = 0
        c = w.concurrency(t)
        assert 0.3 - 1e-12 <= c <= 1.0 + 1e-12
    assert seen == set(ranges)
    # burst dwell: lognormal, median 6 s (REFERENCE §4.6); ±25 % for ~hundreds of samples and
    # the random first-segment phase
    assert statistics.median(runs) * 0.1 == pytest.approx(6.0, rel=0.25)


def test_agentic_spikes_step_the_rack_up_within_one_step() -> None:
    # §4.6 "spike" mode: rack steps of up to +70 % within ≤ 100 ms.
    w = AgenticWorkload(seed=3, spike_rate_per_h=6.0)
    spikes = w.spikes_until(4 * 3600.0)
    assert 10 <= len(spikes) <= 40  # Poisson, 24 expected in 4 h
    jumps = []
    t = 0.0
    for start, dur in spikes:
        before_t = math.floor(start / DT) * DT
        while t < before_t:
            w.power_fraction(t)
            t += DT
        before = float(w.power_fraction(before_t).mean())
        after_t = before_t + DT
        after = w.power_fraction(after_t)
        assert set(w.instance_states(after_t)) <= {"burst", "comm"}  # every instance bursts
        jumps.append(float(after.mean()) - before)
        t = after_t + dur + 1.0
    assert max(jumps) >= 0.4  # ≈ +50-70 % of TDP in one 100 ms step


def test_training_is_a_rack_wide_square_wave_with_comm_traffic() -> None:
    w = TrainingWorkload(seed=0, period_s=4.0, jitter=0.0)
    for t, hi in ((0.5, True), (2.5, False), (4.5, True), (6.5, False)):
        f, tr = w.power_fraction(t), w.traffic_demand(t)
        assert (f == (1.0 if hi else 0.65)).all()
        assert (tr == (0.05 if hi else 0.9)).all()


# --- node agents ---------------------------------------------------------------------------------


def _agents() -> tuple[ComputeRack, Any]:
    comp = ComputeRack(VirtualRackParams().cdu.rack)
    return comp, comp.agents


def test_node_agent_caps_act_at_once() -> None:
    comp, ag = _agents()
    full = np.full(72, 1200.0)
    ag.step(full, DT)
    ag.configure(0, NodeAgentSettings(gpu_power_cap_w=700.0, ramp_down_w_per_s=10.0))
    tray_cap = 4 * 500.0 * (1 + comp.other_share)
    ag.configure(1, NodeAgentSettings(power_cap_w=tray_cap))
    out = ag.step(full, DT)
    assert (out[0:4] == 700.0).all()  # the cap wins over the ramp-down limit
    assert out[4:8] == pytest.approx(500.0)
    assert (out[8:] == 1200.0).all()
    st = ag.status(1, out)
    assert st.capping and st.enforced_gpu_cap_w == pytest.approx(500.0)
    assert st.tray_power_w == pytest.approx(tray_cap)
    assert st.enforced_tray_cap_w == pytest.approx(tray_cap)


def test_node_agent_floor_burns_power_up_to_the_cap() -> None:
    _, ag = _agents()
    ag.configure(3, NodeAgentSettings(power_floor_pct=60.0))
    ag.configure(4, NodeAgentSettings(power_floor_pct=90.0, gpu_power_cap_w=800.0))
    out = ag.step(np.full(72, 240.0), DT)
    assert (out[12:16] == 720.0).all()  # 60 % of 1.2 kW TGP
    assert (out[16:20] == 800.0).all()  # floor above the cap: the cap wins
    assert (out[:12] == 240.0).all()
    assert ag.status(3, out).flooring


def test_node_agent_ramp_limits_and_hysteresis() -> None:
    _, ag = _agents()
    ag.configure(0, NodeAgentSettings(ramp_up_w_per_s=500.0, ramp_down_w_per_s=250.0,
                                      ramp_down_hysteresis_s=1.0))
    ag.reset(np.full(72, 240.0))
    ups = [ag.step(np.full(72, 1200.0), DT)[0] for _ in range(30)]
    assert ups[0] == pytest.approx(290.0)  # 500 W/s × 0.1 s
    assert ups[9] == pytest.approx(740.0)
    assert ups[-1] == pytest.approx(1200.0)  # reached after 1.92 s
    downs = [ag.step(np.full(72, 240.0), DT)[0] for _ in range(20)]
    assert downs[8] == pytest.approx(1200.0)  # held for the 1 s hysteresis
    assert downs[9] == pytest.approx(1175.0)  # then 250 W/s
    assert downs[19] == pytest.approx(925.0)
    assert ag.status(0, ag.request_w).ramp_limited and not ag.status(1, ag.request_w).ramp_limited


def test_node_agent_power_off_and_back_on_ramps_from_zero() -> None:
    _, ag = _agents()
    ag.step(np.full(72, 1000.0), DT)
    ag.set_powered(5, False)
    out = ag.step(np.full(72, 1000.0), DT)
    assert (out[20:24] == 0.0).all() and (out[:20] == 1000.0).all()
    ag.configure(5, NodeAgentSettings(ramp_up_w_per_s=1000.0))
    out = ag.step(np.full(72, 1000.0), DT)
    assert (out[20:24] == 100.0).all()


def test_node_agent_refuses_bad_settings_and_changes_nothing() -> None:
    _, ag = _agents()
    before = ag.all_settings()
    for bad in (NodeAgentSettings(gpu_power_cap_w=50.0), NodeAgentSettings(power_cap_w=1000.0),
                NodeAgentSettings(power_floor_pct=120.0), NodeAgentSettings(ramp_up_w_per_s=0.0),
                NodeAgentSettings(ramp_down_w_per_s=math.nan),
                NodeAgentSettings(ramp_down_hysteresis_s=-1.0)):
        with pytest.raises(ValueError):
            ag.configure(0, bad)
    with pytest.raises(ValueError):
        ag.configure(18, NodeAgentSettings())
    assert ag.all_settings() == before and ag.version == 0


def test_node_agents_smooth_training_swings_in_the_rack() -> None:
    # GB300-style smoothing (REFERENCE §1.3, §4.2 item 8): a power floor and ramp limits cut
    # the rack's swing and bound every GPU's ramp rate.
    def swing(settings: NodeAgentSettings | None) -> tuple[float, float]:
        vr = VirtualRack(workload=TrainingWorkload(period_s=4.0, jitter=0.0), fabric="off")
        if settings is not None:
            for k in range(18):
                vr.agents.configure(k, settings)
        vr.warm_start()
        it: list[float] = []
        gpu0: list[float] = []

        def each(v: VirtualRow) -> None:
            it.append(v.racks[0].thermal.power_w)
            gpu0.append(float(v.racks[0].thermal.gpu_power_drawn_w[0]))

        run(vr, 40.0, each=each)
        rate = max(abs(b - a) for a, b in itertools.pairwise(gpu0)) / DT
        return max(it[100:]) - min(it[100:]), rate

    raw_swing, raw_rate = swing(None)
    smooth_swing, smooth_rate = swing(NodeAgentSettings(power_floor_pct=90.0,
                                                        ramp_up_w_per_s=40.0,
                                                        ramp_down_w_per_s=40.0))
    assert raw_swing == pytest.approx(0.35 * 86_400.0 * 1.486, rel=0.02)  # 100 % ↔ 65 %
    assert smooth_swing < 0.25 * raw_swing  # ≤ 80 W per GPU in a 2 s phase, of 420 W
    assert raw_rate > 1000.0 and smooth_rate <= 40.0 + 1e-6


# --- power shelves -------------------------------------------------------------------------------


def test_efficiency_curve_and_ac_input() -> None:
    ps = PowerShelves()
    # REFERENCE §1.2: 98.5 % peak, 97.5 % at full load; 97.5-98.5 % over 30-100 % load
    assert float(ps.efficiency(0.5)) == pytest.approx(0.985)
    assert float(ps.efficiency(1.0)) == pytest.approx(0.975)
    for x in np.linspace(0.3, 1.0, 15):
        assert 0.975 - 1e-12 <= float(ps.efficiency(x)) <= 0.985 + 1e-12
    f = ps.step(132_000.0, 24.0, DT)  # 48 PSUs at 50 %
    assert f.output_w == pytest.approx(132_000.0)
    assert f.input_w == pytest.approx(132_000.0 / 0.985, rel=1e-9)
    assert ps.state.redundancy == "N+N" and ps.state.spare_psus == 24


def test_n_plus_n_shelf_and_feed_loss_then_derate_needs_a_cap() -> None:
    # REFERENCE §5 S10 with the default 8 × 6 × 5.5 kW on two feeds at 132 kW.
    ps = PowerShelves()
    ps.lose_shelf(2)
    ps.step(132_000.0, 24.0, DT)
    st = ps.state
    assert st.capacity_w == 231_000.0 and st.redundancy == "N+18" and st.bbu_output_w == 0.0
    assert st.shelf_status[2] & (1 << SHELF_STATUS_BITS["ac_lost"])
    assert (st.psu_status[2] & (1 << PSU_STATUS_BITS["ac_lost"])).all()
    assert st.ac_voltage_v[2] == 0.0 and st.shelf_output_w[2] == 0.0
    ps.restore_shelf(2)
    ps.lose_feed(1)
    ps.step(132_000.0, 24.0, DT)
    st = ps.state
    assert st.capacity_w == 132_000.0 and st.redundancy == "N" and st.spare_psus == 0
    assert st.shelf_status[0] & (1 << SHELF_STATUS_BITS["redundancy_lost"])
    ps.derate_psu(0, 0, 0.5)
    f = ps.step(132_000.0, 24.0, DT)
    st = ps.state
    assert st.redundancy == "overloaded" and st.capacity_w == pytest.approx(129_250.0)
    assert f.bbu_output_w == pytest.approx(2_750.0) and not st.brownout
    assert st.psu_status[0, 0] & (1 << PSU_STATUS_BITS["derated"])
    assert st.shelf_status[0] & (1 << SHELF_STATUS_BITS["bbu_discharging"])


def test_bbu_rides_through_90_s_at_its_rating_then_brownout() -> None:
    ps = PowerShelves(PowerShelfParams(shelves=4, feeds=1))  # 132 kW for a 132 kW rack: N
    ps.step(132_000.0, 24.0, DT)
    assert ps.state.redundancy == "N"
    ps.lose_shelf(0)  # 33 kW short = the BBU's rating (REFERENCE §1.2: 90 s)
    t = 0.0
    while not ps.brownout:
        f = ps.step(132_000.0, 24.0, DT)
        t += DT
        assert t < 100.0
    assert t == pytest.approx(90.0, abs=DT + 1e-6)
    assert f.unserved_w > 0.0
    f = ps.step(132_000.0, 24.0, DT)
    assert f.output_w == f.bbu_recharge_w > 0.0  # latched: the rack lost power, BBU recharges
    ps.restore_shelf(0)
    ps.reset_brownout()
    f = ps.step(132_000.0, 24.0, DT)
    assert f.output_w - f.bbu_recharge_w == pytest.approx(132_000.0)


def test_n_plus_1_spare_count_and_psu_failures() -> None:
    ps = PowerShelves(PowerShelfParams(shelves=5, feeds=1))  # 165 kW for 132 kW
    ps.step(132_000.0, 24.0, DT)
    assert ps.state.redundancy == "N+6" and ps.state.spare_psus == 6
    for k in range(6):
        ps.fail_psu(k % 5, k // 5)
    ps.step(132_000.0, 24.0, DT)
    assert ps.state.redundancy == "N" and ps.state.output_w == pytest.approx(132_000.0)
    st = ps.state
    assert st.psu_output_w[0, 0] == 0.0 and st.psu_status[0, 0] & (1 << PSU_STATUS_BITS["failed"])
    ps.fail_psu(4, 5)
    ps.step(132_000.0, 24.0, DT)
    assert ps.state.redundancy == "overloaded"
    with pytest.raises(ValueError):
        ps.fail_psu(5, 0)
    with pytest.raises(ValueError):
        ps.derate_psu(0, 0, 1.5)


def test_psu_temperature_follows_its_loss() -> None:
    ps = PowerShelves()
    for _ in range(3000):  # 5 min = 2.5 τ
        ps.step(200_000.0, 24.0, DT)
    st = ps.state
    loss = float(st.psu_input_w[0, 0] - st.psu_output_w[0, 0])
    final = 24.0 + ps.params.psu_thermal_resistance_k_per_w * loss
    assert float(st.psu_temp_c[0, 0]) == pytest.approx(24.0 + (final - 24.0)
                                                       * (1 - math.exp(-2.5)), rel=0.01)


# --- leaks ---------------------------------------------------------------------------------------


def test_tray_weep_trips_after_threshold_and_wetting_delay() -> None:
    lk = LeakSensors(18, LeakSensorParams())
    lk.set_tray_leak(3, 0.2)  # REFERENCE §5 S6 (a): 20 mL at 3.33 mL/s = 6 s, then 2 s wet
    t = 0.0
    while not lk.state().tray_leak[3]:
        lk.step(DT)
        t += DT
        assert t < 20.0
    assert t == pytest.approx(8.0, abs=DT + 1e-9)
    st = lk.state()
    assert st.leaking_trays() == [3] and not st.drip_pan_leak and not st.rope_leak
    for _ in range(1800):  # 3 min more: 600 mL, the tray holds 500, 100 mL in the pan
        lk.step(DT)
    assert lk.state().drip_pan_leak


def test_leak_sensor_fault_flags_and_reads_dry() -> None:
    lk = LeakSensors(18)
    lk.set_tray_leak(5, 20.0)
    lk.set_sensor_fault("tray", True, 5)
    lk.set_rope_leak(2.0)
    lk.set_sensor_fault("rope", True)
    for _ in range(100):
        lk.step(DT)
    st = lk.state()
    assert not st.tray_leak[5] and st.tray_sensor_fault[5]
    assert not st.rope_leak and st.rope_sensor_fault
    assert st.leaked_l == pytest.approx(22.0 * 10.0 / 60.0)
    lk.set_sensor_fault("tray", False, 5)
    assert lk.state().tray_leak[5]
    with pytest.raises(ValueError):
        lk.set_sensor_fault("tray", True)
    with pytest.raises(ValueError):
        lk.set_tray_leak(2, -1.0)


# --- room air ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("t_c", "rh", "dp_ref"), [
    (25.0, 50.0, 13.9), (30.0, 80.0, 26.2), (35.0, 40.0, 19.4), (20.0, 50.0, 9.3),
    (10.0, 70.0, 4.8), (0.0, 50.0, -9.2), (20.0, 100.0, 20.0),
])
def test_dew_point_reference_values(t_c: float, rh: float, dp_ref: float) -> None:
    # Published dew-point tables (over water), rounded to 0.1 K: ±0.05 rounding + 0.05 fit.
    assert dew_point_c(t_c, rh) == pytest.approx(dp_ref, abs=0.1)


def _sonntag_hpa(t_c: float) -> float:
    # Sonntag (1990) saturation vapour pressure over water, an independent reference.
    t = t_c + 273.15
    return math.exp(-6096.9385 / t + 16.635794 - 2.711193e-2 * t + 1.673952e-5 * t * t
                    + 2.433502 * math.log(t))


def test_magnus_dew_point_agrees_with_sonntag_1990() -> None:
    for t_c in range(0, 51, 5):
        for rh in (10.0, 30.0, 50.0, 70.0, 90.0):
            e = rh / 100.0 * _sonntag_hpa(t_c)
            lo, hi = -60.0, float(t_c)
            for _ in range(60):
                mid = 0.5 * (lo + hi)
                lo, hi = (mid, hi) if _sonntag_hpa(mid) < e else (lo, mid)
            assert dew_point_c(t_c, rh) == pytest.approx(lo, abs=0.1), (t_c, rh)
            assert relative_humidity_pct(t_c, dew_point_c(t_c, rh)) == pytest.approx(rh)
    with pytest.raises(ValueError):
        dew_point_c(25.0, 0.0)
    with pytest.raises(ValueError):
        dew_point_c(80.0, 50.0)


def test_environment_script_and_humidity_rise() -> None:
    env = Environment(EnvironmentParams(temp_points=[(0.0, 24.0), (100.0, 28.0)]), seed=1)
    for _ in range(500):
        env.step(DT)
    assert env.room_temp_c == pytest.approx(26.0)
    env.set_humidity_offset(40.0, ramp_s=100.0)
    for _ in range(500):
        env.step(DT)
    assert env.relative_humidity_pct == pytest.approx(65.0)
    st = env.state()
    assert st.dew_point_c == pytest.approx(dew_point_c(28.0, 65.0))
    assert abs(st.sensed_room_temp_c - 28.0) < 2.0  # τ 30 s behind a 0.04 K/s ramp, + noise


# --- faults: one test per kind -------------------------------------------------------------------

BASE_LOAD: dict[str, Any] = {"kind": "constant", "power_w": 92_400.0}


def _scenario(fault: dict[str, Any], duration_s: float = 60.0, model: str = "auto",
              load: dict[str, Any] | None = None) -> Scenario:
    data = {"name": "t", "duration_s": duration_s, "seed": 3, "plant": {"model": model},
            "load": load or BASE_LOAD, "faults": [fault]}
    return validate_data(Scenario, data, "test")


def _run(sc: Scenario, until_s: float, model: str | None = None) -> ScenarioRun:
    r = ScenarioRun(sc, model=model)  # type: ignore[arg-type]
    advance(r, until_s)
    return r


def advance(r: ScenarioRun, until_s: float) -> None:
    while r.t_s < until_s - 1e-9:
        k = round(r.t_s / DT)
        if k % 10 == 0:
            r.plant.write("heartbeat", (k // 10) % 65536)
        r.step(DT)


def _gt(r: ScenarioRun) -> tuple[str, str, float, float | None]:
    g = r.ground_truth[0]
    return g.kind, g.target, g.start_s, g.end_s


def test_fault_pump_trip() -> None:
    r = _run(_scenario({"at_s": 5.0, "kind": "pump_trip", "pump": 0}), 5.1)
    assert r.plant.readings()["pump_speed_pct"] == 0.0  # status seen before the flow falls
    assert r.plant.truth().flow_lps > 0.9 * r.plant.params.design_flow_lps
    assert _gt(r) == ("pump_trip", "pump0", 5.0, None)


def test_fault_valve_stuck() -> None:
    r = _run(_scenario({"at_s": 2.0, "until_s": 20.0, "kind": "valve_stuck"}), 3.0)
    x0 = r.plant.truth().valve_position_pct
    r.plant.write("valve_command_pct", 100.0)
    advance(r, 15.0)
    assert r.plant.truth().valve_position_pct == x0
    advance(r, 25.0)
    assert r.plant.truth().valve_position_pct > x0 + 5.0
    assert _gt(r) == ("valve_stuck", "valve", 2.0, 20.0)


def test_fault_valve_offset() -> None:
    r = _run(_scenario({"at_s": 1.0, "kind": "valve_offset", "value": 7.0}), 2.0)
    tr = r.plant.truth()
    assert r.plant.readings()["valve_position_pct"] == pytest.approx(tr.valve_position_pct + 7.0)


def test_fault_valve_slow() -> None:
    r = _run(_scenario({"at_s": 0.0, "kind": "valve_slow", "value": 2.0}), 0.5)
    x0 = r.plant.truth().valve_position_pct
    r.plant.write("valve_command_pct", 0.0)
    advance(r, 10.5)
    assert r.plant.truth().valve_position_pct == pytest.approx(x0 - 100.0 * 10.0 / 120.0)


@pytest.mark.parametrize("mode", ["freeze", "stale", "drop", "dropout", "nan", "sentinel",
                                  "spike", "drift", "offset"])
def test_fault_sensor(mode: str) -> None:
    f = {"at_s": 5.0, "until_s": 35.0, "kind": "sensor", "point": "supply_temp_b_c",
         "mode": mode, "magnitude": 3.0, "rate_per_s": 0.1, "duration_s": 1.0}
    r = _run(_scenario(f), 5.0)
    seen: list[float] = []
    bs: list[float] = []
    for _ in range(300):
        advance(r, r.t_s + DT)
        rd = r.plant.readings()
        bs.append(rd["supply_temp_b_c"])
        seen.append(rd["supply_temp_b_c"] - rd["supply_temp_c_c"])
    if mode in ("freeze", "stale"):
        assert len(set(bs)) == 1 and statistics.pstdev(seen) > 0.01
    if mode in ("drop", "dropout", "nan", "sentinel"):
        assert all(math.isnan(x) for x in seen)
        assert (mode == "sentinel") == ("supply_temp_b_c" in r.protocol.sentinel_points)
    if mode == "spike":
        assert max(seen[:10]) > 2.5 and abs(statistics.fmean(seen[20:])) < 0.1
    if mode == "drift":
        assert seen[-1] == pytest.approx(3.0, abs=0.15)  # 0.1 K/s × 30 s
    if mode == "offset":
        assert statistics.fmean(seen) == pytest.approx(3.0, abs=0.05)
    advance(r, 36.0)
    assert math.isfinite(r.plant.readings()["supply_temp_b_c"])
    assert not r.protocol.sentinel_points
    end = 6.0 if mode == "spike" else 35.0  # a spike ends by itself (duration_s = 1 s)
    assert _gt(r) == ("sensor", "supply_temp_b_c", 5.0, end)


def test_fault_sensor_freeze_is_a_flat_reading() -> None:
    r = _run(_scenario({"at_s": 2.0, "kind": "sensor", "point": "supply_temp_c",
                        "mode": "stale"}), 2.0)
    vals = set()
    for _ in range(50):
        advance(r, r.t_s + DT)
        vals.add(r.plant.readings()["supply_temp_c"])
    assert len(vals) == 1


@pytest.mark.parametrize("model", ["cdu", "rack"])
def test_fault_leak(model: str) -> None:
    r = _run(_scenario({"at_s": 0.0, "until_s": 30.0, "kind": "leak", "value": 6.0}), 40.0,
             model=model)
    assert r.plant.truth().inventory_l == pytest.approx(110.0 - 3.0, abs=0.05)
    assert _gt(r) == ("leak", "loop", 0.0, 30.0)


def test_fault_controller_restart() -> None:
    r = _run(_scenario({"at_s": 20.0, "kind": "controller_restart"}), 20.05)
    assert r.plant.readings()["uptime_s"] == 0.0 and r.plant.local_control
    assert _gt(r) == ("controller_restart", "cdu", 20.0, 20.0)


def test_fault_facility_water_rise() -> None:
    r = _run(_scenario({"at_s": 10.0, "until_s": 40.0, "kind": "facility_water_rise",
                        "magnitude": 4.0, "ramp_s": 20.0}, duration_s=80.0), 20.0)
    assert r.facility_supply_temp_c == pytest.approx(42.0, abs=0.01)
    advance(r, 35.0)
    assert r.plant.truth().facility_supply_temp_c == pytest.approx(44.0)
    advance(r, 70.0)
    assert r.facility_supply_temp_c == pytest.approx(40.0)
    assert _gt(r) == ("facility_water_rise", "facility_water", 10.0, 40.0)


@pytest.mark.parametrize("model", ["cdu", "rack"])
def test_fault_fouled_cold_plate(model: str) -> None:
    r = _run(_scenario({"at_s": 1.0, "kind": "fouled_cold_plate", "tray": 5, "value": 0.4},
                       load={"kind": "constant", "power_w": 132_000.0}), 40.0, model=model)
    tj = r.plant.truth().gpu_tj_c
    assert tj[5] > max(tj[:5] + tj[6:]) + 8.0
    assert r.plant.truth().hw_slowdown  # 1.2 kW into G × 0.4 crosses the slowdown threshold
    assert _gt(r) == ("fouled_cold_plate", "tray05", 1.0, None)


def test_fault_tray_leak() -> None:
    r = _run(_scenario({"at_s": 1.0, "kind": "tray_leak", "tray": 7, "value": 20.0}), 5.0)
    assert r.rack is not None and r.model == "rack"
    st = r.rack.truth().leaks
    assert st.leaking_trays() == [7]
    assert r.plant.truth().inventory_l == pytest.approx(110.0 - 20.0 * 4.0 / 60.0, abs=0.01)
    assert _gt(r) == ("tray_leak", "tray07", 1.0, None)


def test_fault_cdu_leak() -> None:
    r = _run(_scenario({"at_s": 1.0, "until_s": 10.0, "kind": "cdu_leak", "value": 2.0}), 12.0)
    assert r.rack is not None
    assert r.rack.truth().leaks.rope_leak
    assert _gt(r) == ("cdu_leak", "cdu", 1.0, 10.0)


@pytest.mark.parametrize(("sensor", "target"), [("tray", "tray04.leak_sensor"),
                                                ("rope", "cdu.rope_sensor"),
                                                ("drip_pan", "rack.drip_pan_sensor")])
def test_fault_leak_sensor_fault(sensor: str, target: str) -> None:
    r = _run(_scenario({"at_s": 1.0, "until_s": 5.0, "kind": "leak_sensor_fault",
                        "sensor": sensor, "tray": 4}), 2.0)
    assert r.rack is not None
    st = r.rack.truth().leaks
    flag = {"tray": bool(st.tray_sensor_fault[4]), "rope": st.rope_sensor_fault,
            "drip_pan": st.drip_pan_sensor_fault}[sensor]
    assert flag and not st.leaking_trays() and not st.rope_leak
    advance(r, 6.0)
    assert not r.rack.truth().leaks.tray_sensor_fault.any()
    assert _gt(r) == ("leak_sensor_fault", target, 1.0, 5.0)


def test_fault_psu_failure() -> None:
    r = _run(_scenario({"at_s": 1.0, "until_s": 3.0, "kind": "psu_failure", "shelf": 3,
                        "psu": 2}), 2.0)
    assert r.rack is not None
    st = r.rack.truth().shelves
    assert st.psu_output_w[3, 2] == 0.0 and st.capacity_w == 264_000.0 - 5_500.0
    assert st.psu_status[3, 2] & (1 << PSU_STATUS_BITS["failed"])
    advance(r, 4.0)
    assert r.rack.truth().shelves.capacity_w == 264_000.0
    assert _gt(r) == ("psu_failure", "shelf3.psu2", 1.0, 3.0)


def test_fault_psu_derate() -> None:
    r = _run(_scenario({"at_s": 1.0, "kind": "psu_derate", "shelf": 0, "psu": 1,
                        "value": 0.5}), 2.0)
    assert r.rack is not None
    assert r.rack.truth().shelves.psu_available_w[0, 1] == 2_750.0
    assert _gt(r) == ("psu_derate", "shelf0.psu1", 1.0, None)


def test_fault_shelf_loss() -> None:
    r = _run(_scenario({"at_s": 1.0, "until_s": 3.0, "kind": "shelf_loss", "shelf": 6}), 2.0)
    assert r.rack is not None
    assert r.rack.truth().shelves.ac_voltage_v[6] == 0.0
    advance(r, 4.0)
    assert r.rack.truth().shelves.ac_voltage_v[6] > 0.0
    assert _gt(r) == ("shelf_loss", "shelf6", 1.0, 3.0)


def test_fault_feed_loss() -> None:
    r = _run(_scenario({"at_s": 1.0, "kind": "feed_loss", "feed": 0}), 2.0)
    assert r.rack is not None
    st = r.rack.truth().shelves
    assert list(st.feed_capacity_w) == [0.0, 132_000.0] and st.redundancy == "N+7"  # 92.4 kW
    assert _gt(r) == ("feed_loss", "feedA", 1.0, None)


def test_fault_humidity_rise() -> None:
    r = _run(_scenario({"at_s": 1.0, "kind": "humidity_rise", "magnitude": 30.0,
                        "ramp_s": 10.0}), 12.0)
    assert r.rack is not None
    env = r.rack.environment_state()
    assert env.relative_humidity_pct == pytest.approx(75.0)
    assert env.dew_point_c == pytest.approx(dew_point_c(24.0, 75.0))
    assert _gt(r) == ("humidity_rise", "room", 1.0, None)


def test_fault_room_temp_rise() -> None:
    r = _run(_scenario({"at_s": 1.0, "kind": "room_temp_rise", "magnitude": 6.0}), 2.0)
    assert r.rack is not None
    assert r.rack.environment.room_temp_c == pytest.approx(30.0)
    assert _gt(r) == ("room_temp_rise", "room", 1.0, None)


def test_fault_link_flap() -> None:
    # REFERENCE §5 S7: 3 link-downs within 8 min (down 5 s, up 155 s)
    f = {"at_s": 10.0, "kind": "link_flap", "port": "gpu07/nic1", "down_s": 5.0, "up_s": 155.0,
         "count": 3}
    r = _run(_scenario(f, duration_s=400.0), 12.0)
    fab = r.rack.fabric if r.rack is not None else None
    assert fab is not None
    p = fab.port_index("gpu07/nic1")
    assert not fab.snapshot()["link_up"][p]
    advance(r, 400.0)
    snap = fab.snapshot()
    assert snap["link_up"][p] and int(snap["link_downed"][p]) == 3
    assert int(snap["link_downed"].sum()) == 3
    assert _gt(r) == ("link_flap", "gpu07/nic1", 10.0, 335.0)


def test_fault_link_down() -> None:
    r = _run(_scenario({"at_s": 2.0, "kind": "link_down", "port": 41, "down_s": 20.0}), 10.0)
    fab = r.rack.fabric if r.rack is not None else None
    assert fab is not None and not fab.snapshot()["link_up"][41]
    advance(r, 25.0)
    assert fab.snapshot()["link_up"][41]
    assert _gt(r) == ("link_down", "41", 2.0, 22.0)


def test_fault_link_error_rate() -> None:
    r = _run(_scenario({"at_s": 0.0, "until_s": 50.0, "kind": "link_error_rate",
                        "port": "gpu03/nvl02", "counter": "nvl_replay_errors",
                        "rate_per_s": 2.0}), 60.0)
    fab = r.rack.fabric if r.rack is not None else None
    assert fab is not None
    n = int(fab.snapshot()["nvl_replay_errors"][fab.port_index("gpu03/nvl02")])
    assert 60 <= n <= 140  # Poisson, mean 100 over 50 s
    assert int(fab.snapshot()["nvl_replay_errors"].sum()) == n  # healthy replay rate is 0
    assert _gt(r) == ("link_error_rate", "gpu03/nvl02", 0.0, 50.0)


def test_fault_link_error_ramp() -> None:
    r = _run(_scenario({"at_s": 0.0, "kind": "link_error_ramp", "port": "gpu11/nic0",
                        "counter": "symbol_error", "start_per_s": 0.01, "end_per_s": 1.0,
                        "ramp_s": 20.0}), 30.0)
    fab = r.rack.fabric if r.rack is not None else None
    assert fab is not None
    p = fab.port_index("gpu11/nic0")
    assert fab.truth()["symbol_error_rate_per_s"][p] == pytest.approx(1.0)


def test_fault_link_ber() -> None:
    r = _run(_scenario({"at_s": 1.0, "kind": "link_ber", "port": "gpu00/nvl00",
                        "value": 1e-11}), 5.0)
    fab = r.rack.fabric if r.rack is not None else None
    assert fab is not None
    assert fab.truth()["ber_rate"][0] == pytest.approx(1e-11)


def test_fault_gpu_reboot() -> None:
    r = _run(_scenario({"at_s": 3.0, "kind": "gpu_reboot", "gpu": 9}), 5.0)
    fab = r.rack.fabric if r.rack is not None else None
    assert fab is not None
    up = fab.snapshot()["uptime_s"]
    assert up[9] < 3.0 < up[8]
    assert _gt(r) == ("gpu_reboot", "gpu09", 3.0, 3.0)


@pytest.mark.parametrize(("fault", "check"), [
    ({"kind": "modbus_exception", "device": "cdu", "code": 6},
     lambda m: m["cdu"].exceptions and next(iter(m["cdu"].exceptions.values()))[0] == 6),
    ({"kind": "modbus_half_open", "device": "power"}, lambda m: m["power"].blackhole),
    ({"kind": "modbus_slow", "device": "cdu", "value": 0.5},
     lambda m: m["cdu"].reply_delay_s == 0.5),
    ({"kind": "modbus_gap", "device": "cdu", "table": "input", "address": 20},
     lambda m: list(m["cdu"].exceptions.values()) == [(2, None, "input", 20, 1)]),
    ({"kind": "modbus_max_registers", "device": "power", "value": 10},
     lambda m: m["power"].max_registers == 10),
])
def test_fault_modbus_protocol(fault: dict[str, Any], check: Callable[[Any], bool]) -> None:
    r = _run(_scenario({"at_s": 1.0, "until_s": 3.0, **fault}), 2.0)
    assert check(r.protocol.modbus)
    v = r.protocol.version
    advance(r, 4.0)
    assert r.protocol.version == v + 1 and not check(r.protocol.modbus)
    assert r.ground_truth[0].target == f"modbus:{fault['device']}"


def test_fault_mqtt_stop() -> None:
    r = _run(_scenario({"at_s": 1.0, "until_s": 3.0, "kind": "mqtt_stop",
                        "publisher": "env"}), 2.0)
    assert not r.protocol.publishing("env") and r.protocol.publishing("trays")
    advance(r, 4.0)
    assert r.protocol.publishing("env")
    assert _gt(r) == ("mqtt_stop", "mqtt:env", 1.0, 3.0)


def test_fault_specs_are_checked() -> None:
    bad = [
        {"at_s": 1.0, "kind": "tray_leak"},
        {"at_s": 1.0, "kind": "sensor", "point": "supply_temp_c"},
        {"at_s": 1.0, "kind": "link_flap", "port": "gpu00/nic0", "down_s": 1.0, "count": 3},
        {"at_s": 1.0, "kind": "psu_derate", "shelf": 0, "psu": 0, "value": 2.0},
        {"at_s": 1.0, "kind": "mqtt_stop", "publisher": "nobody"},
        {"at_s": 1.0, "until_s": 0.5, "kind": "valve_stuck"},
    ]
    for f in bad:
        with pytest.raises(ConfigError):
            validate_data(FaultSpec, f, "test")
    with pytest.raises(ConfigError):
        validate_data(Scenario, {"name": "x", "duration_s": 10.0, "load": BASE_LOAD,
                                 "faults": [{"at_s": 10.0, "kind": "valve_stuck"}]}, "t")
    with pytest.raises(ValueError, match="rack model"):
        ScenarioRun(_scenario({"at_s": 1.0, "kind": "cdu_leak", "value": 1.0}), model="cdu")


# --- scenarios -----------------------------------------------------------------------------------

STANDARD = ["load-step", "agentic-bursts", "training-swings", "pump-trip", "valve-stuck", "leak",
            "facility-water-rise", "sensor-dropout", "flapping-link", "rising-crc",
            "overheating-tray", "psu-failure", "healthy-24h"]


def test_standard_set_is_bundled_and_covers_s1_to_s10() -> None:
    by_name = {s.name: s for s in list_scenarios()}
    assert set(STANDARD) <= set(by_name)
    refs = " ".join(s.reference for s in by_name.values())
    for n in range(1, 11):
        assert f"§5 S{n}" in refs
    for s in by_name.values():
        assert s.reference.startswith("REFERENCE §"), s.name


@pytest.mark.parametrize("name", sorted(p.stem for p in (
    Path(__file__).resolve().parents[2] / "config" / "scenarios").glob("*.toml")))
def test_every_bundled_scenario_loads_and_runs(name: str) -> None:
    sc = load_scenario(name)
    r = ScenarioRun(sc)
    until = min(sc.duration_s, 70.0)  # shortened: long scenarios run their first minute
    advance(r, until)
    due = [f for f in sc.faults if f.at_s < until - 1e-9]
    assert len(r.ground_truth) == len(due)
    for g, f in zip(r.ground_truth, sorted(due, key=lambda f: f.at_s), strict=True):
        assert g.start_s == pytest.approx(f.at_s, abs=DT)
    tr = r.plant.truth()
    assert 30.0 < tr.supply_temp_c < 70.0 and tr.rack_power_w > 0.0


def test_old_load_step_runs_the_cdu_model_as_before() -> None:
    # The lock-step path valvey uses is unchanged: load-step stays on CduPlant alone, with
    # the same trace a hand-built CduPlant gives.
    from sims.cdu import CduPlant
    sc = load_scenario("load-step")
    r = ScenarioRun(sc)
    assert r.model == "cdu" and r.rack is None
    p = CduPlant(sc.cdu_params(), seed=sc.seed)
    p.warm_start(39_600.0, supply_setpoint_c=45.0, facility_supply_temp_c=40.0)
    load = sc.load_profile()
    for _ in range(800):
        p.step(load.power_w(p.time_s), 40.0, DT)
        r.step(DT)
    assert r.plant.readings() == p.readings()


def test_rack_sim_list_prints_one_scenario_a_line_name_first() -> None:
    res = CliRunner().invoke(sim_cli, ["list"])
    assert res.exit_code == 0
    lines = res.output.strip().splitlines()
    names = [ln.split("\t")[0] for ln in lines]
    assert names == sorted(s.name for s in list_scenarios())
    assert set(STANDARD) <= set(names)


# --- rows ----------------------------------------------------------------------------------------


def test_row_of_three_racks_on_one_cdu() -> None:
    row = VirtualRow(n_racks=3, seed=1, fabric="off",
                     workloads=[BurnInWorkload(), IdleWorkload(seed=2), BurnInWorkload()])
    assert row.cdu.params.n_racks == 3
    assert row.cdu.params.design_flow_lps == pytest.approx(9.9)
    run(row, 30.0)
    powers = [row.truth(i).it_power_w for i in range(3)]
    assert powers[0] == pytest.approx(132_000.0) and powers[1] < 0.3 * powers[0]
    ct = row.cdu_truth()
    assert ct.rack_power_w == pytest.approx(sum(powers))
    assert len(ct.gpu_tj_c) == 54
    row.racks[1].compute.leaks.set_tray_leak(0, 6.0)
    run(row, 10.0)
    assert row.cdu_truth().inventory_l == pytest.approx(110.0 + 80.0 - 1.0, abs=0.02)


# --- telemetry payloads and schemas --------------------------------------------------------------


def test_sim_schemas_are_not_stale() -> None:
    """Regenerate with ``rackctl schemas --write`` when this fails."""
    assert stale_schemas() == []


def test_stale_schema_is_detected(tmp_path: Path) -> None:
    docs = schema_documents()
    assert len(docs) >= 12  # every sims payload kind has one (12 before contract 1.3's reply)
    assert sorted(p.name for p in write_schemas(tmp_path)) == sorted(docs)
    assert write_schemas(tmp_path) == [] and stale_schemas(tmp_path) == []
    (tmp_path / "sim.telemetry.tray.schema.json").write_text("{}")
    assert stale_schemas(tmp_path) == ["sim.telemetry.tray.schema.json"]


def test_payloads_validate_and_carry_no_nan() -> None:
    vr = VirtualRack(workload=AgenticWorkload(seed=1), seed=1, fabric="on")
    vr.environment.sensors["room_temp_c"].set_fault("drop")
    vr.agents.configure(3, NodeAgentSettings(gpu_power_cap_w=600.0))
    vr.racks[0].compute.leaks.set_tray_leak(2, 20.0)
    run(vr, 5.0)
    ident = Identity(site="lab", row="r1", rack="rk1")
    trays = tray_payloads(vr, ident, 123)
    assert [t for t, _ in trays] == [f"tray{k:02d}" for k in range(18)]
    for _, p in trays:
        TrayTelemetry.model_validate(p)
        encode_json(p)
    t3 = TrayTelemetry.model_validate(trays[3][1])
    assert t3.agent.enforced_gpu_cap_w == 600.0 and all(g.power_w <= 600.0 for g in t3.gpus)
    assert t3.gpus[0].ports is not None and len(t3.gpus[0].ports.names) == 20
    assert t3.gpus[0].ports.names[0] == "gpu12/nvl00"
    bits = t3.gpus[0].ports.counter_bits  # the counters' native widths (sims.fabric)
    assert bits is not None and bits["symbol_error"] == 16 and bits["carrier_changes"] == 32
    assert bits["link_downed"] == 8 and bits["rx_bytes"] == 64
    assert TrayTelemetry.model_validate(trays[2][1]).leak
    env = EnvTelemetry.model_validate(env_payload(vr, ident, 1))
    assert env.room_temp_c is None and env.true_room_temp_c == pytest.approx(24.0)
    RackTelemetry.model_validate(rack_payload(vr, ident, 1))
    PowerTelemetry.model_validate(power_payload(vr, ident, 1))
    NodeAgentsState.model_validate(node_agents_payload(vr))
    for p in (env_payload(vr, ident, 1), rack_payload(vr, ident, 1), power_payload(vr, ident, 1)):
        encode_json(p)  # raises on NaN


def test_encode_readings_sentinel_nan_and_held_points() -> None:
    from rackplane.core.registers import load_register_map
    m = load_register_map("cdu-generic")
    ok, raw, held = encode_readings(
        m,
        {"supply_temp_c": math.nan, "return_temp_c": math.nan, "uptime_s": math.nan,
         "flow_lpm": 99999.0, "supply_temp_b_c": 45.0, "not_a_point": 1.0},
        {"supply_temp_b_c"},
    )
    assert math.isnan(ok["supply_temp_c"])  # a float register serves NaN
    assert raw == {"return_temp_c": [0x8000], "supply_temp_b_c": [0x8000]}
    assert sorted(held) == ["flow_lpm", "uptime_s"]  # NaN without sentinel; out of range


# --- node-agent contract v1: the simulator's truth apart, the command side -------------------


def test_truth_is_published_apart_and_tray_payloads_carry_throttle_reasons() -> None:
    from sims.telemetry import TruthTelemetry, truth_payload

    vr = VirtualRack(workload=BurnInWorkload(), seed=1)
    vr.agents.configure(3, NodeAgentSettings(gpu_power_cap_w=600.0))
    vr.racks[0].thermal.set_conductance_factor(5, 0.5)
    run(vr, 3.0)
    ident = Identity(site="lab", row="r1", rack="rk1")
    truth = TruthTelemetry.model_validate(truth_payload(vr, ident, 7))
    encode_json(truth_payload(vr, ident, 7))
    assert truth.trays[5].cold_plate_conductance_factor == 0.5 and truth.t_s > 0
    assert min(truth.trays[3].gpu_demand_w) > 600.0  # burn-in wants more than the cap
    trays = dict(tray_payloads(vr, ident, 7))
    for g in trays["tray03"]["gpus"]:
        assert "sw_power_cap" in g["throttle_reasons"] and g["power_w"] <= 600.0 + 1e-6
    assert all("sw_power_cap" not in g["throttle_reasons"] for g in trays["tray04"]["gpus"])
    assert "cold_plate_conductance_factor" not in trays["tray05"]


def _cmd(**kw: object) -> dict[str, object]:
    return {"schema_version": "1.0", "trays": [0, 1], "epoch": 100, **kw}


def test_v1_command_caps_expire_at_their_ttl_unless_refreshed() -> None:
    from sims.telemetry import apply_power_limits

    vr = VirtualRack(workload=BurnInWorkload(), seed=1)
    ag = vr.agents
    apply_power_limits(vr, _cmd(power_cap_w=3000.0, ttl_s=5.0, ramp_up_w_per_s=500.0))
    assert ag.settings(0).power_cap_w == 3000.0 and ag.settings(1).ramp_up_w_per_s == 500.0
    run(vr, 3.0)
    st = ag.status(0, vr.truth().gpu_power_w)
    assert st.epoch == 100 and st.cap_expires_in_s == pytest.approx(2.0, abs=0.11)
    apply_power_limits(vr, {**_cmd(power_cap_w=3000.0, ttl_s=5.0), "trays": [0]})  # refresh
    run(vr, 3.0)
    assert ag.settings(0).power_cap_w == 3000.0  # refreshed at 3 s: holds to 8 s
    assert ag.settings(1).power_cap_w is None  # not refreshed: expired at 5 s
    assert ag.settings(1).ramp_up_w_per_s == 500.0  # ramps do not expire
    assert ag.status(1, vr.truth().gpu_power_w).cap_expires_in_s is None
    run(vr, 2.5)
    assert ag.settings(0).power_cap_w is None and ag.expired_caps == 2


def test_v1_command_epochs_release_and_refusals() -> None:
    from rackplane.errors import CommandError
    from sims.telemetry import apply_power_limits

    vr = VirtualRack(workload=BurnInWorkload(), seed=1)
    ag = vr.agents
    apply_power_limits(vr, _cmd(gpu_power_cap_w=700.0, ttl_s=60.0, epoch=200))

    def refused(args: dict[str, object], code: str) -> None:
        before = [ag.settings(k) for k in range(3)]
        with pytest.raises(CommandError) as ei:
            apply_power_limits(vr, args)
        assert ei.value.code == code, ei.value
        assert [ag.settings(k) for k in range(3)] == before  # all or nothing

    refused(_cmd(gpu_power_cap_w=650.0, ttl_s=60.0, epoch=199), "stale_epoch")
    refused({**_cmd(release=["gpu_power_cap_w"], epoch=199), "trays": [1, 2]}, "stale_epoch")
    refused(_cmd(gpu_power_cap_w=None, epoch=200), "wrong_type")  # null is never a value
    refused(_cmd(gpu_power_cap_w=650.0, epoch=200), "invalid_args")  # a cap needs a TTL
    refused(_cmd(gpu_power_cap_w=650.0, ttl_s=60.0, release=["gpu_power_cap_w"], epoch=200),
            "invalid_args")
    refused(_cmd(gpu_power_cap_w=650.0, ttl_s=60.0, epoch=200, schema_version="2.0"),
            "invalid_args")
    refused(_cmd(gpu_power_cap_w=100.0, ttl_s=60.0, epoch=200), "out_of_range")
    refused({**_cmd(ramp_up_w_per_s=10.0), "trays": [0, 99]}, "unknown_tray")
    # the same epoch is not older; a newer one replaces it; release removes the cap
    apply_power_limits(vr, _cmd(release=["gpu_power_cap_w"], epoch=200))
    assert ag.settings(0).gpu_power_cap_w is None and ag.settings(1).gpu_power_cap_w is None
    apply_power_limits(vr, {**_cmd(powered=False, epoch=300), "trays": [2]})
    assert not ag.settings(2).powered
    refused({**_cmd(powered=True, epoch=250), "trays": [2]}, "stale_epoch")
    apply_power_limits(vr, {**_cmd(powered=True, epoch=250), "trays": [0]})  # tray 0: 200 seen
