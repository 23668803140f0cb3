"""Issue 22's scoring: the link harness's overdispersed counts, unknown bins and counted
exposure, and harness.linkcells' per-cell figures (small sizes)."""

from __future__ import annotations

import numpy as np

from harness.linkcells import cell_figures
from racky.config import RackyConfig
from sims.link_harness import RateProfile, iter_counts, run


def test_overdispersed_counts_have_the_asked_variance_over_mean() -> None:
    counts = np.concatenate([ch.counts.ravel() for ch in iter_counts(
        RateProfile.healthy(0.5), 2000, 200, dispersion=1.5, seed=1)])
    assert abs(counts.mean() - 0.5) < 0.01
    assert abs(counts.var() / counts.mean() - 1.5) < 0.05


def test_link_days_are_counted_by_the_run_after_the_warm_up_and_without_unknown_bins() -> None:
    """The healthy link-day count is an output: known bins judged after the warm-up (the
    unknown bins of a counter reset are not exposure)."""
    def never(n: int) -> object:
        return lambda c, m: None

    res = run(RateProfile.healthy(0.5), 100, 3000, never, count_from_min=1000,  # type: ignore
              unknown_min=range(1500, 1510))
    assert res.counted_link_minutes == 100 * (2000 - 10)


def test_cell_figures_two_sided_and_named_per_cell() -> None:
    figs = {f.name: f for f in cell_figures(RackyConfig(), link_days=200, change_links=20,
                                            workers=1, cells=[(0.5, 1.0)], full_size=False)}
    pre = "racky.S8.cell_l0.5_d1."
    for key in ("false_alarms_per_100k_link_days", "healthy_link_days", "creep_median_h",
                "creep_p90_h", "creep_p10_h", "creep_early_links", "creep_missed_links",
                "ramp_median_min", "ramp_early_links", "creep_reset_median_h"):
        assert pre + key in figs, key
    assert figs[pre + "healthy_link_days"].value == 200.0
    assert figs[pre + "creep_early_links"].passed
    assert figs[pre + "creep_median_h"].passed and figs[pre + "ramp_median_min"].passed


def test_part_and_traffic_figures_pass_on_racky() -> None:
    from harness.linkcells import part_figures, traffic_figures

    figs = part_figures() + traffic_figures(minutes=1.0)
    assert [f.name for f in figs if not f.passed] == []
