"""``rackctl demo``: the main job on embedded defaults, with nothing to install.

Starts, on loopback and free ports:
1. an MQTT broker: amqtt in this process (MQTT 3.1.1), or the Mosquitto given with --broker;
2. the CDU simulator (``rack-sim run``, real time, Modbus TCP + plant truth on MQTT);
3. valvey (the real daemon, as a subprocess, with a generated config and its spool in the run
   folder as the embedded store: no database needed);
then shows a live view, and at the end prints a summary computed from what was recorded (max
|error| after each load step, settling time, points spooled and where) and writes a PNG plot,
the trace (CSV) and the summary (JSON) into the run folder.
"""

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
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from harness.servers import free_port
from rackplane.clock import SYSTEM_CLOCK
from rackplane.config import toml_value
from rackplane.io.mqtt import Message, MqttLink
from rackplane.settings import Identity, MqttSettings
from sims.metrics import StepMetrics, step_metrics
from sims.scenario import Scenario, load_scenario

__all__ = [
    "BAND_K",
    "EXPECTED_DEMO_ALARMS",
    "FF_SOURCE_NAMES",
    "SPARK",
    "DemoSummary",
    "Recorder",
    "control_mode_from_states",
    "count_spooled",
    "print_summary",
    "run_demo",
    "summarise",
    "summary_markdown",
    "write_plot",
]

BAND_K = 0.5  # REFERENCE §5 S1: back within ±0.5 K
SPARK = "▁▂▃▄▅▆▇█"


@dataclass
class Recorder:
    """What the demo saw on MQTT, on the plant's time axis."""

    plant_t0_mono: float | None = None  # monotonic time at plant t = 0 (estimated)
    plant: list[dict[str, Any]] = field(default_factory=list)
    loop: list[dict[str, Any]] = field(default_factory=list)
    alarms: dict[str, dict[str, Any]] = field(default_factory=dict)
    alarm_log: list[tuple[float, str, str]] = field(default_factory=list)
    health: dict[str, Any] = field(default_factory=dict)
    valvey_status: str = "?"

    def plant_t(self, mono: float) -> float | None:
        return None if self.plant_t0_mono is None else mono - self.plant_t0_mono

    def on_message(self, msg: Message) -> None:
        topic = msg.topic
        try:
            payload = msg.json() if msg.payload else None
        except ValueError:
            return
        if topic.endswith("/sim/telemetry/plant") and isinstance(payload, dict):
            t0 = msg.received_mono - float(payload["t_s"])
            self.plant_t0_mono = t0 if self.plant_t0_mono is None else min(self.plant_t0_mono, t0)
            self.plant.append(payload)
        elif topic.endswith("/valvey/state/supply_loop") and isinstance(payload, dict):
            t = self.plant_t(msg.received_mono)
            if t is not None:
                self.loop.append({"t_s": t, **payload})
        elif topic.endswith("/valvey/state/health") and isinstance(payload, dict):
            self.health = payload
        elif topic.endswith("/valvey/status") and isinstance(payload, dict):
            self.valvey_status = str(payload.get("status", "?"))
        elif "/valvey/alarm/" in topic:
            alarm_id = topic.rsplit("/", 1)[-1]
            t = self.plant_t(msg.received_mono) or 0.0
            if payload:
                if alarm_id not in self.alarms:
                    self.alarm_log.append((t, alarm_id, "raised"))
                self.alarms[alarm_id] = payload
            elif alarm_id in self.alarms:
                self.alarms.pop(alarm_id)
                self.alarm_log.append((t, alarm_id, "cleared"))


FF_SOURCE_NAMES = {
    "rack_power": "racky's rack power",
    "heat_removed": "the CDU's heat removed (no racky in the demo)",
}
"""How the summary names valvey's feedforward sources (valvey.core.feedforward.FfSource)."""

EXPECTED_DEMO_ALARMS: dict[str, str] = {}
"""Alarms the demo's set-up raises by design, with the note the summary prints beside them
(none: the demo makes the CDU's heat figure valvey's primary feedforward source)."""


def control_mode_from_states(loop: Sequence[Mapping[str, Any]]) -> str:
    """The control mode that actually ran, from valvey's ``state/supply_loop`` payloads:
    ``PI only`` (feedforward off or never had a source), else ``PI + feedforward from
    <source>`` (several sources joined with "then", in the order first seen)."""
    sources: list[str] = []
    enabled = False
    for r in loop:
        ff = r.get("feedforward")
        if not isinstance(ff, dict) or not ff.get("enabled"):
            continue
        enabled = True
        src = ff.get("source")
        if isinstance(src, str) and src != "none" and src not in sources:
            sources.append(src)
    if not sources:
        return "PI only" + (" (feedforward on but no source)" if enabled else "")
    return "PI + feedforward from " + " then ".join(FF_SOURCE_NAMES.get(x, x) for x in sources)


