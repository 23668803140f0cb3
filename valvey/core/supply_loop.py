"""Supply-temperature loop core of valvey: coolant supply temperature -> facility valve command.

Pure (no clock, no I/O): the daemon calls `SupplyLoop.step` on every 10 Hz tick with the
monotonic time, the latest ``supply_temp_c`` `Sample`, the valve read-back and an optional
feedforward, and writes ``command_pct`` to the valve when ``write`` is True.

Behaviour (DESIGN §1 "Outputs are owned", §3 Safety; FIELD-CASES BR-09, BR-14, BR-16, BR-25):

* The PID (`rackplane.core.pid.PidLoop`, direct acting: the valve opens as the supply warms) runs
  once per ``period_s`` (a multiple of the 0.1 s tick) however often `step` is called. Its
  ``dt`` is the real monotonic time since the PID state was last updated (or held, see below),
  never a constant, and a wall-clock step cannot reach it.
* Start: the first step that has a valve read-back initialises bumplessly from it (the read-back
  is written back once, taking ownership); the PID then starts with ``I := u − P − D − FF``.
  With no read-back yet the loop stays ``initialising`` and writes nothing (unless the PV is
  bad long enough for the fail-safe, which does not need to know the valve position).
* PV validation: a sample is used only if GOOD, finite, not older than ``stale_after_s``,
  inside ``[pv_valid_min_c, pv_valid_max_c]`` and (optionally) not frozen. Invalid samples
  never reach the PID (BR-09) and the derivative never spans a gap.
* Each period without a usable PV is a bad period: ``supply_pv_invalid`` is true from the first
  one, the command holds, and after ``failsafe_after_periods`` bad periods the command goes to
  ``failsafe_output_pct`` at once (safety wins over the rate limit), or holds if that setting
  is None. When the PV is good again the loop returns to auto bumplessly from the fail-safe
  command, rate-limited.
* Every other move is rate-limited (``output_rate_limit_pct_per_s``) and the PID integrator
  tracks the rate-limited command (no windup against the limiter). Writes are quantised for
  valve wear (REFERENCE §4.5): a new command is written only when it differs from the last
  written one by at least ``min_step_pct``, or reaches an output limit, or is an operator's
  manual target, or is a fail-safe; the PID's error dead zone is ``deadband_k``.
* Manual: `set_manual` (operator output, rate-limited, within the output limits), `set_auto`
  bumpless from the current command. The fail-safe applies in auto only: in manual the
  operator owns the valve (``supply_pv_invalid`` still raises).
* Shadow (commissioning): everything is computed, ``write`` is always False, and the loop
  tracks the real valve read-back so what it would command is computed from where the valve
  actually is (and the hand-over to live control is bumpless).

Alarm conditions are returned as bools for the `rackplane.core.alarms.AlarmEngine`
(`default_alarm_defs` gives their definitions).
"""

from __future__ import annotations

import math
import numbers

from rackplane.core.detect.threshold import ThresholdDetector
from rackplane.core.pid import PidLoop
from rackplane.core.samples import Quality, Sample, slots_constructor
from rackplane.errors import CommandError
from valvey.core.supply_loop_settings import (
    SUPPLY_LOOP_FAILSAFE,
    SUPPLY_LOOP_INITIALISING,
    SUPPLY_PV_INVALID,
    SUPPLY_TEMP_DEVIATION,
    SUPPLY_VALVE_SATURATED,
    TICK_S,
    ControlMode,
    LoopStep,
    PvStatus,
    SupplyLoopSettings,
)

__all__ = [
    "SupplyLoop",
]

_PERIOD_TOLERANCE_S = TICK_S / 2
"""A period is due when this close to its nominal length (ticks jitter by a few ms)."""

_EPS = 1e-9

_new_loop_step = slots_constructor(LoopStep)  # built on every tick


