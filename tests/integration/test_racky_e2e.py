"""racky's daemon end to end with real servers: the virtual rack (power shelves behind Modbus
TCP, node agents and telemetry on MQTT) and racky (`racky.app.Racky`) through a real Mosquitto.

- racky polls the 8 power shelves and publishes ``state/rack_power`` (retained);
- with a budget below the load, racky caps the trays over the node-agent contract
  (``set_power_limits``), the simulator's agents obey, and rack power falls under the budget;
- valvey's safety request (``racky/cmd/valvey/power_down_trays``) switches trays off at once
  and racky replies with its state.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from harness.daemons import command_envelope, in_process_rack
from harness.servers import Mosquitto
from rackplane.commands import CommandReply
from rackplane.settings import ModbusTargetSettings
from racky.app import Racky
from racky.config import RackyConfig
from tests.adapters.mqtt_cli import MqttSub, mqtt_pub

pytestmark = [pytest.mark.servers, pytest.mark.slow]

BUDGET_W = 100_000.0


async def test_racky_caps_the_rack_and_serves_valveys_power_down(
        tmp_path: Path, mosquitto: Mosquitto, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # racky's state file and spool land here
    async with in_process_rack(mosquitto.port) as rr:
        sim, base = rr.sim, rr.base
        shelves = [ModbusTargetSettings(name=f"shelf{i}", port=rr.shelf_port,
                                        unit_id=1 + i, register_map=Path("power-shelf"),
                                        timeout_s=1.0, reconnect_min_s=0.1,
                                        reconnect_max_s=1.0)
                   for i in range(8)]
        cfg = RackyConfig.model_validate({
            "identity": rr.ident.model_dump(), "mqtt": rr.mqtt.model_dump(),
            "power_shelves": [s.model_dump() for s in shelves],
            "power": {"budget_w": BUDGET_W},
            "lifecycle": {"state_file": str(tmp_path / "racky-state.json")},
            "spool": {"directory": str(tmp_path / "spool")},
        })
        racky = Racky(cfg)
        async with MqttSub(mosquitto.port, f"{base}/racky/state/+", f"{base}/racky/alarm/+",
                           f"{base}/racky/cmd/valvey/+/result", f"{base}/sim/telemetry/power",
                           v5=False) as sub:
            rr.spawn(racky.run(rr.stop))

            def rack_power() -> float | None:
                got = sub.on(f"{base}/racky/state/rack_power")
                return json.loads(got[-1].payload)["rack_power_w"] if got else None

            await sub.wait_for(lambda m: m.topic == f"{base}/racky/state/rack_power"
                                   and json.loads(m.payload)["shelves_reporting"] == 8, 30.0)
            async with MqttSub(mosquitto.port, f"{base}/racky/state/rack_power",
                               v5=False) as late:
                r = await late.wait_for(lambda m: True, 10.0)
                assert r.retain  # valvey starting later finds the rack power at once
            # the load step at 10 s takes the rack over the budget; racky caps it back under
            for _ in range(300):
                p = rack_power()
                if sim.run_.t_s > 25.0 and p is not None and p <= BUDGET_W * 1.02:
                    break
                await asyncio.sleep(0.2)
            p = rack_power()
            assert p is not None and p <= BUDGET_W * 1.02, p
            assert sim.rack is not None
            caps = [sim.rack.agents.settings(k).power_cap_w for k in range(18)]
            assert all(c is not None for c in caps), caps  # the agents hold racky's caps
            assert racky.agent_stats["ok"] >= 1 and racky.agent_stats["refused"] == 0
            # the simulator's agents answer in the contract's reply layout (1.3): every ok
            # reply read, its per-GPU read-back kept
            assert racky.agent_stats["bad_reply_state"] == 0, racky.agent_stats
            assert racky.agent_stats["legacy_replies"] == 0, racky.agent_stats
            assert racky.racky_tick.agent_readback

            n = len(sub.messages)
            await mqtt_pub(mosquitto.port, f"{base}/racky/cmd/valvey/power_down_trays",
                           command_envelope("leak-1", {"trays": [3], "reason": "leak at tray 3"}))
            res = await sub.wait_for(lambda m: m.topic.endswith("power_down_trays/result"),
                                     15.0, n)
            reply = CommandReply.model_validate(json.loads(res.payload))
            assert reply.ok, reply
            for _ in range(100):
                if not sim.rack.agents.settings(3).powered:
                    break
                await asyncio.sleep(0.1)
            assert not sim.rack.agents.settings(3).powered
            assert sim.rack.agents.settings(4).powered
            assert 3 in racky.core.persisted.safety_off
            # no shelf was ever reported offline (start-up inhibit, on-delay)
            assert not [m for m in sub.messages if "/alarm/shelf_offline" in m.topic]
