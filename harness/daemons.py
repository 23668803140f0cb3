"""The real daemons and simulator as processes, shared by the integration tests and the
benchmarks' chaos run (`harness.chaos`: product code never imports ``tests``), or the
virtual rack in this process, systemd's notify socket, the spool as a reader sees it, and
watching it all over MQTT.

- processes: `Proc` (reaped after every test by conftest's ``reap``), `sim_proc`,
  `valvey_proc`, `racky_proc`, `write_config` (TOML from dicts);
- in this process: `in_process_rack` (the virtual rack simulator on a private rack id, and
  the daemons' tasks, all stopped at exit);
- `NotifySocket` (a test ``NOTIFY_SOCKET``), `spool_lines` (every line a spool holds);
- MQTT: `MqttClient` (a test-side `MqttLink` running inside ``async with``), `Watcher` (the
  simulator's plant truth and valvey's state/alarms), `command_envelope` (a command body);
- `until`: wait for a condition with a generous bound, failing early when a process died.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from harness.demo import Recorder
from rackplane.clock import SYSTEM_CLOCK
from rackplane.config import toml_value
from rackplane.io.mqtt import MqttLink
from rackplane.io.spool import Spool
from rackplane.settings import Identity, MqttSettings

if TYPE_CHECKING:
    from sims.runtime import VirtualRackSimulator


@dataclass
class Proc:
    """A daemon or simulator process with its log file.

    Every started process is remembered in `STARTED` so the ``reap`` fixture can stop it at
    teardown, whatever the test did (a leaked simulator would load every later test).
    """

    name: str
    argv: list[str]
    log: Path
    env: dict[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        STARTED.append(self)
        fh = self.log.open("ab")
        env = {**os.environ, **(self.env or {})}
        self.proc = subprocess.Popen(self.argv, stdout=fh, stderr=subprocess.STDOUT, env=env)
        fh.close()
        return self

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout_s: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout_s)

    def stop(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(5)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def events(self) -> list[dict[str, Any]]:
        """The JSON log lines (structlog JSON renderer)."""
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                obj = json.loads(line)
                if isinstance(obj, dict):
                    out.append(obj)
        return out


STARTED: list[Proc] = []


def reap_all() -> None:
    """Stop every process a test started (SIGTERM, then SIGKILL)."""
    while STARTED:
        STARTED.pop().stop()


def sim_proc(tmp: Path, modbus_port: int, mqtt_port: int, scenario: str, rack: str) -> Proc:
    return Proc(
        "sim",
        [
            sys.executable,
            "-m",
            "sims",
            "run",
            "--scenario",
            scenario,
            "--modbus-port",
            str(modbus_port),
            "--mqtt-host",
            "127.0.0.1",
            "--mqtt-port",
            str(mqtt_port),
            "--rack",
            rack,
            "--log-format",
            "json",
        ],
        tmp / "sim.log",
    )


async def until(cond: Callable[[], object], timeout_s: float, what: str, *procs: Proc,
                poll_s: float = 0.1, detail: Callable[[], str] | None = None) -> float:
    """Wait for ``cond()`` to be true; returns the seconds waited.

    Raises:
        AssertionError: one of ``procs`` exited (its log's tail is shown), or ``timeout_s``
            passed (naming ``what``, plus ``detail()`` when given).
    """
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if cond():
            return time.monotonic() - t0
        for p in procs:
            assert p.alive(), (
                f"{p.name} exited ({p.proc.returncode if p.proc else '?'}); "
                f"log:\n{p.log.read_text()[-3000:]}"
            )
        await asyncio.sleep(poll_s)
    extra = f"; {detail()}" if detail is not None else ""
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}{extra}")


def write_config(path: Path, **sections: dict[str, Any]) -> Path:
    """Write a daemon's TOML config, one ``[section]`` per keyword; returns ``path``."""
    lines = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        for k, v in values.items():
            lines.append(f"{k} = {toml_value(v)}")
        lines.append("")
    path.write_text("\n".join(lines))
    return path


write_valvey_config = write_config  # its first name: any daemon's config is written alike


def daemon_proc(daemon: str, tmp: Path, config: Path, env: dict[str, str] | None = None,
                tag: str = "") -> Proc:
    """``python -m <daemon> --config <config>`` with JSON logs in ``tmp/<daemon>[-tag].log``
    (not started)."""
    name = f"{daemon}-{tag}" if tag else daemon
    return Proc(
        name,
        [sys.executable, "-m", daemon, "--config", str(config), "--log-format", "json"],
        tmp / f"{name}.log",
        env=env,
    )


def valvey_proc(tmp: Path, config: Path, env: dict[str, str] | None = None) -> Proc:
    return daemon_proc("valvey", tmp, config, env)


def racky_proc(tmp: Path, config: Path, env: dict[str, str] | None = None, tag: str = ""
               ) -> Proc:
    return daemon_proc("racky", tmp, config, env, tag)


# Linux's SO_TIMESTAMPNS (asm-generic/socket.h; Python's socket module does not name it): the
# kernel stamps each datagram (CLOCK_REALTIME, a struct timespec) as it is queued
_SO_TIMESTAMPNS = 35
_TIMESPEC = struct.Struct("qq")


class NotifySocket:
    """A datagram socket standing in for systemd's ``NOTIFY_SOCKET`` (abstract namespace):
    records (monotonic s, message) from a reader thread until `close`. The time is the
    kernel's stamp of the datagram (``SO_TIMESTAMPNS``, put on the monotonic clock), i.e. when
    the daemon sent it, not when this thread got to read it: on a loaded host (the suite on
    pytest-xdist workers) the reader was held 1.9 s once and read three pings in the same
    millisecond, a watchdog gap the daemon never made."""

    def __init__(self) -> None:
        self.name = f"@rp-notify-{uuid.uuid4().hex[:12]}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + self.name[1:])
        self.sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        self.sock.settimeout(0.2)
        self.records: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                data, ancillary, _flags, _addr = self.sock.recvmsg(
                    4096, socket.CMSG_SPACE(_TIMESPEC.size))
            except TimeoutError:
                continue
            except OSError:
                return
            at = time.monotonic()
            for level, kind, raw in ancillary:
                if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS:
                    sec, nsec = _TIMESPEC.unpack(raw[:_TIMESPEC.size])
                    at -= time.time() - (sec + nsec / 1e9)  # how long it waited unread
            self.records.append((at, data.decode(errors="replace")))

    def times(self, line: str) -> list[float]:
        """When each message containing the line ``line`` (e.g. ``WATCHDOG=1``) arrived."""
        return [t for t, msg in list(self.records) if line in msg.split("\n")]

    def ready_at(self) -> float | None:
        """When ``READY=1`` first arrived (monotonic s), None before."""
        return next(iter(self.times("READY=1")), None)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


def spool_lines(d: Path) -> list[str]:
    """Every line the spool in ``d`` holds, oldest first, read beside a running daemon: its
    own cursor file (acking with the daemon's cursor would move it), rewound at each call."""
    out: list[str] = []
    with Spool(d, readonly=True, cursor_file="test-reader-cursor") as sp:
        sp.reset_to_start()
        while True:
            got, cur = sp.read(10_000)
            if not got:
                return out
            out.extend(got)
            sp.ack(cur)


def command_envelope(request_id: str, args: dict[str, Any]) -> str:
    """A command's JSON body (DESIGN §3), issued now."""
    return json.dumps({"request_id": request_id,
                       "issued_at": datetime.now(UTC).isoformat(timespec="seconds"),
                       "args": args})


@dataclass
class InProcessRack:
    """The virtual rack simulator running in this process, and the daemons' tasks beside it;
    every task stops on ``stop`` (see `in_process_rack`)."""

    ident: Identity
    mqtt: MqttSettings
    sim: VirtualRackSimulator
    stop: asyncio.Event
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def base(self) -> str:
        """The rack's MQTT topic root, ``rackplane/<site>/<rack>``."""
        return f"rackplane/{self.ident.site}/{self.ident.rack}"

    @property
    def shelf_port(self) -> int:
        """The simulator's power-shelf Modbus TCP port."""
        assert self.sim.shelf_face is not None
        return self.sim.shelf_face.port

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``coro`` (a daemon's ``run(stop)``) as a task stopped with the rack."""
        task = asyncio.create_task(coro)
        self.tasks.append(task)
        return task


@contextlib.asynccontextmanager
async def in_process_rack(mqtt_port: int, scenario: str = "load-step-short",
                          duration_s: float = 3600.0) -> AsyncIterator[InProcessRack]:
    """The virtual rack (``scenario`` stretched to ``duration_s``) on a fresh rack id, its
    power shelves on a free Modbus port, MQTT telemetry each second through the broker on
    ``mqtt_port``; entered once the shelf face listens. At exit ``stop`` is set and every
    task of the rack is awaited (30 s), then cancelled."""
    from sims.runtime import VirtualRackSimulator
    from sims.scenario import load_scenario

    ident = Identity(rack=f"r{uuid.uuid4().hex[:10]}")
    mq = MqttSettings(port=mqtt_port, clean_session=True, reconnect_min_s=0.1,
                      reconnect_max_s=1.0)
    sc = load_scenario(scenario).model_copy(update={"duration_s": duration_s})
    sim = VirtualRackSimulator(sc, modbus_port=0, shelf_modbus_port=0, identity=ident,
                               mqtt=mq, telemetry_interval_s=1.0)
    rack = InProcessRack(ident, mq, sim, asyncio.Event())
    rack.spawn(sim.run(rack.stop))
    try:
        await until(lambda: sim.shelf_face is not None and sim.shelf_face.port, 10.0,
                    "the simulator's power-shelf face")
        yield rack
    finally:
        rack.stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*rack.tasks, return_exceptions=True), 30.0)
        for t in rack.tasks:
            t.cancel()


