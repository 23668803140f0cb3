"""Reports of lock-step campaigns: per campaign a Markdown page with a PNG (each rack's backend
throughput per phase against the stage's expected range) and the per-rack verdicts; over the
scenario set the figures of issue 17 (`figures`, `write_summary`). matplotlib is imported
lazily with the Agg backend; without it the pages are written without the plot."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.lockstep_campaign.run import CampaignRun

__all__ = ["campaign_report", "figures", "phase_means", "write_summary"]


def phase_means(run: CampaignRun) -> dict[str, dict[str, float]]:
    """Per rack: racky's lowest NIC port fraction of line rate, mean over each validation
    phase (``load``, ``backend``) of every run (NaN: the rack never was in it)."""
    out: dict[str, dict[str, float]] = {}
    for rack, tr in run.trace.items():
        acc: dict[str, list[float]] = {"load": [], "backend": []}
        for ph, x in zip(tr["phase"], tr["nic_min"], strict=True):
            if ph in acc and math.isfinite(x):
                acc[ph].append(x)
        out[rack] = {ph: (sum(v) / len(v) if v else math.nan) for ph, v in acc.items()}
    return out


def _plot(run: CampaignRun, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    racks = list(run.trace)
    fig, axes = plt.subplots(len(racks), 1, figsize=(9, 1.9 * len(racks) + 0.6), sharex=True)
    lo, hi = run.expected_range
    for ax, rack in zip(axes, racks, strict=True):
        tr = run.trace[rack]
        t = tr["t_s"]
        start = None
        for i, ph in enumerate([*tr["phase"], None]):
            if ph == "backend" and start is None:
                start = t[i]
            elif ph != "backend" and start is not None:
                ax.axvspan(start, t[i - 1], color="0.88")
                start = None
        ax.axhspan(lo, hi, color="tab:green", alpha=0.06)
        ax.axhline(lo, color="tab:green", ls="--", lw=0.8)
        ax.plot(t, tr["nic_min"], lw=1.0, label="racky: lowest NIC port / line rate")
        ax.plot(t, [math.nan if x is None else x for x in tr["backend_fraction"]], lw=0.8,
                color="tab:orange", alpha=0.7, label="rack backend achieved / expected")
        v = run.verdicts[rack]
        ax.set_title(f"{rack}: {v.status}" + (f" ({', '.join(v.parts)})" if v.parts else ""),
                     fontsize=9, loc="left")
        ax.set_ylim(0.0, 1.1)
        ax.set_ylabel("fraction", fontsize=8)
    axes[0].legend(fontsize=7, loc="lower right")
    axes[-1].set_xlabel("plant s (grey: backend-only phase, NVLink off; dashed: expected min)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def campaign_report(run: CampaignRun, out_dir: Path) -> Path:
    """Write ``<out_dir>/<scenario>.md`` and ``<scenario>-throughput.png``; the page's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    name = run.scenario.name
    png = out_dir / f"{name}-throughput.png"
    plotted = _plot(run, png)
    lo, hi = run.expected_range
    pm = phase_means(run)
    lines = [f"# Campaign `{name}` (4-rack lock-step)", "", run.scenario.description, "",
             "Plan: one multi-rack stage, phases "
             + ", ".join(f"{k} {d:g} s" for k, d in run.phases)
             + f"; expected backend fraction [{lo:g}, {hi:g}] of line rate. "
             f"Plant {run.plant_s:g} s, wall {run.wall_s:.1f} s, "
             f"{'finished' if run.finished else 'NOT finished'}.", "",
             "| rack | verdict | status | NIC min, load (mean) | NIC min, backend (mean) | "
             "reason |", "|---|---|---|---|---|---|"]
    for r, v in run.verdicts.items():
        lines.append(f"| {r} | {'PASS' if v.passed else 'FAIL'} | {v.status} | "
                     f"{pm[r]['load']:.2f} | {pm[r]['backend']:.2f} | "
                     f"{v.reason.replace('|', '/')} |")
    lines += ["", "## Findings (racky's failed criteria per run)", ""]
    for r, v in run.verdicts.items():
        for f in v.findings:
            lines.append(f"- {r} {f}")
    if not any(v.findings for v in run.verdicts.values()):
        lines.append("- none")
    lines += ["", "## Injected faults", ""]
    for e, ok, reason in run.found:
        lines.append(f"- {e.rack}, `{e.part}`, blame {e.blame}: "
                     f"{'FOUND' if ok else 'MISSED'} ({e.why}). Verdict: {reason}")
    if not run.found:
        lines.append("- none (every rack healthy)")
    lines += ["", f"False quarantines: {len(run.false_quarantines)} "
              f"{run.false_quarantines or ''}".rstrip(), "",
              f"Switch readings at the end (network side): busiest leaf↔spine bundle "
              f"{run.spine['hottest_bundle']} at {run.spine['utilisation']:.0%} "
              f"(median bundle {run.spine['median_utilisation']:.0%}).", "",
              "Runs: " + "; ".join(f"{k} {v['state']} {v['racks']}" for k, v in
                                   run.runs.items()), ""]
    if plotted:
        lines += [f"![throughput per phase]({png.name})", ""]
    else:
        lines += ["(matplotlib not installed: no plot)", ""]
    page = out_dir / f"{name}.md"
    page.write_text("\n".join(lines), encoding="utf-8")
    return page


