"""`replay`: a spool or embedded store sent to an InfluxDB later (``rackctl replay``), with
its own cursor, resumable.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rackplane.clock import SYSTEM_CLOCK, Clock
from rackplane.errors import ConfigError, SpoolError
from rackplane.io.spool import CURSOR_FILE, REPLAY_CURSOR_FILE, Spool
from rackplane.io.tsdb.influx import _backoff_s, _rejection_details, _Sender, sender_secret
from rackplane.io.tsdb.timestamps import TimestampGuard
from rackplane.log import get_logger
from rackplane.settings import TsdbSettings

__all__ = ["ReplayResult", "replay"]

# --- replay ------------------------------------------------------------------------------


@dataclass(slots=True)
class ReplayResult:
    """Progress and outcome of `replay` (also what the progress callback receives).

    Attributes:
        sent_lines: lines the database accepted.
        rejected_lines: lines refused as invalid (dropped, logged).
        batches: requests that got an answer.
        retries: failed attempts retried.
        remaining_lines: lines not yet sent.
        complete: everything was sent (or rejected).
        error: why the replay stopped early (configuration error, gave up), else None.
        elapsed_s: wall duration.
        ts_restamped, ts_dropped: lines whose timestamp was outside 2020..2100 (spooled by
            an older version), given the replay's wall time or dropped per
            ``tsdb.ts_out_of_window``; never sent as they were.
    """

    sent_lines: int = 0
    rejected_lines: int = 0
    batches: int = 0
    retries: int = 0
    remaining_lines: int = 0
    complete: bool = False
    error: str | None = None
    elapsed_s: float = 0.0
    ts_restamped: int = 0
    ts_dropped: int = 0


_SPOOL_FILE_RE = re.compile(
    r"^seg-\d{16}\.lp$|^" + re.escape(CURSOR_FILE) + "$|^" + re.escape(REPLAY_CURSOR_FILE) + "$")


def require_spool_folder(spool_dir: Path) -> None:
    """Refuse what is not a spool before anything is written there (the read-only spool
    keeps a ``replay-cursor`` in its folder; a typo'd path once "replayed" as complete and
    left one behind).

    Raises:
        SpoolError: ``spool_dir`` is missing, not a folder, or holds neither a segment
            (``seg-<16 digits>.lp``) nor a spool cursor.
    """
    if not spool_dir.exists():
        raise SpoolError(f"{spool_dir}: no such folder")
    if not spool_dir.is_dir():
        raise SpoolError(f"{spool_dir}: not a folder (give the spool folder)")
    try:
        names = [p.name for p in spool_dir.iterdir()]
    except OSError as err:
        raise SpoolError(f"{spool_dir}: cannot list: {err.strerror}") from None
    if not any(_SPOOL_FILE_RE.match(n) for n in names):
        raise SpoolError(f"{spool_dir}: not a spool (no seg-*.lp segment or cursor file)")


async def replay(
    spool_dir: Path,
    tsdb: TsdbSettings,
    *,
    from_start: bool = True,
    progress: Callable[[ReplayResult], object] | None = None,
    log: Any = None,
    clock: Clock = SYSTEM_CLOCK,
) -> ReplayResult:
    """Send a spool or embedded store in ``spool_dir`` to the InfluxDB of ``tsdb``.

    The spool is opened read-only: nothing is deleted and the daemon's cursor is not moved
    (replay keeps its own cursor in ``replay-cursor.json``). ``from_start=True`` sends
    everything present; ``False`` resumes an interrupted replay. Do not replay a spool that a
    running writer drains to the same database (its lines would arrive twice).

    Outcomes per batch as in the writer (400/422 dropped and counted, 413 split); a
    configuration error (401/403/404) stops at once; retryable errors back off and the replay
    gives up after ``tsdb.replay_give_up_s`` without progress. ``progress`` is called after
    every batch with the running totals (the same `ReplayResult` object). A line whose
    timestamp is outside 2020..2100 is restamped with ``clock.wall_ns()`` or dropped
    (``tsdb.ts_out_of_window``; `rackplane.io.tsdb.timestamps`), never sent as it is.

    Raises:
        ConfigError: ``tsdb.url`` is None, or ``token_env`` (v2) / ``password_env`` (v1)
            names an unset variable.
        SpoolError: no spool there (the path missing, not a folder, or a folder holding
            no spool file: nothing is created there), or one of another format version.
    """
    if tsdb.url is None:
        raise ConfigError("replay needs tsdb.url (the InfluxDB to send the spool to)")
    require_spool_folder(Path(spool_dir))
    log = log if log is not None else get_logger("rackplane.io.tsdb")
    secret = sender_secret(tsdb)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    spool = Spool(spool_dir, readonly=True, cursor_file=REPLAY_CURSOR_FILE, log=log)
    sender = _Sender(tsdb, secret)
    result = ReplayResult()
    guard = TimestampGuard(tsdb.ts_out_of_window, log)
    try:
        if from_start:
            spool.reset_to_start()
        result.remaining_lines = spool.depth_lines
        limit = tsdb.batch_lines
        attempt = 0
        last_progress = loop.time()
        while True:
            lines, cur = spool.read(limit)
            lines = guard.fix_lines(lines, clock.wall_ns(), "replay")
            result.ts_restamped, result.ts_dropped = guard.restamped, guard.dropped
            if not lines:
                if cur != spool.cursor:
                    spool.ack(cur)
                    continue
                result.complete = True
                break
            outcome = await sender.start(lines)
            done = outcome.kind in ("ok", "reject")
            if done or (outcome.kind == "too_large" and len(lines) == 1):
                spool.ack(cur)
                result.batches += 1
                if outcome.kind == "ok":
                    result.sent_lines += len(lines)
                    limit = min(tsdb.batch_lines, limit * 2)
                else:
                    lost = outcome.dropped_of(len(lines))  # a partial write stored the rest
                    result.rejected_lines += lost
                    result.sent_lines += len(lines) - lost
                    log.error(
                        "tsdb_batch_rejected",
                        status=outcome.status,
                        lines_dropped=lost,
                        message=outcome.message[:500],
                        retried=False,
                        **_rejection_details(outcome.message, lines),
                    )
                result.remaining_lines = spool.depth_lines
                attempt = 0
                last_progress = loop.time()
            elif outcome.kind == "too_large":
                limit = max(1, len(lines) // 2)
            elif outcome.kind == "config":
                result.error = f"HTTP {outcome.status}: {outcome.message[:300]}"
                log.error("tsdb_replay_config_error", status=outcome.status, error=outcome.message)
                break
            else:
                result.retries += 1
                attempt += 1
                if loop.time() - last_progress >= tsdb.replay_give_up_s:
                    result.error = f"gave up after {tsdb.replay_give_up_s} s: {outcome.message}"
                    log.error("tsdb_replay_gave_up", error=outcome.message)
                    break
                delay = _backoff_s(tsdb, attempt, outcome.retry_after_s)
                delay = min(delay, max(0.0, last_progress + tsdb.replay_give_up_s - loop.time()))
                await asyncio.sleep(delay)
            result.elapsed_s = loop.time() - t0
            if progress is not None:
                progress(result)
    finally:
        result.elapsed_s = loop.time() - t0
        result.remaining_lines = spool.depth_lines
        spool.close()
        sender.close()
    if progress is not None:
        progress(result)
    return result
