"""The cold-plate time constant of each GPU, learned from its junction's response to a power
step (pure, vectorised over the rack's GPUs).

`racky.core.thermal` extrapolates the junction temperature with the plate's time constant
τ = C/G (the first-order steady state Tj + τ·dTj/dt, the protective cap's look-ahead 2τ). τ
is the plant's (the cold plate's heat capacity over its conductance to the coolant: another
plate, another flow, fouling change it); a controller must not assume the nominal simulated
plant's. So it is learned, per GPU:

after a power step (``moved``) the junction follows the plate, dTj/dt = (Tss − Tj)/τ at
constant power. Each pair of successive fresh readings while the power stays where it
stepped gives a point (x = the pair's mean Tj, y = its difference quotient [K/s]); at the
end of the window (the next step, or ``window_s`` after this one) the least-squares line
y = a + b·x gives τ = −1/b (the trapezoidal quotient is within 1 % of the derivative for a
reading interval up to τ). A window counts only with at least ``min_pairs`` points and a
junction range of ``min_range_k`` (a flat trace teaches nothing), b < 0, τ within
[``min_s``, ``max_s``], and the line explaining at least ``min_r2`` of the quotients'
variance (R²): a window in which the junction does not follow one first-order decay (the
load wandered within the flat band, the coolant drifted under it) gives a flat, poorly
fitting line, i.e. a τ many times too long. A too-long τ is NOT the safe side: the
steady-state prediction Tj + τ·dTj/dt then reads a healthy load step's rise as an overheat
(one such window, averaged in, took τ from ≈ 4 s to 16-29 s and raised tray_overheat and a
protective cap under a healthy load). Each counted τ is averaged 1:1 into the GPU's estimate.
Until a GPU has one, the prior (``plate_tau_s``) is the protective cap's look-ahead only
(`racky.core.thermal` predicts nothing on it).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["PlateTau"]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


class PlateTau:
    """Per-GPU plate time constant (module docstring).

    Args:
        n: GPUs; prior_s: τ until learned [s]; min_s, max_s: plausibility window [s];
        window_s: longest fit window after a step [s]; min_pairs, min_range_k, min_r2: what a
        window needs to count (pairs, junction range [K], the fit's R² [0-1]).
    """

    def __init__(self, n: int, prior_s: float, *, min_s: float = 1.0, max_s: float = 60.0,
                 window_s: float = 30.0, min_pairs: int = 5, min_range_k: float = 1.0,
                 min_r2: float = 0.5) -> None:
        self.prior_s = prior_s
        self.min_s, self.max_s = min_s, max_s
        self.window_s = window_s
        self.min_pairs = min_pairs
        self.min_range_k = min_range_k
        self.min_r2 = min_r2
        self.tau_s: FloatArray = np.full(n, prior_s)  # in use: learned, else the prior
        self.learned: BoolArray = np.zeros(n, dtype=bool)
        self.fits = 0  # windows counted (all GPUs)
        self.rejected = 0  # windows with a τ outside [min_s, max_s], b >= 0 or R² < min_r2
        self._start = np.full(n, np.nan)  # the window's step time
        self._prev_t = np.full(n, np.nan)
        self._prev_tj = np.full(n, np.nan)
        self._sums = np.zeros((6, n))  # per GPU: pairs, Σx, Σy, Σxx, Σxy, Σyy
        self._lo = np.full(n, np.inf)
        self._hi = np.full(n, -np.inf)

    def update(self, now: float, tj_c: FloatArray, moved: BoolArray, fresh: BoolArray) -> None:
        """One tick at monotonic ``now`` [s]: junction temperatures [°C] (NaN: none), which
        GPUs' power stepped at this tick, which readings are fresh."""
        ok = fresh & np.isfinite(tj_c)
        open_ = np.isfinite(self._start)
        # a window ends at the next step, after window_s, or at a missing reading
        end = open_ & (moved | (now - self._start > self.window_s) | ~ok)
        if end.any():
            self._fit(end)
        start = moved & ok
        self._start = np.where(start, now, self._start)
        pair = ok & ~moved & np.isfinite(self._start) & np.isfinite(self._prev_tj) & (
            now > self._prev_t)
        dt = np.where(pair, now - self._prev_t, 1.0)
        x = np.where(pair, 0.5 * (tj_c + self._prev_tj), 0.0)
        y = np.where(pair, (tj_c - self._prev_tj) / dt, 0.0)
        s = self._sums
        s[0] += pair
        s[1] += x
        s[2] += y
        s[3] += x * x
        s[4] += x * y
        s[5] += y * y
        self._lo = np.where(pair, np.minimum(self._lo, tj_c), self._lo)
        self._hi = np.where(pair, np.maximum(self._hi, tj_c), self._hi)
        self._prev_tj = np.where(ok, tj_c, np.nan)
        self._prev_t = np.where(ok, now, np.nan)

    def _fit(self, end: BoolArray) -> None:
        s = self._sums
        n = s[0]
        with np.errstate(invalid="ignore", divide="ignore"):
            var = s[3] - s[1] * s[1] / n
            cov = s[4] - s[1] * s[2] / n
            var_y = s[5] - s[2] * s[2] / n
            b = cov / var
            r2 = cov * cov / (var * var_y)
        rng = self._hi - self._lo
        enough = end & (n >= self.min_pairs) & (rng >= self.min_range_k) & (var > 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            tau = np.where(enough & (b < 0.0), -1.0 / b, np.nan)
        good = enough & (tau >= self.min_s) & (tau <= self.max_s) & (r2 >= self.min_r2)
        self.rejected += int((enough & ~good).sum())
        self.fits += int(good.sum())
        self.tau_s = np.where(good, np.where(self.learned, 0.5 * (self.tau_s + tau), tau),
                              self.tau_s)
        self.learned |= good
        s[:, end] = 0.0
        self._lo = np.where(end, np.inf, self._lo)
        self._hi = np.where(end, -np.inf, self._hi)
        self._start = np.where(end, np.nan, self._start)

    def reset(self) -> None:
        """Forget what was learned (the prior again)."""
        self.tau_s[:] = self.prior_s
        self.learned[:] = False