class MqttClient:
    """A test-side MQTT client (`MqttLink`, daemon name ``tester``) that runs inside
    ``async with`` (entered once connected, 10 s at most); subscribe in ``__init__``."""

    def __init__(self, settings: MqttSettings, ident: Identity):
        self.ident = ident
        self.link = MqttLink(settings, ident, "tester", clock=SYSTEM_CLOCK)
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Self:
        self.task = asyncio.create_task(self.link.run())
        await self.link.wait_ready(10)
        return self

    async def __aexit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.link.stop(), 5)
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task


class Watcher(MqttClient):
    """Subscribes like any other tool: the simulator's plant truth and valvey's state/alarms."""

    def __init__(self, mqtt_port: int, rack: str):
        super().__init__(
            MqttSettings(
                port=mqtt_port,
                clean_session=True,
                client_id=f"test-watcher-{rack}-{time.monotonic_ns()}",
            ),
            Identity(rack=rack),
        )
        self.rec = Recorder()
        base = f"rackplane/{self.ident.site}/{rack}"
        for topic in (
            f"{base}/sim/telemetry/plant",
            f"{base}/valvey/state/#",
            f"{base}/valvey/status",
            f"{base}/valvey/alarm/+",
        ):
            self.link.subscribe(topic, self.rec.on_message, qos=0)

    @property
    def plant_t(self) -> float:
        return float(self.rec.plant[-1]["t_s"]) if self.rec.plant else 0.0

    def last_loop(self) -> dict[str, Any]:
        return self.rec.loop[-1] if self.rec.loop else {}

    async def until(
        self, cond: Callable[[], bool], timeout_s: float, what: str, *procs: Proc
    ) -> float:
        """Wait for ``cond``; fail naming ``what`` (and any process that died)."""
        return await until(cond, timeout_s, what, *procs, poll_s=0.2,
                           detail=lambda: f"last loop state {self.last_loop()}")
