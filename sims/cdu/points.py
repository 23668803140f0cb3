"""The CDU's register points: what `CduPlant.readings` returns and what `CduPlant.write`
accepts (config/registers/cdu-generic.toml)."""

from __future__ import annotations

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
    "controller_stale_writes",
    "controller_epoch",
)

#: Pumps the register map names (index i -> ``pump_<letter>_*`` points); a plant with fewer
#: pumps reads 0 for the missing ones.
PUMP_LETTERS: tuple[str, ...] = ("a", "b")

#: Writable points and their (write_min, write_max), as in config/registers/cdu-generic.toml.
WRITABLE_POINTS: dict[str, tuple[float, float]] = {
    "valve_command_pct": (0.0, 100.0),
    "pump_speed_command_pct": (15.0, 100.0),
    "heartbeat": (0.0, 65535.0),
    "supply_temp_setpoint_c": (20.0, 60.0),
    "duty_pump_select": (0.0, 1.0),
    "valve_b_command_pct": (0.0, 100.0),
    "rack_isolation_command": (0.0, 1.0),
    # a claim of the controller epoch (sims.cdu.fence): the map bounds what the daemons write
    # to 2**53 (floats); `CduPlant.write` itself takes any epoch in 1..2**64-1
    "controller_epoch": (1.0, float(2**53)),
}
