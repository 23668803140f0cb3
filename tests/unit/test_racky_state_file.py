"""racky's state file is one per rack (issue 14 item 17's kind, acceptance round 2): two racky
daemons for different racks started from one folder on defaults shared ``racky-state.json``,
so one rack's lifecycle and the trays a safety request powered off were the other's after a
restart. An upgrade keeps the state left under the old shared name."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from rackplane.clock import FakeClock
from racky.app import Racky
from racky.config import RackyConfig
from racky.persist import lifecycle_state_file

WALL0 = 1_800_000_000 * 10**9


def _cfg(rack: str, **extra: object) -> RackyConfig:
    return RackyConfig.model_validate({"identity": {"rack": rack}, **extra})


def test_default_state_files_are_per_rack() -> None:
    env: dict[str, str] = {}
    a, b = (lifecycle_state_file(_cfg(r), env) for r in ("rack1", "rack2"))
    assert a != b
    assert a == Path("racky-state-lab-row1-rack1.json")
    sd = {"STATE_DIRECTORY": "/var/lib/rackplane-racky"}
    assert lifecycle_state_file(_cfg("rack1"), sd) == Path(
        "/var/lib/rackplane-racky/racky-state-lab-row1-rack1.json")
    given = _cfg("rack1", lifecycle={"state_file": "/data/r.json"})
    assert lifecycle_state_file(given, env) == Path("/data/r.json")


def _racky(rack: str, tmp: Path) -> Racky:
    cfg = _cfg(rack, spool={"directory": str(tmp / f"spool-{rack}")})
    return Racky(cfg, clock=FakeClock(start_mono=1000.0, start_wall_ns=WALL0))


def _close(r: Racky) -> None:
    asyncio.run(r.writer.close(budget_s=0))


def test_two_rackies_from_one_folder_keep_their_own_state(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    r1 = _racky("rack1", tmp_path)
    r2 = _racky("rack2", tmp_path)
    assert r1.store.path != r2.store.path
    from racky.core.lifecycle import Lifecycle, PersistedState

    r1.store.save(PersistedState(Lifecycle("quarantined", WALL0, "test", "op")))
    assert r2.store.load(WALL0).lifecycle.state != "quarantined"
    assert _racky("rack1", tmp_path).store.load(WALL0).lifecycle.state == "quarantined"
    for r in (r1, r2):
        _close(r)


def test_a_state_file_under_the_old_shared_name_is_taken_over_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    # the state an older version left under the shared default name
    from racky.core.lifecycle import Lifecycle, PersistedState
    from racky.persist import StateStore

    StateStore(tmp_path / "racky-state.json").save(
        PersistedState(Lifecycle("production", WALL0, "test", "op")))
    with capture_logs() as logs:
        r = _racky("rack1", tmp_path)
    assert r.store.path == Path("racky-state-lab-row1-rack1.json")  # in the working folder
    assert r.store.load(WALL0).lifecycle.state == "production"
    assert not (tmp_path / "racky-state.json").exists()
    assert [e["event"] for e in logs].count("state_file_legacy_adopted") == 1
    with capture_logs() as logs:
        r2 = _racky("rack2", tmp_path)  # nothing left to take over: a new rack
    assert "state_file_legacy_adopted" not in [e["event"] for e in logs]
    assert r2.store.load(WALL0).lifecycle.state == "provisioning"
    for x in (r, r2):
        _close(x)
