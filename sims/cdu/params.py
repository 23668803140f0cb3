"""Parameters of the CDU plant: `RackParams` (one rack) and `CduParams` (the CDU, its loop,
sensors and local control), REFERENCE §4.3."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from rackplane.config import StrictModel
from sims.sensors import SensorParams


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


ROW_SCALED_FIELDS = ("design_flow_lps", "max_flow_lps", "hx_ua_kw_per_k",
                     "facility_max_flow_lps", "pump_power_full_speed_w")
"""`CduParams` fields that are the whole CDU's and scale with the power it serves: rack
power (`CduParams.for_rack_power`) and the number of racks of a row CDU (`sims.row.VirtualRow`,
the ``racks_N`` plant variants of `sims.cdu.variants`); volumes and time constants stay."""


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
    valve_backlash_pct: float = _f(
        0.0,
        "dead zone between actuator and plug, % of stroke: after a reversal the actuator "
        "travels this far before the plug follows (plant-family variant, issue 21 [U])",
        ge=0.0,
        le=20.0,
    )
    valve_stiction_pct: float = _f(
        0.0,
        "stick band, % of stroke: a resting actuator starts only when its demand is more "
        "than this away, then travels to the demand and sticks again (issue 21 [U])",
        ge=0.0,
        le=20.0,
    )
    facility_flow_available_fraction: float = _f(
        1.0,
        "facility water the building delivers, share of Qp_max: < 1 is flow starvation "
        "(low differential pressure at the CDU); the HX's UA reference flow stays "
        "(issue 21 [U])",
        gt=0.0,
        le=1.0,
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
    supply_sensor_tau_s: float | None = _f(
        None,
        "lag of supply sensors A, B, C, s (e.g. a deep thermowell); None: temp_sensor.tau_s",
        ge=0.0,
        le=600.0,
    )
    supply_sensor_pink_noise_k: float = _f(
        0.0,
        "σ of a 1/f (pink) noise added to each supply sensor (A, B, C independently), K: "
        "four first-order processes with τ 0.3/3/30/300 s of equal variance [U]",
        ge=0.0,
        le=5.0,
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
            **{f: data[f] * k for f in ROW_SCALED_FIELDS},
        )
        data.update(overrides)
        return cls.model_validate(data)
