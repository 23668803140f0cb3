"""In-control average run length of the learned-rate CUSUM (`racky.core.linkrate`): the
Markov-chain approximation of Brook & Evans (1972), solved without cancellation (pure).

The chain's levels are the statistic S on ``states`` + 1 steps of h/``states`` over [0, h];
a count's log-likelihood ratio moves S to a level between two neighbours, its mass split
between them (the drift is kept exact); S beyond h is the alarm (absorbed). ARL0 is the
expected number of bins from S = 0 to absorption: x with (I − P)·x = 1.

Numerics (issue: a NaN grid point at λ0 ≈ 256 counts/bin, φ = 1, and ln ARL0 = 0 at others):

* The earlier solve formed I − P and eliminated it. At a large rate the alarm is a far-tail
  event (P(alarm per bin) ≈ e^-83 at λ0 = 256, φ = 1, h = 18): every row of P sums to 1 within
  the rounding, so 1 − p_kk and the elimination's pivots were differences of nearly equal
  numbers: zero (inf, then NaN) or negative (a negative ARL, ln taken as 0); from ARL0 ≈
  1/eps ≈ e^36 up the numbers were rounding (34.4 for 38.6 at λ0 = 92). Here the elimination
  is the Grassmann–Taksar–Heyman form: each pivot is the sum of the level's outflows (to the
  levels not yet eliminated, to the alarm, as they are updated), never 1 − p_kk; every
  operation adds non-negative numbers, so the run length is accurate to rounding relative
  to itself however long it is. A run length beyond the float range (or a chain with no path
  to the alarm) is reported as ``LN_ARL_MAX``.
* Two forms of that elimination, the same to 1e-14 in ln ARL0: where a count moves S down by
  at most ``band`` levels (except to 0: every count that resets S), renewal at level 0 and a
  banded elimination of levels 1 .. n − 1 (band × n² operations; at low rates the band is a
  few levels); otherwise the dense one from the top level down, ARL0 being the last step's
  expected time over its exit probability (n³/3). `log_arl0_many` (a grid's points) solves
  the chains 8 at a time, in the order of their band, in one loop over the levels.
* The counts' probabilities are computed in logarithms (lgamma at the support's lower end,
  then a cumulative sum of the log ratios): exp(−λ) underflows above λ ≈ 745, the old
  recursion's start. The support is λ ± 45 s.d. (+ 800 φ above: the negative binomial's
  geometric tail), less the counts of probability below e^-720: the mass left out
  changes no run length below e^``LN_ARL_MAX`` by more than a relative e^-70.
* Only the counts whose LLR lies in (−h, h + h/states) move S differently from level to
  level; the rest go to level 0 from every level (LLR ≤ −h) or to the alarm (LLR ≥
  h + h/states), and are lumped there. The transition matrix is built from those few counts
  (~30-60 at ratio 3) with one `numpy.bincount`, not from every count up to 6·λ1·(1 + φ).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

__all__ = ["LN_ARL_MAX", "count_logpmf", "llr_span", "log_arl0", "log_arl0_many"]

FloatArray = npt.NDArray[np.float64]

LN_ARL_MAX = 650.0
"""ln ARL0 reported for run lengths beyond the float range (e^709) or a chain without a path
to the alarm: any threshold computed from it is the design's lowest."""

_SUPPORT_SD = 45.0  # the support's half-width in standard deviations (tail mass < e^-745)
_SUPPORT_GEOM = 800.0  # ... plus this many φ above (the NB tail decays as (1 − 1/φ)^x)
_LN_MASS_MIN = -720.0
"""Counts less probable than e^-720 are left out (their mass changes a run length below
e^``LN_ARL_MAX`` by a relative e^-70 at most)."""


def count_logpmf(l0: float, phi: float, a: int, b: int) -> FloatArray:
    """ln P(x) for counts x = ``a`` .. ``b`` (shape (b − a + 1,)) of mean ``l0`` (> 0) and
    variance/mean ``phi`` (Poisson where φ ≤ 1.001, else negative binomial of size
    λ/(φ − 1), p = 1/φ)."""
    x = np.arange(a + 1, b + 1, dtype=np.float64)
    if phi > 1.0 + 1e-3:
        r, q = l0 / (phi - 1.0), 1.0 - 1.0 / phi
        first = (math.lgamma(a + r) - math.lgamma(r) - math.lgamma(a + 1.0)
                 - r * math.log(phi) + a * math.log(q))
        ratios = np.log((x - 1.0 + r) / x * q)
    else:
        first = a * math.log(l0) - l0 - math.lgamma(a + 1.0)
        ratios = math.log(l0) - np.log(x)
    out = np.empty(b - a + 1)
    out[0] = first
    np.cumsum(ratios, out=out[1:])
    out[1:] += first
    return out


