"""racky the daemon, first version: the runtime every later racky feature stands on.

It polls the configured power shelves (one owner task each), writes their points to the time
series through the spool, and publishes its status, health and the rack's measured power
(``state/rack_power``: the sum of the shelves' ``output_power_w`` points, the input valvey's
feedforward will use) on MQTT. Power capping, link health, detection and the rack lifecycle
come in later versions (issue 5).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

from rackplane.clock import SYSTEM_CLOCK, Clock
from rackplane.config import check_environment, check_writable_dir, load_config
from rackplane.errors import ConfigError
from rackplane.log import get_logger
from rackplane.modbus import ModbusDevice
from rackplane.mqtt import MqttLink
from rackplane.registers import load_register_map
from rackplane.samples import Sample
from rackplane.service import Notifier, TickStats, run_ticker, supervised
from rackplane.settings import effective_spool, environment_checks
from rackplane.tsdb import TelemetryWriter
from racky.config import RackyConfig

DAEMON = "racky"
RACK_POWER_POINT = "output_power_w"


def load_racky_config(path: str | os.PathLike[str] | None) -> RackyConfig:
    """Load the config and check every power shelf's register map loads.

    Raises:
        ConfigError: with the key path named.
    """
    cfg = load_config(RackyConfig, path)
    for i, shelf in enumerate(cfg.power_shelves):
        try:
            load_register_map(shelf.register_map)
        except ConfigError as err:
            key = f"power_shelves[{i}].register_map"
            raise ConfigError(f"{key}: {err}", problems=[f"{key}: {err}"]) from None
    check_environment(environment_checks(cfg.mqtt, cfg.tsdb))
    check_writable_dir("spool.directory", effective_spool(cfg.spool).directory)
    return cfg


class Racky:
    """The racky daemon (see the module docstring)."""

    def __init__(
        self,
        cfg: RackyConfig,
        *,
        clock: Clock = SYSTEM_CLOCK,
        notifier: Notifier | None = None,
        config_path: str | os.PathLike[str] | None = None,
    ):
        self.cfg = cfg
        self.clock = clock
        self.config_path = config_path
        self.notifier = notifier or Notifier(clock)
        self.log = get_logger(DAEMON)
        ident = cfg.identity
        self.tags_base = {"site": ident.site, "row": ident.row, "rack": ident.rack}
        self.latest: dict[str, dict[str, Sample]] = {s.name: {} for s in cfg.power_shelves}
        self.devices = [
            ModbusDevice(s, clock=clock, on_samples=self._collector(s.name))
            for s in cfg.power_shelves
        ]
        self.mqtt = MqttLink(cfg.mqtt, ident, DAEMON, clock=clock)
        self.writer = TelemetryWriter(
            cfg.tsdb, effective_spool(cfg.spool), identity_tags=self.tags_base, clock=clock
        )
        self.tick_stats = TickStats()
        self._next_state = 0.0
        self._started = clock.monotonic()

    def _collector(self, name: str) -> Any:
        def collect(samples: list[Sample]) -> None:
            self.latest[name] = {s.point: s for s in samples}

        return collect

    def rack_power_w(self) -> tuple[float | None, int]:
        """Sum of the shelves' output power [W] and how many shelves contributed."""
        total, n = 0.0, 0
        for samples in self.latest.values():
            s = samples.get(RACK_POWER_POINT)
            if s is not None and s.usable and s.value is not None:
                total += s.value
                n += 1
        return (total if n else None), n

    def _tick(self, now: float) -> None:
        ts = self.clock.wall_ns()
        for name, samples in self.latest.items():
            if samples:
                self.writer.write_samples("power_shelf", {"device": name}, samples.values(), ts)
        power_w, shelves = self.rack_power_w()
        if now >= self._next_state:
            self._next_state = now + self.cfg.control.state_interval_s
            self.mqtt.publish_state(
                "health",
                {
                    "uptime_s": round(now - self._started, 1),
                    "tick_late_max_s": round(self.tick_stats.late_max_s, 4),
                    "shelves": {d.name: d.stats.as_dict() for d in self.devices},
                },
            )
        self.mqtt.publish_state(
            "rack_power",
            {
                "rack_power_w": power_w,
                "shelves_reporting": shelves,
                "shelves_configured": len(self.devices),
                "ts_ns": ts,
            },
        )
        self.notifier.tick()
        if not self.notifier.ready_sent:
            self.notifier.ready("racky running")
            self.log.info("ready", shelves=len(self.devices))

    async def run(self, stop: asyncio.Event) -> None:
        self.log.info(
            "starting",
            shelves=[s.name for s in self.cfg.power_shelves],
            broker=f"{self.cfg.mqtt.host}:{self.cfg.mqtt.port}",
            tsdb=self.cfg.tsdb.url or "embedded spool",
        )
        async with asyncio.TaskGroup() as tg:
            side = [
                tg.create_task(
                    supervised(f"modbus:{d.name}", d.run, self.log)(), name=f"modbus:{d.name}"
                )
                for d in self.devices
            ]
            mqtt_task = tg.create_task(supervised("mqtt", self.mqtt.run, self.log)(), name="mqtt")
            writer_task = tg.create_task(
                supervised("tsdb", self.writer.run, self.log)(), name="tsdb"
            )
            tick = tg.create_task(
                run_ticker(self.cfg.control.tick_s, self._tick, self.clock, self.tick_stats),
                name="tick",
            )
            await stop.wait()
            self.notifier.stopping("stopping")
            tick.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await tick
            await self.mqtt.stop()
            mqtt_task.cancel()
            await self.writer.close()
            writer_task.cancel()
            for t in side:
                t.cancel()
        self.log.info("stopped")

    def reload(self) -> None:
        self.log.warning("reload_needs_restart", note="racky reloads nothing in this version")
