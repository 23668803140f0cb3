"""The benchmark suite's machinery (`harness.bench`): the machine line, spread figures, the
private servers, the daemons and simulators as subprocesses with their CPU and memory read
from /proc, and the suite's `Context`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.figures import Comparison, Figure, Progress
from harness.machine import machine_info
from harness.servers import free_port

__all__ = [
    "Child",
    "Context",
    "IngestRun",
    "Servers",
    "bench_script",
    "cpu_s",
    "failed_figures",
    "ingest_run",
    "lateness_ms",
    "machine_info",
    "pct",
    "racky_config",
    "reason_of",
    "spawn",
    "spread_figure",
    "start_cdu_sim",
    "start_racky",
    "start_servers",
    "start_valvey",
    "stop_read",
    "wait_file",
    "wait_subscribed",
]

_CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- helpers ---------------------------------------------------------------------------------


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


def failed_figures(names: Sequence[tuple[str, str, float | None, Comparison]], why: str
                   ) -> list[Figure]:
    """One failed figure per (name, unit, target, comparison), `why` as its detail."""
    return [Figure(n, None, u, t, c, detail=why.replace("|", "/")[:400]) for n, u, t, c in names]


def cpu_s(pid: int) -> float:
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


def bench_script(name: str) -> list[str]:
    """The argv prefix that runs child ``harness.benchkids.<name>`` with this interpreter."""
    return ["-m", f"harness.benchkids.{name.removesuffix('.py')}"]


def wait_file(path: Path, timeout_s: float, child: Child | None = None) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size > 0:
            return True
        if child is not None and not child.alive():
            return path.exists()
        time.sleep(0.05)
    return False


def reason_of(err: BaseException) -> str:
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
    child = spawn([sys.executable, *bench_script("daemon_child.py"), "racky", str(cfg),
                   str(stats)], tmp / f"racky{rack}-{tag}.log", env)
    return child, stats


def stop_read(child: Child, stats: Path) -> dict[str, Any]:
    child.stop()
    if not stats.exists():
        raise RuntimeError(f"no stats from {child.log.name}: {child.tail()}")
    data: dict[str, Any] = json.loads(stats.read_text())
    return data


def wait_subscribed(kids: Sequence[tuple[Child, Path]], timeout_s: float = 60.0) -> None:
    """Wait until every daemon's broker granted its subscriptions (daemon_child's marker).

    Raises:
        RuntimeError: a daemon exited or did not subscribe in time.
    """
    for child, stats in kids:
        if not wait_file(Path(str(stats) + ".subscribed"), timeout_s, child):
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
        wait_subscribed(kids)
        out = tmp / f"loadgen-{tag}.json"
        out.unlink(missing_ok=True)
        host, port = srv.mqtt
        gen = spawn([sys.executable, *bench_script("loadgen.py"), "rate", host, str(port),
                     str(n_racks), str(mult), str(duration_s), str(out)],
                    tmp / f"loadgen-{tag}.log")
        # the generator builds its payloads first; measure CPU from its first publish
        cpu0: dict[int, float] = {}
        t_cpu0 = 0.0
        deadline = time.monotonic() + 600
        while gen.alive() and time.monotonic() < deadline:
            if not cpu0 and Path(str(out) + ".started").exists():
                cpu0 = {k.pid: cpu_s(k.pid) for k, _ in kids}
                t_cpu0 = time.monotonic()
            time.sleep(0.1)
        gen.stop()
        cpu1 = {k.pid: cpu_s(k.pid) for k, _ in kids if k.alive()}
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
        stats = [stop_read(k, s) for k, s in kids]
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
    child = spawn([sys.executable, *bench_script("daemon_child.py"), "valvey", str(cfg),
                   str(stats)], tmp / f"valvey-{tag}.log")
    return child, stats


def lateness_ms(stats: dict[str, Any], skip: int = 20) -> list[float]:
    return [1000.0 * x for x in stats.get("late_s", [])[skip:]]


def pct(values: Sequence[float], q: float) -> float | None:
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
    chaos_failovers: int = 20  # failovers of each kind in the chaos section
    plots: dict[str, Any] = field(default_factory=dict)