def llr_span(l0: float, phi: float, ratio: float, alternative: str, a: int, b: int
             ) -> FloatArray:
    """`racky.core.linkrate.llr_table`'s log-likelihood ratio (mean ratio·λ0 against λ0,
    variance/mean ``phi``) for counts x = ``a`` .. ``b`` (shape (b − a + 1,)), from the
    closed form at ``a`` and the table's steps above it."""
    l1 = ratio * l0
    j = np.arange(a, b, dtype=np.float64)
    if phi <= 1.0 + 1e-3:
        first = -(l1 - l0) + a * math.log(ratio)
        steps: FloatArray = np.full(b - a, math.log(ratio))
    elif alternative == "dispersion":
        g = phi - 1.0
        r0, r1 = l0 / g, l1 / g
        first = (-(r1 - r0) * math.log(phi) + math.lgamma(a + r1) - math.lgamma(r1)
                 - math.lgamma(a + r0) + math.lgamma(r0))
        steps = np.log((j + r1) / (j + r0))
    else:
        r = l0 / (phi - 1.0)
        slope = math.log(l1 * (l0 + r) / (l0 * (l1 + r)))
        first = r * math.log((l0 + r) / (l1 + r)) + a * slope
        steps = np.full(b - a, slope)
    out = np.empty(b - a + 1)
    out[0] = first
    np.cumsum(steps, out=out[1:])
    out[1:] += first
    return out


def log_arl0(l0: float, phi: float, ratio: float, h: float, alternative: str,
             states: int = 400) -> float:
    """ln of the in-control average run length (bins, from S = 0) of the upper CUSUM of
    `racky.core.linkrate.llr_table`'s LLR with threshold ``h`` when the counts have mean
    ``l0`` (> 0, counts per bin) and variance/mean ``phi`` (≥ 1): the Markov-chain
    approximation on ``states`` levels of S (see the module docstring). Finite, within
    [0, ``LN_ARL_MAX``]."""
    return float(log_arl0_many(np.array([l0]), np.array([phi]), ratio, h, alternative,
                               states)[0])


def log_arl0_many(l0: FloatArray, phi: FloatArray, ratio: float, h: float | FloatArray,
                  alternative: str, states: int = 400) -> FloatArray:
    """`log_arl0` at each point (``l0``, ``phi`` and ``h``, a threshold per point or one for
    all: shape (points,)), the same numbers: the chains are solved together, ``_BATCH`` at a
    time in the order of their largest fall (one loop over the levels for a batch rather than
    for each chain). Shape (points,)."""
    n = states + 1
    l0a, pa = np.atleast_1d(l0), np.atleast_1d(phi)
    ha = np.broadcast_to(np.asarray(h, dtype=np.float64), l0a.shape)
    chains = [_chain(float(x), float(p), ratio, float(hh), alternative, n) for x, p, hh in
              zip(l0a, pa, ha, strict=True)]
    out = np.empty(len(chains))
    order = sorted(range(len(chains)), key=lambda i: chains[i][2])
    for start in range(0, len(order), _BATCH):
        idx = order[start:start + _BATCH]
        q = np.stack([chains[i][0] for i in idx])
        exit_p = np.stack([chains[i][1] for i in idx])
        band = max(chains[i][2] for i in idx)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            # beyond e^709 or no path to the alarm: not finite, LN_ARL_MAX below
            arl0 = (_renewal_run_lengths(q, exit_p, band) if 2 * band < n
                    else _gth_run_lengths(q, exit_p))  # (the same to 1e-14 in ln ARL0)
            ln = np.log(arl0)
        out[idx] = np.where(np.isfinite(ln) & (arl0 > 0.0), np.clip(ln, 0.0, LN_ARL_MAX),
                            LN_ARL_MAX)
    return out


_BATCH = 8  # chains solved together (8 × 201² doubles: 2.6 MB)


def _chain(l0: float, phi: float, ratio: float, h: float, alternative: str, n: int
           ) -> tuple[FloatArray, FloatArray, int]:
    """The chain on ``n`` levels: transitions (n, n), alarm probability per level (n,), and
    the largest fall in levels other than to level 0 (the band of the renewal form)."""
    step = h / (n - 1)
    sd = math.sqrt(max(phi, 1.0) * l0)
    a = max(0, math.floor(l0 - _SUPPORT_SD * sd))
    b = math.ceil(l0 + _SUPPORT_SD * sd + _SUPPORT_GEOM * max(phi, 1.0) + 40.0)
    lp = count_logpmf(l0, phi, a, b)
    keep = np.flatnonzero(lp > _LN_MASS_MIN)  # one interval (the pmf is unimodal)
    a, b = a + int(keep[0]), a + int(keep[-1])
    pm = np.exp(lp[keep[0]:keep[-1] + 1])
    v = llr_span(l0, phi, ratio, alternative, a, b)
    low, high = v <= -h, v >= h + step
    mid = ~(low | high)
    # a count moves S from level i to i + v/step, its mass split between the two levels
    # around it: the same offsets and split from every level (levels are whole steps), so
    # P is Toeplitz in the offset j − i, its columns ≤ 0 lumped into level 0 and those
    # ≥ n into the alarm
    z = v[mid] / step
    off = np.floor(z)
    frac = z - off
    d = off.astype(np.int64) + n  # offset + n, within [1, 2n] (|v| < h + step)
    w = np.bincount(np.concatenate((d, d + 1)),
                    weights=np.concatenate((pm[mid] * (1.0 - frac), pm[mid] * frac)),
                    minlength=2 * n + 2).astype(np.float64, copy=False)
    w[0] += float(pm[low].sum())  # offset −n: level 0 from every level
    w[2 * n + 1] += float(pm[high].sum())  # offset n + 1: the alarm from every level
    lvl = np.arange(n)
    q = w[n + lvl[None, :] - lvl[:, None]]  # q[i, j] = w[n + j − i]
    cum = np.cumsum(w)
    q[:, 0] = cum[n - lvl]  # offsets ≤ −i: level 0
    exit_p = np.cumsum(w[::-1])[lvl + 1]  # offsets ≥ n − i: the alarm
    nz = np.flatnonzero(w[1:2 * n])
    band = max(0, n - 1 - int(nz[0])) if len(nz) else 0  # the largest fall, levels
    return q, exit_p, band


