"""Modbus TCP acquisition: one owner task, one connection, per device (DESIGN §1 bulkheads).

This is the only daemon-side module importing pymodbus (3.16.x). Everything the library
raises is turned into `rackplane.errors` types here; decode, encode and read planning are the
pure functions of `rackplane.core.registers`.

`ModbusDevice.run()` is the owner task. It connects with capped, jittered exponential backoff,
polls on a fixed-rate schedule of the monotonic clock, reads the planned blocks, and hands
one `Sample` per configured point per poll to ``on_samples``: GOOD, or not GOOD with a reason.
Writes and dry reads are queued to it, so one client serialises every request.

Field behaviour (FIELD-CASES):

- BR-03: pymodbus 3.16.1 skips a reply whose transaction id differs from the request's, but
  it *accepts a reply with tid 0 for any request*, never checks the function code or byte
  count (a 1-register reply is returned for a 3-register read; an FC01 reply for an FC04
  request), does not check the unit id when the request went to unit 0, and drops the whole
  receive buffer once it holds more than 264 bytes (a late 125-register reply followed by the
  right one in the same TCP chunk: both lost, a timeout). This module installs a strict framer
  in the client: a reply is accepted only when tid, unit id, function code and byte count
  (or write echo) all match the outstanding request; anything else is dropped and counted
  (``stats.stale_frames``: other tid or no request outstanding; ``stats.rejected_frames``:
  right tid, wrong content). A broken MBAP header (protocol id != 0, impossible length) is a
  desync: the request times out and the connection is replaced. pymodbus wraps tids
  65000 -> 1 (never 0).
- BR-04: exception responses never escape the owner task. 2 -> the read plan is split and the
  split remembered, a single point answering 2 is BAD ``illegal_data_address``; 3 -> the
  request size shrinks (remembered); 6 -> the block's points are STALE ``server_busy`` this
  cycle (no invalid state, retried next cycle); 10/11 -> the unit is unavailable
  (``stats.available``), its points STALE, the TCP connection kept (the gateway is fine).
- BR-05: no request exceeds 125 registers or the device's remembered limit.
- BR-06: unit 0 over TCP is an ordinary device (reads wait for the reply, its unit id is
  checked). With ``framer = "rtu"`` unit 0 is broadcast: writes are sent with pymodbus'
  ``no_response_expected`` (return at once, logged "no response expected"); reads are refused.
- BR-07: a timeout or connection loss makes every point STALE from that poll on (values read
  and validated earlier in the same poll stay GOOD: they are fresh), drops the connection and
  reconnects with a *new* client object: no byte of the old connection can be read again.
  Backoff doubles from ``reconnect_min_s`` (floored at `MIN_RECONNECT_DELAY_S`) to
  ``reconnect_max_s`` with jitter in [d/2, d]; it resets only after a successful read, so a
  half-open device that accepts TCP but never answers keeps backing off. Only a live
  connection is dropped and rescheduled: a request refused while disconnected never touches
  the reconnect schedule or the backoff (field bug: a heartbeat write refused every second
  re-armed a 1-2 s delay each time, so the device never reconnected).
- A connection the device closes while idle (reboot, gateway idle timeout) is reopened at
  once if it had worked, so it costs no STALE poll. A connection lost *during* a request
  costs that request's timeout (pymodbus 3.16.1 does not fail the pending request on close).
- Shutdown: Python 3.11's ``asyncio.wait_for``, used by pymodbus for every request, swallows a
  cancel that arrives together with the reply (CPython gh-86296); the owner re-raises it from
  `asyncio.Task.cancelling`, so cancelling `ModbusDevice.run` always stops it.

Logging: state changes once per change (``modbus_offline`` / ``modbus_online`` once per outage
however many reconnects it takes, unit unavailable/available, a point becoming invalid and
recovering, a read plan change, a probable word-order error, a point's writes failing
(``modbus_write_failed``, again only when the reason changes) and succeeding again
(``modbus_write_recovered``), an internal error and its end); each connect attempt, close and
successful write is a debug line (a heartbeat is written every second). Every failure is
counted in `ModbusStats` however often it is logged. pymodbus' own per-event log lines (every
timeout, every skipped frame, each with a hex dump) are silenced by raising the ``pymodbus``
logger to CRITICAL, since every such event is reported here as a typed error, a counter or a
state change.

The injected `Clock` must advance in real time (`SystemClock`): it schedules polls and
reconnects and stamps samples; asyncio waits on it. Sample values are floats: 64-bit integer
points above 2**53 lose precision.

Cost (issue 8, ``bench.modbus.cost_ratio_to_raw``: CPU per poll vs the bare pymodbus client
on the same requests): each read request of the plan is prepared once per plan
(`_ReadOp`: its `rackplane.core.registers.BlockDecoder`, expected reply and client method) and
sent by one coroutine (`_read`) with the reply checks of its common case inline; the strict
framer builds the reply to a register read itself when the buffer holds exactly that reply
(pymodbus' generic PDU decode formats a debug string per reply even with logging off); a
poll in which every planned request answers collects its samples in plan order and puts
them in map order with an index computed per plan; the request guard is one lazily
re-armed timer (`_RequestWatchdog`), not an ``asyncio.timeout`` per request; the idle wait
is a bare future; the running loop and task are looked up once per poll (each lookup is a
getpid() system call). Every other case (exception replies, plan changes, stray or
mismatched frames, failures) takes the general path. Measured on the CDU map (35 points,
6 requests) at 10 Hz: 0.97-1.05x the bare client (median of 3 per run, 5 runs; the code
before, in runs alternated with them: 1.10-1.25x).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import struct
import traceback
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pydantic import Field, model_validator
from pymodbus.client import AsyncModbusSerialClient, AsyncModbusTcpClient
from pymodbus.exceptions import ConnectionException, ModbusException, ModbusIOException
from pymodbus.framer import FramerSocket, FramerType
from pymodbus.pdu import DecodePDU, ModbusPDU

from rackplane.clock import Clock
from rackplane.core.registers import (
    BlockDecoder,
    EncodedWrite,
    PointSpec,
    ReadBlock,
    ReadMemory,
    RegisterMap,
    encode_write,
    learn_from_exception,
    load_register_map,
    plan_reads,
)
from rackplane.core.samples import Quality, Sample, invalid
from rackplane.errors import (
    ModbusConnectionError,
    ModbusDecodeError,
    ModbusError,
    ModbusExceptionResponse,
    ModbusTimeout,
    WriteRejected,
)
from rackplane.log import get_logger
from rackplane.settings import ModbusTargetSettings

#: Floor of the reconnect delay, whatever the settings say (FIELD-CASES BR-07: pymodbus
#: issue 1794, ``reconnect_delay=0`` spun at 100 % CPU).
_Client = AsyncModbusTcpClient | AsyncModbusSerialClient

try:  # POSIX: pyserial reports a port refusing its line settings as termios.error
    import termios

    _SERIAL_SETUP_ERROR: type[Exception] = termios.error
except ImportError:  # pragma: no cover (Windows)
    class _SerialSetupError(Exception):
        """Never raised: no termios on this platform."""

    _SERIAL_SETUP_ERROR = _SerialSetupError

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


class ModbusSerialTargetSettings(ModbusTargetSettings):
    """One Modbus RTU device on a serial line (RS-485 through a USB or on-board UART).

    ``host``/``port`` are unused (kept for the log context); ``framer`` is always ``rtu``.
    Defaults are the Modbus-over-serial specification's (19200 baud, even parity, 8 data bits,
    1 stop bit). Unit 0 is broadcast (writes only, FIELD-CASES BR-06). `ModbusDevice` opens a
    serial client for any settings object whose ``serial_port`` is set (a daemon's own target
    model may carry these fields, optional, instead of subclassing this one).
    """

    serial_port: str = Field(description="device path, e.g. /dev/ttyUSB0 or /dev/serial/by-id/…")
    baudrate: int = Field(19200, ge=1200, le=921600)
    parity: Literal["N", "E", "O"] = "E"
    bytesize: Literal[7, 8] = 8
    stopbits: Literal[1, 2] = 1
    framer: Literal["socket", "rtu"] = "rtu"

    @model_validator(mode="after")
    def _rtu_only(self) -> ModbusSerialTargetSettings:
        if self.framer != "rtu":
            raise ValueError("a serial line speaks RTU only (framer = 'rtu')")
        return self


_READ_CALLS: dict[int, str] = {
    1: "read_coils",
    2: "read_discrete_inputs",
    3: "read_holding_registers",
    4: "read_input_registers",
}
_GATEWAY_CODES = frozenset({10, 11})
_GOOD = Quality.GOOD
_STALE = Quality.STALE
#: Reasons that describe the device or its link, not one point: no per-point log line.
_DEVICE_REASONS = frozenset(
    {"timeout", "not_connected", "connection_lost", "reply_mismatch", "desync",
     "gateway_path_unavailable", "gateway_target_no_response", "stopped", "modbus_error"}
)

logging.getLogger("pymodbus").setLevel(logging.CRITICAL)


def _raise_if_cancelling(task: asyncio.Task[Any] | None = None) -> None:
    """Re-raise a cancellation that a library swallowed (``task``: the current task, when
    the caller has it; `asyncio.current_task` costs a getpid() system call).

    Python 3.11's ``asyncio.wait_for`` (used by pymodbus 3.16.1 for every request and
    connect) returns the result instead of raising when the cancel arrives in the same loop
    iteration as the reply (CPython gh-86296, fixed in 3.12). The task still counts the
    request (`asyncio.Task.cancelling`), so the owner checks it between steps: without this,
    a busy device task could ignore a shutdown forever.
    """
    if task is None:
        task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError()


def _resolve(waiter: asyncio.Future[None]) -> None:
    """Wake the owner task's idle wait (timer or queued command), once."""
    if not waiter.done():
        waiter.set_result(None)


