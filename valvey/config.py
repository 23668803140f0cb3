"""valvey's configuration: one TOML file, validated at load (DESIGN §3 Config).

``valvey --check-config FILE`` validates it; with no file valvey runs on the embedded defaults
below (the CDU simulator on 127.0.0.1:5020, a broker on 127.0.0.1:1883, no database: the spool
is the embedded store). See config/valvey.example.toml for every key with its default.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rackplane.config import StrictModel, identity_required, require_keys
from rackplane.config_plausibility import Plausible, plausibility_warnings, value_at
from rackplane.core.plausibility import PlausibilityWindow, merge_windows
from rackplane.core.registers import RegisterMap
from rackplane.errors import ConfigError
from rackplane.leadership_settings import LeadershipSettings
from rackplane.settings import (
    CommandSettings,
    DaemonSettings,
    ModbusTargetSettings,
    SpoolSettings,
    TopicLevel,
)
from valvey.core.capacity import CapacitySettings
from valvey.core.commissioning import CommissioningSettings
from valvey.core.feedforward import FeedforwardSettings, sample_names
from valvey.core.pump_settings import PumpLoopSettings, PumpSettings
from valvey.core.safety import SafetySettings
from valvey.core.sensors import SensorMap, SensorTopic, SupplySensorSettings
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
    "config_warnings",
    "default_plausibility",
    "required_parts",
]


def default_plausibility() -> dict[str, PlausibilityWindow]:
    """Plausibility windows of the MQTT inputs that feed a safety function (the CDU's
    Modbus points have theirs in the register map: ``valid_min`` / ``valid_max``). Field
    defaults: physics, REFERENCE §8 (rack budget), ASHRAE's data-hall envelope [U]."""
    w = PlausibilityWindow
    return {
        "room_temp_c": w(min=-10.0, max=55.0, source="data-hall air, °C: ASHRAE A4 allows "
                         "5-45 °C, a hot aisle reaches ~50 [U]; a reading in kelvin (≥ 263) or "
                         "°F is outside"),
        "room_rh_pct": w(min=3.0, max=100.0, source="relative humidity, %: physics (≤ 100 %); "
                         "ASHRAE allows ≥ 8 % [U]; a fraction (0.6) or a dead sensor (0 %) is "
                         "outside"),
        "rack_power_w": w(min=-1000.0, max=250_000.0, source="one rack, W: GB300 NVL72 up to "
                          "≈142 kW (REFERENCE §8) with margin; mW sent as W is outside (kW "
                          "sent as W is not: a low reading can be true)"),
    }


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
    controller_epoch: str | None = Field(
        None, description="the CDU's controller-epoch register (redundant pairs, issue 15: "
        "an instance claims its lease's epoch there on its connection before any other "
        "write, so the CDU refuses and counts a fenced-out instance's writes; 'controller_"
        "epoch' in the bundled map); None: no claim (single instance, or a CDU without one: "
        "then only the heartbeat watchdog fences)"
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
        None, ge=-45.0, le=60.0, allow_inf_nan=False,
        description="dew point assumed while a room reading is "
        "invalid (stale, missing, bad or outside its plausibility window); None: the air is "
        "assumed saturated at the last valid room temperature (dew point = that temperature). "
        "Never 'no floor' once a room temperature was valid"
    )


