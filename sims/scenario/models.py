"""The scenario file's models (`Scenario` and its sections, `FaultSpec` and the fault kinds):
what a scenario TOML may say, validated (the package docstring of `sims.scenario` documents the
keys and fault kinds)."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, model_validator

from rackplane.config import StrictModel
from sims.cdu import CduParams
from sims.cdu.variants import VARIANTS, apply_variant
from sims.environment import EnvironmentParams
from sims.power import PowerShelfParams
from sims.rack import ComputeRackParams, NodeAgentSettings
from sims.row import FabricMode, VirtualRackParams
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
    "FaultSpec",
    "LoadSpec",
    "PlantSpec",
    "PowerSpec",
    "Scenario",
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
    variant: str = Field(
        "nominal", description="plant-family member (`sims.cdu.variants.VARIANTS`)"
    )

    @model_validator(mode="after")
    def _known_variant(self) -> PlantSpec:
        if self.variant not in VARIANTS:
            raise ValueError(f"unknown plant variant {self.variant!r}; known: "
                             f"{', '.join(VARIANTS)}")
        return self


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


class FaultSpec(StrictModel):
    """One scripted fault: applied at ``at_s``, healed at ``until_s`` (None: never, or at its
    own end for self-ending kinds). Fields per kind: see the `sims.scenario` docstring."""

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
    """A scenario file (see the `sims.scenario` docstring for the format)."""

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
        return apply_variant(
            CduParams.for_rack_power(self.plant.rack_max_power_w, **overrides),
            self.plant.variant,
        )

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

    def n_racks(self) -> int:
        """Racks on the CDU: 1, or N on a row CDU (the ``racks_N`` plant variants)."""
        return self.cdu_params().n_racks

    def rack_load(self, rack: int = 0) -> tuple[LoadSpec, int]:
        """Rack ``rack``'s load spec and seed on a row CDU (rack 0: the scenario's own).

        The racks of a row step independently, each deterministic: with ``n`` racks and
        Δ = min(15 s, (back_at_s − step_at_s) / (2 n)) (15 s without a step back), a step
        load's rack k steps up k·Δ after the scenario's step and back (n − k)·Δ after its step
        back (rack 0 is the scenario's own; the later up, the earlier down), by
        ``1 − 0.5·frac(k·φ)`` of the scenario's step (φ the golden ratio: sizes spread over
        (0.5, 1], no two alike, so every rack is within its own ``rack_max_power_w`` and the
        row within the CDU's N racks); a seeded
        load (agentic bursts, training waves) has seed ``seed + 1000 k``; a timeline is k·Δ
        later (its first point held before); constant and burn-in loads are the same on every
        rack (idle: its own seed).

        Raises:
            ValueError: ``rack`` outside 0..n_racks − 1.
        """
        n = self.n_racks()
        if not 0 <= rack < n:
            raise ValueError(f"rack {rack} outside 0..{n - 1}")
        spec, seed = self.load, self.seed + 1000 * rack
        if rack == 0:
            return spec, self.seed
        lo, hi, up, back = spec.low_w, spec.high_w, spec.step_at_s, spec.back_at_s
        dt = 15.0 if up is None or back is None else min(15.0, (back - up) / (2 * n))
        if spec.kind == "step" and lo is not None and hi is not None and up is not None:
            size = 1.0 - 0.5 * math.modf(rack * (1.0 + 5.0 ** 0.5) / 2.0)[0]
            spec = spec.model_copy(update={
                "high_w": lo + (hi - lo) * size, "step_at_s": up + rack * dt,
                "back_at_s": None if back is None else back + (n - rack) * dt})
        elif spec.kind == "timeline" and spec.points:
            pts = [(t + rack * dt, v) for t, v in spec.points]
            spec = spec.model_copy(update={"points": [(0.0, pts[0][1]), *pts]})
        return spec, seed

    def load_profile(self, rack: int = 0) -> LoadProfile:
        """The rack IT power profile, deterministic for the scenario's seed (idle and burn-in
        as their constant rack power at 20 % / ``fraction`` of ``rack_max_power_w``); on a
        row CDU, rack ``rack``'s (`rack_load`)."""
        spec, seed = self.rack_load(rack)
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
            return AgenticBurstLoad(pmax, seed=seed)
        if spec.kind == "idle":
            return ConstantLoad(0.2 * pmax)
        if spec.kind == "burn_in":
            return ConstantLoad((1.0 if spec.fraction is None else spec.fraction) * pmax)
        return TrainingSquareWave(
            pmax,
            period_s=spec.period_s or 4.0,
            seed=seed,
            high_fraction=1.0 if spec.high_fraction is None else spec.high_fraction,
            low_fraction=0.65 if spec.low_fraction is None else spec.low_fraction,
        )

    def workload(self, gpus: int, fraction_for_power: Any, rack: int = 0) -> Workload:
        """The per-GPU workload of the rack model (``fraction_for_power``: rack W -> fraction
        of TGP, for the power-profile kinds); on a row CDU, rack ``rack``'s (`rack_load`)."""
        spec, seed = self.rack_load(rack)
        if spec.kind == "agentic":
            kw: dict[str, Any] = {}
            if spec.spike_rate_per_h is not None:
                kw["spike_rate_per_h"] = spec.spike_rate_per_h
            if spec.concurrency_min is not None:
                kw["concurrency_min"] = spec.concurrency_min
            return AgenticWorkload(gpus, seed=seed, **kw)
        if spec.kind == "training":
            return TrainingWorkload(
                gpus,
                seed=seed,
                period_s=spec.period_s or 4.0,
                high_fraction=1.0 if spec.high_fraction is None else spec.high_fraction,
                low_fraction=0.65 if spec.low_fraction is None else spec.low_fraction,
            )
        if spec.kind == "idle":
            return IdleWorkload(gpus, seed=seed)
        if spec.kind == "burn_in":
            return BurnInWorkload(
                gpus,
                fraction=1.0 if spec.fraction is None else spec.fraction,
                traffic=0.5 if spec.traffic is None else spec.traffic,
            )
        return RackPowerWorkload(self.load_profile(rack), fraction_for_power, gpus)

    def facility_profile(self) -> LoadProfile:
        """Facility water supply temperature (°C) over time, as a profile of plain numbers."""
        if self.facility is None:
            return ConstantLoad(self.plant.facility_supply_temp_c)
        return TimelineLoad(self.facility.points, mode=self.facility.mode)