def _alarm_note(alarm_id: str) -> str:
    note = EXPECTED_DEMO_ALARMS.get(alarm_id)
    return f" ({note})" if note else ""


@dataclass
class DemoSummary:
    scenario: str
    duration_s: float
    steps: list[dict[str, Any]]
    points_spooled: int
    spool_dir: str
    valvey_exit_code: int | None
    alarms_raised: list[str]
    plot: str | None
    trace_csv: str
    run_dir: str
    max_gpu_tj_c: float | None
    control_mode: str = "PI control"
    """What ran, from valvey's own supply_loop state (`control_mode_from_states`)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _write_toml(path: Path, data: dict[str, dict[str, Any]]) -> None:
    lines = ["# Generated by rackctl demo: valvey against the CDU simulator."]
    for section, values in data.items():
        lines.append(f"\n[{section}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n")


def count_spooled(spool_dir: Path) -> int:
    """Lines (points) in the spool's segment files, header comments excluded."""
    n = 0
    for seg in sorted(spool_dir.glob("*.lp")):
        with seg.open("rb") as fh:
            n += sum(1 for line in fh if line.strip() and not line.startswith(b"#"))
    return n


def _steps(sc: Scenario) -> list[tuple[str, float, float | None]]:
    """(label, t0, t1) of the disturbances to score, from the scenario's load timeline."""
    ld = sc.load
    if ld.kind == "step" and ld.step_at_s is not None:
        out = [("load step up", ld.step_at_s, ld.back_at_s)]
        if ld.back_at_s is not None:
            out.append(("load step down", ld.back_at_s, None))
        return out
    if ld.kind == "timeline" and ld.points:
        ts = [t for t, _ in ld.points[1:]]
        return [
            (f"load change at {t:g} s", t, nxt) for t, nxt in zip(ts, [*ts[1:], None], strict=True)
        ]
    return [("whole run", 0.0, None)]


def summarise(sc: Scenario, rec: Recorder, end_t: float) -> list[dict[str, Any]]:
    """Step figures from what valvey published (its process variable) and the plant truth."""
    t = [r["t_s"] for r in rec.loop]
    pv = [r.get("supply_temp_c") for r in rec.loop]
    sp = [r.get("setpoint_c") or sc.plant.supply_setpoint_c for r in rec.loop]
    tt = [r["t_s"] for r in rec.plant]
    true = [r["supply_temp_c"] for r in rec.plant]
    out = []
    for label, t0, t1 in _steps(sc):
        if t0 > end_t - 5:  # a step in the last seconds has no response to score yet
            continue
        row: dict[str, Any] = {"disturbance": label, "t0_s": t0, "t1_s": t1 if t1 else end_t}
        for name, ts, vals, sps in (
            ("valvey_pv", t, pv, sp),
            ("plant_truth", tt, true, sc.plant.supply_setpoint_c),
        ):
            try:
                m: StepMetrics | None = step_metrics(ts, vals, sps, t0, t1, BAND_K)
            except ValueError:
                m = None
            row[name] = m.as_dict() if m else None
        out.append(row)
    return out


def _spark(values: list[float], lo: float, hi: float) -> str:
    out = []
    for v in values:
        if v is None or not math.isfinite(v):
            out.append(" ")
            continue
        f = (min(max(v, lo), hi) - lo) / (hi - lo)
        out.append(SPARK[min(len(SPARK) - 1, int(f * len(SPARK)))])
    return "".join(out)


def _view(sc: Scenario, rec: Recorder, elapsed: float, total: float) -> Group:
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
    tbl.add_row("alarms", ", ".join(sorted(rec.alarms)) or "none")
    spool = rec.health.get("spool", {}) if rec.health else {}
    tbl.add_row("spooled lines", str(spool.get("spooled_lines", "—")))
    errs = [
        (r.get("supply_temp_c") or sp or 0) - (r.get("setpoint_c") or 0) for r in rec.loop[-60:]
    ]
    spark = _spark(errs, -1.0, 1.0)
    bar = f"{elapsed:5.0f} / {total:.0f} s"
    return Group(
        Panel(tbl, title=f"rackplane demo: {sc.name}", subtitle=bar),
        Text(f"error, last 60 s (±1 K): {spark}"),
        Text("Ctrl-C stops early; the summary and plot are written either way.", style="dim"),
    )


