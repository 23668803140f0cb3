"""The benchmark suite (issue 8, issue 3's lock-step targets): ``rackctl bench --out DIR``.

Everything is measured side by side in one run on this machine, each figure from repeated runs
(median, with the spread min..max in ``detail``); absolute times are context, the ratios and
the targets are the point. The daemons run as subprocesses (``harness.benchkids.daemon_child``:
their console-script path `rackplane.io.service.run_daemon`, plus counters they do not publish)
against private Mosquitto and VictoriaMetrics servers (`harness.servers`); the node-agent load
comes from the simulators (``harness.benchkids.loadgen``: `sims.row.VirtualRack` +
`sims.telemetry.tray_payloads`); the bare-library baselines live in ``harness.benchkids``
(DESIGN §1: the only other importers of aiomqtt, pymodbus and influxdb-client).

=====================================  ==========================================================
figure (``bench.*``)                   how
=====================================  ==========================================================
``lockstep.valvey_plant_s_per_s``      plant s per wall s: load-step, valvey's tick at 10 Hz,
                                       CDU + rack thermal (`harness.lockstep_valvey.run_valvey`)
``lockstep.racky_plant_s_per_s``       rising-crc, the whole rack with its 1,440 link ports and
                                       racky's detectors at 1 Hz (`run_racky`)
``lockstep.link_days_per_s``           the link-only harness with racky's CUSUM (healthy links)
``ingest.*``                           8 racky processes (one per NVL72 rack, as deployed) fed a
                                       row of 8 racks' tray telemetry at 1 Hz: loss, CPU-s per
                                       wall-s of all of them, peak RSS
``capacity.*``                         the same at 2x, 3x, 4x the rate: the highest with 0 loss
``receive.*``                          racky (rack1) vs a bare aiomqtt subscriber, one flood
``tick.*``                             valvey's 10 Hz tick lateness p50/p99, idle and under the
                                       ingest load (valvey polls the CDU simulator's Modbus face)
``restart.*``                          SIGKILL -> READY (sd_notify) of racky, spool intact
``modbus.*``                           CPU of polling the CDU map at 10 Hz: rackplane.io.modbus vs
                                       raw pymodbus decoding the same requests, same server
``tsdb.*``                             points/s through the spool vs raw influxdb-client batches
=====================================  ==========================================================

A section that cannot run (no server binary, a daemon that does not start) yields failed
figures with the reason in ``detail``; the suite goes on. ``quick`` is a 1-2 minute smoke.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.figures import Comparison, Figure, Progress, no_progress, write_results
from harness.servers import free_port

__all__ = ["machine_info", "main", "run_suite", "spread_figure"]

_CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- helpers ---------------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    """CPU model, cores, RAM, Python and OS of this machine (context for every figure)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram_gb = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                ram_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "ram_gb": ram_gb,
            "python": platform.python_version(), "os": platform.platform()}


def spread_figure(name: str, values: Sequence[float], unit: str, target: float | None = None,
                  comparison: Comparison = "info", how: str = "", **extra: Any) -> Figure:
    """The median of ``values`` as a figure; ``detail`` gives n and the spread (min..max)."""
    vals = [float(v) for v in values]
    if not vals:
        return Figure(name, None, unit, target, comparison, detail=f"{how}; no run succeeded")
    med = statistics.median(vals)
    spread = f"median of {len(vals)}, {min(vals):.4g}..{max(vals):.4g}" if len(vals) > 1 else \
        "1 run"
    return Figure(name, med, unit, target, comparison, detail=f"{how} ({spread})",
                  extra={"runs": vals, **extra})


def _failed(names: Sequence[tuple[str, str, float | None, Comparison]], why: str) -> list[Figure]:
    return [Figure(n, None, u, t, c, detail=why.replace("|", "/")[:400]) for n, u, t, c in names]


