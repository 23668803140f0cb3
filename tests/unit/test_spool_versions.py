"""Spool format versions on upgrade and rollback (issue 7): `check_format` reports a spool this
build cannot read before the daemon starts (for --check-config), changing nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rackplane.errors import SpoolError
from rackplane.io.spool import CURSOR_FILE, Spool, check_format, segment_name

LINES = [f"m,rack=r1 v={i} {1_767_225_600_000_000_000 + i}" for i in range(5)]


def _snapshot(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_missing_empty_and_current_spools_pass(tmp_path: Path) -> None:
    check_format(tmp_path / "none")
    check_format(tmp_path)
    with Spool(tmp_path, max_bytes=2**20, segment_bytes=2**16) as sp:
        sp.append(LINES)
        _, cur = sp.read(2)
        sp.ack(cur)
    before = _snapshot(tmp_path)
    check_format(tmp_path)
    assert _snapshot(tmp_path) == before  # nothing changed, no cursor moved


def test_works_while_the_daemon_holds_the_spool(tmp_path: Path) -> None:
    with Spool(tmp_path, max_bytes=2**20, segment_bytes=2**16) as sp:
        sp.append(LINES)
        check_format(tmp_path)  # no lock taken: --check-config beside a running daemon


def test_rollback_newer_segment_is_refused_naming_both_versions(tmp_path: Path) -> None:
    (tmp_path / segment_name(1)).write_bytes(b"# rackplane-spool v2\nm v=1 1\n")
    with pytest.raises(SpoolError, match=r"spool format v2; this rackplane reads v1 only"):
        check_format(tmp_path)


def test_rollback_newer_cursor_is_refused(tmp_path: Path) -> None:
    with Spool(tmp_path, max_bytes=2**20, segment_bytes=2**16) as sp:
        sp.append(LINES)
    rec = json.dumps({"format": "rackplane-spool-cursor", "version": 2, "seq": 9})
    (tmp_path / CURSOR_FILE).write_bytes(rec.encode().ljust(511) + b"\n")
    with pytest.raises(SpoolError, match=r"v2 cursor; this rackplane reads .* v1 only"):
        check_format(tmp_path)


def test_foreign_segment_is_refused_and_torn_one_passes(tmp_path: Path) -> None:
    (tmp_path / segment_name(1)).write_bytes(b"# rackplane-sp")  # torn at creation: repaired
    check_format(tmp_path)
    (tmp_path / segment_name(2)).write_bytes(b"m v=1 1\n")
    with pytest.raises(SpoolError, match="not a rackplane spool segment"):
        check_format(tmp_path)


def test_config_check_names_the_key(tmp_path: Path) -> None:
    from rackplane.errors import ConfigError
    from rackplane.io.spool import check_spool_config

    check_spool_config("spool.directory", tmp_path)
    (tmp_path / segment_name(1)).write_bytes(b"# rackplane-spool v2\nm v=1 1\n")
    with pytest.raises(ConfigError, match=r"spool.directory: .*spool format v2") as e:
        check_spool_config("spool.directory", tmp_path)
    assert e.value.problems and e.value.problems[0].startswith("spool.directory: ")
