"""Test set-up that several test modules need lives in one helper, so a fix to it (a timeout,
the environment rackctl runs in) reaches every test: rackctl as a subprocess is
tests/integration/rackctl_proc.py."""

from __future__ import annotations

import ast
from pathlib import Path

INTEGRATION = Path(__file__).parent.parent / "integration"


def _defined(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in tree.body
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_the_rackctl_tests_run_rackctl_through_the_shared_helper() -> None:
    assert {"rackctl", "rackctl_json"} <= _defined(INTEGRATION / "rackctl_proc.py")
    for name in ("test_rackctl_fleet.py", "test_rackctl_pair.py"):
        src = (INTEGRATION / name).read_text()
        assert not {"rackctl", "rackctl_json"} & _defined(INTEGRATION / name), name
        assert "from tests.integration.rackctl_proc import" in src, name
        assert "create_subprocess_exec" not in src, name
