"""The one state-directory resolver (rackplane.paths), the one atomic writer
(rackplane.io.files) and the peer topic builder (rackplane.core.topics)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rackplane.core.topics import Topics
from rackplane.io.files import move_aside, write_atomic
from rackplane.paths import (
    in_state_directory,
    is_in_state_directory,
    state_directories,
    state_directory,
)
from rackplane.settings import Identity


def test_state_directory_resolution() -> None:
    env = {"STATE_DIRECTORY": "/var/lib/valvey:/var/lib/other"}
    assert state_directories(env) == [Path("/var/lib/valvey"), Path("/var/lib/other")]
    assert state_directory(env) == Path("/var/lib/valvey")
    assert state_directory({}) is None
    assert in_state_directory(Path("state.json"), env) == Path("/var/lib/valvey/state.json")
    assert in_state_directory(Path("state.json"), {}) == Path("state.json")
    assert in_state_directory(Path("/etc/x.json"), env) == Path("/etc/x.json")
    assert is_in_state_directory(Path("/var/lib/other/sub"), env)
    assert is_in_state_directory(Path("/var/lib/valvey"), env)
    assert not is_in_state_directory(Path("/var/lib"), env)
    assert not is_in_state_directory(Path("/var/lib/valvey"), {})


def test_write_atomic_replaces_whole_or_not_at_all(tmp_path: Path) -> None:
    p = tmp_path / "state.json"
    write_atomic(p, "old\n")
    write_atomic(p, b"new\n")
    assert p.read_bytes() == b"new\n"
    assert sorted(os.listdir(tmp_path)) == ["state.json"]  # no temporary file left
    with pytest.raises(OSError):
        write_atomic(tmp_path / "missing" / "state.json", "x")
    os.chmod(tmp_path, 0o500)
    try:
        if os.access(tmp_path, os.W_OK):  # root ignores the mode bits
            pytest.skip("running as root: the folder stays writable")
        with pytest.raises(OSError):
            write_atomic(p, "newer\n")
    finally:
        os.chmod(tmp_path, 0o700)
    assert p.read_bytes() == b"new\n"


def test_move_aside(tmp_path: Path) -> None:
    p = tmp_path / "state.json"
    p.write_text("{")
    aside = move_aside(p, "bad-7")
    assert aside == tmp_path / "state.json.bad-7" and aside.read_text() == "{" and not p.exists()


def test_peer_topics() -> None:
    t = Topics("rackplane", Identity(site="lab", rack="r1"), "racky")
    assert t.base == "rackplane/lab/r1/racky"
    assert t.state("supply_loop") == "rackplane/lab/r1/racky/state/supply_loop"
    assert t.telemetry_filter == "rackplane/lab/r1/racky/telemetry/+"
    assert t.cmd("valvey", "set_cap") == "rackplane/lab/r1/racky/cmd/valvey/set_cap"
    assert t.cmd_results("valvey") == "rackplane/lab/r1/racky/cmd/valvey/+/result"
