"""valvey keeps the setpoint and loop mode set by command across a restart (issue 7,
valvey.persist): set by command, restart, still there; a damaged or newer-version state file is
moved aside with a clear log and the config's values apply; a file setpoint edited since the
command wins (at start and at SIGHUP)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import structlog

from rackplane.clock import FakeClock
from rackplane.core.registers import load_register_map
from rackplane.core.samples import good
from rackplane.io.mqtt import Message
from rackplane.io.selfmetrics import TELEMETRY_ALARMS
from valvey.app import Valvey
from valvey.commands import valvey_contract
from valvey.config import ValveyConfig
from valvey.core.supply_loop import SupplyLoop
from valvey.core.supply_loop_settings import SupplyLoopSettings
from valvey.persist import (
    STATE_FORMAT,
    CommandState,
    LearnedState,
    apply_command_state,
    state_file_path,
)

STATE_NAME = "valvey-state-rack1.json"  # beside the spool folder, named after the rack


def make_cfg(tmp: Path, **supply_loop: Any) -> ValveyConfig:
    return ValveyConfig.model_validate({
        "spool": {"directory": str(tmp / "spool")},
        "commands": {"users": {"op1": "operator"}},
        "supply_loop": supply_loop,
    })


def write_toml(path: Path, tmp: Path, setpoint_c: float) -> None:
    # a config file names what valvey needs (rackplane.config: identity, the CDU); the model
    # defaults of make_cfg are the same values
    path.write_text('[identity]\nsite = "lab"\nrack = "rack1"\n[cdu]\nhost = "127.0.0.1"\n'
                    f'[spool]\ndirectory = "{tmp / "spool"}"\n'
                    f'[commands.users]\nop1 = "operator"\n'
                    f'[supply_loop]\nsetpoint_c = {setpoint_c}\n')


def make_app(cfg: ValveyConfig, config_path: Path | None = None) -> Valvey:
    return Valvey(cfg, load_register_map(cfg.cdu.register_map), clock=FakeClock(),
                  config_path=config_path)


async def command(app: Valvey, verb: str, args: dict[str, Any]) -> None:
    """One command through the daemon's own router (as from the broker)."""
    env = {"request_id": uuid.uuid4().hex, "issued_at":
           "2026-01-01T00:00:00+00:00", "args": args}
    msg = Message(topic=app.commands.topics.cmd("op1", verb), payload=json.dumps(env).encode(),
                  qos=1, retain=False, dup=False, received_mono=app.clock.monotonic())
    await app.commands.handle(msg)


def test_state_file_beside_the_spool_and_under_systemd(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path)
    assert state_file_path(None, cfg.spool, "r7", {}) == tmp_path / "valvey-state-r7.json"
    rel = ValveyConfig().spool  # relative ./spool: $STATE_DIRECTORY/spool under systemd
    assert state_file_path(None, rel, "r7", {"STATE_DIRECTORY": "/var/lib/x"}) == \
        Path("/var/lib/x/valvey-state-r7.json")
    assert state_file_path(Path("s.json"), rel, "r7", {"STATE_DIRECTORY": "/var/lib/x:/o"}) == \
        Path("/var/lib/x/s.json")


async def test_setpoint_and_manual_mode_set_by_command_survive_a_restart(
    tmp_path: Path,
) -> None:
    cfg = make_cfg(tmp_path)
    app = make_app(cfg)
    await command(app, "set_setpoint", {"setpoint_c": 43.5})
    await command(app, "acquire_lease", {"output": "facility_valve", "ttl_s": 60})
    await command(app, "set_mode", {"mode": "manual", "output_pct": 40.0})
    assert app.core.loop.setpoint_c == 43.5 and app.core.loop.manual_target_pct == 40.0
    app._persist_tick(app.clock.monotonic())  # the tick saves the change (off the loop)
    assert app._save_task is not None
    await app._save_task
    doc = json.loads((tmp_path / STATE_NAME).read_text())
    assert doc["format"] == STATE_FORMAT and doc["version"] == 1
    assert doc["data"]["setpoint_c"] == 43.5 and doc["data"]["manual_output_pct"] == 40.0

    again = make_app(cfg)  # the restart
    assert again.core.loop.setpoint_c == 43.5
    assert again.core.loop.control_mode == "manual"
    assert again.core.loop.manual_target_pct == 40.0
    assert again._saved_state == CommandState.of("lab/row1/rack1", again.core.loop,
                                                 cfg.supply_loop, LearnedState.of(again.core))

    # back to auto by command; saved at shutdown; the next start is in auto
    await command(again, "set_mode", {"mode": "auto"})
    again._save_state_now()
    third = make_app(cfg)
    assert third.core.loop.manual_target_pct is None and third.core.loop.setpoint_c == 43.5


