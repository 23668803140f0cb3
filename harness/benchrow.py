"""A row per host (issue 20 item 3): the daemons of 1 rack, then of 8 racks, on one host.

Each rack is one simulator process (`harness.benchkids.sim_child`: ``healthy-24h`` on the
whole virtual rack with its CDU and 8 power shelves on the rack's own Modbus ports, its 18
trays and their link ports published by the real tray agent in the same process, as in the
demo: `harness.simagent`), one valvey and one racky (`harness.benchkids.daemon_child`: their
console scripts' path, under the CPU scheduling their systemd units with the shipped drop-ins
give them, `unit_scheduling`: round-robin real-time for the event loop; where the host
refuses it, the figures say so), all on the suite's Mosquitto and VictoriaMetrics. An observer
(`harness.benchkids.row_watch`) hears the simulators' published clock and the daemons'
self-metrics (``state/health``).

Measured over a window after every simulator has published and a warm-up:

- the daemons' CPU: user + system CPU-s of the valvey and racky processes (``/proc``) over
  the window / its wall s (cores); the simulator processes' (simulator and tray agent)
  beside it (context);
- tick lateness: every control tick's lateness as the daemon's `TickStats` records it (each
  tick stamped on the system-wide monotonic clock by daemon_child), the window's ticks;
  p99 per daemon process, the worst of them; the self-metrics' ``tick_late_last_s`` heard
  over MQTT gives a sampled p99 beside it;
- samples lost: the daemons' own counters (``telemetry_dropped_lines`` +
  ``telemetry_rejected_lines`` of their last ``state/health``); tray messages lost: the
  tray agents' ``telemetry/trayNN`` messages - those racky parsed (the daemons subscribe
  before the simulators start and stop after them, with a drain);
- simulator lag: per simulator, wall s elapsed minus plant s run between its first and its
  last ``telemetry/plant`` message, both read from the message (``ts_ns`` and ``t_s``, its
  own clocks); a simulator that fell behind runs the steps it owes (`sims.runtime`), so the
  lag left is what it could not catch up (or dropped, ``steps_dropped``).

The row is run twice: under the units' scheduling (the targets) and at the normal policy
(``bench.row.normal_policy.*``: what the units' scheduling buys, information).

`row_figures` turns a 1-rack and an N-rack `RowRun` into the ``bench.row.*`` figures.
"""

from __future__ import annotations

import configparser
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.benchrun import (
    Child,
    Context,
    Servers,
    bench_script,
    cpu_s,
    pct,
    reason_of,
    spawn,
    wait_file,
    wait_subscribed,
)
from harness.demo.procs import write_toml
from harness.figures import Comparison, Figure
from harness.servers import free_port

__all__ = ["ROW_NAMES", "RowRun", "host_busy_s", "lost_lines", "row_figures", "row_run",
           "section_row", "sim_lag_s", "unit_scheduling", "window_lateness_ms"]

UNITS_DIR = Path(__file__).resolve().parents[1] / "systemd"

SITE = "lab"
SCENARIO = "healthy-24h"
BUDGET_W = 140_000.0
"""racky's rack budget, W: above the scenario's load, so racky watches and never caps."""
ROW_RACKS = 8
DAEMON_STOP_S = 45.0
"""SIGTERM to SIGKILL for the daemons, s: above the sum of their stop budgets (outputs, state,
MQTT, the telemetry drain) on a loaded host."""
DRAIN_S = 2.0
"""Wait after the simulators stopped, s: QoS 0 telemetry in flight reaches racky."""

ROW_NAMES: list[tuple[str, str, float | None, Comparison]] = [
    ("bench.row.daemons_cpu_cores", "CPU-s/s", 1.0, "<="),
    ("bench.row.tick_late_p99_ms", "ms", 5.0, "<="),
    ("bench.row.samples_lost", "lines", 0.0, "=="),
    ("bench.row.tray_messages_lost", "messages", 0.0, "=="),
    ("bench.row.sim_lag_s", "s", 1.0, "<="),
]


