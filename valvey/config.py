"""valvey's configuration: one TOML file, validated at load (DESIGN §3 Config).

``valvey --check-config FILE`` validates it; with no file valvey runs on the embedded defaults
below (the CDU simulator on 127.0.0.1:5020, a broker on 127.0.0.1:1883, no database: the spool
is the embedded store). See config/valvey.example.toml for every key with its default.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from rackplane.config import StrictModel
from rackplane.errors import ConfigError
from rackplane.registers import RegisterMap
from rackplane.settings import (
    CommandSettings,
    Identity,
    LogSettings,
    ModbusTargetSettings,
    MqttSettings,
    SpoolSettings,
    TsdbSettings,
)
from valvey.supply_loop import TICK_S, SupplyLoopSettings


class CduPoints(StrictModel):
    """Which register-map points valvey uses for what (names in the CDU's register map)."""

    supply_temp: str = Field("supply_temp_c", description="process variable of the loop, °C")
    valve_command: str = Field("valve_command_pct", description="facility valve demand, %")
    valve_position: str | None = Field(
        "valve_position_pct", description="valve position feedback, % (bumpless start fallback)"
    )
    heartbeat: str | None = Field(
        "heartbeat",
        description="heartbeat register the CDU watches to fall back to local "
        "control when valvey is gone; None disables the heartbeat",
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
    timeout_s: float = Field(0.5, gt=0, le=60)
    max_gap_registers: int = Field(
        2,
        ge=0,
        le=64,
        description="the bundled map leaves input registers 16-19 "
        "unimplemented: never merge a read across them (BR-05)",
    )


class ValveyConfig(StrictModel):
    """The whole valvey config file."""

    identity: Identity = Identity()
    log: LogSettings = LogSettings()
    mqtt: MqttSettings = MqttSettings()
    tsdb: TsdbSettings = TsdbSettings()
    spool: SpoolSettings = Field(
        default_factory=lambda: SpoolSettings(),
        description="spool directory: default $STATE_DIRECTORY/spool under systemd, else ./spool",
    )
    cdu: CduTarget = CduTarget()
    points: CduPoints = CduPoints()
    supply_loop: SupplyLoopSettings = SupplyLoopSettings()
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
        return self


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
    roles = {
        "points.supply_temp": (cfg.points.supply_temp, False),
        "points.valve_command": (cfg.points.valve_command, True),
        "points.valve_position": (cfg.points.valve_position, False),
        "points.heartbeat": (cfg.points.heartbeat, True),
    }
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
    hb = by_name.get(cfg.points.heartbeat or "")
    if hb is not None and (hb.type not in ("uint16", "int16", "uint32", "int32")
                           or hb.scale != 1.0 or hb.offset != 0.0):
        problems.append(f"points.heartbeat: point {hb.name!r} must be an integer register "
                        f"with scale 1 and offset 0 (it is {hb.type}, scale {hb.scale:g})")
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems), problems=problems)