def _cpu_s(pid: int) -> float:
    """user + system CPU seconds of process ``pid`` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def _peak_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _toml(data: dict[str, dict[str, Any]]) -> str:
    from rackplane.config import toml_value

    out: list[str] = []
    for section, values in data.items():
        out.append(f"[{section}]")
        out += [f"{k} = {toml_value(v)}" for k, v in values.items()]
        out.append("")
    return "\n".join(out)


@dataclass
class Servers:
    """Private Mosquitto and VictoriaMetrics (harness/servers.py), started once for the suite."""

    mosquitto: Any
    victoria: Any

    @property
    def mqtt(self) -> tuple[str, int]:
        return "127.0.0.1", int(self.mosquitto.port)

    def stop(self) -> None:
        for s in (self.mosquitto, self.victoria):
            with contextlib.suppress(Exception):
                s.stop()


def start_servers(tmp: Path) -> Servers:
    """Start private Mosquitto and VictoriaMetrics with `harness.servers` (no pytest, no
    checkout needed).

    Raises:
        RuntimeError: a binary is missing (``make servers`` installs them) or did not start.
    """
    from harness.servers import ServerMissing, start_mosquitto, start_victoria

    (tmp / "mosquitto").mkdir(parents=True, exist_ok=True)
    (tmp / "victoria").mkdir(parents=True, exist_ok=True)
    try:
        mq = start_mosquitto(tmp / "mosquitto")
    except (ServerMissing, OSError, TimeoutError, subprocess.SubprocessError) as err:
        raise RuntimeError(f"Mosquitto: {err}") from None
    try:
        vm = start_victoria(tmp / "victoria")
    except (ServerMissing, OSError, TimeoutError, subprocess.SubprocessError) as err:
        mq.stop()
        raise RuntimeError(f"VictoriaMetrics: {err}") from None
    return Servers(mq, vm)


@dataclass
class Child:
    """A subprocess with its log; stopped with SIGTERM (then SIGKILL) by `stop`."""

    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return int(self.proc.returncode)

    def tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-600:]
        except OSError:
            return ""


def spawn(argv: Sequence[str], log: Path, env: dict[str, str] | None = None) -> Child:
    fh = log.open("ab")
    proc = subprocess.Popen(list(argv), stdout=fh, stderr=subprocess.STDOUT,
                            env={**os.environ, **(env or {})})
    fh.close()
    return Child(proc, log)


def _bench_script(name: str) -> list[str]:
    """The argv prefix that runs child ``harness.benchkids.<name>`` with this interpreter."""
    return ["-m", f"harness.benchkids.{name.removesuffix('.py')}"]


def _wait_file(path: Path, timeout_s: float, child: Child | None = None) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size > 0:
            return True
        if child is not None and not child.alive():
            return path.exists()
        time.sleep(0.05)
    return False


# -- lock-step ---------------------------------------------------------------------------------


def bench_lockstep(quick: bool, progress: Progress) -> list[Figure]:
    """Plant seconds per wall second of both lock-step runners and the link harness."""
    figs: list[Figure] = []
    reps = 1 if quick else 3
    # valvey: CDU + rack thermal (model "cdu", REFERENCE §4) with valvey's cores at 10 Hz; and
    # the whole virtual rack (workload, node agents, shelves) for context
    for model, name, target in (("cdu", "valvey_plant_s_per_s", 1000.0),
                                ("rack", "valvey_full_rack_plant_s_per_s", None)):
        fname = f"bench.lockstep.{name}"
        try:
            from harness.lockstep_valvey import run_valvey
            from sims.scenario import load_scenario

            sc = load_scenario("load-step")
            plant_s = 60.0 if quick else min(sc.duration_s, 330.0)
            rates = []
            for i in range(reps):
                t0 = time.perf_counter()
                run_valvey(sc, duration_s=plant_s, model=model)  # type: ignore[arg-type]
                rates.append(plant_s / (time.perf_counter() - t0))
                progress(f"lock-step valvey {model}", (i + 1) / reps)
            figs.append(spread_figure(
                fname, rates, "plant s/wall s", target, ">=" if target else "info",
                f"load-step, {plant_s:.0f} plant s, model {model}, plant 10 Hz + valvey tick "
                "10 Hz"))
        except Exception as err:
            figs += _failed([(fname, "plant s/wall s", target, ">=" if target else "info")],
                            _why(err))
    # racky: the whole rack, 1,440 link ports, detectors at 1 Hz
    try:
        from harness.lockstep_racky import run_racky
        from sims.scenario import load_scenario

        sc = load_scenario("rising-crc")
        plant_s = 60.0 if quick else 600.0
        rates = []
        ports = None
        for i in range(reps):
            t0 = time.perf_counter()
            res = run_racky(sc, duration_s=plant_s)
            rates.append(plant_s / (time.perf_counter() - t0))
            ports = _port_count(res)
            progress("lock-step racky", (i + 1) / reps)
        figs.append(spread_figure(
            "bench.lockstep.racky_plant_s_per_s", rates, "plant s/wall s", 100.0, ">=",
            f"rising-crc, {plant_s:.0f} plant s, plant 10 Hz, racky 1 Hz, "
            f"{ports if ports is not None else '?'} link ports", link_ports=ports))
    except Exception as err:
        figs += _failed([("bench.lockstep.racky_plant_s_per_s", "plant s/wall s", 100.0, ">=")],
                        _why(err))
    # the link-only harness with racky's CUSUM on healthy links
    try:
        figs += _bench_harness(quick, progress)
    except Exception as err:
        figs += _failed([("bench.lockstep.link_days_per_s", "link-days/s", None, "info")],
                        _why(err))
    return figs


def _port_count(res: Any) -> int | None:
    """Link ports racky's detectors ran on (``core.links.n``), None when unknown."""
    links = getattr(getattr(res, "core", None), "links", None)
    n = getattr(links, "n", None)
    return n if isinstance(n, int) else None


