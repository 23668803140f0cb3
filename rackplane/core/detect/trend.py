"""Rate of rise and predicted time to a limit, vectorised.

REFERENCE §3.4: a GPU junction rising faster than 2 K/s for 2 s at flat power is a loss of
flow or a failed cold plate (the physical rate at zero flow is ≈ 4 K/s); a supply temperature
rising faster than 0.2 K/s for 5 s at steady power is a loss of heat rejection. The slope is a
least-squares fit over the last ``points`` valid samples (robust to one noisy sample, unlike a
two-point difference); the time to a limit extrapolates it linearly, which for a first-order
approach overestimates the speed: the prediction errs early (safe).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rackplane.core.detect._util import FloatArray, check_count, check_time, values

__all__ = ["RateOfRise", "time_to_limit"]


class RateOfRise:
    """Least-squares slope per element over its last ``points`` valid samples [unit/s].

    Args:
        n: elements.
        points: samples in the fit (>= 2).
        max_span_s: samples older than this (relative to the newest) are not used.
    """

    def __init__(self, n: int, points: int = 3, max_span_s: float = 10.0) -> None:
        self.n = check_count("n", n)
        self.points = check_count("points", points)
        if self.points < 2:
            raise ValueError("points must be >= 2")
        if not (np.isfinite(max_span_s) and max_span_s > 0):
            raise ValueError("max_span_s must be > 0")
        self.max_span_s = float(max_span_s)
        self._v = np.full((self.n, self.points), np.nan)
        self._t = np.full((self.n, self.points), np.nan)
        self._last_t: float | None = None

    def update(self, now_mono: float, value: Any) -> FloatArray:
        """Add one sample per element (NaN: none) at ``now_mono``; returns the slopes (NaN
        where fewer than 2 usable samples)."""
        now = check_time("now_mono", now_mono, self._last_t)
        self._last_t = now
        v = values("value", value, self.n)
        ok = ~np.isnan(v)
        if ok.all():
            self._v[:, 1:] = self._v[:, :-1]
            self._t[:, 1:] = self._t[:, :-1]
            self._v[:, 0] = v
            self._t[:, 0] = now
        elif ok.any():
            self._v[ok] = np.roll(self._v[ok], 1, axis=1)
            self._t[ok] = np.roll(self._t[ok], 1, axis=1)
            self._v[ok, 0] = v[ok]
            self._t[ok, 0] = now
        return self.slope(now)

    def slope(self, now_mono: float) -> FloatArray:
        """The slopes using samples within ``max_span_s`` of ``now_mono``."""
        with np.errstate(invalid="ignore"):
            use = ~np.isnan(self._v) & (now_mono - self._t <= self.max_span_s + 1e-9)
        cnt = use.sum(axis=1)
        t = np.where(use, self._t, 0.0)
        v = np.where(use, self._v, 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            tm = t.sum(axis=1) / cnt
            vm = v.sum(axis=1) / cnt
            dt = np.where(use, self._t - tm[:, None], 0.0)
            dv = np.where(use, self._v - vm[:, None], 0.0)
            den = (dt * dt).sum(axis=1)
            out: FloatArray = np.where((cnt >= 2) & (den > 0), (dt * dv).sum(axis=1) / den,
                                       np.nan)
        return out


def time_to_limit(value: Any, slope: Any, limit: Any) -> FloatArray:
    """Seconds until ``value`` reaches ``limit`` at ``slope`` per s (linear): 0 at or past the
    limit, inf when not rising (or unknown slope), NaN for an unknown value."""
    v = np.asarray(value, dtype=np.float64)
    s = np.asarray(slope, dtype=np.float64)
    lim = np.asarray(limit, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        ttl = np.where(v >= lim, 0.0, np.where(s > 0, (lim - v) / s, np.inf))
    out: FloatArray = np.where(np.isnan(v), np.nan, ttl)
    return out
