"""Run the virtual rack exactly as ``rack-sim run`` does (`sims.runtime.VirtualRackSimulator`
under `rackplane.io.service.run_daemon`, its own node agents publishing every tray's
telemetry with link ports), counting what the benchmark needs and the simulator does not
publish; written as JSON when it stops (SIGTERM).

Usage: ``python -m harness.benchkids.sim_child SCENARIO SITE RACK MQTT_PORT MODBUS_PORT
SHELF_PORT STATS_JSON``

Counted: ``tray_messages`` (``telemetry/trayNN`` messages handed to the MQTT link: what
racky should parse), ``t_s`` (plant seconds run), the plant tick's lateness (``tick_late_max_s``,
``tick_overruns``: 10 Hz ticks skipped because the process fell behind) and the link's
counters (``telemetry_dropped``: telemetry its bounded queue dropped).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from rackplane.io.service import run_daemon
from rackplane.log import configure_logging
from rackplane.settings import Identity, MqttSettings
from sims.runtime import VirtualRackSimulator
from sims.scenario import load_scenario


def main(argv: list[str]) -> int:
    scenario, site, rack = argv[0], argv[1], argv[2]
    mqtt_port, modbus_port, shelf_port = int(argv[3]), int(argv[4]), int(argv[5])
    out = Path(argv[6])
    configure_logging("warning", "json")
    sim = VirtualRackSimulator(
        load_scenario(scenario), modbus_port=modbus_port, shelf_modbus_port=shelf_port,
        mqtt=MqttSettings(host="127.0.0.1", port=mqtt_port, protocol="5", clean_session=True),
        identity=Identity(site=site, rack=rack))
    link = sim.mqtt
    assert link is not None
    counts = {"tray_messages": 0}
    publish = link.publish_telemetry

    def counted(thing: str, payload: Any, *args: Any, **kwargs: Any) -> Any:
        if thing.startswith("tray"):
            counts["tray_messages"] += 1
        return publish(thing, payload, *args, **kwargs)

    setattr(link, "publish_telemetry", counted)  # noqa: B010 - wraps the bound method
    rc = asyncio.run(run_daemon(sim, "rack-sim"))
    st = link.stats
    ts = sim.tick_stats
    out.write_text(json.dumps({
        **counts, "t_s": sim.run_.t_s, "ticks": ts.ticks, "tick_overruns": ts.overruns,
        "tick_late_max_s": ts.late_max_s, "tick_cpu_s": sim.tick_cpu_s,
        "messages_out": st.messages_out, "telemetry_dropped": st.telemetry_dropped}))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
