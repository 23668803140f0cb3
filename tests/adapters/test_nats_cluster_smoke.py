"""The private 3-node NATS JetStream cluster of the tests (harness/servers.py): it forms,
every node's MQTT 3.1.1 listener answers, and killing the meta leader elects
another while a restarted node rejoins on the same ports."""

from __future__ import annotations

import socket

from harness.servers import NatsCluster


def _mqtt_connack(port: int, client_id: bytes = b"smoke") -> bytes:
    """Send a bare MQTT 3.1.1 CONNECT (clean session) and return the 4-byte CONNACK."""
    var = b"\x00\x04MQTT\x04\x02\x00\x3c"
    payload = len(client_id).to_bytes(2, "big") + client_id
    body = var + payload
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(bytes([0x10, len(body)]) + body)
        got = b""
        while len(got) < 4:
            chunk = s.recv(4 - len(got))
            if not chunk:
                break
            got += chunk
    return got


def test_three_nodes_form_one_jetstream_cluster_with_mqtt_on_each(
    nats_cluster: NatsCluster,
) -> None:
    assert len(nats_cluster.nodes) == 3
    leader = nats_cluster.meta_leader()
    assert leader in {n.name for n in nats_cluster.nodes}
    for node in nats_cluster.nodes:
        meta = node.jsz()["meta_cluster"]
        assert meta["cluster_size"] == 3
        assert meta.get("leader") == leader
        # 0x20 = CONNACK, remaining length 2, no session present, return code 0 (accepted)
        assert _mqtt_connack(node.mqtt_port) == b"\x20\x02\x00\x00"


def test_killing_the_meta_leader_elects_another_restart_rejoins_pause_resumes(
    nats_cluster_private: NatsCluster,
) -> None:
    cluster = nats_cluster_private
    first = cluster.wait_meta_leader()
    node = cluster.node(first)
    port = node.port
    node.kill()
    assert not node.running
    second = cluster.wait_meta_leader(exclude=first)
    assert second != first
    node.start()
    assert node.port == port
    cluster.wait_joined(first)
    follower = next(n for n in cluster.nodes if n.name != second)
    follower.pause()  # SIGSTOP: a hung node; the others keep their leader
    try:
        assert follower.paused
        assert cluster.wait_meta_leader() == second
    finally:
        follower.resume()
    assert not follower.paused
    cluster.wait_joined(follower.name)
