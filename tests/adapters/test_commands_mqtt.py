"""The command path against a real Mosquitto (harness/servers.py): the real `MqttLink`, a real
`CommandRouter` with valvey's verbs on a real `ValveyCore`; peers are Mosquitto's own C clients
(tests/adapters/mqtt_cli.py), network cuts go through tests/adapters/mqtt_proxy.py.

DESIGN §3 (replies on the v5 response topic with correlation data, else on
``cmd/<user>/<verb>/result``; never acted on when retained: on v5 also when published retained
and delivered live, through Retain As Published; on 3.1.1 the documented limit). FIELD-CASES
BR-22 (a: a DUP redelivery answered, never re-applied; b: a broker restarted without
persistence, the router resubscribed through the link).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from harness.servers import Mosquitto
from rackplane.clock import SystemClock
from rackplane.commands import CommandAudit, CommandReply, CommandRouter
from rackplane.core.samples import good
from rackplane.io.mqtt import MqttLink
from rackplane.settings import CommandSettings, Identity, MqttSettings
from tests.adapters.mqtt_cli import MqttSub, Received, mqtt_pub
from tests.adapters.mqtt_proxy import MqttProxy
from valvey.commands import register_valvey_commands
from valvey.config import CduPoints, ControlSettings
from valvey.core.controller import ValveyCore
from valvey.core.supply_loop_settings import SupplyLoopSettings

CLOCK = SystemClock()
USERS = {"alice": "operator", "viewer": "reader"}


@dataclass
class Daemon:
    """What valvey wires (valvey/app.py): link + router + core; audits recorded."""

    link: MqttLink
    router: CommandRouter
    core: ValveyCore
    audits: list[CommandAudit] = field(default_factory=list)
    task: asyncio.Task[None] | None = None


def make_core() -> ValveyCore:
    core = ValveyCore(SupplyLoopSettings(), CduPoints(), ControlSettings(), CLOCK.monotonic())
    t = CLOCK.monotonic()
    core.step(t, {"supply_temp_c": good("supply_temp_c", 45.0, "degC", CLOCK.wall_ns(), t),
                  "valve_command_pct": good("valve_command_pct", 30.0, "pct", CLOCK.wall_ns(), t)})
    return core


def make_daemon(port: int, rack: str | None = None, **mqtt_kw: Any) -> Daemon:
    s = MqttSettings(**{"port": port, "reconnect_min_s": 0.1, "reconnect_max_s": 1.0,
                        "stop_timeout_s": 2.0, **mqtt_kw})
    ident = Identity(site="lab", row="rowA", rack=rack or f"r{uuid.uuid4().hex[:10]}")
    link = MqttLink(s, ident, "valvey", clock=CLOCK)
    core = make_core()
    audits: list[CommandAudit] = []
    router = CommandRouter(link, CommandSettings(users=USERS), clock=CLOCK, audit=audits.append)
    register_valvey_commands(router, core)
    router.attach()
    return Daemon(link, router, core, audits)


@pytest.fixture
async def daemons() -> AsyncIterator[list[Daemon]]:
    started: list[Daemon] = []
    yield started
    for d in started:
        if d.task is not None and not d.task.done():
            await d.link.stop(0.5)
            d.task.cancel()
        if d.task is not None:
            with contextlib.suppress(BaseException):
                await d.task


async def start(d: Daemon, daemons: list[Daemon]) -> None:
    d.task = asyncio.create_task(d.link.run())
    daemons.append(d)
    await d.link.wait_ready(10)


def envelope(rid: str, args: dict[str, Any] | None = None) -> str:
    issued = datetime.fromtimestamp(CLOCK.wall_ns() / 1e9, tz=UTC).isoformat()
    return json.dumps({"request_id": rid, "issued_at": issued, "args": args or {}})


def reply_of(m: Received) -> dict[str, Any]:
    doc = json.loads(m.payload)
    CommandReply.model_validate(doc)
    assert isinstance(doc, dict)
    return doc


def for_request(topic: str, rid: str) -> Callable[[Received], bool]:
    return lambda m: m.topic == topic and json.loads(m.payload).get("request_id") == rid


async def wait_until(pred: Callable[[], bool], timeout_s: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not pred():
        if loop.time() > deadline:
            raise TimeoutError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.01)


async def test_v5_reply_on_response_topic_with_correlation_data(
    mosquitto: Mosquitto, daemons: list[Daemon]
) -> None:
    d = make_daemon(mosquitto.port, protocol="5")
    await start(d, daemons)
    # The convention (docs/COMMANDS.md): a response topic in the sender's own reply space.
    result = d.link.topics.cmd_result("alice", "set_setpoint")
    resp = f"{result}/{uuid.uuid4().hex}"
    async with MqttSub(mosquitto.port, resp, result) as sub:
        await mqtt_pub(mosquitto.port, d.link.topics.cmd("alice", "set_setpoint"),
                       envelope("v5-1", {"setpoint_c": 40.5}), v5=True, response_topic=resp,
                       correlation_data="corr-7")
        m = await sub.wait_for(lambda m: m.topic == resp)
        await asyncio.sleep(0.3)  # a stray copy on /result would arrive by now
    reply = reply_of(m)
    assert reply["ok"] is True and reply["request_id"] == "v5-1"
    assert reply["state"]["setpoint_c"] == 40.5
    assert m.correlation_data == "corr-7" and m.qos == 1 and not m.retain
    assert sub.on(result) == []  # only on the response topic
    assert d.core.loop.setpoint_c == 40.5
    assert [a.outcome for a in d.audits] == ["ok"] and d.audits[0].reply_topic == resp


async def test_311_reply_on_result_topic(mosquitto: Mosquitto, daemons: list[Daemon]) -> None:
    d = make_daemon(mosquitto.port, protocol="3.1.1")
    await start(d, daemons)
    t = d.link.topics
    async with MqttSub(mosquitto.port, t.base + "/cmd/+/+/result", v5=False) as sub:
        await mqtt_pub(mosquitto.port, t.cmd("viewer", "get_state"), envelope("g-1"))
        await mqtt_pub(mosquitto.port, t.cmd("viewer", "set_setpoint"),
                       envelope("s-1", {"setpoint_c": 40}))
        got = await sub.wait_for(for_request(t.cmd_result("viewer", "get_state"), "g-1"))
        refused = await sub.wait_for(for_request(t.cmd_result("viewer", "set_setpoint"), "s-1"))
    assert reply_of(got)["ok"] is True and reply_of(got)["state"]["mode"] == "auto"
    assert reply_of(refused)["error"]["code"] == "forbidden"  # role from config: reader
    assert d.core.loop.setpoint_c == 45.0


async def test_retained_command_before_subscribe_refused_not_applied(
    mosquitto: Mosquitto, daemons: list[Daemon]
) -> None:
    d = make_daemon(mosquitto.port, protocol="3.1.1")
    t = d.link.topics
    topic = t.cmd("alice", "set_setpoint")
    # Someone left a retained command on the broker before the daemon (re)started.
    await mqtt_pub(mosquitto.port, topic, envelope("stale-1", {"setpoint_c": 30}), retain=True)
    try:
        async with MqttSub(mosquitto.port, t.cmd_result("alice", "set_setpoint"),
                           v5=False) as sub:
            await start(d, daemons)
            m = await sub.wait_for(lambda m: True)
            await asyncio.sleep(0.3)
        reply = reply_of(m)
        assert reply["ok"] is False and reply["error"]["code"] == "retained"
        assert not m.retain  # replies are never retained
        assert d.core.loop.setpoint_c == 45.0
        assert d.router.stats.refused == {"retained": 1} and d.router.stats.applied == 0
        assert [(a.outcome, a.retained) for a in d.audits] == [("retained", True)]
    finally:
        await mqtt_pub(mosquitto.port, topic, None, retain=True)  # clear it on the broker


async def test_br22b_set_setpoint_applied_once_across_broker_restart(
    mosquitto_private: Mosquitto, daemons: list[Daemon]
) -> None:
    port = mosquitto_private.port
    d = make_daemon(port, protocol="3.1.1", clean_session=False,
                    client_id=f"valvey-cmd-{uuid.uuid4().hex[:6]}")
    t = d.link.topics
    result = t.cmd_result("alice", "set_setpoint")
    await start(d, daemons)
    first = envelope("c-1", {"setpoint_c": 40})
    async with MqttSub(port, result, v5=False) as sub:
        await mqtt_pub(port, t.cmd("alice", "set_setpoint"), first)
        r1 = reply_of(await sub.wait_for(for_request(result, "c-1")))
    assert r1["ok"] and d.core.loop.setpoint_c == 40.0

    mosquitto_private.restart()  # persistence false: sessions and subscriptions are gone
    await wait_until(lambda: d.link.stats.connects >= 2, 15, "reconnect")
    await d.link.wait_ready(10)
    assert d.link.session_present is False
    assert d.link.subscribed_topics == d.link.configured_topics == [t.cmd_filter]

    async with MqttSub(port, result, v5=False) as sub:
        await mqtt_pub(port, t.cmd("alice", "set_setpoint"), envelope("c-2", {"setpoint_c": 41}))
        r2 = reply_of(await sub.wait_for(for_request(result, "c-2")))
        # The client never saw c-1's reply (say) and sends it again, unchanged.
        await mqtt_pub(port, t.cmd("alice", "set_setpoint"), first)
        r1_again = reply_of(await sub.wait_for(for_request(result, "c-1")))
    assert r2["ok"] and r1_again == r1  # answered with the first reply...
    assert d.core.loop.setpoint_c == 41.0  # ...and not applied again
    st = d.router.stats
    assert (st.received, st.applied, st.duplicates) == (3, 2, 1)
    assert [a.outcome for a in d.audits] == ["ok", "ok", "duplicate"]


async def test_br22a_dup_redelivery_through_the_broker_not_reapplied(
    mosquitto: Mosquitto, daemons: list[Daemon]
) -> None:
    async with MqttProxy(mosquitto.port) as proxy:
        d = make_daemon(proxy.port, protocol="3.1.1", clean_session=False,
                        client_id=f"valvey-cmddup-{uuid.uuid4().hex[:6]}")
        t = d.link.topics
        result = t.cmd_result("alice", "set_setpoint")
        await start(d, daemons)
        async with MqttSub(mosquitto.port, result, v5=False) as sub:
            proxy.blackhole_upstream = True  # our PUBACK (and first reply) never arrive
            await mqtt_pub(mosquitto.port, t.cmd("alice", "set_setpoint"),
                           envelope("d-1", {"setpoint_c": 39}))
            await wait_until(lambda: d.router.stats.received == 1, 10, "first delivery")
            assert d.core.loop.setpoint_c == 39.0
            d.core.loop.set_setpoint(42.0)  # meanwhile the setpoint moved on
            proxy.cut()
            proxy.blackhole_upstream = False
            await wait_until(lambda: not d.link.connected, 5, "link notices the cut")
            proxy.restore()
            await wait_until(lambda: d.router.stats.received == 2, 15, "redelivery (DUP)")
            m = await sub.wait_for(for_request(result, "d-1"))
    assert reply_of(m)["ok"] is True
    assert d.core.loop.setpoint_c == 42.0  # the redelivered 39 was not applied again
    assert [(a.outcome, a.dup) for a in d.audits] == [("ok", False), ("duplicate", True)]


async def test_v5_command_published_retained_is_refused_even_when_delivered_live(
    mosquitto: Mosquitto, daemons: list[Daemon]
) -> None:
    d = make_daemon(mosquitto.port, protocol="5")
    await start(d, daemons)
    t = d.link.topics
    topic = t.cmd("alice", "set_setpoint")
    try:
        async with MqttSub(mosquitto.port, t.cmd_result("alice", "set_setpoint")) as sub:
            await mqtt_pub(mosquitto.port, topic, envelope("live-r", {"setpoint_c": 30}),
                           retain=True)
            reply = reply_of(await sub.wait_for(for_request(sub_topic(t), "live-r")))
            audits = [(a.outcome, a.retained, a.request_id) for a in d.audits]
    finally:
        await mqtt_pub(mosquitto.port, topic, None, retain=True)  # (also refused: retained)
    assert reply["ok"] is False and reply["error"]["code"] == "retained"
    assert d.core.loop.setpoint_c == 45.0
    assert audits == [("retained", True, "live-r")]


async def test_311_live_retained_command_applied_once_then_refused_from_the_store(
    mosquitto: Mosquitto, daemons: list[Daemon]
) -> None:
    """The MQTT 3.1.1 limit (docs/COMMANDS.md "Retained commands"): the broker clears the flag
    on live deliveries, so the daemon cannot tell; it applies the (fresh) command once, and
    refuses the copy the broker replays from its retained store at the next subscribe."""
    d = make_daemon(mosquitto.port, protocol="3.1.1", clean_session=True)
    await start(d, daemons)
    t = d.link.topics
    topic = t.cmd("alice", "set_setpoint")
    try:
        async with MqttSub(mosquitto.port, t.cmd_result("alice", "set_setpoint"),
                           v5=False) as sub:
            await mqtt_pub(mosquitto.port, topic, envelope("r311", {"setpoint_c": 41}),
                           retain=True)
            first = reply_of(await sub.wait_for(for_request(sub_topic(t), "r311")))
            assert first["ok"] is True and d.core.loop.setpoint_c == 41.0
            d.core.loop.set_setpoint(43.0)
            # A restarted daemon (new session): the stored copy is flagged and refused; the
            # dedup cache of this process would also answer it, so use a fresh router.
            await d.link.stop(1.0)
            d2 = make_daemon(mosquitto.port, d.link.identity.rack, protocol="3.1.1",
                             clean_session=True)
            await start(d2, daemons)
            again = reply_of(await sub.wait_for(for_request(sub_topic(t), "r311"), start=1))
    finally:
        await mqtt_pub(mosquitto.port, topic, None, retain=True)
    assert again["ok"] is False and again["error"]["code"] == "retained"
    assert d2.core.loop.setpoint_c == 45.0 and d2.router.stats.applied == 0


def sub_topic(t: Any) -> str:
    return str(t.cmd_result("alice", "set_setpoint"))


async def test_311_command_round_trip_on_the_demos_embedded_broker(
    daemons: list[Daemon]
) -> None:
    """The demo's amqtt broker speaks only 3.1.1: the router answers on /result and rackctl's
    client (3.1.1) matches the reply by request_id."""
    from rackctl.client import ClientSettings, CommandClient
    from tests.adapters.test_mqtt import amqtt_broker

    async with amqtt_broker() as port:
        d = make_daemon(port, protocol="3.1.1")
        await start(d, daemons)
        settings = ClientSettings(port=port, protocol="3.1.1", username="alice",
                                  rack=d.link.identity.rack, site=d.link.identity.site)
        async with CommandClient(settings) as client:
            reply = await client.call("valvey", "set_setpoint", {"setpoint_c": 42.5})
            refused = await client.call("valvey", "set_setpoint", {"setpoint_c": 99.0})
        await d.link.stop(1.0)
    assert reply["ok"] is True and reply["state"]["setpoint_c"] == 42.5
    assert refused["error"]["code"] == "out_of_range" and d.core.loop.setpoint_c == 42.5
