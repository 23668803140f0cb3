"""rackplane.core.leases: who may move an output (DESIGN §1 "Outputs are owned": active safety
interlocks always win; below them leases decide, operator > automation, each with an expiry and
an explicit release; the state shows the holder). Pure: time is passed in."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rackplane.commands import LeasesState
from rackplane.core.leases import LEASE_CODES, PRIORITY, LeaseTable
from rackplane.errors import CommandError


def code_of(fn: Any, *args: Any, **kw: Any) -> str:
    with pytest.raises(CommandError) as err:
        fn(*args, **kw)
    assert err.value.code in LEASE_CODES
    return str(err.value.code)


def table(**kw: Any) -> LeaseTable:
    return LeaseTable({"valve": "facility valve, manual output", "pump_lead": ""}, **kw)


def test_acquire_renew_release_with_events_and_holder_in_state() -> None:
    t = table(default_ttl_s=600.0)
    lease = t.acquire("valve", "alice", "operator", now=100.0, reason="commissioning")
    assert (lease.holder, lease.role, lease.priority) == ("alice", "operator", 2)
    assert lease.expires_mono == 700.0
    t.check("valve", "alice", "operator", 150.0, require_lease=True)  # the holder may move it
    renewed = t.acquire("valve", "alice", "operator", now=200.0, ttl_s=60.0)
    assert renewed.acquired_mono == 100.0 and renewed.expires_mono == 260.0
    snap = t.snapshot(210.0)
    assert snap["valve"] == {
        "holder": "alice", "role": "operator", "priority": 2, "expires_in_s": 50.0,
        "held_for_s": 110.0, "reason": None, "interlock": None,
        "description": "facility valve, manual output",
    }
    assert snap["pump_lead"]["holder"] is None and snap["pump_lead"]["description"] is None
    LeasesState.model_validate(snap)  # the published state/leases schema
    released = t.release("valve", "alice", "operator", now=220.0)
    assert released is not None and t.holder("valve", 221.0) is None
    assert [e.kind for e in t.drain_events()] == ["acquired", "renewed", "released"]
    assert t.drain_events() == []  # each change reported once
    assert t.release("valve", "alice", "operator", now=230.0) is None  # no-op when free


def test_operator_preempts_automation_never_the_reverse() -> None:
    t = table()
    t.acquire("valve", "bms", "automation", now=0.0, ttl_s=300.0)
    assert code_of(t.check, "valve", "alice", "operator", 1.0) == "lease_held"
    with pytest.raises(CommandError, match=r"leased to 'bms' \(automation\) for another 299 s"):
        t.check("valve", "alice", "operator", 1.0)
    t.acquire("valve", "alice", "operator", now=2.0)  # operator > automation
    events = t.drain_events()
    assert [(e.kind, e.holder, e.by) for e in events] == [
        ("acquired", "bms", "bms"), ("preempted", "bms", "alice"), ("acquired", "alice", "alice")]
    assert code_of(t.acquire, "valve", "bms", "automation", 3.0) == "lease_held"
    assert code_of(t.check, "valve", "bms", "automation", 3.0) == "lease_held"
    # Equal priority never preempts: the holder must release or let it expire.
    assert code_of(t.acquire, "valve", "bob", "operator", 4.0) == "lease_held"
    assert PRIORITY["operator"] > PRIORITY["automation"] > PRIORITY["reader"]


def test_active_interlock_overrides_every_lease() -> None:
    t = table()
    t.acquire("valve", "alice", "operator", now=0.0)
    t.set_interlocks({"valve": "leak_tray_03", "not_leasable": "x"})
    assert t.interlocks == {"valve": "leak_tray_03"}  # outputs never leased are ignored
    # Even the holder cannot move it, with or without require_lease.
    with pytest.raises(CommandError, match="safety interlock 'leak_tray_03'") as err:
        t.check("valve", "alice", "operator", 1.0, require_lease=True)
    assert err.value.code == "interlock_active"
    assert code_of(t.check, "valve", "bob", "operator", 1.0) == "interlock_active"
    # Taking the lease is still possible (the state shows the interlock); moving is not.
    t.acquire("pump_lead", "bob", "operator", now=1.0)
    t.set_interlocks({"pump_lead": "no_standby_pump"})
    assert t.snapshot(1.0)["pump_lead"]["interlock"] == "no_standby_pump"
    assert t.snapshot(1.0)["valve"]["interlock"] is None
    t.check("valve", "alice", "operator", 2.0)  # cleared: the holder moves it again
    t.set_interlocks({})
    t.check("pump_lead", "bob", "operator", 2.0)


def test_require_lease_and_free_outputs() -> None:
    t = table()
    t.check("valve", "alice", "operator", 0.0)  # free and not required: allowed
    with pytest.raises(CommandError, match=r'acquire_lease \{"output": "valve"\} first') as e:
        t.check("valve", "alice", "operator", 0.0, require_lease=True)
    assert e.value.code == "lease_required"
    t.acquire("valve", "bms", "automation", now=0.0, ttl_s=10.0)
    assert code_of(t.check, "valve", "alice", "operator", 5.0, require_lease=True) == "lease_held"


def test_expiry_is_exact_lazy_and_reported_once() -> None:
    t = table()
    t.acquire("valve", "bms", "automation", now=0.0, ttl_s=30.0)
    assert t.holder("valve", 29.999) is not None
    assert t.holder("valve", 30.0) is None  # expired at its expiry, even before expire()
    t.check("valve", "alice", "operator", 30.0)
    t.drain_events()
    expired = t.expire(30.5)
    assert [(e.kind, e.holder, e.by) for e in expired] == [("expired", "bms", None)]
    assert t.expire(31.0) == []
    assert [e.kind for e in t.drain_events()] == ["expired"]
    # An expired lease never blocks a new one, and the new holder is reported.
    t.acquire("valve", "bms", "automation", now=40.0, ttl_s=5.0)
    t.acquire("valve", "alice", "operator", now=46.0)
    assert [e.kind for e in t.drain_events()] == ["acquired", "expired", "acquired"]


@pytest.mark.parametrize("ttl", [0.0, -1.0, 28_800.1, math.nan, math.inf])
def test_ttl_bounds_from_config(ttl: float) -> None:
    t = table(default_ttl_s=600.0, max_ttl_s=28_800.0)
    assert code_of(t.acquire, "valve", "alice", "operator", 0.0, ttl) == "invalid_lease_ttl"
    assert t.holder("valve", 0.0) is None and t.drain_events() == []


def test_set_limits_validates_and_applies_to_new_leases() -> None:
    t = table()
    t.set_limits(60.0, 120.0)
    assert t.acquire("valve", "alice", "operator", 0.0).expires_mono == 60.0
    assert code_of(t.acquire, "valve", "alice", "operator", 0.0, 121.0) == "invalid_lease_ttl"
    for bad in ((0.0, 10.0), (20.0, 10.0), (math.nan, 10.0), (1.0, math.inf)):
        with pytest.raises(ValueError):
            t.set_limits(*bad)


def test_release_by_others_needs_force_and_the_operator_role() -> None:
    t = table()
    t.acquire("valve", "bob", "operator", now=0.0)
    assert code_of(t.release, "valve", "alice", "operator", 1.0) == "lease_held"
    assert code_of(t.release, "valve", "bms", "automation", 1.0, force=True) == "forbidden"
    broken = t.release("valve", "alice", "operator", 2.0, force=True)
    assert broken is not None and broken.holder == "bob"
    assert [(e.kind, e.holder, e.by) for e in t.drain_events()][-1] == ("broken", "bob", "alice")


def test_readers_unknown_outputs_and_bad_config() -> None:
    t = table()
    assert code_of(t.acquire, "valve", "rita", "reader", 0.0) == "forbidden"
    with pytest.raises(CommandError, match="leasable outputs: valve, pump_lead") as err:
        t.check("nozzle", "alice", "operator", 0.0)
    assert err.value.code == "unknown_output"
    assert code_of(t.acquire, "nozzle", "alice", "operator", 0.0) == "unknown_output"
    for bad in (["Valve"], ["a/b"], ["v", "v"], [""]):
        with pytest.raises(ValueError):
            LeaseTable(bad)
    assert LeaseTable(iter(["valve", "tray:07"])).outputs == ["valve", "tray:07"]


_op = st.tuples(
    st.sampled_from(["acquire", "release", "force", "check", "interlock", "expire"]),
    st.sampled_from(["valve", "pump_lead"]),
    st.sampled_from([("alice", "operator"), ("bob", "operator"), ("bms", "automation")]),
    st.floats(0.0, 50.0),
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(ops=st.lists(_op, max_size=40))
def test_invariants_under_any_sequence(ops: list[Any]) -> None:
    """Whatever happens: at most one holder per output, only it may move it, never while an
    interlock is active, a lower priority never takes a higher one's lease, and every refusal
    is a lease code."""
    t = table(default_ttl_s=20.0, max_ttl_s=40.0)
    now = 0.0
    interlocked: dict[str, str] = {}
    for kind, output, (user, role), step in ops:
        now += step
        before = t.holder(output, now)
        try:
            if kind == "acquire":
                lease = t.acquire(output, user, role, now)
                assert before is None or before.holder == user or \
                    PRIORITY[role] > before.priority
                assert t.holder(output, now) == lease
            elif kind in ("release", "force"):
                t.release(output, user, role, now, force=kind == "force")
                assert t.holder(output, now) is None
            elif kind == "check":
                t.check(output, user, role, now)
                assert output not in interlocked
                assert before is None or before.holder == user
            elif kind == "interlock":
                interlocked = {} if interlocked else {output: "trip"}
                t.set_interlocks(interlocked)
            else:
                t.expire(now)
        except CommandError as err:
            assert err.code in LEASE_CODES
        snap = t.snapshot(now)
        LeasesState.model_validate(snap)
        for name, entry in snap.items():
            assert entry["interlock"] == interlocked.get(name)
            if entry["holder"] is not None:
                assert entry["expires_in_s"] > 0
