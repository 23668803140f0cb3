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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import numpy as np
from pydantic import Field, model_validator

from rackplane.config import StrictModel
from rackplane.errors import WriteRejected
from sims.sensors import Sensor, SensorFault, SensorParams

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

ATM_KPA = 101.325

#: Points `CduPlant.readings` returns: exactly the register map's points
#: (config/registers/cdu-generic.toml).
READING_POINTS: tuple[str, ...] = (
    "supply_temp_c",
    "return_temp_c",
    "flow_lpm",
    "diff_pressure_kpa",
    "valve_position_pct",
    "facility_supply_temp_c",
    "heat_removed_kw",
    "pump_speed_pct",
    "supply_temp_b_c",
    "supply_temp_c_c",
    "uptime_s",
    "loop_pressure_kpa",
    "valve_command_pct",
    "pump_speed_command_pct",
    "heartbeat",
    "supply_temp_setpoint_c",
    "local_control",
    "pump_a_running",
    "pump_a_fault",
    "pump_a_speed_pct",
    "pump_a_run_hours_h",
    "pump_b_running",
    "pump_b_fault",
    "pump_b_speed_pct",
    "pump_b_run_hours_h",
    "reservoir_level_pct",
    "filter_diff_pressure_kpa",
    "valve_b_position_pct",
    "rack_isolation_open",
    "rack_isolation_closed",
    "leak_rope_detected",
    "leak_rope_sensor_fault",
    "duty_pump_select",
    "valve_b_command_pct",
    "rack_isolation_command",
)

#: Pumps the register map names (index i -> ``pump_<letter>_*`` points); a plant with fewer
#: pumps reads 0 for the missing ones.
PUMP_LETTERS: tuple[str, ...] = ("a", "b")
_PUMP_KEYS = tuple((f"pump_{c}_running", f"pump_{c}_fault", f"pump_{c}_speed_pct",
                    f"pump_{c}_run_hours_h") for c in PUMP_LETTERS)  # `CduPlant.readings`

#: Writable points and their (write_min, write_max), as in config/registers/cdu-generic.toml.
WRITABLE_POINTS: dict[str, tuple[float, float]] = {
    "valve_command_pct": (0.0, 100.0),
    "pump_speed_command_pct": (15.0, 100.0),
    "heartbeat": (0.0, 65535.0),
    "supply_temp_setpoint_c": (20.0, 60.0),
    "duty_pump_select": (0.0, 1.0),
    "valve_b_command_pct": (0.0, 100.0),
    "rack_isolation_command": (0.0, 1.0),
}


# --- parameters -------------------------------------------------------------------------------


def _f(default: Any, desc: str, **kw: Any) -> Any:
    return Field(default, description=desc, **kw)


class RackParams(StrictModel):
    """One rack on the CDU: rack node and GPU sub-model (REFERENCE §4.2 items 6–7, §4.3)."""

    rack_max_power_w: float = _f(
        132_000.0,
        "100 % rack IT power, W: NVL72 132 kW design point (REF §1.1, §4.3 [S2]); "
        "Vera Rubin 130–230 kW (REF §1.1 [S2/U])",
        gt=0.0,
        le=600_000.0,
    )
    liquid_fraction: float = _f(
        0.85,
        "share of IT power to liquid, f_liq (REF §1.1, §4.3 [U]; Vera Rubin 1.0)",
        gt=0.0,
        le=1.0,
    )
    n_trays: int = _f(
        18, "compute trays, one hottest GPU modelled per tray (REF §1.1 [S])", ge=1, le=72
    )
    gpus_per_tray: int = _f(4, "GPUs per compute tray: 72 / 18 (REF §1.1 [S])", ge=1, le=72)
    gpu_max_power_w: float = _f(
        1200.0, "B200 in GB200 TDP, W (REF §1.1 [S/S2], §4.3)", gt=0.0, le=5000.0
    )
    fluid_volume_l: float = _f(40.0, "rack fluid hold-up V_rack, L (REF §4.3 [U])", gt=0.0)
    metal_heat_capacity_kj_per_k: float = _f(
        30.0, "cold plates etc. C_metal, kJ/K (REF §4.3 [U])", ge=0.0
    )
    gpu_plate_heat_capacity_j_per_k: float = _f(
        300.0, "C_plate, cold plate + package, J/K (REF §4.3 [D])", gt=0.0
    )
    gpu_plate_conductance_w_per_k: float = _f(
        77.0, "G0, plate-to-coolant conductance at design flow, W/K (REF §4.3 [D])", gt=0.0
    )
    gpu_plate_min_conductance_w_per_k: float = _f(
        2.0, "G_min, conductance at zero flow, W/K (REF §4.3 [U])", ge=0.0
    )
    gpu_conductance_flow_exponent: float = _f(
        0.8, "G(Q) = G0·(Q/Q0)^m + G_min, m (REF §4.2 item 7)", gt=0.0, le=2.0
    )
    gpu_junction_resistance_k_per_w: float = _f(
        0.012, "R_jp junction to plate, K/W (REF §4.3 [U])", ge=0.0
    )
    gpu_chain_beta: float = _f(
        0.5,
        "β, position of the hottest GPU in a serial cold-plate chain (REF §4.2 item 7)",
        ge=0.0,
        le=1.0,
    )
    gpu_max_operating_temp_c: float = _f(87.0, "T_maxop, °C (REF §4.3 [U])")
    gpu_slowdown_offset_k: float = _f(
        3.0,
        "HW slowdown when Tj > T_maxop + this, K (REF §4.3; §1.6: 2 K GB200, 3 K B200 [S])",
        ge=0.0,
    )
    gpu_shutdown_offset_k: float = _f(
        10.0, "GPU shutdown when Tj > T_maxop + this, K (REF §4.3 [U])", gt=0.0
    )
    gpu_throttle_rate_per_s: float = _f(
        0.5,
        "power scale-down while above slowdown, fraction of nominal per s "
        "(REF §4.2 item 7: −50 %/s)",
        gt=0.0,
    )
    gpu_throttle_floor: float = _f(
        0.3, "lowest throttled power fraction (REF §4.2 item 7: 30 %)", ge=0.0, le=1.0
    )
    gpu_throttle_recovery_per_s: float = _f(
        0.1,
        "power scale-up once below slowdown − hysteresis, fraction per s "
        "(this module [U]; REFERENCE gives none)",
        gt=0.0,
    )
    gpu_throttle_hysteresis_k: float = _f(
        1.0, "recovery starts this far below the slowdown threshold, K (this module [U])", ge=0.0
    )
    tray_hotspot_factors: tuple[float, ...] | None = _f(
        None, "per-tray hottest-GPU power relative to the average GPU; None = all 1.0"
    )

    @model_validator(mode="after")
    def _check(self) -> RackParams:
        if self.gpu_shutdown_offset_k <= self.gpu_slowdown_offset_k:
            raise ValueError("gpu_shutdown_offset_k must exceed gpu_slowdown_offset_k")
        if self.n_trays * self.gpus_per_tray * self.gpu_max_power_w > self.rack_max_power_w:
            raise ValueError(
                "GPU power (n_trays × gpus_per_tray × gpu_max_power_w) exceeds rack_max_power_w"
            )
        f = self.tray_hotspot_factors
        if f is not None and (len(f) != self.n_trays or any(not (0.0 <= v <= 3.0) for v in f)):
            raise ValueError("tray_hotspot_factors needs n_trays values in [0, 3]")
        return self