def write_plot(path: Path, sc: Scenario, rec: Recorder) -> None:
    """Supply temperature, valve and load over plant time (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    tt = [r["t_s"] for r in rec.plant]
    t = [r["t_s"] for r in rec.loop]
    sp = sc.plant.supply_setpoint_c
    ax[0].axhspan(sp - BAND_K, sp + BAND_K, color="tab:green", alpha=0.12, label="±0.5 K")
    ax[0].plot(t, [r.get("supply_temp_c") for r in rec.loop], label="supply temp (valvey PV)")
    ax[0].plot(tt, [r["supply_temp_c"] for r in rec.plant], "--", lw=1, label="supply temp (plant)")
    ax[0].axhline(sp, color="k", lw=0.8, label="setpoint")
    ax[0].set_ylabel("°C")
    ax[0].legend(loc="upper right", fontsize=8)
    ax[1].plot(t, [r.get("valve_command_pct") for r in rec.loop], label="valve command")
    ax[1].plot(tt, [r["valve_position_pct"] for r in rec.plant], "--", lw=1, label="valve position")
    ax[1].set_ylabel("%")
    ax[1].legend(loc="lower right", fontsize=8)
    ax[2].plot(tt, [r["rack_power_w"] / 1000 for r in rec.plant], color="tab:red")
    ax[2].set_ylabel("rack load, kW")
    ax[2].set_xlabel("plant time, s")
    fig.suptitle(f"valvey on the simulated CDU: {sc.description}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def _start_amqtt(port: int) -> Any:
    from amqtt.broker import Broker

    broker = Broker(
        {
            "listeners": {"default": {"type": "tcp", "bind": f"127.0.0.1:{port}"}},
            "plugins": {
                "amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}
            },
        }
    )
    await broker.start()
    return broker


async def _spawn(argv: list[str], log: Path) -> asyncio.subprocess.Process:
    fh = log.open("ab")
    try:
        return await asyncio.create_subprocess_exec(*argv, stdout=fh, stderr=fh)
    finally:
        fh.close()


async def _terminate(proc: asyncio.subprocess.Process | None, timeout_s: float) -> int | None:
    if proc is None:
        return None
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
    return proc.returncode


async def run_demo(
    *,
    scenario: str = "load-step",
    duration_s: float | None = None,
    broker: str | None = None,
    out_root: Path = Path("demo-output"),
    console: Console | None = None,
) -> DemoSummary:
    """Run the demo (see the module docstring) and return its summary.

    Raises:
        ConfigError: unknown scenario. RuntimeError: the simulator or valvey died at start.
    """
    console = console or Console()
    sc = load_scenario(scenario)
    total = float(duration_s if duration_s is not None else sc.duration_s)
    run_dir = out_root / time.strftime("%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    spool_dir = run_dir / "spool"
    modbus_port = free_port()
    amqtt_broker = None
    if broker:
        host, _, port_s = broker.partition(":")
        mqtt_host, mqtt_port, protocol = host or "127.0.0.1", int(port_s or 1883), "5"
    else:
        mqtt_host, mqtt_port, protocol = "127.0.0.1", free_port(), "3.1.1"
        amqtt_broker = await _start_amqtt(mqtt_port)
    cfg_path = run_dir / "valvey.toml"
    _write_toml(
        cfg_path,
        {
            "cdu": {"host": "127.0.0.1", "port": modbus_port},
            "mqtt": {"host": mqtt_host, "port": mqtt_port, "protocol": protocol},
            "spool": {"directory": str(spool_dir.resolve())},
            "log": {"format": "json"},
            # No racky in the demo: the CDU's heat removed is the primary feedforward source
            # (a site without racky does the same), so no feedforward_source_lost alarm.
            "feedforward": {"enabled": True, "source": "heat_removed"},
        },
    )
    py = sys.executable
    ident = Identity()
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
    ):
        link.subscribe(topic, rec.on_message, qos=0)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    sim = valvey = None
    link_task = asyncio.create_task(link.run(), name="demo-mqtt")
    valvey_rc: int | None = None
    started = time.monotonic()
    try:
        sim = await _spawn(
            [
                py,
                "-m",
                "sims",
                "run",
                "--scenario",
                sc.name,
                "--modbus-port",
                str(modbus_port),
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
        valvey = await _spawn(
            [py, "-m", "valvey", "--config", str(cfg_path)], run_dir / "valvey.log"
        )
        started = time.monotonic()
        interactive = console.is_terminal
        last_print = 0.0
        with (
            Live(_view(sc, rec, 0, total), console=console, refresh_per_second=2, transient=False)
            if interactive
            else contextlib.nullcontext() as live
        ):
            while not stop.is_set():
                elapsed = time.monotonic() - started
                if elapsed >= total:
                    break
                if valvey.returncode is not None or sim.returncode is not None:
                    who = "valvey" if valvey.returncode is not None else "the simulator"
                    console.print(f"[red]{who} exited early; logs in {run_dir}[/]")
                    break
                if live is not None:
                    live.update(_view(sc, rec, elapsed, total))
                elif elapsed - last_print >= 10:
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
        valvey_rc = await _terminate(valvey, 20)
        await _terminate(sim, 10)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(link.stop(), 3)
        link_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await link_task
        if amqtt_broker is not None:
            with contextlib.suppress(Exception):
                await amqtt_broker.shutdown()
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
    summary = DemoSummary(
        scenario=sc.name,
        duration_s=round(end_t, 1),
        steps=steps,
        points_spooled=count_spooled(spool_dir) if spool_dir.exists() else 0,
        spool_dir=str(spool_dir),
        valvey_exit_code=valvey_rc,
        alarms_raised=[f"{t:.0f} s {a} {k}{_alarm_note(a) if k == 'raised' else ''}"
                       for t, a, k in rec.alarm_log],
        control_mode=control_mode_from_states(rec.loop),
        plot=str(plot) if plot else None,
        trace_csv=str(trace_csv),
        run_dir=str(run_dir),
        max_gpu_tj_c=max(tj) if tj else None,
    )
    (run_dir / "summary.json").write_text(json.dumps(summary.as_dict(), indent=2))
    (run_dir / "summary.md").write_text(summary_markdown(summary))
    return summary


def summary_markdown(s: DemoSummary) -> str:
    """The summary as a Markdown table (pasted verbatim into the README)."""
    import platform

    def settle(m: dict[str, Any] | None) -> str:
        if not m:
            return "—"
        v = m["settling_s"]
        return "never left ±0.5 K" if v == 0 else ("not settled" if v is None else f"{v:.0f} s")

    lines = [
        f"`rackctl demo` ({s.scenario}, {s.duration_s:g} s of plant time, {s.control_mode}, real "
        f"time over Modbus TCP and MQTT; {platform.system()} {platform.machine()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d')}):",
        "",
        "| disturbance | max \\|error\\| (valvey's PV) | back within ±0.5 K after | "
        "max \\|error\\| (plant truth) |",
        "|---|---|---|---|",
    ]
    for st in s.steps:
        pv, tr = st.get("valvey_pv"), st.get("plant_truth")
        if not (pv and tr):
            lines.append(f"| {st['disturbance']} | — | — | — |")
            continue
        lines.append(
            f"| {st['disturbance']} at t = {st['t0_s']:g} s | {pv['max_abs_error_k']:.2f} K | "
            f"{settle(pv)} | {tr['max_abs_error_k']:.2f} K |"
        )
    lines += [
        "",
        f"Points spooled: {s.points_spooled} lines of line protocol in the run's `spool/` "
        f"folder (the embedded store). Hottest GPU junction: "
        f"{s.max_gpu_tj_c:.1f} °C. Alarms: {', '.join(s.alarms_raised) or 'none'}. "
        f"valvey's exit code after SIGTERM: {s.valvey_exit_code}.",
    ]
    return "\n".join(lines) + "\n"


def print_summary(s: DemoSummary, console: Console) -> None:
    """The end-of-run summary, every figure computed from the run."""
    if not s.steps:
        console.print(
            f"No load step fell inside this {s.duration_s:g} s run, so there is no step "
            "response to score; run longer (the load-step scenario steps at t = 60 s: "
            "`make demo DURATION=150`).", markup=False, highlight=False,
        )
    t = Table(title=f"demo summary: {s.scenario}, {s.duration_s:g} s of plant time")
    for col in (
        "disturbance",
        "max |error| (valvey PV)",
        "settling to ±0.5 K",
        "max |error| (plant truth)",
    ):
        t.add_column(col)
    for st in s.steps:
        pv, tr = st.get("valvey_pv"), st.get("plant_truth")

        def settle(m: dict[str, Any] | None) -> str:
            if not m:
                return "—"
            v = m["settling_s"]
            return (
                "never left the band" if v == 0 else ("not settled" if v is None else f"{v:.0f} s")
            )

        t.add_row(
            f"{st['disturbance']} (t={st['t0_s']:g} s)",
            f"{pv['max_abs_error_k']:.2f} K" if pv else "—",
            settle(pv),
            f"{tr['max_abs_error_k']:.2f} K" if tr else "—",
        )
    console.print(t)
    console.print(
        f"points spooled: {s.points_spooled} lines of line protocol in {s.spool_dir} "
        "(the embedded store; `rackctl replay` sends them to an InfluxDB)",
        markup=False,
        highlight=False,
    )
    if s.max_gpu_tj_c is not None:
        console.print(f"hottest GPU junction: {s.max_gpu_tj_c:.1f} °C", markup=False)
    console.print(f"control: {s.control_mode}", markup=False, highlight=False)
    console.print(f"alarms: {', '.join(s.alarms_raised) or 'none'}", markup=False)
    console.print(f"valvey exit code after SIGTERM: {s.valvey_exit_code}", markup=False)
    console.print(
        f"plot: {s.plot}\ntrace: {s.trace_csv}\nlogs and config: {s.run_dir}",
        markup=False,
        highlight=False,
    )