def _gth_run_lengths(q: FloatArray, exit_p: FloatArray) -> FloatArray:
    """x[:, 0] of (I − Q)·x = 1 for sub-stochastic chains ``q`` (B, n, n) whose rows lose
    ``exit_p`` (B, n) to absorption: elimination in the Grassmann–Taksar–Heyman form, from
    the top level down (each step leaves the chain watched on the levels below, whose
    transitions, exits and expected times gain those through the level removed), so that
    x[0] is the last expected time over the last exit probability, without
    back-substitution. Each pivot is a sum of outflows, never 1 − q_kk: no subtraction
    anywhere. ``q`` and ``exit_p`` are overwritten; shape (B,); not finite (inf or NaN)
    where a level has no outflow left (no path to absorption)."""
    bsz, n = exit_p.shape
    rhs = np.ones((bsz, n))
    for k in range(n - 1, 0, -1):
        row = q[:, k, :k]
        d = exit_p[:, k] + row.sum(axis=1)
        g = q[:, :k, k] / d[:, None]
        q[:, :k, :k] += g[:, :, None] * row[:, None, :]
        exit_p[:, :k] += g * exit_p[:, k, None]
        rhs[:, :k] += g * rhs[:, k, None]
    out: FloatArray = rhs[:, 0] / exit_p[:, 0]
    return out


def _renewal_run_lengths(q: FloatArray, alarm: FloatArray, band: int) -> FloatArray:
    """ARL0 from level 0 of chains ``q`` (B, n, n; row sums + ``alarm`` (B, n) ≤ 1) whose
    falls are at most ``band`` levels except to level 0 (column 0 is dense: the lump of
    every count that resets S). Renewal at level 0: a cycle is one step from 0 and, from a
    level j ≥ 1, the steps until S is back at 0 or alarms (expected t_j, alarm probability
    a_j), so ARL0 = (1 + Σ q_0j t_j) / (alarm_0 + Σ q_0j a_j). t and a solve
    (I − Q')·[t a] = [1 alarm'] on levels 1 .. n − 1, where Q' keeps the falls within
    ``band``: a banded Grassmann–Taksar–Heyman elimination (pivots are sums of outflows,
    every operation adds non-negative numbers), ``band`` × n² operations rather than n³.
    ``q`` and ``alarm`` are not changed; shape (B,); not finite where a level has no
    outflow left (no path to absorption)."""
    bsz, n = alarm.shape
    qq = q[:, 1:, 1:].copy()
    m = n - 1
    out_p = alarm[:, 1:] + q[:, 1:, 0]  # leaving levels 1 .. n − 1: the alarm, or back to 0
    rhs = np.stack((np.ones((bsz, m)), alarm[:, 1:]), axis=2)
    piv = np.empty((bsz, m))
    for k in range(m):
        d = out_p[:, k] + qq[:, k, k + 1:].sum(axis=1)
        piv[:, k] = d
        r = min(m, k + 1 + band)
        if r > k + 1:
            g = qq[:, k + 1:r, k] / d[:, None]
            qq[:, k + 1:r, k + 1:] += g[:, :, None] * qq[:, k, None, k + 1:]
            out_p[:, k + 1:r] += g * out_p[:, k, None]
            rhs[:, k + 1:r] += g[:, :, None] * rhs[:, k, None, :]
    x = np.empty((bsz, m, 2))
    for k in range(m - 1, -1, -1):
        x[:, k] = (rhs[:, k] + np.einsum("bj,bjc->bc", qq[:, k, k + 1:], x[:, k + 1:])
                   ) / piv[:, k, None]
    t_cycle = 1.0 + np.einsum("bj,bj->b", q[:, 0, 1:], x[:, :, 0])
    p_alarm = alarm[:, 0] + np.einsum("bj,bj->b", q[:, 0, 1:], x[:, :, 1])
    out: FloatArray = t_cycle / p_alarm
    return out
