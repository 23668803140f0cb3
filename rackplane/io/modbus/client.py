"""The pymodbus side of a Modbus device: the only daemon-side module importing pymodbus
(3.16.x). The strict reply framer (FIELD-CASES BR-03), the client of a target (TCP or RTU
over a serial line) and the translation of whatever the library raises into
`rackplane.errors` types (the `_PymodbusClient` part of `rackplane.io.modbus.ModbusDevice`).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pymodbus.client import AsyncModbusSerialClient, AsyncModbusTcpClient
from pymodbus.exceptions import ConnectionException, ModbusException, ModbusIOException
from pymodbus.framer import FramerSocket, FramerType
from pymodbus.pdu import DecodePDU, ModbusPDU

from rackplane.clock import Clock
from rackplane.core.registers import BlockDecoder, EncodedWrite, PointSpec, ReadBlock
from rackplane.core.samples import Sample
from rackplane.errors import (
    ModbusConnectionError,
    ModbusDecodeError,
    ModbusError,
    ModbusExceptionResponse,
    ModbusTimeout,
    WriteFenced,
)
from rackplane.io.modbus.rtu_line import _RtuLine, t35_s
from rackplane.io.modbus.support import (
    OUTER_TIMEOUT_MARGIN_S,
    RECEIVE_BUFFER_BYTES,
    ModbusStats,
)
from rackplane.settings import ModbusTargetSettings

_Client = AsyncModbusTcpClient | AsyncModbusSerialClient

try:  # POSIX: pyserial reports a port refusing its line settings as termios.error
    import termios

    _SERIAL_SETUP_ERROR: type[Exception] = termios.error
except ImportError:  # pragma: no cover (Windows)
    class _SerialSetupError(Exception):
        """Never raised: no termios on this platform."""

    _SERIAL_SETUP_ERROR = _SerialSetupError

_READ_CALLS: dict[int, str] = {
    1: "read_coils",
    2: "read_discrete_inputs",
    3: "read_holding_registers",
    4: "read_input_registers",
}
_GATEWAY_CODES = frozenset({10, 11})
_NEVER_DISCONNECT = 1 << 62

logging.getLogger("pymodbus").setLevel(logging.CRITICAL)


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
        #: The counters of the device whose request is outstanding (a shared link's
        #: members point it at their own before each request).
        self.stats = stats
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
        self.stats.dropped_frames[reason] = self.stats.dropped_frames.get(reason, 0) + 1
        if same_tid:
            self.stats.rejected_frames += 1
            self.bad_reply = True
        else:
            self.stats.stale_frames += 1
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
        self.stats.dropped_frames["desync"] = self.stats.dropped_frames.get("desync", 0) + 1


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



class _PymodbusClient:
    """Connecting and the library's replies and errors, for `ModbusDevice` (a mixin: the
    device sets these attributes up)."""

    _settings: ModbusTargetSettings
    _clock: Clock
    _log: Any
    stats: ModbusStats
    _guard: _ReplyGuard
    write_gate: Callable[[], bool] | None
    _watchdog: Any
    _backoff: Any
    _client: _Client | None
    _link: Any  # rackplane.io.modbus.link.ModbusLink
    _ever_connected: bool
    _down_reason: str
    _next_connect: float
    _ok_since_connect: bool
    _broadcast_noted: set[str]
    _write_failures: dict[str, int]
    _write_problem: dict[str, str]

    @property
    def name(self) -> str:
        raise NotImplementedError

    @property
    def _broadcast(self) -> bool:
        raise NotImplementedError

    def _transaction_ok(self) -> None:
        raise NotImplementedError

    def _drop_after(self, err: ModbusError) -> None:
        raise NotImplementedError

    def _transport_failure(self, err: ModbusError) -> bool:
        raise NotImplementedError

    def _set_online(self, online: bool, reason: str | None, **extra: Any) -> None:
        raise NotImplementedError

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
            self._link.line = None
        else:  # RTU, on a serial line or through a transparent TCP gateway
            self._link.line = _RtuLine(
                ctx, self._guard, local_echo=s.local_echo,
                t35=t35_s(getattr(s, "baudrate", 19200)) if serial_port else 0.0,
                max_wait_s=s.timeout_s)
        ctx.max_buffer_size = RECEIVE_BUFFER_BYTES
        # pymodbus closes the connection itself after retries + 3 timeouts in a row: on a
        # shared gateway connection one silent unit would drop every unit's connection.
        # Whether a timeout replaces the connection is decided here (`rackplane.io.modbus.link`)
        ctx.max_until_disconnect = ctx.count_until_disconnect = _NEVER_DISCONNECT
        return client

    async def _connect(self) -> bool:
        """One connect attempt; on failure the next one is scheduled with backoff.

        On a shared link (`rackplane.io.modbus.link`) the link's open connection is taken
        as it is (no new connection); only when it has none does this device open one, for
        every member.
        """
        link = self._link
        async with link.lock:
            shared = link.client
            if shared is not None and shared.connected:
                self._client = shared
                link.users.add(id(self))
                self._ok_since_connect = False
                self.stats.connected = True
                self._log.debug("modbus_connection_shared", link=str(link.key))
                return True
            return await self._connect_new()

    async def _connect_new(self) -> bool:
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
        link = self._link
        if link.client is not None and link.client is not client:
            link.client.close()  # a closed one another member has not noticed yet
        link.client = client
        link.users = {id(self)}
        link.connects += 1
        link.silent_units.clear()
        self._ok_since_connect = False
        self.stats.connected = True
        if self._ever_connected:
            self.stats.reconnects += 1
        self._ever_connected = True
        self._log.debug("modbus_connected", attempt=self.stats.connect_attempts)
        return True


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
        line = self._link.line
        if line is not None:
            await line.quiet()
        self._guard.stats = self.stats
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
        line = self._link.line
        if line is not None:
            await line.quiet()
        guard = self._guard
        guard.stats = self.stats
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
            async with self._link.lock:  # one request at a time on a shared connection
                # the fence asked again at the last moment before the request goes out: a
                # write queued, or waiting for the shared connection, while this instance lost
                # its lease (e.g. paused past its renew deadline) never reaches the device
                # (issue 15: "writes nothing, not even a queued write")
                if self.write_gate is not None and not self.write_gate():
                    self.stats.count_error("write_fenced")
                    raise WriteFenced(f"{self.name}: {p.name}: the leadership lease was lost "
                                      "while the write waited; not sent")
                reply = await self._transact(expect, call)
            if not broadcast:
                self._check_echo(expect, p, regs, reply)
        except ModbusError as err:
            self.stats.write_errors += 1
            self.stats.count_error(err.reason)
            self._note_write_failed(p, enc.value, err)
            if (isinstance(err, ModbusTimeout | ModbusDecodeError | ModbusConnectionError)
                    and self._transport_failure(err)):
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

