"""The robustness matrix of the scenario report (issue 21): each cooling row run cold (the
shipped defaults, learners empty, never tuned per variant) on every member of the plant family
(`sims.cdu.variants`), one figure per cell, each able to fail.

Rows (``valvey.matrix.<row>.<variant>.<figure>``):

* ``S1``: the load step (load-step.toml, rack model): max |error| ≤ 0.5 K (with a bias
  common to the supply sensors ≤ bias + 0.2 K: the bias is the floor of any controller);
* ``S2sync``: REFERENCE-style synchronised agentic bursts (agentic-bursts-sync.toml, §4 CDU
  model), and ``S2train``: the 4 s training square wave (training-swings.toml on the §4 CDU
  model): RMS ≤ 0.15 K, valve running time ≤ 30 %, ≤ 15 strokes/h, all three on the same
  run (aim on the nominal plant 0.1 K / 20 % / 10); with a common bias the RMS target is
  bias + 0.15 K (the same floor);
* ``S3step``: the duty pump trips 2 s into a load step (pump-trip-step.toml): standby
  commanded ≤ 0.25 s after the trip, and the trip's own hottest-GPU Tj rise ≤ 5 K: the run's
  hottest Tj minus that of the same variant's run without the trip (``S3step_ref``, its
  reference, reported with it).

On a row CDU (``racks_2/3/4``: N racks stepping independently on one CDU) the S1 and S2sync
rows run (`ROW_CDU_ROWS`), with valvey configured for the N racks.

Every row also counts healthy valves declared stuck (target 0). Beside each S1 / S2 error
and strokes cell stands its ideal (``matrix.ideal.<row>.<variant>`` jobs,
`harness.lockstep_valvey.ideal`: a controller with perfect knowledge of that plant, within
its actuator's speed), in the detail and in ``extra["ideal"]``; the valve running time has
none (the ideal tracks the heat continuously: it shows what is reachable in error, not in
valve rest). Errors are read at every
0.1 s plant step, valve activity at the plant (`harness.lockstep_valvey.plant_steps`).

**The commissioned column** (``COMMISSIONED_ROWS``; jobs ``matrix.commissioned.<row>.<variant>``,
figures ``valvey.matrix.<row>.<variant>.commissioned.<figure>``, the cold names unchanged):
valvey auto-commissions itself on that variant through its command handlers and accepts the
proposal (`harness.lockstep_valvey.commission`), the learned state is saved and laid over a
fresh core, then the row's scenario runs. Commissioning always runs on the whole virtual rack
(the row's scenario plant and variant, ``model = "rack"``): on the §4 CDU model alone the
rack's leak and room sensors are missing, their alarms are active and commissioning is
(rightly) refused; the S2sync cell then runs on the CDU model with what was accepted. Same
targets and aims as the cold cell; the detail names the identified model and the accepted
values beside the cold figure and the ideal, and ``proposal_accepted`` (1: an acceptable
proposal was accepted; target 1) says whether the commissioning succeeded there (0: the cell
ran cold).
"""

from __future__ import annotations

from typing import Any, Literal

from harness.figures import Figure
from sims.cdu import CduParams
from sims.cdu.variants import VARIANTS, apply_variant, variant_names

__all__ = ["COMMISSIONED_ROWS", "COMMISSIONED_ROWS_QUICK", "IDEAL_ROWS", "MATRIX_QUICK", "ROWS",
           "ROW_CDU_ROWS", "matrix_figures", "matrix_jobs", "rows_of"]

MATRIX_QUICK = ("stroke_120s", "transport_fast_50")
"""Plant variants of the quick report's robustness matrix (the full report runs them all)."""

Model = Literal["rack", "cdu"]

ROWS: dict[str, tuple[str, Model]] = {
    "S1": ("load-step", "rack"),
    "S2sync": ("agentic-bursts-sync", "cdu"),
    "S2train": ("training-swings", "cdu"),
    "S3step": ("pump-trip-step", "rack"),
}
"""Row → (scenario, plant model)."""

IDEAL_ROWS = ("S1", "S2sync", "S2train")
"""Rows with an ideal beside each cell (`harness.lockstep_valvey.ideal`)."""

ROW_CDU_ROWS = ("S1", "S2sync")
"""Rows run on a row CDU (the ``racks_N`` variants: N racks whose loads step independently,
`sims.scenario.Scenario.rack_load`; valvey configured with the N racks, its feedforward
summing their published powers, `harness.lockstep_valvey.run.row_config`)."""


def rows_of(variant: str) -> tuple[str, ...]:
    """The rows run on ``variant`` (`ROW_CDU_ROWS` on a row CDU, else every row)."""
    return ROW_CDU_ROWS if apply_variant(CduParams(), variant).n_racks > 1 else tuple(ROWS)

