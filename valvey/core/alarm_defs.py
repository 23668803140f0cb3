"""Every alarm valvey's core raises (docs/RUNBOOK.md has one entry per id). Pure: no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rackplane.core.alarms import AlarmDef
from rackplane.core.names import ALARM_SUBJECT_SEPARATOR, alarm_id
from valvey.config import ValveyConfig
from valvey.core.supply_loop_settings import default_alarm_defs

__all__ = ["alarm_defs"]


def alarm_defs(cfg: ValveyConfig, pump_names: list[str], valve_names: list[str],
               sensor_points: list[str], implausible: Mapping[str, str] | None = None
               ) -> list[AlarmDef]:
    """Every alarm valvey raises (docs/RUNBOOK.md has one entry per id); ``implausible``:
    alarm id -> input name of the per-input plausibility alarms
    (`valvey.core.inputs.InputGate.alarm_ids`)."""
    def d(aid: str, severity: str, message: str, **kw: Any) -> AlarmDef:
        return AlarmDef(id=aid, severity=severity, message=message,
                        runbook=f"valvey.{aid.split(ALARM_SUBJECT_SEPARATOR)[0]}", **kw)

    out = list(default_alarm_defs())
    for p in sensor_points:
        out.append(d(alarm_id("supply_sensor_fault", p), "major",
                     f"Supply sensor {p} dropped from the vote (bad, frozen, disagreeing or "
                     "drifting)", latch=True))
    for aid, name in (implausible or {}).items():
        out.append(AlarmDef(
            id=aid, severity="major", runbook="valvey.input_implausible",
            message=f"Input {name} is outside its plausibility window (unit or scale error, "
            "failing sensor): not believed, its functions fall back to their safe side"))
    out += [
        d("feedforward_source_lost", "minor",
          "Feedforward's primary source (feedforward.source) is stale (a row CDU: any rack "
          "of feedforward.racks, named in state feedforward.missing_racks): feedforward on "
          "the CDU's heat figure or off",
          on_delay_s=10.0),
        d("dew_point_floor_active", "warning",
          "Supply setpoint raised to dew point + margin (condensation risk)"),
        d("room_sensors_stale", "warning", "Room temperature/humidity readings stale",
          on_delay_s=10.0),
        d("cdu_local_control", "major",
          "CDU runs its own local control (it lost valvey's heartbeat)", on_delay_s=2.0),
    ]
    for n in pump_names:
        out.append(d(f"pump_{n}_fault", "major", f"Pump {n.upper()} failed or faulted",
                     latch=True))
    out += [
        d("pump_failover", "major", "Duty pump failed: the standby took over", latch=True),
        d("pump_redundancy_lost", "major", "Fewer than two healthy pumps (N+1 lost)"),
        d("pump_no_standby", "critical", "Duty pump failed and no standby is available"),
        d("pump_loop_failsafe", "critical",
          "Pump speed loop in fail-safe: its measurement is lost", latch=True),
        d("pump_loop_pv_invalid", "major", "Differential pressure / flow measurement invalid",
          on_delay_s=2.0),
        d("loop_pressure_high", "warning",
          "Maximum-pressure override limits the pump speed", on_delay_s=5.0),
    ]
    for n in valve_names:
        out.append(d(f"valve_{n}_fault", "critical",
                     f"Facility valve {n.upper()} does not follow its command (stuck)",
                     latch=True))
    for n in valve_names:  # one runbook entry for every valve
        out.append(AlarmDef(
            id=alarm_id("valve_actuator_slow", n), severity="warning",
            message=f"Facility valve {n.upper()} moves, but slower than its rated stroke "
            "(valves.stroke_time_s × slow_ratio): the learned stroke is used",
            runbook="valvey.valve_actuator_slow"))
    out += [
        d("valve_failover", "major", "Control moved to the second facility valve"),
        d("valve_no_spare", "critical",
          "Facility valve failed and no second valve can take over: rack capped"),
        d("valve_hunting", "warning",
          "Facility valve active more than 20 % of the time over the last hour "
          "(REFERENCE §1.5)", on_delay_s=300.0),
        d("leak_tray", "critical", "Leak sensor wet on a compute tray: tray powered down"),
        d("leak_rack", "critical",
          "Rack-level leak (several trays, drip pan or CDU rope): rack powered down and "
          "isolated", latch=True),
        d("rack_isolated", "critical", "Rack liquid isolation valves closed", latch=True),
        d("leak_sensor_fault", "major", "Leak sensor fault (open wire): no isolation on it"),
        d("leak_sensor_unavailable", "major", "Leak sensor readings stale or missing",
          on_delay_s=10.0),
        d("supply_temp_high_interlock", "critical",
          "Over-temperature interlock: valves forced open, rack capped", latch=True),
        d("flow_low_interlock", "critical", "Coolant flow below 50 % of design: rack capped"),
        d("no_flow_power_down", "critical", "No coolant flow: rack power-down requested",
          latch=True),
        d("flow_low", "warning", "Coolant flow below 90 % of design for 100 s (Vertiv)"),
        d("supply_temp_rising", "major",
          "Supply temperature rising > 0.2 K/s for 5 s: loss of heat rejection?"),
        d("coolant_inventory_loss", "major", "Reservoir level falling: coolant leaving the loop",
          on_delay_s=30.0),
        d("reservoir_level_low", "major", "Reservoir level low", on_delay_s=10.0),
        d("filter_dp_high", "warning", "Filter differential pressure high (dirty filter)",
          on_delay_s=60.0),
        d("rack_power_capped", "major", "valvey asked racky to cap the rack (cooling limited)"),
        d("racky_request_unanswered", "major", "A request to racky is not acknowledged"),
    ]
    return out
