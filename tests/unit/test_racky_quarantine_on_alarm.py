"""``[lifecycle] quarantine_on_alarms`` (issue 20): a flapping link takes a rack out of
production (quarantined, its passed validation forgotten), and racky's rules then hold it out
until a new validation passes; without the setting no alarm moves the lifecycle."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from harness.lockstep_racky import WALL0_NS, run_racky
from rackplane.core.alarms import AlarmEvent
from rackplane.errors import CommandError
from racky.config import LifecycleSettings, RackyConfig
from racky.core.lifecycle import Lifecycle, PersistedState, quarantine_reason
from sims.scenario import load_scenario

FLAP_AT_S = 90.0
"""The demo scenario's link flap: 3 downs of 2 s, 4 s apart, from t = 90 s."""


def _validated_production() -> PersistedState:
    return PersistedState(Lifecycle("production", WALL0_NS, "rack validation passed",
                                    "validation", validated=True))


def _run(kinds: list[str]) -> PersistedState:
    sc = load_scenario("demo-load-step")
    flap = next(f for f in sc.faults if f.kind == "link_flap")
    assert flap.at_s == FLAP_AT_S and flap.count == 3
    cfg = RackyConfig(lifecycle=LifecycleSettings(quarantine_on_alarms=kinds))
    r = run_racky(sc, cfg, plant_dt_s=0.5, duration_s=120.0, persisted=_validated_production())
    assert any(a.id == "link_flapping:gpu07-nic1" for a in r.raised())
    return r.core.persisted


def test_a_flapping_link_quarantines_a_production_rack_until_it_is_revalidated() -> None:
    p = _run(["link_flapping", "port_dropped"])
    lc = p.lifecycle
    assert lc.state == "quarantined" and lc.by == "racky" and not lc.validated
    assert lc.reason.startswith("alarm link_flapping:gpu07-nic1 raised"), lc.reason
    (step,) = [h for h in lc.history if h["to"] == "quarantined"]
    # at the tick that reveals the 3rd down (t = 102 s), not before the flap nor long after
    third_down_s = FLAP_AT_S + 2 * (2.0 + 4.0)
    at_s = (step["at_ns"] - WALL0_NS) / 1e9
    assert third_down_s <= at_s <= third_down_s + 2.0, at_s
    # held out: maintenance is allowed, production needs a new passed validation
    assert lc.set_by_command("maintenance", "cable reseated", "operator", WALL0_NS + 1)
    with pytest.raises(CommandError, match="production needs a passed validation"):
        lc.set_by_command("production", "back", "operator", WALL0_NS + 2)


def test_without_the_setting_no_alarm_moves_the_lifecycle() -> None:
    lc = _run([]).lifecycle
    assert lc.state == "production" and lc.validated


def _ev(aid: str, kind: str = "raised") -> AlarmEvent:
    return AlarmEvent(aid, kind, "critical", f"{aid} message", 1.0, 5.0)  # type: ignore[arg-type]


def test_quarantine_reason_only_for_listed_kinds_raised_in_production_or_maintenance() -> None:
    kinds = ["link_flapping"]
    flap = _ev("link_flapping:gpu07-nic1")
    assert quarantine_reason("production", kinds, [flap]) == (
        "alarm link_flapping:gpu07-nic1 raised: link_flapping:gpu07-nic1 message")
    assert quarantine_reason("maintenance", kinds, [_ev("link_errors:x"), flap])
    for state in ("provisioning", "validating", "quarantined"):
        assert quarantine_reason(state, kinds, [flap]) is None
    assert quarantine_reason("production", kinds, [_ev("link_flapping:x", "cleared")]) is None
    assert quarantine_reason("production", kinds, [_ev("link_errors:gpu07-nic1")]) is None
    assert quarantine_reason("production", [], [flap]) is None


def test_an_unknown_alarm_kind_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValidationError, match=r"unknown alarm kind.*link_flap;.*link_flapping"):
        LifecycleSettings(quarantine_on_alarms=["link_flap"])
