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
import contextlib
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from rackplane.clock import SYSTEM_CLOCK
from rackplane.io.mqtt import MqttLink
from rackplane.io.mqtt.queues import Message
from rackplane.settings import Identity, MqttSettings


async def run(host: str, port: int, out: Path) -> None:
    plant: list[list[Any]] = []
    health: list[list[Any]] = []
    racks: set[str] = set()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)

    def on_message(msg: Message) -> None:
        now = time.monotonic()
        parts = msg.topic.split("/")
        try:
            body = msg.json()
        except ValueError:
            return
        if not isinstance(body, dict) or len(parts) < 6:
            return
        rack, daemon = parts[2], parts[3]
        if parts[4] == "telemetry":
            plant.append([rack, now, body.get("t_s"), body.get("ts_ns")])
            if rack not in racks:
                racks.add(rack)
                Path(str(out) + ".seen").write_text(str(len(racks)))
        elif isinstance(body.get("self"), dict):
            health.append([rack, daemon, now, body["self"]])

    link = MqttLink(MqttSettings(host=host, port=port, clean_session=True,
                                 client_id=f"bench-row-watch-{time.monotonic_ns()}"),
                    Identity(site="lab", rack="benchwatch"), "watch", clock=SYSTEM_CLOCK)
    link.subscribe("rackplane/+/+/sim/telemetry/plant", on_message, qos=0)
    link.subscribe("rackplane/+/+/+/state/health", on_message, qos=0)
    task = asyncio.create_task(link.run())
    try:
        await link.wait_ready(30)
        Path(str(out) + ".ready").write_text("1")  # noqa: ASYNC240 - once
        await stop.wait()
    finally:
        await link.stop()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    out.write_text(json.dumps({"plant": plant, "health": health}))  # noqa: ASYNC240 - at exit


def main(argv: list[str]) -> int:
    asyncio.run(run(argv[0], int(argv[1]), Path(argv[2])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
