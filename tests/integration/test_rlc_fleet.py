"""rlc and racky's budget side on the real 3-node NATS cluster (issue 16 items 2 and 5).

rlc runs as real processes (``python -m rlc``; one, or two replicas a/b with ``[leadership]``);
each rack is racky's budget side driven in this process: `racky.fleet.FleetLink` (the code
racky's ``fleet`` task runs: lease read and pushed, report written) over a stand-in for the
trays (`TraysStandIn`): a budget decrease is read back as enforced after ``ENFORCE_S`` (the
agents applying their caps), a rise at once. What the stand-in reports as enforced is what the
rack may draw; a monitor samples both racks every 50 ms and every test asserts their sum never
exceeded the row limit, and reads the budget keys every 0.1 s to time the leases.

- a decrease is enforced and acknowledged, and the headroom it frees goes to the other rack
  only after that acknowledgement;
- a partitioned rack (its FleetLink task cancelled: connection closed) reaches its floor by
  itself before its share is re-granted, and the re-grant waits for its last lease's expiry +
  clock margin + agent cap TTL;
- the rlc leader SIGKILLed mid-reallocation (a ramp in progress): the other replica resumes
  from the KV state (seq continues, grant continues from the last one) within lease + 2 s.

Timing: lease ttl 3 s, clock margin 0.5 s, agent cap TTL 2 s, cycle 0.5 s; leadership lease
3 s, renew 0.5 s. Figures are printed (run with ``-s``).

Waits for a steady state (`_steady`) are two: the first leases (the processes start, a leader
is elected and restores: several seconds on a loaded host, ``STARTUP_S``), then the ramp, which
rlc may not beat: Σ of the rises / the row's ``ramp_w_per_s`` (15 s from the floors to
50 kW each at 4 kW/s) + ``RAMP_SLACK_S`` (cycles, writes and the monitor's reads). A grant that
stops short of its target still fails the wait; its message lists each rack's lease history.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import signal
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness.daemons import Proc, daemon_proc, until, write_config
from harness.servers import Mosquitto, NatsCluster
from rackplane.core.budget_leases import BudgetLease, RackReport, budget_key, rack_key
from rackplane.io.nats.kv import KvUnknown, NatsKv
from racky.fleet import FleetLink
from racky.fleet_settings import FleetSettings

pytestmark = [pytest.mark.servers]

ROW_LIMIT_W = 100_000.0
FLOOR_W = 20_000.0
ENFORCE_S = 0.2
TTL_S, MARGIN_S, CAP_TTL_S = 3.0, 0.5, 2.0
BUCKET_S = 30.0    # the test's bucket made (JetStream's meta leader busy on a loaded host)
CANCEL_S = 15.0    # a cancelled FleetLink/monitor task ends (its NATS close is bounded 5 s)
STARTUP_S = 30.0   # process start + election + restore until the first leases (loaded host)
RAMP_SLACK_S = 20.0  # beyond the ramp's own minimum time (cycles, writes, monitor reads)
DEFAULT_RAMP_W_PER_S = 50_000.0
LEADERSHIP = {"lease_s": 3.0, "renew_every_s": 0.5, "renew_deadline_s": 2.0,
              "retry_every_s": 0.2, "election_max_s": 1.0, "request_timeout_s": 0.5,
              "sync_min_interval_s": 0.25}


def _topology(site: str, ramp_w_per_s: float) -> dict[str, Any]:
    rack = {"floor_w": FLOOR_W, "max_w": 80_000.0, "priority": "normal"}
    return {"site": site, "halls": {"h1": {"feed_limit_w": 1e6, "rows": {"row1": {
        "limit_w": ROW_LIMIT_W, "ramp_w_per_s": ramp_w_per_s,
        "racks": {"ra": rack, "rb": dict(rack)}}}}}}


def rlc_proc(tmp: Path, inst: str, site: str, bucket: str, nats: NatsCluster,
             mosquitto: Mosquitto, *, pair: bool,
             ramp_w_per_s: float = DEFAULT_RAMP_W_PER_S) -> Proc:
    cfg = write_config(
        tmp / f"rlc-{inst}.toml",
        identity={"site": site, "row": "fleet", "rack": "rlc"},
        mqtt={"host": "127.0.0.1", "port": mosquitto.port},
        spool={"directory": str(tmp / f"spool-{inst}")},
        control={"tick_s": 0.5, "telemetry_interval_s": 0.5},
        fleet={"servers": nats.urls, "bucket": bucket, "request_timeout_s": 0.5,
               "cycle_s": 0.5, "unreachable_after_s": 2.0, "reclaim_after_s": 3.0,
               "write_deadband_w": 100.0},
        leases={"ttl_s": TTL_S, "clock_margin_s": MARGIN_S, "agent_cap_ttl_s": CAP_TTL_S},
        leadership={"enabled": pair, "instance": inst, "servers": nats.urls,
                    "bucket": f"{bucket}_lead", **LEADERSHIP},
        topology=_topology(site, ramp_w_per_s),
    )
    return daemon_proc("rlc", tmp, cfg, tag=inst).start()


@dataclass
class TraysStandIn:
    """A rack's trays as racky's budget side sees them (module docstring)."""

    link: FleetLink
    demand_w: float
    enforced_w: float = FLOOR_W
    falling_since: float | None = None
    floor_at: float | None = None      # wall s: enforced reached the floor without a lease

    def step(self) -> None:
        budget = self.link.budget_w()
        now = time.time()
        if budget < self.enforced_w:
            if self.falling_since is None:
                self.falling_since = now
            if now - self.falling_since >= ENFORCE_S:
                self.enforced_w = budget
                self.falling_since = None
        else:
            self.enforced_w = budget
            self.falling_since = None
        f = self.link.follower
        if (self.floor_at is None and self.enforced_w <= FLOOR_W and f.lease is not None
                and not f.valid(now, time.monotonic())):
            self.floor_at = now
        self.link.observe(self.enforced_w, self.demand_w)


@dataclass
class Fleet:
    site: str
    bucket: str
    racks: dict[str, TraysStandIn]
    tasks: dict[str, asyncio.Task[None]]
    leases: dict[str, list[tuple[float, BudgetLease]]] = field(default_factory=dict)
    reports: dict[str, RackReport] = field(default_factory=dict)
    max_sum_w: float = 0.0
    samples: int = 0

    def last(self, rack: str) -> BudgetLease | None:
        seen = self.leases.get(rack)
        return seen[-1][1] if seen else None

    def enforced(self, rack: str, value_w: float) -> bool:
        """The rack enforces ``value_w`` and acknowledged the newest lease seen."""
        r, last = self.racks[rack], self.last(rack)
        return last is not None and r.enforced_w == value_w and r.link.follower.acked == last.key

    def cut(self, rack: str) -> None:
        """Partition: cancel the rack's FleetLink (its NATS connection is closed)."""
        self.tasks.pop(f"link-{rack}").cancel()


