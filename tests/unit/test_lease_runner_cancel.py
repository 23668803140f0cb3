"""The lease runner ends when cancelled even when its KV library swallowed the cancellation
(Python 3.11's ``asyncio.wait_for``, inside nats-py's requests: CPython gh-86296). A lease
test once hung 300 s in CI on exactly this: the runner kept renewing after ``cancel()``."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from rackplane.core.leadership import LeaseTiming
from rackplane.io.nats.lease import LeaseRunner, lease_key

FAST = LeaseTiming(lease_s=3.0, renew_every_s=0.5, renew_deadline_s=2.0, retry_every_s=0.2,
                   election_max_s=0.5)


class SwallowingKv:
    """An in-memory KV whose every write swallows a cancellation that arrives while it is
    answering, the way ``wait_for`` does on 3.11 when the reply and the cancel coincide."""

    def __init__(self) -> None:
        self.rev = 0
        self.data: dict[str, tuple[int, bytes]] = {}
        self.writes = 0

    async def _answer(self) -> None:
        # the reply came in the same iteration: the result is returned, the cancel is not raised
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.05)

    async def _store(self, key: str, value: bytes) -> int:
        await self._answer()
        self.writes += 1
        self.rev += 1
        self.data[key] = (self.rev, value)
        return self.rev

    async def read(self, key: str) -> tuple[int, bytes] | None:
        await self._answer()
        return self.data.get(key)

    async def create(self, key: str, value: bytes) -> int:
        return await self._store(key, value)

    async def update(self, key: str, value: bytes, last: int) -> int:
        return await self._store(key, value)

    async def put(self, key: str, value: bytes) -> int:
        return await self._store(key, value)

    async def delete(self, key: str, last: int) -> None:
        await self._answer()
        self.data.pop(key, None)


@pytest.mark.parametrize("after_s", [0.0, 0.03, 0.3, 1.1])
async def test_a_cancel_the_library_swallowed_still_ends_the_runner(after_s: float) -> None:
    kv = SwallowingKv()
    runner = LeaseRunner(kv, lease_key("site1", "r03", "racky"), "a", FAST)
    task = asyncio.create_task(runner.run())
    await asyncio.sleep(after_s)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=5.0)
    assert task in done, "the runner ignored its cancellation"
    assert task.cancelled()
    writes = kv.writes
    await asyncio.sleep(0.6)  # more than one renew period: nothing writes any more
    assert kv.writes == writes


def test_names_with_a_trailing_newline_are_refused() -> None:
    with pytest.raises(ValueError):
        lease_key("site1\n", "r03", "racky")
    with pytest.raises(ValueError):
        LeaseRunner(SwallowingKv(), "k", "a\n", FAST)
