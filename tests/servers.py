"""pytest fixtures for the real servers (the launcher is `harness.servers`, pytest-free).

A missing server binary is a skip on a developer machine and a failure under ``CI=true``
(DESIGN §5).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import servers as _servers
from harness.servers import InfluxDB1, Mosquitto, NatsCluster, ServerMissing, VictoriaMetrics


def _missing(err: ServerMissing) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(str(err))
    pytest.skip(str(err))


def require_binary(name: str, package: str) -> str:
    """`harness.servers.require_binary`, skipping (developer) or failing (CI=true) when missing."""
    try:
        return _servers.require_binary(name, package)
    except ServerMissing as err:
        _missing(err)
        raise


def start_mosquitto(tmp: Path, extra_conf: str = "") -> Mosquitto:
    """`harness.servers.start_mosquitto`, skipping (developer) or failing (CI=true) when
    Mosquitto is missing."""
    try:
        return _servers.start_mosquitto(tmp, extra_conf)
    except ServerMissing as err:
        _missing(err)
        raise


def start_victoria(tmp: Path) -> VictoriaMetrics:
    """`harness.servers.start_victoria`, skipping (developer) or failing (CI=true) when
    VictoriaMetrics is missing."""
    try:
        return _servers.start_victoria(tmp)
    except ServerMissing as err:
        _missing(err)
        raise


def start_influxdb1(tmp: Path, admin: tuple[str, str] | None = None) -> InfluxDB1:
    """`harness.servers.start_influxdb1`, skipping (developer) or failing (CI=true) when
    influxd (Debian ``influxdb``) is missing."""
    try:
        return _servers.start_influxdb1(tmp, admin)
    except ServerMissing as err:
        _missing(err)
        raise


def start_nats_cluster(tmp: Path, extra_conf: str = "") -> NatsCluster:
    """`harness.servers.start_nats_cluster` (3 nodes), skipping (developer) or failing
    (CI=true) when nats-server (Debian ``nats-server``) is missing."""
    try:
        return _servers.start_nats_cluster(tmp, extra_conf=extra_conf)
    except ServerMissing as err:
        _missing(err)
        raise


@pytest.fixture(scope="session")
def mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mosquitto]:
    """A private Mosquitto for the whole session (tests must not restart it: use
    ``mosquitto_private`` for that)."""
    srv = start_mosquitto(tmp_path_factory.mktemp("mosquitto"))
    yield srv
    srv.stop()


@pytest.fixture
def mosquitto_private(tmp_path: Path) -> Iterator[Mosquitto]:
    """A Mosquitto of this test's own, free to stop and restart."""
    srv = start_mosquitto(tmp_path)
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def victoria(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VictoriaMetrics]:
    """A private VictoriaMetrics for the whole session (query by a unique tag per test)."""
    srv = start_victoria(tmp_path_factory.mktemp("victoria"))
    yield srv
    srv.stop()


@pytest.fixture
def victoria_private(tmp_path: Path) -> Iterator[VictoriaMetrics]:
    """A VictoriaMetrics of this test's own, free to stop and restart (outages)."""
    srv = start_victoria(tmp_path)
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def influxdb1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InfluxDB1]:
    """A private InfluxDB 1.x for the whole session (a database per test)."""
    srv = start_influxdb1(tmp_path_factory.mktemp("influxdb1"))
    yield srv
    srv.stop()


@pytest.fixture
def influxdb1_private(tmp_path: Path) -> Iterator[InfluxDB1]:
    """An InfluxDB 1.x of this test's own, free to stop and restart (outages)."""
    srv = start_influxdb1(tmp_path)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def nats_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    """A private 3-node NATS JetStream cluster shared by one test module (tests must not
    kill, pause or restart its nodes: use ``nats_cluster_private`` for that; use a bucket or
    key of the test's own)."""
    cluster = start_nats_cluster(tmp_path_factory.mktemp("nats"))
    yield cluster
    cluster.stop()


@pytest.fixture
def nats_cluster_private(tmp_path: Path) -> Iterator[NatsCluster]:
    """A 3-node NATS JetStream cluster of this test's own, free to kill, pause and restart
    nodes (outages, elections, lost quorum)."""
    cluster = start_nats_cluster(tmp_path)
    yield cluster
    cluster.stop()
