"""The learned-rate CUSUM's threshold grid (`racky.core.linkrate.RateDesign`): the threshold h
that gives the design's in-control average run length at each grid point, and the
interpolation between grid points (pure).

Threshold per point. ln ARL0(h) (`racky.core.arlchain.log_arl0`, the Markov chain) rises
monotonically with h, but not at slope 1: at low rates ln ARL0 − h is nearly flat in h, at
high rates (tens of counts per bin and up) the slope is well below 1 (0.76 at λ0 = 40/bin,
φ = 1, ratio 3, between h = 11 and 18), so a threshold read off ln ARL0 − h computed at one h
(the grid before this module) was too high there: 12.81 for the exact 11.16 at λ0 = 40 (slower
detection than designed; false alarms unaffected). `solve_thresholds` finds each point's
smallest h (to ``_H_RES``) whose ln ARL0 is at least ln target: a safeguarded secant on
ln ARL0(h) (the first solve at a start h, a step at a start slope, then secant steps
between the last two solves aiming at ln target + `TOL_LN_ARL`/2, each kept inside the
bracket known so far, bisection when it would leave it or ln ARL0 is flat), and once in
[ln target, + `TOL_LN_ARL`] a probe ``_H_RES`` lower to close the bracket; every iteration
solves the chains of the points still open together (`log_arl0_many`). `solve_grid` warm
starts it (a coarser chain first, rows from their neighbours).

Where the counts are (near) Poisson, ln ARL0(h) is a staircase in h (the LLR moves S by
multiples of ln ratio less a constant per bin; in control the alarm is mostly one large
count): at λ0 = 10/bin, φ = 1, ln ARL0 − ln target jumps from −0.5 at h = 17.3 to +0.004 at
17.4 and stays within +0.05 up to 18.0 (so the old 17.95 met the target there, but not with
the smallest threshold: under a rise S climbs over several bins, not on those stairs, and
detects sooner at 17.4); at λ0 = 40: −0.32 up to 11.1, +0.44 up to 12.2. The smallest h is
then a sawtooth in λ0 (17.4 at λ0 = 10, 18.0 at 10.2, 17.5 at 10.5), which no grid
resolves: between grid points the threshold is within a stair of it.

Interpolation (`bilinear` in ln λ0 and φ; `solve_grid` adds rows in ln λ0 where h falls
by more than ``_MAX_STEP_H`` between rows; the grid holds h unclipped down to h_min/2, so the
clip to h_min comes after the interpolation). The direction it errs in, documented: **where
h is concave (where it falls with the rate, tens of counts per bin) the bilinear h is below
the exact one: the run length below the target, detection not slower than designed; at the
stairs of near-Poisson counts either way. Measured at 150 random points of the default
config's pooled design of a 72-port part (rates up to 150/bin): ln ARL0 − ln target within
[−0.42, +0.44] (the run length 0.66× to 1.55× the target); the bound held by
`tests/unit/test_racky_link_thresholds.py` is ±0.6.** Points clipped to h_min have a run
length above the target (the floor of the thresholds: fewer false alarms).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from racky.core.arlchain import log_arl0_many

__all__ = ["TOL_LN_ARL", "bilinear", "solve_grid", "solve_thresholds"]

FloatArray = npt.NDArray[np.float64]

TOL_LN_ARL = 0.1
"""A grid point's threshold gives ln ARL0 within [ln target, ln target + this]."""

_H_RES = 0.1  # h resolution of the search for the smallest threshold
_MAX_SOLVES = 16  # per point (a safeguard: 3-5 in practice, see `solve_thresholds`)
_STATES = 200  # chain levels of the grid's solves
_STATES_COARSE = 100  # ... of its warm start (`solve_grid`)
_MAX_STEP_H = 1.0  # `solve_grid` adds rows between neighbours whose h differs by more