async def _monitor(fl: Fleet, kv: NatsKv) -> None:
    while True:
        for r in fl.racks:
            with contextlib.suppress(Exception):
                got = await kv.read(budget_key(fl.site, r))
                if got is not None:
                    lease = BudgetLease.from_record(json.loads(got[1])["lease"])
                    seen = fl.leases.setdefault(r, [])
                    if not seen or seen[-1][1].key != lease.key:
                        seen.append((time.time(), lease))
                rep = await kv.read(rack_key(fl.site, r))
                if rep is not None:
                    fl.reports[r] = RackReport.from_record(json.loads(rep[1]))
        await asyncio.sleep(0.1)


async def _trays(fl: Fleet) -> None:
    while True:
        for r in fl.racks.values():
            r.step()
        fl.max_sum_w = max(fl.max_sum_w, sum(r.enforced_w for r in fl.racks.values()))
        fl.samples += 1
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def fleet(nats: NatsCluster, site: str, bucket: str,
                demand_w: dict[str, float]) -> AsyncIterator[Fleet]:
    settings = FleetSettings(enabled=True, servers=nats.urls, bucket=bucket,
                             request_timeout_s=0.5, floor_w=FLOOR_W, clock_margin_s=MARGIN_S,
                             read_every_s=0.5, report_every_s=0.5, agent_safe_gpu_cap_w=100.0)
    racks = {r: TraysStandIn(FleetLink(settings, site, r), d) for r, d in demand_w.items()}
    fl = Fleet(site, bucket, racks, {})
    kv, last_err = None, None
    t0 = time.monotonic()  # the bucket is made here (a fresh or loaded cluster: seconds)
    while kv is None and time.monotonic() - t0 < BUCKET_S:
        try:
            kv = await NatsKv.connect(nats.urls, bucket, request_timeout_s=2.0, name="monitor")
        except KvUnknown as err:
            last_err = err
            await asyncio.sleep(0.5)
    assert kv is not None, f"the fleet bucket could not be made in {BUCKET_S} s: {last_err!r}"
    for r, rk in racks.items():
        fl.tasks[f"link-{r}"] = asyncio.create_task(rk.link.run(), name=f"link-{r}")
    fl.tasks["trays"] = asyncio.create_task(_trays(fl), name="trays")
    fl.tasks["monitor"] = asyncio.create_task(_monitor(fl, kv), name="monitor")
    try:
        yield fl
    finally:
        for t in fl.tasks.values():
            t.cancel()
        hung = []
        for name, t in fl.tasks.items():  # bounded: a task that ignores its cancellation fails
            done, _ = await asyncio.wait({t}, timeout=CANCEL_S)
            if not done:
                stack = io.StringIO()
                t.print_stack(file=stack)
                hung.append(f"{name}:\n{stack.getvalue()}")
            elif not t.cancelled() and t.exception() is not None:
                hung.append(f"{name} failed: {t.exception()!r}")
        await kv.close()
        print(f"\n[rlc fleet] max Σ enforced {fl.max_sum_w:.0f} W over {fl.samples} samples "
              f"(row limit {ROW_LIMIT_W:.0f} W)")
        assert fl.max_sum_w <= ROW_LIMIT_W
        assert not hung, f"tasks failed or not ended {CANCEL_S} s after cancel: {hung}"


