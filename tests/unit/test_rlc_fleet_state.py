"""rlc's FleetState (rlc/core/cycle.py): ledgers only from the store, write on change and renew
at ttl/3, a refused or unanswered write read again, unreachable racks held then reclaimed to
their floor with the old grant committed until expiry + margin + cap TTL."""

from __future__ import annotations

import json

import pytest

from rackplane.core.budget_leases import BudgetLease, RackReport
from rlc.core.allocation import AllocationSettings
from rlc.core.cycle import BudgetWrite, FleetState
from rlc.core.leases import LeaseTiming
from rlc.core.topology import TopologySettings, compile_topology

WALL = 1.8e9
TIMING = LeaseTiming(ttl_s=9.0, clock_margin_s=1.0, agent_cap_ttl_s=5.0)


def state(spread_spare: bool = False) -> FleetState:
    rack = {"floor_w": 20_000.0, "max_w": 80_000.0}
    topo = compile_topology(TopologySettings.model_validate({"site": "s", "halls": {"h": {
        "feed_limit_w": 1e6, "rows": {"r": {"limit_w": 100_000.0, "racks": {
            "ra": rack, "rb": dict(rack)}}}}}}))
    return FleetState(topo, TIMING, AllocationSettings(spread_spare=spread_spare), 2.0, 4.0,
                      100.0)


def report(st: FleetState, rack: str, demand_w: float, rev: int, mono: float,
           acked: tuple[int, int] | None = None) -> None:
    rec = RackReport(rack, demand_w, 0.0, 20_000.0, None, acked, True, WALL).as_record()
    st.on_report(rack, (rev, json.dumps(rec).encode()), mono)


def land(st: FleetState, writes: list[BudgetWrite], rev0: int) -> dict[str, tuple[int, bytes]]:
    """The writes landed: revisions from ``rev0``; returns the store's budget keys."""
    out = {}
    for i, w in enumerate(writes):
        st.write_done(w.rack, rev0 + i)
        out[w.rack] = (rev0 + i, w.record)
    return out


def lease_of(rec: bytes) -> BudgetLease:
    return BudgetLease.from_record(json.loads(rec)["lease"])


def test_no_cycle_before_the_ledgers_come_from_the_store() -> None:
    st = state()
    assert st.cycle(7, WALL, 0.0) == []
    st.restore(7, {"ra": None, "rb": None}, 0.0)
    assert st.cycle(8, WALL, 0.0) == []                   # another tenure: read again
    st.restore(8, {"ra": None, "rb": None}, 0.0)
    ws = st.cycle(8, WALL, 0.1)
    assert {w.rack for w in ws} == {"ra", "rb"}
    assert all(w.last_revision is None and w.seq == 1 for w in ws)  # created
    assert all(lease_of(w.record).epoch == 8 for w in ws)


def test_write_on_change_renew_at_a_third_of_the_ttl_and_restore_continues() -> None:
    st = state()
    st.restore(1, {"ra": None, "rb": None}, 0.0)
    report(st, "ra", 30_000.0, 1, 0.0)
    report(st, "rb", 30_000.0, 2, 0.0)
    store = land(st, st.cycle(1, WALL, 0.0), 10)          # no ramp limit: the demand at once
    assert {k: lease_of(v[1]).value_w for k, v in store.items()} == {"ra": 30_000.0,
                                                                   "rb": 30_000.0}
    report(st, "ra", 30_000.0, 3, 1.0)
    report(st, "rb", 30_000.0, 4, 1.0)
    assert st.cycle(1, WALL + 1.0, 1.0) == []             # unchanged: nothing written
    assert st.cycle(1, WALL + 2.9, 2.9) == []
    ws = st.cycle(1, WALL + 3.5, 3.5)                     # ttl/3 = 3 s after the last issue
    assert {w.rack for w in ws} == {"ra", "rb"}
    assert all(w.value_w == 30_000.0 and w.last_revision in (10, 11) for w in ws), ws
    store |= land(st, ws, 30)
    # a new leader restores from these records: seq continues, epoch is its own
    st2 = state()
    st2.restore(2, store, 100.0)
    report(st2, "ra", 30_000.0, 1, 100.0)
    report(st2, "rb", 30_000.0, 2, 100.0)
    ws2 = st2.cycle(2, WALL + 4.0, 100.0)
    assert ws2 == []                                      # within ttl/3 of the last issue
    ws2 = st2.cycle(2, WALL + 7.0, 103.0)
    assert sorted(w.seq for w in ws2) == [3, 3]
    assert all(lease_of(w.record).epoch == 2 and w.last_revision in (30, 31) for w in ws2)


def test_a_failed_write_reads_the_rack_again_before_any_cycle() -> None:
    st = state()
    st.restore(1, {"ra": None, "rb": None}, 0.0)
    ws = st.cycle(1, WALL, 0.0)
    st.write_done(ws[0].rack, 5)
    st.write_failed(ws[1].rack)
    assert st.needs_restore() == [ws[1].rack]
    assert st.cycle(1, WALL + 1, 1.0) == []
    st.restore(1, {ws[1].rack: (6, ws[1].record)}, 1.0)   # it did land after all
    assert st.needs_restore() == []
    assert st.ledgers[ws[1].rack].last_seq == 1