COMMISSIONED_ROWS = ("S1", "S2sync")
"""Rows with a commissioned column (full report; module docstring)."""
COMMISSIONED_ROWS_QUICK = ("S1",)
"""... and in the quick report (on `MATRIX_QUICK`)."""


def matrix_jobs(quick: bool) -> list[tuple[str, str, str, Model, bool]]:
    """``(key, scenario, variant, model, without faults)`` of every cell's run (and the
    S3step rows' references)."""
    out: list[tuple[str, str, str, Model, bool]] = []
    for v in MATRIX_QUICK if quick else variant_names():
        rows = rows_of(v)
        for row, (sc, model) in ROWS.items():
            if row in rows:
                out.append((f"matrix.{row}.{v}", sc, v, model, False))
        if "S3step" in rows:
            out.append((f"matrix.S3step_ref.{v}", ROWS["S3step"][0], v, ROWS["S3step"][1],
                        True))
        for row in (r for r in IDEAL_ROWS if r in rows):  # the ideal beside the cell
            sc, model = ROWS[row]
            out.append((f"matrix.ideal.{row}.{v}", sc, v, model, False))
    return out + _commissioned_jobs(quick)


def _commissioned_jobs(quick: bool) -> list[tuple[str, str, str, Model, bool]]:
    """The commissioned column's cells (module docstring), as `matrix_jobs` tuples."""
    out: list[tuple[str, str, str, Model, bool]] = []
    for v in MATRIX_QUICK if quick else variant_names():
        for row in COMMISSIONED_ROWS_QUICK if quick else COMMISSIONED_ROWS:
            sc, model = ROWS[row]
            out.append((f"matrix.commissioned.{row}.{v}", sc, v, model, False))
    return out


def _fig(name: str, value: Any, unit: str, comparison: str, target: float | None,
         aim: float | None, detail: str, ideal: tuple[str, dict[str, Any]] = ("", {})
         ) -> Figure:
    cmp_: Any = comparison
    return Figure(name, None if value is None else float(value), unit, target, cmp_, aim,
                  ideal[0] + detail, dict(ideal[1]))


def _bias_k(variant: str) -> float:
    return max(abs(b) for b in apply_variant(CduParams(), variant).supply_sensor_bias_k)


def _cells(results: dict[str, dict[str, Any]], row: str) -> list[tuple[str, dict[str, Any]]]:
    order = {v: i for i, v in enumerate(variant_names())}
    prefix = f"matrix.{row}."
    keys = sorted((k for k in results if k.startswith(prefix)),
                  key=lambda k: order.get(k[len(prefix):], len(order)))
    return [(k[len(prefix):], results[k]) for k in keys]


def _ideal(results: dict[str, dict[str, Any]], row: str, v: str, key: str) -> tuple[
        str, dict[str, Any]]:
    """The ideal's figure ``key`` for the cell as (detail text, extra)."""
    got = results.get(f"matrix.ideal.{row}.{v}")
    if got is None or got.get(key) is None:
        return "", {}
    return f"ideal (perfect knowledge of this plant): {got[key]:g}; ", {"ideal": got[key]}


def _stuck(row: str, v: str, r: dict[str, Any]) -> Figure:
    return _fig(f"valvey.matrix.{row}.{v}.healthy_valve_declared_stuck",
                r.get("valves_declared_stuck"), "valves", "==", 0.0, None,
                "valves:failed transitions in a run without a valve fault")


