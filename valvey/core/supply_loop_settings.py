"""The supply-temperature loop's settings, its per-tick decision (`LoopStep`) and its alarms
(`valvey.core.supply_loop` has the behaviour; its module docstring explains each setting's
use). Pure: no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, model_validator

from rackplane.config import StrictModel
from rackplane.core.alarms import AlarmDef
from rackplane.core.pid import PidOutput, PidSettings
from rackplane.core.samples import Quality

__all__ = [
    "SUPPLY_LOOP_FAILSAFE",
    "SUPPLY_LOOP_INITIALISING",
    "SUPPLY_PV_INVALID",
    "SUPPLY_TEMP_DEVIATION",
    "SUPPLY_VALVE_SATURATED",
    "TICK_S",
    "ControlMode",
    "LoopMode",
    "LoopStep",
    "PvStatus",
    "SupplyLoopSettings",
    "default_alarm_defs",
]

TICK_S = 0.1
"""The daemons' control tick (DESIGN §3: 10 Hz); slower loops run at a multiple of it."""

ControlMode = Literal["initialising", "auto", "manual", "failsafe"]
LoopMode = Literal["initialising", "auto", "manual", "failsafe", "shadow"]
PvStatus = Literal["ok", "missing", "bad", "stale", "out_of_range", "frozen"]

SUPPLY_PV_INVALID = "supply_pv_invalid"
SUPPLY_LOOP_FAILSAFE = "supply_loop_failsafe"
SUPPLY_TEMP_DEVIATION = "supply_temp_deviation"
SUPPLY_VALVE_SATURATED = "supply_valve_saturated"
SUPPLY_LOOP_INITIALISING = "supply_loop_initialising"