class CduParams(StrictModel):
    """The CDU share for one rack, its loop, sensors and local control (REFERENCE §4.3).

    ``rack`` carries the rack-side figures. `for_rack_power` scales a parameter set to another
    rack power (e.g. Vera Rubin 130–230 kW, REFERENCE §1.1).
    """

    rack: RackParams = Field(default_factory=RackParams, description="the rack on this CDU")
    n_racks: int = _f(
        1,
        "identical racks in parallel on this CDU (a row CDU, sims.row.VirtualRow); the flows, "
        "UA, facility flow and pump power above are the whole CDU's, the secondary flow splits "
        "equally between the racks",
        ge=1,
        le=32,
    )
    coolant_rho_c_kj_per_l_k: float = _f(
        4.03, "secondary ρc, PG25, kJ/(L·K) (REF §1.4, §4.2 [D])", gt=0.0
    )
    facility_rho_c_kj_per_l_k: float = _f(4.18, "facility water ρc, kJ/(L·K) (REF §4.2)", gt=0.0)
    design_flow_lps: float = _f(
        3.3, "Q0 design flow, L/s = 1.5 L/min/kW × 132 kW (REF §1.4, §4.3 [S2])", gt=0.0
    )
    max_flow_lps: float = _f(4.0, "Q_max at 100 % pump speed, L/s (REF §4.3 [D])", gt=0.0)
    cdu_volume_l: float = _f(30.0, "V_cdu (CDU node), L (REF §4.3 [U])", gt=0.0)
    pipe_volume_l: float = _f(20.0, "V_pipe each way, L (REF §4.3, §1.7 [U])", gt=0.0)
    pipe_tanks: int = _f(8, "tanks in series per pipe (REF §4.2 item 5)", ge=1, le=64)
    hx_ua_kw_per_k: float = _f(
        30.0,
        "UA0 of the plate HX, kW/K: 2.5 K approach at 132 kW, valve open, 40 °C (REF §4.3 [D])",
        gt=0.0,
    )
    hx_flow_exponent: float = _f(0.7, "UA flow exponent (REF §4.2 item 3)", gt=0.0, le=1.0)
    hx_primary_ref_fraction: float = _f(
        0.7, "primary reference flow in UA(Q, Qp), fraction of Qp_max (REF §4.2 item 3)", gt=0.0
    )
    facility_max_flow_lps: float = _f(4.0, "Qp_max, valve open, L/s (REF §4.3 [U])", gt=0.0)
    valve_rangeability: float = _f(30.0, "R of the equal-% valve (REF §4.3 [U])", gt=1.0)
    valve_stroke_time_s: float = _f(
        60.0, "full stroke time, s (REF §1.7, §4.3; Belimo 90 s/60 mm [S/U])", gt=0.0
    )
    n_pumps: int = _f(2, "pumps in parallel, duty + standby (REF §4.2 item 2)", ge=1, le=4)
    pump_vfd_ramp_pct_per_s: float = _f(20.0, "VFD ramp, %/s (REF §4.3 [U])", gt=0.0)
    pump_coast_tau_s: float = _f(2.0, "coast-down τ after a trip, s (REF §4.3 [U])", gt=0.0)
    flow_tau_s: float = _f(1.0, "flow first-order τ_Q, s (REF §4.3 [U])", gt=0.0)
    pump_min_speed_pct: float = _f(
        15.0, "minimum running speed, % (Vertiv CDU 600 default, REF §1.5 [S])", ge=0.0, lt=100.0
    )
    pump_power_full_speed_w: float = _f(
        1750.0,
        "P_p0 at 100 % speed, W: 218 kPa × 4 L/s hydraulic at ~50 % wire-to-water "
        "(this module [D/U])",
        ge=0.0,
    )
    diff_pressure_design_kpa: float = _f(
        150.0, "loop DP at design flow, kPa (sets K_sys; REF §1.4 window 0.5–3 bar [S2])", gt=0.0
    )
    supply_temp_setpoint_c: float = _f(
        45.0, "T_ss setpoint, °C (REF §1.4, §4.3 [S])", ge=20.0, le=60.0
    )
    facility_supply_temp_c: float = _f(40.0, "design T_fws, °C (W40 class, REF §1.4 [S])")
    heartbeat_timeout_s: float = _f(
        10.0,
        "heartbeat unchanged this long → local control, s: tolerates several missed 1 s "
        "writes and a Modbus retry cycle, well inside the ≈35 s valve→supply time constant "
        "(REF §1.7); same order as Vertiv's 10 s loop refresh (REF §1.5 [S])",
        gt=0.0,
    )
    local_pi_gain_per_k: float = _f(
        0.079, "local PI Kc, valve fraction per K (SIMC τc = 10 s, REF §2.2 [D])", gt=0.0
    )
    local_pi_integral_time_s: float = _f(35.0, "local PI τI, s (REF §2.2 [D])", gt=0.0)
    local_pi_period_s: float = _f(1.0, "local PI period, s (REF §4.2: PI at 1 Hz)", gt=0.0)
    fill_pressure_kpa: float = _f(
        150.0,
        "static gauge pressure at fill temperature, kPa (REF §1.4 window 2–6 bar [S2], cold)",
        ge=0.0,
    )
    fill_temp_c: float = _f(25.0, "temperature the loop was filled at, °C [U]")
    expansion_tank_gas_volume_l: float = _f(
        10.0, "expansion-tank gas volume at fill, L [U]", gt=0.0
    )
    coolant_expansion_per_k: float = _f(
        5.5e-4, "volumetric expansion of PG25 near 40 °C, 1/K [U]", ge=0.0
    )
    relief_valve_kpa: float = _f(
        600.0, "PRV setting, gauge kPa (REF §1.4 top of 2–6 bar) [U]", gt=0.0
    )
    temp_sensor: SensorParams = Field(
        default_factory=SensorParams, description="temperature transmitters (REF §4.3 [U])"
    )
    flow_sensor: SensorParams = Field(
        default_factory=lambda: SensorParams(tau_s=1.0, noise_sigma=1.0, quantum=0.1),
        description="flow meter, L/min [U]",
    )
    pressure_sensor: SensorParams = Field(
        default_factory=lambda: SensorParams(tau_s=0.5, noise_sigma=0.5, quantum=0.1),
        description="DP and static pressure transmitters, kPa [U]",
    )
    heat_meter: SensorParams = Field(
        default_factory=lambda: SensorParams(tau_s=2.0, noise_sigma=0.5, quantum=0.01),
        description="heat removed, kW: σ ≈ C_s·√2·0.03 K at design flow [D]",
    )
    supply_sensor_bias_k: tuple[float, float, float] = _f(
        (0.0, 0.0, 0.0), "calibration bias of supply sensors A, B, C, K"
    )
    return_sensor_bias_k: float = _f(0.0, "calibration bias of the return sensor, K")
    facility_sensor_bias_k: float = _f(0.0, "calibration bias of the facility supply sensor, K")
    second_valve: bool = _f(
        True,
        "a second facility valve in parallel with the first (redundant; REF §1.5 Coolcentric: "
        "'a second valve takes over'); closed unless commanded",
    )
    pump_initial_run_hours_h: tuple[float, ...] | None = _f(
        None, "run hours of each pump at construction; None: 8000 h + 50 h per pump index [U]"
    )
    reservoir_volume_l: float = _f(
        20.0, "reservoir (make-up tank) volume the level reading spans, L [U]", gt=0.0
    )
    reservoir_initial_level_pct: float = _f(
        80.0, "reservoir level with the loop at its filled inventory, % [U]", ge=0.0, le=100.0
    )
    filter_diff_pressure_design_kpa: float = _f(
        30.0,
        "clean filter ΔP at design flow, kPa [U] (dirty alarm at 60 kPa: Vertiv 0.6 bar, "
        "REF §1.5 [S])",
        ge=0.0,
    )
    rack_isolation_stroke_s: float = _f(
        10.0, "rack liquid isolation valves: full stroke time, s [U]", gt=0.0
    )

    @model_validator(mode="after")
    def _check(self) -> CduParams:
        h = self.pump_initial_run_hours_h
        if h is not None and (len(h) != self.n_pumps or any(not v >= 0.0 for v in h)):
            raise ValueError("pump_initial_run_hours_h needs n_pumps values >= 0")
        if self.design_flow_lps > self.max_flow_lps:
            raise ValueError("design_flow_lps must not exceed max_flow_lps")
        if 100.0 * self.design_flow_lps / self.max_flow_lps < self.pump_min_speed_pct:
            raise ValueError("design flow needs a pump speed below pump_min_speed_pct")
        return self

    @property
    def design_pump_speed_pct(self) -> float:
        """Pump speed giving the design flow, % (82.5 % with the defaults)."""
        return 100.0 * self.design_flow_lps / self.max_flow_lps

    @classmethod
    def for_rack_power(
        cls,
        rack_max_power_w: float,
        *,
        liquid_fraction: float | None = None,
        gpu_max_power_w: float | None = None,
        n_racks: int = 1,
        **overrides: Any,
    ) -> CduParams:
        """Defaults scaled to another rack power (e.g. 130–230 kW Vera Rubin, REF §1.1).

        Flows (1.5 L/min/kW, REF §1.4), UA, facility flow and pump power scale with power
        (times ``n_racks`` for a row CDU serving that many identical racks); volumes, time
        constants and GPU counts stay. ``gpu_max_power_w`` defaults to 1.2 kW scaled with rack
        power. Raises `pydantic.ValidationError` on invalid values.
        """
        base = cls()
        k = rack_max_power_w / base.rack.rack_max_power_w * n_racks
        rack = base.rack.model_copy(
            update={
                "rack_max_power_w": rack_max_power_w,
                "liquid_fraction": liquid_fraction or base.rack.liquid_fraction,
                "gpu_max_power_w": gpu_max_power_w
                or base.rack.gpu_max_power_w * rack_max_power_w / base.rack.rack_max_power_w,
            }
        )
        data = base.model_dump()
        data.update(
            rack=RackParams.model_validate(rack.model_dump()).model_dump(),
            n_racks=n_racks,
            design_flow_lps=base.design_flow_lps * k,
            max_flow_lps=base.max_flow_lps * k,
            hx_ua_kw_per_k=base.hx_ua_kw_per_k * k,
            facility_max_flow_lps=base.facility_max_flow_lps * k,
            pump_power_full_speed_w=base.pump_power_full_speed_w * k,
        )
        data.update(overrides)
        return cls.model_validate(data)


# --- outputs ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PumpState:
    """One pump: ``speed_pct`` (true shaft speed), running (healthy and commanded), tripped."""

    speed_pct: float
    running: bool
    tripped: bool
    duty: bool