def _is_finite_number(value: object) -> bool:
    """A real number (numpy scalars included, bool excluded) that is finite."""
    if value.__class__ is float:  # the per-tick case, without the ABC isinstance check
        return math.isfinite(value)
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def _finite_or_value_error(name: str, value: float) -> float:
    if not _is_finite_number(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


class SupplyLoop:
    """The supply-temperature loop. See the module docstring for the behaviour.

    Args:
        settings: `SupplyLoopSettings`.
    """

    def __init__(self, settings: SupplyLoopSettings):
        self._s = settings
        self._pid = PidLoop(settings.pid_settings(), settings.setpoint_c)
        self._setpoint = settings.setpoint_c
        self._mode: ControlMode = "initialising"
        self._shadow = settings.shadow
        self._manual_target: float | None = None
        self._command: float | None = None
        self._written: float | None = None
        self._force_write = False
        self._t_last: float | None = None
        self._t_period: float | None = None
        self._t_pid: float | None = None
        self._bad_periods = 0
        self._pv_status: PvStatus = "missing"
        self._frozen_value: float | None = None
        self._frozen_since: float | None = None
        self._deviation = self._make_detector(settings)
        self._pending: list[str] = []
        self._sp_ramped = settings.setpoint_c  # the ramp's current value
        self._sp_used = settings.setpoint_c  # what the PID regulates to (ramp, floor)
        self._floor: float | None = None
        self._floor_name = "setpoint"
        self._constraint = "setpoint"
        self._pv_filt: float | None = None
        self._pv_filt_t: float | None = None
        self._hold = False

    @staticmethod
    def _make_detector(s: SupplyLoopSettings) -> ThresholdDetector:
        return ThresholdDetector(
            high=s.deviation_warn_k,
            hysteresis=s.deviation_hysteresis_k,
            on_delay_s=s.deviation_on_delay_s,
            off_delay_s=s.deviation_off_delay_s,
        )

    # --- properties ------------------------------------------------------------------------

    @property
    def settings(self) -> SupplyLoopSettings:
        """The current settings."""
        return self._s

    @property
    def setpoint_c(self) -> float:
        """The operator's setpoint [°C] (the target of the ramp)."""
        return self._setpoint

    @property
    def effective_setpoint_c(self) -> float:
        """What the PID regulates to now [°C]: the ramped setpoint, raised to the floor."""
        return self._sp_used

    @property
    def constraint(self) -> str:
        """``setpoint`` or the name of the floor that wins (the selector's winner)."""
        return self._constraint

    def set_floor(self, floor_c: float | None, name: str = "floor") -> None:
        """A lower bound on the setpoint (the min/max selector's max-select: e.g. the dew-point
        floor, supply ≥ dew point + margin, REFERENCE §8). None removes it. It applies from
        the next period, at once (a safety constraint is not ramped).

        Raises:
            ValueError: not finite.
        """
        if floor_c is not None:
            floor_c = _finite_or_value_error("floor_c", floor_c)
        self._floor = floor_c
        self._floor_name = name

    def set_hold(self, on: bool, name: str = "hold") -> None:
        """Hold the command (e.g. the rack's liquid isolated: no flow, the temperatures say
        nothing about the valve): the PID tracks the held command and resumes bumplessly from
        it when released. Fail-safe and manual are unaffected."""
        if on == self._hold:
            return
        self._hold = on
        self._pending.append(f"hold:{'on:' + name if on else 'off'}")
        if not on and self._mode == "auto" and self._command is not None:
            self._pid.set_auto(self._command)

    @property
    def held(self) -> bool:
        """True while `set_hold` holds the command."""
        return self._hold

    def rebase(self) -> None:
        """Re-initialise the PID from the current command (bumpless) on the next update: used
        when the feedforward is switched on or off (its step is absorbed by the integrator)."""
        if self._mode == "auto" and self._command is not None:
            self._pid.set_auto(self._command)

    @property
    def control_mode(self) -> ControlMode:
        """initialising | auto | manual | failsafe."""
        return self._mode

    @property
    def shadow(self) -> bool:
        """True while in shadow mode (nothing is written)."""
        return self._shadow

    @property
    def manual_target_pct(self) -> float | None:
        """The operator's manual output [%] while in manual mode, else None."""
        return self._manual_target if self._mode == "manual" else None

    @property
    def command_pct(self) -> float | None:
        """The current valve command [%], None before initialisation."""
        return self._command

    def stop_command_pct(self) -> float | None:
        """What to write when the daemon stops (DESIGN §3 stop action): the fail-safe output
        for ``stop_action = failsafe``, None for ``hold`` (write nothing). None in shadow."""
        if self._shadow or self._s.stop_action == "hold":
            return None
        return self._s.failsafe_output_pct

    # --- operator commands (raise CommandError with a code for the reply) ------------------

    def set_setpoint(self, setpoint_c: float) -> None:
        """Change the setpoint (no derivative kick: D acts on the measurement).

        Raises:
            CommandError: ``invalid_value`` (not a finite number) or ``out_of_range``
                (outside [setpoint_min_c, setpoint_max_c]).
        """
        sp = self._command_number("setpoint_c", setpoint_c)
        if not self._s.setpoint_min_c <= sp <= self._s.setpoint_max_c:
            raise CommandError(
                "out_of_range",
                f"setpoint_c {sp} outside [{self._s.setpoint_min_c}, {self._s.setpoint_max_c}]",
            )
        self._setpoint = sp
        if self._s.setpoint_ramp_k_per_min is None or self._t_period is None:
            self._sp_ramped = sp
            self._apply_sp()

    def _apply_sp(self) -> None:
        sp = self._sp_ramped
        constraint = "setpoint"
        if self._floor is not None and self._floor > sp:
            sp, constraint = self._floor, self._floor_name
        if constraint != self._constraint:
            self._pending.append(f"constraint:{self._constraint}->{constraint}")
            self._constraint = constraint
        if sp != self._sp_used:
            self._sp_used = sp
            self._pid.set_setpoint(sp)

    def set_manual(self, output_pct: float) -> None:
        """Operator output: manual mode moving the valve to ``output_pct`` at the rate limit
        (directly if the valve position is unknown). Leaves the fail-safe: the operator owns
        the valve.

        Raises:
            CommandError: ``invalid_value`` or ``out_of_range`` (outside the output limits).
        """
        out = self._command_number("output_pct", output_pct)
        if not self._s.output_min_pct <= out <= self._s.output_max_pct:
            raise CommandError(
                "out_of_range",
                f"output_pct {out} outside [{self._s.output_min_pct}, {self._s.output_max_pct}]",
            )
        self._manual_target = out
        self._set_mode("manual")

    def set_auto(self) -> None:
        """Back to automatic control, bumpless from the current command. Before the loop has
        a command (no read-back yet) it returns to ``initialising``."""
        self._manual_target = None
        if self._mode in ("auto", "failsafe"):
            return
        if self._command is None:
            self._set_mode("initialising")
            return
        self._pid.set_auto(self._command)
        self._set_mode("auto")

    def set_shadow(self, on: bool) -> None:
        """Shadow mode on/off. Leaving shadow, the next command is written unconditionally."""
        if on == self._shadow:
            return
        self._shadow = on
        self._pending.append(f"shadow:{'on' if on else 'off'}")
        if not on:
            self._written = None

    def reload(self, settings: SupplyLoopSettings) -> None:
        """Apply new settings (SIGHUP) without bumping the output. The current setpoint is
        kept, clamped into the new setpoint limits; the shadow flag follows the new settings."""
        self._s = settings
        self._pid.set_settings(settings.pid_settings())
        sp = min(settings.setpoint_max_c, max(settings.setpoint_min_c, self._setpoint))
        self._setpoint = sp
        self._sp_ramped = min(settings.setpoint_max_c,
                              max(settings.setpoint_min_c, self._sp_ramped))
        self._sp_used = math.nan  # re-applied below
        self._apply_sp()
        old = self._deviation
        if (old.high, old.hysteresis, old.on_delay_s, old.off_delay_s) != (
            settings.deviation_warn_k,
            settings.deviation_hysteresis_k,
            settings.deviation_on_delay_s,
            settings.deviation_off_delay_s,
        ):
            self._deviation = self._make_detector(settings)
        if self._command is not None:
            self._command = min(settings.output_max_pct,
                                max(settings.output_min_pct, self._command))
        if self._manual_target is not None:
            self._manual_target = min(settings.output_max_pct,
                                      max(settings.output_min_pct, self._manual_target))
        self.set_shadow(settings.shadow)

    def track_applied(self, applied_pct: float) -> None:
        """Something above the loop (an interlock, lease arbitration) wrote ``applied_pct``:
        continue from there (the PID integrator tracks it, the rate limit starts from it).

        Raises:
            ValueError: not a finite number.
        """
        a = _finite_or_value_error("applied_pct", applied_pct)
        a = min(self._s.output_max_pct, max(self._s.output_min_pct, a))
        self._command = a
        self._written = a
        self._pid.track(a)
        if self._mode == "initialising":
            self._pid.set_auto(a)
            self._set_mode("auto")

    # --- the step --------------------------------------------------------------------------

    def step(
        self,
        now_mono: float,
        pv: Sample | None,
        readback_pct: float | None,
        feedforward_pct: float = 0.0,
    ) -> LoopStep:
        """One tick.

        Args:
            now_mono: monotonic time [s], not before the previous step.
            pv: the latest ``supply_temp_c`` sample (None if none yet).
            readback_pct: the valve's read-back (command register or position) [%], None when
                unknown; a non-finite value counts as unknown, values are clamped to the limits.
            feedforward_pct: additive feedforward [%] (e.g. dynamic power feedforward, §4.5).

        Raises:
            ValueError: time not finite or going backwards, non-finite feedforward (a caller
                bug; the loop state is unchanged).
        """
        # (the finite-float case inline: this runs on every 10 Hz tick)
        now = now_mono if now_mono.__class__ is float and math.isfinite(now_mono) else (
            _finite_or_value_error("now_mono", now_mono))
        if self._t_last is not None and now < self._t_last:
            raise ValueError(f"monotonic time went backwards: {now} < {self._t_last}")
        ff = feedforward_pct if feedforward_pct.__class__ is float and math.isfinite(
            feedforward_pct) else _finite_or_value_error("feedforward_pct", feedforward_pct)
        self._t_last = now
        s = self._s
        readback: float | None = None
        if readback_pct is not None and _is_finite_number(readback_pct):
            readback = min(s.output_max_pct, max(s.output_min_pct, float(readback_pct)))

        status, pv_value = self._assess(now, pv)
        if status != self._pv_status:
            self._pending.append(f"pv:{self._pv_status}->{status}")
            self._pv_status = status
        if pv_value is not None and s.pv_filter_tau_s > 0.0:
            assert pv is not None
            if self._pv_filt is None or self._pv_filt_t is None:
                self._pv_filt, self._pv_filt_t = pv_value, pv.t_mono
            elif pv.t_mono > self._pv_filt_t:
                a = 1.0 - math.exp(-(pv.t_mono - self._pv_filt_t) / s.pv_filter_tau_s)
                self._pv_filt += (pv_value - self._pv_filt) * a
                self._pv_filt_t = pv.t_mono
            pv_value = self._pv_filt
        elif pv_value is None:
            self._pv_filt = self._pv_filt_t = None  # a gap: start afresh from the next reading
        deviation = None if pv_value is None else pv_value - self._sp_used
        deviating = self._deviation.update(now, None if deviation is None else abs(deviation))

        pid_updated = False
        write = False
        if self._t_period is None or now - self._t_period >= s.period_s - _PERIOD_TOLERANCE_S:
            dt_period = None if self._t_period is None else now - self._t_period
            self._t_period = now
            self._ramp_setpoint(dt_period)
            pid_updated = self._period(now, dt_period, pv_value, readback, ff)
            write = self._decide_write()
        transitions: tuple[str, ...] = ()
        if self._pending:
            transitions, self._pending = tuple(self._pending), []

        last = self._pid.last
        conditions = {
            SUPPLY_PV_INVALID: self._bad_periods >= 1,
            SUPPLY_LOOP_FAILSAFE: self._mode == "failsafe",
            SUPPLY_TEMP_DEVIATION: deviating,
            SUPPLY_VALVE_SATURATED: self._mode == "auto" and last is not None and last.saturated,
            SUPPLY_LOOP_INITIALISING: self._mode == "initialising",
        }
        return _new_loop_step(  # LoopStep(...), every field in order
            now,  # t_mono
            "shadow" if self._shadow else self._mode,  # mode
            self._mode,  # control_mode
            self._command,  # command_pct
            write,
            pid_updated,
            last,  # pid
            self._sp_used,  # setpoint_c
            pv_value,  # pv_c
            status,  # pv_status
            None if pv is None else pv.quality,  # pv_quality
            None if pv is None else pv.age_s(now),  # pv_age_s
            deviation,  # deviation_c
            self._bad_periods,  # bad_periods
            conditions,
            transitions,
            self._setpoint,  # setpoint_target_c
            self._constraint,  # constraint
        )

    # --- internals -------------------------------------------------------------------------

    def _period(
        self, now: float, dt_period: float | None, pv: float | None, readback: float | None,
        ff: float,
    ) -> bool:
        """One control period; returns True when the PID ran."""
        s = self._s
        good = pv is not None
        if good:
            self._bad_periods = 0
        else:
            self._bad_periods += 1
            self._pid.clear_history()  # D never differentiates across a gap

        if (
            self._shadow
            and readback is not None
            and self._command is not None
            and self._mode in ("auto", "manual")
        ):
            # Shadow: the real valve is driven by someone else; compute from where it is.
            self._command = readback
            self._pid.track(readback)

        if self._mode == "initialising":
            if readback is not None:
                self._command = readback
                self._pid.set_auto(readback)
                self._t_pid = now
                self._set_mode("auto")
            elif self._bad_periods >= s.failsafe_after_periods:
                self._enter_failsafe(now)
            return False

        if self._mode == "manual":
            assert self._manual_target is not None
            target = self._manual_target
            if self._command is None:
                self._command = readback if readback is not None else target
            elif dt_period is not None:
                self._command = self._rate_limit(self._command, target, dt_period)
            self._pid.set_manual(self._command)
            ran = False
            if good and self._t_pid is not None:
                assert pv is not None
                self._pid.update(pv, now - self._t_pid, ff)
                ran = True
            self._t_pid = now
            return ran

        if self._mode == "failsafe":
            if not good:
                self._t_pid = now  # the PID is held (manual at the fail-safe command)
                return False
            if readback is not None:
                # Resume from where the valve really is: the fail-safe write may never have
                # reached the device (it failed while the CDU was unreachable), so the
                # command we believe in is not evidence. The read-back is.
                self._command = readback
                self._written = readback
            assert self._command is not None
            self._pid.set_auto(self._command)
            self._set_mode("auto")
            # fall through: resume at once, bumpless and rate-limited

        # auto
        assert self._command is not None
        if self._hold:
            self._pid.set_manual(self._command)  # tracks, computes nothing new
            self._t_pid = now
            return False
        if not good:
            if self._bad_periods >= s.failsafe_after_periods:
                self._enter_failsafe(now)
            return False
        assert pv is not None
        if self._t_pid is None:  # auto entered via track_applied before any period
            self._t_pid = now
            return False
        out = self._pid.update(pv, now - self._t_pid, ff)
        self._t_pid = now
        cmd = out.output
        if dt_period is not None:
            cmd = self._rate_limit(self._command, cmd, dt_period)
        if cmd != out.output:
            self._pid.track(cmd)
        self._command = cmd
        return True

    def _ramp_setpoint(self, dt_period: float | None) -> None:
        rate = self._s.setpoint_ramp_k_per_min
        target = self._setpoint
        if rate is None or dt_period is None:
            self._sp_ramped = target
        else:
            d = target - self._sp_ramped
            m = rate / 60.0 * dt_period
            self._sp_ramped += m if d > m else -m if d < -m else d
        self._apply_sp()

    def _enter_failsafe(self, now: float) -> None:
        fs = self._s.failsafe_output_pct
        if fs is None and self._command is None:
            return  # hold, but nothing to hold yet: stay initialising
        if fs is not None:
            self._command = fs  # at once: safety wins over the rate limit
            self._force_write = True
        assert self._command is not None
        self._pid.set_manual(self._command)
        self._t_pid = now
        self._set_mode("failsafe")

    def _rate_limit(self, prev: float, target: float, dt_s: float) -> float:
        step = self._s.output_rate_limit_pct_per_s * dt_s
        return prev + min(step, max(-step, target - prev))

    def _decide_write(self) -> bool:
        s = self._s
        cmd = self._command
        force, self._force_write = self._force_write, False
        if self._shadow or cmd is None:
            return False
        written = self._written
        if not (force or written is None):
            delta = abs(cmd - written)
            if delta <= _EPS:
                return False
            at_limit = cmd in (s.output_min_pct, s.output_max_pct)
            at_manual_target = self._mode == "manual" and cmd == self._manual_target
            if not (delta >= s.min_step_pct - _EPS or at_limit or at_manual_target):
                return False
        self._written = cmd
        return True

    def _assess(self, now: float, pv: Sample | None) -> tuple[PvStatus, float | None]:
        s = self._s
        if pv is None:
            return "missing", None
        if pv.quality is Quality.STALE:
            return "stale", None
        if pv.quality is Quality.OUT_OF_RANGE:
            return "out_of_range", None
        v = pv.value
        if pv.quality is not Quality.GOOD or v is None or not math.isfinite(v):
            return "bad", None  # not pv.usable
        if max(0.0, now - pv.t_mono) > s.stale_after_s:  # pv.age_s(now)
            return "stale", None
        if not s.pv_valid_min_c <= v <= s.pv_valid_max_c:
            return "out_of_range", None
        if s.pv_frozen_after_s is not None:
            if self._frozen_value != v or self._frozen_since is None:
                self._frozen_value, self._frozen_since = v, pv.t_mono
            elif pv.t_mono - self._frozen_since >= s.pv_frozen_after_s:
                return "frozen", None
        return "ok", v

    def _set_mode(self, mode: ControlMode) -> None:
        if mode != self._mode:
            self._pending.append(f"mode:{self._mode}->{mode}")
            self._mode = mode

    @staticmethod
    def _command_number(name: str, value: float) -> float:
        try:
            return _finite_or_value_error(name, value)
        except ValueError as err:
            raise CommandError("invalid_value", str(err)) from None
