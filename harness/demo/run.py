"""`run_demo`: start the demo's processes, show the live view, record, summarise."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import time
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from harness.demo.fleet import RowFleet, start_row_fleet
from harness.demo.procs import (
    BROKER_PROBE_S,
    DEMO_RACK,
    DEMO_SITE,
    RACKY_BUDGET_W,
    access_lines,
    probe_broker,
    route_broker_logging,
    start_amqtt,
    write_rackctl_config,
)
from harness.demo.racks import (
    MAX_RACKS,
    DemoRack,
    finish_rack,
    plan_racks,
    start_daemons,
    start_sim,
    stop_rack,
)
from harness.demo.record import Recorder
from harness.demo.row import (
    ROW_LIMIT_PER_RACK_W,
    RowSummary,
    rack_power_series,
    row_figures,
    row_line,
    row_markdown,
    row_power,
    row_power_item,
    row_t0,
    row_view,
    write_row_plot,
)
from harness.demo.summary import BAND_K, DemoSummary
from harness.machine import machine_info, machine_line
from harness.servers import free_port
from rackplane.clock import SYSTEM_CLOCK
from rackplane.io.mqtt import MqttLink
from rackplane.settings import Identity, MqttSettings
from sims.scenario import Scenario, load_scenario

__all__ = ["DEFAULT_SCENARIO", "SPARK", "run_demo"]

DEFAULT_SCENARIO = "demo-load-step"
"""S1's load step on the virtual rack with demo timing (config/scenarios/demo-load-step.toml)."""
SPARK = "▁▂▃▄▅▆▇█"
EVENTS_SHOWN = 8
"""Alarms and actions the live view lists (the latest)."""
ANNOUNCE_AFTER_S = 30.0
"""How long the demo waits for valvey and racky to be online before it prints how to reach
them anyway (with what is not online), s."""

def _spark(values: list[float], lo: float, hi: float) -> str:
    out = []
    for v in values:
        if v is None or not math.isfinite(v):
            out.append(" ")
            continue
        f = (min(max(v, lo), hi) - lo) / (hi - lo)
        out.append(SPARK[min(len(SPARK) - 1, int(f * len(SPARK)))])
    return "".join(out)