def _bench_harness(quick: bool, progress: Progress) -> list[Figure]:
    from rackplane.core.detect.change import PoissonCusum
    from racky.config import LinkSettings
    from sims.link_harness import RateProfile, run

    ls = LinkSettings()
    lam0 = ls.healthy_rate_per_min
    lam1 = ls.cusum_lambda1_per_min

    def factory(n: int) -> Any:
        return PoissonCusum(n, lam0, lam1, ls.cusum_h, watch_h=ls.cusum_watch_h)

    n_links = 2_000 if quick else 100_000
    reps = 1 if quick else 2
    rates = []
    alarms = []
    for i in range(reps):
        t0 = time.perf_counter()
        res = run(RateProfile.healthy(lam0), n_links, 1440, factory, seed=i)
        rates.append(res.link_days / (time.perf_counter() - t0))
        alarms.append(res.total_alarms)
        progress("link harness", (i + 1) / reps)
    return [
        spread_figure("bench.lockstep.link_days_per_s", rates, "link-days/s", None, "info",
                      f"{n_links:,} healthy links x 1 day, racky's CUSUM (h {ls.cusum_h})"),
        Figure("bench.lockstep.link_harness_100k_days_s",
               100_000 / statistics.median(rates), "s", 300.0, "<=",
               detail="wall time of 100,000 link-days at the measured rate (issue 3: a few "
                      "minutes)"),
        Figure("bench.lockstep.harness_false_alarms", float(sum(alarms)), "alarms",
               detail=f"in {reps * n_links:,} healthy link-days (S8 figure: "
                      "racky.S8 in the scenario report)"),
    ]


def _why(err: BaseException) -> str:
    return traceback.format_exception_only(type(err), err)[-1].strip()


# -- the daemons as subprocesses ---------------------------------------------------------------


def racky_config(tmp: Path, srv: Servers, rack: int, *, tsdb: bool = True) -> Path:
    """A racky config for rack ``rack`` (1-based) on the bench servers; returns its path."""
    d = tmp / f"racky{rack}"
    d.mkdir(parents=True, exist_ok=True)
    host, port = srv.mqtt
    data: dict[str, dict[str, Any]] = {
        "identity": {"rack": f"rack{rack}"},
        "log": {"level": "warning", "format": "json"},
        "mqtt": {"host": host, "port": port, "client_id": f"bench-racky{rack}-{os.getpid()}"},
        "spool": {"directory": str(d / "spool")},
        "control": {"link_telemetry_interval_s": 10.0},
        "lifecycle": {"state_file": str(d / "state.json")},
        "validation": {"report_dir": str(d / "validation")},
    }
    if tsdb:
        data["tsdb"] = {"url": srv.victoria.url}
    path = d / "racky.toml"
    path.write_text(_toml(data))
    return path


def start_racky(tmp: Path, srv: Servers, rack: int, tag: str, *, tsdb: bool = True,
                env: dict[str, str] | None = None) -> tuple[Child, Path]:
    """racky for rack ``rack`` through ``harness.benchkids.daemon_child``; returns it and its
    stats file (written when it stops)."""
    cfg = racky_config(tmp, srv, rack, tsdb=tsdb)
    stats = tmp / f"racky{rack}-{tag}.json"
    stats.unlink(missing_ok=True)
    Path(str(stats) + ".subscribed").unlink(missing_ok=True)
    child = spawn([sys.executable, *_bench_script("daemon_child.py"), "racky", str(cfg),
                   str(stats)], tmp / f"racky{rack}-{tag}.log", env)
    return child, stats


def _stop_read(child: Child, stats: Path) -> dict[str, Any]:
    child.stop()
    if not stats.exists():
        raise RuntimeError(f"no stats from {child.log.name}: {child.tail()}")
    data: dict[str, Any] = json.loads(stats.read_text())
    return data


def _wait_subscribed(kids: Sequence[tuple[Child, Path]], timeout_s: float = 60.0) -> None:
    """Wait until every daemon's broker granted its subscriptions (daemon_child's marker).

    Raises:
        RuntimeError: a daemon exited or did not subscribe in time.
    """
    for child, stats in kids:
        if not _wait_file(Path(str(stats) + ".subscribed"), timeout_s, child):
            raise RuntimeError(f"{child.log.name}: not subscribed after {timeout_s:.0f} s: "
                               f"{child.tail()}")


@dataclass
class IngestRun:
    mult: int
    published: int
    parsed: int
    samples_per_s: float
    messages_per_s: float
    cpu_cores: float
    cpu_cores_max_proc: float
    rss_peak_mb: float
    payload_errors: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def lost(self) -> int:
        return max(0, self.published - self.parsed)


