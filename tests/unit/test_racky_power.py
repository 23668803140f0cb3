"""racky.core.power: the cap allocator (priority classes, headroom redistribution, ramp limits),
sequencing within the inrush limit, reconciliation with the drift alarm, the blast radius, the
rack limit and the agents' smoothing settings."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rackplane.core.samples import Quality, Sample
from racky.config import (
    BlastRadiusSettings,
    NodeAgentsSettings,
    PowerSettings,
    SequencingSettings,
    ShelfPoints,
)
from racky.core.agent_settings import (
    DRIFT_CAUSES,
    DesiredTray,
    DeviceLimits,
    Reconciler,
    Sequencer,
    classify_cap_drift,
    diff_commands,
)
from racky.core.power import (
    BlastRadius,
    CapAllocator,
    RequestedCap,
    TrayPowerView,
    rack_limit,
    read_shelves,
    smoothing,
)
from racky.core.telemetry import AgentReading, TrayReading

AG = NodeAgentsSettings(trays=4)


def view(demand: list[float], rank: list[int] | None = None) -> TrayPowerView:
    n = len(demand)
    d = np.asarray(demand, dtype=float)
    return TrayPowerView(powered=np.ones(n, dtype=bool), power_w=d.copy(), demand_w=d,
                         enforced_w=np.full(n, np.nan), fresh=np.ones(n, dtype=bool),
                         rank=np.asarray(rank or [2] * n))


def settle(alloc: CapAllocator, limit: float, v: TrayPowerView, ticks: int = 60) -> np.ndarray:
    """Allocate for ``ticks`` ticks with agents that obey (enforced = the caps sent)."""
    caps = alloc.allocate(limit, 0.0, v, None, 1.0)
    for _ in range(ticks):
        v.enforced_w[:] = caps
        caps = alloc.allocate(limit, 0.0, v, float(np.nansum(np.minimum(caps, v.demand_w))),
                              1.0)
    return caps


def test_caps_sum_within_the_budget_less_its_margin_and_no_caps_when_it_cannot_bind() -> None:
    cfg = PowerSettings(budget_margin_pct=1.0, cap_ramp_down_w_per_s=1e6)
    alloc = CapAllocator(cfg, AG)
    mx = alloc.tray_max_w
    assert np.isnan(alloc.allocate(4 * mx + 1000.0, 0.0, view([mx] * 4), None, 1.0)).all()
    caps = settle(alloc, 20_000.0, view([mx] * 4))
    assert caps.sum() <= 20_000.0 * 0.99 + 1.0
    assert caps.sum() >= 20_000.0 * 0.99 - 4 * cfg.cap_deadband_w
    assert np.ptp(caps) <= 1.0  # equal demand, equal class: equal caps


def test_priority_classes_high_class_served_first_low_class_capped_hardest() -> None:
    cfg = PowerSettings(cap_ramp_down_w_per_s=1e6, tray_classes={"0": "high", "3": "low"})
    alloc = CapAllocator(cfg, AG)
    mx = alloc.tray_max_w
    ranks = [cfg.classes[cfg.tray_classes.get(str(k), cfg.default_class)] for k in range(4)]
    caps = settle(alloc, 18_000.0, view([mx] * 4, ranks))
    assert caps[0] == pytest.approx(mx, abs=1.0)  # high: its full demand (+ headroom, ≤ max)
    assert caps[3] == pytest.approx(alloc.tray_min_w, abs=1.0)  # low: only its minimum left
    assert caps[1] == pytest.approx(caps[2], abs=1.0) and caps[3] < caps[1] < caps[0]


def test_headroom_of_a_light_tray_is_redistributed_to_the_busy_ones() -> None:
    cfg = PowerSettings(cap_ramp_down_w_per_s=1e6, headroom_pct=10.0)
    alloc = CapAllocator(cfg, AG)
    mx = alloc.tray_max_w
    light = 1500.0
    caps = settle(alloc, 20_000.0, view([light, mx, mx, mx]))
    assert caps[0] == pytest.approx(light * 1.1, abs=30.0)  # demand + headroom, no more
    busy = (20_000.0 * 0.99 - caps[0]) / 3
    np.testing.assert_allclose(caps[1:], busy, atol=30.0)  # the light tray's share went here
    assert caps[1:].min() > 20_000.0 * 0.99 / 4


def test_cap_rise_is_ramp_limited_and_a_fall_is_immediate_when_over_the_limit() -> None:
    cfg = PowerSettings(cap_ramp_up_w_per_s=500.0, cap_ramp_down_w_per_s=1e6)
    alloc = CapAllocator(cfg, AG)
    mx = alloc.tray_max_w
    v = view([mx] * 4)
    low = settle(alloc, 12_000.0, v)
    v.enforced_w[:] = low
    up = alloc.allocate(24_000.0, 0.0, v, float(low.sum()), 1.0)
    assert (up - low).max() <= 500.0 + 1.0
    assert (up > low).all()
    down = alloc.allocate(10_000.0, 0.0, v, 11_000.0, 1.0)  # over the limit: at once
    assert down.sum() <= 10_000.0 * 0.99 + 1.0


def test_a_fall_below_a_hard_limit_is_immediate_even_under_the_limit_and_short_dt() -> None:
    """Fleet mode (``hard_limit_w``: rlc's lease bounds what the trays may draw): while the
    caps exceed it, a fall goes out at once, whatever dt (a tick run early) and though the
    rack draws less than the limit; without it the fall is ramp-limited by dt."""
    cfg = PowerSettings(cap_ramp_down_w_per_s=2000.0)
    mx = CapAllocator(cfg, AG).tray_max_w
    caps_at: dict[str, np.ndarray] = {}
    for hard in (False, True):
        alloc = CapAllocator(cfg, AG)
        v = view([mx] * 4)
        v.power_w[:] = 2000.0  # the rack draws 8 kW: under every limit below
        high = settle(alloc, 24_000.0, v)
        v.enforced_w[:] = high
        caps_at[str(hard)] = alloc.allocate(14_000.0, 0.0, v, 8_000.0, 0.05,
                                            hard_limit_w=14_000.0 if hard else None)
    ramped, at_once = caps_at["False"], caps_at["True"]
    assert at_once.sum() <= 14_000.0 * 0.99 + 1.0
    np.testing.assert_allclose(ramped, high - 2000.0 * 0.05, atol=1.0)  # 100 W in 0.05 s


def test_the_demand_peak_hold_is_a_time_window_whatever_the_ticks() -> None:
    """A tick run early adds an entry; the peak is still held ``demand_hold_s``, no shorter
    (and no longer: gone once older)."""
    from racky.core.telemetry import TrayTable

    alloc = CapAllocator(PowerSettings(demand_hold_s=3.0), AG)

    def table(w: float, now: float) -> TrayTable:
        r = _reading(None, now)
        base = {f: getattr(r, f) for f in r.__slots__}
        return TrayTable.build({k: TrayReading(**{**base, "tray": k, "power_w": w,
                                                  "gpu_index": np.arange(4 * k, 4 * k + 4)})
                                for k in range(4)}, 4, 4, now, 5.0)

    assert alloc.demand(table(5000.0, 10.0), 10.0)[0] == pytest.approx(5000.0)
    for now in (10.5, 10.55, 10.6, 11.0, 12.0, 13.0):  # early ticks at 10.5-10.6
        assert alloc.demand(table(1000.0, now), now)[0] == pytest.approx(5000.0), now
    assert alloc.demand(table(1000.0, 14.0), 14.0)[0] == pytest.approx(1000.0)


def test_budget_below_the_trays_minimum_is_infeasible() -> None:
    alloc = CapAllocator(PowerSettings(), AG)
    alloc.allocate(2 * alloc.tray_min_w, 0.0, view([5000.0] * 4), None, 1.0)
    assert alloc.infeasible


def test_sequencer_staggers_switching_within_the_inrush_limit() -> None:
    seq = Sequencer(SequencingSettings(inrush_limit_w=21_000.0, tray_inrush_w=7_000.0,
                                       stagger_s=2.0), 18)
    seq.request(list(range(8)), True)
    got: list[tuple[float, int]] = []
    t = 0.0
    while seq.pending and t < 100:
        got += [(t, k) for k, _ in seq.step(t)]
        t += 1.0
    assert [k for _, k in got] == list(range(8))
    for t0 in {t for t, _ in got}:  # never more than 3 trays (21 kW) within 2 s
        assert sum(1 for t, _ in got if t0 <= t < t0 + 2.0) <= 3


def _reading(cap: float | None, t: float) -> TrayReading:
    nan = float("nan")
    agent = AgentReading(
        enforced_gpu_cap_w=nan, enforced_tray_cap_w=cap if cap is not None else nan,
        floor_w=0.0, power_cap_w=cap, gpu_power_cap_w=None, power_floor_pct=0.0,
        ramp_up_w_per_s=None, ramp_down_w_per_s=None, ramp_down_hysteresis_s=0.0,
        capping=False, flooring=False, ramp_limited=False)
    g = np.zeros(4)
    return TrayReading(
        tray=0, t_mono=t, powered=True, power_w=4000.0, coolant_out_temp_c=50.0, leak=False,
        leak_sensor_fault=False, agent=agent, gpu_index=np.arange(4), gpu_power_w=g,
        gpu_demand_w=g, gpu_temp_c=g, gpu_t_limit_c=g, gpu_throttled=np.zeros(4, dtype=bool),
        gpu_shut_down=np.zeros(4, dtype=bool), gpu_traffic=g, gpu_uptime_s=g,
        gpu_boot_id=np.zeros(4, dtype=np.uint64))


def test_reconciler_reasserts_a_drifted_cap_and_alarms_naming_the_tray() -> None:
    cfg = PowerSettings(reconcile_confirm_s=3.0, drift_alarm_s=15.0)
    rec = Reconciler(cfg, 1)
    want = [DesiredTray(power_cap_w=5000.0)]
    rec.note_sent([0], 0.0)
    resends: list[float] = []
    drift_at = None
    for i in range(1, 30):
        t = float(i)
        resend, drift = rec.step(t, want, {0: _reading(6000.0, t)}, np.ones(1, dtype=bool))
        if resend:
            resends.append(t)
            rec.note_reasserted(resend, t)  # as the core does: the drift keeps its age
        if drift and drift_at is None:
            drift_at = t
            assert "tray cap" in drift[0] and "5000" in drift[0] and "6000" in drift[0]
    assert resends[:2] == [4.0, 7.0]  # mismatch first seen at 1 s, 3 s to confirm, then again
    assert drift_at == 16.0
    rec2 = Reconciler(cfg, 1)
    assert rec2.step(1.0, want, {0: _reading(5010.0, 1.0)}, np.ones(1, dtype=bool)) == ([], {})


def test_blast_radius_bounds_actions_per_window() -> None:
    br = BlastRadius(BlastRadiusSettings(max_actions=3, window_s=600.0))
    assert br.allow(0.0, 2) and br.allow(10.0)
    assert not br.allow(20.0)
    assert br.refused == 1
    assert br.allow(601.0)


def test_rack_limit_takes_the_lowest_part_and_names_it() -> None:
    req = {"valvey": RequestedCap("valvey", 90_000.0, 100.0, "overheat")}
    lim = rack_limit(120_000.0, 126_000.0, None, req)
    assert (lim.limit_w, lim.source) == (90_000.0, "requested:valvey")
    assert rack_limit(None, None, None, {}).limit_w is None


def test_grid_ramp_is_split_over_every_gpu_of_the_rack() -> None:
    ag = NodeAgentsSettings()
    s = smoothing(PowerSettings(rack_ramp_w_per_s=20_000.0), ag, ag.other_share)
    assert s.ramp_up_w_per_s is not None
    rack_dc = s.ramp_up_w_per_s * ag.trays * ag.gpus_per_tray * (1 + ag.other_share)
    assert rack_dc == pytest.approx(20_000.0 * 0.975, rel=1e-3)


def test_diff_commands_groups_trays_with_the_same_change() -> None:
    old = [DesiredTray(power_cap_w=5000.0)] * 3
    new = [DesiredTray(power_cap_w=4000.0), DesiredTray(power_cap_w=4000.0),
           DesiredTray(power_cap_w=5000.0)]
    cmds = diff_commands(old, new, "budget")
    assert len(cmds) == 1 and cmds[0].trays == (0, 1) and cmds[0].args == {"power_cap_w": 4000.0}
    assert len(diff_commands([None] * 3, new, "start")) == 2


def _shelf(pts: ShelfPoints, t: float, output_w: float | None, **extra: float) -> dict[str, Sample]:
    vals = {pts.output_power: output_w, pts.input_power: None, **extra}
    return {p: Sample(p, v, "W", 0, t, Quality.GOOD if v is not None else Quality.BAD,
                      None if v is not None else "timeout") for p, v in vals.items()}


def test_an_offline_shelf_never_counts_as_zero_watts_in_the_rack_load() -> None:
    """Two shelves without a rack-load register, one offline (timeout): the other's output is
    half the rack. Taken as the rack's load it would understate it (the rack looks under its
    limit, the non-tray estimate falls, caps rise); the load is unknown instead, and the
    published sum says how many shelves it covers."""
    pts = ShelfPoints()
    both = {"shelf1": _shelf(pts, 10.0, 60_000.0), "shelf2": _shelf(pts, 10.0, 61_000.0)}
    v = read_shelves(both, pts, 10.0, 3.0)
    assert v.load_w == 121_000.0
    one = {"shelf1": _shelf(pts, 10.0, 60_000.0), "shelf2": _shelf(pts, 10.0, None)}
    v = read_shelves(one, pts, 10.0, 3.0)
    assert v.load_w is None and v.offline == ["shelf2"]
    assert v.rack_power_w == 60_000.0 and (v.shelves_reporting, v.shelves_configured) == (1, 2)
    # a stale sample (older than stale_after_s) is offline too
    old = {"shelf1": _shelf(pts, 10.0, 60_000.0), "shelf2": _shelf(pts, 5.0, 61_000.0)}
    assert read_shelves(old, pts, 10.0, 3.0).load_w is None
    # with the rack-load register (any shelf reports the whole rack) the load stays known
    rl = {"shelf1": _shelf(pts, 10.0, 60_000.0, **{pts.rack_load: 121_500.0}),
          "shelf2": _shelf(pts, 10.0, None)}
    assert read_shelves(rl, pts, 10.0, 3.0).load_w == 121_500.0


def test_a_derate_table_whose_power_rises_with_the_water_is_refused() -> None:
    """P_max(T_fws) must fall as the facility water warms: a table typed the wrong way round
    would raise the cap exactly when the water gets hot."""
    from pydantic import ValidationError

    from racky.config import DerateSettings

    with pytest.raises(ValidationError, match="must not rise"):
        DerateSettings(table=[(40.0, 100_000.0), (44.0, 200_000.0)])
    with pytest.raises(ValidationError, match="finite"):
        DerateSettings(table=[(40.0, float("inf")), (44.0, 50_000.0)])
    assert DerateSettings(table=[(40.0, 200_000.0), (44.0, 200_000.0)]).table


def test_rack_power_for_valvey_is_unknown_while_a_shelf_is_offline() -> None:
    """``state/rack_power`` feeds valvey's feedforward: with a shelf offline the partial sum
    (half the rack) is published as unknown, never as the rack's power."""
    from racky.config import RackyConfig
    from racky.core.controller import RackyCore, RackyInputs
    from racky.core.lifecycle import Lifecycle, PersistedState

    pts = ShelfPoints()
    core = RackyCore(RackyConfig(), 0.0, PersistedState(Lifecycle("production")))
    both = {"shelf1": _shelf(pts, 1.0, 60_000.0), "shelf2": _shelf(pts, 1.0, 61_000.0)}
    core.step(1.0, RackyInputs(both, {}, None, None), 1)
    assert core.rack_power_payload(1)["rack_power_w"] == 121_000.0
    one = {"shelf1": _shelf(pts, 2.0, 60_000.0), "shelf2": _shelf(pts, 2.0, None)}
    core.step(2.0, RackyInputs(one, {}, None, None), 2)
    pay = core.rack_power_payload(2)
    assert pay["rack_power_w"] is None
    assert (pay["shelves_reporting"], pay["shelves_configured"]) == (1, 2)


