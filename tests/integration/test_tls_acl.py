"""The shipped broker security (config/mosquitto/: TLS listener, password file, ACL with three
roles) on a private Mosquitto 2.0 with a throwaway CA (tests/integration/secure_broker.py),
and valvey (a subprocess, its existing ``[mqtt]`` username / password_env / ``[mqtt.tls]``
keys) working through it. Issue 6 "Security"; DESIGN §3 (the <user> level is the broker
username, made unforgeable by the ACL; authentication is the broker's).

valvey's config even names the reader ``rita`` an operator: what stops her is the broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.daemons import Proc, valvey_proc, write_valvey_config
from harness.servers import free_port
from rackctl.client import (
    BrokerRefused,
    BrokerUnavailable,
    ClientSettings,
    CommandClient,
    ReplyTimeout,
)
from rackplane.commands import AlarmPayload, StatusPayload
from rackplane.io.mqtt import Message, PublishRefused
from tests.integration.secure_broker import SecureBroker, make_ca, start_secure_broker

pytestmark = [pytest.mark.servers]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    b = start_secure_broker(tmp_path_factory.mktemp("secure-broker"))
    yield b
    b.stop()


def client_settings(b: SecureBroker, user: str | None, rack: str = "rack1", **kw: Any
                    ) -> ClientSettings:
    values: dict[str, Any] = {"host": "127.0.0.1", "port": b.port, "username": user,
                              "ca_file": b.ca_file, "rack": rack, "connect_timeout_s": 5.0,
                              "timeout_s": 5.0, **kw}
    return ClientSettings(**values)


@contextlib.asynccontextmanager
async def as_user(b: SecureBroker, user: str | None, monkeypatch: pytest.MonkeyPatch,
                  password: str | None = None, **kw: Any) -> AsyncIterator[CommandClient]:
    pw = password if password is not None else b.passwords.get(user or "", None)
    if pw is None:
        monkeypatch.delenv("RACKCTL_PASSWORD", raising=False)
    else:
        monkeypatch.setenv("RACKCTL_PASSWORD", pw)
    client = CommandClient(client_settings(b, user, **kw))
    async with client:
        yield client


def mosquitto_pub(b: SecureBroker, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", str(b.port), "-t",
                           "rackplane/lab/rack1/valvey/cmd/x/get_state", "-m", "{}", *extra],
                          capture_output=True, text=True, timeout=20)


async def test_anonymous_wrong_password_and_untrusted_server_cannot_connect(
    broker: SecureBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    anon = mosquitto_pub(broker, "--cafile", str(broker.ca_file))
    assert anon.returncode != 0 and "not authorised" in anon.stderr.lower()
    plain = mosquitto_pub(broker)  # no TLS at all: the listener speaks only TLS
    assert plain.returncode != 0
    with pytest.raises(BrokerRefused, match="anonymous"):
        async with as_user(broker, None, monkeypatch):
            pass
    with pytest.raises(BrokerRefused, match="alice"):
        async with as_user(broker, "alice", monkeypatch, password="wrong"):
            pass
    # A client that does not trust the broker's CA never sends its password.
    other_ca, _ = make_ca(tmp_path, "other-ca")
    settings = client_settings(broker, "alice", connect_timeout_s=1.5)
    monkeypatch.setenv("RACKCTL_PASSWORD", broker.passwords["alice"])
    with pytest.raises(BrokerUnavailable, match=r"CERTIFICATE_VERIFY_FAILED|certificate"):
        async with CommandClient(settings.model_copy(update={"ca_file": other_ca})):
            pass
    assert "New client connected" not in broker.log()  # nobody got in


class Health:
    """The latest retained ``state/health`` and everything else a reader sees."""

    def __init__(self) -> None:
        self.health: dict[str, Any] = {}
        self.seen: list[Message] = []

    def on_message(self, msg: Message) -> None:
        self.seen.append(msg)
        if msg.topic.endswith("/state/health"):
            self.health = msg.json()

    async def until(self, pred: Any, what: str, valvey: Proc, timeout_s: float = 20) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not pred():
            assert valvey.alive(), valvey.log.read_text()[-3000:]
            assert loop.time() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.05)


async def test_daemon_over_tls_reader_cannot_command_operator_can_user_unforgeable(
    broker: SecureBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rack = f"tls-{uuid.uuid4().hex[:8]}"
    cfg = write_valvey_config(
        tmp_path / "valvey.toml",
        identity={"site": "lab", "rack": rack},
        mqtt={"host": "127.0.0.1", "port": broker.port, "username": "valvey",
              "password_env": "VALVEY_MQTT_PASSWORD", "reconnect_max_s": 1.0},
        **{"mqtt.tls": {"ca_file": str(broker.ca_file)}},
        cdu={"port": free_port()},  # no CDU: the loop goes to fail-safe and raises alarms
        spool={"directory": str(tmp_path / "spool")},
        commands={"users": {"alice": "operator", "rita": "operator", "bms": "automation"}},
        log={"format": "json"},
    )
    valvey = valvey_proc(tmp_path, cfg, env={"VALVEY_MQTT_PASSWORD": broker.passwords["valvey"]})
    valvey.start()
    try:
        reader = Health()
        monkeypatch.setenv("RACKCTL_PASSWORD", broker.passwords["rita"])
        rita = CommandClient(client_settings(broker, "rita", rack=rack))
        base = rita.settings.topics("valvey").base
        for flt in (f"{base}/status", f"{base}/state/+", f"{base}/alarm/+",
                    f"{base}/cmd/+/+/result/#"):  # others' replies: the ACL hides them
            rita.subscribe(flt, reader.on_message)
        async with rita:
            # The daemon over TLS: online, state and alarms, readable by a reader.
            await reader.until(lambda: reader.health.get("mqtt_subscribed"), "valvey online",
                               valvey)
            status = [m for m in reader.seen if m.topic.endswith("/status")]
            assert StatusPayload.model_validate(status[-1].json()).status == "online"
            await reader.until(lambda: any("/alarm/" in m.topic for m in reader.seen),
                               "an alarm (fail-safe without a CDU)", valvey)
            for m in reader.seen:
                if "/alarm/" in m.topic and m.payload:
                    AlarmPayload.model_validate(m.json())
            received0 = reader.health["commands"]["received"]

            # A reader cannot command: v5 tells her (PUBACK 0x87), 3.1.1 drops it silently.
            with pytest.raises(PublishRefused, match="0x87"):
                await rita.call("valvey", "set_setpoint", {"setpoint_c": 30.0})
            monkeypatch.setenv("RACKCTL_PASSWORD", broker.passwords["rita"])
            async with CommandClient(client_settings(broker, "rita", rack=rack,
                                                     protocol="3.1.1", timeout_s=1.5)) as r311:
                with pytest.raises(ReplyTimeout, match="dropped silently"):
                    await r311.call("valvey", "set_setpoint", {"setpoint_c": 30.0})

            # An operator can, over v5 and 3.1.1; the reply reaches her and nobody else.
            async with as_user(broker, "alice", monkeypatch, rack=rack) as alice:
                r1 = await alice.call("valvey", "set_setpoint", {"setpoint_c": 41.0})
                assert r1["ok"] is True and r1["state"]["setpoint_c"] == 41.0
                # The <user> level cannot be forged: alice writing as bob is refused.
                alice.settings = alice.settings.model_copy(update={"user": "bob"})
                with pytest.raises(PublishRefused, match="Not authorized"):
                    await alice.call("valvey", "set_setpoint", {"setpoint_c": 30.0})
            async with as_user(broker, "alice", monkeypatch, rack=rack,
                               protocol="3.1.1") as alice311:
                r2 = await alice311.call("valvey", "get_state")
                assert r2["ok"] is True and r2["state"]["setpoint_c"] == 41.0
            await reader.until(lambda: reader.health["commands"]["received"] >= received0 + 2,
                               "health after the operator's commands", valvey)
            await asyncio.sleep(1.2)  # one more health period
            counts = reader.health["commands"]
            # Only alice's two commands reached valvey: rita's and "bob"'s never did.
            assert counts["received"] == received0 + 2 and counts["applied"] >= 2
            assert not [m for m in reader.seen if "/cmd/" in m.topic]  # no one else's replies
            assert reader.health["mqtt_subscribed"] == reader.health["mqtt_configured"]
            assert reader.health["mqtt_reconnects"] == 0
    finally:
        code = valvey.stop()
    assert code == 0
    events = valvey.events()
    assert not [e for e in events if e.get("event") == "mqtt_publish_refused"]
    # no software errors (an alarm's own record carries its severity's level: not one)
    errors = [e for e in events if e.get("level") in ("error", "critical")
              and e.get("event") != "alarm"]
    assert not errors, errors
    assert any(e.get("event") == "mqtt_connected" for e in events)


def test_rackctl_over_tls_with_password_from_the_environment(
    broker: SecureBroker, tmp_path: Path
) -> None:
    """The CLI's TLS and password path (no daemon: get_state to a rack nobody serves times
    out with exit 3, after the broker accepted the command; a reader is refused with 1)."""
    base = [sys.executable, "-m", "rackctl", "cmd", "valvey", "get_state", "--host",
            "127.0.0.1", "--port", str(broker.port), "--ca-file", str(broker.ca_file),
            "--rack", f"none-{uuid.uuid4().hex[:6]}", "--timeout", "1"]
    env = {**os.environ, "HOME": str(tmp_path)}
    runs = {  # in parallel: three independent CLI runs
        "alice": subprocess.Popen([*base, "--username", "alice"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True,
                                  env={**env, "RACKCTL_PASSWORD": broker.passwords["alice"]}),
        "rita": subprocess.Popen([*base, "--username", "rita"], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True,
                                 env={**env, "RACKCTL_PASSWORD": broker.passwords["rita"]}),
        "bad": subprocess.Popen([*base, "--username", "alice"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                env={**env, "RACKCTL_PASSWORD": "nope"}),
    }
    out = {}
    for name, proc in runs.items():
        _stdout, stderr = proc.communicate(timeout=60)
        out[name] = (proc.returncode, stderr)
    assert out["alice"][0] == 3 and "no reply from valvey" in out["alice"][1], out["alice"]
    assert out["rita"][0] == 1 and "Not authorized" in out["rita"][1], out["rita"]
    assert out["bad"][0] == 2 and "refused the login" in out["bad"][1], out["bad"]


async def test_racky_over_tls_valvey_may_command_racky_reader_may_not(
    broker: SecureBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second daemon over TLS with its own broker user, and the cross-daemon grant of the
    shipped ACL (docs/CONTRACTS.md: valvey, as broker user ``valvey``, commands racky): the
    ``valvey`` user's derating request is applied; an operator reads racky's state; the
    reader ``rita`` (an operator in racky's config!) is stopped by the broker."""
    rack = f"tls-{uuid.uuid4().hex[:8]}"
    cfg = write_valvey_config(  # a generic TOML writer despite its name
        tmp_path / "racky.toml",
        identity={"site": "lab", "rack": rack},
        mqtt={"host": "127.0.0.1", "port": broker.port, "username": "racky",
              "password_env": "RACKY_MQTT_PASSWORD", "reconnect_max_s": 1.0},
        **{"mqtt.tls": {"ca_file": str(broker.ca_file)}},
        spool={"directory": str(tmp_path / "spool")},
        lifecycle={"state_file": str(tmp_path / "racky-state.json")},
        commands={"users": {"valvey": "automation", "alice": "operator", "rita": "operator"}},
        log={"format": "json"},
    )
    racky = Proc("racky", [sys.executable, "-m", "racky", "--config", str(cfg),
                           "--log-format", "json"], tmp_path / "racky.log",
                 env={"RACKY_MQTT_PASSWORD": broker.passwords["racky"]})
    racky.start()
    try:
        seen = Health()
        monkeypatch.setenv("RACKCTL_PASSWORD", broker.passwords["rita"])
        rita = CommandClient(client_settings(broker, "rita", rack=rack))
        rita.subscribe(f"{rita.settings.topics('racky').base}/status", seen.on_message)
        async with rita:
            await seen.until(lambda: any(m.payload and m.json().get("status") == "online"
                                         for m in seen.seen), "racky online over TLS", racky)
            StatusPayload.model_validate(seen.seen[-1].json())
            with pytest.raises(PublishRefused, match="0x87"):
                await rita.call("racky", "set_budget", {"power_w": 1.0, "reason": "rita"})
            async with as_user(broker, "valvey", monkeypatch, rack=rack) as valvey_user:
                r = await valvey_user.call("racky", "cap_rack", {
                    "power_w": 90_000.0, "reason": "tls test: facility water", "ttl_s": 60.0})
                assert r["ok"] is True, r
                assert r["state"]["requested_caps"]["valvey"]["power_w"] == 90_000.0
            async with as_user(broker, "alice", monkeypatch, rack=rack) as alice:
                st = await alice.call("racky", "get_state")
                assert st["ok"] is True
                assert st["state"]["requested_caps"]["valvey"]["reason"] == \
                    "tls test: facility water"
                assert st["state"]["budget_w"] != 1.0  # rita's command never arrived
    finally:
        code = racky.stop()
    assert code == 0, racky.log.read_text()[-3000:]
    events = racky.events()
    assert any(e.get("event") == "mqtt_connected" for e in events)
    assert not [e for e in events if e.get("event") == "mqtt_publish_refused"]
    commands = [e for e in events if e.get("event") == "command"]
    assert [(e.get("user"), e.get("verb"), e.get("ok")) for e in commands] == [
        ("valvey", "cap_rack", True), ("alice", "get_state", True)]