def ingest_run(tmp: Path, srv: Servers, n_racks: int, mult: int, duration_s: float,
               tag: str) -> IngestRun:
    """One ingest measurement: ``n_racks`` racky processes, the load at ``mult`` x 1 Hz."""
    kids = [start_racky(tmp, srv, r, tag) for r in range(1, n_racks + 1)]
    try:
        _wait_subscribed(kids)
        out = tmp / f"loadgen-{tag}.json"
        out.unlink(missing_ok=True)
        host, port = srv.mqtt
        gen = spawn([sys.executable, *_bench_script("loadgen.py"), "rate", host, str(port),
                     str(n_racks), str(mult), str(duration_s), str(out)],
                    tmp / f"loadgen-{tag}.log")
        # the generator builds its payloads first; measure CPU from its first publish
        cpu0: dict[int, float] = {}
        t_cpu0 = 0.0
        deadline = time.monotonic() + 600
        while gen.alive() and time.monotonic() < deadline:
            if not cpu0 and Path(str(out) + ".started").exists():
                cpu0 = {k.pid: _cpu_s(k.pid) for k, _ in kids}
                t_cpu0 = time.monotonic()
            time.sleep(0.1)
        gen.stop()
        cpu1 = {k.pid: _cpu_s(k.pid) for k, _ in kids if k.alive()}
        t_cpu1 = time.monotonic()
        if not out.exists():
            raise RuntimeError(f"load generator failed: {gen.tail()}")
        g = json.loads(out.read_text())
        if not cpu0:
            cpu0 = {k.pid: cpu1.get(k.pid, 0.0) for k, _ in kids}
            t_cpu0 = t_cpu1 - g["wall_s"]
        wall = max(t_cpu1 - t_cpu0, 1e-9)
        per = [(cpu1.get(pid, c0) - c0) / wall for pid, c0 in cpu0.items()]
        time.sleep(2.0)  # drain: QoS 0 in flight reaches the subscribers
        rss = [_peak_rss_mb(k.pid) or 0.0 for k, _ in kids]
        stats = [_stop_read(k, s) for k, s in kids]
    finally:
        for k, _ in kids:
            k.stop()
    parsed = sum(int(s.get("parsed", 0)) for s in stats)
    return IngestRun(
        mult=mult, published=int(g["published"]), parsed=parsed,
        samples_per_s=float(g["samples_per_s"]), messages_per_s=float(g["messages_per_s"]),
        cpu_cores=sum(per), cpu_cores_max_proc=max(per), rss_peak_mb=max(rss),
        payload_errors=sum(int(s.get("payload_errors", 0)) for s in stats),
        extra={"samples_per_message": g["samples_per_message"], "wall_s": g["wall_s"],
               "gen_late_max_s": g["late_max_s"]})


# -- valvey tick lateness ------------------------------------------------------------------------


def start_cdu_sim(tmp: Path) -> tuple[Child, int]:
    """The CDU simulator's Modbus face (healthy-24h, no MQTT); returns it and its port."""
    port = free_port()
    exe = _which("rack-sim")
    child = spawn([*([exe] if exe else [sys.executable, "-m", "sims"]), "run", "--scenario",
        "healthy-24h",
        "--modbus-port", str(port), "--shelf-modbus-port", "-1", "--log-format", "json",
        "--log-level", "warning"], tmp / "cdu-sim.log")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return child, port
        except OSError:
            if not child.alive():
                break
            time.sleep(0.1)
    child.stop()
    raise RuntimeError(f"CDU simulator did not listen: {child.tail()}")


def _which(name: str) -> str | None:
    p = Path(sys.executable).parent / name
    return str(p) if p.exists() else None


def start_valvey(tmp: Path, srv: Servers, modbus_port: int, tag: str) -> tuple[Child, Path]:
    d = tmp / "valvey"
    d.mkdir(parents=True, exist_ok=True)
    host, port = srv.mqtt
    cfg = d / "valvey.toml"
    cfg.write_text(_toml({
        "log": {"level": "warning", "format": "json"},
        "mqtt": {"host": host, "port": port, "client_id": f"bench-valvey-{os.getpid()}"},
        "tsdb": {"url": srv.victoria.url},
        "spool": {"directory": str(d / "spool")},
        "cdu": {"host": "127.0.0.1", "port": modbus_port},
    }))
    stats = tmp / f"valvey-{tag}.json"
    stats.unlink(missing_ok=True)
    child = spawn([sys.executable, *_bench_script("daemon_child.py"), "valvey", str(cfg),
                   str(stats)], tmp / f"valvey-{tag}.log")
    return child, stats


def _lateness_ms(stats: dict[str, Any], skip: int = 20) -> list[float]:
    return [1000.0 * x for x in stats.get("late_s", [])[skip:]]


def _pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


# -- the suite ---------------------------------------------------------------------------------


@dataclass
class Context:
    tmp: Path
    out: Path
    quick: bool
    progress: Progress
    srv: Servers | None = None
    plots: dict[str, Any] = field(default_factory=dict)


INGEST_NAMES: list[tuple[str, str, float | None, Comparison]] = [
    ("bench.ingest.lost_messages", "messages", 0.0, "=="),
    ("bench.ingest.racky_cpu_cores", "CPU-s/s", 1.0, "<="),
    ("bench.ingest.samples_per_s", "samples/s", None, "info"),
    ("bench.memory.racky_peak_rss_mb", "MB", 150.0, "<="),
    ("bench.tick.valvey_late_p50_ms", "ms", None, "info"),
    ("bench.tick.valvey_late_p99_ms", "ms", 5.0, "<="),
    ("bench.capacity.samples_per_s", "samples/s", None, "info"),
    ("bench.capacity.ratio_to_8_rack_load", "x", 2.0, ">="),
]