def test_rack_power_publishes_the_shelves_ac_input_only_when_every_shelf_reports_it() -> None:
    """``state/rack_power.rack_input_w``: the shelves' AC input, what rlc's leases and a
    row's feed limit are on (the demo's row item compares it with the row limit); a shelf
    without its input reading leaves it unknown, never a partial sum."""
    from racky.commands import RackPowerState
    from racky.config import RackyConfig
    from racky.core.controller import RackyCore, RackyInputs
    from racky.core.lifecycle import Lifecycle, PersistedState

    pts = ShelfPoints()
    core = RackyCore(RackyConfig(), 0.0, PersistedState(Lifecycle("production")))
    both = {"shelf1": _shelf(pts, 1.0, 60_000.0, **{pts.input_power: 61_500.0}),
            "shelf2": _shelf(pts, 1.0, 61_000.0, **{pts.input_power: 62_600.0})}
    core.step(1.0, RackyInputs(both, {}, None, None), 1)
    pay = core.rack_power_payload(1)
    assert (pay["rack_power_w"], pay["rack_input_w"]) == (121_000.0, 124_100.0)
    RackPowerState.model_validate(pay)
    one_in = {"shelf1": _shelf(pts, 2.0, 60_000.0, **{pts.input_power: 61_500.0}),
              "shelf2": _shelf(pts, 2.0, 61_000.0)}
    core.step(2.0, RackyInputs(one_in, {}, None, None), 2)
    pay = core.rack_power_payload(2)
    assert pay["rack_power_w"] == 121_000.0 and pay["rack_input_w"] is None


