"""`TelemetryWriter`: lines into the disk spool at once, and from it to the database in
batches (delivery semantics: the `rackplane.io.tsdb` docstring).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rackplane.clock import Clock
from rackplane.core.samples import Sample
from rackplane.errors import SpoolError
from rackplane.io.spool import Cursor, Spool, SpoolLockedError, SpoolWriteError
from rackplane.io.tsdb.influx import (
    EVENT_MEASUREMENTS,
    EVENT_MEMORY_FACTOR,
    FieldValue,
    LineCounters,
    SendOutcome,
    _backoff_s,
    _rejection_details,
    _Sender,
    _start_thread,
    check_tags,
    line_measurement,
    point_line,
    sender_secret,
)
from rackplane.io.tsdb.stats import TelemetryStats
from rackplane.io.tsdb.timestamps import TimestampGuard
from rackplane.log import get_logger
from rackplane.settings import SpoolSettings, TsdbSettings

__all__ = ["TelemetryStats", "TelemetryWriter"]

_APPEND_NOW_LINES = 2000  # write() appends at once past this many waiting lines
_SPOOL_REOPEN_S = 5.0


@dataclass(slots=True)
class _Batch:
    lines: list[str]
    cursor: Cursor | None  # None: taken from memory (spool unusable)


@dataclass(slots=True)
class _InFlight:
    future: asyncio.Future[SendOutcome]
    batch: _Batch


class TelemetryWriter:
    """Writes telemetry through the spool to InfluxDB (see the module docstring).

    Args:
        tsdb: database settings; ``url = None`` keeps everything in the spool (embedded store).
        spool: spool settings.
        identity_tags: tags on every line (``site``, ``row``, ``rack``); validated here.
        clock: gives the timestamps (``wall_ns``).
        log: a structlog logger; default ``rackplane.io.tsdb``.

    Raises:
        ValueError: an empty or invalid identity tag.
        ConfigError: ``tsdb.token_env`` (v2) or ``tsdb.password_env`` (v1) names an unset
            variable.

    A spool that cannot be opened (unwritable folder, another format version) does not raise:
    the error is logged and counted, lines wait in memory (bounded by ``memory_max_lines``)
    and, with a database, are sent straight from memory; opening is retried every 5 s. A spool
    folder held by another process (two daemons configured with one folder) would lose this
    process's lines at stop: the writer takes the first free fallback folder beside it
    (``<folder>.2`` .. ``<folder>.9``), logs it (``telemetry_spool_in_use_fallback``, error)
    and reports it in ``stats.spool_fallback`` (the ``telemetry_spool_failed`` alarm); the
    fallback is drained like the spool, and what is left in it at stop is sent by the next
    writer that takes it or by ``rackctl replay``.
    """

    def __init__(
        self,
        tsdb: TsdbSettings,
        spool: SpoolSettings,
        *,
        identity_tags: Mapping[str, str],
        clock: Clock,
        log: Any = None,
    ):
        self._tsdb = tsdb
        self._spool_settings = spool
        self._clock = clock
        self._log = log if log is not None else get_logger("rackplane.io.tsdb")
        check_tags(identity_tags)
        self._identity = dict(identity_tags)
        secret = sender_secret(tsdb)
        self._sender = _Sender(tsdb, secret) if tsdb.url else None
        self._counters = LineCounters()
        self._pending: list[str] = []
        self._spool: Spool | None = None
        self._fallback: Path | None = None
        self._spool_failing = False
        self._spool_error: str | None = None
        self._spool_errors = 0
        self._next_reopen = 0.0
        self._spooled = 0
        self._sent = 0
        self._rejected = 0
        self._dropped_memory = 0
        self._dropped_events = 0
        self._dropped_closed = 0
        self._retries = 0
        self._last_error: str | None = None
        self._last_success_wall_ns: int | None = None
        self._ts = TimestampGuard(tsdb.ts_out_of_window, self._log,
                                  max_held=spool.memory_max_lines)
        self._attempt = 0
        self._backoff = 0.0
        self._next_attempt_at = 0.0
        self._batch_limit = tsdb.batch_lines
        self._send_state: str = "ok"
        self._inflight: _InFlight | None = None
        self._send_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._tick_end = asyncio.Event()
        self._stop = asyncio.Event()
        self._closing = False
        self._closed = False
        self._fsync_fut: asyncio.Future[None] | None = None
        self._open_spool()

    # --- writing (synchronous, on the loop) ------------------------------------------------

    def write(
        self,
        measurement: str,
        tags: Mapping[str, str],
        fields: Mapping[str, FieldValue],
        ts_ns: int | None = None,
        int_fields: Collection[str] = (),
    ) -> bool:
        """Queue one point; returns False when no line was queued (no usable field, closed).

        ``tags`` are merged with the identity tags (a key of both must have the same value).
        ``ts_ns`` defaults to ``clock.wall_ns()``. Cost: one ``Point`` (~10-20 µs); the line
        reaches the spool file within ``append_interval_s``.

        Raises:
            ValueError, TypeError: as `point_line`, or a tag that contradicts the identity.
        """
        if self._closed:
            self._dropped_closed += 1
            if self._dropped_closed == 1:
                self._log.warning("telemetry_write_after_close", measurement=measurement)
            return False
        merged = self._merge_tags(tags)
        now = self._clock.wall_ns()
        if ts_ns is None:
            ts_ns = now
        act = self._ts.action(ts_ns, now, "write")
        if act == "drop":
            return False
        if act == "restamp":
            ts_ns = now
        if act != "hold" and self._ts.held:
            self._pending.extend(self._ts.release(now, self._clock.monotonic()))
        before = len(self._counters.omitted_by_field)
        line = point_line(measurement, merged, fields, ts_ns, int_fields, counters=self._counters)
        if len(self._counters.omitted_by_field) != before:
            self._log_new_omissions()
        if line is None:
            return False
        if act == "hold":
            self._ts.hold(line, self._clock.monotonic())
            return True
        self._pending.append(line)
        if len(self._pending) >= _APPEND_NOW_LINES and not self._spool_failing:
            self._flush_memory()
        return True

    def write_samples(
        self,
        measurement: str,
        tags: Mapping[str, str],
        samples: Iterable[Sample],
        ts_ns: int | None = None,
    ) -> int:
        """Write samples as ``<point> = value`` (usable ones) and ``<point>_quality = code`` (all).

        A bad value is thus recorded as its quality code, never as NaN (DESIGN §3). With
        ``ts_ns`` None each sample keeps its own ``ts_ns`` (one line per distinct timestamp);
        otherwise all go in one line at ``ts_ns``. Returns the number of lines queued.

        Raises:
            ValueError, TypeError: as `write`.
        """
        groups: dict[int, dict[str, FieldValue]] = {}
        for s in samples:
            t = s.ts_ns if ts_ns is None else ts_ns
            f = groups.setdefault(t, {})
            if s.usable:
                f[s.point] = s.value
            f[f"{s.point}_quality"] = float(s.quality.code)
        return sum(self.write(measurement, tags, f, t) for t, f in groups.items())

    def _merge_tags(self, tags: Mapping[str, str]) -> Mapping[str, str]:
        if not tags:
            return self._identity
        merged = dict(self._identity)
        for k, v in tags.items():
            have = merged.get(k)
            if have is not None and have != v:
                raise ValueError(f"tag {k!r}={v!r} contradicts the identity tag {k}={have!r}")
            merged[k] = v
        return merged

    def _log_new_omissions(self) -> None:
        for key, n in self._counters.omitted_by_field.items():
            if n == 1:
                self._log.info(
                    "telemetry_field_omitted",
                    field=key,
                    reason="None/NaN/Inf or outside int64; its _quality field is the record",
                )

    # --- memory → spool --------------------------------------------------------------------

    @property
    def spool_directory(self) -> Path | None:
        """The folder lines are spooled to now: the configured one, or its fallback."""
        return self._fallback or self._spool_settings.directory

    def _open_spool(self) -> None:
        try:
            self._spool = Spool.from_settings(self._spool_settings, log=self._log)
        except SpoolLockedError as err:
            self._spool = self._open_fallback(err)
            if self._spool is None:
                self._note_spool_error(err)
                return
        except SpoolError as err:
            self._spool = None
            self._note_spool_error(err)
            return
        else:
            self._warn_fallbacks_left()
        if self._spool_failing or self._spool_error:
            self._log.info("telemetry_spool_recovered")
        self._spool_failing = False
        self._spool_error = None

    def _fallbacks(self) -> list[Path]:
        d = self._spool_settings.directory
        return [] if d is None else [d.with_name(f"{d.name}.{k}") for k in range(2, 10)]

    def _open_fallback(self, err: SpoolLockedError) -> Spool | None:
        """The first fallback folder this process can lock, or None (all held, or failing)."""
        s = self._spool_settings
        for d in self._fallbacks():
            try:
                sp = Spool(d, max_bytes=s.max_bytes, segment_bytes=s.segment_bytes,
                           log=self._log)
            except SpoolLockedError:
                continue
            except SpoolError as fb_err:
                if not self._spool_failing:  # once per failing spell (retried every 5 s)
                    self._log.error("telemetry_spool_fallback_failed", fallback=str(d),
                                    error=str(fb_err))
                return None
            self._fallback = d
            self._log.error(
                "telemetry_spool_in_use_fallback", spool=str(s.directory), owner_pid=err.owner,
                fallback=str(d),
                fix="two daemons share spool.directory: leave it unset (a folder per daemon "
                "and rack) or give each its own; lines left in the fallback at stop are sent "
                "by `rackctl replay " + str(d) + "`")
            return sp
        return None

    def _warn_fallbacks_left(self) -> None:
        for d in self._fallbacks():
            segs = list(d.glob("seg-*.lp")) if d.is_dir() else []
            if segs:
                self._log.warning("telemetry_spool_fallback_left", fallback=str(d),
                                  segments=len(segs),
                                  fix=f"send it with `rackctl replay {d}`, then remove it")

    def flush_to_spool(self) -> int:
        """Append the lines waiting in memory to the spool now; returns how many remain in
        memory (0 unless the spool is failing). ``run()`` does this every
        ``append_interval_s``; call it directly to know that a line is on disk."""
        self._flush_memory()
        return len(self._pending)

    def _flush_memory(self) -> None:
        if self._ts.held:
            self._pending.extend(self._ts.release(self._clock.wall_ns(),
                                                  self._clock.monotonic()))
        if not self._pending or self._spool is None:
            self._bound_memory()
            return
        try:
            self._spool.append(self._pending)
        except SpoolWriteError as err:
            del self._pending[: err.lines_written]
            self._spooled += err.lines_written
            self._note_spool_error(err)
            self._bound_memory()
            return
        except SpoolError as err:
            self._note_spool_error(err)
            self._bound_memory()
            return
        self._spooled += len(self._pending)
        self._pending = []
        if self._spool_failing:
            self._spool_failing = False
            self._spool_error = None
            self._log.info("telemetry_spool_recovered")
        if self._spool.depth_lines >= self._batch_limit:
            self._wake.set()

    def _note_spool_error(self, err: SpoolError) -> None:
        self._spool_errors += 1
        self._last_error = f"spool: {err}"
        if not self._spool_failing:
            self._log.error(
                "telemetry_spool_failed",
                error=str(err),
                effect="lines wait in memory (bounded) and are sent from there when a "
                "database is configured",
            )
        self._spool_failing = True
        self._spool_error = str(err)

    def _bound_memory(self) -> None:
        """Keep memory within ``memory_max_lines`` while the spool cannot take the lines.

        Policy (issue 7, stated in docs/OPERATIONS.md): the *oldest telemetry* lines are
        dropped first and counted in ``dropped_memory``; event lines (measurements in
        `EVENT_MEASUREMENTS`: alarms, command audits) are never dropped for telemetry. Only
        when events alone exceed ``EVENT_MEMORY_FACTOR`` x the bound (a spool down for a very
        long time) are the oldest events dropped, counted in ``dropped_events``.
        """
        limit = self._spool_settings.memory_max_lines
        excess = len(self._pending) - limit
        if excess <= 0:
            return
        keep: list[str] = []
        dropped = 0
        for line in self._pending:
            if dropped < excess and line_measurement(line) not in EVENT_MEASUREMENTS:
                dropped += 1
                continue
            keep.append(line)
        over = len(keep) - limit * EVENT_MEMORY_FACTOR
        if over > 0:  # events alone are far past the bound: the oldest go, counted apart
            del keep[:over]
            if self._dropped_events == 0:
                self._log.critical("telemetry_memory_full_dropping_events",
                                   limit=limit * EVENT_MEMORY_FACTOR)
            self._dropped_events += over
        self._pending = keep
        if dropped:
            if self._dropped_memory == 0:
                self._log.error(
                    "telemetry_memory_full_dropping_oldest",
                    memory_max_lines=limit,
                    policy="oldest telemetry first; alarms and command audits kept",
                )
            self._dropped_memory += dropped

    def _start_fsync(self) -> asyncio.Future[None] | None:
        """Start an fsync in a daemon thread unless one is running (a slow disk never
        stalls the loop); returns its future."""
        spool = self._spool
        if spool is None:
            return None
        if self._fsync_fut is not None and not self._fsync_fut.done():
            return self._fsync_fut
        fut = _start_thread(spool.fsync)
        fut.add_done_callback(self._fsync_done)
        self._fsync_fut = fut
        return fut

    async def _fsync(self, timeout_s: float) -> None:
        """Wait for a running fsync, then make one that covers everything appended so far."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            prev = self._fsync_fut
            if prev is not None and not prev.done():
                await asyncio.wait_for(asyncio.shield(prev), timeout_s)
            fut = self._start_fsync()
            if fut is not None:
                await asyncio.wait_for(asyncio.shield(fut), max(0.0, deadline - loop.time()))
        except TimeoutError:
            self._log.warning("telemetry_fsync_slow", timeout_s=timeout_s)
        except SpoolError:
            pass  # counted and logged by _fsync_done; the drain goes on all the same

    def _fsync_done(self, fut: asyncio.Future[None]) -> None:
        if fut.cancelled():
            return
        err = fut.exception()
        if isinstance(err, SpoolError):
            self._note_spool_error(err)
        elif err is not None:
            self._last_error = f"fsync: {type(err).__name__}: {err}"
            self._log.error("telemetry_fsync_error", error=str(err))

    # --- the owner task --------------------------------------------------------------------

    async def run(self) -> None:
        """Owner task: memory → spool every ``append_interval_s``, fsync every
        ``fsync_interval_s``, and (with a database) drain the spool. Returns after `close`;
        never raises except ``CancelledError``."""
        if self._closing:
            return
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._spool_loop(), name="tsdb-spool")
            if self._sender is not None:
                tg.create_task(self._drain_loop(), name="tsdb-drain")

    async def _sleep(self, seconds: float) -> None:
        """Sleep, or return early when closing starts."""
        if seconds <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    def tick_ended(self) -> None:
        """The daemon's control tick calls this as it ends: the lines the tick wrote are
        appended to the spool right after it, and the next steady-state batch is read then,
        in the tick's shadow, rather than whenever the writer's timers fall, where a long
        append or batch read could hold up a tick falling due meanwhile. Lines written
        between ticks (a daemon whose tick is slower than ``spool.append_interval_s``, such
        as racky's 1 s) are still appended on the interval; they are few. The bounds keep: a
        line waits at most ``spool.append_interval_s``, a batch at most
        ``tsdb.flush_interval_s`` longer; a backlog drains back to back."""
        self._tick_end.set()

    async def _after_tick(self, timeout_s: float) -> None:
        """Return right after the next tick end (`tick_ended`), or after ``timeout_s``, or
        when closing starts."""
        if timeout_s > 0 and not self._closing:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await self._tick_end.wait()
        self._tick_end.clear()

    async def _spool_loop(self) -> None:
        loop = asyncio.get_running_loop()
        s = self._spool_settings
        next_fsync = loop.time() + s.fsync_interval_s
        while not self._closing:
            await self._after_tick(s.append_interval_s)
            if self._closing:
                return
            try:
                now = loop.time()
                if self._spool is None and now >= self._next_reopen:
                    self._next_reopen = now + _SPOOL_REOPEN_S
                    self._open_spool()
                self._flush_memory()
                if now >= next_fsync:
                    next_fsync = now + s.fsync_interval_s
                    self._start_fsync()
            except Exception as exc:  # never let telemetry take the daemon down
                self._last_error = f"spool loop: {type(exc).__name__}: {exc}"
                self._log.exception("telemetry_spool_loop_error")

    async def _drain_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._tsdb.flush_interval_s)
            self._wake.clear()
            while not self._closing and self._has_data():
                wait = self._next_attempt_at - loop.time()
                if wait > 0:
                    await self._sleep(wait)
                    continue
                if self._inflight is None and not self._backlog():
                    # steady state: the batch is read in the next tick's shadow; a backlog
                    # (after an outage) goes back to back, its catching up first
                    await self._after_tick(self._tsdb.flush_interval_s)
                    if self._closing:
                        return
                try:
                    async with self._send_lock:
                        if self._closing:
                            return
                        kind = await self._send_once()
                except Exception as exc:
                    self._last_error = f"drain loop: {type(exc).__name__}: {exc}"
                    self._log.exception("telemetry_drain_loop_error")
                    self._set_backoff(None)
                    continue
                if kind == "empty":
                    break

    def _backlog(self) -> bool:
        """More than one batch waits: in the spool, or in memory while the spool cannot be
        used (those are sent from memory)."""
        if self._spool is not None and self._spool.depth_lines > self._batch_limit:
            return True
        return (self._spool is None or self._spool_failing) and \
            len(self._pending) > self._batch_limit

    def _has_data(self) -> bool:
        if self._inflight is not None:
            return True
        if self._spool is not None and self._spool.depth_lines > 0:
            return True
        return bool(self._pending) and (self._spool is None or self._spool_failing)

    def _next_batch(self) -> _Batch | None:
        spool = self._spool
        while spool is not None and spool.depth_lines > 0:
            try:
                lines, cur = spool.read(self._batch_limit)
                # Lines an older version spooled with an out-of-window timestamp.
                lines = self._ts.fix_lines(lines, self._clock.wall_ns(), "spool")
                if not lines:
                    if cur == spool.cursor:
                        return None
                    spool.ack(cur)  # step over skipped (corrupt, dropped) records
                    continue
            except SpoolError as err:
                self._note_spool_error(err)
                return None
            return _Batch(lines, cur)
        if self._pending and (spool is None or self._spool_failing):
            n = min(self._batch_limit, len(self._pending))
            lines = self._pending[:n]
            del self._pending[:n]
            return _Batch(lines, None)
        return None

    async def _send_once(self) -> str:
        """Send one batch (or finish the one in flight) and settle it. Caller holds the lock.

        Returns the outcome kind, or ``empty`` when there was nothing to send. If the caller
        is cancelled while the request runs, the request stays in flight and the next call
        settles it (it is never sent twice by this process).
        """
        if self._inflight is None:
            batch = self._next_batch()
            if batch is None:
                return "empty"
            assert self._sender is not None
            self._inflight = _InFlight(self._sender.start(batch.lines), batch)
        inflight = self._inflight
        outcome = await asyncio.shield(inflight.future)
        self._inflight = None
        self._settle(inflight.batch, outcome)
        return outcome.kind

    def _settle(self, batch: _Batch, outcome: SendOutcome) -> None:
        n = len(batch.lines)
        if outcome.kind == "ok":
            self._sent += n
            self._ack(batch)
            self._last_success_wall_ns = self._clock.wall_ns()
            self._batch_limit = min(self._tsdb.batch_lines, self._batch_limit * 2)
            if self._send_state != "ok":
                self._log.info("tsdb_write_recovered", after_retries=self._attempt)
            self._send_state = "ok"
            self._attempt = 0
            self._backoff = 0.0
            self._next_attempt_at = 0.0
        elif outcome.kind == "reject" or (outcome.kind == "too_large" and n == 1):
            lost = outcome.dropped_of(n)  # a partial write stored the other lines
            self._rejected += lost
            self._sent += n - lost
            self._ack(batch)
            self._last_error = f"HTTP {outcome.status}: {outcome.message[:300]}"
            self._log.error(
                "tsdb_batch_rejected",
                status=outcome.status,
                lines_dropped=lost,
                message=outcome.message[:500],
                retried=False,
                **_rejection_details(outcome.message, batch.lines),
            )
        elif outcome.kind == "too_large":
            self._unsend(batch)
            self._batch_limit = max(1, n // 2)
            self._log.warning("tsdb_batch_too_large_splitting", lines=n, next=self._batch_limit)
        else:
            self._unsend(batch)
            self._retries += 1
            self._last_error = (
                f"HTTP {outcome.status}: {outcome.message[:300]}"
                if outcome.status
                else outcome.message[:300]
            )
            state = "config" if outcome.kind == "config" else "retry"
            if state != self._send_state:
                log = self._log.error if state == "config" else self._log.warning
                log(
                    "tsdb_write_failing",
                    status=outcome.status,
                    error=outcome.message[:500],
                    kind="configuration (check url, token, org, bucket)"
                    if state == "config"
                    else "unreachable or overloaded; data kept in the spool",
                )
                self._send_state = state
            self._set_backoff(outcome.retry_after_s)

    def _set_backoff(self, retry_after_s: float | None) -> None:
        self._attempt += 1
        self._backoff = _backoff_s(self._tsdb, self._attempt, retry_after_s)
        try:
            now = asyncio.get_running_loop().time()
        except RuntimeError:
            now = time.monotonic()
        self._next_attempt_at = now + self._backoff

    def _ack(self, batch: _Batch) -> None:
        if batch.cursor is None or self._spool is None:
            return
        try:
            self._spool.ack(batch.cursor)
        except SpoolError as err:
            self._note_spool_error(err)

    def _unsend(self, batch: _Batch) -> None:
        if batch.cursor is None:
            self._pending[:0] = batch.lines  # from memory: put back in front, in order

    # --- shutdown --------------------------------------------------------------------------

    async def close(self, budget_s: float | None = None) -> None:
        """Flush memory to the spool, fsync, then drain what fits in the budget and return.

        ``budget_s`` defaults to ``tsdb.stop_budget_s``. Whatever is not sent stays in the
        spool for after the restart. A request still running at the deadline is abandoned
        (its daemon thread never delays the exit); its batch is resent after the restart.
        The fsyncs are always given time (1 s before the drain, 0.5 s after it) even when
        the budget is spent, so on a hung disk close() may take up to ``budget_s + 1.5`` s;
        with a healthy disk it returns within the budget. Idempotent; never raises except
        ``CancelledError``.
        """
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        budget = self._tsdb.stop_budget_s if budget_s is None else budget_s
        deadline = loop.time() + budget
        self._closing = True
        self._stop.set()
        self._wake.set()
        self._tick_end.set()
        try:
            self._flush_memory()
            await self._fsync(timeout_s=max(1.0, deadline - loop.time()))
            if self._sender is not None:
                await self._final_drain(deadline)
            self._flush_memory()
        except Exception as exc:
            self._last_error = f"close: {type(exc).__name__}: {exc}"
            self._log.exception("telemetry_close_error")
        finally:
            self._closed = True
            self._ts.drop_held()
            if self._spool is not None:
                try:
                    if self._spool_failing:
                        self._spool.close(fsync=False)
                    else:
                        await self._fsync(timeout_s=max(0.5, deadline - loop.time()))
                        self._spool.close(fsync=False)
                except SpoolError as err:
                    self._note_spool_error(err)
            if self._sender is not None:
                self._sender.close()
            st = self.stats
            self._log.info(
                "telemetry_closed",
                sent=st.sent,
                left_in_spool=st.depth_lines - st.pending_memory,
                left_in_memory_lost=st.pending_memory,
                rejected=st.rejected,
                dropped=st.dropped,
            )

    async def _final_drain(self, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        remaining = deadline - loop.time()
        if remaining <= 0:
            return
        try:
            await asyncio.wait_for(self._send_lock.acquire(), remaining)
        except TimeoutError:
            return
        try:
            while self._has_data():
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return
                try:
                    kind = await asyncio.wait_for(self._send_once(), remaining)
                except TimeoutError:
                    return  # the request stays in flight; its batch is resent after restart
                if kind in ("retry", "config", "empty"):
                    return  # the rest waits for the restart
                self._flush_memory()
        finally:
            self._send_lock.release()

    # --- stats -----------------------------------------------------------------------------

    @property
    def stats(self) -> TelemetryStats:
        """A snapshot (no I/O)."""
        sp = self._spool.stats if self._spool is not None else None
        pending = len(self._pending) + (
            len(self._inflight.batch.lines)
            if self._inflight is not None and self._inflight.batch.cursor is None
            else 0
        )
        bound = sp.dropped_by_bound if sp else 0
        return TelemetryStats(
            spooled=self._spooled,
            sent=self._sent,
            rejected=self._rejected,
            dropped=bound + self._dropped_memory + self._dropped_closed + self._dropped_events
            + self._ts.dropped,
            dropped_by_bound=bound,
            dropped_memory=self._dropped_memory,
            dropped_closed=self._dropped_closed,
            depth_lines=(sp.depth_lines if sp else 0) + pending,
            depth_bytes=sp.depth_bytes if sp else 0,
            pending_memory=pending,
            retries=self._retries,
            last_error=self._last_error,
            last_success_wall_ns=self._last_success_wall_ns,
            omitted_fields=self._counters.omitted_fields,
            empty_points=self._counters.empty_points,
            ts_out_of_window=self._ts.out_of_window,
            spool_errors=self._spool_errors,
            spool_ok=self._spool is not None and not self._spool_failing,
            spool_fallback=str(self._fallback) if self._fallback else None,
            segments=sp.segments if sp else 0,
            backoff_s=self._backoff,
            batch_limit=self._batch_limit,
            dropped_events=self._dropped_events,
            ts_restamped=self._ts.restamped,
            ts_dropped=self._ts.dropped,
            ts_held=len(self._ts.held),
        )
