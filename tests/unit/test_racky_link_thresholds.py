"""The learned-rate CUSUM's per-link thresholds hold the design's in-control run length
(`racky.core.linkthresholds`): at the grid's points and between them, two-sided, against the
Markov chain itself (`log_arl0_many`). The design is the default config's pooled one for a
72-port part (rates up to 360 counts/bin: where ln ARL0 − h is not flat in h)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from racky.config import RackyConfig
from racky.core import linkthresholds
from racky.core.arlchain import log_arl0_many
from racky.core.linkparts import PartGrouper
from racky.core.linkrate import RateDesign
from racky.core.links import rate_design

LINKS = RackyConfig().links

# the documented bounds between grid points (linkthresholds' docstring): ln ARL0 − ln target
# within [−LN_BELOW, +LN_ABOVE] where h is within (h_min, h_max); at h_min at least −LN_BELOW
LN_BELOW = 0.6
LN_ABOVE = 0.6


@pytest.fixture(scope="module")
def pooled() -> RateDesign:
    d = PartGrouper({"tray": list(range(72))}, 72, rate_design(LINKS)).det.d
    assert d.arl0_bins is not None and d.cap > 100.0
    d.prepare_grid()
    return d


def _excess(d: RateDesign, l0: np.ndarray, phi: np.ndarray, h: np.ndarray) -> np.ndarray:
    """ln ARL0 at ``h`` (the chain the grid is solved on) less ln arl0_bins."""
    assert d.arl0_bins is not None
    return log_arl0_many(l0, phi, d.ratio, h, d.alternative, 200) - math.log(d.arl0_bins)


def _holds(d: RateDesign, l0: np.ndarray, phi: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Per point: ln ARL0 at ``h`` within [−LN_BELOW, +LN_ABOVE] of the target's (at h_min
    only the lower bound: the floor of the thresholds allows a longer run length)."""
    at = _excess(d, l0, phi, h)
    return (at >= -LN_BELOW) & ((at <= LN_ABOVE) | (h <= d.h_min))


def test_the_grid_points_thresholds_give_the_target(pooled: RateDesign) -> None:
    """At random grid points (λ0 ≥ 5/bin: where the flat assumption failed): the smallest h
    (to _H_RES) whose ln ARL0 is at least the target's: at h at least, at h − _H_RES below."""
    ll, pp, hg = pooled._arl_grid()
    i, j = np.nonzero((hg > pooled.h_min) & (hg < pooled.h_max)
                      & (np.exp(ll)[:, None] >= 5.0))
    pick = np.random.default_rng(7).choice(len(i), size=12, replace=False)
    l0, phi, h = np.exp(ll[i[pick]]), pp[j[pick]], hg[i[pick], j[pick]]
    at = _excess(pooled, l0, phi, h)
    lower = _excess(pooled, l0, phi, h - linkthresholds._H_RES)
    assert (at >= 0.0).all(), (l0, phi, h, at)
    assert (lower < 0.0).all(), (l0, phi, h, at, lower)
    # clipped points: even h_min gives a longer run length
    ci, cj = np.nonzero(hg <= pooled.h_min)
    assert len(ci) > 0
    k = np.random.default_rng(8).choice(len(ci), size=min(4, len(ci)), replace=False)
    assert (_excess(pooled, np.exp(ll[ci[k]]), pp[cj[k]], hg[ci[k], cj[k]]) >= 0.0).all()


def test_the_thresholds_between_grid_points_hold_the_target_both_ways(
        pooled: RateDesign) -> None:
    """Random (λ0, φ) between grid points (λ0 from the floor to 150/bin, where h reaches
    h_min), and λ0 = 40 at φ = 1 (where ln ARL0 − h computed at one h gave 12.81 for the
    exact 11.16): `h_for` within the documented bounds, two-sided."""
    rng = np.random.default_rng(11)
    l0 = np.concatenate(([10.0, 40.0], np.exp(rng.uniform(math.log(pooled.floor),
                                                          math.log(150.0), 30))))
    phi = np.concatenate(([1.0, 1.0], rng.uniform(pooled.dispersion_min,
                                                  pooled.dispersion, 30)))
    h = pooled.h_for(l0, phi)
    ok = _holds(pooled, l0, phi, h)
    assert ok.all(), [(a, b, c) for a, b, c, g in zip(l0, phi, h, ok, strict=True) if not g]


def test_the_flat_assumption_fails_the_same_checks(pooled: RateDesign) -> None:
    """The checks can fail: the thresholds from ln ARL0 − h at the design's h (the grid
    before) are too high at λ0 = 10 and 40 counts/bin, φ = 1. At 40 the run length is e^1.2
    above the target (beyond the bound between grid points); at 10 it is within it (17.95
    lies on the chain's stair [17.4, 18.0], ln ARL0 +0.004 .. +0.05: counts of mean 10 cross
    h in one bin, in control) but it is not the smallest threshold that meets the target,
    the one `solve_thresholds` finds (its h − _H_RES is below the target): in control the
    run length is the same, under the rise (several bins to cross h) detection is slower."""
    assert pooled.arl0_bins is not None
    ln_target = math.log(pooled.arl0_bins)
    l0, phi = np.array([10.0, 40.0]), np.array([1.0, 1.0])
    flat = pooled.h - _excess(pooled, l0, phi, np.full(2, pooled.h))
    assert flat == pytest.approx([17.95, 12.81], abs=0.02)
    assert not _holds(pooled, l0[1:], phi[1:], flat[1:]).any()
    h, _, _ = linkthresholds.solve_thresholds(l0, phi, pooled.ratio, pooled.alternative,
                                              ln_target, pooled.h, pooled.h_min, pooled.h_max)
    assert h == pytest.approx([17.35, 11.16], abs=linkthresholds._H_RES)
    for x in (h, flat):
        at = _excess(pooled, l0, phi, x)
        below = _excess(pooled, l0, phi, x - linkthresholds._H_RES)
        assert ((at >= 0.0) & (below < 0.0)).all() == (x is h), (x, at, below)
    assert (h < flat - 0.5).all()  # lower thresholds there: faster detection


def test_the_grid_depends_on_the_target() -> None:
    """arl0_bins is in the grid's key: a 10× longer target gives higher thresholds."""
    a = RateDesign(arl0_bins=1e6, floor=0.05, cap=2.0, h=18.0, h_min=6.0, h_max=30.0)
    b = RateDesign(arl0_bins=1e7, floor=0.05, cap=2.0, h=18.0, h_min=6.0, h_max=30.0)
    assert a.grid_key != b.grid_key
    l0, phi = np.array([0.1, 1.0, 2.0]), np.array([1.0, 1.5, 1.2])
    ha, hb = a.h_for(l0, phi), b.h_for(l0, phi)
    assert (hb > ha + 1.5).all()
    assert _holds(a, l0, phi, ha).all() and _holds(b, l0, phi, hb).all()


def test_the_search_stops_at_its_ends() -> None:
    """A target beyond h_hi's run length gives h_hi; one below h_lo's gives h_lo."""
    l0, phi = np.array([0.5, 0.5]), np.array([1.0, 1.0])
    h, _, solves = linkthresholds.solve_thresholds(l0, phi, 3.0, "dispersion", 200.0, 18.0,
                                                   8.0, 30.0)
    assert (h == 30.0).all() and solves <= 6
    h, _, _ = linkthresholds.solve_thresholds(l0, phi, 3.0, "dispersion", 2.0, 18.0, 8.0, 30.0)
    assert (h == 8.0).all()
