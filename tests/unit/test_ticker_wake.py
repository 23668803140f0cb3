"""The ticker's wake (`rackplane.io.service.run_ticker` ``wake``, the frame's
`rackplane.daemon.DaemonFrame.wake_tick`): an input that cannot wait a period runs the next
tick now; the schedule goes on one period after it; a flood of wakes cannot make it spin.
Real time on the loop (periods of 0.4 s; tolerances for a loaded host)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools

from rackplane.clock import SYSTEM_CLOCK
from rackplane.io.service import WAKE_MIN_GAP_S, TickStats, run_ticker

PERIOD_S = 0.4
SLACK_S = 0.08  # a loaded 2-core host's scheduling noise


async def _ticks(wakes_at: list[float], until_s: float) -> tuple[list[float], TickStats]:
    """Tick times (s from the start) with ``wake`` set at ``wakes_at`` (s from the start)."""
    wake = asyncio.Event()
    stats = TickStats()
    t0 = SYSTEM_CLOCK.monotonic()
    seen: list[float] = []
    task = asyncio.create_task(run_ticker(PERIOD_S, lambda now: seen.append(now - t0),
                                          SYSTEM_CLOCK, stats, wake=wake))
    for at in wakes_at:
        await asyncio.sleep(max(0.0, at - (SYSTEM_CLOCK.monotonic() - t0)))
        wake.set()
    await asyncio.sleep(max(0.0, until_s - (SYSTEM_CLOCK.monotonic() - t0)))
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return seen, stats


async def test_a_wake_runs_the_next_tick_now_and_the_schedule_goes_on_after_it() -> None:
    seen, stats = await _ticks([0.5], 1.5)  # ticks at 0, 0.4; woken at 0.5 (due 0.8)
    early = next(t for t in seen if t > PERIOD_S + 0.05)
    assert 0.5 - 0.01 <= early <= 0.5 + SLACK_S, seen  # now, not at 0.8
    after = [t for t in seen if t > early]
    assert after[0] - early >= PERIOD_S - 0.01  # a period after the early one: not at 0.8
    assert after[0] - early <= PERIOD_S + SLACK_S, seen
    assert stats.woken == 1
    assert all(b - a >= 0.09 for a, b in itertools.pairwise(seen)), seen


async def test_wakes_in_a_flood_never_make_the_tick_spin() -> None:
    flood = [0.45 + 0.005 * i for i in range(40)]  # 40 wakes in 0.2 s
    seen, stats = await _ticks(flood, 1.2)
    gaps = [b - a for a, b in itertools.pairwise(seen)]
    assert min(gaps) >= WAKE_MIN_GAP_S - 0.005, seen
    # at most one early tick per minimum gap over the flood (and the regular ones)
    assert stats.woken <= 0.2 / WAKE_MIN_GAP_S + 1, (stats.woken, seen)
    assert len(seen) <= 1.2 / PERIOD_S + 0.2 / WAKE_MIN_GAP_S + 2, seen


async def test_without_a_wake_the_fixed_schedule_is_unchanged() -> None:
    seen, stats = await _ticks([], 1.3)
    assert len(seen) == 4 and stats.woken == 0, seen
    for k, t in enumerate(seen):
        assert abs(t - k * PERIOD_S) <= SLACK_S, seen