def _bug_key(err: BaseException) -> str:
    """What makes two internal errors "the same bug" for logging: type and raising line."""
    tb = traceback.extract_tb(err.__traceback__)
    where = f"{tb[-1].filename}:{tb[-1].lineno}" if tb else "?"
    return f"{type(err).__name__} at {where}"


# --- strict reply matching (BR-03) -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Expect:
    """The outstanding request, as its reply must answer it."""

    unit: int
    function_code: int
    count: int = 0  # registers or bits read; 0 for writes
    echo: bytes | None = None  # the exact 4 bytes a write reply echoes
    no_response: bool = False


@dataclass(frozen=True, slots=True)
class _FastReply:
    """The exact MBAP header and PDU start of a valid reply to one register read (FC 3/4):
    what `_StrictSocketFramer.handleFrame` compares before building the reply itself."""

    length: int  # MBAP length field: unit + function + byte count + data
    unit: int
    function_code: int
    nbytes: int  # the byte count field: 2 per register
    reply_type: type[ModbusPDU]  # pymodbus' response class of the function
    registers: struct.Struct  # big-endian uint16 x count

    @classmethod
    def of_read(cls, unit: int, function_code: int, count: int) -> _FastReply | None:
        """For a read of ``count`` registers (FC 3/4); None for any other request."""
        if function_code not in (3, 4) or not 0 < count <= 125:
            return None
        reply_type = DecodePDU.pdu_table.get(function_code, (None, None))[1]  # client side
        if reply_type is None or reply_type.sub_function_code >= 0:  # pragma: no cover
            return None  # (pymodbus 3.16 always has FC 3/4 responses, without sub-function)
        return cls(3 + 2 * count, unit, function_code, 2 * count, reply_type,
                   struct.Struct(f">{count}H"))


_MBAP_AND_PDU_HEAD = struct.Struct(">HHHBBB")  # tid, protocol id, length, unit, fc, byte count


class _ReplyGuard:
    """Matches reply frames to the one outstanding request; counts what it drops."""

    def __init__(self, stats: ModbusStats) -> None:
        self._stats = stats
        self.expect: _Expect | None = None
        self.fast: _FastReply | None = None
        self.bad_reply = False  # a frame with the right tid but wrong content arrived
        self.desync = False

    def begin(self, expect: _Expect, fast: _FastReply | None = None) -> None:
        """``fast``: the exact reply header of a register read (`_StrictSocketFramer`'s
        common case), or None."""
        self.expect = expect
        self.fast = fast
        self.bad_reply = False
        self.desync = False

    def end(self) -> None:
        self.expect = None
        self.fast = None

    def drop(self, reason: str, *, same_tid: bool) -> str:
        """Count a dropped frame; ``same_tid``: it carried the outstanding request's tid."""
        self._stats.dropped_frames[reason] = self._stats.dropped_frames.get(reason, 0) + 1
        if same_tid:
            self._stats.rejected_frames += 1
            self.bad_reply = True
        else:
            self._stats.stale_frames += 1
        return reason

    def check(self, tid: int, expected_tid: int, unit: int, pdu: bytes) -> str | None:
        """None when the frame answers the outstanding request, else the drop reason."""
        e = self.expect
        if e is None:
            return self.drop("unsolicited", same_tid=False)
        if tid != expected_tid:
            return self.drop("tid_mismatch", same_tid=False)
        if unit != e.unit:
            return self.drop("unit_mismatch", same_tid=True)
        fc = pdu[0]
        if fc == e.function_code | 0x80:
            return None if len(pdu) == 2 else self.drop("bad_length", same_tid=True)
        if fc != e.function_code:
            return self.drop("function_mismatch", same_tid=True)
        if fc in _READ_CALLS:
            nbytes = 2 * e.count if fc in (3, 4) else (e.count + 7) // 8
            if len(pdu) != 2 + nbytes or pdu[1] != nbytes:
                return self.drop("byte_count_mismatch", same_tid=True)
        elif e.echo is not None and pdu[1:] != e.echo:
            return self.drop("echo_mismatch", same_tid=True)
        return None

    def out_of_step(self) -> None:
        self.desync = True
        self._stats.dropped_frames["desync"] = self._stats.dropped_frames.get("desync", 0) + 1


