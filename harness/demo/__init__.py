"""``rackctl demo``: the main job on embedded defaults, with nothing to install.

Starts, on loopback and free ports:
1. an MQTT broker: amqtt in this process (MQTT 3.1.1; its logging goes to ``broker.log`` in
   the run folder, never the console), or the Mosquitto given with --broker;
2. the rack simulator (``python -m harness.simagent``, real time: the CDU and 8 power
   shelves on Modbus TCP, plant truth on MQTT, and the 18 trays through the real tray agent,
   ``trayagent``, its NVML, BMC and link sources simulated: GPU power and caps, the trays'
   BMC figures and every GPU's link ports of the virtual rack's fabric) for rack ``r12`` at
   site ``lab``; racky reads the trays from the agent (``node_agents.daemon = "trays"``);
3. racky (the real daemon, as a subprocess) reading the power shelves, publishing the rack's
   power, lifecycle and budget;
4. valvey (the real daemon) on the CDU, its feedforward from racky's rack power, its spool in
   the run folder as the embedded store (no database needed);
both daemons give the broker user ``operator`` the operator role, and the demo prints the
broker's address and ready ``rackctl`` lines (a ``rackctl.toml`` in the run folder). It then
shows a live view (with the alarms and actions as they happen: alarms raised and cleared,
valvey's duty pump changing, racky's lifecycle changing), and at the end prints a summary
computed from what was recorded (max |error| after each load step over a window no scripted
fault touches, settling time, the feedforward source, racky's lifecycle, rack power against
its budget, alarms, points spooled) with a checklist of what the run showed, each item
checked from its data (`harness.demo.checklist`: the load steps, the scripted pump trip and
link flap with their alarms and actions, no unexpected alarms), and writes a PNG plot, the
trace (CSV) and the summary (JSON, Markdown) into the run folder.

``--racks N`` (N = 2..4) runs a row: N racks side by side on the one broker (README's rack
``r12`` and ``r13``, ``r14``, ``r15``), each its own simulator, valvey and racky (per-rack
identity, ports, folder ``<run>/<rack>/``) and its share of the scripted faults
(`harness.demo.racks`); every second rack (r13, r15) runs S2's agentic bursts with demo timing
(config/scenarios/demo-agentic-bursts.toml) instead of the load step, scored by its own item
(`harness.demo.bursts`: RMS and max |error| over a window its faults do not touch); a live
line per rack (with its load pattern) and the row's power against its limit, each rack's
summary, checklist and plot, and the row's item and plot (`harness.demo.row`).

A row runs **under rlc** when a ``nats-server`` binary is there (`harness.demo.fleet`:
``--nats-server PATH``, ``$RACKPLANE_DEMO_NATS_SERVER``, else PATH or /usr/sbin; ``make demo``
installs the Debian package as ``make test`` does, when it can): a single-node NATS JetStream
on a free loopback port (config, store and log in ``<run>/nats/``), rlc (the real daemon)
granting the row limit as budget leases to the racks' rackys in fleet mode, and a short
validation campaign: the last rack starts as a new rack (``provisioning``) and, once rlc grants
every rack a lease, the demo starts the campaign as an operator would (``rackctl campaign
start``); rlc validates it (one short ``rack`` stage) and orders it into production. The live
view and the off-terminal lines say rlc's leases per rack against the row limit and the
campaign's progress; the row's checklist adds "new rack validated into production by rlc's
campaign" (its lifecycle as racky published it, with times, and rlc's ``state/campaign``)
and "row budgets granted by rlc never above the row limit" (every lease rlc wrote, as read
from the KV bucket; `harness.demo.fleet_check`); ``row.png`` shows the Σ of the leases.
Without nats-server (or ``--nats-server none``) the row runs **without rlc**: the row limit
split evenly into static racky budgets, and the summary says why and how to get rlc
(``sudo apt-get install nats-server`` or ``make servers``).
"""

from __future__ import annotations

from harness.demo.bursts import burst_figures
from harness.demo.checklist import CheckItem, checklist
from harness.demo.procs import (
    BROKER_PROBE_S,
    DEMO_RACK,
    DEMO_SITE,
    OPERATOR,
    BrokerUnreachable,
    embedded_broker_problem,
    probe_broker,
)
from harness.demo.racks import MAX_RACKS, split_faults
from harness.demo.record import (
    EXPECTED_DEMO_ALARMS,
    FF_SOURCE_NAMES,
    Recorder,
    alarm_note,
    control_mode_from_states,
)
from harness.demo.row import RowSummary, print_row_summary, row_power, row_power_item
from harness.demo.run import DEFAULT_SCENARIO, SPARK, run_demo
from harness.demo.summary import (
    BAND_K,
    DemoSummary,
    RackySummary,
    count_spooled,
    print_summary,
    summarise,
    summary_markdown,
    write_plot,
)

__all__ = [
    "BAND_K",
    "BROKER_PROBE_S",
    "DEFAULT_SCENARIO",
    "DEMO_RACK",
    "DEMO_SITE",
    "EXPECTED_DEMO_ALARMS",
    "FF_SOURCE_NAMES",
    "MAX_RACKS",
    "OPERATOR",
    "SPARK",
    "BrokerUnreachable",
    "CheckItem",
    "DemoSummary",
    "RackySummary",
    "Recorder",
    "RowSummary",
    "alarm_note",
    "burst_figures",
    "checklist",
    "control_mode_from_states",
    "count_spooled",
    "embedded_broker_problem",
    "print_row_summary",
    "print_summary",
    "probe_broker",
    "row_power",
    "row_power_item",
    "run_demo",
    "split_faults",
    "summarise",
    "summary_markdown",
    "write_plot",
]
