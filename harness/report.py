"""The scenario quality report (issue 8): every standard scenario in lock-step, its control and
detection figures, a Markdown table and plots.

``rackctl scenarios --out DIR [--quick] [--only NAME...]`` calls `main`. The figures come from
the daemons' own lock-step runners, each a ``(out, progress, quick) -> list[Figure]`` function:

* ``harness.lockstep_valvey.valvey_scenario_figures``: valvey on S1-S6, S9 (control: max and RMS
  error, settling, valve reversals and strokes, recovery times; supply-loop detection), with
  its plots of supply temperature, valve, pump and power per control scenario;
* ``harness.lockstep_racky.racky_scenario_figures``: racky on S3, S4, S6-S10 (detection
  latency, false alarms, caps), beside a Prometheus-style static rule on the same traces.

A source that is missing or raises is recorded as one failed figure ``<daemon>.report.error``
(value None, the error in ``detail``) and the report goes on. ``DIR`` receives
``results.json`` and ``results.md`` (`harness.figures.write_results`), the sources' PNGs and
``machine.json``: the host (`harness.machine.machine_info`), the mode, and the run's wall time
and CPU seconds (``wall_s``, ``cpu_s``), which the first line of ``results.md`` also states.

Plots are optional (matplotlib, the ``tools`` extra); figures are not. `main` checks the plot
dependencies before the first run (`plot_dependency_problem`): when they are missing it says
so at once, runs every scenario without plots and records an information-only
``report.plots`` figure naming the missing module. A plot that fails while drawing is recorded
by its source as ``<daemon>.report.plot_error.*`` (information only) after its figures are
computed: a plot never costs a figure.
"""

from __future__ import annotations

import importlib
import json
import re
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from harness.figures import Figure, write_results
from harness.machine import cpu_seconds, machine_info, machine_line
from harness.progress import progress_reporter

__all__ = ["PLOT_MODULES", "SOURCES", "SOURCE_SCENARIOS", "Source", "collect", "main",
           "plot_dependency_problem"]

Source = tuple[str, str, str]
"""``(daemon, module, function)`` of one figure source."""

SOURCES: tuple[Source, ...] = (
    ("valvey", "harness.lockstep_valvey", "valvey_scenario_figures"),
    ("racky", "harness.lockstep_racky", "racky_scenario_figures"),
)


PLOT_MODULES = ("matplotlib", "matplotlib.pyplot")
"""What drawing the plots needs (the ``tools`` extra)."""


