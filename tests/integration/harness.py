"""Running the real daemons and simulator as processes, and watching them over MQTT."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rackctl.demo import Recorder
from rackplane.clock import SYSTEM_CLOCK
from rackplane.config import toml_value
from rackplane.mqtt import MqttLink
from rackplane.settings import Identity, MqttSettings


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


def write_valvey_config(path: Path, **sections: dict[str, Any]) -> Path:
    lines = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        for k, v in values.items():
            lines.append(f"{k} = {toml_value(v)}")
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def valvey_proc(tmp: Path, config: Path, env: dict[str, str] | None = None) -> Proc:
    return Proc(
        "valvey",
        [sys.executable, "-m", "valvey", "--config", str(config), "--log-format", "json"],
        tmp / "valvey.log",
        env=env,
    )


class Watcher:
    """Subscribes like any other tool: the simulator's plant truth and valvey's state/alarms."""

    def __init__(self, mqtt_port: int, rack: str):
        self.rec = Recorder()
        self.ident = Identity(rack=rack)
        self.link = MqttLink(
            MqttSettings(
                port=mqtt_port,
                clean_session=True,
                client_id=f"test-watcher-{rack}-{time.monotonic_ns()}",
            ),
            self.ident,
            "tester",
            clock=SYSTEM_CLOCK,
        )
        base = f"rackplane/{self.ident.site}/{rack}"
        for topic in (
            f"{base}/sim/telemetry/plant",
            f"{base}/valvey/state/#",
            f"{base}/valvey/status",
            f"{base}/valvey/alarm/+",
        ):
            self.link.subscribe(topic, self.rec.on_message, qos=0)
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Watcher:
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

    @property
    def plant_t(self) -> float:
        return float(self.rec.plant[-1]["t_s"]) if self.rec.plant else 0.0

    def last_loop(self) -> dict[str, Any]:
        return self.rec.loop[-1] if self.rec.loop else {}

    async def until(
        self, cond: Callable[[], bool], timeout_s: float, what: str, *procs: Proc
    ) -> float:
        """Wait for ``cond``; fail naming ``what`` (and any process that died)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if cond():
                return time.monotonic() - t0
            for p in procs:
                assert p.alive(), (
                    f"{p.name} exited ({p.proc.returncode if p.proc else '?'}); "
                    f"log:\n{p.log.read_text()[-3000:]}"
                )
            await asyncio.sleep(0.2)
        raise AssertionError(
            f"timed out after {timeout_s} s waiting for {what}; last loop state {self.last_loop()}"
        )
