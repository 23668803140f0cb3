"""The leadership lease runner: drives `rackplane.core.leadership.LeaderLease` on a key-value
store (a `NatsKv` bucket, or anything with the same four calls) in one asyncio task.

One lease per (site, rack, daemon): key ``<site>.<rack>.<daemon>`` (`lease_key`). The owner id
is ``<instance>/<nonce>``: a fresh random nonce per process, so a restarted process never
mistakes its predecessor's record for its own tenure.

Use::

    runner = LeaseRunner(kv, lease_key("dc1", "r07", "valvey"), "a", timing)
    task = asyncio.create_task(runner.run())
    ...
    if runner.may_write(clock.monotonic()):   # right before each actuator write
        write(..., epoch=runner.epoch)

Every change of the lease (acquired, fenced, lost, released, a new holder seen) is logged once
(event ``leadership_<kind>``); request failures are counted (``failures``) and logged once per
run of failures, not every retry.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import Callable
from typing import Final, Protocol

from rackplane.clock import SYSTEM_CLOCK, Clock
from rackplane.core.leadership import (
    LeaderLease,
    LeadershipEvent,
    LeadershipStatus,
    LeaseTiming,
    Op,
    Step,
)
from rackplane.core.names import PAIR_INSTANCE_PATTERN
from rackplane.io.cancel import raise_if_cancelling
from rackplane.io.nats.errors import KvConflict, KvUnknown
from rackplane.log import get_logger

__all__ = ["KvStore", "LeaseRunner", "lease_key"]

log = get_logger(__name__)

_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
INSTANCE_PATTERN: Final = PAIR_INSTANCE_PATTERN
_INSTANCE = re.compile(INSTANCE_PATTERN)


class KvStore(Protocol):
    """What the runner needs of a store (`rackplane.io.nats.kv.NatsKv`'s contract: results,
    or ``KvConflict`` / ``KvUnknown``)."""

    async def read(self, key: str) -> tuple[int, bytes] | None: ...
    async def create(self, key: str, value: bytes) -> int: ...
    async def update(self, key: str, value: bytes, last: int) -> int: ...
    async def delete(self, key: str, last: int) -> None: ...
    async def put(self, key: str, value: bytes) -> int: ...


def lease_key(site: str, rack: str, daemon: str) -> str:
    """The lease key of one daemon kind on one rack: ``<site>.<rack>.<daemon>``.

    Raises:
        ValueError: a part is empty, longer than 64, or holds other than letters, digits,
            ``_`` or ``-`` (NATS subject tokens: no dots, no spaces).
    """
    for name, part in (("site", site), ("rack", rack), ("daemon", daemon)):
        if not _TOKEN.fullmatch(part):
            raise ValueError(f"{name} {part!r} must match {_TOKEN.pattern} for a lease key")
    return f"{site}.{rack}.{daemon}"


class LeaseRunner:
    """Runs one contender for one lease key (module docstring)."""

    def __init__(self, kv: KvStore, key: str, instance: str,
                 timing: LeaseTiming | None = None, *, clock: Clock = SYSTEM_CLOCK,
                 on_event: Callable[[LeadershipEvent], None] | None = None,
                 nonce: str | None = None) -> None:
        """
        Raises:
            ValueError: ``instance`` does not match `INSTANCE_PATTERN` (e.g. ``a``, ``b``).
        """
        if not _INSTANCE.fullmatch(instance):
            raise ValueError(f"instance {instance!r} must match {INSTANCE_PATTERN}")
        self.kv = kv
        self.key = key
        self.instance = instance
        self.owner = f"{instance}/{nonce or secrets.token_hex(6)}"
        self.lease = LeaderLease(self.owner, timing or LeaseTiming())
        self.clock = clock
        self.on_event = on_event
        self.failures = 0          # requests whose outcome was unknown (wraps never: int)
        #: the last renewal's latency (sent -> answered, s; None: none yet) and the largest
        self.renew_latency_s: float | None = None
        self.renew_latency_max_s = 0.0
        #: tenures this runner began (acquisitions: failovers and handovers to it)
        self.acquisitions = 0
        self._failing = False
        self._wake = asyncio.Event()
        self._release = False
        self._released = asyncio.Event()

    # --- what the daemon asks --------------------------------------------------------------

    def may_write(self, now_mono: float) -> bool:
        """True while this instance holds the lease and has not passed its renew deadline
        (`LeaderLease.may_write`): ask right before every actuator write."""
        return self.lease.may_write(now_mono)

    @property
    def epoch(self) -> int:
        """The current tenure's epoch (0 when not holding)."""
        return self.lease.epoch

    def status(self) -> LeadershipStatus:
        return self.lease.status(self.clock.monotonic())

    def hurry(self) -> None:
        """The holder released the lease (`LeaderLease.read_soon`): contend now, not at the
        next renewal period."""
        self.lease.read_soon(self.clock.monotonic())
        self._wake.set()

    async def release(self, timeout_s: float = 5.0) -> None:
        """Give the lease up (planned handover): fenced at once, the key deleted by
        compare-and-set when this instance holds it; the runner does not contend again for
        ``lease_s``. Returns when done, or after ``timeout_s`` (the deletion's outcome is then
        unknown: the other instance takes over after the lease)."""
        self._release = True
        self._wake.set()
        try:
            async with asyncio.timeout(timeout_s):
                await self._released.wait()
        except TimeoutError:
            log.warning("leadership_release_unconfirmed", key=self.key, timeout_s=timeout_s)

    # --- the task ------------------------------------------------------------------------

    async def run(self) -> None:
        """Drive the lease until cancelled. A cancellation nats-py swallowed (Python 3.11's
        ``asyncio.wait_for``, `rackplane.io.cancel`) is re-raised at the next step, so
        cancelling this task always ends it."""
        task = asyncio.current_task()
        while True:
            raise_if_cancelling(task)
            now = self.clock.monotonic()
            if self._release:
                step = self.lease.release(now)
                self._release = False
                if step is not None:
                    self._log_events()
                    await self._do(step)
                self._released.set()
                continue
            step = self.lease.step(now)
            self._log_events()
            if step.op is Op.WAIT:
                self._wake.clear()
                try:
                    async with asyncio.timeout(max(0.0, step.at_s - now)):
                        await self._wake.wait()
                except TimeoutError:
                    pass
                continue
            await self._do(step)
            self._log_events()

    async def _do(self, step: Step) -> None:
        renewal = step.op is Op.UPDATE and self.lease.epoch > 0
        sent_s = self.clock.monotonic()
        try:
            if step.op is Op.READ:
                got = await self.kv.read(self.key)
                self.lease.read_done(self.clock.monotonic(), *(got if got else (None, None)))
            elif step.op is Op.PROBE:
                rev = await self.kv.put(f"{self.key}.probe", self.owner.encode())
                self.lease.write_done(self.clock.monotonic(), rev)
            else:
                assert step.record is not None
                value = step.record.encode()
                if step.op is Op.CREATE:
                    rev = await self.kv.create(self.key, value)
                elif step.op is Op.UPDATE:
                    rev = await self.kv.update(self.key, value, step.last_revision)
                else:
                    await self.kv.delete(self.key, step.last_revision)
                    rev = step.last_revision
                now = self.clock.monotonic()
                if renewal:
                    self.renew_latency_s = now - sent_s
                    self.renew_latency_max_s = max(self.renew_latency_max_s, now - sent_s)
                self.lease.write_done(now, rev)
        except KvConflict:
            self.lease.write_refused(self.clock.monotonic())
        except KvUnknown as err:
            self.failures += 1
            if renewal:  # unanswered: it took at least this long
                self.renew_latency_s = self.clock.monotonic() - sent_s
                self.renew_latency_max_s = max(self.renew_latency_max_s, self.renew_latency_s)
            if not self._failing:
                log.warning("leadership_request_failed", key=self.key, owner=self.owner,
                            op=str(step.op), error=str(err))
            self._failing = True
            self.lease.failed(self.clock.monotonic(), str(err))
            return
        if self._failing:
            log.info("leadership_requests_answered", key=self.key, owner=self.owner,
                     failures=self.failures)
        self._failing = False

    def _log_events(self) -> None:
        for ev in self.lease.drain_events():
            if ev.kind == "acquired":
                self.acquisitions += 1
            level = log.warning if ev.kind in ("fenced", "lost", "bad_record",
                                               "epoch_regressed") else log.info
            level(f"leadership_{ev.kind}", key=self.key, owner=self.owner, epoch=ev.epoch,
                  detail=ev.detail)
            if self.on_event is not None:
                self.on_event(ev)
