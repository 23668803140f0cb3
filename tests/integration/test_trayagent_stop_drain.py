"""A stopping tray agent publishes nothing its link will not send (`TrayAgent.quiesce`): its
read, Xid and BMC loops are done before the MQTT link drains, so every ``telemetry/trayNN``
message it counted as published reaches the broker, a read cycle still in flight at the stop
included (row benchmark: 18 messages, one rack's publish, counted but never sent).

The whole virtual rack through the real agent (`harness.simagent`) on a real Mosquitto; the
stop lands while a read cycle is running (the cycle is held in its worker thread until the
stop has begun)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from pathlib import Path
from typing import Any

import aiomqtt
import pytest

from harness.servers import Mosquitto
from harness.simagent import build_rack_agent, run_rack_agent
from rackplane.settings import Identity, MqttSettings

pytestmark = [pytest.mark.servers]


async def test_a_cycle_in_flight_at_the_stop_publishes_nothing_the_link_drops(
        tmp_path: Path, mosquitto: Mosquitto) -> None:
    rack = f"r{uuid.uuid4().hex[:8]}"
    mq = MqttSettings(host="127.0.0.1", port=mosquitto.port, clean_session=True,
                      reconnect_min_s=0.1, reconnect_max_s=1.0)
    ra = build_rack_agent("load-step-short", Identity(site="lab", rack=rack), mq,
                          epoch_file=tmp_path / "epochs.json", spool_dir=tmp_path / "spool")
    agent = ra.agent
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    stopping = threading.Event()
    cycles = 0
    cycle = agent._cycle

    def held_cycle(*args: Any) -> Any:  # the worker thread
        nonlocal cycles
        cycles += 1
        if cycles == 4:  # three publishes done: stop while this cycle runs
            loop.call_soon_threadsafe(stop.set)
            stopping.wait(5.0)  # until the stop has begun ...
            threading.Event().wait(0.3)  # ... and gone on a while
        return cycle(*args)

    agent._cycle = held_cycle  # type: ignore[method-assign]
    read_done_at_link_stop: list[bool] = []
    link_stop = agent.mqtt.stop

    async def watched_stop(*args: Any, **kwargs: Any) -> None:
        task = agent.tasks.get("read")
        read_done_at_link_stop.append(task is None or task.done())
        await link_stop(*args, **kwargs)

    agent.mqtt.stop = watched_stop  # type: ignore[method-assign]
    received = 0

    async def listen(ready: asyncio.Event) -> None:
        nonlocal received
        async with aiomqtt.Client("127.0.0.1", mosquitto.port) as c:
            await c.subscribe(f"rackplane/lab/+/{rack}/#")
            await c.subscribe(f"rackplane/lab/{rack}/#")
            ready.set()
            async for msg in c.messages:
                if "/telemetry/tray" in str(msg.topic):
                    received += 1

    ready = asyncio.Event()
    listener = asyncio.create_task(listen(ready))
    await asyncio.wait_for(ready.wait(), 10)

    async def note_stop() -> None:
        await stop.wait()
        stopping.set()

    noter = asyncio.create_task(note_stop())
    await asyncio.wait_for(run_rack_agent(ra, stop), 60)
    await asyncio.sleep(1.0)  # QoS 0 in flight reaches the listener
    listener.cancel()
    noter.cancel()
    assert cycles >= 4, "the stop never came"
    assert read_done_at_link_stop == [True], "the read loop still ran when the link drained"
    assert agent.published_total >= 2 * 18  # the first cycle precedes the first plant step
    assert received == agent.published_total, (received, agent.published_total)