def section_ingest(ctx: Context) -> list[Figure]:
    """8-rack ingest (repeats), valvey's tick beside it, then the capacity sweep."""
    assert ctx.srv is not None
    srv, tmp, quick = ctx.srv, ctx.tmp, ctx.quick
    n_racks = 8
    duration = 8.0 if quick else 40.0
    reps = 1 if quick else 3
    figs: list[Figure] = []
    sim, mb_port = start_cdu_sim(tmp)
    try:
        # valvey idle: the tick with nothing else running
        idle_s = 5.0 if quick else 30.0
        v, vstats = start_valvey(tmp, srv, mb_port, "idle")
        time.sleep(idle_s)
        idle = _lateness_ms(_stop_read(v, vstats))
        ctx.progress("ingest", 0.1)
        v, vstats = start_valvey(tmp, srv, mb_port, "load")
        runs: list[IngestRun] = []
        try:
            for i in range(reps):
                runs.append(ingest_run(tmp, srv, n_racks, 1, duration, f"x1-{i}"))
                ctx.progress("ingest", 0.1 + 0.5 * (i + 1) / reps)
        finally:
            loaded = _lateness_ms(_stop_read(v, vstats)) if v.alive() else []
    finally:
        sim.stop()
    spm = runs[0].extra["samples_per_message"]
    how = (f"{n_racks} racky processes (one per NVL72 rack), 18 trays x {spm} samples per "
           f"message at 1 Hz, {duration:.0f} s")
    figs.append(spread_figure("bench.ingest.lost_messages", [r.lost for r in runs], "messages",
                              0.0, "==", how + "; published - parsed",
                              published=[r.published for r in runs]))
    figs.append(spread_figure("bench.ingest.racky_cpu_cores", [r.cpu_cores for r in runs],
                              "CPU-s/s", 1.0, "<=", how + "; sum over the racky processes",
                              per_process_max=[r.cpu_cores_max_proc for r in runs]))
    figs.append(spread_figure("bench.ingest.racky_cpu_cores_per_rack",
                              [r.cpu_cores_max_proc for r in runs], "CPU-s/s", None, "info",
                              "the busiest single racky process"))
    figs.append(spread_figure("bench.ingest.samples_per_s", [r.samples_per_s for r in runs],
                              "samples/s", None, "info", how))
    figs.append(spread_figure("bench.ingest.messages_per_s", [r.messages_per_s for r in runs],
                              "messages/s", None, "info", how))
    figs.append(spread_figure("bench.memory.racky_peak_rss_mb", [r.rss_peak_mb for r in runs],
                              "MB", 150.0, "<=", "VmHWM of the largest racky process"))
    figs.append(Figure("bench.ingest.payload_errors", float(sum(r.payload_errors for r in runs)),
                       "payloads", 0.0, "==", detail="tray payloads racky refused"))
    p50i, p99i = _pct(idle, 0.5), _pct(idle, 0.99)
    p50, p99 = _pct(loaded, 0.5), _pct(loaded, 0.99)
    figs.append(Figure("bench.tick.valvey_late_p50_ms", p50, "ms", detail=(
        f"{len(loaded)} ticks at 10 Hz during the ingest runs; idle p50 "
        f"{_f(p50i)} ms")))
    figs.append(Figure("bench.tick.valvey_late_p99_ms", p99, "ms", 5.0, "<=", detail=(
        f"{len(loaded)} ticks during the ingest runs; idle p99 {_f(p99i)} ms, max "
        f"{_f(max(loaded) if loaded else None)} ms")))
    figs.append(Figure("bench.tick.valvey_late_p99_idle_ms", p99i, "ms",
                       detail=f"{len(idle)} ticks, nothing else running"))
    ctx.plots["tick"] = {"idle": idle, "load": loaded}
    # capacity: raise the rate until something is lost (or the generator cannot keep up)
    sweep = [runs[0]]
    steps = [2] if quick else [2, 4, 6, 8]
    for j, m in enumerate(steps):
        r = ingest_run(tmp, srv, n_racks, m, 6.0 if quick else 20.0, f"x{m}")
        sweep.append(r)
        ctx.progress("ingest", 0.6 + 0.4 * (j + 1) / len(steps))
        if r.lost:
            break
    base = statistics.median([r.samples_per_s for r in runs])
    ok = [r for r in sweep if r.lost == 0]
    best = max(ok, key=lambda r: r.mult) if ok else None
    ratio = None
    if best is not None:
        # the offered load is exactly mult x the 8-rack load unless the generator fell behind
        achieved = best.samples_per_s / (base * best.mult)
        ratio = float(best.mult) if achieved >= 0.97 else best.samples_per_s / base
    sweep_txt = ", ".join(f"{r.mult}x: {r.samples_per_s:,.0f} samples/s, lost {r.lost}, "
                          f"{r.cpu_cores:.2f} cores" for r in sweep)
    figs.append(Figure("bench.capacity.samples_per_s", best.samples_per_s if best else None,
                       "samples/s", detail=f"highest swept rate with 0 loss ({sweep_txt})",
                       extra={"sweep": [r.__dict__ for r in sweep]}))
    top = sweep[-1]
    figs.append(Figure("bench.capacity.ratio_to_8_rack_load", ratio, "x", 2.0, ">=",
                       detail=("a lower bound: the highest rate swept had no loss; "
                               if top.lost == 0 else "") + f"swept {sweep_txt}"))
    ctx.plots["capacity"] = [(r.samples_per_s, r.lost / max(r.published, 1), r.cpu_cores)
                             for r in sweep]
    return figs


