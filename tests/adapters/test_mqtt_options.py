"""rackplane.io.mqtt options added for the command contract (issue 6), against a real Mosquitto
2.0 with Mosquitto's own C clients as peers:

- Retain As Published (MQTT 5.0 §3.8.3.1): on v5 a command *published* retained is flagged
  retained even when delivered live, so the router refuses it; on 3.1.1 a live delivery
  always carries RETAIN 0 (§3.3.1.3): the documented limit (docs/COMMANDS.md);
- a v5 request's Response Topic and Correlation Data from `MqttLink.publish`;
- a client link (``announce=False``) publishes no status and sets no Will;
- a publish the broker's ACL refuses: `PublishRefused` (v5 PUBACK 0x87) for the caller; for
  the queued publishes (state, replies) counted, logged once, never retried; silently dropped
  on 3.1.1 (Mosquitto acknowledges it anyway).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.servers import Mosquitto
from rackplane.io.mqtt import Message, MqttLink, PublishRefused
from tests.adapters.mqtt_cli import MqttSub, mqtt_pub
from tests.adapters.test_mqtt import CLOCK, Runner, ident, runner, settings, wait_until
from tests.servers import start_mosquitto

__all__ = ["runner"]  # the fixture, re-exported for pytest


@pytest.mark.parametrize(("protocol", "flagged"), [("5", True), ("3.1.1", False)])
async def test_live_retained_publish_flagged_only_with_retain_as_published(
    mosquitto: Mosquitto, runner: Runner, protocol: str, flagged: bool
) -> None:
    link = MqttLink(settings(mosquitto.port, protocol=protocol), ident(), "valvey", clock=CLOCK)
    seen: list[Message] = []
    link.subscribe(link.topics.cmd_filter, seen.append, qos=1, retain_as_published=True)
    plain: list[Message] = []
    other = link.topics.state("x")  # a second filter without the option, for contrast
    link.subscribe(other, plain.append, qos=1)
    runner.start(link)
    await link.wait_ready(10)
    topic = link.topics.cmd("alice", "set_setpoint")
    try:
        await mqtt_pub(mosquitto.port, topic, '{"live": true}', retain=True)
        await mqtt_pub(mosquitto.port, other, '{"live": true}', retain=True)
        await wait_until(lambda: len(seen) == 1 and len(plain) == 1, 10, "live deliveries")
        assert seen[0].retain is flagged  # v5: refused as retained; 3.1.1: cannot tell
        assert plain[0].retain is False  # without the option the broker clears the flag
    finally:
        await mqtt_pub(mosquitto.port, topic, None, retain=True)
        await mqtt_pub(mosquitto.port, other, None, retain=True)


async def test_publish_carries_response_topic_and_correlation_data(
    mosquitto: Mosquitto, runner: Runner
) -> None:
    link = MqttLink(settings(mosquitto.port, protocol="5"), ident(), "rackctl", clock=CLOCK,
                    announce=False)
    runner.start(link)
    await link.wait_ready(10)
    topic = link.topics.cmd("alice", "get_state")
    proc = await asyncio.create_subprocess_exec(
        "mosquitto_sub", "-p", str(mosquitto.port), "-V", "mqttv5", "-t", topic, "-C", "1",
        "-F", "%R|%D|%p", stdout=asyncio.subprocess.PIPE)
    try:
        await asyncio.sleep(0.3)  # mosquitto_sub subscribed
        await link.publish(topic, {"request_id": "r-1"}, qos=1,
                           response_topic=f"{topic}/result/n1", correlation_data=b"r-1")
        out, _ = await asyncio.wait_for(proc.communicate(), 10)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    assert out.decode().strip() == f'{topic}/result/n1|r-1|{{"request_id":"r-1"}}'
    with pytest.raises(ValueError):
        await link.publish(topic, "{}", response_topic="bad/+/topic")


async def test_client_link_publishes_no_status_and_no_will(
    mosquitto: Mosquitto, runner: Runner
) -> None:
    link = MqttLink(settings(mosquitto.port), ident(), "rackctl", clock=CLOCK, announce=False)
    async with MqttSub(mosquitto.port, link.topics.base + "/#") as sub:
        task = runner.start(link)
        await link.wait_ready(10)
        task.cancel()  # dropped without DISCONNECT: a Will, if any, would fire now
        with contextlib.suppress(BaseException):
            await task
        await asyncio.sleep(0.5)
    assert sub.messages == []


@pytest.fixture
def acl_broker(tmp_path: Path) -> Iterator[Mosquitto]:
    """A private Mosquitto whose ACL lets anonymous clients write only ``ok/#`` and the
    links' status and ``state/allowed`` topics (``user``: see
    tests/integration/secure_broker.py, why the broker runs as the test's user)."""
    acl = tmp_path / "acl"
    acl.write_text("topic readwrite ok/#\ntopic readwrite rackplane/+/+/+/status\n"
                   "topic readwrite rackplane/+/+/+/state/allowed\n"
                   "topic readwrite rp-test-probe/#\n")  # MqttSub's probe
    me = pwd.getpwuid(os.geteuid()).pw_name
    # max_queued_messages as in production (config/mosquitto): with the test servers' 0,
    # Mosquitto 2.0.11 drops a v5 client right after a PUBACK 0x87 ("Bad socket read/write
    # ... Unknown error"; measured; eclipse-mosquitto/mosquitto#2579, #3244).
    srv = start_mosquitto(tmp_path,
                          extra_conf=f"acl_file {acl}\nuser {me}\nmax_queued_messages 1000\n")
    yield srv
    srv.stop()


async def test_acl_refusal_raises_on_v5_and_queued_publishes_are_not_retried(
    acl_broker: Mosquitto, runner: Runner
) -> None:
    link = MqttLink(settings(acl_broker.port, protocol="5"), ident(), "valvey", clock=CLOCK)
    runner.start(link)
    await link.wait_ready(10)
    await link.publish("ok/x", "1")
    with pytest.raises(PublishRefused, match="0x87") as err:
        await link.publish("denied/x", "1")
    assert "Not authorized" in err.value.reason
    async with MqttSub(acl_broker.port, link.topics.base + "/state/+") as sub:
        link.publish_state("forbidden", {"v": 1})
        link.publish_state("allowed", {"v": 2})
        await sub.wait_for(lambda m: m.topic.endswith("/state/allowed"))
        await asyncio.sleep(0.6)  # a retry would come after 0.2 s
    st = link.stats
    assert st.publish_refused == 2  # the generic publish and the state, each once
    assert [json.loads(m.payload) for m in sub.messages] == [{"v": 2}]
    link.publish_state("forbidden", {"v": 3})  # refused again, logged only the first time
    await wait_until(lambda: link.stats.publish_refused == 3, 5, "second refusal")
    assert link.connected and link.stats.reconnects == 0


async def test_acl_refusal_is_silent_on_311(acl_broker: Mosquitto, runner: Runner) -> None:
    link = MqttLink(settings(acl_broker.port, protocol="3.1.1"), ident(), "valvey",
                    clock=CLOCK)
    runner.start(link)
    await link.wait_ready(10)
    await link.publish("denied/x", "1")  # acknowledged and dropped: the client cannot know
    assert link.stats.publish_refused == 0
