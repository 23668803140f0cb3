"""Line protocol and the InfluxDB write APIs: the only module importing influxdb-client.

`point_line` builds one line with ``influxdb_client.Point`` (escaping is the library's, never
string formatting: FIELD-CASES BR-21); `classify_status` sorts a write's outcome; `_Sender`
sends a batch in a daemon thread: to the v2 API (``POST /api/v2/write``) with the synchronous
``WriteApi`` (never the batching API: BR-18), or to the 1.x API (``POST /write?db=&rp=
&precision=ns``, ``tsdb.api = "v1"``) with the same client's HTTP layer (``ApiClient.call_api``:
the same connection pool, TLS settings, timeouts and ``ApiException``). influxdb-client has no
1.x write of its own: its "v1 compatibility" is ``/api/v2/write`` with ``db/rp`` as the bucket,
which only InfluxDB 1.8+ answers (Debian's 1.6 answers 404). Authentication on 1.x is HTTP
Basic (``username`` + the password from ``password_env``), never the password in the URL. The
delivery rules are the `rackplane.io.tsdb` docstring's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import re
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from influxdb_client import InfluxDBClient, Point, WritePrecision
from influxdb_client.client.write_api import SYNCHRONOUS
from influxdb_client.rest import ApiException

from rackplane.config import secret_from_env
from rackplane.settings import TsdbSettings

__all__ = [
    "EVENT_MEASUREMENTS",
    "EVENT_MEMORY_FACTOR",
    "TS_MAX_NS",
    "TS_MIN_NS",
    "FieldValue",
    "LineCounters",
    "OutcomeKind",
    "SendOutcome",
    "check_tags",
    "classify_status",
    "line_measurement",
    "point_line",
    "sender_secret",
]

TS_MIN_NS = 1_577_836_800 * 10**9
"""2020-01-01T00:00:00Z: an earlier timestamp means a wall clock not yet synchronised."""
TS_MAX_NS = 4_102_444_800 * 10**9
"""2100-01-01T00:00:00Z: a later timestamp is a unit mistake (µs or ms taken for ns)."""

_INT64_MAX = 2**63 - 1
_BAD_NAME_RE = re.compile(r"[\x00-\x1f\x7f]")
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
            ``config`` (401/403/other 4xx, and 1.x's 500 "retention policy not found": keep,
            back off, log loudly), ``retry`` (429, other 5xx, connection error, timeout: keep,
            back off).
        status: HTTP status, or None when no response arrived.
        message: the server's message (from its JSON body when it has one) or the exception.
        retry_after_s: the ``Retry-After`` header in s, when given.
        dropped: for ``reject``, the lines the server says it dropped (``dropped=N`` of a
            partial write: it stored the others); None when it does not say.
    """

    kind: OutcomeKind
    status: int | None = None
    message: str = ""
    retry_after_s: float | None = None
    dropped: int | None = None

    def dropped_of(self, n: int) -> int:
        """Lines of a rejected batch of ``n`` that were not stored: the server's
        ``dropped=N`` when it gave one within 1..n, else all ``n``."""
        if self.dropped is not None and 0 < self.dropped <= n:
            return self.dropped
        return n


_DROPPED_RE = re.compile(r"\bdropped=(\d+)")
_CONFIG_500_RE = re.compile(r"^(retention policy|database) not found")


def classify_status(status: int, body: str, retry_after: str | None = None) -> SendOutcome:
    """Classify an HTTP error answer of ``/api/v2/write`` or 1.x ``/write`` (see the module
    docstring). The message is the JSON body's ``message`` (v2) or ``error`` (1.x), else the
    body; a partial write's ``dropped=N`` is kept in ``dropped``."""
    message = body
    try:
        data = json.loads(body)
        if isinstance(data, dict):
            for key in ("message", "error"):
                if key in data:
                    message = str(data[key])
                    break
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
    elif _CONFIG_500_RE.search(message):
        kind = "config"  # 1.x answers 500 to a write naming a retention policy it lacks
    elif status == 429 or status >= 500:
        kind = "retry"
    else:
        kind = "config"  # 401, 403, 404 (bucket not found), 405, ...; 0: TLS failure
    dropped: int | None = None
    if kind == "reject":
        # 1.x: "partial write: unable to parse '<line>': ... dropped=0": the unparsable lines
        # are not in its dropped count
        dm = _DROPPED_RE.search(message)
        unparsable = message.count("unable to parse '")
        if dm or unparsable:
            dropped = (int(dm.group(1)) if dm else 0) + unparsable
    return SendOutcome(kind, status, message[:2000], ra, dropped)


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


def sender_secret(tsdb: TsdbSettings) -> str | None:
    """The secret the sender needs: the v2 token (``token_env``) or the 1.x password
    (``password_env``).

    Raises:
        ConfigError: the variable named is not set.
    """
    return secret_from_env(tsdb.password_env if tsdb.api == "v1" else tsdb.token_env)


class _Sender:
    """One batch per request to the v2 or 1.x write API (``tsdb.api``), classified, run off
    the event loop. ``secret``: the v2 token or the 1.x password (`sender_secret`)."""

    def __init__(self, tsdb: TsdbSettings, secret: str | None):
        assert tsdb.url is not None
        self._tsdb = tsdb
        if tsdb.api == "v1":
            # HTTP Basic when a user is configured (the client encodes "user:password");
            # "" sends no Authorization header (a 1.x server without auth).
            auth = f"{tsdb.username}:{secret or ''}" if tsdb.username else ""
            kw: dict[str, Any] = {"token": auth, "auth_basic": bool(auth)}
            query: list[tuple[str, str]] = [("db", tsdb.database)]
            if tsdb.retention_policy:
                query.append(("rp", tsdb.retention_policy))
            query.append(("precision", "ns"))
            self._v1_query: list[tuple[str, str]] | None = query
        else:
            kw = {"token": secret or ""}  # "" sends no Authorization header
            self._v1_query = None
        # retries=False: no urllib3 retries behind our back; our backoff decides.
        self._client = InfluxDBClient(
            url=tsdb.url, org=tsdb.org, timeout=int(tsdb.timeout_s * 1000), retries=False, **kw
        )
        self._api = self._client.write_api(write_options=SYNCHRONOUS)

    def _write(self, body: str) -> None:
        if self._v1_query is None:
            self._api.write(
                bucket=self._tsdb.bucket,
                org=self._tsdb.org,
                record=body,
                write_precision=WritePrecision.NS,  # type: ignore[arg-type]
            )
            return
        self._client.api_client.call_api(
            "/write", "POST", query_params=list(self._v1_query),
            header_params={"Content-Type": "text/plain; charset=utf-8",
                           "Accept": "application/json"},
            body=body, auth_settings=[], response_type=None, _return_http_data_only=True,
            collection_formats={},
        )

    def post(self, lines: Sequence[str]) -> SendOutcome:
        """Send one batch (blocking; runs in a thread). Never raises."""
        try:
            self._write("\n".join(lines))
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