@pytest.mark.parametrize("content", [
    "{not json",
    json.dumps({"format": STATE_FORMAT, "version": 99, "saved_wall_ns": 1, "data": {}}),
    json.dumps({"format": "racky-state", "version": 1, "saved_wall_ns": 1, "data": {}}),
    json.dumps({"format": STATE_FORMAT, "version": 1, "saved_wall_ns": 1,
                "data": {"owner": "lab/rack1", "setpoint_c": "hot"}}),
    json.dumps({"format": STATE_FORMAT, "version": 1, "saved_wall_ns": 1, "data": {
        "owner": "lab/rack2", "setpoint_c": 41.0, "file_setpoint_c": 45.0,
        "manual_output_pct": None, "shadow": False, "file_shadow": False}}),
    # acceptance round 2 of issue 14: an integer no double holds (float() raised at start)
    '{"format": "valvey-state", "version": 1, "saved_wall_ns": 1, "data": {"owner": '
    '"lab/row1/rack1", "setpoint_c": 1' + "0" * 400 + ', "file_setpoint_c": 45.0, '
    '"manual_output_pct": null, "shadow": false, "file_shadow": false}}',
    # acceptance round 2 of issue 14: a rack of the same name in another row (one folder)
    json.dumps({"format": STATE_FORMAT, "version": 1, "saved_wall_ns": 1, "data": {
        "owner": "lab/row2/rack1", "setpoint_c": 41.0, "file_setpoint_c": 45.0,
        "manual_output_pct": 80.0, "shadow": False, "file_shadow": False}}),
])
def test_damaged_or_future_state_file_logs_and_uses_the_config(
    tmp_path: Path, content: str
) -> None:
    (tmp_path / STATE_NAME).write_text(content)
    cfg = make_cfg(tmp_path, setpoint_c=44.0)
    with structlog.testing.capture_logs() as logs:
        app = make_app(cfg)
    assert app.core.loop.setpoint_c == 44.0 and app.core.loop.control_mode != "manual"
    bad = [e for e in logs if e["event"] == "state_file_unusable"]
    assert len(bad) == 1 and bad[0]["log_level"] == "error"
    assert "configuration" in bad[0]["effect"]
    assert not (tmp_path / STATE_NAME).exists()  # moved aside for a look
    assert len(list(tmp_path.glob(STATE_NAME + ".bad-*"))) == 1
    if "99" in content:
        assert "newer" in bad[0]["error"] and "v99" in bad[0]["error"]


def test_file_setpoint_edited_since_the_command_wins_at_start(tmp_path: Path) -> None:
    loop = SupplyLoop(SupplyLoopSettings(setpoint_c=46.0))
    saved = CommandState(owner="lab/rack1", setpoint_c=43.0, file_setpoint_c=45.0,
                         manual_output_pct=None, shadow=False, file_shadow=False)
    restored, superseded = apply_command_state(loop, SupplyLoopSettings(setpoint_c=46.0), saved)
    assert loop.setpoint_c == 46.0 and restored == [] and superseded[0].startswith("setpoint_c")
    # the config unchanged since the command: the command's setpoint applies
    loop = SupplyLoop(SupplyLoopSettings(setpoint_c=45.0))
    restored, _ = apply_command_state(loop, SupplyLoopSettings(setpoint_c=45.0), saved)
    assert loop.setpoint_c == 43.0 and restored == ["setpoint_c"]


async def test_sighup_file_setpoint_change_wins_over_an_older_command(tmp_path: Path) -> None:
    path = tmp_path / "valvey.toml"
    cfg = make_cfg(tmp_path, setpoint_c=45.0)
    write_toml(path, tmp_path, 45.0)
    app = make_app(cfg, config_path=path)
    await command(app, "set_setpoint", {"setpoint_c": 43.0})
    app.reload()  # unchanged file: the command's setpoint stays
    assert app.core.loop.setpoint_c == 43.0
    cfg2 = make_cfg(tmp_path, setpoint_c=47.0)
    write_toml(path, tmp_path, 47.0)
    app.reload()  # edited file: the newer decision wins
    assert app.core.loop.setpoint_c == 47.0
    app._save_state_now()
    assert make_app(cfg2).core.loop.setpoint_c == 47.0


