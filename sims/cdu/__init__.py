"""Pure CDU + rack thermal plant: REFERENCE §4.1–4.3, items 1–7, 9 (inventory only) and 10.

One GB200 NVL72 rack with its share of a CDU (REFERENCE §4.3 defaults)::

    facility water (T_fws, Qp) ─► valve x ─► plate HX ─► CDU node ─► supply pipe ─► rack node ─┐
                                               ▲                      (8 tanks)   + 18 hottest  │
                                               └── return pipe (8 tanks) ◄── pumps A/B ◄─ GPUs ─┘

Usage::

    plant = CduPlant(CduParams(), seed=0)
    plant.warm_start(rack_power_w=39_600.0)          # steady state at 45 °C supply
    plant.write("valve_command_pct", 72.0)            # register writes (the Modbus face's job)
    plant.write("heartbeat", 1)
    plant.step(rack_power_w=load.power_w(plant.time_s), facility_supply_temp_c=40.0)  # dt 0.1 s
    plant.readings()   # {"supply_temp_c": 45.01, ...} keyed by config/registers/cdu-generic.toml
    plant.truth()      # CduTruth: the unsensed state

Units inside: kW, kJ/K, L, L/s, °C (as REFERENCE §4.2); inputs and outputs carry their unit in
their name (``rack_power_w``, ``flow_lpm``, ...). Explicit Euler (§4.2), every derivative from
the state before the step, so the discrete energy balance closes exactly. The pipe-tank and
flow coefficients are clipped to one step; the node coefficients stay below 0.15 at the
largest allowed ``dt`` (1 s) with REFERENCE volumes, far from the Euler limit.

Heartbeat: when ``heartbeat`` has not changed for ``heartbeat_timeout_s`` (10 s) the CDU runs
its own PI on the valve (median of supply sensors A/B/C, to ``supply_temp_setpoint_c``, 1 Hz,
REFERENCE §2.2 SIMC gains) and returns to remote control when the heartbeat changes again.

Deliberate choices where REFERENCE leaves room (each also in the docstring it concerns):

* GPU power is the rack power's GPU share: ``P_gpu = P_IT · gpu_max_power_w / rack_max_power_w``
  (72 × 1.2 kW of 132 kW). This reproduces §4.4's Tj column. ``tray_hotspot_factors`` scale
  the hottest GPU of a tray against that average (default 1 for all 18 trays).
* When a tray's hottest GPU throttles (or shuts down) all its GPUs are taken to throttle with
  it; the rack heat falls by that tray's GPU share. Recovery (not given in REFERENCE) is
  +10 %/s once Tj is 1 K below the slowdown threshold [U].
* The local-coolant formula of §4.2 item 7 is capped at the plate temperature (§5.1 note), so
  it is finite at zero flow.
* The GPU plates are a side model: their heat capacity is part of ``C_metal`` of the rack node,
  so the energy balance (`stored_energy_kj`) counts the rack node, CDU node and pipes only.
* Pumps: the running pump with the highest speed sets the flow (§4.2 item 2,
  ``Q* = Q_max·max(n_A, n_B)``); changing the duty pump ramps the new one up at the VFD rate;
  a healthy old duty pump keeps running until the new one is at speed (the CDU's changeover
  sequence [U]), a tripped one coasts. The changeover *delay* (0.25 s, §4.3) is the
  controller's, not the plant's. Each pump reports running, fault (trip), speed and run
  hours (accumulated while turning).
* Second facility valve (``second_valve``, default on): in parallel with the first, same
  characteristic and stroke; the facility flows add, capped at ``facility_max_flow_lps`` [U].
* Rack liquid isolation valves (``rack_isolation_command``): the secondary flow scales with
  their opening (linear, ``rack_isolation_stroke_s`` full stroke [U]); closed, no coolant
  reaches the rack and the leaks (downstream of them) stop draining the loop. There is no
  bypass: the pumps deadhead (a real CDU would open its bypass).
* Reservoir level falls with the inventory lost; filter ΔP ∝ Q² × fouling [U].
* The valve is equal-percentage above its seat: ``Qp = Qp_max·R^(x−1)`` for x > 0, and 0 at
  x = 0 exactly ("x = 0 means closed", §4.2 item 1), so it cannot throttle below Qp_max/R.
* The rack (rack node + GPU trays) is its own class, `RackThermal`, fed an inlet temperature,
  flow and power: a row of racks on one CDU (a later issue) adds racks and headers around it.
* ``heat_removed_kw`` reads the HX duty q_hx through a BTU-meter-like lag and noise.

Modules (one job each): `points` (register points), `params` (`CduParams`, `RackParams`),
`outputs` (`CduTruth`, `PumpState`, `WarmStartResult`), `hx` (plate HX), `rack_thermal`
(`RackThermal`); `CduPlant` is `plant` (construction, steady state, `step`) on top of its parts
`registers` (write, readings, truth), `faults` (fault hooks), `control` (local PI), `loop`
(valve flow, level, filter ΔP, static pressure, stored energy) and `state` (its typed, slotted
fields).
"""

from sims.cdu.hx import hx_conductance_kw_per_k
from sims.cdu.outputs import CduTruth, PumpState, WarmStartResult
from sims.cdu.params import CduParams, RackParams
from sims.cdu.plant import CduPlant
from sims.cdu.points import READING_POINTS, WRITABLE_POINTS
from sims.cdu.rack_thermal import RackThermal

__all__ = [
    "READING_POINTS",
    "WRITABLE_POINTS",
    "CduParams",
    "CduPlant",
    "CduTruth",
    "PumpState",
    "RackParams",
    "RackThermal",
    "WarmStartResult",
    "hx_conductance_kw_per_k",
]