def _ids() -> tuple[str, str]:
    u = uuid.uuid4().hex[:8]
    return f"s{u}", f"fleet_{u}"


def _history(fl: Fleet) -> str:
    """Each rack's leases as the monitor saw them: (epoch, seq) value W at s since the first."""
    t0 = min((seen[0][0] for seen in fl.leases.values() if seen), default=0.0)
    out = []
    for r, x in fl.racks.items():
        seen = fl.leases.get(r, [])
        steps = ", ".join(f"({ls.epoch},{ls.seq}) {ls.value_w:.0f}@{t - t0:.1f}"
                          for t, ls in seen[-12:])
        out.append(f"{r}: enforced {x.enforced_w:.0f} W, acked {x.link.follower.acked}, "
                   f"{len(seen)} leases, last: {steps}")
    return "; ".join(out)


async def _steady_values(fl: Fleet, procs: list[Proc], values: dict[str, float],
                         ramp_w_per_s: float = DEFAULT_RAMP_W_PER_S) -> None:
    """Wait until every rack enforces and acknowledges its value (W): first the first leases
    (``STARTUP_S``), then the rises at the row's ramp + ``RAMP_SLACK_S`` (module docstring)."""
    await until(lambda: all(fl.last(r) is not None for r in values), STARTUP_S,
                "the first leases (a leader elected and restored)", *procs,
                detail=lambda: _history(fl))
    rise_w = 0.0
    for r, v in values.items():
        last = fl.last(r)
        assert last is not None
        rise_w += max(v - last.value_w, 0.0)
    waited_s = await until(lambda: all(fl.enforced(r, v) for r, v in values.items()),
                           rise_w / ramp_w_per_s + RAMP_SLACK_S,
                           f"racks enforce and ack {values} (a {rise_w:.0f} W rise at "
                           f"{ramp_w_per_s:.0f} W/s)", *procs, detail=lambda: _history(fl))
    print(f"\n[rlc steady] {values}: a {rise_w:.0f} W rise in {waited_s:.1f} s (the ramp's "
          f"minimum {rise_w / ramp_w_per_s:.1f} s)")


async def _steady(fl: Fleet, procs: list[Proc], value_w: float,
                  ramp_w_per_s: float = DEFAULT_RAMP_W_PER_S) -> None:
    """`_steady_values` with ``value_w`` for every rack."""
    await _steady_values(fl, procs, dict.fromkeys(fl.racks, value_w), ramp_w_per_s)


