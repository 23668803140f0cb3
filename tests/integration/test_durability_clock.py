"""Wall-clock steps and an unsynchronised clock at boot (issue 7, FIELD-CASES BR-16).

Control timing (the ticker, the watchdog pings, backoff) runs on monotonic time; the wall
clock gives timestamps only. A clock whose wall time steps (NTP, an operator) or starts at
1970 (no RTC, NTP not yet synchronised) must never change when the control tick runs; lines
stamped before the clock synchronised are held and given their real time once it has, never
written as 1970 and never dropped.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

from rackplane.io.service import Notifier, TickStats, run_ticker
from rackplane.io.spool import Spool
from rackplane.io.tsdb import TS_MIN_NS, TelemetryWriter
from rackplane.settings import SpoolSettings, TsdbSettings


class SteppingClock:
    """Real monotonic time; a wall clock the test steps at will."""

    def __init__(self, wall_ns: int):
        self.wall = wall_ns

    def monotonic(self) -> float:
        return time.monotonic()

    def wall_ns(self) -> int:
        return self.wall


async def test_wall_clock_steps_never_move_the_control_tick_or_the_watchdog() -> None:
    clock = SteppingClock(1_767_225_600 * 10**9)
    notifier = Notifier(clock, environ={"NOTIFY_SOCKET": "@rp-none-test",
                                        "WATCHDOG_USEC": "40000"})  # ping every 10 ms
    stats = TickStats()
    seen: list[float] = []
    done = asyncio.Event()

    def step(now: float) -> None:
        seen.append(now)
        notifier.tick()
        if len(seen) == 10:
            clock.wall -= 3600 * 10**9  # back one hour
        if len(seen) == 20:
            clock.wall += 7200 * 10**9  # forward two hours
        if len(seen) == 40:
            done.set()

    task = asyncio.create_task(run_ticker(0.01, step, clock, stats))
    await asyncio.wait_for(done.wait(), 30)  # ticks kept coming through both steps
    task.cancel()
    # The schedule and the `now` handed to control are monotonic time, whatever the wall did.
    assert all(b > a for a, b in itertools.pairwise(seen))
    assert all(abs(t - time.monotonic()) < 60 for t in seen)
    assert notifier.pings >= 2


async def test_unsynchronised_boot_clock_lines_get_their_real_time_once_synced(
    tmp_path: Path,
) -> None:
    """Lines written before NTP synchronised are held (never written as 1970, issue 14 item 8)
    and, once the clock is in the window, stamped with the time they really had: the
    synchronised wall time minus their monotonic age."""
    clock = SteppingClock(30 * 10**9)  # 1970-01-01T00:00:30Z: no RTC, NTP not synced yet
    w = TelemetryWriter(TsdbSettings(), SpoolSettings(directory=tmp_path / "spool"),
                        identity_tags={"site": "lab", "rack": "r1"}, clock=clock)
    t0 = time.monotonic()
    for i in range(5):
        w.write("pid", {"loop": "supply_temp"}, {"setpoint_c": 45.0, "seq": float(i)})
    clock.wall = 1_767_225_600 * 10**9  # NTP synchronised: the clock steps forward 56 years
    for i in range(5, 8):
        w.write("pid", {"loop": "supply_temp"}, {"setpoint_c": 45.0, "seq": float(i)})
    w.flush_to_spool()
    st = w.stats
    assert st.ts_out_of_window == 5 and st.spooled == 8 and st.dropped == 0
    assert st.ts_restamped == 5 and st.ts_held == 0
    await w.close(budget_s=0)
    with Spool(tmp_path / "spool", readonly=True, cursor_file="test-cursor") as sp:
        lines, _ = sp.read(100)
    stamps = [int(ln.rsplit(" ", 1)[1]) for ln in lines]
    assert all(t >= TS_MIN_NS for t in stamps)  # none in 1970
    age_ns = (time.monotonic() - t0) * 1e9 + 1e9
    assert all(clock.wall - age_ns <= t <= clock.wall for t in stamps[:5])
