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
    path.write_text(f'[spool]\ndirectory = "{tmp / "spool"}"\n'
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
