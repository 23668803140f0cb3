"""Retained alarm topics are reconciled on every connect (rackplane.io.mqtt, DESIGN §3 alarms).

Found by a tester: a daemon restarted after raising a critical latched alarm left
``<base>/alarm/pump_loop_failsafe`` (state "returned", ts_ns of the old process) retained on the
broker while the new process held no such alarm: `rackctl watch` showed it, `get_state` did not,
and nothing ever cleared it. Real private Mosquitto (harness/servers.py), its own C clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from typing import Any

import pytest

from harness.servers import Mosquitto
from rackplane.clock import SystemClock
from rackplane.io.mqtt import Message, MqttLink
from rackplane.settings import Identity, MqttSettings
from tests.adapters.mqtt_cli import MqttSub, mqtt_pub


def _settings(port: int, protocol: str) -> MqttSettings:
    return MqttSettings(port=port, protocol=protocol, reconnect_min_s=0.1, reconnect_max_s=1.0,
                        stop_timeout_s=2.0)


def _ident() -> Identity:
    return Identity(site="lab", row="rowA", rack=f"r{uuid.uuid4().hex[:10]}")


async def _retained(port: int, topic_filter: str) -> dict[str, Any]:
    """The broker's retained store under ``topic_filter`` (a fresh subscriber's deliveries
    before its probe came back: Mosquitto sends retained messages at subscribe time)."""
    async with MqttSub(port, topic_filter) as sub:
        return {m.topic: json.loads(m.payload) for m in sub.messages if m.retain and m.payload}


async def _run(link: MqttLink) -> asyncio.Task[None]:
    task = asyncio.create_task(link.run())
    await link.wait_ready(20)
    return task


async def _stop(link: MqttLink, task: asyncio.Task[None]) -> None:
    await link.stop(1.0)
    task.cancel()
    with contextlib.suppress(BaseException):
        await task


@pytest.mark.parametrize("protocol", ["3.1.1", "5"])
async def test_stale_retained_alarm_cleared_and_held_ones_republished_on_connect(
    mosquitto: Mosquitto, protocol: str
) -> None:
    link = MqttLink(_settings(mosquitto.port, protocol), _ident(), "valvey", clock=SystemClock())
    stale = link.topics.alarm("pump_loop_failsafe")
    held = link.topics.alarm("supply_temp_high")
    old = {"id": "pump_loop_failsafe", "severity": "critical", "state": "returned", "ts_ns": 1}
    await mqtt_pub(mosquitto.port, stale, json.dumps(old), retain=True)
    await mqtt_pub(mosquitto.port, held, json.dumps({"id": "supply_temp_high", "ts_ns": 1}),
                   retain=True)
    assert set(await _retained(mosquitto.port, link.topics.alarm_filter)) == {stale, held}

    link.publish_alarm("supply_temp_high", {"id": "supply_temp_high", "ts_ns": 2})
    task = await _run(link)
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while True:
            store = await _retained(mosquitto.port, link.topics.alarm_filter)
            if store.get(held, {}).get("ts_ns") == 2 or loop.time() > deadline:
                break
            await asyncio.sleep(0.05)
        assert store == {held: {"id": "supply_temp_high", "ts_ns": 2}}
        st = link.stats
        assert st.unrouted == 0 and st.handler_errors == 0
    finally:
        await _stop(link, task)


async def test_alarm_cleared_while_down_does_not_come_back_after_restart(
    mosquitto: Mosquitto,
) -> None:
    """The tester's sequence: one process raises, stops (its retained alarm stays, as it
    should while held); the next process of the same daemon does not hold it: cleared."""
    ident = _ident()
    first = MqttLink(_settings(mosquitto.port, "5"), ident, "valvey", clock=SystemClock())
    first.publish_alarm("pump_loop_failsafe", {"id": "pump_loop_failsafe", "state": "returned"})
    task = await _run(first)
    topic = first.topics.alarm("pump_loop_failsafe")
    try:
        async with MqttSub(mosquitto.port, topic) as sub:
            await sub.wait_for(lambda m: m.topic == topic and bool(m.payload))
    finally:
        await _stop(first, task)
    assert topic in await _retained(mosquitto.port, first.topics.alarm_filter)

    second = MqttLink(_settings(mosquitto.port, "5"), ident, "valvey", clock=SystemClock())
    task = await _run(second)
    try:
        assert await _retained(mosquitto.port, second.topics.alarm_filter) == {}
    finally:
        await _stop(second, task)


async def test_client_link_never_clears_a_daemons_alarms(mosquitto: Mosquitto) -> None:
    """A client link (announce=False, the rackctl CLI) holds no alarms and must not touch
    the daemon's retained ones."""
    ident = _ident()
    cli = MqttLink(_settings(mosquitto.port, "5"), ident, "valvey", clock=SystemClock(),
                   announce=False)
    topic = cli.topics.alarm("pump_loop_failsafe")
    await mqtt_pub(mosquitto.port, topic, json.dumps({"id": "pump_loop_failsafe"}), retain=True)
    task = await _run(cli)
    try:
        assert topic in await _retained(mosquitto.port, cli.topics.alarm_filter)
    finally:
        await _stop(cli, task)
    await mqtt_pub(mosquitto.port, topic, None, retain=True)


async def test_handler_on_the_alarm_filter_keeps_its_subscription(mosquitto: Mosquitto) -> None:
    """A handler registered on ``<base>/alarm/+`` itself is not unsubscribed by the
    reconciliation and still receives live alarm messages."""
    link = MqttLink(_settings(mosquitto.port, "5"), _ident(), "valvey", clock=SystemClock())
    got: list[str] = []
    arrived = asyncio.Event()

    def on_alarm(m: Message) -> None:
        got.append(m.topic)
        arrived.set()

    link.subscribe(link.topics.alarm_filter, on_alarm)
    task = await _run(link)
    try:
        topic = link.topics.alarm("x1")
        await mqtt_pub(mosquitto.port, topic, "{}", retain=False)
        await asyncio.wait_for(arrived.wait(), 10)
        assert got == [topic]
    finally:
        await _stop(link, task)
