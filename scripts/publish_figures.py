#!/usr/bin/env python3
"""Publish a finished benchmark or scenario-report run into the docs and the README.

    scripts/publish_figures.py --bench bench-results --scenarios scenario-results
    scripts/publish_figures.py --row row-results --chaos chaos-results
    scripts/publish_figures.py --demo demo-output/<time>

For each directory given (the ``--out`` of ``rackctl bench`` / ``rackctl scenarios``; for
``--row`` / ``--chaos`` the ``--out`` of ``rackctl bench --only row`` / ``--only chaos``) it

* copies ``results.md``, ``results.json``, ``machine.json`` (when present) and every PNG into
  ``docs/bench-report/``, ``docs/scenario-report/``, ``docs/row-report/`` or
  ``docs/chaos-report/`` (the old files there are removed first, so a plot the run no longer
  makes does not linger);
* rewrites the README's block between ``<!-- figures:bench:start -->`` and
  ``<!-- figures:bench:end -->`` (or ``figures:scenarios``, ``figures:row``,
  ``figures:chaos``) with the run's own preamble line (machine, mode, wall time), the date of
  the run's ``results.json``, the commit given with ``--commit`` (the tree the run ran) and the
  headline rows (the scenario report's `SCENARIO_HEADLINES`; for the others every figure with
  a target), rendered from ``results.json`` by `harness.figures.markdown_table`.

``--demo RUN`` (a finished row run of ``rackctl demo``) rewrites the README's block between
``<!-- demo-summary:start -->`` and ``<!-- demo-summary:end -->`` with the run's own
``summary.md`` (its machine line, date and wall time, each rack's figures and checklist, the
row's items) and copies its plots (``row.png``, ``<rack>/demo-<rack>.png``) into
``docs/demo/``, linked from the block.

Nothing is typed in: every row comes from the run's ``results.json`` or ``summary.md``. Exit
code 2 when a directory, its results or a README marker is missing or malformed (then nothing
is copied, deleted or rewritten).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.figures import Figure, markdown_table  # noqa: E402

# headline rows of the scenario report in the README (the full report is linked)
SCENARIO_HEADLINES = (
    "valvey.S1.pid_only.max_abs_error_k.median",
    "valvey.S1.max_abs_error_k.median",
    "valvey.S1.back_within_0_5k_s.median",
    "valvey.S1.valve_active_pct.median",
    "valvey.S2.pid_only.max_abs_error_k.median",
    "valvey.S2.max_abs_error_k.median",
    "valvey.S2.rms_error_k.median",
    "valvey.S3.standby_commanded_s",
    "valvey.S3.min_flow_pct",
    "valvey.S3.gpu_tj_rise_k",
    "valvey.S4.mismatch_detected_s",
    "valvey.S5.drift_detected_min",
    "valvey.S6d.isolated_after_trip_s",
    "valvey.S6e.isolations",
    "valvey.S9.max_above_sp_k",
    "valvey.healthy.false_alarms",
    "valvey.S9.over_capping_pct",
    "valvey.matrix.S1.stroke_120s.max_abs_error_k",
    "valvey.matrix.S2sync.stroke_120s.valve_running_pct",
    "racky.S7.flap_declared_after_3rd_down_s",
    "racky.S7.flap_declared_not_before_3rd_down_s",
    # racky's alarm: the learned-baseline CUSUM, the hardest cell (λ0 0.3/min, variance/mean
    # 1.5) and the one with the tightest targets (0.5/min, 1.25); every cell in the report
    "racky.S8.cell_l0.3_d1.5.false_alarms_per_100k_link_days",
    "racky.S8.cell_l0.3_d1.5.creep_median_h",
    "racky.S8.cell_l0.3_d1.5.ramp_median_min",
    "racky.S8.cell_l0.5_d1.25.false_alarms_per_100k_link_days",
    "racky.S8.cell_l0.5_d1.25.healthy_link_days",
    "racky.S8.cell_l0.5_d1.25.creep_median_h",
    "racky.S8.cell_l0.5_d1.25.creep_p90_h",
    "racky.S8.cell_l0.5_d1.25.ramp_median_min",
    "racky.S8.shared_part_one_finding_cases",
    "racky.traffic.faults_found_pct",
    "racky.traffic.healthy_agentic_alarms",
    "racky.S10.cap_latency_max_s",
    "racky.S2.training_over_budget_max_pct",
    "racky.overheat.warn_lead_s",
    "racky.faults.detected_pct",
)


def load_figures(run: Path) -> list[Figure]:
    """The run's figures from ``run/results.json``, checked.

    Raises:
        FileNotFoundError: no ``results.json`` / ``results.md`` in ``run``.
        ValueError: not a list of figures (name and unit strings, value/target/aim a number
            or null, a known comparison).
    """
    rows = json.loads((run / "results.json").read_text())
    if not (run / "results.md").is_file():
        raise FileNotFoundError(f"{run}/results.md not found")
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{run}/results.json: not a non-empty list of figures")
    keys = ("name", "value", "unit", "target", "comparison", "aim", "detail")
    figs = []
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or not isinstance(r.get("name"), str) or not isinstance(
                r.get("unit"), str):
            raise ValueError(f"{run}/results.json[{i}]: needs string name and unit")
        for k in ("value", "target", "aim"):
            v = r.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
                raise ValueError(f"{run}/results.json[{i}].{k}: {v!r} is not a number or null")
        if r.get("comparison", "info") not in ("<=", ">=", "==", "info"):
            raise ValueError(f"{run}/results.json[{i}].comparison: {r.get('comparison')!r}")
        figs.append(Figure(**{k: r[k] for k in keys if k in r}))
    return figs


def preamble(run: Path) -> str:
    """The first paragraph under the title of ``run/results.md`` (machine, mode, wall time)."""
    lines = (run / "results.md").read_text().splitlines()
    body = [ln for ln in lines[1:] if not ln.startswith("|")]
    text = "\n".join(body).strip().split("\n\n")[0]
    return text.strip()


def copy_run(run: Path, dest: Path) -> None:
    """Replace ``dest``'s results and plots by ``run``'s."""
    dest.mkdir(parents=True, exist_ok=True)
    for old in list(dest.glob("*.png")) + [dest / n for n in
                                           ("results.md", "results.json", "machine.json")]:
        old.unlink(missing_ok=True)
    for f in sorted(run.iterdir()):
        if f.suffix == ".png" or f.name in ("results.md", "results.json", "machine.json"):
            shutil.copy2(f, dest / f.name)


KINDS = {"bench": ("Benchmarks", "docs/bench-report"),
         "scenarios": ("Scenario report", "docs/scenario-report"),
         "row": ("A row per host (`rackctl bench --only row`)", "docs/row-report"),
         "chaos": ("Chaos run of a valvey pair (`rackctl bench --only chaos`)",
                   "docs/chaos-report")}
"""Each kind: its README heading and its docs folder."""


def block(kind: str, run: Path, figures: list[Figure], report: str, commit: str = "") -> str:
    """The README block for ``kind`` (a `KINDS` key); ``commit``: the tree the run ran."""
    when = dt.datetime.fromtimestamp((run / "results.json").stat().st_mtime,
                                     tz=dt.UTC).strftime("%Y-%m-%d")
    when += f" on commit {commit}" if commit else ""
    failed = [f for f in figures if f.passed is False]
    if kind != "scenarios":
        rows = [f for f in figures if f.comparison != "info" and f.target is not None]
        head = (f"{KINDS[kind][0]}, every figure with a target ({len(rows)} of "
                f"{len(figures)}; all in `{report}`), run {when}:")
    else:
        by = {f.name: f for f in figures}
        rows = [by[n] for n in SCENARIO_HEADLINES if n in by]
        head = (f"Scenario report, headline rows ({len(rows)} of {len(figures)} figures; "
                f"all in `{report}`), run {when}:")
    verdict = (f"{len(failed)} figure(s) below target: "
               + ", ".join(f"`{f.name}`" for f in failed) if failed
               else "every figure with a target meets it")
    return (f"{head}\n\n> {preamble(run)}\n\n{verdict}.\n\n" + markdown_table(rows))


def replace_block(readme: str, kind: str, text: str) -> str:
    """``readme`` with the text between the ``figures:KIND`` markers replaced.

    Raises KeyError when a marker is missing."""
    start, end = f"<!-- figures:{kind}:start -->", f"<!-- figures:{kind}:end -->"
    i, j = readme.find(start), readme.find(end)
    if i < 0 or j < i:
        raise KeyError(f"README has no {start} ... {end} block")
    return readme[:i + len(start)] + "\n" + text + readme[j:]


DEMO_DOCS = "docs/demo"
"""Where ``--demo`` puts the run's plots."""