def test_telemetry_alarms_and_self_metrics_are_wired(tmp_path: Path) -> None:
    app = make_app(make_cfg(tmp_path))
    assert {d.id for d in TELEMETRY_ALARMS} <= app.core.alarms.defs.keys()
    assert app.health()["self"] == {}  # before the first tick


def test_state_payloads_match_their_schemas(tmp_path: Path) -> None:
    """The retained state the daemon publishes validates against valvey_contract()'s models
    (rackplane/schemas/valvey.state.*.schema.json are generated from them)."""
    app = make_app(make_cfg(tmp_path))
    c = app.clock
    assert isinstance(c, FakeClock)
    for _ in range(30):
        now = c.monotonic()
        app.latest = {p: good(p, v, u, c.wall_ns(), now) for p, v, u in
                      (("supply_temp_c", 45.0, "C"), ("valve_position_pct", 30.0, "%"))}
        app.core.step(now, app.latest)
        c.advance(0.1)
    states = app.core.states(c.monotonic(), app.latest)
    contract = valvey_contract()
    assert set(contract.states) == {*states, "health"}
    for thing, payload in states.items():
        contract.states[thing].model_validate({**payload, "ts_ns": 1})
    health = contract.states["health"].model_validate(app.health())
    assert health.model_dump()["spool"]["depth_lines"] == 0


# --- what the controller learned of its plant (issue 21) ------------------------------------


LEARNED_MAP = [0.0, 45.0, 55.0, 72.0, 84.0, 91.0, 100.0]


