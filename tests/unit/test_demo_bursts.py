"""The demo row's burst rack (issue 20 item 1): its bundled scenario
(config/scenarios/demo-agentic-bursts.toml), its place in the row (`plan_racks`), and its
checklist item and summary computed from recorded data, fed through the demo's own `Recorder`
as MQTT messages."""

from __future__ import annotations

import itertools
import json
import math
import statistics
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from harness.demo import Recorder
from harness.demo.bursts import BURSTS_FROM_S, burst_figures, burst_window
from harness.demo.checklist import checklist
from harness.demo.racks import ROW_LOADS, plan_racks, rack_scenarios
from harness.demo.summary import DemoSummary, print_summary, summarise, summary_markdown
from rackplane.core.topics import Message
from sims.scenario import ScenarioRun, load_scenario

STEP = load_scenario("demo-load-step")
BURSTS = load_scenario("demo-agentic-bursts")
BASE = "rackplane/lab/r13"
MONO0 = 1000.0
"""Monotonic time at plant t = 0 in these recordings, s."""
SP_C = 45.0


def test_the_burst_scenario_is_s2_on_the_demo_s_rack_and_timing() -> None:
    assert ROW_LOADS[STEP.name] == BURSTS.name
    assert BURSTS.reference == "REFERENCE §5 S2" and BURSTS.load.kind == "agentic"
    # the row's racks run together on the same plant: same length, same rack and CDU
    assert BURSTS.duration_s == STEP.duration_s == 170.0
    assert BURSTS.plant == STEP.plant and BURSTS.plant.model == "rack"
    # its own fault is the one the row deals its second rack
    assert BURSTS.faults == [STEP.faults[1]] and BURSTS.faults[0].kind == "pump_trip"
    assert burst_window(BURSTS, 170.0)[:2] == (BURSTS_FROM_S, 140.0)


