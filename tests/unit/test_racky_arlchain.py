"""racky.core.arlchain: the learned-rate CUSUM's in-control run length (the chain each link's
and part's threshold comes from) is finite and right over every design racky's config allows.

The earlier solve formed I − P and eliminated it: at the pooled parts' rates (λ0 ≈ 256
counts/bin, φ = 1) the alarm is a far-tail event, every row of P sums to 1 within the
rounding, and the pivots came out zero (a NaN grid point, a NaN threshold: a part that could
never alarm) or negative (ln ARL0 taken as 0). `_reference_log_arl0` below is that solve,
kept to show the new one gives the same numbers wherever the old one was well conditioned.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from racky.config import RackyConfig
from racky.core import linkrate
from racky.core.arlchain import LN_ARL_MAX, count_logpmf, llr_span, log_arl0, log_arl0_many
from racky.core.linkparts import PartGrouper
from racky.core.linkrate import RateDesign, llr_table
from racky.core.links import rate_design
from racky.link_settings import LinkSettings

LINKS = RackyConfig().links


def _reference_log_arl0(l0: float, phi: float, ratio: float, h: float, alternative: str,
                        states: int) -> float:
    """The solve before the fix (slow; ill-conditioned once ARL0 ≳ 1/eps ≈ e^36)."""
    k = max(31, math.ceil(l0 * ratio * (1.0 + phi) * 6.0 + 20.0))
    pmf = np.empty(k + 1)
    if phi > 1.0 + 1e-3:
        r, q = l0 / (phi - 1.0), 1.0 - 1.0 / phi
        pmf[0] = math.exp(-r * math.log(phi))
        for x in range(1, k + 1):
            pmf[x] = pmf[x - 1] * (x - 1 + r) / x * q
    else:
        pmf[0] = math.exp(-l0)
        for x in range(1, k + 1):
            pmf[x] = pmf[x - 1] * l0 / x
    pmf[k] += max(0.0, 1.0 - float(pmf.sum()))
    tab, _ = llr_table(np.array([l0]), np.array([ratio * l0]), np.array([phi]), k, alternative)
    step = h / states
    pos = np.maximum(np.arange(states + 1)[:, None] + tab[0][None, :] / step, 0.0)
    lo = np.floor(pos).astype(np.int64)
    frac = pos - lo
    w = np.broadcast_to(pmf, pos.shape)
    rows = np.broadcast_to(np.arange(states + 1)[:, None], pos.shape)
    p = np.zeros((states + 1, states + 2))
    np.add.at(p, (rows, np.minimum(lo, states + 1)), w * (1.0 - frac))
    np.add.at(p, (rows, np.minimum(lo + 1, states + 1)), w * frac)
    a = np.eye(states + 1) - p[:, :-1]
    b = np.ones(states + 1)
    n = len(b)
    for j in range(n - 1):
        f = a[j + 1:, j] / a[j, j]
        a[j + 1:, j:] -= f[:, None] * a[j, j:][None, :]
        b[j + 1:] -= f * b[j]
    x = np.zeros(n)
    for j in range(n - 1, -1, -1):
        x[j] = (b[j] - float(np.dot(a[j, j + 1:], x[j + 1:]))) / a[j, j]
    return float(math.log(max(x[0], 1.0)))


# Design points where the old solve is well conditioned (ln ARL0 ≤ 25: its rounding,
# ~ARL0·eps, is below 1e-5): the new one gives the same ln ARL0 within TOLERANCE.
TOLERANCE = 1e-5
_WELL_CONDITIONED = [(0.05, 1.0, 3.0, 18.0, "dispersion"), (0.5, 1.5, 3.0, 18.0, "dispersion"),
                     (0.5, 1.5, 3.0, 4.0, "size"), (2.0, 2.0, 3.0, 18.0, "dispersion"),
                     (5.0, 1.25, 3.0, 18.0, "size"), (20.0, 1.0, 3.0, 18.0, "dispersion"),
                     (0.3, 1.0, 3.0, 8.0, "dispersion"), (1.0, 3.0, 1.5, 12.0, "dispersion")]


@pytest.mark.parametrize(("l0", "phi", "ratio", "h", "alternative"), _WELL_CONDITIONED)
def test_the_new_solve_gives_the_old_numbers_where_the_old_was_well_conditioned(
        l0: float, phi: float, ratio: float, h: float, alternative: str) -> None:
    old = _reference_log_arl0(l0, phi, ratio, h, alternative, 200)
    assert old <= 25.0
    assert log_arl0(l0, phi, ratio, h, alternative, 200) == pytest.approx(old, abs=TOLERANCE)


def _ln_tail(l0: float, phi: float, ratio: float, alternative: str, above: float,
             strict: bool) -> float:
    """ln P(LLR > above) (or ≥ with ``strict`` False), summed in logarithms per count
    (math.lgamma, independent of the module's cumulative sums), -inf if no count gets there."""
    sd = math.sqrt(phi * l0)
    hi = math.ceil(l0 + 60.0 * sd + 1000.0 * phi + 50.0)
    terms = []
    tab, _ = llr_table(np.array([l0]), np.array([ratio * l0]), np.array([phi]), hi,
                       alternative)
    for x in range(hi + 1):
        v = float(tab[0, x])
        if (v > above) if strict else (v >= above):
            if phi > 1.0 + 1e-3:
                r = l0 / (phi - 1.0)
                lp = (math.lgamma(x + r) - math.lgamma(r) - math.lgamma(x + 1.0)
                      - r * math.log(phi) + x * math.log(1.0 - 1.0 / phi))
            else:
                lp = x * math.log(l0) - l0 - math.lgamma(x + 1.0)
            terms.append(lp)
    if not terms:
        return -math.inf
    m = max(terms)
    return m + math.log(sum(math.exp(t - m) for t in terms))


@pytest.mark.parametrize(("l0", "phi"), [(91.8, 1.0), (129.2, 1.0), (255.8, 1.0),
                                          (255.8, 1.25), (360.0, 2.0), (30.0, 1.0)])
def test_the_run_length_is_within_its_bounds_at_the_pooled_parts_rates(
        l0: float, phi: float) -> None:
    """From S = 0 the chain leaves level 0 only on a count of LLR > 0, and from any level a
    count of LLR ≥ h + h/states is the alarm: 1/P(LLR > 0) ≤ ARL0 ≤ 1/P(LLR ≥ h + step).
    At the pooled rates the alarm is one bin's jump, so ARL0 is within 0.1 (in ln) of the
    upper bound; the old solve was NaN at 255.8, 0 at 360 and 34.4, 34.3 at 91.8, 129.2
    (ln ARL0 there: 38.6, 48.5)."""
    h, states = 18.0, 200
    got = log_arl0(l0, phi, 3.0, h, "dispersion", states)
    lower = -_ln_tail(l0, phi, 3.0, "dispersion", 0.0, strict=True)
    upper = -_ln_tail(l0, phi, 3.0, "dispersion", h + h / states, strict=False)
    assert min(lower, LN_ARL_MAX) - 1e-9 <= got <= min(upper, LN_ARL_MAX) + 1e-9
    if l0 > 50.0:
        assert got == pytest.approx(upper, abs=0.1)
    if 50.0 < l0 < 200.0:  # (the old solve is slow above)
        old = _reference_log_arl0(l0, phi, 3.0, h, "dispersion", states)
        assert abs(old - upper) > 1.0


def test_the_count_probabilities_and_llr_agree_with_the_closed_forms() -> None:
    for l0, phi in [(0.05, 1.0), (3.0, 1.0), (3.0, 2.5), (900.0, 1.0), (900.0, 1.7)]:
        a = max(0, int(l0) - 20)
        lp = count_logpmf(l0, phi, a, a + 40)
        for i, x in enumerate(range(a, a + 41)):
            if phi > 1.0:
                r = l0 / (phi - 1.0)
                want = (math.lgamma(x + r) - math.lgamma(r) - math.lgamma(x + 1.0)
                        - r * math.log(phi) + x * math.log(1.0 - 1.0 / phi))
            else:
                want = x * math.log(l0) - l0 - math.lgamma(x + 1.0)
            assert lp[i] == pytest.approx(want, abs=1e-9)
        for alt in ("dispersion", "size"):
            tab, _ = llr_table(np.array([l0]), np.array([3.0 * l0]), np.array([phi]), a + 40,
                               alt)
            assert llr_span(l0, phi, 3.0, alt, a, a + 40) == pytest.approx(tab[0, a:],
                                                                            rel=1e-9, abs=1e-9)


# The config's bounds (racky.link_settings.LinkSettings): rate_ratio (1, 20], rate_h (0, 100],
# rate_dispersion_max [1, 10], the floor/cap unbounded above 0 (per bin: × bin_s/60, the pooled
# cap × a part's port count): rates from 1e-6 to 1e7 counts per bin here; the alternative
# "size" too (RateDesign allows it).
@pytest.mark.parametrize("ratio", [1.02, 3.0, 20.0])
@pytest.mark.parametrize("h", [0.5, 18.0, 100.0])
def test_the_run_length_is_finite_over_the_configs_whole_range(ratio: float, h: float) -> None:
    for l0 in (1e-6, 0.05, 1.0, 255.8, 3.6e3, 1e7):
        for phi in (1.0, 1.0005, 1.002, 1.5, 10.0):
            for alt in ("dispersion", "size"):
                got = log_arl0(l0, phi, ratio, h, alt, 200)
                assert math.isfinite(got) and 0.0 <= got <= LN_ARL_MAX, (l0, phi, alt, got)


def _pooled(settings: LinkSettings, ports: int) -> RateDesign:
    per_port = rate_design(settings)
    grouper = PartGrouper({"tray": list(range(ports))}, ports, per_port)
    return grouper.det.d


@pytest.mark.parametrize("ports", [72, 1296])
def test_the_pooled_parts_grids_are_finite(ports: int) -> None:
    """The default design's pooled grid (18 trays: 72 ports' worth, cap 360 counts/bin) had a
    NaN point at λ0 ≈ 256, φ = 1; 1296: a part of every port of an NVL72 rack."""
    d = _pooled(LINKS, ports)
    assert d.arl0_bins is not None
    ll, _, c = linkrate._compute_grid(*d.grid_key)
    assert np.isfinite(c).all()
    l0 = np.exp(np.linspace(ll[0] - 1.0, ll[-1] + 1.0, 101))
    for phi in (1.0, 1.1, 1.6, 2.0):
        h = d.h_for(l0, np.full(l0.shape, phi))
        assert np.isfinite(h).all() and ((d.h_min <= h) & (h <= d.h_max)).all()


def test_the_extreme_designs_grids_are_finite() -> None:
    """Grids at the corners of the config's box (coarse: a wide floor..cap is many points)."""
    for kw in [dict(rate_ratio=20.0, rate_h=100.0, rate_h_max=100.0, rate_dispersion_max=1.0),
               dict(rate_ratio=1.05, rate_h=0.5, rate_h_min=0.1, rate_dispersion_max=1.5),
               dict(rate_ratio=3.0, rate_h=18.0, rate_dispersion_max=10.0,
                    baseline_floor_per_min=1e-4, baseline_cap_per_min=1e-3)]:
        d = rate_design(LinkSettings(**kw))  # type: ignore[arg-type]
        _, _, c = linkrate._compute_grid(*d.grid_key)
        assert np.isfinite(c).all(), kw


def test_a_non_finite_threshold_falls_back_to_the_designs_h_and_is_counted() -> None:
    d = RateDesign(arl0_bins=1e6, floor=0.0531, cap=2.0, dispersion=1.5, h=18.0, h_max=30.0)
    linkrate._GRIDS.pop(d.grid_key, None)
    ll, pp, c = linkrate._compute_grid(*d.grid_key)
    clean = float(d.h_for(np.array([1.0]), np.array([1.2]))[0])
    bad = c.copy()
    bad[1, 0] = np.nan  # a broken grid point (what the old solve produced)
    linkrate._GRIDS[d.grid_key] = (ll, pp, bad)
    try:
        l0 = np.array([math.exp(ll[1]), 1.0, np.nan])
        got = d.h_for(l0, np.array([1.0, 1.2, 1.0]))
        assert np.isfinite(got).all()
        assert got[0] == 18.0 and got[2] == 18.0  # the base h: a detector that can alarm
        assert d.nonfinite_thresholds == 2
        assert got[1] == clean  # the points away from the broken one are untouched
    finally:
        linkrate._GRIDS.pop(d.grid_key, None)


def test_the_grids_batched_solve_gives_each_points_own_number() -> None:
    """`log_arl0_many` solves chains together (the band of a batch is its largest, the dense
    form above half the levels): the same numbers as one chain at a time."""
    l0 = np.array([0.05, 400.0, 0.7, 12.0, 3.0, 90.0, 1e-4, 30.0, 0.2, 6.0])
    phi = np.array([1.0, 2.0, 1.5, 1.25, 10.0, 1.0, 1.75, 1.5, 2.0, 1.0])
    many = log_arl0_many(l0, phi, 3.0, 18.0, "dispersion", 200)
    one = [log_arl0(float(x), float(p), 3.0, 18.0, "dispersion", 200)
           for x, p in zip(l0, phi, strict=True)]
    assert many == pytest.approx(one, abs=1e-12)
