"""The pumps' configuration: the units (names and points) and the speed loop's settings
(`valvey.core.pumps` has the behaviour; its module docstring explains each setting's use).
Pure: no I/O."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from rackplane.config import StrictModel

__all__ = ["Constraint", "PumpLoopSettings", "PumpSettings", "PumpUnit"]


class PumpUnit(StrictModel):
    """One pump's register-map points (None: the CDU does not report it)."""

    name: str = Field(pattern=r"^[a-z0-9]{1,8}$")
    running: str | None = None
    fault: str | None = None
    speed: str | None = None
    run_hours: str | None = None

    @classmethod
    def generic(cls, letter: str) -> PumpUnit:
        """The ``cdu-generic`` points of pump ``letter``."""
        return cls(name=letter, running=f"pump_{letter}_running", fault=f"pump_{letter}_fault",
                   speed=f"pump_{letter}_speed_pct", run_hours=f"pump_{letter}_run_hours_h")


class PumpSettings(StrictModel):
    """Pumps, lead/lag and failover (module docstring). Each pump's points are the templates
    with ``{name}`` replaced (e.g. ``pump_a_running``); an empty template: not reported."""

    names: list[str] = Field(
        default_factory=lambda: ["a", "b"], min_length=1, max_length=4,
        description="pumps in duty_select index order",
    )
    running_point: str = Field("pump_{name}_running", description="1 = running")
    fault_point: str = Field("pump_{name}_fault", description="1 = VFD fault / trip")
    speed_point: str = Field("pump_{name}_speed_pct", description="speed feedback, %")
    run_hours_point: str = Field("pump_{name}_run_hours_h", description="run hours, h")
    duty_select: str | None = Field(
        "duty_pump_select", description="register holding the duty pump's index (written on "
        "changeover, read back); None: one pump, no failover"
    )
    speed_command: str = Field("pump_speed_command_pct", description="duty pump speed demand")
    rotate_after_h: float | None = Field(
        100.0, gt=0, description="rotate when the duty pump ran this much longer than a "
        "healthy standby (None: never) [U]"
    )
    rotation_check_s: float = Field(3600.0, gt=0)
    trip_flow_fraction: float = Field(0.5, gt=0, lt=1, description="REFERENCE §3.4: 50 %")
    trip_dp_fraction: float = Field(0.25, gt=0, lt=1, description="DP ∝ Q²: 25 % = 50 % flow")
    trip_samples: int = Field(3, ge=1, le=50, description="REFERENCE §3.4: 3 samples at 10 Hz")
    running_grace_s: float = Field(1.0, ge=0, le=30)
    changeover_delay_s: float = Field(
        0.0, ge=0, le=0.5, description="wait after the trip before selecting the standby "
        "(vendor default 0.25 s between stop and start, REFERENCE §1.5; the detection tick "
        "already adds up to 0.1 s)"
    )
    handoff_max_s: float = Field(10.0, gt=0, le=60)
    reference_tau_s: float = Field(10.0, gt=0, le=600)
    stale_after_s: float = Field(1.0, gt=0, le=30, description="status readings older: unknown")

    @model_validator(mode="after")
    def _check(self) -> PumpSettings:
        names = self.names
        if len(set(names)) != len(names) or not all(
                re.fullmatch(r"[a-z0-9]{1,8}", n) for n in names):
            raise ValueError("pump names must be distinct, 1-8 of a-z 0-9")
        if len(names) > 1 and self.duty_select is None:
            raise ValueError("several pumps need duty_select (the register that selects one)")
        return self

    def units(self) -> list[PumpUnit]:
        """The pumps with their points."""
        def pt(t: str, n: str) -> str | None:
            return t.replace("{name}", n) if t else None
        return [PumpUnit(name=n, running=pt(self.running_point, n), fault=pt(self.fault_point, n),
                         speed=pt(self.speed_point, n), run_hours=pt(self.run_hours_point, n))
                for n in self.names]