class SupplyLoopSettings(StrictModel):
    """Settings of the supply-temperature loop (units in the names).

    Defaults and their sources:

    * ``setpoint_c`` 45 °C: Vera Rubin / warm-water operating point (REFERENCE §1.4).
      ``setpoint_min_c`` 25 °C (older DLC practice, §1.4) and ``setpoint_max_c`` 48 °C
      (GPU junction budget at 45 °C inlet is tight, §1.6) are design choices [U].
    * Gains: SIMC (REFERENCE §2.2) on the §1.7 valve model k = 37 K per unit stroke
      = 0.37 K/%, τ1 = 35 s, θ = 2 s, τc = 3 s: Kc = τ1 / (k·(τc + θ)) = 35 / (37 × 5)
      = 0.189 per K = **18.9 %/K** (REFERENCE rounds it to 0.19), τI = min(τ1, 4(τc + θ))
      = **20 s**, so ki = Kc/τI = 0.945 %/(K·s); no derivative. At full load the plant gain
      is ≈ 25 K/unit, where these gains are on the aggressive side (§2.2); τc = 10 s gives
      the smoother 7.9 %/K, τI 35 s.
    * ``output_rate_limit_pct_per_s`` 1.6 %/s: the valve strokes 100 % in ~60 s (1.67 %/s,
      REFERENCE §1.7 model; Belimo 90 s / 60 mm, §1.5). Commanding no faster than the actuator
      moves keeps the command, the integrator (which tracks the rate-limited command) and the
      real valve together; 30 → 100 % load needs ≈ 24 % of travel, i.e. ≈ 15 s.
    * ``min_step_pct`` 1 % and ``deadband_k`` 0.1 K: REFERENCE §4.5 (valve wear, "hunting"
      criterion of 20 % active time, §1.5).
    * ``stale_after_s`` 3 s (3 periods of a 1 Hz loop; must exceed the source's refresh
      interval: a publish-on-change source with a 100 s heartbeat needs its own freshness).
    * ``failsafe_after_periods`` 3: the fail-safe acts ≤ 3 s after the first bad period; at
      the worst loss-of-cooling rate (0.46 K/s, §1.7) that is ≈ 1.4 K.
    * ``failsafe_output_pct`` 100 %: on a warm-water loop, full cooling is bounded by the
      facility water (W40: ≤ ~42 °C, a 3 K approach, §1.4), far above any dew point, while
      holding a stale position through a load step lets the supply reach 53.9 °C (§4.5,
      frozen sensor). None = hold the last command (the Vertiv default on signal loss, §1.5);
      use that (or a lower value) when the facility water can be colder than dew point +
      2–3 K (§8).
    * ``stop_action`` ``hold``: on a clean stop the valve keeps its last command and the CDU
      falls back to local control through the heartbeat register (DESIGN §3);
      ``failsafe`` writes ``failsafe_output_pct`` (then that must be set).
    * Deviation condition: ±2 K for ≥ 120 s, cleared below 1 K (REFERENCE §8, Coolcentric);
      the 20 min start-up mask is the alarm definition's (`default_alarm_defs`).
    """

    setpoint_c: float = Field(45.0, allow_inf_nan=False)
    setpoint_min_c: float = Field(25.0, allow_inf_nan=False)
    setpoint_max_c: float = Field(48.0, allow_inf_nan=False)
    period_s: float = Field(1.0, ge=TICK_S, le=60.0)
    kc_pct_per_k: float = Field(18.9, gt=0.0, allow_inf_nan=False)
    ti_s: float | None = Field(20.0, gt=0.0, allow_inf_nan=False, description="None = no I")
    td_s: float = Field(0.0, ge=0.0, allow_inf_nan=False)
    output_min_pct: float = Field(0.0, ge=0.0, le=100.0)
    output_max_pct: float = Field(100.0, ge=0.0, le=100.0)
    output_rate_limit_pct_per_s: float = Field(1.6, gt=0.0, allow_inf_nan=False)
    min_step_pct: float = Field(1.0, ge=0.0, allow_inf_nan=False)
    deadband_k: float = Field(0.1, ge=0.0, le=2.0)
    stale_after_s: float = Field(3.0, gt=0.0, allow_inf_nan=False)
    pv_valid_min_c: float = Field(5.0, allow_inf_nan=False)
    pv_valid_max_c: float = Field(90.0, allow_inf_nan=False)
    pv_frozen_after_s: float | None = Field(
        None,
        gt=0.0,
        allow_inf_nan=False,
        description="an exactly unchanged value for this long counts as invalid (None = off; "
        "REFERENCE §5 S5 suggests 10 s when sensor noise is expected)",
    )
    failsafe_after_periods: int = Field(3, ge=1, le=100)
    failsafe_output_pct: float | None = Field(100.0, allow_inf_nan=False)
    stop_action: Literal["hold", "failsafe"] = "hold"
    shadow: bool = False
    deviation_warn_k: float = Field(2.0, gt=0.0, allow_inf_nan=False)
    deviation_hysteresis_k: float = Field(1.0, ge=0.0, allow_inf_nan=False)
    deviation_on_delay_s: float = Field(120.0, ge=0.0, allow_inf_nan=False)
    deviation_off_delay_s: float = Field(0.0, ge=0.0, allow_inf_nan=False)
    setpoint_ramp_k_per_min: float | None = Field(
        1.0, gt=0.0, allow_inf_nan=False,
        description="a new setpoint is approached at this rate (None: at once) [U: typical "
        "supervisory slew; REFERENCE §1.5 gives ≤ 10 %/min of valve travel]",
    )
    pv_filter_tau_s: float = Field(
        1.0, ge=0.0, le=30.0, allow_inf_nan=False,
        description="first-order filter on the 10 Hz PV before the 1 Hz PID (0: none); "
        "1 s cuts σ 0.03 K sensor noise to ≈ 0.007 K at 1 s of lag [D]",
    )

    @model_validator(mode="after")
    def _check(self) -> SupplyLoopSettings:
        problems = []
        if not self.setpoint_min_c <= self.setpoint_c <= self.setpoint_max_c:
            problems.append(
                f"setpoint_c = {self.setpoint_c:g} °C is outside [setpoint_min_c, "
                f"setpoint_max_c] = [{self.setpoint_min_c:g}, {self.setpoint_max_c:g}] °C")
        lo, hi = self.pv_valid_min_c, self.pv_valid_max_c
        if not lo < self.setpoint_min_c <= self.setpoint_max_c < hi:
            problems.append(
                "need pv_valid_min_c < setpoint_min_c <= setpoint_max_c < pv_valid_max_c "
                f"(they are {lo:g}, {self.setpoint_min_c:g}, {self.setpoint_max_c:g}, "
                f"{hi:g} °C)"
            )
        ticks = self.period_s / TICK_S
        if abs(ticks - round(ticks)) > 1e-6:
            problems.append(f"period_s must be a multiple of the {TICK_S} s control tick")
        if not self.output_min_pct < self.output_max_pct:
            problems.append("output_min_pct must be below output_max_pct")
        if self.min_step_pct >= self.output_max_pct - self.output_min_pct:
            problems.append("min_step_pct must be smaller than the output span")
        if self.stale_after_s < self.period_s:
            problems.append("stale_after_s must be at least period_s")
        if self.failsafe_output_pct is not None and not (
            self.output_min_pct <= self.failsafe_output_pct <= self.output_max_pct
        ):
            problems.append("failsafe_output_pct must lie within the output limits")
        if self.stop_action == "failsafe" and self.failsafe_output_pct is None:
            problems.append("stop_action 'failsafe' needs failsafe_output_pct (None = hold)")
        if self.deviation_hysteresis_k > self.deviation_warn_k:
            problems.append("deviation_hysteresis_k must not exceed deviation_warn_k")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def pid_settings(self) -> PidSettings:
        """The `PidSettings` these settings imply (direct acting, ki = Kc/τI, kd = Kc·τD)."""
        return PidSettings(
            kp=self.kc_pct_per_k,
            ki=0.0 if self.ti_s is None else self.kc_pct_per_k / self.ti_s,
            kd=self.kc_pct_per_k * self.td_s,
            action="direct",
            output_min=self.output_min_pct,
            output_max=self.output_max_pct,
            error_deadband=self.deadband_k,
        )


