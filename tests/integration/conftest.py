"""Integration tests: every daemon or simulator process a test starts is stopped after it."""

from collections.abc import Iterator

import pytest

from harness.daemons import reap_all


@pytest.fixture(autouse=True)
def reap() -> Iterator[None]:
    yield
    reap_all()
