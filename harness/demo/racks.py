"""The demo's racks: one or more, each its own simulator process (CDU, power shelves, link
fabric, and its 18 trays through the real tray agent: `harness.simagent`, the agent's GPU,
BMC and link sources simulated) on its own Modbus ports, its own valvey and racky under its
own identity, all on one broker; each rack's records (`Recorder`) and summary
(`DemoSummary`).

One rack (``rackctl demo``) keeps the run folder's layout of before (its files in the run
folder itself); with ``--racks N`` (N >= 2) each rack has its folder ``<run>/<rack>/`` and
its own scenario file there: the demo's scenario with its share of the scripted faults
(`split_faults`) and its own seed. In a row of the demo's scenario every second rack (r13,
r15) runs the agentic burst load instead of the load step (`ROW_LOADS`:
config/scenarios/demo-agentic-bursts.toml, same duration and plant), with its share of the
faults all the same."""

from __future__ import annotations

import asyncio
import csv
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from harness.demo.bursts import burst_figures
from harness.demo.checklist import checklist
from harness.demo.procs import (
    DEMO_RACK,
    DEMO_SITE,
    RACK_NAMES,
    TRAYS_VIA,
    racky_config,
    spawn,
    terminate,
    valvey_config,
    write_toml,
)
from harness.demo.record import Recorder, alarm_note, control_mode_from_states
from harness.demo.summary import (
    DemoSummary,
    command_lists,
    count_spooled,
    ff_source_share,
    load_pattern,
    racky_summary,
    summarise,
    summary_markdown,
    write_plot,
)
from harness.servers import free_port
from sims.scenario import FaultSpec, Scenario, load_scenario

__all__ = ["MAX_RACKS", "ROW_LOADS", "DemoRack", "finish_rack", "overlay", "plan_racks",
           "rack_scenarios", "split_faults", "start_daemons", "start_sim", "stop_rack",
           "write_trace"]

MAX_RACKS = len(RACK_NAMES)
ROW_LOADS: dict[str, str] = {"demo-load-step": "demo-agentic-bursts"}
"""A row's scenario -> the bundled scenario every second rack of the row (r13, r15) runs
instead: the demo's load step alternates with S2's agentic bursts (issue 20), so the row
shows both patterns. A row of any other scenario runs it on every rack."""


@dataclass
class DemoRack:
    """One rack of the demo: its name, folder, scenario, ports, processes and records."""

    name: str
    dir: Path
    scenario: Scenario
    scenario_ref: str
    """What the simulator gets as ``--scenario``: a bundled name or a TOML path."""
    modbus_port: int
    shelf_port: int
    budget_w: float
    """racky's rack power budget, W."""
    rec: Recorder = field(default_factory=Recorder)
    sim: asyncio.subprocess.Process | None = None
    valvey: asyncio.subprocess.Process | None = None
    racky: asyncio.subprocess.Process | None = None
    valvey_rc: int | None = None
    racky_rc: int | None = None
    sim_rc: int | None = None
    """The exit code of the rack's simulator + tray agent process (`start_sim`) after SIGTERM."""
    end_t_s: float | None = None
    """The run's end on this rack's plant clock, s: set when the demo stops it."""
    racky_extra: dict[str, Any] = field(default_factory=dict)
    """Sections laid over racky's demo config (`overlay`; a row under rlc:
    `harness.demo.fleet.RowFleet.racky_overrides`)."""
    explained_alarms: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Alarms the run's setup explains (`harness.demo.checklist.checklist`'s ``explained``)."""

    def end_t(self) -> float:
        """`end_t_s`, else the last plant time this rack's simulator published, s (0: none)."""
        if self.end_t_s is not None:
            return self.end_t_s
        return float(self.rec.plant[-1]["t_s"]) if self.rec.plant else 0.0

    def processes(self) -> list[tuple[str, asyncio.subprocess.Process | None]]:
        return [(f"valvey ({self.name})", self.valvey), (f"racky ({self.name})", self.racky),
                (f"the simulator ({self.name})", self.sim)]


def split_faults(faults: Sequence[FaultSpec], n_racks: int) -> list[list[FaultSpec]]:
    """The scripted faults dealt to ``n_racks`` racks in turn (fault i to rack i mod N): the
    demo's link flap on the first rack, its pump trip on the second, so the row shows both;
    with more racks than faults the others run healthy."""
    if n_racks < 1:
        raise ValueError(f"n_racks must be >= 1, not {n_racks}")
    out: list[list[FaultSpec]] = [[] for _ in range(n_racks)]
    for i, f in enumerate(faults):
        out[i % n_racks].append(f)
    return out


