"""The bare-subscriber baseline of the receive-path benchmark: aiomqtt over MQTT v5 (as racky
by default), one subscription, every message counted and discarded.

Usage: ``python -m harness.benchkids.bare_sub HOST PORT FILTER IDLE_S OUT_JSON`` — exits
``IDLE_S`` after the last message (or on SIGTERM) and writes ``{received, first_mono, last_mono}``.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path

import aiomqtt


async def run(host: str, port: int, filt: str, idle_s: float, out: Path) -> None:
    stats: dict[str, float | int | None] = {"received": 0, "first_mono": None, "last_mono": None}
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with aiomqtt.Client(host, port, identifier=f"bench-bare-{time.monotonic_ns()}",
                              max_queued_incoming_messages=0,
                              # racky's protocol (MqttSettings.protocol default "5"): both
                              # sides pay paho's MQTT v5 property parsing
                              protocol=aiomqtt.ProtocolVersion.V5) as client:
        await client.subscribe(filt, qos=0)
        Path(str(out) + ".ready").write_text("1")  # noqa: ASYNC240 - once, before the load

        async def consume() -> None:
            async for _msg in client.messages:
                now = time.monotonic()
                if stats["first_mono"] is None:
                    stats["first_mono"] = now
                stats["received"] = int(stats["received"] or 0) + 1
                stats["last_mono"] = now

        task = asyncio.create_task(consume())
        while not stop.is_set():
            await asyncio.sleep(0.2)
            last = stats["last_mono"]
            if last is not None and time.monotonic() - float(last) > idle_s:
                break
        task.cancel()
    out.write_text(json.dumps(stats))  # noqa: ASYNC240 - once, at exit


def main(argv: list[str]) -> int:
    asyncio.run(run(argv[0], int(argv[1]), argv[2], float(argv[3]), Path(argv[4])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