async def test_decrease_enforced_acked_then_regranted(
        tmp_path: Path, mosquitto: Mosquitto, nats_cluster: NatsCluster) -> None:
    site, bucket = _ids()
    async with fleet(nats_cluster, site, bucket, {"ra": 60_000.0, "rb": 60_000.0}) as fl:
        p = rlc_proc(tmp_path, "a", site, bucket, nats_cluster, mosquitto, pair=False)
        await _steady(fl, [p], 50_000.0)
        ra, rb = fl.racks["ra"], fl.racks["rb"]
        ra.demand_w, rb.demand_w = 30_000.0, 80_000.0
        await until(lambda: (x := fl.last("ra")) is not None and x.value_w < 50_000.0, 10.0,
                    "ra's decrease written", p)
        dec = fl.last("ra")
        assert dec is not None
        await until(lambda: ra.link.follower.acked == dec.key, 10.0, "ra acks", p)
        acked_at = time.time()
        await until(lambda: (x := fl.last("rb")) is not None and x.value_w > 50_000.0, 10.0,
                    "rb's raise written", p)
        raise_lease = fl.last("rb")
        assert raise_lease is not None
        enforce_s = acked_at - dec.issued_at_s
        print(f"\n[rlc decrease] ra {dec.value_w:.0f} W lease issued -> enforced and acked in "
              f"{enforce_s:.2f} s (stand-in read-back {ENFORCE_S} s; target <= 2 s); rb raised "
              f"to {raise_lease.value_w:.0f} W {raise_lease.issued_at_s - acked_at:+.2f} s "
              "after the ack")
        assert dec.value_w == pytest.approx(30_000.0)
        assert ENFORCE_S <= enforce_s <= 2.0
        # released headroom goes out only after the ack (the ack's report was read by rlc)
        assert raise_lease.issued_at_s >= acked_at - 0.1
        await _steady_values(fl, [p], {"ra": 30_000.0, "rb": 70_000.0})
        p.stop()
    # the leader's time series (rlc/telemetry.py, every 0.5 s) in its spool: each grant it
    # shows is a lease the monitor read from the store, with its expiry ahead within the ttl
    spooled = _spooled_grants(tmp_path / "spool-a")
    assert set(spooled) == {"ra", "rb"}, spooled
    for r, got in spooled.items():
        issued = {ls.value_w for _, ls in fl.leases.get(r, [])}
        assert len(got) >= 3 and {g for g, _ in got} <= issued, (r, got, sorted(issued))
        assert all(0.0 < e <= TTL_S for _, e in got), (r, got)


def _spooled_grants(folder: Path) -> dict[str, list[tuple[float, float]]]:
    """rack -> (``grant_w``, ``lease_expires_in_s``) of each ``fleet_rack`` line the rlc
    process spooled, in order."""
    from rackplane.io.spool import Spool

    sp = Spool(folder, readonly=True)
    try:
        lines, _ = sp.read(1_000_000)
    finally:
        sp.close(fsync=False)
    out: dict[str, list[tuple[float, float]]] = {}
    for ln in lines:
        if not ln.startswith("fleet_rack,"):
            continue
        tags = dict(kv.split("=", 1) for kv in ln.split(" ", 1)[0].split(",")[1:])
        fields = dict(kv.split("=", 1) for kv in ln.split(" ")[1].split(","))
        if "grant_w" in fields:
            out.setdefault(tags["fleet_rack"], []).append(
                (float(fields["grant_w"]), float(fields["lease_expires_in_s"])))
    return out


