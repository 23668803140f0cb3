"""Invalid samples are counted monotonically in self-metrics (issue 14 item 9).

NaN/Inf and out-of-range registers are never written as values (their ``_quality`` is); the
device's ``invalid_points`` says how many are invalid *now*, and ``invalid_samples`` counts
every invalid sample since start, so a point that flips bad and good between two self-metric
refreshes still shows. Real Modbus TCP (the simulator's face).
"""

from __future__ import annotations

from pathlib import Path

from rackplane.clock import FakeClock
from rackplane.io.modbus import ModbusDevice
from rackplane.io.selfmetrics import SelfMetrics, counter_fields
from rackplane.io.service import TickStats
from rackplane.io.spool import Spool
from rackplane.io.tsdb import TelemetryWriter
from rackplane.settings import MetricsSettings, SpoolSettings, TsdbSettings
from sims.modbus_face import ModbusFace
from tests.adapters.test_modbus import CLOCK, Polls, regmap, running, serving, target

POINTS = (
    {"name": "supply_temp_c", "table": "holding", "address": 100, "type": "float32",
     "order": "CDAB", "valid_min": -50.0, "valid_max": 150.0},
    {"name": "return_temp_c", "table": "holding", "address": 102, "type": "float32",
     "order": "CDAB", "valid_min": -50.0, "valid_max": 150.0},
    {"name": "flow_lpm", "table": "holding", "address": 104, "type": "float32",
     "order": "CDAB", "valid_min": 0.0, "valid_max": 300.0},
)
NAN, INF, F25, F500 = [0x0000, 0x7FC0], [0x0000, 0x7F80], [0x0000, 0x41C8], [0x0000, 0x43FA]


async def test_invalid_samples_are_counted_monotonically_and_reach_self_metrics(
    tmp_path: Path,
) -> None:
    face = ModbusFace(regmap(*POINTS))
    face.set_registers("holding", 100, NAN + INF + F500)  # NaN, Inf, 500 lpm > valid_max
    polls = Polls()
    async with serving(face):
        dev = ModbusDevice(target(face.port), regmap(*POINTS), clock=CLOCK, on_samples=polls)
        async with running(dev):
            await polls.more(3)
            bad_polls = len(polls.polls)
            assert dev.stats.invalid_points == 3
            assert dev.stats.invalid_samples >= 3 * 3
            face.set_registers("holding", 100, F25 + F25 + F25)  # all good again
            await polls.until(lambda: all(s.usable for s in polls.polls[-1]))
            counted = dev.stats.invalid_samples
            await polls.more(2)
    assert dev.stats.invalid_points == 0  # the gauge: none invalid now
    bad = sum(1 for poll in polls.polls for s in poll if not s.usable)
    assert counted == dev.stats.invalid_samples == bad >= 3 * bad_polls  # the counter stays
    # Self-metrics: a counter field, summed over the devices, never the gauge.
    assert "modbus_invalid_samples" in counter_fields()
    clock = FakeClock()
    w = TelemetryWriter(TsdbSettings(), SpoolSettings(directory=tmp_path / "spool"),
                        identity_tags={"site": "lab", "rack": "r1"}, clock=clock)
    sm = SelfMetrics("valvey", MetricsSettings(), clock=clock)
    sm.tick(clock.monotonic(), tick_stats=TickStats(), writer=w, devices=[dev, dev])
    assert sm.status()["modbus_invalid_samples"] == 2 * counted
    # The invalid values themselves are never written; their quality is.
    w.write_samples("cdu", {}, polls.polls[0])
    w.flush_to_spool()
    with Spool(tmp_path / "spool", readonly=True, cursor_file="t") as sp:
        lines, _ = sp.read(10)
    cdu = [ln for ln in lines if ln.startswith("cdu,")]
    assert cdu and all("supply_temp_c=" not in ln and "flow_lpm=" not in ln for ln in cdu)
    assert all("supply_temp_c_quality=" in ln for ln in cdu)
    assert f"modbus_invalid_samples={2 * counted}" in next(
        ln for ln in lines if ln.startswith("daemon,"))