def _f(v: float | None) -> str:
    return "—" if v is None else f"{v:.3g}"


def section_receive(ctx: Context) -> list[Figure]:
    """racky's receive + parse vs a bare aiomqtt subscriber, both fed one flood."""
    assert ctx.srv is not None
    srv, tmp = ctx.srv, ctx.tmp
    count = 1000 if ctx.quick else 5000
    reps = 1 if ctx.quick else 3
    ratios, racky_rates, bare_rates = [], [], []
    host, port = srv.mqtt
    for i in range(reps):
        rk, rstats = start_racky(tmp, srv, 1, f"recv{i}", tsdb=False)
        bare_out = tmp / f"bare{i}.json"
        bare = spawn([sys.executable, *_bench_script("bare_sub.py"), host, str(port),
                      "rackplane/lab/rack1/sim/telemetry/+", "3", str(bare_out)],
                     tmp / f"bare{i}.log")
        try:
            if not _wait_file(Path(str(bare_out) + ".ready"), 20, bare):
                raise RuntimeError(f"bare subscriber did not start: {bare.tail()}")
            _wait_subscribed([(rk, rstats)])
            gen_out = tmp / f"flood{i}.json"
            gen = spawn([sys.executable, *_bench_script("loadgen.py"), "flood", host, str(port),
                         str(count), str(gen_out)], tmp / f"flood{i}.log")
            gen.proc.wait(300)
            _wait_file(bare_out, 120, bare)
            deadline = time.monotonic() + 120
            while bare.alive() and time.monotonic() < deadline:
                time.sleep(0.1)
            b = json.loads(bare_out.read_text())
            # racky: wait until its count stops growing (it may lag behind the flood)
            time.sleep(3.0)
            r = _stop_read(rk, rstats)
        finally:
            rk.stop()
            bare.stop()
        if r.get("parsed", 0) < 2 or b.get("received", 0) < 2:
            raise RuntimeError(f"flood not received: racky {r.get('parsed')}, bare "
                               f"{b.get('received')}")
        rr = (r["parsed"] - 1) / max(r["last_mono"] - r["first_mono"], 1e-9)
        br = (b["received"] - 1) / max(b["last_mono"] - b["first_mono"], 1e-9)
        racky_rates.append(rr)
        bare_rates.append(br)
        ratios.append(rr / br)
        ctx.progress("receive path", (i + 1) / reps)
    how = f"{count} tray messages flooded, racky (parse into its link frame) vs bare aiomqtt"
    return [
        spread_figure("bench.receive.ratio_to_bare", ratios, "x", 0.5, ">=", how),
        spread_figure("bench.receive.racky_messages_per_s", racky_rates, "messages/s", None,
                      "info", how),
        spread_figure("bench.receive.bare_messages_per_s", bare_rates, "messages/s", None,
                      "info", how),
    ]


def section_restart(ctx: Context) -> list[Figure]:
    """SIGKILL racky while it spools, start it again, time READY (sd_notify), check the spool."""
    assert ctx.srv is not None
    srv, tmp = ctx.srv, ctx.tmp
    reps = 2 if ctx.quick else 5
    sock_path = tmp / "notify.sock"
    sock_path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.settimeout(0.2)
    env = {"NOTIFY_SOCKET": str(sock_path)}
    times: list[float] = []
    intact = True
    notes: list[str] = []
    spool = tmp / "racky1" / "spool"

    def wait_ready(child: Child, timeout_s: float) -> float | None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            try:
                msg = sock.recv(4096).decode(errors="replace")
            except TimeoutError:
                if not child.alive():
                    return None
                continue
            if "READY=1" in msg:
                return time.monotonic()
        return None

    try:
        child, _ = start_racky(tmp, srv, 1, "restart", tsdb=False, env=env)
        if wait_ready(child, 30) is None:
            raise RuntimeError(f"racky never sent READY: {child.tail()}")
        for i in range(reps):
            time.sleep(1.5)  # it spools telemetry (embedded store: nothing drains)
            before = _dir_bytes(spool)
            child.proc.send_signal(signal.SIGKILL)
            child.proc.wait(10)
            t_kill = time.monotonic()
            child, _ = start_racky(tmp, srv, 1, f"restart{i}", tsdb=False, env=env)
            t_ready = wait_ready(child, 30)
            if t_ready is None:
                notes.append(f"run {i}: no READY")
                continue
            times.append(t_ready - t_kill)
            after = _dir_bytes(spool)
            if after < before:
                intact = False
                notes.append(f"run {i}: spool {before} B before the kill, {after} B after")
            ctx.progress("restart", (i + 1) / reps)
        child.stop()
    finally:
        sock.close()
        sock_path.unlink(missing_ok=True)
    how = "racky, SIGKILL -> READY=1 on NOTIFY_SOCKET (process start, config, first tick)"
    return [
        spread_figure("bench.restart.racky_kill_to_ready_s", times, "s", 2.0, "<=",
                      how + ("; " + "; ".join(notes) if notes else "")),
        Figure("bench.restart.spool_intact", 1.0 if intact and times else 0.0, "bool", 1.0,
               "==", detail="spool bytes after each restart >= before the kill"),
    ]


