"""tray-agent the daemon: the node agent of one or more compute trays on the daemon frame
(`rackplane.daemon.DaemonFrame`: MQTT link, commands with audit, self-metrics, TaskGroup,
ordered stop, SIGHUP reload, sd_notify).

Tasks: ``read`` (every ``control.tick_s``: reads every hosted GPU through NVML in a worker
thread, bounded by ``control.read_timeout_s``, holds each GPU at its target limit and
publishes one ``telemetry/trayNN`` per tray whose reading is complete), ``mqtt``, ``tsdb`` and
the frame's ``tick`` (cap expiry, self-metrics, watchdog). Commands: ``set_power_limits``
(node-agent contract v1; `trayagent.core.caps` has the rules) on
``<root>/<site>/<rack>/<agents.daemon>/cmd/<user>/set_power_limits``.

What is reported is what is **enforced**: the limit each GPU reports back, never the value
asked for. A command's reply comes after the read-back confirmed every GPU's target or after
``caps.confirm_timeout_s`` (the reply's state says which).

A tray with ``actuation = "redfish"`` is capped at its BMC instead (`BmcSource.hold_power_limit`:
the chassis power Control, one tray limit from `CapBook.tray_wanted`): its GPUs' NVML limits are
never set; the Control is held in the BMC's own task after each read (a slow BMC delays only
its own cap), and by a command's confirmation; the ``SetPoint`` read back is the tray's
``enforced_tray_cap_w`` while it is fresh (``bmc.max_age_s``).
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Unpack

from rackplane.commands import CommandRouter, LeaseGate
from rackplane.config import secret_from_env
from rackplane.core.envelope import CommandContext
from rackplane.core.tray_contract import SCHEMA_VERSION
from rackplane.daemon import DaemonFrame, FrameOptions, OwnerTask
from rackplane.errors import CommandError, ConfigError
from rackplane.io.mqtt import MqttLink
from rackplane.io.statefile import StateFile, StateFileError
from rackplane.paths import in_state_directory
from trayagent.config import TrayAgentConfig, load_tray_agent_config
from trayagent.contract import SetPowerLimitsArgs
from trayagent.core.bmc import BmcReading, ControlResult
from trayagent.core.caps import CapBook, DeviceLimits, StaleEpoch, Target, limit_action
from trayagent.core.counters import Rate
from trayagent.core.payload import (
    XIDS_PER_MESSAGE,
    GpuReading,
    NotPublishable,
    TrayInfo,
    XidCount,
    tray_payload,
)
from trayagent.core.ports import PortReading, port_block
from trayagent.nvml import NvmlError, NvmlSource
from trayagent.redfish import BmcSource
from trayagent.selection import make_source
from trayagent.sources import BmcReader, GpuSource, LinkReader, SourceError
from trayagent.sysfs import LinkRates, SysfsLinks

__all__ = ["TrayAgent", "load_tray_agent_config"]

EPOCH_FORMAT = "tray-agent-epochs"


@dataclass(slots=True)
class _Gpu:
    tray: int
    gpu: int
    device: int
    reading: GpuReading | None = None
    read_wall_ns: int = 0
    set_failed: str | None = None
    would_set_w: float | None = None
    set_w: float | None = None
    set_mono: float = -math.inf
    safe_clamped: str | None = None  # why the safe cap was last moved into its limits


class TrayAgent(DaemonFrame[TrayAgentConfig]):
    """The tray agent (module docstring). ``source``: the GPU reader (default: NVML);
    ``bmcs``: tray -> its BMC reader, in place of the configured Redfish BMCs (a simulated
    tray's, `harness.simagent`), its readings used while younger than ``bmc_max_age_s``;
    ``links``: the link-counter reader in place of sysfs."""

    daemon = "tray-agent"

    def __init__(self, cfg: TrayAgentConfig, *, source: GpuSource | None = None,
                 bmcs: Mapping[int, BmcReader] | None = None, bmc_max_age_s: float = 5.0,
                 links: LinkReader | None = None,
                 **options: Unpack[FrameOptions]) -> None:
        super().__init__(cfg, **options)
        # topics are the agents' level (racky's node_agents.daemon), not the daemon's name
        self.mqtt = MqttLink(cfg.mqtt, cfg.identity, cfg.agents.daemon, clock=self.clock)
        self.source = source if source is not None else make_source(cfg)
        a = cfg.agents
        self.gpus: dict[int, list[_Gpu]] = {
            t.tray: [_Gpu(t.tray, t.tray * a.gpus_per_tray + i, d)
                     for i, d in enumerate(t.nvml_devices)] for t in a.trays}
        ident = cfg.identity
        self.infos = {t.tray: TrayInfo(ident.site, ident.row, ident.rack, t.tray,
                                       t.non_gpu_power_w, t.coolant_out_temp_c)
                      for t in a.trays}
        self.epoch_file = StateFile(in_state_directory(cfg.caps.epoch_file), EPOCH_FORMAT, 1,
                                    log=self.log)
        self.book = CapBook({t: len(g) for t, g in self.gpus.items()},
                            cfg.caps.safe_gpu_cap_w, self._load_epochs())
        self._last_ts: dict[int, int] = {}
        self._not_published: dict[int, str | None] = {}
        self._unknown_bits: dict[int, int] = {}
        self._source_open = False
        sc = cfg.sysfs
        self.gpu_ports = {t.tray * a.gpus_per_tray + i: ports for t in a.trays
                          for i, ports in enumerate(t.gpu_ports)}
        self.links: LinkReader = links if links is not None else SysfsLinks(
            sc.root, ib_extended_counters=sc.ib_extended_counters)
        self.link_rates = LinkRates(sc.max_rate_per_s)
        self._ports: dict[str, tuple[PortReading, dict[str, Rate]]] = {}
        self._ports_not_published: dict[int, str] = {}
        self.bmcs: dict[int, BmcReader] = {}
        self.bmc_max_age_s: dict[int, float] = {}
        for k, reader in (bmcs or {}).items():
            self.bmcs[k] = reader
            self.bmc_max_age_s[k] = bmc_max_age_s
        for t in a.trays:
            if t.bmc is not None:
                b = t.bmc
                self.bmcs[t.tray] = BmcSource(b.url, b.chassis, b.username,
                                              secret_from_env(b.password_env) or "",
                                              b.timeout_s, power_control=b.power_control)
                self.bmc_max_age_s[t.tray] = b.max_age_s
        self.bmc_readings: dict[int, BmcReading] = {}
        self._bmc_state: dict[int, str] = {}
        self.bmc_capped = {t.tray: t for t in a.trays if t.actuation == "redfish"}
        # each tray's power outside its GPUs, W: the configured estimate until a fresh BMC
        # reading measures it (input power − the GPUs' sum, smoothed: `_learn_non_gpu`)
        self.non_gpu_w = {t.tray: t.non_gpu_power_w for t in a.trays}
        self._non_gpu_smooth: dict[int, float] = {}
        self.controls: dict[int, ControlResult] = {}
        self._control_state: dict[int, str | None] = {}
        self.published_total = 0
        self._cycle_running: asyncio.Future[None] | None = None  # the read cycle's thread
        self.read_cpu_s = 0.0  # CPU time of the read cycles (worker threads), s
        self.limit_corrections = 0  # limits set again: not held, or superseded in flight
        self.read_timeouts_total = 0
        self.xid_total = 0
        # rack GPU -> its Xid events (total, numbers since the last message); GPUs whose
        # device offers Xid events only (`_xid_loop`): the others publish null
        self.xids: dict[int, XidCount] = {}
        self._cycled = asyncio.Event()
        self.attach_commands(lease_outputs={}, register=self._register)

    # --- persistence -------------------------------------------------------------------------

    def _load_epochs(self) -> dict[int, int]:
        try:
            data = self.epoch_file.load() or {}
        except StateFileError as err:
            # an unreadable epoch file must not let an old command through: refuse to start
            raise ConfigError(f"caps.epoch_file: {self.epoch_file.path}: {err} (move it "
                              "aside only if no older controller can still send)") from None
        raw = data.get("epochs", {})
        return {int(k): int(v) for k, v in raw.items() if int(k) in self.gpus}

    def _save_epochs(self) -> None:
        epochs = {str(t): c.epoch for t, c in self.book.trays.items() if c.epoch is not None}
        self.epoch_file.save({"epochs": epochs}, self.clock.wall_ns())

    # --- commands ---------------------------------------------------------------------------

    def _register(self, router: CommandRouter, _leases: LeaseGate) -> None:
        router.register("set_power_limits", SetPowerLimitsArgs, self._set_power_limits,
                        role="automation")

    def _set_power_limits(self, args: SetPowerLimitsArgs, ctx: CommandContext) -> Any:
        """Validate (all trays or none), apply to the cap book, then (off the loop) enforce and
        wait for the read-back. Raises `CommandError` (``unknown_tray``, ``stale_epoch``,
        ``not_supported``, ``out_of_range``) before anything changes."""
        given = args.model_fields_set
        unknown = sorted(set(args.trays) - set(self.gpus))
        if unknown:
            raise CommandError("unknown_tray", f"trays {unknown} are not hosted by this agent "
                               f"(hosted: {sorted(self.gpus)})")
        if "powered" in given and args.powered is False:
            raise CommandError("not_supported", "powered: this agent cannot switch tray power")
        if "power_floor_pct" in given and args.power_floor_pct > 0:
            raise CommandError("not_supported", "power_floor_pct: this agent applies no floor")
        for f in ("ramp_up_w_per_s", "ramp_down_w_per_s"):
            if f in given:
                raise CommandError("not_supported", f"{f}: this agent applies no ramp limit")
        if "ramp_down_hysteresis_s" in given and args.ramp_down_hysteresis_s > 0:
            raise CommandError("not_supported", "ramp_down_hysteresis_s: no ramp limits here")
        if not self.source.cap_enforceable and given & {"power_cap_w", "gpu_power_cap_w"} \
                and set(args.trays) - set(self.bmc_capped):
            raise CommandError("not_supported", "this agent reads the GPUs through the DCGM "
                               "exporter: no cap can be applied (cap_enforceable = false)")
        self._check_cap_range(args)
        try:
            grew = self.book.apply(
                args.trays, args.epoch,
                power_cap_w=args.power_cap_w if "power_cap_w" in given else None,
                gpu_power_cap_w=args.gpu_power_cap_w if "gpu_power_cap_w" in given else None,
                release=args.release, ttl_s=args.ttl_s if "ttl_s" in given else None,
                now=ctx.now_mono)
        except StaleEpoch as err:
            self.log.warning("command_stale_epoch", trays=args.trays, epoch=args.epoch,
                             user=ctx.user, stale_refused=self.book.stale_refused)
            raise CommandError("stale_epoch", str(err)) from None
        self.log.info("caps_set", trays=args.trays, epoch=args.epoch, user=ctx.user,
                      power_cap_w=self.book.trays[args.trays[0]].power_cap_w,
                      gpu_power_cap_w=self.book.trays[args.trays[0]].gpu_power_cap_w)
        return self._confirm(list(args.trays), grew, args.epoch)

    def _check_cap_range(self, args: SetPowerLimitsArgs) -> None:
        given = args.model_fields_set
        for t in args.trays:
            if t in self.bmc_capped:
                continue  # the BMC's control clamps (and says so): no per-GPU minimum
            n = len(self.gpus[t])
            for g in self.gpus[t]:
                lo = None if g.reading is None else g.reading.limits.min_w
                if lo is None:
                    continue
                for f, per_gpu in (("power_cap_w", 1.0 / n), ("gpu_power_cap_w", 1.0)):
                    if f in given and getattr(args, f) * per_gpu < lo:
                        raise CommandError(
                            "out_of_range", f"args.{f} = {getattr(args, f):g} W gives "
                            f"{getattr(args, f) * per_gpu:g} W per GPU, below gpu {g.gpu}'s "
                            f"minimum power limit {lo:g} W (tray {t})")

    async def _confirm(self, trays: list[int], persist: bool, epoch: int) -> dict[str, Any]:
        """Persist a grown epoch (a failure is logged and said in the reply: the command is
        applied, the epoch holds until a restart), then enforce and wait for the read-back."""
        saved: bool | None = None
        if persist:
            try:
                await asyncio.to_thread(self._save_epochs)
                saved = True
            except (OSError, StateFileError) as err:
                saved = False
                self.log.error("epoch_file_save_failed", path=str(self.epoch_file.path),
                               error=str(err), note="the epoch holds until a restart; a "
                               "restarted agent would accept older commands")
        deadline = self.clock.monotonic() + self.cfg.caps.confirm_timeout_s
        at_gpus = [t for t in trays if t not in self.bmc_capped]
        # a BMC-capped tray: one hold (it reads back itself), waited for until the deadline;
        # one still under way (a slow BMC) goes on in its thread and its result is published
        holds = [asyncio.ensure_future(asyncio.to_thread(self._hold_control, t,
                                                         self.clock.monotonic()))
                 for t in trays if t in self.bmc_capped]
        targets: dict[tuple[int, int], Target] = {}
        while at_gpus:
            targets = self._targets(at_gpus)
            done = not targets or await asyncio.to_thread(self._enforce, targets, True)
            # a GPU never read has no target: nothing is confirmed for it
            done = done and len(targets) == sum(len(self.gpus[t]) for t in at_gpus)
            if done or self.clock.monotonic() >= deadline:
                break
            await asyncio.sleep(0.05)
        else:
            done = True
        if holds:
            finished, _ = await asyncio.wait(
                holds, timeout=max(0.0, deadline - self.clock.monotonic()))
            done = done and len(finished) == len(holds) and all(
                h.result().confirmed for h in holds)
        return {**self._state(trays, targets, confirmed=done, epoch=epoch),
                "epoch_persisted": saved}

    def _state(self, trays: Sequence[int], targets: Mapping[tuple[int, int], Target],
               *, confirmed: bool, epoch: int) -> dict[str, Any]:
        """The reply state (`rackplane.core.tray_reply.SetPowerLimitsReply`, contract 1.3):
        per GPU the limit read back (W), per tray the enforced figure as in telemetry."""
        now = self.clock.monotonic()
        out: list[dict[str, Any]] = []
        for t in sorted(set(trays)):
            c = self.book.trays[t]
            gpus = []
            read: list[float | None] = []
            for i, g in enumerate(self.gpus[t]):
                tg = targets.get((t, i))
                read.append(None if g.reading is None else g.reading.limit_w)
                gpus.append({"gpu": g.gpu, "target_w": None if tg is None else tg.watts,
                             "source": None if tg is None else tg.source,
                             "clamped": None if tg is None else tg.clamped,
                             "enforced_w": read[-1]})
            ctl = self.controls.get(t)
            tray_w: float | None = None if None in read else sum(w or 0.0 for w in read)
            if t in self.bmc_capped:
                tray_w = None if ctl is None else ctl.enforced_w
            out.append({"tray": t, "epoch": c.epoch, "powered": None,
                        "power_cap_w": c.power_cap_w, "gpu_power_cap_w": c.gpu_power_cap_w,
                        "cap_expires_in_s": self.book.expires_in_s(t, now),
                        "enforced_tray_cap_w": tray_w, "gpus": gpus})
            if t in self.bmc_capped:
                out[-1]["bmc_control"] = None if ctl is None else {
                    "wanted_w": ctl.wanted_w, "target_w": ctl.target_w,
                    "clamped": ctl.clamped, "enforced_w": ctl.enforced_w,
                    "confirmed": ctl.confirmed, "patches": ctl.attempts, "error": ctl.error}
        return {"schema_version": SCHEMA_VERSION, "epoch": epoch, "confirmed": confirmed,
                "dry_run": self.cfg.caps.dry_run, "trays": out}

    # --- enforcement (worker thread) ---------------------------------------------------------

    def _targets(self, trays: Sequence[int]) -> dict[tuple[int, int], Target]:
        out = {}
        for t in trays:
            if t in self.bmc_capped:
                continue  # capped at the BMC: the GPUs' limits are never set
            gs = self.gpus[t]
            lims = [DeviceLimits(None, None, None) if g.reading is None else g.reading.limits
                    for g in gs]
            for i, tg in enumerate(self.book.targets(t, lims, self.non_gpu_w[t])):
                if gs[i].reading is not None:  # read once: its limits are known
                    out[(t, i)] = tg
                    self._say_safe_clamp(gs[i], tg)
        return out

    def _say_safe_clamp(self, g: _Gpu, tg: Target) -> None:
        """Log (once per change) a safe cap moved into a GPU's device limits: the device's
        maximum is below caps.safe_gpu_cap_w (or its minimum above)."""
        why = tg.clamped if tg.source == "safe" and tg.watts is not None else None
        if why is not None and why != g.safe_clamped:
            self.log.warning("safe_gpu_cap_clamped", gpu=g.gpu, device=g.device, reason=why,
                             safe_gpu_cap_w=tg.wanted_w, held_w=tg.watts)
        g.safe_clamped = why

    def _enforce(self, targets: Mapping[tuple[int, int], Target], reread: bool) -> bool:
        """Set every GPU whose read-back differs from its target, or whose other limit set
        just before may still land (`trayagent.core.caps.limit_action`; dry run: log it
        once) and, with ``reread``, read the GPUs back first; True when every target is
        confirmed. A set not caused by a new target is a correction (``limit_corrections``)."""
        if not self.source.cap_enforceable:
            return False
        tol, ok = self.cfg.caps.tolerance_w, True
        for (t, i), tg in targets.items():
            g = self.gpus[t][i]
            if tg.watts is None:
                ok = False
                continue
            if reread:
                self._read_one(g)
            cur = None if g.reading is None else g.reading.limit_w
            now = self.clock.monotonic()
            act = limit_action(cur, tg.watts, g.set_w, now - g.set_mono, tol,
                               self.cfg.caps.confirm_timeout_s)
            if act == "held":
                continue
            ok = False
            if self.cfg.caps.dry_run:
                if g.would_set_w != tg.watts:
                    g.would_set_w = tg.watts
                    self.log.info("power_limit_dry_run", gpu=g.gpu, device=g.device,
                                  would_set_w=tg.watts, enforced_w=cur, source=tg.source,
                                  clamped=tg.clamped)
                continue
            if act == "wait":
                continue  # set, not read back yet: a GPU applies a limit after a delay
            if g.set_w is not None and (abs(g.set_w - tg.watts) <= tol or (
                    cur is not None and abs(cur - tg.watts) <= tol)):
                self.limit_corrections += 1  # drifted from what was set, or a set in flight
                self.log.info("power_limit_corrected", gpu=g.gpu, target_w=tg.watts,
                              enforced_w=cur, last_set_w=g.set_w, total=self.limit_corrections)
            try:
                g.set_w, g.set_mono = tg.watts, now
                self.source.set_limit(g.device, tg.watts)
                if g.set_failed is not None:
                    self.log.info("power_limit_set_recovered", gpu=g.gpu, device=g.device)
                g.set_failed = None
            except SourceError as err:
                if g.set_failed != str(err):
                    self.log.error("power_limit_set_failed", gpu=g.gpu, device=g.device,
                                   target_w=tg.watts, error=str(err))
                g.set_failed = str(err)
        return ok

    def _read_one(self, g: _Gpu) -> None:
        g.reading = self.source.read(g.device, g.gpu)
        g.read_wall_ns = self.clock.wall_ns()

    def _cycle(self, targets: Mapping[tuple[int, int], Target],
               version: int | None = None) -> None:
        """One read cycle (worker thread): open NVML if needed, read every GPU, hold the
        targets (its CPU time is added to ``read_cpu_s``)."""
        c0 = time.thread_time()
        try:
            self._cycle_body(targets, version)
        finally:
            self.read_cpu_s += time.thread_time() - c0

    def _cycle_body(self, targets: Mapping[tuple[int, int], Target],
                    version: int | None) -> None:
        if not self._source_open:
            self.source.open()
            self._source_open = True
        self.source.refresh()
        for gs in self.gpus.values():
            for g in gs:
                self._read_one(g)
        for ports in self.gpu_ports.values():
            for name in ports:
                r = self.links.read(name, self.clock.monotonic())
                self._ports[name] = (r, self.link_rates.update(r))
        if version is None or version == self.book.version:  # a command since: its targets
            self._enforce(targets, False)

    # --- the read / publish loop -------------------------------------------------------------

    def owner_tasks(self) -> Sequence[OwnerTask]:
        xid = (OwnerTask("xid", self._xid_loop),) if isinstance(self.source, NvmlSource) else ()
        return (OwnerTask("read", self._read_loop), *xid,
                *(OwnerTask(f"bmc:tray{t:02d}", self._bmc_loop_of(t)) for t in self.bmcs))

    async def _xid_loop(self) -> None:
        """Log every Xid NVML reports for a hosted GPU (``gpu_xid``, a warning) and count it
        for the GPU's next message (contract 1.2 ``xid_total`` / ``xids``); devices that offer
        none are logged once (and publish null). Waits in a worker
        thread, 0.5 s at a time; a failed wait is logged once and retried after a tick."""
        assert isinstance(self.source, NvmlSource)
        await self._cycled.wait()  # NVML is open
        where = {g.device: g for gs in self.gpus.values() for g in gs}
        watch = await asyncio.to_thread(self.source.xid_watch, sorted(where))
        for dev, why in sorted(watch.unsupported.items()):
            self.log.info("xid_events_not_offered", device=dev, gpu=where[dev].gpu, why=why)
        for dev, hosted in where.items():
            if dev not in watch.unsupported:
                self.xids.setdefault(hosted.gpu, XidCount(0, []))
        failed: str | None = None
        try:
            while True:
                try:
                    events = await asyncio.to_thread(watch.wait, 500)
                    failed = None
                except NvmlError as err:
                    if failed != str(err):
                        self.log.error("xid_wait_failed", error=str(err))
                    failed = str(err)
                    await asyncio.sleep(self.cfg.control.tick_s)
                    continue
                for e in events:
                    g = where.get(e.device)
                    self.xid_total += 1
                    if g is not None:
                        c = self.xids.get(g.gpu, XidCount(0, []))
                        self.xids[g.gpu] = XidCount(
                            (c.total + 1) % 2**64, [*c.recent, e.xid][-XIDS_PER_MESSAGE:])
                    self.log.warning("gpu_xid", device=e.device, xid=e.xid,
                                     gpu=None if g is None else g.gpu,
                                     tray=None if g is None else g.tray)
        finally:
            await asyncio.to_thread(watch.close)

    def _bmc_loop_of(self, tray: int) -> Any:
        async def run() -> None:
            await self._bmc_loop(tray)
        return run

    async def _bmc_loop(self, tray: int) -> None:
        """Read tray ``tray``'s BMC every ``control.tick_s`` in a worker thread (its own task:
        a slow BMC delays only its own readings; each request is bounded by
        ``bmc.timeout_s``); what it could not read is logged once per change."""
        src = self.bmcs[tray]
        period = self.cfg.control.tick_s
        try:
            while True:
                t0 = self.clock.monotonic()
                r = await asyncio.to_thread(src.read, t0)
                self.bmc_readings[tray] = r
                if tray in self.bmc_capped:
                    await asyncio.to_thread(self._hold_control, tray, self.clock.monotonic())
                state = "; ".join(f"{k}: {v}" for k, v in sorted(r.errors.items()))
                if state != self._bmc_state.get(tray, ""):
                    if state:
                        self.log.warning("bmc_figures_unknown", tray=tray, errors=r.errors)
                    else:
                        self.log.info("bmc_figures_known", tray=tray)
                    self._bmc_state[tray] = state
                await asyncio.sleep(max(0.0, t0 + period - self.clock.monotonic()))
        finally:
            await asyncio.to_thread(src.close)

    def _hold_control(self, tray: int, now: float) -> ControlResult:
        """Hold a BMC-capped tray's power Control at its wanted limit (worker thread);
        what went wrong is logged once per change."""
        wanted, src = self.book.tray_wanted(tray, self.bmc_capped[tray].non_gpu_power_w)
        b = self.bmc_capped[tray].bmc
        assert b is not None  # config: actuation = 'redfish' needs bmc
        bmc = self.bmcs[tray]
        assert isinstance(bmc, BmcSource)  # a configured Redfish BMC: the only one capped
        r = bmc.hold_power_limit(
            wanted, tolerance_w=self.cfg.caps.tolerance_w, attempts=b.set_attempts, mono=now,
            dry_run=self.cfg.caps.dry_run)
        self.controls[tray] = r
        state = r.error if r.error is not None else f"ok {r.target_w} {r.clamped}"
        if state != self._control_state.get(tray):
            self._control_state[tray] = state
            if r.confirmed:
                self.log.info("bmc_power_limit_enforced", tray=tray, wanted_w=wanted,
                              source=src, enforced_w=r.enforced_w, clamped=r.clamped,
                              patches=r.attempts)
            else:
                self.log.warning("bmc_power_limit_not_confirmed", tray=tray, wanted_w=wanted,
                                 source=src, target_w=r.target_w, enforced_w=r.enforced_w,
                                 error=r.error)
        return r

    def _fresh_bmc(self, tray: int, now: float) -> BmcReading | None:
        r = self.bmc_readings.get(tray)
        if r is None or now - r.mono > self.bmc_max_age_s.get(tray, 0.0):
            return None
        return r

    async def _read_loop(self) -> None:
        """Every ``control.tick_s``: one read cycle in a worker thread, waited for at most
        ``control.read_timeout_s``. A cycle that overruns is left to finish in its thread
        (a thread cannot be cancelled) and no new one starts until it has: never a pile of
        threads on a hung driver; nothing is published from it (its readings are late).
        Timeouts and source errors are logged once per episode."""
        period = self.cfg.control.tick_s
        nxt = self.clock.monotonic()
        open_error: str | None = None
        running: asyncio.Future[None] | None = None
        late = False
        while True:
            if running is None or running.done():
                if running is not None and running.done() and not running.cancelled():
                    running.exception()  # a late cycle's error was logged when it timed out
                targets, v = self._targets(list(self.gpus)), self.book.version
                running = asyncio.ensure_future(asyncio.to_thread(self._cycle, targets, v))
                self._cycle_running = running
                done, _ = await asyncio.wait({running}, timeout=self.cfg.control.read_timeout_s)
                if done:
                    fut, running = running, None
                    try:
                        fut.result()
                        self._cycled.set()
                        if open_error is not None or late:
                            self.log.info("gpu_source_answers", note="the GPU source answers "
                                          "again within control.read_timeout_s")
                        open_error, late = None, False
                        self._publish()
                    except SourceError as err:
                        if open_error != str(err):
                            self.log.error("gpu_source_unavailable", error=str(err))
                        open_error = str(err)
                else:
                    self.read_timeouts_total += 1
                    if not late:
                        self.log.warning("gpu_read_timeout",
                                         timeout_s=self.cfg.control.read_timeout_s,
                                         note="nothing published until a cycle completes in "
                                         "time; no new read starts while this one hangs")
                    late = True
            else:
                self.read_timeouts_total += 1  # the hung cycle still runs: skip this slot
            nxt += period
            now = self.clock.monotonic()
            if nxt < now:  # fell behind: keep the phase, skip the missed slots
                nxt += math.ceil((now - nxt) / period) * period
            await asyncio.sleep(nxt - now)

    def _publish(self) -> None:
        now = self.clock.monotonic()
        for t, gs in self.gpus.items():
            readings = [g.reading for g in gs if g.reading is not None]
            ts = max((g.read_wall_ns for g in gs), default=0)
            for g in gs:
                if g.reading is not None and g.reading.unknown_reason_bits != \
                        self._unknown_bits.get(g.gpu, 0):
                    self._unknown_bits[g.gpu] = g.reading.unknown_reason_bits
                    self.log.warning("clock_event_bits_unknown", gpu=g.gpu,
                                     bits=hex(g.reading.unknown_reason_bits))
            try:
                if len(readings) != len(gs):
                    raise NotPublishable("a GPU was not read")
                if ts <= self._last_ts.get(t, -1):
                    raise NotPublishable("no new reading since the last message")
                lims = [g.limits for g in readings]
                self._learn_non_gpu(t, readings, now)
                ctl = self.controls.get(t)
                if ctl is not None and now - ctl.mono > self.bmc_max_age_s.get(t, 0.0):
                    ctl = None
                if t in self.bmc_capped:
                    clamped = ctl is not None and ctl.clamped is not None
                else:
                    clamped = any(tg.clamped is not None and tg.watts is not None
                                  for tg in self.book.targets(t, lims, self.non_gpu_w[t]))
                payload = tray_payload(self.infos[t], readings, self.book.trays[t], ts_ns=ts,
                                       ports=self._port_blocks(gs),
                                       bmc=self._fresh_bmc(t, now),
                                       cap_expires_in_s=self.book.expires_in_s(t, now),
                                       cap_enforceable=(self.source.cap_enforceable
                                                        or t in self.bmc_capped)
                                       and not self.cfg.caps.dry_run,
                                       cap_clamped=clamped,
                                       tray_limit_w=None if ctl is None else ctl.enforced_w,
                                       xids=self.xids,
                                       safe_gpu_cap_w=self.cfg.caps.safe_gpu_cap_w
                                       if t in self.bmc_capped else self.book.safe_gpu_w(lims))
            except NotPublishable as err:
                if self._not_published.get(t) != str(err):
                    self.log.warning("tray_not_published", tray=t, reason=str(err))
                self._not_published[t] = str(err)
                continue
            if self._not_published.get(t) is not None:
                self.log.info("tray_published_again", tray=t)
            self._not_published[t] = None
            self._last_ts[t] = ts
            for g in gs:  # the Xid numbers listed are sent once
                c = self.xids.get(g.gpu)
                if c is not None and c.recent:
                    self.xids[g.gpu] = XidCount(c.total, [])
            self.mqtt.publish_telemetry(f"tray{t:02d}", payload)
            self.published_total += 1

    NON_GPU_SMOOTHING = 0.3
    """Weight of a new measurement in the non-GPU power estimate (an EWMA per publish
    interval: readings of BMC and GPUs a fraction of a second apart do not jitter the caps)."""
    NON_GPU_DEADBAND_W = 25.0
    """The estimate in use moves only when the smoothed figure is this far from it, W (a tray
    cap's share moves by a quarter of it per GPU: the GPUs' limits are not re-set every
    interval for noise)."""

    def _learn_non_gpu(self, tray: int, readings: Sequence[GpuReading], now: float) -> None:
        """Update the tray's non-GPU power from a fresh BMC input power minus the GPUs' sum,
        W. A measurement outside [0, 20000] W (the configured estimate's window: a BMC and
        GPUs read at different moments, a BMC reporting another figure) is not used."""
        r = self._fresh_bmc(tray, now)
        if r is None or r.power_w is None:
            return
        gsum = sum(g.power_w for g in readings if g.power_w is not None)
        measured = r.power_w - gsum
        if not (math.isfinite(measured) and 0.0 <= measured <= 20000.0):
            return
        a = self.NON_GPU_SMOOTHING
        prev = self._non_gpu_smooth.get(tray, measured)
        smooth = self._non_gpu_smooth[tray] = (1.0 - a) * prev + a * measured
        if abs(smooth - self.non_gpu_w[tray]) > self.NON_GPU_DEADBAND_W:
            self.non_gpu_w[tray] = smooth

    def _port_blocks(self, gs: Sequence[_Gpu]) -> dict[int, dict[str, Any] | None]:
        """Rack GPU -> its port block (None: not publishable now, logged once per change of
        reason) for the GPUs that name ports."""
        out: dict[int, dict[str, Any] | None] = {}
        for g in gs:
            names = self.gpu_ports.get(g.gpu)
            if not names:
                continue
            got = [self._ports.get(n) for n in names]
            if any(x is None for x in got):
                block, why = None, "not read yet"
            else:
                block, why = port_block(g.gpu, [x[0] for x in got if x is not None],
                                        [x[1] for x in got if x is not None],
                                        self.cfg.sysfs.publish_counters or None)
            if why != self._ports_not_published.get(g.gpu, ""):
                if why:
                    self.log.warning("gpu_ports_not_published", gpu=g.gpu, reason=why,
                                     note="ports: null until the ports vouch for every column")
                else:
                    self.log.info("gpu_ports_published", gpu=g.gpu)
                self._ports_not_published[g.gpu] = why
            out[g.gpu] = block
        return out

    # --- the frame's tick ---------------------------------------------------------------------

    def tick(self, now: float) -> None:
        for t in self.book.expire(now):
            self.log.warning("caps_expired_safe_cap", tray=t,
                             safe_gpu_cap_w=self.cfg.caps.safe_gpu_cap_w,
                             note="racky silent longer than the caps' ttl_s: GPUs held at "
                             "the safe cap")

    async def quiesce(self) -> None:
        """The read, Xid and BMC loops stop before the link drains: a read cycle that ends
        during the stop publishes nothing the link would no longer send (a message counted
        as published is one the broker got). Each is waited for at most
        ``control.read_timeout_s`` (one still running then stays in ``tasks``: the frame
        cancels it again at the end), then a read cycle still running in its worker thread
        (a thread cannot be cancelled) as long, so the sources close after their last use
        unless a hung driver holds a cycle past it."""
        names = [n for n in self.tasks if n in ("read", "xid") or n.startswith("bmc:")]
        tasks = {n: self.tasks[n] for n in names}
        for task in tasks.values():
            task.cancel()
        budget_s = self.cfg.control.read_timeout_s
        if tasks:
            await asyncio.wait(tasks.values(), timeout=budget_s)
        for name, task in tasks.items():  # those that ended; a straggler stays in `tasks`
            if task.done():
                self.tasks.pop(name, None)
        cycle = self._cycle_running  # a read cycle's worker thread cannot be cancelled
        if cycle is not None and not cycle.done():
            await asyncio.wait([cycle], timeout=budget_s)

    async def stop_outputs(self) -> None:
        """The GPUs keep the limits in force (a stopped agent leaves them capped)."""

    async def save_state_at_stop(self) -> None:
        try:
            await asyncio.to_thread(self._save_epochs)
        except (OSError, StateFileError) as err:
            self.log.error("epoch_file_save_failed", path=str(self.epoch_file.path),
                           error=str(err))
        await asyncio.to_thread(self.source.close)

    def start_fields(self) -> Mapping[str, Any]:
        return {"trays": sorted(self.gpus), "agents": self.cfg.agents.daemon,
                "dry_run": self.cfg.caps.dry_run}

    def final_counts(self) -> Mapping[str, Any]:
        return {"published": self.published_total, "read_timeouts": self.read_timeouts_total,
                "stale_epoch_refused": self.book.stale_refused,
                "xid_events": self.xid_total, "limit_corrections": self.limit_corrections}

    @classmethod
    def load_config(cls, path: str | os.PathLike[str]) -> TrayAgentConfig:
        return load_tray_agent_config(Path(path))
