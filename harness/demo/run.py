"""`run_demo`: start the demo's processes, show the live view, record, summarise."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import json
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from harness.demo.checklist import checklist
from harness.demo.procs import (
    BROKER_PROBE_S,
    DEMO_RACK,
    DEMO_SITE,
    access_lines,
    probe_broker,
    racky_config,
    route_broker_logging,
    spawn,
    start_amqtt,
    terminate,
    valvey_config,
    write_rackctl_config,
    write_toml,
)
from harness.demo.record import Recorder, alarm_note, control_mode_from_states
from harness.demo.summary import (
    BAND_K,
    DemoSummary,
    count_spooled,
    ff_source_share,
    racky_summary,
    summarise,
    summary_markdown,
    write_plot,
)
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
) -> DemoSummary:
    """Run the demo (`harness.demo`) for ``duration_s`` (default the scenario's length) and
    return its summary; the run's files go to ``out_root/<time>/``.

    Raises:
        ConfigError: unknown scenario. BrokerUnreachable: ``broker`` accepts no connection.
        RuntimeError: the simulator died at start.
    """
    console = console or Console()
    sc = load_scenario(scenario)
    total = float(duration_s if duration_s is not None else sc.duration_s)
    if broker:  # before anything starts: an unreachable broker is said at once
        host, _, port_s = broker.partition(":")
        mqtt_host, mqtt_port, protocol = host or "127.0.0.1", int(port_s or 1883), "5"
        await probe_broker(mqtt_host, mqtt_port)
    run_dir = out_root / time.strftime("%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    spool_dir = run_dir / "spool"
    modbus_port, shelf_port = free_port(), free_port()
    amqtt_broker = None
    broker_log = None
    broker_kind = "the Mosquitto given with --broker"
    if not broker:
        mqtt_host, mqtt_port, protocol = "127.0.0.1", free_port(), "3.1.1"
        broker_log = route_broker_logging(run_dir / "broker.log")
        amqtt_broker = await start_amqtt(mqtt_port)
        broker_kind = f"embedded amqtt, its log in {run_dir / 'broker.log'}"
    cfg_path = run_dir / "valvey.toml"
    write_toml(cfg_path, valvey_config(run_dir, modbus_port, mqtt_host, mqtt_port, protocol),
               "valvey against the rack simulator")
    racky_cfg = run_dir / "racky.toml"
    write_toml(racky_cfg, racky_config(run_dir, shelf_port, mqtt_host, mqtt_port, protocol),
               "racky against the rack simulator's power shelves")
    rackctl_cfg = run_dir / "rackctl.toml"
    write_rackctl_config(rackctl_cfg, mqtt_host, mqtt_port, protocol)
    py = sys.executable
    ident = Identity(site=DEMO_SITE, rack=DEMO_RACK)
    rec = Recorder()
    link = MqttLink(
        MqttSettings(
            host=mqtt_host,
            port=mqtt_port,
            protocol=protocol,
            clean_session=True,
            client_id=f"rackctl-demo-{os.getpid()}",
        ),
        ident,
        "rackctl",
        clock=SYSTEM_CLOCK,
    )
    base = f"{link.settings.topic_root}/{ident.site}/{ident.rack}"
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
    ):
        link.subscribe(topic, rec.on_message, qos=0)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    sim = valvey = racky = None
    link_task = asyncio.create_task(link.run(), name="demo-mqtt")
    valvey_rc: int | None = None
    racky_rc: int | None = None
    lost_broker: str | None = None
    started = time.monotonic()
    try:
        sim = await spawn(
            [
                py,
                "-m",
                "sims",
                "run",
                "--scenario",
                scenario,  # as given: a bundled name or a TOML path (its name alone is not
                # found when the file is not bundled)
                "--modbus-port",
                str(modbus_port),
                "--shelf-modbus-port",
                str(shelf_port),
                "--site",
                DEMO_SITE,
                "--rack",
                DEMO_RACK,
                "--mqtt-host",
                mqtt_host,
                "--mqtt-port",
                str(mqtt_port),
                "--mqtt-protocol",
                protocol,
                "--log-format",
                "json",
                "--ground-truth",
                str(run_dir / "ground-truth.json"),
            ],
            run_dir / "sim.log",
        )
        await asyncio.sleep(0.8)
        if sim.returncode is not None:
            raise RuntimeError(f"the simulator exited at start; see {run_dir / 'sim.log'}")
        racky = await spawn([py, "-m", "racky", "--config", str(racky_cfg)],
                            run_dir / "racky.log")
        valvey = await spawn([py, "-m", "valvey", "--config", str(cfg_path)],
                             run_dir / "valvey.log")
        started = time.monotonic()
        announced = False
        interactive = console.is_terminal
        last_print = 0.0
        last_state: str | None = None
        events_said = 0
        with (
            Live(_view(sc, rec, 0, total, _broker_state(link, mqtt_host, mqtt_port)),
                 console=console, refresh_per_second=2, transient=False)
            if interactive
            else contextlib.nullcontext() as live
        ):
            while not stop.is_set():
                elapsed = time.monotonic() - started
                if elapsed >= total:
                    break
                gone = [n for n, pr in (("valvey", valvey), ("racky", racky),
                                        ("the simulator", sim)) if pr.returncode is not None]
                if gone:
                    who = gone[0]
                    console.print(f"[red]{who} exited early; logs in {run_dir}[/]")
                    break
                online = rec.valvey_status == "online" and rec.racky_status == "online"
                if not announced and (online or elapsed >= ANNOUNCE_AFTER_S):
                    # said once both daemons take commands (a command sent before a daemon
                    # subscribed is lost on a clean session), or after ANNOUNCE_AFTER_S anyway
                    announced = True
                    if not online:
                        console.print(f"not online yet: valvey {rec.valvey_status}, racky "
                                      f"{rec.racky_status} (logs in {run_dir})", markup=False)
                    for line in access_lines(rackctl_cfg, mqtt_host, mqtt_port, protocol,
                                             broker_kind):
                        console.print(line, markup=False, highlight=False, soft_wrap=True)
                state = _broker_state(link, mqtt_host, mqtt_port)
                if not state.startswith("connected") and elapsed > BROKER_PROBE_S:
                    lost_broker = state
                if state != last_state:  # said once per change, also when not interactive
                    if last_state is not None or not state.startswith("connected"):
                        console.print(f"broker: {state}", markup=False, highlight=False)
                    last_state = state
                if live is not None:
                    live.update(_view(sc, rec, elapsed, total, state))
                else:  # off a terminal: each alarm and action as a line, as it happens
                    for t_ev, ev in rec.events[events_said:]:
                        console.print(f"[t = {t_ev:5.1f} s] {ev}", markup=False,
                                      highlight=False, soft_wrap=True)
                    events_said = len(rec.events)
                if live is None and elapsed - last_print >= 10:
                    last_print = elapsed
                    lp = rec.loop[-1] if rec.loop else {}
                    def num(v: Any, nd: int) -> str:
                        return "—" if v is None else f"{v:.{nd}f}"

                    console.print(
                        f"[{elapsed:5.0f}/{total:.0f} s] supply "
                        f"{num(lp.get('supply_temp_c'), 2)} °C, setpoint "
                        f"{num(lp.get('setpoint_c'), 1)} °C, valve "
                        f"{num(lp.get('valve_command_pct'), 1)} %, mode {lp.get('mode')}, "
                        f"alarms {', '.join(sorted(rec.alarms)) or 'none'}",
                        markup=False,
                        highlight=False,
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.5)
    finally:
        end_t = rec.plant[-1]["t_s"] if rec.plant else 0.0
        valvey_rc, racky_rc = await asyncio.gather(terminate(valvey, 20), terminate(racky, 20))
        await terminate(sim, 10)
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
    steps = summarise(sc, rec, end_t)
    trace_csv = run_dir / "trace.csv"
    with trace_csv.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(
            [
                "source",
                "t_s",
                "supply_temp_c",
                "setpoint_c",
                "valve_command_pct",
                "valve_position_pct",
                "rack_power_w",
                "mode",
            ]
        )
        for r in rec.loop:
            w.writerow(
                [
                    "valvey",
                    f"{r['t_s']:.2f}",
                    r.get("supply_temp_c"),
                    r.get("setpoint_c"),
                    r.get("valve_command_pct"),
                    "",
                    "",
                    r.get("mode"),
                ]
            )
        for r in rec.plant:
            w.writerow(
                [
                    "plant",
                    r["t_s"],
                    r["supply_temp_c"],
                    "",
                    r["valve_command_pct"],
                    r["valve_position_pct"],
                    r["rack_power_w"],
                    "",
                ]
            )
    plot: Path | None = run_dir / "demo.png"
    try:
        assert plot is not None
        write_plot(plot, sc, rec)
    except Exception as err:  # a plot problem must not lose the summary
        console.print(f"[yellow]plot not written: {err}[/]")
        plot = None
    tj = [r["hottest_gpu_tj_c"] for r in rec.plant if r.get("hottest_gpu_tj_c") is not None]
    rsum = racky_summary(rec)
    if rsum is not None:
        rsum.exit_code = racky_rc
    summary = DemoSummary(
        scenario=sc.name,
        duration_s=round(end_t, 1),
        steps=steps,
        points_spooled=count_spooled(spool_dir) if spool_dir.exists() else 0,
        spool_dir=str(spool_dir),
        valvey_exit_code=valvey_rc,
        alarms_raised=[f"{t:.0f} s {a} {k}{alarm_note(a) if k == 'raised' else ''}"
                       for t, a, k in rec.alarm_log],
        control_mode=control_mode_from_states(rec.loop),
        plot=str(plot) if plot else None,
        trace_csv=str(trace_csv),
        run_dir=str(run_dir),
        max_gpu_tj_c=max(tj) if tj else None,
        broker_problem=lost_broker,
        ff_source_share=ff_source_share(rec.loop),
        racky=rsum,
        commands=[f"{t:.0f} s {user} → {daemon} {verb}" for t, daemon, user, verb in rec.commands],
        checklist=[c.as_dict() for c in checklist(sc, rec, steps, end_t)],
    )
    (run_dir / "summary.json").write_text(json.dumps(summary.as_dict(), indent=2))
    (run_dir / "summary.md").write_text(summary_markdown(summary))
    return summary