# --- issue 14 item 11: the ACL against hostile usernames ---------------------------------------

HOSTILE_USERS = {"+": "pw-plus", "#": "pw-hash", "a/b": "pw-slash", "alice/get_state": "pw-ag",
                 "alice/+": "pw-aplus"}


@pytest.fixture(scope="module")
def hostile_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    from tests.integration.secure_broker import USERS
    b = start_secure_broker(tmp_path_factory.mktemp("hostile-broker"),
                            {**USERS, **HOSTILE_USERS})
    yield b
    b.stop()


def _cli(b: SecureBroker, tool: str, user: str, *args: str) -> list[str]:
    return [tool, "-h", "127.0.0.1", "-p", str(b.port), "--cafile", str(b.ca_file),
            "-u", user, "-P", b.passwords[user], "-V", "mqttv5", *args]


@contextlib.asynccontextmanager
async def replying_daemon(b: SecureBroker, rack: str, monkeypatch: pytest.MonkeyPatch
                          ) -> AsyncIterator[list[Message]]:
    """Broker user ``valvey`` answering every command on its response topic or /result (a
    stand-in for the daemon: only the broker's decisions are under test here)."""
    from rackplane.clock import SystemClock
    from rackplane.io.mqtt import MqttLink
    from rackplane.settings import Identity, MqttSettings, TlsSettings

    monkeypatch.setenv("FAKE_VALVEY_PW", b.passwords["valvey"])
    link = MqttLink(MqttSettings(host="127.0.0.1", port=b.port, username="valvey",
                                 password_env="FAKE_VALVEY_PW",
                                 tls=TlsSettings(ca_file=b.ca_file)),
                    Identity(rack=rack), "valvey", clock=SystemClock())
    received: list[Message] = []

    async def on_cmd(msg: Message) -> None:
        if "/result" in msg.topic:
            return  # a reply (ours): cmd/# below sees them too
        received.append(msg)
        rid = msg.json().get("request_id")
        await link.publish(msg.response_topic or f"{msg.topic}/result",
                           {"request_id": rid, "ok": True, "error": None, "state": {}},
                           correlation_data=msg.correlation_data)

    link.subscribe(f"{link.topics.base}/cmd/#", on_cmd)
    task = asyncio.create_task(link.run())
    try:
        await link.wait_ready(10.0)
        yield received
    finally:
        await link.stop(1.0)
        task.cancel()
        with contextlib.suppress(BaseException):
            await task


