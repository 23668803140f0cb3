"""S7 flapping-link (REFERENCE §5) in lock-step with racky's core: flapping declared at the
3rd down (≤ 1 s after it), nothing for the single flap, "port dropped" at 4 min, one alert per
incident; every injected fault detected. BR-13 through the same window rule."""

from __future__ import annotations

from harness.lockstep_racky import br13_figures, fault_coverage, s7_figures
from sims.scenario import Scenario, load_scenario


def _compressed() -> Scenario:
    """flapping-link with its faults unchanged but closer together: the single flap at 400 s,
    the 5-minute down at 420 s (the scenario report runs the original timeline)."""
    sc = load_scenario("flapping-link")
    moved = {"link_down": 420.0}
    faults = [f.model_copy(update={"at_s": 400.0}) if f.kind == "link_flap" and f.count == 1
              else f.model_copy(update={"at_s": moved[f.kind]}) if f.kind in moved else f
              for f in sc.faults]
    return sc.model_copy(update={"faults": faults})


def test_s7_flapping_link_figures_and_faults_detected() -> None:
    figs, run = s7_figures(plant_dt_s=1.0, duration_s=720.0, scenario=_compressed())
    by = {f.name: f for f in figs}
    assert by["racky.S7.flap_declared_after_3rd_down_s"].value is not None
    assert by["racky.S7.flap_declared_after_3rd_down_s"].value <= 1.0
    assert by["racky.S7.single_flap_fatal_alarms"].value == 0
    assert by["racky.S7.port_dropped_after_s"].value is not None
    assert 240.0 <= by["racky.S7.port_dropped_after_s"].value <= 241.0
    assert by["racky.S7.flap_alerts_per_incident"].value == 1
    assert all(f.passed for f in figs), [f for f in figs if not f.passed]
    det, exp, misses = fault_coverage([run])
    assert exp == 2 and det == exp, misses  # the 3-flap port and the held-down port
    # a powered tray's links never flapped: no other link alarm anywhere in the rack
    things = {a.id for a in run.raised() if a.id.startswith(("link_", "port_"))}
    assert things == {"link_flapping:gpu07-nic1", "port_dropped:gpu40-nic0"}


def test_br13_flap_alert_from_polled_state_and_from_carrier_change_deltas() -> None:
    """FIELD-CASES BR-13 (c): one alert at the 4th transition within 60 s (t = 40 s) from
    polled state; from a carrier_changes delta of 6 with both polls up, the alert too."""
    figs = br13_figures()
    by = {f.name: f for f in figs}
    assert by["racky.BR13.polled_flap_raised_at_s"].value == 40.0
    assert by["racky.BR13.polled_flap_alerts"].value == 1
    assert by["racky.BR13.carrier_delta_flap_raised"].value == 1