# --- node-agent contract v1: the command on the wire, the caps' TTL refresh --------------------


def test_wire_args_are_contract_v1_never_null_with_a_ttl_on_caps() -> None:
    from racky.core.agent_settings import CAP_TTL_S, AgentCommand
    from sims.telemetry import SetPowerLimitsArgs

    new = [DesiredTray(power_cap_w=4000.0, ramp_up_w_per_s=50.0), DesiredTray()]
    old = [DesiredTray(), DesiredTray(power_cap_w=5000.0, gpu_power_cap_w=800.0,
                                      ramp_up_w_per_s=50.0)]
    cmds = diff_commands(old, new, "budget")
    wires = {c.trays: c.wire_args(1_800_000_000_000) for c in cmds}
    assert wires[(0,)] == {"schema_version": "1.3", "trays": [0], "epoch": 1_800_000_000_000,
                           "power_cap_w": 4000.0, "ramp_up_w_per_s": 50.0, "ttl_s": CAP_TTL_S}
    assert wires[(1,)] == {"schema_version": "1.3", "trays": [1], "epoch": 1_800_000_000_000,
                           "release": ["power_cap_w", "gpu_power_cap_w", "ramp_up_w_per_s"]}
    for w in wires.values():
        assert None not in w.values()
        SetPowerLimitsArgs.model_validate(w, strict=True)  # what the agents accept
    full = diff_commands([None], [DesiredTray(powered=False)], "leak")[0].wire_args(7)
    assert full["powered"] is False and "ttl_s" not in full
    assert sorted(full["release"]) == sorted(["power_cap_w", "gpu_power_cap_w",
                                              "ramp_up_w_per_s", "ramp_down_w_per_s"])
    with pytest.raises(ValueError, match="power_floor_pct"):
        AgentCommand((0,), {"power_floor_pct": None}, "x").wire_args(1)


