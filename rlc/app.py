"""rlc the daemon: the fleet's budget allocator on the shared frame (`rackplane.daemon`),
thin I/O around its pure core (`rlc.core.cycle.FleetState`, issue 16).

Run as 2–3 replicas with ``[leadership] enabled``: the frame's leadership lease (key
``<site>.<rack>.rlc`` in the leadership bucket) decides which one leads; only the lease holder
allocates and writes budget leases, each carrying its tenure's epoch. One owner task,
``fleet``, on its own connection to the fleet bucket (`rackplane.io.nats.kv.NatsKv`), every
``fleet.cycle_s``:

1. reads every rack key (racky's reports: demand, enforced budget, ack; `on_report`) and logs
   a rack whose report contradicts the topology (``rack_config_mismatch``: its floor, its
   agents' safe caps; `FleetState.mismatches`);
2. not leading (or fenced): forgets every ledger; leading: a new tenure first reads every budget
   key and restores the ledgers from them (`FleetState.restore`: never from memory), as does
   a rack whose last write was refused or unanswered;
3. runs one cycle (`FleetState.cycle`) and writes the leases it issues, each by
   compare-and-set on the revision it last read or wrote, while `may_write` still holds right
   before it (a fenced leader writes nothing).

Then, leading, the **campaign** (issue 17; `rlc.campaign_driver`): the record is read from
the key ``<site>.rlc.campaign`` at a new tenure (or after a failed write), the campaign steps
on what racky published (``<root>/<site>/+/racky/state/rack``, subscribed), the record is
written by compare-and-set **before** the step's orders go out to racky
(``cmd/<campaign user>/<verb>``, QoS 1), unconfirmed orders are re-sent every
``campaign.resend_s``. racky's replies are counted (refusals logged with their code).
Commands ``campaign_start``, ``campaign_status``, ``campaign_abort`` (`rlc.commands`). The
budget cycle serves each validating rack its stage's draw first (and reserves it for a stage
waiting for power): `rlc.campaign_driver.CampaignDriver.reserve_w`, from the campaign as the
previous cycle left it (none in a new tenure's first cycle).

The tick writes the fleet's time series while active (`rlc.telemetry`: per rack grant,
committed, demand, power, cooling, lease expiry, reachable; per row limit and sums) through
the frame's telemetry writer (``[tsdb]``, ``[spool]``), and publishes ``state/fleet``
(retained: per row limit, Σ committed, per rack grant, committed, seq, ack, demand, cooling,
unreachable) every ``control.state_interval_s`` while active.
Counters ``writes_ok``, ``writes_refused``, ``writes_unknown``, ``reads_failed``,
``restores`` are in it and in the ``stopped`` log line; ``state/campaign`` (retained) too,
with the campaign driver's counters.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Unpack

from rackplane.config import check_environment, check_writable_dir, load_config
from rackplane.config_errors import ProblemList
from rackplane.core.budget_leases import budget_key, rack_key
from rackplane.core.topics import Message
from rackplane.daemon import DaemonFrame, FrameOptions, OwnerTask
from rackplane.io.nats.errors import KvConflict, KvUnknown
from rackplane.settings import environment_checks, spool_folder
from rlc.campaign_driver import CampaignDriver, Order, campaign_key
from rlc.commands import register_rlc_commands
from rlc.config import EXAMPLE_CONFIG, RlcConfig, required_parts
from rlc.core.cycle import BudgetWrite, FleetState
from rlc.core.topology import compile_topology
from rlc.telemetry import fleet_lines

DAEMON = "rlc"

__all__ = ["DAEMON", "Rlc", "load_rlc_config"]


def load_rlc_config(path: str | os.PathLike[str] | None) -> RlcConfig:
    """Load and cross-check rlc's config (every env var it names set, the spool folder
    usable).

    Raises:
        ConfigError: with the key path named.
    """
    problems = ProblemList()  # every problem at once (rackplane.config_errors)
    cfg = load_config(RlcConfig, path, required=required_parts, example=EXAMPLE_CONFIG,
                      problems=problems)
    with problems.check():
        check_environment({**environment_checks(cfg.mqtt, cfg.tsdb),
                           **cfg.leadership.environment_checks(),
                           **cfg.fleet.password_env_check("fleet")})
    with problems.check():
        check_writable_dir("spool.directory", spool_folder(cfg.spool, daemon=DAEMON,
                                                           identity=cfg.identity))
    problems.raise_if_any()
    return cfg


class Rlc(DaemonFrame[RlcConfig]):
    """The rlc daemon (module docstring)."""

    daemon = DAEMON

    def __init__(self, cfg: RlcConfig, **options: Unpack[FrameOptions]) -> None:
        super().__init__(cfg, **options)
        self.topo = compile_topology(cfg.topology)
        f = cfg.fleet
        self.state = FleetState(self.topo, cfg.leases, cfg.allocation, f.unreachable_after_s,
                                f.reclaim_after_s, f.write_deadband_w,
                                cooling_max_w=f.cooling_max_w, cooling_hold_s=f.cooling_hold_s)
        self.counts = {"writes_ok": 0, "writes_refused": 0, "writes_unknown": 0,
                       "reads_failed": 0, "restores": 0, "cycles": 0}
        self._state_at = -float("inf")
        self._lines_at = -float("inf")
        self._mismatch: dict[str, list[str]] = {}
        self._resent_at = -float("inf")
        self._orders = 0
        # request ids unique per process start: racky de-duplicates by (user, request_id),
        # and a restarted rlc counts from 1 again
        self._order_prefix = f"rlc-{cfg.leadership.instance[:16]}-{self.clock.wall_ns() // 10**6}"
        self._sends: set[asyncio.Task[None]] = set()
        c = cfg.campaign
        self.driver = CampaignDriver(self.topo, cfg.mqtt.topic_root,
                                     c.user or cfg.mqtt.username or "rlc", c.racky_daemon,
                                     c.max_record_bytes)
        self.attach_commands(lease_outputs={}, register=lambda router, leases:
                             register_rlc_commands(router, self.driver, self.leading))
        if cfg.leadership.enabled and self.commands.accept is None:
            self.commands.accept = self.leading  # one answer: the leader's (others ignore)
        self.mqtt.subscribe(self.driver.state_filter(), self._on_racky_state, qos=1)
        self.mqtt.subscribe(self.driver.reply_filter(), self._on_racky_reply, qos=1)

    @classmethod
    def load_config(cls, path: str | os.PathLike[str]) -> RlcConfig:
        return load_rlc_config(path)

    def owner_tasks(self) -> Sequence[OwnerTask]:
        return (OwnerTask("fleet", self._fleet),)

    def leading(self) -> bool:
        """May this instance allocate now: it holds the lease (or runs alone) and is active."""
        return self.may_write(self.clock.monotonic()) and self.is_active

    # --- the fleet task -------------------------------------------------------------------

    async def _fleet(self) -> None:
        from rackplane.io.nats.kv import NatsKv

        f = self.cfg.fleet
        while True:
            try:
                kv = await NatsKv.connect(f.servers, f.bucket, replicas=f.replicas,
                                          request_timeout_s=f.request_timeout_s,
                                          name=f"rlc-{self.cfg.leadership.instance}",
                                          user=f.username, password=f.password())
                break
            except KvUnknown as err:
                self.log.warning("fleet_connect_failed", servers=f.servers, error=str(err))
                await asyncio.sleep(f.cycle_s)
        self.log.info("fleet_connected", bucket=f.bucket, racks=self.topo.n)
        try:
            while True:
                t0 = self.clock.monotonic()
                await self._cycle(kv)
                await asyncio.sleep(max(0.0, f.cycle_s - (self.clock.monotonic() - t0)))
        finally:
            await kv.close()

    async def _read_all(self, kv: Any, keys: list[str]) -> list[tuple[int, bytes] | None] | None:
        try:
            return list(await asyncio.gather(*(kv.read(k) for k in keys)))
        except KvUnknown as err:
            self.counts["reads_failed"] += 1
            self.log.warning("fleet_read_failed", error=str(err))
            return None

    async def _cycle(self, kv: Any) -> None:
        site, st = self.topo.site, self.state
        racks = list(self.topo.rack_ids)
        reports = await self._read_all(kv, [rack_key(site, r) for r in racks])
        now, wall = self.clock.monotonic(), self.clock.wall_ns() / 1e9  # wall-clock: at_s
        if reports is not None:
            for r, got in zip(racks, reports, strict=True):
                st.on_report(r, got, now, wall)
            self._log_mismatches()
        if not self.leading():
            if st.epoch is not None:
                self.log.info("fleet_not_leading", epoch=st.epoch)
                st.forget()
            self.driver.forget()
            return
        epoch = self.controller_epoch
        if st.epoch != epoch or st.needs_restore():
            missing = racks if st.epoch != epoch else st.needs_restore()
            records = await self._read_all(kv, [budget_key(site, r) for r in missing])
            if records is None:
                return
            st.restore(epoch, dict(zip(missing, records, strict=True)),
                       self.clock.monotonic())
            self.counts["restores"] += 1
            self.log.info("fleet_restored", epoch=epoch, racks=len(missing))
        wall = self.clock.wall_ns() / 1e9  # wall-clock: lease times, the campaign's runs
        writes = st.cycle(epoch, wall, self.clock.monotonic(), self.driver.reserve_w(wall))
        self.counts["cycles"] += 1
        if writes:
            await asyncio.gather(*(self._write(kv, w) for w in writes))
        await self._campaign_cycle(kv, epoch)

    # --- the campaign (rlc.campaign_driver) -----------------------------------------------

    async def _campaign_cycle(self, kv: Any, epoch: int) -> None:
        """Read (new tenure), step, write before send, re-send (module docstring)."""
        d, key = self.driver, campaign_key(self.topo.site)
        if not d.loaded:
            try:
                got = await kv.read(key)
            except KvUnknown as err:
                self.counts["reads_failed"] += 1
                self.log.warning("campaign_read_failed", error=str(err))
                return
            d.restore(got)
            if d.bad_record:
                self.log.error("campaign_record_unreadable", key=key)
        wall = self.clock.wall_ns() / 1e9  # wall-clock: the campaign's times (a new leader's too)
        committed = {r: led.committed_w() for r, led in self.state.ledgers.items()}
        data, orders = d.step(wall, epoch, committed)
        if d.too_large is not None:
            self.log.error("campaign_record_too_large", key=key, bytes=d.too_large,
                           max_record_bytes=d.max_record_bytes)
            return
        now = self.clock.monotonic()
        if data is not None:
            if not self.may_write(now):
                d.write_failed(unknown=False)  # fenced: nothing written, nothing sent
                return
            try:
                rev = await (kv.create(key, data) if d.revision is None
                             else kv.update(key, data, d.revision))
            except KvConflict:
                d.write_failed(unknown=False)
                self.log.warning("campaign_write_refused", key=key)
                return
            except KvUnknown as err:
                d.write_failed(unknown=True)
                self.log.warning("campaign_write_unknown", key=key, error=str(err))
                return
            d.written(rev, data)
            self._send(d.commands(orders))
        if now - self._resent_at >= self.cfg.campaign.resend_s:
            self._resent_at = now
            self._send(d.commands(d.outstanding(wall)))

    def _send(self, orders: list[Order]) -> None:
        """Publish each order (QoS 1, not retained) as its own task; a failure is logged (the
        order is re-sent from the record)."""
        issued = datetime.fromtimestamp(self.clock.wall_ns() / 1e9, tz=UTC).isoformat()
        for o in orders:
            self._orders += 1
            env = {"request_id": f"{self._order_prefix}-{self._orders}",
                   "issued_at": issued, "args": o.args}
            self.log.info("campaign_order", rack=o.rack, verb=o.verb,
                          run_id=o.args.get("run_id"), state=o.args.get("state"))
            task = asyncio.get_running_loop().create_task(
                self._publish_order(self.driver.topic(o), env, o))
            self._sends.add(task)
            task.add_done_callback(self._sends.discard)

    async def _publish_order(self, topic: str, env: dict[str, Any], o: Order) -> None:
        try:
            await self.mqtt.publish(topic, env, qos=1)
        except Exception as err:  # MqttError, PublishRefused: re-sent from the record
            self.log.warning("campaign_order_failed", rack=o.rack, verb=o.verb, error=str(err))
            return
        self.driver.counts["orders_sent"] += 1

    def _rack_of(self, topic: str) -> str | None:
        levels = topic.split("/")
        k = len(self.cfg.mqtt.topic_root.split("/")) + 1
        return levels[k] if len(levels) > k else None

    def _on_racky_state(self, msg: Message) -> None:
        """racky's retained ``state/rack`` (`CampaignDriver.on_racky_state`)."""
        rack = self._rack_of(msg.topic)
        if rack is not None and isinstance(msg.payload, bytes | bytearray):
            self.driver.on_racky_state(rack, bytes(msg.payload))

    def _on_racky_reply(self, msg: Message) -> None:
        """racky's reply to an order: a refusal is counted and logged with its code."""
        try:
            r = json.loads(msg.payload)
            ok, err = bool(r["ok"]), r.get("error") or {}
        except (ValueError, TypeError, KeyError):
            return
        if not ok:
            self.driver.counts["orders_refused"] += 1
            self.log.warning("campaign_order_refused", topic=msg.topic,
                             request_id=r.get("request_id"), code=err.get("code"),
                             message=str(err.get("message"))[:200])

    def _log_mismatches(self) -> None:
        """Log each rack whose report contradicts the topology (`FleetState.mismatches`),
        once per change."""
        now = self.state.mismatches()
        for r in sorted(set(now) | set(self._mismatch)):
            got = now.get(r, [])
            if got == self._mismatch.get(r, []):
                continue
            if got:
                i = self.topo.index(r)
                rep = self.state.seen[r].report
                self.log.warning("rack_config_mismatch", rack=r, mismatch=got,
                                 topology_floor_w=float(self.topo.floor_w[i]),
                                 reported_floor_w=None if rep is None else rep.floor_w,
                                 agents_safe_w=None if rep is None else rep.agents_safe_w,
                                 hint="racky's [fleet] floor_w and its agents' safe caps must "
                                 "match rlc's topology floor_w (docs/RLC.md)")
            else:
                self.log.info("rack_config_agrees", rack=r)
        self._mismatch = now

    async def _write(self, kv: Any, w: BudgetWrite) -> None:
        key = budget_key(self.topo.site, w.rack)
        if not self.may_write(self.clock.monotonic()):
            self.state.write_failed(w.rack)  # not written: read again next tenure
            return
        try:
            if w.last_revision is None:
                rev = await kv.create(key, w.record)
            else:
                rev = await kv.update(key, w.record, w.last_revision)
        except KvConflict:
            self.counts["writes_refused"] += 1
            self.log.warning("budget_write_refused", rack=w.rack, seq=w.seq)
            self.state.write_failed(w.rack)
            return
        except KvUnknown as err:
            self.counts["writes_unknown"] += 1
            self.log.warning("budget_write_unknown", rack=w.rack, seq=w.seq, error=str(err))
            self.state.write_failed(w.rack)
            return
        self.counts["writes_ok"] += 1
        self.state.write_done(w.rack, rev)

    # --- the tick -------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """While active: the fleet's time series every ``control.telemetry_interval_s``
        (`rlc.telemetry.fleet_lines`), ``state/fleet`` every ``control.state_interval_s``."""
        if not self.is_active:
            return
        if now - self._lines_at >= self.cfg.control.telemetry_interval_s:
            self._lines_at = now
            self.write_lines(fleet_lines(self.state, now,
                                         self.clock.wall_ns()))  # wall-clock: lease expiry, stamps
        if now - self._state_at < self.cfg.control.state_interval_s:
            return
        self._state_at = now
        self.mqtt.publish_state("fleet", {**self.state.summary(now), **self.counts})
        self.mqtt.publish_state("campaign", self.driver.status(
            self.clock.wall_ns() / 1e9))  # wall-clock: the campaign's deadlines

    def ready_status(self) -> tuple[str, Mapping[str, Any]]:
        return "rlc running", {"racks": self.topo.n, "rows": len(self.topo.row_ids)}

    def start_fields(self) -> Mapping[str, Any]:
        c = self.cfg
        return {"racks": self.topo.n, "bucket": c.fleet.bucket, "servers": c.fleet.servers,
                "leadership": c.leadership.enabled}

    def final_counts(self) -> Mapping[str, Any]:
        return {**self.counts, **{f"campaign_{k}": v for k, v in self.driver.counts.items()}}
