"""Telemetry to InfluxDB through the disk spool (DESIGN §1, §3). The only influxdb-client importer.

Three parts:

- `point_line` builds one line of line protocol with ``influxdb_client.Point`` (escaping is the
  library's, never string formatting: FIELD-CASES BR-21). Numeric fields are floats unless
  declared integer (BR-19); None, NaN and Inf are never written (DESIGN §3: the caller writes
  ``<field>_quality`` instead).
- `TelemetryWriter`: ``write()`` is synchronous and cheap (one ``Point``, ~10-20 µs); lines wait
  in memory at most ``spool.append_interval_s`` (default 100 ms) and are then appended to the
  `rackplane.io.spool.Spool` in one ``os.write``. ``run()`` drains the spool to the InfluxDB v2
  write API in batches, with the synchronous ``WriteApi`` in a daemon thread (never the
  batching API: BR-18), so the event loop never waits on the network and a hung request never
  holds up the process exit.
- `replay()` sends a spool or embedded store to an InfluxDB later (``rackctl replay``).

Delivery semantics (what a test can check):

- Lines still in memory (at most ``append_interval_s`` worth) are lost by a SIGKILL: at most
  once. Appended lines survive a SIGKILL; fsynced ones (every ``fsync_interval_s`` and at
  shutdown) survive a power loss.
- Spooled lines are delivered at least once, in order. A line is sent again only when the
  process dies (or ``close()`` gives up) after the database received its batch and before the
  cursor moved: at most one batch (``batch_lines``) per crash. InfluxDB stores a repeated point
  (same series and timestamp) once; VictoriaMetrics keeps both unless deduplication is on.
- Outcomes of a batch: 2xx → acked. 400/422 (e.g. "field type conflict", BR-19) → dropped,
  counted in ``rejected`` and logged with the field and line the server named; never retried
  (InfluxDB has stored the valid lines of a partial write). 413 → the batch is halved until it
  fits; a single line that is still too large is rejected. 401/403 (and any other 4xx, e.g.
  404 bucket not found) → a configuration problem: logged loudly, data kept, retried with
  backoff. 429, 5xx, connection errors and timeouts → data kept, retried with capped
  exponential backoff (``retry_initial_s`` × 2 up to ``retry_max_s``, jitter -20 %,
  ``Retry-After`` honoured up to the cap). The writer never gives up: the spool bound is the
  only limit.

Timestamps: ``clock.wall_ns()`` unless given. A timestamp outside 2020-01-01 .. 2100-01-01 (an
unsynchronised clock at boot, or a unit mistake) is counted in ``ts_out_of_window`` and logged
when that state changes; the line is still spooled as it is (the value is real; only its time
is doubtful, and a later fix can be made from the log).

I/O pacing (append interval, fsync interval, backoff, stop budget) uses the event loop's time,
the clock ``asyncio.sleep`` and timeouts run on; the injected clock gives the timestamps.

Measured (influxdb-client 1.50.0, VictoriaMetrics 1.79.5, 2-core host): ``write()`` ~20-40 k
points/s (``Point`` dominates: ~18 µs for 4 tags and 2 fields); the writer drains the spool to
VictoriaMetrics at ~75 k lines/s (batch 1,000), ``replay`` at ~140-160 k lines/s. The async
client (``InfluxDBClientAsync``) would need aiohttp, not installed; the thread is not the limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import re
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from influxdb_client import InfluxDBClient, Point, WritePrecision
from influxdb_client.client.write_api import SYNCHRONOUS
from influxdb_client.rest import ApiException

from rackplane.clock import Clock
from rackplane.config import secret_from_env
from rackplane.core.samples import Sample
from rackplane.errors import ConfigError, SpoolError
from rackplane.io.spool import REPLAY_CURSOR_FILE, Cursor, Spool, SpoolWriteError
from rackplane.log import get_logger
from rackplane.settings import SpoolSettings, TsdbSettings

TS_MIN_NS = 1_577_836_800 * 10**9
"""2020-01-01T00:00:00Z: an earlier timestamp means a wall clock not yet synchronised."""
TS_MAX_NS = 4_102_444_800 * 10**9
"""2100-01-01T00:00:00Z: a later timestamp is a unit mistake (µs or ms taken for ns)."""

_INT64_MAX = 2**63 - 1
_BAD_NAME_RE = re.compile(r"[\x00-\x1f\x7f]")
_APPEND_NOW_LINES = 2000  # write() appends at once past this many waiting lines
_SPOOL_REOPEN_S = 5.0
_T = TypeVar("_T")

FieldValue = float | int | bool | None

EVENT_MEASUREMENTS = frozenset({"alarm", "command", "event"})
"""Measurements that record events (alarm changes, command audits): never dropped to make
room for telemetry when the spool cannot be written (`TelemetryWriter` memory bound)."""
EVENT_MEMORY_FACTOR = 10
"""Events may fill this many times ``memory_max_lines`` before the oldest are dropped."""
_MEASUREMENT_RE = re.compile(r"^(?:[^\\, ]|\\.)*")


def line_measurement(line: str) -> str:
    """The measurement of a line-protocol line (up to the first unescaped comma or space)."""
    m = _MEASUREMENT_RE.match(line)
    return m.group(0) if m else ""


# --- line building -----------------------------------------------------------------------


@dataclass(slots=True)
class LineCounters:
    """What `point_line` left out, for the writer's stats.

    Attributes:
        omitted_fields: None, NaN, Inf or out-of-int64 values not written.
        empty_points: points with no field left (no line written).
        omitted_by_field: the same counts keyed ``"<measurement>.<field>"``.
    """

    omitted_fields: int = 0
    empty_points: int = 0
    omitted_by_field: dict[str, int] = field(default_factory=dict)


_VALID_NAMES: set[str] = set()  # names already checked (bounded: cleared past 50,000)


def _check_name(kind: str, name: object) -> str:
    if name in _VALID_NAMES:
        return name
    if not isinstance(name, str):
        raise TypeError(f"{kind} must be a str, got {type(name).__name__}")
    if not name:
        raise ValueError(f"{kind} must not be empty")
    if _BAD_NAME_RE.search(name):
        raise ValueError(f"{kind} {name!r} contains a control character")
    if name.endswith("\\"):
        raise ValueError(f"{kind} {name!r} ends with a backslash (line protocol cannot carry it)")
    if len(_VALID_NAMES) > 50_000:
        _VALID_NAMES.clear()
    _VALID_NAMES.add(name)
    return name


def check_tags(tags: Mapping[str, str]) -> None:
    """Validate tag keys and values (non-empty str, no control character, no trailing ``\\``).

    Raises:
        ValueError: an empty key or value (an untagged series would merge racks: BR-21), or a
            value line protocol cannot carry.
        TypeError: a key or value is not a str.
    """
    for k, v in tags.items():
        if k in _VALID_NAMES and v in _VALID_NAMES:
            continue
        _check_name("tag key", k)
        if isinstance(v, str) and not v:
            raise ValueError(
                f"tag {k!r} is empty: an untagged series would merge with others (BR-21)"
            )
        _check_name(f"tag {k!r} value", v)


def point_line(
    measurement: str,
    tags: Mapping[str, str],
    fields: Mapping[str, FieldValue],
    ts_ns: int,
    int_fields: Collection[str] = (),
    *,
    counters: LineCounters | None = None,
) -> str | None:
    """One line of InfluxDB line protocol, built by ``influxdb_client.Point``.

    Args:
        measurement: equipment name (``coolant_loop``, ``pump``, ...: DESIGN §3).
        tags: identity tags; values escaped by the library (BR-21: ``CDU 3,row=A`` round trips).
        fields: name → value. Numbers are written as floats (BR-19: 12 → ``12``, never ``12i``)
            except names in ``int_fields`` (declared counters, written ``12i``); bool → 1.0/0.0;
            None, NaN and ±Inf are omitted and counted (never handed to the client), as is an
            integer outside int64.
        ts_ns: timestamp, ns since the epoch (int; the client refuses floats).
        int_fields: names of integer counters.
        counters: where omitted fields and empty points are counted.

    Returns:
        The line (no trailing newline), or None when no field is left.

    Raises:
        ValueError: empty measurement, tag key, tag value or field name; a control character
            or trailing backslash in a name; a non-integral value for an integer field.
        TypeError: a string (or other non-numeric) field value, a non-int timestamp.
    """
    _check_name("measurement", measurement)
    check_tags(tags)
    if isinstance(ts_ns, bool) or not isinstance(ts_ns, int):
        raise TypeError(f"ts_ns must be int nanoseconds, got {type(ts_ns).__name__}")
    p = Point(measurement)
    for k, v in tags.items():
        p.tag(k, v)
    n = 0
    for name, value in fields.items():
        _check_name("field name", name)
        out = _field_value(measurement, name, value, name in int_fields, counters)
        if out is not None:
            p.field(name, out)
            n += 1
    if n == 0:
        if counters is not None:
            counters.empty_points += 1
        return None
    p.time(ts_ns, WritePrecision.NS)
    line: str = p.to_line_protocol()
    return line


def _field_value(
    measurement: str, name: str, value: object, is_int: bool, counters: LineCounters | None
) -> float | int | None:
    if value is None:
        return _omit(measurement, name, counters)
    if isinstance(value, bool):
        return int(value) if is_int else float(value)
    if isinstance(value, str | bytes) or not hasattr(value, "__float__"):
        raise TypeError(
            f"field {name!r}: {type(value).__name__} values are not written (DESIGN §3: numeric "
            "fields only; write a numeric code)"
        )
    if is_int:
        if isinstance(value, int):
            iv = value
        else:
            fv = float(value)
            if not math.isfinite(fv):
                return _omit(measurement, name, counters)
            if not fv.is_integer():
                raise ValueError(f"integer field {name!r} got non-integral value {fv!r}")
            iv = int(fv)
        if not -_INT64_MAX - 1 <= iv <= _INT64_MAX:
            return _omit(measurement, name, counters)
        return iv
    fv = float(value)
    if not math.isfinite(fv):
        return _omit(measurement, name, counters)
    return fv


def _omit(measurement: str, name: str, counters: LineCounters | None) -> float | None:
    """Count an omitted field; returns None (the value not to write)."""
    if counters is not None:
        counters.omitted_fields += 1
        key = f"{measurement}.{name}"
        counters.omitted_by_field[key] = counters.omitted_by_field.get(key, 0) + 1
    return None


# --- sending -----------------------------------------------------------------------------

OutcomeKind = Literal["ok", "reject", "too_large", "config", "retry"]


@dataclass(frozen=True, slots=True)
class SendOutcome:
    """The result of one write request, classified.

    Attributes:
        kind: ``ok`` (2xx), ``reject`` (400/422: drop, never retry), ``too_large`` (413: split),
            ``config`` (401/403/other 4xx: keep, back off, log loudly), ``retry`` (429, 5xx,
            connection error, timeout: keep, back off).
        status: HTTP status, or None when no response arrived.
        message: the server's message (from its JSON body when it has one) or the exception.
        retry_after_s: the ``Retry-After`` header in s, when given.
    """

    kind: OutcomeKind
    status: int | None = None
    message: str = ""
    retry_after_s: float | None = None


def classify_status(status: int, body: str, retry_after: str | None = None) -> SendOutcome:
    """Classify an HTTP error answer of ``/api/v2/write`` (see the module docstring)."""
    message = body
    try:
        data = json.loads(body)
        if isinstance(data, dict) and "message" in data:
            message = str(data["message"])
    except ValueError:
        pass
    ra: float | None = None
    if retry_after:
        try:
            ra = max(0.0, float(retry_after))
        except ValueError:
            ra = None
    kind: OutcomeKind
    if 200 <= status < 300:
        kind = "ok"
    elif status in (400, 422):
        kind = "reject"
    elif status == 413:
        kind = "too_large"
    elif status == 429 or status >= 500:
        kind = "retry"
    else:
        kind = "config"  # 401, 403, 404 (bucket not found), 405, ...; 0: TLS failure
    return SendOutcome(kind, status, message[:2000], ra)


def _start_thread(fn: Callable[[], _T]) -> asyncio.Future[_T]:
    """Run ``fn`` in a new daemon thread; a future on the running loop gets its result.

    A daemon thread (not the default executor) so that a request stuck past the stop budget
    never delays the process exit.
    """
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[_T] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if fut.done():
            return
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)

    def runner() -> None:
        try:
            result: Any = fn()
            ok = True
        except BaseException as exc:  # delivered to the awaiting task
            result, ok = exc, False
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(settle, ok, result)

    threading.Thread(target=runner, name="rackplane-tsdb", daemon=True).start()
    return fut


class _Sender:
    """influxdb-client's synchronous v2 write API, classified, run off the event loop."""

    def __init__(self, tsdb: TsdbSettings, token: str | None):
        assert tsdb.url is not None
        self._tsdb = tsdb
        # retries=False: no urllib3 retries behind our back; our backoff decides.
        self._client = InfluxDBClient(
            url=tsdb.url,
            token=token or "",  # "" sends no Authorization header
            org=tsdb.org,
            timeout=int(tsdb.timeout_s * 1000),
            retries=False,
        )
        self._api = self._client.write_api(write_options=SYNCHRONOUS)

    def post(self, lines: Sequence[str]) -> SendOutcome:
        """Send one batch (blocking; runs in a thread). Never raises."""
        try:
            self._api.write(
                bucket=self._tsdb.bucket,
                org=self._tsdb.org,
                record="\n".join(lines),
                write_precision=WritePrecision.NS,  # type: ignore[arg-type]
            )
        except ApiException as exc:
            body = exc.body
            text = body.decode(errors="replace") if isinstance(body, bytes) else str(body or "")
            headers: Any = exc.headers or {}
            retry_after = headers.get("Retry-After") if hasattr(headers, "get") else None
            status = int(exc.status or 0)
            if status == 0:
                return SendOutcome("config", None, str(exc.reason or exc)[:2000])
            return classify_status(status, text or str(exc.reason or ""), retry_after)
        except Exception as exc:  # connection refused/reset, timeouts: urllib3 errors
            return SendOutcome("retry", None, f"{type(exc).__name__}: {exc}"[:2000])
        return SendOutcome("ok", 204)

    def start(self, lines: Sequence[str]) -> asyncio.Future[SendOutcome]:
        return _start_thread(lambda: self.post(lines))

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing a pool must never fail a shutdown
            self._client.close()