def _view(sc: Scenario, rec: Recorder, elapsed: float, total: float,
          broker: str = "") -> Group:
    p = rec.plant[-1] if rec.plant else {}
    lp = rec.loop[-1] if rec.loop else {}
    tbl = Table(show_header=True, header_style="bold", expand=False)
    for col in ("", "value"):
        tbl.add_column(col)

    def f(v: Any, unit: str, nd: int = 2) -> str:
        return "—" if v is None else f"{v:.{nd}f} {unit}"

    sp = lp.get("setpoint_c")
    pv = lp.get("supply_temp_c")
    err = None if pv is None or sp is None else pv - sp
    style = "green" if err is not None and abs(err) <= BAND_K else "yellow"
    if broker:
        tbl.add_row("broker", broker)
    tbl.add_row("plant time", f(p.get("t_s"), "s", 0))
    tbl.add_row("rack load", f((p.get("rack_power_w") or 0) / 1000 if p else None, "kW", 1))
    tbl.add_row("setpoint", f(sp, "°C"))
    tbl.add_row("supply temp (valvey PV)", Text(f(pv, "°C"), style=style))
    tbl.add_row("error", Text(f(err, "K"), style=style))
    tbl.add_row("supply temp (plant truth)", f(p.get("supply_temp_c"), "°C"))
    tbl.add_row(
        "valve command / position",
        f"{f(lp.get('valve_command_pct'), '%', 1)} / {f(p.get('valve_position_pct'), '%', 1)}",
    )
    tbl.add_row(
        "return temp / flow",
        f"{f(p.get('return_temp_c'), '°C')} / {f(p.get('flow_lpm'), 'L/min', 0)}",
    )
    tbl.add_row("hottest GPU Tj", f(p.get("hottest_gpu_tj_c"), "°C", 1))
    tbl.add_row("loop mode / valvey", f"{lp.get('mode', '—')} / {rec.valvey_status}")
    ff_any = lp.get("feedforward")
    ff: dict[str, Any] = ff_any if isinstance(ff_any, dict) else {}
    tbl.add_row("feedforward source", str(ff.get("source", "—")))
    rp = rec.rack_power[-1] if rec.rack_power else {}
    lc = rec.rack.get("lifecycle") or {}
    tbl.add_row("racky: lifecycle / status", f"{lc.get('state', '—')} / {rec.racky_status}")
    tbl.add_row(
        "racky: rack power / limit",
        f"{f((rp.get('rack_power_w') or 0) / 1000 if rp else None, 'kW', 1)} / "
        f"{f((rec.rack.get('limit_w') or 0) / 1000 if rec.rack.get('limit_w') else None, 'kW', 1)}"
        f" ({rec.rack.get('limit_source', '—')})",
    )
    tbl.add_row("alarms", ", ".join(sorted(rec.alarms)) or "none")
    duty = rec.pumps[-1] if rec.pumps else {}
    running = ", ".join(f"{k} {v:g}" for k, v in duty.get("running", {}).items()
                        if isinstance(v, (int, float)))
    tbl.add_row("valvey: duty pump / running", f"{duty.get('duty', '—')} / {running or '—'}")
    spool = rec.health.get("spool", {}) if rec.health else {}
    tbl.add_row("spooled lines", str(spool.get("spooled_lines", "—")))
    errs = [
        (r.get("supply_temp_c") or sp or 0) - (r.get("setpoint_c") or 0) for r in rec.loop[-60:]
    ]
    spark = _spark(errs, -1.0, 1.0)
    bar = f"{elapsed:5.0f} / {total:.0f} s"
    events = Text("\n".join(f"{t:5.0f} s  {e}" for t, e in rec.events[-EVENTS_SHOWN:])
                  or "none yet")
    faults = "; ".join(f"{f.kind} {f.target()} at t = {f.at_s:g} s" for f in sc.faults)
    return Group(
        Panel(tbl, title=f"rackplane demo: {sc.name}, rack {DEMO_RACK}", subtitle=bar),
        Panel(events, title="alarms and actions (plant time)",
              subtitle=f"scripted faults: {faults}" if faults else None),
        Text(f"error, last 60 s (±1 K): {spark}"),
        Text("Ctrl-C stops early; the summary and plot are written either way.", style="dim"),
    )


def _broker_state(link: MqttLink, host: str, port: int) -> str:
    if link.stats.connected:
        return f"connected ({host}:{port})"
    return (f"NOT CONNECTED: the broker at {host}:{port} is unreachable; nothing arrives "
            "until it is back")


