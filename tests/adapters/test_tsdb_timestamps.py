"""A timestamp outside the sanity window is never written as it is (issue 14 item 8).

Every path a line takes into the spool or the database: the writer's ``write`` (the daemons'
lines, samples, self-metrics), lines read back from a spool an older version wrote (the
writer's drain), and ``rackctl replay``. Checked against the real VictoriaMetrics: a point
stamped in seconds where ns are expected must be stored at its arrival time, not 1970.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from harness.servers import VictoriaMetrics
from rackplane.clock import FakeClock
from rackplane.io.selfmetrics import SelfMetrics, counter_fields
from rackplane.io.service import TickStats
from rackplane.io.spool import Spool
from rackplane.io.tsdb import line_timestamp, replay, with_timestamp
from rackplane.settings import MetricsSettings
from tests.adapters.test_tsdb import TS, make_writer, uid

# The kind: a time in the wrong unit or far from now, each outside 2020..2100.
BAD_STAMPS = {
    "seconds": 1_767_225_600,
    "milliseconds": 1_767_225_600_000,
    "microseconds": 1_767_225_600_000_000,
    "ns_times_1000": 1_767_225_600 * 10**12,  # past 2100
    "before_2020": 1_500_000_000 * 10**9,
    "negative": -5,
}


def _spool_stamps(spool_dir: Path) -> list[int | None]:
    with Spool(spool_dir, readonly=True, cursor_file="test-cursor") as sp:
        lines, _ = sp.read(1000)
    return [line_timestamp(ln) for ln in lines]


def test_line_timestamp_helpers_handle_every_line_shape() -> None:
    assert line_timestamp("m,t=a f=1 123") == 123
    assert line_timestamp("m,t=a f=1") is None
    assert line_timestamp('m s="a 123"') is None  # a string with a space and digits
    assert line_timestamp('m s="a 1" 5') == 5
    assert line_timestamp("m f=12i") is None
    assert with_timestamp("m f=1 123", 9) == "m f=1 9"
    assert with_timestamp("m f=1", 9) == "m f=1 9"


def test_out_of_window_timestamps_are_restamped_on_arrival_and_counted(tmp_path: Path) -> None:
    clock = FakeClock()
    w = make_writer(tmp_path, None, clock=clock)
    arrivals = []
    with capture_logs() as logs:
        for i, ts in enumerate(BAD_STAMPS.values()):
            clock.advance(1.0)
            arrivals.append(clock.wall_ns())
            assert w.write("cdu", {}, {"seq": float(i)}, ts)
        clock.advance(1.0)
        w.write("cdu", {}, {"seq": 99.0}, TS)  # in the window: kept as given
    w.flush_to_spool()
    assert _spool_stamps(tmp_path / "spool") == [*arrivals, TS]
    st = w.stats
    assert (st.ts_out_of_window, st.ts_restamped, st.ts_dropped, st.dropped) == (6, 6, 0, 0)
    events = [e["event"] for e in logs]
    assert events.count("telemetry_timestamp_outside_window") == 1  # once per change
    assert events.count("telemetry_timestamp_back_in_window") == 1
    (warn,) = [e for e in logs if e["event"] == "telemetry_timestamp_outside_window"]
    assert warn["action"] == "restamp"
    # The count reaches the self-metrics (a counter).
    sm = SelfMetrics("valvey", MetricsSettings(), clock=clock)
    assert sm.collect(clock.monotonic(), tick_stats=TickStats(),
                      writer=w).telemetry_ts_out_of_window_lines == 6
    assert "telemetry_ts_out_of_window_lines" in counter_fields()


def test_drop_policy_drops_and_counts(tmp_path: Path) -> None:
    w = make_writer(tmp_path, None, ts_out_of_window="drop")
    for ts in BAD_STAMPS.values():
        assert not w.write("cdu", {}, {"x": 1.0}, ts)
    assert w.write("cdu", {}, {"x": 2.0}, TS)
    w.flush_to_spool()
    assert _spool_stamps(tmp_path / "spool") == [TS]
    st = w.stats
    assert (st.ts_out_of_window, st.ts_dropped, st.ts_restamped) == (6, 6, 0)
    assert st.dropped == 6  # a drop is a drop: counted with the others


async def test_unsynchronised_clock_lines_are_held_then_given_their_real_time(
    tmp_path: Path,
) -> None:
    clock = FakeClock(start_wall_ns=30 * 10**9)  # 1970: no RTC, NTP not synced yet
    w = make_writer(tmp_path, None, clock=clock)
    for i in range(3):
        w.write("pid", {}, {"seq": float(i)})  # stamped by the clock itself
        clock.advance(2.0)
    w.flush_to_spool()
    assert w.stats.ts_held == 3 and w.stats.spooled == 0
    clock.step_wall(1_767_225_600 - 36)  # NTP: the wall clock steps to 2026-01-01T00:00:00
    now = clock.wall_ns()
    w.write("pid", {}, {"seq": 3.0})
    w.flush_to_spool()
    # Each held line gets the time it really had: now minus its monotonic age.
    assert _spool_stamps(tmp_path / "spool") == [now - 6 * 10**9, now - 4 * 10**9,
                                                 now - 2 * 10**9, now]
    st = w.stats
    assert (st.ts_out_of_window, st.ts_restamped, st.ts_held, st.dropped) == (3, 3, 0, 0)
    await w.close(budget_s=0)


async def test_held_lines_are_dropped_and_counted_if_the_clock_never_syncs(
    tmp_path: Path,
) -> None:
    w = make_writer(tmp_path, None, clock=FakeClock(start_wall_ns=30 * 10**9),
                    memory_max_lines=100)
    for i in range(150):
        w.write("pid", {}, {"seq": float(i)})
    assert w.stats.ts_held == 100 and w.stats.ts_dropped == 50  # bounded
    await w.close(budget_s=0)
    assert w.stats.ts_dropped == 150 and w.stats.dropped == 150
    assert _spool_stamps(tmp_path / "spool") == []  # never written as 1970


async def test_seconds_for_ns_lands_at_arrival_in_victoria(
    tmp_path: Path, victoria: VictoriaMetrics
) -> None:
    rack = uid("tsw")
    clock = FakeClock()
    w = make_writer(tmp_path, victoria.url, identity={"site": "lab", "rack": rack}, clock=clock)
    w.write("tsw", {}, {"v": 1.0}, 1_767_225_600)  # seconds where ns are expected
    await w.close(budget_s=10)
    (s,) = await asyncio.to_thread(victoria.wait_export, f'{{__name__="tsw_v",rack="{rack}"}}')
    assert s["timestamps"] == [clock.wall_ns() // 10**6]  # not 1970-01-01


def _old_spool(directory: Path, rack: str) -> None:
    """A spool as an older version wrote it: lines with timestamps in the wrong unit."""
    with Spool(directory) as sp:
        sp.append([f"tso,rack={rack} v=1 1767225600",  # seconds
                   f"tso,rack={rack} v=2 1767225600000",  # ms
                   f"tso,rack={rack} v=3 {TS}"])
        sp.fsync()


async def test_old_spool_lines_are_restamped_when_the_writer_drains_them(
    tmp_path: Path, victoria: VictoriaMetrics
) -> None:
    rack = uid("tso")
    _old_spool(tmp_path / "spool", rack)
    clock = FakeClock(start_wall_ns=TS + 3600 * 10**9)
    w = make_writer(tmp_path, victoria.url, identity={"site": "lab", "rack": rack}, clock=clock)
    task = asyncio.create_task(w.run())
    await asyncio.to_thread(victoria.wait_export, f'{{__name__="tso_v",rack="{rack}"}}', 3)
    await w.close(budget_s=5)
    task.cancel()
    (s,) = victoria.export(f'{{__name__="tso_v",rack="{rack}"}}')
    got = dict(zip(s["values"], s["timestamps"], strict=True))
    arrival_ms = clock.wall_ns() // 10**6
    assert got == {1: arrival_ms, 2: arrival_ms, 3: TS // 10**6}
    assert w.stats.ts_restamped == 2


@pytest.mark.parametrize("policy", ["restamp", "drop"])
async def test_replay_never_sends_an_out_of_window_timestamp(
    tmp_path: Path, victoria: VictoriaMetrics, policy: str
) -> None:
    from rackplane.settings import TsdbSettings

    rack = uid(f"tsr{policy}")
    _old_spool(tmp_path / "spool", rack)
    clock = FakeClock(start_wall_ns=TS + 7200 * 10**9)
    res = await replay(tmp_path / "spool", TsdbSettings(url=victoria.url,
                                                        ts_out_of_window=policy),
                       clock=clock)
    assert res.complete
    (s,) = await asyncio.to_thread(victoria.wait_export,
                                   f'{{__name__="tso_v",rack="{rack}"}}', 3 if policy ==
                                   "restamp" else 1)
    got = dict(zip(s["values"], s["timestamps"], strict=True))
    if policy == "restamp":
        assert got == {1: clock.wall_ns() // 10**6, 2: clock.wall_ns() // 10**6,
                       3: TS // 10**6}
        assert (res.ts_restamped, res.ts_dropped, res.sent_lines) == (2, 0, 3)
    else:
        assert got == {3: TS // 10**6}
        assert (res.ts_restamped, res.ts_dropped, res.sent_lines) == (0, 2, 1)
