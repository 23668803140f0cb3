"""racky through a SIGKILL (issue 7): READY again after the restart, the operator's budget
(persisted state, racky.core.lifecycle's versioned state file) survives, and no line its spool held
at the kill is lost (embedded store: no database, so every line stays in the spool)."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from pathlib import Path

import pytest

from harness.daemons import (
    NotifySocket,
    Proc,
    racky_proc,
    spool_lines,
    until,
    write_config,
)
from harness.servers import Mosquitto
from rackctl.client import ClientSettings, CommandClient

pytestmark = [pytest.mark.servers, pytest.mark.slow]


async def test_racky_sigkill_restart_ready_state_kept_no_spooled_line_lost(
    tmp_path: Path, mosquitto: Mosquitto
) -> None:
    rack = f"durr-{uuid.uuid4().hex[:8]}"
    cfg = write_config(
        tmp_path / "racky.toml",
        identity={"site": "lab", "rack": rack},
        mqtt={"port": mosquitto.port, "reconnect_max_s": 1.0},
        spool={"directory": str(tmp_path / "spool")},
        lifecycle={"state_file": str(tmp_path / "racky-state.json")},
        commands={"users": {"alice": "operator"}},
        log={"format": "json"},
    )

    def racky(n: NotifySocket, tag: str) -> Proc:
        return racky_proc(tmp_path, cfg, env={"NOTIFY_SOCKET": n.name}, tag=tag).start()

    client = CommandClient(ClientSettings(port=mosquitto.port, rack=rack, username="alice",
                                          timeout_s=30.0))
    client.expect_replies_from("racky")
    n1, n2 = NotifySocket(), NotifySocket()
    r1 = racky(n1, "1")
    r2: Proc | None = None
    try:
        async with client:
            await until(lambda: n1.ready_at() is not None, 30, "READY", r1)
            # READY never waits on the broker (DESIGN §3): a command sent before racky has
            # subscribed would be lost, so wait for its subscription first
            await until(lambda: any(e.get("event") == "mqtt_subscribed" for e in r1.events()),
                        30, "racky subscribed", r1)
            r = await client.call("racky", "set_budget",
                                  {"power_w": 91_000.0, "reason": "durability test"})
            assert r["ok"] is True, r
            before = await asyncio.to_thread(spool_lines, tmp_path / "spool")
            await until(lambda: len(spool_lines(tmp_path / "spool")) > len(before) + 5, 30,
                         "more telemetry in the spool", r1)
            r1.signal(signal.SIGKILL)
            assert r1.wait(10) == -signal.SIGKILL
            at_kill = await asyncio.to_thread(spool_lines, tmp_path / "spool")
            assert at_kill

            t_spawn = time.monotonic()
            r2 = racky(n2, "2")
            await until(lambda: n2.ready_at() is not None, 30, "READY after restart", r2)
            print(f"durability.racky_sigkill_restart_ready_s = "
                  f"{(n2.ready_at() or 0.0) - t_spawn:.2f}")
            st = await client.call("racky", "get_state")
            assert st["ok"] is True and st["state"]["budget_w"] == 91_000.0, st
            r2.signal(signal.SIGTERM)
            assert r2.wait(30) == 0
        after = await asyncio.to_thread(spool_lines, tmp_path / "spool")
        kept = set(after)
        lost = [ln for ln in at_kill if ln not in kept]
        print(f"durability.racky_sigkill_spooled_lines = {len(at_kill)}, lost = {len(lost)}")
        assert not lost, lost[:3]
    finally:
        n1.close()
        n2.close()
        r1.stop()
        if r2 is not None:
            r2.stop()
