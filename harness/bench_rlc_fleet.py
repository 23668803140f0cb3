"""The bench's ``rlc fleet`` section (issue 16 target: rlc's CPU with 1,800 racks reporting at
1 Hz through the 3-node NATS cluster <= 0.5 core).

A private 3-node NATS JetStream cluster is started here (loopback, `harness.servers`); rlc
runs as its own process (``python -m rlc``, one instance, no leadership) on the synthetic
site of `harness.bench_rlc.synthetic_site` (10 halls × 18 rows × 10 racks, floors 20 kW) with
its defaults but for ``[fleet]``: the cluster, a fresh bucket, ``cycle_s`` 1 s (every cycle
reads all 1,800 rack keys and writes the leases that changed or are due for renewal). The
racks are one child process (`harness.benchkids.fleet_racks`): each rack pushed its budget
key's writes (one subscription per rack, as racky) and writing its report once per second
(plain put; 1,800 puts/s spread over the second).

Once every rack holds a lease, and ``SETTLE_S`` more, rlc's CPU (user + system, /proc) is
measured over ``MEASURE_S`` (quick: ``MEASURE_QUICK_S``) of wall time. Beside it (info): the
reports the racks achieved per second in that window (the figure counts only when they kept
up with 1 Hz: ≈ 1,800/s), the cluster's CPU (its three nodes), rlc's allocation cycles per
second over its run (from its ``stopped`` log line; 1/``cycle_s`` when it keeps up), and the
start → every rack leased time. The whole section is bounded (`STARTUP_S` for the leases).
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path
from typing import Final

from harness.bench_rlc import synthetic_site
from harness.benchrun import Child, Context, bench_script, cpu_s, spawn
from harness.figures import Comparison, Figure

__all__ = ["RLC_FLEET_NAMES", "section_rlc_fleet"]

SETTLE_S: Final = 3.0
MEASURE_S: Final = 30.0
MEASURE_QUICK_S: Final = 10.0
STARTUP_S: Final = 90.0
CPU_TARGET_CORES: Final = 0.5

RLC_FLEET_NAMES: list[tuple[str, str, float | None, Comparison]] = [
    ("bench.rlc.fleet_cpu_cores_1800_racks", "CPU-s/s", CPU_TARGET_CORES, "<="),
    ("bench.rlc.fleet_reports_per_s", "puts/s", None, "info"),
    ("bench.rlc.fleet_nats_cpu_cores", "CPU-s/s", None, "info"),
    ("bench.rlc.fleet_cycles_per_s", "cycles/s", None, "info"),
    ("bench.rlc.fleet_all_leased_s", "s", None, "info"),
]


def _write_rlc_config(path: Path, tmp: Path, servers: list[str], bucket: str,
                      mqtt_port: int) -> None:
    from harness.daemons import write_config

    topo = synthetic_site().model_dump(mode="json", exclude_none=True)
    write_config(
        path,
        identity={"site": topo["site"], "row": "fleet", "rack": "rlc"},
        mqtt={"host": "127.0.0.1", "port": mqtt_port},
        spool={"directory": str(tmp / "spool-rlc")},
        fleet={"servers": servers, "bucket": bucket, "cycle_s": 1.0,
               "request_timeout_s": 1.0},
        topology=topo,
    )


def _status(path: Path) -> dict[str, float]:
    try:
        out: dict[str, float] = json.loads(path.read_text())
        return out
    except (OSError, ValueError):
        return {}


def _stopped(log: Path) -> tuple[dict[str, float], float] | None:
    """(rlc's final counters, wall s from ``fleet_connected`` to ``stopped``) from its JSON
    log; None when either line is missing."""
    from datetime import datetime

    start = end = None
    counts: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if not isinstance(e, dict) or not e.get("timestamp"):
            continue
        at = datetime.fromisoformat(str(e["timestamp"]).replace("Z", "+00:00")).timestamp()
        if e.get("event") == "fleet_connected" and start is None:
            start = at
        if e.get("event") == "stopped" and "cycles" in e:
            counts = {k: float(v) for k, v in e.items() if isinstance(v, int | float)}
            end = at
    if start is None or end is None:
        return None
    return counts, end - start


def section_rlc_fleet(ctx: Context) -> list[Figure]:
    """rlc's CPU at 1,800 racks through a 3-node cluster (module docstring)."""
    from harness.servers import start_nats_cluster

    assert ctx.srv is not None
    tmp = ctx.tmp / "rlc-fleet"
    tmp.mkdir(parents=True, exist_ok=True)
    measure_s = MEASURE_QUICK_S if ctx.quick else MEASURE_S
    cluster = start_nats_cluster(tmp / "nats")
    children: list[Child] = []
    try:
        bucket = f"fleet_{uuid.uuid4().hex[:8]}"
        cfg = tmp / "rlc.toml"
        _write_rlc_config(cfg, tmp, cluster.urls, bucket, int(ctx.srv.mosquitto.port))
        topo = synthetic_site()
        racks = [r for hall in topo.halls.values() for row in hall.rows.values()
                 for r in row.racks]
        racks_json = tmp / "racks.json"
        racks_json.write_text(json.dumps(racks))
        status = tmp / "racks-status.json"
        t_start = time.time()
        rlc = spawn([sys.executable, "-m", "rlc", "--config", str(cfg), "--log-format", "json"],
                    tmp / "rlc.log")
        children.append(rlc)
        gen = spawn([sys.executable, *bench_script("fleet_racks"), ",".join(cluster.urls),
                     bucket, topo.site, str(racks_json),
                     str(STARTUP_S + SETTLE_S + measure_s + 10.0), str(status)],
                    tmp / "fleet-racks.log")
        children.append(gen)
        deadline = time.monotonic() + STARTUP_S
        while _status(status).get("all_leased_at") is None:
            if time.monotonic() > deadline or not rlc.alive() or not gen.alive():
                raise RuntimeError(f"not every rack leased in {STARTUP_S:g} s (status "
                                   f"{_status(status)}; rlc: {rlc.tail()}; racks: {gen.tail()})")
            time.sleep(0.2)
        all_leased_s = float(_status(status)["all_leased_at"]) - t_start
        ctx.progress("rlc fleet", 0.3)
        time.sleep(SETTLE_S)
        nodes = [n.proc.pid for n in cluster.nodes if n.proc is not None]
        s0, c0, n0, w0 = _status(status), cpu_s(rlc.pid), sum(map(cpu_s, nodes)), \
            time.monotonic()
        time.sleep(measure_s)
        s1, c1, n1, w1 = _status(status), cpu_s(rlc.pid), sum(map(cpu_s, nodes)), \
            time.monotonic()
        ctx.progress("rlc fleet", 0.9)
        rlc.stop()
        gen.stop()
    finally:
        for ch in children:
            ch.stop()
        cluster.stop()
    wall = w1 - w0
    cpu = (c1 - c0) / wall
    puts = (s1.get("puts", 0.0) - s0.get("puts", 0.0)) / max(
        s1.get("elapsed_s", 0.0) - s0.get("elapsed_s", 0.0), 1e-9)
    stopped = _stopped(tmp / "rlc.log")
    counts = {} if stopped is None else stopped[0]
    said = ", ".join(f"{k} {counts[k]:.0f}" for k in ("writes_ok", "writes_refused",
                                                     "writes_unknown", "reads_failed")
                     if k in counts)
    how = (f"{len(racks):,} racks reporting once a second (plain puts, one subscription per "
           f"rack), rlc cycle 1 s, 3-node NATS JetStream cluster on loopback (R3 bucket); "
           f"rlc process user+system CPU over {wall:.1f} s after every rack held a lease")
    return [
        Figure("bench.rlc.fleet_cpu_cores_1800_racks", cpu, "CPU-s/s", CPU_TARGET_CORES, "<=",
               detail=how + f"; reports in the window {puts:,.0f}/s; rlc's counters: {said}"),
        Figure("bench.rlc.fleet_reports_per_s", puts, "puts/s",
               detail="the racks' report puts per second in the window (1 Hz per rack: "
               f"{len(racks):,}/s); failed puts over the run: {s1.get('failed', 0.0):.0f}"),
        Figure("bench.rlc.fleet_nats_cpu_cores", (n1 - n0) / wall, "CPU-s/s",
               detail="the three nats-server processes together, same window"),
        Figure("bench.rlc.fleet_cycles_per_s",
               None if stopped is None else counts.get("cycles", 0.0) / stopped[1],
               "cycles/s", detail="rlc's allocation cycles over its run (fleet_connected → "
               "stopped; 1 when it keeps up with cycle_s 1 s)" + (
                   "" if stopped is not None else ": not in its log")),
        Figure("bench.rlc.fleet_all_leased_s", all_leased_s, "s",
               detail="rlc's start → every rack pushed a lease (startup, restore, first "
               "cycles)"),
    ]
