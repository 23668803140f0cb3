"""Run the virtual rack with its trays through the real tray agent, as the demo does
(`harness.simagent`: `sims.runtime.VirtualRackSimulator` with its own node agents off and one
`trayagent.app.TrayAgent` hosting its 18 trays and their link ports through the simulated
sources, in this one process), counting what the benchmark needs; written as JSON when it
stops (SIGTERM).

Usage: ``python -m harness.benchkids.sim_child SCENARIO SITE RACK MQTT_PORT MODBUS_PORT
SHELF_PORT STATS_JSON [PHASE]``

``PHASE``: the fraction of the agent's 1 s read period (on the host's monotonic clock) at which
this rack's agent reads and publishes (`harness.simagent.run_rack_agent`); the benchmark gives
rack k of n the phase k/n, as unsynchronised tray hosts spread over the second; absent: at
the process's own start.

Counted: ``tray_messages`` (the agent's ``telemetry/trayNN`` messages handed to its MQTT
link: what racky should parse), ``t_s`` (plant seconds run), the plant tick's lateness
(``tick_late_max_s``, ``tick_overruns``: 10 Hz ticks that never ran because the process fell
behind; ``steps_caught_up``: plant steps late ticks ran for them; ``steps_dropped``: a backlog
past `sims.runtime.MAX_BACKLOG_S`, never run), the link counters of the simulator and the
agent together (``messages_out``, ``telemetry_dropped``: telemetry their bounded queues
dropped) and the agent's read-cycle CPU (``agent_read_cpu_s``).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

from harness.simagent import build_rack_agent, run_rack_agent
from rackplane.log import configure_logging
from rackplane.settings import Identity, MqttSettings


def main(argv: list[str]) -> int:
    scenario, site, rack = argv[0], argv[1], argv[2]
    mqtt_port, modbus_port, shelf_port = int(argv[3]), int(argv[4]), int(argv[5])
    out = Path(argv[6])
    phase = float(argv[7]) if len(argv) > 7 else None
    configure_logging("warning", "json")
    ra = build_rack_agent(
        scenario, Identity(site=site, rack=rack),
        MqttSettings(host="127.0.0.1", port=mqtt_port, protocol="5", clean_session=True),
        epoch_file=out.with_name(out.stem + "-epochs.json"), modbus_port=modbus_port,
        shelf_modbus_port=shelf_port, spool_dir=out.with_name("tray-agent-spool"))

    async def go() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_rack_agent(ra, stop, phase=phase)

    asyncio.run(go())
    sim, agent = ra.sim, ra.agent
    assert sim.mqtt is not None
    links = (sim.mqtt.stats, agent.mqtt.stats)
    ts = sim.tick_stats
    out.write_text(json.dumps({
        "tray_messages": agent.published_total, "t_s": sim.run_.t_s, "ticks": ts.ticks,
        "tick_overruns": ts.overruns, "tick_late_max_s": ts.late_max_s,
        "steps_caught_up": sim.steps_caught_up, "steps_dropped": sim.steps_dropped,
        "tick_cpu_s": sim.tick_cpu_s, "agent_read_cpu_s": agent.read_cpu_s,
        "messages_out": sum(s.messages_out for s in links),
        "telemetry_dropped": sum(s.telemetry_dropped for s in links)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
