"""tray-agent with a tray BMC (a Redfish service serving DMTF's mockups) on a real Mosquitto:
the tray's input power, coolant outlet and leak state come from the BMC while its reading is
fresh; a slow BMC never stalls the publish loop (messages keep coming at the interval, the BMC
figures fall back once stale: estimate, configured outlet, leak sensor faulted); racky's
receive path refuses none of the messages."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from harness.daemons import daemon_proc
from harness.servers import Mosquitto
from tests.adapters.mqtt_cli import MqttSub
from tests.integration.test_trayagent_nvml import _config, _env, _racky, _tray_where, _trays
from tests.standin.build import build_nvml_standin
from tests.standin.redfish_server import RedfishServer

pytestmark = [pytest.mark.servers]

BASE = "rackplane/lab/rack01/trays"


async def test_bmc_figures_while_fresh_and_a_slow_bmc_never_stalls_publishing(
        tmp_path: Path, mosquitto: Mosquitto) -> None:
    lib = build_nvml_standin(tmp_path / "lib")
    bmc = RedfishServer()
    try:
        text = _config(tmp_path, mosquitto.port).read_text() + (
            "[agents.trays.bmc]\n"
            f'url = "{bmc.url}"\nchassis = "1U"\nusername = "admin"\n'
            'password_env = "TRAY03_BMC_PASSWORD"\ntimeout_s = 5.0\nmax_age_s = 1.0\n')
        cfg = tmp_path / "bmc.toml"
        cfg.write_text(text)
        racky = _racky()
        async with MqttSub(mosquitto.port, f"{BASE}/#") as sub:
            agent = daemon_proc("trayagent", tmp_path, cfg, tag="bmc",
                                env=_env(lib, TRAY03_BMC_PASSWORD="secret")).start()
            t = await _tray_where(sub, lambda t: t["power_w"] == 374.0, "the BMC's power",
                                  agent)
            assert (t["coolant_out_temp_c"], t["leak"], t["leak_sensor_fault"]) == \
                (46.9, False, False)
            bmc.delay_s = 3.0  # every request 3 s: one BMC read takes ~20 s
            await asyncio.sleep(0.5)
            n = len(_trays(sub))
            await asyncio.sleep(2.0)
            assert len(_trays(sub)) >= n + 5  # 0.2 s interval: the loop keeps publishing
            t = await _tray_where(sub, lambda t: t["leak_sensor_fault"], "the stale fallback",
                                  agent)
            assert t["coolant_out_temp_c"] == 45.0 and t["power_w"] == 4 * 700.0 + 400.0
            bmc.delay_s = 0.0
            await _tray_where(sub, lambda t: t["power_w"] == 374.0 and not
                              t["leak_sensor_fault"], "the BMC back", agent)
            assert agent.stop() == 0
        for m in sub.messages:
            if m.topic.endswith("/telemetry/tray03"):
                racky.message(m.topic, m.payload, retain=m.retain,
                              received_mono=time.monotonic(), wall_ns=time.time_ns())
        assert (racky.ingest.errors, racky.ingest.stale_messages) == (0, 0)
        assert bmc.logins == 1  # one session, reused throughout (no new one at the stop)
    finally:
        bmc.close()
