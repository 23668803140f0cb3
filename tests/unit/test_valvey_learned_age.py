"""The age of what valvey learned of its plant (valvey.learned_age, valvey.persist): each
learned value carries when a measurement last confirmed it (wall clock, saved); at start one
older than control.learned_max_age_s, or of unknown age (a stamp in the future, a file of an
older build without stamps), is dropped (valve strokes and rest, liquid fraction, k_open) or
kept as a starting point only (feedforward map, commissioning gains), and each is logged."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import structlog

from rackplane.clock import FakeClock
from rackplane.core.registers import load_register_map
from valvey.app import Valvey
from valvey.config import ValveyConfig
from valvey.core.controller import ValveyCore
from valvey.learned_age import FUTURE_SLACK_S, LearnedAges
from valvey.persist import CommandState, LearnedState, apply_learned

T0 = 1_767_225_600  # when the values were confirmed, s since the epoch
DAY = 86400
LEARNED_MAP = (0.0, 45.0, 55.0, 72.0, 84.0, 91.0, 100.0)
DROPPED = {"valve_stroke_s.a", "valve_rest_pct.a", "liquid_fraction", "k_open_kw_per_k"}
KEPT = {"ff_map_pct", "commissioned"}  # kept as a starting point when old


def _core(**cfg: Any) -> ValveyCore:
    return ValveyCore.from_config(ValveyConfig.model_validate(cfg), 0.0)


def _run_plant(core: ValveyCore, seconds: int, t0: float = 0.0) -> None:
    """Steady running with the valve open: the liquid fraction (0.92) and k_open (10.2 kW/K)
    are measured (as in test_valvey_persist)."""
    for i in range(seconds):
        q = 0.92 * 90.0
        core.capacity.step(
            t0 + i, pv_c=45.0, setpoint_c=45.0, valve_demand_pct=100.0,
            valve_position_pct=100.0, valve_stuck=False, heat_removed_kw=q,
            return_c=44.0 + q / 10.2, facility_c=44.0, flow_lpm=198.0,
            rack_power_w=90_000.0, no_standby=False, low_flow=False, over_temperature=False)


def _saved(stamps: dict[str, int] | None) -> LearnedState:
    """Every kind of learned value, through the state file's JSON, confirmed at ``stamps``
    (None: a file of a build before the stamps: no ``confirmed_wall_s`` key)."""
    core = _core()
    _run_plant(core, 200)
    assert core.valves.restore_learned({"a": 90.0}) == ["a"]
    assert core.valves.restore_learned_rest({"a": [0.3, 0.5]}) == ["a"]
    assert core.ff.restore_map(list(LEARNED_MAP))
    assert core.commissioning.restore(core, (30.0, 40.0, 1.1, 18.9, 20.0, 1.0))
    st = replace(LearnedState.of(core), confirmed_wall_s=tuple(sorted((stamps or {}).items())))
    data = CommandState.of("lab/row1/rack1", core.loop, core.cfg.supply_loop, st).data()
    if stamps is None:
        del data["learned"]["confirmed_wall_s"]
    learned = CommandState.from_data(json.loads(json.dumps(data))).learned
    assert learned is not None
    return learned


def _all_at(t: int) -> dict[str, int]:
    return dict.fromkeys(DROPPED | KEPT, t)


def _restore(saved: LearnedState, wall_s: float, **cfg: Any
             ) -> tuple[ValveyCore, LearnedAges, list[str], list[str]]:
    core = _core(**cfg)
    ages = LearnedAges(lambda: wall_s)
    restored, superseded = apply_learned(core, saved, ages)
    return core, ages, restored, superseded


def _name(entry: str) -> str:
    return entry.split(":")[0]


def test_fresh_values_are_restored_with_their_confirmation_times() -> None:
    saved = _saved(_all_at(T0))
    core, ages, restored, superseded = _restore(saved, T0 + 29 * DAY)
    assert superseded == [] and set(restored) == DROPPED | KEPT  # plain names: fresh
    assert core.capacity.k_open_source == "restored" and core.valves.stroke_time_s(0) == 90.0
    # the stamps are kept, not renewed: a restore is no measurement, no save is due
    assert LearnedState.of(core, ages) == saved
    assert saved.ages_s(T0 + 29 * DAY) == dict.fromkeys(DROPPED | KEPT, 29 * DAY)


def test_old_values_are_dropped_or_kept_as_a_starting_point_per_kind() -> None:
    saved = _saved(_all_at(T0))
    core, ages, restored, superseded = _restore(saved, T0 + 31 * DAY)
    assert {_name(s) for s in superseded} == DROPPED
    assert all("confirmed 31.0 d ago, over control.learned_max_age_s (2592000 s): dropped"
               in s for s in superseded)
    # k_open no longer makes valvey believe in the capacity measured a month ago
    assert core.capacity.k_open is None and core.capacity.k_open_source is None
    assert core.capacity.liquid.value == core.cfg.capacity.liquid_fraction
    assert core.valves.stroke_time_s(0) == core.cfg.valves.stroke_prior_s
    assert core.valves.learned_rest() == {}
    assert {_name(r) for r in restored} == KEPT
    assert all(r.endswith("kept as a starting point only") for r in restored)
    assert [y for _, y in core.ff.valve_map] == list(LEARNED_MAP)
    assert core.commissioning.accepted is not None
    # kept with their old stamps: still old at the next start unless confirmed meanwhile
    after = LearnedState.of(core, ages)
    assert after.confirmed_wall_s == (("commissioned", T0), ("ff_map_pct", T0))
    assert after.liquid_fraction is None and after.exchanger is None


def test_the_maximum_age_comes_from_the_config() -> None:
    saved = _saved(_all_at(T0))
    _, _, restored, superseded = _restore(saved, T0 + 2 * 3600,
                                          control={"learned_max_age_s": 3600})
    assert {_name(s) for s in superseded} == DROPPED
    assert "(3600 s)" in superseded[0] and "confirmed 2.0 h ago" in superseded[0]
    assert {_name(r) for r in restored} == KEPT
    with pytest.raises(ValueError, match="learned_max_age_s"):
        ValveyConfig.model_validate({"control": {"learned_max_age_s": 10}})


@pytest.mark.parametrize(("ahead_s", "fresh"), [(DAY, False), (FUTURE_SLACK_S + 1, False),
                                                (FUTURE_SLACK_S - 1, True)])
def test_a_confirmation_time_in_the_future_is_an_unknown_age(ahead_s: float,
                                                             fresh: bool) -> None:
    # the wall clock stepped back since the save: the values' age is unknown (not 0), unless
    # within a small correction's slack
    saved = _saved(_all_at(T0))
    core, ages, restored, superseded = _restore(saved, T0 - ahead_s)
    if fresh:
        assert superseded == [] and set(restored) == DROPPED | KEPT
        return
    assert {_name(s) for s in superseded} == DROPPED
    assert all("age unknown" in s for s in superseded + restored)
    assert {_name(r) for r in restored} == KEPT
    # a future stamp is not kept: once the clock passed it, the value would look fresh
    assert LearnedState.of(core, ages).confirmed_wall_s == ()


def test_a_file_of_the_previous_version_without_times_still_loads_as_unknown_age() -> None:
    saved = _saved(None)
    assert saved.confirmed_wall_s == ()
    core, ages, restored, superseded = _restore(saved, T0)
    assert {_name(s) for s in superseded} == DROPPED
    assert all("age unknown" in s and "dropped" in s for s in superseded)
    assert {_name(r) for r in restored} == KEPT and core.ff.map_learned
    assert LearnedState.of(core, ages).confirmed_wall_s == ()  # still of unknown age


def test_per_value_ages_only_the_old_one_goes() -> None:
    stamps = _all_at(T0 + 20 * DAY)
    stamps["k_open_kw_per_k"] = T0  # the valve was last fully open 40 days before the restart
    _, _, restored, superseded = _restore(_saved(stamps), T0 + 40 * DAY)
    assert [_name(s) for s in superseded] == ["k_open_kw_per_k"]
    assert set(restored) == (DROPPED | KEPT) - {"k_open_kw_per_k"}


def test_a_config_change_is_reported_as_such_before_the_age() -> None:
    saved = _saved(_all_at(T0))
    _, _, _, superseded = _restore(saved, T0 + 40 * DAY, cdu={"host": "10.0.4.99"})
    ex = [s for s in superseded if _name(s) == "k_open_kw_per_k"]
    assert len(ex) == 1 and "changed since" in ex[0]


def test_measurements_stamp_their_values_at_most_hourly() -> None:
    wall = [float(T0)]
    core = _core()
    ages = LearnedAges(lambda: wall[0])
    ages.observe(core)
    assert LearnedState.of(core, ages).confirmed_wall_s == ()
    _run_plant(core, 200)
    ages.observe(core)
    st = dict(LearnedState.of(core, ages).confirmed_wall_s)
    assert st == {"liquid_fraction": T0, "k_open_kw_per_k": T0}
    # confirmed again 10 min later: the stamp stands (no save each second) ...
    wall[0] += 600
    _run_plant(core, 10, t0=200.0)
    ages.observe(core)
    assert dict(LearnedState.of(core, ages).confirmed_wall_s) == st
    # ... and is renewed once an hour has passed; a value not confirmed keeps its own
    wall[0] += 3600
    core.capacity.step(
        300.0, pv_c=45.0, setpoint_c=45.0, valve_demand_pct=100.0, valve_position_pct=100.0,
        valve_stuck=False, heat_removed_kw=82.8, return_c=44.0 + 82.8 / 10.2,
        facility_c=44.0, flow_lpm=198.0, rack_power_w=None, no_standby=False,
        low_flow=False, over_temperature=False)
    ages.observe(core)
    assert dict(LearnedState.of(core, ages).confirmed_wall_s) == {
        "liquid_fraction": T0, "k_open_kw_per_k": T0 + 4200}
    # forgotten (reset_learned): no stamp; learned again: stamped anew
    core.reset_learned()
    ages.observe(core)
    assert LearnedState.of(core, ages).confirmed_wall_s == ()
    wall[0] += 60
    _run_plant(core, 200, t0=400.0)
    ages.observe(core)
    assert dict(LearnedState.of(core, ages).confirmed_wall_s) == {
        "liquid_fraction": T0 + 4260, "k_open_kw_per_k": T0 + 4260}


def test_a_commissioning_runs_strokes_count_as_measured() -> None:
    core = _core()
    ages = LearnedAges(lambda: float(T0))
    core.valves.restore_learned({"a": 80.0})  # laid over: not a measurement
    ages.observe(core)
    assert LearnedState.of(core, ages).confirmed_wall_s == ()
    core.valves.restore_learned({"a": 81.0}, measured=True)
    ages.observe(core)
    assert LearnedState.of(core, ages).confirmed_wall_s == (("valve_stroke_s.a", T0),)
    core.reset_learned()
    ages.observe(core)
    core.valves.restore_learned({"a": 80.0})  # forgotten, then laid over: still no stamp
    ages.observe(core)
    assert LearnedState.of(core, ages).confirmed_wall_s == ()


@pytest.mark.parametrize("stamps", [[1], {"k_open_kw_per_k": "yesterday"},
                                    {"k_open_kw_per_k": True}])
def test_malformed_confirmation_times_are_a_clear_error(stamps: Any) -> None:
    data = {"owner": "lab/rack1", "setpoint_c": 45.0, "file_setpoint_c": 45.0,
            "manual_output_pct": None, "shadow": False, "file_shadow": False,
            "learned": {"confirmed_wall_s": stamps}}
    with pytest.raises(ValueError, match=r"learned\.confirmed_wall_s"):
        CommandState.from_data(data)


def _app(cfg: ValveyConfig, wall_s: int) -> Valvey:
    return Valvey(cfg, load_register_map(cfg.cdu.register_map),
                  clock=FakeClock(start_wall_ns=wall_s * 10**9))


async def test_the_daemon_saves_the_times_and_logs_each_value_at_start(tmp_path: Path) -> None:
    cfg = ValveyConfig.model_validate({"spool": {"directory": str(tmp_path / "spool")}})
    app = _app(cfg, T0)
    _run_plant(app.core, 200)
    app._save_state_now()
    learned = json.loads((tmp_path / "valvey-state-rack1.json").read_text())["data"]["learned"]
    assert learned["confirmed_wall_s"] == {"liquid_fraction": T0, "k_open_kw_per_k": T0}

    with structlog.testing.capture_logs() as logs:
        _app(cfg, T0 + DAY)  # restarted the next day: restored, with their ages
    got = [e for e in logs if e["event"] == "command_state_restored"]
    assert got and {"liquid_fraction", "k_open_kw_per_k"} <= set(got[0]["restored"])
    assert got[0]["learned_age_s"] == {"liquid_fraction": DAY, "k_open_kw_per_k": DAY}

    with structlog.testing.capture_logs() as logs:
        late = _app(cfg, T0 + 45 * DAY)  # after a long shutdown: dropped, one entry each
    assert not [e for e in logs if e["event"] == "command_state_restored"]
    sup = [e for e in logs if e["event"] == "command_state_superseded"]
    assert len(sup) == 1 and {_name(s) for s in sup[0]["superseded"]} == {
        "liquid_fraction", "k_open_kw_per_k"}
    assert late.core.capacity.k_open is None


def test_a_pair_standby_takes_the_actives_times_and_applies_the_same_rule(
        tmp_path: Path) -> None:
    def cfg(name: str) -> ValveyConfig:
        return ValveyConfig.model_validate({"spool": {"directory": str(tmp_path / name)}})

    active = _app(cfg("a"), T0)
    _run_plant(active.core, 200)
    record = active.sync_state()
    assert record["command"]["learned"]["confirmed_wall_s"] == {
        "liquid_fraction": T0, "k_open_kw_per_k": T0}

    standby = _app(cfg("b"), T0 + 3600)
    standby.apply_sync_state(record, standby.clock.monotonic())
    assert standby.core.capacity.k_open_source == "restored"
    # its next save (after a takeover) carries the active's times, not its own
    learned = standby._command_state().learned
    assert learned is not None and dict(learned.confirmed_wall_s) == {
        "liquid_fraction": T0, "k_open_kw_per_k": T0}

    late = _app(cfg("c"), T0 + 40 * DAY)  # the active kept a value it no longer confirms
    with structlog.testing.capture_logs() as logs:
        late.apply_sync_state(record, late.clock.monotonic())
    assert late.core.capacity.k_open is None
    sup = [e for e in logs if e["event"] == "pair_sync_superseded"]
    assert sup and {_name(s) for s in sup[0]["superseded"]} == {
        "liquid_fraction", "k_open_kw_per_k"}
