"""Scenarios: TOML timelines of load, facility water and faults (DESIGN §4; REFERENCE §5).

A scenario file (bundled ones live in ``config/scenarios/<name>.toml``)::

    name = "load-step"
    description = "S1: 30 % -> 100 % rack load step at steady state, then back"
    reference = "REFERENCE §5 S1"
    duration_s = 330.0
    seed = 1

    [plant]
    rack_max_power_w = 132000.0     # CduParams.for_rack_power
    supply_setpoint_c = 45.0        # the warm start holds this
    facility_supply_temp_c = 40.0   # start value; [facility] below may move it
    model = "auto"                  # cdu | rack | auto (see "Models" below)

    [load]
    kind = "timeline"               # constant | step | timeline | agentic | training | idle |
    points = [[0.0, 39600.0], [60.0, 132000.0], [210.0, 39600.0]]   # burn_in
    mode = "hold"

    [facility]                      # optional facility water temperature timeline (°C)
    points = [[0.0, 40.0], [600.0, 44.0]]
    mode = "ramp"

    [power]                         # optional: power shelves (sims.power defaults)
    shelves = 8
    [environment]                   # optional: room air (sims.environment defaults)
    relative_humidity_pct = 45.0
    [fabric]                        # optional: link fabric "auto" | "on" | "off", step_s
    enabled = "auto"
    [agents]                        # optional: node-agent settings of every tray at start
    power_floor_pct = 0.0

    [[faults]]                      # applied at at_s, healed at until_s (if given)
    at_s = 120.0
    until_s = 180.0
    kind = "sensor"
    point = "supply_temp_c"
    mode = "freeze"

Models. ``cdu``: the §4 model alone (`sims.cdu.CduPlant`, the rack as a power profile; fast,
valvey's lock-step). ``rack``: the whole virtual rack (`sims.row.VirtualRack`: per-GPU
workload, node agents, power shelves, room air, link fabric). ``auto`` (default) picks
``rack`` when a fault, the load kind or an ``[agents]`` table needs it, else ``cdu``; the real
time simulator always runs ``rack`` (`sims.runtime`).

Fault kinds (`FaultSpec`; fields other than ``at_s``/``until_s``/``kind`` as listed; "rack"
marks kinds that need the rack model, "fabric" those that also need `sims.fabric`):

==================== ==================================================================== =====
kind                 fields (meaning)                                                       needs
==================== ==================================================================== =====
pump_trip            pump (0 = A)
valve_stuck          -
valve_offset         value (feedback offset, %)
valve_slow           value (stroke-time factor)
sensor               point, mode (freeze | stale | drop | dropout | nan | sentinel | spike |
                     drift | offset), magnitude, rate_per_s, duration_s (spike)
leak                 value (L/min from the loop, no sensor location)
controller_restart   -
facility_water_rise  magnitude (K), ramp_s (up at at_s, back down at until_s)
fouled_cold_plate    tray, value (plate conductance factor, e.g. 0.35)
tray_leak            tray, value (L/min: 0.2 weep, 20 QD failure, REF §5 S6)           rack
cdu_leak             value (L/min onto the CDU rope sensor)                              rack
leak_sensor_fault    sensor (tray | rope | drip_pan), tray                               rack
psu_failure          shelf, psu                                                          rack
psu_derate           shelf, psu, value (factor of rating)                                rack
shelf_loss           shelf                                                               rack
feed_loss            feed (0 = A)                                                        rack
humidity_rise        magnitude (%RH), ramp_s                                             rack
room_temp_rise       magnitude (K), ramp_s                                               rack
link_flap            port (name ``gpu07/nvl03`` or index), down_s, up_s, count           fabric
link_down            port, down_s (held down once)                                       fabric
link_error_rate      port, counter, rate_per_s (constant; healed at until_s)             fabric
link_error_ramp      port, counter, start_per_s, end_per_s, ramp_s                       fabric
link_ber             port, value (pre-FEC BER, e.g. 1e-11)                               fabric
gpu_reboot           gpu (counters reset)                                                fabric
modbus_exception     device (cdu | power), code, unit, table, address, registers
modbus_half_open     device (requests read and never answered, BR-07)
modbus_slow          device, value (reply delay, s)
modbus_gap           device, table, address, registers (answered exception 2, BR-05)
modbus_max_registers device, value (largest read accepted; exception 3 above, BR-05)
mqtt_stop            publisher (plant | rack | trays | power | env | all)
==================== ==================================================================== =====

Sensor modes: ``stale`` is ``freeze``; ``dropout`` and ``nan`` are ``drop`` (the reading is
NaN: a float register serves NaN, an integer one its sentinel); ``sentinel`` also drops the
reading and makes the Modbus face serve the point's sentinel raw value. Protocol faults
(``modbus_*``, ``mqtt_stop``) do not touch the plant: they are recorded in
`ScenarioRun.protocol` for the real-time faces (`sims.runtime`) to apply.

Everything here is pure: `ScenarioRun` applies the timeline to the plant as plant time
advances and records every fault's start and end (the ground truth detection is scored on);
self-ending faults (a flap, a held-down link, a reboot, a spike) get their end from their
own timing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from rackplane.config import StrictModel, read_toml, validate_data
from rackplane.errors import ConfigError
from sims.cdu import CduParams, CduPlant
from sims.environment import EnvironmentParams
from sims.power import PowerShelfParams
from sims.rack import ComputeRackParams, NodeAgentSettings
from sims.row import FabricMode, FabricUnavailable, VirtualRack, VirtualRackParams
from sims.workloads import (
    AgenticBurstLoad,
    AgenticWorkload,
    BurnInWorkload,
    ConstantLoad,
    IdleWorkload,
    LoadProfile,
    RackPowerWorkload,
    StepLoad,
    TimelineLoad,
    TrainingSquareWave,
    TrainingWorkload,
    Workload,
)

__all__ = [
    "CDU_SENSOR_MODES",
    "FABRIC_KINDS",
    "PROTOCOL_KINDS",
    "RACK_KINDS",
    "AgentSpec",
    "EnvironmentSpec",
    "FabricSpec",
    "FacilitySpec",
    "FaultKind",
    "FaultRecord",
    "FaultSpec",
    "LoadSpec",
    "ModbusFaultState",
    "PlantSpec",
    "PowerSpec",
    "ProtocolFaults",
    "Scenario",
    "ScenarioRun",
    "list_scenarios",
    "load_scenario",
    "scenario_dir",
]


class PlantSpec(StrictModel):
    """Plant parameters of a scenario (everything else: `CduParams` defaults, REFERENCE §4.3)."""

    rack_max_power_w: float = Field(132_000.0, gt=0, le=600_000)
    supply_setpoint_c: float = Field(45.0, ge=20, le=60)
    facility_supply_temp_c: float = Field(40.0, ge=5, le=60)
    heartbeat_timeout_s: float | None = Field(None, gt=0)
    model: Literal["auto", "cdu", "rack"] = Field(
        "auto", description="cdu: the §4 model; rack: the virtual rack; auto: as needed"
    )


class LoadSpec(StrictModel):
    """Rack IT power (cdu model) or per-GPU workload (rack model) over plant time."""

    kind: Literal[
        "constant", "step", "timeline", "agentic", "training", "idle", "burn_in"
    ] = "constant"
    power_w: float | None = Field(None, ge=0, description="constant: the power")
    low_w: float | None = Field(None, ge=0, description="step: before the step")
    high_w: float | None = Field(None, ge=0, description="step: after the step")
    step_at_s: float | None = Field(None, ge=0)
    back_at_s: float | None = Field(None, ge=0)
    points: list[tuple[float, float]] | None = None
    mode: Literal["hold", "ramp"] = "hold"
    period_s: float | None = Field(None, ge=1, le=10, description="training square wave")
    high_fraction: float | None = Field(None, ge=0, le=1, description="training: compute")
    low_fraction: float | None = Field(None, ge=0, le=1, description="training: comm")
    fraction: float | None = Field(None, ge=0, le=1, description="burn_in: of TDP")
    traffic: float | None = Field(None, ge=0, le=1, description="burn_in: link traffic")
    spike_rate_per_h: float | None = Field(None, ge=0, description="agentic: demand spikes")
    concurrency_min: float | None = Field(None, ge=0, le=1, description="agentic: swell min")

    @model_validator(mode="after")
    def _fields(self) -> LoadSpec:
        needs = {
            "constant": ["power_w"],
            "step": ["low_w", "high_w", "step_at_s"],
            "timeline": ["points"],
        }.get(self.kind, [])
        missing = [n for n in needs if getattr(self, n) is None]
        if missing:
            raise ValueError(f"load kind {self.kind!r} needs {', '.join(missing)}")
        return self


class FacilitySpec(StrictModel):
    """Facility water supply temperature timeline in °C."""

    points: list[tuple[float, float]]
    mode: Literal["hold", "ramp"] = "ramp"


class PowerSpec(StrictModel):
    """Power shelves of the rack model (`sims.power.PowerShelfParams`; REFERENCE §1.2)."""

    shelves: int = Field(8, ge=1, le=32)
    psus_per_shelf: int = Field(6, ge=1, le=16)
    psu_rating_w: float = Field(5500.0, gt=0)
    feeds: int = Field(2, ge=1, le=4)
    bbu_power_w: float = Field(33_000.0, ge=0)
    bbu_backup_s: float = Field(90.0, ge=0)


class EnvironmentSpec(StrictModel):
    """Room air of the rack model (`sims.environment.EnvironmentParams`)."""

    room_temp_c: float = Field(24.0, ge=-10, le=50)
    relative_humidity_pct: float = Field(45.0, gt=0, le=100)
    temp_points: list[tuple[float, float]] | None = None
    rh_points: list[tuple[float, float]] | None = None


class FabricSpec(StrictModel):
    """Link fabric of the rack model (`sims.fabric.LinkFabric`)."""

    enabled: FabricMode = "auto"
    step_s: float = Field(1.0, ge=0.1, le=60)


class AgentSpec(StrictModel):
    """Node-agent settings every compute tray starts with (`sims.rack.NodeAgentSettings`)."""

    power_cap_w: float | None = Field(None, gt=0)
    gpu_power_cap_w: float | None = Field(None, gt=0)
    power_floor_pct: float = Field(0.0, ge=0, le=100)
    ramp_up_w_per_s: float | None = Field(None, gt=0)
    ramp_down_w_per_s: float | None = Field(None, gt=0)
    ramp_down_hysteresis_s: float = Field(0.0, ge=0, le=3600)

    def settings(self) -> NodeAgentSettings:
        """As the node-agent contract."""
        return NodeAgentSettings(**self.model_dump())


FaultKind = Literal[
    "pump_trip",
    "valve_stuck",
    "valve_offset",
    "valve_slow",
    "sensor",
    "leak",
    "controller_restart",
    "facility_water_rise",
    "fouled_cold_plate",
    "tray_leak",
    "cdu_leak",
    "leak_sensor_fault",
    "psu_failure",
    "psu_derate",
    "shelf_loss",
    "feed_loss",
    "humidity_rise",
    "room_temp_rise",
    "link_flap",
    "link_down",
    "link_error_rate",
    "link_error_ramp",
    "link_ber",
    "gpu_reboot",
    "modbus_exception",
    "modbus_half_open",
    "modbus_slow",
    "modbus_gap",
    "modbus_max_registers",
    "mqtt_stop",
]

FABRIC_KINDS: frozenset[str] = frozenset(
    {"link_flap", "link_down", "link_error_rate", "link_error_ramp", "link_ber", "gpu_reboot"}
)
"""Fault kinds that need the link fabric."""
RACK_KINDS: frozenset[str] = FABRIC_KINDS | {
    "tray_leak",
    "cdu_leak",
    "leak_sensor_fault",
    "psu_failure",
    "psu_derate",
    "shelf_loss",
    "feed_loss",
    "humidity_rise",
    "room_temp_rise",
}
"""Fault kinds that need the rack model."""
PROTOCOL_KINDS: frozenset[str] = frozenset(
    {"modbus_exception", "modbus_half_open", "modbus_slow", "modbus_gap",
     "modbus_max_registers", "mqtt_stop"}
)
"""Fault kinds that act on the real-time faces only (`ScenarioRun.protocol`)."""
CDU_SENSOR_MODES: dict[str, str] = {
    "freeze": "freeze",
    "stale": "freeze",
    "drop": "drop",
    "dropout": "drop",
    "nan": "drop",
    "sentinel": "drop",
    "spike": "spike",
    "drift": "drift",
    "offset": "offset",
}
"""Scenario sensor mode -> `sims.sensors.SensorFault` value."""
MQTT_PUBLISHERS: frozenset[str] = frozenset({"plant", "rack", "trays", "power", "env", "all"})
_SELF_ENDING = frozenset({"link_flap", "link_down", "gpu_reboot", "controller_restart"})


class FaultSpec(StrictModel):
    """One scripted fault: applied at ``at_s``, healed at ``until_s`` (None: never, or at its
    own end for self-ending kinds). Fields per kind: see the module docstring."""

    at_s: float = Field(ge=0)
    until_s: float | None = Field(None, ge=0)
    kind: FaultKind
    pump: int = Field(0, ge=0, description="pump_trip: which pump (0 = duty A)")
    point: str | None = Field(None, description="sensor: the point whose transmitter fails")
    mode: Literal[
        "freeze", "stale", "drop", "dropout", "nan", "sentinel", "spike", "drift", "offset"
    ] | None = None
    magnitude: float = Field(0.0, description="sensor spike/offset; K or %RH for rises")
    rate_per_s: float = Field(0.0, description="sensor drift per s; link_error_rate per s")
    duration_s: float | None = Field(None, gt=0, description="sensor spike length, s")
    value: float = Field(
        0.0,
        description="valve_offset %, valve_slow factor, leak L/min, fouled_cold_plate factor, "
        "psu_derate factor, link_ber BER, modbus_slow s, modbus_max_registers count",
    )
    ramp_s: float = Field(0.0, ge=0, description="rises: ramp time; link_error_ramp length")
    tray: int | None = Field(None, ge=0, description="compute tray index (0-based)")
    sensor: Literal["tray", "rope", "drip_pan"] | None = None
    shelf: int | None = Field(None, ge=0)
    psu: int | None = Field(None, ge=0)
    feed: int | None = Field(None, ge=0)
    gpu: int | None = Field(None, ge=0)
    port: str | int | None = Field(None, description="link port name or index")
    counter: str | None = Field(None, description="fabric counter name")
    down_s: float | None = Field(None, gt=0)
    up_s: float | None = Field(None, ge=0)
    count: int = Field(1, ge=1)
    start_per_s: float | None = Field(None, ge=0)
    end_per_s: float | None = Field(None, ge=0)
    device: Literal["cdu", "power"] | None = None
    code: int | None = Field(None, ge=1, le=11)
    unit: int | None = Field(None, ge=0, le=255)
    table: Literal["holding", "input", "coil", "discrete"] | None = None
    address: int | None = Field(None, ge=0, le=65535)
    registers: int = Field(1, ge=1, le=125)
    publisher: str | None = None

    @model_validator(mode="after")
    def _fields(self) -> FaultSpec:
        if self.until_s is not None and self.until_s <= self.at_s:
            raise ValueError("until_s must be after at_s")
        k = self.kind
        need: list[str] = {
            "sensor": ["point", "mode"],
            "fouled_cold_plate": ["tray"],
            "tray_leak": ["tray"],
            "leak_sensor_fault": ["sensor"],
            "psu_failure": ["shelf", "psu"],
            "psu_derate": ["shelf", "psu"],
            "shelf_loss": ["shelf"],
            "feed_loss": ["feed"],
            "link_flap": ["port", "down_s"],
            "link_down": ["port", "down_s"],
            "link_error_rate": ["port", "counter"],
            "link_error_ramp": ["port", "counter", "start_per_s", "end_per_s"],
            "link_ber": ["port"],
            "gpu_reboot": ["gpu"],
            "modbus_exception": ["device", "code"],
            "modbus_half_open": ["device"],
            "modbus_slow": ["device"],
            "modbus_gap": ["device", "table", "address"],
            "modbus_max_registers": ["device"],
            "mqtt_stop": ["publisher"],
        }.get(k, [])
        missing = [n for n in need if getattr(self, n) is None]
        if missing:
            raise ValueError(f"a {k} fault needs {', '.join(missing)}")
        if k == "leak_sensor_fault" and self.sensor == "tray" and self.tray is None:
            raise ValueError("a tray leak_sensor_fault needs tray")
        if k == "link_flap" and self.count > 1 and not self.up_s:
            raise ValueError("a link_flap with count > 1 needs up_s > 0")
        if k == "link_error_ramp" and self.ramp_s <= 0.0:
            raise ValueError("a link_error_ramp needs ramp_s > 0")
        if k in ("valve_slow", "fouled_cold_plate", "psu_derate", "link_ber",
                 "modbus_max_registers") and self.value <= 0.0:
            raise ValueError(f"a {k} fault needs value > 0")
        if k in ("leak", "tray_leak", "cdu_leak", "modbus_slow") and self.value < 0.0:
            raise ValueError(f"a {k} fault needs value >= 0")
        if k == "psu_derate" and self.value > 1.0:
            raise ValueError("psu_derate value is a factor in (0, 1]")
        if k == "modbus_max_registers" and not (1 <= self.value <= 125):
            raise ValueError("modbus_max_registers value must be 1-125")
        if k == "mqtt_stop" and self.publisher not in MQTT_PUBLISHERS:
            raise ValueError(f"publisher must be one of {sorted(MQTT_PUBLISHERS)}")
        return self

    def target(self) -> str:
        """The ground-truth target name (pump0, a point, tray03, shelf2.psu1, a port, ...)."""
        k = self.kind
        if k == "pump_trip":
            return f"pump{self.pump}"
        if k == "sensor":
            return self.point or ""
        if k in ("valve_stuck", "valve_offset", "valve_slow"):
            return "valve"
        if k == "leak":
            return "loop"
        if k in ("controller_restart", "cdu_leak"):
            return "cdu"
        if k == "facility_water_rise":
            return "facility_water"
        if k in ("fouled_cold_plate", "tray_leak"):
            return f"tray{self.tray:02d}"
        if k == "leak_sensor_fault":
            return {"tray": f"tray{self.tray or 0:02d}.leak_sensor", "rope": "cdu.rope_sensor",
                    "drip_pan": "rack.drip_pan_sensor"}[self.sensor or "tray"]
        if k in ("psu_failure", "psu_derate"):
            return f"shelf{self.shelf}.psu{self.psu}"
        if k == "shelf_loss":
            return f"shelf{self.shelf}"
        if k == "feed_loss":
            return f"feed{'ABCD'[self.feed or 0]}"
        if k in ("humidity_rise", "room_temp_rise"):
            return "room"
        if k == "gpu_reboot":
            return f"gpu{self.gpu:02d}"
        if k in FABRIC_KINDS:
            return str(self.port)
        if k == "mqtt_stop":
            return f"mqtt:{self.publisher}"
        return f"modbus:{self.device}"


class Scenario(StrictModel):
    """A scenario file (see the module docstring for the format)."""

    name: str
    description: str = ""
    reference: str = ""
    duration_s: float = Field(gt=0, le=30 * 86400)
    seed: int = 0
    plant: PlantSpec = PlantSpec()
    load: LoadSpec
    facility: FacilitySpec | None = None
    power: PowerSpec | None = None
    environment: EnvironmentSpec | None = None
    fabric: FabricSpec | None = None
    agents: AgentSpec | None = None
    faults: list[FaultSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _faults_in_time(self) -> Scenario:
        for i, f in enumerate(self.faults):
            if f.at_s >= self.duration_s:
                raise ValueError(f"faults[{i}].at_s {f.at_s} is not before duration_s")
        return self

    def needs_rack(self) -> bool:
        """True when a fault, the load kind or ``[agents]`` needs the rack model."""
        return (
            any(f.kind in RACK_KINDS or f.device == "power" for f in self.faults)
            or self.load.kind in ("idle", "burn_in")
            or self.agents is not None
        )

    def model(self) -> Literal["cdu", "rack"]:
        """The model `ScenarioRun` uses by default (``plant.model``, ``auto`` resolved)."""
        m = self.plant.model
        if m == "auto":
            return "rack" if self.needs_rack() else "cdu"
        return m

    def cdu_params(self) -> CduParams:
        """Plant parameters for this scenario (REFERENCE §4.3 scaled to the rack power)."""
        overrides: dict[str, Any] = {}
        if self.plant.heartbeat_timeout_s is not None:
            overrides["heartbeat_timeout_s"] = self.plant.heartbeat_timeout_s
        return CduParams.for_rack_power(self.plant.rack_max_power_w, **overrides)

    def rack_params(self) -> VirtualRackParams:
        """Virtual-rack parameters for this scenario (``[power]``, ``[environment]``,
        ``[fabric]`` over the `sims.row` defaults)."""
        pw = self.power or PowerSpec()
        env = self.environment or EnvironmentSpec()
        fab = self.fabric or FabricSpec()
        return VirtualRackParams(
            cdu=self.cdu_params(),
            compute=ComputeRackParams(),
            power=PowerShelfParams(**pw.model_dump()),
            environment=EnvironmentParams(**env.model_dump()),
            fabric=fab.enabled,
            fabric_step_s=fab.step_s,
            supply_setpoint_c=self.plant.supply_setpoint_c,
        )

    def load_profile(self) -> LoadProfile:
        """The rack IT power profile, deterministic for the scenario's seed (idle and burn-in
        as their constant rack power at 20 % / ``fraction`` of ``rack_max_power_w``)."""
        spec = self.load
        pmax = self.plant.rack_max_power_w
        if spec.kind == "constant":
            assert spec.power_w is not None
            return ConstantLoad(spec.power_w)
        if spec.kind == "step":
            assert spec.low_w is not None and spec.high_w is not None
            assert spec.step_at_s is not None
            return StepLoad(spec.low_w, spec.high_w, spec.step_at_s, back_at_s=spec.back_at_s)
        if spec.kind == "timeline":
            assert spec.points is not None
            return TimelineLoad(spec.points, mode=spec.mode)
        if spec.kind == "agentic":
            return AgenticBurstLoad(pmax, seed=self.seed)
        if spec.kind == "idle":
            return ConstantLoad(0.2 * pmax)
        if spec.kind == "burn_in":
            return ConstantLoad((1.0 if spec.fraction is None else spec.fraction) * pmax)
        return TrainingSquareWave(
            pmax,
            period_s=spec.period_s or 4.0,
            seed=self.seed,
            high_fraction=1.0 if spec.high_fraction is None else spec.high_fraction,
            low_fraction=0.65 if spec.low_fraction is None else spec.low_fraction,
        )

    def workload(self, gpus: int, fraction_for_power: Any) -> Workload:
        """The per-GPU workload of the rack model (``fraction_for_power``: rack W -> fraction
        of TGP, for the power-profile kinds)."""
        spec = self.load
        if spec.kind == "agentic":
            kw: dict[str, Any] = {}
            if spec.spike_rate_per_h is not None:
                kw["spike_rate_per_h"] = spec.spike_rate_per_h
            if spec.concurrency_min is not None:
                kw["concurrency_min"] = spec.concurrency_min
            return AgenticWorkload(gpus, seed=self.seed, **kw)
        if spec.kind == "training":
            return TrainingWorkload(
                gpus,
                seed=self.seed,
                period_s=spec.period_s or 4.0,
                high_fraction=1.0 if spec.high_fraction is None else spec.high_fraction,
                low_fraction=0.65 if spec.low_fraction is None else spec.low_fraction,
            )
        if spec.kind == "idle":
            return IdleWorkload(gpus, seed=self.seed)
        if spec.kind == "burn_in":
            return BurnInWorkload(
                gpus,
                fraction=1.0 if spec.fraction is None else spec.fraction,
                traffic=0.5 if spec.traffic is None else spec.traffic,
            )
        return RackPowerWorkload(self.load_profile(), fraction_for_power, gpus)

    def facility_profile(self) -> LoadProfile:
        """Facility water supply temperature (°C) over time, as a profile of plain numbers."""
        if self.facility is None:
            return ConstantLoad(self.plant.facility_supply_temp_c)
        return TimelineLoad(self.facility.points, mode=self.facility.mode)


def scenario_dir() -> Path:
    """Folder of the bundled scenarios (``config/scenarios``)."""
    return Path(str(files("rackplane_config") / "scenarios"))


def list_scenarios() -> list[Scenario]:
    """Every bundled scenario, sorted by name."""
    return sorted((load_scenario(p) for p in scenario_dir().glob("*.toml")), key=lambda s: s.name)


def load_scenario(ref: str | Path) -> Scenario:
    """Load a scenario by bundled name (``load-step``) or by path.

    Raises:
        ConfigError: unknown name, unreadable file, or invalid content (key path named).
    """
    p = Path(ref)
    if p.suffix != ".toml" and len(p.parts) == 1:
        p = scenario_dir() / f"{ref}.toml"
        if not p.exists():
            known = ", ".join(sorted(q.stem for q in scenario_dir().glob("*.toml")))
            raise ConfigError(f"unknown scenario {ref!r}; bundled scenarios: {known}")
    return validate_data(Scenario, read_toml(p), str(p), base_dir=p.parent)


@dataclass(frozen=True)
class FaultRecord:
    """Ground truth of one injected fault: what, where, from when to when (plant s)."""

    kind: str
    target: str
    start_s: float
    end_s: float | None


@dataclass
class ModbusFaultState:
    """Fault knobs of one Modbus face (`sims.modbus_face.ModbusFace`)."""

    blackhole: bool = False
    reply_delay_s: float = 0.0
    max_registers: int | None = None
    exceptions: dict[int, tuple[int, int | None, str | None, int | None, int]] = field(
        default_factory=dict
    )  # fault index -> (code, unit, table, address, count)


@dataclass
class ProtocolFaults:
    """Protocol misbehaviour the real-time faces apply (`version` increments on change)."""

    modbus: dict[str, ModbusFaultState] = field(
        default_factory=lambda: {"cdu": ModbusFaultState(), "power": ModbusFaultState()}
    )
    sentinel_points: set[str] = field(default_factory=set)
    mqtt_stopped: set[str] = field(default_factory=set)
    version: int = 0

    def publishing(self, publisher: str) -> bool:
        """False while ``publisher`` (or ``all``) is stopped."""
        return publisher not in self.mqtt_stopped and "all" not in self.mqtt_stopped


class _Ramp:
    """An additive offset ramped linearly to a target."""

    def __init__(self) -> None:
        self.value = 0.0
        self.target = 0.0
        self.rate = math.inf

    def set(self, target: float, ramp_s: float) -> None:
        span = abs(target - self.value)
        self.target = target
        self.rate = math.inf if ramp_s <= 0.0 or span == 0.0 else span / ramp_s

    def at(self, dt: float) -> float:
        d = self.target - self.value
        m = self.rate * dt
        self.value = self.target if abs(d) <= m else self.value + math.copysign(m, d)
        return self.value


@dataclass
class ScenarioRun:
    """Applies a scenario's timeline to a plant as plant time advances (pure, no clock).

    Usage: ``run = ScenarioRun(scenario)``; ``plant = run.plant`` (the `CduPlant`, in both
    models); ``run.rack`` (the `VirtualRack`, rack model only); then each step
    ``run.step(dt)``; ``run.ground_truth`` lists the faults applied so far; ``run.protocol``
    the protocol faults in force.

    Args:
        scenario: the scenario.
        model: ``cdu`` or ``rack`` (default: `Scenario.model`).

    Raises:
        ValueError: the scenario needs the rack model and ``model="cdu"`` was asked.
        FabricUnavailable: a link fault without a link fabric.
    """

    scenario: Scenario
    model: Literal["cdu", "rack"] | None = None
    plant: CduPlant = field(init=False)
    rack: VirtualRack | None = field(init=False, default=None)
    load: LoadProfile = field(init=False)
    facility: LoadProfile = field(init=False)
    ground_truth: list[FaultRecord] = field(default_factory=list)
    protocol: ProtocolFaults = field(default_factory=ProtocolFaults)
    _pending: list[tuple[float, int, str]] = field(default_factory=list)
    _active: dict[int, int] = field(default_factory=dict)
    _fws: _Ramp = field(default_factory=_Ramp)
    _t: float = 0.0

    def __post_init__(self) -> None:
        s = self.scenario
        model = self.model or s.model()
        if model == "cdu" and s.needs_rack():
            raise ValueError(f"scenario {s.name!r} needs the rack model (a rack-level fault)")
        self.model = model
        self.load = s.load_profile()
        self.facility = s.facility_profile()
        if model == "rack":
            params = s.rack_params()
            if any(f.kind in FABRIC_KINDS for f in s.faults) and params.fabric == "auto":
                params = params.model_copy(update={"fabric": "on"})
            rack = VirtualRack(params, seed=s.seed)
            self.rack = rack
            self.plant = rack.cdu
            comp = rack.compute
            rack.workload = s.workload(comp.n_gpus, comp.gpu_fraction_for_rack_power)
            if s.agents is not None:
                for k in range(rack.compute.n_trays):
                    rack.agents.configure(k, s.agents.settings())
            rack.warm_start(self.facility.power_w(0.0))
            if any(f.kind in FABRIC_KINDS for f in s.faults) and rack.fabric is None:
                raise FabricUnavailable("this scenario's link faults need sims.fabric")
        else:
            self.plant = CduPlant(s.cdu_params(), seed=s.seed)
            self.plant.warm_start(
                self.load.power_w(0.0),
                supply_setpoint_c=s.plant.supply_setpoint_c,
                facility_supply_temp_c=self.facility.power_w(0.0),
            )
        events: list[tuple[float, int, str]] = []
        for i, f in enumerate(s.faults):
            events.append((f.at_s, i, "start"))
            own = self._own_end(f)
            self_ending = own is not None and (f.until_s is None or f.mode == "spike")
            end = own if self_ending else f.until_s
            if end is not None:
                events.append((end, i, "end"))
        self._pending = sorted(events, reverse=True)  # pop() from the end: earliest first

    @staticmethod
    def _own_end(f: FaultSpec) -> float | None:
        if f.kind == "link_flap":
            assert f.down_s is not None
            return f.at_s + (f.count - 1) * (f.down_s + (f.up_s or 0.0)) + f.down_s
        if f.kind == "link_down":
            assert f.down_s is not None
            return f.at_s + f.down_s
        if f.kind == "sensor" and f.mode == "spike":  # a spike ends by itself
            if f.duration_s is not None:
                return f.at_s + f.duration_s
            return f.until_s if f.until_s is not None else f.at_s + 0.1
        return None

    # --- time and inputs -----------------------------------------------------------------------

    @property
    def t_s(self) -> float:
        """Plant time in s since the scenario started."""
        return self.plant.time_s

    @property
    def rack_power_w(self) -> float:
        """Rack IT power demand now, W (cdu model: the profile; rack model: the node agents'
        requests, before throttling)."""
        if self.rack is not None:
            return self.rack.rack.rack_demand_w
        return self.load.power_w(self.t_s)

    @property
    def facility_supply_temp_c(self) -> float:
        """Facility water supply temperature now, °C (timeline + a rise fault's offset)."""
        return self.facility.power_w(self.t_s) + self._fws.value

    @property
    def done(self) -> bool:
        return self.t_s >= self.scenario.duration_s - 1e-9

    def step(self, dt_s: float = 0.1) -> None:
        """Apply due faults, then advance the plant by ``dt_s`` under the timeline's inputs
        (past the end too: the timeline holds its last inputs, no new faults start)."""
        while self._pending and self._pending[-1][0] <= self.t_s + 1e-9:
            _, idx, what = self._pending.pop()
            self._apply(idx, start=(what == "start"))
        self._fws.at(dt_s)
        t_fws = self.facility_supply_temp_c
        if self.rack is not None:
            self.rack.step(dt_s, t_fws)
            lk = self.rack.leaks.state()  # the CDU's registers carry its rope sensor
            self.plant.set_leak_sensor_inputs(lk.rope_leak, lk.rope_sensor_fault)
        else:
            self.plant.step(self.load.power_w(self.t_s), t_fws, dt_s)

    # --- faults --------------------------------------------------------------------------------

    def _apply(self, idx: int, *, start: bool) -> None:
        f = self.scenario.faults[idx]
        k = f.kind
        if k in PROTOCOL_KINDS:
            self._apply_protocol(idx, f, start)
        elif k in RACK_KINDS:
            self._apply_rack(f, start)
        else:
            self._apply_cdu(f, start)
        now = round(self.t_s, 6)  # plant time sums 0.1 s steps: drop the float noise
        if start:
            self._active[idx] = len(self.ground_truth)
            end = now if k in ("gpu_reboot", "controller_restart") else None
            self.ground_truth.append(FaultRecord(k, f.target(), now, end))
        elif idx in self._active:
            i = self._active.pop(idx)
            rec = self.ground_truth[i]
            self.ground_truth[i] = FaultRecord(rec.kind, rec.target, rec.start_s, now)

    def _apply_cdu(self, f: FaultSpec, start: bool) -> None:
        p = self.plant
        k = f.kind
        if k == "pump_trip":
            p.trip_pump(f.pump) if start else p.reset_pump(f.pump)
        elif k == "valve_stuck":
            p.set_valve_stuck(start)
        elif k == "valve_offset":
            p.set_valve_feedback_offset_pct(f.value if start else 0.0)
        elif k == "valve_slow":
            p.set_valve_slow_factor(f.value if start else 1.0)
        elif k == "sensor":
            assert f.point is not None and f.mode is not None
            self._sensor(f, start)
        elif k == "leak":
            if self.rack is not None:
                self.rack.loop_leak_lpm = f.value if start else 0.0
            else:
                p.set_leak_lpm(f.value if start else 0.0)
        elif k == "controller_restart" and start:
            p.restart_controller()
        elif k == "facility_water_rise":
            self._fws.set(f.magnitude if start else 0.0, f.ramp_s)
        elif k == "fouled_cold_plate":
            assert f.tray is not None
            for rack in p.racks:
                rack.set_conductance_factor(f.tray, f.value if start else 1.0)

    def _sensor(self, f: FaultSpec, start: bool) -> None:
        assert f.point is not None and f.mode is not None
        env_sensor = self.rack is not None and f.point in self.rack.environment.sensors
        if start:
            mode = CDU_SENSOR_MODES[f.mode]
            dur = f.duration_s
            if mode == "spike" and dur is None and f.until_s is not None:
                dur = f.until_s - f.at_s
            kw: dict[str, Any] = {"magnitude": f.magnitude, "rate_per_s": f.rate_per_s,
                                  "duration_s": dur}
            if env_sensor:
                assert self.rack is not None
                self.rack.environment.sensors[f.point].set_fault(mode, **kw)
            else:
                self.plant.set_sensor_fault(f.point, mode, **kw)
            if f.mode == "sentinel":
                self.protocol.sentinel_points.add(f.point)
                self.protocol.version += 1
        else:
            if env_sensor:
                assert self.rack is not None
                self.rack.environment.sensors[f.point].clear_fault()
            else:
                self.plant.clear_sensor_fault(f.point)
            if f.mode == "sentinel":
                self.protocol.sentinel_points.discard(f.point)
                self.protocol.version += 1

    def _apply_rack(self, f: FaultSpec, start: bool) -> None:
        rack = self.rack
        assert rack is not None
        k = f.kind
        if k == "tray_leak":
            assert f.tray is not None
            rack.leaks.set_tray_leak(f.tray, f.value if start else 0.0)
        elif k == "cdu_leak":
            rack.leaks.set_rope_leak(f.value if start else 0.0)
        elif k == "leak_sensor_fault":
            assert f.sensor is not None
            rack.leaks.set_sensor_fault(f.sensor, start, f.tray)
        elif k == "psu_failure":
            assert f.shelf is not None and f.psu is not None
            (rack.shelves.fail_psu if start else rack.shelves.restore_psu)(f.shelf, f.psu)
        elif k == "psu_derate":
            assert f.shelf is not None and f.psu is not None
            rack.shelves.derate_psu(f.shelf, f.psu, f.value if start else 1.0)
        elif k == "shelf_loss":
            assert f.shelf is not None
            (rack.shelves.lose_shelf if start else rack.shelves.restore_shelf)(f.shelf)
        elif k == "feed_loss":
            assert f.feed is not None
            (rack.shelves.lose_feed if start else rack.shelves.restore_feed)(f.feed)
        elif k == "humidity_rise":
            rack.environment.set_humidity_offset(f.magnitude if start else 0.0, f.ramp_s)
        elif k == "room_temp_rise":
            rack.environment.set_temp_offset(f.magnitude if start else 0.0, f.ramp_s)
        else:
            self._apply_fabric(f, start)

    def _apply_fabric(self, f: FaultSpec, start: bool) -> None:
        assert self.rack is not None
        fab = self.rack.fabric
        if fab is None:
            raise FabricUnavailable(f"a {f.kind} fault needs the link fabric")
        k = f.kind
        if k == "gpu_reboot":
            if start:
                assert f.gpu is not None
                fab.reboot(f.gpu)
            return
        if k == "link_flap":
            if start:
                assert f.down_s is not None
                fab.flap(f.port, f.down_s, f.up_s or 0.0, f.count,
                         start_s=max(self.t_s, fab.time_s))
            return
        if k == "link_down":
            if start:
                assert f.down_s is not None
                fab.hold_down(f.port, f.down_s, start_s=max(self.t_s, fab.time_s))
            return
        if not start:
            fab.restore_error_rate(f.port, None if k == "link_ber" else f.counter)
        elif k == "link_error_rate":
            assert f.counter is not None
            fab.set_error_rate(f.port, f.counter, f.rate_per_s)
        elif k == "link_error_ramp":
            assert f.counter is not None and f.start_per_s is not None
            assert f.end_per_s is not None
            fab.ramp_error_rate(f.port, f.counter, f.start_per_s, f.end_per_s, f.ramp_s)
        elif k == "link_ber":
            fab.degrade_ber(f.port, f.value)

    def _apply_protocol(self, idx: int, f: FaultSpec, start: bool) -> None:
        pr = self.protocol
        k = f.kind
        if k == "mqtt_stop":
            assert f.publisher is not None
            (pr.mqtt_stopped.add if start else pr.mqtt_stopped.discard)(f.publisher)
        else:
            assert f.device is not None
            m = pr.modbus[f.device]
            if k == "modbus_half_open":
                m.blackhole = start
            elif k == "modbus_slow":
                m.reply_delay_s = f.value if start else 0.0
            elif k == "modbus_max_registers":
                m.max_registers = int(f.value) if start else None
            elif k == "modbus_exception":
                assert f.code is not None
                if start:
                    m.exceptions[idx] = (f.code, f.unit, f.table, f.address, f.registers)
                else:
                    m.exceptions.pop(idx, None)
            elif k == "modbus_gap":
                if start:
                    m.exceptions[idx] = (2, f.unit, f.table, f.address, f.registers)
                else:
                    m.exceptions.pop(idx, None)
        pr.version += 1

    def inputs(self) -> dict[str, float]:
        """The scenario's current inputs (for telemetry and plots)."""
        return {
            "rack_power_w": self.rack_power_w,
            "facility_supply_temp_c": self.facility_supply_temp_c,
        }
