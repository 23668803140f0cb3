"""The demo's row (``rackctl demo --racks N``): the scripted faults dealt to the racks, the
row's power (Σ of each rack's racky power, each rack's records on its own plant clock put on
one row time axis) and the row item checked from it; fed through the demo's own `Recorder`
as MQTT messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.demo import Recorder, row_power, row_power_item, split_faults
from harness.demo.racks import plan_racks
from harness.demo.row import rack_power_series, row_figures, row_t0
from rackplane.core.topics import Message
from sims.scenario import load_scenario

SC = load_scenario("demo-load-step")


def test_the_faults_are_dealt_so_the_row_shows_both() -> None:
    kinds = [[f.kind for f in fs] for fs in split_faults(SC.faults, 2)]
    assert kinds == [["link_flap"], ["pump_trip"]]
    assert [[f.kind for f in fs] for fs in split_faults(SC.faults, 3)] == [
        ["link_flap"], ["pump_trip"], []]
    assert [[f.kind for f in fs] for fs in split_faults(SC.faults, 1)] == [
        ["link_flap", "pump_trip"]]
    with pytest.raises(ValueError):
        split_faults(SC.faults, 0)


def test_each_rack_gets_its_scenario_file_with_its_faults_its_seed_and_the_same_plant(
        tmp_path: Path) -> None:
    racks = plan_racks(2, "demo-load-step", SC, tmp_path, 140_000.0)
    assert [r.name for r in racks] == ["r12", "r13"]  # README's rack r12, then its neighbour
    assert [r.dir for r in racks] == [tmp_path / "r12", tmp_path / "r13"]
    assert len({r.modbus_port for r in racks} | {r.shelf_port for r in racks}) == 4
    for r in racks:
        assert r.scenario_ref == str(tmp_path / r.name / f"scenario-{r.name}.toml")
    # r12's file, loaded back, is the demo's scenario but for its faults; r13 runs the agentic
    # bursts instead of the load step (tests/unit/test_demo_bursts.py), on the same plant
    keep = {"faults", "description"}
    assert racks[0].scenario.model_dump(exclude=keep) == SC.model_dump(exclude=keep)
    assert racks[1].scenario.name == "demo-agentic-bursts"
    assert racks[1].scenario.plant == SC.plant
    assert racks[1].scenario.duration_s == SC.duration_s
    assert [f.kind for f in racks[1].scenario.faults] == ["pump_trip"]
    assert racks[1].scenario.faults[0] == SC.faults[1]
    (one,) = plan_racks(1, "demo-load-step", SC, tmp_path, 140_000.0)
    assert one.name == "r12" and one.dir == tmp_path and one.scenario is SC
    assert one.scenario_ref == "demo-load-step"  # one rack: as before, the bundled name
    with pytest.raises(ValueError):
        plan_racks(5, "demo-load-step", SC, tmp_path, 140_000.0)


def _feed(rec: Recorder, rack: str, mono: float, topic: str, payload: object) -> None:
    rec.on_message(Message(f"rackplane/lab/{rack}/{topic}", json.dumps(payload).encode(),
                           received_mono=mono))


def _rack(name: str, plant_t0_mono: float, powers_w: list[float],
          skip: tuple[int, ...] = (), dc_share: float = 1.0) -> Recorder:
    """A rack whose plant clock began at ``plant_t0_mono``; racky's AC input at plant t = 1,
    2, ... s (its DC output ``dc_share`` of it; ``skip``: plant seconds with no sample)."""
    rec = Recorder()
    _feed(rec, name, plant_t0_mono, "sim/telemetry/plant", {"t_s": 0.0})
    for i, w in enumerate(powers_w, start=1):
        if i not in skip:
            _feed(rec, name, plant_t0_mono + i, "racky/state/rack_power",
                  {"rack_power_w": w * dc_share, "rack_input_w": w})
    return rec


def test_the_row_power_sums_the_racks_at_the_same_instant_across_their_plant_clocks() -> None:
    # r13's plant began 3 s after r12's: its plant t = 1 s is row t = 4 s
    r12 = _rack("r12", 1000.0, [50_000.0] * 3 + [130_000.0] * 7)
    r13 = _rack("r13", 1003.0, [40_000.0] * 3 + [120_000.0] * 7)
    t0 = row_t0([r12, r13])
    assert t0 == 1000.0
    s13 = rack_power_series(r13, t0)
    assert s13[0] == (4.0, 40_000.0)
    pts = row_power([rack_power_series(r12, t0), s13])
    # from row t = 4 s (both heard) to row t = 10 s (r12's last)
    assert [t for t, _ in pts] == [4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    # r12 at full load from row t = 4 s, r13 from row t = 7 s (its plant t = 4 s)
    assert [p for _, p in pts] == [170_000.0, 170_000.0, 170_000.0, 250_000.0, 250_000.0,
                                   250_000.0, 250_000.0]
    ok = row_power_item(pts, 280_000.0, 2)
    assert ok.ok, ok
    assert ok.detail == ("peak 250.0 kW at row t = 7 s against 280 kW; 7 instants (1 s apart) "
                         "with every rack heard, 0 without; margin 30.0 kW")
    over = row_power_item(pts, 240_000.0, 2)
    assert not over.ok
    assert over.detail.startswith("above the limit at 4 instants, first at row t = 7 s "
                                  "(250.0 kW)")
    assert row_figures(pts, 240_000.0) == {
        "row_power_max_w": 250_000.0, "row_power_max_t_s": 7.0, "instants": 7,
        "instants_missing": 0, "over_limit_instants": 4}


def test_the_row_item_sums_the_racks_ac_input_like_the_row_limit_and_the_leases() -> None:
    """The row limit and rlc's leases are on AC input; the racks' DC output is lower by the
    shelves' losses. Two racks at 138 kW of AC input each (134.6 kW DC at 97.5 %) against a
    row limit of 275 kW: the DC sum (269.1 kW) would pass, the AC sum (276 kW) is above."""
    r12 = _rack("r12", 1000.0, [138_000.0] * 5, dc_share=0.975)
    r13 = _rack("r13", 1000.0, [138_000.0] * 5, dc_share=0.975)
    pts = row_power([rack_power_series(r, 1000.0) for r in (r12, r13)])
    assert {p for _, p in pts} == {276_000.0}
    item = row_power_item(pts, 275_000.0, 2)
    assert not item.ok and item.detail.startswith("above the limit at 5 instants"), item
    assert "AC input" in item.label
    dc = row_power([rack_power_series(r, 1000.0, "rack_power_w") for r in (r12, r13)])
    assert row_power_item(dc, 275_000.0, 2).ok  # what the item used to compare
    # a racky that does not publish its AC input: no row power, the item unchecked
    old = Recorder()
    _feed(old, "r14", 1000.0, "sim/telemetry/plant", {"t_s": 0.0})
    _feed(old, "r14", 1001.0, "racky/state/rack_power", {"rack_power_w": 1.0})
    assert rack_power_series(old, 1000.0) == []
    assert not row_power_item(row_power([rack_power_series(r12, 1000.0), []]), 1e9, 2).ok


def test_an_instant_without_a_fresh_sample_of_every_rack_has_no_row_power() -> None:
    r13 = _rack("r13", 1000.0, [40_000.0] * 12)
    r12 = _rack("r12", 1000.0, [50_000.0] * 12, skip=(5, 6, 7))  # racky silent 3 s
    pts = row_power([rack_power_series(r, 1000.0) for r in (r12, r13)])
    assert [t for t, p in pts if p is None] == [7.0]  # r12's t = 4 s sample is 3 s old there
    one = row_power_item(pts, 280_000.0, 2)
    assert one.ok and "11 instants (1 s apart) with every rack heard, 1 without" in one.detail
    r12 = _rack("r12", 1000.0, [50_000.0] * 12, skip=(4, 5, 6, 7))  # silent 4 s
    pts = row_power([rack_power_series(r, 1000.0) for r in (r12, r13)])
    assert [t for t, p in pts if p is None] == [6.0, 7.0]
    item = row_power_item(pts, 280_000.0, 2)
    assert not item.ok  # 2 of 12 instants missing: more than 10 %, "never above" unproven
    assert item.detail.startswith("unproven: too many instants without every rack's power")
    assert "10 instants (1 s apart) with every rack heard, 2 without" in item.detail
    # a rack never heard: no instant at all, unchecked
    none = row_power([rack_power_series(r12, 1000.0), []])
    assert none == []
    assert not row_power_item(none, 280_000.0, 2).ok


def test_the_live_view_shows_a_line_per_rack_and_the_row_against_its_limit() -> None:
    from rich.console import Console

    from harness.demo.row import row_view

    r12 = _rack("r12", 1000.0, [130_000.0] * 5)
    r13 = _rack("r13", 1000.0, [120_000.0] * 5)
    for rec, name in ((r12, "r12"), (r13, "r13")):
        _feed(rec, name, 1005.0, "sim/telemetry/plant", {"t_s": 5.0, "rack_power_w": 1.0})
        _feed(rec, name, 1005.0, "racky/state/rack", {
            "budget_w": 140_000.0, "lifecycle": {"state": "production", "by": "racky"}})
    _feed(r12, "r12", 1004.0, "racky/alarm/link_flapping:gpu07-nic1", {"message": "flapping"})
    console = Console(record=True, width=200)
    console.print(row_view([("r12", r12), ("r13", r13)], 280_000.0, 5.0, 60.0, "connected", ""))
    text = console.export_text()
    line12 = next(x for x in text.splitlines() if " r12 " in x)
    assert "130.0/140.0" in line12 and "production" in line12
    line13 = next(x for x in text.splitlines() if " r13 " in x)
    assert "120.0/140.0" in line13
    assert "r12: racky:link_flapping:gpu07-nic1" in text and "r13: none" in text
    assert "row: Σ rack AC input 250.0 kW / row limit 280 kW" in text
    assert "r12: alarm racky:link_flapping:gpu07-nic1 raised" in text
    # a rack whose last power is stale (racky silent 3 s of its plant time): no Σ shown
    _feed(r13, "r13", 1008.0, "sim/telemetry/plant", {"t_s": 8.0, "rack_power_w": 1.0})
    console = Console(record=True, width=200)
    console.print(row_view([("r12", r12), ("r13", r13)], 280_000.0, 5.0, 60.0, "connected", ""))
    assert "row: Σ rack AC input — kW" in console.export_text()


def test_the_row_plot_stacks_each_rack_at_its_last_sample() -> None:
    from harness.demo.row import held_at

    s = [(1.0, 10.0), (2.0, 20.0), (4.0, 40.0)]
    assert held_at(s, [0.5, 1.0, 3.9, 4.0, 9.0]) == [0.0, 10.0, 20.0, 40.0, 40.0]


def test_the_row_summary_names_each_rack_and_the_row_item() -> None:
    from harness.demo import DemoSummary, RackySummary, RowSummary
    from harness.demo.row import rack_lines, row_markdown

    def rack(name: str, oks: list[bool], alarms: list[str], lc: str,
             rc: int | None = 0) -> DemoSummary:
        return DemoSummary(
            scenario="demo-load-step", duration_s=170.0, steps=[], points_spooled=1,
            spool_dir="s", valvey_exit_code=0, alarms_raised=alarms, plot=None, trace_csv="t",
            run_dir=name, max_gpu_tj_c=None, rack=name, tray_agent_exit_code=rc,
            racky=RackySummary(lc, None, 1.0, 1, "8/8", 1.0, 1.0, "budget", 0.0, exit_code=0),
            checklist=[{"label": f"item {i}", "ok": ok, "detail": "d"}
                       for i, ok in enumerate(oks)])

    item = row_power_item([(1.0, 250_000.0)], 280_000.0, 2)
    s = RowSummary(
        racks=[rack("r12", [True, True, False], ["105 s racky:link_flapping:gpu07-nic1 raised",
                                                 "120 s racky:link_flapping:gpu07-nic1 cleared"],
                    "quarantined"),
               rack("r13", [True], [], "production", rc=-9)],
        row_limit_w=280_000.0, budgets_w={"r12": 140_000.0, "r13": 140_000.0},
        checklist=[item.as_dict()], plot="row.png", run_dir="run",
        coordination="row without rlc: x", **row_figures([(1.0, 250_000.0)], 280_000.0))
    assert rack_lines(s) == [
        "r12: 2/3 checklist items checked; lifecycle quarantined; alarms raised: "
        "racky:link_flapping:gpu07-nic1; exit codes after SIGTERM: valvey 0, racky 0, "
        "tray agent 0",
        "r13: 1/1 checklist items checked; lifecycle production; alarms raised: none; exit "
        "codes after SIGTERM: valvey 0, racky 0, tray agent -9"]
    md = row_markdown(s)
    assert md.index("## rack r12") < md.index("## rack r13") < md.index("## the row (2 racks)")
    assert f"- [x] {item.label}: {item.detail}" in md
