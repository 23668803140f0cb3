"""racky's daemon with real servers, the parts the end-to-end test does not reach:

- discovery (`racky.discovery` driven by `racky.app.Racky._discovery`) over real Modbus TCP
  (the simulator's power-shelf face, `sims.modbus_face`): the start-up scan finds the 8 shelves
  and no more; a shelf that answers only exceptions goes dormant (its poll stops), is
  re-probed, and is polled again once it answers;
- the shelf-offline alarm on its way: retained on MQTT (``racky/alarm/<id>``, cleared with an
  empty retained message) and in the time series (real VictoriaMetrics, ``alarm_active``);
- SIGHUP on the ``racky`` process: command roles apply at once, an invalid file is rejected
  and the running config kept, the daemon keeps running; SIGTERM stops it cleanly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from rackplane.commands import CommandReply
from rackplane.settings import Identity, MqttSettings
from racky.app import Racky
from racky.config import RackyConfig
from sims.runtime import VirtualRackSimulator
from sims.scenario import load_scenario
from tests.adapters.mqtt_cli import MqttSub, mqtt_pub
from tests.servers import Mosquitto, VictoriaMetrics

pytestmark = [pytest.mark.servers, pytest.mark.slow]

GATEWAY_TARGET_FAILED = 11  # Modbus exception: gateway target device failed to respond


async def _until(cond: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


async def test_discovery_dormant_reprobe_and_shelf_alarm_reach_mqtt_and_the_time_series(
        tmp_path: Path, mosquitto: Mosquitto, victoria: VictoriaMetrics,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    rack = f"r{uuid.uuid4().hex[:10]}"
    ident = Identity(rack=rack)
    mq = MqttSettings(port=mosquitto.port, clean_session=True, reconnect_min_s=0.1,
                      reconnect_max_s=1.0)
    sc = load_scenario("load-step-short").model_copy(update={"duration_s": 3600.0})
    sim = VirtualRackSimulator(sc, modbus_port=0, shelf_modbus_port=0, identity=ident,
                               mqtt=mq, telemetry_interval_s=1.0)
    stop = asyncio.Event()
    sim_task = asyncio.create_task(sim.run(stop))
    racky_task: asyncio.Task[None] | None = None
    base = f"rackplane/lab/{rack}"
    try:
        await _until(lambda: sim.shelf_face is not None and sim.shelf_face.port, 10.0,
                     "the shelf face")
        face = sim.shelf_face
        assert face is not None
        cfg = RackyConfig.model_validate({
            "identity": ident.model_dump(), "mqtt": mq.model_dump(),
            "discovery": {"enabled": True, "port": face.port, "unit_id_first": 1,
                          "unit_id_last": 10, "timeout_s": 0.3, "slow_scan_interval_s": 1.0,
                          "dormant_after_s": 2.0, "reprobe_dormant_s": 1.5},
            "tsdb": {"url": victoria.url, "flush_interval_s": 0.2},
            "lifecycle": {"state_file": str(tmp_path / "racky-state.json")},
            "spool": {"directory": str(tmp_path / "spool")},
        })
        racky = Racky(cfg)
        plan = racky.plan
        assert plan is not None
        async with MqttSub(mosquitto.port, f"{base}/racky/alarm/+", v5=False) as sub:
            racky_task = asyncio.create_task(racky.run(stop))
            await _until(lambda: plan.found() == list(range(1, 9)), 20.0, "8 shelves found")
            await _until(lambda: racky.core.last is not None and racky.core.last.shelves
                         is not None and racky.core.last.shelves.shelves_reporting == 8,
                         20.0, "8 shelves reporting")
            assert plan.state[9] == plan.state[10] == "unknown"  # no unit behind them
            # shelf unit 3 answers every request with an exception: dormant, alarmed
            face.inject_exception(GATEWAY_TARGET_FAILED, unit=3)
            await _until(lambda: plan.state[3] == "dormant", 20.0, "unit 3 dormant")
            assert "shelf-u3" not in racky._device_tasks  # its poll stopped
            msg = await sub.wait_for(lambda m: "/alarm/shelf_offline" in m.topic
                                     and "u3" in m.topic and bool(m.payload), 20.0)
            alarm_topic = msg.topic
            body = json.loads(msg.payload)
            assert body["state"] == "active" and "shelf-u3" in body["message"]
            async with MqttSub(mosquitto.port, alarm_topic, v5=False) as late:
                kept = await late.wait_for(lambda m: True, 10.0)
                assert kept.retain and json.loads(kept.payload)["state"] == "active"
            # it comes back: re-probed, found, polled again, alarm cleared (empty retained)
            n = len(sub.messages)
            face.clear_exceptions()
            await _until(lambda: plan.state[3] == "found", 20.0, "unit 3 found again")
            assert "shelf-u3" in racky._device_tasks
            await sub.wait_for(lambda m: m.topic == alarm_topic and not m.payload, 30.0, n)
            await _until(lambda: racky.core.last is not None and racky.core.last.shelves
                         is not None and racky.core.last.shelves.shelves_reporting == 8,
                         20.0, "8 shelves reporting again")
        series = await asyncio.to_thread(
            victoria.wait_export, '{__name__="alarm_active",alarm=~"shelf_offline.*u3"}', 2, 20.0)
        values = [v for s in series for v in s["values"]]
        assert 1.0 in values and values[-1] == 0.0, series  # raised, then cleared
    finally:
        stop.set()
        tasks = [t for t in (sim_task, racky_task) if t is not None]
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30.0)
        for t in tasks:
            t.cancel()


def _config_text(rack: str, mqtt_port: int, tmp: Path, users: str) -> str:
    return f"""
