"""racky's self-metrics and telemetry alarms wired as docs/OPERATIONS.md §5 says (issue 7):
the snapshot in ``state/health.self`` after a tick, and ``telemetry_spool_failed`` raised from
the writer's real stats when the spool cannot be opened."""

from __future__ import annotations

from pathlib import Path

from rackplane.clock import FakeClock
from rackplane.io.selfmetrics import snapshot_fields
from racky.app import Racky
from racky.config import RackyConfig

WALL0 = 1_800_000_000 * 10**9


def _racky(tmp_path: Path, spool_dir: Path) -> Racky:
    cfg = RackyConfig.model_validate({
        "lifecycle": {"state_file": str(tmp_path / "racky-state.json")},
        "spool": {"directory": str(spool_dir)},
    })
    return Racky(cfg, clock=FakeClock(start_mono=1000.0, start_wall_ns=WALL0))


async def test_health_carries_the_self_metrics_and_no_telemetry_alarm(tmp_path: Path) -> None:
    r = _racky(tmp_path, tmp_path / "spool")
    assert r.health()["self"] == {}  # before the first tick
    r.run_tick(1000.0)
    snap = r.health()["self"]
    assert set(snap) == set(snapshot_fields())
    assert snap["spool_ok"] is True and snap["pv_age_s"] is None  # no shelf reported yet
    assert not [a for a in r.core.bank.active() if a.id.startswith("telemetry_")]
    assert r.selfmetrics.points_written == 1  # measurement "daemon" into the writer


async def test_an_unopenable_spool_raises_telemetry_spool_failed(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")  # the spool directory is a file: the spool cannot open
    r = _racky(tmp_path, blocker / "spool")
    assert not r.writer.stats.spool_ok
    r.run_tick(1000.0)
    ids = [a.id for a in r.core.bank.active()]
    assert "telemetry_spool_failed" in ids
    assert r.health()["self"]["spool_ok"] is False
