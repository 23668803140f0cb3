"""PID loop on simple-pid 2.0.1: explicit dt, conditional-integration anti-windup, tracking,
feedforward, bumpless manual/auto. The only module that imports ``simple_pid``.

Conventions (industrial, ISA parallel form with positive gains):

* ``kp`` [output unit per PV unit], ``ki`` [output unit per (PV unit · s)], ``kd``
  [output unit · s per PV unit] are magnitudes (>= 0); ``action`` gives the sign.
  ``direct``: the output rises when the PV rises above the setpoint (a cooling valve);
  ``reverse``: the output rises when the PV falls below the setpoint (a heater).
  In simple-pid's convention (error = setpoint − PV) a direct-acting loop is
  ``PID(Kp=-kp, Ki=-ki, Kd=-kd)``; FIELD-CASES BR-14/16/25 use exactly that, so their
  ``Kp=-5, Ki=-0.1, Kd=-50`` is ``PidSettings(kp=5, ki=0.1, kd=50, action="direct")`` here.
* ``u = P + I + D + FF``, clamped to ``[output_min, output_max]``. P acts on the (dead-zoned)
  error, D on the measurement only (no derivative kick on a setpoint step, BR-25 a), FF is an
  additive term given on every update.
* Time is never read here: every `PidLoop.update` gets ``dt_s``, the real monotonic time
  since the previous update, from the caller (BR-16). The wrapped ``simple_pid.PID`` runs with
  ``sample_time=None`` and a constant ``time_fn``, so its internal clock is never consulted.

Anti-windup (FIELD-CASES BR-14, REFERENCE §2.2): *conditional integration* with an integral
bound. The integral may grow towards a limit only until the unclamped output reaches that
limit, never beyond it (``I <= max(I_prev, output_max − P − D − FF)`` when integrating up;
symmetric going down), and it always stays within ``[output_min − FF, output_max − FF]``
clipped to ``±(output_max − output_min)``: the integral never exceeds the output span, and once
the error changes sign the output leaves the limit on the very first sample. In BR-14's case
(Kp 5, Ki 0.1, 600 s at 40 °C against setpoint 30) simple-pid's own clamping holds I = 100 and
gives 89.8 on the first sample at 28 °C (the valve closes 450 s later); this scheme holds
I = 50 (the value at which the output first reached 100) and gives 39.8 (closed ≈ 200 s later).
An integral that sits at its bound while the output is saturated by a large P does not get
dragged to the opposite side either (a known weakness of back-calculation with a short
tracking time), so the output returns to its pre-disturbance value when the error goes away.

Tracking (external reset feedback): when something downstream changes the applied output (a
rate limiter, a fail-safe, an interlock, lease arbitration), the caller reports it with
`PidLoop.track` and the integral becomes ``applied − P − D − FF`` (within the bound above), so
there is no windup against external limits. Do **not** track output quantisation (a minimum
write step): the integral must keep accumulating below the step, or the loop keeps an offset.

Bumpless transfer (BR-25 b/c, REFERENCE §2.2): `PidLoop.set_auto` always (re)initialises on
the next update, even when the loop is already in auto (simple-pid's
``set_auto_mode(True, last_output=…)`` is silently ignored in that case: issue #26; our API
cannot reach that path). The next update sets ``I := u_current − P − D − FF`` with that
sample's P, D and FF, then applies the sample's own integral action ``ki·e·dt`` as usual, so
the first auto output is ``u_current`` plus one step of integral action (exactly ``u_current``
with the PV at setpoint). Exactness needs ``u_current − P − D − FF`` to lie inside the
integral bound; otherwise the integral starts at the nearest bound (P action beyond the output
range is never stored in the integral).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, model_validator
from simple_pid import PID

from rackplane.config import StrictModel

__all__ = ["PidLoop", "PidNotInitialisedError", "PidOutput", "PidSettings"]

PidMode = Literal["auto", "manual"]

_LIB_INTEGRAL_ATTR = "_integral"
"""simple-pid 2.0.1's integral attribute (see `PidLoop._set_library_integral`)."""


