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

    [load]
    kind = "timeline"               # constant | step | timeline | agentic | training
    points = [[0.0, 39600.0], [60.0, 132000.0], [210.0, 39600.0]]
    mode = "hold"

    [facility]                      # optional facility water temperature timeline (°C)
    points = [[0.0, 40.0], [600.0, 44.0]]
    mode = "ramp"

    [[faults]]                      # applied at at_s, healed at until_s (if given)
    at_s = 120.0
    until_s = 180.0
    kind = "sensor"                 # pump_trip | valve_stuck | valve_offset | valve_slow |
    point = "supply_temp_c"         # sensor | leak | controller_restart
    mode = "freeze"

Everything here is pure: `ScenarioRun` applies the timeline to a `CduPlant` as plant time
advances and records every fault's start and end (the ground truth detection is scored on).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from rackplane.config import StrictModel, read_toml, validate_data
from rackplane.errors import ConfigError
from sims.cdu import CduParams, CduPlant
from sims.loads import (
    AgenticBurstLoad,
    ConstantLoad,
    LoadProfile,
    StepLoad,
    TimelineLoad,
    TrainingSquareWave,
)


class PlantSpec(StrictModel):
    """Plant parameters of a scenario (everything else: `CduParams` defaults, REFERENCE §4.3)."""

    rack_max_power_w: float = Field(132_000.0, gt=0, le=600_000)
    supply_setpoint_c: float = Field(45.0, ge=20, le=60)
    facility_supply_temp_c: float = Field(40.0, ge=5, le=60)
    heartbeat_timeout_s: float | None = Field(None, gt=0)


class LoadSpec(StrictModel):
    """Rack IT power over plant time."""

    kind: Literal["constant", "step", "timeline", "agentic", "training"] = "constant"
    power_w: float | None = Field(None, ge=0, description="constant: the power")
    low_w: float | None = Field(None, ge=0, description="step: before the step")
    high_w: float | None = Field(None, ge=0, description="step: after the step")
    step_at_s: float | None = Field(None, ge=0)
    back_at_s: float | None = Field(None, ge=0)
    points: list[tuple[float, float]] | None = None
    mode: Literal["hold", "ramp"] = "hold"
    period_s: float | None = Field(None, ge=1, le=10, description="training square wave")

    @model_validator(mode="after")
    def _fields(self) -> LoadSpec:
        needs = {
            "constant": ["power_w"],
            "step": ["low_w", "high_w", "step_at_s"],
            "timeline": ["points"],
            "agentic": [],
            "training": [],
        }[self.kind]
        missing = [n for n in needs if getattr(self, n) is None]
        if missing:
            raise ValueError(f"load kind {self.kind!r} needs {', '.join(missing)}")
        return self


class FacilitySpec(StrictModel):
    """Facility water supply temperature timeline in °C."""

    points: list[tuple[float, float]]
    mode: Literal["hold", "ramp"] = "ramp"


FaultKind = Literal[
    "pump_trip",
    "valve_stuck",
    "valve_offset",
    "valve_slow",
    "sensor",
    "leak",
    "controller_restart",
]