@dataclass
class RowRun:
    """What one run of ``n_racks`` racks measured (keys of the per-process dicts:
    ``"<daemon>@<rack>"``; times in s, lateness in ms)."""

    n_racks: int
    window_s: float
    startup_s: float
    daemon_cpu_s: dict[str, float]
    sim_cpu_s: dict[str, float]
    late_ms: dict[str, list[float]]
    health_late_ms: list[float]
    lost_lines: dict[str, int | None]
    tray_published: dict[str, int]
    tray_parsed: dict[str, int]
    lag_s: dict[str, float]
    lag_growth_s: dict[str, float]
    sim_overruns: dict[str, int] = field(default_factory=dict)
    sim_caught_up: dict[str, int] = field(default_factory=dict)
    """Per rack, plant steps its simulator's late ticks ran to catch up."""
    sim_dropped: dict[str, int] = field(default_factory=dict)
    """Per rack, plant steps its simulator dropped (a backlog past its bound)."""
    sched: dict[str, str] = field(default_factory=dict)
    """Per daemon process, the scheduling it ran under (`daemon_child.apply_scheduling`)."""
    host_busy_cores: float | None = None
    """The whole host's busy CPU over the window (other jobs included), cores."""
    load_avg: tuple[float, float] | None = None
    """The host's 1-min load average at the window's start and end."""

    def cpu_cores(self, daemon: str) -> float:
        """CPU cores of the ``daemon`` processes (valvey or racky) over the window."""
        return sum(v for k, v in self.daemon_cpu_s.items()
                   if k.startswith(daemon + "@")) / self.window_s

    @property
    def daemons_cpu_cores(self) -> float:
        return sum(self.daemon_cpu_s.values()) / self.window_s

    @property
    def sims_cpu_cores(self) -> float:
        return sum(self.sim_cpu_s.values()) / self.window_s

    def p99_ms(self, daemon: str | None = None) -> dict[str, float]:
        """p99 tick lateness of each daemon process (of kind ``daemon``: all when None)."""
        out: dict[str, float] = {}
        for key, late in self.late_ms.items():
            p = pct(late, 0.99)
            if p is not None and (daemon is None or key.startswith(daemon + "@")):
                out[key] = p
        return out

    @property
    def samples_lost(self) -> int | None:
        """Lines the daemons' writers lost; None when a daemon's self-metrics never came."""
        vals = list(self.lost_lines.values())
        if not vals or any(v is None for v in vals):
            return None
        return sum(v for v in vals if v is not None)

    @property
    def tray_messages_lost(self) -> int:
        return sum(max(0, n - self.tray_parsed.get(r, 0))
                   for r, n in self.tray_published.items())


# -- the figure computations (pure) -----------------------------------------------------------


def unit_scheduling(daemon: str, units_dir: Path = UNITS_DIR) -> str:
    """The CPU scheduling ``daemon``'s shipped unit gives it, as systemd reads it: the unit
    (``<units_dir>/<daemon>.service``) and then its drop-ins (``<daemon>.service.d/*.conf``
    in name order, a later one overriding), in the form `harness.benchkids.daemon_child`
    takes: ``rr:N`` / ``fifo:N`` (a real-time ``CPUSchedulingPolicy=`` with its
    ``CPUSchedulingPriority=``), ``:reset`` appended with ``CPUSchedulingResetOnFork=yes``;
    else ``other``.

    Raises:
        OSError: a file cannot be read.
        ValueError: a real-time policy without a priority in 1..99.
    """
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]  # keys keep their case
    cp.read_string((units_dir / f"{daemon}.service").read_text())
    for conf in sorted((units_dir / f"{daemon}.service.d").glob("*.conf")):
        cp.read_string(conf.read_text())
    svc = cp["Service"] if cp.has_section("Service") else {}
    policy = svc.get("CPUSchedulingPolicy", "other").strip().lower()
    if policy not in ("rr", "fifo"):
        return "other"
    prio = svc.get("CPUSchedulingPriority", "").strip()
    if not prio.isdigit() or not 1 <= int(prio) <= 99:
        raise ValueError(f"{daemon}.service: CPUSchedulingPolicy={policy} needs "
                         f"CPUSchedulingPriority= in 1..99, got {prio!r}")
    reset = svc.get("CPUSchedulingResetOnFork", "no").strip().lower() in ("yes", "true", "1",
                                                                          "on")
    return f"{policy}:{prio}" + (":reset" if reset else "")


