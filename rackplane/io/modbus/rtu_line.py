"""RTU line discipline: local echo of RS-485 adapters, stale input between requests and the
t3.5 inter-frame silence (issue 14 item 7). Works on pymodbus' protocol object by its
attributes (``send``, ``datagram_received``, ``low_level_send``, ``recv_buffer``) without
importing pymodbus: `rackplane.io.modbus.client` installs it on every RTU client.

pymodbus 3.16.1 has ``handle_local_echo`` (serial clients): it strips an echo that matches
but passes bytes that differ on as the reply, and has no inter-frame timing; hence this.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rackplane.io.modbus.client import _ReplyGuard

__all__ = ["t35_s"]


def t35_s(baudrate: int) -> float:
    """The RTU inter-frame silent interval t3.5, s: 3.5 characters of 11 bits (Modbus over
    serial line V1.02 §2.5.1.1), fixed at 1.75 ms above 19200 baud."""
    return 1.75e-3 if baudrate > 19200 else 3.5 * 11 / baudrate


class _RtuLine:
    """Line discipline of an RTU client, installed on pymodbus' protocol object (``ctx``).

    - Local echo (``local_echo``: an RS-485 adapter that echoes what it sends): the bytes
      received after a request are first compared with the bytes sent and discarded; an echo
      that differs (a collision on the bus, a broken adapter, an adapter that does not echo)
      is dropped with everything after it until the next request, and counted
      (``dropped_frames["echo_mismatch"]``): the request then fails as ``reply_mismatch``.
      Without this, the echo of a write (FC 5/6/16 echo the request) is taken for the
      device's reply.
    - Stale input: bytes received while no request is outstanding (the tail of a late
      reply, noise) are discarded and counted (``dropped_frames["stale_input"]``), and so is
      anything left in the receive buffer when a request is sent.
    - t3.5 (serial lines only, ``t35 > 0``): a request is sent only after the line has been
      silent for t3.5 since the last byte received (the end of the previous frame); a line
      that never goes quiet is waited for at most ``max_wait_s``, then counted
      (``dropped_frames["line_busy"]``) and used anyway.
    """

    def __init__(self, ctx: Any, guard: _ReplyGuard, *, local_echo: bool, t35: float,
                 max_wait_s: float) -> None:
        self._ctx = ctx
        self._guard = guard
        self.local_echo = local_echo
        self.t35 = t35
        self.max_wait_s = max_wait_s
        self.last_rx = -float("inf")  # loop time of the last byte received
        self._echo = b""  # echo bytes still expected
        self._discard = False  # echo mismatch: drop input until the next request
        self._send = ctx.send
        self._received = ctx.datagram_received
        ctx.low_level_send = self.send
        ctx.datagram_received = self.received

    def _count(self, reason: str) -> None:
        d = self._guard.stats.dropped_frames
        d[reason] = d.get(reason, 0) + 1

    async def quiet(self) -> None:
        """Wait until the line has been silent for t3.5 (at most ``max_wait_s``)."""
        if self.t35 <= 0:
            return
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.max_wait_s
        while (wait := self.last_rx + self.t35 - loop.time()) > 0:
            if loop.time() + wait > give_up:
                self._count("line_busy")
                return
            await asyncio.sleep(wait)

    def send(self, data: bytes, addr: Any = None) -> None:
        if self._ctx.recv_buffer:
            self._count("stale_input")  # pymodbus' send clears it: counted here
            self._ctx.recv_buffer = b""
        self._discard = False
        self._echo = bytes(data) if self.local_echo else b""
        self._send(data, addr)

    def received(self, data: bytes, addr: Any = None) -> None:
        self.last_rx = asyncio.get_running_loop().time()
        if self._discard:
            return
        if self._guard.expect is None:  # between requests: a late tail, noise
            self._count("stale_input")
            return
        if self._echo:
            n = min(len(data), len(self._echo))
            if data[:n] != self._echo[:n]:
                self._echo = b""
                self._discard = True
                self._guard.drop("echo_mismatch", same_tid=True)
                return
            self._echo = self._echo[n:]
            data = data[n:]
            if not data:
                return
        self._received(data, addr)
