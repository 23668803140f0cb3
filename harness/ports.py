"""Loopback TCP ports for private test servers: picking free ones that cannot race outgoing
connections nor another pytest-xdist worker, and telling whether a process itself listens on
a port (Linux ``/proc``). Used by `harness.servers`; no pytest needed."""

from __future__ import annotations

import os
import random
import socket
import time
from pathlib import Path

__all__ = ["accepts", "ephemeral_range", "free_port", "listening_inodes", "listens_on",
           "wait_port"]


_EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST_PICKED_PORT = 10000
_handed_out: set[int] = set()
_rng = random.Random(os.getpid() ^ time.monotonic_ns())


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral (client) port range; Linux's default where it cannot be read."""
    try:
        low, high = (int(x) for x in _EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _worker_slice(low: int, high: int) -> tuple[int, int]:
    """The part of ``[low, high)`` this process picks from: under pytest-xdist each worker
    (``PYTEST_XDIST_WORKER`` ``gwN`` of ``PYTEST_XDIST_WORKER_COUNT``, the environment the
    workers and their children inherit) gets a disjoint slice, so two workers never pick the
    same port; the whole range otherwise."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    try:
        index = int(worker.removeprefix("gw"))
        count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", ""))
    except ValueError:
        return low, high
    if count < 1 or not 0 <= index < count or (high - low) // count < 1000:
        return low, high
    width = (high - low) // count
    return low + index * width, low + (index + 1) * width


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now and that no other call in this process has
    handed out.

    Picked at random *below* the kernel's ephemeral range where there is room
    (``/proc/sys/net/ipv4/ip_local_port_range``): a port from ``bind(0)`` is an ephemeral one,
    which any outgoing connection on the host may take between the pick and the server's
    bind, or while a test has the server stopped for an outage (CI saw nats-server refuse
    its monitor port so). Under pytest-xdist each worker picks from its own slice of that
    range (`_worker_slice`). Falls back to ``bind(0)`` where the range leaves no room.
    A port can still be taken by another program between the pick and the bind: the
    ``start_*`` functions notice (`ServerProcess.start`) and start again on fresh ports.
    """
    low, _high = ephemeral_range()
    if low - _LOWEST_PICKED_PORT >= 1000:
        first, end = _worker_slice(_LOWEST_PICKED_PORT, low)
        for _ in range(200):
            port = _rng.randrange(first, end)
            if port not in _handed_out and _bindable(port):
                _handed_out.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    _handed_out.add(port)
    return port


def listening_inodes(port: int) -> set[str] | None:
    """Socket inodes listening on TCP ``port`` (any local address, IPv4 or IPv6), from
    ``/proc/net/tcp{,6}``; None where /proc cannot be read (not Linux)."""
    inodes: set[str] = set()
    read_any = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        read_any = True
        for line in lines:
            cols = line.split()
            # cols: sl local_address rem_address st ... uid timeout inode
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    return inodes if read_any else None


def _socket_inodes(pid: int) -> set[str] | None:
    """Inodes of the sockets process ``pid`` holds open; None where they cannot be read."""
    fd_dir = Path(f"/proc/{pid}/fd")
    out: set[str] = set()
    try:
        fds = list(fd_dir.iterdir())
    except OSError:
        return None
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            out.add(target[len("socket:["):-1])
    return out


def listens_on(pid: int, ports: list[int]) -> bool | None:
    """Whether process ``pid`` itself listens on every one of ``ports`` (a connection that
    is accepted may be another program's listener on a port this one failed to bind); None
    where /proc cannot tell (not Linux)."""
    mine = _socket_inodes(pid)
    if mine is None:
        return None
    for port in ports:
        listening = listening_inodes(port)
        if listening is None:
            return None
        if not listening & mine:
            return False
    return True


def accepts(port: int) -> bool:
    """Whether something accepts a TCP connection on 127.0.0.1:``port`` now (0.2 s)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def wait_port(port: int, timeout_s: float = 10.0) -> None:
    """Wait until something accepts TCP connections on 127.0.0.1:port."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout_s} s")