def sched_summary(run: RowRun | None) -> str:
    """How the run's daemons were scheduled, in words, per daemon kind."""
    if run is None or not run.sched:
        return "scheduling unknown"
    parts = []
    for d in ("valvey", "racky"):
        kinds = sorted({v for k, v in run.sched.items() if k.startswith(d + "@")})
        if not kinds:
            continue
        refused = [k for k in kinds if k.startswith("not applied")]
        if refused:
            parts.append(f"{d} at the normal policy: its unit's real-time scheduling was "
                         f"refused ({refused[0].removeprefix('not applied ')})")
        elif kinds == ["other"]:
            parts.append(f"{d} at the normal policy")
        else:
            parts.append(f"{d} {'/'.join(k.replace(':reset', ', reset on fork') for k in kinds)}")
    return "daemons: " + "; ".join(parts)


def window_lateness_ms(late_s: Sequence[float], tick_mono: Sequence[float], t0: float,
                       t1: float) -> list[float]:
    """Lateness (ms) of the ticks stamped in [t0, t1] (monotonic s).

    Raises:
        ValueError: the two lists differ in length.
    """
    if len(late_s) != len(tick_mono):
        raise ValueError(f"{len(late_s)} lateness values for {len(tick_mono)} tick times")
    return [1000.0 * late for late, t in zip(late_s, tick_mono, strict=True) if t0 <= t <= t1]


def sim_lag_s(plant: Sequence[Sequence[Any]], t0: float | None = None
              ) -> tuple[dict[str, float], dict[str, float]]:
    """Per rack, how far its simulator's plant time fell behind its wall clock, s.

    ``plant``: rows ``[rack, recv_mono, t_s, ts_ns]`` (`harness.benchkids.row_watch`). The lag
    at a message is (ts_ns - ts_ns of the rack's first message) / 1e9 - (t_s - t_s of the
    first); returns ``(lag at the rack's last message, growth of the lag from the first message
    heard at or after ``t0`` (monotonic s, None: the first) to the last)``. Rows without
    numbers are skipped.
    """
    first: dict[str, tuple[float, int]] = {}
    last: dict[str, float] = {}
    at_t0: dict[str, float] = {}
    for rack, recv, t_s, ts_ns in plant:
        if not isinstance(t_s, (int, float)) or not isinstance(ts_ns, int):
            continue
        if rack not in first:
            first[rack] = (float(t_s), ts_ns)
        f_t, f_ns = first[rack]
        lag = (ts_ns - f_ns) / 1e9 - (float(t_s) - f_t)
        last[rack] = lag
        if rack not in at_t0 and (t0 is None or recv >= t0):
            at_t0[rack] = lag
    return last, {r: last[r] - at_t0.get(r, last[r]) for r in last}


def lost_lines(health: Sequence[Sequence[Any]], keys: Sequence[str]) -> dict[str, int | None]:
    """Per daemon process (``"<daemon>@<rack>"`` in ``keys``), the telemetry lines its writer
    lost (dropped + rejected) by its last ``state/health`` self-metrics; None when none came.
    ``health``: rows ``[rack, daemon, recv_mono, self]`` in arrival order."""
    lastself: dict[str, dict[str, Any]] = {}
    for rack, daemon, _recv, snap in health:
        lastself[f"{daemon}@{rack}"] = snap
    out: dict[str, int | None] = {}
    for key in keys:
        s = lastself.get(key)
        out[key] = None if s is None else int(s.get("telemetry_dropped_lines", 0)) + int(
            s.get("telemetry_rejected_lines", 0))
    return out


def _fmt(v: float | None, spec: str = ".3g") -> str:
    return "—" if v is None else format(v, spec)