def plot_dependency_problem() -> str | None:
    """Why the plots cannot be drawn (a `PLOT_MODULES` module missing or failing to import
    with the Agg backend), or None when they can. Imports matplotlib (~0.3 s)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        for name in PLOT_MODULES:
            importlib.import_module(name)
    except Exception as err:  # ImportError, or a broken install raising anything else
        return f"{type(err).__name__}: {err}"
    return None


def _error_figure(daemon: str, what: str) -> Figure:
    return Figure(
        name=f"{daemon}.report.error", value=None, unit="", target=0.0, comparison="==",
        detail=what.replace("|", "\\|").replace("\n", " ")[:500],
    )


#: REFERENCE §5: the standard scenarios' names and their ids in figure names.
SCENARIO_IDS = {
    "load-step": "S1", "agentic-bursts": "S2", "pump-trip": "S3", "valve-stuck": "S4",
    "sensor-dropout": "S5", "leak": "S6", "flapping-link": "S7", "rising-crc": "S8",
    "facility-water-rise": "S9", "psu-failure": "S10",
}


#: Scenario ids whose figures each source can produce (module docstring; a superset is safe:
#: it only means a source runs when ``--only`` might need it).
SOURCE_SCENARIOS: dict[str, frozenset[str]] = {
    "valvey": frozenset({"S1", "S2", "S3", "S4", "S5", "S6", "S9"}),
    "racky": frozenset({"S2", "S3", "S4", "S6", "S7", "S8", "S9", "S10"}),
}

_SID_RE = re.compile(r"^(S\d+)[a-z]?$")


def _source_needed(daemon: str, filters: Sequence[str]) -> bool:
    """Whether source ``daemon`` can yield a figure that scenario/prefix ``filters`` keep
    (True when unsure: a filter that is neither a scenario id or name nor a ``<daemon>.``
    prefix)."""
    if not filters:
        return True
    covered = SOURCE_SCENARIOS.get(daemon)
    for o in filters:
        head, dot, _ = o.partition(".")
        if dot and head in SOURCE_SCENARIOS:  # a name prefix such as valvey.S1
            if head == daemon:
                return True
            continue
        m = _SID_RE.match(SCENARIO_IDS.get(o, o))
        if m is None or covered is None or m.group(1) in covered:
            return True
    return False


def _matches(name: str, only: Sequence[str] | None) -> bool:
    """Whether figure ``name`` is selected by ``only``: a scenario id (``S6`` also selects its
    variants ``S6a``.., never ``S60``), a scenario name (``leak``), or a name prefix."""
    if not only:
        return True
    parts = name.split(".")
    for o in only:
        sid = SCENARIO_IDS.get(o, o)
        if name.startswith(o) or any(
            p == sid or (p.startswith(sid) and not p[len(sid):len(sid) + 1].isdigit()
                         and sid[:1] == "S" and sid[1:].isdigit())
            for p in parts
        ):
            return True
    return False


def collect(
    out: Path | None,
    progress: Callable[[str, float], None],
    quick: bool,
    only: Sequence[str] | None = None,
    sources: Sequence[Source] | None = None,
    plots: bool = True,
) -> list[Figure]:
    """Run every source (lazily imported) and return their figures.

    ``plots`` False: the sources get no output folder (they compute every figure and draw no
    plot).

    ``only`` keeps sources whose daemon is named and, within a source, figures of the given
    scenarios (id ``S1`` or name ``load-step``) or name prefixes. A source that cannot yield
    any requested scenario (`SOURCE_SCENARIOS`) is skipped; a source that runs still runs
    every scenario it has (they take no filter), only the figures kept are reported. A source that
    cannot be imported or raises yields one failed ``<daemon>.report.error`` figure.
    """
    sources = SOURCES if sources is None else sources
    figures: list[Figure] = []
    daemons = {s[0] for s in (*SOURCES, *sources)}
    picked_daemons = {o for o in (only or ()) if o in daemons}
    for daemon, module, func in sources:
        if picked_daemons and daemon not in picked_daemons:
            continue
        if not picked_daemons and not _source_needed(
                daemon, [o for o in (only or ()) if o not in daemons]):
            continue
        label = f"{daemon} scenarios"
        progress(label, 0.0)
        try:
            fn = getattr(importlib.import_module(module), func)
        except (ImportError, AttributeError) as err:
            figures.append(_error_figure(daemon, f"{module}.{func} is missing: {err}"))
            progress(label, 1.0)
            continue

        def sub(lbl: str, frac: float, _d: str = daemon) -> None:
            progress(lbl if lbl.startswith(_d) else f"{_d}: {lbl}", frac)

        try:
            got = list(fn(out if plots else None, sub, quick))
        except Exception as err:  # a crashing source is a failed figure, never a crashed report
            tb = traceback.format_exception_only(type(err), err)[-1].strip()
            figures.append(_error_figure(daemon, f"{module}.{func} raised {tb}"))
            progress(label, 1.0)
            continue
        rest = [o for o in (only or ()) if o not in daemons]
        figures += [f for f in got if _matches(f.name, rest)]
        progress(label, 1.0)
    return figures


def main(out: Path, quick: bool, only: list[str] | None) -> int:
    """Run the scenario report into ``out``; 0 when every figure passes, 1 otherwise.

    ``quick`` shortens traces and seeds (a smoke run, minutes not tens of minutes); ``only``
    limits the run to daemons (``valvey``/``racky``), scenario ids (``S1``) or figure names.
    """
    out.mkdir(parents=True, exist_ok=True)
    problem = plot_dependency_problem()  # before the runs: said at once, not after them
    figures: list[Figure] = []
    if problem is not None:
        print(f"plots: off ({problem}); install the tools extra (pip install "
              "'rackplane[tools]') for them. Every figure is computed and written all the "
              "same.", flush=True)
        figures.append(Figure(name="report.plots", value=None, unit="", comparison="info",
                              detail=f"no plots drawn: {problem}"))
    progress, close = progress_reporter()
    t0 = time.monotonic()
    cpu0 = cpu_seconds()
    machine = machine_info()
    md = out / "results.md"

    def write(done: str) -> Path:
        wall = time.monotonic() - t0
        cpu = cpu_seconds() - cpu0
        preamble = (
            f"Lock-step runs of the standard scenarios ({'quick' if quick else 'full'} mode"
            f"{done}) on {machine_line(machine)}. Took {wall:.0f} s wall, {cpu:.0f} CPU-s "
            "(this process and its finished worker processes). Every value is computed from "
            "a run; see docs/BENCHMARKS.md."
        )
        (out / "machine.json").write_text(json.dumps(
            {**machine, "mode": "quick" if quick else "full", "wall_s": round(wall, 1),
             "cpu_s": round(cpu, 1), "complete": not done}, indent=2) + "\n")
        return write_results(out, figures, "rackplane scenario quality report", preamble)

    try:
        for i, src in enumerate(SOURCES):
            figures += collect(out, progress, quick, only, [src], plots=problem is None)
            # after each source, so an interrupted run still leaves what it computed
            md = write("" if i == len(SOURCES) - 1 else f"; partial: {src[0]} done")
    finally:
        close()
    failed = [f.name for f in figures if f.passed is False]
    print(f"{len(figures)} figures, {len(failed)} failed; {md}")
    return 1 if failed else 0
