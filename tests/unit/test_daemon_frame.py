"""The daemon frame (rackplane.daemon) with a tiny daemon of its own: real asyncio, a real
MQTT link and telemetry writer (no broker: the link keeps retrying a closed port, the writer
spools to a temporary folder), no mocks of either.

- the stop runs in order: the tick stops, stop writes, state saved, final state, the link
  stops, the writer closes, the owner tasks end;
- an owner task that raises is restarted and the tick goes on;
- a reload whose config does not load keeps the running config; one that loads applies
  the commands section and keeps (and names) a section that needs a restart;
- READY goes out only after the first tick, WATCHDOG from the tick.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field

from harness.servers import free_port
from rackplane import settings as st
from rackplane.commands import CommandRouter, LeaseGate
from rackplane.config import StrictModel, load_config
from rackplane.daemon import DaemonFrame, OwnerTask, ReloadOutcome
from rackplane.io.service import Notifier
from rackplane.settings import MqttSettings, SpoolSettings


class FakeControl(StrictModel):
    tick_s: float = Field(0.02, gt=0)
    stop_budget_s: float = Field(0.5, gt=0)
    gain: float = 1.0


class FakeConfig(StrictModel):
    identity: st.Identity = Field(default_factory=st.Identity)
    mqtt: MqttSettings = Field(default_factory=MqttSettings)
    tsdb: st.TsdbSettings = Field(default_factory=st.TsdbSettings)
    spool: SpoolSettings = Field(default_factory=SpoolSettings)
    commands: st.CommandSettings = Field(default_factory=st.CommandSettings)
    metrics: st.MetricsSettings = Field(default_factory=st.MetricsSettings)
    log: st.LogSettings = Field(default_factory=st.LogSettings)
    control: FakeControl = Field(default_factory=FakeControl)


class RecordingNotifier(Notifier):
    """systemd's side: what would have been sent, in order."""

    def __init__(self) -> None:
        super().__init__(clock=_clock(), environ={"NOTIFY_SOCKET": "@unused",
                                                  "WATCHDOG_USEC": "40000"})
        self.sent: list[str] = []

    def _send(self, msg: str) -> None:
        self.sent.append(msg)


def _clock() -> Any:
    from rackplane.clock import SYSTEM_CLOCK
    return SYSTEM_CLOCK


class Tiny(DaemonFrame[FakeConfig]):
    daemon = "tiny"

    def __init__(self, cfg: FakeConfig, events: list[str], **kw: Any) -> None:
        super().__init__(cfg, **kw)
        self.events = events
        self.ticks = 0
        self.ready_seen_in_tick: list[bool] = []
        self.owner_runs = 0
        self.crash_owner = False
        self.attach_commands(lease_outputs={"valve": "the valve"}, register=self._verbs)

    def _verbs(self, router: CommandRouter, leases: LeaseGate) -> None:
        self.events.append("verbs")

    @classmethod
    def load_config(cls, path: str | os.PathLike[str]) -> FakeConfig:
        return load_config(FakeConfig, path)

    def tick(self, now: float) -> None:
        self.ready_seen_in_tick.append(self.notifier.ready_sent)
        self.ticks += 1
        if "stopping" in self.events:
            self.events.append("tick_after_stop")

    def owner_tasks(self) -> Sequence[OwnerTask]:
        return [OwnerTask("device", self._device)]

    async def _device(self) -> None:
        self.owner_runs += 1
        try:
            if self.crash_owner and self.owner_runs == 1:
                raise RuntimeError("device task fails once")
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.events.append("owner_cancelled")
            raise

    async def stop_outputs(self) -> None:
        self.events.append("stop_outputs")

    async def save_state_at_stop(self) -> None:
        self.events.append("save_state")

    def publish_final_state(self) -> None:
        self.events.append("final_state")

    def apply_reload(self, cfg: FakeConfig) -> ReloadOutcome:
        return ReloadOutcome(restart_sections=("control", "mqtt"))

    def ready_status(self) -> tuple[str, Mapping[str, Any]]:
        return "tiny running", {"ticks": self.ticks}


def _cfg(tmp_path: Path) -> FakeConfig:
    return FakeConfig(mqtt=MqttSettings(port=free_port(), reconnect_min_s=0.05,
                                        reconnect_max_s=0.1),
                      spool=SpoolSettings(directory=tmp_path / "spool"))


def _tiny(tmp_path: Path, events: list[str], **kw: Any) -> Tiny:
    d = Tiny(_cfg(tmp_path), events, notifier=RecordingNotifier(), **kw)

    async def mqtt_stop(timeout_s: float | None = None, _orig: Any = d.mqtt.stop) -> None:
        events.append("mqtt_stop")
        await _orig(timeout_s)

    async def writer_close(budget_s: float | None = None, _orig: Any = d.writer.close) -> None:
        events.append("writer_close")
        await _orig(budget_s)

    d.mqtt.stop = mqtt_stop  # type: ignore[method-assign]
    d.writer.close = writer_close  # type: ignore[method-assign]
    return d


