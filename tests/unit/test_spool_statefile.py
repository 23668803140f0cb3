"""Persisted-state files (rackplane.io.statefile):
atomic, versioned, refused clearly on rollback."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from rackplane.io.statefile import StateFile, StateFileError, StateVersionError

WALL = 1_767_225_600 * 10**9


def sf(path: Path, version: int = 2, **kw: Any) -> StateFile:
    return StateFile(path / "valvey-state.json", "valvey-state", version, **kw)


def test_roundtrip_and_no_file(tmp_path: Path) -> None:
    f = sf(tmp_path)
    assert f.load() is None
    f.save({"setpoint_c": 44.5, "mode": "auto"}, WALL)
    assert f.load() == {"setpoint_c": 44.5, "mode": "auto"}
    doc = json.loads(f.path.read_text())
    assert (doc["format"], doc["version"], doc["saved_wall_ns"]) == ("valvey-state", 2, WALL)
    assert [p.name for p in tmp_path.iterdir()] == ["valvey-state.json"]  # no temp left


def test_rollback_newer_version_is_refused_naming_both(tmp_path: Path) -> None:
    sf(tmp_path, version=3).save({"x": 1}, WALL)
    with pytest.raises(StateVersionError, match=r"newer rackplane .*v3.*reads v2") as e:
        sf(tmp_path, version=2).load()
    assert (e.value.found, e.value.supported) == (3, 2)


def test_upgrade_migrates_or_refuses_without_a_conversion(tmp_path: Path) -> None:
    sf(tmp_path, version=1).save({"sp": 45.0}, WALL)
    with pytest.raises(StateVersionError, match="no conversion from v1"):
        sf(tmp_path, version=2).load()
    up = sf(tmp_path, version=2, migrations={1: lambda d: {"setpoint_c": d["sp"]}})
    assert up.load() == {"setpoint_c": 45.0}


@pytest.mark.parametrize("text", ["{not json", "[]", '{"format": "other", "version": 1, '
                                  '"data": {}}', '{"format": "valvey-state", "version": 2}',
                                  '{"format": "valvey-state", "version": "2", "data": {}}'])
def test_damaged_file_is_an_error_and_moved_aside_by_load_or_default(
    tmp_path: Path, text: str
) -> None:
    f = sf(tmp_path)
    f.path.write_text(text)
    with pytest.raises(StateFileError):
        f.load()
    assert f.path.exists()  # load() leaves it for inspection
    assert f.load_or_default({"mode": "auto"}, WALL) == {"mode": "auto"}
    assert not f.path.exists() and (tmp_path / f"valvey-state.json.bad-{WALL}").exists()


def test_failed_save_keeps_the_old_document(tmp_path: Path) -> None:
    f = sf(tmp_path)
    f.save({"setpoint_c": 45.0}, WALL)
    with pytest.raises(StateFileError, match="not JSON-serialisable"):
        f.save({"setpoint_c": float("nan")}, WALL)
    if os.geteuid() != 0:  # root writes anywhere: only the serialisation case is portable
        tmp_path.chmod(0o500)
        try:
            with pytest.raises(StateFileError, match="cannot write"):
                f.save({"setpoint_c": 40.0}, WALL)
        finally:
            tmp_path.chmod(0o700)
    assert f.load() == {"setpoint_c": 45.0}