def row_figures(one: RowRun | None, row: RowRun | None,
                normal: RowRun | None = None) -> list[Figure]:
    """The ``bench.row.*`` figures: the targets on the row (``row``), the same of one rack
    (``one``) beside it in the detail and as ``bench.row.one_rack.*`` (information), and the
    row at the normal policy (``normal``) as ``bench.row.normal_policy.*`` (information)."""
    figs: list[Figure] = []

    def side(run: RowRun | None, what: str) -> str:
        return f"{run.n_racks} rack(s): {what}" if run is not None else "not measured"

    def worst(run: RowRun | None, daemon: str | None = None) -> float | None:
        p = run.p99_ms(daemon) if run is not None else {}
        return max(p.values()) if p else None

    def lag(run: RowRun | None) -> float | None:
        return max(run.lag_s.values()) if run is not None and run.lag_s else None

    r, o = row, one
    how = (f"{r.n_racks if r else ROW_RACKS} racks' valvey + racky processes, each rack a "
           f"{SCENARIO} simulator + tray agent process on its own ports (rack k's agent "
           "reading at phase k/n of its second), one Mosquitto, VictoriaMetrics")
    cpu_r = r.daemons_cpu_cores if r else None
    cpu_o = o.daemons_cpu_cores if o else None
    figs.append(Figure("bench.row.daemons_cpu_cores", cpu_r, "CPU-s/s", 1.0, "<=", detail=(
        f"{how}; CPU-s of the daemon processes / wall s over {_fmt(r.window_s if r else None)} s;"
        f" valvey {_fmt(r.cpu_cores('valvey') if r else None)}, racky "
        f"{_fmt(r.cpu_cores('racky') if r else None)}; 1 rack: {_fmt(cpu_o)}; simulators: "
        f"{_fmt(r.sims_cpu_cores if r else None)} cores"),
        extra={"per_process": r.daemon_cpu_s if r else {}, "window_s": r.window_s if r else None,
               "one_rack": cpu_o}))
    figs.append(Figure("bench.row.tick_late_p99_ms", worst(r), "ms", 5.0, "<=", detail=(
        f"the worst daemon process's p99 of its control ticks in the window (valvey 10 Hz, "
        f"racky 1 Hz, {sum(len(v) for v in r.late_ms.values()) if r else 0} ticks); valvey "
        f"{_fmt(worst(r, 'valvey'))}, racky {_fmt(worst(r, 'racky'))} ms; self-metrics heard "
        f"over MQTT (tick_late_last_s, sampled): p99 "
        f"{_fmt(pct(r.health_late_ms, 0.99) if r else None)} ms; 1 rack: {_fmt(worst(o))} ms; "
        f"{sched_summary(r)}; the same row at the normal policy: {_fmt(worst(normal))} ms"),
        extra={"per_process_p99_ms": r.p99_ms() if r else {},
               "sched": r.sched if r else {}, "normal_policy_sched": normal.sched
               if normal else {}}))
    lost = r.samples_lost if r else None
    figs.append(Figure("bench.row.samples_lost", None if lost is None else float(lost), "lines",
                       0.0, "==", detail=(
        "telemetry lines the daemons' writers dropped or had refused (their self-metrics, "
        "last state/health of each)" + ("" if r is None or lost is not None else
                                         "; no self-metrics from " + ", ".join(
                                             k for k, v in r.lost_lines.items() if v is None))
        + f"; 1 rack: {_fmt(o.samples_lost if o else None)}")))
    figs.append(Figure("bench.row.tray_messages_lost",
                       float(r.tray_messages_lost) if r else None, "messages", 0.0, "==",
                       detail=(f"simulators' telemetry/trayNN messages - racky's parsed, "
                               f"{sum(r.tray_published.values()) if r else 0} published; "
                               f"1 rack: {_fmt(o.tray_messages_lost if o else None)}")))
    figs.append(Figure("bench.row.sim_lag_s", lag(r), "s", 1.0, "<=", detail=(
        "the most behind simulator: wall s - plant s from its first to its last telemetry/"
        "plant (its own ts_ns and t_s); grown during the window: "
        f"{_fmt(max(r.lag_growth_s.values()) if r and r.lag_growth_s else None)} s; plant steps "
        f"late ticks ran to catch up, all simulators: "
        f"{sum(r.sim_caught_up.values()) if r else '—'}, dropped: "
        f"{sum(r.sim_dropped.values()) if r else '—'}; 1 rack: {_fmt(lag(o))} s"),
        extra={"per_rack_s": r.lag_s if r else {}}))
    figs.append(Figure("bench.row.sims_cpu_cores", r.sims_cpu_cores if r else None, "CPU-s/s",
                       detail=side(r, "the simulator processes (not the daemons') over the "
                                   "window")))
    figs.append(Figure("bench.row.host_busy_cores", r.host_busy_cores if r else None,
                       "CPU-s/s", detail=side(r, (
                           "the whole host over the window, other jobs included (/proc/stat); "
                           "1-min load average " + (" -> ".join(f"{x:.1f}" for x in r.load_avg)
                                                     if r and r.load_avg else "—")
                           + f"; 1 rack: {_fmt(o.host_busy_cores if o else None)}"))))
    figs.append(Figure("bench.row.startup_s", r.startup_s if r else None, "s", detail=side(
        r, "daemons started -> every simulator heard (imports, connects, first publish)")))
    figs.append(Figure("bench.row.one_rack.daemons_cpu_cores", cpu_o, "CPU-s/s",
                       detail=side(o, "valvey + racky CPU-s / wall s")))
    figs.append(Figure("bench.row.one_rack.tick_late_p99_ms", worst(o), "ms", detail=side(
        o, f"worst p99, valvey {_fmt(worst(o, 'valvey'))}, racky {_fmt(worst(o, 'racky'))} ms")))
    figs.append(Figure("bench.row.one_rack.sim_lag_s", lag(o), "s", detail=side(
        o, "wall s - plant s of its simulator")))
    n = normal
    figs.append(Figure("bench.row.normal_policy.tick_late_p99_ms", worst(n), "ms", detail=side(
        n, f"the row again with every process at the normal policy (no real-time): worst p99 "
           f"valvey {_fmt(worst(n, 'valvey'))}, racky {_fmt(worst(n, 'racky'))} ms over "
           f"{_fmt(n.window_s if n else None)} s; daemons "
           f"{_fmt(n.daemons_cpu_cores if n else None)} cores, simulators "
           f"{_fmt(n.sims_cpu_cores if n else None)}; simulator lag "
           f"{_fmt(lag(n))} s")))
    return figs


