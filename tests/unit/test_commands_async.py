"""The command router beyond the synchronous verbs: async handlers (blocking work off the loop,
FIELD-CASES BR-24 b), the test-only verb behind RACKPLANE_TEST_VERBS, the generic lease verbs
(DESIGN §1 leases) and the limit hook. No broker: the rig of tests/unit/test_commands.py (a
never-connected MqttLink, replies captured)."""

from __future__ import annotations

import asyncio
import itertools
import math
from dataclasses import replace
from typing import Any

import pytest

from rackplane.commands import (
    TEST_VERBS_ENV,
    CommandArgs,
    CommandContext,
    LeaseGate,
    LeasesState,
    NoArgs,
    contract_of,
    register_lease_verbs,
    require_within,
)
from rackplane.core.leases import LeaseTable
from rackplane.errors import CommandError
from tests.unit.test_commands import Rig, error_code, make_rig

_MIDS = itertools.count(1)


async def handle(rig: Rig, verb: str, args: dict[str, Any] | None = None, **kw: Any
                 ) -> dict[str, Any]:
    msg = replace(rig.msg(verb, args, **kw), mid=next(_MIDS))  # tells concurrent calls apart
    await rig.router.handle(msg)
    mine = [r for m, r in rig.replies if m.mid == msg.mid]
    assert len(mine) == 1, "exactly one reply per command"
    return mine[0]


async def test_async_handler_is_awaited_and_answered_once() -> None:
    rig = make_rig()
    gate = asyncio.Event()
    calls: list[str] = []

    def slow(_args: NoArgs, ctx: CommandContext) -> Any:
        async def work() -> dict[str, Any]:
            await gate.wait()
            calls.append(ctx.request_id)
            return {"done": True, "nan": math.nan}
        return work()

    rig.router.register("slow", NoArgs, slow, role="operator")
    first = asyncio.create_task(handle(rig, "slow", {}, rid="s-1"))
    await asyncio.sleep(0.01)
    assert not first.done() and calls == []
    # The same request while the first copy is still being handled: refused, not run twice.
    busy = await handle(rig, "slow", {}, rid="s-1")
    assert error_code(busy) == "in_progress" and busy["state"] is None
    gate.set()
    reply = await first
    assert reply["ok"] is True and reply["state"] == {"done": True, "nan": None}
    again = await handle(rig, "slow", {}, rid="s-1")  # now a plain duplicate
    assert again == reply and calls == ["s-1"]
    assert [a.outcome for a in rig.audits] == ["in_progress", "ok", "duplicate"]
    st = rig.router.stats
    assert (st.applied, st.duplicates, st.refused) == (1, 1, {"in_progress": 1})


@pytest.mark.parametrize(("exc", "code"), [
    (CommandError("device_busy", "the CDU refused the write"), "device_busy"),
    (OSError("bus error"), "internal_error"),
])
async def test_async_handler_failure_is_a_refusal(exc: Exception, code: str) -> None:
    rig = make_rig()

    def failing(_args: NoArgs, _ctx: CommandContext) -> Any:
        async def work() -> dict[str, Any]:
            await asyncio.sleep(0)
            raise exc
        return work()

    rig.router.register("failing", NoArgs, failing)
    reply = await handle(rig, "failing", {}, rid="f-1")
    assert error_code(reply) == code and reply["state"] is None
    assert (await handle(rig, "failing", {}, rid="f-1")) == reply  # remembered as refused
    if code == "internal_error":
        assert rig.log.named("command_handler_failed")


