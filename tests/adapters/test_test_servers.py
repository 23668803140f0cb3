"""The test-server harness itself: port picks that cannot race outgoing connections, and a
server that loses a port race is started again on fresh ports (CI once lost a run to
nats-server finding its monitor port taken)."""

from __future__ import annotations

import itertools
import socket
from pathlib import Path

import pytest

from harness import ports, servers
from harness.ports import ephemeral_range


def test_free_ports_are_distinct_and_below_the_ephemeral_range() -> None:
    low, _high = ephemeral_range()
    ports = [servers.free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    if low - 10000 >= 1000:
        assert all(10000 <= p < low for p in ports)


def test_a_server_whose_port_is_taken_raises_port_clash(tmp_path: Path) -> None:
    binary = servers.require_binary("mosquitto", "mosquitto")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        # bound, not listening: connections are refused (a listener would pass for the
        # server) and mosquitto's bind fails
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
        conf = tmp_path / "m.conf"
        conf.write_text(servers.mosquitto_config(port))
        srv = servers.Mosquitto(argv=[binary, "-c", str(conf)], port=port,
                                log_path=tmp_path / "m.log")
        with pytest.raises(servers.PortClash, match="did not start"):
            srv.start()
        assert not srv.running


def test_start_retries_on_fresh_ports_after_a_clash(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    servers.require_binary("mosquitto", "mosquitto")
    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind(("127.0.0.1", 0))
    real_free_port = servers.free_port
    picks: list[int] = []

    def first_pick_taken() -> int:
        port = taken.getsockname()[1] if not picks else real_free_port()
        picks.append(port)
        return port

    monkeypatch.setattr(servers, "free_port", first_pick_taken)
    try:
        srv = servers.start_mosquitto(tmp_path)
        try:
            assert srv.running and srv.port == picks[-1] != picks[0]
        finally:
            srv.stop()
    finally:
        taken.close()


def test_a_port_held_by_another_listener_is_a_clash_not_a_start(tmp_path: Path) -> None:
    """A listener of another program on the picked port accepts connections: the server (which
    failed to bind) must not pass for started because the port answers."""
    binary = servers.require_binary("mosquitto", "mosquitto")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        conf = tmp_path / "m.conf"
        conf.write_text(servers.mosquitto_config(port))
        srv = servers.Mosquitto(argv=[binary, "-c", str(conf)], port=port,
                                log_path=tmp_path / "m.log")
        with pytest.raises(servers.PortClash, match="did not start"):
            srv.start()
        assert not srv.running


def test_a_nats_node_waits_for_all_its_ports(tmp_path: Path) -> None:
    """A NATS node whose monitor port is held by another listener is a clash even though its
    client port would answer (the CI failure: monitor port taken between pick and bind)."""
    binary = servers.require_binary("nats-server", "nats-server")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        store = tmp_path / "store"
        store.mkdir()
        node = servers.NatsNode(argv=[], port=servers.free_port(), log_path=tmp_path / "n.log",
                                name="n0", cluster_port=servers.free_port(),
                                mqtt_port=servers.free_port(),
                                monitor_port=holder.getsockname()[1], store_dir=store)
        conf = tmp_path / "n0.conf"
        conf.write_text(servers.nats_node_config(node, "c", [node.cluster_port]))
        node.argv = [binary, "-c", str(conf)]
        with pytest.raises(servers.PortClash):
            node.start()
        assert not node.running


@pytest.mark.parametrize("count", [2, 3, 4])
def test_xdist_workers_pick_from_disjoint_slices(monkeypatch: pytest.MonkeyPatch,
                                                 count: int) -> None:
    slices = []
    for i in range(count):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{i}")
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(count))
        slices.append(ports._worker_slice(10000, 32768))
    assert slices[0][0] == 10000 and slices[-1][1] <= 32768
    for (_a0, a1), (b0, _b1) in itertools.pairwise(slices):
        assert a1 <= b0
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert ports._worker_slice(10000, 32768) == (10000, 32768)
