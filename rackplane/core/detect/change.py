"""Sequential change tests on per-bin counts, and the static rules they are compared with.

Setting (REFERENCE §3.3): per-link error counts in fixed bins (1 minute), Poisson with an
in-control rate λ0 > 0 (pre-FEC symbol / CRC-flit errors: raw bit errors are constant and
expected on PAM4 links, so "> 0" rules are wrong, REFERENCE §3.2).

- `PoissonCusum`: upper Poisson CUSUM (Page 1954): S ← min(S_max, max(0, S + x − k)) with
  k = (λ1 − λ0)/ln(λ1/λ0) (`cusum_reference_value`); alarm when S > h, cleared when S falls to
  ``h_clear`` (one alarm per incident; S is not reset, so a persisting fault stays one alarm);
  an optional ``watch_h`` < h gives a "watch" flag (two-stage watch → confirm).
  ARL0 and delays of the designs in use: docs/RACKY.md §S8 (racky's default λ1 = 1.5/min,
  h = 17: ARL0 ≈ 1,900 years per link by a Markov-chain calculation).
- `PoissonEwma`: EWMA (Roberts 1959) with the asymptotic UCL λ0 + L·√(λ0·w/(2 − w)).
- `WindowSum`: the count over the last W bins above a threshold (the IBTA-style "60-minute
  window > 120 errors").
- `RateFor`: Prometheus style ``rate(x[5m]) > thr for 5m``: the rate over the last W bins
  above ``thr`` on ``for_bins`` + 1 consecutive evaluations.
- `BinAccumulator`: turns irregular per-poll deltas into fixed bins, NaN where a bin holds an
  unknown delta (a reset, a saturated counter) or too little coverage (missed polls).

Every detector here is also a `sims.link_harness.ChunkDetector` (``det(counts, minute_start)``
over a (links, minutes) matrix returns the raise events), so the link-only harness measures
exactly the production code. The four detectors share their alarm bookkeeping (``state``,
``raised``, that call) through `_BinDetector`; each class holds only its statistic.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rackplane.core.detect._util import (
    BoolArray,
    FloatArray,
    check_count,
    check_time,
    param,
    values,
)

__all__ = [
    "BinAccumulator",
    "PoissonCusum",
    "PoissonEwma",
    "RateFor",
    "WindowSum",
    "cusum_reference_value",
]

_EPS = 1e-9


def cusum_reference_value(lambda0: float, lambda1: float) -> float:
    """k = (λ1 − λ0)/ln(λ1/λ0) (REFERENCE §3.3: 1.08 /min for 0.5 → 2 /min).

    Raises:
        ValueError: unless 0 < λ0 < λ1 < inf.
    """
    if not (0.0 < lambda0 < lambda1) or not math.isfinite(lambda1):
        raise ValueError(f"need 0 < lambda0 < lambda1 (got {lambda0}, {lambda1})")
    return (lambda1 - lambda0) / math.log(lambda1 / lambda0)


class _BinDetector:
    """Alarm bookkeeping shared by the per-bin detectors; a subclass holds only its statistic.

    Per element (n,): ``state`` is the alarm condition now, ``raised`` the rising edges of the
    last update. A subclass's ``update`` computes its statistic and ends with `_level` (alarm
    while a condition holds: the static rules) or `_latch` (raise on one condition, clear on
    another: the change tests' hysteresis). Calling the detector runs it over a (n, m) count
    matrix (the `sims.link_harness.ChunkDetector` protocol).
    """

    def __init__(self, n: int) -> None:
        self.n = check_count("n", n)
        self._active = np.zeros(self.n, dtype=bool)
        self._raised = np.zeros(self.n, dtype=bool)

    @property
    def state(self) -> BoolArray:
        """Per element (n,): the alarm condition now (a copy)."""
        return self._active.copy()

    @property
    def raised(self) -> BoolArray:
        """Per element (n,): raised at the last update, i.e. rising edges (a copy)."""
        return self._raised.copy()

    def update(self, counts: Any) -> BoolArray:  # pragma: no cover - overridden
        raise NotImplementedError

    def _level(self, cond: BoolArray) -> BoolArray:
        """The alarm is ``cond`` itself; raised where it turned on. Returns `state`."""
        self._raised = cond & ~self._active
        self._active = cond
        return cond.copy()

    def _latch(self, on: BoolArray, off: BoolArray) -> BoolArray:
        """Raise where ``on`` holds and the alarm is off; clear where ``off`` holds and it is
        on (one alarm per incident). Returns `state`."""
        rise = ~self._active & on
        clear = self._active & off
        self._active = (self._active | rise) & ~clear
        self._raised = rise
        return self._active.copy()

    def __call__(self, counts: Any, minute_start: int = 0, /) -> BoolArray | None:
        """Feed ``counts`` of shape (n, m) bin by bin; returns a (n, m) bool matrix of raise
        events (rising edges), or None when there was none.

        Raises:
            ValueError: ``counts`` not of shape (n, m).
        """
        c = np.asarray(counts)
        if c.ndim != 2 or c.shape[0] != self.n:
            raise ValueError(f"counts must have shape ({self.n}, bins)")
        out: BoolArray | None = None
        for j in range(c.shape[1]):
            self.update(c[:, j])
            r = self.raised
            if r.any():
                if out is None:
                    out = np.zeros(c.shape, dtype=bool)
                out[:, j] = r
        return out


class PoissonCusum(_BinDetector):
    """Upper Poisson CUSUM per element (see the module docstring).

    Args:
        n: elements (links).
        lambda0, lambda1: in-control and out-of-control counts per bin (scalars or (n,)).
        h: decision interval (> 0).
        h_clear: the alarm clears when S falls to this (default h / 4).
        s_max: S is capped here (default 2 h) so the alarm clears in bounded time after a
            repair.
        watch_h: optional lower threshold for the "watch" flag (two-stage design).

    Raises:
        ValueError: bad rates or thresholds.
    """

    def __init__(
        self,
        n: int,
        lambda0: Any,
        lambda1: Any,
        h: float,
        *,
        h_clear: float | None = None,
        s_max: float | None = None,
        watch_h: float | None = None,
    ) -> None:
        super().__init__(n)
        l0 = param("lambda0", lambda0, self.n, lo=0.0, lo_open=True)
        l1 = param("lambda1", lambda1, self.n, lo=0.0, lo_open=True)
        if (l1 <= l0).any():
            raise ValueError("lambda1 must be above lambda0")
        if not (math.isfinite(h) and h > 0):
            raise ValueError("h must be > 0")
        self.lambda0, self.lambda1 = l0, l1
        self.k = (l1 - l0) / np.log(l1 / l0)
        self.h = float(h)
        self.h_clear = self.h / 4.0 if h_clear is None else float(h_clear)
        self.s_max = 2.0 * self.h if s_max is None else float(s_max)
        if not (0.0 <= self.h_clear < self.h <= self.s_max):
            raise ValueError("need 0 <= h_clear < h <= s_max")
        if watch_h is not None and not (0.0 < watch_h < self.h):
            raise ValueError("watch_h must be within (0, h)")
        self.watch_h = watch_h
        self.s = np.zeros(self.n)

    @property
    def watch(self) -> BoolArray:
        """S above ``watch_h`` (all False without one)."""
        if self.watch_h is None:
            return np.zeros(self.n, dtype=bool)
        out: BoolArray = self.s > self.watch_h
        return out

    def update(self, counts: Any) -> BoolArray:
        """Advance one bin; NaN counts leave an element unchanged (no information).
        Returns the alarm condition (a copy)."""
        x = values("counts", counts, self.n)
        valid = ~np.isnan(x)
        s = np.where(valid, np.clip(self.s + np.nan_to_num(x) - self.k, 0.0, self.s_max), self.s)
        self.s = s
        return self._latch(s > self.h, s <= self.h_clear)

    def reset(self, which: Any = None) -> None:
        """Restart elements (all when None): S = 0, alarm off."""
        idx = slice(None) if which is None else which
        self.s[idx] = 0.0
        self._active[idx] = False

    def __call__(self, counts: Any, minute_start: int = 0, /) -> BoolArray | None:
        """The harness path: as `_BinDetector.__call__`, with in-place arithmetic for integer
        counts (no NaN possible); the same recursion as `update`."""
        c = np.asarray(counts)
        if c.dtype.kind not in "ui":
            return super().__call__(c, minute_start)
        if c.ndim != 2 or c.shape[0] != self.n:
            raise ValueError(f"counts must have shape ({self.n}, bins)")
        s, k, act = self.s, self.k, self._active
        out: BoolArray | None = None
        for j in range(c.shape[1]):
            s += c[:, j]
            s -= k
            np.clip(s, 0.0, self.s_max, out=s)
            rise = s > self.h
            rise &= ~act
            if act.any():
                act &= s > self.h_clear
            if rise.any():
                act |= rise
                if out is None:
                    out = np.zeros(c.shape, dtype=bool)
                out[:, j] = rise
        self._raised = np.zeros(self.n, dtype=bool)
        return out


class PoissonEwma(_BinDetector):
    """EWMA of per-bin counts with the asymptotic UCL (REFERENCE §3.3: w = 0.05, L = 5).

    Raises when z > UCL, clears when z < λ0 + (UCL − λ0)/2.
    """

    def __init__(self, n: int, lambda0: Any, weight: float = 0.05, width: float = 5.0) -> None:
        super().__init__(n)
        if not (0.0 < weight <= 1.0) or not (width > 0.0):
            raise ValueError("weight must be in (0, 1] and width > 0")
        self.lambda0 = param("lambda0", lambda0, self.n, lo=0.0, lo_open=True)
        self.weight = float(weight)
        self.ucl = self.lambda0 + width * np.sqrt(self.lambda0 * weight / (2.0 - weight))
        self.z = self.lambda0.copy()

    def update(self, counts: Any) -> BoolArray:
        """Add one bin's counts (n,) (NaN: unknown bin); returns `state`.

        Raises:
            ValueError: wrong shape.
        """
        x = values("counts", counts, self.n)
        valid = ~np.isnan(x)
        self.z = np.where(valid, (1.0 - self.weight) * self.z + self.weight * np.nan_to_num(x),
                          self.z)
        return self._latch(self.z > self.ucl, self.z < 0.5 * (self.lambda0 + self.ucl))


class WindowSum(_BinDetector):
    """Count over the last ``window_bins`` bins above ``threshold`` (e.g. 60 one-minute bins >
    120: the "IBTA limit" as usually implemented, REFERENCE §3.3). NaN counts count as 0."""

    def __init__(self, n: int, window_bins: int, threshold: float) -> None:
        super().__init__(n)
        self.window_bins = check_count("window_bins", window_bins)
        if self.window_bins < 1:
            raise ValueError("window_bins must be >= 1")
        self.threshold = float(threshold)
        self._ring = np.zeros((self.n, self.window_bins))
        self._i = 0
        self._sum = np.zeros(self.n)

    @property
    def window_count(self) -> FloatArray:
        """The count over the window now."""
        return self._sum.copy()

    def update(self, counts: Any) -> BoolArray:
        """Add one bin's counts (n,) (NaN counts as 0); returns `state`.

        Raises:
            ValueError: wrong shape.
        """
        x = np.nan_to_num(values("counts", counts, self.n))
        self._sum += x - self._ring[:, self._i]
        self._ring[:, self._i] = x
        self._i = (self._i + 1) % self.window_bins
        return self._level(self._sum > self.threshold + _EPS)


class RateFor(_BinDetector):
    """Prometheus ``rate(x[window]) > rate_per_bin for <for_bins>``: the mean count per bin over
    the last ``window_bins`` above ``rate_per_bin`` on ``for_bins + 1`` consecutive bins (the
    condition has then held for ``for_bins`` bins). NaN counts count as 0."""

    def __init__(self, n: int, window_bins: int, rate_per_bin: float, for_bins: int) -> None:
        super().__init__(n)
        self._win = WindowSum(n, window_bins, 0.0)
        self.window_bins = self._win.window_bins
        self.rate_per_bin = float(rate_per_bin)
        self.for_bins = check_count("for_bins", for_bins)
        self._held = np.zeros(self.n, dtype=np.int64)

    def update(self, counts: Any) -> BoolArray:
        """Add one bin's counts (n,); returns `state`.

        Raises:
            ValueError: wrong shape.
        """
        self._win.update(counts)
        above = self._win.window_count / self.window_bins > self.rate_per_bin + _EPS
        self._held = np.where(above, self._held + 1, 0)
        return self._level(self._held >= self.for_bins + 1)


class BinAccumulator:
    """Irregular per-poll deltas into fixed bins of ``bin_s`` seconds (arrival time decides the
    bin; the first bin starts at the first call).

    A closed bin's count is NaN for an element that reported an unknown delta (NaN) inside it
    or whose known deltas cover less than ``min_coverage`` of the bin (missed polls): such a
    bin carries no information rather than a short count.

    Raises:
        ValueError: bad sizes or times going backwards.
    """

    def __init__(self, n: int, bin_s: float = 60.0, min_coverage: float = 0.75) -> None:
        self.n = check_count("n", n)
        if not (math.isfinite(bin_s) and bin_s > 0):
            raise ValueError("bin_s must be > 0")
        if not 0.0 <= min_coverage <= 1.0:
            raise ValueError("min_coverage must be within [0, 1]")
        self.bin_s = float(bin_s)
        self.min_coverage = float(min_coverage)
        self._sum = np.zeros(self.n)
        self._cover = np.zeros(self.n)
        self._bad = np.zeros(self.n, dtype=bool)
        self._end: float | None = None
        self._last_t: float | None = None

    @property
    def bin_end(self) -> float | None:
        """End of the open bin, monotonic s (None before the first call)."""
        return self._end

    def add(self, now_mono: float, delta: Any, dt_s: Any, present: Any = None
            ) -> FloatArray | None:
        """Add one poll's deltas (NaN: unknown) covering ``dt_s`` seconds (NaN: nothing);
        ``present`` (default: finite dt) marks elements with a read this poll. Returns the
        closed bin's counts when this call ends a bin, else None."""
        now = check_time("now_mono", now_mono, self._last_t)
        self._last_t = now
        if self._end is None:
            self._end = now + self.bin_s
        d = values("delta", delta, self.n)
        dt = values("dt_s", dt_s, self.n)
        pres = ~np.isnan(dt) if present is None else np.asarray(present, dtype=bool)
        self._bad |= pres & np.isnan(d)
        ok = pres & ~np.isnan(d)
        self._sum += np.where(ok, d, 0.0)
        self._cover += np.where(ok, np.nan_to_num(dt), 0.0)
        if now < self._end - _EPS:
            return None
        counts = np.where(self._bad | (self._cover < self.min_coverage * self.bin_s - _EPS),
                          np.nan, self._sum)
        self._sum = np.zeros(self.n)
        self._cover = np.zeros(self.n)
        self._bad = np.zeros(self.n, dtype=bool)
        # next bin: contiguous, unless polls stopped for longer than a bin (then realign)
        self._end = self._end + self.bin_s if now < self._end + self.bin_s else now + self.bin_s
        return counts