async def run_demo(
    *,
    scenario: str = DEFAULT_SCENARIO,
    duration_s: float | None = None,
    broker: str | None = None,
    out_root: Path = Path("demo-output"),
    console: Console | None = None,
    racks: int = 1,
    nats_server: str | None = None,
    started_mono: float | None = None,
) -> DemoSummary | RowSummary:
    """Run the demo (`harness.demo`) for ``duration_s`` (default the scenario's length) on
    ``racks`` racks (1..4, side by side on the one broker; `harness.demo.racks`) and return
    its summary (one rack: `DemoSummary`; a row: `RowSummary`); the run's files go to
    ``out_root/<time>/``. A row runs under rlc when a nats-server is found
    (`harness.demo.fleet.find_nats_server`: ``nats_server`` a path or ``none``), else without.

    Raises:
        ConfigError: unknown scenario. BrokerUnreachable: ``broker`` accepts no connection.
        RuntimeError: a simulator died at start. ValueError: ``racks`` outside 1..4.
    """
    console = console or Console()
    sc = load_scenario(scenario)
    if not 1 <= racks <= MAX_RACKS:
        raise ValueError(f"racks must be 1..{MAX_RACKS}, not {racks}")
    total = float(duration_s if duration_s is not None else sc.duration_s)
    if broker:  # before anything starts: an unreachable broker is said at once
        host, _, port_s = broker.partition(":")
        mqtt_host, mqtt_port, protocol = host or "127.0.0.1", int(port_s or 1883), "5"
        await probe_broker(mqtt_host, mqtt_port)
    started_mono = started_mono if started_mono is not None else time.monotonic()
    run_dir = out_root / time.strftime("%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    row = plan_racks(racks, scenario, sc, run_dir, RACKY_BUDGET_W)
    names = tuple(r.name for r in row)
    row_limit_w = ROW_LIMIT_PER_RACK_W * len(row)
    amqtt_broker = None
    broker_log = None
    broker_kind = "the Mosquitto given with --broker"
    if not broker:
        mqtt_host, mqtt_port, protocol = "127.0.0.1", free_port(), "3.1.1"
        broker_log = route_broker_logging(run_dir / "broker.log")
        amqtt_broker = await start_amqtt(mqtt_port)
        broker_kind = f"embedded amqtt, its log in {run_dir / 'broker.log'}"
    rackctl_cfg = run_dir / "rackctl.toml"
    write_rackctl_config(rackctl_cfg, mqtt_host, mqtt_port, protocol)
    link = MqttLink(
        MqttSettings(
            host=mqtt_host,
            port=mqtt_port,
            protocol=protocol,
            clean_session=True,
            client_id=f"rackctl-demo-{os.getpid()}",
        ),
        Identity(site=DEMO_SITE, rack=DEMO_RACK),
        "rackctl",
        clock=SYSTEM_CLOCK,
    )
    for rack in row:  # each rack's topics to its own recorder
        base = f"{link.settings.topic_root}/{DEMO_SITE}/{rack.name}"
        for topic in (
            f"{base}/sim/telemetry/plant",
            f"{base}/valvey/state/#",
            f"{base}/valvey/status",
            f"{base}/valvey/alarm/+",
            f"{base}/racky/state/rack",
            f"{base}/racky/state/rack_power",
            f"{base}/racky/status",
            f"{base}/racky/alarm/+",
            f"{base}/valvey/cmd/+/+",  # operators' commands: named in the summary
            f"{base}/racky/cmd/+/+",
            f"{base}/valvey/cmd/+/+/result/#",  # their replies: accepted or refused
            f"{base}/racky/cmd/+/+/result/#",
        ):
            link.subscribe(topic, rack.rec.on_message, qos=0)
    recs = [(r.name, r.rec) for r in row]
    fleet: RowFleet | None = None
    no_rlc = ""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    link_task = asyncio.create_task(link.run(), name="demo-mqtt")
    lost_broker: str | None = None
    faults = "; ".join(f"{f.kind} {f.target()} at t = {f.at_s:g} s"
                       + (f" on {r.name}" if len(row) > 1 else "")
                       for r in row for f in r.scenario.faults)

    def view(elapsed: float, state: str) -> Group:
        if len(row) == 1:
            return _view(sc, row[0].rec, elapsed, total, state)
        return row_view(recs, row_limit_w, elapsed, total, state, f"scripted faults: {faults}",
                        loads={r.name: r.scenario.load.kind for r in row},
                        rlc=fleet.lines() if fleet else (),
                        rlc_events=fleet.events if fleet else ())

    try:
        for rack in row:
            await start_sim(rack, mqtt_host, mqtt_port, protocol)
        await asyncio.sleep(0.8)
        dead = [r for r in row if r.sim is not None and r.sim.returncode is not None]
        if dead:
            raise RuntimeError(f"the simulator exited at start; see {dead[0].dir / 'sim.log'}")
        if len(row) > 1:  # the row under rlc when NATS is there (harness.demo.fleet)
            fleet, no_rlc = await start_row_fleet(row, row_limit_w, run_dir, nats_server,
                                                  link, mqtt_host, mqtt_port, protocol,
                                                  console)
        for rack in row:
            await start_daemons(rack, mqtt_host, mqtt_port, protocol)
        started = time.monotonic()
        fleet_said = 0
        announced = False
        interactive = console.is_terminal
        last_print = 0.0
        last_state: str | None = None
        events_said = [0] * len(row)
        with (
            Live(view(0, _broker_state(link, mqtt_host, mqtt_port)),
                 console=console, refresh_per_second=2, transient=False)
            if interactive
            else contextlib.nullcontext() as live
        ):
            while not stop.is_set():
                elapsed = time.monotonic() - started
                if elapsed >= total:
                    break
                gone = [n for r in row for n, pr in r.processes()
                        if pr is not None and pr.returncode is not None]
                if fleet is not None:
                    gone += [n for n in (fleet.gone(),) if n]
                    await fleet.tick(started, rackctl_cfg, {r.name: r.rec for r in row})
                if gone:
                    who = gone[0].replace(f" ({DEMO_RACK})", "") if len(row) == 1 else gone[0]
                    console.print(f"[red]{who} exited early; logs in {run_dir}[/]")
                    break
                online = all(r.rec.valvey_status == "online" and r.rec.racky_status == "online"
                             for r in row)
                leases = fleet.handed_out() if fleet is not None else None
                if not announced and ((online and leases is None)
                                      or elapsed >= ANNOUNCE_AFTER_S):
                    # said once all daemons take commands (a command sent before a daemon
                    # subscribed is lost on a clean session) and, under rlc, the row's leases
                    # are handed out (a set_budget above a ramping grant is refused), or after
                    # ANNOUNCE_AFTER_S anyway
                    announced = True
                    if leases is not None:
                        console.print(f"not settled yet: {leases}", markup=False)
                    if not online:
                        console.print("not online yet: " + ", ".join(
                            f"{r.name} valvey {r.rec.valvey_status}, racky "
                            f"{r.rec.racky_status}" for r in row) + f" (logs in {run_dir})",
                            markup=False)
                    for line in access_lines(rackctl_cfg, mqtt_host, mqtt_port, protocol,
                                             broker_kind, names,
                                             run_dir / "rlc.toml" if fleet else None):
                        console.print(line, markup=False, highlight=False, soft_wrap=True)
                state = _broker_state(link, mqtt_host, mqtt_port)
                if not state.startswith("connected") and elapsed > BROKER_PROBE_S:
                    lost_broker = state
                if state != last_state:  # said once per change, also when not interactive
                    if last_state is not None or not state.startswith("connected"):
                        console.print(f"broker: {state}", markup=False, highlight=False)
                    last_state = state
                if live is not None:
                    live.update(view(elapsed, state))
                else:  # off a terminal: each alarm and action as a line, as it happens
                    for i, r in enumerate(row):
                        who = "" if len(row) == 1 else f"{r.name}: "
                        for t_ev, ev in r.rec.events[events_said[i]:]:
                            console.print(f"[t = {t_ev:5.1f} s] {who}{ev}", markup=False,
                                          highlight=False, soft_wrap=True)
                        events_said[i] = len(r.rec.events)
                    if fleet is not None:  # rlc's side, on the row's time axis
                        t0r = row_t0([r.rec for r in row]) or started
                        for t_ev, ev in fleet.events[fleet_said:]:
                            console.print(f"[t = {t_ev - t0r:5.1f} s] {ev}", markup=False,
                                          highlight=False, soft_wrap=True)
                        fleet_said = len(fleet.events)
                if live is None and elapsed - last_print >= 10:
                    last_print = elapsed
                    for r in row:
                        _print_progress(console, r.rec, elapsed, total,
                                        "" if len(row) == 1 else r.name)
                    if len(row) > 1:
                        note = ["row under rlc"] if fleet else []
                        console.print(f"[{elapsed:5.0f}/{total:.0f} s] "
                                      f"{row_line([r.rec for r in row], row_limit_w, *note)}",
                                      markup=False, highlight=False, soft_wrap=True)
                    for fl in fleet.lines() if fleet is not None else ():
                        console.print(f"[{elapsed:5.0f}/{total:.0f} s] {fl}", markup=False,
                                      highlight=False, soft_wrap=True)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.5)
    finally:
        await asyncio.gather(*(stop_rack(r) for r in row))
        if fleet is not None:
            await fleet.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(link.stop(), 3)
        link_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await link_task
        if amqtt_broker is not None:
            with contextlib.suppress(Exception):
                await amqtt_broker.shutdown()
        if broker_log is not None:
            broker_log.close()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    summaries = [finish_rack(r, console, lost_broker, len(row)) for r in row]
    if len(row) == 1:
        return summaries[0]
    return _finish_row(row, summaries, row_limit_w, run_dir, console, fleet, no_rlc,
                       started_mono)