class RackySettings(StrictModel):
    """Requests to racky (docs/CONTRACTS.md: racky/cmd/valvey/<verb>)."""

    daemon: TopicLevel = Field("racky", description="racky's topic level")
    user: TopicLevel | None = Field(
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
    learned_max_age_s: float = Field(
        30 * 86400.0, ge=3600, le=366 * 86400, description="what valvey learned of its "
        "plant (state file, valvey.learned_age) is restored as fresh at start only while last "
        "confirmed by a measurement at most this long ago, s (wall clock); older, or of "
        "unknown age (a file of an older build, a time in the future): the valve strokes, "
        "liquid fraction and exchanger k_open are dropped and re-learned (an old k_open could "
        "overstate the capacity), the feedforward map and commissioning gains kept as a "
        "starting point. 30 days: fouling and actuator wear change a plant over weeks to "
        "months, a normal month re-confirms what the plant exercises, and a restart (update, "
        "reboot) keeps values that recent"
    )

    @model_validator(mode="after")
    def _tick(self) -> ControlSettings:
        if abs(self.tick_s - TICK_S) > 1e-9:
            raise ValueError(f"tick_s is fixed at {TICK_S} s in this version")
        return self


class CduTarget(ModbusTargetSettings):
    """The CDU's Modbus target, with valvey's defaults (the simulator's port 5020, 10 Hz poll)."""

    name: TopicLevel = "cdu"
    port: int = Field(5020, ge=1, le=65535)
    register_map: Path = Field(
        Path("cdu-generic"), description="register-map TOML, or a bundled map's name"
    )
    poll_interval_s: float = Field(0.1, gt=0, le=3600, description="10 Hz, like the tick")
    reconnect_max_s: float = Field(
        2.0, gt=0, description="reconnect backoff cap: well below the CDU's heartbeat timeout "
        "(10 s in the simulator), so control resumes before the CDU falls back to local"
    )
    dormant_reprobe_s: float = Field(
        2.0, ge=0.05, le=86_400, allow_inf_nan=False,
        description="the CDU, unavailable behind a gateway (exception 10/11), is read again "
        "this often, s: as reconnect_max_s, so control resumes before the CDU falls back to "
        "local (a power shelf's default is 30 s)"
    )
    watchdog_timeout_s: float = Field(
        10.0, gt=0, le=3600, allow_inf_nan=False,
        description="the CDU's heartbeat (watchdog) timeout as commissioned on the CDU: it "
        "falls back to local control when the heartbeat has not changed this long (the "
        "simulator's: 10 s). With [leadership] enabled it must exceed leadership.lease_s + "
        "leadership.renew_every_s + control.heartbeat_interval_s + cdu.timeout_s, so a "
        "failover never drops the CDU to local control")
    watchdog_fed_by: Literal["heartbeat", "any_traffic"] = Field(
        "heartbeat", description="what keeps the CDU's watchdog alive: 'heartbeat' (only a "
        "changing heartbeat register) or 'any_traffic' (any Modbus request: then a fenced-out "
        "instance's reads keep the CDU under remote control; refused with [leadership])")
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
    stale_after_failed_polls: int | None = Field(
        None, ge=1, le=100, description="a point goes STALE after this many consecutive failed "
        "polls even while its last good value is younger than its stale limit (a faster "
        "reaction than stale_after_s); None (default): a value is good until stale_after_s "
        "after its last good read, however many polls failed in between"
    )
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
    commissioning: CommissioningSettings = CommissioningSettings()
    control: ControlSettings = ControlSettings()
    leadership: LeadershipSettings = Field(
        default_factory=lambda: LeadershipSettings(),
        description="redundant pair (issue 15, docs/OPERATIONS.md §6): two instances on a "
        "NATS JetStream cluster, only the lease holder writes the CDU; off by default")
    commands: CommandSettings = Field(
        default_factory=lambda: CommandSettings(),
        description="command path: roles of broker users, command TTL, limits (DESIGN §3)",
    )
    plausibility: dict[str, PlausibilityWindow] = Field(
        default_factory=default_plausibility,
        description="plausibility window (min, max, in the input's unit) per input name, "
        "laid over the defaults (room_temp_c, room_rh_pct, rack_power_w); a value outside "
        "is not believed (OUT_OF_RANGE 'implausible'), alarm input_implausible:<name>. Every "
        "input of a safety function needs a window here or in the register map",
    )

    @field_validator("plausibility", mode="before")
    @classmethod
    def _windows(cls, v: object) -> object:
        return merge_windows(default_plausibility(), v)

    @model_validator(mode="after")
    def _cross(self) -> ValveyConfig:
        if self.cdu.timeout_s >= self.supply_loop.stale_after_s:
            raise ValueError(
                "cdu.timeout_s must be shorter than supply_loop.stale_after_s, or a slow reply "
                "would count as fresh"
            )
        # every stale limit applied to the CDU's points must outlast one poll, or a value would
        # go stale between two good reads (a value is good until stale_after_s after its last
        # good read, issue 14)
        for key, limit in (("supply_loop", self.supply_loop.stale_after_s),
                           ("supply_sensors", self.supply_sensors.stale_after_s),
                           ("safety", self.safety.stale_after_s),
                           ("valves", self.valves.stale_after_s),
                           ("pump_loop", self.pump_loop.stale_after_s),
                           ("pumps", self.pumps.stale_after_s)):
            if self.cdu.poll_interval_s >= limit:
                raise ValueError(f"cdu.poll_interval_s ({self.cdu.poll_interval_s:g} s) must be "
                                 f"shorter than {key}.stale_after_s ({limit:g} s)")
        if self.feedforward.racks and self.sensors.rack_power is None:
            raise ValueError("feedforward.racks needs sensors.rack_power (the topic template "
                             "of each rack's racky state/rack_power)")
        names = [t.name for t in self.sensor_topics()]
        if len(set(names)) != len(names):
            raise ValueError("sensors: names must be distinct")
        self._check_pair()
        return self

    def sensor_topics(self) -> list[SensorTopic]:
        """Every MQTT sensor mapping in use: ``sensors`` and, on a row CDU, one rack power per
        rack of ``feedforward.racks`` (``sensors.rack_power`` with ``{rack}`` = the rack's
        name, sample ``<name>.<rack>``: `valvey.core.feedforward.sample_names`)."""
        out = self.sensors.topics()
        rp = self.sensors.rack_power
        if rp is not None:
            out += [rp.model_copy(update={"name": n, "topic": rp.topic.replace("{rack}", r)})
                    for r, n in zip(self.feedforward.racks,
                                    sample_names(self.feedforward, rp.name), strict=True)]
        return out

    def _check_pair(self) -> None:
        """A pair's CDU watchdog (issue 15): the fence of last resort on a CDU without an
        epoch register, and what must not fire during a failover. The watchdog must outlast
        the takeover: the lease (the standby waits lease_s from its last read of the old
        holder's record), one renewal period (that read may be that old), then the new
        active's first heartbeat (a tick period of heartbeats and one write's timeout)."""
        ls = self.leadership
        if not ls.enabled:
            return
        problems = []
        if self.points.heartbeat is None:
            problems.append("points.heartbeat is unset: a pair needs the CDU's heartbeat "
                            "watchdog as its fence of last resort")
        need = (ls.lease_s + ls.renew_every_s + self.control.heartbeat_interval_s
                + self.cdu.timeout_s)
        if not self.cdu.watchdog_timeout_s > need:
            problems.append(
                f"cdu.watchdog_timeout_s ({self.cdu.watchdog_timeout_s:g} s) must exceed "
                f"leadership.lease_s ({ls.lease_s:g}) + leadership.renew_every_s "
                f"({ls.renew_every_s:g}) + control.heartbeat_interval_s "
                f"({self.control.heartbeat_interval_s:g}) + cdu.timeout_s "
                f"({self.cdu.timeout_s:g}) = {need:g} s: set the CDU's watchdog longer or "
                "the lease shorter, or a failover drops the CDU to local control")
        if self.cdu.watchdog_fed_by != "heartbeat":
            problems.append("cdu.watchdog_fed_by is 'any_traffic': with [leadership] enabled "
                            "the CDU's watchdog must be fed by the heartbeat only (a fenced-"
                            "out instance still reads the CDU, which would keep it alive)")
        if problems:
            raise ValueError("; ".join(problems))

    def sensor_names(self) -> set[str]:
        """Sample names the MQTT sensors produce (index lists as their base name)."""
        return {t.name for t in self.sensor_topics()}


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
        "points.controller_epoch": (pts.controller_epoch, True),
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
    # every input of a safety function has a plausibility window (issue 14): in the
    # plausibility table, or (a CDU point) valid_min and valid_max in the register map
    from valvey.core.inputs import safety_inputs  # valvey.core.inputs reads this config

    for name, key in safety_inputs(cfg).items():
        spec = by_name.get(name)
        if name in cfg.plausibility or (spec is not None and spec.valid_min is not None
                                        and spec.valid_max is not None):
            continue
        problems.append(f"{key}: input {name!r} has no plausibility window: add "
                        f"[plausibility.{name}] min/max (or valid_min/valid_max in the "
                        "register map)")
    clash = sorted(mqtt & set(by_name))
    if clash:
        problems.append(f"sensors: names {clash} are also register-map points")
    hb = by_name.get(cfg.points.heartbeat or "")
    if hb is not None and (hb.type not in ("uint16", "int16", "uint32", "int32")
                           or hb.scale != 1.0 or hb.offset != 0.0):
        problems.append(f"points.heartbeat: point {hb.name!r} must be an integer register "
                        f"with scale 1 and offset 0 (it is {hb.type}, scale {hb.scale:g})")
    ep = by_name.get(cfg.points.controller_epoch or "")
    if ep is not None and (ep.type not in ("uint32", "uint64") or ep.scale != 1.0
                           or ep.offset != 0.0):
        problems.append(f"points.controller_epoch: point {ep.name!r} must be an unsigned "
                        f"32- or 64-bit register with scale 1 and offset 0 (it is {ep.type})")
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems), problems=problems)


