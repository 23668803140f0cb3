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
from harness.servers import Mosquitto, ServerMissing, VictoriaMetrics


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