async def test_acl_hostile_usernames_can_neither_command_nor_read_commands_or_replies(
    hostile_broker: SecureBroker, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Users named "+", "#", "a/b", "alice/get_state", "alice/+" (all authenticated) publish
    commands as alice and as themselves, and subscribe to everything while alice commands
    (v5 and 3.1.1): no command of theirs reaches the daemon, and they see no command and no
    reply. alice's replies reach her through her own per-user read line (the ACL has no
    %u pattern left)."""
    b = hostile_broker
    rack = f"acl-{uuid.uuid4().hex[:8]}"
    base = f"rackplane/lab/{rack}/valvey"
    async with replying_daemon(b, rack, monkeypatch) as received:
        outs = {u: tmp_path / f"spy-{i}.out" for i, u in enumerate(HOSTILE_USERS)}
        subs = {}
        for i, u in enumerate(HOSTILE_USERS):
            argv = ["stdbuf", "-oL",  # line-buffered into the file; -d: "received SUBACK"
                    *_cli(b, "mosquitto_sub", u, "-d", "-i", f"spy-{i}", "-t", "#", "-t",
                          "rackplane/#", "-t", f"{base}/cmd/#", "-F", "MSG %t", "-W", "30")]
            with outs[u].open("w") as f:
                subs[u] = await asyncio.create_subprocess_exec(
                    *argv, stdout=f, stderr=asyncio.subprocess.STDOUT)
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 15
            # Live, or refused at CONNECT (Mosquitto refuses some names outright).
            while not all(any(w in o.read_text() for w in ("received SUBACK", "Connection error"))
                          for o in outs.values()):
                assert loop.time() < deadline, {u: o.read_text() for u, o in outs.items()}
                await asyncio.sleep(0.05)
            for u in HOSTILE_USERS:
                for who in ("alice", u):
                    pub = await asyncio.create_subprocess_exec(
                        *_cli(b, "mosquitto_pub", u, "-q", "1", "-t",
                              f"{base}/cmd/{who}/get_state", "-m", '{"request_id":"x"}'),
                        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
                    out, _ = await asyncio.wait_for(pub.communicate(), 20)
                    assert "not authori" in out.decode().lower() or pub.returncode != 0, \
                        (u, who, out)
            for protocol in ("5", "3.1.1"):
                async with as_user(b, "alice", monkeypatch, rack=rack,
                                   protocol=protocol) as alice:
                    r = await alice.call("valvey", "get_state")
                    assert r["ok"] is True
        finally:
            for proc in subs.values():
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
                await asyncio.wait_for(proc.wait(), 20)
    assert [m.topic.split("/cmd/")[1] for m in received] == ["alice/get_state"] * 2
    for u, o in outs.items():
        seen = [ln for ln in o.read_text().splitlines() if ln.startswith("MSG ")]
        assert not [t for t in seen if "/cmd/" in t], (u, seen)