@dataclass(frozen=True, slots=True)
class CduTruth:
    """The true (unsensed) plant state at ``time_s`` (plant seconds since construction).

    Temperatures °C, flows L/s and L/min, powers W or kW as named, energies kJ since the last
    warm start. ``t_limit_margin_c`` is REFERENCE §1.6's T.Limit (T_maxop − Tj) of the hottest
    GPU: HW slowdown below −``gpu_slowdown_offset_k``. ``gpu_tj_c`` (one per tray) is the
    junction temperature the throttle logic saw in the last step, with that step's power.
    """

    time_s: float
    supply_temp_c: float
    return_temp_c: float
    rack_inlet_temp_c: float
    rack_outlet_temp_c: float
    facility_supply_temp_c: float
    flow_lps: float
    flow_lpm: float
    facility_flow_lps: float
    valve_position_pct: float
    valve_command_pct: float
    diff_pressure_kpa: float
    loop_pressure_kpa: float
    q_hx_kw: float
    rack_power_w: float
    rack_power_demand_w: float
    air_heat_kw: float
    gpu_tj_c: tuple[float, ...]
    hottest_gpu_tj_c: float
    t_limit_margin_c: float
    hw_slowdown: bool
    gpu_shutdown: bool
    throttled_trays: int
    shutdown_trays: int
    throttle_events: int
    pumps: tuple[PumpState, ...]
    duty_pump: int
    pump_power_w: float
    local_control: bool
    inventory_l: float
    stored_energy_kj: float
    it_liquid_energy_kj: float
    air_energy_kj: float
    hx_energy_kj: float
    pump_energy_kj: float
    valve_b_position_pct: float = 0.0
    valve_b_command_pct: float = 0.0
    rack_isolation_open_pct: float = 100.0
    reservoir_level_pct: float = 0.0
    filter_diff_pressure_kpa: float = 0.0
    pump_run_hours_h: tuple[float, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """Plain dict (for logs and traces)."""
        return asdict(self)


class WarmStartResult(NamedTuple):
    """Result of `CduPlant.warm_start`.

    ``holds_setpoint`` is False when no valve position holds the setpoint at that load (valve
    saturated open, or the load is below what the smallest opening removes); the plant is then
    at the steady state of ``valve_position_pct`` with supply ``supply_temp_c``.
    """

    valve_position_pct: float
    supply_temp_c: float
    holds_setpoint: bool


def hx_conductance_kw_per_k(flow_lps: float, facility_flow_lps: float, p: CduParams) -> float:
    """ε·C_min of the counterflow plate HX, kW/K, so that q_hx = ε·C_min·(T_ret − T_fws).

    REFERENCE §4.2 item 3: UA = UA0·2/((Q0/Q)^0.7 + (0.7·Qp_max/Qp)^0.7), ε-NTU counterflow,
    NTU/(1+NTU) when C_r = 1. Zero for zero flow on either side.
    """
    if flow_lps <= 1e-9 or facility_flow_lps <= 1e-9:
        return 0.0
    e = p.hx_flow_exponent
    ua = (
        2.0
        * p.hx_ua_kw_per_k
        / (
            (p.design_flow_lps / flow_lps) ** e
            + (p.hx_primary_ref_fraction * p.facility_max_flow_lps / facility_flow_lps) ** e
        )
    )
    cs = p.coolant_rho_c_kj_per_l_k * flow_lps
    cp = p.facility_rho_c_kj_per_l_k * facility_flow_lps
    cmin, cmax = (cs, cp) if cs < cp else (cp, cs)
    cr = cmin / cmax
    ntu = ua / cmin
    if cr > 1.0 - 1e-9:
        eps = ntu / (1.0 + ntu)
    else:
        x = math.exp(-ntu * (1.0 - cr))
        eps = (1.0 - x) / (1.0 - cr * x)
    return eps * cmin


# --- the rack ---------------------------------------------------------------------------------


class RackThermal:
    """One rack's thermal model: rack node + GPU cold plates (REFERENCE §4.2 items 6–7).

    Fed by whatever supplies it (the CDU's supply pipe, one branch of a row CDU) with an inlet
    temperature (°C), a flow (L/s) and the rack IT power demand (W); its outlet is the rack
    node temperature ``t_out_c``. Power comes in one of two ways, sharing the rack node (so
    the energy balance is the same):

    * `step` (rack power only, the §4 model and valvey's lock-step): GPU power is the rack
      power's GPU share (``P_IT · gpu_max_power_w / rack_max_power_w``) and one hottest GPU
      per tray is modelled (``tray_hotspot_factors``); when a tray's hottest GPU throttles or
      shuts down, the tray's GPUs follow it and the rack heat falls by their share.
    * `step_gpus` (per-GPU power, ``n_trays × gpus_per_tray`` values, from `sims.rack`): every
      GPU's plate is modelled (numpy, vectorised) and throttles or shuts down on its own; the
      rack heat falls by exactly the power the throttled GPUs do not draw. Hotspot factors do
      not apply (each GPU's power is given).

    ``set_conductance_factor(tray, f)`` scales G(Q) of a tray's cold plates (1 = clean; a
    fouled plate is < 1: the overheating-tray fault).

    Args:
        params: `RackParams`.
        design_flow_lps: Q0 of G(Q) = G0·(Q/Q0)^m + G_min (this rack's design flow, L/s).
        rho_c_kj_per_l_k: coolant ρc, kJ/(L·K).
    """

    __slots__ = (
        "_beta",
        "_c_plate",
        "_c_rack",
        "_events",
        "_f_liq",
        "_g0",
        "_g_exp",
        "_g_fac",
        "_g_min",
        "_g_on",
        "_g_p",
        "_g_s",
        "_g_slowed",
        "_g_tj",
        "_g_tp",
        "_gfac",
        "_gpt",
        "_gpu_mode",
        "_gpu_share",
        "_hot",
        "_loss",
        "_n_gpus",
        "_n_trays",
        "_off",
        "_on",
        "_p",
        "_q0",
        "_rhoc",
        "_rjp",
        "_s",
        "_slowed",
        "_t_recover",
        "_t_shut",
        "_t_slow",
        "_tj",
        "_tp",
        "demand_w",
        "liquid_kw",
        "power_w",
        "t_out_c",
    )

    def __init__(self, params: RackParams, design_flow_lps: float, rho_c_kj_per_l_k: float):
        r = params
        self._p = r
        self._q0 = design_flow_lps
        self._rhoc = rho_c_kj_per_l_k
        self._c_rack = rho_c_kj_per_l_k * r.fluid_volume_l + r.metal_heat_capacity_kj_per_k
        self._f_liq = r.liquid_fraction
        self._n_trays = r.n_trays
        self._gpt = r.gpus_per_tray
        self._n_gpus = r.n_trays * r.gpus_per_tray
        self._gpu_share = r.gpu_max_power_w / r.rack_max_power_w  # one GPU's share of P_IT
        self._beta = r.gpu_chain_beta
        self._hot = list(r.tray_hotspot_factors or [1.0] * r.n_trays)
        self._c_plate = r.gpu_plate_heat_capacity_j_per_k
        self._g0 = r.gpu_plate_conductance_w_per_k
        self._g_min = r.gpu_plate_min_conductance_w_per_k
        self._g_exp = r.gpu_conductance_flow_exponent
        self._rjp = r.gpu_junction_resistance_k_per_w
        self._t_slow = r.gpu_max_operating_temp_c + r.gpu_slowdown_offset_k
        self._t_shut = r.gpu_max_operating_temp_c + r.gpu_shutdown_offset_k
        self._t_recover = self._t_slow - r.gpu_throttle_hysteresis_k
        self._gfac = [1.0] * r.n_trays
        self._g_fac = np.ones(self._n_gpus)
        self._gpu_mode = False
        self._tp: list[float] = []
        self._tj: list[float] = []
        self._s: list[float] = []
        self._on: list[bool] = []
        self._slowed: list[bool] = []
        n = self._n_gpus
        self._g_tp = np.zeros(n)
        self._g_tj = np.zeros(n)
        self._g_p = np.zeros(n)
        self._g_s = np.ones(n)
        self._g_on = np.ones(n, dtype=bool)
        self._g_slowed = np.zeros(n, dtype=bool)
        self._off = 0
        self._loss = 0.0
        self._events = 0
        self.t_out_c = 45.0
        self.power_w = self.demand_w = self.liquid_kw = 0.0
        self.settle(45.0, design_flow_lps, 0.0)

    @property
    def params(self) -> RackParams:
        """The rack parameters."""
        return self._p

    @property
    def heat_capacity_kj_per_k(self) -> float:
        """C_r = ρc·V_rack + C_metal, kJ/K (191 kJ/K with the defaults, REFERENCE §1.7)."""
        return self._c_rack

    @property
    def gpu_mode(self) -> bool:
        """True when the last step or settle had per-GPU power (`step_gpus`)."""
        return self._gpu_mode

    @property
    def n_gpus(self) -> int:
        """GPUs on the rack (n_trays × gpus_per_tray; 72 for an NVL72)."""
        return self._n_gpus

    def stored_energy_kj(self) -> float:
        """Heat in the rack node relative to 0 °C, kJ (plates are part of C_metal)."""
        return self._c_rack * self.t_out_c

    def _conductance_w_per_k(self, flow_lps: float) -> float:
        if flow_lps <= 0.0:
            return self._g_min
        return self._g0 * (flow_lps / self._q0) ** self._g_exp + self._g_min

    # --- fouling ---------------------------------------------------------------------------

    def set_conductance_factor(self, tray: int, factor: float) -> None:
        """Scale G(Q) of tray ``tray``'s cold plates by ``factor`` (1 = clean; e.g. 0.4 for a
        fouled plate, the overheating-tray fault; REFERENCE §3.4 "failed cold plate").

        Raises:
            ValueError: no such tray, or factor outside (0, 2].
        """
        if not (isinstance(tray, int) and 0 <= tray < self._n_trays):
            raise ValueError(f"tray {tray!r} outside 0..{self._n_trays - 1}")
        if not (0.0 < factor <= 2.0 and math.isfinite(factor)):
            raise ValueError(f"conductance factor {factor!r} outside (0, 2]")
        self._gfac[tray] = float(factor)
        self._g_fac[tray * self._gpt : (tray + 1) * self._gpt] = factor

    @property
    def conductance_factors(self) -> tuple[float, ...]:
        """Per-tray cold-plate conductance factors (1 = clean)."""
        return tuple(self._gfac)

    # --- steady state ------------------------------------------------------------------------

    def settle(
        self,
        t_in_c: float,
        flow_lps: float,
        power_w: float,
        gpu_power_w: np.ndarray | None = None,
    ) -> float:
        """Steady state at this inlet, flow (> 0 L/s) and power, GPUs on and unthrottled;
        returns the outlet temperature (°C). With ``gpu_power_w`` (shape ``(n_gpus,)``, W) the
        per-GPU plates settle on those powers (GPU mode); else on the GPU share of
        ``power_w``.

        Raises:
            ValueError: ``flow_lps`` not > 0 (no steady state without flow), or
                ``gpu_power_w`` of the wrong shape.
        """
        if not flow_lps > 0.0:
            raise ValueError("RackThermal.settle needs flow_lps > 0")
        cs = self._rhoc * flow_lps
        liquid_kw = self._f_liq * power_w * 0.001
        rise = liquid_kw / cs
        self.t_out_c = t_in_c + rise
        self.power_w = self.demand_w = power_w
        self.liquid_kw = liquid_kw
        g = self._conductance_w_per_k(flow_lps)
        t_loc = t_in_c + self._beta * rise
        p_gpu = power_w * self._gpu_share
        gf = self._gfac
        self._tp = [t_loc + p_gpu * h / (g * f) for h, f in zip(self._hot, gf, strict=True)]
        self._tj = [tp + self._rjp * p_gpu * h for tp, h in zip(self._tp, self._hot, strict=True)]
        if gpu_power_w is None:
            self._gpu_mode = False
            gw = np.repeat(np.asarray(self._hot) * p_gpu, self._gpt)
        else:
            gw = self._check_gpu_power(gpu_power_w)
            self._gpu_mode = True
        self._g_tp = t_loc + gw / (g * self._g_fac)
        self._g_tj = self._g_tp + self._rjp * gw
        self._g_p = gw.copy()
        self.reset_gpus()
        self._events = 0
        return self.t_out_c

    def _check_gpu_power(self, gpu_power_w: np.ndarray) -> np.ndarray:
        gw = np.asarray(gpu_power_w, dtype=float)
        if gw.shape != (self._n_gpus,):
            raise ValueError(f"gpu_power_w needs shape ({self._n_gpus},), got {gw.shape}")
        return gw

    # --- stepping ----------------------------------------------------------------------------

    def _rack_node(self, t_in_c: float, flow_lps: float, power_w: float, p_eff: float,
                   dt: float) -> tuple[float, float]:
        self.demand_w = power_w
        self.power_w = p_eff
        p_liq = self._f_liq * p_eff * 0.001
        self.liquid_kw = p_liq
        cs = self._rhoc * flow_lps
        t_r0 = self.t_out_c
        self.t_out_c = t_r0 + (p_liq + cs * (t_in_c - t_r0)) * dt / self._c_rack
        return p_liq, cs

    def step(self, t_in_c: float, flow_lps: float, power_w: float, dt: float) -> float:
        """Advance by ``dt`` s with inlet ``t_in_c`` (°C), ``flow_lps`` and demand ``power_w``
        (W); the rack node uses its own value from before the step. Returns the heat into the
        liquid this step, kW (f_liq × IT power after throttling)."""
        if self._gpu_mode:
            self._to_tray_mode()
        gpu_w = power_w * self._gpu_share
        p_eff = power_w - gpu_w * self._gpt * self._loss  # throttle state of the last step
        self.demand_w = power_w
        self.power_w = p_eff
        p_liq = self._f_liq * p_eff * 0.001
        self.liquid_kw = p_liq
        cs = self._rhoc * flow_lps
        t_r0 = self.t_out_c
        self.t_out_c = t_r0 + (p_liq + cs * (t_in_c - t_r0)) * dt / self._c_rack

        # GPU sub-model: local coolant capped at the plate temperature (REFERENCE §5.1)
        if flow_lps > 0.0:
            g = self._g0 * (flow_lps / self._q0) ** self._g_exp + self._g_min
        else:
            g = self._g_min
        t_loc_f = t_in_c + self._beta * p_liq / cs if cs > 1e-9 else math.inf
        k_p = dt / self._c_plate
        rjp = self._rjp
        t_slow = self._t_slow
        tps = self._tp
        tjs = self._tj
        ss = self._s
        on = self._on
        hot = self._hot
        gf = self._gfac
        loss = 0.0
        for k in range(self._n_trays):
            tp = tps[k]
            t_loc = t_loc_f if t_loc_f < tp else tp
            if on[k]:
                sk = ss[k]
                pk = gpu_w * hot[k] * sk
                tp += k_p * (pk - g * gf[k] * (tp - t_loc))
                tps[k] = tp
                tj = tp + rjp * pk
                tjs[k] = tj
                if tj > t_slow or sk < 1.0:
                    sk = self._throttle(k, tj, sk, dt)
                    loss += 1.0 - sk
            else:
                tp -= k_p * g * gf[k] * (tp - t_loc)
                tps[k] = tp
                tjs[k] = tp
                loss += 1.0
        self._loss = loss
        return p_liq

    def step_gpus(
        self,
        t_in_c: float,
        flow_lps: float,
        power_w: float,
        gpu_power_w: np.ndarray,
        dt: float,
    ) -> float:
        """Advance by ``dt`` s with per-GPU power (GPU mode).

        Args:
            t_in_c: rack inlet temperature, °C.
            flow_lps: this rack's coolant flow, L/s.
            power_w: rack IT power demand (GPUs + everything else), W.
            gpu_power_w: the GPUs' share of it, shape ``(n_gpus,)``, W (tray-major: tray k
                holds GPUs ``k·gpus_per_tray …``).
            dt: step, s.

        Each GPU draws ``gpu_power_w × scale``, its throttle scale of the last step (0 when
        shut down); the rack heat is ``power_w`` minus what throttled GPUs do not draw.
        Returns the heat into the liquid this step, kW.

        Raises:
            ValueError: ``gpu_power_w`` of the wrong shape.
        """
        gw = self._check_gpu_power(gpu_power_w)
        if not self._gpu_mode:
            self._to_gpu_mode()
        s = self._g_s
        p_act = gw * s
        p_eff = power_w - float(gw.sum() - p_act.sum())
        p_liq, cs = self._rack_node(t_in_c, flow_lps, power_w, p_eff, dt)
        g = self._conductance_w_per_k(flow_lps)
        t_loc_f = t_in_c + self._beta * p_liq / cs if cs > 1e-9 else math.inf
        tp = self._g_tp
        t_loc = np.minimum(tp, t_loc_f)
        tp += (dt / self._c_plate) * (p_act - g * self._g_fac * (tp - t_loc))
        tj = tp + self._rjp * p_act
        self._g_tj = tj
        self._g_p = p_act
        on = self._g_on
        r = self._p
        shut = tj > self._t_shut
        shut &= on
        if shut.any():
            on[shut] = False
            s[shut] = 0.0
            self._off += int(shut.sum())
        hot = tj > self._t_slow
        hot &= on
        if hot.any():
            slowed = self._g_slowed
            self._events += int((hot & ~slowed).sum())
            slowed |= hot
            s[hot] = np.maximum(s[hot] - r.gpu_throttle_rate_per_s * dt, r.gpu_throttle_floor)
        rec = (tj < self._t_recover) & on & (s < 1.0)
        if rec.any():
            s[rec] = np.minimum(s[rec] + r.gpu_throttle_recovery_per_s * dt, 1.0)
            self._g_slowed[rec & (s >= 1.0)] = False
        return p_liq

    def _to_gpu_mode(self) -> None:
        """Switch from the hottest-GPU-per-tray state to per-GPU state (same temperatures)."""
        gpt = self._gpt
        self._g_tp = np.repeat(np.asarray(self._tp, dtype=float), gpt)
        self._g_tj = np.repeat(np.asarray(self._tj, dtype=float), gpt)
        self._g_s = np.repeat(np.asarray(self._s, dtype=float), gpt)
        self._g_on = np.repeat(np.asarray(self._on, dtype=bool), gpt)
        self._g_slowed = np.repeat(np.asarray(self._slowed, dtype=bool), gpt)
        self._gpu_mode = True

    def _to_tray_mode(self) -> None:
        """Switch from per-GPU state to one hottest GPU per tray."""
        n, gpt = self._n_trays, self._gpt
        k = self._g_tj.reshape(n, gpt).argmax(axis=1) + np.arange(n) * gpt
        self._tp = self._g_tp[k].tolist()
        self._tj = self._g_tj[k].tolist()
        self._s = self._g_s[k].tolist()
        self._on = self._g_on[k].tolist()
        self._slowed = self._g_slowed[k].tolist()
        self._loss = float(sum(1.0 - v for v in self._s))
        self._gpu_mode = False

    def _throttle(self, k: int, tj: float, sk: float, dt: float) -> float:
        """HW slowdown / shutdown of tray ``k`` (REFERENCE §4.2 item 7); returns its scale."""
        r = self._p
        if tj > self._t_shut:
            self._on[k] = False
            self._off += 1
            self._s[k] = 0.0
            return 0.0
        if tj > self._t_slow:
            if not self._slowed[k]:
                self._slowed[k] = True
                self._events += 1
            sk -= r.gpu_throttle_rate_per_s * dt
            if sk < r.gpu_throttle_floor:
                sk = r.gpu_throttle_floor
        elif tj < self._t_recover:
            sk += r.gpu_throttle_recovery_per_s * dt
            if sk >= 1.0:
                sk = 1.0
                self._slowed[k] = False
        self._s[k] = sk
        return sk

    def reset_gpus(self) -> None:
        """Power shut-down GPUs back on and clear throttling (operator action)."""
        self._on = [True] * self._n_trays
        self._s = [1.0] * self._n_trays
        self._slowed = [False] * self._n_trays
        n = self._n_gpus
        self._g_on = np.ones(n, dtype=bool)
        self._g_s = np.ones(n)
        self._g_slowed = np.zeros(n, dtype=bool)
        self._off = 0
        self._loss = 0.0

    # --- outputs -----------------------------------------------------------------------------

    @property
    def gpu_tj_c(self) -> tuple[float, ...]:
        """Hottest-GPU junction temperature per tray, °C, as the throttle logic last saw it."""
        if self._gpu_mode:
            return tuple(self._g_tj.reshape(self._n_trays, self._gpt).max(axis=1).tolist())
        return tuple(self._tj)

    @property
    def gpu_junction_temps_c(self) -> np.ndarray:
        """Every GPU's junction temperature, °C, shape ``(n_gpus,)`` (a copy). In tray mode
        the tray's hottest-GPU value stands for its GPUs."""
        if self._gpu_mode:
            return self._g_tj.copy()
        return np.repeat(np.asarray(self._tj, dtype=float), self._gpt)

    @property
    def gpu_plate_temps_c(self) -> np.ndarray:
        """Every GPU's cold-plate temperature, °C, shape ``(n_gpus,)`` (a copy)."""
        if self._gpu_mode:
            return self._g_tp.copy()
        return np.repeat(np.asarray(self._tp, dtype=float), self._gpt)

    @property
    def gpu_scales(self) -> np.ndarray:
        """Every GPU's thermal throttle scale (1 = unthrottled, 0 = shut down), shape
        ``(n_gpus,)`` (a copy)."""
        if self._gpu_mode:
            return self._g_s.copy()
        return np.repeat(np.asarray(self._s, dtype=float), self._gpt)

    @property
    def gpu_on(self) -> np.ndarray:
        """False for shut-down GPUs (latched until `reset_gpus`), shape ``(n_gpus,)``."""
        if self._gpu_mode:
            return self._g_on.copy()
        return np.repeat(np.asarray(self._on, dtype=bool), self._gpt)

    @property
    def gpu_throttled(self) -> np.ndarray:
        """True for GPUs in HW slowdown (above the threshold, or still recovering)."""
        if self._gpu_mode:
            return self._g_on & (self._g_slowed | (self._g_s < 1.0))
        t = [on and (sl or s < 1.0) for on, s, sl in zip(self._on, self._s, self._slowed,
                                                          strict=True)]
        return np.repeat(np.asarray(t, dtype=bool), self._gpt)

    @property
    def gpu_power_drawn_w(self) -> np.ndarray:
        """Power each GPU drew in the last `step_gpus` (after throttling), W (a copy)."""
        return self._g_p.copy()

    @property
    def throttled_trays(self) -> int:
        """Trays in HW slowdown (above the threshold, or still recovering)."""
        if self._gpu_mode:
            return int(self.gpu_throttled.reshape(self._n_trays, self._gpt).any(axis=1).sum())
        return len([  # a count: a list comprehension is cheaper than sum() of a generator
            1
            for on, s, sl in zip(self._on, self._s, self._slowed, strict=True)
            if on and (sl or s < 1.0)
        ])

    @property
    def shutdown_trays(self) -> int:
        """Trays with a shut-down GPU (latched until `reset_gpus`)."""
        if self._gpu_mode:
            return int((~self._g_on).reshape(self._n_trays, self._gpt).any(axis=1).sum())
        return sum(1 for on in self._on if not on)

    @property
    def throttle_events(self) -> int:
        """Entries into HW slowdown since the last settle (per tray, or per GPU in GPU
        mode)."""
        return self._events


# --- the plant --------------------------------------------------------------------------------


_NOISE_BLOCK = 4096


class CduPlant:
    """CDU + its rack(s), stepped with an explicit ``dt``; deterministic for a ``seed``.

    Args:
        params: `CduParams` (REFERENCE §4.3 defaults); ``params.n_racks`` identical racks
            share the secondary flow equally (a row CDU; 1 by default).
        seed: seeds the sensor-noise stream (numpy PCG64).

    The constructor leaves the plant at the zero-load steady state (valve closed, everything at
    the setpoint, duty pump A at design speed); call `warm_start` for a loaded one. Writes come
    through `write`; each `step` takes the rack IT power (W; one value for every rack, or one
    per rack), optionally per-GPU power (`RackThermal.step_gpus`), and the facility water
    supply temperature (°C). Fault hooks: `trip_pump`, `reset_pump`, `set_duty_pump`,
    `set_valve_stuck`, `set_valve_feedback_offset_pct`, `set_valve_slow_factor`,
    `set_sensor_fault`, `clear_sensor_fault`, `set_leak_lpm`, `restart_controller`,
    `reset_gpus`.
    """

    __slots__ = (
        "_boot_t",
        "_c_cdu",
        "_c_tank",
        "_ce_air",
        "_ce_hx",
        "_ce_liq",
        "_ce_pump",
        "_duty",
        "_filter_foul",
        "_handover_from",
        "_hb",
        "_hb_change_t",
        "_hb_timeout",
        "_hx_exp",
        "_iso",
        "_iso_cmd",
        "_iso_rate",
        "_k_sys",
        "_leak_lps",
        "_ln_r",
        "_local",
        "_n",
        "_n_cmd",
        "_n_pumps",
        "_p",
        "_p_abs0",
        "_p_in_max_w",
        "_p_loop",
        "_pi_i",
        "_pi_next_t",
        "_pump_p0_kw",
        "_q",
        "_q0",
        "_q_hx",
        "_q_share",
        "_qmax",
        "_qp",
        "_qp_max",
        "_qp_ref",
        "_rack",
        "_racks",
        "_remote_cmd",
        "_remote_written",
        "_ret",
        "_rhoc_p",
        "_rhoc_s",
        "_rng",
        "_rng2",
        "_rope_fault",
        "_rope_leak",
        "_run_h",
        "_s_dp",
        "_s_filter",
        "_s_flow",
        "_s_fws",
        "_s_heat",
        "_s_level",
        "_s_loop",
        "_s_ret",
        "_s_sa",
        "_s_sb",
        "_s_sc",
        "_sensors",
        "_sp",
        "_sup",
        "_t",
        "_t_fws",
        "_t_ss",
        "_tripped",
        "_ua2",
        "_v_inv",
        "_v_inv0",
        "_v_tank",
        "_valve_offset",
        "_valve_rate",
        "_valve_slow",
        "_valve_stuck",
        "_x",
        "_x_b",
        "_x_b_cmd",
        "_x_cmd",
        "_z",
        "_z2",
        "_z2i",
        "_zi",
    )

    def __init__(self, params: CduParams | None = None, seed: int = 0) -> None:
        p = params if params is not None else CduParams()
        r = p.rack
        self._p = p
        self._rng = np.random.Generator(np.random.PCG64(seed))
        self._z: list[float] = []
        self._zi = 0
        # constants (REFERENCE §4.2/4.3)
        self._rhoc_s = p.coolant_rho_c_kj_per_l_k
        self._rhoc_p = p.facility_rho_c_kj_per_l_k
        self._q0 = p.design_flow_lps
        self._qmax = p.max_flow_lps
        self._ua2 = 2.0 * p.hx_ua_kw_per_k
        self._hx_exp = p.hx_flow_exponent
        self._qp_max = p.facility_max_flow_lps
        self._qp_ref = p.hx_primary_ref_fraction * p.facility_max_flow_lps
        self._ln_r = math.log(p.valve_rangeability)
        self._k_sys = p.diff_pressure_design_kpa / p.design_flow_lps**2
        self._c_cdu = p.coolant_rho_c_kj_per_l_k * p.cdu_volume_l
        self._v_tank = p.pipe_volume_l / p.pipe_tanks
        self._c_tank = p.coolant_rho_c_kj_per_l_k * self._v_tank
        self._n_pumps = p.n_pumps
        self._pump_p0_kw = p.pump_power_full_speed_w / 1000.0
        self._q_share = 1.0 / p.n_racks
        self._racks = tuple(
            RackThermal(r, p.design_flow_lps * self._q_share, p.coolant_rho_c_kj_per_l_k)
            for _ in range(p.n_racks)
        )
        self._rack = self._racks[0]
        self._p_in_max_w = 2.0 * r.rack_max_power_w
        self._hb_timeout = p.heartbeat_timeout_s
        self._v_inv0 = 2.0 * p.pipe_volume_l + p.cdu_volume_l + p.n_racks * r.fluid_volume_l
        self._p_abs0 = p.fill_pressure_kpa + ATM_KPA
        # state
        self._t = 0.0
        self._boot_t = 0.0
        self._sp = p.supply_temp_setpoint_c
        self._t_fws = p.facility_supply_temp_c
        self._hb = 0
        self._hb_change_t = 0.0
        self._local = False
        self._pi_i = 0.0
        self._pi_next_t = 0.0
        self._remote_cmd = 0.0
        self._remote_written = False
        self._valve_stuck = False
        self._valve_offset = 0.0
        self._valve_slow = 1.0
        self._valve_rate = 1.0 / p.valve_stroke_time_s
        self._x = 0.0
        self._x_cmd = 0.0
        self._qp = 0.0
        self._duty = 0
        self._handover_from: int | None = None
        self._n = [0.0] * p.n_pumps
        self._tripped = [False] * p.n_pumps
        self._run_h = list(p.pump_initial_run_hours_h or [8000.0 + 50.0 * i
                                                          for i in range(p.n_pumps)])
        self._x_b = 0.0
        self._x_b_cmd = 0.0
        self._iso = 1.0
        self._iso_cmd = 1.0
        self._iso_rate = 1.0 / p.rack_isolation_stroke_s
        self._rope_leak = False
        self._rope_fault = False
        self._filter_foul = 1.0
        # The issue-4 transmitters (level, filter ΔP) draw from their own stream, so the
        # original sensors' noise (and every seeded figure built on it) is unchanged.
        self._rng2 = np.random.Generator(np.random.PCG64([seed, 0x4C56]))
        self._z2: list[float] = []
        self._z2i = 0
        self._s_level = Sensor(
            "reservoir_level_pct", SensorParams(tau_s=5.0, noise_sigma=0.1, quantum=0.1)
        )
        self._s_filter = Sensor(
            "filter_diff_pressure_kpa", SensorParams(tau_s=0.5, noise_sigma=0.3, quantum=0.1)
        )
        self._n_cmd = p.design_flow_lps / p.max_flow_lps
        self._q = p.design_flow_lps
        self._t_ss = self._sp
        self._sup = [self._sp] * p.pipe_tanks
        self._ret = [self._sp] * p.pipe_tanks
        self._q_hx = 0.0
        self._v_inv = self._v_inv0
        self._leak_lps = 0.0
        self._p_loop = 0.0
        self._ce_liq = self._ce_air = self._ce_hx = self._ce_pump = 0.0
        sb = p.supply_sensor_bias_k
        self._s_sa = Sensor("supply_temp_c", p.temp_sensor, sb[0])
        self._s_sb = Sensor("supply_temp_b_c", p.temp_sensor, sb[1])
        self._s_sc = Sensor("supply_temp_c_c", p.temp_sensor, sb[2])
        self._s_ret = Sensor("return_temp_c", p.temp_sensor, p.return_sensor_bias_k)
        self._s_fws = Sensor("facility_supply_temp_c", p.temp_sensor, p.facility_sensor_bias_k)
        self._s_flow = Sensor("flow_lpm", p.flow_sensor)
        self._s_dp = Sensor("diff_pressure_kpa", p.pressure_sensor)
        self._s_heat = Sensor("heat_removed_kw", p.heat_meter)
        self._s_loop = Sensor("loop_pressure_kpa", p.pressure_sensor)
        self._sensors = {
            s.name: s
            for s in (
                self._s_sa,
                self._s_sb,
                self._s_sc,
                self._s_ret,
                self._s_fws,
                self._s_flow,
                self._s_dp,
                self._s_heat,
                self._s_loop,
                self._s_level,
                self._s_filter,
            )
        }
        self.warm_start(0.0)

    # --- properties ------------------------------------------------------------------------

    @property
    def params(self) -> CduParams:
        """The parameter set."""
        return self._p

    @property
    def time_s(self) -> float:
        """Plant time, s since construction."""
        return self._t

    @property
    def racks(self) -> tuple[RackThermal, ...]:
        """The rack thermal models on this CDU (one unless ``params.n_racks`` > 1)."""
        return self._racks

    @property
    def local_control(self) -> bool:
        """True while the CDU runs its own supply-temperature loop (heartbeat lost)."""
        return self._local

    @property
    def sensors(self) -> dict[str, Sensor]:
        """The simulated transmitters by point name (for fault injection and inspection)."""
        return dict(self._sensors)

    # --- steady state ----------------------------------------------------------------------

    def _valve_flow(self, x: float) -> float:
        return self._qp_max * math.exp((x - 1.0) * self._ln_r) if x > 0.0 else 0.0

    def capacity_w(
        self,
        supply_temp_c: float,
        facility_supply_temp_c: float,
        valve_position_pct: float = 100.0,
        pump_speed_pct: float | None = None,
    ) -> float:
        """Steady-state rack IT power (W) the plant removes at ``supply_temp_c``.

        With the valve at ``valve_position_pct`` (100 = open) and the pump at
        ``pump_speed_pct`` (default design speed). REFERENCE §4.4: ≈52 kW per K of approach
        with the defaults (41 °C → ≈208 kW at 45 °C). 0 when supply ≤ facility temperature.
        For a row CDU it is the total over its racks.
        """
        n = pump_speed_pct if pump_speed_pct is not None else self._p.design_pump_speed_pct
        q = self._qmax * n / 100.0
        k = hx_conductance_kw_per_k(q, self._valve_flow(valve_position_pct / 100.0), self._p)
        dt_k = supply_temp_c - facility_supply_temp_c
        if k <= 0.0 or dt_k <= 0.0:
            return 0.0
        q_liq = dt_k / (1.0 / k - 1.0 / (self._rhoc_s * q))
        return 1000.0 * q_liq / self._rack.params.liquid_fraction

    def warm_start(
        self,
        rack_power_w: float | Sequence[float],
        supply_setpoint_c: float | None = None,
        facility_supply_temp_c: float | None = None,
        pump_speed_pct: float | None = None,
        *,
        gpu_power_w: np.ndarray | Sequence[np.ndarray] | None = None,
    ) -> WarmStartResult:
        """Put the plant at the steady state where a valve position holds the setpoint.

        Bisection on the valve position (REFERENCE §4.4 method). Every tank, node, GPU plate
        and sensor lag is set to its steady value; pumps healthy, duty A at ``pump_speed_pct``
        (default design speed); valve command = position; remote control with a fresh
        heartbeat; energy counters reset. ``supply_setpoint_c`` also becomes the local-control
        setpoint register. Plant time is not reset. ``rack_power_w`` and ``gpu_power_w`` are
        as in `step` (with ``gpu_power_w`` the racks settle in GPU mode).

        Raises:
            ValueError: power outside [0, 2 × rack_max_power_w], setpoint outside 20–60 °C,
                pump speed outside [pump_min_speed_pct, 100], non-finite input, wrong number
                of per-rack values.
        """
        p = self._p
        sp = p.supply_temp_setpoint_c if supply_setpoint_c is None else supply_setpoint_c
        t_fws = (
            p.facility_supply_temp_c if facility_supply_temp_c is None else facility_supply_temp_c
        )
        n_pct = p.design_pump_speed_pct if pump_speed_pct is None else pump_speed_pct
        powers = self._rack_powers(rack_power_w)
        gpus = self._gpu_powers(gpu_power_w)
        if not (20.0 <= sp <= 60.0):
            raise ValueError(f"supply setpoint {sp} °C outside 20–60 °C")
        if not (-20.0 <= t_fws <= 95.0):
            raise ValueError(f"facility_supply_temp_c {t_fws} outside −20–95 °C")
        if not (p.pump_min_speed_pct <= n_pct <= 100.0):
            raise ValueError(f"pump_speed_pct {n_pct} outside [{p.pump_min_speed_pct}, 100]")
        n = n_pct / 100.0
        q = self._qmax * n
        cs = self._rhoc_s * q
        q_liq = self._rack.params.liquid_fraction * sum(powers) / 1000.0
        rise = q_liq / cs

        def t_ss_at(x: float) -> float:
            k = hx_conductance_kw_per_k(q, self._valve_flow(x), p)
            return t_fws + q_liq / k - rise

        holds = True
        if q_liq <= 0.0:
            x, t_ss = 0.0, sp
        elif t_ss_at(1.0) > sp:
            x, t_ss, holds = 1.0, t_ss_at(1.0), False
        else:
            lo, hi = 0.0, 1.0  # t_ss_at decreases with x; invariant t_ss_at(hi) <= sp
            for _ in range(60):
                mid = 0.5 * (lo + hi)
                if t_ss_at(mid) > sp:
                    lo = mid
                else:
                    hi = mid
            x = hi
            t_ss = t_ss_at(x)
            holds = abs(t_ss - sp) < 1e-6
        # state
        self._sp = sp
        self._t_fws = t_fws
        self._x = self._x_cmd = self._remote_cmd = x
        self._remote_written = False
        self._qp = self._valve_flow(x)
        self._duty = 0
        self._handover_from = None
        self._n = [n if i == 0 else 0.0 for i in range(self._n_pumps)]
        self._tripped = [False] * self._n_pumps
        self._n_cmd = n
        self._x_b = self._x_b_cmd = 0.0
        self._iso = self._iso_cmd = 1.0
        self._q = q
        self._t_ss = t_ss
        self._sup = [t_ss] * p.pipe_tanks
        q_r = q * self._q_share
        t_r = 0.0
        for i, rack in enumerate(self._racks):
            t_r += rack.settle(t_ss, q_r, powers[i], None if gpus is None else gpus[i])
        t_r *= self._q_share
        self._ret = [t_r] * p.pipe_tanks
        self._q_hx = q_liq
        self._local = False
        self._hb_change_t = self._t
        self._ce_liq = self._ce_air = self._ce_hx = self._ce_pump = 0.0
        self._p_loop = self._static_pressure_kpa()
        self._s_sa.reset(t_ss)
        self._s_sb.reset(t_ss)
        self._s_sc.reset(t_ss)
        self._s_ret.reset(t_r)
        self._s_fws.reset(t_fws)
        self._s_flow.reset(q * 60.0)
        self._s_dp.reset(self._k_sys * q * q)
        self._s_heat.reset(q_liq)
        self._s_loop.reset(self._p_loop)
        self._s_level.reset(self._level_pct())
        self._s_filter.reset(self._filter_dp_kpa(q))
        return WarmStartResult(100.0 * x, t_ss, holds)

    def _level_pct(self) -> float:
        """Reservoir level: falls with the inventory lost (thermal expansion is the
        expansion tank's, `_static_pressure_kpa`) [U]."""
        p = self._p
        lvl = p.reservoir_initial_level_pct - 100.0 * (self._v_inv0 - self._v_inv) / (
            p.reservoir_volume_l
        )
        return 0.0 if lvl < 0.0 else 100.0 if lvl > 100.0 else lvl

    def _filter_dp_kpa(self, q: float) -> float:
        """Filter ΔP ∝ Q² × fouling factor [U]."""
        r = q / self._q0
        return self._p.filter_diff_pressure_design_kpa * self._filter_foul * r * r

    def _static_pressure_kpa(self) -> float:
        """Expansion-tank model: isothermal gas cushion squeezed by thermal expansion and
        inventory change; vents through the PRV above its setting (updates inventory)."""
        p = self._p
        heat_sum = (
            p.cdu_volume_l * self._t_ss
            + p.rack.fluid_volume_l * sum(r.t_out_c for r in self._racks)
            + self._v_tank * (sum(self._sup) + sum(self._ret))
        )
        dv = p.coolant_expansion_per_k * (heat_sum - self._v_inv0 * p.fill_temp_c) + (
            self._v_inv - self._v_inv0
        )
        vg0 = p.expansion_tank_gas_volume_l
        p_max_abs = p.relief_valve_kpa + ATM_KPA
        dv_max = vg0 * (1.0 - self._p_abs0 / p_max_abs)
        if dv > dv_max:  # PRV opens: vent the excess
            self._v_inv -= dv - dv_max
            return p.relief_valve_kpa
        p_g = self._p_abs0 * vg0 / (vg0 - dv) - ATM_KPA
        return p_g if p_g > 0.0 else 0.0

    def stored_energy_kj(self) -> float:
        """Heat stored in the loop relative to 0 °C, kJ (CDU node, pipes, rack node)."""
        return (
            self._c_cdu * self._t_ss
            + sum(r.stored_energy_kj() for r in self._racks)
            + self._c_tank * (sum(self._sup) + sum(self._ret))
        )

    # --- stepping --------------------------------------------------------------------------

    def _noise(self) -> list[float]:
        self._z = self._rng.standard_normal(_NOISE_BLOCK).tolist()
        self._zi = 0
        return self._z

    def _rack_powers(self, rack_power_w: float | Sequence[float]) -> list[float]:
        n = len(self._racks)
        if isinstance(rack_power_w, int | float):
            powers = [float(rack_power_w)] * n
        else:
            powers = [float(v) for v in rack_power_w]
            if len(powers) != n:
                raise ValueError(f"rack_power_w needs {n} values (one per rack), got {len(powers)}")
        for v in powers:
            if not (0.0 <= v <= self._p_in_max_w):
                raise ValueError(f"rack_power_w {v} outside [0, {self._p_in_max_w}]")
        return powers

    def _gpu_powers(
        self, gpu_power_w: np.ndarray | Sequence[np.ndarray] | None
    ) -> list[np.ndarray] | None:
        if gpu_power_w is None:
            return None
        n = len(self._racks)
        arrs = [gpu_power_w] if isinstance(gpu_power_w, np.ndarray) else list(gpu_power_w)
        if len(arrs) != n:
            raise ValueError(f"gpu_power_w needs {n} arrays (one per rack), got {len(arrs)}")
        out = []
        for a in arrs:
            a = np.asarray(a, dtype=float)
            if not (a.size and a.min() >= 0.0 and math.isfinite(a.sum())):
                raise ValueError("gpu_power_w must be finite and >= 0 W")
            out.append(a)
        return out

    def step(
        self,
        rack_power_w: float | Sequence[float],
        facility_supply_temp_c: float,
        dt: float = 0.1,
        *,
        gpu_power_w: np.ndarray | Sequence[np.ndarray] | None = None,
    ) -> None:
        """Advance the plant by ``dt`` s (REFERENCE §4.2 items 1–7, 9, 10).

        Args:
            rack_power_w: rack IT power demand (before GPU throttling), W: one value (every
                rack of a row CDU gets it) or one per rack.
            facility_supply_temp_c: facility water supply temperature, °C.
            dt: step, s (0 < dt ≤ 1).
            gpu_power_w: per-GPU power demand, the GPU part of ``rack_power_w`` (an array of
                shape ``(n_trays × gpus_per_tray,)``, or one per rack): the racks step in GPU
                mode (`RackThermal.step_gpus`). None: the §4 hottest-GPU-per-tray model.

        Raises:
            ValueError: non-finite or out-of-range input (power outside
                [0, 2 × rack_max_power_w], facility temperature outside −20–95 °C, wrong
                number of per-rack values or GPU array shape); nothing changes.
        """
        racks = self._racks
        # (int, float): a tuple, not a union built on every step
        if len(racks) == 1 and isinstance(rack_power_w, (int, float)):
            if not (0.0 <= rack_power_w <= self._p_in_max_w):
                raise ValueError(f"rack_power_w {rack_power_w} outside [0, {self._p_in_max_w}]")
            powers = [rack_power_w]
        else:
            powers = self._rack_powers(rack_power_w)
        gpus = None if gpu_power_w is None else self._gpu_powers(gpu_power_w)
        if gpus is not None:
            for a in gpus:
                if a.shape != (racks[0].n_gpus,):
                    raise ValueError(
                        f"gpu_power_w needs shape ({racks[0].n_gpus},), got {a.shape}"
                    )
        if not (-20.0 <= facility_supply_temp_c <= 95.0):
            raise ValueError(f"facility_supply_temp_c {facility_supply_temp_c} outside −20–95 °C")
        if not (0.0 < dt <= 1.0):
            raise ValueError(f"dt {dt} outside (0, 1] s")
        t = self._t + dt
        self._t = t
        t_fws = facility_supply_temp_c
        self._t_fws = t_fws

        # heartbeat watchdog and local control (the CDU's own PI at 1 Hz)
        if not self._local:
            if t - self._hb_change_t >= self._hb_timeout:
                self._enter_local()
        elif t >= self._pi_next_t:
            self._pi_next_t += self._p.local_pi_period_s
            self._local_pi()

        # 1. valve: rate-limited, equal-percentage
        x = self._x
        if not self._valve_stuck:
            d = self._x_cmd - x
            m = dt * self._valve_rate
            if d > m:
                d = m
            elif d < -m:
                d = -m
            x += d
            self._x = x
        qp = self._qp_max * math.exp((x - 1.0) * self._ln_r) if x > 0.0 else 0.0
        xb = self._x_b
        if xb > 0.0 or self._x_b_cmd > 0.0:  # second valve (parallel): flows add, capped
            d = self._x_b_cmd - xb
            m = dt * self._valve_rate
            xb += m if d > m else -m if d < -m else d
            self._x_b = xb
            if xb > 0.0:
                qp += self._qp_max * math.exp((xb - 1.0) * self._ln_r)
                if qp > self._qp_max:
                    qp = self._qp_max
        self._qp = qp
        iso = self._iso
        if iso != self._iso_cmd:  # rack isolation valves travel
            d = self._iso_cmd - iso
            m = dt * self._iso_rate
            iso += m if d > m else -m if d < -m else d
            self._iso = iso

        # 2. pumps: VFD ramp, coast-down after a trip, flow lag
        p = self._p
        ns = self._n
        ramp = p.pump_vfd_ramp_pct_per_s * 0.01 * dt
        coast = dt / p.pump_coast_tau_s
        if coast > 1.0:
            coast = 1.0
        nmax = 0.0
        pump_kw = 0.0
        hand = self._handover_from
        if hand is not None and (
            self._tripped[hand] or ns[self._duty] >= self._n_cmd - 0.01
            or self._tripped[self._duty]
        ):
            hand = self._handover_from = None  # the new duty pump is at speed (or a trip)
        dt_h = dt / 3600.0
        for i in range(self._n_pumps):
            ni = ns[i]
            if self._tripped[i]:
                ni -= ni * coast
            else:
                d = (self._n_cmd if i == self._duty or i == hand else 0.0) - ni
                if d > ramp:
                    d = ramp
                elif d < -ramp:
                    d = -ramp
                ni += d
            ns[i] = ni
            if ni > nmax:
                nmax = ni
            if ni > 0.01:
                self._run_h[i] += dt_h
            pump_kw += ni * ni * ni
        pump_kw *= self._pump_p0_kw
        a_q = dt / p.flow_tau_s
        if a_q > 1.0:
            a_q = 1.0
        q = self._q + (self._qmax * nmax * iso - self._q) * a_q
        self._q = q
        cs = self._rhoc_s * q

        # 3. plate HX (ε-NTU counterflow, flow-dependent UA)
        sup = self._sup
        ret = self._ret
        t_rc = ret[-1]
        if q > 1e-9 and qp > 1e-9:
            hx_e = self._hx_exp
            ua = self._ua2 / ((self._q0 / q) ** hx_e + (self._qp_ref / qp) ** hx_e)
            cp = self._rhoc_p * qp
            if cs < cp:
                cmin = cs
                cr = cs / cp
            else:
                cmin = cp
                cr = cp / cs
            ntu = ua / cmin
            if cr > 0.999999999:
                eps = ntu / (1.0 + ntu)
            else:
                e = math.exp(-ntu * (1.0 - cr))
                eps = (1.0 - e) / (1.0 - cr * e)
            q_hx = eps * cmin * (t_rc - t_fws)
        else:
            q_hx = 0.0
        self._q_hx = q_hx

        # 4.–7. pipes (tanks in series), CDU node, rack: all from the state before the step
        t_ss0 = self._t_ss
        t_in0 = sup[-1]
        if len(racks) == 1:
            t_r0 = racks[0].t_out_c
        else:
            t_r0 = sum(r.t_out_c for r in racks) * self._q_share
        a_t = cs * dt / self._c_tank
        if a_t > 1.0:
            a_t = 1.0
        for k in range(len(sup) - 1, 0, -1):
            sup[k] += (sup[k - 1] - sup[k]) * a_t
            ret[k] += (ret[k - 1] - ret[k]) * a_t
        sup[0] += (t_ss0 - sup[0]) * a_t
        ret[0] += (t_r0 - ret[0]) * a_t
        self._t_ss = t_ss0 + (cs * (t_rc - t_ss0) - q_hx) * dt / self._c_cdu
        if gpus is None and len(racks) == 1:  # the §4 model, valvey's lock-step: keep it lean
            rack = racks[0]
            p_liq = rack.step(t_in0, q, powers[0], dt)
            p_it_kw = rack.power_w * 0.001
        else:
            q_r = q * self._q_share
            p_liq = 0.0
            p_it_kw = 0.0
            for i, rack in enumerate(racks):
                if gpus is None:
                    p_liq += rack.step(t_in0, q_r, powers[i], dt)
                else:
                    p_liq += rack.step_gpus(t_in0, q_r, powers[i], gpus[i], dt)
                p_it_kw += rack.power_w * 0.001

        # 9. inventory (leak) and static pressure
        if self._leak_lps:  # leaks are downstream of the rack isolation valves [U]
            v = self._v_inv - self._leak_lps * iso * dt
            self._v_inv = v if v > 0.0 else 0.0

        # energy counters (kJ)
        self._ce_liq += p_liq * dt
        self._ce_air += (p_it_kw - p_liq) * dt
        self._ce_hx += q_hx * dt
        self._ce_pump += pump_kw * dt

        # 10. sensors
        zi = self._zi
        z = self._z if zi + 9 <= len(self._z) else self._noise()
        zi = self._zi
        self._zi = zi + 9
        t_ss = self._t_ss
        self._s_sa.update(t_ss, dt, z[zi])
        self._s_sb.update(t_ss, dt, z[zi + 1])
        self._s_sc.update(t_ss, dt, z[zi + 2])
        self._s_ret.update(ret[-1], dt, z[zi + 3])
        self._s_fws.update(t_fws, dt, z[zi + 4])
        self._s_flow.update(q * 60.0, dt, z[zi + 5])
        self._s_dp.update(self._k_sys * q * q, dt, z[zi + 6])
        self._s_heat.update(q_hx, dt, z[zi + 7])
        self._p_loop = self._static_pressure_kpa()
        self._s_loop.update(self._p_loop, dt, z[zi + 8])
        z2i = self._z2i
        if z2i + 2 > len(self._z2):
            self._z2 = self._rng2.standard_normal(_NOISE_BLOCK).tolist()
            z2i = 0
        self._z2i = z2i + 2
        z2 = self._z2
        self._s_level.update(self._level_pct(), dt, z2[z2i])
        self._s_filter.update(self._filter_dp_kpa(q), dt, z2[z2i + 1])

    # --- local control ---------------------------------------------------------------------

    def _supply_estimate(self) -> float:
        """Median of the finite supply sensors A/B/C; NaN when none is finite."""
        vals = [v for v in (self._s_sa.value, self._s_sb.value, self._s_sc.value) if v == v]
        if not vals:
            return math.nan
        vals.sort()
        n = len(vals)
        return vals[n // 2] if n % 2 else 0.5 * (vals[0] + vals[1])

    def _enter_local(self) -> None:
        self._local = True
        self._remote_written = False
        self._remote_cmd = self._x_cmd
        y = self._supply_estimate()
        e = 0.0 if y != y else y - self._sp
        self._pi_i = self._x_cmd - self._p.local_pi_gain_per_k * e  # bumpless
        self._pi_next_t = self._t
        self._local_pi()
        self._pi_next_t = self._t + self._p.local_pi_period_s

    def _local_pi(self) -> None:
        """PI with conditional integration on the median supply sensor; holds on signal loss
        (Vertiv CDU 600: "on signal loss the valve holds its last position", REF §1.5)."""
        y = self._supply_estimate()
        if y != y:
            return
        p = self._p
        e = y - self._sp
        kc = p.local_pi_gain_per_k
        i_new = self._pi_i + kc * e * p.local_pi_period_s / p.local_pi_integral_time_s
        u = i_new + kc * e
        if u > 1.0:
            u = 1.0
            if e <= 0.0:
                self._pi_i = i_new
        elif u < 0.0:
            u = 0.0
            if e >= 0.0:
                self._pi_i = i_new
        else:
            self._pi_i = i_new
        self._x_cmd = u

    # --- register interface ----------------------------------------------------------------

    def write(self, point: str, value: float) -> None:
        """Write a holding register in engineering units (config/registers/cdu-generic.toml).

        ``valve_command_pct`` moves the valve demand (while in local control it is stored and
        used when remote control resumes); ``pump_speed_command_pct`` the duty pump speed;
        ``heartbeat`` (rounded to an integer) restores remote control when it changes;
        ``supply_temp_setpoint_c`` is the local-control setpoint.

        Raises:
            WriteRejected: unknown or read-only point, non-finite value, value outside the
                register's write_min/write_max (nothing changes).
        """
        lim = WRITABLE_POINTS.get(point)
        if lim is None:
            raise WriteRejected(f"cdu: point {point!r} is not writable")
        if not (isinstance(value, int | float) and math.isfinite(value)):
            raise WriteRejected(f"cdu: {point} value {value!r} is not a finite number")
        if not (lim[0] <= value <= lim[1]):
            raise WriteRejected(f"cdu: {point} value {value} outside [{lim[0]}, {lim[1]}]")
        if point == "valve_command_pct":
            if self._local:
                self._remote_cmd = value / 100.0
                self._remote_written = True
            else:
                self._x_cmd = value / 100.0
        elif point == "pump_speed_command_pct":
            self._n_cmd = value / 100.0
        elif point == "duty_pump_select":
            pump = round(value)
            if pump >= self._n_pumps:
                raise WriteRejected(f"cdu: duty_pump_select {value}: the CDU has "
                                    f"{self._n_pumps} pump(s)")
            self.set_duty_pump(pump)
        elif point == "valve_b_command_pct":
            if not self._p.second_valve:
                raise WriteRejected("cdu: valve_b_command_pct: this CDU has no second valve")
            self._x_b_cmd = value / 100.0
        elif point == "rack_isolation_command":
            self._iso_cmd = 1.0 if round(value) else 0.0
        elif point == "heartbeat":
            hb = round(value)
            if hb != self._hb:
                self._hb = hb
                self._hb_change_t = self._t
                if self._local:
                    self._local = False
                    if self._remote_written:
                        self._x_cmd = self._remote_cmd
        else:
            self._sp = float(value)

    def readings(self) -> dict[str, float]:
        """What the CDU's registers hold now, keyed by `READING_POINTS` (engineering units).

        Sensors are lagged, noisy, quantised and possibly faulted (NaN when dropped);
        ``valve_position_pct`` is the feedback (with any offset fault, clipped to 0–100);
        ``pump_speed_pct`` the fastest running pump; ``valve_command_pct`` the effective demand
        (the local loop's output while in local control). Per pump (``pump_a_*``,
        ``pump_b_*``): running (not tripped and turning), fault (tripped), speed, run hours;
        ``duty_pump_select`` the duty pump's index. ``rack_isolation_open`` / ``_closed`` are
        the limit switches (both 0 while the valves travel).
        """
        x_fb = 100.0 * self._x + self._valve_offset
        run = max([n for n, tr in zip(self._n, self._tripped, strict=True) if not tr],
                  default=0.0)
        pumps: dict[str, float] = {}
        n_pumps = self._n_pumps
        for i, (k_run, k_fault, k_speed, k_hours) in enumerate(_PUMP_KEYS):
            if i < n_pumps:
                n, tr = self._n[i], self._tripped[i]
                pumps[k_run] = 1.0 if (not tr and n > 0.01) else 0.0
                pumps[k_fault] = 1.0 if tr else 0.0
                pumps[k_speed] = 100.0 * n
                pumps[k_hours] = self._run_h[i]
            else:
                pumps[k_run] = pumps[k_fault] = pumps[k_speed] = pumps[k_hours] = 0.0
        return {
            **pumps,
            "reservoir_level_pct": self._s_level.value,
            "filter_diff_pressure_kpa": self._s_filter.value,
            "valve_b_position_pct": 100.0 * self._x_b,
            "rack_isolation_open": 1.0 if self._iso >= 1.0 else 0.0,
            "rack_isolation_closed": 1.0 if self._iso <= 0.0 else 0.0,
            "leak_rope_detected": 1.0 if self._rope_leak else 0.0,
            "leak_rope_sensor_fault": 1.0 if self._rope_fault else 0.0,
            "duty_pump_select": float(self._duty),
            "valve_b_command_pct": 100.0 * self._x_b_cmd,
            "rack_isolation_command": self._iso_cmd,
            "supply_temp_c": self._s_sa.value,
            "return_temp_c": self._s_ret.value,
            "flow_lpm": self._s_flow.value,
            "diff_pressure_kpa": self._s_dp.value,
            "valve_position_pct": 0.0 if x_fb < 0.0 else 100.0 if x_fb > 100.0 else x_fb,
            "facility_supply_temp_c": self._s_fws.value,
            "heat_removed_kw": self._s_heat.value,
            "pump_speed_pct": 100.0 * run,
            "supply_temp_b_c": self._s_sb.value,
            "supply_temp_c_c": self._s_sc.value,
            "uptime_s": float(math.floor(self._t - self._boot_t + 1e-9)),
            "loop_pressure_kpa": self._s_loop.value,
            "valve_command_pct": 100.0 * self._x_cmd,
            "pump_speed_command_pct": 100.0 * self._n_cmd,
            "heartbeat": float(self._hb),
            "supply_temp_setpoint_c": self._sp,
            "local_control": 1.0 if self._local else 0.0,
        }

    def truth(self) -> CduTruth:
        """The true state (see `CduTruth`); rack figures are totals (powers, counts) or the
        mixed value (outlet temperature) over the CDU's racks, ``gpu_tj_c`` lists every rack's
        trays in rack order."""
        racks = self._racks
        rack = racks[0]
        if len(racks) == 1:
            tjs = rack.gpu_tj_c
            n_slow = rack.throttled_trays
            n_off = rack.shutdown_trays
            p_it = rack.power_w
            p_dem = rack.demand_w
            liq = rack.liquid_kw
            t_out = rack.t_out_c
            events = rack.throttle_events
        else:
            tjs = tuple(t for r in racks for t in r.gpu_tj_c)
            n_slow = sum(r.throttled_trays for r in racks)
            n_off = sum(r.shutdown_trays for r in racks)
            p_it = sum(r.power_w for r in racks)
            p_dem = sum(r.demand_w for r in racks)
            liq = sum(r.liquid_kw for r in racks)
            t_out = sum(r.t_out_c for r in racks) * self._q_share
            events = sum(r.throttle_events for r in racks)
        hottest = max(tjs)
        q = self._q
        return CduTruth(
            time_s=self._t,
            supply_temp_c=self._t_ss,
            return_temp_c=self._ret[-1],
            rack_inlet_temp_c=self._sup[-1],
            rack_outlet_temp_c=t_out,
            facility_supply_temp_c=self._t_fws,
            flow_lps=q,
            flow_lpm=q * 60.0,
            facility_flow_lps=self._qp,
            valve_position_pct=100.0 * self._x,
            valve_command_pct=100.0 * self._x_cmd,
            diff_pressure_kpa=self._k_sys * q * q,
            loop_pressure_kpa=self._p_loop,
            q_hx_kw=self._q_hx,
            rack_power_w=p_it,
            rack_power_demand_w=p_dem,
            air_heat_kw=p_it * 0.001 - liq,
            gpu_tj_c=tjs,
            hottest_gpu_tj_c=hottest,
            t_limit_margin_c=rack.params.gpu_max_operating_temp_c - hottest,
            hw_slowdown=n_slow > 0,
            gpu_shutdown=n_off > 0,
            throttled_trays=n_slow,
            shutdown_trays=n_off,
            throttle_events=events,
            pumps=tuple(
                PumpState(
                    speed_pct=100.0 * n,
                    running=((i == self._duty or i == self._handover_from) and not tr
                             and n > 0.0),
                    tripped=tr,
                    duty=i == self._duty,
                )
                for i, (n, tr) in enumerate(zip(self._n, self._tripped, strict=True))
            ),
            duty_pump=self._duty,
            pump_power_w=1000.0 * self._pump_p0_kw * sum(n * n * n for n in self._n),
            local_control=self._local,
            inventory_l=self._v_inv,
            stored_energy_kj=self.stored_energy_kj(),
            it_liquid_energy_kj=self._ce_liq,
            air_energy_kj=self._ce_air,
            hx_energy_kj=self._ce_hx,
            pump_energy_kj=self._ce_pump,
            valve_b_position_pct=100.0 * self._x_b,
            valve_b_command_pct=100.0 * self._x_b_cmd,
            rack_isolation_open_pct=100.0 * self._iso,
            reservoir_level_pct=self._level_pct(),
            filter_diff_pressure_kpa=self._filter_dp_kpa(q),
            pump_run_hours_h=tuple(self._run_h),
        )

    # --- fault hooks -----------------------------------------------------------------------

    def _pump_index(self, pump: int) -> int:
        if not (isinstance(pump, int) and 0 <= pump < self._n_pumps):
            raise ValueError(f"pump index {pump!r} outside 0..{self._n_pumps - 1}")
        return pump

    def trip_pump(self, pump: int) -> None:
        """Trip pump ``pump`` (0 = A): it coasts down with τ_coast (REFERENCE §4.2 item 2).

        Raises:
            ValueError: no such pump.
        """
        self._tripped[self._pump_index(pump)] = True

    def reset_pump(self, pump: int) -> None:
        """Clear a trip: the pump runs again (ramping) if it is the duty pump."""
        self._tripped[self._pump_index(pump)] = False

    def set_duty_pump(self, pump: int) -> None:
        """Make ``pump`` the duty pump: it ramps to the speed command; a healthy old duty pump
        keeps running until the new one is within 1 % of the command, then ramps to stop (the
        CDU's own changeover sequence [U]: a planned rotation without a flow dip); a tripped
        one keeps coasting. The register ``duty_pump_select`` does the same.

        Raises:
            ValueError: no such pump.
        """
        new = self._pump_index(pump)
        old = self._duty
        if new != old:
            self._handover_from = None if self._tripped[old] else old
        self._duty = new

    def set_leak_sensor_inputs(self, rope_leak: bool, rope_sensor_fault: bool) -> None:
        """The CDU's rope (drip-tray) leak sensor as the CDU reads it (wet, faulted): the
        leak model lives in `sims.rack.LeakSensors`; `sims.scenario.ScenarioRun` copies its
        rope sensor here every step, so the CDU's registers carry it."""
        self._rope_leak = bool(rope_leak)
        self._rope_fault = bool(rope_sensor_fault)

    def set_filter_fouling(self, factor: float) -> None:
        """Filter ΔP × ``factor`` (1 = clean). Raises ValueError for factor not >= 1 finite."""
        if not (math.isfinite(factor) and factor >= 1.0):
            raise ValueError("filter fouling factor must be finite and >= 1")
        self._filter_foul = float(factor)

    @property
    def rack_isolation_open_pct(self) -> float:
        """Rack liquid isolation valves' opening, % (100 = open)."""
        return 100.0 * self._iso

    def set_valve_stuck(self, stuck: bool = True) -> None:
        """Freeze the valve at its current position (REFERENCE §4.2 item 1, `stuck`)."""
        self._valve_stuck = stuck

    def set_valve_feedback_offset_pct(self, offset_pct: float) -> None:
        """Feedback reads position + ``offset_pct`` (REFERENCE §4.2 item 1, `offset`)."""
        if not math.isfinite(offset_pct):
            raise ValueError("offset_pct must be finite")
        self._valve_offset = offset_pct

    def set_valve_slow_factor(self, factor: float) -> None:
        """Stroke time × ``factor`` (REFERENCE §4.2 item 1, `slow`); 1 = healthy.

        Raises:
            ValueError: factor not > 0.
        """
        if not (factor > 0.0 and math.isfinite(factor)):
            raise ValueError("valve slow factor must be > 0")
        self._valve_slow = factor
        self._valve_rate = 1.0 / (self._p.valve_stroke_time_s * factor)

    def set_sensor_fault(
        self,
        point: str,
        mode: SensorFault | str,
        *,
        magnitude: float = 0.0,
        rate_per_s: float = 0.0,
        duration_s: float | None = None,
    ) -> None:
        """Put the transmitter behind ``point`` in a fault mode (see `Sensor.set_fault`).

        Raises:
            KeyError: ``point`` has no simulated transmitter.
            ValueError: bad mode or parameters.
        """
        self._sensors[point].set_fault(
            mode, magnitude=magnitude, rate_per_s=rate_per_s, duration_s=duration_s
        )

    def clear_sensor_fault(self, point: str) -> None:
        """Heal the transmitter behind ``point``. Raises KeyError for an unknown point."""
        self._sensors[point].clear_fault()

    def set_leak_lpm(self, leak_lpm: float) -> None:
        """Lose coolant at ``leak_lpm`` L/min (inventory and static pressure fall).

        Raises:
            ValueError: negative or non-finite rate.
        """
        if not (leak_lpm >= 0.0 and math.isfinite(leak_lpm)):
            raise ValueError("leak_lpm must be finite and >= 0")
        self._leak_lps = leak_lpm / 60.0

    def restart_controller(self) -> None:
        """The CDU controller reboots: uptime restarts at 0 and it runs local control until
        the heartbeat changes again."""
        self._boot_t = self._t
        if not self._local:
            self._enter_local()

    def reset_gpus(self) -> None:
        """Power shut-down GPUs back on and clear throttling (operator action), every rack."""
        for r in self._racks:
            r.reset_gpus()