def _rejection_details(message: str, lines: Sequence[str]) -> dict[str, str]:
    """The field, measurement and offending line named in an error body (for the log)."""
    out: dict[str, str] = {}
    m = re.search(r'field \\?"([^"\\]+)\\?"', message)
    if m:
        out["field"] = m.group(1)
    mm = re.search(r'measurement \\?"([^"\\]+)\\?"', message)
    if mm:
        out["measurement"] = mm.group(1)
    lm = re.search(r"unable to parse '(.{1,300}?)'", message)
    if lm:
        out["line"] = lm.group(1)
    elif "field" in out:
        needle = out["field"] + "="
        meas = out.get("measurement")
        for line in lines:
            if needle in line and (meas is None or line.startswith(meas)):
                out["line"] = line[:300]
                break
    if "line" not in out and lines:
        out["first_line"] = lines[0][:300]
    return out


def _backoff_s(tsdb: TsdbSettings, attempt: int, retry_after_s: float | None) -> float:
    cap = max(tsdb.retry_max_s, tsdb.retry_initial_s)
    delay = min(cap, tsdb.retry_initial_s * 2 ** min(attempt - 1, 30))
    if retry_after_s is not None:
        delay = min(cap, max(delay, retry_after_s))
    return delay * (0.8 + 0.2 * random.random())