# -- the run ---------------------------------------------------------------------------------


def _mqtt(srv: Servers, name: str) -> dict[str, Any]:
    host, port = srv.mqtt
    return {"host": host, "port": port, "client_id": f"bench-{name}-{os.getpid()}",
            "reconnect_min_s": 0.2, "reconnect_max_s": 2.0}


def _modbus(port: int) -> dict[str, Any]:
    return {"host": "127.0.0.1", "port": port, "reconnect_min_s": 0.2, "reconnect_max_s": 1.0}


def _configs(tmp: Path, srv: Servers, rack: str, mb_port: int, shelf_port: int
             ) -> tuple[Path, Path]:
    """valvey's and racky's configs for ``rack`` (defaults but for identity, ports, paths
    and racky's budget)."""
    d = tmp / rack
    d.mkdir(parents=True, exist_ok=True)
    common = {"log": {"level": "warning", "format": "json"}, "tsdb": {"url": srv.victoria.url}}
    v = d / "valvey.toml"
    write_toml(v, {"identity": {"site": SITE, "rack": rack}, **common,
                   "mqtt": _mqtt(srv, f"valvey-{rack}"),
                   "spool": {"directory": str(d / "valvey-spool")},
                   "cdu": _modbus(mb_port)}, "bench row")
    r = d / "racky.toml"
    write_toml(r, {"identity": {"site": SITE, "rack": rack}, **common,
                   "mqtt": _mqtt(srv, f"racky-{rack}"),
                   "spool": {"directory": str(d / "racky-spool")},
                   "power": {"budget_w": BUDGET_W},
                   "node_agents": {"daemon": "trays"},  # the tray agent's level (sim_child)
                   "lifecycle": {"state_file": str(d / "racky-state.json")},
                   "validation": {"report_dir": str(d / "validation")},
                   "power_shelves": [{**_modbus(shelf_port), "name": f"shelf{i}",
                                      "unit_id": 1 + i, "register_map": "power-shelf"}
                                     for i in range(8)]}, "bench row")
    return v, r