def test_unreachable_rack_held_then_reclaimed_its_grant_committed_until_expiry() -> None:
    st = state()
    st.restore(1, {"ra": None, "rb": None}, 0.0)
    report(st, "ra", 50_000.0, 1, 0.0)
    report(st, "rb", 50_000.0, 2, 0.0)
    land(st, st.cycle(1, WALL, 0.0), 10)
    land(st, st.cycle(1, WALL + 0.5, 0.5), 20)
    assert st.ledgers["rb"].grant_w == 50_000.0
    # rb stops reporting at 0.5 s; ra wants more
    t = 0.5
    grants: list[tuple[float, float, float, float]] = []
    rb_expiry_50 = 0.0
    while t < 30.0:
        t += 0.5
        report(st, "ra", 80_000.0, int(t * 10) + 100, t)
        ws = st.cycle(1, WALL + t, t)
        land(st, ws, int(t * 100))
        for w in ws:
            if w.rack == "rb" and w.value_w == 50_000.0:
                rb_expiry_50 = lease_of(w.record).expires_at_s - WALL
        grants.append((t, st.ledgers["ra"].grant_w, st.ledgers["rb"].grant_w,
                       st.ledgers["rb"].committed_w()))
    unr = [g for g in grants if 2.0 <= g[0] - 0.0 < 4.0]
    assert all(rb == 50_000.0 for _, _, rb, _ in unr)     # held while merely unreachable
    reclaimed = next(g for g in grants if g[2] == 20_000.0)
    assert reclaimed[0] == pytest.approx(4.0, abs=0.51)   # after reclaim_after_s
    assert reclaimed[3] == 50_000.0                       # the old grant still committed
    # ra gets rb's share only once rb's last 50 kW lease expired + margin + cap TTL
    released = next(g for g in grants if g[1] > 50_000.0)
    hold = TIMING.hold_after_expiry_s
    assert rb_expiry_50 + hold <= released[0] <= rb_expiry_50 + hold + 0.5
    assert max(g[1] + g[3] for g in grants) <= 100_000.0  # Σ committed within the row
    assert grants[-1][1] == 80_000.0 and grants[-1][2] == 20_000.0
    assert st.unreachable(30.0).tolist() == [False, True]


def test_a_reclaimed_rack_gets_no_spare_while_silent() -> None:
    """With ``spread_spare`` the row's spare goes to the racks that report, never to a rack
    reclaimed to its floor (it could not read a raise; an unreachable rack is never raised),
    and a reclaimed rack that reports again gets its share of the spare back."""
    st = state(spread_spare=True)
    st.restore(1, {"ra": None, "rb": None}, 0.0)
    report(st, "ra", 30_000.0, 1, 0.0)
    report(st, "rb", 30_000.0, 2, 0.0)
    t, rev = 0.0, 10
    rb_after_reclaim: list[float] = []
    while t < 40.0:                          # rb silent from 0 s; reclaimed at 4 s
        t += 0.5
        rev += 1
        report(st, "ra", 30_000.0, rev, t)
        land(st, st.cycle(1, WALL + t, t), rev * 10)
        if t >= 4.5:
            rb_after_reclaim.append(st.ledgers["rb"].grant_w)
    assert max(rb_after_reclaim) == 20_000.0                 # at its floor, never above
    assert st.ledgers["ra"].grant_w == 80_000.0              # the spare went to ra (its cap)
    report(st, "rb", 30_000.0, rev + 1, t)                   # rb reports again
    for k in range(40):
        rev += 2
        for i, r in enumerate(("ra", "rb")):   # both acknowledge their current leases
            cur = st.ledgers[r].current
            report(st, r, 30_000.0, rev + i, t + 0.5 * (k + 1),
                   acked=None if cur is None else cur.key)
        land(st, st.cycle(1, WALL + t + 0.5 * (k + 1), t + 0.5 * (k + 1)), rev * 10)
    assert st.ledgers["rb"].grant_w > 30_000.0               # its demand and a share of spare


def test_never_writes_under_an_older_epoch_than_the_lease_it_read() -> None:
    st = state()
    st.restore(1, {"ra": None, "rb": None}, 0.0)
    ws = st.cycle(1, WALL, 0.0)
    newer = {w.rack: (5, w.record) for w in ws}
    # a record written meanwhile by epoch 9 (a newer leader): this (stale) tenure restores it
    rec = json.loads(newer["ra"][1])
    rec["lease"]["epoch"] = 9
    rec["ledger"]["current"]["epoch"] = 9
    newer["ra"] = (6, json.dumps(rec).encode())
    st.forget()
    st.restore(1, newer, 1.0)
    ws = st.cycle(1, WALL + 5, 5.0)
    assert "ra" not in {w.rack for w in ws}


def test_an_old_report_seen_first_does_not_make_a_dead_rack_reachable() -> None:
    st = state()
    old = RackReport("ra", 60_000.0, 0.0, 20_000.0, None, None, True, WALL - 30.0).as_record()
    new = RackReport("rb", 60_000.0, 0.0, 20_000.0, None, None, True, WALL - 0.5).as_record()
    st.on_report("ra", (1, json.dumps(old).encode()), 100.0, WALL)
    st.on_report("rb", (2, json.dumps(new).encode()), 100.0, WALL)
    assert st.unreachable(100.0).tolist() == [True, False]
    assert st.demand_w(100.0)[0] == 20_000.0          # 29 s silent: reclaimed to its floor
    # a fresh write of ra's key: reachable again
    fresh = RackReport("ra", 60_000.0, 0.0, 20_000.0, None, None, True, WALL + 1).as_record()
    st.on_report("ra", (3, json.dumps(fresh).encode()), 101.0, WALL + 1)
    assert st.unreachable(101.0).tolist() == [False, False]
