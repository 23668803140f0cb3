"""Shared test configuration: the real-server fixtures live in tests/servers.py
(launcher: harness/servers.py)."""

import asyncio
import gc
import inspect
from collections.abc import AsyncIterator

import pytest

pytest_plugins = ["tests.servers"]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Move what collection left alive (every test module, ~380 k objects for the whole
    suite) to the permanent generation, as `rackplane.io.service.run_daemon` does for a daemon:
    a full collection over it took 200-550 ms on a loaded 2-core host, which an in-process
    loop-lag test (BR-24 d) would otherwise measure as its own lag."""
    gc.collect()
    gc.freeze()


# The layers whose tests run real servers and processes against wall-clock deadlines (a NATS
# election takes 4-9 s; a 2-core CI host is shared by two xdist workers).
_RERUN_LAYERS = ("adapters", "integration")


def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Every async test checks that it leaks no task (pymodbus' system-health fixture).

    A test of the real-server layers (tests/adapters, tests/integration) that fails gets one
    rerun (pytest-rerunfailures), and one only: a test that fails twice fails the run, and every
    test that passed on its rerun is named in the summary (``-rR`` in pyproject's addopts) as a
    flake to chase, never hidden. Unit, scenario and lock-step tests are deterministic and get
    no rerun. ``make test PYTEST_ARGS="-n0 -p no:rerunfailures"`` runs without any."""
    rerun = config.pluginmanager.hasplugin("rerunfailures")
    for item in items:
        fn = getattr(item, "function", None)
        if fn is not None and inspect.iscoroutinefunction(fn):
            item.fixturenames.insert(0, "no_leaked_tasks")
        if rerun and item.path.parent.name in _RERUN_LAYERS and not item.get_closest_marker(
            "flaky"
        ):
            item.add_marker(pytest.mark.flaky(reruns=1, reruns_delay=2))


@pytest.fixture
async def no_leaked_tasks() -> AsyncIterator[None]:
    """Fail an async test that leaves a task of its own running after its fixtures are torn
    down (a daemon or link not stopped, a fire-and-forget task without an owner). Tasks get
    up to 1 s to finish the cancellation they were given."""
    before = set(asyncio.all_tasks())
    yield
    me = asyncio.current_task()
    leaked: set[asyncio.Task[object]] = set()
    for _ in range(20):
        leaked = {t for t in asyncio.all_tasks() - before if t is not me and not t.done()}
        if not leaked:
            return
        await asyncio.sleep(0.05)
    names = sorted(f"{t.get_name()} ({t.get_coro()!r:.80})" for t in leaked)
    for t in leaked:
        t.cancel()
    pytest.fail(f"the test leaked {len(leaked)} running task(s): {names}")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """For each test that failed and was rerun, the first attempt's error (its last 1,500
    characters): "RERUN" alone names the flake, this says what went wrong, so the next run's
    reader can chase it without reproducing it."""
    reruns = terminalreporter.stats.get("rerun", [])
    if not reruns:
        return
    terminalreporter.section("first attempts of the rerun tests")
    for rep in reruns:
        text = getattr(rep, "longreprtext", "") or str(getattr(rep, "longrepr", ""))
        terminalreporter.write_line(f"--- {rep.nodeid}")
        terminalreporter.write_line(text[-1500:])
