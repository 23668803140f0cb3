"""Smoke tests of the benchmark suite (harness/bench.py, benchrun.py, benchsections.py) in quick
mode: the plumbing runs and writes figures; no timing is asserted (speed figures live in bench
results, not tests)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from harness import bench, benchrun
from harness.figures import write_results


def test_spread_figure_reports_median_and_spread() -> None:
    f = benchrun.spread_figure("bench.x", [3.0, 1.0, 2.0], "x", 1.5, ">=", "how")
    assert f.value == 2.0 and f.passed is True
    assert "median of 3" in f.detail and "1..3" in f.detail
    empty = benchrun.spread_figure("bench.y", [], "x", 1.0, ">=", "how")
    assert empty.value is None and empty.passed is False


def test_machine_info_names_the_machine() -> None:
    m = benchrun.machine_info()
    assert m["cores"] and m["python"] and m["cpu"]


def test_lockstep_section_quick(tmp_path: Path) -> None:
    figs = bench.run_suite(tmp_path, True, only=["lockstep"])
    names = {f.name: f for f in figs}
    for name in ("bench.lockstep.valvey_plant_s_per_s", "bench.lockstep.racky_plant_s_per_s",
                 "bench.lockstep.link_days_per_s"):
        assert name in names, [f"{f.name}: {f.detail}" for f in figs]
        v = names[name].value
        assert v is not None and math.isfinite(v) and v > 0, names[name].detail
    write_results(tmp_path, figs, "bench")
    data = json.loads((tmp_path / "results.json").read_text())
    assert all(d["name"].startswith("bench.") for d in data)


def test_rlc_section_quick(tmp_path: Path) -> None:
    """The rlc allocation-cycle figure is produced (its time is a bench result, not asserted)."""
    figs = {f.name: f for f in bench.run_suite(tmp_path, True, only=["rlc"])}
    f = figs["bench.rlc.allocation_cycle_1800_racks_ms"]
    assert f.value is not None and f.value > 0 and f.target == 100.0, f.detail
    assert "1,800 racks" in f.detail
    assert figs["bench.rlc.cycle_growth_10x_racks"].value


def test_plots_are_written(tmp_path: Path) -> None:
    paths = bench.write_plots(tmp_path, {"tick": {"idle": [0.1, 0.2, 3.0], "load": [0.3, 9.0]},
                                         "capacity": [(1e5, 0.0, 0.2), (2e5, 0.01, 0.5)]})
    assert [p.name for p in paths] == ["tick_lateness.png", "ingest_capacity.png"]
    assert all(p.stat().st_size > 1000 for p in paths)


@pytest.mark.servers
def test_tsdb_section_quick_against_real_servers(tmp_path: Path) -> None:
    """The subprocess plumbing end to end: both writers deliver every point to a private
    VictoriaMetrics (a missing binary is a failed figure, not a crash)."""
    figs = bench.run_suite(tmp_path, True, only=["tsdb"])
    by = {f.name: f for f in figs}
    f = by["bench.tsdb.ratio_to_raw"]
    if f.value is None and "servers:" in f.detail:
        pytest.skip(f.detail)
    assert f.value is not None and f.value > 0, f.detail
    assert by["bench.tsdb.spool_points_per_s"].value
