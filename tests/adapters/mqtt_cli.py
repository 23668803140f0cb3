"""Independent MQTT clients for the adapter tests: Mosquitto's own C tools (mosquitto-clients).

Tests drive and observe `rackplane.io.mqtt.MqttLink` with `mosquitto_pub` / `mosquitto_sub`
subprocesses, never with aiomqtt (the module under test) nor with a mock of the broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import pytest


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found: install the Debian package 'mosquitto-clients'")
    return path


def _props(response_topic: str | None, correlation_data: str | None) -> list[str]:
    argv: list[str] = []
    if response_topic is not None:
        argv += ["-D", "publish", "response-topic", response_topic]
    if correlation_data is not None:
        argv += ["-D", "publish", "correlation-data", correlation_data]
    return argv


async def mqtt_pub(
    port: int,
    topic: str,
    payload: str | None,
    *,
    qos: int = 1,
    retain: bool = False,
    v5: bool = False,
    response_topic: str | None = None,
    correlation_data: str | None = None,
    host: str = "127.0.0.1",
) -> None:
    """Publish one message with ``mosquitto_pub`` (``payload=None``: zero-length)."""
    argv = [_binary("mosquitto_pub"), "-h", host, "-p", str(port), "-t", topic, "-q", str(qos)]
    argv += ["-n"] if payload is None else ["-m", payload]
    if retain:
        argv.append("-r")
    if v5 or response_topic or correlation_data:
        argv += ["-V", "mqttv5", *_props(response_topic, correlation_data)]
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 20)
    if proc.returncode != 0:
        raise RuntimeError(f"mosquitto_pub failed ({proc.returncode}): {(err + out).decode()}")


async def mqtt_pub_lines(
    port: int, topic: str, lines: list[str], *, qos: int = 1, host: str = "127.0.0.1"
) -> None:
    """Publish each line as one message, from one ``mosquitto_pub -l`` connection."""
    argv = [_binary("mosquitto_pub"), "-h", host, "-p", str(port), "-t", topic, "-q", str(qos)]
    proc = await asyncio.create_subprocess_exec(
        *argv, "-l", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    data = "".join(line + "\n" for line in lines).encode()
    _out, err = await asyncio.wait_for(proc.communicate(data), 60)
    if proc.returncode != 0:
        raise RuntimeError(f"mosquitto_pub -l failed ({proc.returncode}): {err.decode()}")


@dataclass(frozen=True)
class Received:
    """One message seen by `MqttSub`."""

    topic: str
    payload: bytes
    retain: bool
    qos: int
    correlation_data: str


class MqttSub:
    """A ``mosquitto_sub`` (MQTT v5 by default) recording every message on its filters.

    ``async with MqttSub(port, "a/#") as sub``: returns once the subscription is live (a probe
    message on a private topic came back). ``await sub.wait_for(pred)`` returns the first
    recorded message matching ``pred``.
    """

    def __init__(
        self, port: int, *filters: str, qos: int = 1, v5: bool = True, host: str = "127.0.0.1"
    ) -> None:
        self.port = port
        self.v5 = v5
        self.host = host
        self.filters = filters
        self.qos = qos
        self.messages: list[Received] = []
        self._probe = f"rp-test-probe/{uuid.uuid4().hex}"
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._probed = False

    async def __aenter__(self) -> MqttSub:
        argv = [_binary("mosquitto_sub"), "-h", self.host, "-p", str(self.port)]
        argv += ["-V", "mqttv5" if self.v5 else "mqttv311"]
        argv += ["-q", str(self.qos), "--nodelay", "-F", "%r %q %t %D %x"]
        for f in (*self.filters, self._probe):
            argv += ["-t", f]
        self._proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
        )
        self._reader = asyncio.create_task(self._read())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while not self._probed:
            if loop.time() > deadline:
                raise TimeoutError("mosquitto_sub did not come up")
            await mqtt_pub(self.port, self._probe, "probe", qos=0, host=self.host)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), 0.2)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._proc is not None and self._proc.returncode is None:
            self._proc.terminate()
            await self._proc.wait()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(BaseException):
                await self._reader

    async def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        while True:
            line = await self._proc.stdout.readline()
            if not line:
                return
            parts = line.decode().rstrip("\n").split(" ", 4)
            if len(parts) != 5:
                continue
            retain, qos, topic, corr, hexpayload = parts
            if topic == self._probe:
                self._probed = True
                self._changed.set()
                continue
            self.messages.append(
                Received(topic, bytes.fromhex(hexpayload), retain == "1", int(qos), corr)
            )
            self._changed.set()

    def on(self, topic: str) -> list[Received]:
        """Messages recorded on ``topic`` (exact), in arrival order."""
        return [m for m in self.messages if m.topic == topic]

    async def wait_for(
        self, pred: Callable[[Received], bool], timeout_s: float = 10.0, start: int = 0
    ) -> Received:
        """The first message (from index ``start``) matching ``pred``.

        Raises:
            TimeoutError: none within ``timeout_s``.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            for m in self.messages[start:]:
                if pred(m):
                    return m
            left = deadline - loop.time()
            if left <= 0:
                seen = [(m.topic, m.payload[:80]) for m in self.messages[-10:]]
                raise TimeoutError(f"no matching message in {timeout_s} s; last seen: {seen}")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)