async def _run_until(d: Tiny, done: Any, timeout_s: float = 10.0) -> asyncio.Event:
    stop = asyncio.Event()
    task = asyncio.create_task(d.run(stop))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not done() and loop.time() < deadline:  # noqa: ASYNC110 (a condition, not an event)
        await asyncio.sleep(0.01)
    d.events.append("stopping")
    stop.set()
    await asyncio.wait_for(task, 20.0)
    return stop


async def test_stop_runs_in_order(tmp_path: Path) -> None:
    events: list[str] = []
    d = _tiny(tmp_path, events)
    await _run_until(d, lambda: d.ticks >= 3)
    after = events[events.index("stopping"):]
    assert "tick_after_stop" not in after
    assert [e for e in after if e != "owner_cancelled"] == [
        "stopping", "stop_outputs", "save_state", "final_state", "mqtt_stop", "writer_close"]
    assert after[-1] == "owner_cancelled"  # the device outlives the stop writes
    notes = d.notifier.sent  # type: ignore[attr-defined]
    assert notes[-1].startswith("STOPPING=1")


async def test_a_failing_owner_task_is_restarted_and_the_tick_goes_on(tmp_path: Path) -> None:
    events: list[str] = []
    d = _tiny(tmp_path, events)
    d.crash_owner = True
    await _run_until(d, lambda: d.owner_runs >= 2)
    assert d.owner_runs == 2
    assert d.ticks > 10  # the tick ran through the failure and the 1 s restart delay


async def test_ready_only_after_the_first_tick_and_watchdog_from_the_tick(tmp_path: Path) -> None:
    events: list[str] = []
    d = _tiny(tmp_path, events)
    assert not d.notifier.ready_sent and not d.first_step_done.is_set()
    await _run_until(d, lambda: d.ticks >= 5)
    assert d.ready_seen_in_tick[0] is False  # not yet during the first tick
    assert all(d.ready_seen_in_tick[1:])
    notes = d.notifier.sent  # type: ignore[attr-defined]
    assert next(n for n in notes if n != "WATCHDOG=1") == "READY=1\nSTATUS=tiny running"
    assert notes.count("READY=1\nSTATUS=tiny running") == 1
    assert "WATCHDOG=1" in notes
    assert d.first_step_done.is_set()


def test_reload_refused_keeps_the_running_config(tmp_path: Path) -> None:
    path = tmp_path / "tiny.toml"
    path.write_text('[commands]\nusers = { alice = "operator" }\n')
    events: list[str] = []
    d = _tiny(tmp_path, events, config_path=path)
    running = d.cfg
    path.write_text("[control]\ngain = 'not a number'\n")
    d.reload()
    assert d.cfg is running
    notes = d.notifier.sent  # type: ignore[attr-defined]
    assert notes == ["RELOADING=1",
                     "STATUS=reload rejected: config invalid; running config kept"]


def test_reload_applies_commands_and_keeps_restart_sections(tmp_path: Path) -> None:
    path = tmp_path / "tiny.toml"
    path.write_text("")
    events: list[str] = []
    d = _tiny(tmp_path, events, config_path=path)
    tick_s = d.cfg.control.tick_s
    path.write_text('[commands]\nusers = { alice = "operator" }\n'
                    "[control]\ntick_s = 0.5\ngain = 2.0\n")
    d.reload()
    assert d.cfg.commands.users == {"alice": "operator"}  # applied at once
    assert d.cfg.control.tick_s == tick_s  # needs a restart: the running value is kept
    assert d.cfg.control.gain == 1.0
    assert d.notifier.sent[-1] == "READY=1\nSTATUS=reloaded"  # type: ignore[attr-defined]


def test_reload_without_a_file_is_skipped(tmp_path: Path) -> None:
    d = _tiny(tmp_path, [])
    running = d.cfg
    d.reload()
    assert d.cfg is running and d.notifier.sent == []  # type: ignore[attr-defined]


def test_commands_attached_with_leases(tmp_path: Path) -> None:
    events: list[str] = []
    d = _tiny(tmp_path, events)
    assert events == ["verbs"]
    assert d.leases is not None and d.commands is not None


@pytest.mark.parametrize("name", ["valvey.app", "racky.app"])
def test_the_daemons_use_the_frame(name: str) -> None:
    import importlib

    mod = importlib.import_module(name)
    cls = mod.Valvey if name == "valvey.app" else mod.Racky
    assert issubclass(cls, DaemonFrame)
    assert "run" not in vars(cls) and "reload" not in vars(cls)
