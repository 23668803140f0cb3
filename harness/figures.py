"""One shape for every figure a scenario or benchmark run computes.

The scenario report (`rackctl scenarios`), the benchmark suite (`rackctl bench`) and the scenario
tests all speak `Figure`; `write_results` writes the ``results.json`` list that issue 8 defines
(one entry per figure: name, value, unit, target, pass) plus a Markdown table.

Names: daemon first, then the scenario of REFERENCE §5, then the figure with its unit, e.g.
``valvey.S1.max_abs_error_k`` or ``racky.S8.creep_24h_detect_h``. Benchmark figures start with
``bench.``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = ["Figure", "Progress", "check", "markdown_table", "no_progress", "plot_error_figure",
           "write_results"]

Progress = Callable[[str, float], None]
"""``progress(label, fraction_done)``: fraction in [0, 1]; called by long runs."""


def no_progress(label: str, fraction: float) -> None:
    """A `Progress` that shows nothing."""


Comparison = Literal["<=", ">=", "==", "info"]


@dataclass(frozen=True)
class Figure:
    """One computed figure with its target.

    ``value`` is computed by code from a run, never typed in; ``None`` means the run could not
    produce it (for example, a fault never detected), which fails any target. ``target`` is the
    bound the issue sets ("must reach"); ``aim`` an optional tighter one reported beside it.
    ``detail`` says how it was computed (seeds, median/p90, trace length).
    """

    name: str
    value: float | None
    unit: str
    target: float | None = None
    comparison: Comparison = "info"
    aim: float | None = None
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool | None:
        """True/False against ``target``; None for an information-only figure."""
        if self.comparison == "info" or self.target is None:
            return None
        return check(self.value, self.comparison, self.target)

    def as_json(self) -> dict[str, Any]:
        """The results.json entry: name, value, unit, target, pass (+ comparison, aim, detail)."""
        d = asdict(self)
        d["pass"] = self.passed
        if d["value"] is not None and not math.isfinite(d["value"]):
            d["value"] = None
        return d


def plot_error_figure(name: str, err: BaseException) -> Figure:
    """An information-only figure recording that a plot could not be drawn (the figures it
    would have shown are reported all the same; a missing plot is not a failed figure)."""
    return Figure(name=name, value=None, unit="", comparison="info",
                  detail=f"plot not drawn: {type(err).__name__}: {err}"[:500])


def check(value: float | None, comparison: Comparison, target: float) -> bool:
    """Whether ``value`` meets ``target`` under ``comparison`` (None never does)."""
    if value is None or not math.isfinite(value):
        return False
    if comparison == "<=":
        return value <= target
    if comparison == ">=":
        return value >= target
    if comparison == "==":
        return value == target
    return True


def _fmt(v: float | None) -> str:
    if v is None:
        return "—"
    if v == 0 or 1e-3 <= abs(v) < 1e6:
        return f"{v:.4g}"
    return f"{v:.3e}"


def markdown_table(figures: Sequence[Figure], title: str = "") -> str:
    """A Markdown table of ``figures`` (name, value, unit, target, pass, detail)."""
    lines = [f"## {title}", ""] if title else []
    lines += ["| figure | value | unit | target | pass | how |", "|---|---:|---|---|---|---|"]
    for f in figures:
        target = ""
        if f.target is not None and f.comparison != "info":
            target = f"{f.comparison} {_fmt(f.target)}"
        if f.aim is not None:
            target += f" (aim {_fmt(f.aim)})"
        verdict = {True: "pass", False: "**FAIL**", None: ""}[f.passed]
        value = _fmt(f.value)
        lines.append(f"| `{f.name}` | {value} | {f.unit} | {target} | {verdict} | {f.detail} |")
    return "\n".join(lines) + "\n"


def write_results(out: Path, figures: Iterable[Figure], title: str, preamble: str = "") -> Path:
    """Write ``out/results.json`` (a list of `Figure.as_json`) and ``out/results.md``.

    Returns the Markdown path. Raises OSError when ``out`` cannot be written.
    """
    figs = list(figures)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps([f.as_json() for f in figs], indent=2) + "\n")
    md = out / "results.md"
    md.write_text(f"# {title}\n\n{preamble}\n\n" + markdown_table(figs))
    return md
