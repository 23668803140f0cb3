"""`rackplane.io.service`: an owner task being cancelled is never restarted by `supervised`,
even when its clean-up raises; `run_daemon` runs the daemon with the short GIL switch interval
and puts the interpreter's back afterwards."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest

from rackplane.io.service import GIL_SWITCH_INTERVAL_S, run_daemon, supervised


class _Log:
    def __init__(self) -> None:
        self.events: list[str] = []

    def error(self, event: str, **_: Any) -> None:
        self.events.append(event)


async def test_a_task_whose_clean_up_fails_on_cancel_is_not_restarted() -> None:
    starts = 0

    async def loop_with_a_failing_finally() -> None:
        nonlocal starts
        starts += 1
        try:
            await asyncio.sleep(3600)
        finally:
            raise OSError("close failed")  # e.g. a source's close() raising during the stop

    log = _Log()
    task = asyncio.create_task(supervised("read", loop_with_a_failing_finally, log,
                                          restart_delay_s=0.0)())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 2.0)
    assert starts == 1
    assert log.events == ["task_failed_while_cancelled"]


async def test_a_crash_outside_a_cancel_is_still_restarted() -> None:
    starts = 0

    async def crashes_once() -> None:
        nonlocal starts
        starts += 1
        if starts == 1:
            raise RuntimeError("bug")
        await asyncio.sleep(3600)

    log = _Log()
    task = asyncio.create_task(supervised("read", crashes_once, log, restart_delay_s=0.0)())
    for _ in range(100):
        if starts == 2:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert starts == 2 and log.events == ["task_crashed_restarting"]


async def test_run_daemon_shortens_the_gil_switch_interval_while_it_runs() -> None:
    before = sys.getswitchinterval()
    seen: list[float] = []

    class Dummy:
        async def run(self, stop: asyncio.Event) -> None:
            seen.append(sys.getswitchinterval())

        def reload(self) -> None:
            pass

    assert await run_daemon(Dummy(), "valvey", freeze_gc=False) == 0
    assert seen == [pytest.approx(GIL_SWITCH_INTERVAL_S)]
    assert before > GIL_SWITCH_INTERVAL_S
    assert sys.getswitchinterval() == pytest.approx(before)
