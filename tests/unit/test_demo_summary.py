"""The demo summary's racky and operator-command lines (harness.demo.summary), computed
from MQTT messages fed through the demo's own `Recorder`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.demo import Recorder
from harness.demo.summary import DemoSummary, command_lists, racky_summary, summary_markdown
from rackplane.core.topics import Message

BASE = "rackplane/lab/r12"
MONO0 = 1000.0
"""Monotonic time at plant t = 0 in these recordings, s."""


def _feed(rec: Recorder, t_s: float, topic: str, payload: Any) -> None:
    body = b"" if payload is None else json.dumps(payload).encode()
    rec.on_message(Message(f"{BASE}/{topic}", body, received_mono=MONO0 + t_s))


def _rack(limit_w: float, source: str) -> dict[str, Any]:
    return {"lifecycle": {"state": "production", "by": "racky", "reason": "validated"},
            "limit_w": limit_w, "limit_source": source, "budget_w": 140_000.0}


def test_time_above_the_limit_counts_each_sample_against_the_limit_then() -> None:
    """The rack runs at 100 kW under a 140 kW limit for 90 s; then valvey's request lowers
    the limit to 26 kW and racky brings the rack to 25 kW within 3 s. Above the limit in
    force: the 3 samples before the caps took hold, not the 90 s at 100 kW under 140 kW
    (the final limit counted those)."""
    rec = Recorder()
    _feed(rec, 0.0, "sim/telemetry/plant", {"t_s": 0.0, "supply_temp_c": 45.0})
    _feed(rec, 0.5, "racky/state/rack", _rack(140_000.0, "budget"))
    for t in range(1, 91):
        _feed(rec, float(t), "racky/state/rack_power", {"rack_power_w": 100_000.0})
    _feed(rec, 90.5, "racky/state/rack", _rack(26_000.0, "requested:valvey"))
    for t in range(91, 94):
        _feed(rec, float(t), "racky/state/rack_power", {"rack_power_w": 60_000.0})
    for t in range(94, 120):
        _feed(rec, float(t), "racky/state/rack_power", {"rack_power_w": 25_000.0})
        _feed(rec, t + 0.5, "racky/state/rack", _rack(26_000.0, "requested:valvey"))
    s = racky_summary(rec)
    assert s is not None
    assert s.limit_w == 26_000.0 and s.limit_source == "requested:valvey"
    assert s.over_limit_s == 3.0
    assert [lim for _, lim, _ in rec.limit_log] == [140_000.0, 26_000.0]
    assert rec.limit_at(0.2) is None and rec.limit_at(90.0) == 140_000.0


def test_no_limit_published_yet_counts_no_sample_above_it() -> None:
    rec = Recorder()
    _feed(rec, 0.0, "sim/telemetry/plant", {"t_s": 0.0, "supply_temp_c": 45.0})
    for t in range(1, 11):
        _feed(rec, float(t), "racky/state/rack_power", {"rack_power_w": 50_000.0})
    _feed(rec, 10.5, "racky/state/rack", _rack(40_000.0, "budget"))
    _feed(rec, 11.0, "racky/state/rack_power", {"rack_power_w": 50_000.0})
    s = racky_summary(rec)
    assert s is not None and s.over_limit_s == 1.0


def _command(rec: Recorder, t_s: float, user: str, verb: str, rid: str,
             reply: dict[str, Any] | None, daemon: str = "racky") -> None:
    _feed(rec, t_s, f"{daemon}/cmd/{user}/{verb}", {"request_id": rid, "args": {}})
    if reply is not None:  # on the MQTT v5 response topic below result/ (rackctl's)
        _feed(rec, t_s + 0.1, f"{daemon}/cmd/{user}/{verb}/result/n1",
              {"request_id": rid, **reply})


REFUSED: dict[str, Any] = {"ok": False, "state": None,
                           "error": {"code": "not_authorized", "message": "no"}}
ACCEPTED: dict[str, Any] = {"ok": True, "error": None, "state": {}}


def _summary(rec: Recorder) -> DemoSummary:
    s = DemoSummary(scenario="demo-load-step", duration_s=60.0, steps=[], points_spooled=0,
                    spool_dir="-", valvey_exit_code=0, alarms_raised=[], plot=None,
                    trace_csv="-", run_dir="-", max_gpu_tj_c=None)
    for name, lines in command_lists(rec).items():
        setattr(s, name, lines)
    return s


def test_commands_all_refused_say_the_figures_include_none_of_their_effects() -> None:
    rec = Recorder()
    _feed(rec, 0.0, "sim/telemetry/plant", {"t_s": 0.0, "supply_temp_c": 45.0})
    for k in range(21):
        _command(rec, 10.0 + k, "operator", "set_lifecycle", f"r{k}", REFUSED)
    s = _summary(rec)
    assert len(s.commands) == 21 and len(s.commands_refused) == 21
    assert s.commands_accepted == [] and s.commands_unanswered == []
    assert s.commands_refused[0] == "10 s operator → racky set_lifecycle (not_authorized)"
    text = summary_markdown(s)
    assert "operator commands during the run (21): 0 accepted; 21 refused: " in text
    assert "include no command's effect" in text
    assert "include the effects of" not in text


def test_accepted_refused_and_unanswered_commands_are_named_apart() -> None:
    rec = Recorder()
    _feed(rec, 0.0, "sim/telemetry/plant", {"t_s": 0.0, "supply_temp_c": 45.0})
    _command(rec, 20.0, "operator", "shelve_alarm", "a1", ACCEPTED)
    _command(rec, 30.0, "operator", "set_lifecycle", "a2", REFUSED)
    _command(rec, 40.0, "operator", "set_setpoint", "a3", ACCEPTED, daemon="valvey")
    _command(rec, 50.0, "operator", "shelve_alarm", "a4", None)
    # another user's reply with the same request id is not this command's
    _feed(rec, 50.2, "racky/cmd/other/shelve_alarm/result", {"request_id": "a4", **ACCEPTED})
    s = _summary(rec)
    assert s.commands_accepted == ["20 s operator → racky shelve_alarm",
                                   "40 s operator → valvey set_setpoint"]
    assert s.commands_refused == ["30 s operator → racky set_lifecycle (not_authorized)"]
    assert s.commands_unanswered == ["50 s operator → racky shelve_alarm"]
    text = summary_markdown(s)
    assert ("operator commands during the run (4): 2 accepted: 20 s operator → racky "
            "shelve_alarm, 40 s operator → valvey set_setpoint; 1 refused: 30 s operator → "
            "racky set_lifecycle (not_authorized); 1 with no reply seen: 50 s operator → racky "
            "shelve_alarm; the figures above include the effects of the 2 accepted only") in text


def test_the_tray_agent_s_exit_code_is_the_simulator_process_s_after_sigterm(
        tmp_path: Path) -> None:
    """The trays report through the real tray agent in each rack's simulator process
    (harness.simagent): its exit code after SIGTERM is in the rack's summary beside valvey's
    and racky's, taken from the process when the demo stops the rack."""
    import asyncio
    import sys

    from rich.console import Console

    from harness.demo.racks import DemoRack, stop_rack
    from harness.demo.summary import print_summary
    from sims.scenario import load_scenario

    async def run() -> DemoRack:
        rack = DemoRack("r12", tmp_path, load_scenario("demo-load-step"), "demo-load-step",
                        0, 0, 140_000.0)
        # stands in for the simulator: exits 3 on SIGTERM (the real one: 0)
        rack.sim = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))\n"
            "print('up', flush=True)\ntime.sleep(60)", stdout=asyncio.subprocess.PIPE)
        assert rack.sim.stdout is not None
        await rack.sim.stdout.readline()  # the handler is installed
        await stop_rack(rack)
        return rack

    rack = asyncio.run(run())
    assert rack.sim_rc == 3 and rack.valvey_rc is None
    s = DemoSummary(scenario="demo-load-step", duration_s=60.0, steps=[], points_spooled=0,
                    spool_dir="-", valvey_exit_code=0, alarms_raised=[], plot=None,
                    trace_csv="-", run_dir="-", max_gpu_tj_c=None,
                    tray_agent_exit_code=rack.sim_rc)
    line = "Tray agent (in the simulator's process) exit code after SIGTERM: 3."
    assert line in summary_markdown(s)
    console = Console(record=True, width=200)
    print_summary(s, console)
    assert line in console.export_text()
    s.tray_agent_exit_code = None
    assert "exit code after SIGTERM: — (not started)" in summary_markdown(s)
