"""tray-agent capping a tray at its BMC (``actuation = "redfish"``) on a real Mosquitto, over
the stand-in NVML and a Redfish service serving DMTF's liquid-cooled server mockup with
ETag / If-Match on its chassis power ``Control``, a session limit, slow answers and a dropping
event stream:

- the safe cap (4 × 700 W + 400 W) is clamped to the control's ``AllowableMax`` and reported
  clamped; racky's ``power_cap_w`` is set through the control, confirmed by the read-back
  (the reply and ``enforced_tray_cap_w``), clamped up to ``AllowableMin`` when below it; the
  GPUs' NVML limits are never touched;
- with the BMC answering every request in 5 s the publish interval's jitter stays within 10 %
  of the interval (measured from the payloads' ``ts_ns``, printed), and a cap command answers
  by ``caps.confirm_timeout_s`` (not confirmed) and is read back once the BMC answers again;
- one session for the whole run (a second client at the limit would be refused); the event
  stream, dropping every few events, is never opened (the agent polls);
- racky's receive path refuses none of the messages."""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from harness.daemons import daemon_proc
from harness.servers import Mosquitto
from rackplane.core.tray_reply import SetPowerLimitsReply
from tests.adapters.mqtt_cli import MqttSub
from tests.integration.test_trayagent_nvml import (
    BASE,
    _command,
    _config,
    _env,
    _racky,
    _tray_where,
    _trays,
)
from tests.standin.build import build_nvml_standin
from tests.standin.redfish_server import RedfishServer

pytestmark = [pytest.mark.servers]

CTL = "/redfish/v1/Chassis/1U/Controls/PowerLimit"
TICK_S = 0.5



def _tray_state(reply: dict[str, Any], tray: int) -> dict[str, Any]:
    """Tray ``tray``'s entry of an ok set_power_limits reply (contract 1.3: a list of trays,
    each once, validated as the contract's model)."""
    SetPowerLimitsReply.model_validate(reply["state"])
    (item,) = [t for t in reply["state"]["trays"] if t["tray"] == tray]
    return dict(item)

async def test_caps_at_the_bmc_and_a_5_s_bmc_never_stalls_publishing(
        tmp_path: Path, mosquitto: Mosquitto) -> None:
    lib = build_nvml_standin(tmp_path / "lib")
    bmc = RedfishServer(max_sessions=1)
    bmc.sse_events_per_connection = 3
    try:
        text = _config(tmp_path, mosquitto.port).read_text().replace(
            "tick_s = 0.2", f"tick_s = {TICK_S}").replace(
            "coolant_out_temp_c = 45.0\n", 'coolant_out_temp_c = 45.0\nactuation = "redfish"\n')
        text += ("[agents.trays.bmc]\n"
                 f'url = "{bmc.url}"\nchassis = "1U"\nusername = "admin"\n'
                 'password_env = "TRAY03_BMC_PASSWORD"\ntimeout_s = 8.0\nmax_age_s = 60.0\n')
        cfg = tmp_path / "bmc-caps.toml"
        cfg.write_text(text)
        racky = _racky()
        async with MqttSub(mosquitto.port, f"{BASE}/#") as sub:
            agent = daemon_proc("trayagent", tmp_path, cfg, tag="bmccaps",
                                env=_env(lib, TRAY03_BMC_PASSWORD="secret")).start()
            # the safe cap 3,200 W is above the control's maximum: held there, said clamped
            t = await _tray_where(sub, lambda t: t["agent"]["enforced_tray_cap_w"] == 1000.0,
                                  "the safe cap clamped at the control", agent)
            assert t["agent"]["cap_clamped"] is True and t["agent"]["cap_enforceable"]
            assert bmc.resources[CTL]["SetPoint"] == 1000.0
            # the GPUs' NVML limits are never set (the stand-in's default stays)
            assert all(g["power_limit_w"] == g["power_limit_default_w"] for g in t["gpus"])

            t0 = time.perf_counter()
            r = await _command(mosquitto.port, sub, {"epoch": 1, "power_cap_w": 600.0,
                                                     "ttl_s": 60.0})
            took = time.perf_counter() - t0
            assert r["ok"], r
            ctl = _tray_state(r, 3)["bmc_control"]
            assert r["state"]["confirmed"] is True
            assert (ctl["target_w"], ctl["enforced_w"], ctl["clamped"]) == (600.0, 600.0, None)
            assert bmc.resources[CTL]["SetPoint"] == 600.0
            print(f"\ncap command -> BMC control read back -> reply: {took * 1000:.0f} ms")
            t = await _tray_where(sub, lambda t: t["agent"]["enforced_tray_cap_w"] == 600.0,
                                  "the control's read-back reported", agent)
            assert t["agent"]["power_cap_w"] == 600.0 and t["agent"]["cap_clamped"] is False

            r = await _command(mosquitto.port, sub, {"epoch": 1, "power_cap_w": 100.0,
                                                     "ttl_s": 60.0})
            ctl = _tray_state(r, 3)["bmc_control"]
            assert r["ok"] and (ctl["target_w"], ctl["enforced_w"]) == (150.0, 150.0)
            assert "below the control's minimum" in ctl["clamped"]
            t = await _tray_where(sub, lambda t: t["agent"]["cap_clamped"] is True,
                                  "the clamp reported", agent)
            assert t["agent"]["enforced_tray_cap_w"] == 150.0

            # a BMC answering every request in 5 s: the publish loop keeps its interval
            bmc.delay_s = 5.0
            await asyncio.sleep(1.0)
            start = len(sub.messages)
            await asyncio.sleep(8.0)
            slow = _trays(sub, start)
            # a command meanwhile answers by confirm_timeout_s (3 s), not confirmed; the cap
            # is read back once the BMC answers again
            t0 = time.perf_counter()
            r = await _command(mosquitto.port, sub, {"epoch": 1, "power_cap_w": 700.0,
                                                     "ttl_s": 60.0})
            reply_s = time.perf_counter() - t0
            print(f"\ncap command with a 5 s BMC: reply after {reply_s:.2f} s, confirmed "
                  f"{r['state']['confirmed']}")
            assert r["ok"] and r["state"]["confirmed"] is False and 2.5 <= reply_s <= 4.5
            bmc.delay_s = 0.0
            await _tray_where(sub, lambda t: t["agent"]["enforced_tray_cap_w"] == 700.0,
                              "the cap read back after the slow spell", agent)
            ts = [m["ts_ns"] / 1e9 for m in slow]
            dts = [b - a for a, b in itertools.pairwise(ts)]
            dev = [abs(d - TICK_S) for d in dts]
            print(f"publish interval with a 5 s BMC: {len(dts)} intervals, median "
                  f"{statistics.median(dts) * 1000:.1f} ms, jitter max "
                  f"{max(dev) * 1000:.1f} ms = {max(dev) / TICK_S * 100:.1f} % of "
                  f"{TICK_S * 1000:.0f} ms (target <= 10 %)")
            assert len(dts) >= int(8.0 / TICK_S) - 2
            assert max(dev) <= 0.1 * TICK_S
            assert agent.stop() == 0
        for m in sub.messages:
            if m.topic.endswith("/telemetry/tray03"):
                racky.message(m.topic, m.payload, retain=m.retain,
                              received_mono=time.monotonic(), wall_ns=time.time_ns())
        assert (racky.ingest.errors, racky.ingest.stale_messages) == (0, 0)
        assert bmc.logins == 1  # one session for reads and cap sets, through the slow BMC
        assert bmc.sse_connections == 0  # the agent polls: a dropping stream cannot matter
    finally:
        bmc.close()
