"""Shared test configuration: the real-server fixtures live in tests/servers.py
(launcher: harness/servers.py)."""

import gc

import pytest

pytest_plugins = ["tests.servers"]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Move what collection left alive (every test module, ~380 k objects for the whole
    suite) to the permanent generation, as `rackplane.io.service.run_daemon` does for a daemon:
    a full collection over it took 200-550 ms on a loaded 2-core host, which an in-process
    loop-lag test (BR-24 d) would otherwise measure as its own lag."""
    gc.collect()
    gc.freeze()
