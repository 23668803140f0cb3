"""`make demo` on embedded defaults: no servers, the real processes, a summary and a plot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_demo_runs_on_embedded_defaults(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "rackctl", "demo", "--duration", "25",
         "--scenario", "load-step-short", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (run_dir,) = tmp_path.iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["valvey_exit_code"] == 0
    assert summary["points_spooled"] > 50
    assert Path(summary["spool_dir"]).is_dir()
    (step,) = summary["steps"]
    assert step["disturbance"] == "load step up"
    assert 0 < step["valvey_pv"]["max_abs_error_k"] < 3
    png = Path(summary["plot"]).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert "demo summary" in r.stdout and "points spooled" in r.stdout
    # The spool is line protocol a replay can send: the loop's own measurement is in it.
    seg = next((run_dir / "spool").glob("*.lp")).read_text()
    assert seg.startswith("# rackplane-spool v1") and "\npid," in seg