def test_wire_args_applied_by_a_simulated_agent_hold_the_desired_settings() -> None:
    from sims.row import VirtualRack
    from sims.telemetry import apply_power_limits
    from sims.workloads import BurnInWorkload

    vr = VirtualRack(workload=BurnInWorkload(), seed=1)
    want = [DesiredTray(power_cap_w=4000.0, power_floor_pct=20.0, ramp_down_w_per_s=30.0),
            DesiredTray(gpu_power_cap_w=700.0, ramp_down_hysteresis_s=2.0)]
    for c in diff_commands([None, None], want, "start"):
        apply_power_limits(vr, c.wire_args(3))
    for k, d in enumerate(want):
        s = vr.agents.settings(k)
        assert (s.power_cap_w, s.gpu_power_cap_w, s.power_floor_pct, s.ramp_up_w_per_s,
                s.ramp_down_w_per_s, s.ramp_down_hysteresis_s, s.powered) == (
            d.power_cap_w, d.gpu_power_cap_w, d.power_floor_pct, d.ramp_up_w_per_s,
            d.ramp_down_w_per_s, d.ramp_down_hysteresis_s, d.powered)


def test_reconciler_refreshes_capped_trays_before_their_ttl() -> None:
    from racky.core.agent_settings import CAP_REFRESH_S, CAP_TTL_S

    assert CAP_REFRESH_S * 3 <= CAP_TTL_S
    rec = Reconciler(PowerSettings(), 2)
    want = [DesiredTray(power_cap_w=5000.0), DesiredTray()]
    rec.note_sent([0, 1], 0.0)
    due: list[float] = []
    for i in range(1, 70):
        t = float(i)
        readings = {0: _reading(5000.0, t), 1: _reading(None, t)}
        resend, drift = rec.step(t, want, readings, np.ones(2, dtype=bool))
        assert not drift and 1 not in resend  # holding what racky wants; no cap: no TTL
        if resend:
            due.append(t)
            rec.note_reasserted(resend, t)
    assert due == [20.0, 40.0, 60.0] and rec.refreshes == 3 and rec.reasserts == 0


