"""A cuttable path from one client host to a NATS cluster: a loopback TCP relay per node.

A daemon given `NatsCut.urls` instead of the nodes' own reaches the cluster only through this
process. `NatsCut.cut` partitions that host from the bus the way a cut network does: every
relayed connection stays open and carries nothing either way, and a new connection is
accepted and left silent (the client's requests time out; nothing tells it the peer is gone).
`NatsCut.heal` closes the held connections (the client reconnects through the relays, its
`rackplane.io.nats.kv.NatsKv` by itself) and relays again.

The nodes advertise each other's client ports (``connect_urls`` in ``INFO``); a client adds
them to its server pool and would reconnect around the cut. The relay therefore reads the
server's side of the protocol (``INFO``/``MSG``/``HMSG``/others, payloads passed through by
their stated sizes) and empties ``connect_urls`` in every ``INFO``.

Why a relay and not a paused node (`harness.servers.NatsNode.pause`): pausing a node cuts
every client of that node and can take the bucket's stream leader away from the others; this
cuts one host only. Loopback only; no privileges.
"""

from __future__ import annotations

import asyncio
import functools
import json
from dataclasses import dataclass, field

__all__ = ["NatsCut", "strip_discovery"]

_MAX_LINE = 1 << 20


def strip_discovery(info_line: bytes) -> bytes:
    """An ``INFO {...}`` line (without CRLF) with ``connect_urls`` emptied (others
    unchanged). A line that does not decode is returned as it is."""
    head, _, body = info_line.partition(b" ")
    try:
        info = json.loads(body)
    except ValueError:
        return info_line
    if not isinstance(info, dict) or not info.get("connect_urls"):
        return info_line
    info["connect_urls"] = []
    info.pop("ws_connect_urls", None)
    return head + b" " + json.dumps(info, separators=(",", ":")).encode()


class _ServerStream:
    """Splits the server's byte stream into protocol units, rewriting ``INFO`` lines."""

    def __init__(self) -> None:
        self.buf = b""

    def feed(self, data: bytes) -> bytes:
        """The complete units in ``buf + data`` (rewritten), keeping an incomplete tail.

        Raises:
            ValueError: a control line longer than 1 MiB, or a MSG/HMSG size that does not
                parse (not NATS: the caller closes the connection).
        """
        self.buf += data
        out = bytearray()
        while True:
            i = self.buf.find(b"\r\n")
            if i < 0:
                if len(self.buf) > _MAX_LINE:
                    raise ValueError("control line too long")
                return bytes(out)
            line = self.buf[:i]
            op = line.split(b" ", 1)[0].upper()
            if op in (b"MSG", b"HMSG"):
                size = int(line.rsplit(b" ", 1)[-1])
                need = i + 2 + size + 2
                if len(self.buf) < need:
                    return bytes(out)
                out += self.buf[:need]
                self.buf = self.buf[need:]
                continue
            out += (strip_discovery(line) if op == b"INFO" else line) + b"\r\n"
            self.buf = self.buf[i + 2:]


@dataclass
class _Relay:
    node_port: int
    server: asyncio.Server | None = None
    port: int = 0


@dataclass
class NatsCut:
    """Relays to the NATS nodes on ``node_ports`` (loopback); `start` before use, `stop` at
    the end (module docstring)."""

    node_ports: list[int]
    cut_now: bool = False
    relays: list[_Relay] = field(default_factory=list)
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    @property
    def urls(self) -> list[str]:
        """The relays' client URLs, one per node (give these to the host's daemons)."""
        return [f"nats://127.0.0.1:{r.port}" for r in self.relays]

    async def start(self) -> NatsCut:
        for p in self.node_ports:
            r = _Relay(p)
            r.server = await asyncio.start_server(functools.partial(self._accept, r),
                                                  "127.0.0.1", 0)
            r.port = r.server.sockets[0].getsockname()[1]
            self.relays.append(r)
        return self

    def cut(self) -> None:
        """From now on nothing passes either way; connections stay open (module docstring)."""
        self.cut_now = True

    def heal(self) -> None:
        """Close every connection (held or relayed) and relay again."""
        self.cut_now = False
        for w in list(self._writers):
            w.close()

    async def stop(self) -> None:
        """Close the listeners and every connection."""
        for r in self.relays:
            if r.server is not None:
                r.server.close()
        for w in list(self._writers):
            w.close()
        await asyncio.sleep(0)

    async def _accept(self, r: _Relay, cr: asyncio.StreamReader,
                      cw: asyncio.StreamWriter) -> None:
        self._writers.add(cw)
        try:
            if self.cut_now:  # a cut host's new connection: accepted, never answered
                while await cr.read(65536):
                    pass
                return
            try:
                sr, sw = await asyncio.open_connection("127.0.0.1", r.node_port)
            except OSError:
                return
            self._writers.add(sw)
            try:
                await asyncio.gather(self._pipe(cr, sw, None), self._pipe(sr, cw, _ServerStream()))
            finally:
                self._writers.discard(sw)
                sw.close()
        finally:
            self._writers.discard(cw)
            cw.close()

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                    parse: _ServerStream | None) -> None:
        """Copy until EOF; while cut, read and drop. Ends both sides when one ends."""
        try:
            while data := await src.read(65536):
                if self.cut_now:
                    continue
                out = parse.feed(data) if parse is not None else data
                if out:
                    dst.write(out)
                    await dst.drain()
        except (OSError, ValueError):
            pass
        finally:
            dst.close()
