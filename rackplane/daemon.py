"""The daemon frame: what every rackplane daemon is built of, written once (DESIGN §1, §3).

A daemon (valvey, racky, and the ones to come) subclasses `DaemonFrame` and supplies a few
hooks; the frame owns the rest:

- **construction**: the MQTT link (`rackplane.io.mqtt.MqttLink`), the telemetry writer
  (`rackplane.io.tsdb.TelemetryWriter` with the effective spool), self-metrics
  (`rackplane.io.selfmetrics.SelfMetrics`), the systemd `Notifier`, `TickStats`, the logger,
  the identity tags; `attach_commands` adds the command router with leases and the audit to
  the time series (measurement ``command``);
- **run**: one `asyncio.TaskGroup` with named supervised tasks: the daemon's owner tasks
  (`owner_tasks`, started first; more at run time with `start_task`), ``mqtt``, ``tsdb`` and
  the tick (`tick_task_name`, every ``cfg.control.tick_s`` on a fixed schedule). After the
  first tick: ``READY=1`` (never waiting for the broker or the database); every tick feeds the
  watchdog (FIELD-CASES BR-24);
- **ordered stop** when ``stop`` is set: ``STOPPING=1``, the tick stops, the daemon's stop
  writes (`stop_outputs`), its state saved (`save_state_at_stop`), the last state published
  (`publish_final_state`), the MQTT link stopped (``stopping`` then ``offline``), the writer
  closed within ``tsdb.stop_budget_s``, then the owner tasks; each step bounded (the daemon's
  hooks by ``cfg.control.stop_budget_s`` each, with a second budget of grace);
- **reload** (SIGHUP, `rackplane.io.service.run_daemon`): the config re-read with
  `load_config`; a config that does not load is refused and the running one kept; command
  roles and limits and logging apply at once, the daemon applies what it can
  (`apply_reload`), every other changed section is kept as it runs and named
  (``reload_needs_restart``).

Hooks (see each method): `load_config`, `tick`, `owner_tasks`, `stop_outputs`,
`save_state_at_stop`, `publish_final_state`, `apply_reload`, `ready_status`, `start_fields`,
`final_counts`. The shared command line (``--check-config``, ``--dry-connect``,
``--print-default-config``, ``--log-level``, ``--log-format``) is `rackplane.daemon_cli`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypedDict, TypeVar

from rackplane.clock import SYSTEM_CLOCK, Clock
from rackplane.commands import CommandAudit, CommandRouter, LeaseGate
from rackplane.core.effects import LogRecord, TsLine
from rackplane.core.leases import LeaseTable
from rackplane.errors import ConfigError
from rackplane.io.mqtt import MqttLink
from rackplane.io.selfmetrics import SelfMetrics
from rackplane.io.service import Notifier, TickStats, run_ticker, supervised
from rackplane.io.tsdb import TelemetryWriter
from rackplane.log import configure_logging, get_logger
from rackplane.settings import (
    CommandSettings,
    Identity,
    LogSettings,
    MetricsSettings,
    MqttSettings,
    SpoolSettings,
    TsdbSettings,
    effective_spool,
)

__all__ = [
    "ControlConfig",
    "DaemonConfig",
    "DaemonFrame",
    "FrameOptions",
    "OwnerTask",
    "ReloadOutcome",
]


class ControlConfig(Protocol):
    """The ``[control]`` keys the frame reads: the tick period and the stop budget, s."""

    @property
    def tick_s(self) -> float: ...

    @property
    def stop_budget_s(self) -> float: ...


class DaemonConfig(Protocol):
    """The config sections every daemon has (rackplane.settings), as the frame reads them."""

    @property
    def identity(self) -> Identity: ...

    @property
    def mqtt(self) -> MqttSettings: ...

    @property
    def tsdb(self) -> TsdbSettings: ...

    @property
    def spool(self) -> SpoolSettings: ...

    @property
    def commands(self) -> CommandSettings: ...

    @property
    def metrics(self) -> MetricsSettings: ...

    @property
    def log(self) -> LogSettings: ...

    @property
    def control(self) -> ControlConfig: ...

    def model_copy(self, *, update: Mapping[str, Any] | None = None,
                   deep: bool = False) -> Any: ...


C = TypeVar("C", bound=DaemonConfig)


class FrameOptions(TypedDict, total=False):
    """The keyword arguments of `DaemonFrame` a daemon's constructor passes on
    (``**options: Unpack[FrameOptions]``)."""

    clock: Clock
    notifier: Notifier | None
    config_path: str | os.PathLike[str] | None


@dataclass(frozen=True, slots=True)
class OwnerTask:
    """A supervised owner task: ``run`` is restarted (after a log line) if it ever raises."""

    name: str
    run: Callable[[], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class ReloadOutcome:
    """What a daemon's `DaemonFrame.apply_reload` did.

    Args:
        applied: the config sections now in force besides ``commands`` and ``log``.
        restart_sections: the sections that apply only after a restart (a change in them is
            kept out of the running config and named); None: every section not applied.
        fields: extra fields of the ``reloaded`` log line.
    """

    applied: tuple[str, ...] = ()
    restart_sections: tuple[str, ...] | None = None
    fields: Mapping[str, Any] | None = None


class DaemonFrame(ABC, Generic[C]):
    """Base of a rackplane daemon (module docstring).

    Attributes the daemon and its handlers use: ``cfg``, ``clock``, ``config_path``,
    ``notifier``, ``log``, ``tags_base`` (site/row/rack tags), ``tick_stats``, ``mqtt``,
    ``writer``, ``selfmetrics``, ``commands`` and ``leases`` (after `attach_commands`),
    ``first_step_done`` (set after the first tick), ``started_mono`` (s, monotonic).

    Args:
        cfg: the validated config (the daemon's model).
        clock: injected clocks; notifier: systemd notification (default: from the
            environment); config_path: the file `reload` re-reads (None: embedded defaults,
            reload is skipped).
    """

    daemon: ClassVar[str]
    """The daemon's name: MQTT topic level, logger, self-metrics prefix."""
    tick_task_name: ClassVar[str] = "tick"
    """Name of the tick's task in the TaskGroup."""

    commands: CommandRouter
    leases: LeaseGate

    def __init__(
        self,
        cfg: C,
        *,
        clock: Clock = SYSTEM_CLOCK,
        notifier: Notifier | None = None,
        config_path: str | os.PathLike[str] | None = None,
    ) -> None:
        self.cfg = cfg
        self.clock = clock
        self.config_path = config_path
        self.notifier = notifier or Notifier(clock)
        self.log = get_logger(self.daemon)
        ident = cfg.identity
        self.tags_base = {"site": ident.site, "row": ident.row, "rack": ident.rack}
        self.tick_stats = TickStats()
        self.mqtt = MqttLink(cfg.mqtt, ident, self.daemon, clock=clock)
        self.writer = TelemetryWriter(
            cfg.tsdb, effective_spool(cfg.spool), identity_tags=self.tags_base, clock=clock
        )
        self.selfmetrics = SelfMetrics(self.daemon, cfg.metrics, clock=clock)
        self.started_mono = clock.monotonic()
        self.first_step_done = asyncio.Event()
        self.tasks: dict[str, asyncio.Task[Any]] = {}
        self._tg: asyncio.TaskGroup | None = None

    # -- commands --------------------------------------------------------------------------

    def attach_commands(
        self,
        *,
        lease_outputs: Mapping[str, str],
        register: Callable[[CommandRouter, LeaseGate], None],
    ) -> None:
        """Build the command router (``cmd/<user>/<verb>``, each command audited), its lease
        gate over ``lease_outputs`` (output -> description), let ``register`` add the
        daemon's verbs, and subscribe (before `run`, so commands a persistent session delivers
        right after CONNACK find their handler: BR-22 a)."""
        c = self.cfg.commands
        self.commands = CommandRouter(self.mqtt, c, clock=self.clock, audit=self._audit_command)
        self.leases = LeaseGate(self.commands, LeaseTable(
            dict(lease_outputs), default_ttl_s=c.lease_default_ttl_s,
            max_ttl_s=c.lease_max_ttl_s))
        register(self.commands, self.leases)
        self.commands.attach()

    def _audit_command(self, audit: CommandAudit) -> None:
        """Every command, accepted or refused: measurement ``command`` (tags user, verb,
        outcome; fields ok 1/0, latency_s)."""
        self.writer.write("command", audit.tags(), audit.fields(), audit.wall_ns)

    # -- hooks -----------------------------------------------------------------------------

    @classmethod
    @abstractmethod
    def load_config(cls, path: str | os.PathLike[str]) -> C:
        """Load and cross-check the config at ``path`` (for `reload`).

        Raises:
            ConfigError: naming the key path.
        """

    @abstractmethod
    def tick(self, now: float) -> None:
        """One tick at monotonic time ``now`` (s); never awaits the network."""

    def owner_tasks(self) -> Sequence[OwnerTask]:
        """The daemon's owner tasks (devices, discovery), started before the link."""
        return ()

    async def stop_outputs(self) -> None:
        """Stop writes: the outputs to their declared stop state (first step of the stop)."""

    async def save_state_at_stop(self) -> None:
        """Persist what must survive the restart (after `stop_outputs`)."""

    def publish_final_state(self) -> None:
        """Queue the last retained state (before the link stops)."""

    def apply_reload(self, cfg: C) -> ReloadOutcome:
        """Apply what of the new config applies at once (commands and log are the frame's)."""
        return ReloadOutcome()

    # --- applying a tick's shared effects (rackplane.core.effects) ------------------------

    def log_records(self, records: Iterable[LogRecord]) -> None:
        """Emit a tick's log records on the daemon's logger."""
        for rec in records:
            getattr(self.log, rec.level)(rec.event, **rec.fields)

    def write_lines(self, lines: Iterable[TsLine]) -> None:
        """Hand a tick's time-series points to the writer (spooled; never waits)."""
        write = self.writer.write
        for line in lines:
            write(line.measurement, line.tags, line.fields, line.wall_ns)

    def config_reloaded(self) -> None:
        """After a reload, once ``self.cfg`` is the config now in force (the file's applied
        sections, the running values of those that need a restart): e.g. hand it to the tick."""

    def ready_status(self) -> tuple[str, Mapping[str, Any]]:
        """The ``STATUS=`` text sent with ``READY=1`` and the ``ready`` log line's fields."""
        return f"{self.daemon} running", {}

    def start_fields(self) -> Mapping[str, Any]:
        """Fields of the ``starting`` log line."""
        return {}

    def final_counts(self) -> Mapping[str, Any]:
        """Fields of the ``stopped`` log line."""
        return {}

    stopping_status: ClassVar[str] = "stopping"
    """The ``STATUS=`` text sent with ``STOPPING=1``."""

    # -- run -------------------------------------------------------------------------------

    def uptime_s(self) -> float:
        """Seconds since the daemon object was built (monotonic), rounded to 0.1 s."""
        return round(self.clock.monotonic() - self.started_mono, 1)

    def start_task(self, name: str, run: Callable[[], Awaitable[Any]]) -> asyncio.Task[Any] | None:
        """Start a supervised owner task named ``name`` in the running TaskGroup (recorded in
        ``tasks``); None when the daemon is not running (the task starts with `run` then, if
        `owner_tasks` lists it)."""
        if self._tg is None:
            return None
        task = self._tg.create_task(supervised(name, run, self.log)(), name=name)
        self.tasks[name] = task
        return task

    def stop_task(self, name: str) -> None:
        """Cancel the owner task ``name`` if it runs."""
        task = self.tasks.pop(name, None)
        if task is not None:
            task.cancel()

    def modbus_devices(self) -> Sequence[Any]:
        """The daemon's Modbus owners (`rackplane.io.modbus.ModbusDevice`), for self-metrics."""
        return ()

    def pv_age_s(self, now: float) -> float | None:
        """Age of the process value the daemon controls on, s (None: none read yet), for
        self-metrics."""
        return None

    def run_tick(self, now: float) -> None:
        """One tick as the ticker runs it: the daemon's `tick`, its self-metrics, the
        watchdog, and READY after the first one."""
        self.tick(now)
        self.selfmetrics.tick(now, tick_stats=self.tick_stats, writer=self.writer,
                              mqtt=self.mqtt, commands=self.commands,
                              devices=self.modbus_devices(), pv_age_s=self.pv_age_s(now))
        self.notifier.tick()
        if not self.first_step_done.is_set():
            self.first_step_done.set()
            status, fields = self.ready_status()
            self.notifier.ready(status)
            self.log.info("ready", **fields)

    async def _bounded(self, step: str, coro: Coroutine[Any, Any, None]) -> None:
        """Run a stop hook within twice ``control.stop_budget_s`` (a hook that hangs must not
        keep the telemetry from draining); a hook that fails is logged, the stop goes on."""
        budget = 2.0 * self.cfg.control.stop_budget_s
        try:
            await asyncio.wait_for(coro, budget)
        except TimeoutError:
            self.log.error("stop_step_timeout", step=step, budget_s=budget)
        except Exception as err:
            self.log.error("stop_step_failed", step=step, error=repr(err), exc_info=True)

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set, then stop in order (module docstring)."""
        self.log.info("starting", **self.start_fields())
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            for t in self.owner_tasks():
                self.start_task(t.name, t.run)
            mqtt_task = tg.create_task(supervised("mqtt", self.mqtt.run, self.log)(),
                                       name="mqtt")
            writer_task = tg.create_task(supervised("tsdb", self.writer.run, self.log)(),
                                         name="tsdb")
            ticker = tg.create_task(
                run_ticker(self.cfg.control.tick_s, self.run_tick, self.clock,
                           self.tick_stats),
                name=self.tick_task_name,
            )
            await stop.wait()
            self.notifier.stopping(self.stopping_status)
            self.log.info("stopping")
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
            await self._bounded("stop_outputs", self.stop_outputs())
            await self._bounded("save_state", self.save_state_at_stop())
            self.publish_final_state()
            await self.mqtt.stop()
            mqtt_task.cancel()
            await self.writer.close()
            writer_task.cancel()
            for task in self.tasks.values():
                task.cancel()
            self._tg = None
        self.log.info("stopped", **self.final_counts())

    # -- reload ----------------------------------------------------------------------------

    def reload(self) -> None:
        """SIGHUP: re-read the config. Refused (running config kept, ``reload_rejected``)
        when it does not load; else command roles and limits and logging apply at once, the
        daemon's `apply_reload` applies its part, and every other changed section is kept as
        it runs until a restart (``reload_needs_restart``)."""
        if self.config_path is None:
            self.log.info("reload_skipped", reason="running on embedded defaults")
            return
        self.notifier.reloading()
        try:
            cfg = self.load_config(self.config_path)
        except ConfigError as err:
            self.log.error("reload_rejected", error=str(err))
            self.notifier.status("reload rejected: config invalid; running config kept")
            return
        outcome = self.apply_reload(cfg)
        self.commands.update_settings(cfg.commands)  # roles and limits apply at once
        if cfg.log != self.cfg.log:
            configure_logging(cfg.log.level, cfg.log.format)
        applied = (*outcome.applied, "commands", "log")
        sections = outcome.restart_sections
        if sections is None:
            sections = tuple(k for k in type(cfg).model_fields  # type: ignore[attr-defined]
                             if k not in applied)
        changed = [k for k in sections if getattr(cfg, k) != getattr(self.cfg, k)]
        if changed:
            self.log.warning("reload_needs_restart", sections=changed,
                             note="these sections apply only after a restart")
        self.cfg = cfg.model_copy(update={k: getattr(self.cfg, k) for k in changed})
        self.config_reloaded()
        self.log.info("reloaded", **dict(outcome.fields or {}), applied=list(applied),
                      kept=changed)
        self.notifier.reloaded()