# --- the writer --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TelemetryStats:
    """A snapshot of the telemetry path (lines are points).

    Attributes:
        spooled: lines appended to the spool by this process.
        sent: lines the database accepted (2xx).
        rejected: lines the database refused as invalid (400/422, or 413 for a single line):
            dropped, logged, never retried.
        dropped: lines lost otherwise: ``dropped_by_bound + dropped_memory + dropped_closed
            + dropped_events``.
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
        ts_out_of_window: lines whose timestamp was outside 2020..2100 (spooled anyway).
        spool_errors: spool failures (disk full, unwritable).
        spool_ok: the spool is open and its last append worked.
        segments: spool segment files.
        backoff_s: the current retry delay (0 when healthy).
        batch_limit: the current batch size (smaller than ``batch_lines`` after a 413).
        dropped_events: event lines (alarms, command audits) dropped because events alone
            exceeded ``EVENT_MEMORY_FACTOR`` x ``memory_max_lines`` in memory.
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
        ConfigError: ``tsdb.token_env`` names an unset variable.

    A spool that cannot be opened (unwritable folder, another format version, held by another
    process) does not raise: the error is logged and counted, lines wait in memory (bounded by
    ``memory_max_lines``) and, with a database, are sent straight from memory; opening is
    retried every 5 s.
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
        token = secret_from_env(tsdb.token_env)
        self._sender = _Sender(tsdb, token) if tsdb.url else None
        self._counters = LineCounters()
        self._pending: list[str] = []
        self._spool: Spool | None = None
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
        self._ts_bad = 0
        self._ts_state_bad = False
        self._attempt = 0
        self._backoff = 0.0
        self._next_attempt_at = 0.0
        self._batch_limit = tsdb.batch_lines
        self._send_state: str = "ok"
        self._inflight: _InFlight | None = None
        self._send_lock = asyncio.Lock()
        self._wake = asyncio.Event()
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
        if ts_ns is None:
            ts_ns = self._clock.wall_ns()
        self._check_window(ts_ns)
        before = len(self._counters.omitted_by_field)
        line = point_line(measurement, merged, fields, ts_ns, int_fields, counters=self._counters)
        if len(self._counters.omitted_by_field) != before:
            self._log_new_omissions()
        if line is None:
            return False
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

    def _check_window(self, ts_ns: int) -> None:
        bad = not TS_MIN_NS <= ts_ns < TS_MAX_NS
        if bad:
            self._ts_bad += 1
        if bad != self._ts_state_bad:
            self._ts_state_bad = bad
            if bad:
                self._log.warning(
                    "telemetry_timestamp_outside_window",
                    ts_ns=ts_ns,
                    window="2020-01-01..2100-01-01",
                    hint="wall clock not synchronised yet, or a unit mistake; lines are "
                    "spooled with this timestamp and counted in ts_out_of_window",
                )
            else:
                self._log.info("telemetry_timestamp_back_in_window", ts_ns=ts_ns)

    def _log_new_omissions(self) -> None:
        for key, n in self._counters.omitted_by_field.items():
            if n == 1:
                self._log.info(
                    "telemetry_field_omitted",
                    field=key,
                    reason="None/NaN/Inf or outside int64; its _quality field is the record",
                )

    # --- memory → spool --------------------------------------------------------------------

    def _open_spool(self) -> None:
        try:
            self._spool = Spool.from_settings(self._spool_settings, log=self._log)
        except SpoolError as err:
            self._spool = None
            self._note_spool_error(err)
            return
        if self._spool_failing or self._spool_error:
            self._log.info("telemetry_spool_recovered")
        self._spool_failing = False
        self._spool_error = None

    def flush_to_spool(self) -> int:
        """Append the lines waiting in memory to the spool now; returns how many remain in
        memory (0 unless the spool is failing). ``run()`` does this every
        ``append_interval_s``; call it directly to know that a line is on disk."""
        self._flush_memory()
        return len(self._pending)

    def _flush_memory(self) -> None:
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

    async def _spool_loop(self) -> None:
        loop = asyncio.get_running_loop()
        s = self._spool_settings
        next_fsync = loop.time() + s.fsync_interval_s
        while not self._closing:
            await self._sleep(s.append_interval_s)
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

    def _has_data(self) -> bool:
        if self._inflight is not None:
            return True
        if self._spool is not None and self._spool.depth_lines > 0:
            return True
        return bool(self._pending) and (self._spool is None or self._spool_failing)

    def _next_batch(self) -> _Batch | None:
        spool = self._spool
        if spool is not None and spool.depth_lines > 0:
            try:
                lines, cur = spool.read(self._batch_limit)
                if not lines:
                    if cur != spool.cursor:
                        spool.ack(cur)  # step over skipped (corrupt) records
                    return None
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
            self._rejected += n
            self._ack(batch)
            self._last_error = f"HTTP {outcome.status}: {outcome.message[:300]}"
            self._log.error(
                "tsdb_batch_rejected",
                status=outcome.status,
                lines_dropped=n,
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
            dropped=bound + self._dropped_memory + self._dropped_closed + self._dropped_events,
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
            ts_out_of_window=self._ts_bad,
            spool_errors=self._spool_errors,
            spool_ok=self._spool is not None and not self._spool_failing,
            segments=sp.segments if sp else 0,
            backoff_s=self._backoff,
            batch_limit=self._batch_limit,
            dropped_events=self._dropped_events,
        )


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
    """

    sent_lines: int = 0
    rejected_lines: int = 0
    batches: int = 0
    retries: int = 0
    remaining_lines: int = 0
    complete: bool = False
    error: str | None = None
    elapsed_s: float = 0.0


