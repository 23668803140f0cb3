"""A redundant pair's state sync (issue 15), the parts without servers: the record and its
rules (rackplane.core.pair_sync), the router's applied request-ids and the lease table carried
from one instance to the other, valvey's command state followed by the standby
(valvey.persist.sync_command_state), the lease hint of a handover, and the sync task with
handover on an in-memory store (rackplane.pair)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rackplane.core.envelope import CommandContext
from rackplane.core.leadership import LeaderLease, LeaseTiming, Op
from rackplane.core.leases import LeaseTable
from rackplane.core.pair_sync import (
    HandoverArgs,
    PairAlarms,
    SyncFollower,
    SyncPacer,
    SyncRecord,
    is_pair_alarm,
    pair_alarm_defs,
)
from rackplane.errors import CommandError
from rackplane.io.nats.errors import KvConflict, KvUnknown
from rackplane.io.nats.lease import LeaseRunner
from rackplane.leadership_settings import LeadershipSettings
from rackplane.log import get_logger
from rackplane.pair import PairSync, sync_key
from tests.unit.test_commands import error_code, make_rig
from valvey.core.supply_loop import SupplyLoop
from valvey.core.supply_loop_settings import SupplyLoopSettings
from valvey.persist import CommandState, sync_command_state

# --- the record ---------------------------------------------------------------------------


def test_record_round_trips_and_bad_records_are_refused() -> None:
    rec = SyncRecord(7, 3, "a/x", ({"user": "u"},), ({"output": "v"},), {"k": 1}, True)
    assert SyncRecord.decode(rec.encode()) == rec
    for raw in (b"nope", b"[]", b'{"epoch":0,"seq":1,"owner":"a"}',
                b'{"epoch":1,"seq":true,"owner":"a"}', b'{"epoch":1,"seq":1,"owner":3}',
                b'{"epoch":1,"seq":1,"owner":"a","commands":{}}',
                b'{"epoch":1,"seq":1,"owner":"a","state":[]}',
                b'{"epoch":1,"seq":1,"owner":"a","released":1}'):
        with pytest.raises(ValueError):
            SyncRecord.decode(raw)


def test_follower_ignores_older_epochs_and_repeated_or_older_seqs() -> None:
    f = SyncFollower()
    assert f.offer(SyncRecord(5, 1, "a/1"), 1.0)
    assert not f.offer(SyncRecord(5, 1, "a/1"), 2.0)  # the same record read again
    assert f.applied_at_s == 1.0  # ... says nothing of now (a dead active's last record)
    assert f.offer(SyncRecord(5, 2, "a/1"), 3.0)
    assert not f.offer(SyncRecord(4, 99, "b/1"), 4.0)  # an older tenure: ignored
    assert f.ignored_stale == 1
    assert f.offer(SyncRecord(9, 1, "b/2"), 5.0)  # a newer tenure, its seq from 1
    assert not f.offer(SyncRecord(5, 3, "a/1"), 6.0)
    assert (f.newest_epoch, f.last_seq, f.applied, f.ignored_stale) == (9, 1, 3, 2)


def test_pacer_writes_on_change_at_most_every_min_interval_and_at_least_every_heartbeat() -> None:
    p = SyncPacer(0.25, 2.0)
    assert p.due(0.0, ("x",))
    p.written(0.0, ("x",))
    assert not p.due(0.1, ("y",))  # changed, too soon
    assert p.due(0.25, ("y",))
    assert not p.due(1.9, ("x",))  # unchanged
    assert p.due(2.0, ("x",))  # heartbeat
    p.reset()
    assert p.due(2.01, ("x",))
    # a lease's time left counting down is no change (the heartbeat carries it)
    lease = {"output": "v", "holder": "alice", "role": "operator", "reason": None}
    r1 = SyncRecord(1, 1, "a", leases=({**lease, "remaining_s": 30.0},))
    r2 = SyncRecord(1, 2, "a", leases=({**lease, "remaining_s": 29.9},))
    r3 = SyncRecord(1, 3, "a", leases=({**lease, "holder": "bob", "remaining_s": 29.9},))
    assert r1.content() == r2.content() != r3.content()
    with pytest.raises(ValueError):
        SyncPacer(3.0, 2.0)


def test_pair_alarms_raise_and_clear_on_their_bounds() -> None:
    a = PairAlarms(sync_max_age_s=10.0, renew_late_s=1.0, no_active_after_s=17.0, start_s=0.0)
    kw: dict[str, Any] = {"renew_latency_s": None, "holder_seen": True, "holder_expired": False}
    assert a.update(5.0, standby=True, synced_at_s=None, **kw) == []
    assert a.update(10.5, standby=True, synced_at_s=None, **kw) == [
        ("standby_not_in_sync", True)]
    assert a.update(11.0, standby=True, synced_at_s=10.9, **kw) == [
        ("standby_not_in_sync", False)]
    assert a.update(20.9, standby=True, synced_at_s=10.9, **kw) == []  # exactly 10 s: not yet
    # the active: renewals late above the bound, never the standby's alarms
    assert a.update(30.0, standby=False, synced_at_s=None, renew_latency_s=1.2,
                    holder_seen=True, holder_expired=False) == [("lease_renewals_late", True)]
    assert a.update(31.0, standby=False, synced_at_s=None, renew_latency_s=0.9,
                    holder_seen=True, holder_expired=False) == [("lease_renewals_late", False)]
    # no holder (key absent, or its record expired) for longer than lease + margin
    b = PairAlarms(1e9, 1.0, 17.0, 0.0)
    assert b.update(0.0, standby=True, synced_at_s=0.0, renew_latency_s=None,
                    holder_seen=False, holder_expired=False) == []
    assert b.update(17.0, standby=True, synced_at_s=0.0, renew_latency_s=None,
                    holder_seen=True, holder_expired=True) == []
    assert b.update(17.1, standby=True, synced_at_s=0.0, renew_latency_s=None,
                    holder_seen=True, holder_expired=True) == [("no_active_controller", True)]
    assert b.update(18.0, standby=True, synced_at_s=0.0, renew_latency_s=None,
                    holder_seen=True, holder_expired=False) == [("no_active_controller", False)]


def test_pair_alarm_ids_are_per_instance_and_recognised_for_the_reconciliation() -> None:
    ids = [d.id for d in pair_alarm_defs("b")]
    assert ids == ["standby_not_in_sync:b", "lease_renewals_late:b", "no_active_controller:b"]
    assert all(is_pair_alarm(i) for i in ids)
    assert not is_pair_alarm("standby_not_in_sync")  # a core alarm of that name: not ours
    assert not is_pair_alarm("supply_temp_deviation:x")


# --- what the record carries ----------------------------------------------------------------


def test_a_retried_request_id_gets_the_first_reply_from_the_other_instance() -> None:
    active, standby = make_rig(), make_rig()
    first = active.call("set_setpoint", {"setpoint_c": 41.0}, rid="sp-1")
    assert first["ok"]
    entries = active.router.export_seen(active.clock.monotonic(), 256)
    assert [e["request_id"] for e in entries] == ["sp-1"]
    assert standby.router.import_seen(entries, standby.clock.monotonic()) == 1
    assert standby.router.import_seen(entries, standby.clock.monotonic()) == 0  # known
    sp_before = standby.core.loop.setpoint_c
    again = standby.call("set_setpoint", {"setpoint_c": 41.0}, rid="sp-1")
    assert again == first
    assert standby.core.loop.setpoint_c == sp_before  # not executed a second time
    other = standby.call("set_setpoint", {"setpoint_c": 42.0}, rid="sp-1")
    assert error_code(other) == "request_id_reused"
    # entries older than the command TTL (plus skew) are left out: a retry is expired anyway
    ttl = active.router.settings.ttl_s + active.router.settings.clock_skew_s
    assert active.router.export_seen(active.clock.monotonic() + ttl + 1.0, 256) == []
    assert standby.router.import_seen([{"user": "u"}, {"fingerprint": "zz"}], 0.0) == 0


def test_remember_applied_builds_the_entry_the_router_would_keep() -> None:
    rig = make_rig()
    reply = rig.call("set_setpoint", {"setpoint_c": 41.0}, rid="sp-2")
    kept = rig.router.export_seen(rig.clock.monotonic(), 10)[-1]
    built = rig.router.remember_applied("alice", "sp-2", "set_setpoint",
                                        {"setpoint_c": 41.0}, reply)
    assert built == kept


def test_leases_carried_with_their_time_left() -> None:
    a = LeaseTable({"valve": "", "pump": ""})
    a.acquire("valve", "alice", "operator", now=100.0, ttl_s=60.0, reason="work")
    exported = a.export(130.0)
    assert exported == [{"output": "valve", "holder": "alice", "role": "operator",
                         "remaining_s": 30.0, "reason": "work"}]
    b = LeaseTable({"valve": "", "pump": ""})
    b.acquire("pump", "bms", "automation", now=0.0, ttl_s=600.0)
    bad = [{"output": "nope", "holder": "x", "role": "operator", "remaining_s": 5},
           {"output": "pump", "holder": "x", "role": "reader", "remaining_s": 5},
           {"output": "pump", "holder": "x", "role": "operator", "remaining_s": float("nan")}]
    assert b.restore(exported + bad, 5000.0) == ["valve"]
    lease = b.holder("valve", 5029.0)
    assert lease is not None and lease.holder == "alice"
    assert b.holder("valve", 5030.0) is None
    assert b.holder("pump", 5000.0) is None  # the active holds none on it: gone here too
    assert b.drain_events()[-1].kind == "acquired"  # only the local acquire: no sync events


def test_standby_follows_setpoint_shadow_and_manual_back_and_forth() -> None:
    file = SupplyLoopSettings()
    loop = SupplyLoop(file)

    def st(sp: float, manual: float | None = None, shadow: bool = False,
           file_sp: float = file.setpoint_c) -> CommandState:
        return CommandState("o", sp, file_sp, manual, shadow, file.shadow)

    assert sync_command_state(loop, file, st(41.0)) == (["setpoint_c"], [])
    assert loop.setpoint_c == 41.0
    assert sync_command_state(loop, file, st(file.setpoint_c)) == (["setpoint_c"], [])
    assert loop.setpoint_c == file.setpoint_c  # back to the config's value: followed too
    assert sync_command_state(loop, file, st(45.0, manual=30.0)) == (
        ["manual_output_pct"], [])
    assert loop.manual_target_pct == 30.0
    assert sync_command_state(loop, file, st(45.0)) == (["auto"], [])
    assert loop.manual_target_pct is None
    changed, superseded = sync_command_state(loop, file, st(40.0, file_sp=44.0))
    assert changed == [] and superseded and loop.setpoint_c == file.setpoint_c
    changed, superseded = sync_command_state(loop, file, st(99.0))
    assert changed == [] and superseded[0].startswith("setpoint_c: out_of_range")


def test_read_soon_starts_the_next_cycle_now_but_never_shortens_an_expiry() -> None:
    t = LeaseTiming(lease_s=3.0, renew_every_s=0.5, renew_deadline_s=2.0, retry_every_s=0.2,
                    election_max_s=1.0)
    lease = LeaderLease("b/1", t)
    step = lease.step(0.0)
    assert step.op is Op.PROBE
    lease.write_done(0.01, 1)
    assert lease.step(0.01).op is Op.READ
    rec = b'{"owner":"a/1","seq":1,"epoch":0,"lease_s":3.0}'
    lease.read_done(0.02, 5, rec)  # someone holds it: next cycle in 0.5 s
    assert lease.step(0.03).op is Op.WAIT
    lease.read_soon(0.03)
    assert lease.step(0.03).op is Op.PROBE  # at once
    lease.write_done(0.04, 6)
    assert lease.step(0.04).op is Op.READ
    lease.read_done(0.05, 5, rec)  # the same revision: still timed from 0.02
    assert lease.step(0.06).op is Op.WAIT  # not taken over
    assert not lease.may_write(0.06)
    # a hint while a step is in flight: one more cycle right after it
    assert lease.step(0.6).op is Op.PROBE
    lease.read_soon(0.61)
    lease.write_done(0.62, 7)
    assert lease.step(0.62).op is Op.READ
    lease.read_done(0.63, 5, rec)  # answered before the release landed
    assert lease.step(0.64).op is Op.PROBE  # not 0.5 s later
    lease.write_done(0.65, 8)
    assert lease.step(0.65).op is Op.READ
    lease.read_done(0.66, None, None)  # the key is gone: acquire
    assert lease.step(0.66).op is Op.CREATE


# --- the sync task and the handover on an in-memory store ---------------------------------


class MemKv:
    def __init__(self) -> None:
        self.data: dict[str, tuple[int, bytes]] = {}
        self.rev = 0
        self.fail = False

    def _next(self, key: str, value: bytes) -> int:
        if self.fail:
            raise KvUnknown("down")
        self.rev += 1
        self.data[key] = (self.rev, value)
        return self.rev

    async def read(self, key: str) -> tuple[int, bytes] | None:
        if self.fail:
            raise KvUnknown("down")
        return self.data.get(key)

    async def create(self, key: str, value: bytes) -> int:
        if key in self.data:
            raise KvConflict(key)
        return self._next(key, value)

    async def update(self, key: str, value: bytes, last: int) -> int:
        if self.data.get(key, (0, b""))[0] != last:
            raise KvConflict(key)
        return self._next(key, value)

    async def put(self, key: str, value: bytes) -> int:
        return self._next(key, value)

    async def delete(self, key: str, last: int) -> None:
        if self.data.get(key, (0, b""))[0] != last:
            raise KvConflict(key)
        del self.data[key]


class FakeFrame:
    """What `PairSync` asks of the daemon frame: a router, a lease runner, the record's parts
    (a counter standing for the daemon's state) and where the standby lays a record."""

    def __init__(self, runner: LeaseRunner, router: Any) -> None:
        self.runner = runner
        self.clock = runner.clock
        self.log = get_logger("test")
        self.commands = router
        self.value = 0
        self.applied: list[SyncRecord] = []

    @property
    def controller_epoch(self) -> int:
        return self.runner.epoch

    def may_write(self, now: float) -> bool:
        return self.runner.may_write(now)

    def sync_record_parts(self, n: int) -> tuple[list[Any], list[Any], dict[str, Any]]:
        return [], [], {"value": self.value}

    def apply_sync(self, rec: SyncRecord, now: float) -> None:
        self.applied.append(rec)
        self.value = rec.state["value"]


LS = LeadershipSettings(enabled=True, lease_s=3.0, renew_every_s=0.5, renew_deadline_s=2.0,
                        retry_every_s=0.2, election_max_s=1.0, request_timeout_s=0.5,
                        sync_min_interval_s=0.1)


async def test_sync_catch_up_and_handover_on_an_in_memory_store() -> None:
    kv = MemKv()
    sides = {}
    tasks = []
    for inst in "ab":
        runner = LeaseRunner(kv, "lab.r1.valvey", inst, LS.timing())
        frame = FakeFrame(runner, make_rig().router)
        sync = PairSync(frame, LS)  # type: ignore[arg-type]
        sync.attach(kv, runner)
        sides[inst] = (runner, frame, sync)
        tasks.append(asyncio.create_task(runner.run()))
        await asyncio.sleep(0.05)  # "a" first: it acquires the absent key
    tasks += [asyncio.create_task(s.run()) for _r, _f, s in sides.values()]
    try:
        ra, fa, sa = sides["a"]
        rb, fb, sb = sides["b"]
        await _until(lambda: sa.ready(ra.epoch), "a caught up")
        assert rb.epoch == 0
        fa.value = 41
        sa.tick(ra.clock.monotonic())
        await _until(lambda: fb.value == 41, "b following a")
        # handover: a's last record (released, with the command's own reply), then release
        rig = make_rig()
        ctx = CommandContext("alice", "operator", "handover", "ho-1", 0, 0.0, 0, 0.0)
        fa.commands = rig.router
        e1 = ra.epoch
        state = await sa.handover(HandoverArgs(reason="x"), ctx)
        assert state == {"released_epoch": e1, "instance": "a"}
        assert not ra.may_write(ra.clock.monotonic())
        await _until(lambda: sb.ready(rb.epoch), "b taking over")
        last = fb.applied[-1]
        assert last.released and last.commands[-1]["request_id"] == "ho-1"
        assert last.commands[-1]["reply"]["state"] == state
        assert rb.epoch > state["released_epoch"]
        # a, now standby, refuses a second handover
        with pytest.raises(CommandError) as err:
            await sa.handover(HandoverArgs(), ctx)
        assert err.value.code == "not_active"
        # a record of an older tenure is ignored by the new standby (a)
        kv.data[sync_key("lab.r1.valvey")] = (999, SyncRecord(1, 99, "x/1", state={
            "value": -1}).encode())
        await asyncio.sleep(0.3)
        assert fa.value != -1
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_handover_refused_when_the_store_does_not_confirm_the_record() -> None:
    kv = MemKv()
    runner = LeaseRunner(kv, "lab.r2.valvey", "a", LS.timing())
    frame = FakeFrame(runner, make_rig().router)
    sync = PairSync(frame, LS)  # type: ignore[arg-type]
    sync.attach(kv, runner)
    tasks = [asyncio.create_task(runner.run()), asyncio.create_task(sync.run())]
    try:
        await _until(lambda: sync.ready(runner.epoch), "a active")
        kv.fail = True
        ctx = CommandContext("alice", "operator", "handover", "ho-2", 0, 0.0, 0, 0.0)
        with pytest.raises(CommandError) as err:
            await sync.handover(HandoverArgs(), ctx)
        assert err.value.code == "unavailable"
        assert runner.may_write(runner.clock.monotonic())  # nothing released
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _until(cond: Any, what: str, timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not cond():
        assert loop.time() < end, what
        await asyncio.sleep(0.02)