class _StrictSocketFramer(FramerSocket):
    """Modbus TCP framer that accepts only the reply to the outstanding request (BR-03).

    Replaces pymodbus' ``FramerBase.handleFrame`` for the client: walks every complete frame
    in the buffer, drops (and counts) frames the `_ReplyGuard` rejects, returns the first that
    matches. Never raises (pymodbus would raise out of ``data_received``).
    """

    def __init__(self, guard: _ReplyGuard) -> None:
        super().__init__(DecodePDU(False))
        self._guard = guard

    def handleFrame(  # pymodbus names it so
        self, data: bytes, exp_devid: int, exp_tid: int
    ) -> tuple[int, ModbusPDU | None]:
        size_all = len(data)
        fast = self._guard.fast
        if fast is not None and size_all >= 9:
            # the common case of every poll: the buffer holds exactly the reply to the
            # outstanding register read (tid, protocol 0, length, unit, function and byte
            # count all as expected). The reply is built here, as pymodbus' DecodePDU would
            # (same class, same registers), without its lookup, per-register unpack and
            # eager debug formatting. Anything else takes the frame walk below.
            tid, pid, length, unit, fc, nbytes = _MBAP_AND_PDU_HEAD.unpack_from(data, 0)
            if (tid == exp_tid and pid == 0 and length == fast.length
                    and size_all == 6 + length and unit == fast.unit
                    and fc == fast.function_code and nbytes == fast.nbytes
                    and self._guard.expect is not None):
                reply = fast.reply_type()
                reply.registers = list(fast.registers.unpack_from(data, 9))
                reply.dev_id = unit
                reply.transaction_id = tid
                return size_all, reply
        used = 0
        while size_all - used >= 8:
            tid, pid, length = struct.unpack_from(">HHH", data, used)
            if pid != 0 or not 2 <= length <= 254:
                self._guard.out_of_step()
                return size_all, None
            size = 6 + length
            if size_all - used < size:
                break
            unit = data[used + 6]
            pdu_bytes = bytes(data[used + 7 : used + size])
            used += size
            if self._guard.check(tid, exp_tid, unit, pdu_bytes) is not None:
                continue
            pdu = self.decoder.decode(pdu_bytes)
            if pdu is None:
                self._guard.drop("undecodable", same_tid=True)
                continue
            pdu.dev_id = unit
            pdu.transaction_id = tid
            return used, pdu
        return used, None


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
            OUT_OF_RANGE.
        last_ok_mono: monotonic time of the last valid reply (``None``: never).
        connected: a TCP connection is open.
        available: False while a gateway answers 10/11 for the unit (BR-04).
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
    last_ok_mono: float | None = None
    connected: bool = False
    available: bool = True
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


class _ReadOp:
    """One read request of the plan, prepared once per plan: its decoder, the reply it
    expects and the name of the client method it calls."""

    __slots__ = ("count", "decoder", "expect", "fast", "function_code", "method", "start",
                 "unit")

    def __init__(self, block: ReadBlock, unit: int) -> None:
        self.decoder = BlockDecoder(block)
        self.function_code = fc = block.function_code
        self.start = block.start
        self.count = block.count
        self.unit = unit
        self.expect = _Expect(unit, fc, block.count)
        self.fast = _FastReply.of_read(unit, fc, block.count)
        self.method = _READ_CALLS[fc]


def _by_name(ops: list[_ReadOp], flat: list[Sample], done: int) -> dict[str, Sample]:
    """The samples of the first ``done`` requests of ``ops`` (``flat``, in their order), by
    point name."""
    out: dict[str, Sample] = {}
    i = 0
    for op in ops[:done]:
        names = op.decoder.names
        out.update(zip(names, flat[i:i + len(names)], strict=True))
        i += len(names)
    return out


# --- the device ------------------------------------------------------------------------------