class PidNotInitialisedError(RuntimeError):
    """`PidLoop.update` called before any output is known (neither set_auto nor set_manual)."""


class PidSettings(StrictModel):
    """Gains, action and limits of one PID loop (all magnitudes; ``action`` gives the sign).

    Attributes:
        kp: proportional gain [output unit / PV unit], >= 0.
        ki: integral gain [output unit / (PV unit · s)] = kp / τI, >= 0.
        kd: derivative gain [output unit · s / PV unit] = kp · τD, >= 0 (on measurement).
        action: ``direct`` (output rises with the PV: cooling valve) or ``reverse``.
        output_min, output_max: hard output limits (output units), min < max.
        error_deadband: dead zone on the error [PV units], >= 0. Inside ±deadband the error is
            0 (no P change, no integration); outside it is reduced by the deadband, so P is
            continuous (no step when the error leaves the band). REFERENCE §4.5: 0.1 K for
            valve wear.
    """

    kp: float = Field(ge=0.0, allow_inf_nan=False)
    ki: float = Field(0.0, ge=0.0, allow_inf_nan=False)
    kd: float = Field(0.0, ge=0.0, allow_inf_nan=False)
    action: Literal["direct", "reverse"]
    output_min: float = Field(0.0, allow_inf_nan=False)
    output_max: float = Field(100.0, allow_inf_nan=False)
    error_deadband: float = Field(0.0, ge=0.0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _check(self) -> PidSettings:
        if not self.output_min < self.output_max:
            raise ValueError("output_min must be below output_max")
        if self.kp == 0.0 and self.ki == 0.0:
            raise ValueError("kp and ki cannot both be 0 (the loop would do nothing)")
        return self

    @property
    def span(self) -> float:
        """output_max − output_min (output units)."""
        return self.output_max - self.output_min


@dataclass(frozen=True, slots=True)
class PidOutput:
    """Result of one `PidLoop.update` (all terms in output units).

    Attributes:
        output: the clamped output u (within [output_min, output_max]).
        p, i, d, ff: the terms; ``p + i + d + ff`` is the unclamped output.
        saturated: the unclamped output was outside the limits (auto mode only).
        mode: ``auto`` or ``manual`` (in manual, ``output`` is the manual output and ``i``
            tracks it).
    """

    output: float
    p: float
    i: float
    d: float
    ff: float
    saturated: bool
    mode: PidMode


def _no_clock() -> float:
    """simple-pid's ``time_fn``: a constant, so the library never reads a real clock."""
    return 0.0


def _finite(name: str, value: float) -> float:
    """``float(value)`` if it is a finite real number (bool excluded), else ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return v


class PidLoop:
    """One PID loop (pure: no clock, no I/O). Starts in manual with no output.

    Usage::

        loop = PidLoop(settings, setpoint=45.0)
        loop.set_auto(readback_pct)            # bumpless start from the actuator's position
        out = loop.update(pv, dt_s, feedforward=ff)
        applied = rate_limit(out.output)
        if applied != out.output:
            loop.track(applied)                # no windup against downstream limits

    Errors: every method raises ``ValueError`` on a non-finite number, a ``dt_s <= 0`` or an
    output outside the limits, *before* any state changes (a caller bug is never integrated).
    `update` raises `PidNotInitialisedError` if no output was ever given.
    """

    def __init__(self, settings: PidSettings, setpoint: float):
        self._settings = settings
        sp = _finite("setpoint", setpoint)
        self._pid = PID(
            Kp=0.0,
            Ki=0.0,
            Kd=0.0,
            setpoint=sp,
            sample_time=None,
            output_limits=(None, None),
            auto_mode=True,
            proportional_on_measurement=False,
            differential_on_measurement=True,
            error_map=None,
            time_fn=_no_clock,
            starting_output=0.0,
        )
        self._apply_settings(settings)
        self._mode: PidMode = "manual"
        self._manual_output: float | None = None
        self._output: float | None = None
        self._integral = 0.0
        self._pending_init: float | None = None
        self._last: PidOutput | None = None

    # --- configuration ---------------------------------------------------------------------

    def _apply_settings(self, s: PidSettings) -> None:
        sign = -1.0 if s.action == "direct" else 1.0
        self._pid.tunings = (sign * s.kp, sign * s.ki, sign * s.kd)
        db = s.error_deadband
        if db > 0.0:

            def dead_zone(e: float) -> float:
                return 0.0 if abs(e) <= db else e - math.copysign(db, e)

            self._pid.error_map = dead_zone
        else:
            self._pid.error_map = None

    @property
    def settings(self) -> PidSettings:
        """The current settings."""
        return self._settings

    def set_settings(self, settings: PidSettings) -> None:
        """Retune (e.g. on SIGHUP) without a bump: the next update restarts from the last
        output (clamped into the new limits). Limits and gains may change together."""
        self._settings = settings
        self._apply_settings(settings)
        if self._manual_output is not None:
            self._manual_output = self._clamp(self._manual_output)
        if self._output is not None:
            self._output = self._clamp(self._output)
            if self._mode == "auto":
                self._pending_init = self._output

    # --- state -----------------------------------------------------------------------------

    @property
    def mode(self) -> PidMode:
        """``auto`` or ``manual``."""
        return self._mode

    @property
    def setpoint(self) -> float:
        """The setpoint (PV units)."""
        return float(self._pid.setpoint)

    @property
    def output(self) -> float | None:
        """The last output (or the last tracked/applied output); None before initialisation."""
        return self._output

    @property
    def integral(self) -> float:
        """The integral term I (output units)."""
        return self._integral

    @property
    def last(self) -> PidOutput | None:
        """The result of the last update, or None."""
        return self._last

    def set_setpoint(self, setpoint: float) -> None:
        """Change the setpoint. D acts on the measurement, so there is no derivative kick;
        P acts on the error and moves with the step (BR-25 a: 11.2 → 21.6 for 30 → 28 °C)."""
        self._pid.setpoint = _finite("setpoint", setpoint)

    def set_manual(self, output: float) -> None:
        """Manual mode holding ``output`` (within the limits, else ValueError). While in
        manual, `update` still computes P and D and keeps the integral tracking, so the return
        to auto is bumpless."""
        out = self._check_output("manual output", output)
        self._mode = "manual"
        self._manual_output = out
        self._output = out
        self._pending_init = None

    def set_auto(self, current_output: float | None = None) -> None:
        """Auto mode, bumpless from ``current_output`` (the actuator's read-back or last
        applied output; default: the last known output). Always re-initialises, also when
        already in auto (unlike simple-pid's ``set_auto_mode``). A value slightly outside the
        limits (e.g. a read-back of 100.3 %) is clamped.

        Raises:
            ValueError: ``current_output`` not finite, or None with no output known yet.
        """
        if current_output is None:
            if self._output is None:
                raise ValueError("set_auto needs current_output: no output is known yet")
            start = self._output
        else:
            start = self._clamp(_finite("current_output", current_output))
        self._mode = "auto"
        self._manual_output = None
        self._output = start
        self._pending_init = start

    def track(self, applied_output: float) -> None:
        """The output actually applied differs from ours (rate limit, fail-safe, interlock,
        lease): make the integral consistent with it, ``I := applied − P − D − FF`` using the
        last update's terms, so the next update continues from ``applied`` (clamped into the
        limits). Before the first update this schedules a bumpless start from ``applied``.
        """
        applied = self._clamp(_finite("applied_output", applied_output))
        self._output = applied
        if self._last is None or self._pending_init is not None:
            if self._mode == "auto":
                self._pending_init = applied
            return
        last = self._last
        self._integral = self._bound_integral(applied - last.p - last.d - last.ff, last.ff)
        self._set_library_integral(self._integral)

    def clear_history(self) -> None:
        """Forget the previous measurement (after a gap in valid PV): the next update has
        D = 0 instead of differentiating across the gap. The integral is kept."""
        self._pid.reset()  # clears _last_input; reads only our constant time_fn

    # --- the update ------------------------------------------------------------------------

    def update(self, pv: float, dt_s: float, feedforward: float = 0.0) -> PidOutput:
        """One control step.

        Args:
            pv: the measurement (PV units), finite; only valid samples may be passed.
            dt_s: real elapsed monotonic time since the previous update [s], > 0.
            feedforward: additive term (output units), finite.

        Returns:
            `PidOutput` with the clamped output and its terms.

        Raises:
            ValueError: non-finite pv/feedforward, dt_s <= 0 or non-finite (state untouched).
            PidNotInitialisedError: neither set_auto nor set_manual was ever called.
        """
        pv = _finite("pv", pv)
        dt = _finite("dt_s", dt_s)
        if dt <= 0.0:
            raise ValueError(f"dt_s must be > 0 (monotonic time since the last update), got {dt}")
        ff = _finite("feedforward", feedforward)
        if self._output is None:
            raise PidNotInitialisedError("PidLoop.update before set_auto/set_manual")

        s = self._settings
        i_prev = self._integral
        self._set_library_integral(i_prev)  # our integral is the state of record
        self._pid(pv, dt=dt)  # simple-pid: P on the mapped error, I += Ki·e·dt, D on measurement
        p, i_cand, d = (float(x) + 0.0 for x in self._pid.components)  # + 0.0: no -0.0
        delta_i = i_cand - i_prev

        if self._mode == "manual":
            assert self._manual_output is not None
            u = self._manual_output
            i_new = self._bound_integral(u - p - d - ff, ff)
            result = PidOutput(u, p, i_new, d, ff, False, "manual")
        else:
            if self._pending_init is not None:
                i_prev = self._bound_integral(self._pending_init - p - d - ff, ff)
                self._pending_init = None
            i_new = i_prev + delta_i
            # Conditional integration: never integrate past the point where the unclamped
            # output reaches a limit.
            if delta_i > 0.0:
                i_new = min(i_new, max(i_prev, s.output_max - p - d - ff))
            elif delta_i < 0.0:
                i_new = max(i_new, min(i_prev, s.output_min - p - d - ff))
            i_new = self._bound_integral(i_new, ff)
            v = p + i_new + d + ff
            u = self._clamp(v)
            result = PidOutput(u, p, i_new, d, ff, v > s.output_max or v < s.output_min, "auto")

        self._integral = i_new
        self._set_library_integral(i_new)
        self._output = result.output
        self._last = result
        return result

    # --- helpers ---------------------------------------------------------------------------

    def _set_library_integral(self, value: float) -> None:
        """Write simple-pid 2.0.1's integral (``PID._integral``, not in its public API or its
        stub): the one private attribute this wrapper relies on; the version is pinned
        (<2.1) and tests/unit/test_pid.py checks the attribute still exists."""
        setattr(self._pid, _LIB_INTEGRAL_ATTR, value)

    def _clamp(self, value: float) -> float:
        s = self._settings
        return min(s.output_max, max(s.output_min, value))

    def _bound_integral(self, value: float, ff: float) -> float:
        """Clamp I into [min − FF, max − FF] ∩ [−span, +span]."""
        s = self._settings
        span = s.span
        lo = min(span, max(-span, s.output_min - ff))
        hi = min(span, max(-span, s.output_max - ff))
        return min(hi, max(lo, value))

    def _check_output(self, name: str, value: float) -> float:
        v = _finite(name, value)
        s = self._settings
        if not s.output_min <= v <= s.output_max:
            raise ValueError(f"{name} {v} is outside [{s.output_min}, {s.output_max}]")
        return v
