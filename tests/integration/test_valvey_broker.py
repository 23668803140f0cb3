"""valvey and its broker: a restart without persistence, commands before and after (BR-22 b)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from harness.daemons import sim_proc, until, valvey_proc, write_valvey_config
from harness.servers import Mosquitto, free_port
from rackplane.clock import SYSTEM_CLOCK
from rackplane.io.mqtt import Message, MqttLink
from rackplane.settings import Identity, MqttSettings

pytestmark = [pytest.mark.servers, pytest.mark.slow]


class Operator:
    """An operator tool on MQTT 3.1.1: sends commands as user `op1`, reads the replies."""

    def __init__(self, port: int, rack: str):
        ident = Identity(rack=rack)
        self.link = MqttLink(
            MqttSettings(port=port, protocol="3.1.1", clean_session=True,
                         client_id=f"op-{uuid.uuid4().hex[:6]}", reconnect_max_s=1.0),
            ident, "op", clock=SYSTEM_CLOCK,
        )
        self.base = f"rackplane/lab/{rack}/valvey"
        self.replies: dict[str, dict[str, Any]] = {}
        self.health: dict[str, Any] = {}
        self.safety: dict[str, Any] = {}
        self.link.subscribe(f"{self.base}/cmd/op1/+/result", self._reply, qos=1)
        self.link.subscribe(f"{self.base}/state/health", self._health, qos=0)
        self.link.subscribe(f"{self.base}/state/safety", self._safety, qos=0)

    def _reply(self, m: Message) -> None:
        body = m.json()
        self.replies[str(body.get("request_id"))] = body

    def _health(self, m: Message) -> None:
        self.health = m.json()

    def _safety(self, m: Message) -> None:
        self.safety = m.json()

    async def command(
        self, verb: str, args: dict[str, Any], timeout_s: float = 15
    ) -> dict[str, Any]:
        rid = uuid.uuid4().hex[:12]
        payload = {"request_id": rid, "issued_at": datetime.now(UTC).isoformat(), "args": args}
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            with contextlib.suppress(Exception):
                await self.link.publish(f"{self.base}/cmd/op1/{verb}", json.dumps(payload), qos=1)
            for _ in range(10):
                if rid in self.replies:
                    return self.replies[rid]
                await asyncio.sleep(0.1)
        raise AssertionError(f"no reply to {verb} within {timeout_s} s")


async def test_br22b_broker_restart_without_persistence_valvey_resubscribes(
    tmp_path: Path, mosquitto_private: Mosquitto
) -> None:
    rack = f"it-{uuid.uuid4().hex[:8]}"
    modbus_port = free_port()
    sim = sim_proc(tmp_path, modbus_port, mosquitto_private.port, "load-step-short", rack)
    cfg = write_valvey_config(
        tmp_path / "valvey.toml",
        identity={"site": "lab", "rack": rack},
        cdu={"port": modbus_port},
        mqtt={"port": mosquitto_private.port, "reconnect_max_s": 2.0},
        spool={"directory": str(tmp_path / "spool")},
        commands={"users": {"op1": "operator"}},
        log={"format": "json"},
    )
    valvey = valvey_proc(tmp_path, cfg)
    op = Operator(mosquitto_private.port, rack)
    task = asyncio.create_task(op.link.run())
    try:
        sim.start()
        valvey.start()
        await op.link.wait_ready(15)
        r1 = await op.command("set_setpoint", {"setpoint_c": 44.0})
        assert r1["ok"] is True, r1
        assert r1["state"]["setpoint_c"] == 44.0

        mosquitto_private.restart()  # persistence false: every session is gone
        restarted = time.monotonic()
        r2 = await op.command("set_setpoint", {"setpoint_c": 45.5}, timeout_s=20)
        assert r2["ok"] is True and r2["state"]["setpoint_c"] == 45.5, r2
        # valvey saw its session lost, subscribed again, and says so in its health state.
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10 and op.health.get("mqtt_reconnects", 0) < 1:  # noqa: ASYNC110
            await asyncio.sleep(0.2)  # polls retained state published by another process
        assert op.health["mqtt_reconnects"] >= 1
        assert op.health["mqtt_subscribed"] == op.health["mqtt_configured"] != []
        # Within one reconnect-backoff cap (2 s) of the broker's return, plus the command's
        # own round trip and retry period.
        assert time.monotonic() - restarted < 2 + 1 + 10
        assert valvey.alive() and sim.alive()
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(op.link.stop(), 3)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        assert valvey.stop() == 0
        sim.stop()


async def test_command_setpoint_survives_a_daemon_restart(
    tmp_path: Path, mosquitto_private: Mosquitto
) -> None:
    """Issue 7 (valvey.persist): a setpoint set by command is saved by the running daemon and
    restored by the next process; a SIGTERM in between loses nothing. Issue 21 item 2: the
    liquid fraction and the exchanger's valve-open conductance an earlier run learned (laid
    into the file here: learning them takes minutes of steady, valve-open running) are
    restored by the next process and reported as such."""
    rack = f"it-{uuid.uuid4().hex[:8]}"
    modbus_port = free_port()
    sim = sim_proc(tmp_path, modbus_port, mosquitto_private.port, "load-step-short", rack)
    cfg = write_valvey_config(
        tmp_path / "valvey.toml",
        identity={"site": "lab", "rack": rack},
        cdu={"port": modbus_port},
        mqtt={"port": mosquitto_private.port, "reconnect_max_s": 1.0},
        spool={"directory": str(tmp_path / "spool")},
        commands={"users": {"op1": "operator"}},
        log={"format": "json"},
    )
    op = Operator(mosquitto_private.port, rack)
    task = asyncio.create_task(op.link.run())
    valvey = valvey_proc(tmp_path, cfg)
    try:
        sim.start()
        valvey.start()
        await op.link.wait_ready(15)
        r1 = await op.command("set_setpoint", {"setpoint_c": 43.5})
        assert r1["ok"] is True and r1["state"]["setpoint_c"] == 43.5, r1
        assert valvey.stop() == 0
        path = tmp_path / f"valvey-state-{rack}.json"
        doc = json.loads(path.read_text())
        assert doc["format"] == "valvey-state" and doc["data"]["setpoint_c"] == 43.5
        assert {"liquid_fraction", "exchanger"} <= set(doc["data"]["learned"])
        doc["data"]["learned"]["liquid_fraction"] = {
            "value": 0.91, "file_liquid_fraction": 0.85,
            "file_inputs": ["heat_removed_kw", "rack_power_w"]}
        doc["data"]["learned"]["exchanger"] = {
            "k_open_kw_per_k": 10.2, "file_cdu": f"127.0.0.1:{modbus_port}/1",
            "file_points": ["heat_removed_kw", "return_temp_c", "facility_supply_temp_c"]}
        # confirmed an hour ago (valvey.learned_age: without a time their age is unknown)
        doc["data"]["learned"]["confirmed_wall_s"] = dict.fromkeys(
            ("liquid_fraction", "k_open_kw_per_k"), int(time.time()) - 3600)
        path.write_text(json.dumps(doc))

        valvey = valvey_proc(tmp_path, cfg).start()  # the restart
        r2 = await op.command("get_state", {}, timeout_s=20)
        assert r2["ok"] is True and r2["state"]["setpoint_c"] == 43.5, r2
        assert r2["state"]["control_mode"] != "manual"
        restored = [e for e in valvey.events() if e.get("event") == "command_state_restored"]
        assert {"liquid_fraction", "k_open_kw_per_k"} <= set(restored[-1]["restored"]), restored
        await until(lambda: op.safety.get("liquid_fraction_source") == "restored", 20,
                    "state/safety: the liquid fraction restored", valvey,
                    detail=lambda: str(op.safety))
        assert op.safety["liquid_fraction"] == 0.91, op.safety
        # the figure racky derates by is there with the first flow reading, the valve open or
        # not: restored (or this run's, had the valve been fully open already)
        state: dict[str, Any] = {}
        for _ in range(40):
            state = (await op.command("get_state", {}, timeout_s=20))["state"]
            if state.get("capacity_w_per_k") is not None:
                break
            await asyncio.sleep(0.5)
        assert state.get("capacity_w_per_k") is not None, state
        assert state["capacity_w_per_k_source"] in ("restored", "measured"), state
        print(f"\nrestored exchanger: {state['capacity_w_per_k']} W/K "
              f"({state['capacity_w_per_k_source']}), valve {state['valve_command_pct']} %")
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(op.link.stop(), 3)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        assert valvey.stop() == 0
        sim.stop()
