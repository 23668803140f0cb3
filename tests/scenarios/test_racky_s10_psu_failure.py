"""S10 psu-failure / psu-failure-n1 (REFERENCE §5): every PSU, shelf and feed fault alarmed
within 1 s, and the rack capped to live capacity within 1 s once redundancy is gone."""

from __future__ import annotations

from harness.lockstep_racky import fault_coverage, s10_figures


def test_s10_alarms_and_capacity_cap_within_one_second() -> None:
    figs, runs = s10_figures(plant_dt_s=0.5)
    for f in figs:
        assert f.passed, f
    det, exp, misses = fault_coverage(runs)
    assert exp == 6 and det == exp, misses
    for r in runs:  # capped: measured rack power back within live capacity
        tr = r.trace
        i = next(i for i, s in enumerate(tr["limit_source"]) if s == "capacity")
        late = [p for p, c in zip(tr["rack_power_w"][i + 5:], tr["capacity_w"][i + 5:],
                                  strict=True) if p is not None and c is not None and p > c]
        assert late == []
