"""S8 rising-crc (REFERENCE §5, §3.3): racky's CUSUM (its own classes and [links] parameters)
on the link-only harness — 24 h creep median ≤ 4.5 h, p90 ≤ 5 h; fast ramp ≤ 30 min; no
false alarm on healthy links — and the fast ramp through racky's whole lock-step pipeline.
Fewer links and link-days than the scenario report (harness.lockstep_racky), same code."""

from __future__ import annotations

from harness.lockstep_racky import fault_coverage, s8_harness_figures, s8_lockstep_figures


def test_s8_creep_and_fast_ramp_detected_in_time_and_quiet_when_healthy() -> None:
    figs = s8_harness_figures(creep_links=60, healthy_links=5_000, days_target=False)
    by = {f.name: f for f in figs}
    for name in ("creep_24h_detect_h", "creep_24h_detect_p90_h", "fast_2h_detect_min",
                 "healthy_false_alarms"):
        f = by[f"racky.S8.{name}"]
        assert f.passed, f
    # the static rules are slower than the CUSUM on the same counts (REFERENCE §3.3)
    creep = by["racky.S8.creep_24h_detect_h"].value
    window = by["racky.S8.creep_24h_static_window_h"].value
    assert creep is not None and window is not None and window > creep + 2.0
    assert by["racky.S8.healthy_false_alarms"].value == 0  # 5,000 link-days: expect ~0.01


def test_s8_fast_ramp_detected_by_racky_in_lockstep_within_30_min() -> None:
    figs, run = s8_lockstep_figures(duration_s=1900.0)
    f = figs[0]
    assert f.name == "racky.S8.fast_lockstep_detect_min" and f.passed, f
    det, exp, misses = fault_coverage([run], skip=[("rising-crc", "gpu11/nic0")])
    assert exp == 1 and det == 1, misses
    # the 24 h creep's port has not alarmed in the first half hour (no early false alarm)
    assert run.first_alarm("link_error_rate", "gpu11/nic0") is None
