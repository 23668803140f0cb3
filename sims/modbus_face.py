"""The simulators' Modbus TCP face: a pymodbus 3.16 server serving one register map.

The face serves the same `RegisterMap` the daemon reads (DESIGN §4), for one or more unit ids,
on 127.0.0.1. The simulator pushes engineering values with `ModbusFace.update` (encoded with
`rackplane.core.registers`, so word order, scale and sentinels are the map's); client writes to
writable points are decoded, checked against the point's write limits, stored in the holding
registers (or coils) and delivered to ``on_write(point, value)``.

What a request sees, in this order (the Modbus spec's own order: quantity, then address):

1. blackhole (`ModbusFace.blackhole`, or the request's unit in `ModbusFace.silent_units`):
   the request is read and dropped, no reply, the TCP connection stays open: a half-open
   link (FIELD-CASES BR-07), or one dead unit behind a gateway; writes are not applied;
2. reply delay (`ModbusFace.reply_delay_s`): the reply waits, per request, concurrently;
3. an injected exception for the whole unit (`inject_exception` without ``address``):
   e.g. 10/11 from a gateway, 6 busy (BR-04);
4. a unit the face does not serve: exception 11 (gateway target failed to respond);
5. more registers than `ModbusFace.max_registers_per_request` (or 125; 2000 bits): exception 3
   (BR-05);
6. an injected exception for a register range overlapping the request (BR-04);
7. any address not occupied by a point of the map (or set with `set_registers`): exception 2
   (the "gap" of BR-05);
8. writes: only whole writable points (else 2 for a non-writable or unimplemented address, 3
   for part of a multi-register point); a value outside [write_min, write_max], or a sentinel
   or NaN, is refused with 3 and changes nothing;
9. writes: the face's `ModbusFace.admit_write` hook (the simulated CDU's controller-epoch
   gate, `sims.epoch_gate`) sees the decoded write with the TCP connection it came on
   (`FaceWrite.connection`, numbered from 1 per face in accept order) and may refuse it with
   an exception code; nothing changes then.

pymodbus details measured on 3.16.1 that shaped this module:

- the `pymodbus.simulator` SimDevice ``action`` hook does not receive the unit id, and
  ``SimDevice(id=0)`` is a catch-all for every unit not listed, so unit 0 cannot be served as
  an ordinary device beside others: the face uses its own datastore (a
  ``ModbusServerContext`` subclass with ``old_simulator = True``, the path pymodbus keeps for
  custom contexts in 3.x);
- ``ServerRequestHandler.handle_request`` reads ``self.last_pdu`` again after awaiting the
  datastore, so a delayed reply overlapped by the next request on the same connection goes
  out with the *next* request's transaction id (a mis-attribution made by the server), and it
  decodes one request per received chunk: the face's handler serves each request with its own
  task and copy of the request;
- ``StartAsyncTcpServer`` keeps one global server; the face uses ``ModbusTcpServer`` objects
  directly, so several faces run in one process.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pymodbus.constants import ExcCodes
from pymodbus.datastore import ModbusServerContext
from pymodbus.exceptions import ModbusIOException
from pymodbus.pdu import ExceptionResponse, ModbusPDU
from pymodbus.server import ModbusTcpServer
from pymodbus.server.requesthandler import ServerRequestHandler
from pymodbus.transaction import TransactionManager

from rackplane.core.registers import (
    BIT_TABLES,
    MAX_READ_BITS,
    MAX_READ_REGISTERS,
    Decoded,
    PointSpec,
    RegisterMap,
    Table,
    decode_point,
    encode_value,
)
from rackplane.core.samples import Quality
from rackplane.log import get_logger

_FC_TABLE: Mapping[int, Table] = {
    1: "coil", 5: "coil", 15: "coil",
    2: "discrete",
    3: "holding", 6: "holding", 16: "holding", 22: "holding", 23: "holding",
    4: "input",
}
_READ_FCS = frozenset({1, 2, 3, 4, 23})
_HANDLER_BUFFER_BYTES = 1 << 16
# the connection a request came on, set in the request's own task (`_FaceRequestHandler._serve`)
_CONNECTION: contextvars.ContextVar[int] = contextvars.ContextVar("face_connection", default=0)


@dataclass(frozen=True, slots=True)
class FaceRequest:
    """One request the face received (kept in `ModbusFace.requests` for tests)."""

    unit: int
    function_code: int
    address: int | None
    count: int | None
    transaction_id: int


@dataclass(frozen=True, slots=True)
class FaceWrite:
    """A client write the face is about to apply (`ModbusFace.admit_write`).

    Attributes:
        connection: the TCP connection it came on (1, 2, ... per face, in accept order).
        unit: the unit id written.
        points: ``(point name, engineering value, raw registers)`` of every point written,
            in address order.
    """

    connection: int
    unit: int
    points: tuple[tuple[str, float, tuple[int, ...]], ...]


@dataclass(frozen=True, slots=True)
class _Fault:
    code: int
    unit: int | None
    table: str | None
    start: int | None
    end: int | None

    def unit_wide(self) -> bool:
        return self.start is None

    def hits(self, unit: int, table: str, start: int, end: int) -> bool:
        if self.unit is not None and self.unit != unit:
            return False
        if self.table is not None and self.table != table:
            return False
        if self.start is None or self.end is None:
            return True
        return start <= self.end and self.start <= end


class _FaceContext(ModbusServerContext):
    """pymodbus datastore interface onto the face (device id, function code, address)."""

    def __init__(self, face: ModbusFace) -> None:  # no super().__init__: custom datastore
        self._face = face
        self.old_simulator = True
        self.simdevices = []

    async def async_getValues(  # pymodbus' name
        self, device_id: int, func_code: int, address: int, count: int = 1
    ) -> list[int] | list[bool] | ExcCodes:
        return self._face._read(device_id, func_code, address, count)

    async def async_setValues(  # pymodbus' name
        self,
        device_id: int,
        func_code: int,
        address: int,
        values: Sequence[int] | Sequence[bool],
    ) -> ExcCodes | None:
        return self._face._write(device_id, func_code, address, list(values))

    def device_ids(self) -> list[int]:
        return list(self._face.unit_ids)


class _FaceRequestHandler(ServerRequestHandler):
    """One client connection: every request is served by its own task (see module doc)."""

    def __init__(self, owner: _FaceServer) -> None:
        super().__init__(owner, owner.trace_packet, owner.trace_pdu, owner.trace_connect)
        self._face = owner.face
        self.max_buffer_size = _HANDLER_BUFFER_BYTES
        self.connection_id = owner.face.connections  # counted before the handler is made

    def callback_data(self, data: bytes, addr: tuple[Any, ...] | None = None) -> int:
        used_total = 0
        while used_total < len(data):
            try:
                used = TransactionManager.callback_data(self, data[used_total:], addr)
            except ModbusIOException as exc:
                response = ExceptionResponse(
                    exc.fcode or 0,
                    exception_code=ExcCodes.ILLEGAL_FUNCTION,
                    device_id=exc.dev_id,
                    transaction=exc.transaction_id,
                )
                self.server_send(response, addr)
                return len(data)
            if used <= 0:
                break
            used_total += used
            pdu = self.last_pdu
            if pdu is not None:
                self._face._spawn(self._serve(pdu, addr))
        return used_total

    async def _serve(self, pdu: ModbusPDU, addr: tuple[Any, ...] | None) -> None:
        face = self._face
        _CONNECTION.set(self.connection_id)  # this task's own context
        face._record(pdu)
        if face.blackhole or pdu.dev_id in face.silent_units:
            return
        if face.reply_delay_s > 0:
            await asyncio.sleep(face.reply_delay_s)
            if face.blackhole:
                return
        try:
            response = await pdu.datastore_update(self.server.context, pdu.dev_id)
        except Exception:
            face._request_failed(pdu.function_code)
            response = ExceptionResponse(pdu.function_code, ExcCodes.DEVICE_FAILURE)
        else:
            face._request_ok(pdu.function_code)
        response.transaction_id = pdu.transaction_id
        response.dev_id = pdu.dev_id
        if self.transport is None or face.blackhole:
            return
        self.server_send(response, addr)


class _FaceServer(ModbusTcpServer):
    def __init__(self, face: ModbusFace, context: _FaceContext, address: tuple[str, int]):
        self.face = face
        super().__init__(context, address=address)

    def callback_new_connection(self) -> ServerRequestHandler:
        self.face.connections += 1
        return _FaceRequestHandler(self)


class ModbusFace:
    """A Modbus TCP server for one register map.

    Args:
        regmap: the map served (the same file the daemon reads).
        unit_ids: unit ids served, each 0-255 (0 is an ordinary unit over TCP, BR-06); each
            unit has its own registers.
        host: listen address (loopback by default; never all interfaces by accident).
        port: TCP port; 0 picks a free one (see `port` after `start`).
        on_write: called as ``on_write(point, value)`` after a client write to a writable
            point was accepted and stored (engineering value, decoded from the map).
        admit_write: called with each client write (`FaceWrite`) that passed the map's
            checks, before anything is stored: None admits it, an exception code (1-8, 10,
            11) refuses it (answered with that code, nothing stored, ``on_write`` not called).

    Fault knobs, settable at any time: `blackhole`, `reply_delay_s`,
    `max_registers_per_request`, `inject_exception` / `clear_exceptions`.

    Logging: start and stop at info; each accepted write at debug; a failure of the face
    itself (answered 4) or of ``on_write`` once per function code / point until it
    succeeds again, counted always in `request_errors` / `on_write_errors`.
    """

    def __init__(
        self,
        regmap: RegisterMap,
        *,
        unit_ids: Iterable[int] = (1,),
        host: str = "127.0.0.1",
        port: int = 0,
        on_write: Callable[[str, float], None] | None = None,
        admit_write: Callable[[FaceWrite], int | None] | None = None,
        log: Any = None,
    ) -> None:
        units = tuple(dict.fromkeys(unit_ids))
        if not units or any(not 0 <= u <= 255 for u in units):
            raise ValueError(f"unit ids must be 0-255, got {units!r}")
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be 0-65535, got {port}")
        self.regmap = regmap
        self.unit_ids = units
        self.host = host
        self._port = port
        self.on_write = on_write
        self.admit_write = admit_write
        self._log = (log if log is not None else get_logger(__name__)).bind(
            face=regmap.device.name
        )
        #: Half-open link: requests are read and dropped, nothing is answered (BR-07).
        self.blackhole = False
        #: Units whose requests are read and dropped (a dead unit behind a gateway that does
        #: not answer 11 for it): the others keep answering on the same connection.
        self.silent_units: set[int] = set()
        #: TCP connections accepted since construction (a gateway counts its clients).
        self.connections = 0
        #: Seconds every reply waits (slow device / link).
        self.reply_delay_s = 0.0
        self._max_registers: int | None = None
        self._faults: list[_Fault] = []
        #: Requests received (newest last; bounded).
        self.requests: deque[FaceRequest] = deque(maxlen=100_000)
        self._regs: dict[int, dict[str, dict[int, int]]] = {
            u: {t: {} for t in ("holding", "input", "coil", "discrete")} for u in units
        }
        self._owner: dict[str, dict[int, PointSpec]] = {
            t: {} for t in ("holding", "input", "coil", "discrete")
        }
        for p in regmap.points:
            for a in range(p.address, p.end + 1):
                self._owner[p.table][a] = p
                for u in units:
                    self._regs[u][p.table][a] = 0
        self._server: _FaceServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        #: Requests answered 4 (device failure) because the face itself failed (a bug).
        self.request_errors = 0
        #: ``on_write`` calls that raised.
        self.on_write_errors = 0
        self._failing_fcs: set[int] = set()  # function codes whose failure was logged
        self._failing_writes: set[str] = set()  # points whose on_write failure was logged

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The TCP port (the one picked when constructed with 0, once started)."""
        return self._port

    @property
    def running(self) -> bool:
        """True between `start` and `stop`."""
        return self._server is not None

    async def start(self) -> None:
        """Listen on ``host:port`` (the same port again after a `stop`).

        Raises:
            OSError: the port cannot be bound.
            RuntimeError: already running.
        """
        if self._server is not None:
            raise RuntimeError("modbus face already running")
        server = _FaceServer(self, _FaceContext(self), (self.host, self._port))
        try:
            await server.serve_forever(background=True)
        except RuntimeError as err:
            server.close()
            raise OSError(f"modbus face cannot listen on {self.host}:{self._port}") from err
        sockets = getattr(server.transport, "sockets", None) or []
        if sockets:
            self._port = int(sockets[0].getsockname()[1])
        self._server = server
        self._log.info("modbus_face_started", host=self.host, port=self._port,
                       units=list(self.unit_ids))

    async def stop(self) -> None:
        """Close the listener and every connection (clients see the TCP close); drop
        pending replies. Registers and faults are kept for a later `start`."""
        server, self._server = self._server, None
        if server is not None:
            await server.shutdown()
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if server is not None:
            self._log.info("modbus_face_stopped", port=self._port)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _request_failed(self, function_code: int) -> None:
        """Count a failed request; log it (with the traceback) once per function code until
        one succeeds again: a bug hit on every poll must not log every poll."""
        self.request_errors += 1
        if function_code not in self._failing_fcs:
            self._failing_fcs.add(function_code)
            self._log.exception("modbus_face_request_failed", function_code=function_code)

    def _request_ok(self, function_code: int) -> None:
        if function_code in self._failing_fcs:
            self._failing_fcs.discard(function_code)
            self._log.info("modbus_face_request_recovered", function_code=function_code)

    def _record(self, pdu: ModbusPDU) -> None:
        self.requests.append(
            FaceRequest(
                unit=pdu.dev_id,
                function_code=pdu.function_code,
                address=getattr(pdu, "address", None),
                count=getattr(pdu, "count", None),
                transaction_id=pdu.transaction_id,
            )
        )

    # -- values --------------------------------------------------------------------------------

    def _units(self, unit: int | None) -> tuple[int, ...]:
        if unit is None:
            return self.unit_ids
        if unit not in self._regs:
            raise KeyError(f"unit {unit} is not served (units {list(self.unit_ids)})")
        return (unit,)

    def update(self, values: Mapping[str, float], *, unit: int | None = None) -> None:
        """Set points to engineering values (all served units, or one).

        All values are checked before any is applied.

        Raises:
            KeyError: a name is not a point of the map (all unknown names listed), or the unit
                is not served.
            ValueError: a value is not representable in its point's type (never wrapped).
        """
        unknown = sorted(n for n in values if n not in self.regmap.by_name)
        if unknown:
            raise KeyError(
                f"not points of register map {self.regmap.device.name!r}: {', '.join(unknown)}"
            )
        units = self._units(unit)
        encoded = [
            (self.regmap.by_name[n], encode_value(self.regmap.by_name[n], float(v)))
            for n, v in values.items()
        ]
        for u in units:
            for p, regs in encoded:
                store = self._regs[u][p.table]
                for i, r in enumerate(regs):
                    store[p.address + i] = r

    def set_registers(
        self, table: Table, address: int, values: Sequence[int], *, unit: int | None = None
    ) -> None:
        """Set raw registers (0..0xFFFF) or bits (0/1) and mark the addresses implemented.

        Raises:
            ValueError: unknown table, address range past 65535 or a value out of range.
            KeyError: the unit is not served.
        """
        if table not in self._owner:
            raise ValueError(f"unknown table {table!r}")
        top = 1 if table in BIT_TABLES else 0xFFFF
        if address < 0 or address + len(values) - 1 > 65535:
            raise ValueError("address range outside 0..65535")
        if any(not 0 <= int(v) <= top for v in values):
            raise ValueError(f"{table} values must be 0..{top}")
        for u in self._units(unit):
            store = self._regs[u][table]
            for i, v in enumerate(values):
                store[address + i] = int(v)

    def registers(self, table: Table, address: int, count: int, *, unit: int | None = None
                  ) -> list[int]:
        """Raw registers (or bits as 0/1) as served; unimplemented addresses raise KeyError."""
        u = self._units(unit)[0]
        store = self._regs[u][table]
        return [store[a] for a in range(address, address + count)]

    def decoded(self, point: str, *, unit: int | None = None) -> Decoded:
        """The point as the map decodes its current registers."""
        p = self.regmap.point(point)
        return decode_point(p, self.registers(p.table, p.address, p.words, unit=unit))

    # -- faults --------------------------------------------------------------------------------

    @property
    def max_registers_per_request(self) -> int | None:
        """Largest register read accepted (exception 3 above it); None: the protocol's 125."""
        return self._max_registers

    @max_registers_per_request.setter
    def max_registers_per_request(self, value: int | None) -> None:
        if value is not None and not 1 <= value <= MAX_READ_REGISTERS:
            raise ValueError("max_registers_per_request must be 1-125 or None")
        self._max_registers = value

    def inject_exception(
        self,
        code: int,
        *,
        unit: int | None = None,
        table: Table | None = None,
        address: int | None = None,
        count: int = 1,
    ) -> None:
        """Answer exception ``code`` to requests of ``unit`` (None: every unit) that overlap
        ``table`` ``address .. address+count-1``; without ``address``, to every request of
        the unit (a unit-wide fault, checked first).

        Raises:
            ValueError: ``code`` is not a Modbus exception code pymodbus can send (1-8, 10,
                11), or ``count`` < 1.
        """
        if code not in {int(c) for c in ExcCodes}:
            raise ValueError(
                f"exception code must be one of {sorted(int(c) for c in ExcCodes)}, not {code}"
            )
        if address is None:
            self._faults.append(_Fault(code, unit, table, None, None))
        else:
            if count < 1:
                raise ValueError("count must be >= 1")
            self._faults.append(_Fault(code, unit, table, address, address + count - 1))

    def clear_exceptions(self) -> None:
        """Remove every injected exception."""
        self._faults.clear()

    # -- request handling (called by pymodbus through _FaceContext) ------------------------------

    def _fault_for(self, unit: int, table: str, start: int, end: int, *, unit_wide: bool
                   ) -> int | None:
        for f in self._faults:
            if f.unit_wide() == unit_wide and f.hits(unit, table, start, end):
                return f.code
        return None

    def _precheck(self, unit: int, fc: int, address: int, count: int) -> tuple[str, int | None]:
        table = _FC_TABLE.get(fc)
        if table is None:
            return "", ExcCodes.ILLEGAL_FUNCTION
        end = address + count - 1
        code = self._fault_for(unit, table, address, end, unit_wide=True)
        if code is not None:
            return table, code
        if unit not in self._regs:
            return table, ExcCodes.GATEWAY_NO_RESPONSE
        return table, None

    def _read(
        self, unit: int, fc: int, address: int, count: int
    ) -> list[int] | list[bool] | ExcCodes:
        table, code = self._precheck(unit, fc, address, count)
        if code is not None:
            return ExcCodes(code)
        limit = MAX_READ_BITS if table in BIT_TABLES else MAX_READ_REGISTERS
        if fc in (3, 4) and self._max_registers is not None:
            limit = min(limit, self._max_registers)
        if fc in _READ_FCS and not 1 <= count <= limit:
            return ExcCodes.ILLEGAL_VALUE
        end = address + count - 1
        code = self._fault_for(unit, table, address, end, unit_wide=False)
        if code is not None:
            return ExcCodes(code)
        store = self._regs[unit][table]
        try:
            values = [store[a] for a in range(address, end + 1)]
        except KeyError:
            return ExcCodes.ILLEGAL_ADDRESS
        if table in BIT_TABLES:
            return [bool(v) for v in values]
        return values

    def _write(self, unit: int, fc: int, address: int, values: list[Any]) -> ExcCodes | None:
        table, code = self._precheck(unit, fc, address, max(1, len(values)))
        if code is not None:
            return ExcCodes(code)
        if table not in ("holding", "coil") or not values:
            return ExcCodes.ILLEGAL_FUNCTION
        end = address + len(values) - 1
        code = self._fault_for(unit, table, address, end, unit_wide=False)
        if code is not None:
            return ExcCodes(code)
        touched: dict[str, PointSpec] = {}
        for a in range(address, end + 1):
            p = self._owner[table].get(a)
            if p is None or not p.writable:
                return ExcCodes.ILLEGAL_ADDRESS
            touched[p.name] = p
        if any(p.address < address or p.end > end for p in touched.values()):
            return ExcCodes.ILLEGAL_VALUE  # part of a multi-register value
        new = {address + i: (1 if v else 0) if table == "coil" else int(v)
               for i, v in enumerate(values)}
        accepted: list[tuple[PointSpec, float]] = []
        for p in touched.values():
            regs = [new[a] for a in range(p.address, p.end + 1)]
            d = decode_point(p, regs)
            if d.value is None or d.quality is Quality.BAD or not math.isfinite(d.value):
                return ExcCodes.ILLEGAL_VALUE
            lo = p.write_min if p.write_min is not None else -math.inf
            hi = p.write_max if p.write_max is not None else math.inf
            tol = 1e-9 * max(1.0, abs(lo), abs(hi))
            if not lo - tol <= d.value <= hi + tol:
                return ExcCodes.ILLEGAL_VALUE
            accepted.append((p, d.value))
        if self.admit_write is not None:
            refused = self.admit_write(FaceWrite(
                _CONNECTION.get(), unit,
                tuple((p.name, v, tuple(new[a] for a in range(p.address, p.end + 1)))
                      for p, v in sorted(accepted, key=lambda pv: pv[0].address))))
            if refused is not None:
                return ExcCodes(refused)
        store = self._regs[unit][table]
        store.update(new)
        for p, value in accepted:
            self._log.debug("modbus_face_write", unit=unit, point=p.name, value=value)
            if self.on_write is not None:
                try:
                    self.on_write(p.name, value)
                except Exception:
                    self.on_write_errors += 1
                    if p.name not in self._failing_writes:  # once per change, per point
                        self._failing_writes.add(p.name)
                        self._log.exception("modbus_face_on_write_failed", point=p.name)
                else:
                    if p.name in self._failing_writes:
                        self._failing_writes.discard(p.name)
                        self._log.info("modbus_face_on_write_recovered", point=p.name)
        return None


__all__ = ["FaceRequest", "FaceWrite", "ModbusFace"]
