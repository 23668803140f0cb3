"""`ModbusDevice`: one device's owner task (connect, poll on a fixed-rate schedule, write,
dry read); the pymodbus side is `rackplane.io.modbus.client`."""

from __future__ import annotations

import asyncio
import math
import random
import traceback
from collections import deque
from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field, model_validator

from rackplane.clock import Clock
from rackplane.core.polling import all_stale, mark_stale
from rackplane.core.registers import (
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
    ModbusError,
    ModbusExceptionResponse,
    WriteFenced,
    WriteRejected,
)
from rackplane.io.cancel import raise_if_cancelling
from rackplane.io.modbus.bulkhead import _Bulkhead
from rackplane.io.modbus.client import (
    _GATEWAY_CODES,
    _by_name,
    _Client,
    _PymodbusClient,
    _ReadOp,
)
from rackplane.io.modbus.link import ModbusLink
from rackplane.io.modbus.support import (
    MAX_PLAN_RETRIES_PER_POLL,
    MIN_POLL_INTERVAL_S,
    MIN_RECONNECT_DELAY_S,
    ModbusStats,
    _Backoff,
    _Command,
    _Failure,
    _RequestWatchdog,
)
from rackplane.log import get_logger
from rackplane.settings import ModbusTargetSettings

__all__ = ["ModbusDevice", "ModbusSerialTargetSettings"]

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




_GOOD = Quality.GOOD
_STALE = Quality.STALE
#: Reasons that describe the device or its link, not one point: no per-point log line.
_DEVICE_REASONS = frozenset(
    {"timeout", "not_connected", "connection_lost", "reply_mismatch", "desync",
     "gateway_path_unavailable", "gateway_target_no_response", "stopped", "modbus_error"}
)


def _resolve(waiter: asyncio.Future[None]) -> None:
    """Wake the owner task's idle wait (timer or queued command), once."""
    if not waiter.done():
        waiter.set_result(None)


def _bug_key(err: BaseException) -> str:
    """What makes two internal errors "the same bug" for logging: type and raising line."""
    tb = traceback.extract_tb(err.__traceback__)
    where = f"{tb[-1].filename}:{tb[-1].lineno}" if tb else "?"
    return f"{type(err).__name__} at {where}"



# --- the device ------------------------------------------------------------------------------


