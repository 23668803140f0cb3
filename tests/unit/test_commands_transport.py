"""The command router on a fake transport, no broker and no MQTT adapter: `CommandRouter` only
needs a `rackplane.commands.CommandTransport` (subscribe a handler to the command filter,
reply on the response topic or ``.../result``, publish a retained state). A fake records the
subscription and the replies; messages are delivered through the handler the router
subscribed, on a real asyncio loop.

DESIGN §1 (commands, leases), §3 (never acted on when retained or expired; one reply and one
audit per command), FIELD-CASES BR-22 a (a repeat is answered, never re-applied).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import subprocess
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import Field

from rackplane.clock import FakeClock
from rackplane.commands import (
    CommandArgs,
    CommandAudit,
    CommandContext,
    CommandReply,
    CommandRouter,
    CommandTransport,
    LeaseGate,
    NoArgs,
)
from rackplane.core.leases import LeaseTable
from rackplane.core.topics import Handler, Message, Topics
from rackplane.settings import CommandSettings, Identity

USERS = {"alice": "operator", "bms": "automation", "viewer": "reader"}


class FakeTransport:
    """A `CommandTransport` that records what the router asks of it."""

    def __init__(self, daemon: str = "valvey") -> None:
        self.daemon = daemon
        self.topics = Topics("rackplane", Identity(site="lab", rack="r1"), daemon)
        self.subscriptions: list[tuple[str, Handler, int, bool]] = []
        self.replies: list[tuple[str, bytes | None, dict[str, Any]]] = []
        self.states: list[tuple[str, dict[str, Any]]] = []

    def subscribe(self, topic_filter: str, handler: Handler, qos: int = 1, *,
                  retain_as_published: bool = False) -> None:
        self.subscriptions.append((topic_filter, handler, qos, retain_as_published))

    async def reply(self, request: Message, payload: Mapping[str, Any]) -> str:
        await asyncio.sleep(0)  # a real transport queues; let the loop run
        assert request.response_topic is not None  # the router always chooses the topic
        self.replies.append((request.response_topic, request.correlation_data,
                             json.loads(json.dumps(payload))))
        return request.response_topic

    def publish_state(self, thing: str, payload: Mapping[str, Any]) -> None:
        self.states.append((thing, json.loads(json.dumps(payload))))

    async def deliver(self, msg: Message) -> None:
        """Hand ``msg`` to the handler subscribed to the command filter, as a link would."""
        (topic_filter, handler, _qos, _rap), = self.subscriptions
        assert topic_filter == self.topics.cmd_filter
        result = handler(msg)
        if inspect.isawaitable(result):
            await result


class SetArgs(CommandArgs):
    value: float = Field(ge=0, le=100, allow_inf_nan=False)


class Rig:
    def __init__(self, **settings: Any) -> None:
        self.clock = FakeClock()
        self.transport = FakeTransport()
        self.audits: list[CommandAudit] = []
        self.applied: list[tuple[float, str]] = []
        self.router = CommandRouter(
            self.transport, CommandSettings(**{"users": USERS, **settings}), clock=self.clock,
            audit=self.audits.append,
        )

        def set_value(args: SetArgs, ctx: CommandContext) -> dict[str, Any]:
            self.applied.append((args.value, ctx.user))
            return {"value": args.value}

        self.router.register("set_value", SetArgs, set_value, role="operator")
        self.router.register("get_state", NoArgs, lambda a, c: {"n": len(self.applied)},
                             role="reader")
        self.router.attach(environ={})

    def msg(self, verb: str, args: Mapping[str, Any] | None = None, *, user: str = "alice",
            rid: str = "r-1", issued_offset_s: float = 0.0, retain: bool = False,
            dup: bool = False, response_topic: str | None = None,
            correlation_data: bytes | None = None) -> Message:
        issued = datetime.fromtimestamp(self.clock.wall_ns() / 1e9 + issued_offset_s, tz=UTC)
        env: dict[str, Any] = {"request_id": rid, "issued_at": issued.isoformat()}
        if args is not None:
            env["args"] = dict(args)
        return Message(topic=self.transport.topics.cmd(user, verb),
                       payload=json.dumps(env).encode(), qos=1, retain=retain, dup=dup,
                       received_mono=self.clock.monotonic(), response_topic=response_topic,
                       correlation_data=correlation_data)

    async def send(self, msg: Message) -> dict[str, Any]:
        n = len(self.transport.replies)
        await self.transport.deliver(msg)
        assert len(self.transport.replies) == n + 1, "exactly one reply per command"
        reply = self.transport.replies[-1][2]
        CommandReply.model_validate(reply)
        return reply


def test_the_fake_is_a_command_transport() -> None:
    transport: CommandTransport = FakeTransport()  # mypy checks the protocol here
    assert transport.topics.cmd_filter == "rackplane/lab/r1/valvey/cmd/+/+"


async def test_attach_subscribes_the_command_filter_with_retain_as_published() -> None:
    rig = Rig()
    assert [(f, q, rap) for f, _h, q, rap in rig.transport.subscriptions] == [
        ("rackplane/lab/r1/valvey/cmd/+/+", 1, True)]
    rig.router.attach(environ={})  # a second attach does nothing
    assert len(rig.transport.subscriptions) == 1


async def test_valid_command_is_applied_once_and_answered_on_its_response_topic() -> None:
    rig = Rig()
    own = rig.transport.topics.cmd_result("alice", "set_value") + "/nonce-7"
    reply = await rig.send(rig.msg("set_value", {"value": 42.5}, response_topic=own,
                                   correlation_data=b"c-1"))
    assert reply == {"request_id": "r-1", "ok": True, "error": None, "state": {"value": 42.5}}
    assert rig.applied == [(42.5, "alice")]
    assert rig.transport.replies[-1][:2] == (own, b"c-1")
    (audit,) = rig.audits
    assert (audit.outcome, audit.ok, audit.user, audit.verb, audit.reply_topic) == (
        "ok", True, "alice", "set_value", own)
    # Without a response topic (MQTT 3.1.1) the reply goes to .../result.
    await rig.send(rig.msg("get_state", rid="r-2"))
    assert rig.transport.replies[-1][0] == rig.transport.topics.cmd_result("alice", "get_state")
    assert rig.router.stats.applied == 2


HOSTILE_RESPONSE_TOPICS = [
    "rackplane/lab/r1/valvey/cmd/bms/set_value/result",  # another user's reply space
    "rackplane/lab/r1/valvey/cmd/alice/set_value",  # a command topic (its own!)
    "rackplane/lab/r1/racky/cmd/alice/set_budget",  # another daemon's command topic
    "rackplane/lab/r1/racky/cmd/alice/set_budget/result",  # another daemon's replies
    "rackplane/lab/r1/valvey/state/supply_loop",  # the daemon's own state
    "$SYS/broker/clients", "$share/g/rackplane/lab/r1/valvey/cmd/alice/x/result",
    "rackplane/lab/r1/valvey/cmd/alice/set_value/result/#",  # wildcards
    "rackplane/lab/r1/valvey/cmd/alice/+/result",
    "rackplane/lab/r1/valvey/cmd/alice/set_value/result/+",
    "rackplane/lab/r1/valvey/cmd/alice/set_value/result/a.b",  # NATS-hostile levels
    "rackplane/lab/r1/valvey/cmd/alice/set_value/result/a b",
    "rackplane/lab/r1/valvey/cmd/alice/set_value/result//x",  # an empty level
    "rackplane/lab/r1/valvey/cmd/alice/set_value/result/",
    "rackplane/lab/r1/valvey/cmd/alice/set_value/other",  # not .../result
    "rackplane/lab/r1/valvey/cmd/alice/set_value/result/\x00", "clients/alice/replies", "",
]


@pytest.mark.parametrize("response_topic", HOSTILE_RESPONSE_TOPICS)
async def test_a_hostile_response_topic_is_neither_answered_nor_executed(
    response_topic: str
) -> None:
    """Issue 14 item 12: a response topic outside the sender's own reply space
    (``<base>/cmd/<user>/<verb>/result[/...]``) gets no reply at all (the old router answered on
    ``.../result`` anyway); the command is not executed; it is audited (outcome
    response_topic_refused, with its correlation data logged as hex)."""
    rig = Rig()
    msg = rig.msg("set_value", {"value": 1.0}, response_topic=response_topic,
                  correlation_data=b"\xca\xfe")
    await rig.transport.deliver(msg)
    assert rig.transport.replies == []
    assert rig.applied == []
    (audit,) = rig.audits
    assert (audit.outcome, audit.ok, audit.reply_topic, audit.request_id) == (
        "response_topic_refused", False, None, "r-1")
    assert rig.router.stats.refused == {"response_topic_refused": 1}


async def test_the_audit_line_carries_the_correlation_data_as_hex() -> None:
    from structlog.testing import capture_logs
    rig = Rig()
    own = rig.transport.topics.cmd_result("alice", "get_state") + "/n1"
    with capture_logs() as logs:
        await rig.send(rig.msg("get_state", response_topic=own, correlation_data=b"\x00\xffrq"))
    (line,) = [e for e in logs if e["event"] == "command"]
    assert line["correlation_data"] == "00ff7271" and line["reply_topic"] == own


async def test_a_request_without_response_topic_is_answered_on_result() -> None:
    rig = Rig()
    await rig.send(rig.msg("set_value", {"value": 1.0}))
    assert rig.transport.replies[-1][0] == rig.transport.topics.cmd_result("alice", "set_value")
    assert rig.applied == [(1.0, "alice")]


@pytest.mark.parametrize(("kw", "code"), [
    ({"retain": True}, "retained"),
    ({"issued_offset_s": -301.0}, "expired"),
    ({"issued_offset_s": 31.0}, "from_future"),
])
async def test_retained_or_expired_command_is_never_acted_on(kw: dict[str, Any],
                                                              code: str) -> None:
    rig = Rig()
    reply = await rig.send(rig.msg("set_value", {"value": 10.0}, **kw))
    assert reply["ok"] is False and reply["error"]["code"] == code
    assert reply["request_id"] == "r-1" and reply["state"] is None
    assert rig.applied == []
    (audit,) = rig.audits
    assert (audit.outcome, audit.ok, audit.retained) == (code, False, kw.get("retain", False))
    assert rig.router.stats.refused == {code: 1}


@pytest.mark.parametrize(("user", "args", "code"), [
    ("viewer", {"value": 10.0}, "forbidden"),
    ("alice", {"value": 101.0}, "out_of_range"),
    ("alice", {"value": "10"}, "wrong_type"),
])
async def test_a_refused_command_is_audited(user: str, args: dict[str, Any], code: str) -> None:
    rig = Rig()
    reply = await rig.send(rig.msg("set_value", args, user=user))
    assert reply["error"]["code"] == code and rig.applied == []
    (audit,) = rig.audits
    assert audit.outcome == code and not audit.ok and audit.user == user
    assert audit.message == reply["error"]["message"]
    assert audit.tags() == {"user": user, "verb": "set_value", "outcome": code}
    assert audit.fields()["ok"] == 0.0


async def test_an_unknown_verb_is_audited_with_a_bounded_tag() -> None:
    rig = Rig()
    reply = await rig.send(rig.msg("reboot_everything"))
    assert reply["error"]["code"] == "unknown_verb"
    assert rig.audits[0].tags()["verb"] == "_unknown"


async def test_duplicates_are_answered_with_the_first_reply_never_reapplied() -> None:
    rig = Rig()
    first = await rig.send(rig.msg("set_value", {"value": 5.0}))
    again = await rig.send(rig.msg("set_value", {"value": 5.0}, dup=True, issued_offset_s=1.0))
    assert again == first and rig.applied == [(5.0, "alice")]
    reused = await rig.send(rig.msg("set_value", {"value": 6.0}))
    assert reused["error"]["code"] == "request_id_reused" and rig.applied == [(5.0, "alice")]
    # Another user's same request_id is another command.
    await rig.send(rig.msg("set_value", {"value": 6.0}, user="bms"))
    assert rig.applied == [(5.0, "alice")]  # bms is automation: forbidden, not a duplicate
    assert [a.outcome for a in rig.audits] == ["ok", "duplicate", "request_id_reused",
                                               "forbidden"]
    st = rig.router.stats
    assert (st.received, st.applied, st.duplicates) == (4, 1, 1)


async def test_a_copy_arriving_while_an_async_handler_runs_is_in_progress() -> None:
    rig = Rig()
    release = asyncio.Event()

    def slow(args: NoArgs, ctx: CommandContext) -> Any:
        async def work() -> dict[str, Any]:
            await release.wait()
            return {"done": True}
        return work()

    rig.router.register("slow", NoArgs, slow, role="operator")
    first = asyncio.create_task(rig.transport.deliver(rig.msg("slow", rid="s-1")))
    await asyncio.sleep(0.01)
    assert rig.transport.replies == []  # still running; the loop is free
    busy = await rig.send(rig.msg("slow", rid="s-1", dup=True))
    assert busy["error"]["code"] == "in_progress"
    release.set()
    await first
    assert rig.transport.replies[-1][2]["state"] == {"done": True}
    again = await rig.send(rig.msg("slow", rid="s-1", dup=True))
    assert again["ok"] is True and again["state"] == {"done": True}


async def test_lease_gate_publishes_state_through_the_transport() -> None:
    rig = Rig()
    gate = LeaseGate(rig.router, LeaseTable({"valve": "the valve"}))
    gate.tick(rig.clock.monotonic())
    assert rig.transport.states[-1][0] == "leases"
    assert rig.transport.states[-1][1]["valve"]["holder"] is None
    reply = await rig.send(rig.msg("acquire_lease", {"output": "valve", "ttl_s": 60.0},
                                   user="bms", rid="l-1"))
    assert reply["ok"] is True
    assert rig.transport.states[-1][1]["valve"]["holder"] == "bms"


def test_the_router_imports_no_mqtt_library() -> None:
    """The command path loads without the MQTT adapter (its own process: a clean import)."""
    code = ("import sys, rackplane.commands; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('aiomqtt', 'paho') "
            "or m.startswith('rackplane.io')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout
