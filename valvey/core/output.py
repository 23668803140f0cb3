"""What one tick of valvey's core returns (`CoreOutput`), with the numeric codes its
telemetry writes and the dew point the selector uses. Pure: no I/O."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from rackplane.core.alarms import AlarmEvent
from valvey.core.capacity import CapacityStep
from valvey.core.pumps import PumpStep
from valvey.core.requests import RackyRequest
from valvey.core.supply_loop_settings import LoopStep

__all__ = ["PUMP_CONSTRAINT_CODES", "VALVE_CONSTRAINT_CODES", "CoreOutput", "dew_point_c",
           "floor_dew_point_c"]

#: Numeric codes of the winning constraint (time series: string fields do not survive every
#: store, DESIGN §3).
VALVE_CONSTRAINT_CODES = {"supply_temp": 0.0, "dew_point_floor": 1.0, "interlock": 2.0,
                          "failsafe": 3.0, "manual": 4.0, "step_test": 5.0,
                          "initialising": 6.0, "isolated": 7.0}
PUMP_CONSTRAINT_CODES = {"diff_pressure": 0.0, "flow": 0.0, "max_pressure": 1.0,
                         "min_speed": 2.0, "max_speed": 3.0, "handoff": 4.0, "isolated": 5.0,
                         "failsafe": 6.0, "manual": 7.0, "initialising": 8.0}


def dew_point_c(temp_c: float, rh_pct: float) -> float:
    """Dew point [°C]: Magnus form, Alduchov & Eskridge (1996) coefficients (a = 17.625,
    b = 243.04 °C), as the simulator's room model (docs/SIMULATORS.md).

    Raises:
        ValueError: RH outside (0, 100] or temperature outside −45…60 °C.
    """
    if not (0.0 < rh_pct <= 100.0) or not (-45.0 <= temp_c <= 60.0):
        raise ValueError(f"no dew point for {temp_c} °C / {rh_pct} %RH")
    g = math.log(rh_pct / 100.0) + 17.625 * temp_c / (243.04 + temp_c)
    return 243.04 * g / (17.625 - g)


def floor_dew_point_c(temp_c: float | None, rh_pct: float | None,
                      last_valid_temp_c: float | None, fallback_c: float | None
                      ) -> float | None:
    """The dew point the dew-point floor uses [°C], never "no constraint" once anything is
    known (issue 14). ``temp_c`` / ``rh_pct``: the room readings when valid (fresh and inside
    their plausibility windows), else None.

    * both valid: the dew point of the room air (`dew_point_c`);
    * otherwise ``fallback_c`` when configured (a conservative site value);
    * otherwise the air is assumed saturated at the room temperature: the valid one now, else
      ``last_valid_temp_c`` (dew point = that temperature, the highest it can be);
    * None only while no room temperature was ever valid and no fallback is configured.
    """
    if temp_c is not None and rh_pct is not None:
        try:
            return dew_point_c(temp_c, min(100.0, rh_pct))
        except ValueError:
            pass  # outside the formula's range: judged as invalid below
    if fallback_c is not None:
        return fallback_c
    if temp_c is not None and -45.0 <= temp_c <= 60.0:
        return temp_c
    return last_valid_temp_c


@dataclass(frozen=True, slots=True)
class CoreOutput:
    """Result of one tick.

    Attributes:
        writes: ``(point, value)`` pairs to write to the CDU now, in order.
        loop: the supply loop's decision.
        alarm_events: alarm changes in this tick (log, publish, write each once).
        requests: requests to send to racky now (`valvey.core.requests.RackyRequest`).
        events: events to publish (leak tiers, failovers), JSON-ready.
        transitions: state changes of the whole core in this tick (log each once).
        pump: the pump manager's decision (its speed command [%], duty pump index, winning
            constraint); None only in outputs built outside `ValveyCore.step`.
        pump_setpoint: the pump loop's operator setpoint (kPa or L/min, by its mode).
        cap: the capacity guard's last decision (the rack power cap [W] and capacity
            estimate [W]); None before its first run (once a second).
        dew_point_c: the room dew point the selector last used [°C] (None: never known).
        ff_pct: the dynamic feedforward's last term [%].
        valve_constraint: what set the facility valve in this tick (a key of
            `VALVE_CONSTRAINT_CODES`).
        valve_active_index: index of the facility valve in control (0: A, 1: B).
        leak_isolation: the rack isolation sequence: open | pending | closing | closed.
        output_reasserts: valve writes repeated because the read-back disagreed (count).
    """

    writes: list[tuple[str, float]]
    loop: LoopStep
    alarm_events: list[AlarmEvent] = field(default_factory=list)
    requests: list[RackyRequest] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    transitions: tuple[str, ...] = ()
    pump: PumpStep | None = None
    pump_setpoint: float | None = None
    cap: CapacityStep | None = None
    dew_point_c: float | None = None
    ff_pct: float = 0.0
    valve_constraint: str = "initialising"
    valve_active_index: int = 0
    leak_isolation: str = "open"
    output_reasserts: int = 0
