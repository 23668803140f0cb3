"""valvey's retained state payloads (``valvey/state/<thing>``): one model per thing, the
schemas ``rackctl schemas --write`` generates (``rackplane/schemas/valvey.state.*``) and
`valvey.commands.valvey_contract` names. The payloads themselves are built by
`valvey.core.controller.ValveyCore.states` and the daemon (``health``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

__all__ = ["VALVEY_STATES", "HealthState", "PumpsState", "SafetyState", "SupplyLoopState",
           "ValvesState"]


class SupplyLoopState(BaseModel):
    """``valvey/state/supply_loop`` (retained, every ``control.state_interval_s``): the supply
    temperature loop (`ValveyCore.state`). Temperatures °C, outputs %, PID terms % of output."""

    mode: Literal["initialising", "auto", "manual", "failsafe", "shadow"] = Field(
        description="effective mode (shadow whenever shadow is on)")
    control_mode: Literal["initialising", "auto", "manual", "failsafe"]
    setpoint_c: float = Field(description="the operator's setpoint (command or config)")
    effective_setpoint_c: float = Field(description="what the PID regulates to now (ramp, "
                                        "dew-point floor)")
    constraint: str = Field(description="which limit sets the valve now (selector winner)")
    supply_temp_c: float | None = Field(description="voted supply temperature; null: no "
                                        "usable measurement")
    capacity_w_per_k: float | None = Field(
        description="the exchanger as measured: rack power (W) the cooling holds per K of "
        "approach (setpoint − facility water) with the valve open (valvey.core.capacity); "
        "racky's facility-water derate uses it in place of its nominal table; null until the "
        "valve has been open long enough to measure it (unless one an earlier run measured is "
        "restored from the state file, valvey.persist)")
    capacity_w_per_k_source: Literal["restored", "measured"] | None = Field(
        None, description="where capacity_w_per_k's valve-open conductance comes from: "
        "'restored' (measured by an earlier run, from the state file, not yet re-confirmed: "
        "this run has measured it for less than 10 s with the valve open), 'measured' (this "
        "run; also when this run's first valve-open sample was more than 3 % off the restored "
        "one and replaced it); null: not measured")
    pv_status: str
    pv_age_s: float | None
    valve_command_pct: float | None = Field(description="null before initialisation")
    valve_active: str
    p_term_pct: float | None
    i_term_pct: float | None
    d_term_pct: float | None
    ff_term_pct: float | None
    feedforward: dict[str, Any]
    dew_point_c: float | None
    supply_sensors: dict[str, Any]
    supply_estimate_c: float | None
    bad_periods: int
    readback_mismatch: bool
    output_reasserts: int
    step_test: dict[str, Any]
    commissioning: dict[str, Any] = Field(
        description="auto-commissioning (valvey.core.commissioning): phase, error, "
        "acceptable, proposal (model K/τ/θ and fit quality, PI gains, feedforward gain and map, "
        "valve strokes), accepted gains")
    alarms: list[str] = Field(description="active alarm ids")
    valve_position_pct: float | None = Field(
        None, description="valve position read back (the daemon adds it); null: unknown")
    ts_ns: int | None = Field(None, description="wall-clock publish time, ns")


class PumpsState(BaseModel):
    """``valvey/state/pumps`` (retained): the pump loop (DP or flow) and each pump."""

    mode: str = Field(description="auto | manual | failsafe | ... of the pump speed loop")
    control: Literal["diff_pressure", "flow"]
    setpoint: float = Field(description="kPa (diff_pressure) or L/min (flow)")
    setpoint_ramped: float
    speed_command_pct: float | None
    constraint: str
    duty: str = Field(description="the duty (lead) pump's name")
    handoff: bool
    no_standby: bool
    isolated: bool
    flow_reference_lpm: float | None
    dp_reference_kpa: float | None
    units: list[dict[str, Any]] = Field(description="per pump: name, duty, running, fault, "
                                        "speed, run hours")
    ts_ns: int | None = None


class ValvesState(BaseModel):
    """``valvey/state/valves`` (retained): the facility valves (active one, failover)."""

    active: str
    second_valve: bool
    units: list[dict[str, Any]] = Field(description="per valve: name, active, command_pct, "
                                        "position_pct, expected_pct, mismatch_pct, failed, "
                                        "stroke_time_s (learned, else configured), "
                                        "stroke_learned, rest_offset_pct, rest_band_pct "
                                        "(learned feedback − command at rest and its "
                                        "scatter)")
    ts_ns: int | None = None


class SafetyState(BaseModel):
    """``valvey/state/safety`` (retained): leaks, isolation, interlocks, the rack power cap
    valvey asked racky for, requests to racky and every actuator's owner. In shadow mode it
    also carries ``shadow_would_write`` / ``shadow_would_request``."""

    trays_powered_down: list[Any]
    rack_leak: Any = Field(description="null: no rack leak")
    isolation: str = Field(description="open | closing | closed | ...")
    over_temperature: bool
    no_flow: bool
    cap_w: float | None = Field(description="rack power cap requested from racky, W")
    cap_reasons: list[str]
    capacity_estimate_w: float | None = Field(description="cooling capacity estimate, W "
                                              "(rounded to 100 W)")
    liquid_fraction: float | None = Field(
        None, description="share of the rack power reaching the liquid that the capacity "
        "estimate uses, 0–1: learned (heat removed / rack power at steady state) or the "
        "configured capacity.liquid_fraction until then (valvey.core.liquid_fraction)")
    liquid_fraction_learned: bool = Field(False, description="liquid_fraction is learned "
                                          "(this run, or restored from the state file)")
    liquid_fraction_source: Literal["configured", "restored", "learned"] = Field(
        "configured", description="where liquid_fraction comes from: the configured fallback, "
        "'restored' (learned by an earlier run, from the state file (valvey.persist), not yet "
        "re-confirmed: this run has averaged in fewer steady ratios than make a cold start's "
        "value learned), or 'learned' (this run)")
    requests: dict[str, Any]
    actuators: list[dict[str, Any]]
    shadow_would_write: list[list[Any]] | None = None
    shadow_would_request: list[dict[str, Any]] | None = None
    ts_ns: int | None = None


class HealthState(BaseModel):
    """``valvey/state/health`` (retained): the daemon's own health; ``self`` holds the
    self-metrics (`rackplane.selfmetrics.SelfMetricsSnapshot` fields; empty before the first
    refresh)."""

    uptime_s: float
    tick_late_last_s: float
    tick_late_max_s: float
    tick_overruns: int
    cdu: dict[str, Any] = Field(description="Modbus link stats of the CDU")
    mqtt_subscribed: list[str]
    mqtt_configured: list[str]
    mqtt_reconnects: int
    commands: dict[str, Any] = Field(description="received, applied, refused by code, "
                                     "duplicates")
    output_writes_ok: int
    output_writes_failed: int
    self: dict[str, Any] = Field(description="self-metrics (OPERATIONS.md)")
    spool: dict[str, Any] = Field(description="directory, spooled/sent/depth/rejected/"
                                  "dropped lines, last_error")
    pair: dict[str, Any] | None = Field(
        None, description="one instance of a redundant pair only (issue 15): what "
        "state/pair_<instance> holds (instance, role, epoch, lease, withheld writes, epoch "
        "claims); absent for a single instance")


VALVEY_STATES: dict[str, type[BaseModel]] = {
    "supply_loop": SupplyLoopState,
    "pumps": PumpsState,
    "valves": ValvesState,
    "safety": SafetyState,
    "health": HealthState,
}
"""``state/<thing>`` -> payload model (``state/leases``: `rackplane.commands.LeasesState`)."""
