"""`TelemetryStats`: what the `rackplane.io.tsdb.TelemetryWriter` reports (self-metrics,
``state/health``, alarms)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TelemetryStats"]


@dataclass(frozen=True, slots=True)
class TelemetryStats:
    """A snapshot of the telemetry path (lines are points).

    Attributes:
        spooled: lines appended to the spool by this process.
        sent: lines the database accepted (2xx).
        rejected: lines the database refused as invalid (400/422, or 413 for a single line):
            dropped, logged, never retried.
        dropped: lines lost otherwise: ``dropped_by_bound + dropped_memory + dropped_closed
            + dropped_events + ts_dropped``.
        dropped_by_bound: unacked lines removed by the spool bound (embedded mode: rotation).
        dropped_memory: telemetry lines dropped because the spool could not be written and
            memory was full (oldest first; event lines are kept, see `EVENT_MEASUREMENTS`).
        dropped_closed: lines written after ``close()``.
        depth_lines: lines waiting (memory + spool).
        depth_bytes: spool bytes waiting.
        pending_memory: lines in memory, not yet spooled.
        retries: failed attempts that will be retried (retryable and configuration errors).
        last_error: the last send or spool error, or None.
        last_success_wall_ns: wall time of the last accepted batch, or None.
        omitted_fields: None/NaN/Inf values not written (their ``_quality`` is).
        empty_points: points with no field left.
        ts_out_of_window: lines whose timestamp was outside 2020..2100: never written as
            is (`rackplane.io.tsdb.timestamps`): restamped, held or dropped.
        spool_errors: spool failures (disk full, unwritable).
        spool_ok: the spool is open and its last append worked.
        segments: spool segment files.
        backoff_s: the current retry delay (0 when healthy).
        batch_limit: the current batch size (smaller than ``batch_lines`` after a 413).
        dropped_events: event lines (alarms, command audits) dropped because events alone
            exceeded ``EVENT_MEMORY_FACTOR`` x ``memory_max_lines`` in memory.
        ts_restamped: out-of-window lines given their arrival (or, held, their real) time.
        ts_dropped: out-of-window lines dropped (policy ``drop``; held past the bound or at
            close while the wall clock was outside the window).
        ts_held: lines held now until the wall clock is in the window.
        spool_fallback: the fallback folder in use because the configured one is held by
            another process, else None.
    """

    spooled: int
    sent: int
    rejected: int
    dropped: int
    dropped_by_bound: int
    dropped_memory: int
    dropped_closed: int
    depth_lines: int
    depth_bytes: int
    pending_memory: int
    retries: int
    last_error: str | None
    last_success_wall_ns: int | None
    omitted_fields: int
    empty_points: int
    ts_out_of_window: int
    spool_errors: int
    spool_ok: bool
    segments: int
    backoff_s: float
    batch_limit: int
    dropped_events: int = 0
    ts_restamped: int = 0
    ts_dropped: int = 0
    ts_held: int = 0
    spool_fallback: str | None = None
