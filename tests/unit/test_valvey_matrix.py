"""The scenario report's robustness matrix (harness/lockstep_valvey/, issue 21): S1 cold on
each plant variant, one figure per cell computed from a run, each able to fail."""

from __future__ import annotations

from typing import Any

import pytest

from harness.lockstep_valvey import MATRIX_QUICK, _jobs, _matrix_figures, _run_job
from harness.lockstep_valvey.matrix import ROW_CDU_ROWS, rows_of
from sims.cdu.variants import variant_names

ROWS = ("S1", "S2sync", "S2train", "S3step", "S3step_ref")


def test_quick_report_runs_a_small_matrix_and_full_runs_every_variant() -> None:
    def rows(v: str) -> tuple[str, ...]:  # a row CDU (racks_N) runs S1 and S2sync only
        return ROW_CDU_ROWS if v.startswith("racks_") else ROWS

    quick = sorted(j.key for j in _jobs(True) if j.key.startswith("matrix."))
    assert quick == sorted([f"matrix.{r}.{v}" for v in MATRIX_QUICK for r in rows(v)]
                           + [f"matrix.ideal.{r}.{v}" for v in MATRIX_QUICK
                              for r in ("S1", "S2sync", "S2train") if r in rows(v)]
                           + [f"matrix.commissioned.S1.{v}" for v in MATRIX_QUICK])
    assert 2 <= len(MATRIX_QUICK) <= 3
    full = [j for j in _jobs(False) if j.key.startswith("matrix.")]
    for row in ROWS:
        assert {j.variant for j in full if j.key.startswith(f"matrix.{row}.")} == {
            v for v in variant_names() if row in rows(v)}, row
    assert {v for v in variant_names() if v.startswith("racks_")} == {
        "racks_2", "racks_3", "racks_4"}
    assert all((rows_of(v) == ROW_CDU_ROWS) == v.startswith("racks_") for v in variant_names())
    assert all(j.no_faults == j.key.startswith("matrix.S3step_ref.") for j in full)


def test_s2_cells_score_rms_running_time_and_strokes_of_one_run() -> None:
    job = next(j for j in _jobs(True) if j.key == "matrix.S2sync.transport_fast_50")
    _job, figs, _trace = _run_job(job)
    cells = {f.name: f for f in _matrix_figures({job.key: figs})}
    base = "valvey.matrix.S2sync.transport_fast_50"
    assert cells[f"{base}.rms_error_k"].value == figs["rms_error_k"]
    assert cells[f"{base}.valve_running_pct"].value == figs["valve_active_pct"] > 0.0
    assert cells[f"{base}.valve_strokes_per_h"].value == figs["valve_strokes_per_h"] > 0.0
    for name, target in (("rms_error_k", 0.15), ("valve_running_pct", 30.0),
                         ("valve_strokes_per_h", 15.0)):
        assert cells[f"{base}.{name}"].target == target
    bad = {f.name: f for f in _matrix_figures({"matrix.S2train.nominal": {
        "rms_error_k": 0.16, "valve_active_pct": 31.0, "valve_strokes_per_h": 16.0,
        "valves_declared_stuck": 0}})}
    assert [f.passed for n, f in bad.items() if not n.endswith(("max_abs_error_k",
                                                                "declared_stuck"))] == [
        False, False, False]


def test_s3_step_cell_is_the_trips_own_tj_rise_over_the_same_step_without_it() -> None:
    jobs = {j.key: j for j in _jobs(True)}
    res = {k: _run_job(jobs[k])[1] for k in ("matrix.S3step.stroke_120s",
                                              "matrix.S3step_ref.stroke_120s")}
    cells = {f.name: f for f in _matrix_figures(res)}
    rise = cells["valvey.matrix.S3step.stroke_120s.gpu_tj_rise_k"]
    assert rise.value == round(res["matrix.S3step.stroke_120s"]["max_gpu_tj_c"]
                               - res["matrix.S3step_ref.stroke_120s"]["max_gpu_tj_c"], 2)
    assert 0.0 < rise.value <= 5.0 and rise.passed is True
    assert res["matrix.S3step_ref.stroke_120s"].get("standby_commanded_s") is None  # no trip
    assert cells["valvey.matrix.S3step.stroke_120s.standby_commanded_s"].passed is True
    missing = {f.name: f for f in _matrix_figures({"matrix.S3step.nominal": {
        "max_gpu_tj_c": 80.0, "standby_commanded_s": 0.3, "valves_declared_stuck": 0}})}
    assert missing["valvey.matrix.S3step.nominal.gpu_tj_rise_k"].passed is False  # no ref
    assert missing["valvey.matrix.S3step.nominal.standby_commanded_s"].passed is False


