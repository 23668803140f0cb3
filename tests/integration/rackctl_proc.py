"""rackctl as an operator's script runs it, for the integration tests: the real console entry
point in a subprocess (``python -m rackctl``), no user config (``HOME`` elsewhere), a wide
terminal, a 60 s bound. Shared by tests/integration/test_rackctl_fleet.py and
test_rackctl_pair.py."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

__all__ = ["RACKCTL_TIMEOUT_S", "entry_point", "rackctl", "rackctl_json"]

RACKCTL_TIMEOUT_S = 60.0


async def entry_point(module: str, *argv: str) -> tuple[int, str, str]:
    """Run ``python -m MODULE ARGV`` (a console entry point: rackctl, rlc ...); (exit code,
    stdout, stderr).

    Raises:
        TimeoutError: it ran longer than `RACKCTL_TIMEOUT_S`.
    """
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, *argv, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ, "HOME": "/nonexistent",
                                             "COLUMNS": "250"})
    out, err = await asyncio.wait_for(proc.communicate(), RACKCTL_TIMEOUT_S)
    return proc.returncode or 0, out.decode(), err.decode()


async def rackctl(*argv: str) -> tuple[int, str, str]:
    """Run ``rackctl ARGV`` (`entry_point`)."""
    return await entry_point("rackctl", *argv)


async def rackctl_json(*argv: str) -> tuple[int, dict[str, Any]]:
    """Run ``rackctl ARGV`` (ARGV asks for ``--json``); (exit code, the JSON object it
    printed). Fails the test (with its stderr) when it printed nothing."""
    code, out, err = await rackctl(*argv)
    assert out, err
    doc: dict[str, Any] = json.loads(out)
    return code, doc
