"""config/nats/ on the real 3-node cluster (issue 15 item 3): each role's allowed publishes go
through, denied ones are refused (NATS: permission violation; MQTT 3.1.1 through the NATS
listener: PUBACK as usual but the message is dropped, and the server logs a "Publish
Violation" naming the user and subject, as Mosquitto drops it silently), and a daemon's
lease operations work on its own keys only.

The cluster's nodes include the shipped config/nats/authorization.conf (copied beside each
node's config: nats-server 2.9.10 resolves includes relative to the including file).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.servers import NatsCluster, free_port
from rackplane.io.nats.errors import KvUnknown
from rackplane.io.nats.kv import NatsKv
from rackplane.natsacl import password_var
from tests.servers import start_nats_cluster

paho = pytest.importorskip("paho.mqtt.client")
from paho.mqtt.enums import CallbackAPIVersion  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def password(user: str) -> str:
    """The test password of ``user`` (set in its authorization.conf variable)."""
    return f"pw-{password_var(user)}-test"


def password_vars() -> set[str]:
    """Every password variable the shipped config/nats/ files name (users of the ACL, rlc,
    and each rack's fleet user)."""
    return {v for f in (ROOT / "config" / "nats").glob("*.conf")
            for v in re.findall(r"\$(RACKPLANE_NATS_PASSWORD_\w+)", f.read_text())}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    tmp = tmp_path_factory.mktemp("nats_acl")
    for f in (ROOT / "config" / "nats").glob("*.conf"):
        shutil.copy(f, tmp / f.name)
    names = password_vars()
    saved = {k: os.environ.get(k) for k in names}
    for k in names:
        os.environ[k] = f"pw-{k}-test"
    try:
        c = start_nats_cluster(tmp, extra_conf="include authorization.conf")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    yield c
    c.stop()


class Mqtt:
    """A paho MQTT 3.1.1 client of one user, recording messages and disconnects."""

    def __init__(self, cluster: NatsCluster, user: str, pw: str | None = None) -> None:
        self.msgs: list[tuple[str, bytes]] = []
        self.disconnects: list[str] = []
        self.connack: list[str] = []
        self.c = paho.Client(CallbackAPIVersion.VERSION2,
                             client_id=f"{user}-{uuid.uuid4().hex[:8]}", protocol=paho.MQTTv311)
        self.c.username_pw_set(user, pw if pw is not None else password(user))
        self.c.on_message = lambda _c, _u, m: self.msgs.append((m.topic, m.payload))
        self.c.on_disconnect = lambda _c, _u, _f, rc, _p: self.disconnects.append(str(rc))
        self.c.on_connect = lambda _c, _u, _f, rc, _p: self.connack.append(str(rc))
        self.c.connect("127.0.0.1", cluster.nodes[0].mqtt_port)
        self.c.loop_start()
        deadline = time.monotonic() + 10
        while not (self.connack or self.disconnects) and time.monotonic() < deadline:
            time.sleep(0.02)

    def publish(self, topic: str, payload: bytes = b"x") -> None:
        info = self.c.publish(topic, payload, qos=1)
        info.wait_for_publish(5)

    def close(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()


def _violations(cluster: NatsCluster, kind: str, user: str, subject: str) -> int:
    needle = f'{kind} Violation - User "{user}", Subject "{subject}"'
    return sum(n.log_path.read_text(errors="replace").count(needle) for n in cluster.nodes)


def _wait(cond: Any, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return bool(cond())


@pytest.fixture
def observer(cluster: NatsCluster) -> Iterator[Mqtt]:
    """A daemon user (reads all of rackplane/#) watching every publish of the test."""
    obs = Mqtt(cluster, "racky")
    obs.c.subscribe("rackplane/#", qos=0)
    time.sleep(0.5)
    yield obs
    obs.close()


# role, user, topic, allowed. "S" stands for a unique site level per case.
CASES = [
    ("daemon", "valvey", "rackplane/S/r1/valvey/status", True),
    ("daemon", "valvey", "rackplane/S/r1/valvey/status/a", True),
    ("daemon", "valvey", "rackplane/S/r1/valvey/state/pair_a", True),
    ("daemon", "valvey", "rackplane/S/r1/valvey/alarm/no_active_controller:a", True),
    ("daemon", "valvey", "rackplane/S/r1/valvey/cmd/alice/handover/result", True),
    ("daemon", "valvey", "rackplane/S/r1/racky/cmd/valvey/set_cap", True),
    ("daemon", "valvey", "rackplane/S/r1/racky/status", False),
    ("daemon", "valvey", "rackplane/S/r1/racky/state/health", False),
    ("daemon", "valvey", "rackplane/S/r1/valvey/cmd/alice/handover", False),
    ("operator", "alice", "rackplane/S/r1/valvey/cmd/alice/handover", True),
    ("operator", "alice", "rackplane/S/r1/valvey/cmd/bms/handover", False),
    ("operator", "alice", "rackplane/S/r1/valvey/status/a", False),
    ("operator", "alice", "rackplane/S/r1/valvey/cmd/alice/handover/result", False),
    ("reader", "grafana", "rackplane/S/r1/valvey/cmd/grafana/get_state", False),
    ("reader", "grafana", "rackplane/S/r1/valvey/status", False),
]


@pytest.mark.parametrize(("role", "user", "topic", "allowed"), CASES,
                         ids=[f"{c[1]}-{c[2].split('/', 3)[3]}" for c in CASES])
def test_mqtt_publish_by_role(cluster: NatsCluster, observer: Mqtt, role: str, user: str,
                              topic: str, allowed: bool) -> None:
    topic = topic.replace("/S/", f"/s{uuid.uuid4().hex[:10]}/")
    subject = topic.replace("/", ".")
    client = Mqtt(cluster, user)
    try:
        assert client.connack == ["Success"], (user, client.connack, client.disconnects)
        client.publish(topic, b"payload")
        delivered = _wait(lambda: any(t == topic for t, _ in observer.msgs),
                          timeout_s=3.0 if allowed else 1.5)
        refused = _wait(lambda: _violations(cluster, "Publish", user, subject) > 0, 1.0)
        assert delivered is allowed, (role, user, topic)
        assert refused is not allowed, (role, user, topic)
    finally:
        client.close()


def test_reader_cannot_subscribe_to_commands_but_reads_status(
        cluster: NatsCluster) -> None:
    site = f"s{uuid.uuid4().hex[:10]}"
    reader = Mqtt(cluster, "grafana")
    daemon = Mqtt(cluster, "valvey")
    try:
        reader.c.subscribe(f"rackplane/{site}/+/+/cmd/+/+", qos=0)
        reader.c.subscribe(f"rackplane/{site}/+/+/status/+", qos=1)  # QoS 1: $MQTT.sub.>
        time.sleep(0.5)
        daemon.publish(f"rackplane/{site}/r1/valvey/status/b", b"online")
        daemon.publish(f"rackplane/{site}/r1/valvey/cmd/alice/get_state/result", b"reply")
        assert _wait(lambda: (f"rackplane/{site}/r1/valvey/status/b", b"online")
                     in reader.msgs)
        assert _wait(lambda: _violations(cluster, "Subscription", "grafana",
                                         f"rackplane.{site}.*.*.cmd.*.*") > 0)
        time.sleep(0.5)
        assert [t for t, _ in reader.msgs] == [f"rackplane/{site}/r1/valvey/status/b"]
    finally:
        reader.close()
        daemon.close()


def test_a_reader_cannot_see_others_qos1_deliveries_through_mqtt_sub(
        cluster: NatsCluster) -> None:
    """Every role holds "$MQTT.sub.>" (QoS 1 deliveries on 2.9.10): an MQTT reader that
    subscribes to that internal space gets nothing of an operator's replies."""
    site = f"s{uuid.uuid4().hex[:10]}"
    reply = f"rackplane/{site}/r1/valvey/cmd/alice/get_state/result"
    snoop, alice, daemon = (Mqtt(cluster, u) for u in ("grafana", "alice", "valvey"))
    try:
        snoop.c.subscribe("$MQTT/sub/#", qos=0)
        snoop.c.subscribe("$MQTT/#", qos=0)
        alice.c.subscribe(f"rackplane/{site}/+/+/cmd/alice/+/result", qos=1)
        time.sleep(0.5)
        daemon.publish(reply, b"secret")
        assert _wait(lambda: (reply, b"secret") in alice.msgs)
        time.sleep(0.5)
        assert snoop.msgs == []
    finally:
        for c in (snoop, alice, daemon):
            c.close()


def test_wrong_password_and_unknown_user_are_refused(cluster: NatsCluster) -> None:
    for user, pw in (("valvey", "wrong"), ("mallory", "pw-mallory-test")):
        c = Mqtt(cluster, user, pw)
        try:
            assert c.connack != ["Success"], user
        finally:
            c.close()


async def _lease_ops(cluster: NatsCluster) -> dict[str, Any]:
    out: dict[str, Any] = {}
    site = f"s{uuid.uuid4().hex[:10]}"
    kv = await NatsKv.connect(cluster.urls, "rackplane_leases", replicas=3,
                              request_timeout_s=2.0, name="valvey-a", user="valvey",
                              password=password("valvey"))
    try:
        key = f"{site}.r1.valvey"
        rev = await kv.create(key, b'{"owner": "a/1"}')
        out["rev"] = rev
        out["rev2"] = await kv.update(key, b'{"owner": "a/1", "seq": 2}', rev)
        out["probe"] = await kv.put(f"{key}.probe", b"p")
        out["got"] = await kv.read(key)
        await kv.delete(key, out["rev2"])
        out["deleted"] = await kv.read(key)
        try:
            await kv.create(f"{site}.r1.racky", b'{"owner": "x"}')
            out["racky"] = "written"
        except KvUnknown:
            out["racky"] = "refused"
    finally:
        await kv.close()
    out["violation"] = _violations(cluster, "Publish", "valvey",
                                   f"$KV.rackplane_leases.{site}.r1.racky")
    # Readers and operators cannot use NATS natively at all (allowed_connection_types MQTT).
    # (nats-py retries a refused first connect: bounded here.)
    try:
        kv2 = await asyncio.wait_for(NatsKv.connect(
            cluster.urls, "rackplane_leases", replicas=3, user="grafana",
            password=password("grafana"), connect_timeout_s=2.0), 5.0)
        await kv2.close()
        out["reader_native"] = "connected"
    except (KvUnknown, TimeoutError) as err:
        out["reader_native"] = repr(err)
    out["auth_log"] = sum(n.log_path.read_text(errors="replace").count(
        'authentication error - User "grafana"')
                          for n in cluster.nodes)
    return out


def test_daemon_lease_ops_on_its_own_keys_only(cluster: NatsCluster) -> None:
    out = asyncio.run(_lease_ops(cluster))
    assert out["rev"] > 0 and out["rev2"] > out["rev"] and out["probe"] > out["rev2"]
    assert out["got"] == (out["rev2"], b'{"owner": "a/1", "seq": 2}')
    assert out["deleted"] is None
    assert out["racky"] == "refused" and out["violation"] >= 1
    assert out["reader_native"] != "connected" and out["auth_log"] >= 1, out


def test_valvey_runs_under_its_users_mqtt_and_kv_without_a_violation(
        cluster: NatsCluster, tmp_path: Path) -> None:
    """A real valvey with ``[leadership]`` on the authenticated cluster: MQTT 3.1.1 through
    the NATS listener and the lease bucket natively, both as user ``valvey``. It becomes
    active, a reader sees its ``status/a`` and ``state/pair_a``, alice's command gets its
    reply, and no node logs a single permission violation of user valvey: the generated
    grants cover everything the daemon does. (Another bucket than the generated file's is
    refused: "$JS.API.STREAM.INFO.KV_<other>" violations, the daemon stays standby.)"""
    from harness.chaos import LEASE
    from harness.daemons import STARTED, command_envelope, valvey_proc, write_config

    rack = f"r{uuid.uuid4().hex[:10]}"
    base = f"rackplane/lab/{rack}/valvey"
    cfg = write_config(
        tmp_path / "valvey-a.toml", identity={"site": "lab", "rack": rack},
        cdu={"port": free_port()},
        mqtt={"port": cluster.nodes[1].mqtt_port, "protocol": "3.1.1", "username": "valvey",
              "password_env": "VALVEY_MQTT_PW", "reconnect_max_s": 1.0, "keepalive_s": 5},
        spool={"directory": str(tmp_path / "spool")},
        commands={"users": {"alice": "operator"}},
        leadership={"enabled": True, "instance": "a", "servers": cluster.urls,
                    "username": "valvey", "password_env": "VALVEY_NATS_PW",
                    "bucket": "rackplane_leases", **LEASE},  # the one config/nats/ grants
        log={"format": "json"})
    proc = valvey_proc(tmp_path, cfg, env={"VALVEY_MQTT_PW": password("valvey"),
                                           "VALVEY_NATS_PW": password("valvey")})
    reader = Mqtt(cluster, "grafana")
    alice = Mqtt(cluster, "alice")
    try:
        reader.c.subscribe(f"{base}/status/+", qos=1)
        reader.c.subscribe(f"{base}/state/+", qos=1)
        alice.c.subscribe(f"{base}/cmd/alice/+/result", qos=1)
        proc.start()

        def pair_a() -> dict[str, Any]:
            docs = [json.loads(p) for t, p in reader.msgs if t == f"{base}/state/pair_a" and p]
            return docs[-1] if docs else {}

        assert _wait(lambda: pair_a().get("role") == "active", 40.0), (pair_a(), proc.alive())
        assert any(t == f"{base}/status/a" and json.loads(p)["status"] == "online"
                   for t, p in reader.msgs if p), reader.msgs[:5]
        alice.publish(f"{base}/cmd/alice/get_state", command_envelope("acl-1", {}).encode())
        assert _wait(lambda: any(json.loads(p).get("request_id") == "acl-1"
                                 for _, p in alice.msgs if p), 10.0), alice.msgs
        time.sleep(2.0)  # renewals and sync records under way
        assert pair_a()["renew_failures"] == 0 and pair_a().get("sync_puts_failed", 0) == 0
        # other tests of this module provoke violations of user valvey on purpose (other
        # sites, other buckets): only this daemon's rack, bucket or inbox count here
        logs = "".join(n.log_path.read_text(errors="replace") for n in cluster.nodes)
        own = [ln for ln in logs.splitlines() if "Violation" in ln
               and 'User "valvey"' in ln and (rack in ln or "_INBOX" in ln
                                               or "$JS" in ln or "$MQTT" in ln)]
        assert own == [], own
    finally:
        reader.close()
        alice.close()
        proc.stop()
        if proc in STARTED:
            STARTED.remove(proc)


async def _refused_connects(cluster: NatsCluster) -> dict[str, Any]:
    """A refused login and a dead cluster each end in KvUnknown by themselves (no outer
    timeout), and a connect cancelled at any point of nats-py's retry loop ends cancelled."""
    out: dict[str, Any] = {}
    for label, servers, user, pw in (
            ("wrong_password", cluster.urls, "valvey", "not-the-password"),
            ("mqtt_only_user", cluster.urls, "grafana", password("grafana")),
            ("dead_servers", [f"nats://127.0.0.1:{free_port()}" for _ in range(3)], None, None)):
        t0 = time.monotonic()
        try:
            kv = await NatsKv.connect(servers, "rackplane_leases", user=user, password=pw,
                                      connect_timeout_s=1.0)
            await kv.close()
            out[label] = "connected"
        except KvUnknown:
            out[label] = "KvUnknown"
        out[f"{label}_s"] = time.monotonic() - t0
    ends = []
    for i in range(12):  # cancel at 0, 25, ..., 275 ms: inside nats-py's close/flush too
        task = asyncio.create_task(NatsKv.connect(
            cluster.urls, "rackplane_leases", user="valvey", password="wrong",
            connect_timeout_s=1.0))
        await asyncio.sleep(i * 0.025)
        if task.done():  # gave up (KvUnknown) before the cancel came
            ends.append(f"ended first: {type(task.exception()).__name__}")
            continue
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=10.0)
        ends.append("cancelled" if task in done and task.cancelled()
                    else f"other end: {task.exception()!r}" if task in done
                    else "still running")
        if task not in done:  # do not leak a looping client into the next test
            task.cancel()
    out["cancel_ends"] = ends
    return out


@pytest.mark.timeout(120)
def test_a_refused_or_unreachable_connect_ends_and_a_cancel_is_honoured(
        cluster: NatsCluster) -> None:
    """nats-py retries a first connect without end when told to reconnect without end, and
    its close swallows a cancellation: a daemon started with a wrong password or against a
    dead cluster would hang silently in start-up (never logging ``*_connect_failed``) and a
    stop would not stop it. `NatsKv.connect` bounds the first connect and honours a cancel."""
    out = asyncio.run(_refused_connects(cluster))
    assert out["wrong_password"] == out["mqtt_only_user"] == "KvUnknown", out
    assert out["dead_servers"] == "KvUnknown", out
    ends = out["cancel_ends"]
    assert all(e in ("cancelled", "ended first: KvUnknown") for e in ends), ends
    assert ends[:4] == ["cancelled"] * 4, ends  # 0-75 ms: always inside the retry loop
