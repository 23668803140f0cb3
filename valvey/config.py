"""valvey's configuration: one TOML file, validated at load (DESIGN §3 Config).

``valvey --check-config FILE`` validates it; with no file valvey runs on the embedded defaults
below (the CDU simulator on 127.0.0.1:5020, a broker on 127.0.0.1:1883, no database: the spool
is the embedded store). See config/valvey.example.toml for every key with its default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from rackplane.config import StrictModel
from rackplane.core.registers import RegisterMap
from rackplane.errors import ConfigError
from rackplane.settings import (
    CommandSettings,
    DaemonSettings,
    ModbusTargetSettings,
    SpoolSettings,
)
from valvey.core.capacity import CapacitySettings
from valvey.core.feedforward import FeedforwardSettings
from valvey.core.pump_settings import PumpLoopSettings, PumpSettings
from valvey.core.safety import SafetySettings
from valvey.core.sensors import SensorMap, SupplySensorSettings
from valvey.core.step_test import StepTestSettings
from valvey.core.supply_loop_settings import TICK_S, SupplyLoopSettings
from valvey.core.valves import ValveSettings

__all__ = [
    "CduPoints",
    "CduTarget",
    "ControlSettings",
    "RackySettings",
    "SelectorSettings",
    "ValveyConfig",
    "check_points_against_map",
]


class CduPoints(StrictModel):
    """Which register-map points valvey uses for what (names in the CDU's register map).
    Optional points set to None are not used (the function needing them is then off)."""

    supply_temp: str = Field("supply_temp_c", description="process variable of the loop, °C "
                             "(sensor A; supply_sensors.redundant are voted with it)")
    valve_command: str = Field("valve_command_pct", description="facility valve demand, %")
    valve_position: str | None = Field(
        "valve_position_pct", description="valve position feedback, % (bumpless start fallback)"
    )
    heartbeat: str | None = Field(
        "heartbeat",
        description="heartbeat register the CDU watches to fall back to local "
        "control when valvey is gone; None disables the heartbeat",
    )
    return_temp: str | None = Field("return_temp_c", description="secondary return, °C")
    flow: str | None = Field("flow_lpm", description="secondary flow, L/min")
    diff_pressure: str | None = Field("diff_pressure_kpa", description="secondary DP, kPa")
    loop_pressure: str | None = Field("loop_pressure_kpa", description="static pressure, kPa")
    heat_removed: str | None = Field("heat_removed_kw", description="HX duty, kW")
    facility_supply_temp: str | None = Field("facility_supply_temp_c", description="°C")
    local_control: str | None = Field(
        "local_control", description="1 while the CDU runs its own control (heartbeat lost)"
    )


class SelectorSettings(StrictModel):
    """The min/max selector's constraints on the supply loop (REFERENCE §8): the dew-point
    floor (supply ≥ dew point + margin, from the room sensors over MQTT). The pump loop's
    maximum-pressure override is ``pump_loop.max_pressure_kpa``."""

    dew_point_floor: bool = Field(True, description="raise the setpoint to dew point + margin")
    dew_point_margin_k: float = Field(3.0, ge=0, le=20, description="REFERENCE §8: 2–3 °C")
    room_temp: str = Field("room_temp_c", description="MQTT sensor name")
    room_rh: str = Field("room_rh_pct", description="MQTT sensor name")
    fallback_dew_point_c: float | None = Field(
        None, description="dew point assumed while the room sensors are stale (None: the last "
        "good one is kept)"
    )


class RackySettings(StrictModel):
    """Requests to racky (docs/CONTRACTS.md: racky/cmd/valvey/<verb>)."""

    daemon: str = Field("racky", description="racky's topic level")
    user: str | None = Field(
        None, description="the <user> level of valvey's requests; default mqtt.username, "
        "else 'valvey' (racky maps it to the automation role)"
    )
    retry_s: float = Field(2.0, gt=0, le=60, description="resend without a reply")
    alarm_after_s: float = Field(
        5.0, gt=0, le=300, description="a safety request unanswered this long raises an alarm"
    )


class ControlSettings(StrictModel):
    """Timing of the control tick and of what it publishes."""

    tick_s: float = Field(
        TICK_S,
        description="control tick (10 Hz: pump, safety logic, fast fault detection; "
        "DESIGN §3). The supply loop runs at its own period_s, a multiple of it",
    )
    heartbeat_interval_s: float = Field(1.0, gt=0, le=60)
    state_interval_s: float = Field(1.0, gt=0, le=60, description="retained MQTT state")
    telemetry_interval_s: float = Field(1.0, gt=0, le=3600, description="CDU points to the TSDB")
    write_timeout_s: float = Field(2.0, gt=0, le=30, description="bound on each output write")
    readback_confirm_s: float = Field(
        3.0, gt=0, le=60, description="a written output whose read-back still differs after "
        "this long is written again (a write lost in an outage, or overridden by the CDU's "
        "local control) and counted"
    )
    readback_tolerance_pct: float = Field(
        0.25, gt=0, le=5, description="read-back within this of the written value counts as "
        "applied (register resolution 0.1 %)"
    )
    stop_budget_s: float = Field(
        3.0, gt=0, le=30, description="time allowed at shutdown for the stop writes"
    )
    state_file: Path | None = Field(
        None, description="versioned state file keeping the setpoint and loop mode set by "
        "command across a restart (valvey.persist); None: valvey-state-<rack>.json beside the "
        "spool folder ($STATE_DIRECTORY under systemd); relative: in $STATE_DIRECTORY or the "
        "working directory"
    )

    @model_validator(mode="after")
    def _tick(self) -> ControlSettings:
        if abs(self.tick_s - TICK_S) > 1e-9:
            raise ValueError(f"tick_s is fixed at {TICK_S} s in this version")
        return self


class CduTarget(ModbusTargetSettings):
    """The CDU's Modbus target, with valvey's defaults (the simulator's port 5020, 10 Hz poll)."""

    name: str = "cdu"
    port: int = Field(5020, ge=1, le=65535)
    register_map: Path = Field(
        Path("cdu-generic"), description="register-map TOML, or a bundled map's name"
    )
    poll_interval_s: float = Field(0.1, gt=0, le=3600, description="10 Hz, like the tick")
    reconnect_max_s: float = Field(
        2.0, gt=0, description="reconnect backoff cap: well below the CDU's heartbeat timeout "
        "(10 s in the simulator), so control resumes before the CDU falls back to local"
    )
    serial_port: str | None = Field(
        None, description="Modbus RTU over a serial line (RS-485), e.g. /dev/ttyUSB0: host and "
        "port are then unused and framer must be 'rtu'; None: TCP (framer 'rtu' = RTU over a "
        "TCP gateway)"
    )
    baudrate: int = Field(19200, ge=1200, le=921600, description="serial line only")
    parity: Literal["N", "E", "O"] = Field("E", description="serial line only")
    bytesize: Literal[7, 8] = Field(8, description="serial line only")
    stopbits: Literal[1, 2] = Field(1, description="serial line only")

    @model_validator(mode="after")
    def _serial_is_rtu(self) -> CduTarget:
        if self.serial_port is not None and self.framer != "rtu":
            raise ValueError("cdu.serial_port needs framer = 'rtu' (a serial line speaks RTU)")
        return self
    timeout_s: float = Field(0.5, gt=0, le=60)
    max_gap_registers: int = Field(
        2,
        ge=0,
        le=64,
        description="the bundled map leaves input registers 16-19 "
        "unimplemented: never merge a read across them (BR-05)",
    )


class ValveyConfig(DaemonSettings):
    """The whole valvey config file."""

    spool: SpoolSettings = Field(
        default_factory=lambda: SpoolSettings(),
        description="spool directory: default $STATE_DIRECTORY/spool under systemd, else ./spool",
    )
    cdu: CduTarget = CduTarget()
    points: CduPoints = CduPoints()
    supply_loop: SupplyLoopSettings = SupplyLoopSettings()
    supply_sensors: SupplySensorSettings = SupplySensorSettings()
    feedforward: FeedforwardSettings = FeedforwardSettings()
    selector: SelectorSettings = SelectorSettings()
    pump_loop: PumpLoopSettings = PumpLoopSettings()
    pumps: PumpSettings = PumpSettings()
    valves: ValveSettings = ValveSettings()
    safety: SafetySettings = SafetySettings()
    capacity: CapacitySettings = CapacitySettings()
    racky: RackySettings = RackySettings()
    sensors: SensorMap = Field(
        default_factory=SensorMap,
        description="sensors read over MQTT (room air, leak sensors, rack power); the "
        "defaults are the simulator's topics and racky's state/rack_power",
    )
    step_test: StepTestSettings = StepTestSettings()
    control: ControlSettings = ControlSettings()
    commands: CommandSettings = Field(
        default_factory=lambda: CommandSettings(),
        description="command path: roles of broker users, command TTL, limits (DESIGN §3)",
    )

    @model_validator(mode="after")
    def _cross(self) -> ValveyConfig:
        if self.cdu.timeout_s >= self.supply_loop.stale_after_s:
            raise ValueError(
                "cdu.timeout_s must be shorter than supply_loop.stale_after_s, or a slow reply "
                "would count as fresh"
            )
        if self.cdu.poll_interval_s >= self.supply_loop.stale_after_s:
            raise ValueError("cdu.poll_interval_s must be shorter than supply_loop.stale_after_s")
        names = [t.name for t in self.sensors.topics()]
        if len(set(names)) != len(names):
            raise ValueError("sensors: names must be distinct")
        return self

    def sensor_names(self) -> set[str]:
        """Sample names the MQTT sensors produce (index lists as their base name)."""
        return {t.name for t in self.sensors.topics()}


def check_points_against_map(cfg: ValveyConfig, regmap: RegisterMap) -> None:
    """Check the configured points against the register map.

    Every point must exist; outputs must be writable; no two roles may share a point (a
    heartbeat aliased to the valve register would drive the valve with a counter); the
    heartbeat must be an integer register with scale 1 (it counts).

    Raises:
        ConfigError: naming the key path of each problem.
    """
    by_name = {p.name: p for p in regmap.points}
    problems = []
    pts, pu, sf = cfg.points, cfg.pumps, cfg.safety
    roles: dict[str, tuple[str | None, bool]] = {
        "points.supply_temp": (pts.supply_temp, False),
        "points.valve_command": (pts.valve_command, True),
        "points.valve_position": (pts.valve_position, False),
        "points.heartbeat": (pts.heartbeat, True),
        "points.return_temp": (pts.return_temp, False),
        "points.flow": (pts.flow, False),
        "points.diff_pressure": (pts.diff_pressure, False),
        "points.loop_pressure": (pts.loop_pressure, False),
        "points.heat_removed": (pts.heat_removed, False),
        "points.facility_supply_temp": (pts.facility_supply_temp, False),
        "points.local_control": (pts.local_control, False),
        "pumps.duty_select": (pu.duty_select, True),
        "pumps.speed_command": (pu.speed_command, True),
        "valves.second_command": (cfg.valves.second_command, True),
        "valves.second_position": (cfg.valves.second_position, False),
        "safety.isolation_command": (sf.isolation_command, True),
        "safety.isolation_closed": (sf.isolation_closed, False),
        "safety.reservoir_level": (sf.reservoir_level, False),
        "safety.filter_dp": (sf.filter_dp, False),
    }
    for i, r in enumerate(cfg.supply_sensors.redundant):
        roles[f"supply_sensors.redundant[{i}]"] = (r, False)
    for u in pu.units():
        for f in ("running", "fault", "speed", "run_hours"):
            roles[f"pumps.{f}_point ({u.name})"] = (getattr(u, f), False)
    seen: dict[str, str] = {}
    for key, (name, must_write) in roles.items():
        if name is None:
            continue
        spec = by_name.get(name)
        if spec is None:
            problems.append(f"{key}: point {name!r} is not in register map {cfg.cdu.register_map}")
            continue
        if must_write and not spec.writable:
            problems.append(f"{key}: point {name!r} is not writable in the register map")
        if name in seen:
            problems.append(f"{key}: point {name!r} is already used as {seen[name]}; each role "
                            "needs its own point")
        seen.setdefault(name, key)
    # Names that may come from the register map or from an MQTT sensor mapping.
    mqtt = cfg.sensor_names()
    either = {
        "safety.rope_leak": sf.rope_leak,
        "safety.rope_sensor_fault": sf.rope_sensor_fault,
        "safety.drip_pan_leak": sf.drip_pan_leak,
        "safety.drip_pan_sensor_fault": sf.drip_pan_sensor_fault,
        "safety.tray_leak": sf.tray_leak,
        "safety.tray_sensor_fault": sf.tray_sensor_fault,
        "safety.rack_power": sf.rack_power,
        "selector.room_temp": cfg.selector.room_temp if cfg.selector.dew_point_floor else None,
        "selector.room_rh": cfg.selector.room_rh if cfg.selector.dew_point_floor else None,
    }
    for key, name in either.items():
        if name is not None and name not in by_name and name not in mqtt:
            problems.append(f"{key}: {name!r} is neither a register-map point nor a name in "
                            "[[sensors]]")
    clash = sorted(mqtt & set(by_name))
    if clash:
        problems.append(f"sensors: names {clash} are also register-map points")
    hb = by_name.get(cfg.points.heartbeat or "")
    if hb is not None and (hb.type not in ("uint16", "int16", "uint32", "int32")
                           or hb.scale != 1.0 or hb.offset != 0.0):
        problems.append(f"points.heartbeat: point {hb.name!r} must be an integer register "
                        f"with scale 1 and offset 0 (it is {hb.type}, scale {hb.scale:g})")
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems), problems=problems)
