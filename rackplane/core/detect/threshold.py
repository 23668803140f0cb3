"""Threshold with on/off delay and hysteresis: the one rule, in a scalar form
(`ThresholdDetector`) and a vectorised form (`VectorThreshold`).

REFERENCE §8 / §3.4 examples: supply-temperature deviation warns at ±2 °C for >= 120 s and
clears with 1 °C hysteresis (Coolcentric); a GPU's T.Limit margin below the slowdown offset is
fatal (NVSentinel ADR-042, ``direction="below"``); NVSentinel's "port dropped" is a link held
DOWN for >= 4 min (``VectorThreshold(n, 0.5, 0.0, on_delay_s=240)`` fed 1.0 while down).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np

from rackplane.core.detect._util import (
    BoolArray,
    FloatArray,
    check_count,
    check_time,
    param,
    values,
)

__all__ = ["ThresholdDetector", "VectorThreshold"]


class ThresholdDetector:
    """Turns a value stream into a debounced bool: True at ``value >= high`` held for
    ``on_delay_s``; False again at ``value < high − hysteresis`` held for ``off_delay_s``.

    REFERENCE §8 / §3.4 (Coolcentric): supply-temperature deviation warns at ±2 °C for
    >= 120 s and clears with 1 °C hysteresis, i.e.
    ``ThresholdDetector(high=2.0, hysteresis=1.0, on_delay_s=120.0)`` fed with
    ``abs(supply_temp_c − setpoint_c)``. For a low limit, feed the shortfall
    (``limit − value``) or the negated value.

    A missing or non-finite value (None, NaN) is "no information": the output holds and any
    pending transition restarts (a transition needs continuous valid evidence).

    The scalar form of `VectorThreshold` (``direction="above"``) with the same rule, for the
    per-tick callers where a numpy call per update would cost more than the rule itself;
    tests/unit/test_detect_threshold_forms.py proves the two forms give the same outputs.
    """

    def __init__(
        self, high: float, hysteresis: float, on_delay_s: float = 0.0, off_delay_s: float = 0.0
    ):
        checks = (("high", high), ("hysteresis", hysteresis), ("on_delay_s", on_delay_s),
                  ("off_delay_s", off_delay_s))
        for name, v in checks:
            if not math.isfinite(v):
                raise ValueError(f"{name} must be finite")
        if hysteresis < 0 or on_delay_s < 0 or off_delay_s < 0:
            raise ValueError("hysteresis and delays must be >= 0")
        self.high = float(high)
        self.hysteresis = float(hysteresis)
        self.on_delay_s = float(on_delay_s)
        self.off_delay_s = float(off_delay_s)
        self._raw = False
        self._out = False
        self._pending_since: float | None = None
        self._last_t: float | None = None

    @property
    def state(self) -> bool:
        """The debounced output."""
        return self._out

    def update(self, now_mono: float, value: float | None) -> bool:
        """Feed one value at monotonic time ``now_mono`` [s]; returns the debounced state.

        Raises:
            ValueError: time not finite or going backwards.
        """
        now = check_time("now_mono", now_mono, self._last_t)
        self._last_t = now
        if value is None or not math.isfinite(value):
            self._pending_since = None
            return self._out
        if value >= self.high:
            self._raw = True
        elif value < self.high - self.hysteresis:
            self._raw = False
        if self._raw == self._out:
            self._pending_since = None
            return self._out
        if self._pending_since is None:
            self._pending_since = now
        delay = self.on_delay_s if self._raw else self.off_delay_s
        if now - self._pending_since >= delay:
            self._out = self._raw
            self._pending_since = None
        return self._out


class VectorThreshold:
    """``n`` debounced threshold detectors advanced together.

    ``direction="above"``: raw True at ``value >= level``, False again below ``level −
    hysteresis``; ``"below"``: raw True at ``value <= level``, False above ``level +
    hysteresis``. The output follows the raw state once it has held for ``on_delay_s``
    (to True) or ``off_delay_s`` (to False). A NaN value is "no information": the output holds
    and a pending change restarts (a change needs continuous valid evidence), as in
    `ThresholdDetector`.

    Args:
        n: elements.
        level, hysteresis, on_delay_s, off_delay_s: scalars or arrays of shape (n,) (units of
            the value; s). Hysteresis and delays >= 0.

    Raises:
        ValueError: bad shapes or values; time going backwards in `update`.
    """

    def __init__(
        self,
        n: int,
        level: Any,
        hysteresis: Any = 0.0,
        on_delay_s: Any = 0.0,
        off_delay_s: Any = 0.0,
        direction: Literal["above", "below"] = "above",
    ) -> None:
        self.n = check_count("n", n)
        if direction not in ("above", "below"):
            raise ValueError("direction must be 'above' or 'below'")
        self.direction = direction
        self.level = param("level", level, self.n)
        self.hysteresis = param("hysteresis", hysteresis, self.n, lo=0.0)
        self.on_delay_s = param("on_delay_s", on_delay_s, self.n, lo=0.0)
        self.off_delay_s = param("off_delay_s", off_delay_s, self.n, lo=0.0)
        self._raw = np.zeros(self.n, dtype=bool)
        self._out = np.zeros(self.n, dtype=bool)
        self._pending = np.full(self.n, np.nan)
        self._since = np.full(self.n, np.nan)
        self._last_t: float | None = None

    @property
    def state(self) -> BoolArray:
        """The debounced outputs (a copy)."""
        return self._out.copy()

    @property
    def since(self) -> FloatArray:
        """Monotonic time each output last turned True (NaN while False), s (a copy)."""
        return np.where(self._out, self._since, np.nan)

    def update(self, now_mono: float, value: Any) -> BoolArray:
        """Feed one value per element at ``now_mono`` [s]; returns the outputs (a copy).

        Raises:
            ValueError: time not finite or going backwards; wrong shape.
        """
        now = check_time("now_mono", now_mono, self._last_t)
        self._last_t = now
        v = values("value", value, self.n)
        valid = ~np.isnan(v)
        with np.errstate(invalid="ignore"):
            if self.direction == "above":
                on = v >= self.level
                off = v < self.level - self.hysteresis
            else:
                on = v <= self.level
                off = v > self.level + self.hysteresis
        raw = np.where(valid & on, True, np.where(valid & off, False, self._raw))
        self._raw = raw
        diff = raw != self._out
        pend = np.where(diff & valid, np.where(np.isnan(self._pending), now, self._pending),
                        np.nan)
        delay = np.where(raw, self.on_delay_s, self.off_delay_s)
        flip = diff & valid & (now - pend >= delay - 1e-9)
        if flip.any():
            self._out = np.where(flip, raw, self._out)
            self._since = np.where(flip & raw, now, self._since)
            pend[flip] = np.nan
        self._pending = pend
        return self._out.copy()

    def reset(self, which: Any = None) -> None:
        """Force elements (a bool mask or indices; all when None) back to False."""
        idx = slice(None) if which is None else which
        self._raw[idx] = False
        self._out[idx] = False
        self._pending[idx] = np.nan
        self._since[idx] = np.nan
