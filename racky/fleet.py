"""racky's link to rlc's budget leases in the fleet KV bucket (issue 16 item 2; ``[fleet]``).

`FleetLink` runs as racky's owner task ``fleet`` on its own connection to the bucket
(`rackplane.io.nats.kv.NatsKv`; keys `rackplane.core.budget_leases`):

- **lease**: the budget key ``<site>.<rack>.budget`` is read at connect, on every reconnect,
  and every ``read_every_s``; every write to it is also pushed as the server publishes it
  (`NatsKv.subscribe_key`, for latency; the reads stay the truth). Each lease goes through
  `racky.core.budget.BudgetFollower.offer` (newer (epoch, seq) only).
- **promptness** (``wake_tick``, the daemon's `rackplane.daemon.DaemonFrame.wake_tick`: racky's
  one tick runs now rather than at its time): a lease that lowers the budget in force wakes
  it, so the caps go out within milliseconds of the lease; while a lease awaits its
  acknowledgement, an agent's telemetry reading its enforced cap back lower wakes it too
  (`readback_lowered`), so the acknowledgement follows the read-back, not the next tick. An
  increase waits for the next tick (never applied before it is read either way).
- **report**: the rack key ``<site>.<rack>.rack`` (`RackReport`) is written (plain put) when
  its content changes (an acknowledgement at once) and at least every ``report_every_s``
  (rlc marks a rack whose report stops changing unreachable).

The daemon's tick asks `budget_w` before racky's core step (the fleet budget bounds the rack
budget: `racky.core.controller.RackyCore.fleet_budget_w`) and hands the step's read-back to
`observe` after it (`rack_figures`: the most the trays may draw by their **enforced** caps,
and the rack's demand). Cut off from the bucket, racky keeps the lease it has until it expires
and then falls to ``floor_w`` by itself (`BudgetFollower.budget_w`).

**Cooling capacity.** The report carries the rack's cooling capacity now (``cooling_w``, AC
W): the P_max racky's facility-water derate works to from valvey's measured capacity
(`racky.core.power.Derate.measured_capacity_w`), × the input ratio; None while valvey has not
measured or its state is stale. rlc takes the lower of it and its configured figure
(`rlc.core.cycle`).

**Status** (report version 3): the rack's lifecycle state, its alarms (`AlarmSummary.of`
racky's alarm bank: counts per severity, the most severe ids, bounded) and, for one of a
racky pair, the active instance and its lease epoch (`PairTag`) go in the report too, for
operators (``rackctl fleet status``); rlc never decides on them.

**One writer.** Of a racky pair only the active instance writes the report: the daemon sets
``reporting`` each tick (after `observe_core`, so a takeover's first report carries its own
figures) and ``fence`` (the frame's ``may_write``: a fenced instance stops at once, not at its
next tick). A standby keeps following the lease (its takeover starts from it).

**Safe caps.** rlc counts on a rack whose racky went silent drawing at most its floor once the
agents' cap TTL ran out: the agents then hold their safe caps. racky's config checks that with
the safe cap it assumes (``agent_safe_gpu_cap_w``, `racky.fleet_settings.check_fleet`); the
agents state theirs in their telemetry (contract 1.2 ``agent.safe_gpu_cap_w``), and
`observe_core` compares (`agents_safe_figures`): a tray whose agent states more than the
assumption (+ `SAFE_CAP_TOLERANCE_W`) is logged (``agent_safe_cap_above_assumed``, once per
change of the set of such trays) and counted (``safe_cap_above_trays``), and the Σ of the
stated caps goes to rlc in the report (``agents_safe_w``), which checks it against the floor
it counts for the rack.

Counters (``stats``): ``reads_failed``, ``writes_ok``, ``writes_failed``, ``leases_taken``,
``bad_records``, ``reconnects``, ``safe_cap_above_trays`` (trays now above the assumption).
Nothing raised out of the task (store failures are counted and logged once per run of
failures).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from rackplane.clock import SYSTEM_CLOCK, Clock
from rackplane.core.budget_leases import (
    AlarmSummary,
    BudgetLease,
    PairTag,
    budget_key,
    check_lifecycle,
    rack_key,
)
from rackplane.io.nats.errors import KvError, KvUnknown
from rackplane.log import get_logger
from racky.core.budget import BudgetFollower, FleetSide, InputRatio
from racky.fleet_settings import FleetSettings

if TYPE_CHECKING:
    from racky.core.controller import RackyCore

__all__ = ["SAFE_CAP_TOLERANCE_W", "FleetLink", "agents_safe_figures", "rack_figures",
           "status_of"]

SAFE_CAP_TOLERANCE_W = 1.0
"""A stated safe cap at most this above the assumed one is within it, W (an agent's rounding
to its device's step)."""


def rack_figures(core: RackyCore) -> tuple[float | None, float | None]:
    """(drawable_w, demand_w) after a step, W.

    ``drawable_w``: Σ over trays of the enforced tray cap its agent reports (a powered or
    wanted-on tray without one: its maximum, ``CapAllocator.tray_max_w``; an unpowered tray
    racky keeps off: 0) plus the power outside the trays; None unless every tray's reading is
    fresh. ``demand_w``: Σ over powered trays of the demand estimate with racky's headroom,
    clipped to [tray min, tray max], plus the power outside the trays, grossed up by
    ``budget_margin_pct`` (what budget would let the cap loop give every tray its want);
    None unless every tray's reading is fresh too (rlc then holds the rack's grant rather
    than cut it on a partial sum).
    """
    t = core.table
    if t is None or not bool(t.fresh.all()):
        return None, None
    alloc = core.alloc
    mx, mn = alloc.tray_max_w, alloc.tray_min_w
    wanted_on = np.array([x is not False for x in core.desired_powered])
    enforced = np.where(np.isfinite(t.enforced_tray_cap_w), t.enforced_tray_cap_w, mx)
    per = np.where(t.powered | wanted_on, enforced,
                   np.where(np.isfinite(t.enforced_tray_cap_w), t.enforced_tray_cap_w, 0.0))
    drawable = float(per.sum() + core.non_tray_w)
    p = alloc.cfg
    on = t.powered
    want = np.where(on, np.clip(core.tray_demand_w * (1.0 + p.headroom_pct / 100.0), mn, mx),
                    0.0)
    demand = (float(want.sum()) + core.non_tray_w) / (1.0 - p.budget_margin_pct / 100.0)
    return drawable, demand


def agents_safe_figures(core: RackyCore, assumed_gpu_w: float) -> tuple[float | None,
                                                                       dict[int, float]]:
    """(safe_dc_w, above) from the trays' latest fresh telemetry.

    ``safe_dc_w``: Σ over trays of the stated ``safe_gpu_cap_w`` × GPUs per tray × (1 +
    the non-GPU share), plus the power outside the trays, W (the figure racky's config checks
    with ``assumed_gpu_w`` in its place; share and outside power: the larger of the
    configured and the learned figure, the safe side); None unless every tray is fresh and
    states one.
    ``above``: tray → stated cap (W) of the fresh trays whose agent states more than
    ``assumed_gpu_w`` + `SAFE_CAP_TOLERANCE_W`.
    """
    a = core.cfg.node_agents
    total = max(core.non_tray_w, a.non_tray_power_w)
    per_tray = core.gpt * (1.0 + max(core.other_share, a.other_share))
    known = True
    above: dict[int, float] = {}
    for k in range(core.n_trays):
        r = core.readings.get(k)
        cap = None if r is None or not bool(core.fresh[k]) else r.agent.safe_gpu_cap_w
        if cap is None:
            known = False
            continue
        if cap > assumed_gpu_w + SAFE_CAP_TOLERANCE_W:
            above[k] = cap
        total += cap * per_tray
    return (total if known else None), above


def status_of(core: RackyCore) -> tuple[str | None, AlarmSummary | None]:
    """(lifecycle, alarms) for the report: the persisted lifecycle state and the summary of
    the alarm bank's alarms not normal; either None when it does not fit the report's bounds
    (`rackplane.core.budget_leases`; never expected, never fatal)."""
    try:
        lifecycle: str | None = check_lifecycle(core.persisted.lifecycle.state)
    except ValueError:
        lifecycle = None
    try:
        alarms: AlarmSummary | None = AlarmSummary.of(core.bank.active())
    except (ValueError, KeyError):
        alarms = None
    return lifecycle, alarms


class FleetLink:
    """One rack's lease follower and reporter on the fleet bucket (module docstring).

    Args:
        settings: ``[fleet]``; site, rack: the rack's identity (key tokens); clock: injected
        clocks; name: the NATS connection's name.
    """

    def __init__(self, settings: FleetSettings, site: str, rack: str, *,
                 clock: Clock = SYSTEM_CLOCK, name: str | None = None) -> None:
        self.settings = settings
        self.clock = clock
        self.name = name or f"racky-{rack}"
        self.budget_key = budget_key(site, rack)
        self.rack_key = rack_key(site, rack)
        self.follower = BudgetFollower(rack, settings.floor_w, settings.clock_margin_s,
                                       settings.ack_tolerance_w)
        self.side = FleetSide(self.follower, InputRatio(settings.input_ratio_fallback))
        self.log = get_logger("racky.fleet")
        self.stats = {"reads_failed": 0, "writes_ok": 0, "writes_failed": 0, "leases_taken": 0,
                      "bad_records": 0, "reconnects": 0, "safe_cap_above_trays": 0}
        self._safe_above: dict[int, float] = {}
        self.connected = False
        #: runs the daemon's tick now (module docstring: promptness); None: never woken
        self.wake_tick: Callable[[], None] | None = None
        #: whether this instance writes the report (module docstring: one writer); a pair's
        #: daemon sets it each tick, False until its first tick as active
        self.reporting = True
        #: asked before every report write when set (the frame's ``may_write`` now)
        self.fence: Callable[[], bool] | None = None
        self._read_now = asyncio.Event()
        self._report_now = asyncio.Event()
        self._failing = False

    # --- what the tick asks ---------------------------------------------------------------

    def _now(self) -> tuple[float, float]:
        return self.clock.wall_ns() / 1e9, self.clock.monotonic()  # wall-clock: lease times

    def budget_w(self) -> float:
        """The fleet budget in force now, W (the lease's value, or the floor)."""
        return self.follower.budget_w(*self._now())

    def observe(self, drawable_w: float | None, demand_w: float | None) -> None:
        """A read-back in the lease's terms (AC input, W); a new acknowledgement is reported
        at once."""
        self._acked(self.follower.observe(drawable_w, demand_w, *self._now()), drawable_w)

    def readback_lowered(self) -> None:
        """An agent's telemetry read its enforced cap back lower (`racky.tick.RackyTick.
        take_readback_lowered`): while a lease awaits its acknowledgement, wake the tick."""
        if self.wake_tick is not None and self.follower.awaiting_ack(*self._now()):
            self.wake_tick()

    def dc_budget_w(self) -> float:
        """The budget for racky's core (DC output, W; `FleetSide.dc_budget_w`)."""
        return self.side.dc_budget_w(*self._now())

    def observe_core(self, core: RackyCore, pair: PairTag | None = None) -> None:
        """After racky's step: its read-back (`rack_figures`) and the shelves' input and
        output, converted to AC (`FleetSide.observe`), and the rack's status (`status_of`;
        ``pair``: this instance and its epoch when one of a pair, None for one instance)."""
        f = self.follower
        f.lifecycle, f.alarms = status_of(core)
        f.pair = pair
        drawable, demand = rack_figures(core)
        view = core.last.shelves if core.last is not None else None
        inp = None if view is None else view.rack_input_w
        out = None if view is None else view.rack_power_w
        safe_dc, above = agents_safe_figures(core, self.settings.agent_safe_gpu_cap_w)
        if above.keys() != self._safe_above.keys():
            if above:
                self.log.warning("agent_safe_cap_above_assumed", trays=sorted(above),
                                 stated_w=sorted(set(above.values())),
                                 assumed_w=self.settings.agent_safe_gpu_cap_w,
                                 hint="set tray-agent [caps] safe_gpu_cap_w to at most racky's "
                                 "[fleet] agent_safe_gpu_cap_w: a silent rack could exceed "
                                 "its floor")
            else:
                self.log.info("agent_safe_caps_within_assumed",
                              assumed_w=self.settings.agent_safe_gpu_cap_w)
        self._safe_above = above
        self.stats["safe_cap_above_trays"] = len(above)
        cooling = core.last.cooling_capacity_w if core.last is not None else None
        limit = core.last.limit.limit_w if core.last is not None else None
        self._acked(self.side.observe(drawable, demand, inp, out, *self._now(),
                                      agents_safe_dc_w=safe_dc, cooling_dc_w=cooling,
                                      limit_dc_w=limit),
                    drawable)

    def _acked(self, acked: bool, drawable_w: float | None) -> None:
        if acked:
            self.log.info("budget_lease_acked", key=self.budget_key,
                          acked=list(self.follower.acked or ()), drawable_w=drawable_w)
            self._report_now.set()

    # --- the task -------------------------------------------------------------------------

    async def run(self) -> None:
        """Connect (retrying every ``read_every_s``), then follow and report until
        cancelled; the connection is closed on the way out."""
        from rackplane.io.nats.kv import NatsKv

        s = self.settings
        while True:
            try:
                kv = await NatsKv.connect(s.servers, s.bucket, replicas=s.replicas,
                                          request_timeout_s=s.request_timeout_s,
                                          name=self.name, on_reconnect=self._reconnected,
                                          user=s.username, password=s.password())
                break
            except (KvUnknown, KvError) as err:
                self._fail("fleet_connect_failed", err)
                await asyncio.sleep(s.read_every_s)
        self.connected = True
        self.log.info("fleet_connected", bucket=s.bucket, key=self.budget_key)
        unsubscribe = None
        try:
            with contextlib.suppress(KvUnknown):
                unsubscribe = await kv.subscribe_key(self.budget_key, self._pushed)
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._reader(kv), name="fleet_reader")
                tg.create_task(self._reporter(kv), name="fleet_reporter")
        finally:
            self.connected = False
            if unsubscribe is not None:
                with contextlib.suppress(Exception):
                    await unsubscribe()
            await kv.close()

    def _reconnected(self) -> None:
        self.stats["reconnects"] += 1
        self._read_now.set()
        self._report_now.set()

    def take(self, value: bytes) -> None:
        """The budget key's value as read or pushed (the JSON record); a bad one is counted."""
        try:
            lease = BudgetLease.from_record(json.loads(value)["lease"])
        except (ValueError, TypeError, KeyError):
            self.stats["bad_records"] += 1
            return
        before = self.follower.budget_w(*self._now())
        if self.follower.offer(lease, self.clock.monotonic()):
            self.stats["leases_taken"] += 1
            if lease.value_w != before:
                self.log.info("budget_lease_taken", key=self.budget_key, value_w=lease.value_w,
                              epoch=lease.epoch, seq=lease.seq, before_w=before)
            if lease.value_w < before and self.wake_tick is not None:
                self.wake_tick()
            self._report_now.set()

    def _pushed(self, value: bytes, deleted: bool) -> None:
        if not deleted:
            self.take(value)

    def _fail(self, event: str, err: Exception) -> None:
        if not self._failing:
            self.log.warning(event, key=self.budget_key, error=str(err))
        self._failing = True

    async def _reader(self, kv: Any) -> None:
        while True:
            try:
                got = await kv.read(self.budget_key)
                if got is not None:
                    self.take(got[1])
                self._failing = False
            except KvUnknown as err:
                self.stats["reads_failed"] += 1
                self._fail("budget_lease_read_failed", err)
            self._read_now.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.read_every_s):
                    await self._read_now.wait()

    async def _reporter(self, kv: Any) -> None:
        last: dict[str, Any] | None = None
        sent_at = -float("inf")
        while True:
            wall, mono = self._now()
            rec = self.follower.report(wall, mono).as_record()
            content = {k: v for k, v in rec.items() if k != "at_s"}
            if not (self.reporting and (self.fence is None or self.fence())):
                last = None  # not the writer: once it is, it writes at once
            elif content != last or mono - sent_at >= self.settings.report_every_s:
                try:
                    await kv.put(self.rack_key, json.dumps(rec).encode())
                    self.stats["writes_ok"] += 1
                    last, sent_at = content, mono
                except KvUnknown as err:
                    self.stats["writes_failed"] += 1
                    self._fail("rack_report_write_failed", err)
            self._report_now.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(self.settings.report_every_s, 0.25)):
                    await self._report_now.wait()
