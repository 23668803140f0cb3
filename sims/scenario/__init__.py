"""Scenarios: TOML timelines of load, facility water and faults (DESIGN §4; REFERENCE §5).

A scenario file (bundled ones live in ``config/scenarios/<name>.toml``)::

    name = "load-step"
    description = "S1: 30 % -> 100 % rack load step at steady state, then back"
    reference = "REFERENCE §5 S1"
    duration_s = 330.0
    seed = 1

    [plant]
    rack_max_power_w = 132000.0     # CduParams.for_rack_power
    supply_setpoint_c = 45.0        # the warm start holds this
    facility_supply_temp_c = 40.0   # start value; [facility] below may move it
    model = "auto"                  # cdu | rack | auto (see "Models" below)
    variant = "nominal"             # plant-family member (sims.cdu.variants: stroke_120s, ...)

    [load]
    kind = "timeline"               # constant | step | timeline | agentic | training | idle |
    points = [[0.0, 39600.0], [60.0, 132000.0], [210.0, 39600.0]]   # burn_in
    mode = "hold"

    [facility]                      # optional facility water temperature timeline (°C)
    points = [[0.0, 40.0], [600.0, 44.0]]
    mode = "ramp"

    [power]                         # optional: power shelves (sims.power defaults)
    shelves = 8
    [environment]                   # optional: room air (sims.environment defaults)
    relative_humidity_pct = 45.0
    [fabric]                        # optional: link fabric "auto" | "on" | "off", step_s
    enabled = "auto"
    [agents]                        # optional: node-agent settings of every tray at start
    power_floor_pct = 0.0

    [[faults]]                      # applied at at_s, healed at until_s (if given)
    at_s = 120.0
    until_s = 180.0
    kind = "sensor"
    point = "supply_temp_c"
    mode = "freeze"

Models. ``cdu``: the §4 model alone (`sims.cdu.CduPlant`, the rack as a power profile; fast,
valvey's lock-step). ``rack``: the whole virtual rack (`sims.row.VirtualRack`: per-GPU
workload, node agents, power shelves, room air, link fabric). ``auto`` (default) picks
``rack`` when a fault, the load kind or an ``[agents]`` table needs it, else ``cdu``; the real
time simulator always runs ``rack`` (`sims.runtime`).

Fault kinds (`FaultSpec`; fields other than ``at_s``/``until_s``/``kind`` as listed; "rack"
marks kinds that need the rack model, "fabric" those that also need `sims.fabric`):

==================== ==================================================================== =====
kind                 fields (meaning)                                                       needs
==================== ==================================================================== =====
pump_trip            pump (0 = A)
valve_stuck          -
valve_offset         value (feedback offset, %)
valve_slow           value (stroke-time factor)
sensor               point, mode (freeze | stale | drop | dropout | nan | sentinel | spike |
                     drift | offset), magnitude, rate_per_s, duration_s (spike)
leak                 value (L/min from the loop, no sensor location)
controller_restart   -
facility_water_rise  magnitude (K), ramp_s (up at at_s, back down at until_s)
fouled_cold_plate    tray, value (plate conductance factor, e.g. 0.35)
tray_leak            tray, value (L/min: 0.2 weep, 20 QD failure, REF §5 S6)           rack
cdu_leak             value (L/min onto the CDU rope sensor)                              rack
leak_sensor_fault    sensor (tray | rope | drip_pan), tray                               rack
psu_failure          shelf, psu                                                          rack
psu_derate           shelf, psu, value (factor of rating)                                rack
shelf_loss           shelf                                                               rack
feed_loss            feed (0 = A)                                                        rack
humidity_rise        magnitude (%RH), ramp_s                                             rack
room_temp_rise       magnitude (K), ramp_s                                               rack
link_flap            port (name ``gpu07/nvl03`` or index), down_s, up_s, count           fabric
link_down            port, down_s (held down once)                                       fabric
link_error_rate      port, counter, rate_per_s (constant; healed at until_s)             fabric
link_error_ramp      port, counter, start_per_s, end_per_s, ramp_s                       fabric
link_ber             port, value (pre-FEC BER, e.g. 1e-11)                               fabric
gpu_reboot           gpu (counters reset)                                                fabric
modbus_exception     device (cdu | power), code, unit, table, address, registers
modbus_half_open     device (requests read and never answered, BR-07)
modbus_slow          device, value (reply delay, s)
modbus_gap           device, table, address, registers (answered exception 2, BR-05)
modbus_max_registers device, value (largest read accepted; exception 3 above, BR-05)
mqtt_stop            publisher (plant | rack | trays | power | env | all)
==================== ==================================================================== =====

Sensor modes: ``stale`` is ``freeze``; ``dropout`` and ``nan`` are ``drop`` (the reading is
NaN: a float register serves NaN, an integer one its sentinel); ``sentinel`` also drops the
reading and makes the Modbus face serve the point's sentinel raw value. Protocol faults
(``modbus_*``, ``mqtt_stop``) do not touch the plant: they are recorded in
`ScenarioRun.protocol` for the real-time faces (`sims.runtime`) to apply.

Everything here is pure: `ScenarioRun` applies the timeline to the plant as plant time
advances and records every fault's start and end (the ground truth detection is scored on);
self-ending faults (a flap, a held-down link, a reboot, a spike) get their end from their
own timing.
"""

from __future__ import annotations

from sims.scenario.loading import list_scenarios, load_scenario, scenario_dir
from sims.scenario.models import (
    CDU_SENSOR_MODES,
    FABRIC_KINDS,
    PROTOCOL_KINDS,
    RACK_KINDS,
    AgentSpec,
    EnvironmentSpec,
    FabricSpec,
    FacilitySpec,
    FaultKind,
    FaultSpec,
    LoadSpec,
    PlantSpec,
    PowerSpec,
    Scenario,
)
from sims.scenario.run import FaultRecord, ModbusFaultState, ProtocolFaults, ScenarioRun

__all__ = [
    "CDU_SENSOR_MODES",
    "FABRIC_KINDS",
    "PROTOCOL_KINDS",
    "RACK_KINDS",
    "AgentSpec",
    "EnvironmentSpec",
    "FabricSpec",
    "FacilitySpec",
    "FaultKind",
    "FaultRecord",
    "FaultSpec",
    "LoadSpec",
    "ModbusFaultState",
    "PlantSpec",
    "PowerSpec",
    "ProtocolFaults",
    "Scenario",
    "ScenarioRun",
    "list_scenarios",
    "load_scenario",
    "scenario_dir",
]