def _print_progress(console: Console, rec: Any, elapsed: float, total: float,
                    rack: str) -> None:
    """The off-terminal progress line of one rack (every 10 s)."""
    lp = rec.loop[-1] if rec.loop else {}

    def num(v: Any, nd: int) -> str:
        return "—" if v is None else f"{v:.{nd}f}"

    console.print(
        f"[{elapsed:5.0f}/{total:.0f} s] {f'{rack}: ' if rack else ''}supply "
        f"{num(lp.get('supply_temp_c'), 2)} °C, setpoint "
        f"{num(lp.get('setpoint_c'), 1)} °C, valve "
        f"{num(lp.get('valve_command_pct'), 1)} %, mode {lp.get('mode')}, "
        f"alarms {', '.join(sorted(rec.alarms)) or 'none'}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def _finish_row(row: list[DemoRack], summaries: list[DemoSummary], limit_w: float,
                run_dir: Path, console: Console, fleet: RowFleet | None = None,
                no_rlc: str = "", started_mono: float | None = None) -> RowSummary:
    """The row's figures, items and plot from the racks' records (with rlc: its items from
    what `harness.demo.fleet` recorded); summary.json/.md of the row (each rack's summary
    inside) in the run folder."""
    recs = [(r.name, r.rec) for r in row]
    t0 = row_t0([r.rec for r in row]) or 0.0
    points = row_power([rack_power_series(r.rec, t0) for r in row])
    item = row_power_item(points, limit_w, len(row))
    items = [item] + (fleet.check_items({r.name: r.rec for r in row}, t0) if fleet else [])
    plot: Path | None = run_dir / "row.png"
    try:
        assert plot is not None
        write_row_plot(plot, recs, [(r.name, f.at_s, f"{f.kind} {f.target()}") for r in row
                                    for f in r.scenario.faults], limit_w, points,
                       fleet.granted_series(t0) if fleet else None)
    except Exception as err:  # a plot problem must not lose the summary
        console.print(f"[yellow]row plot not written: {err}[/]")
        plot = None
    budgets = {r.name: r.budget_w for r in row}
    if fleet is not None:  # the last lease of each rack
        budgets = {r: x.value_w for r, x in fleet.latest().items()}
    summary = RowSummary(
        racks=summaries, row_limit_w=limit_w, budgets_w=budgets,
        checklist=[c.as_dict() for c in items], plot=str(plot) if plot else None,
        run_dir=str(run_dir),
        coordination=fleet.coordination() if fleet is not None else (
            f"{no_rlc or 'row without rlc'}; the row limit {limit_w / 1000:.0f} "
            f"kW is split evenly into the racks' racky budgets "
            f"({', '.join(f'{k} {v / 1000:.0f} kW' for k, v in budgets.items())}), "
            "which nothing moves during the run"),
        rlc=fleet.as_dict(t0) if fleet is not None else None,
        row_power=[(round(t, 2), p) for t, p in points],
        wall_s=None if started_mono is None else round(time.monotonic() - started_mono, 1),
        machine=machine_line(machine_info()), date=time.strftime("%Y-%m-%d", time.gmtime()),
        **row_figures(points, limit_w),
    )
    (run_dir / "summary.json").write_text(json.dumps(summary.as_dict(), indent=2))
    (run_dir / "summary.md").write_text(row_markdown(summary))
    return summary