def host_busy_s() -> float:
    """CPU-s the whole host has been busy so far (all cores: /proc/stat's first line, idle and
    iowait left out)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(f[:8]) - f[3] - f[4]) / os.sysconf("SC_CLK_TCK")


def _stop_all(kids: Sequence[Child], timeout_s: float = 20.0) -> None:
    """SIGTERM every child once, at once, then wait for them all (SIGKILL to those still
    running ``timeout_s`` after the SIGTERM). One SIGTERM only: a second one reaching a
    daemon after its stop removed its handlers (while it writes its stats and exits) would
    end it by the default action, before its stats are written."""
    for k in kids:
        if k.alive():
            k.proc.terminate()
    deadline = time.monotonic() + timeout_s
    for k in kids:
        try:
            k.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            k.proc.kill()
            k.proc.wait(5)


def _cpu(kids: dict[str, Child]) -> dict[str, float]:
    out = {}
    for key, k in kids.items():
        try:
            out[key] = cpu_s(k.pid)
        except OSError:
            continue
    return out


def row_run(tmp: Path, srv: Servers, n_racks: int, warmup_s: float, window_s: float,
            tag: str, *, units_sched: bool = True) -> RowRun:
    """One run of ``n_racks`` racks (module docstring): warm-up, then a ``window_s`` window;
    the daemons under their units' scheduling (``units_sched``) or the normal policy.

    Raises:
        RuntimeError: a daemon or simulator did not start, or the observer failed.
    """
    host, port = srv.mqtt
    racks = [f"{tag}r{i}" for i in range(1, n_racks + 1)]
    watch_out = tmp / f"row-watch-{tag}.json"
    watch = spawn([sys.executable, *bench_script("row_watch.py"), host, str(port),
                   str(watch_out)], tmp / f"row-watch-{tag}.log")
    daemons: dict[str, tuple[Child, Path]] = {}
    sims: dict[str, Child] = {}
    sim_stats: dict[str, Path] = {}
    try:
        if not wait_file(Path(str(watch_out) + ".ready"), 30, watch):
            raise RuntimeError(f"row observer did not subscribe: {watch.tail()}")
        ports = {r: (free_port(), free_port()) for r in racks}
        sched = {d: unit_scheduling(d) if units_sched else "other" for d in ("valvey", "racky")}
        t_start = time.monotonic()
        for r in racks:
            vcfg, rcfg = _configs(tmp, srv, r, *ports[r])
            for which, cfg in (("valvey", vcfg), ("racky", rcfg)):
                stats = tmp / r / f"{which}-stats.json"
                daemons[f"{which}@{r}"] = (spawn(
                    [sys.executable, *bench_script("daemon_child.py"), which, str(cfg),
                     str(stats), sched[which]], tmp / r / f"{which}.log"), stats)
        wait_subscribed(list(daemons.values()), timeout_s=180.0)
        for k, r in enumerate(racks):  # rack k's agent at phase k/n of its second
            sim_stats[r] = tmp / r / "sim-stats.json"
            sims[r] = spawn([sys.executable, *bench_script("sim_child.py"), SCENARIO, SITE, r,
                             str(port), *map(str, ports[r]), str(sim_stats[r]),
                             str(k / n_racks)], tmp / r / "sim.log")
        seen = Path(str(watch_out) + ".seen")
        deadline = time.monotonic() + 180.0
        every = {**sims, **{k: c for k, (c, _) in daemons.items()}}
        while not (seen.exists() and seen.read_text().strip() == str(n_racks)):
            dead = [k for k, c in every.items() if not c.alive()]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"not every simulator published in time (exited: {dead}): "
                                   + (every[dead[0]].tail() if dead else ""))
            time.sleep(0.2)
        startup = time.monotonic() - t_start
        time.sleep(warmup_s)
        procs = {k: c for k, (c, _) in daemons.items()}
        d0, s0, h0, t0 = _cpu(procs), _cpu(sims), host_busy_s(), time.monotonic()
        load0 = os.getloadavg()[0]
        time.sleep(window_s)
        d1, s1, h1, t1 = _cpu(procs), _cpu(sims), host_busy_s(), time.monotonic()
        load1 = os.getloadavg()[0]
        _stop_all(list(sims.values()))
        time.sleep(DRAIN_S)
        _stop_all([watch])
        _stop_all(list(procs.values()), timeout_s=DAEMON_STOP_S)
    finally:
        _stop_all([watch, *sims.values(), *(c for c, _ in daemons.values())])
    wall = t1 - t0
    if not watch_out.exists():
        raise RuntimeError(f"row observer wrote nothing: {watch.tail()}")
    seen_data = json.loads(watch_out.read_text())
    late: dict[str, list[float]] = {}
    parsed: dict[str, int] = {}
    applied: dict[str, str] = {}
    for key, (child, path) in daemons.items():
        if not path.exists():
            rc = child.proc.returncode
            how = ("still running" if rc is None else "killed after the stop timeout"
                   if rc == -9 else f"exit code {rc}")
            raise RuntimeError(f"no stats from {key} ({how}): {child.tail()}")
        st = json.loads(path.read_text())
        applied[key] = str(st.get("sched", "other"))
        late[key] = window_lateness_ms(st["late_s"], st["tick_mono"], t0, t1)
        if key.startswith("racky@"):
            parsed[key.split("@", 1)[1]] = int(st.get("parsed", 0))
    published: dict[str, int] = {}
    overruns: dict[str, int] = {}
    caught_up: dict[str, int] = {}
    dropped: dict[str, int] = {}
    for r, path in sim_stats.items():
        if not path.exists():
            raise RuntimeError(f"no stats from the simulator of {r}: {sims[r].tail()}")
        st = json.loads(path.read_text())
        published[r] = int(st["tray_messages"])
        overruns[r] = int(st["tick_overruns"])
        caught_up[r] = int(st.get("steps_caught_up", 0))
        dropped[r] = int(st.get("steps_dropped", 0))
    lag, growth = sim_lag_s(seen_data["plant"], t0)
    health = seen_data["health"]
    hl = [1000.0 * float(s["tick_late_last_s"]) for _r, _d, recv, s in health
          if t0 <= recv <= t1 and isinstance(s.get("tick_late_last_s"), (int, float))]
    return RowRun(
        n_racks=n_racks, window_s=wall, startup_s=startup,
        daemon_cpu_s={k: d1[k] - d0[k] for k in d0 if k in d1},
        sim_cpu_s={k: s1[k] - s0[k] for k in s0 if k in s1},
        late_ms=late, health_late_ms=hl, lost_lines=lost_lines(health, list(daemons)),
        tray_published=published, tray_parsed=parsed, lag_s=lag, lag_growth_s=growth,
        sim_overruns=overruns, sim_caught_up=caught_up, sim_dropped=dropped, sched=applied,
        host_busy_cores=(h1 - h0) / wall, load_avg=(load0, load1))


def section_row(ctx: Context) -> list[Figure]:
    """1 rack, then `ROW_RACKS` racks, under the units' scheduling (windows of 10 and 20 s with
    ``quick``, else 60 and 120 s), then the row again at the normal policy (its window as the
    row's: the two p99 compare like with like)."""
    assert ctx.srv is not None
    quick = ctx.quick
    runs: dict[str, RowRun] = {}
    # warm-up: a daemon's first seconds cost far more than its steady state (imports,
    # first reads, learning); the row's start-up is longer on a small host
    plan = (((1, 8.0, 10.0, True), (ROW_RACKS, 12.0, 20.0, True), (ROW_RACKS, 12.0, 20.0, False))
            if quick else
            ((1, 15.0, 60.0, True), (ROW_RACKS, 20.0, 120.0, True),
             (ROW_RACKS, 20.0, 120.0, False)))
    for i, (n, warm, win, units) in enumerate(plan):
        label = f"{n} rack{'s' if n > 1 else ''}" + ("" if units else ", normal policy")
        try:
            runs[label] = row_run(ctx.tmp, ctx.srv, n, warm, win,
                                  f"n{n}" + ("" if units else "o"), units_sched=units)
        except Exception as err:
            if n == ROW_RACKS and units:  # the targets' run: the figures fail with the reason
                raise
            # the others are context: their figures say "not measured"
            print(f"row: the {label} run failed: {reason_of(err)}", file=sys.stderr)
        ctx.progress("row", (i + 1) / len(plan))
    one = runs.get("1 rack")
    row = runs.get(f"{ROW_RACKS} racks")
    normal = runs.get(f"{ROW_RACKS} racks, normal policy")
    ctx.plots["row"] = {
        label: {"cpu_cores": r.daemons_cpu_cores, "sims_cpu_cores": r.sims_cpu_cores,
                "p99_ms": r.p99_ms(),
                "median_late_ms": statistics.median([x for v in r.late_ms.values() for x in v])
                if any(r.late_ms.values()) else None}
        for label, r in runs.items()}
    return row_figures(one, row, normal)