def test_a_power_capped_tray_is_estimated_above_its_power_so_its_cap_can_rise() -> None:
    from racky.core.telemetry import TrayTable, infer_gpu_demand_w

    alloc = CapAllocator(PowerSettings(), AG)
    readings = {}
    for k in range(4):
        r = _reading(4000.0, 1.0)
        power = np.full(4, 900.0)
        capped = np.full(4, k == 0)  # tray 0 held at its 900 W GPU cap, the others not
        demand = infer_gpu_demand_w(power, 900.0, capped)
        readings[k] = TrayReading(**{**{f: getattr(r, f) for f in r.__slots__},
                                     "tray": k, "gpu_power_w": power, "gpu_demand_w": demand,
                                     "gpu_index": np.arange(4 * k, 4 * k + 4),
                                     "gpu_power_capped": capped})
    t = TrayTable.build(readings, 4, 4, 1.0, 5.0)
    d = alloc.demand(t, 1.0)
    assert d[0] > 4000.0 * 1.09 and d[1] == pytest.approx(4000.0)


# --- cap drift: classified, alarmed when it recurs (issue 14 item 14) -----------------------

LIM = DeviceLimits(gpu_min_w=200.0, gpu_default_w=1200.0, gpu_max_w=1200.0,
                   tray_min_w=1190.0, tray_default_w=7133.0, tray_max_w=7133.0)


