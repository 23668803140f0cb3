"""`make demo` on embedded defaults: no servers, the real processes (valvey and racky on the
rack simulator), a summary and a plot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


FAULTS_SHORT = """
name = "demo-faults-short"
description = "the demo's faults, short: load step at 8 s, link flap from 20 s, pump trip 32 s"
duration_s = 42.0
seed = 1

[plant]
rack_max_power_w = 132000.0
model = "rack"

[load]
kind = "step"
low_w = 39600.0
high_w = 132000.0
step_at_s = 8.0

[[faults]]
at_s = 20.0
kind = "link_flap"
port = "gpu07/nic1"
down_s = 2.0
up_s = 2.0
count = 3

[[faults]]
at_s = 32.0
kind = "pump_trip"
pump = 0
"""
"""demo-load-step's faults (a link flap of 3 downs, then the duty pump's trip) on a 42 s
timeline: the demo's processes and checklist in a bounded test."""


def test_demo_runs_on_embedded_defaults(tmp_path: Path) -> None:
    scenario = tmp_path / "demo-faults-short.toml"
    scenario.write_text(FAULTS_SHORT)
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-m", "rackctl", "demo", "--racks", "1", "--scenario", str(scenario),
         "--out",
         str(out)],
        capture_output=True, text=True, timeout=150, cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (run_dir,) = out.iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["valvey_exit_code"] == 0
    assert summary["points_spooled"] > 50
    # racky runs in the demo: valvey's feedforward has its primary source, racky's rack power
    assert not [a for a in summary["alarms_raised"] if "feedforward_source_lost" in a]
    assert summary["ff_source_share"].get("rack_power", 0) > 0.5, summary["ff_source_share"]
    assert summary["racky"]["budget_w"] == 140_000.0 and summary["racky"]["exit_code"] == 0
    assert 30_000 < summary["racky"]["rack_power_max_w"] < 140_000, summary["racky"]
    assert Path(summary["spool_dir"]).is_dir()
    (step,) = summary["steps"]
    assert step["disturbance"] == "load step up"
    assert 0 < step["valvey_pv"]["max_abs_error_k"] < 3
    png = Path(summary["plot"]).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert "demo summary" in r.stdout and "points spooled" in r.stdout
    # the trays (and their link ports, whose flap racky detects below) came through the real
    # tray agent: the simulator publishes no trayNN of its own, racky reads the agents' level
    assert summary["trays"].startswith("18 trays per rack through the real tray agent")
    assert "trays: 18 trays per rack through the real tray agent" in r.stdout
    assert 'daemon = "trays"' in (run_dir / "racky.toml").read_text()
    assert (run_dir / "tray-agent-spool").is_dir()  # the agent's own files in the run folder
    # The spool is line protocol a replay can send: the loop's own measurement is in it.
    seg = next((run_dir / "spool").glob("*.lp")).read_text()
    assert seg.startswith("# rackplane-spool v1") and "\npid," in seg
    # the checklist (issue 20): each item as the run's own records show it
    items = {c["label"].split(" ", 2)[0] + " " + c["label"].split(" ", 2)[1]: c
             for c in summary["checklist"]}
    assert set(items) == {"load step", "link flap", "rack held", "pump trip", "no unexpected"}
    flap, held, pump = items["link flap"], items["rack held"], items["pump trip"]
    assert flap["ok"] and held["ok"] and pump["ok"], summary["checklist"]
    # the flap's alarm as the summary's alarm list has it, after the 3rd down (t = 28 s)
    (t_flap,) = [float(a.split(" s ", 1)[0]) for a in summary["alarms_raised"]
                 if "racky:link_flapping:gpu07-nic1 raised" in a]
    assert 28 <= t_flap <= 32, summary["alarms_raised"]
    t_item = float(flap["detail"].split("raised at t = ", 1)[1].split(" s", 1)[0])
    assert abs(t_item - t_flap) <= 0.5, (flap["detail"], t_flap)  # the list rounds to 1 s
    # racky's own persisted state: quarantined by racky on that alarm, no passed validation
    lc = json.loads((run_dir / "racky-state.json").read_text())["lifecycle"]
    assert lc["state"] == "quarantined" and lc["by"] == "racky" and not lc["validated"], lc
    assert "link_flapping:gpu07-nic1" in lc["reason"]
    assert summary["racky"]["lifecycle"] == "quarantined"
    # valvey logged the trip and the standby took over within seconds of it (t = 32 s)
    assert '"kind": "pump_trip"' in (run_dir / "valvey.log").read_text()
    takeover_s = float(pump["detail"].split("(takeover ", 1)[1].split(" s", 1)[0])
    assert 0 < takeover_s < 5, pump["detail"]
    assert "checklist" in r.stdout and "[x] pump trip at t = 32 s" in r.stdout
    # "no unexpected alarms" as the alarm list has it: at full load the trip may also heat
    # the GPUs (racky's rack_overheat), which no scripted fault's target explains
    raised = {a.split(" ")[2] for a in summary["alarms_raised"] if a.endswith(" raised")}
    odd = {k for k in raised if k != "racky:link_flapping:gpu07-nic1"
           and not k.startswith("valvey:pump_")}
    none_odd = items["no unexpected"]
    assert none_odd["ok"] == (not odd), (none_odd, raised)
    assert all(k in none_odd["detail"] for k in odd), (none_odd, odd)


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