def rack_scenarios(sc: Scenario, n_racks: int) -> list[Scenario]:
    """The scenario each rack of a row of ``n_racks`` runs (N >= 2), before its faults are
    dealt: ``sc`` (seed + rack index), every second rack `ROW_LOADS`' alternate for ``sc``
    when there is one (its own seed + the burst rack's count before it: r13 runs the file's
    seed, r15 the next).

    Raises:
        ValueError: ``n_racks`` < 2, or the alternate's duration differs from ``sc``'s (the
            racks of a row run together).
        ConfigError: the alternate does not load.
    """
    if n_racks < 2:
        raise ValueError(f"a row has 2 racks or more, not {n_racks}")
    other_name = ROW_LOADS.get(sc.name)
    other = load_scenario(other_name) if other_name else None
    if other is not None and other.duration_s != sc.duration_s:
        raise ValueError(f"{other.name} lasts {other.duration_s:g} s, {sc.name} "
                         f"{sc.duration_s:g} s: a row's racks must run as long")
    out = []
    for i in range(n_racks):
        if other is not None and i % 2 == 1:
            out.append(other.model_copy(update={"seed": other.seed + i // 2}))
        else:
            out.append(sc.model_copy(update={"seed": sc.seed + i}))
    return out


def plan_racks(n_racks: int, scenario_ref: str, sc: Scenario, run_dir: Path,
               budget_w: float) -> list[DemoRack]:
    """The demo's racks (`RACK_NAMES`' first ``n_racks``), their folders made and, for
    N >= 2, each one's scenario file written: `rack_scenarios`' (the load step or, every
    second rack of the demo's row, the agentic bursts) with the rack's share of ``sc``'s
    faults (`split_faults`).

    Raises:
        ValueError: ``n_racks`` outside 1..`MAX_RACKS`; see `rack_scenarios`.
        ConfigError: a rack's scenario does not load back (a bug here).
    """
    if not 1 <= n_racks <= MAX_RACKS:
        raise ValueError(f"racks must be 1..{MAX_RACKS}, not {n_racks}")
    if n_racks == 1:
        return [DemoRack(DEMO_RACK, run_dir, sc, scenario_ref, free_port(), free_port(),
                         budget_w)]
    racks = []
    for name, base, faults in zip(RACK_NAMES, rack_scenarios(sc, n_racks),
                                  split_faults(sc.faults, n_racks), strict=False):
        d = run_dir / name
        d.mkdir(parents=True, exist_ok=True)
        what = "; ".join(f"{f.kind} {f.target()} at t={f.at_s:g} s" for f in faults) or "none"
        rsc = base.model_copy(update={
            "faults": faults,
            "description": f"{base.description.split(';', 1)[0]}; rack {name}'s scripted "
                           f"faults: {what}"})
        path = d / f"scenario-{name}.toml"
        write_toml(path, rsc.model_dump(mode="json", exclude_none=True),
                   f"{base.name} for rack {name} (its share of the faults)")
        racks.append(DemoRack(name, d, load_scenario(path), str(path), free_port(),
                              free_port(), budget_w))
    return racks


async def start_sim(rack: DemoRack, mqtt_host: str, mqtt_port: int, protocol: str) -> None:
    """Start the rack's simulator under its identity, real time, its trays through the real
    tray agent in the same process (``python -m harness.simagent``: the virtual rack with its
    own node agents off, one `trayagent.app.TrayAgent` hosting its trays; the agent's cap
    epochs in ``tray-agent-epochs.json``, its spool in ``tray-agent-spool/``)."""
    rack.sim = await spawn(
        [sys.executable, "-m", "harness.simagent", "--scenario", rack.scenario_ref,
         "--modbus-port", str(rack.modbus_port), "--shelf-modbus-port", str(rack.shelf_port),
         "--site", DEMO_SITE, "--rack", rack.name, "--mqtt-host", mqtt_host,
         "--mqtt-port", str(mqtt_port), "--mqtt-protocol", protocol, "--log-format", "json",
         "--ground-truth", str(rack.dir / "ground-truth.json"),
         "--epoch-file", str((rack.dir / "tray-agent-epochs.json").resolve()),
         "--spool-dir", str((rack.dir / "tray-agent-spool").resolve())],
        rack.dir / "sim.log",
    )


def overlay(cfg: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` with each section of ``extra`` laid over its own (a key set to None removed;
    a section ``cfg`` lacks added)."""
    out = dict(cfg)
    for section, values in extra.items():
        merged = {**out.get(section, {}), **values}
        out[section] = {k: v for k, v in merged.items() if v is not None}
    return out


async def start_daemons(rack: DemoRack, mqtt_host: str, mqtt_port: int,
                        protocol: str) -> None:
    """Write the rack's valvey and racky configs into its folder and start both."""
    v_cfg, r_cfg = rack.dir / "valvey.toml", rack.dir / "racky.toml"
    write_toml(v_cfg, valvey_config(rack.dir, rack.modbus_port, mqtt_host, mqtt_port,
                                    protocol, rack.name),
               f"valvey against the rack simulator (rack {rack.name})")
    write_toml(r_cfg, overlay(racky_config(rack.dir, rack.shelf_port, mqtt_host, mqtt_port,
                                           protocol, rack.name, rack.budget_w), rack.racky_extra),
               f"racky against the rack simulator's power shelves (rack {rack.name})")
    py = sys.executable
    rack.racky = await spawn([py, "-m", "racky", "--config", str(r_cfg)], rack.dir / "racky.log")
    rack.valvey = await spawn([py, "-m", "valvey", "--config", str(v_cfg)],
                              rack.dir / "valvey.log")


async def stop_rack(rack: DemoRack) -> None:
    """SIGTERM the rack's daemons (then its simulator with its tray agent); their exit
    codes kept, the run's end (`DemoRack.end_t_s`) taken before."""
    rack.end_t_s = rack.end_t()
    rack.valvey_rc, rack.racky_rc = await asyncio.gather(terminate(rack.valvey, 20),
                                                         terminate(rack.racky, 20))
    rack.sim_rc = await terminate(rack.sim, 10)


def write_trace(path: Path, rec: Recorder) -> None:
    """valvey's loop states and the plant truth as one CSV (``source`` tells them apart)."""
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["source", "t_s", "supply_temp_c", "setpoint_c", "valve_command_pct",
                    "valve_position_pct", "rack_power_w", "mode"])
        for r in rec.loop:
            w.writerow(["valvey", f"{r['t_s']:.2f}", r.get("supply_temp_c"),
                        r.get("setpoint_c"), r.get("valve_command_pct"), "", "", r.get("mode")])
        for r in rec.plant:
            w.writerow(["plant", r["t_s"], r["supply_temp_c"], "", r["valve_command_pct"],
                        r["valve_position_pct"], r["rack_power_w"], ""])


def finish_rack(rack: DemoRack, console: Console, broker_problem: str | None,
                n_racks: int = 1) -> DemoSummary:
    """The rack's summary from its records: the step figures (a burst rack: its burst
    figures), the checklist, the trace, the plot (``demo.png``, or ``demo-<rack>.png`` in a
    row) and summary.json/.md in its folder."""
    rec, sc, end_t = rack.rec, rack.scenario, rack.end_t()
    steps = summarise(sc, rec, end_t)
    bursts = burst_figures(sc, rec, end_t)
    trace_csv = rack.dir / "trace.csv"
    write_trace(trace_csv, rec)
    plot: Path | None = rack.dir / ("demo.png" if n_racks == 1 else f"demo-{rack.name}.png")
    try:
        assert plot is not None
        write_plot(plot, sc, rec, rack=None if n_racks == 1 else rack.name, bursts=bursts)
    except Exception as err:  # a plot problem must not lose the summary
        console.print(f"[yellow]plot not written ({rack.name}): {err}[/]")
        plot = None
    tj = [r["hottest_gpu_tj_c"] for r in rec.plant if r.get("hottest_gpu_tj_c") is not None]
    rsum = racky_summary(rec)
    if rsum is not None:
        rsum.exit_code = rack.racky_rc
    spool_dir = rack.dir / "spool"
    summary = DemoSummary(
        scenario=sc.name,
        duration_s=round(end_t, 1),
        steps=steps,
        points_spooled=count_spooled(spool_dir) if spool_dir.exists() else 0,
        spool_dir=str(spool_dir),
        valvey_exit_code=rack.valvey_rc,
        tray_agent_exit_code=rack.sim_rc,
        alarms_raised=[f"{t:.0f} s {a} {k}{alarm_note(a) if k == 'raised' else ''}"
                       for t, a, k in rec.alarm_log],
        control_mode=control_mode_from_states(rec.loop),
        plot=str(plot) if plot else None,
        trace_csv=str(trace_csv),
        run_dir=str(rack.dir),
        max_gpu_tj_c=max(tj) if tj else None,
        broker_problem=broker_problem,
        ff_source_share=ff_source_share(rec.loop),
        racky=rsum,
        **command_lists(rec),
        checklist=[c.as_dict() for c in checklist(sc, rec, steps, end_t, bursts=bursts,
                                                   explained=rack.explained_alarms)],
        rack=rack.name,
        load=load_pattern(sc),
        bursts=bursts,
        trays=TRAYS_VIA,
    )
    (rack.dir / "summary.json").write_text(json.dumps(summary.as_dict(), indent=2))
    (rack.dir / "summary.md").write_text(summary_markdown(summary))
    return summary
