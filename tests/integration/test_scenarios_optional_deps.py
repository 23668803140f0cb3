"""``rackctl scenarios`` without the ``tools`` extra (issue 14 item 20): the missing plotting
library is said before the runs, and every computed figure is written; a plot that fails while
drawing is recorded, never fatal. Quick mode, in a subprocess where matplotlib is blocked
(``sys.modules["matplotlib"] = None``: what an install without the extra sees), with valvey's
lock-step jobs cut to the ones named (the report and plotting path are the real ones)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

DRIVER = """
import sys
mode, out, keys = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
if mode == "no-matplotlib":
    sys.modules["matplotlib"] = None  # an install without the tools extra
    sys.modules["matplotlib.pyplot"] = None
import harness.lockstep_valvey.scenario_report as lv
full_jobs = lv._jobs
lv._jobs = lambda quick: [j for j in full_jobs(quick) if j.key in keys]
if mode == "plot-raises":
    def broken_plot(*args, **kwargs):
        raise RuntimeError("the plot backend fell over")
    lv.plot_run = broken_plot
from rackctl.cli import main
sys.argv = ["rackctl", "scenarios", "--quick", "--only", "valvey", "--out", out]
sys.exit(main())
"""


def _run(tmp_path: Path, mode: str) -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    out = tmp_path / "report"
    r = subprocess.run([sys.executable, "-c", DRIVER, mode, str(out), "S5"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    results = json.loads((out / "results.json").read_text()) if (
        out / "results.json").exists() else []
    return r, results


def test_without_matplotlib_the_figures_are_written_and_the_gap_said_first(
        tmp_path: Path) -> None:
    r, results = _run(tmp_path, "no-matplotlib")
    out = r.stdout + r.stderr
    names = {f["name"] for f in results}
    assert "valvey.report.error" not in names, out[-3000:]
    assert any(n.startswith("valvey.S5.") for n in names), names
    (plots,) = [f for f in results if f["name"] == "report.plots"]
    assert plots["pass"] is None and "matplotlib" in plots["detail"]
    # Said before the runs: the first line of output, naming the module and the extra.
    first = r.stdout.lstrip().splitlines()[0]
    assert first.startswith("plots: off") and "matplotlib" in first and "tools" in first, out
    assert not list((tmp_path / "report").glob("*.png"))
    assert "Traceback" not in out, out[-3000:]


def test_a_plot_that_fails_to_draw_is_recorded_not_fatal(tmp_path: Path) -> None:
    r, results = _run(tmp_path, "plot-raises")
    out = r.stdout + r.stderr
    names = {f["name"] for f in results}
    assert "valvey.report.error" not in names, out[-3000:]
    assert any(n.startswith("valvey.S5.") for n in names), names
    errs = [f for f in results if f["name"].startswith("valvey.report.plot_error.")]
    assert errs and all(f["pass"] is None and "fell over" in f["detail"] for f in errs)
