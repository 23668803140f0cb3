"""One Modbus connection shared by the devices behind one address (a TCP gateway, a serial
line): `ModbusLink`, and `ModbusLinks`, the registry a daemon keeps of them.

Many Modbus TCP gateways accept one connection, or very few, and drop the others' requests
when a client reconnects. Devices at the same ``host:port`` (same framer), or on the same
serial port, therefore share one connection and one request at a time on it (the link's
lock), each with its own bulkhead (`rackplane.io.modbus.ModbusDevice`):

- a unit that times out costs its own request slot; the shared connection is kept (a late
  reply carries an old transaction id and is dropped by the strict framer);
- after ``unavailable_after_failures`` timeouts in a row the unit is unavailable: its points
  are STALE and it is read again (re-probed) no more often than ``dormant_reprobe_s``; a
  gateway exception 10/11 for it does the same at once;
- the connection itself is replaced only on a transport error (closed by the peer, a broken
  byte stream), or when every available unit on it has timed out since the last valid reply
  on it (then it is the gateway or the connection, not a unit).

A device alone on its link behaves as before links existed (FIELD-CASES BR-07: a timeout
replaces the connection with backoff). No pymodbus here: the client object is created by
`rackplane.io.modbus.client`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rackplane.io.modbus.client import _ReplyGuard
from rackplane.io.modbus.support import ModbusStats
from rackplane.settings import ModbusTargetSettings

__all__ = ["ModbusLink", "ModbusLinks", "link_key"]


def link_key(settings: ModbusTargetSettings) -> tuple[Any, ...]:
    """What makes two targets one connection: the serial port, or host, port and framer."""
    serial_port = getattr(settings, "serial_port", None)
    if serial_port:
        return ("serial", str(serial_port))
    return ("tcp", settings.host.lower(), settings.port, settings.framer)


class ModbusLink:
    """One connection and the devices (units) that use it.

    Attributes:
        key: `link_key` of its devices.
        client: the open client (None while disconnected); owned by the members, replaced
            by whichever member reconnects first.
        lock: one request (one poll of one unit, one write) at a time on the connection.
        guard: the strict reply matcher installed in the client's framer (shared: the member
            sending a request points it at its own stats).
        members: devices attached (`join`); ``users``: those holding the open client.
        connects: successful connects (for tests and health: one per outage, not per unit).
        silent_units: units that timed out since the last valid reply on the link.
    """

    def __init__(self, key: tuple[Any, ...] = ("private",)) -> None:
        self.key = key
        self.client: Any = None
        self.lock = asyncio.Lock()
        self.guard = _ReplyGuard(ModbusStats())
        self.members: list[Any] = []
        self.users: set[int] = set()
        self.connects = 0
        self.silent_units: set[int] = set()
        #: RTU line discipline of the open client (`rackplane.io.modbus.client._RtuLine`),
        #: None for Modbus TCP.
        self.line: Any = None

    @property
    def shared(self) -> bool:
        """True when more than one device uses the link."""
        return len(self.members) > 1

    def join(self, device: Any) -> None:
        """Attach a device (`rackplane.io.modbus.ModbusDevice`)."""
        if device not in self.members:
            self.members.append(device)

    def leave(self, device: Any) -> None:
        """Detach a device (a discovery probe done, a device removed)."""
        if device in self.members:
            self.members.remove(device)
        self.users.discard(id(device))

    def connection_at_fault(self, unit: int) -> bool:
        """Record that ``unit`` timed out; True when every available unit of the link has
        timed out since the last valid reply on it (the connection, not a unit, is silent)."""
        self.silent_units.add(unit)
        available = {m.settings.unit_id for m in self.members if m.stats.available}
        return not available or available <= self.silent_units


class ModbusLinks:
    """The daemon's links by `link_key`: pass ``links.get(settings)`` to every
    `rackplane.io.modbus.ModbusDevice` it creates, so devices behind one gateway share one
    connection."""

    def __init__(self) -> None:
        self._links: dict[tuple[Any, ...], ModbusLink] = {}

    def get(self, settings: ModbusTargetSettings) -> ModbusLink:
        """The link of ``settings`` (created on first use)."""
        key = link_key(settings)
        link = self._links.get(key)
        if link is None:
            link = self._links[key] = ModbusLink(key)
        return link

    def __len__(self) -> int:
        return len(self._links)
