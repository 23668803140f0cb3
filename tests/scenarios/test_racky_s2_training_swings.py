"""S2 / training swings (REFERENCE §5): rack power under a 120 kW budget with a 20 kW/s
grid-side ramp limit: ≤ 2 % over, back under within 5 s, AC input ramp within the limit."""

from __future__ import annotations

from harness.lockstep_racky import S2_BUDGET_W, s2_figures


def test_s2_training_and_agentic_power_vs_budget_and_grid_ramp() -> None:
    figs, runs = s2_figures(duration_s=180.0)
    assert len(figs) == 6
    for f in figs:
        assert f.passed, f
    for r in runs:  # the budget binds (the loads want more than it): it is a real test
        assert max(r.trace["it_power_w"]) > 0.0
        assert any(s == "budget" for s in r.trace["limit_source"])
        assert max(p for p in r.fine["rack_power_w"]) > 0.9 * S2_BUDGET_W
