"""Overheating tray (fouled cold plate, REFERENCE §3.4): racky warns ≥ 30 s before HW slowdown
(plate fouling progressively), blames the tray (cooling normal), and its protective cap keeps
the GPUs out of slowdown; the scenario's sudden fouling is detected too."""

from __future__ import annotations

from harness.lockstep_racky import fault_coverage, overheat_figures, run_racky


def test_overheating_tray_warned_30s_ahead_and_protected() -> None:
    figs, (r_off, _r_on) = overheat_figures(ramp_s=300.0, plant_dt_s=0.5)
    by = {f.name: f for f in figs}
    assert by["racky.overheat.warn_lead_s"].passed, by
    assert by["racky.overheat.throttled_with_protection"].passed, by
    assert max(r_off.trace["throttled"]) > 0  # without protection the slowdown does come
    warn = r_off.raised("tray_overheat")
    assert warn and warn[0].id == "tray_overheat:tray05" and "cause: tray" in warn[0].message


def test_overheating_tray_step_fouling_detected() -> None:
    r = run_racky("overheating-tray", duration_s=240.0)
    det, exp, misses = fault_coverage([r])
    assert det == exp == 1, misses