def test_the_burst_scenario_draws_bursts_with_a_spike_inside_the_scored_window() -> None:
    """What the file's comment says of seed 54 on the virtual rack: bursts between about 50
    and 120 kW with a demand spike (a rise of tens of kW in a second) inside t = 40-140 s,
    never above the rack's 132 kW (racky's 140 kW budget never caps it)."""
    run = ScenarioRun(BURSTS.model_copy(update={"faults": []}))
    pts: list[tuple[float, float]] = []
    k = 0
    while run.t_s < BURSTS.duration_s - 1e-9:
        if k % 10 == 0:
            run.plant.write("heartbeat", (k // 10) % 65536)
            pts.append((run.t_s, run.plant.truth().rack_power_w))
        run.step(0.1)
        k += 1
    w = [p for t, p in pts if 40.0 <= t <= 140.0]
    q = statistics.quantiles(w, n=20, method="inclusive")
    assert q[0] < 60_000.0 and q[18] > 110_000.0, (q[0], q[18])
    assert max(b - a for a, b in itertools.pairwise(w)) > 50_000.0
    assert max(p for _, p in pts) <= BURSTS.plant.rack_max_power_w + 1.0


def test_in_the_demo_s_row_every_second_rack_runs_the_bursts_with_its_share_of_the_faults(
        tmp_path: Path) -> None:
    racks = plan_racks(4, STEP.name, STEP, tmp_path, 140_000.0)
    assert [r.scenario.load.kind for r in racks] == ["step", "agentic", "step", "agentic"]
    assert [r.scenario.seed for r in racks] == [STEP.seed, BURSTS.seed, STEP.seed + 2,
                                                BURSTS.seed + 1]
    assert [[f.kind for f in r.scenario.faults] for r in racks] == [
        ["link_flap"], ["pump_trip"], [], []]
    r13 = racks[1]
    assert r13.name == "r13" and r13.scenario.name == BURSTS.name
    keep = {"faults", "description"}  # the file the simulator runs: the bundled one
    assert r13.scenario.model_dump(exclude=keep) == BURSTS.model_dump(exclude=keep)
    assert "rack r13's scripted faults: pump_trip pump0 at t=140 s" in r13.scenario.description
    # a row of another scenario runs it on every rack
    other = load_scenario("load-step")
    assert {s.load.kind for s in rack_scenarios(other, 3)} == {"step"}
    with pytest.raises(ValueError):
        rack_scenarios(STEP, 1)


def _feed(rec: Recorder, t_s: float, topic: str, payload: Any) -> None:
    rec.on_message(Message(f"{BASE}/{topic}", json.dumps(payload).encode(),
                           received_mono=MONO0 + t_s))


def _recording(err_k: Any, end_s: float = 170.0) -> Recorder:
    """A burst rack's run: valvey's PV at SP + ``err_k(t)`` once a second, the plant truth at
    80 % of that error; the rack load bursting between 50 and 120 kW; the valve command
    following the load; the pump trip at 140 s upsets everything after it by 1.5 K."""
    rec = Recorder()
    t = 0.0
    while t <= end_s + 1e-9:
        e = err_k(t) + (1.5 if t > 140.0 else 0.0)
        load_w = 120_000.0 if int(t) % 10 < 6 else 50_000.0
        valve = 30.0 + load_w / 4000.0
        _feed(rec, t, "sim/telemetry/plant", {
            "t_s": t, "supply_temp_c": SP_C + 0.8 * e, "rack_power_w": load_w,
            "valve_command_pct": valve, "valve_position_pct": valve})
        _feed(rec, t + 0.2, "valvey/state/supply_loop", {
            "supply_temp_c": SP_C + e, "setpoint_c": SP_C, "valve_command_pct": valve,
            "mode": "auto"})
        t += 1.0
    return rec


def _burst_item(rec: Recorder, end_t: float = 170.0) -> Any:
    b = burst_figures(BURSTS, rec, end_t)
    items = checklist(BURSTS, rec, summarise(BURSTS, rec, end_t), end_t, bursts=b)
    assert not any(c.label.startswith(("whole run", "load step")) for c in items)
    (item,) = [c for c in items if c.label.startswith("agentic bursts held")]
    return item, b


def test_bursts_held_is_checked_from_valvey_s_pv_over_a_window_the_pump_trip_ends() -> None:
    rec = _recording(lambda t: 0.12 * math.sin(t / 3.0))
    item, b = _burst_item(rec)
    assert item.ok, item.line()
    assert item.label == ("agentic bursts held: supply RMS error <= 0.15 K and max |error| <= "
                          "0.5 K over t = 40-140 s")
    pv, tr = b["valvey_pv"], b["plant_truth"]
    # the pump trip's 1.5 K upset from t = 140 s is outside the window: the figures are the
    # bursts' alone (0.12 K amplitude: RMS 0.12/√2)
    assert pv["max_abs_error_k"] == pytest.approx(0.12, abs=0.002)
    assert pv["rms_error_k"] == pytest.approx(0.12 / math.sqrt(2), abs=0.01)
    assert tr["max_abs_error_k"] == pytest.approx(0.8 * pv["max_abs_error_k"], abs=0.002)
    assert pv["samples"] == 100  # states at 40.2 ... 139.2 s
    assert item.detail.startswith(f"held: valvey's PV RMS {pv['rms_error_k']:.2f} K, max "
                                  f"|error| 0.12 K at t = ")
    assert f"plant truth RMS {tr['rms_error_k']:.2f} K, max |error| 0.10 K" in item.detail
    assert "rack load 50-120 kW p5-p95, max 120 kW, largest rise 70 kW" in item.detail
    assert item.detail.endswith("the window ends at the pump_trip pump0 at t = 140 s")
    # the valve moved 17.5 % with every change of load: down at 46, 56, ... 136 s (10), up at
    # 50, 60, ... 130 s (9; the next, at 140 s, is after the window's last state)
    assert b["valve"]["moves"] == 19 and b["valve"]["travel_pct"] == pytest.approx(19 * 17.5)


def test_bursts_not_held_are_unchecked_saying_what_was_seen() -> None:
    # RMS above 0.15 K, max within 0.5 K
    item, b = _burst_item(_recording(lambda t: 0.3 * math.sin(t / 3.0)))
    rms = b["valvey_pv"]["rms_error_k"]
    assert rms == pytest.approx(0.3 / math.sqrt(2), abs=0.01)
    assert not item.ok
    assert item.detail.startswith(f"not met (RMS above 0.15 K): valvey's PV RMS {rms:.2f} K, "
                                  "max |error| 0.30 K"), item.detail
    # one excursion of 0.7 K at t = 80 s: RMS small, max above 0.5 K
    item, _ = _burst_item(_recording(lambda t: 0.7 if t == 80.0 else 0.05))
    assert not item.ok
    assert item.detail.startswith("not met (max |error| above 0.5 K): valvey's PV RMS 0.09 K, "
                                  "max |error| 0.70 K at t = 80 s"), item.detail
    # the same excursion before the window (the daemons' start) is not the bursts'
    item, _ = _burst_item(_recording(lambda t: 0.7 if t == 30.0 else 0.05))
    assert item.ok, item.line()


def test_a_run_too_short_for_the_window_or_without_valvey_leaves_the_item_unchecked() -> None:
    rec = _recording(lambda t: 0.0, end_s=50.0)
    item, b = _burst_item(rec, end_t=50.0)
    assert not item.ok and b["valvey_pv"] is None
    assert item.detail == "not scored: the window is 10 s, under 20 s (the run ended at t = 50 s)"
    rec = _recording(lambda t: 0.0)
    rec.loop.clear()
    item, _ = _burst_item(rec)
    assert not item.ok
    assert item.detail == ("no valvey state in the window; the window ends at the pump_trip "
                           "pump0 at t = 140 s")
    # a burst scenario's item is there even when no figures were computed
    (item,) = [c for c in checklist(BURSTS, rec, [], 170.0) if c.label.startswith("agentic")]
    assert not item.ok and item.detail == "no burst figures for the run"
    # the load step's checklist has no burst item
    assert burst_figures(STEP, rec, 170.0) is None
    assert not [c for c in checklist(STEP, rec, [], 170.0) if c.label.startswith("agentic")]


def test_the_burst_rack_s_summary_shows_a_bursts_row_not_the_step_table() -> None:
    rec = _recording(lambda t: 0.12 * math.sin(t / 3.0))
    b = burst_figures(BURSTS, rec, 170.0)
    assert b is not None
    s = DemoSummary(scenario=BURSTS.name, duration_s=170.0, steps=[], points_spooled=0,
                    spool_dir="-", valvey_exit_code=0, alarms_raised=[], plot=None,
                    trace_csv="-", run_dir="-", max_gpu_tj_c=None, rack="r13",
                    load="agentic bursts", bursts=b)
    md = summary_markdown(s)
    assert "| disturbance |" not in md
    row = next(x for x in md.splitlines() if x.startswith("| t = 40-140 s"))
    assert row.startswith("| t = 40-140 s (to the pump_trip pump0 at t = 140 s) | "
                          f"{b['valvey_pv']['rms_error_k']:.2f} / "
                          f"{b['plant_truth']['rms_error_k']:.2f} K | 0.12 / 0.10 K | "
                          "50-120 kW (max 120, largest rise 70 kW) | 19 in 99 periods (19% "
                          "active), travel 332 % ("), row
    assert "RMS error (valvey's PV / plant truth; S2 ≤ 0.15 K)" in md
    console = Console(record=True, width=120)
    print_summary(s, console)
    text = console.export_text()
    assert "agentic bursts, t = 40-140 s (to the pump_trip pump0 at t = 140 s)" in text
    rms = next(x for x in text.splitlines() if "RMS error (S2 ≤ 0.15 K)" in x)
    assert f"{b['valvey_pv']['rms_error_k']:.2f} K" in rms
    assert "rack load over the window (plant truth, p5-p95): 50-120 kW (max 120, largest rise " \
           "70 kW); valve moves (valvey's command): 19 in 99 periods" in text
    assert "No load step fell inside" not in text and "settling to" not in text


def test_the_row_names_each_rack_s_load_pattern_live_and_in_its_summary() -> None:
    from harness.demo import RowSummary
    from harness.demo.row import rack_lines, row_view

    recs = [("r12", _recording(lambda t: 0.0, end_s=5.0)),
            ("r13", _recording(lambda t: 0.0, end_s=5.0))]
    console = Console(record=True, width=200)
    console.print(row_view(recs, 280_000.0, 5.0, 170.0, "connected", "",
                           loads={"r12": "step", "r13": "agentic"}))
    text = console.export_text()
    assert "pattern" in text
    assert "agentic" in next(x for x in text.splitlines() if " r13 " in x)
    assert "step" in next(x for x in text.splitlines() if " r12 " in x)

    def rack(name: str, load: str) -> DemoSummary:
        return DemoSummary(scenario="s", duration_s=170.0, steps=[], points_spooled=1,
                           spool_dir="s", valvey_exit_code=0, alarms_raised=[], plot=None,
                           trace_csv="t", run_dir=name, max_gpu_tj_c=None, rack=name,
                           load=load)

    s = RowSummary(racks=[rack("r12", "load step"), rack("r13", "agentic bursts")],
                   row_limit_w=280_000.0, budgets_w={}, row_power_max_w=None,
                   row_power_max_t_s=None, instants=0, instants_missing=0,
                   over_limit_instants=0, checklist=[], plot=None, run_dir="run")
    assert [x.split(":")[0] for x in rack_lines(s)] == ["r12 (load step)", "r13 (agentic bursts)"]


def test_the_plant_truth_is_scored_against_the_setpoint_in_force() -> None:
    """After an operator's set_setpoint (the README's example moves r12 to 44 °C), the plant
    truth is scored against the setpoint valvey published at each instant, as its PV is, not
    the scenario's."""
    from harness.demo.bursts import setpoints_at

    loop_t, loop_sp = [10.0, 11.0, 50.0, 51.0], [45.0, 45.0, 44.0, 44.0]
    assert setpoints_at(loop_t, loop_sp, [5.0, 10.0, 49.9, 50.0, 80.0], 45.0) == [
        45.0, 45.0, 45.0, 44.0, 44.0]
    assert setpoints_at([], [], [1.0, 2.0], 45.0) == [45.0, 45.0]