def demo_block(run: Path) -> tuple[str, list[Path]]:
    """The README's demo block from a row run's ``summary.md`` and the plots it links.

    Raises:
        FileNotFoundError: no ``summary.md`` / ``summary.json`` in ``run``.
        ValueError: not a row run's summary (no racks), or a plot it names is missing.
    """
    summary = json.loads((run / "summary.json").read_text())
    racks = [r.get("rack") for r in summary.get("racks") or []]
    if not racks or not all(isinstance(r, str) for r in racks):
        raise ValueError(f"{run}/summary.json: not a row run's summary (rackctl demo --racks 2..4)")
    plots = [run / "row.png"] + [run / r / f"demo-{r}.png" for r in racks]
    missing = [str(p) for p in plots if not p.is_file()]
    if missing:
        raise ValueError(f"plots missing: {missing}")
    out = []
    for line in (run / "summary.md").read_text().splitlines():
        if line.startswith("Row plot:"):
            continue
        if line.startswith("## "):
            rack = line[len("## rack "):] if line.startswith("## rack ") else None
            if rack is None and out:  # the row's section: its plot first
                out += [f"![the row: each rack's power, their sum and rlc's leases against the "
                        f"limit]({DEMO_DOCS}/row.png)", ""]
            line = "#" + line
            if rack is not None:
                out += [line, "", f"![rack {rack}]({DEMO_DOCS}/demo-{rack}.png)"]
                continue
        out.append(line)
    return "\n".join(out).strip() + "\n", plots


