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
  the tick (`tick_task_name`, every ``cfg.control.tick_s`` on a fixed schedule; `wake_tick`:
  the next one now). After the first tick: ``READY=1`` (never waiting for the broker or the
  database); every tick feeds the watchdog (FIELD-CASES BR-24);
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

**Redundant pairs** (issue 15, docs/OPERATIONS.md §6): a config with ``[leadership]``
``enabled = true`` runs the leadership lease (task ``leadership``, `rackplane.io.nats.lease`);
`may_write` is then true only while this instance holds it, every Modbus owner's writes are
gated on it (`WriteFenced`), and a clean stop releases the lease after the stop writes. The
instance's MQTT identity is its own (`MqttLink` ``instance``: client id ``<daemon>-<site>-
<rack>-<instance>``, status and Last Will on ``<base>/status/<instance>``); each tick the frame
sets `role` (``active`` while `may_write`, else ``standby``) and publishes it with the epoch
and the lease's state on ``state/pair_<instance>`` (on change and every second). Only the
active instance answers commands (the standby's router ignores them) and owns the daemon's
shared retained topics: on becoming active it reconciles the retained alarms, on becoming
standby it forgets the state and alarms it held (`on_role_change`); the daemon publishes
shared state, alarms and telemetry only while `is_active`. Without that section, or with
``enabled = false``, `may_write` is always true and `role` None: nothing changes.

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
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypedDict, TypeVar

from rackplane.clock import SYSTEM_CLOCK, Clock
from rackplane.commands import CommandAudit, CommandRouter, LeaseGate
from rackplane.core import pair_sync as pairs
from rackplane.core.alarms import AlarmEngine
from rackplane.core.effects import LogRecord, TsLine, alarm_event
from rackplane.core.envelope import alarm_payload
from rackplane.core.leases import LeaseTable
from rackplane.core.pair_sync import PairAlarms, is_pair_alarm, pair_alarm_defs
from rackplane.errors import ConfigError
from rackplane.io.mqtt import MqttLink
from rackplane.io.selfmetrics import SelfMetrics
from rackplane.io.service import Notifier, TickStats, run_ticker, supervised
from rackplane.io.tsdb import TelemetryWriter
from rackplane.leadership_settings import LeadershipSettings
from rackplane.log import configure_logging, get_logger
from rackplane.paths import in_state_directory
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

if TYPE_CHECKING:
    from rackplane.core.pair_sync import SyncRecord
    from rackplane.io.nats.lease import LeaseRunner
    from rackplane.pair import PairSync

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
        self.lease_runner: LeaseRunner | None = None
        self.pair_sync: PairSync | None = None
        ls = self.leadership_settings()
        self.pair_alarms: PairAlarms | None = None
        if ls is not None:
            from rackplane.pair import PairSync

            self.pair_sync = PairSync(self, ls)
            self.pair_alarms = PairAlarms(ls.sync_max_age_s, ls.renew_late_s,
                                          ls.lease_s + ls.no_active_margin_s,
                                          clock.monotonic())
            self.pair_alarm_engine = AlarmEngine(pair_alarm_defs(ls.instance),
                                                 clock.monotonic())
        self.mqtt = MqttLink(cfg.mqtt, ident, self.daemon, clock=clock,
                             instance=ls.instance if ls is not None else None)
        if ls is not None:
            self.mqtt.alarm_reconcile_keep = is_pair_alarm
            for d in pair_alarm_defs(ls.instance):  # what a predecessor left raised
                self.mqtt.publish_alarm(d.id, None)
        #: ``active`` / ``standby`` for one of a pair (set each tick), None for one instance.
        self.role: str | None = "standby" if ls is not None else None
        self._pair_published_at = -float("inf")
        self.writer = TelemetryWriter(
            cfg.tsdb, effective_spool(cfg.spool, daemon=self.daemon, identity=ident),
            identity_tags=self.tags_base, clock=clock
        )
        if cfg.spool.directory is None:
            self._warn_legacy_spool()
        self.selfmetrics = SelfMetrics(self.daemon, cfg.metrics, clock=clock)
        self.started_mono = clock.monotonic()
        self.first_step_done = asyncio.Event()
        self._tick_wake = asyncio.Event()
        self.tasks: dict[str, asyncio.Task[Any]] = {}
        self._tg: asyncio.TaskGroup | None = None

    def _warn_legacy_spool(self) -> None:
        """Before issue 14 the unset spool folder was ``spool`` itself, shared by every daemon
        started from one folder; lines an earlier version left there are not drained by the
        per-daemon folder now used: say where they are, once at start."""
        legacy = in_state_directory(Path("spool"))
        segments = sorted(legacy.glob("seg-*.lp")) if legacy.is_dir() else []
        if segments:
            self.log.warning(
                "telemetry_spool_legacy_left", folder=str(legacy), segments=len(segments),
                now=str(self.writer.spool_directory),
                fix=f"lines an earlier version spooled there are not sent by this daemon: "
                f"`rackctl replay {legacy}`, then remove the segment files")

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
        if self.pair_sync is not None:  # the standby ignores commands
            self.commands.accept = lambda: self.may_write(self.clock.monotonic())
        self.commands.register("handover", pairs.HandoverArgs, role="operator", handler=(
            pairs.unpaired_handover(self.daemon) if self.pair_sync is None  # not_paired
            else self.pair_sync.handover))
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

    async def quiesce(self) -> None:
        """Stop producing, first thing at a stop (after the tick's last run): the owner tasks
        that read and publish stop here, so nothing is queued once the link drains (default:
        nothing; a daemon whose outputs go through an owner task keeps that one running for
        `stop_outputs`)."""

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

    # -- leadership (redundant pairs) -------------------------------------------------------

    def leadership_settings(self) -> LeadershipSettings | None:
        """The config's ``[leadership]`` when enabled; None for a single instance."""
        ls = getattr(self.cfg, "leadership", None)
        return ls if isinstance(ls, LeadershipSettings) and ls.enabled else None

    def may_write(self, now_mono: float) -> bool:
        """May this instance write actuators at ``now_mono`` (monotonic s)? Always for a
        single instance; for one of a pair only while it holds the leadership lease and its
        renew deadline has not passed (`rackplane.core.leadership.LeaderLease.may_write`).
        Ask right before every actuator write."""
        if self.leadership_settings() is None:
            return True
        return self.lease_runner is not None and self.lease_runner.may_write(now_mono)

    @property
    def is_active(self) -> bool:
        """As of this tick: this instance writes and owns the shared topics (always for a
        single instance)."""
        return self.role != "standby"

    def _update_role(self, now: float) -> None:
        """Each tick, one of a pair: `role` from `may_write`; a change is logged and handed
        to `on_role_change`; ``state/pair_<instance>`` on change and every second."""
        ls = self.leadership_settings()
        if ls is None:
            return
        sync = self.pair_sync
        active = self.may_write(now) and (sync is None or sync.ready(self.controller_epoch))
        role = "active" if active else "standby"
        changed = role != self.role
        if changed:
            self.role = role
            self.log.warning("pair_role", role=role, instance=ls.instance,
                             epoch=self.controller_epoch)
            self.on_role_change(role == "active")
        self._pair_alarms_tick(now)
        if changed or now - self._pair_published_at >= 1.0:
            self._pair_published_at = now
            self.mqtt.publish_state(f"pair_{ls.instance}", self.pair_state())

    def _pair_alarms_tick(self, now: float) -> None:
        """The pair alarms (`rackplane.core.pair_sync.PairAlarms`): each instance publishes
        its own as ``alarm/<kind>:<instance>`` whatever its role (the reconciliation of a new
        active leaves them alone; an instance clears its own at start), with their log line
        and ``alarm`` time-series line; also listed in ``state/pair_<instance>``."""
        r, sync, alarms = self.lease_runner, self.pair_sync, self.pair_alarms
        if sync is None or alarms is None:
            return
        st = r.status() if r is not None else None
        changes = alarms.update(
            now, standby=self.role == "standby", synced_at_s=sync.follower.applied_at_s,
            renew_latency_s=r.renew_latency_s if r is not None else None,
            holder_seen=st is not None and (st.holding or st.holder_seen is not None),
            holder_expired=st is not None and st.takeover_in_s == 0.0)
        for alarm, raised in changes:
            (self.log.warning if raised else self.log.info)(
                "pair_alarm", alarm=alarm, raised=raised, role=self.role,
                synced_age_s=(None if sync.follower.applied_at_s is None
                              else round(now - sync.follower.applied_at_s, 3)),
                renew_latency_s=r.renew_latency_s if r is not None else None)
            self._pair_published_at = -float("inf")
        if changes:
            inst = self._instance()
            events = self.pair_alarm_engine.update(
                now, {f"{k}:{inst}": v for k, v in alarms.active.items()})
            snaps = {a.id: a for a in self.pair_alarm_engine.active()}
            wall = self.clock.wall_ns()  # wall-clock: the payloads' and lines' time
            for ev in events:
                log, payload, line = alarm_event(ev, snaps.get(ev.id), wall)
                self.log_records([log])
                self.mqtt.publish_alarm(ev.id, payload)
                self.write_lines([line])

    def _instance(self) -> str:
        ls = self.leadership_settings()
        return ls.instance if ls is not None else ""

    def sync_record_parts(self, dedup_entries: int) -> tuple[
            list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
        """One of a pair, active: what its sync record carries (`rackplane.pair`): the
        router's applied request-ids (newest ``dedup_entries`` within the command TTL), the
        output leases, and `sync_state`."""
        now = self.clock.monotonic()
        return (self.commands.export_seen(now, dedup_entries), self.leases.table.export(now),
                self.sync_state())

    def apply_sync(self, rec: SyncRecord, now: float) -> None:
        """One of a pair: lay the active's record over this instance (applied request-ids,
        leases, `apply_sync_state`). Called by the sync task with records
        `rackplane.core.pair_sync.SyncFollower` accepted."""
        self.commands.import_seen(list(rec.commands), now)
        self.leases.table.restore(rec.leases, now)
        self.apply_sync_state(rec.state, now)

    def sync_state(self) -> dict[str, Any]:
        """The daemon's own part of the sync record (JSON object); default none."""
        return {}

    def apply_sync_state(self, state: Mapping[str, Any], now: float) -> None:
        """Lay the active's `sync_state` over this (standby) instance; default nothing."""

    def pair_state(self) -> dict[str, Any]:
        """``state/pair_<instance>``: ``instance``, ``role``, ``epoch`` (0 unless active), and
        the lease's ``fence_in_s``, ``holder_seen``, ``takeover_in_s``, ``last_change``,
        ``renew_failures`` (None before the NATS cluster answered), ``renew_latency_s``,
        ``acquisitions``; the sync's ``synced_epoch``, ``synced_seq``, ``synced_age_s``,
        ``sync_puts_ok`` / ``sync_puts_failed`` / ``sync_reads_failed``; ``alarms`` (the
        pair alarms raised now)."""
        ls = self.leadership_settings()
        out: dict[str, Any] = {"instance": ls.instance if ls else None, "role": self.role,
                               "epoch": self.controller_epoch}
        r = self.lease_runner
        if r is not None:
            st = r.status()
            out.update(owner=r.owner, fence_in_s=round(st.fence_in_s, 3),
                       holder_seen=st.holder_seen,
                       takeover_in_s=(None if st.takeover_in_s is None
                                      else round(st.takeover_in_s, 3)),
                       last_change=st.last_change, renew_failures=r.failures,
                       renew_latency_s=(None if r.renew_latency_s is None
                                        else round(r.renew_latency_s, 4)),
                       acquisitions=r.acquisitions)
        sync = self.pair_sync
        if sync is not None:
            f = sync.follower
            out.update(synced_epoch=f.newest_epoch, synced_seq=f.last_seq,
                       synced_age_s=(None if f.applied_at_s is None else
                                     round(self.clock.monotonic() - f.applied_at_s, 3)),
                       sync_puts_ok=sync.puts_ok, sync_puts_failed=sync.puts_failed,
                       sync_reads_failed=sync.reads_failed,
                       alarms=sorted(k for k, v in (self.pair_alarms.active.items()
                                                    if self.pair_alarms else ()) if v))
        return out

    def on_role_change(self, active: bool) -> None:
        """Became active: reconcile the retained alarms (clear what the old active left and
        this one does not hold). Became standby: forget the shared state and alarms held for
        re-publication (the active owns them). Daemons extend it (e.g. a claim at the CDU)."""
        ls = self.leadership_settings()
        if active:
            self.mqtt.request_alarm_reconcile()
            if hasattr(self, "leases"):
                self.leases.republish()  # its leases came by sync
        else:
            self.mqtt.forget_held(keep_state=(f"pair_{ls.instance}",) if ls else ())
            if self.pair_sync is not None:  # its own pair alarms stay its own
                wall = self.clock.wall_ns()  # wall-clock: the payloads' time
                for a in self.pair_alarm_engine.active():
                    self.mqtt.publish_alarm(a.id, alarm_payload(a, wall))

    @property
    def controller_epoch(self) -> int:
        """The epoch of this instance's tenure (0: single instance, or not holding)."""
        return self.lease_runner.epoch if self.lease_runner is not None else 0

    async def _run_leadership(self, ls: LeadershipSettings) -> None:
        """The ``leadership`` task: connect (retrying every ``renew_every_s``; writes stay
        refused meanwhile), then run the lease until cancelled."""
        from rackplane.io.nats.errors import KvUnknown
        from rackplane.io.nats.kv import NatsKv
        from rackplane.io.nats.lease import LeaseRunner, lease_key

        ident = self.cfg.identity
        key = lease_key(ident.site, ident.rack, self.daemon)
        failing = False
        while True:
            try:
                kv = await NatsKv.connect(
                    ls.servers, ls.bucket, replicas=ls.replicas,
                    request_timeout_s=ls.request_timeout_s, name=f"{self.daemon}-{ls.instance}",
                    user=ls.username, password=ls.password())
                break
            except KvUnknown as err:
                if not failing:
                    self.log.warning("leadership_connect_failed", servers=ls.servers,
                                     error=str(err))
                failing = True
                await asyncio.sleep(ls.renew_every_s)
        self.log.info("leadership_connected", key=key, bucket=ls.bucket,
                      instance=ls.instance)
        # a new runner (a new owner nonce) per start: a restarted task never trusts a tenure
        # of its predecessor; the old runner's may_write fences by its own deadline
        self.lease_runner = LeaseRunner(kv, key, ls.instance, ls.timing(), clock=self.clock)
        if self.pair_sync is not None:
            self.pair_sync.attach(kv, self.lease_runner)
        try:
            await self.lease_runner.run()
        finally:
            await kv.close()

    def modbus_devices(self) -> Sequence[Any]:
        """The daemon's Modbus owners (`rackplane.io.modbus.ModbusDevice`), for self-metrics."""
        return ()

    def input_invalid_samples(self) -> int:
        """Unusable MQTT inputs counted since start (self-metric ``input_invalid_samples``);
        0 for a daemon without such inputs."""
        return 0

    def pv_age_s(self, now: float) -> float | None:
        """Age of the process value the daemon controls on, s (None: none read yet), for
        self-metrics."""
        return None

    def wake_tick(self) -> None:
        """Run the next tick now (an input that cannot wait a period, e.g. racky's fleet budget
        decrease): the same `tick` at the real time (dt: the real time elapsed), the schedule
        going on a period after it (`rackplane.io.service.run_ticker` ``wake``)."""
        self._tick_wake.set()

    def run_tick(self, now: float) -> None:
        """One tick as the ticker runs it: the daemon's `tick`, its self-metrics, the
        watchdog, and READY after the first one (one of a pair: its role first)."""
        self._update_role(now)
        self.tick(now)
        if self.pair_sync is not None and self.role == "active":
            self.pair_sync.tick(now)
        self.selfmetrics.tick(now, tick_stats=self.tick_stats, writer=self.writer,
                              mqtt=self.mqtt, commands=self.commands,
                              devices=self.modbus_devices(), pv_age_s=self.pv_age_s(now),
                              input_invalid=self.input_invalid_samples(),
                              leadership=self.lease_runner)
        self.notifier.tick()
        self.writer.tick_ended()
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
            if (ls := self.leadership_settings()) is not None:
                for dev in self.modbus_devices():
                    dev.write_gate = lambda: self.may_write(self.clock.monotonic())
                self.start_task("leadership", lambda: self._run_leadership(ls))
                if self.pair_sync is not None:
                    self.start_task("pair_sync", self.pair_sync.run)
            mqtt_task = tg.create_task(supervised("mqtt", self.mqtt.run, self.log)(),
                                       name="mqtt")
            writer_task = tg.create_task(supervised("tsdb", self.writer.run, self.log)(),
                                         name="tsdb")
            ticker = tg.create_task(
                run_ticker(self.cfg.control.tick_s, self.run_tick, self.clock,
                           self.tick_stats, wake=self._tick_wake),
                name=self.tick_task_name,
            )
            await stop.wait()
            self.notifier.stopping(self.stopping_status)
            self.log.info("stopping")
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
            await self._bounded("quiesce", self.quiesce())
            await self._bounded("stop_outputs", self.stop_outputs())
            await self._bounded("save_state", self.save_state_at_stop())
            if self.lease_runner is not None:  # after the stop writes: hand over
                await self._bounded("release_lease", self.lease_runner.release(
                    self.cfg.control.stop_budget_s))
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
