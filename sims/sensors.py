"""Simulated transmitters: first-order lag, white noise, bias, quantisation and fault modes.

REFERENCE §4.2 item 10: ``y = first-order(τ_s)(x) + N(0, σ) + bias``, quantised (0.01 K for
temperatures). The noise enters *after* the lag (REFERENCE §5.1 notes that where it enters
changes valve activity figures). A sensor owns no random generator: its owner passes one
standard-normal draw per update, so a plant with one seeded stream stays deterministic
however many sensors it has.

Fault modes (REFERENCE §4.2 item 10, §5 S5), one at a time per sensor:

=========  ==================================================================================
``freeze``  the output holds its last value (zero variance); the lag keeps tracking the truth
``drop``    the output is NaN (open circuit / lost transmitter)
``spike``   ``magnitude`` is added for ``duration_s`` (default one update), then it clears
``drift``   an error growing at ``rate_per_s`` (units per second) is added; it restarts from 0
            when the fault is set again or cleared
``offset``  a constant ``magnitude`` is added (calibration error)
=========  ==================================================================================

Pure: no clock, no I/O; time enters as ``dt`` (s).
"""

from __future__ import annotations

import math
from enum import StrEnum

from pydantic import Field

from rackplane.config import StrictModel

__all__ = ["Sensor", "SensorFault", "SensorParams"]


class SensorParams(StrictModel):
    """Dynamic and noise figures of one kind of transmitter (units are the measured quantity's).

    Defaults are REFERENCE §4.3's temperature sensor: τ 2 s, σ 0.03 K [U], quantum 0.01 K
    (§4.2 item 10).
    """

    tau_s: float = Field(
        2.0, ge=0.0, le=600.0, description="first-order lag time constant, s (REF §4.3 [U])"
    )
    noise_sigma: float = Field(
        0.03, ge=0.0, description="white noise σ, added after the lag (REF §4.3 [U])"
    )
    quantum: float = Field(
        0.01, ge=0.0, description="output resolution; 0 = none (REF §4.2 item 10: 0.01 K)"
    )


class SensorFault(StrEnum):
    """Fault modes a `Sensor` can be put in (REFERENCE §4.2 item 10, §5 S5)."""

    NONE = "none"
    FREEZE = "freeze"
    DROP = "drop"
    SPIKE = "spike"
    DRIFT = "drift"
    OFFSET = "offset"


_NAN = math.nan