def _agent(held: float | None, enforced: float, gpu_held: float | None = None,
           gpu_enforced: float = float("nan")) -> Any:
    return AgentReading(
        enforced_gpu_cap_w=gpu_enforced, enforced_tray_cap_w=enforced, floor_w=0.0,
        power_cap_w=held, gpu_power_cap_w=gpu_held, power_floor_pct=0.0, ramp_up_w_per_s=None,
        ramp_down_w_per_s=None, ramp_down_hysteresis_s=0.0, capping=False, flooring=False,
        ramp_limited=False)


@pytest.mark.parametrize(("want", "agent", "cause", "held"), [
    # another value set: another writer
    (DesiredTray(power_cap_w=5000.0), _agent(6200.0, 6200.0), "other_writer", 6200.0),
    (DesiredTray(power_cap_w=5000.0), _agent(3000.0, 3000.0), "other_writer", 3000.0),
    # no cap set, or the default limit set / in force: reverted to default
    (DesiredTray(power_cap_w=5000.0), _agent(None, 7133.0), "reverted_to_default", None),
    (DesiredTray(power_cap_w=5000.0), _agent(7133.0, 7133.0), "reverted_to_default", 7133.0),
    (DesiredTray(power_cap_w=5000.0), _agent(5000.0, 7130.0), "reverted_to_default", 7130.0),
    # a device limit the commanded value lies beyond, or ours set and another in force
    (DesiredTray(power_cap_w=1000.0), _agent(1190.0, 1190.0), "clamped_to_device_limit",
     1190.0),
    (DesiredTray(power_cap_w=5000.0), _agent(5000.0, 5600.0), "clamped_to_device_limit",
     5600.0),
    # the per-GPU cap (thermal protection) the same way
    (DesiredTray(gpu_power_cap_w=600.0), _agent(None, 7133.0, None, 1200.0),
     "reverted_to_default", None),
    (DesiredTray(gpu_power_cap_w=150.0), _agent(None, 7133.0, 200.0, 200.0),
     "clamped_to_device_limit", 200.0),
    (DesiredTray(gpu_power_cap_w=600.0), _agent(None, 7133.0, 800.0, 800.0), "other_writer",
     800.0),
])
def test_a_cap_drift_is_classified_from_what_the_agent_reports(
        want: DesiredTray, agent: Any, cause: str, held: float | None) -> None:
    cd = classify_cap_drift(want, agent, LIM, 25.0)
    assert cd is not None and cd.cause == cause and cd.enforced_w == held
    text = cd.describe()
    assert cause in text and f"desired {cd.commanded_w:.0f} W (racky's command)" in text
    assert DRIFT_CAUSES[cause] in text