_FLOW = ("REFERENCE §1.4: 1.5 L/min per kW (1.2-2.0 in use), 198 L/min for a 132 kW rack; "
         "in-rack CDUs 50-200 kW [S2]")
_DP = "REFERENCE §1.4: loop DP 0.5-3 bar; CDU 600 DP setpoint 0.1-4 bar [S]"
PLAUSIBLE: tuple[Plausible, ...] = (
    Plausible("pump_loop.flow_setpoint_lpm", 20.0, 3_000.0, "L/min", _FLOW,
              "m³/h or L/s written as L/min?"),
    Plausible("pump_loop.flow_setpoint_min_lpm", 10.0, 3_000.0, "L/min", _FLOW,
              "m³/h or L/s written as L/min?"),
    Plausible("pump_loop.flow_setpoint_max_lpm", 20.0, 5_000.0, "L/min", _FLOW,
              "m³/h or L/s written as L/min?"),
    Plausible("pump_loop.dp_setpoint_kpa", 20.0, 400.0, "kPa", _DP, "bar or psi written as kPa?"),
    Plausible("pump_loop.dp_setpoint_min_kpa", 10.0, 400.0, "kPa", _DP,
              "bar or psi written as kPa?"),
    Plausible("pump_loop.dp_setpoint_max_kpa", 20.0, 500.0, "kPa", _DP,
              "bar or psi written as kPa?"),
    Plausible("pump_loop.max_pressure_kpa", 100.0, 1_000.0, "kPa", "REFERENCE §1.4: system "
              "pressure 2-6 bar; relief valves ≈6 bar", "bar or psi written as kPa?"),
    Plausible("supply_loop.setpoint_c", 15.0, 65.0, "°C", "REFERENCE §1.4: DLC supply 25-45 °C "
              "(W45 class), never below the dew point", "°F or K written as °C?"),
    Plausible("supply_loop.setpoint_min_c", 15.0, 65.0, "°C", "REFERENCE §1.4: DLC supply "
              "25-45 °C (W45 class), never below the dew point", "°F or K written as °C?"),
    Plausible("supply_loop.setpoint_max_c", 15.0, 65.0, "°C", "REFERENCE §1.4: DLC supply "
              "25-45 °C (W45 class), never below the dew point", "°F or K written as °C?"),
    Plausible("selector.fallback_dew_point_c", -20.0, 35.0, "°C", "REFERENCE §8: the room's "
              "dew point; ASHRAE allows a data hall at most 17-24 °C [U]",
              "°F written as °C?"),
    Plausible("safety.design_flow_lpm", 20.0, 5_000.0, "L/min", _FLOW,
              "m³/h or L/s written as L/min?"),
    Plausible("safety.filter_dp_high_kpa", 10.0, 300.0, "kPa", "REFERENCE §1.5: Vertiv's "
              "filter alarm at 0.6 bar", "bar or psi written as kPa?"),
    Plausible("safety.power_low_w", 500.0, 100_000.0, "W", "REFERENCE §1.1: a rack with its "
              "trays off still draws kW (switches, fans); one running draws tens of kW",
              "kW written as W?"),
    Plausible("capacity.rack_max_power_w", 10_000.0, 600_000.0, "W", "REFERENCE §1.1: NVL72 "
              "≈120-142 kW, Vera Rubin 130-230 kW, Kyber up to 600 kW [S2]", "kW written as W?"),
    Plausible("capacity.min_cap_w", 1_000.0, 600_000.0, "W", "REFERENCE §1.1: a rack's floor "
              "is tens of kW", "kW written as W?"),
    Plausible("capacity.coolant_rho_c_kj_per_l_k", 3.0, 4.5, "kJ/(L·K)", "REFERENCE §4.3: "
              "PG25 4.03, water 4.18"),
)
"""Physical ranges of valvey's config values (`config_warnings`; issue 14 item 18)."""


