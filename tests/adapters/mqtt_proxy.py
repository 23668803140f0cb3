"""A small asyncio TCP proxy that can cut and restore a client's network (MQTT adapter tests).

The daemon under test connects to the proxy instead of the broker, so a test can take its
network away (BR-22 a) while other clients keep talking to the broker directly:

- ``cut()``: close every proxied connection (both sides: the broker sees the client vanish
  without DISCONNECT, so it keeps a persistent session and publishes the Will) and refuse new
  ones until ``restore()``.
- ``blackhole_upstream = True``: keep connections open but silently discard what the client
  sends (its PUBACKs never reach the broker), to provoke a QoS 1 redelivery with DUP.
"""

from __future__ import annotations

import asyncio
import contextlib


class MqttProxy:
    """Forward 127.0.0.1:<port> to 127.0.0.1:<target_port>. Use ``async with``."""

    def __init__(self, target_port: int, host: str = "127.0.0.1") -> None:
        self.target_port = target_port
        self.host = host
        self.port = 0
        self.blackhole_upstream = False
        self.accepted = 0
        self._cut = False
        self._server: asyncio.Server | None = None
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> MqttProxy:
        self._server = await asyncio.start_server(self._handle, self.host, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._close_all()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(BaseException):
                await t

    @property
    def connections(self) -> int:
        """Proxied connections open now."""
        return len(self._pairs)

    def cut(self) -> None:
        """Drop every connection and refuse (accept-and-close) new ones."""
        self._cut = True
        self._close_all()

    def restore(self) -> None:
        """Forward again."""
        self._cut = False

    def _close_all(self) -> None:
        for client_w, broker_w in list(self._pairs):
            for w in (client_w, broker_w):
                with contextlib.suppress(Exception):
                    w.close()
        self._pairs.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self._cut:
            writer.close()
            return
        try:
            b_reader, b_writer = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            writer.close()
            return
        pair = (writer, b_writer)
        self._pairs.add(pair)
        up = asyncio.create_task(self._pump(reader, b_writer, upstream=True))
        down = asyncio.create_task(self._pump(b_reader, writer, upstream=False))
        for t in (up, down):
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)
        await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        for w in pair:
            with contextlib.suppress(Exception):
                w.close()
        self._pairs.discard(pair)

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, upstream: bool
    ) -> None:
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    return
                if upstream and self.blackhole_upstream:
                    continue
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            return
