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
    assert again._saved_state == CommandState.of("lab/rack1", again.core.loop, cfg.supply_loop)

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
