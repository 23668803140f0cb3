"""The row benchmark's observer (`harness.benchrow`): the simulators' published clock and the
daemons' self-metrics, as the broker delivers them.

Usage: ``python -m harness.benchkids.row_watch HOST PORT OUT_JSON``

Subscribes to ``rackplane/+/+/sim/telemetry/plant`` (each simulator's plant time ``t_s`` and
its wall-clock stamp ``ts_ns``, both the simulator's own) and ``rackplane/+/+/+/state/health``
(each daemon's ``self`` object, `rackplane.io.selfmetrics.SelfMetricsSnapshot`). Writes
``OUT_JSON.ready`` once subscribed and ``OUT_JSON.seen`` (the number of racks whose
simulator it has heard) as racks appear; on SIGTERM writes ``{"plant": [[rack, recv_mono,
t_s, ts_ns], ...], "health": [[rack, daemon, recv_mono, self], ...]}``.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aiomqtt


async def run(host: str, port: int, out: Path) -> None:
    plant: list[list[Any]] = []
    health: list[list[Any]] = []
    racks: set[str] = set()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with aiomqtt.Client(host, port, identifier=f"bench-row-watch-{time.monotonic_ns()}",
                              protocol=aiomqtt.ProtocolVersion.V5) as client:
        await client.subscribe("rackplane/+/+/sim/telemetry/plant", qos=0)
        await client.subscribe("rackplane/+/+/+/state/health", qos=0)
        Path(str(out) + ".ready").write_text("1")  # noqa: ASYNC240 - once

        async def consume() -> None:
            async for msg in client.messages:
                now = time.monotonic()
                parts = str(msg.topic).split("/")
                try:
                    body = json.loads(bytes(msg.payload))  # type: ignore[arg-type]
                except (TypeError, ValueError):
                    continue
                if not isinstance(body, dict) or len(parts) < 6:
                    continue
                rack, daemon = parts[2], parts[3]
                if parts[4] == "telemetry":
                    plant.append([rack, now, body.get("t_s"), body.get("ts_ns")])
                    if rack not in racks:
                        racks.add(rack)
                        Path(str(out) + ".seen").write_text(str(len(racks)))  # noqa: ASYNC240
                elif isinstance(body.get("self"), dict):
                    health.append([rack, daemon, now, body["self"]])

        task = asyncio.create_task(consume())
        await stop.wait()
        task.cancel()
    out.write_text(json.dumps({"plant": plant, "health": health}))  # noqa: ASYNC240 - at exit


def main(argv: list[str]) -> int:
    asyncio.run(run(argv[0], int(argv[1]), Path(argv[2])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
