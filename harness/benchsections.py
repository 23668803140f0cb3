"""The benchmark suite's server-backed sections (`harness.bench`): ingest and capacity, receive,
restart, Modbus and the time-series path; each returns its figures, failed ones with the reason
when a section cannot run."""

from __future__ import annotations

import json
import signal
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from harness.bench_rlc_fleet import RLC_FLEET_NAMES, section_rlc_fleet
from harness.benchchaos import CHAOS_NAMES, section_chaos
from harness.benchrow import ROW_NAMES, section_row
from harness.benchrun import (
    Child,
    Context,
    IngestRun,
    bench_script,
    ingest_run,
    lateness_ms,
    pct,
    spawn,
    spread_figure,
    start_cdu_sim,
    start_racky,
    start_valvey,
    stop_read,
    wait_file,
    wait_subscribed,
)
from harness.figures import Comparison, Figure

__all__ = ["section_ingest", "section_modbus", "section_receive", "section_restart",
           "section_tsdb"]


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
        idle = lateness_ms(stop_read(v, vstats))
        ctx.progress("ingest", 0.1)
        v, vstats = start_valvey(tmp, srv, mb_port, "load")
        runs: list[IngestRun] = []
        try:
            for i in range(reps):
                runs.append(ingest_run(tmp, srv, n_racks, 1, duration, f"x1-{i}"))
                ctx.progress("ingest", 0.1 + 0.5 * (i + 1) / reps)
        finally:
            loaded = lateness_ms(stop_read(v, vstats)) if v.alive() else []
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
    p50i, p99i = pct(idle, 0.5), pct(idle, 0.99)
    p50, p99 = pct(loaded, 0.5), pct(loaded, 0.99)
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
        bare = spawn([sys.executable, *bench_script("bare_sub.py"), host, str(port),
                      "rackplane/lab/rack1/sim/telemetry/+", "3", str(bare_out)],
                     tmp / f"bare{i}.log")
        try:
            if not wait_file(Path(str(bare_out) + ".ready"), 20, bare):
                raise RuntimeError(f"bare subscriber did not start: {bare.tail()}")
            wait_subscribed([(rk, rstats)])
            gen_out = tmp / f"flood{i}.json"
            gen = spawn([sys.executable, *bench_script("loadgen.py"), "flood", host, str(port),
                         str(count), str(gen_out)], tmp / f"flood{i}.log")
            gen.proc.wait(300)
            wait_file(bare_out, 120, bare)
            deadline = time.monotonic() + 120
            while bare.alive() and time.monotonic() < deadline:
                time.sleep(0.1)
            b = json.loads(bare_out.read_text())
            # racky: wait until its count stops growing (it may lag behind the flood)
            time.sleep(3.0)
            r = stop_read(rk, rstats)
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
                child = spawn([sys.executable, *bench_script("modbus_poll.py"), mode,
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
            child = spawn([sys.executable, *bench_script("tsdb_write.py"), mode,
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
    ("rlc fleet", section_rlc_fleet, RLC_FLEET_NAMES),
    ("row", section_row, ROW_NAMES),
    ("chaos", section_chaos, CHAOS_NAMES),
]


