"""Validation reports: Markdown with PNG plots (matplotlib, when installed).

``write_report(results, directory)`` writes ``report.md`` and, per rack, ``<rack>-power.png``
(rack power against the limit and PSU capacity), ``<rack>-thermal.png`` (hottest junction and
smallest T.Limit margin) and ``<rack>-traffic.png`` (NVLink and NIC throughput as a share of
line rate), with the phases shaded. matplotlib is imported here only, lazily, with the Agg
backend (no display); without it (the daemon installed without the ``tools`` extra) the
report is written without plots and says so. Writing is blocking file I/O: the daemon calls
it in a worker thread.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from racky.core.validation import ValidationResult, ValidationSample

__all__ = ["write_report"]


def _plots(r: ValidationResult, d: Path) -> list[tuple[str, str]]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    s: Sequence[ValidationSample] = r.samples
    if not s:
        return []
    t = [x.t_s for x in s]
    out: list[tuple[str, str]] = []
    spans: list[tuple[float, float, str]] = []
    start = t[0]
    for i in range(1, len(s) + 1):
        if i == len(s) or s[i].phase != s[i - 1].phase:
            spans.append((start, t[i - 1], s[i - 1].phase))
            if i < len(s):
                start = t[i]

    def shade(ax: Any) -> None:
        for a, b, ph in spans:
            if ph == "backend":
                ax.axvspan(a, b, color="0.9", label="backend phase (NVLink off)")

    def nz(v: float | None) -> float:
        return math.nan if v is None else v

    figs: list[tuple[str, str, Any]] = []
    fig, ax = plt.subplots(figsize=(8, 3.2))
    shade(ax)
    ax.plot(t, [nz(x.rack_power_w) / 1000 for x in s], label="rack power")
    ax.plot(t, [nz(x.limit_w) / 1000 for x in s], "--", label="limit")
    ax.plot(t, [nz(x.capacity_w) / 1000 for x in s], ":", label="PSU capacity")
    ax.set_ylabel("kW")
    figs.append(("power", "Rack power, limit and PSU capacity", fig))
    fig, ax = plt.subplots(figsize=(8, 3.2))
    shade(ax)
    ax.plot(t, [x.hottest_tj_c for x in s], label="hottest junction (°C)")
    ax2 = ax.twinx()
    ax2.plot(t, [x.min_margin_c for x in s], "C1", label="smallest T.Limit margin (K)")
    ax.set_ylabel("°C")
    ax2.set_ylabel("K")
    figs.append(("thermal", "Hottest GPU junction and smallest T.Limit margin", fig))
    fig, ax = plt.subplots(figsize=(8, 3.2))
    shade(ax)
    ax.plot(t, [x.nvlink_fraction for x in s], label="NVLink (mean)")
    ax.plot(t, [x.nic_fraction_mean for x in s], label="NIC (mean)")
    ax.plot(t, [x.nic_fraction_min for x in s], label="NIC (min)")
    ax.set_ylabel("share of line rate")
    figs.append(("traffic", "Link throughput as a share of line rate", fig))
    for key, title, f in figs:
        for a in f.axes:
            a.set_xlabel("s")
            a.grid(alpha=0.3)
        f.axes[0].legend(loc="best", fontsize=7)
        f.tight_layout()
        name = f"{r.rack}-{key}.png"
        f.savefig(d / name, dpi=90)
        plt.close(f)
        out.append((title, name))
    return out


def write_report(results: Sequence[ValidationResult], directory: Path,
                 title: str = "racky validation report") -> Path:
    """Write ``report.md`` (+ PNGs) into ``directory`` (created); returns the report's path."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    lines = [f"# {title}", ""]
    overall = bool(results) and all(r.passed for r in results)
    lines += [f"**Verdict: {'PASS' if overall else 'FAIL'}** "
              f"({len(results)} run{'s' if len(results) != 1 else ''})", ""]
    plotted = True
    plot_problem: str | None = None
    for r in results:
        tr = "all trays" if r.trays is None else "trays " + ", ".join(map(str, r.trays))
        lines += [f"## {r.stage} stage: {r.rack} ({tr}): {'PASS' if r.passed else 'FAIL'}", "",
                  "| criterion | result | measured | limit |", "|---|---|---|---|"]
        for c in r.criteria:
            lines.append(f"| {c.name} | {'pass' if c.passed else '**FAIL**'} | {c.measured} | "
                         f"{c.limit} |")
        lines.append("")
        if r.link_alarm_ids:
            lines += ["Link alarms raised: " + ", ".join(f"`{a}`" for a in r.link_alarm_ids), ""]
        if r.samples:
            dur = r.samples[-1].t_s - r.samples[0].t_s
            lines += [f"{len(r.samples)} samples over {dur:.0f} s.", ""]
        try:
            plots = _plots(r, d)
        except Exception as err:  # a plot that fails to draw never costs the report
            plots, plot_problem = [], f"{type(err).__name__}: {err}"
        if not plots and r.samples:
            plotted = False
        for t, name in plots:
            lines += [f"![{t}]({name})", ""]
    if plot_problem is not None:
        lines += [f"_Plots not drawn ({plot_problem}); the verdict and criteria above are "
                  "complete._", ""]
    elif not plotted:
        lines += ["_Plots omitted: matplotlib is not installed (pip install "
                  "'rackplane[tools]')._", ""]
    p = d / "report.md"
    p.write_text("\n".join(lines), encoding="utf-8")
    return p