def test_caps_held_or_a_lower_cap_in_force_are_no_drift() -> None:
    assert classify_cap_drift(DesiredTray(power_cap_w=5000.0), _agent(5010.0, 5010.0), LIM,
                              25.0) is None
    assert classify_cap_drift(DesiredTray(power_cap_w=5000.0), _agent(5000.0, 4000.0), LIM,
                              25.0) is None  # a GPU cap of racky's binds below it
    assert classify_cap_drift(DesiredTray(), _agent(6000.0, 6000.0), LIM, 25.0) is None


def _run_other_writer(rec: Reconciler, period_s: float, until_s: float, stop_s: float,
                      value: float = 6200.0) -> list[tuple[float, dict[int, str]]]:
    """Tray 0: racky wants 5000 W; every ``period_s`` another writer sets ``value`` and the
    agent takes racky's re-assert back at once (so no drift lasts drift_alarm_s)."""
    want = [DesiredTray(power_cap_w=5000.0)]
    held = 5000.0
    out = []
    t = 0.0
    rec.note_sent([0], 0.0)
    while t < until_s:
        t += 1.0
        if t % period_s == 0 and t <= stop_s:
            held = value
        resend, drift = rec.step(t, want, {0: _reading(held, t)}, np.ones(1, dtype=bool))
        if resend:
            rec.note_reasserted(resend, t)
            held = 5000.0  # the agent applies the re-assert
        out.append((t, drift))
    return out


def test_a_recurring_cap_drift_alarms_naming_tray_values_and_cause() -> None:
    cfg = PowerSettings(reconcile_confirm_s=3.0, drift_alarm_s=15.0, drift_recur_count=3,
                        drift_recur_window_s=600.0)
    rec = Reconciler(cfg, 1, LIM)
    steps = _run_other_writer(rec, period_s=60.0, until_s=1500.0, stop_s=840.0)
    raised = [(t, d[0]) for t, d in steps if 0 in d]
    assert raised, "a cap another writer keeps changing must alarm"
    t0, text = raised[0]
    assert 180.0 <= t0 <= 190.0  # the third episode (60, 120, 180 s + the confirm time)
    assert "other_writer" in text and "desired 5000 W" in text and "6200 W" in text
    assert "re-asserted 3 times within 600 s" in text
    assert rec.drift_episodes >= 3
    # held while the writer goes on; it stops (last change at 840 s): the alarm clears once
    # the window holds fewer than 3 (after 720 + 3 + 600 s)
    assert all(0 in d for t, d in steps if 190.0 <= t <= 1300.0)
    cleared = [t for t, d in steps if t > 190.0 and 0 not in d]
    assert cleared and 1320.0 <= cleared[0] <= 1330.0
    assert all(0 not in d for t, d in steps if t >= cleared[0])


