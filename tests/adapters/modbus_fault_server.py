"""A raw asyncio Modbus TCP server for faults pymodbus' server cannot express.

Test helper (no pymodbus): it parses MBAP requests itself and can answer with crafted bytes,
e.g. a stale frame and the right one in a single TCP chunk (FIELD-CASES BR-03), an exact
exception frame (BR-04), garbage that breaks the MBAP framing, or nothing at all. In
``rtu_sink`` mode it accepts RTU-over-TCP bytes, records them and never answers (BR-06
broadcast writes).

Normal replies: FC03/FC04 registers and FC01/FC02 bits come from ``values(unit, address)``
(default ``unit * 1000 + address``, the BR-03 long-run pattern); FC05/FC06/FC16 are echoed.

Run as a process for throughput tests (the other core serves while the test's core polls)::

    python -m tests.adapters.modbus_fault_server --port N --stats-file F

On SIGTERM it writes per-connection statistics as JSON to ``F``: request count, how often the
transaction id went down (a wrap), first and last tid, and whether the tids were consecutive.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def default_value(unit: int, address: int) -> int:
    """The BR-03 long-run pattern: ``unit * 1000 + address`` (mod 65536)."""
    return (unit * 1000 + address) & 0xFFFF


def mbap(tid: int, unit: int, pdu: bytes) -> bytes:
    """One Modbus TCP frame: MBAP header + PDU."""
    return struct.pack(">HHHB", tid & 0xFFFF, 0, len(pdu) + 1, unit) + pdu


@dataclass(frozen=True, slots=True)
class Delayed:
    """A reply written ``delay_s`` after the request (if the connection still exists)."""

    delay_s: float
    data: bytes


@dataclass(frozen=True, slots=True)
class Request:
    """A request as received."""

    conn: int
    tid: int
    unit: int
    function_code: int
    address: int
    count: int
    pdu: bytes


@dataclass
class ConnStats:
    """Transaction ids seen on one connection."""

    requests: int = 0
    first_tid: int | None = None
    last_tid: int | None = None
    wraps: int = 0
    consecutive: bool = True


@dataclass
class FaultServer:
    """The server. ``reply(request, normal_reply) -> bytes | Delayed | None``: bytes to send
    instead (``b""`` sends nothing), a `Delayed` reply, or ``None`` for the normal reply."""

    host: str = "127.0.0.1"
    port: int = 0
    values: Callable[[int, int], int] = default_value
    reply: Callable[[Request, bytes], bytes | Delayed | None] | None = None
    rtu_sink: bool = False
    keep_requests: bool = True
    requests: list[Request] = field(default_factory=list)
    conn_stats: dict[int, ConnStats] = field(default_factory=dict)
    rtu_bytes: bytearray = field(default_factory=bytearray)
    connections: int = 0
    _server: asyncio.Server | None = None
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)
    _handlers: set[asyncio.Task[Any]] = field(default_factory=set)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for w in list(self._writers):
                w.close()
            if self._handlers:  # let them see the close (no "Task was destroyed" noise)
                await asyncio.wait(list(self._handlers), timeout=2.0)
            await self._server.wait_closed()
            self._server = None

    def normal_reply(self, r: Request) -> bytes:
        """The well-formed answer to ``r``."""
        if r.function_code in (3, 4):
            regs = [self.values(r.unit, r.address + i) for i in range(r.count)]
            body = bytes([r.function_code, 2 * r.count]) + struct.pack(f">{r.count}H", *regs)
        elif r.function_code in (1, 2):
            nbytes = (r.count + 7) // 8
            bits = 0
            for i in range(r.count):
                bits |= (self.values(r.unit, r.address + i) & 1) << i
            body = bytes([r.function_code, nbytes]) + bits.to_bytes(nbytes, "little")
        elif r.function_code in (5, 6, 16):
            body = r.pdu[:5]
        else:
            body = bytes([r.function_code | 0x80, 1])
        return mbap(r.tid, r.unit, body)

    def _note_tid(self, conn: int, tid: int) -> None:
        st = self.conn_stats.setdefault(conn, ConnStats())
        st.requests += 1
        if st.first_tid is None:
            st.first_tid = tid
        elif st.last_tid is not None:
            if tid < st.last_tid:
                st.wraps += 1
            elif tid != st.last_tid + 1:
                st.consecutive = False
        st.last_tid = tid

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn = self.connections
        self._writers.add(writer)
        me = asyncio.current_task()
        if me is not None:
            self._handlers.add(me)
        try:
            if self.rtu_sink:
                while chunk := await reader.read(4096):
                    self.rtu_bytes.extend(chunk)
                return
            while True:
                head = await reader.readexactly(7)
                tid, _pid, length, unit = struct.unpack(">HHHB", head)
                pdu = await reader.readexactly(length - 1)
                fc = pdu[0]
                address, count = struct.unpack(">HH", pdu[1:5]) if len(pdu) >= 5 else (0, 0)
                r = Request(conn, tid, unit, fc, address, count, pdu)
                self._note_tid(conn, tid)
                if self.keep_requests:
                    self.requests.append(r)
                normal = self.normal_reply(r)
                out = self.reply(r, normal) if self.reply is not None else None
                if isinstance(out, Delayed):
                    asyncio.get_running_loop().call_later(out.delay_s, _late_write, writer,
                                                          out.data)
                    continue
                data = normal if out is None else out
                if data:
                    writer.write(data)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            if me is not None:
                self._handlers.discard(me)
            writer.close()


def _late_write(writer: asyncio.StreamWriter, data: bytes) -> None:
    if not writer.is_closing():
        writer.write(data)


def _stats_json(server: FaultServer) -> dict[str, Any]:
    return {
        str(conn): {
            "requests": st.requests,
            "first_tid": st.first_tid,
            "last_tid": st.last_tid,
            "wraps": st.wraps,
            "consecutive": st.consecutive,
        }
        for conn, st in server.conn_stats.items()
    }


async def _main(port: int) -> FaultServer:
    server = FaultServer(port=port, keep_requests=False)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print(f"listening {server.port}", flush=True)
    await stop.wait()
    await server.stop()
    return server


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--stats-file", required=True)
    args = ap.parse_args()
    done = asyncio.run(_main(args.port))
    Path(args.stats_file).write_text(json.dumps(_stats_json(done)))