class FaultSpec(StrictModel):
    """One scripted fault: applied at ``at_s``, healed at ``until_s`` (None: never)."""

    at_s: float = Field(ge=0)
    until_s: float | None = Field(None, ge=0)
    kind: FaultKind
    pump: int = Field(0, ge=0, description="pump_trip: which pump (0 = duty A)")
    point: str | None = Field(None, description="sensor: the point whose transmitter fails")
    mode: Literal["freeze", "drop", "spike", "drift", "offset"] | None = None
    magnitude: float = 0.0
    rate_per_s: float = 0.0
    value: float = Field(0.0, description="valve_offset: % ; valve_slow: factor; leak: L/min")

    @model_validator(mode="after")
    def _fields(self) -> FaultSpec:
        if self.until_s is not None and self.until_s <= self.at_s:
            raise ValueError("until_s must be after at_s")
        if self.kind == "sensor" and (self.point is None or self.mode is None):
            raise ValueError("a sensor fault needs point and mode")
        return self


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
    faults: list[FaultSpec] = Field(default_factory=list)

    def cdu_params(self) -> CduParams:
        """Plant parameters for this scenario (REFERENCE §4.3 scaled to the rack power)."""
        overrides: dict[str, Any] = {}
        if self.plant.heartbeat_timeout_s is not None:
            overrides["heartbeat_timeout_s"] = self.plant.heartbeat_timeout_s
        return CduParams.for_rack_power(self.plant.rack_max_power_w, **overrides)

    def load_profile(self) -> LoadProfile:
        """The rack IT power profile, deterministic for the scenario's seed."""
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
        return TrainingSquareWave(pmax, period_s=spec.period_s or 4.0, seed=self.seed)

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
class ScenarioRun:
    """Applies a scenario's timeline to a plant as plant time advances (pure, no clock).

    Usage: ``run = ScenarioRun(scenario)``; ``plant = run.plant``; then each step
    ``run.step(dt)``; ``run.ground_truth`` lists the faults applied so far.
    """

    scenario: Scenario
    plant: CduPlant = field(init=False)
    load: LoadProfile = field(init=False)
    facility: LoadProfile = field(init=False)
    ground_truth: list[FaultRecord] = field(default_factory=list)
    _pending: list[tuple[float, int, str]] = field(default_factory=list)
    _active: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        s = self.scenario
        self.plant = CduPlant(s.cdu_params(), seed=s.seed)
        self.load = s.load_profile()
        self.facility = s.facility_profile()
        self.plant.warm_start(
            self.load.power_w(0.0),
            supply_setpoint_c=s.plant.supply_setpoint_c,
            facility_supply_temp_c=self.facility.power_w(0.0),
        )
        events: list[tuple[float, int, str]] = []
        for i, f in enumerate(s.faults):
            events.append((f.at_s, i, "start"))
            if f.until_s is not None:
                events.append((f.until_s, i, "end"))
        self._pending = sorted(events, reverse=True)  # pop() from the end: earliest first

    @property
    def t_s(self) -> float:
        """Plant time in s since the scenario started."""
        return self.plant.time_s

    @property
    def rack_power_w(self) -> float:
        return self.load.power_w(self.t_s)

    @property
    def facility_supply_temp_c(self) -> float:
        return self.facility.power_w(self.t_s)

    @property
    def done(self) -> bool:
        return self.t_s >= self.scenario.duration_s - 1e-9

    def step(self, dt_s: float = 0.1) -> None:
        """Apply due faults, then advance the plant by ``dt_s`` under the timeline's inputs."""
        while self._pending and self._pending[-1][0] <= self.t_s + 1e-9:
            _, idx, what = self._pending.pop()
            self._apply(idx, start=(what == "start"))
        self.plant.step(self.rack_power_w, self.facility_supply_temp_c, dt_s)

    def _apply(self, idx: int, *, start: bool) -> None:
        f = self.scenario.faults[idx]
        p = self.plant
        target = {
            "pump_trip": f"pump{f.pump}",
            "sensor": f.point or "",
            "leak": "loop",
            "controller_restart": "cdu",
        }.get(f.kind, "valve")
        if f.kind == "pump_trip":
            p.trip_pump(f.pump) if start else p.reset_pump(f.pump)
        elif f.kind == "valve_stuck":
            p.set_valve_stuck(start)
        elif f.kind == "valve_offset":
            p.set_valve_feedback_offset_pct(f.value if start else 0.0)
        elif f.kind == "valve_slow":
            p.set_valve_slow_factor(f.value if start else 1.0)
        elif f.kind == "sensor":
            assert f.point is not None and f.mode is not None
            if start:
                p.set_sensor_fault(f.point, f.mode, magnitude=f.magnitude, rate_per_s=f.rate_per_s)
            else:
                p.clear_sensor_fault(f.point)
        elif f.kind == "leak":
            p.set_leak_lpm(f.value if start else 0.0)
        elif f.kind == "controller_restart" and start:
            p.restart_controller()
        if start:
            self._active[idx] = len(self.ground_truth)
            self.ground_truth.append(FaultRecord(f.kind, target, self.t_s, None))
        elif idx in self._active:
            rec = self.ground_truth[self._active.pop(idx)]
            self.ground_truth[self.ground_truth.index(rec)] = FaultRecord(
                rec.kind, rec.target, rec.start_s, self.t_s
            )

    def inputs(self) -> dict[str, float]:
        """The scenario's current inputs (for telemetry and plots)."""
        return {
            "rack_power_w": self.rack_power_w,
            "facility_supply_temp_c": self.facility_supply_temp_c,
        }
