"""A long database outage compressed in time (issue 7): 100,000 points written at full speed
while VictoriaMetrics is down, then it returns: 0 points lost, none twice; the spool depth and
the drain are visible in the writer's stats (what state/health and /metrics show).

100,000 points is ~28 h of valvey's supply-loop telemetry (one pid line a second) or ~4 min
of a 400-line/s racky. Drain rate is printed (measured, not asserted: the benchmarks own speed).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest

from harness.servers import VictoriaMetrics
from rackplane.clock import SystemClock
from rackplane.io.tsdb import TelemetryWriter
from rackplane.settings import SpoolSettings, TsdbSettings

pytestmark = [pytest.mark.servers]

TS = 1_767_225_600 * 10**9
N = 100_000


async def test_long_outage_at_high_rate_loses_nothing_and_shows_depth_and_drain(
    tmp_path: Path, victoria_private: VictoriaMetrics
) -> None:
    vm = victoria_private
    run = f"hr{uuid.uuid4().hex[:8]}"
    w = TelemetryWriter(
        TsdbSettings(url=vm.url, flush_interval_s=0.05, retry_initial_s=0.05, retry_max_s=0.5,
                     batch_lines=5000),
        SpoolSettings(directory=tmp_path / "spool", segment_bytes=2**20, max_bytes=2**26),
        identity_tags={"site": "lab", "row": "row1", "rack": run}, clock=SystemClock(),
    )
    task = asyncio.create_task(w.run())
    try:
        await asyncio.to_thread(vm.stop)
        for i in range(N):
            w.write("hrate", {}, {"seq": float(i)}, TS + i * 10**6)
            if i % 5000 == 4999:
                await asyncio.sleep(0)  # let the writer append, as the daemons' loop does
        assert w.flush_to_spool() == 0
        t_wait = time.monotonic()
        while w.stats.retries < 1:
            assert time.monotonic() - t_wait < 30, "no send attempt during the outage"
            await asyncio.sleep(0.05)
        during = w.stats
        assert during.depth_lines == N and during.sent == 0 and during.dropped == 0
        assert during.segments > 1 and during.last_error  # visible: depth, segments, error
        await asyncio.to_thread(vm.start)
        t0 = time.monotonic()
        depths: list[int] = []
        deadline = t0 + 120
        while w.stats.sent < N:
            assert time.monotonic() < deadline, f"drain stuck at {w.stats}"
            depths.append(w.stats.depth_lines)
            await asyncio.sleep(0.05)
        drain_s = time.monotonic() - t0
        print(f"durability.outage_drain_lines_per_s = {N / drain_s:,.0f} ({drain_s:.1f} s)")
        assert depths and depths[0] == N and min(depths) < N  # the drain was visible
    finally:
        await w.close(budget_s=2)
        await task
    after = w.stats
    assert (after.depth_lines, after.dropped, after.rejected, after.sent) == (0, 0, 0, N)
    series = await asyncio.to_thread(
        vm.wait_export, f'{{__name__="hrate_seq",rack="{run}"}}', N, 60.0)
    values = sorted(v for s in series for v in s["values"])
    assert values == [float(i) for i in range(N)]  # 0 lost, none twice