def solve_thresholds(l0: FloatArray, phi: FloatArray, ratio: float, alternative: str,
                     ln_target: float, h_start: float | FloatArray, h_lo: float, h_hi: float,
                     slope_start: float | FloatArray = 1.0, states: int = _STATES,
                     smallest: bool = True) -> tuple[FloatArray, FloatArray, int]:
    """The threshold h per point (``l0`` counts per bin, ``phi`` variance/mean: shape
    (points,)): with ``smallest``, the smallest h (to ``_H_RES``) whose ln ARL0 is at least
    ``ln_target`` (ln ARL0 at h − ``_H_RES`` below it); without, any h whose ln ARL0 is
    within [``ln_target``, + `TOL_LN_ARL`] (a warm start's: fewer solves). Searched within
    [``h_lo``, ``h_hi``] from ``h_start`` (per point or one), the first step taken at slope
    ``slope_start`` of ln ARL0 in h; secant steps aim at ln target + `TOL_LN_ARL`/2, and
    once there (``smallest``) a probe ``_H_RES`` lower closes the bracket where ln ARL0
    rises with h, bisection where it is a stair. ``h_lo`` where even it gives a longer run
    length, ``h_hi`` where even it gives a shorter one; the chain on ``states`` levels.
    Returns (h (points,), the last secant slope per point (``slope_start`` where there was
    none), the chain solves made in all). A point not converged within ``_MAX_SOLVES``
    takes the upper end of its bracket (a run length above the target)."""
    n = len(l0)
    slope0 = np.broadcast_to(np.asarray(slope_start, dtype=np.float64), (n,))
    last_slope = slope0.copy()
    half = 0.5 * TOL_LN_ARL
    a, b = np.full(n, h_lo), np.full(n, h_hi)  # bracket: f(a) < 0 <= f(b) where solved
    a_ok, b_ok = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    x = np.clip(np.broadcast_to(np.asarray(h_start, dtype=np.float64), (n,)), h_lo, h_hi)
    xp, fp = np.full(n, np.nan), np.full(n, np.nan)
    out = np.full(n, np.nan)
    open_ = np.ones(n, dtype=bool)
    solves = 0
    for _ in range(_MAX_SOLVES):
        idx = np.flatnonzero(open_)
        if len(idx) == 0:
            break
        xi = x[idx]
        f = log_arl0_many(l0[idx], phi[idx], ratio, xi, alternative, states) - ln_target
        solves += len(idx)
        low = f < 0.0
        a[idx] = np.where(low, xi, a[idx])
        a_ok[idx] |= low
        b[idx] = np.where(low, b[idx], xi)
        b_ok[idx] |= ~low
        ai, bi = a[idx], b[idx]
        near = (f >= 0.0) & (f <= TOL_LN_ARL)
        closed = b_ok[idx] & (bi - ai <= _H_RES * 1.0001)  # f(b) >= 0, f(b − _H_RES) < 0
        ends = (low & (xi >= h_hi)) | (~low & (xi <= h_lo))
        done = closed | ends | (near & (not smallest))
        out[idx[done]] = np.where(closed, bi, xi)[done]
        # the next guess: a secant through the last two solves aiming at the band's middle
        fm = f - half
        has = np.isfinite(fp[idx]) & (xi != xp[idx])
        slope = np.where(has, (fm - fp[idx]) / np.where(has, xi - xp[idx], 1.0), slope0[idx])
        flat = slope <= 1e-3  # on a stair: bisect (or slope 1 towards the open end)
        slope = np.where(flat, 1.0, slope)
        last_slope[idx] = np.where(has & ~flat, slope, last_slope[idx])
        nxt = xi - fm / slope
        nxt = np.where(near, bi - _H_RES, nxt)  # in the band: probe just below it
        inside = (nxt > ai) & (nxt < bi) & ~(flat & ~near)
        both = a_ok[idx] & b_ok[idx]
        # outside the bracket: bisect it when both ends are solved, else try the open end
        nxt = np.where(inside, nxt, np.where(both, 0.5 * (ai + bi),
                                             np.where(a_ok[idx], bi, ai)))
        xp[idx], fp[idx] = xi, fm
        x[idx] = nxt
        open_[idx[done]] = False
    left = np.isnan(out)  # not converged: the bracket's upper end (ARL0 above the target)
    out[left] = b[left]
    return out, last_slope, solves