@dataclass(frozen=True, slots=True)
class LoopStep:
    """What one `SupplyLoop.step` decided.

    Attributes:
        t_mono: the step's monotonic time [s].
        mode: effective mode (``shadow`` whenever shadow is on, else ``control_mode``).
        control_mode: initialising | auto | manual | failsafe (also computed in shadow).
        command_pct: the loop's current valve command [%], None before initialisation.
        write: write ``command_pct`` to the valve now (never in shadow; only on a period
            boundary; quantised by ``min_step_pct``).
        pid_updated: the PID ran in this step.
        pid: the PID's last result (its P, I, D, FF terms), None if it never ran.
        setpoint_c: the setpoint [°C].
        pv_c: the supply temperature used (usable samples only) [°C], else None.
        pv_status: ok | missing | bad | stale | out_of_range | frozen.
        pv_quality, pv_age_s: of the sample given (None without a sample).
        deviation_c: pv_c − setpoint_c, or None.
        bad_periods: consecutive periods without a usable PV.
        conditions: alarm conditions (see `default_alarm_defs`).
        transitions: state changes in this step, e.g. ``mode:auto->failsafe``,
            ``pv:ok->stale`` (log each once).
        setpoint_target_c: the operator's setpoint (``setpoint_c`` ramps towards it and is
            raised to the floor when one is set).
        constraint: what sets the loop's setpoint: ``setpoint`` or the floor's name (e.g.
            ``dew_point_floor``: the min/max selector's winner).
    """

    t_mono: float
    mode: LoopMode
    control_mode: ControlMode
    command_pct: float | None
    write: bool
    pid_updated: bool
    pid: PidOutput | None
    setpoint_c: float
    pv_c: float | None
    pv_status: PvStatus
    pv_quality: Quality | None
    pv_age_s: float | None
    deviation_c: float | None
    bad_periods: int
    conditions: Mapping[str, bool]
    transitions: tuple[str, ...]
    setpoint_target_c: float = 0.0
    constraint: str = "setpoint"



def default_alarm_defs() -> list[AlarmDef]:
    """Alarm definitions for the loop's conditions (REFERENCE §8 and §1.5 defaults)."""
    return [
        AlarmDef(
            id=SUPPLY_PV_INVALID,
            severity="major",
            # The first Modbus poll lands a few hundred ms after start: without an on-delay
            # every start would raise and clear this alarm. Fail-safe timing is separate
            # (failsafe_after_periods) and not delayed by this.
            on_delay_s=2.0,
            message="Supply temperature measurement invalid (missing, bad, stale or frozen)",
            runbook="valvey.supply_pv_invalid",
        ),
        AlarmDef(
            id=SUPPLY_LOOP_FAILSAFE,
            severity="critical",
            latch=True,
            message="Supply temperature loop in fail-safe: valve at its fail-safe position",
            runbook="valvey.supply_loop_failsafe",
        ),
        AlarmDef(
            id=SUPPLY_TEMP_DEVIATION,
            severity="warning",
            startup_inhibit_s=1200.0,  # 20 min start-up mask (REFERENCE §1.5/§8)
            message="Supply temperature more than 2 K from setpoint for 2 min",
            runbook="valvey.supply_temp_deviation",
        ),
        AlarmDef(
            id=SUPPLY_VALVE_SATURATED,
            severity="minor",
            on_delay_s=60.0,
            off_delay_s=30.0,
            message="Facility valve saturated: the loop cannot reach its setpoint",
            runbook="valvey.supply_valve_saturated",
        ),
        AlarmDef(
            id=SUPPLY_LOOP_INITIALISING,
            severity="major",
            on_delay_s=30.0,
            message="Supply loop not running: no valve read-back to start from",
            runbook="valvey.supply_loop_initialising",
        ),
    ]
