"""The TSDB write benchmark's two writers: rackplane's `TelemetryWriter` (through the disk
spool) and the raw influxdb-client batch write API, the same points to the same server.

Usage: ``python -m harness.benchkids.tsdb_write spool|raw URL N SPOOL_DIR TAG OUT_JSON`` — writes N
points (measurement ``bench``, tags site/row/rack/device, 6 float fields), waits until the
server accepted all of them, and writes ``{points, wall_s, points_per_s}``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

WALL0_NS = 1_780_000_000 * 10**9
FIELDS = ("power_w", "temp_c", "flow_lpm", "pressure_kpa", "speed_rpm", "level_pct")
BATCH = 1000


def _fields(i: int) -> dict[str, float]:
    return {f: float(i % 997) + k * 0.5 for k, f in enumerate(FIELDS)}


async def spool(url: str, n: int, spool_dir: Path, tag: str) -> float:
    from rackplane.clock import SYSTEM_CLOCK
    from rackplane.io.tsdb import TelemetryWriter
    from rackplane.settings import SpoolSettings, TsdbSettings

    w = TelemetryWriter(TsdbSettings(url=url, batch_lines=BATCH, flush_interval_s=0.05),
                        SpoolSettings(directory=spool_dir),
                        identity_tags={"site": "bench", "row": "r", "rack": tag},
                        clock=SYSTEM_CLOCK)
    task = asyncio.create_task(w.run())
    t0 = time.monotonic()
    for i in range(n):
        w.write("bench", {"device": f"d{i % 100}"}, _fields(i), ts_ns=WALL0_NS + i * 1000)
        if i % BATCH == BATCH - 1:
            await asyncio.sleep(0)
    while w.stats.sent + w.stats.rejected < n and time.monotonic() - t0 < 600:  # noqa: ASYNC110
        await asyncio.sleep(0.01)  # polling the writer's counters: it has no event for this
    wall = time.monotonic() - t0
    await w.close(5.0)
    task.cancel()
    return wall


def raw(url: str, n: int, tag: str) -> float:
    from influxdb_client import InfluxDBClient, Point
    from influxdb_client.client.write_api import SYNCHRONOUS

    client = InfluxDBClient(url=url, token="", org="rackplane")
    api = client.write_api(write_options=SYNCHRONOUS)
    t0 = time.monotonic()
    batch: list[Point] = []
    for i in range(n):
        p = Point("bench").tag("site", "bench").tag("row", "r").tag("rack", tag) \
            .tag("device", f"d{i % 100}").time(WALL0_NS + i * 1000)
        for k, v in _fields(i).items():
            p = p.field(k, v)
        batch.append(p)
        if len(batch) >= BATCH:
            api.write(bucket="rackplane", record=batch)
            batch = []
    if batch:
        api.write(bucket="rackplane", record=batch)
    wall = time.monotonic() - t0
    client.close()
    return wall


def main(argv: list[str]) -> int:
    mode, url, n, spool_dir, tag, out = argv[0], argv[1], int(argv[2]), Path(argv[3]), \
        argv[4], argv[5]
    wall = asyncio.run(spool(url, n, spool_dir, tag)) if mode == "spool" else raw(url, n, tag)
    Path(out).write_text(json.dumps({"points": n, "wall_s": wall, "points_per_s": n / wall}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
