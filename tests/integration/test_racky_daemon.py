"""racky's daemon with real servers, the parts the end-to-end test does not reach:

- discovery (`racky.core.discovery` driven by `racky.app.Racky._discovery`) over real Modbus TCP
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
import signal
import uuid
from pathlib import Path

import pytest

from harness.daemons import (
    Proc,
    command_envelope,
    in_process_rack,
    racky_proc,
    until,
    write_config,
)
from harness.servers import Mosquitto, VictoriaMetrics
from rackplane.commands import CommandReply
from racky.app import Racky
from racky.config import RackyConfig
from tests.adapters.mqtt_cli import MqttSub, mqtt_pub

pytestmark = [pytest.mark.servers, pytest.mark.slow]

GATEWAY_TARGET_FAILED = 11  # Modbus exception: gateway target device failed to respond


async def test_discovery_dormant_reprobe_and_shelf_alarm_reach_mqtt_and_the_time_series(
        tmp_path: Path, mosquitto: Mosquitto, victoria: VictoriaMetrics,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    async with in_process_rack(mosquitto.port) as rr:
        face = rr.sim.shelf_face
        assert face is not None
        base = rr.base
        cfg = RackyConfig.model_validate({
            "identity": rr.ident.model_dump(), "mqtt": rr.mqtt.model_dump(),
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
            rr.spawn(racky.run(rr.stop))
            await until(lambda: plan.found() == list(range(1, 9)), 20.0, "8 shelves found")
            await until(lambda: racky.core.last is not None and racky.core.last.shelves
                        is not None and racky.core.last.shelves.shelves_reporting == 8,
                        20.0, "8 shelves reporting")
            assert plan.state[9] == plan.state[10] == "unknown"  # no unit behind them
            # shelf unit 3 answers every request with an exception: dormant, alarmed
            face.inject_exception(GATEWAY_TARGET_FAILED, unit=3)
            await until(lambda: plan.state[3] == "dormant", 20.0, "unit 3 dormant")
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
            await until(lambda: plan.state[3] == "found", 20.0, "unit 3 found again")
            assert "shelf-u3" in racky._device_tasks
            await sub.wait_for(lambda m: m.topic == alarm_topic and not m.payload, 30.0, n)
            await until(lambda: racky.core.last is not None and racky.core.last.shelves
                        is not None and racky.core.last.shelves.shelves_reporting == 8,
                        20.0, "8 shelves reporting again")
        series = await asyncio.to_thread(
            victoria.wait_export, '{__name__="alarm_active",alarm=~"shelf_offline:.*u3"}', 2, 20.0)
        values = [v for s in series for v in s["values"]]
        assert 1.0 in values and values[-1] == 0.0, series  # raised, then cleared


def _write_config(path: Path, rack: str, mqtt_port: int, tmp: Path, users: dict[str, str]
                  ) -> Path:
    return write_config(
        path,
        identity={"site": "lab", "rack": rack},
        mqtt={"port": mqtt_port, "reconnect_min_s": 0.1, "reconnect_max_s": 1.0},
        commands={"users": users},
        lifecycle={"state_file": str(tmp / "racky-state.json")},
        spool={"directory": str(tmp / "spool")},
        validation={"report_dir": str(tmp / "reports")},
    )


async def _log_has(proc: Proc, event: str, timeout_s: float) -> None:
    await until(lambda: event in proc.log.read_text(errors="replace"), timeout_s,
                f"{event!r} in racky's log", proc)


async def test_sighup_applies_command_roles_rejects_a_bad_file_and_sigterm_stops(
        tmp_path: Path, mosquitto: Mosquitto) -> None:
    rack = f"r{uuid.uuid4().hex[:10]}"
    conf = _write_config(tmp_path / "racky.toml", rack, mosquitto.port, tmp_path, {})
    base = f"rackplane/lab/{rack}/racky"
    proc = racky_proc(tmp_path, conf, env={"PYTHONUNBUFFERED": "1"}).start()  # reaped after
    async with MqttSub(mosquitto.port, f"{base}/cmd/alice/+/result", v5=False) as sub:
        async def budget(rid: str, power_w: float) -> CommandReply:
            n = len(sub.messages)
            await mqtt_pub(mosquitto.port, f"{base}/cmd/alice/set_budget",
                           command_envelope(rid, {"power_w": power_w, "reason": "test"}))
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
        _write_config(conf, rack, mosquitto.port, tmp_path, {"alice": "operator"})
        proc.signal(signal.SIGHUP)
        await _log_has(proc, '"reloaded"', 20.0)
        reply = await budget("b1", 90_000.0)
        assert reply.ok, reply
        # an invalid file: rejected, the running config (alice an operator) kept
        conf.write_text("[power]\nbudget_w = -5\n")
        proc.signal(signal.SIGHUP)
        await _log_has(proc, "reload_rejected", 20.0)
        assert proc.alive()
        reply = await budget("b2", 95_000.0)
        assert reply.ok, reply
    proc.signal(signal.SIGTERM)
    rc = await asyncio.to_thread(proc.wait, 30)
    assert rc == 0, proc.log.read_text()[-3000:]
    state = json.loads((tmp_path / "racky-state.json").read_text())
    assert state["budget"] == {"power_w": 95_000.0, "set": True}  # persisted at stop