def _dir_bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in d.rglob("*") if f.is_file()) if d.exists() else 0


def section_modbus(ctx: Context) -> list[Figure]:
    """CPU of polling the CDU map at 10 Hz: rackplane.io.modbus vs raw pymodbus, same server."""
    tmp = ctx.tmp
    seconds = 4.0 if ctx.quick else 20.0
    reps = 1 if ctx.quick else 3
    sim, port = start_cdu_sim(tmp)
    res: dict[str, list[float]] = {"rackplane": [], "raw": []}
    polls: dict[str, list[float]] = {"rackplane": [], "raw": []}
    try:
        for i in range(reps):
            # alternate which side goes first (ABBA): the first poller after the previous
            # section runs on a colder host, which always fell on rackplane before
            order = ("rackplane", "raw") if i % 2 == 0 else ("raw", "rackplane")
            for mode in order:
                out = tmp / f"modbus-{mode}-{i}.json"
                child = spawn([sys.executable, *_bench_script("modbus_poll.py"), mode,
                               "127.0.0.1", str(port), str(seconds), str(out)],
                              tmp / f"modbus-{mode}.log")
                child.proc.wait(seconds + 60)
                if not out.exists():
                    raise RuntimeError(f"modbus {mode} poller failed: {child.tail()}")
                d = json.loads(out.read_text())
                res[mode].append(d["cpu_s_per_poll"] * 1e3)
                polls[mode].append(d["polls_per_s"])
            ctx.progress("modbus", (i + 1) / reps)
    finally:
        sim.stop()
    ratios = [a / b for a, b in zip(res["rackplane"], res["raw"], strict=True)]
    how = f"full CDU map at 10 Hz for {seconds:.0f} s, same simulator server"
    return [
        spread_figure("bench.modbus.cost_ratio_to_raw", ratios, "x", 1.2, "<=",
                      how + "; CPU per poll, rackplane.io.modbus (Samples with quality) / raw "
                      "pymodbus (same requests, convert_from_registers + scale)"),
        spread_figure("bench.modbus.rackplane_cpu_ms_per_poll", res["rackplane"], "ms", None,
                      "info", how, polls_per_s=polls["rackplane"]),
        spread_figure("bench.modbus.raw_cpu_ms_per_poll", res["raw"], "ms", None, "info", how,
                      polls_per_s=polls["raw"]),
    ]


def section_tsdb(ctx: Context) -> list[Figure]:
    """Points/s through the spool to VictoriaMetrics vs raw influxdb-client batch writes."""
    assert ctx.srv is not None
    tmp = ctx.tmp
    n = 20_000 if ctx.quick else 100_000
    reps = 1 if ctx.quick else 3
    res: dict[str, list[float]] = {"spool": [], "raw": []}
    for i in range(reps):
        for mode in ("spool", "raw"):
            out = tmp / f"tsdb-{mode}-{i}.json"
            child = spawn([sys.executable, *_bench_script("tsdb_write.py"), mode,
                           ctx.srv.victoria.url, str(n), str(tmp / f"tsdb-spool-{i}"),
                           f"{mode}{i}", str(out)], tmp / f"tsdb-{mode}.log")
            child.proc.wait(600)
            if not out.exists():
                raise RuntimeError(f"tsdb {mode} writer failed: {child.tail()}")
            res[mode].append(json.loads(out.read_text())["points_per_s"])
        ctx.progress("tsdb", (i + 1) / reps)
    ratios = [a / b for a, b in zip(res["spool"], res["raw"], strict=True)]
    how = f"{n:,} points of 6 fields, batches of 1,000, VictoriaMetrics on loopback"
    return [
        spread_figure("bench.tsdb.ratio_to_raw", ratios, "x", 0.8, ">=",
                      how + "; TelemetryWriter (spool, fsync) / raw influxdb-client"),
        spread_figure("bench.tsdb.spool_points_per_s", res["spool"], "points/s", None, "info",
                      how),
        spread_figure("bench.tsdb.raw_points_per_s", res["raw"], "points/s", None, "info", how),
    ]


SECTIONS: list[tuple[str, Callable[[Context], list[Figure]], list[tuple[str, str, float | None,
                                                                           Comparison]]]] = [
    ("ingest", section_ingest, INGEST_NAMES),
    ("receive path", section_receive, [("bench.receive.ratio_to_bare", "x", 0.5, ">=")]),
    ("restart", section_restart, [("bench.restart.racky_kill_to_ready_s", "s", 2.0, "<=")]),
    ("modbus", section_modbus, [("bench.modbus.cost_ratio_to_raw", "x", 1.2, "<=")]),
    ("tsdb", section_tsdb, [("bench.tsdb.ratio_to_raw", "x", 0.8, ">=")]),
]


