"""A writer process for the shutdown and crash tests of rackplane.io.tsdb (BR-18, SIGKILL).

    python tsdb_writer_child.py sigterm URL SPOOL_DIR RUN_ID N BUDGET_S
        Writes N points with a long flush interval (so they are buffered, not sent), prints
        READY, and on SIGTERM calls ``close()`` (its own handler, as the service does), prints
        the stats as JSON and exits 0.

    python tsdb_writer_child.py kill URL SPOOL_DIR RUN_ID
        Writes points continuously while draining to URL in small batches; after every
        ``flush_to_spool()`` prints ``APPENDED <count>`` (those points are on the spool file).
        Runs until killed.

Points: measurement ``seqtest``, tag ``run=RUN_ID``, field ``seq`` = index (float), timestamp
2026-01-01 + index ms. Logs go to stderr so stdout carries only the protocol above.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from dataclasses import asdict
from pathlib import Path

from rackplane.clock import SystemClock
from rackplane.io.tsdb import TelemetryWriter
from rackplane.log import configure_logging
from rackplane.settings import SpoolSettings, TsdbSettings

BASE_NS = 1_767_225_600 * 10**9


def _say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


async def sigterm_mode(url: str, spool_dir: Path, run_id: str, n: int, budget_s: float) -> None:
    tsdb = TsdbSettings(url=url, flush_interval_s=60, batch_lines=1000, stop_budget_s=budget_s)
    writer = TelemetryWriter(
        tsdb,
        SpoolSettings(directory=spool_dir),
        identity_tags={"site": "lab", "run": run_id},
        clock=SystemClock(),
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    task = asyncio.create_task(writer.run())
    for i in range(n):
        writer.write("seqtest", {}, {"seq": i}, ts_ns=BASE_NS + i * 10**6)
    _say("READY")
    await stop.wait()
    await writer.close()
    await task
    _say(json.dumps(asdict(writer.stats)))


async def kill_mode(url: str, spool_dir: Path, run_id: str) -> None:
    tsdb = TsdbSettings(url=url, flush_interval_s=0.02, batch_lines=50)
    writer = TelemetryWriter(
        tsdb,
        SpoolSettings(directory=spool_dir),
        identity_tags={"site": "lab", "run": run_id},
        clock=SystemClock(),
    )
    task = asyncio.create_task(writer.run())
    i = 0
    while True:
        for _ in range(20):
            writer.write("seqtest", {}, {"seq": i}, ts_ns=BASE_NS + i * 10**6)
            i += 1
        left = writer.flush_to_spool()
        _say(f"APPENDED {i - left}")
        await asyncio.sleep(0.002)
        if task.done():
            raise SystemExit("writer task ended")


def main() -> None:
    configure_logging("warning", "json", stream=sys.stderr)
    mode, url, spool_dir, run_id = sys.argv[1:5]
    if mode == "sigterm":
        asyncio.run(
            sigterm_mode(url, Path(spool_dir), run_id, int(sys.argv[5]), float(sys.argv[6]))
        )
    elif mode == "kill":
        asyncio.run(kill_mode(url, Path(spool_dir), run_id))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
