"""A redundant pair's state sync and planned handover over the KV store (issue 15; the pure
rules are `rackplane.core.pair_sync`'s, docs/OPERATIONS.md §6).

`PairSync` is run by the daemon frame (`rackplane.daemon.DaemonFrame`) as the task
``pair_sync`` beside the leadership lease, on the same `NatsKv` connection, key
``<site>.<rack>.<daemon>.sync``:

- **active**: the tick hands it the record when one is due (`tick`: on change at most every
  ``sync_min_interval_s``, at least every ``renew_every_s``); the task writes it (a plain put,
  one at a time, the newest wins). A write that fails is counted (``puts_failed``) and logged
  once per run of failures; the next due record goes out.
- **standby**: the store pushes every record as it is written (`NatsKv.subscribe_key`: no
  guarantee, for latency), and the task also reads the key every ``sync_min_interval_s``
  (the truth after a lost push); it lays a record that
  `SyncFollower.offer` accepts over its own state (`DaemonFrame.apply_sync`: the command
  router's applied request-ids, the output leases, the daemon's state). A record marked
  ``released`` (the active's handover), or the lease key's deletion pushed by the store,
  makes its lease runner contend at once (`LeaseRunner.hurry`).
- **takeover**: a new tenure's first act is one read (**catch-up**) before the frame lets the
  instance act as active (`ready`): a takeover continues from the newest record. When the
  store does not answer, the instance goes on with the state it has (logged).
- **handover** (`handover`): the active writes a last record, marked released and carrying the
  ``handover`` command's own request-id and reply (no other record is written meanwhile),
  waits for it to be confirmed (bounded by twice ``request_timeout_s``), then releases its
  lease (`LeaseRunner.release`): fenced at once.

Errors: none raised out of the task (store failures are counted and logged); ``handover``
refuses with ``not_active`` (`rackplane.core.pair_sync.NOT_ACTIVE`) on an instance that does
not hold the lease, and with ``unavailable`` when the store does not confirm the last record
(nothing released then: the active keeps writing).
"""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING, Any

from rackplane.core.envelope import CommandContext
from rackplane.core.pair_sync import (
    NOT_ACTIVE,
    HandoverArgs,
    SyncFollower,
    SyncPacer,
    SyncRecord,
)
from rackplane.errors import CommandError
from rackplane.io.cancel import raise_if_cancelling
from rackplane.io.nats.errors import KvConflict, KvUnknown
from rackplane.leadership_settings import LeadershipSettings

if TYPE_CHECKING:
    from rackplane.daemon import DaemonFrame
    from rackplane.io.nats.lease import KvStore, LeaseRunner

__all__ = ["UNAVAILABLE", "PairSync", "sync_key"]

UNAVAILABLE = "unavailable"
"""Refusal code of ``handover`` when the KV store did not confirm the last record."""


def sync_key(lease_key: str) -> str:
    """The sync record's key beside the lease key ``<site>.<rack>.<daemon>``."""
    return f"{lease_key}.sync"