class Sensor:
    """One simulated transmitter.

    Args:
        name: point name it feeds (for logs and errors).
        params: lag, noise and resolution.
        bias: constant calibration error added to every output (same unit as the value).
        initial: true value the lag starts at (steady state).

    ``update(true_value, dt, z)`` advances the lag by ``dt`` seconds and returns the output,
    where ``z`` is one standard-normal draw supplied by the owner. ``value`` is the last output
    (NaN while dropped).
    """

    __slots__ = (
        "_a",
        "_drift",
        "_dt",
        "_duration_left_s",
        "_fault",
        "_magnitude",
        "_out",
        "_quantum",
        "_rate_per_s",
        "_y",
        "bias",
        "name",
        "noise_sigma",
        "tau_s",
    )

    def __init__(
        self, name: str, params: SensorParams, bias: float = 0.0, initial: float = 0.0
    ) -> None:
        self.name = name
        self.tau_s = params.tau_s
        self.noise_sigma = params.noise_sigma
        self._quantum = params.quantum
        self.bias = bias
        self._fault = SensorFault.NONE
        self._magnitude = 0.0
        self._rate_per_s = 0.0
        self._duration_left_s = 0.0
        self._drift = 0.0
        self._dt = -1.0
        self._a = 1.0
        self._y = initial
        self._out = self._finish(initial, 0.0)

    # --- state -------------------------------------------------------------------------------

    def reset(self, true_value: float) -> None:
        """Put the lag at steady state on ``true_value`` and emit it noise-free (warm start)."""
        self._y = true_value
        if self._fault is not SensorFault.FREEZE:
            self._out = _NAN if self._fault is SensorFault.DROP else self._finish(true_value, 0.0)

    @property
    def value(self) -> float:
        """Last output (engineering units; NaN while dropped)."""
        return self._out

    @property
    def lagged(self) -> float:
        """The lag state before noise, bias and faults (the sensing element's true reading)."""
        return self._y

    @property
    def fault(self) -> SensorFault:
        """The active fault mode (`SensorFault.NONE` when healthy)."""
        return self._fault

    # --- faults ------------------------------------------------------------------------------

    def set_fault(
        self,
        mode: SensorFault | str,
        *,
        magnitude: float = 0.0,
        rate_per_s: float = 0.0,
        duration_s: float | None = None,
    ) -> None:
        """Put the sensor in fault ``mode`` (replacing any active fault).

        Args:
            mode: a `SensorFault` or its value (``"freeze"``, ``"drop"``, ...).
            magnitude: added value for ``spike`` and ``offset`` (value units).
            rate_per_s: drift rate for ``drift`` (value units per second; 0.05 K/min is
                ``0.05 / 60``, REFERENCE §5 S5).
            duration_s: ``spike`` length in s; ``None`` means one update.

        Raises:
            ValueError: unknown mode, or a non-finite magnitude/rate, or a negative duration.
        """
        mode = SensorFault(mode)
        if not (math.isfinite(magnitude) and math.isfinite(rate_per_s)):
            raise ValueError(f"sensor {self.name}: fault magnitude and rate must be finite")
        if duration_s is not None and not (duration_s >= 0.0):
            raise ValueError(f"sensor {self.name}: spike duration_s must be >= 0")
        self._fault = mode
        self._magnitude = magnitude
        self._rate_per_s = rate_per_s
        self._duration_left_s = -1.0 if duration_s is None else duration_s
        self._drift = 0.0
        if mode is SensorFault.DROP:
            self._out = _NAN

    def clear_fault(self) -> None:
        """Back to healthy; the next update emits a fresh value (drift error restarts at 0)."""
        self._fault = SensorFault.NONE
        self._magnitude = 0.0
        self._rate_per_s = 0.0
        self._drift = 0.0

    # --- dynamics ----------------------------------------------------------------------------

    def _finish(self, lagged: float, noise: float) -> float:
        v = lagged + self.bias + noise
        q = self._quantum
        if q > 0.0:
            v = round(v / q) * q
        return v

    def update(self, true_value: float, dt: float, z: float) -> float:
        """Advance by ``dt`` s towards ``true_value``; ``z`` ~ N(0, 1). Returns the output."""
        if dt != self._dt:
            self._dt = dt
            self._a = 1.0 - math.exp(-dt / self.tau_s) if self.tau_s > 0.0 else 1.0
        y = self._y + (true_value - self._y) * self._a
        self._y = y
        fault = self._fault
        if fault is SensorFault.NONE:
            v = y + self.bias + self.noise_sigma * z
        elif fault is SensorFault.FREEZE:
            return self._out
        elif fault is SensorFault.DROP:
            self._out = _NAN
            return _NAN
        elif fault is SensorFault.DRIFT:
            self._drift += self._rate_per_s * dt
            v = y + self.bias + self.noise_sigma * z + self._drift
        elif fault is SensorFault.OFFSET:
            v = y + self.bias + self.noise_sigma * z + self._magnitude
        else:  # SPIKE
            v = y + self.bias + self.noise_sigma * z + self._magnitude
            left = self._duration_left_s
            if left < 0.0:
                self._fault = SensorFault.NONE
            else:
                left -= dt
                self._duration_left_s = left
                if left <= 1e-12:
                    self._fault = SensorFault.NONE
        q = self._quantum
        if q > 0.0:
            v = round(v / q) * q
        self._out = v
        return v