def matrix_figures(results: dict[str, dict[str, Any]]) -> list[Figure]:
    """The matrix's cold and commissioned columns from the jobs' figures (module
    docstring)."""
    out: list[Figure] = []
    for v, r in _cells(results, "S1"):
        bias = _bias_k(v)
        target = max(0.5, bias + 0.2) if bias > 0.0 else 0.5
        out += [
            _fig(f"valvey.matrix.S1.{v}.max_abs_error_k", r.get("max_abs_error_k"), "K", "<=",
                 target, 0.2 if v == "nominal" else None,
                 f"cold (shipped defaults, nothing learned), seed 1, 0.1 s plant steps; "
                 f"plant: {VARIANTS[v].description}",
                 _ideal(results, "S1", v, "max_abs_error_k")),
            _stuck("S1", v, r),
        ]
    for row, what in (("S2sync", "synchronised agentic bursts (REFERENCE §4.6), CDU model"),
                      ("S2train", "4 s training square wave 100/65 %, CDU model")):
        for v, r in _cells(results, row):
            bias = _bias_k(v)
            nominal = v == "nominal"
            d = (f"cold, {what}, after 60 s; all three figures from the same run; plant: "
                 f"{VARIANTS[v].description}")
            out += [
                _fig(f"valvey.matrix.{row}.{v}.rms_error_k", r.get("rms_error_k"), "K", "<=",
                     round(0.15 + bias, 3), 0.1 if nominal else None,
                     d + ("; target bias + 0.15 K (the bias is the floor)" if bias else ""),
                     _ideal(results, row, v, "rms_error_k")),
                _fig(f"valvey.matrix.{row}.{v}.valve_running_pct", r.get("valve_active_pct"),
                     "%", "<=", 30.0, 20.0 if nominal else None,
                     "share of plant time an actuator ran; " + d),
                _fig(f"valvey.matrix.{row}.{v}.valve_strokes_per_h",
                     r.get("valve_strokes_per_h"), "1/h", "<=", 15.0, 10.0 if nominal else None,
                     "Σ|Δ plug position| / 100 % per hour at the plant; " + d,
                     _ideal(results, row, v, "valve_strokes_per_h")),
                _fig(f"valvey.matrix.{row}.{v}.max_abs_error_k", r.get("max_abs_error_k"),
                     "K", "info", None, None, d, _ideal(results, row, v, "max_abs_error_k")),
                _stuck(row, v, r),
            ]
    refs = dict(_cells(results, "S3step_ref"))
    for v, r in _cells(results, "S3step"):
        ref = refs.get(v, {})
        tj, tj0 = r.get("max_gpu_tj_c"), ref.get("max_gpu_tj_c")
        rise = None if tj is None or tj0 is None else round(tj - tj0, 2)
        d = f"cold; duty pump trips 2 s into a 30 → 100 % load step; plant: " \
            f"{VARIANTS[v].description}"
        out += [
            _fig(f"valvey.matrix.S3step.{v}.standby_commanded_s", r.get("standby_commanded_s"),
                 "s", "<=", 0.25, None, "trip to the duty_pump_select write; " + d),
            _fig(f"valvey.matrix.S3step.{v}.gpu_tj_rise_k", rise, "K", "<=", 5.0, None,
                 f"hottest GPU Tj {tj} °C minus {tj0} °C in the same step without the trip "
                 f"(the trip's own rise; 0.1 s plant steps); " + d),
            _stuck("S3step", v, r),
        ]
    return out + _commissioned_figures(results)


def _commissioned_figures(results: dict[str, dict[str, Any]]) -> list[Figure]:
    """The commissioned column (module docstring): per cell the cold cell's figures and
    targets, the accepted values and the cold figure in the detail."""
    out: list[Figure] = []
    names = {"S1": (("max_abs_error_k", "max_abs_error_k", "K", 0.2),),
             "S2sync": (("rms_error_k", "rms_error_k", "K", 0.1),
                        ("valve_running_pct", "valve_active_pct", "%", 20.0),
                        ("valve_strokes_per_h", "valve_strokes_per_h", "1/h", 10.0),
                        ("max_abs_error_k", "max_abs_error_k", "K", None))}
    for row in COMMISSIONED_ROWS:
        for v, r in _cells(results, f"commissioned.{row}"):
            bias = _bias_k(v)
            cold = results.get(f"matrix.{row}.{v}", {})
            com = r.get("commissioning", {})
            base = (f"{com.get('summary', 'no commissioning record')}; commissioning run "
                    f"{com.get('cpu_s', 0.0):.1f} CPU-s; seed 1, 0.1 s plant steps; plant: "
                    f"{VARIANTS[v].description}")
            pre = f"valvey.matrix.{row}.{v}.commissioned"
            for fig, key, unit, aim in names[row]:
                if row == "S1":
                    target: float | None = max(0.5, bias + 0.2) if bias > 0.0 else 0.5
                elif fig == "rms_error_k":
                    target = round(0.15 + bias, 3)
                else:
                    target = {"valve_running_pct": 30.0, "valve_strokes_per_h": 15.0}.get(fig)
                cmp_ = "<=" if target is not None else "info"
                out.append(_fig(f"{pre}.{fig}", r.get(key), unit, cmp_, target,
                                aim if v == "nominal" and target is not None else None,
                                f"cold: {cold.get(key)}; " + base,
                                ("", {}) if fig == "valve_running_pct"
                                else _ideal(results, row, v, key)))
            out += [
                _fig(f"{pre}.proposal_accepted", 1.0 if com.get("accepted") else 0.0, "", "==",
                     1.0, None, f"phase {com.get('phase')}; " + base),
                _fig(f"{pre}.healthy_valve_declared_stuck", r.get("valves_declared_stuck"),
                     "valves", "==", 0.0, None,
                     "valves:failed transitions in the scenario run after commissioning"),
            ]
    return out
