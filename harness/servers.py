"""Private test servers: Mosquitto and VictoriaMetrics on free loopback ports.

Each server is a real process (Debian packages ``mosquitto`` and ``victoria-metrics``) with its
own config and data directory. A missing binary raises `ServerMissing`
(the test suite's fixtures in ``tests/servers.py`` turn it into a skip on a developer machine and
a failure under ``CI=true``, DESIGN §5). No pytest needed: the benchmarks start servers here
too. Servers can be stopped and started again on the same port, to test outages and broker
restarts.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "Mosquitto",
    "ServerMissing",
    "ServerProcess",
    "VictoriaMetrics",
    "free_port",
    "mosquitto_config",
    "require_binary",
    "start_mosquitto",
    "start_victoria",
    "wait_port",
]


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerMissing(RuntimeError):
    """A server binary is not installed; the message names the Debian package."""


def require_binary(name: str, package: str) -> str:
    """Path of ``name``.

    Raises:
        ServerMissing: it is not installed (the message names the Debian ``package``).
    """
    path = shutil.which(name) or (
        f"/usr/sbin/{name}" if os.path.exists(f"/usr/sbin/{name}") else None
    )
    if path:
        return path
    msg = f"{name} not found: install the Debian package '{package}' (make test does this as root)"
    raise ServerMissing(msg)


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


@dataclass
class ServerProcess:
    """A server process that can be stopped and started again with the same arguments."""

    argv: list[str]
    port: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_port(self.port)
        except TimeoutError:
            self.stop()
            raise RuntimeError(
                f"{self.argv[0]} did not start; log:\n{self.log_path.read_text()[-2000:]}"
            ) from None

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class Mosquitto(ServerProcess):
    """A private Mosquitto. ``host``/``port`` for clients."""

    host: str = "127.0.0.1"


def mosquitto_config(port: int, extra: str = "") -> str:
    """Minimal test broker config (TEST-SERVERS.md): no persistence, no silent queue drops."""
    return (
        f"listener {port} 127.0.0.1\n"
        "allow_anonymous true\n"
        "persistence false\n"
        "set_tcp_nodelay true\n"
        "max_queued_messages 0\n"
        f"{extra}"
    )


def start_mosquitto(tmp: Path, extra_conf: str = "") -> Mosquitto:
    binary = require_binary("mosquitto", "mosquitto")
    port = free_port()
    conf = tmp / "mosquitto.conf"
    conf.write_text(mosquitto_config(port, extra_conf))
    srv = Mosquitto(argv=[binary, "-c", str(conf)], port=port, log_path=tmp / "mosquitto.log")
    srv.start()
    return srv


@dataclass
class VictoriaMetrics(ServerProcess):
    """A private VictoriaMetrics, the InfluxDB-protocol database of the tests."""

    data_dir: Path = field(default_factory=Path)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _get(self, path: str, params: dict[str, str] | None = None) -> bytes:
        q = ("?" + urllib.parse.urlencode(params)) if params else ""
        with urllib.request.urlopen(self.url + path + q, timeout=10) as resp:
            return bytes(resp.read())

    def flush(self) -> None:
        """Make just-written points queryable (otherwise new series take 5-10 s)."""
        self._get("/internal/force_flush")

    def export(self, match: str) -> list[dict[str, Any]]:
        """Series matching a selector, e.g. ``{__name__=~"pid_.*"}``, as JSON-lines records."""
        self.flush()
        raw = self._get("/api/v1/export", {"match[]": match})
        return [json.loads(line) for line in raw.decode().splitlines() if line.strip()]

    def wait_export(
        self, match: str, min_points: int = 1, timeout_s: float = 20.0
    ) -> list[dict[str, Any]]:
        """Poll ``export`` until at least ``min_points`` values exist in total (bounded)."""
        deadline = time.monotonic() + timeout_s
        series: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            series = self.export(match)
            if sum(len(s.get("values", [])) for s in series) >= min_points:
                return series
            time.sleep(0.2)
        return series


def start_victoria(tmp: Path) -> VictoriaMetrics:
    binary = require_binary("victoria-metrics", "victoria-metrics")
    port = free_port()
    data = tmp / "vm-data"
    data.mkdir(parents=True, exist_ok=True)
    argv = [
        binary,
        f"-httpListenAddr=127.0.0.1:{port}",
        f"-storageDataPath={data}",
        "-search.latencyOffset=0s",
        "-loggerLevel=WARN",
        # The default retention (1 month) silently drops points with older timestamps, such as
        # those of a FakeClock: keep everything.
        "-retentionPeriod=100y",
    ]
    srv = VictoriaMetrics(argv=argv, port=port, log_path=tmp / "vm.log", data_dir=data)
    srv.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if srv._get("/health").strip() == b"OK":
                break
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.05)
    return srv
