"""tray-agent reading its trays through a DCGM exporter (served over real HTTP) and publishing
on a real Mosquitto: racky's receive path refuses none of its messages, they say
``cap_enforceable = false``, and a cap is refused ``not_supported`` (never accepted and then
silently not applied)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from harness.daemons import daemon_proc
from harness.servers import Mosquitto
from tests.adapters.mqtt_cli import MqttSub
from tests.integration.test_trayagent_nvml import BASE, _command, _racky, _tray_where, _trays
from tests.unit.test_trayagent_dcgm import _Exporter

pytestmark = [pytest.mark.servers]


async def test_a_dcgm_read_tray_is_published_read_only(tmp_path: Path,
                                                       mosquitto: Mosquitto) -> None:
    exporter = _Exporter()
    try:
        cfg = tmp_path / "tray-agent.toml"
        cfg.write_text(f"""
[identity]
site = "lab"
row = "row1"
rack = "rack01"
[mqtt]
host = "127.0.0.1"
port = {mosquitto.port}
[spool]
directory = "{tmp_path / 'spool'}"
[control]
tick_s = 0.2
[caps]
epoch_file = "{tmp_path / 'epochs.json'}"
[dcgm]
url = "{exporter.url}"
[agents]
daemon = "trays"
source = "dcgm"
[[agents.trays]]
tray = 3
nvml_devices = [0, 1, 2, 3]
coolant_out_temp_c = 45.0
""")
        racky = _racky()
        async with MqttSub(mosquitto.port, f"{BASE}/#") as sub:
            agent = daemon_proc("trayagent", tmp_path, cfg).start()
            t = await _tray_where(sub, lambda t: True, "telemetry", agent)
            assert t["agent"]["cap_enforceable"] is False
            assert [g["power_w"] for g in t["gpus"]] == [612.5] * 4
            r = await _command(mosquitto.port, sub, {"epoch": 1, "gpu_power_cap_w": 500.0,
                                                     "ttl_s": 60.0})
            assert not r["ok"] and r["error"]["code"] == "not_supported"
            exporter.body = "garbage{"  # the exporter breaks: nothing is published as fresh
            n = len(_trays(sub))
            await asyncio.sleep(1.0)
            assert len(_trays(sub)) <= n + 1  # at most one scrape was already under way
            assert agent.stop() == 0
        for m in sub.messages:
            if m.topic.endswith("/telemetry/tray03"):
                racky.message(m.topic, m.payload, retain=m.retain,
                              received_mono=time.monotonic(), wall_ns=time.time_ns())
        assert (racky.ingest.errors, racky.ingest.stale_messages) == (0, 0)
        events = [e for e in agent.events() if e["event"] == "tray_not_published"]
        assert events and "power unknown" in events[0]["reason"]
    finally:
        exporter.server.shutdown()
        exporter.server.server_close()