def figures(runs: Sequence[CampaignRun]) -> dict[str, Any]:
    """Issue 17's figures over ``runs``: ``faults``, ``found`` (with the right part and
    blame), ``found_pct`` (None when no fault was injected), ``false_quarantines`` (racks
    quarantined that nothing blames), ``healthy_racks`` (rack-runs not blamed), ``wall_s``
    per campaign and its ``max_wall_s``, ``all_finished``."""
    faults = sum(len(r.found) for r in runs)
    found = sum(ok for r in runs for _, ok, _ in r.found)
    blamed = sum(sum(e.blame == "rack" for e in r.scenario.expected) for r in runs)
    return {"faults": faults, "found": found,
            "found_pct": 100.0 * found / faults if faults else None,
            "false_quarantines": sum(len(r.false_quarantines) for r in runs),
            "healthy_racks": sum(len(r.verdicts) for r in runs) - blamed,
            "wall_s": {r.scenario.name: round(r.wall_s, 1) for r in runs},
            "max_wall_s": round(max((r.wall_s for r in runs), default=0.0), 1),
            "all_finished": all(r.finished for r in runs)}


def write_summary(runs: Sequence[CampaignRun], out_dir: Path) -> Path:
    """Write every campaign's page and ``summary.md`` (the figures and a line per rack)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    pages = [campaign_report(r, out_dir) for r in runs]
    f = figures(runs)
    lines = ["# Lock-step campaigns on the multi-rack simulator (issue 17)", "",
             "| figure | value | target |", "|---|---|---|",
             f"| injected cross-rack faults found, failing part named | {_found(f)} | 100 % |",
             f"| healthy racks failed (false quarantine) | {f['false_quarantines']} of "
             f"{f['healthy_racks']} | 0 |",
             f"| 4-rack campaign wall time, longest | {f['max_wall_s']:.1f} s | ≤ 300 s |",
             "", "| campaign | rack | verdict | reason |", "|---|---|---|---|"]
    for r in runs:
        for rack, v in r.verdicts.items():
            lines.append(f"| [{r.scenario.name}]({r.scenario.name}.md) | {rack} | "
                         f"{'PASS' if v.passed else 'FAIL'} ({v.status}) | "
                         f"{v.reason.replace('|', '/')} |")
    lines += ["", "Pages: " + ", ".join(p.name for p in pages), ""]
    path = out_dir / "summary.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def _found(f: dict[str, Any]) -> str:
    """``found/faults = pct %``, or that no fault was injected (never "0/0 = 100 %")."""
    if not f["faults"]:
        return "no fault injected"
    return f"{f['found']}/{f['faults']} = {f['found_pct']:.0f} %"