def solve_grid(l0: FloatArray, phi: FloatArray, ratio: float, alternative: str,
               ln_target: float, h_start: float, h_lo: float, h_hi: float
               ) -> tuple[FloatArray, FloatArray, int]:
    """`solve_thresholds` on the grid ``l0`` (rows, increasing) × ``phi`` (columns), warm
    started. First on a chain of ``_STATES_COARSE`` levels (an eighth of the dense solve's
    cost): the rows every 4th (and the last) from ``h_start`` at slope 1, then the rows
    halfway between solved ones from their neighbours' mean h and secant slope; then, once,
    rows halfway (in ln λ0) between neighbouring rows whose h differs by more than
    ``_MAX_STEP_H`` at some φ (where h falls fast with the rate: the bilinear interpolation's
    error grows with the step squared). Then every row on the grid's chain (``_STATES``
    levels) from its coarse h and slope (the coarse chain's ln ARL0 is within a few tenths
    of the fine one's): ~2.5 fine solves a point (one to land in the band, a probe just
    below it, sometimes a secant step) where a search from ``h_start`` takes 4-6. Returns
    (the rows' ln λ0, increasing: ``l0``'s and those added; h (rows, columns); the fine chain
    solves made in all)."""
    nr, nc = len(l0), len(phi)
    ll = np.log(l0)
    h = np.full((nr, nc), np.nan)
    sl = np.ones((nr, nc))
    known = np.zeros(nr, dtype=bool)

    def coarse(x: FloatArray, starts: FloatArray, slopes: FloatArray
               ) -> tuple[FloatArray, FloatArray]:
        got, slope, _ = solve_thresholds(np.repeat(x, nc), np.tile(phi, len(x)), ratio,
                                         alternative, ln_target, starts.ravel(), h_lo, h_hi,
                                         slopes.ravel(), _STATES_COARSE, smallest=False)
        return got.reshape(len(x), nc), slope.reshape(len(x), nc)

    for stride in (4, 2, 1):
        rows = [r for r in range(0, nr, stride) if not known[r]]
        if stride == 4 and nr - 1 not in rows:
            rows.append(nr - 1)
        starts = np.full((len(rows), nc), h_start)
        slopes = np.ones((len(rows), nc))
        if stride < 4:
            for k, r in enumerate(rows):
                nb = [q for q in (r - stride, r + stride) if 0 <= q < nr and known[q]]
                starts[k] = h[nb].mean(axis=0)
                slopes[k] = sl[nb].mean(axis=0)
        h[rows], sl[rows] = coarse(l0[rows], starts, slopes)
        known[rows] = True
    steep = np.flatnonzero(np.max(np.abs(np.diff(h, axis=0)), axis=1) > _MAX_STEP_H)
    if len(steep):
        mid = 0.5 * (ll[steep] + ll[steep + 1])
        hm, sm = coarse(np.exp(mid), 0.5 * (h[steep] + h[steep + 1]),
                        0.5 * (sl[steep] + sl[steep + 1]))
        order = np.argsort(np.concatenate((ll, mid)), kind="stable")
        ll = np.concatenate((ll, mid))[order]
        h = np.concatenate((h, hm))[order]
        sl = np.concatenate((sl, sm))[order]
    got, _, solves = solve_thresholds(np.repeat(np.exp(ll), nc), np.tile(phi, len(ll)), ratio,
                                      alternative, ln_target, h.ravel(), h_lo, h_hi,
                                      sl.ravel())
    return ll, got.reshape(len(ll), nc), solves


def bilinear(xg: FloatArray, yg: FloatArray, g: FloatArray, x: FloatArray, y: FloatArray
             ) -> FloatArray:
    """``g`` (len(xg), len(yg)) on the grid ``xg`` × ``yg`` (increasing), bilinear at the
    points (``x``, ``y``) (broadcast together; clamped to the grid; NaN in, NaN out). Shape:
    that of the broadcast points."""
    x, y = np.broadcast_arrays(np.clip(x, xg[0], xg[-1]), np.clip(y, yg[0], yg[-1]))
    i = np.clip(np.searchsorted(xg, x) - 1, 0, len(xg) - 2)
    j = np.clip(np.searchsorted(yg, y) - 1, 0, len(yg) - 2)
    tx = (x - xg[i]) / (xg[i + 1] - xg[i])
    ty = (y - yg[j]) / (yg[j + 1] - yg[j])
    out: FloatArray = ((1 - tx) * (1 - ty) * g[i, j] + tx * (1 - ty) * g[i + 1, j]
                       + (1 - tx) * ty * g[i, j + 1] + tx * ty * g[i + 1, j + 1])
    return out
