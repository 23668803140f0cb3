"""FIELD-CASES BR-22 at the daemon level: valvey (a subprocess, its default persistent MQTT v5
session) and commands queued by the broker while it is away.

a) Its network is cut (tests/adapters/mqtt_proxy.py between valvey and the broker); three QoS 1
   commands c-1..c-3 are published meanwhile; the network comes back: each is applied exactly
   once, in order, within 5 s, and a repeat of c-2 is answered, not applied again. The field
   case cuts for 30 s; 2 s is enough here (the daemon has noticed the cut, its Will was
   published, the broker queues for the session): the commands' TTL (300 s) outlasts both.
b) The broker restarts without persistence (session and subscriptions gone): valvey sees
   session_present=0, subscribes again, applies c-4; its health shows the subscribed topics
   equal to the configured ones.
The adapter-level versions (the link and the router alone) are in tests/adapters/.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from harness.daemons import Proc, valvey_proc, write_valvey_config
from harness.servers import Mosquitto, free_port
from rackctl.client import ClientSettings, CommandClient
from rackplane.io.mqtt import Message
from tests.adapters.mqtt_proxy import MqttProxy

pytestmark = [pytest.mark.servers]


def start_valvey(tmp: Path, rack: str, port: int) -> Proc:
    cfg = write_valvey_config(
        tmp / "valvey.toml",
        identity={"site": "lab", "rack": rack},
        mqtt={"port": port, "reconnect_min_s": 0.2, "reconnect_max_s": 1.0,
              "client_id": f"valvey-{rack}"},
        cdu={"port": free_port()},
        spool={"directory": str(tmp / "spool")},
        commands={"users": {"alice": "operator"}},
        log={"format": "json"},
    )
    return valvey_proc(tmp, cfg).start()


class Operator:
    """``alice`` at the broker (never through the proxy): commands, status and health."""

    def __init__(self, port: int, rack: str) -> None:
        self.client = CommandClient(ClientSettings(port=port, rack=rack, username="alice",
                                                   timeout_s=20.0, connect_timeout_s=10.0))
        self.status: list[str] = []
        self.health: dict[str, Any] = {}
        self.health_at = 0.0
        base = self.client.settings.topics("valvey").base
        self.client.subscribe(f"{base}/status", self._on)
        self.client.subscribe(f"{base}/state/health", self._on)
        self.client.expect_replies_from("valvey")

    def _on(self, msg: Message) -> None:
        if not msg.payload:
            return
        if msg.topic.endswith("/status"):
            self.status.append(msg.json()["status"])
        else:
            self.health, self.health_at = msg.json(), time.monotonic()

    async def until(self, pred: Any, what: str, valvey: Proc, timeout_s: float = 20) -> None:
        deadline = time.monotonic() + timeout_s
        while not pred():
            assert valvey.alive(), valvey.log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def operator(port: int, rack: str) -> AsyncIterator[Operator]:
    op = Operator(port, rack)
    async with op.client:
        yield op


async def test_br22a_network_cut_three_queued_commands_applied_once_in_order(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    rack = f"br22a-{uuid.uuid4().hex[:6]}"
    async with MqttProxy(mosquitto.port) as proxy:
        valvey = start_valvey(tmp_path, rack, proxy.port)
        try:
            async with operator(mosquitto.port, rack) as op:
                await op.until(lambda: op.status[-1:] == ["online"], "valvey online", valvey)
                first = await op.client.call("valvey", "get_state")
                assert first["ok"]
                proxy.cut()
                await op.until(lambda: op.status[-1:] == ["offline"], "the Will", valvey)
                sent = {}
                for i, sp in ((1, 41.0), (2, 42.0), (3, 43.0)):
                    sent[i] = await op.client.send("valvey", "set_setpoint",
                                                   {"setpoint_c": sp}, request_id=f"c-{i}")
                await asyncio.sleep(2.0)
                assert not any(f.done() for f in sent.values())  # queued, not lost
                restored = time.monotonic()
                proxy.restore()
                replies = await asyncio.wait_for(asyncio.gather(*sent.values()), 15)
                took = time.monotonic() - restored
                assert took <= 5.0, f"applied {took:.1f} s after the network came back"
                assert [r["ok"] for r in replies] == [True, True, True]
                assert [r["state"]["setpoint_c"] for r in replies] == [41.0, 42.0, 43.0]
                assert op.client.arrivals[-3:] == ["c-1", "c-2", "c-3"]  # in order
                # A repeat (a redelivery, or the client retrying) is answered, not applied.
                again = await op.client.call("valvey", "set_setpoint", {"setpoint_c": 42.0},
                                             request_id="c-2")
                assert again == replies[1]
                now = await op.client.call("valvey", "get_state")
                assert now["state"]["setpoint_c"] == 43.0
                t = time.monotonic()
                await op.until(lambda: op.health_at > t, "health", valvey)
                c = op.health["commands"]
                assert (c["applied"], c["duplicates"]) == (5, 1)  # 2 get_state + c-1..c-3
        finally:
            code = valvey.stop()
    assert code == 0


async def test_br22b_broker_restart_without_persistence_resubscribes_and_applies_c4(
    tmp_path: Path, mosquitto_private: Mosquitto
) -> None:
    rack = f"br22b-{uuid.uuid4().hex[:6]}"
    port = mosquitto_private.port
    valvey = start_valvey(tmp_path, rack, port)
    try:
        async with operator(port, rack) as op:
            await op.until(lambda: op.health.get("mqtt_subscribed"), "valvey online", valvey)
            r3 = await op.client.call("valvey", "set_setpoint", {"setpoint_c": 43.0},
                                      request_id="c-3")
            assert r3["ok"]
        mosquitto_private.restart()  # persistence false: every session is gone
        async with operator(port, rack) as op:
            await op.until(lambda: op.health.get("mqtt_reconnects", 0) >= 1,
                           "valvey reconnected", valvey)
            r4 = await op.client.call("valvey", "set_setpoint", {"setpoint_c": 44.0},
                                      request_id="c-4")
            assert r4["ok"] is True and r4["state"]["setpoint_c"] == 44.0
            t = time.monotonic()
            await op.until(lambda: op.health_at > t, "health", valvey)
            assert op.health["mqtt_subscribed"] == op.health["mqtt_configured"] != []
    finally:
        code = valvey.stop()
    assert code == 0
    connected = [e for e in valvey.events() if e.get("event") == "mqtt_connected"]
    assert [e["session_present"] for e in connected][-1] is False