def replace_marked(readme: str, start: str, end: str, text: str) -> str:
    """``readme`` with the text between ``start`` and ``end`` replaced.

    Raises KeyError when a marker is missing."""
    i, j = readme.find(start), readme.find(end)
    if i < 0 or j < i:
        raise KeyError(f"README has no {start} ... {end} block")
    return readme[:i + len(start)] + "\n" + text + readme[j:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", type=Path, help="the --out directory of rackctl bench")
    ap.add_argument("--scenarios", type=Path, help="the --out directory of rackctl scenarios")
    ap.add_argument("--row", type=Path, help="the --out directory of rackctl bench --only row")
    ap.add_argument("--chaos", type=Path,
                    help="the --out directory of rackctl bench --only chaos")
    ap.add_argument("--demo", type=Path, help="a finished row run of rackctl demo (its folder)")
    ap.add_argument("--commit", default="", help="the commit the runs ran (named in the README)")
    ap.add_argument("--readme", type=Path, default=ROOT / "README.md")
    args = ap.parse_args(argv)
    if all(getattr(args, k) is None for k in (*KINDS, "demo")):
        ap.error("nothing to publish: give --bench, --scenarios, --row, --chaos and/or --demo DIR")
    readme = args.readme.read_text()
    todo = []
    # check every run and build the README first: nothing is copied or deleted unless all of
    # it is good
    for kind, (_head, folder) in KINDS.items():
        run, dest = getattr(args, kind), ROOT / folder
        if run is None:
            continue
        try:
            figs = load_figures(run)
            readme = replace_block(readme, kind, block(
                kind, run, figs, f"{dest.relative_to(ROOT)}/results.md", args.commit))
        except (OSError, ValueError, KeyError) as err:
            why = err.args[0] if isinstance(err, KeyError) else err
            print(f"error: {kind} {run}: {why}; nothing published", file=sys.stderr)
            return 2
        todo.append((kind, run, dest, len(figs)))
    demo_plots: list[Path] = []
    if args.demo is not None:
        try:
            text, demo_plots = demo_block(args.demo)
            readme = replace_marked(readme, "<!-- demo-summary:start -->",
                                    "<!-- demo-summary:end -->", text)
        except (OSError, ValueError, KeyError) as err:
            why = err.args[0] if isinstance(err, KeyError) else err
            print(f"error: demo {args.demo}: {why}; nothing published", file=sys.stderr)
            return 2
    if demo_plots:
        dest = ROOT / DEMO_DOCS
        dest.mkdir(parents=True, exist_ok=True)
        for old in dest.glob("*.png"):
            old.unlink()
        for p in demo_plots:
            shutil.copy2(p, dest / p.name)
        print(f"demo: {len(demo_plots)} plots -> {DEMO_DOCS}, README block updated")
    for kind, run, dest, n in todo:
        copy_run(run, dest)
        print(f"{kind}: {n} figures -> {dest.relative_to(ROOT)}, README block updated")
    args.readme.write_text(readme)
    return 0


if __name__ == "__main__":
    sys.exit(main())