def test_a_rare_cap_drift_does_not_alarm_and_the_count_is_configurable() -> None:
    cfg = PowerSettings(reconcile_confirm_s=3.0, drift_alarm_s=15.0, drift_recur_count=3,
                        drift_recur_window_s=600.0)
    steps = _run_other_writer(Reconciler(cfg, 1, LIM), period_s=400.0, until_s=1300.0,
                              stop_s=1300.0)
    assert not any(0 in d for _t, d in steps)  # never 3 within 600 s
    cfg2 = cfg.model_copy(update={"drift_recur_count": 2})
    steps = _run_other_writer(Reconciler(cfg2, 1, LIM), period_s=400.0, until_s=1300.0,
                              stop_s=1300.0)
    assert any(0 in d for _t, d in steps)


def test_a_tick_run_early_adds_no_sample_to_the_thermal_slope_fit() -> None:
    """The die's rate of rise is fitted over samples a nominal tick apart: a tick run early
    (a fleet decrease) evaluates it without a sample 0.05 s after the last, whose reading's
    jitter would be extrapolated over the plate's time constant; the next regular tick
    samples again."""
    from racky.config import RackyConfig
    from racky.core.thermal import ThermalInputs, ThermalWatch

    cfg = RackyConfig()
    a = AG

    def slopes(gap_s: float) -> list[float]:
        tw = ThermalWatch(cfg.thermal, cfg.cooling, a.trays, a.gpus_per_tray, a.gpu_tgp_w,
                          a.gpu_min_power_limit_w, slope_gap_s=gap_s)
        n = a.trays * a.gpus_per_tray
        out = []
        for now, tj in ((0.0, 60.0), (1.0, 60.1), (2.0, 60.2), (2.05, 61.0), (3.05, 60.3)):
            x = ThermalInputs(np.full(n, tj), np.full(n, 30.0), np.full(n, 800.0),
                              np.zeros(n, dtype=bool), np.ones(n, dtype=bool),
                              np.full(a.trays, 45.0), np.ones(a.trays, dtype=bool), {}, None)
            out.append(tw.step(now, x).max_slope_k_per_s)
        return out

    gapped, every = slopes(0.5), slopes(0.0)
    assert gapped[3] == pytest.approx(0.1)  # the early tick: the fit of 0, 1, 2 s
    assert every[3] > 4 * 0.1  # sampled: 0.8 K of jitter 0.05 s later: 5x the true slope
    assert gapped[4] == pytest.approx(np.polyfit([1.0, 2.0, 3.05], [60.1, 60.2, 60.3], 1)[0])


def test_non_tray_estimate_ignores_a_skewed_tick_at_a_load_step_and_follows_a_real_change() -> None:
    """Shelves and trays are read at different instants: at a 132 -> 40 kW step one tick's
    shelves-minus-trays is the step (92 kW). The estimate must not move on one or two such
    ticks (the plain average moved ~17 kW and capped every tray under a 140 kW budget), and
    must follow a real, lasting change."""
    from racky.core.power import NonTrayEstimate

    est = NonTrayEstimate(4_000.0)
    for _ in range(10):
        est.update(4_000.0)
    for spike in (92_000.0, 60_000.0):  # two skewed ticks in a row
        est.update(spike)
    assert est.value_w == pytest.approx(4_000.0)
    for _ in range(3):
        est.update(4_000.0)
    assert est.value_w == pytest.approx(4_000.0)
    # a real change (a switch powered on: +3 kW for good) is followed
    for _ in range(30):
        est.update(7_000.0)
    assert est.value_w == pytest.approx(7_000.0, abs=50.0)
    # a tick run early moves it as much less, never past the measurement
    est2 = NonTrayEstimate(0.0, window=1)
    est2.update(1_000.0, ticks=0.25)
    assert 0.0 < est2.value_w < 0.2 * 1_000.0
    with pytest.raises(ValueError):
        NonTrayEstimate(0.0, alpha=0.0)