[identity]
rack = "{rack}"

[mqtt]
port = {mqtt_port}
reconnect_min_s = 0.1
reconnect_max_s = 1.0

[commands]
users = {users}

[lifecycle]
state_file = "{tmp / 'racky-state.json'}"

[spool]
directory = "{tmp / 'spool'}"

[validation]
report_dir = "{tmp / 'reports'}"
"""


def _envelope(request_id: str, args: dict[str, Any]) -> str:
    return json.dumps({"request_id": request_id,
                       "issued_at": datetime.now(UTC).isoformat(timespec="seconds"),
                       "args": args})


def _start(conf: Path, log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "wb") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", "racky", "--config", str(conf), "--log-format", "json"],
            stdout=fh, stderr=subprocess.STDOUT, env=env)


async def _log_has(path: Path, event: str, timeout_s: float) -> None:
    await _until(lambda: event in path.read_text(errors="replace"), timeout_s,
                 f"{event!r} in racky's log")


async def test_sighup_applies_command_roles_rejects_a_bad_file_and_sigterm_stops(
        tmp_path: Path, mosquitto: Mosquitto) -> None:
    rack = f"r{uuid.uuid4().hex[:10]}"
    conf = tmp_path / "racky.toml"
    conf.write_text(_config_text(rack, mosquitto.port, tmp_path, "{}"))
    log = tmp_path / "racky.log"
    base = f"rackplane/lab/{rack}/racky"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = await asyncio.to_thread(_start, conf, log, env)
    try:
        async with MqttSub(mosquitto.port, f"{base}/cmd/alice/+/result", v5=False) as sub:
            async def budget(rid: str, power_w: float) -> CommandReply:
                n = len(sub.messages)
                await mqtt_pub(mosquitto.port, f"{base}/cmd/alice/set_budget",
                               _envelope(rid, {"power_w": power_w, "reason": "test"}))
                m = await sub.wait_for(lambda m: True, 20.0, n)
                return CommandReply.model_validate(json.loads(m.payload))

            # alice is a reader until the config names her (retry: racky may still start)
            reply = None
            for i in range(50):
                with contextlib.suppress(AssertionError, TimeoutError):
                    reply = await asyncio.wait_for(budget(f"a{i}", 90_000.0), 1.0)
                    break
            assert reply is not None and not reply.ok and reply.error is not None
            assert reply.error.code == "forbidden", reply
            conf.write_text(_config_text(rack, mosquitto.port, tmp_path,
                                         '{ alice = "operator" }'))
            proc.send_signal(signal.SIGHUP)
            await _log_has(log, '"reloaded"', 20.0)
            reply = await budget("b1", 90_000.0)
            assert reply.ok, reply
            # an invalid file: rejected, the running config (alice an operator) kept
            conf.write_text("[power]\nbudget_w = -5\n")
            proc.send_signal(signal.SIGHUP)
            await _log_has(log, "reload_rejected", 20.0)
            assert proc.poll() is None
            reply = await budget("b2", 95_000.0)
            assert reply.ok, reply
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.to_thread(proc.wait, 30)
        assert rc == 0, log.read_text()[-3000:]
        state = json.loads((tmp_path / "racky-state.json").read_text())
        assert state["budget"] == {"power_w": 95_000.0, "set": True}  # persisted at stop
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
