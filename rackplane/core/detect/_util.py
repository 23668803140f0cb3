"""Shared argument checks of the detectors (internal)."""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["check_count", "check_time", "mask", "param", "values"]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]


def check_time(name: str, t: float, last: float | None) -> float:
    """``t`` as a float; ValueError when not finite or before ``last`` (monotonic time)."""
    if isinstance(t, bool) or not isinstance(t, numbers.Real) or not math.isfinite(t):
        raise ValueError(f"{name} must be a finite number of monotonic seconds, got {t!r}")
    if last is not None and t < last:
        raise ValueError(f"monotonic time went backwards: {t} < {last}")
    return float(t)


def check_count(name: str, n: int) -> int:
    """``n`` as an int >= 0; ValueError otherwise."""
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise ValueError(f"{name} must be an integer >= 0 (got {n!r})")
    return int(n)


def param(name: str, value: Any, n: int, *, lo: float | None = None,
          lo_open: bool = False, allow_inf: bool = False) -> FloatArray:
    """A scalar or a length-``n`` parameter as a float array of shape (n,).

    Raises:
        ValueError: wrong shape, NaN, infinite (unless ``allow_inf``), or below ``lo``.
    """
    a = np.asarray(value, dtype=np.float64)
    if a.ndim == 0:
        a = np.full(n, float(a))
    if a.shape != (n,):
        raise ValueError(f"{name} must be a scalar or have shape ({n},), got {a.shape}")
    if np.isnan(a).any() or (not allow_inf and np.isinf(a).any()):
        raise ValueError(f"{name} must be finite")
    if lo is not None and ((a <= lo).any() if lo_open else (a < lo).any()):
        raise ValueError(f"{name} must be {'>' if lo_open else '>='} {lo}")
    return a.copy()


def values(name: str, v: Any, n: int) -> FloatArray:
    """Per-element input values, shape (n,), float (NaN = no information)."""
    a = np.asarray(v, dtype=np.float64)
    if a.ndim == 0:
        a = np.full(n, float(a))
    if a.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},), got {a.shape}")
    return a


def mask(name: str, v: Any, n: int) -> BoolArray:
    """A per-element bool mask of shape (n,) (a scalar is broadcast)."""
    a = np.asarray(v, dtype=bool)
    if a.ndim == 0:
        a = np.full(n, bool(a))
    if a.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},), got {a.shape}")
    return a