class ModbusDevice(_Bulkhead, _PymodbusClient):
    """One Modbus TCP device: one connection, one owner task (`run`).

    Args:
        settings: the target (host, port, unit, framer, timing, limits).
        regmap: the register map; default: ``load_register_map(settings.register_map)``.
        clock: monotonic time for scheduling, wall time for sample timestamps.
        on_samples: called from the owner task with one `Sample` per configured point per
            poll, in map order (not called when ``settings.poll_enabled`` is False). It must
            not block; an exception from it is logged and counted, never fatal.
        log: a structlog-style logger (default ``get_logger("rackplane.io.modbus")``), bound
            to the device.
        rng: random source of the reconnect jitter (tests pass a seeded one).
        link: the connection this device shares with the other units at its address
            (`rackplane.io.modbus.link.ModbusLinks.get`); default: a connection of its own.

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
        link: ModbusLink | None = None,
    ) -> None:
        self._settings = settings
        self.regmap = regmap if regmap is not None else load_register_map(settings.register_map)
        self._clock = clock
        self._on_samples = on_samples
        self._log = (log if log is not None else get_logger("rackplane.io.modbus")).bind(
            device=settings.name, host=settings.host, port=settings.port, unit=settings.unit_id
        )
        self.stats = ModbusStats(read_limit=settings.max_registers_per_read)
        self._link = link if link is not None else ModbusLink()
        #: Asked right before every write (redundant pairs: `DaemonFrame.may_write`); False
        #: refuses the write with `WriteFenced` before anything is encoded or sent.
        self.write_gate: Callable[[], bool] | None = None
        self._link.join(self)
        self._guard = self._link.guard
        self._unit_failures = 0  # timeouts in a row (shared link) or the gateway's 10/11
        self._dormant_until: float | None = None  # unavailable: next re-probe (monotonic)
        self._unavailable_reason = ""
        self._refused_until: dict[str, float] = {}  # refused point -> re-probe (monotonic)
        self._refused_reason: dict[str, str] = {}
        self._refused_logged: set[str] = set()
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
    def connection_serial(self) -> int:
        """Successful TCP connects of this device's connection so far (0: never connected):
        it changes with every new connection (a controller of a pair claims its epoch on
        each one, `sims.epoch_gate`)."""
        return self._link.connects

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
            self._release_client()
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
            WriteFenced: ``write_gate`` says this instance may not write now.
        """
        if self.write_gate is not None and not self.write_gate():
            raise WriteFenced(f"{self.name}: {point}: this instance does not hold the "
                              "leadership lease; write refused")
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
                self._release_client()
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
                raise_if_cancelling(task)
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
            raise_if_cancelling()
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
            except (ModbusError, WriteRejected) as err:  # WriteFenced: the lease lost meanwhile
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

    def _transaction_ok(self) -> None:
        """A valid reply arrived: the link works (resets the backoff)."""
        self._link.silent_units.clear()
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
        """Read every block once; one sample per point (map order).

        An unavailable unit is not read before its re-probe time (its points are STALE with
        the reason that made it unavailable); on a shared link the poll holds the link (one
        request at a time on the connection).
        """
        dormant = self._dormant_until
        if dormant is not None and self._clock.monotonic() < dormant:
            if count:
                self.stats.polls += 1
            self.stats.dormant_polls += 1
            return self._all_stale(self._unavailable_reason)
        async with self._link.lock:
            return await self._poll_link(count=count)

    async def _poll_link(self, *, count: bool) -> list[Sample]:
        if self._refused_until:
            self._reprobe_refused()
        if self._client is not self._link.client:  # another unit replaced the connection
            self._client = None
            self.stats.connected = False
            self._next_connect = self._clock.monotonic()
            if count:
                self.stats.polls += 1
            return self._all_stale("connection_lost")
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
            if task.cancelling():  # a cancel a library swallowed (`raise_if_cancelling`)
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
                stats.exception_replies += 1
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
                    if len(block.points) == 1:
                        self._refuse(block.points[0].name, exc.reason)
                elif exc.code == 6:
                    clean = False
                    mark_stale(out, block.points, exc.reason, self._clock.wall_ns(),
                               self._clock.monotonic())
                elif exc.code in _GATEWAY_CODES:
                    failure = _Failure(exc, exc.reason, drop_connection=False)
                    break
                else:
                    self._mark(out, block.points, Quality.BAD, exc.reason)
            except ModbusError as err:
                if out is None:
                    out = _by_name(ops, flat, done)
                stats.count_error(err.reason)
                failure = _Failure(err, err.reason,
                                   drop_connection=self._transport_failure(err))
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
                if not stats.available or self._unit_failures:
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
            if self._refused_reason:  # ... or refused, not read: BAD, the refusal's reason
                self._fill_refused(out)
            reason = failure.reason if failure is not None else "stale"
            rest = [p for p in self.regmap.points if p.name not in out]
            mark_stale(out, rest, reason, self._clock.wall_ns(), self._clock.monotonic())
        return [out[name] for name in self._point_names]

    def _mark(
        self, out: dict[str, Sample], points: Any, quality: Quality, reason: str
    ) -> None:
        """BAD samples for ``points`` (STALE ones come from `rackplane.core.polling`)."""
        ts_ns = self._clock.wall_ns()
        t_mono = self._clock.monotonic()
        for p in points:
            out[p.name] = invalid(p.name, p.unit, ts_ns, t_mono, quality, reason)

    def _all_stale(self, reason: str) -> list[Sample]:
        return all_stale(self.regmap.points, reason, self._clock.wall_ns(),
                         self._clock.monotonic())

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
        self.stats.invalid_samples += bad
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


