"""The lock-step harness's shelf path is the daemon's: the simulator's shelf readings served
by a real `sims.modbus_face.ModbusFace` over TCP and polled by racky's Modbus adapter
(`rackplane.io.modbus.ModbusDevice`) give the same samples (value, quality, reason) as the
harness's register image read in the adapter's plan with the adapter's decoder
(`harness.lockstep_racky._ShelfFace`), sentinels included (a dropped reading of an integer
point, a scenario's sentinel point)."""

from __future__ import annotations

import math
from pathlib import Path

from harness.lockstep_racky import _ShelfFace
from rackplane.clock import SystemClock
from rackplane.core.registers import load_register_map
from rackplane.io.modbus import ModbusDevice
from rackplane.settings import ModbusTargetSettings
from sims.modbus_face import ModbusFace
from sims.runtime import serve_values
from sims.scenario import FabricSpec, ScenarioRun, load_scenario


async def test_harness_shelf_samples_equal_the_modbus_adapters() -> None:
    sc = load_scenario("psu-failure").model_copy(update={"fabric": FabricSpec(enabled="off")})
    run = ScenarioRun(sc, model="rack")
    run.step(1.0)
    assert run.rack is not None
    values = dict(run.rack.shelves.shelf_readings(0))
    names = sorted(values)
    values[names[0]] = math.nan  # a dropped reading: its sentinel (ac_voltage_v)
    sentinels = frozenset(names[1:2])
    regmap = load_register_map("power-shelf")
    face = ModbusFace(regmap, unit_ids=(1,), port=0)
    serve_values(face, regmap, values, sentinels, unit=1)
    await face.start()
    try:
        target = ModbusTargetSettings(name="shelf0", port=face.port, unit_id=1,
                                      register_map=Path("power-shelf"), timeout_s=2.0)
        dev = ModbusDevice(target, regmap, clock=SystemClock(), on_samples=lambda s: None)
        daemon = await dev.read_once()
    finally:
        await face.stop()
    harness = _ShelfFace(target, regmap).poll(values, sentinels, 0, 0.0)
    assert [s.point for s in harness] == [s.point for s in daemon]
    for h, d in zip(harness, daemon, strict=True):
        assert (h.point, h.quality, h.reason) == (d.point, d.quality, d.reason)
        assert h.value == d.value or (h.value is not None and d.value is not None
                                      and math.isnan(h.value) and math.isnan(d.value)), h