SAFETY_ROLES: tuple[tuple[str, str], ...] = (
    ("points.flow", "the low-flow and no-flow interlocks and the flow warning"),
    ("points.loop_pressure", "the pump loop's maximum-pressure override"),
    ("safety.rope_leak", "the rope leak sensor"),
    ("safety.drip_pan_leak", "the drip-pan leak sensor"),
    ("safety.reservoir_level", "the reservoir level alarms (slow-leak detection)"),
    ("safety.filter_dp", "the filter differential-pressure alarm"),
    ("safety.isolation_closed", "the isolation valve's limit-switch confirmation"),
)
"""Optional inputs of safety functions: unset ("unset" in TOML), the function is off."""


def config_warnings(cfg: ValveyConfig) -> list[str]:
    """Warnings for values far outside their physical range (`PLAUSIBLE`), and for each
    input of a safety function left unset (`SAFETY_ROLES`: the function is off, which a
    partial register map may need but nobody should learn from an incident), and a pair's
    loopback-only NATS servers (`LeadershipSettings.warnings`): printed by ``--check-config``,
    logged at start."""
    out = plausibility_warnings(cfg, PLAUSIBLE)
    out += [f"{key} is unset; switched off: {what}" for key, what in SAFETY_ROLES
            if value_at(cfg, key) is None]
    if cfg.capacity.enabled and cfg.capacity.rack_max_power_w is None:
        out.append("capacity.rack_max_power_w is unset: give the rack's maximum IT power from "
                   "its vendor's spec (REFERENCE §1.1); until then the highest rack power seen "
                   "stands in for it (the no-standby and low-flow caps are shares of it)")
    if cfg.leadership.enabled and cfg.points.controller_epoch is None:
        out.append("points.controller_epoch is unset with [leadership] enabled: the CDU cannot "
                   "refuse a fenced-out instance's writes; only its heartbeat watchdog fences")
    return out + cfg.leadership.warnings()


def required_parts(data: Mapping[str, Any]) -> list[str]:
    """What valvey cannot run without, judged on the file's own keys
    (`rackplane.config.RequiredCheck`): its identity (`rackplane.config.identity_required`)
    and the CDU it controls: ``[cdu]`` naming it by ``host``, ``port`` or ``serial_port`` (the
    defaults are the simulator's, 127.0.0.1:5020: valvey must never write to whatever answers
    there by accident)."""
    out = require_keys(data, identity_required("valvey"))
    cdu = data.get("cdu")
    if not (isinstance(cdu, Mapping) and any(k in cdu for k in ("host", "port", "serial_port"))):
        out.append("cdu: names no CDU (host, port or serial_port): the defaults are the rack "
                   "simulator's (127.0.0.1:5020)")
    return out
