"""Where command replies go, on a real Mosquitto 2.0 (tests/servers.py), issue 14 item 12:
the router answers only inside the requester's own reply space (a hostile MQTT v5 Response
Topic gets no reply and no execution, audit only, correlation data logged as hex), answers a
request without one on ``.../result``, never above the request's QoS; rackctl matches replies
by Correlation Data on v5 and by request_id on 3.1.1 and ignores retained replies.
Requests are published by Mosquitto's own client (tests/adapters/mqtt_cli.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from harness.servers import Mosquitto
from rackctl.client import ClientSettings, CommandClient
from rackplane.clock import SystemClock
from rackplane.commands import CommandArgs, CommandAudit, CommandContext, CommandRouter, NoArgs
from rackplane.io.mqtt import Message, MqttLink
from rackplane.settings import CommandSettings, Identity, MqttSettings
from tests.adapters.mqtt_cli import MqttSub, mqtt_pub

pytestmark = [pytest.mark.servers]

CLOCK = SystemClock()


class _Value(CommandArgs):
    value: float


@dataclass
class _Log:
    """A structlog-shaped recorder for the router's events."""

    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def _rec(self, event: str, **kw: Any) -> None:
        self.events.append((event, kw))

    debug = info = warning = error = exception = _rec

    def named(self, event: str) -> list[dict[str, Any]]:
        return [kw for e, kw in self.events if e == event]


@dataclass
class Daemon:
    link: MqttLink
    router: CommandRouter
    log: _Log
    audits: list[CommandAudit]
    applied: list[float]


@contextlib.asynccontextmanager
async def daemon(port: int, protocol: str = "5") -> AsyncIterator[Daemon]:
    ident = Identity(site="rr", rack=f"r{uuid.uuid4().hex[:8]}")
    link = MqttLink(MqttSettings(port=port, protocol=protocol),  # type: ignore[arg-type]
                    ident, "valvey", clock=CLOCK)
    log, audits, applied = _Log(), [], []  # type: ignore[var-annotated]
    router = CommandRouter(link, CommandSettings(users={"alice": "operator"}), clock=CLOCK,
                           audit=audits.append, log=log)

    def set_value(a: _Value, _c: CommandContext) -> dict[str, Any]:
        applied.append(a.value)
        return {"value": a.value}

    router.register("set_value", _Value, set_value, role="operator")
    router.register("get_state", NoArgs, lambda _a, _c: {"n": len(applied)}, role="reader")
    router.attach(environ={})
    task = asyncio.create_task(link.run())
    try:
        await link.wait_ready(10.0)
        yield Daemon(link, router, log, audits, applied)
    finally:
        await link.stop(1.0)
        task.cancel()
        with contextlib.suppress(BaseException):
            await task


def envelope(rid: str, args: dict[str, Any] | None = None) -> str:
    now = datetime.now(UTC).isoformat()
    return json.dumps({"request_id": rid, "issued_at": now, "args": args or {}})