async def test_partitioned_rack_reaches_floor_before_its_share_is_regranted(
        tmp_path: Path, mosquitto: Mosquitto, nats_cluster: NatsCluster) -> None:
    site, bucket = _ids()
    async with fleet(nats_cluster, site, bucket, {"ra": 60_000.0, "rb": 60_000.0}) as fl:
        p = rlc_proc(tmp_path, "a", site, bucket, nats_cluster, mosquitto, pair=False)
        await _steady(fl, [p], 50_000.0)
        fl.racks["ra"].demand_w = 80_000.0
        fl.cut("rb")
        cut_at = time.time()
        await until(lambda: (x := fl.last("ra")) is not None and x.value_w > 50_000.0, 40.0,
                    "ra re-granted rb's share", p)
        regrant = fl.last("ra")
        assert regrant is not None
        floor_at = fl.racks["rb"].floor_at
        # the newest lease rlc wrote for rb above its floor: the last it may have drawn under
        held = [ls for _, ls in fl.leases["rb"] if ls.value_w > FLOOR_W]
        last_expiry = held[-1].expires_at_s
        print(f"\n[rlc partition] rb cut at 0 s: floor by itself at "
              f"{(floor_at or float('nan')) - cut_at:.2f} s, its last {held[-1].value_w:.0f} W "
              f"lease expired at {last_expiry - cut_at:.2f} s, ra re-granted "
              f"{regrant.value_w:.0f} W at {regrant.issued_at_s - cut_at:.2f} s (hold "
              f"margin + cap TTL = {MARGIN_S + CAP_TTL_S:g} s)")
        assert floor_at is not None and floor_at < regrant.issued_at_s
        assert regrant.issued_at_s >= last_expiry + MARGIN_S + CAP_TTL_S
        # not later than needed: a cycle and a read after the hold (plus the ramp's first step)
        assert regrant.issued_at_s <= last_expiry + MARGIN_S + CAP_TTL_S + 2.0
        p.stop()


async def test_leader_killed_mid_reallocation_other_replica_resumes(
        tmp_path: Path, mosquitto: Mosquitto, nats_cluster: NatsCluster) -> None:
    site, bucket = _ids()
    async with fleet(nats_cluster, site, bucket, {"ra": 60_000.0, "rb": 60_000.0}) as fl:
        ramp_w_per_s = 4_000.0
        procs = {i: rlc_proc(tmp_path, i, site, bucket, nats_cluster, mosquitto, pair=True,
                             ramp_w_per_s=ramp_w_per_s) for i in ("a", "b")}
        await _steady(fl, list(procs.values()), 50_000.0, ramp_w_per_s)
        old_epoch = fl.last("ra").epoch  # type: ignore[union-attr]
        leader = next(i for i, pr in procs.items()
                      if any(e.get("event") == "fleet_restored" and e.get("epoch") == old_epoch
                             for e in pr.events()))
        fl.racks["ra"].demand_w, fl.racks["rb"].demand_w = 30_000.0, 80_000.0
        await until(lambda: (x := fl.last("rb")) is not None and x.value_w > 52_000.0, 15.0,
                    "rb's ramp under way", *procs.values())
        before = fl.last("rb")
        assert before is not None and before.value_w < 70_000.0  # mid-reallocation
        procs[leader].signal(signal.SIGKILL)
        killed_at = time.time()
        other = procs["b" if leader == "a" else "a"]
        await until(lambda: (x := fl.last("rb")) is not None and x.epoch > old_epoch, 15.0,
                    "a lease of the new leader", other)
        first = fl.last("rb")
        assert first is not None
        old_seqs = [ls.seq for _, ls in fl.leases["rb"] if ls.epoch == old_epoch]
        resumed_s = first.issued_at_s - killed_at
        print(f"\n[rlc failover] leader {leader} killed with rb at {before.value_w:.0f} W "
              f"(seq {before.seq}); {other.name} wrote epoch {first.epoch} seq {first.seq} "
              f"{first.value_w:.0f} W after {resumed_s:.2f} s (target <= lease "
              f"{LEADERSHIP['lease_s']:g} + 2 s)")
        assert resumed_s <= LEADERSHIP["lease_s"] + 2.0
        # never before the old tenure could have run out (last renewal up to renew_every_s
        # before the kill, 0.2 s for the monitor's poll and clocks)
        assert resumed_s >= LEADERSHIP["lease_s"] - LEADERSHIP["renew_every_s"] - 0.2
        assert first.seq > max(old_seqs)                     # the ledger came from the store
        assert first.value_w >= before.value_w - 100.0       # resumed, not restarted
        await _steady_values(fl, [other], {"ra": 30_000.0, "rb": 70_000.0}, ramp_w_per_s)
        other.stop()