class PumpLoopSettings(StrictModel):
    """Pump speed loop (module docstring). Gains: SIMC (REFERENCE §2.2) on DP = K·Q², Q ∝ n:
    dDP/dn ≈ 2·150 kPa / 0.825 ≈ 3.6 kPa/%, τ ≈ 1 s (flow lag), θ ≈ 0.5 s (transmitter lag
    and half a period), τc = 2 s: Kc = 1/(3.6·2.5) ≈ 0.11 %/kPa, τI = min(1, 10) s → 2 s for
    a 1 s period [D]."""

    mode: Literal["diff_pressure", "flow"] = "diff_pressure"
    dp_setpoint_kpa: float = Field(
        150.0, gt=0, description="REFERENCE §1.4 window 0.5–3 bar; the design DP; within "
        "[dp_setpoint_min_kpa, dp_setpoint_max_kpa]"
    )
    dp_setpoint_min_kpa: float = Field(
        50.0, gt=0, description="lowest DP setpoint a command may set, kPa (REFERENCE §1.4 "
        "loop DP window 0.5–3 bar [S2])"
    )
    dp_setpoint_max_kpa: float = Field(
        300.0, gt=0, description="highest DP setpoint a command may set, kPa (REFERENCE §1.4 "
        "0.5–3 bar [S2]); must stay below max_pressure_kpa (the protective maximum)"
    )
    flow_setpoint_lpm: float | None = Field(
        None, gt=0, description="the flow setpoint of mode 'flow', L/min: the site's (the "
        "rack vendor's design flow, REFERENCE §1.4: 1.5 L/min per kW of rack power, 1.2-2.0 "
        "in use), within [flow_setpoint_min_lpm, flow_setpoint_max_lpm]; required in mode "
        "'flow', unused in 'diff_pressure'"
    )
    flow_setpoint_min_lpm: float = Field(
        50.0, gt=0, description="lowest flow setpoint a command may set, L/min (Vertiv CDU 600 "
        "flow setpoint range 50–500 L/min, REFERENCE §1.5 [S])"
    )
    flow_setpoint_max_lpm: float = Field(
        500.0, gt=0, description="highest flow setpoint a command may set, L/min (Vertiv CDU "
        "600: 50–500 L/min [S])"
    )
    setpoint_ramp_per_min: float | None = Field(
        60.0, gt=0, description="kPa or L/min per minute (None: at once)"
    )
    period_s: float = Field(1.0, ge=0.1, le=10)
    dp_kc_pct_per_kpa: float = Field(0.11, gt=0)
    dp_ti_s: float = Field(2.0, gt=0)
    flow_kc_pct_per_lpm: float = Field(0.2, gt=0)
    flow_ti_s: float = Field(2.0, gt=0)
    deadband: float = Field(1.0, ge=0, description="error dead zone, kPa or L/min")
    speed_min_pct: float = Field(15.0, ge=0, le=100, description="Vertiv default (REF §1.5)")
    speed_max_pct: float = Field(100.0, ge=0, le=100)
    rate_limit_pct_per_s: float = Field(10.0, gt=0, description="below the 20 %/s VFD ramp")
    min_step_pct: float = Field(0.3, ge=0)
    max_pressure_kpa: float | None = Field(
        450.0, gt=0, description="pump discharge (loop static + DP) limit: the maximum-pressure "
        "override (None: off) [U]; keep below the relief valve (600 kPa) less 10 %"
    )
    max_pressure_kc_pct_per_kpa: float = Field(0.3, gt=0)
    max_pressure_ti_s: float = Field(2.0, gt=0)
    stale_after_s: float = Field(3.0, gt=0, le=60)
    failsafe_after_periods: int = Field(3, ge=1, le=100)
    failsafe_speed_pct: float | None = Field(
        85.0, ge=0, le=100, description="speed when the PV is lost (None: hold) [U]: about "
        "design flow"
    )
    stop_action: Literal["hold", "failsafe"] = "hold"

    @model_validator(mode="after")
    def _check(self) -> PumpLoopSettings:
        if self.speed_min_pct >= self.speed_max_pct:
            raise ValueError("speed_min_pct must be below speed_max_pct")
        fs = self.failsafe_speed_pct
        if fs is not None and not self.speed_min_pct <= fs <= self.speed_max_pct:
            raise ValueError("failsafe_speed_pct must lie within the speed limits")
        if self.stop_action == "failsafe" and fs is None:
            raise ValueError("stop_action 'failsafe' needs failsafe_speed_pct")
        if not self.dp_setpoint_min_kpa < self.dp_setpoint_max_kpa:
            raise ValueError(f"dp_setpoint_min_kpa = {self.dp_setpoint_min_kpa:g} must be below "
                             f"dp_setpoint_max_kpa = {self.dp_setpoint_max_kpa:g}")
        pmax = self.max_pressure_kpa
        if pmax is not None and self.dp_setpoint_max_kpa >= pmax:
            raise ValueError(f"dp_setpoint_max_kpa = {self.dp_setpoint_max_kpa:g} kPa must be "
                             f"below max_pressure_kpa = {pmax:g} kPa (a DP setpoint above the "
                             "protective maximum fights the pressure override)")
        if not self.flow_setpoint_min_lpm < self.flow_setpoint_max_lpm:
            raise ValueError(f"flow_setpoint_min_lpm = {self.flow_setpoint_min_lpm:g} must be "
                             f"below flow_setpoint_max_lpm = {self.flow_setpoint_max_lpm:g}")
        if self.mode == "flow" and self.flow_setpoint_lpm is None:
            raise ValueError("pump_loop.mode 'flow' needs flow_setpoint_lpm: the rack's design "
                             "flow from its vendor (REFERENCE §1.4: 1.5 L/min per kW)")
        lo, hi, name, unit = self.setpoint_limits
        if not lo <= self.setpoint <= hi:
            raise ValueError(f"{name} = {self.setpoint:g} {unit} is outside [{lo:g}, {hi:g}] "
                             f"{unit} (the {name[:-4]}_min/_max limits)")
        return self

    @property
    def setpoint_limits(self) -> tuple[float, float, str, str]:
        """(low, high, setpoint key, unit) of the chosen mode: the limits a command's
        setpoint must lie within."""
        if self.mode == "diff_pressure":
            return self.dp_setpoint_min_kpa, self.dp_setpoint_max_kpa, "dp_setpoint_kpa", "kPa"
        return (self.flow_setpoint_min_lpm, self.flow_setpoint_max_lpm, "flow_setpoint_lpm",
                "L/min")

    @property
    def setpoint(self) -> float:
        """The configured setpoint of the chosen mode (kPa or L/min)."""
        if self.mode == "diff_pressure" or self.flow_setpoint_lpm is None:  # None: validated
            return self.dp_setpoint_kpa
        return self.flow_setpoint_lpm


Constraint = Literal["diff_pressure", "flow", "max_pressure", "min_speed", "max_speed",
                     "handoff", "isolated", "failsafe", "manual", "initialising"]