def run_suite(out: Path, quick: bool, progress: Progress = no_progress,
              only: Sequence[str] | None = None) -> list[Figure]:
    """Run the suite (``only``: section names, ``lockstep`` among them) and return figures."""
    figs: list[Figure] = []
    if not only or "lockstep" in only:
        progress("lock-step", 0.0)
        figs += bench_lockstep(quick, progress)
    todo = [s for s in SECTIONS if not only or s[0] in only]
    if not todo:
        return figs
    with tempfile.TemporaryDirectory(prefix="rackplane-bench-") as td:
        ctx = Context(Path(td), out, quick, progress)
        try:
            ctx.srv = start_servers(ctx.tmp)
        except RuntimeError as err:
            for _, _, names in todo:
                figs += _failed(names, f"servers: {err}")
            return figs
        try:
            for name, fn, names in todo:
                progress(name, 0.0)
                try:
                    figs += fn(ctx)
                except Exception as err:
                    figs += _failed(names, f"{name} failed: {_why(err)}")
                progress(name, 1.0)
        finally:
            ctx.srv.stop()
        try:
            write_plots(out, ctx.plots)
        except Exception as err:  # plots are context; a missing matplotlib is not a failure
            print(f"plots skipped: {_why(err)}", file=sys.stderr)
    return figs


def write_plots(out: Path, plots: dict[str, Any]) -> list[Path]:
    """tick-lateness histogram and ingest rate vs loss/CPU (PNG) when the data exists."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    tick = plots.get("tick")
    if tick and (tick["idle"] or tick["load"]):
        fig, ax = plt.subplots(figsize=(7, 4))
        hi = max([*tick["idle"], *tick["load"], 1.0])
        bins = [hi * k / 60 for k in range(61)]
        if tick["idle"]:
            ax.hist(tick["idle"], bins=bins, alpha=0.6, label="idle")
        if tick["load"]:
            ax.hist(tick["load"], bins=bins, alpha=0.6, label="during 8-rack ingest")
        ax.set_xlabel("valvey tick lateness, ms")
        ax.set_ylabel("ticks")
        ax.set_yscale("log")
        ax.axvline(5.0, color="k", ls="--", lw=1, label="p99 target 5 ms")
        ax.legend()
        fig.tight_layout()
        p = out / "tick_lateness.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    cap = plots.get("capacity")
    if cap:
        fig, ax = plt.subplots(figsize=(7, 4))
        xs = [c[0] for c in cap]
        ax.plot(xs, [100 * c[1] for c in cap], "o-", label="messages lost, %")
        ax.set_xlabel("offered load, samples/s")
        ax.set_ylabel("lost, %")
        ax2 = ax.twinx()
        ax2.plot(xs, [c[2] for c in cap], "s--", color="tab:red", label="racky CPU, cores")
        ax2.set_ylabel("CPU-s per s (all racky processes)")
        fig.legend(loc="upper left")
        fig.tight_layout()
        p = out / "ingest_capacity.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    return paths


def _rich_progress() -> tuple[Progress, Callable[[], None]]:
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as RichProgress

    bar = RichProgress(TextColumn("{task.description:<20}"), BarColumn(),
                       TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn())
    bar.start()
    tasks: dict[str, Any] = {}

    def progress(label: str, fraction: float) -> None:
        if label not in tasks:
            tasks[label] = bar.add_task(label, total=1.0)
        bar.update(tasks[label], completed=max(0.0, min(1.0, fraction)))

    return progress, bar.stop


def main(out: Path, quick: bool) -> int:
    """Run the benchmark suite into ``out`` (results.json, results.md, PNGs).

    Returns 0 when every figure meets its target, 1 otherwise (the files are written either
    way). ``quick``: a 1-2 minute smoke with short runs and single repeats.
    """
    out.mkdir(parents=True, exist_ok=True)
    progress, close = _rich_progress()
    t0 = time.monotonic()
    try:
        figures = run_suite(out, quick, progress)
    finally:
        close()
    m = machine_info()
    preamble = (
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['ram_gb']} GB RAM, Python {m['python']}, "
        f"{m['os']}. {'Quick smoke' if quick else 'Full'} run, {time.monotonic() - t0:.0f} s "
        "wall. Medians of repeated runs with the spread in the last column; ratios are "
        "measured side by side in the same run. How each figure is made: docs/BENCHMARKS.md."
    )
    figures.append(Figure("bench.machine.cores", float(m["cores"] or 0), "cores",
                          detail=f"{m['cpu']}; {m['ram_gb']} GB; Python {m['python']}"))
    md = write_results(out, figures, "rackplane benchmarks", preamble)
    (out / "machine.json").write_text(json.dumps(m, indent=2) + "\n")
    failed = [f.name for f in figures if f.passed is False]
    print(f"{len(figures)} figures, {len(failed)} below target; {md}")
    return 1 if failed else 0
