"""What the CDU plant hands out besides its registers: `CduTruth` (the unsensed state),
`PumpState`, `WarmStartResult`."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, NamedTuple


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
