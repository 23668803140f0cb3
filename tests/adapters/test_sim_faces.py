"""The virtual rack's real-time faces (sims/runtime.py): Modbus TCP answered as the register
maps say (real pymodbus client through `rackplane.io.modbus.ModbusDevice`), protocol faults on
the faces, and the MQTT publishers and node-agent commands against a real Mosquitto
(harness/servers.py), observed with Mosquitto's own C clients.

The Modbus tests push one static plant state to the faces (`VirtualRackSimulator.serve`) so
every served value can be compared exactly (within the register's resolution) with the plant.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from harness.servers import Mosquitto
from rackplane.clock import SystemClock
from rackplane.commands import CommandReply
from rackplane.config import validate_data
from rackplane.core.registers import load_register_map
from rackplane.core.samples import Quality, Sample
from rackplane.core.tray_reply import SetPowerLimitsReply
from rackplane.io.modbus import ModbusDevice
from rackplane.settings import Identity, ModbusTargetSettings, MqttSettings
from sims.runtime import VirtualRackSimulator
from sims.scenario import Scenario
from sims.telemetry import payload_models
from tests.adapters.mqtt_cli import MqttSub, mqtt_pub

CLOCK = SystemClock()


def scenario(*faults: dict[str, Any], load: dict[str, Any] | None = None) -> Scenario:
    return validate_data(Scenario, {
        "name": "faces", "duration_s": 600.0, "seed": 2, "plant": {"model": "rack"},
        "load": load or {"kind": "constant", "power_w": 132_000.0},
        "fabric": {"enabled": "off"}, "faults": list(faults),
    }, "test")


@contextlib.asynccontextmanager
async def static_faces(sc: Scenario, steps: int = 2) -> AsyncIterator[VirtualRackSimulator]:
    """A simulator whose faces serve the plant after ``steps`` steps, without ticking."""
    sim = VirtualRackSimulator(sc, modbus_port=0, shelf_modbus_port=0)
    for _ in range(steps):
        sim.run_.step(0.1)
    sim.apply_protocol()
    sim.serve()
    await sim.face.start()
    assert sim.shelf_face is not None
    await sim.shelf_face.start()
    try:
        yield sim
    finally:
        await sim.face.stop()
        await sim.shelf_face.stop()


async def read(port: int, regmap: str, unit: int = 1, **kw: Any) -> dict[str, Sample]:
    dev = ModbusDevice(
        ModbusTargetSettings(name=f"{regmap}-{unit}", port=port, unit_id=unit,
                             register_map=Path(regmap), **{"timeout_s": 2.0, **kw}),
        clock=CLOCK, on_samples=lambda s: None,
    )
    return {s.point: s for s in await dev.read_once()}


def close(point: Any, got: float | None, want: float) -> bool:
    tol = point.scale / 2 + 1e-9 if point.type not in ("float32", "float64") else 1e-5 * max(
        1.0, abs(want))
    return got is not None and abs(got - want) <= tol


async def test_cdu_and_shelf_faces_answer_as_the_register_maps_say() -> None:
    sc = scenario({"at_s": 0.0, "kind": "shelf_loss", "shelf": 2},
                  {"at_s": 0.0, "kind": "psu_derate", "shelf": 5, "psu": 1, "value": 0.5})
    async with static_faces(sc) as sim:
        cdu_map = load_register_map("cdu-generic")
        got = await read(sim.face.port, "cdu-generic")
        want = sim.run_.plant.readings()
        assert set(got) == {p.name for p in cdu_map.points}
        for name, s in got.items():
            assert s.quality is Quality.GOOD, (name, s)
            assert close(cdu_map.point(name), s.value, want[name]), (name, s.value, want[name])
        shelf_map = load_register_map("power-shelf")
        assert sim.rack is not None
        shelves = sim.rack.shelves
        assert sim.shelf_unit_ids == tuple(range(1, 9)) and sim.shelf_face is not None
        port = sim.shelf_face.port
        for i, unit in enumerate(sim.shelf_unit_ids):
            got = await read(port, "power-shelf", unit)
            want = shelves.shelf_readings(i)
            assert set(got) == {p.name for p in shelf_map.points}
            for name, s in got.items():
                assert s.quality is Quality.GOOD, (unit, name, s)
                assert close(shelf_map.point(name), s.value, want[name]), (unit, name, s.value)
        lost = await read(port, "power-shelf", 3)
        assert lost["ac_voltage_v"].value == 0.0 and lost["shelf_output_power_w"].value == 0.0
        assert int(lost["shelf_status"].value or 0) & 0b10  # AC input lost
        derated = await read(port, "power-shelf", 6)
        assert derated["psu2_status"].value == 0b101  # output OK + derated
        assert derated["rack_capacity_w"].value == pytest.approx(264_000 - 33_000 - 2_750)
        # a unit the shelf face does not serve: gateway exception (the unit is unavailable)
        gone = await read(port, "power-shelf", 9)
        assert all(s.quality is not Quality.GOOD for s in gone.values())


async def test_protocol_faults_reach_the_faces() -> None:
    sc = scenario(
        {"at_s": 0.0, "kind": "sensor", "point": "supply_temp_b_c", "mode": "sentinel"},
        {"at_s": 0.0, "kind": "modbus_gap", "device": "cdu", "table": "input", "address": 20},
        {"at_s": 0.0, "kind": "modbus_max_registers", "device": "power", "value": 10},
        {"at_s": 0.0, "kind": "modbus_exception", "device": "power", "code": 6, "unit": 4},
    )
    async with static_faces(sc) as sim:
        assert sim.shelf_face is not None
        assert sim.shelf_face.max_registers_per_request == 10
        dev = ModbusDevice(
            ModbusTargetSettings(name="cdu", port=sim.face.port, register_map=Path("cdu-generic"),
                                 timeout_s=2.0),
            clock=CLOCK, on_samples=lambda s: None,
        )
        polls = [{s.point: s for s in await dev.read_once()} for _ in range(3)]
        last = polls[-1]
        assert last["supply_temp_b_c"].quality is Quality.BAD
        assert last["supply_temp_b_c"].reason == "sentinel"
        assert last["loop_pressure_kpa"].quality is not Quality.GOOD
        assert last["loop_pressure_kpa"].reason == "illegal_data_address"
        assert last["supply_temp_c"].quality is Quality.GOOD  # the rest still reads
        shelf = ModbusDevice(
            ModbusTargetSettings(name="shelf", port=sim.shelf_face.port, unit_id=1,
                                 register_map=Path("power-shelf"), timeout_s=2.0),
            clock=CLOCK, on_samples=lambda s: None,
        )
        polls = [{s.point: s for s in await shelf.read_once()} for _ in range(3)]
        assert all(s.quality is not Quality.BAD for s in polls[-1].values())
        assert polls[-1]["rack_load_w"].value == pytest.approx(132_000.0, abs=5.0)
        assert shelf.stats.read_limit <= 10  # learned from exception 3 (FIELD-CASES BR-05)
        busy = await read(sim.shelf_face.port, "power-shelf", 4)
        assert all(s.quality is Quality.STALE and s.reason == "server_busy"
                   for s in busy.values())


async def test_half_open_and_slow_faces_time_out() -> None:
    sc = scenario({"at_s": 0.0, "kind": "modbus_slow", "device": "cdu", "value": 1.5},
                  {"at_s": 0.0, "kind": "modbus_half_open", "device": "power"})
    async with static_faces(sc) as sim:
        assert sim.shelf_face is not None and sim.shelf_face.blackhole
        slow = await read(sim.face.port, "cdu-generic", timeout_s=0.3)
        assert all(s.quality is Quality.STALE for s in slow.values())
        dead = await read(sim.shelf_face.port, "power-shelf", timeout_s=0.3)
        assert all(s.quality is Quality.STALE for s in dead.values())


def envelope(request_id: str, args: dict[str, Any]) -> str:
    return json.dumps({"request_id": request_id,
                       "issued_at": datetime.now(UTC).isoformat(timespec="seconds"),
                       "args": args})


@pytest.mark.servers
async def test_mqtt_publishers_and_node_agent_commands(mosquitto: Mosquitto) -> None:
    rack = f"r{uuid.uuid4().hex[:10]}"
    sc = scenario(load={"kind": "agentic"})
    sc = sc.model_copy(update={"fabric": None})  # the scenario default: auto, the fabric is here
    sim = VirtualRackSimulator(
        sc, modbus_port=0, shelf_modbus_port=0, identity=Identity(rack=rack),
        mqtt=MqttSettings(port=mosquitto.port, clean_session=True, reconnect_min_s=0.1,
                          reconnect_max_s=1.0),
        telemetry_interval_s=0.5,
    )
    base = f"rackplane/lab/{rack}/sim"
    models = payload_models()
    stop = asyncio.Event()
    async with MqttSub(mosquitto.port, f"{base}/telemetry/+", f"{base}/state/+",
                       f"{base}/cmd/+/+/result", v5=False) as sub:
        task = asyncio.create_task(sim.run(stop))
        try:
            things = ["plant", "rack", "power", "env", "truth",
                      *(f"tray{k:02d}" for k in range(18))]
            for thing in things:
                topic = f"{base}/telemetry/{thing}"
                await sub.wait_for(lambda m: m.topic == topic, 20.0)  # noqa: B023
            for thing in things:
                payload = json.loads(sub.on(f"{base}/telemetry/{thing}")[-1].payload)
                kind = "tray" if thing.startswith("tray") else thing
                models[f"sim.telemetry.{kind}"].model_validate(payload)
            tray0 = json.loads(sub.on(f"{base}/telemetry/tray00")[-1].payload)
            assert tray0["rack"] == rack and len(tray0["gpus"]) == 4
            assert len(tray0["gpus"][0]["ports"]["names"]) == 20  # 18 NVLink + 2 NIC
            for state in ("faces", "node_agents", "scenario"):
                topic = f"{base}/state/{state}"
                m = await sub.wait_for(lambda m: m.topic == topic, 10.0)  # noqa: B023
                models[f"sim.state.{state}"].model_validate(json.loads(m.payload))
            async with MqttSub(mosquitto.port, f"{base}/state/faces", v5=False) as late:
                m = await late.wait_for(lambda m: True, 10.0)
                assert m.retain  # a late subscriber finds where the faces answer
            faces = json.loads(sub.on(f"{base}/state/faces")[-1].payload)
            assert faces["cdu"]["port"] == sim.face.port
            assert faces["power"]["unit_ids"] == list(range(1, 9))

            # the node-agent contract v1: cap tray 4's GPUs at 500 W (TTL 60 s, epoch 5) with
            # a 100 W/s ramp-up
            v1 = {"schema_version": "1.0", "epoch": 5}
            n0 = len(sub.messages)
            await mqtt_pub(mosquitto.port, f"{base}/cmd/racky/set_power_limits",
                           envelope("c1", {**v1, "trays": [4], "gpu_power_cap_w": 500.0,
                                           "ttl_s": 60.0, "ramp_up_w_per_s": 100.0}))
            res = await sub.wait_for(
                lambda m: m.topic.endswith("/cmd/racky/set_power_limits/result"), 10.0, n0)
            reply = CommandReply.model_validate(json.loads(res.payload))
            assert reply.ok and reply.request_id == "c1" and reply.state is not None
            # contract 1.3's reply: the caps set and each GPU's limit read back
            state = SetPowerLimitsReply.model_validate(reply.state)
            assert (state.epoch, state.confirmed) == (5, True)
            (item,) = state.trays
            assert item.tray == 4 and item.gpu_power_cap_w == 500.0
            assert [g.enforced_w for g in item.gpus] == [500.0] * len(item.gpus)
            n1 = len(sub.messages)
            msg = await sub.wait_for(lambda m: m.topic == f"{base}/telemetry/tray04", 10.0, n1)
            t4 = json.loads(msg.payload)
            assert t4["agent"]["enforced_gpu_cap_w"] == 500.0 and t4["agent"]["epoch"] == 5
            assert 0.0 < t4["agent"]["cap_expires_in_s"] <= 60.0
            assert all(g["power_w"] <= 500.0 + 1e-6 for g in t4["gpus"])
            na = await sub.wait_for(lambda m: m.topic == f"{base}/state/node_agents"
                                    and json.loads(m.payload)["trays"][4]["gpu_power_cap_w"]
                                    == 500.0, 10.0, n0)
            t4s = json.loads(na.payload)["trays"][4]
            assert t4s["ramp_up_w_per_s"] == 100.0 and t4s["power_floor_pct"] == 0.0

            # refusals change nothing: below the minimum power limit; a tray that is not there;
            # an older epoch; null for "no cap"
            for rid, args, code in (("c2", {**v1, "trays": [1], "gpu_power_cap_w": 50.0,
                                            "ttl_s": 60.0}, "out_of_range"),
                                    ("c3", {**v1, "trays": [30], "powered": False},
                                     "unknown_tray"),
                                    ("c4", {**v1, "trays": [4], "epoch": 4,
                                            "release": ["gpu_power_cap_w"]}, "stale_epoch"),
                                    ("c5", {**v1, "trays": [1], "power_cap_w": None},
                                     "wrong_type")):
                n = len(sub.messages)
                await mqtt_pub(mosquitto.port, f"{base}/cmd/racky/set_power_limits",
                               envelope(rid, args))
                res = await sub.wait_for(lambda m: m.topic.endswith("set_power_limits/result"),
                                         10.0, n)
                reply = CommandReply.model_validate(json.loads(res.payload))
                assert not reply.ok and reply.error is not None and reply.error.code == code
            assert sim.rack is not None
            assert sim.rack.agents.settings(1).gpu_power_cap_w is None
            assert sim.rack.agents.settings(4).gpu_power_cap_w == 500.0
        finally:
            stop.set()
            await asyncio.wait_for(task, 20.0)