class ModbusDevice:
    """One Modbus TCP device: one connection, one owner task (`run`).

    Args:
        settings: the target (host, port, unit, framer, timing, limits).
        regmap: the register map; default: ``load_register_map(settings.register_map)``.
        clock: monotonic time for scheduling, wall time for sample timestamps.
        on_samples: called from the owner task with one `Sample` per configured point per
            poll, in map order (not called when ``settings.poll_enabled`` is False). It must
            not block; an exception from it is logged and counted, never fatal.
        log: a structlog-style logger (default ``get_logger(__name__)``), bound to the device.
        rng: random source of the reconnect jitter (tests pass a seeded one).

    Raises:
        ConfigError: the register map cannot be loaded.
    """

    def __init__(
        self,
        settings: ModbusTargetSettings,
        regmap: RegisterMap | None = None,
        *,
        clock: Clock,
        on_samples: Callable[[list[Sample]], None],
        log: Any = None,
        rng: random.Random | None = None,
    ) -> None:
        self._settings = settings
        self.regmap = regmap if regmap is not None else load_register_map(settings.register_map)
        self._clock = clock
        self._on_samples = on_samples
        self._log = (log if log is not None else get_logger(__name__)).bind(
            device=settings.name, host=settings.host, port=settings.port, unit=settings.unit_id
        )
        self.stats = ModbusStats(read_limit=settings.max_registers_per_read)
        self._guard = _ReplyGuard(self.stats)
        self._watchdog = _RequestWatchdog()
        self._backoff = _Backoff(
            settings.reconnect_min_s, settings.reconnect_max_s, rng or random.Random()
        )
        self._client: _Client | None = None
        self._ever_connected = False
        self._down_reason = "not_connected"
        self._next_connect = -math.inf
        self._memory = ReadMemory()
        self._point_names = tuple(p.name for p in self.regmap.points)
        self._blocks = self._plan()
        self._ops: list[_ReadOp] = []  # compiled once per plan (`_compile`)
        self._order: list[int] | None = None  # map order -> index in the plan's samples
        self._compile()
        self._commands: deque[_Command] = deque()
        self._waiter: asyncio.Future[None] | None = None  # the owner's idle wait (`_wait`)
        self._io_lock = asyncio.Lock()
        self._running = False
        self._point_problem: dict[str, str] = {}
        self._warned_order: set[str] = set()
        self._callback_failing = False
        self._online: bool | None = None  # None: nothing known yet
        self._write_problem: dict[str, str] = {}  # point -> reason of its failing writes
        self._write_failures: dict[str, int] = {}  # point -> failed writes since its last ok
        self._broadcast_noted: set[str] = set()
        self._internal_error: str | None = None  # the owner's current bug, logged once
        self._command_errors: set[str] = set()
        self._ok_since_connect = False

    # -- public API ----------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The device name from the settings."""
        return self._settings.name

    @property
    def settings(self) -> ModbusTargetSettings:
        """The target settings."""
        return self._settings

    @property
    def read_memory(self) -> ReadMemory:
        """What the device taught the read planner so far (splits, reduced size)."""
        return self._memory

    @property
    def read_plan(self) -> list[ReadBlock]:
        """The current read requests of one poll."""
        return list(self._blocks)

    @property
    def running(self) -> bool:
        """True while `run` is active."""
        return self._running

    async def run(self) -> None:
        """The owner task: connect, poll, serve queued writes; until cancelled.

        Never raises except `asyncio.CancelledError` (and RuntimeError when already running).
        On exit the connection is closed and queued commands fail with
        `ModbusConnectionError`.
        """
        if self._running:
            raise RuntimeError(f"modbus device {self.name}: run() is already active")
        self._running = True  # from here on, writes and reads queue for the owner
        try:
            async with self._io_lock:  # waits for a standalone read_once() to finish
                await self._owner_loop()
        finally:
            self._running = False
            self._close_client()
            self.stats.connected = False
            self._fail_commands(ModbusConnectionError(f"{self.name}: device stopped"))

    async def write(self, point: str, value: float) -> None:
        """Write ``value`` (engineering units) to ``point``, through the owner task.

        The value is validated and encoded first (`rackplane.core.registers.encode_write`: rounded
        to the register resolution, never wrapped). An RTU broadcast (unit 0) returns as
        soon as it is sent ("no response expected", BR-06).

        Raises:
            WriteRejected: unknown point, not writable, outside the write limits, not
                representable.
            ModbusConnectionError: the owner task is not running or the device is not
                connected (no waiting for a reconnect).
            ModbusTimeout: no valid reply within ``timeout_s`` (the connection is replaced).
            ModbusExceptionResponse: the device refused it (``.code``).
            ModbusDecodeError: the reply does not echo the write.
        """
        try:
            spec = self.regmap.point(point)
        except KeyError:
            raise WriteRejected(f"{self.name} has no point {point!r}") from None
        encoded = encode_write(spec, value)
        if not self._running:
            raise ModbusConnectionError(f"{self.name}: owner task not running; write refused")
        await self._submit(_Command("write", self._new_future(), encoded))

    async def read_once(self) -> list[Sample]:
        """Read every point once and return one sample per point (a dry connect).

        With `run` active the read is queued to the owner task (a disconnected device gives
        STALE samples); otherwise this call connects, reads and disconnects itself.

        Raises:
            ModbusConnectionError: (not running) the device cannot be connected.
            ModbusError: reads are impossible (RTU broadcast unit 0).
        """
        if self._broadcast:
            raise ModbusError(f"{self.name}: unit 0 on an RTU line is broadcast: no reads")
        if self._running:
            result: list[Sample] = await self._submit(_Command("read", self._new_future()))
            return result
        async with self._io_lock:
            try:
                if not await self._connect():
                    raise ModbusConnectionError(
                        f"{self.name}: cannot connect to {self._settings.host}:"
                        f"{self._settings.port} ({self._down_reason})"
                    )
                return await self._poll(count=False)
            finally:
                self._close_client()
                self.stats.connected = False

    # -- owner loop ----------------------------------------------------------------------------

    @property
    def _broadcast(self) -> bool:
        return self._settings.framer == "rtu" and self._settings.unit_id == 0

    async def _owner_loop(self) -> None:
        interval = max(self._settings.poll_interval_s, MIN_POLL_INTERVAL_S)
        polling = self._settings.poll_enabled and not self._broadcast
        t0 = self._clock.monotonic()
        next_poll = t0
        self._next_connect = t0
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        while True:
            try:
                _raise_if_cancelling(task)
                if self._client is not None and not self._client.connected:
                    # closed while idle (device reboot, gateway idle timeout): reconnect at
                    # once if this connection had worked, else back off
                    self._drop("connection_lost", immediate=self._ok_since_connect)
                if self._client is None and self._clock.monotonic() >= self._next_connect:
                    await self._connect()
                if self._commands:
                    await self._run_commands()
                now = self._clock.monotonic()
                if polling and now >= next_poll:
                    if self._client is not None:
                        samples = await self._poll(count=True)
                    else:
                        self.stats.polls += 1
                        samples = self._all_stale(self._down_reason)
                    self._emit(samples)
                    k = math.floor((self._clock.monotonic() - t0) / interval) + 1
                    following = t0 + k * interval
                    self.stats.overruns += max(0, round((following - next_poll) / interval) - 1)
                    next_poll = following
                deadline = next_poll if polling else math.inf
                if self._client is None:
                    deadline = min(deadline, self._next_connect)
                if self._internal_error is not None:
                    self._internal_error = None
                    self._log.info("modbus_owner_recovered")
                await self._wait(deadline, loop)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # a bug must not stop acquisition: log, reset, go on
                self.stats.count_error("internal_error")
                key = _bug_key(err)
                if key != self._internal_error:  # once per change, not once per cycle
                    self._internal_error = key
                    self._log.exception("modbus_owner_error")
                self._drop("modbus_error", immediate=False)
                await asyncio.sleep(MIN_RECONNECT_DELAY_S)

    async def _wait(self, deadline: float, loop: asyncio.AbstractEventLoop) -> None:
        """Sleep until ``deadline`` (monotonic s) or until a command is queued.

        A bare future resolved by a timer or by `_submit` (like ``asyncio.sleep``): the idle
        wait of every poll cycle costs no task cancellation and no exception, as an
        ``asyncio.timeout`` around ``Event.wait`` would.
        """
        if self._commands:
            return
        timeout = deadline - self._clock.monotonic()
        if timeout <= 0:
            await asyncio.sleep(0)
            return
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiter = waiter
        timer = loop.call_later(min(timeout, 3600.0), _resolve, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def _new_future(self) -> asyncio.Future[Any]:
        return asyncio.get_running_loop().create_future()

    async def _submit(self, cmd: _Command) -> Any:
        self._commands.append(cmd)
        waiter = self._waiter
        if waiter is not None:
            _resolve(waiter)
        return await cmd.future

    def _fail_commands(self, err: ModbusError) -> None:
        while self._commands:
            cmd = self._commands.popleft()
            if not cmd.future.done():
                cmd.future.set_exception(err)

    async def _run_commands(self) -> None:
        for _ in range(len(self._commands)):  # those queued now: a flood cannot starve polls
            _raise_if_cancelling()
            cmd = self._commands.popleft()
            if cmd.future.done():  # the caller gave up: do not act for it
                continue
            try:
                if cmd.kind == "read":
                    if self._client is None:
                        result: Any = self._all_stale(self._down_reason)
                    else:
                        result = await self._poll(count=False)
                else:
                    assert cmd.encoded is not None
                    await self._write(cmd.encoded)
                    result = None
            except ModbusError as err:
                if not cmd.future.done():
                    cmd.future.set_exception(err)
            except Exception as err:  # a bug: the caller gets a typed error, the task lives
                self.stats.count_error("internal_error")
                key = f"{cmd.kind}: {_bug_key(err)}"
                if key not in self._command_errors:  # once per kind of bug
                    self._command_errors.add(key)
                    self._log.exception("modbus_command_error", kind=cmd.kind)
                if not cmd.future.done():
                    cmd.future.set_exception(ModbusError(f"{self.name}: internal error: {err}"))
            else:
                if not cmd.future.done():
                    cmd.future.set_result(result)

    # -- connection ----------------------------------------------------------------------------

    def _new_client(self) -> _Client:
        s = self._settings
        client: _Client
        serial_port = getattr(s, "serial_port", None)
        if serial_port:  # ModbusSerialTargetSettings, or a daemon's target with the same fields
            client = AsyncModbusSerialClient(
                serial_port,
                framer=FramerType.RTU,
                baudrate=getattr(s, "baudrate", 19200),
                bytesize=getattr(s, "bytesize", 8),
                parity=getattr(s, "parity", "E"),
                stopbits=getattr(s, "stopbits", 1),
                name=f"modbus:{s.name}",
                timeout=s.timeout_s,
                retries=0,
                reconnect_delay=0,
                reconnect_delay_max=0,
            )
        else:
            client = AsyncModbusTcpClient(
                s.host,
                port=s.port,
                framer=FramerType.RTU if s.framer == "rtu" else FramerType.SOCKET,
                name=f"modbus:{s.name}",
                timeout=s.timeout_s,
                retries=0,
                reconnect_delay=0,  # no reconnect task inside pymodbus: this module owns it
                reconnect_delay_max=0,
            )
        ctx = getattr(client, "ctx", None)
        if ctx is None or not hasattr(ctx, "framer") or not hasattr(ctx, "max_buffer_size"):
            raise RuntimeError(
                "pymodbus client layout changed (ctx.framer / ctx.max_buffer_size missing): "
                "the BR-03 reply guard cannot be installed; pin pymodbus 3.16.x"
            )
        if s.framer == "socket":
            ctx.framer = _StrictSocketFramer(self._guard)
        ctx.max_buffer_size = RECEIVE_BUFFER_BYTES
        return client

    async def _connect(self) -> bool:
        """One connect attempt; on failure the next one is scheduled with backoff."""
        self.stats.connect_attempts += 1
        client = self._new_client()
        ok = False
        try:
            async with asyncio.timeout(self._settings.timeout_s + OUTER_TIMEOUT_MARGIN_S):
                ok = bool(await client.connect())
        except (TimeoutError, OSError, ModbusException, _SERIAL_SETUP_ERROR) as err:
            # a serial port that refuses its settings (termios EINVAL) is "not connected"
            self._log.debug("modbus_connect_error", error=str(err))
        if not ok:
            client.close()
            self._down_reason = "not_connected"
            delay = self._backoff.next()
            self._next_connect = self._clock.monotonic() + delay
            self.stats.count_error("not_connected")
            self._log.debug("modbus_connect_failed", retry_in_s=round(delay, 3))
            self._set_online(False, "not_connected", retry_in_s=round(delay, 3))
            return False
        self._client = client
        self._ok_since_connect = False
        self.stats.connected = True
        if self._ever_connected:
            self.stats.reconnects += 1
        self._ever_connected = True
        self._log.debug("modbus_connected", attempt=self.stats.connect_attempts)
        return True

    def _transaction_ok(self) -> None:
        """A valid reply arrived: the link works (resets the backoff)."""
        self._ok_since_connect = True
        self._backoff.reset()
        self._set_online(True, None)

    def _set_online(self, online: bool, reason: str | None, **extra: Any) -> None:
        """Log the device going offline / online once per change (not per attempt)."""
        if online == self._online:
            return
        self._online = online
        if online:
            self._log.info("modbus_online", connect_attempts=self.stats.connect_attempts)
        else:
            self._log.warning("modbus_offline", reason=reason, **extra)

    def _close_client(self) -> None:
        self._watchdog.close()  # no request in flight: the next one re-arms it
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # closing must never fail the owner
                self._log.debug("modbus_close_error", exc_info=True)

    def _drop(self, reason: str, *, immediate: bool) -> None:
        """Close the connection (a new client is made for the next one) and schedule the
        next connect: at once (``immediate``) or after the next backoff delay.

        Without a connection this never postpones a connect already scheduled: a request
        refused while disconnected must not touch the schedule or the backoff (field bug,
        BR-07: a write refused every second re-armed a 1-2 s backoff each time, so the device
        never reconnected). Only when no attempt is pending (an internal error in the connect
        path) is one scheduled, backed off.
        """
        now = self._clock.monotonic()
        if self._client is None:
            if self._next_connect <= now:
                self._next_connect = now + self._backoff.next()
            return
        self._close_client()
        self.stats.connected = False
        self._down_reason = reason
        self._next_connect = now if immediate else now + self._backoff.next()
        retry = round(self._next_connect - now, 3)
        self._log.debug("modbus_disconnected", reason=reason, retry_in_s=retry)
        if not immediate:
            self._set_online(False, reason, retry_in_s=retry)

    def _drop_after(self, err: ModbusError) -> None:
        """Drop the connection after a request failed with a transport error ``err``.

        Nothing happens while disconnected (the request was refused, see `_drop`). A
        connection found closed (device reboot, peer killed) is reopened at once if it had
        worked, like an idle close; any other failure (timeout, desync, mismatch) backs off.
        """
        client = self._client
        if client is None:
            return
        if isinstance(err, ModbusConnectionError) and not client.connected:
            self._drop("connection_lost", immediate=self._ok_since_connect)
        else:
            self._drop(err.reason, immediate=False)

    # -- requests ------------------------------------------------------------------------------

    async def _transact(
        self,
        expect: _Expect,
        call: Callable[[_Client], Awaitable[Any]],
        running: tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]] | None = None,
    ) -> Any:
        """Send one request through the current client; typed errors only.

        ``running``: the running loop and current task, when the caller has them (a poll
        looks them up once for all its requests: each lookup is a getpid() system call).
        """
        client = self._client
        if client is None:
            why = "" if self._down_reason == "not_connected" else f" ({self._down_reason})"
            raise ModbusConnectionError(f"{self.name}: not connected{why}")
        if not client.connected:
            raise ModbusConnectionError(f"{self.name}: connection closed by the peer")
        self._guard.begin(expect)
        self.stats.requests += 1
        if running is None:
            loop = asyncio.get_running_loop()
            current = asyncio.current_task(loop)
            assert current is not None  # always called from a task (the owner, read_once's)
            running = (loop, current)
        loop, task = running
        cancelling = task.cancelling()
        watchdog = self._watchdog
        watchdog.start(loop, task, loop.time() + self._settings.timeout_s
                       + OUTER_TIMEOUT_MARGIN_S)
        try:
            reply = await call(client)
        except BaseException as err:
            typed = self._request_error(err, task, cancelling)
            if typed is None:
                raise
            raise typed from None
        finally:
            watchdog.stop()
            if watchdog.fired:  # its cancel was swallowed (gh-86296) or lost to another
                watchdog.fired = False  # error: take it back, as asyncio.timeout does
                task.uncancel()
            self._guard.end()
        return self._check_reply(expect, reply)

    def _request_error(self, err: BaseException, task: asyncio.Task[Any],
                       cancelling: int) -> ModbusError | None:
        """The typed error for a request that raised ``err`` (None: re-raise ``err``).

        ``cancelling``: ``task.cancelling()`` before the request. A cancel by the
        `_RequestWatchdog` is a timeout, taken back from the task as ``asyncio.timeout``
        does; any other cancel propagates.
        """
        if isinstance(err, asyncio.CancelledError):
            watchdog = self._watchdog
            if watchdog.fired:  # our cancel (as asyncio.timeout decides it): a timeout
                watchdog.fired = False
                if task.uncancel() <= cancelling:
                    return ModbusTimeout(
                        f"{self.name}: request abandoned after "
                        f"{self._settings.timeout_s + OUTER_TIMEOUT_MARGIN_S} s")
            return None
        if isinstance(err, ConnectionException):
            return ModbusConnectionError(f"{self.name}: {err}")
        if isinstance(err, ModbusIOException):
            if self._guard.desync:
                e: ModbusError = ModbusDecodeError(f"{self.name}: byte stream out of step")
                e.reason = "desync"
                return e
            if self._guard.bad_reply:
                e = ModbusDecodeError(
                    f"{self.name}: reply did not match the request (unit, function, length)"
                )
                e.reason = "reply_mismatch"
                return e
            return ModbusTimeout(f"{self.name}: no reply within {self._settings.timeout_s} s "
                                 f"({err})")
        if isinstance(err, TimeoutError):
            return ModbusTimeout(f"{self.name}: request abandoned after "
                                 f"{self._settings.timeout_s + OUTER_TIMEOUT_MARGIN_S} s")
        if isinstance(err, ValueError | TypeError):
            return ModbusError(f"{self.name}: request refused by pymodbus: {err}")
        if isinstance(err, ModbusException):
            return ModbusError(f"{self.name}: {err}")
        if isinstance(err, OSError):
            return ModbusConnectionError(f"{self.name}: {err}")
        return None

    async def _read(self, op: _ReadOp, client: _Client | None,
                    loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> list[int]:
        """One read request: `_transact` and `_check_reply` for a read, in one coroutine
        (a poll makes several per cycle). Returns the registers, or the bits as 0/1
        (``op.count`` of them). Typed errors only.
        """
        if client is None:
            why = "" if self._down_reason == "not_connected" else f" ({self._down_reason})"
            raise ModbusConnectionError(f"{self.name}: not connected{why}")
        if not client.connected:
            raise ModbusConnectionError(f"{self.name}: connection closed by the peer")
        guard = self._guard
        guard.begin(op.expect, op.fast)
        self.stats.requests += 1
        cancelling = task.cancelling()
        watchdog = self._watchdog
        watchdog.start(loop, task, loop.time() + self._settings.timeout_s
                       + OUTER_TIMEOUT_MARGIN_S)
        try:
            reply = await getattr(client, op.method)(op.start, count=op.count,
                                                     device_id=op.unit)
        except BaseException as err:
            typed = self._request_error(err, task, cancelling)
            if typed is None:
                raise
            raise typed from None
        finally:
            watchdog.stop()
            if watchdog.fired:  # as in `_transact`
                watchdog.fired = False
                task.uncancel()
            guard.end()
        fc = op.function_code
        if reply is not None and reply.dev_id == op.unit and reply.function_code == fc:
            # the valid reply (`_check_reply` for it, without its chain of tests)
            if fc > 2:
                registers: list[int] = reply.registers
                if len(registers) == op.count:
                    return registers  # pymodbus' ints (">H"), read, never modified
            elif len(reply.bits) >= op.count:
                return [1 if b else 0 for b in reply.bits[:op.count]]
        reply = self._check_reply(op.expect, reply)  # raises: reply_mismatch, exception
        if fc in (1, 2):  # pragma: no cover (`_check_reply` passes what the test above does)
            return [1 if b else 0 for b in reply.bits[:op.count]]
        regs: list[int] = reply.registers
        return regs

    def _check_reply(self, expect: _Expect, reply: Any) -> Any:
        if reply is None:
            if expect.no_response:
                return None
            raise ModbusDecodeError(f"{self.name}: empty reply")
        if not isinstance(reply, ModbusPDU):
            raise ModbusDecodeError(f"{self.name}: unexpected reply {type(reply).__name__}")
        mismatch = None
        if reply.dev_id != expect.unit:
            mismatch = f"unit {reply.dev_id} != {expect.unit}"
        elif reply.isError():
            if reply.function_code != expect.function_code | 0x80:
                mismatch = f"exception for function {reply.function_code & 0x7F}"
            else:
                raise ModbusExceptionResponse(int(reply.exception_code))
        elif reply.function_code != expect.function_code:
            mismatch = f"function {reply.function_code} != {expect.function_code}"
        elif expect.function_code in (3, 4) and len(reply.registers) != expect.count:
            mismatch = f"{len(reply.registers)} registers for {expect.count}"
        elif expect.function_code in (1, 2) and len(reply.bits) < expect.count:
            mismatch = f"{len(reply.bits)} bits for {expect.count}"
        if mismatch is not None:
            self.stats.rejected_frames += 1
            e = ModbusDecodeError(f"{self.name}: reply does not match the request: {mismatch}")
            e.reason = "reply_mismatch"
            raise e
        return reply

    async def _write(self, enc: EncodedWrite) -> None:
        p = enc.point
        unit = self._settings.unit_id
        broadcast = self._broadcast
        regs = list(enc.registers)
        if p.table == "coil":
            on = bool(regs[0])
            expect = _Expect(unit, 5, echo=struct.pack(">HH", p.address, 0xFF00 if on else 0),
                             no_response=broadcast)

            def call(c: _Client) -> Awaitable[Any]:
                return c.write_coil(p.address, on, device_id=unit,
                                    no_response_expected=broadcast)
        elif len(regs) == 1:
            expect = _Expect(unit, 6, echo=struct.pack(">HH", p.address, regs[0]),
                             no_response=broadcast)

            def call(c: _Client) -> Awaitable[Any]:
                return c.write_register(p.address, regs[0], device_id=unit,
                                        no_response_expected=broadcast)
        else:
            expect = _Expect(unit, 16, echo=struct.pack(">HH", p.address, len(regs)),
                             no_response=broadcast)

            def call(c: _Client) -> Awaitable[Any]:
                return c.write_registers(p.address, regs, device_id=unit,
                                         no_response_expected=broadcast)

        try:
            reply = await self._transact(expect, call)
            if not broadcast:
                self._check_echo(expect, p, regs, reply)
        except ModbusError as err:
            self.stats.write_errors += 1
            self.stats.count_error(err.reason)
            self._note_write_failed(p, enc.value, err)
            if isinstance(err, ModbusTimeout | ModbusDecodeError | ModbusConnectionError):
                self._drop_after(err)
            raise
        self.stats.writes += 1
        self._transaction_ok()
        self._note_write_ok(p, enc.value)
        if broadcast and p.name not in self._broadcast_noted:
            self._broadcast_noted.add(p.name)  # a property of the point: said once
            self._log.info("modbus_write_no_response_expected", point=p.name, value=enc.value,
                           note="RTU broadcast (unit 0): no response expected")
        elif broadcast:
            self._log.debug("modbus_write_no_response_expected", point=p.name, value=enc.value)
        else:
            self._log.debug("modbus_write", point=p.name, value=enc.value)

    def _note_write_failed(self, p: PointSpec, value: float, err: ModbusError) -> None:
        """Log a point's write failure once per change of reason (counted always)."""
        failures = self._write_failures.get(p.name, 0) + 1
        self._write_failures[p.name] = failures
        if self._write_problem.get(p.name) != err.reason:
            self._write_problem[p.name] = err.reason
            self._log.warning("modbus_write_failed", point=p.name, value=value,
                              reason=err.reason, error=str(err), failed_writes=failures)

    def _note_write_ok(self, p: PointSpec, value: float) -> None:
        """After failures, log the first successful write to the point once."""
        was = self._write_problem.pop(p.name, None)
        failures = self._write_failures.pop(p.name, 0)
        if was is not None:
            self._log.info("modbus_write_recovered", point=p.name, value=value, was=was,
                           failed_writes=failures)

    def _check_echo(self, expect: _Expect, p: PointSpec, regs: list[int], reply: Any) -> None:
        ok = reply.address == p.address
        if expect.function_code == 6:
            ok = ok and list(reply.registers[:1]) == regs[:1]
        elif expect.function_code == 16:
            ok = ok and reply.count == len(regs)
        elif expect.function_code == 5:
            ok = ok and bool(reply.bits[0]) == bool(regs[0])
        if not ok:
            e = ModbusDecodeError(f"{self.name}: write reply does not echo the request")
            e.reason = "reply_mismatch"
            raise e

    # -- polling -------------------------------------------------------------------------------

    def _plan(self) -> list[ReadBlock]:
        s = self._settings
        blocks = plan_reads(self.regmap.points, s.max_registers_per_read,
                            s.max_gap_registers, self._memory)
        self.stats.read_limit = min(
            s.max_registers_per_read, self._memory.max_registers or s.max_registers_per_read
        )
        return blocks

    def _compile(self) -> None:
        """Prepare the requests of the current plan (`_ReadOp`) and the order that puts the
        plan's samples in map order (None when the plan does not cover each point once)."""
        unit = self._settings.unit_id
        self._ops = [_ReadOp(b, unit) for b in self._blocks]
        names = [n for op in self._ops for n in op.decoder.names]
        index = {n: i for i, n in enumerate(names)}
        self._order = ([index[n] for n in self._point_names]
                       if len(index) == len(names) == len(self._point_names)
                       and all(n in index for n in self._point_names) else None)

    def _learn(self, memory: ReadMemory, block: ReadBlock, code: int) -> None:
        self._memory = memory
        self._blocks = self._plan()
        self._compile()
        self._log.info(
            "modbus_read_plan_changed", cause=ModbusExceptionResponse.NAMES.get(code, code),
            table=block.table, start=block.start, count=block.count,
            requests=len(self._blocks), read_limit=self.stats.read_limit,
            avoided_addresses=sorted(a for t, a in memory.bad if t == block.table),
        )

    async def _poll(self, *, count: bool) -> list[Sample]:
        """Read every block once; one sample per point (map order)."""
        if count:
            self.stats.polls += 1
        ops = self._ops
        client = self._client
        queue: deque[_ReadOp] = deque(ops)
        # Common case: every planned request answers. Its samples are collected in plan
        # order (``flat``) and put in map order at the end; the first exception or plan
        # change switches to the per-name dict ``out`` for the rest of the poll.
        flat: list[Sample] = []
        done = 0  # planned requests whose samples are in ``flat``
        out: dict[str, Sample] | None = None
        retries = 0
        clean = True
        failure: _Failure | None = None
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        assert task is not None  # the owner task, or read_once's caller
        clock = self._clock
        stats = self.stats
        while queue:
            if task.cancelling():  # a cancel a library swallowed (`_raise_if_cancelling`)
                raise asyncio.CancelledError()
            op = queue.popleft()
            decoder = op.decoder
            try:
                data = await self._read(op, client, loop, task)
            except ModbusExceptionResponse as exc:
                if out is None:
                    out = _by_name(ops, flat, done)
                block = decoder.block
                stats.count_error(exc.reason)
                self._transaction_ok()  # a valid answer: the link works
                if exc.code not in _GATEWAY_CODES:
                    self._mark_reachable()  # the unit itself answered
                if exc.code in (2, 3):
                    learned = learn_from_exception(
                        block, exc.code, self._memory, self._settings.max_registers_per_read
                    )
                    if learned.retry and retries < MAX_PLAN_RETRIES_PER_POLL:
                        retries += 1
                        self._learn(learned.memory, block, exc.code)
                        sub = plan_reads(block.points, self._settings.max_registers_per_read,
                                         self._settings.max_gap_registers, self._memory)
                        unit = self._settings.unit_id
                        queue.extendleft(_ReadOp(b, unit) for b in reversed(sub))
                        continue
                    self._mark(out, block.points, Quality.BAD, exc.reason)
                elif exc.code == 6:
                    clean = False
                    self._mark(out, block.points, Quality.STALE, exc.reason)
                elif exc.code in _GATEWAY_CODES:
                    failure = _Failure(exc, exc.reason, drop_connection=False)
                    break
                else:
                    self._mark(out, block.points, Quality.BAD, exc.reason)
            except ModbusError as err:
                if out is None:
                    out = _by_name(ops, flat, done)
                stats.count_error(err.reason)
                failure = _Failure(err, err.reason, drop_connection=True)
                break
            else:
                t_mono = clock.monotonic()
                # `_read` returns ``op.count`` registers as pymodbus unpacked them (">H":
                # 0..0xFFFF) or bits as 0/1: well formed, so no copy and range check
                decoded = decoder.decode_words(data, clock.wall_ns(), t_mono)
                samples = decoded.samples
                if out is None:
                    flat += samples
                    done += 1
                else:
                    out.update(zip(decoder.names, samples, strict=True))
                for name in decoded.suspect_order:
                    if name not in self._warned_order:
                        self._warned_order.add(name)
                        p = self.regmap.point(name)
                        self._log.warning(
                            "modbus_probable_word_order_error", point=name, type=p.type,
                            order=p.order, value=samples[decoder.names.index(name)].value,
                            hint="a finite float below 1e-30: check the point's byte/word "
                            "order (FIELD-CASES BR-01)",
                        )
                stats.last_ok_mono = t_mono
                if not (self._ok_since_connect and self._online and self._backoff.clean):
                    self._transaction_ok()  # else it has nothing to change
                if not stats.available:
                    self._mark_reachable()
        if failure is not None:
            if failure.reason in ("gateway_path_unavailable", "gateway_target_no_response"):
                self._mark_unreachable(failure.reason)
            if failure.drop_connection:
                self._drop_after(failure.error)
        elif clean and count:
            stats.ok += 1
        order = self._order
        if out is None:
            if (order is not None and ops is self._ops and done == len(ops)
                    and len(flat) == len(order)):
                return [flat[i] for i in order]  # every point answered by the plan
            out = _by_name(ops, flat, done)
        if len(out) < len(self._point_names):  # points no reply covered: STALE
            reason = failure.reason if failure is not None else "stale"
            rest = [p for p in self.regmap.points if p.name not in out]
            self._mark(out, rest, Quality.STALE, reason)
        return [out[name] for name in self._point_names]

    def _mark(
        self, out: dict[str, Sample], points: Any, quality: Quality, reason: str
    ) -> None:
        ts_ns = self._clock.wall_ns()
        t_mono = self._clock.monotonic()
        for p in points:
            out[p.name] = invalid(p.name, p.unit, ts_ns, t_mono, quality, reason)

    def _all_stale(self, reason: str) -> list[Sample]:
        out: dict[str, Sample] = {}
        self._mark(out, self.regmap.points, Quality.STALE, reason)
        return [out[p.name] for p in self.regmap.points]

    def _mark_reachable(self) -> None:
        if not self.stats.available:
            self.stats.available = True
            self._log.info("modbus_unit_available")

    def _mark_unreachable(self, reason: str) -> None:
        if self.stats.available:
            self.stats.available = False
            self._log.warning("modbus_unit_unavailable", reason=reason)

    def _emit(self, samples: list[Sample]) -> None:
        stale = bad = 0
        problems = self._point_problem
        for s in samples:
            q = s.quality
            if q is _GOOD:
                if problems and s.point in problems:  # else `_note_point` has nothing to do
                    self._note_point(s)
                continue
            if q is _STALE:
                stale += 1  # not a point problem (`_note_point` ignores it)
                continue
            bad += 1
            self._note_point(s)
        self.stats.stale_points = stale
        self.stats.invalid_points = bad
        try:
            self._on_samples(samples)
        except Exception:
            self.stats.count_error("on_samples_error")
            if not self._callback_failing:
                self._callback_failing = True
                self._log.exception("modbus_on_samples_failed")
        else:
            if self._callback_failing:
                self._callback_failing = False
                self._log.info("modbus_on_samples_recovered")

    def _note_point(self, s: Sample) -> None:
        """Log a point's own problems once per change (device-wide reasons are logged once
        per device instead)."""
        if s.quality is Quality.STALE or s.reason in _DEVICE_REASONS:
            return  # device-wide, or retried next poll (server_busy): not a point problem
        previous = self._point_problem.get(s.point)
        if s.quality is Quality.GOOD:
            if previous is not None:
                del self._point_problem[s.point]
                self._log.info("modbus_point_recovered", point=s.point, was=previous)
            return
        reason = s.reason or s.quality.value
        if previous != reason:
            self._point_problem[s.point] = reason
            self._log.warning(
                "modbus_point_invalid", point=s.point, quality=s.quality.value, reason=reason,
                value=s.value,
            )


__all__ = ["ModbusDevice", "ModbusSerialTargetSettings", "ModbusStats"]
