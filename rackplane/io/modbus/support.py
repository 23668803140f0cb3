"""Bookkeeping of a Modbus device's owner task: its limits, its counters (`ModbusStats`), the
request watchdog, the reconnect backoff and the queued commands (no Modbus library here)."""

from __future__ import annotations

import asyncio
import random
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from rackplane.core.registers import (
    EncodedWrite,
)
from rackplane.errors import (
    ModbusError,
)

__all__ = [
    "MAX_PLAN_RETRIES_PER_POLL",
    "MIN_POLL_INTERVAL_S",
    "MIN_RECONNECT_DELAY_S",
    "OUTER_TIMEOUT_MARGIN_S",
    "RECEIVE_BUFFER_BYTES",
    "ModbusStats",
]

#: Floor of the reconnect delay, whatever the settings say (FIELD-CASES BR-07: pymodbus
#: issue 1794, ``reconnect_delay=0`` spun at 100 % CPU).
MIN_RECONNECT_DELAY_S = 0.1
#: Floor of the poll interval: the owner task never polls more often than this.
MIN_POLL_INTERVAL_S = 0.001
#: Extra time allowed over ``timeout_s`` before the owner abandons a request itself (pymodbus
#: applies ``timeout_s``; this only guards against a library hang).
OUTER_TIMEOUT_MARGIN_S = 1.0
#: Bound on plan changes (split/shrink) applied and retried within one poll.
MAX_PLAN_RETRIES_PER_POLL = 16
#: pymodbus keeps at most this many received bytes before it discards them all (its default,
#: the 264-byte maximum ADU, loses a right reply queued behind a late one: BR-03).
RECEIVE_BUFFER_BYTES = 1 << 20



# --- backoff and stats -----------------------------------------------------------------------


class _RequestWatchdog:
    """Abandons a request that outlives its deadline: the owner's guard against a library
    hang (pymodbus applies ``timeout_s`` itself; this fires ``OUTER_TIMEOUT_MARGIN_S`` later).

    Works like ``asyncio.timeout`` around each request (it cancels the owner task at the
    deadline and the request turns that cancel into `ModbusTimeout`), but with one loop timer
    re-armed lazily instead of a timer, a context manager and a heap entry per request: a
    request only stores its deadline; the timer, when it fires, re-arms itself for the
    current request's deadline or cancels the task if that deadline has passed. Requests
    last milliseconds and the deadline is seconds away, so it fires about once per deadline
    period whatever the request rate.
    """

    __slots__ = ("_deadline", "_handle", "_loop", "_task", "fired")

    def __init__(self) -> None:
        self._deadline: float | None = None  # loop time; None: no request in flight
        self._task: asyncio.Task[Any] | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.fired = False  # cancelled the task for the request in flight

    def start(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any],
              deadline: float) -> None:
        """A request of ``task`` starts; abandon it at loop time ``deadline``."""
        self._deadline = deadline
        self._task = task
        self.fired = False
        if self._handle is None or self._loop is not loop:
            self.close()
            self._loop = loop
            self._handle = loop.call_at(deadline, self._check)

    def stop(self) -> None:
        """The request ended (any way)."""
        self._deadline = None
        self._task = None

    def close(self) -> None:
        """Cancel the timer (the owner stops, or runs in another loop)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _check(self) -> None:
        self._handle = None
        deadline, task, loop = self._deadline, self._task, self._loop
        if deadline is None or task is None or loop is None:
            return  # idle: the next request re-arms
        if loop.time() < deadline:
            self._handle = loop.call_at(deadline, self._check)
            return
        self.fired = True
        task.cancel()


class _Backoff:
    """Capped exponential backoff with jitter in [d/2, d] (d never above the cap)."""

    def __init__(self, min_s: float, max_s: float, rng: random.Random) -> None:
        self.min_s = max(min_s, MIN_RECONNECT_DELAY_S)
        self.max_s = max(max_s, self.min_s)
        self._rng = rng
        self.attempt = 0

    @property
    def clean(self) -> bool:
        """True when no failure happened since the last success."""
        return self.attempt == 0

    def next(self) -> float:
        d = min(self.max_s, self.min_s * 2 ** min(self.attempt, 60))
        self.attempt += 1
        return d * (0.5 + 0.5 * self._rng.random())

    def reset(self) -> None:
        self.attempt = 0


@dataclass
class ModbusStats:
    """Health counters of one device (for health metrics; read, never written, by others).

    Attributes:
        polls: poll ticks handled (while disconnected too).
        ok: polls in which every planned request got a valid reply (exception answers
            included) and the unit was reachable.
        requests: requests sent.
        errors: failed requests by reason (``timeout``, ``not_connected``,
            ``illegal_data_address``, ``server_busy``, ``reply_mismatch`` ...).
        connect_attempts, reconnects: TCP connects tried; successful ones after the first.
        stale_points, invalid_points: points whose latest sample is STALE; BAD or
            OUT_OF_RANGE (gauges: the number now).
        invalid_samples: BAD or OUT_OF_RANGE samples emitted since the device object was
            built (a counter: a Python int, no width, never wraps; 0 again after a restart).
        last_ok_mono: monotonic time of the last valid reply (``None``: never).
        connected: a TCP connection is open.
        available: False while the unit is unavailable: a gateway answered 10/11 for it
            (BR-04), or it timed out ``unavailable_after_failures`` times in a row on a
            shared connection (`rackplane.io.modbus.link`); re-probed every
            ``dormant_reprobe_s``.
        unit_failures: timeouts of the unit on a shared connection (the connection kept).
        dormant_polls: poll ticks not sent because the unit is unavailable.
        exception_replies: exception responses received (any code).
        refused_points: points the device refused alone (2/3), not read until re-probed.
        refused_skips: samples of refused points given without a read (BAD, the refusal).
        stale_frames: reply frames dropped for another tid, or with no request outstanding.
        rejected_frames: frames with the right tid but wrong unit, function, byte count or echo.
        dropped_frames: every dropped frame by reason.
        overruns: poll ticks skipped because a poll took longer than the interval.
        read_limit: current registers per request (shrinks on exception 3, BR-05).
        writes, write_errors: writes done; writes failed.
    """

    polls: int = 0
    ok: int = 0
    requests: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    connect_attempts: int = 0
    reconnects: int = 0
    stale_points: int = 0
    invalid_points: int = 0
    invalid_samples: int = 0
    last_ok_mono: float | None = None
    connected: bool = False
    available: bool = True
    unit_failures: int = 0
    dormant_polls: int = 0
    exception_replies: int = 0
    refused_points: int = 0
    refused_skips: int = 0
    stale_frames: int = 0
    rejected_frames: int = 0
    dropped_frames: dict[str, int] = field(default_factory=dict)
    overruns: int = 0
    read_limit: int = 125
    writes: int = 0
    write_errors: int = 0

    def count_error(self, reason: str) -> None:
        self.errors[reason] = self.errors.get(reason, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready copy."""
        return asdict(self)


@dataclass(eq=False)
class _Command:
    kind: Literal["write", "read"]
    future: asyncio.Future[Any]
    encoded: EncodedWrite | None = None


class _Failure(Exception):
    """A poll-ending failure inside one poll (transport or gateway)."""

    def __init__(self, error: ModbusError, reason: str, drop_connection: bool) -> None:
        super().__init__(reason)
        self.error = error
        self.reason = reason
        self.drop_connection = drop_connection