class PairSync:
    """One instance's side of the state sync (module docstring).

    Args:
        frame: the daemon (its `sync_record_parts` and `apply_sync`, its clock and log).
        ls: the ``[leadership]`` settings.
    """

    def __init__(self, frame: DaemonFrame[Any], ls: LeadershipSettings) -> None:
        self.frame = frame
        self.ls = ls
        self.log = frame.log
        self.follower = SyncFollower()
        self.pacer = SyncPacer(ls.sync_min_interval_s, ls.renew_every_s)
        self.kv: KvStore | None = None
        self.runner: LeaseRunner | None = None
        self.key = ""
        self.seq = 0
        self.caught_up_epoch = 0
        self.puts_ok = 0
        self.puts_failed = 0
        self.reads_failed = 0
        self.bad_records = 0
        self._due: SyncRecord | None = None
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._failing: str | None = None
        self._handing_over = False  # no record but the handover's own meanwhile
        self._subscribed = False
        self._next_check_s = -math.inf

    def attach(self, kv: KvStore, runner: LeaseRunner) -> None:
        """The lease task's store connection and runner (again after its restart)."""
        self.kv, self.runner = kv, runner
        self.key = sync_key(runner.key)
        self._subscribed = False
        self._wake.set()

    async def _subscribe(self) -> None:
        """Where the store pushes writes (`rackplane.io.nats.kv.NatsKv.subscribe_key`):
        the sync record (applied as a read one would be) and the lease key (a deletion, the
        active's release, makes the runner contend at once). Reads go on beside it."""
        self._subscribed = True
        sub = getattr(self.kv, "subscribe_key", None)
        if sub is None or self.runner is None:
            return
        try:
            await sub(self.key, self._pushed_record)
            await sub(self.runner.key, self._pushed_lease)
        except KvUnknown as err:
            self._subscribed = False
            self._fail("subscribe", err)

    def _pushed_record(self, raw: bytes, deleted: bool) -> None:
        if not deleted and raw and self.frame.controller_epoch == 0:
            self._offer(raw, None, catch_up=False)

    def _pushed_lease(self, raw: bytes, deleted: bool) -> None:
        del raw
        if deleted and self.frame.controller_epoch == 0 and self.runner is not None:
            self.log.info("pair_lease_release_seen", key=self.runner.key)
            self.runner.hurry()

    def ready(self, epoch: int) -> bool:
        """May the tenure ``epoch`` act as active: its catch-up read is done."""
        return epoch > 0 and self.caught_up_epoch == epoch

    def record(self, epoch: int, *, released: bool = False,
               extra_commands: tuple[dict[str, Any], ...] = ()) -> SyncRecord:
        """The record of the state now (``seq`` not yet assigned: 0 until written)."""
        commands, leases, state = self.frame.sync_record_parts(self.ls.sync_dedup_entries)
        return SyncRecord(epoch, 1, self.runner.owner if self.runner else "?",
                          tuple(commands) + extra_commands, tuple(leases), state, released)

    def tick(self, now: float) -> None:
        """From the tick of an active instance: queue the record when one is due."""
        epoch = self.frame.controller_epoch
        if (self.runner is None or not self.ready(epoch) or self._handing_over
                or now < self._next_check_s):
            return
        self._next_check_s = now + self.ls.sync_min_interval_s  # the record is built this often
        rec = self.record(epoch)
        content = rec.content()
        if self.pacer.due(now, content):
            self.pacer.written(now, content)
            self._due = rec
            self._wake.set()

    # --- the task --------------------------------------------------------------------------

    async def run(self) -> None:
        """Until cancelled: write due records while active, read while standby, catch up at
        the start of each tenure."""
        task = asyncio.current_task()
        while True:
            raise_if_cancelling(task)
            epoch = self.frame.controller_epoch
            if self.kv is None or self.runner is None:
                pass
            elif not self._subscribed:
                await self._subscribe()
                continue
            elif epoch > 0 and self.caught_up_epoch != epoch:
                ok = await self._read(catch_up=True)
                self.caught_up_epoch = epoch
                self.pacer.reset()
                self._due = None  # never a record of an earlier tenure
                self._next_check_s = -math.inf  # the tenure's first record at once
                self.log.info("pair_sync_caught_up", epoch=epoch, read=ok,
                              synced_seq=self.follower.last_seq,
                              synced_epoch=self.follower.newest_epoch)
                continue
            elif epoch > 0:
                if self._due is not None and not self._handing_over:
                    rec, self._due = self._due, None
                    if rec.epoch == epoch:
                        await self._put(rec)
                    continue
            else:
                await self._read(catch_up=False)
            self._wake.clear()
            try:
                async with asyncio.timeout(self.ls.sync_min_interval_s):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def _put(self, rec: SyncRecord) -> bool:
        assert self.kv is not None
        async with self._lock:
            self.seq += 1
            rec = SyncRecord(rec.epoch, self.seq, rec.owner, rec.commands, rec.leases,
                             rec.state, rec.released)
            try:
                await self.kv.put(self.key, rec.encode())
            except (KvUnknown, KvConflict) as err:
                self.puts_failed += 1
                self._fail("put", err)
                return False
        self.puts_ok += 1
        self._recovered()
        return True

    async def _read(self, *, catch_up: bool) -> bool:
        assert self.kv is not None
        try:
            got = await self.kv.read(self.key)
        except KvUnknown as err:
            self.reads_failed += 1
            self._fail("read", err)
            return False
        self._recovered()
        if got is not None:
            self._offer(got[1], got[0], catch_up=catch_up)
        return True

    def _offer(self, raw: bytes, revision: int | None, *, catch_up: bool) -> None:
        try:
            rec = SyncRecord.decode(raw)
        except ValueError as err:
            self.bad_records += 1
            self.log.warning("pair_sync_bad_record", key=self.key, revision=revision,
                             error=str(err))
            return
        now = self.frame.clock.monotonic()
        if self.follower.offer(rec, now):
            self.frame.apply_sync(rec, now)
            if rec.released and not catch_up and self.runner is not None:
                self.log.info("pair_sync_handover_seen", epoch=rec.epoch, owner=rec.owner)
                self.runner.hurry()

    def _fail(self, op: str, err: Exception) -> None:
        if self._failing != op:
            self._failing = op
            self.log.warning("pair_sync_failed", op=op, key=self.key, error=str(err),
                             note="the standby keeps its last synced state")

    def _recovered(self) -> None:
        if self._failing is not None:
            self._failing = None
            self.log.info("pair_sync_recovered", key=self.key)

    # --- the handover verb ---------------------------------------------------------------------

    async def handover(self, args: HandoverArgs, ctx: CommandContext) -> dict[str, Any]:
        """``handover`` (module docstring). The reply's state: ``released_epoch``,
        ``instance``.

        Raises:
            CommandError: ``not_active``; ``unavailable`` (the last record not confirmed:
                nothing released).
        """
        runner = self.runner
        epoch = self.frame.controller_epoch
        if runner is None or not self.frame.may_write(self.frame.clock.monotonic()) or (
                not self.ready(epoch)):
            raise CommandError(NOT_ACTIVE, "this instance does not hold the lease: send "
                               "handover to the active instance")
        state = {"released_epoch": epoch, "instance": self.ls.instance}
        reply = {"request_id": ctx.request_id, "ok": True, "error": None, "state": state}
        own = self.frame.commands.remember_applied(
            ctx.user, ctx.request_id, ctx.verb, args.model_dump(exclude_unset=True), reply)
        self._handing_over, self._due = True, None
        rec = self.record(epoch, released=True, extra_commands=(own,))
        try:
            async with asyncio.timeout(2 * self.ls.request_timeout_s):
                ok = await self._put(rec)
        except TimeoutError:
            ok = False
        if not ok:
            self._handing_over = False
            raise CommandError(UNAVAILABLE, "the KV store did not confirm the state record: "
                               "nothing released, this instance stays active")
        self.log.warning("pair_handover", epoch=epoch, user=ctx.user, reason=args.reason,
                         synced_seq=self.seq)
        try:
            await runner.release(2 * self.ls.request_timeout_s)
        finally:
            self._handing_over = False
        return state