async def _ticks_during(rig: Rig, args: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """How many 10 ms ticks another task got while ``test_block`` ran."""
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    t = asyncio.create_task(ticker())
    await asyncio.sleep(0.02)
    start = ticks
    reply = await handle(rig, "test_block", args, rid=f"b-{args['mode']}")
    during = ticks - start
    t.cancel()
    return during, reply


async def test_test_block_verb_only_behind_the_env_flag_sync_blocks_thread_does_not() -> None:
    plain = make_rig()
    plain.router.attach(environ={})
    assert "test_block" not in plain.router.verbs
    rig = make_rig()
    rig.router.attach(environ={TEST_VERBS_ENV: "1"})
    assert rig.router.verbs["test_block"] == "operator"
    assert rig.log.named("command_test_verbs_enabled")
    during, reply = await _ticks_during(rig, {"seconds": 0.3, "mode": "thread"})
    assert reply["ok"] and reply["state"] == {"slept_s": 0.3, "mode": "thread"}
    assert during >= 10  # the loop ran on (BR-24 b fixed design)
    during, reply = await _ticks_during(rig, {"seconds": 0.3, "mode": "sync"})
    assert reply["ok"] and during <= 1  # the loop was blocked (BR-24 b broken design)
    assert error_code(await handle(rig, "test_block", {"seconds": 31, "mode": "thread"},
                                   rid="b-long")) == "out_of_range"
    assert "test_block" not in contract_of(rig.router).verbs  # never part of the contract


async def test_lease_verbs_through_the_router() -> None:
    rig = make_rig({"users": {"alice": "operator", "bob": "operator", "bms": "automation",
                              "viewer": "reader"},
                    "lease_default_ttl_s": 60.0, "lease_max_ttl_s": 120.0})
    table = LeaseTable({"valve": "facility valve"})
    published: list[dict[str, Any]] = []
    register_lease_verbs(rig.router, table,
                         on_change=lambda t: published.append(t.snapshot(0.0)))

    class MoveArgs(CommandArgs):
        output_pct: float

    moved: list[float] = []

    def move(args: MoveArgs, ctx: CommandContext) -> dict[str, Any]:
        require_within("output_pct", args.output_pct, 0.0, 80.0, "%")
        table.check("valve", ctx.user, ctx.role, ctx.now_mono, require_lease=True)
        moved.append(args.output_pct)
        return {"output_pct": args.output_pct}

    rig.router.register("move", MoveArgs, move, role="automation")
    assert rig.router.verbs["acquire_lease"] == "automation"

    assert error_code(rig.call("move", {"output_pct": 10.0}, user="bms", rid="m0")) \
        == "lease_required"
    got = rig.call("acquire_lease", {"output": "valve", "reason": "BMS schedule"}, user="bms",
                   rid="a1")
    assert got["ok"] and got["state"]["lease"]["holder"] == "bms"
    assert got["state"]["lease"]["expires_in_s"] == 60.0  # commands.lease_default_ttl_s
    assert got["state"]["leases"]["valve"]["reason"] == "BMS schedule"
    assert rig.call("move", {"output_pct": 10.0}, user="bms", rid="m1")["ok"]
    assert error_code(rig.call("move", {"output_pct": 20.0}, user="alice", rid="m2")) \
        == "lease_held"
    assert error_code(rig.call("acquire_lease", {"output": "valve", "ttl_s": 500.0},
                               user="alice", rid="a2")) == "invalid_lease_ttl"
    assert rig.call("acquire_lease", {"output": "valve"}, user="alice", rid="a3")["ok"]
    assert error_code(rig.call("move", {"output_pct": 30.0}, user="bms", rid="m3")) \
        == "lease_held"
    assert error_code(rig.call("move", {"output_pct": 95.0}, user="alice", rid="m4")) \
        == "out_of_range"  # config limits before anything else
    table.set_interlocks({"valve": "leak_tray_03"})
    assert error_code(rig.call("move", {"output_pct": 30.0}, user="alice", rid="m5")) \
        == "interlock_active"
    table.set_interlocks({})
    assert rig.call("move", {"output_pct": 30.0}, user="alice", rid="m6")["ok"]
    assert error_code(rig.call("acquire_lease", {"output": "valve"}, user="viewer",
                               rid="a4")) == "forbidden"  # role from config: reader
    assert error_code(rig.call("release_lease", {"output": "valve"}, user="bob",
                               rid="r1")) == "lease_held"
    forced = rig.call("release_lease", {"output": "valve", "force": True}, user="bob", rid="r2")
    assert forced["ok"] and forced["state"]["released"] is True
    assert forced["state"]["lease"]["holder"] == "alice"
    noop = rig.call("release_lease", {"output": "valve"}, user="bob", rid="r3")
    assert noop["ok"] and noop["state"]["released"] is False
    assert moved == [10.0, 30.0]
    assert len(published) == 3  # acquire, acquire (preempt), forced release
    kinds = [e.kind for e in table.drain_events()]
    assert kinds == ["acquired", "preempted", "acquired", "broken"]


def test_require_within_names_value_limits_and_unit() -> None:
    require_within("output_pct", 80.0, 0.0, 80.0, "%")
    with pytest.raises(CommandError, match=r"output_pct = 80.5 % is outside the configured "
                       r"limits \[0, 80\] %") as err:
        require_within("output_pct", 80.5, 0.0, 80.0, "%")
    assert err.value.code == "out_of_range"
    with pytest.raises(CommandError):
        require_within("x", math.nan, 0.0, 1.0)


def test_lease_gate_checks_publishes_holder_and_interlocks_and_logs_each_change_once() -> None:
    """`LeaseGate`: what a daemon wires (DESIGN §1): the verbs, the check before a handler
    mutates, interlocks from the tick overriding every lease, expiry, ``state/leases``
    published on change (and every refresh_s while held), each change logged once."""
    rig = make_rig({"users": {"alice": "operator", "bms": "automation"},
                    "lease_default_ttl_s": 30.0})
    published: list[tuple[str, dict[str, Any]]] = []
    rig.link.publish_state = lambda thing, payload: published.append((thing, dict(payload)))  # type: ignore[method-assign]
    gate = LeaseGate(rig.router, LeaseTable({"valve": "facility valve", "pump": "duty pump"}),
                     refresh_s=10.0, log=rig.log)
    moved: list[float] = []

    class MoveArgs(CommandArgs):
        output_pct: float

    def move(args: MoveArgs, ctx: CommandContext) -> dict[str, Any]:
        gate.check("valve", ctx, require_lease=True)  # before any change
        moved.append(args.output_pct)
        return {"output_pct": args.output_pct}

    rig.router.register("move", MoveArgs, move, role="automation")
    t0 = rig.clock.monotonic()
    gate.tick(t0, {})
    assert published[-1] == ("leases", gate.snapshot(t0))  # the initial, free state
    assert published[-1][1]["valve"]["holder"] is None
    gate.tick(t0 + 0.1, {})
    assert len(published) == 1  # nothing changed, nothing held: no re-publication

    assert rig.call("acquire_lease", {"output": "valve"}, user="bms", rid="a1")["ok"]
    assert len(published) == 2 and published[-1][1]["valve"]["holder"] == "bms"
    assert published[-1][1]["valve"]["role"] == "automation"
    assert rig.call("move", {"output_pct": 5.0}, user="bms", rid="m1")["ok"]
    assert error_code(rig.call("move", {"output_pct": 6.0}, user="alice", rid="m2")) \
        == "lease_held"

    # An interlock overrides the lease: shown in the state, every move refused.
    rig.clock.advance(1.0)
    gate.tick(rig.clock.monotonic(), {"valve": "supply_temp_high_interlock", "other": "x"})
    assert published[-1][1]["valve"]["interlock"] == "supply_temp_high_interlock"
    assert published[-1][1]["valve"]["holder"] == "bms"  # the lease is kept
    assert error_code(rig.call("move", {"output_pct": 7.0}, user="bms", rid="m3")) \
        == "interlock_active"
    n = len(published)
    gate.tick(rig.clock.monotonic(), {"valve": "supply_temp_high_interlock"})
    assert len(published) == n  # same interlocks: no change, no publication
    rig.clock.advance(10.0)
    gate.tick(rig.clock.monotonic(), None)  # None keeps the interlocks
    assert len(published) == n + 1  # refresh while held (expires_in_s counts down)
    assert published[-1][1]["valve"]["interlock"] == "supply_temp_high_interlock"
    gate.tick(rig.clock.monotonic(), {})
    assert published[-1][1]["valve"]["interlock"] is None

    # Expiry: dropped by the tick, logged once, state free again; no refresh after that.
    rig.clock.advance(30.0)
    gate.tick(rig.clock.monotonic(), {})
    assert published[-1][1]["valve"]["holder"] is None
    n = len(published)
    rig.clock.advance(20.0)
    gate.tick(rig.clock.monotonic(), {})
    assert len(published) == n
    assert error_code(rig.call("move", {"output_pct": 8.0}, user="bms", rid="m4")) \
        == "lease_required"
    kinds = [kw["kind"] for _lvl, _ev, kw in rig.log.named("lease")]
    assert kinds == ["acquired", "expired"]
    assert len(rig.log.named("lease_interlocks")) == 2  # set, then cleared
    assert moved == [5.0]
    for _thing, payload in published:
        LeasesState.model_validate(payload)  # the state-leases schema's model