async def wait_audits(d: Daemon, n: int, timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while len(d.audits) < n:
        assert loop.time() < deadline, f"{len(d.audits)} audits, expected {n}"
        await asyncio.sleep(0.02)


async def test_hostile_response_topics_get_no_reply_and_no_execution(
    mosquitto: Mosquitto
) -> None:
    async with daemon(mosquitto.port) as d:
        base = d.link.topics.base
        peer = base.rsplit("/", 1)[0] + "/racky"
        hostile = [
            f"{peer}/cmd/alice/set_budget",  # another daemon's command topic
            f"{base}/cmd/alice/get_state",  # a command topic of this daemon
            f"{base}/cmd/bob/set_value/result",  # another user's reply space
            f"{base}/state/supply_loop",  # the daemon's own retained state
            "$SYS/broker/uptime",
            f"{base}/cmd/alice/set_value/result/a.b",  # a level NATS refuses
            "elsewhere/replies",
        ]
        async with MqttSub(mosquitto.port, "#", "$SYS/broker/x/#") as sub:
            for i, rt in enumerate(hostile):
                await mqtt_pub(mosquitto.port, f"{base}/cmd/alice/set_value",
                               envelope(f"h{i}", {"value": float(i)}), response_topic=rt,
                               correlation_data=f"cd{i}")
            await wait_audits(d, len(hostile))
            # A good one afterwards: its reply proves the daemon was answering meanwhile.
            own = f"{base}/cmd/alice/set_value/result/n1"
            await mqtt_pub(mosquitto.port, f"{base}/cmd/alice/set_value",
                           envelope("ok1", {"value": 7.0}), response_topic=own,
                           correlation_data="cd-ok")
            got = await sub.wait_for(lambda m: m.topic == own)
        assert json.loads(got.payload)["request_id"] == "ok1" and got.correlation_data == "cd-ok"
        # not the requests; not other tests' retained messages on this worker's broker
        # (a retained state holding '"ok":' failed this once): the daemon's replies can only
        # be on a response topic it was given or under its own base
        mine = {*hostile, own}
        replies = [m for m in sub.messages if b'"ok":' in m.payload and not m.retain
                   and (m.topic in mine or m.topic.startswith(base + "/"))]
        assert [json.loads(m.payload)["request_id"] for m in replies] == ["ok1"]
        assert d.applied == [7.0]  # none of the hostile ones was executed
        refused = d.audits[:len(hostile)]
        assert {(a.outcome, a.reply_topic) for a in refused} == {("response_topic_refused", None)}
        lines = d.log.named("command")
        assert [ln["correlation_data"] for ln in lines] == \
            [f"cd{i}".encode().hex() for i in range(len(hostile))] + [b"cd-ok".hex()]
        assert len(d.log.named("command_response_topic_refused")) == len(hostile)


@pytest.mark.parametrize("qos", [0, 1])
@pytest.mark.parametrize("v5", [True, False])
async def test_no_response_topic_is_answered_on_result_never_above_the_request_qos(
    mosquitto: Mosquitto, qos: int, v5: bool
) -> None:
    async with daemon(mosquitto.port) as d:
        base = d.link.topics.base
        result = f"{base}/cmd/alice/get_state/result"
        async with MqttSub(mosquitto.port, f"{base}/#", qos=1) as sub:
            await mqtt_pub(mosquitto.port, f"{base}/cmd/alice/get_state", envelope("q"),
                           qos=qos, v5=v5)
            got = await sub.wait_for(lambda m: m.topic == result)
        assert json.loads(got.payload)["ok"] is True
        assert got.qos == qos  # the subscription allows 1: the reply itself was sent at qos


@contextlib.asynccontextmanager
async def fake_daemon(port: int, ident: Identity, forge: bool) -> AsyncIterator[MqttLink]:
    """A daemon that answers every command twice when ``forge``: first a reply carrying the
    right request_id but other correlation data, then the true one."""
    link = MqttLink(MqttSettings(port=port), ident, "valvey", clock=CLOCK)

    async def on_cmd(msg: Message) -> None:
        rid = json.loads(msg.payload)["request_id"]
        topic = msg.response_topic or f"{msg.topic}/result"
        if forge:
            await link.publish(topic, {"request_id": rid, "ok": False, "state": None,
                                       "error": {"code": "forged", "message": "x"}},
                               correlation_data=b"someone-else")
        await link.publish(topic, {"request_id": rid, "ok": True, "error": None,
                                   "state": {"real": True}},
                           correlation_data=msg.correlation_data)

    link.subscribe(link.topics.cmd_filter, on_cmd)
    task = asyncio.create_task(link.run())
    try:
        await link.wait_ready(10.0)
        yield link
    finally:
        await link.stop(1.0)
        task.cancel()
        with contextlib.suppress(BaseException):
            await task


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
async def test_rackctl_matches_the_true_reply_and_ignores_retained_ones(
    mosquitto: Mosquitto, protocol: str
) -> None:
    ident = Identity(site="rr", rack=f"r{uuid.uuid4().hex[:8]}")
    base = f"rackplane/{ident.site}/{ident.rack}/valvey"
    stale = json.dumps({"request_id": "rq-1", "ok": False, "state": None,
                        "error": {"code": "stale", "message": "retained"}})
    # A retained "reply" waiting on the reply topics before the client subscribes.
    for topic in (f"{base}/cmd/alice/get_state/result",
                  f"{base}/cmd/alice/get_state/result/x"):
        await mqtt_pub(mosquitto.port, topic, stale, retain=True)
    settings = ClientSettings(port=mosquitto.port, protocol=protocol,  # type: ignore[arg-type]
                              username="alice", site=ident.site, rack=ident.rack,
                              timeout_s=10.0)
    try:
        async with fake_daemon(mosquitto.port, ident, forge=protocol == "5"), \
                CommandClient(settings) as client:
            reply = await client.call("valvey", "get_state", request_id="rq-1")
            assert reply["state"] == {"real": True}, reply
            assert client.ignored_replies.get("retained", 0) >= 1
            if protocol == "5":
                assert client.ignored_replies.get("unmatched", 0) >= 1  # the forged one
    finally:
        for topic in (f"{base}/cmd/alice/get_state/result",
                      f"{base}/cmd/alice/get_state/result/x"):
            await mqtt_pub(mosquitto.port, topic, None, retain=True)
