"""Rising pre-FEC error rate per link, judged against the link's own learned baseline (pure;
issue 22).

`LearnedRateCusum` keeps, per link (a port's pre-FEC counter), a learned healthy rate and an
upper negative-binomial CUSUM on 1-minute counts against it:

* **Baseline.** The mean count per bin (and the mean square, for the variance/mean),
  learned from the link's own bins: a plain mean while the link has shown fewer than
  ``warmup_bins`` known bins, then an exponentially weighted mean with time constant
  ``tau_bins``. A bin is learnt only while the CUSUM statistic *before* it is zero
  and the alarm is off: a creep from the link's own baseline lifts the statistic off zero and
  freezes the learning, so it is not absorbed (the condition looks only at earlier bins, so it
  does not bias the estimate). Unknown bins (NaN: a counter reset, a saturated counter, missed
  polls) and lower-bound bins are never learnt and leave the statistic unchanged.
  Through the warm-up every known bin is learnt: a link that alarmed during the warm-up on
  a baseline estimated from a few hours would otherwise keep its statistic off zero and its
  learning frozen at the low estimate, and alarm again and again after the warm-up (the
  caller's ``hold``, the fallback design's evidence, still keeps a fault from the link's
  first minute out). The rate judged against is the estimate plus ``z_margin`` standard errors of it
  (√(φ·λ/n_eff), n_eff = bins learnt, at most 2·``tau_bins``), clipped to
  [``floor``, ``cap``]: a baseline estimated from few bins is not taken as exact (an
  underestimated baseline by 10 % multiplies the false alarms by ~10). A link learns nothing
  above ``cap``: a link already faulty when first seen is judged against the cap.
  Detection starts once ``min_bins`` bins are learnt. The bins learnt are folded into the
  baseline (and λ0 and the statistic's coefficients recomputed) every ``refresh_bins`` bins
  (an hour of 1-minute bins): a per-link baseline needs no finer step, and the batch form
  stays within a few numpy operations per bin.
* **Statistic.** The log-likelihood ratio of a count under mean λ1 = ``ratio`` × λ0 against
  λ0 with the link's variance/mean φ holding under the rise (``alternative`` "dispersion":
  negative binomials of sizes λ/(φ − 1) and one p = 1/φ; Poisson when φ = 1), tabulated per
  link for counts 0 .. K at each fold (`llr_table`; beyond K along the last slope):
  S ← min(s_max, max(0, S + LLR(x))); alarm when S > h, cleared at h/4 (one alarm per
  incident). (``alternative`` "size" holds the NB size λ0/(φ − 1) instead, so the
  variance/mean grows to 1 + ρ(φ − 1) under the rise: it discounts large counts and was
  ~8 % slower on a creep at variance/mean 1.5.) φ is the link's learned variance/mean plus
  ``z_dispersion`` standard errors of it (the NB kurtosis at the estimate:
  √((2 + 6(φ − 1)/λ + 1/(λφ))/n)), within [``dispersion_min``, ``dispersion``] (or
  ``dispersion`` itself when ``learn_dispersion`` is off).
* **Threshold per link.** With ``arl0_bins`` set, each armed link's h is the one whose
  in-control average run length, for counts of mean λ0 and variance/mean φ (the rate and
  dispersion it is judged against), is ``arl0_bins`` (`log_arl0`: the Markov-chain
  approximation of Brook & Evans with the mass split between neighbouring levels;
  `racky.core.arlchain` solves the chain), within [``h_min``, ``h_max``]. That h is
  tabulated once per design on a grid of ln λ0 × φ, found at each point by a safeguarded
  secant on ln ARL0(h) (ln ARL0 − h is not flat in h: at 40 counts/bin its slope is ~0.76,
  and a threshold taken from ln ARL0 − h at one h was 1.7 too high there), and interpolated
  bilinearly (`racky.core.linkthresholds`: between grid points h errs low where it is
  concave, detection not slower than designed; the run length within e^±0.6 of the target
  there, its documented bounds). A
  threshold that comes out non-finite (a defect: the chain is finite by construction) is
  the design's ``h`` (clipped to that range: a detector that can alarm), counted in
  `RateDesign.nonfinite_thresholds` and logged. One h for every link gives links with rarer
  counts a longer run length (≈ 2.5× between 0.3/min and 0.8/min at h = 18): with the
  target held per link, the low-rate links are judged faster and the busy ones no noisier.
  Without ``arl0_bins``, ``h`` for every link.

Everything is vectorised over links; ``__call__`` is the `sims.link_harness.ChunkDetector`
form over a (links, minutes) matrix (the scoring harness runs this class).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from rackplane.log import get_logger
from racky.core.arlchain import log_arl0
from racky.core.linkthresholds import bilinear, solve_grid

__all__ = ["LearnedRateCusum", "RateDesign", "llr_table", "log_arl0"]

_log = get_logger("racky.core.linkrate")

_K_MIN = 31  # counts per bin tabulated at least (the table grows with the largest λ1)
_K_MAX = 4095


def llr_table(l0: FloatArray, l1: FloatArray, phi: FloatArray, k: int, alternative: str
              ) -> tuple[FloatArray, FloatArray]:
    """Log-likelihood ratio of a count x = 0 .. ``k`` of mean ``l1`` against ``l0`` (per
    row), at variance/mean ``phi`` (Poisson where φ ≤ 1.001): shape (rows, k + 1), and the
    LLR per count beyond k (rows,). ``alternative`` "dispersion": φ holds under the rise
    (NB sizes λ/(φ − 1), one p = 1/φ); "size": the NB size λ0/(φ − 1) holds."""
    nb = phi > 1.0 + 1e-3
    j = np.arange(k, dtype=np.float64)[None, :]
    if alternative == "dispersion":
        g = np.where(nb, phi - 1.0, 1.0)[:, None]
        r0, r1 = l0[:, None] / g, l1[:, None] / g
        c0 = np.where(nb, -(r1[:, 0] - r0[:, 0]) * np.log(np.where(nb, phi, 1.0)), -(l1 - l0))
        steps = np.where(nb[:, None], np.log((j + r1) / (j + r0)), np.log(l1 / l0)[:, None])
    else:
        r = l0 / np.where(nb, phi - 1.0, 1.0)
        a = np.where(nb, np.log(l1 * (l0 + r) / (l0 * (l1 + r))), np.log(l1 / l0))
        c0 = np.where(nb, r * np.log((l0 + r) / (l1 + r)), -(l1 - l0))
        steps = np.broadcast_to(a[:, None], (len(l0), k)).copy()
    tab = np.empty((len(l0), k + 1))
    tab[:, 0] = c0
    np.cumsum(steps, axis=1, out=tab[:, 1:])
    tab[:, 1:] += c0[:, None]
    return tab, steps[:, -1].copy()


FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


_GridKey = tuple[float, float, float, float, float, float, str, float, float, float]
_Grid = tuple[FloatArray, FloatArray, FloatArray]
_GRIDS: dict[_GridKey, _Grid] = {}
"""Threshold grids by `RateDesign.grid_key`, oldest first (a process has a few designs: the
per-link one and a pooled one per part size; `_GRIDS_MAX` bounds it all the same)."""
_GRIDS_MAX = 64


def _compute_grid(floor: float, cap: float, dispersion_min: float, dispersion: float,
                  ratio: float, h: float, alternative: str, arl0_bins: float, h_min: float,
                  h_max: float) -> _Grid:
    """`RateDesign`'s grid: ln λ0 points (every 0.35 from ln floor to ln cap, and halfway
    between where h falls steeply: `solve_grid`), φ points (every 0.25 from dispersion_min
    to dispersion), and at each the smallest threshold (to `linkthresholds._H_RES`) whose
    ln ARL0 is at least ln ``arl0_bins`` (`solve_grid`, from ``h``, within [``h_min``/2,
    ``h_max``]: unclipped below h_min, so that `RateDesign.h_for` clips after the
    interpolation). Always finite (the chain is within [0, LN_ARL_MAX] for any design the
    config allows)."""
    ll = np.linspace(math.log(floor), math.log(cap),
                     max(2, math.ceil(math.log(cap / floor) / 0.35) + 1))
    pp = np.linspace(dispersion_min, dispersion,
                     max(2, math.ceil((dispersion - dispersion_min) / 0.25) + 1))
    ll, hg, _ = solve_grid(np.exp(ll), pp, ratio, alternative, math.log(arl0_bins), h,
                           0.5 * h_min, h_max)
    return ll, pp, hg


class RateDesign:
    """The settings of `LearnedRateCusum`, counts per bin (see the module docstring).

    Raises:
        ValueError: a setting out of its range (named).
    """

    def __init__(self, *, ratio: float = 3.0, h: float = 10.0, h_clear: float | None = None,
                 dispersion: float = 1.5, warmup_bins: int = 1440, min_bins: int = 120,
                 tau_bins: float = 10080.0, z_margin: float = 2.0, floor: float = 0.05,
                 cap: float = 10.0, initial: float = 0.5, refresh_bins: int = 60,
                 learn_dispersion: bool = True, dispersion_min: float = 1.0,
                 alternative: str = "dispersion", arl0_bins: float | None = None,
                 h_min: float = 6.0, h_max: float = 30.0, z_dispersion: float = 2.0) -> None:
        if alternative not in ("dispersion", "size"):
            raise ValueError(f"alternative = {alternative!r} is out of range")
        self.alternative = alternative
        if arl0_bins is not None and not (math.isfinite(arl0_bins) and arl0_bins > 1.0):
            raise ValueError(f"arl0_bins = {arl0_bins!r} is out of range")
        if not 0.0 < h_min <= h_max or not math.isfinite(h_max):
            raise ValueError("need 0 < h_min <= h_max")
        self.arl0_bins = None if arl0_bins is None else float(arl0_bins)
        self.h_min, self.h_max = float(h_min), float(h_max)
        if not (math.isfinite(z_dispersion) and z_dispersion >= 0.0):
            raise ValueError(f"z_dispersion = {z_dispersion!r} is out of range")
        self.z_dispersion = float(z_dispersion)
        checks = {"ratio": ratio > 1.0, "h": h > 0.0, "dispersion": 1.0 <= dispersion <= 10.0,
                  "warmup_bins": warmup_bins >= 1, "min_bins": 1 <= min_bins <= warmup_bins,
                  "tau_bins": tau_bins >= 1.0, "z_margin": z_margin >= 0.0,
                  "floor": floor > 0.0, "cap": cap >= floor, "initial": initial > 0.0,
                  "refresh_bins": refresh_bins >= 1,
                  "dispersion_min": 1.0 <= dispersion_min <= dispersion}
        for name, ok in checks.items():
            if not ok or not math.isfinite(float(locals()[name])):
                raise ValueError(f"{name} = {locals()[name]!r} is out of range")
        self.ratio = float(ratio)
        self.h = float(h)
        self.h_clear = self.h / 4.0 if h_clear is None else float(h_clear)
        if not 0.0 <= self.h_clear < self.h:
            raise ValueError("h_clear must be within [0, h)")
        self.s_max = 2.0 * self.h
        self.h_clear_ratio = self.h_clear / self.h
        self.dispersion = float(dispersion)
        self.warmup_bins = int(warmup_bins)
        self.min_bins = int(min_bins)
        self.tau_bins = float(tau_bins)
        self.z_margin = float(z_margin)
        self.floor = float(floor)
        self.cap = float(cap)
        self.initial = float(initial)
        self.refresh_bins = int(refresh_bins)
        self.learn_dispersion = bool(learn_dispersion)
        self.dispersion_min = float(dispersion_min)
        #: thresholds `h_for` found non-finite and replaced by ``h`` (a Python int: no wrap)
        self.nonfinite_thresholds = 0


    @property
    def grid_key(self) -> _GridKey:
        """What the threshold grid depends on (designs with one key share one grid; the
        arguments of `_compute_grid`). Without ``arl0_bins`` there is no grid: the key holds
        0 for it."""
        return (self.floor, self.cap, self.dispersion_min, self.dispersion, self.ratio,
                self.h, self.alternative, self.arl0_bins or 0.0, self.h_min, self.h_max)

    @property
    def grid_ready(self) -> bool:
        """Whether `h_for` would find its grid computed (no Markov-chain solves left)."""
        return self.arl0_bins is None or self.grid_key in _GRIDS

    def prepare_grid(self) -> None:
        """Compute the threshold grid now (a threshold solved per point, `solve_grid`: with
        the defaults 75 points, ~0.5 s of one core; the pooled design of a 72-port part, 165
        points, ~2.6 s; see scripts/bench_rate_grids.py), so that `h_for` does not. Safe
        from any thread: the grid is kept per `grid_key` in a process-wide cache; two
        callers at once (racky's worker thread, off its event loop, and a tick that needs the
        grid before the worker is done) may both compute it, with the same result (a pure
        core takes no locks; the cost is one grid's CPU, not a wrong threshold).
        Nothing to do without ``arl0_bins``."""
        if self.arl0_bins is not None:
            self._arl_grid()

    def _arl_grid(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        """ln λ0 and φ grid points, and the threshold at each (`_compute_grid`)."""
        key = self.grid_key
        got = _GRIDS.get(key)
        if got is not None:
            return got
        got = _compute_grid(*key)
        while len(_GRIDS) >= _GRIDS_MAX:  # oldest first
            old = next(iter(_GRIDS), None)
            if old is None:
                break
            _GRIDS.pop(old, None)
        _GRIDS[key] = got
        return got

    def h_for(self, l0: FloatArray, phi: FloatArray) -> FloatArray:
        """The threshold per link that holds ``arl0_bins`` for counts of mean ``l0`` and
        variance/mean ``phi`` (bilinear in ln λ0 and φ on the design's grid of thresholds;
        see `racky.core.linkthresholds` for the direction it errs in), within [``h_min``,
        ``h_max``]; ``h`` for every link when ``arl0_bins`` is None. Shapes:
        ``l0`` and ``phi`` broadcast together; counts per bin and variance/mean. Always
        finite: a non-finite result (a NaN input, a NaN grid point) is ``h`` clipped to
        [``h_min``, ``h_max``], counted in ``nonfinite_thresholds`` and logged."""
        if self.arl0_bins is None:
            return np.full(np.shape(l0), self.h)
        ll, pp, hg = self._arl_grid()
        with np.errstate(invalid="ignore"):
            h = bilinear(ll, pp, hg, np.log(np.maximum(l0, self.floor)),
                             np.asarray(phi, dtype=np.float64))
        bad = ~np.isfinite(h)
        if bad.any():  # never a NaN threshold (a link that could never alarm): the base h
            n_bad = int(np.count_nonzero(bad))
            self.nonfinite_thresholds += n_bad
            _log.error("rate_threshold_nonfinite", links=n_bad, fallback_h=self.h,
                       total=self.nonfinite_thresholds, grid_key=list(self.grid_key))
            h = np.where(bad, self.h, h)
        out: FloatArray = np.clip(h, self.h_min, self.h_max)
        return out


class LearnedRateCusum:
    """Per-link learned baseline + negative-binomial CUSUM (see the module docstring).

    Args:
        n: links.
        design: `RateDesign`.

    Attributes (per link, (n,)): ``s`` (statistic, LLR units), ``baseline`` (learned mean per
    bin), ``learned`` (bins learnt), ``lambda0`` (the rate judged against, per bin; NaN before
    ``min_bins``), ``h`` (the threshold, LLR units: `RateDesign.h_for` once armed),
    ``state`` / ``raised`` (alarm now / rising edges of the last update).
    """

    def __init__(self, n: int, design: RateDesign) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError("n must be an integer >= 0")
        self.n = n
        self.d = design
        self.s = np.zeros(n)
        self.h = np.full(n, design.h)  # decision interval per link (``h_for`` once armed)
        self.h_clear = self.h * design.h_clear_ratio
        self.s_max = 2.0 * self.h
        self.baseline = np.full(n, design.initial)
        self.sq = np.full(n, design.initial * (1.0 + design.initial))  # mean of x², learned
        self.learned = np.zeros(n)
        self.seen = np.zeros(n)  # valid bins seen (the warm-up runs on these)
        self.lambda0 = np.full(n, np.nan)
        self._table = np.zeros((_K_MIN + 1, n))  # LLR of a count 0 .. K (rows), per link
        self._slope = np.zeros(n)  # LLR per count beyond K
        self._idx_off = np.arange(n, dtype=np.int64)
        self._armed = np.zeros(n, dtype=bool)
        self._acc_n = np.zeros(n)  # bins learnt since the last fold, their sum and sum of x²
        self._acc_x = np.zeros(n)
        self._acc_xx = np.zeros(n)
        self._since = 0
        self.folds = 0  # baseline folds so far (a change to persist)
        self._active = np.zeros(n, dtype=bool)
        self._raised = np.zeros(n, dtype=bool)

    @property
    def state(self) -> BoolArray:
        """The alarm condition now (a copy)."""
        return self._active.copy()

    @property
    def raised(self) -> BoolArray:
        """Rising edges of the last update (a copy)."""
        return self._raised.copy()

    # -- persistence -------------------------------------------------------------------------

    def export(self) -> dict[str, FloatArray]:
        """The learned state to persist: ``baseline`` (mean per bin), ``learned`` (bins) and
        ``dispersion`` (learned variance/mean, before its margin) (copies)."""
        bf = np.maximum(self.baseline, self.d.floor)
        return {"baseline": self.baseline.copy(), "learned": self.learned.copy(),
                "dispersion": np.maximum(self.sq - self.baseline ** 2, 0.0) / bf}

    def restore(self, baseline: Any, learned: Any, dispersion: Any = None) -> None:
        """Take back a persisted baseline (per link, mean count per bin; NaN: none), its
        learnt-bin count and its variance/mean (NaN or None: unknown, taken as the design's
        largest, ``dispersion``, until relearnt). Values outside (0, cap] or non-finite are
        refused per link (that link starts learning afresh); the statistic starts at zero.

        Raises:
            ValueError: wrong shapes.
        """
        b = np.asarray(baseline, dtype=np.float64)
        k = np.asarray(learned, dtype=np.float64)
        if b.shape != (self.n,) or k.shape != (self.n,):
            raise ValueError(f"baseline and learned must have shape ({self.n},)")
        ok = np.isfinite(b) & (b > 0.0) & (b <= self.d.cap) & np.isfinite(k) & (k >= 0.0)
        phi = (np.full(self.n, np.nan) if dispersion is None
               else np.asarray(dispersion, dtype=np.float64))
        if phi.shape != (self.n,):
            raise ValueError(f"dispersion must have shape ({self.n},)")
        phi = np.where(np.isfinite(phi) & (phi >= 0.0), np.minimum(phi, self.d.dispersion),
                       self.d.dispersion)
        self.baseline = np.where(ok, b, self.d.initial)
        bf = np.maximum(self.baseline, self.d.floor)
        self.sq = np.where(ok, self.baseline ** 2 + phi * bf,
                           self.d.initial * (1.0 + self.d.initial))
        self.learned = np.where(ok, np.minimum(k, 2.0 * self.d.tau_bins), 0.0)
        self.seen = np.where(ok, np.maximum(self.learned, self.d.warmup_bins + 1.0), 0.0)
        self._refresh(np.ones(self.n, dtype=bool))

    # -- one bin -----------------------------------------------------------------------------

    def _refresh(self, which: BoolArray) -> None:
        """Recompute λ0 and the LLR coefficients where ``which``."""
        d = self.d
        if not which.any():
            return
        n_eff = np.minimum(self.learned[which], 2.0 * d.tau_bins)
        base = self.baseline[which]
        bf = np.maximum(base, d.floor)
        m = np.maximum(n_eff, 1.0)
        # learned variance/mean, plus its margin, within [1, dispersion]
        phi_hat = np.maximum(self.sq[which] - base * base, 0.0) / bf
        # relative standard error of a variance/mean from m bins of mean λ: √((κ − 1)/m), κ the
        # counts' kurtosis, negative binomial at the estimate: 3 + 6(φ − 1)/λ + 1/(λφ)
        # (Poisson, φ = 1: 3 + 1/λ)
        ph = np.maximum(phi_hat, 1.0)
        rel = np.sqrt((2.0 + 6.0 * (ph - 1.0) / bf + 1.0 / (bf * ph)) / m)
        phi = (np.clip(phi_hat * (1.0 + d.z_dispersion * rel), d.dispersion_min, d.dispersion)
               if d.learn_dispersion else np.full(len(base), d.dispersion))
        se = np.sqrt(phi * bf / m)
        l0 = np.clip(base + d.z_margin * se, d.floor, d.cap)
        l1 = d.ratio * l0
        armed = self.learned[which] >= d.min_bins
        self.lambda0[which] = np.where(armed, l0, np.nan)
        self._armed[which] = armed
        self._table_for(which, l0, l1, phi, armed)
        if d.arl0_bins is not None:
            # the grid (`RateDesign.h_for`) only once a link is armed: a detector that is
            # still learning (a fresh start) never waits for it
            self.h[which] = (np.where(armed, d.h_for(l0, phi), d.h_max) if armed.any()
                             else d.h_max)
            self.h_clear = self.h * d.h_clear_ratio
            self.s_max = 2.0 * self.h

    def _table_for(self, which: BoolArray, l0: FloatArray, l1: FloatArray, phi: FloatArray,
                   armed: BoolArray) -> None:
        """The log-likelihood ratio of a count x = 0 .. K per link (rows ``which``), and its
        slope beyond K (counts above K are extrapolated along it)."""
        d = self.d
        if not which.all():
            raise ValueError("the LLR table is recomputed for every link at once")
        k = max(_K_MIN, math.ceil(float(np.max(l1, initial=0.0))
                                      * (1.0 + float(np.max(phi, initial=1.0))) * 4.0))
        k = min(k, _K_MAX)
        tab, last = llr_table(l0, l1, phi, k, d.alternative)
        tab[~armed] = 0.0
        # count-major: the links' entries for one count are contiguous (most counts are
        # 0, 1 or 2, so a bin's lookups stay within a few rows)
        self._table = np.ascontiguousarray(tab.T)
        self._slope[which] = np.where(armed, last, 0.0)

    def _llr(self, x: FloatArray) -> FloatArray:
        """Per-link log-likelihood ratio of the counts ``x`` (n,), ≥ 0 (non-integer counts
        interpolated; above K along the last slope)."""
        k = self._table.shape[0] - 1
        xc = np.minimum(x, float(k))
        lo = np.minimum(np.floor(xc), float(k - 1)).astype(np.int64)
        flat = self._table.ravel()
        v0 = flat[self._idx_off + lo * self.n]
        v1 = flat[self._idx_off + (lo + 1) * self.n]
        out: FloatArray = v0 + (xc - lo) * (v1 - v0) + np.maximum(x - k, 0.0) * self._slope
        return out

    @property
    def armed(self) -> BoolArray:
        """Links judged against their own baseline (``min_bins`` learnt; a copy)."""
        return self._armed.copy()

    def update(self, counts: Any, lower_bound: Any = None, hold: Any = None) -> BoolArray:
        """Advance one bin. ``counts`` (n,) per link (NaN: unknown, no change);
        ``lower_bound`` (n,) bool: the count is only a lower bound (fed to the statistic, a
        conservative input; never learnt); ``hold`` (n,) bool: do not learn this bin (the
        caller's own evidence of a change, e.g. a fallback statistic off zero). Returns the
        alarm condition (a copy).

        Raises:
            ValueError: wrong shapes.
        """
        x = np.asarray(counts, dtype=np.float64)
        if x.shape != (self.n,):
            raise ValueError(f"counts must have shape ({self.n},)")
        lb = (np.zeros(self.n, dtype=bool) if lower_bound is None
              else np.asarray(lower_bound, dtype=bool))
        valid = ~np.isnan(x)
        xz = np.where(valid, x, 0.0)
        learnable = valid & ~lb
        if hold is not None:
            learnable &= ~np.asarray(hold, dtype=bool)
        self._bin(xz, valid, learnable)
        return self._active.copy()

    def _bin(self, x: FloatArray, valid: BoolArray, learnable: BoolArray) -> None:
        d = self.d
        learn = learnable & (((self.s <= 0.0) & ~self._active) | (self.seen < d.warmup_bins))
        self._acc_n += learn
        xl = np.where(learn, x, 0.0)
        self._acc_x += xl
        self._acc_xx += xl * x
        self.seen += valid
        # unarmed links have a = b = 0: their statistic stays at zero
        s = np.where(valid, np.clip(self.s + self._llr(x), 0.0, self.s_max), self.s)
        self.s = s
        rise = (s > self.h) & ~self._active
        self._active = (self._active | rise) & ~(self._active & (s <= self.h_clear))
        self._raised = rise
        self._since += 1
        if self._since >= d.refresh_bins:
            self._fold()

    def _fold(self) -> None:
        """Fold the bins learnt since the last fold into the baseline (a plain mean during the
        warm-up, then the exponentially weighted one) and recompute λ0 and the statistic's
        coefficients."""
        d = self.d
        self._since = 0
        self.folds += 1
        n_new = self._acc_n
        got = n_new > 0
        if got.any():
            k = self.learned + n_new
            mean_x = np.where(got, self._acc_x / np.maximum(n_new, 1.0), 0.0)
            mean_xx = np.where(got, self._acc_xx / np.maximum(n_new, 1.0), 0.0)
            w = np.where(self.seen <= d.warmup_bins, n_new / np.maximum(k, 1.0),
                         np.minimum(n_new / d.tau_bins, 1.0))
            self.baseline = np.minimum(self.baseline + w * (mean_x - self.baseline), d.cap)
            self.sq = self.sq + w * (mean_xx - self.sq)
            self.learned = k
            self._acc_n = np.zeros(self.n)
            self._acc_x = np.zeros(self.n)
            self._acc_xx = np.zeros(self.n)
        self._refresh(np.ones(self.n, dtype=bool))

    def __call__(self, counts: npt.NDArray[Any], minute_start: int = 0, /
                 ) -> BoolArray | None:
        """The harness form: feed a (n, m) count matrix bin by bin (NaN: unknown bins);
        returns a (n, m) bool matrix of raise events, or None when there was none.

        Raises:
            ValueError: wrong shape.
        """
        c = np.asarray(counts)
        if c.ndim != 2 or c.shape[0] != self.n:
            raise ValueError(f"counts must have shape ({self.n}, bins)")
        if c.dtype.kind in "ui":
            return self._run_counts(c)
        out: BoolArray | None = None
        for j in range(c.shape[1]):
            col = c[:, j].astype(np.float64)
            valid = ~np.isnan(col)
            self._bin(np.where(valid, col, 0.0), valid, valid)
            if self._raised.any():
                if out is None:
                    out = np.zeros(c.shape, dtype=bool)
                out[:, j] = self._raised
        return out

    def _run_counts(self, c: npt.NDArray[Any]) -> BoolArray | None:
        """`__call__` on integer counts (every bin known): the recursion of `_bin` with
        in-place arithmetic."""
        d = self.d
        out: BoolArray | None = None
        s, act = self.s, self._active
        acc_n, acc_x, acc_xx = self._acc_n, self._acc_x, self._acc_xx
        tmp = np.empty(self.n)
        ix = np.empty(self.n, dtype=np.int64)
        flat, off = self._table.ravel(), self._idx_off
        kmax = self._table.shape[0] - 1
        big_any = bool(c.max(initial=0) > kmax)
        wb = float(d.warmup_bins)
        warming = bool((self.seen < wb).any())
        for j in range(c.shape[1]):
            x = c[:, j]
            learn = s <= 0.0
            learn &= ~act
            if warming:
                w = self.seen < wb
                learn |= w
                warming = bool(w.any())
            acc_n += learn
            xl = x * learn
            acc_x += xl
            xl *= x
            acc_xx += xl
            if big_any:
                np.minimum(x, kmax, out=ix)
                ix *= self.n
            else:
                np.multiply(x, self.n, out=ix)
            ix += off
            np.take(flat, ix, out=tmp, mode="clip")
            s += tmp
            if big_any and (x > kmax).any():
                s += np.maximum(x - kmax, 0) * self._slope
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
            self.seen += 1.0
            self._since += 1
            if self._since >= d.refresh_bins:
                self._fold()
                acc_n, acc_x, acc_xx = self._acc_n, self._acc_x, self._acc_xx
                flat, off = self._table.ravel(), self._idx_off
                kmax = self._table.shape[0] - 1
                big_any = bool(c.max(initial=0) > kmax)
        self._raised = np.zeros(self.n, dtype=bool)
        return out