async def replay(
    spool_dir: Path,
    tsdb: TsdbSettings,
    *,
    from_start: bool = True,
    progress: Callable[[ReplayResult], object] | None = None,
    log: Any = None,
) -> ReplayResult:
    """Send a spool or embedded store in ``spool_dir`` to the InfluxDB of ``tsdb``.

    The spool is opened read-only: nothing is deleted and the daemon's cursor is not moved
    (replay keeps its own cursor in ``replay-cursor.json``). ``from_start=True`` sends
    everything present; ``False`` resumes an interrupted replay. Do not replay a spool that a
    running writer drains to the same database (its lines would arrive twice).

    Outcomes per batch as in the writer (400/422 dropped and counted, 413 split); a
    configuration error (401/403/404) stops at once; retryable errors back off and the replay
    gives up after ``tsdb.replay_give_up_s`` without progress. ``progress`` is called after
    every batch with the running totals (the same `ReplayResult` object).

    Raises:
        ConfigError: ``tsdb.url`` is None, or ``token_env`` names an unset variable.
        SpoolError: no spool there, or one of another format version.
    """
    if tsdb.url is None:
        raise ConfigError("replay needs tsdb.url (the InfluxDB to send the spool to)")
    log = log if log is not None else get_logger("rackplane.io.tsdb")
    token = secret_from_env(tsdb.token_env)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    spool = Spool(spool_dir, readonly=True, cursor_file=REPLAY_CURSOR_FILE, log=log)
    sender = _Sender(tsdb, token)
    result = ReplayResult()
    try:
        if from_start:
            spool.reset_to_start()
        result.remaining_lines = spool.depth_lines
        limit = tsdb.batch_lines
        attempt = 0
        last_progress = loop.time()
        while True:
            lines, cur = spool.read(limit)
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
                    result.rejected_lines += len(lines)
                    log.error(
                        "tsdb_batch_rejected",
                        status=outcome.status,
                        lines_dropped=len(lines),
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