def test_a_matrix_cell_is_computed_from_its_run() -> None:
    job = next(j for j in _jobs(True) if j.key == "matrix.S1.stroke_120s")
    _job, figs, _trace = _run_job(job)
    cells = {f.name: f for f in _matrix_figures({job.key: figs})}
    err = cells["valvey.matrix.S1.stroke_120s.max_abs_error_k"]
    assert err.value == figs["max_abs_error_k"] and err.value is not None
    assert err.passed is True, err
    stuck = cells["valvey.matrix.S1.stroke_120s.healthy_valve_declared_stuck"]
    assert stuck.value == 0.0 and stuck.passed is True


def test_matrix_cells_can_fail_and_the_common_bias_target_is_bias_plus_0_2_k() -> None:
    cells = {f.name: f for f in _matrix_figures({
        "matrix.S1.common_bias": {"max_abs_error_k": 0.49, "valves_declared_stuck": 0},
        "matrix.S1.stroke_90s": {"max_abs_error_k": 0.52, "valves_declared_stuck": 2},
    })}
    assert cells["valvey.matrix.S1.common_bias.max_abs_error_k"].target == 0.5
    assert cells["valvey.matrix.S1.common_bias.max_abs_error_k"].passed is True
    assert cells["valvey.matrix.S1.stroke_90s.max_abs_error_k"].passed is False
    assert cells["valvey.matrix.S1.stroke_90s.healthy_valve_declared_stuck"].passed is False


def test_the_ideal_stands_beside_each_cell() -> None:
    jobs = {j.key: j for j in _jobs(True)}
    ideal_job = jobs["matrix.ideal.S1.stroke_120s"]
    assert ideal_job.kind == "ideal"
    _job, ideal, _trace = _run_job(ideal_job)
    cell = {"max_abs_error_k": 0.44, "valves_declared_stuck": 0}
    figs = {f.name: f for f in _matrix_figures({"matrix.S1.stroke_120s": cell,
                                                "matrix.ideal.S1.stroke_120s": ideal})}
    f = figs["valvey.matrix.S1.stroke_120s.max_abs_error_k"]
    assert f.extra["ideal"] == ideal["max_abs_error_k"]
    want = f"ideal (perfect knowledge of this plant): {ideal['max_abs_error_k']:g}"
    assert f.detail.startswith(want)
    # the ideal is no worse than the controller's target on a slow valve (issue 21: ≤ 0.2 K)
    assert 0.0 < ideal["max_abs_error_k"] <= 0.25


def test_a_row_cdu_cell_runs_valvey_with_the_rows_racks_listed(monkeypatch: Any) -> None:
    """racks_N cells (issue 21 item 1): valvey's feedforward lists the N racks, so it sums
    their published powers (tests/scenarios/test_valvey_row_cdu.py: what that does)."""
    from harness.lockstep_valvey import scenario_report

    seen: dict[str, Any] = {}

    def fake_run(sc: Any, cfg: Any, **kw: Any) -> Any:
        seen[kw["variant"]] = (cfg.feedforward.racks, kw["model"])
        raise StopIteration

    monkeypatch.setattr(scenario_report, "run_valvey", fake_run)
    full = {j.key: j for j in _jobs(False)}
    for key in ("matrix.S1.racks_4", "matrix.S2sync.racks_2", "matrix.S1.nominal"):
        with pytest.raises(StopIteration):
            _run_job(full[key])
    assert seen["racks_4"] == (["rack1", "rack1-2", "rack1-3", "rack1-4"], "rack")
    assert seen["racks_2"] == (["rack1", "rack1-2"], "cdu")
    assert seen["nominal"] == ([], "rack")
    assert "matrix.S2train.racks_2" not in full and "matrix.S3step.racks_3" not in full
    assert "matrix.ideal.S2sync.racks_3" in full