async def test_learned_stroke_and_feedforward_map_survive_a_restart(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path)
    app = make_app(cfg)
    assert app.core.valves.restore_learned({"a": 118.74}) == ["a"]
    assert app.core.ff.restore_map(LEARNED_MAP)
    assert app.core.valves.restore_learned_rest({"a": [0.31, 0.52]}) == ["a"]
    # as if measured just now (valvey.learned_age: an unconfirmed value is of unknown age)
    app.learned_ages.adopt(app.core, dict.fromkeys(
        ("valve_stroke_s.a", "ff_map_pct", "valve_rest_pct.a"), app.clock.wall_ns() // 10**9))
    app._persist_tick(app.clock.monotonic())
    assert app._save_task is not None
    await app._save_task
    doc = json.loads((tmp_path / STATE_NAME).read_text())
    assert doc["data"]["learned"]["valve_stroke_s"] == {"a": 118.7}
    assert doc["data"]["learned"]["ff_map_pct"] == LEARNED_MAP
    assert doc["data"]["learned"]["valve_rest_pct"] == {"a": [0.3, 0.5]}

    again = make_app(cfg)
    assert again.core.valves.stroke_time_s(0) == pytest.approx(118.7)
    assert [y for _, y in again.core.ff.valve_map] == LEARNED_MAP
    assert again.core.valves.learned_rest() == {"a": (0.3, 0.5)}
    assert again.core.states(again.clock.monotonic(), {})["valves"]["units"][0][
        "stroke_time_s"] == pytest.approx(118.7)

    # reset by command: back to the cold-start prior and the rated stroke; the next save
    # says so
    await command(again, "reset_learned", {})
    assert again.core.valves.stroke_time_s(0) == cfg.valves.stroke_prior_s
    assert not again.core.ff.map_learned
    assert again.core.valves.learned_rest() == {}
    again._save_state_now()
    assert json.loads((tmp_path / STATE_NAME).read_text())["data"]["learned"][
        "ff_map_pct"] is None
    assert make_app(cfg).core.ff.map_learned is False


def test_learned_values_outside_bounds_or_against_another_prior_are_dropped() -> None:
    from valvey.core.controller import ValveyCore
    from valvey.persist import apply_learned

    core = ValveyCore.from_config(ValveyConfig(), 0.0)
    prior = [float(p[1]) for p in core.ff.settings.valve_map]
    powers = tuple(float(p[0]) for p in core.ff.settings.valve_map)
    bad = LearnedState((("a", 1e6), ("z", 60.0)), powers, tuple(prior),
                       (0.0, 90.0, 20.0, 77.0, 87.0, 91.0, 100.0))  # too far, falling
    restored, superseded = apply_learned(core, bad)
    assert restored == []
    assert len(superseded) == 3 and not core.ff.map_learned
    other_prior = LearnedState((), powers, (0.0, 40.0, 60.0, 75.0, 85.0, 90.0, 100.0),
                               tuple(LEARNED_MAP))
    restored, superseded = apply_learned(core, other_prior)
    assert restored == [] and "changed since" in superseded[0]


@pytest.mark.parametrize("learned", [
    "x", {"valve_stroke_s": {"a": "slow"}}, {"valve_stroke_s": [], "ff_map_pct": None},
    {"ff_map_pct": [1.0, True]}, {"ff_map_powers_kw": list(range(100))},
    {"valve_rest_pct": {"a": [1.0]}}, {"valve_rest_pct": []},
])
def test_a_malformed_learned_object_is_a_clear_error(learned: Any) -> None:
    data = {"owner": "lab/rack1", "setpoint_c": 45.0, "file_setpoint_c": 45.0,
            "manual_output_pct": None, "shadow": False, "file_shadow": False,
            "learned": learned}
    with pytest.raises(ValueError, match="learned"):
        CommandState.from_data(data)


def test_a_file_saved_before_learning_existed_restores_nothing_learned() -> None:
    data = {"owner": "lab/rack1", "setpoint_c": 45.0, "file_setpoint_c": 45.0,
            "manual_output_pct": None, "shadow": False, "file_shadow": False}
    assert CommandState.from_data(data).learned is None


def test_a_state_file_of_an_older_version_without_the_row_is_still_applied(
        tmp_path: Path) -> None:
    """Files saved before the owner named the row ("site/rack") are this rack's when site
    and rack match (the next save names the row)."""
    (tmp_path / STATE_NAME).write_text(json.dumps({
        "format": STATE_FORMAT, "version": 1, "saved_wall_ns": 1, "data": {
            "owner": "lab/rack1", "setpoint_c": 43.0, "file_setpoint_c": 45.0,
            "manual_output_pct": None, "shadow": False, "file_shadow": False}}))
    app = make_app(make_cfg(tmp_path))
    assert app.core.loop.setpoint_c == 43.0


async def test_a_rack_of_the_same_name_in_another_row_never_takes_this_state(
        tmp_path: Path) -> None:
    """Acceptance round 2 of issue 14 (item 17's kind): valvey for row2/rack1 and row1/rack1
    on defaults in one folder share valvey-state-rack1.json, and the owner named only
    site/rack: one CDU started with the other's manual output. The owner names the row."""
    def cfg_row(row: str) -> ValveyConfig:
        data = make_cfg(tmp_path).model_dump(mode="json")
        data["identity"]["row"] = row
        return ValveyConfig.model_validate(data)

    other = make_app(cfg_row("row2"))
    await command(other, "acquire_lease", {"output": "facility_valve", "ttl_s": 60})
    await command(other, "set_mode", {"mode": "manual", "output_pct": 80.0})
    other._save_state_now()
    assert json.loads((tmp_path / STATE_NAME).read_text())["data"]["manual_output_pct"] == 80.0
    with structlog.testing.capture_logs() as logs:
        mine = make_app(cfg_row("row1"))
    assert mine.core.loop.control_mode != "manual" and mine.core.loop.manual_target_pct is None
    assert [e for e in logs if e["event"] == "state_file_unusable"]


# --- the capacity guard's learned values: liquid fraction, exchanger (issue 21 item 2) -------


def _run_plant(core: Any, seconds: int, t0: float = 0.0, ratio: float = 0.92,
               k_kw_per_k: float = 10.2, power_w: float = 90_000.0) -> None:
    """Steady running with the valve fully open on an exchanger of conductance
    ``k_kw_per_k`` whose liquid takes ``ratio`` of the rack power (the supply at setpoint:
    no cap)."""
    for i in range(seconds):
        q = ratio * power_w / 1000.0
        core.capacity.step(
            t0 + i, pv_c=45.0, setpoint_c=45.0, valve_demand_pct=100.0,
            valve_position_pct=100.0, valve_stuck=False, heat_removed_kw=q,
            return_c=44.0 + q / k_kw_per_k, facility_c=44.0, flow_lpm=198.0,
            rack_power_w=power_w, no_standby=False, low_flow=False, over_temperature=False)


def _core(**cfg: Any) -> Any:
    from valvey.core.controller import ValveyCore

    return ValveyCore.from_config(ValveyConfig.model_validate(cfg), 0.0)


def _learned_core(ratio: float = 0.92, k_kw_per_k: float = 10.2) -> Any:
    core = _core()
    _run_plant(core, 200, ratio=ratio, k_kw_per_k=k_kw_per_k)
    assert core.capacity.liquid.source == "learned" and core.capacity.k_open_source == "measured"
    return core


def _sources(core: Any) -> tuple[str, str | None]:
    """(state/safety's liquid_fraction_source, the exchanger's source: state/supply_loop's
    capacity_w_per_k_source once the core has stepped)."""
    return (core.states(0.0, {})["safety"]["liquid_fraction_source"],
            core.capacity.k_open_source)


def _saved_learned(core: Any) -> LearnedState:
    """What the state file keeps of ``core``, through its JSON text (the round trip)."""
    data = CommandState.of("lab/row1/rack1", core.loop, core.cfg.supply_loop,
                           LearnedState.of(core)).data()
    learned = CommandState.from_data(json.loads(json.dumps(data))).learned
    assert learned is not None
    return learned


def test_the_liquid_fraction_and_exchanger_round_trip_and_report_restored() -> None:
    from valvey.persist import apply_learned

    src = _learned_core()
    saved = _saved_learned(src)
    assert saved.liquid_fraction is not None and saved.exchanger is not None
    assert saved.liquid_fraction.value == pytest.approx(0.92, abs=0.005)
    assert saved.exchanger.k_open_kw_per_k == pytest.approx(10.2, rel=0.01)

    core = _core()
    assert _sources(core) == ("configured", None)
    restored, superseded = apply_learned(core, saved)
    assert {"liquid_fraction", "k_open_kw_per_k"} <= set(restored) and superseded == []
    assert core.capacity.liquid.value == saved.liquid_fraction.value
    assert core.capacity.k_open == saved.exchanger.k_open_kw_per_k
    assert _sources(core) == ("restored", "restored")
    assert core.states(0.0, {})["safety"]["liquid_fraction_learned"] is True
    assert LearnedState.of(core) == saved  # unchanged: no save due after a restore

    # this run confirms them: the exchanger after 10 s with the valve open, the fraction
    # after as many steady ratios as make a cold start's learned
    _run_plant(core, 12, ratio=0.92)
    assert _sources(core)[1] == "measured"
    _run_plant(core, 200, t0=20.0, ratio=0.92)
    assert _sources(core) == ("learned", "measured")


def test_the_saved_liquid_fraction_follows_in_steps_not_every_digit() -> None:
    # the learned average's last digits move with the plant's noise and a slow drift: a save
    # (and a log line) on each of those would be noise; the saved value follows in steps,
    # never more than 0.005 from the value
    import random

    rng = random.Random(3)
    core = _learned_core()
    liq = core.capacity.liquid
    value_changes = saved_changes = 0
    last_value, last_saved = round(liq.value, 3), liq.saved
    for i in range(900):
        drift = 0.015 * i / 900.0
        _run_plant(core, 1, t0=200.0 + i, ratio=0.92 + drift + rng.gauss(0.0, 0.004))
        assert liq.saved is not None and abs(liq.saved - liq.value) <= 0.005
        value_changes += round(liq.value, 3) != last_value
        saved_changes += liq.saved != last_saved
        last_value, last_saved = round(liq.value, 3), liq.saved
    assert liq.value > 0.925  # it followed the drift
    assert 1 <= saved_changes < value_changes / 3


def test_a_restored_exchanger_the_plant_no_longer_matches_is_replaced_at_once() -> None:
    # fouled during the restart (10.2 -> 8.0 kW/K): the first valve-open second replaces the
    # restored figure (a cap or racky's derate must not rest on the old exchanger); one
    # within the noise is confirmed and averaged with it
    from valvey.persist import apply_learned

    saved = _saved_learned(_learned_core(k_kw_per_k=10.2))
    fouled = _core()
    apply_learned(fouled, saved)
    _run_plant(fouled, 1, k_kw_per_k=8.0)
    assert fouled.capacity.k_open == pytest.approx(8.0, rel=0.005)
    assert fouled.capacity.k_open_source == "measured"
    same = _core()
    apply_learned(same, saved)
    _run_plant(same, 1, k_kw_per_k=10.3)
    assert same.capacity.k_open_source == "restored"
    assert same.capacity.k_open == pytest.approx((10 * 10.2 + 10.3) / 11, rel=0.005)


@pytest.mark.parametrize(("ratio", "k_kw_per_k"), [(0.3, 10.2), (0.92, 1e4), (0.92, 0.01)])
def test_a_saved_liquid_fraction_or_exchanger_outside_its_bounds_is_dropped(
        ratio: float, k_kw_per_k: float) -> None:
    from valvey.persist import LearnedExchanger, LearnedLiquid, apply_learned

    saved = _saved_learned(_learned_core())
    lf, ex = saved.liquid_fraction, saved.exchanger
    assert lf is not None and ex is not None
    bad_liquid = ratio != 0.92
    bad = LearnedState(
        saved.valve_stroke_s, saved.ff_map_powers_kw, saved.ff_map_prior_pct, None,
        liquid_fraction=LearnedLiquid(ratio, lf.file_liquid_fraction, lf.file_inputs),
        exchanger=LearnedExchanger(k_kw_per_k, ex.file_cdu, ex.file_points))
    core = _core()
    restored, superseded = apply_learned(core, bad)
    name = "liquid_fraction" if bad_liquid else "k_open_kw_per_k"
    assert name not in restored
    assert [s for s in superseded if s.startswith(name)] and len(superseded) == 1
    assert ("outside capacity.liquid_fraction_min..max" if bad_liquid
            else "plausibility window") in superseded[0]
    if bad_liquid:
        assert core.capacity.liquid.value == core.cfg.capacity.liquid_fraction
        assert _sources(core)[0] == "configured"
    else:
        assert core.capacity.k_open is None and _sources(core)[1] is None


@pytest.mark.parametrize(("cfg", "dropped"), [
    ({"capacity": {"liquid_fraction": 0.8}}, {"liquid_fraction"}),  # the prior edited
    ({"capacity": {"learn_liquid_fraction": False}}, {"liquid_fraction"}),
    ({"cdu": {"host": "10.0.4.99"}}, {"k_open_kw_per_k"}),  # another CDU
    ({"points": {"heat_removed": "hx_duty_kw"}}, {"liquid_fraction", "k_open_kw_per_k"}),
    ({"points": {"return_temp": "return_b_c"}}, {"k_open_kw_per_k"}),
    ({"safety": {"rack_power": "rack_power_b_w"}}, {"liquid_fraction"}),
])
def test_a_config_change_since_supersedes_what_was_learned_against_it(
        cfg: dict[str, Any], dropped: set[str]) -> None:
    from valvey.persist import apply_learned

    saved = _saved_learned(_learned_core())
    core = _core(**cfg)
    with structlog.testing.capture_logs():
        restored, superseded = apply_learned(core, saved)
    assert {s.split(":")[0] for s in superseded} == dropped
    assert dropped.isdisjoint(restored)
    assert {"liquid_fraction", "k_open_kw_per_k"} - dropped <= set(restored)


def test_reset_learned_forgets_the_liquid_fraction_and_the_exchanger() -> None:
    from valvey.persist import apply_learned

    core = _core()
    apply_learned(core, _saved_learned(_learned_core()))
    assert _sources(core) == ("restored", "restored")
    core.reset_learned()
    assert _sources(core) == ("configured", None)
    assert core.capacity.liquid.value == core.cfg.capacity.liquid_fraction
    assert core.capacity.k_open is None
    cleared = LearnedState.of(core)
    assert cleared.liquid_fraction is None and cleared.exchanger is None
    # learned again from scratch afterwards (a cold start's rules)
    _run_plant(core, 200, t0=1000.0, ratio=0.8)
    assert core.capacity.liquid.value == pytest.approx(0.8, abs=0.005)


def test_a_learned_block_saved_before_these_keys_restores_none_of_them() -> None:
    from valvey.persist import apply_learned

    data = {"owner": "lab/row1/rack1", "setpoint_c": 45.0, "file_setpoint_c": 45.0,
            "manual_output_pct": None, "shadow": False, "file_shadow": False,
            "learned": {"valve_stroke_s": {"a": 90.0}, "ff_map_powers_kw": [],
                        "ff_map_prior_pct": [], "ff_map_pct": None, "valve_rest_pct": {},
                        "commissioned": None}}
    learned = CommandState.from_data(data).learned
    assert learned is not None
    assert learned.liquid_fraction is None and learned.exchanger is None
    core = _core()
    restored, _ = apply_learned(core, learned)
    assert restored == ["valve_stroke_s.a"] and _sources(core) == ("configured", None)


@pytest.mark.parametrize("learned", [
    {"liquid_fraction": {"value": "high", "file_liquid_fraction": 0.85,
                         "file_inputs": ["h", "p"]}},
    {"liquid_fraction": {"value": 0.9, "file_liquid_fraction": 0.85}},
    {"exchanger": [10.2]},
    {"exchanger": {"k_open_kw_per_k": 10.2, "file_cdu": 5, "file_points": ["a", "b", "c"]}},
    {"exchanger": {"k_open_kw_per_k": True, "file_cdu": "x", "file_points": ["a", "b", "c"]}},
])
def test_a_malformed_capacity_learned_value_is_a_clear_error(learned: Any) -> None:
    data = {"owner": "lab/rack1", "setpoint_c": 45.0, "file_setpoint_c": 45.0,
            "manual_output_pct": None, "shadow": False, "file_shadow": False,
            "learned": learned}
    with pytest.raises(ValueError, match=r"learned\.(liquid_fraction|exchanger)"):
        CommandState.from_data(data)


async def test_the_liquid_fraction_and_exchanger_survive_a_restart(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path)
    app = make_app(cfg)
    _run_plant(app.core, 200, ratio=0.92)
    app._persist_tick(app.clock.monotonic())
    assert app._save_task is not None
    await app._save_task
    learned = json.loads((tmp_path / STATE_NAME).read_text())["data"]["learned"]
    assert learned["liquid_fraction"]["value"] == pytest.approx(0.92, abs=0.005)
    assert learned["liquid_fraction"]["file_liquid_fraction"] == cfg.capacity.liquid_fraction
    assert learned["exchanger"]["k_open_kw_per_k"] == pytest.approx(10.2, rel=0.01)
    assert learned["exchanger"]["file_cdu"] == f"{cfg.cdu.host}:{cfg.cdu.port}/1"

    with structlog.testing.capture_logs() as logs:
        again = make_app(cfg)  # the restart
    got = [e for e in logs if e["event"] == "command_state_restored"]
    assert got and {"liquid_fraction", "k_open_kw_per_k"} <= set(got[0]["restored"])
    assert again.core.capacity.liquid.value == learned["liquid_fraction"]["value"]
    assert _sources(again.core) == ("restored", "restored")
    # the published figure racky derates by is there before the valve has been open
    st = again.core.capacity.step(0.0, pv_c=45.0, setpoint_c=45.0, valve_demand_pct=40.0,
                                  valve_position_pct=40.0, valve_stuck=False,
                                  heat_removed_kw=None, return_c=None, facility_c=30.0,
                                  flow_lpm=198.0, rack_power_w=None, no_standby=False,
                                  low_flow=False, over_temperature=False)
    assert st.open_w_per_k is not None and st.k_open_kw_per_k == pytest.approx(10.2, rel=0.01)
    c = again.clock
    assert isinstance(c, FakeClock)
    again.latest = {p: good(p, v, u, c.wall_ns(), c.monotonic()) for p, v, u in
                    (("supply_temp_c", 45.0, "C"), ("valve_position_pct", 30.0, "%"),
                     ("flow_lpm", 198.0, "L/min"), ("facility_supply_temp_c", 30.0, "C"))}
    again.core.step(c.monotonic(), again.latest)
    states = again.core.states(c.monotonic(), again.latest)
    assert states["supply_loop"]["capacity_w_per_k_source"] == "restored"
    assert states["supply_loop"]["capacity_w_per_k"] is not None
    assert states["safety"]["liquid_fraction_source"] == "restored"
    contract = valvey_contract()
    for thing in ("supply_loop", "safety"):
        contract.states[thing].model_validate({**states[thing], "ts_ns": 1})

    # reset by command: forgotten, and the next save says so; the next start is cold
    await command(again, "reset_learned", {})
    assert _sources(again.core) == ("configured", None)
    again._save_state_now()
    learned = json.loads((tmp_path / STATE_NAME).read_text())["data"]["learned"]
    assert learned["liquid_fraction"] is None and learned["exchanger"] is None
    assert _sources(make_app(cfg).core) == ("configured", None)
