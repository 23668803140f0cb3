"""`make demo` on embedded defaults: no servers, the real processes (valvey and racky on the
rack simulator), a summary and a plot."""

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
    # racky runs in the demo: valvey's feedforward has its primary source, racky's rack power
    assert not [a for a in summary["alarms_raised"] if "feedforward_source_lost" in a]
    assert summary["ff_source_share"].get("rack_power", 0) > 0.5, summary["ff_source_share"]
    assert summary["racky"]["lifecycle"] == "provisioning"
    assert summary["racky"]["budget_w"] == 140_000.0 and summary["racky"]["exit_code"] == 0
    assert 30_000 < summary["racky"]["rack_power_max_w"] < 140_000, summary["racky"]
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


def test_demo_summary_names_the_control_mode_that_ran() -> None:
    """Not "PI control" when feedforward ran (F3): the mode comes from valvey's own state."""
    from harness.demo import alarm_note, control_mode_from_states

    def st(enabled: bool, source: str) -> dict[str, object]:
        return {"feedforward": {"enabled": enabled, "source": source}}

    assert control_mode_from_states([st(False, "none")] * 3) == "PI only"
    assert control_mode_from_states([]) == "PI only"
    heat = control_mode_from_states([st(True, "none"), st(True, "heat_removed")])
    assert heat == ("PI + feedforward from the CDU's heat removed (racky's rack power "
                    "missing or stale)")
    both = control_mode_from_states([st(True, "rack_power"), st(True, "heat_removed")])
    assert both.startswith("PI + feedforward from racky's rack power then the CDU's")
    assert alarm_note("valvey:feedforward_source_lost") == "" and alarm_note("x") == ""
