"""Durability with the real servers (issue 7): database outage, SIGKILL and restart, and an
unwritable spool.

- valvey runs against the CDU simulator with its database (a private VictoriaMetrics) down
  from the start: everything goes to the spool, whose depth ``state/health`` shows growing.
  valvey is then SIGKILLed; the lines its spool holds at that moment are the reference. The
  database comes back, valvey restarts: READY again (systemd's notify socket, a test socket
  here), the spool drains (depth back to ~0 in ``state/health``) and every reference point is
  in the database: 0 spooled points lost.
- With the spool unwritable, telemetry waits in memory under the stated policy (the oldest
  telemetry lines go first, counted) while alarm and command lines are all kept and sent.

Broker restarts (resubscribed, commands applied after) are covered by
tests/integration/test_valvey_broker.py and test_br22_commands.py (BR-22 b).
Timings are reported (printed), never asserted tightly: bounds here are generous.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from harness.daemons import (
    MqttClient,
    NotifySocket,
    sim_proc,
    spool_lines,
    until,
    valvey_proc,
    write_config,
)
from harness.servers import Mosquitto, VictoriaMetrics, free_port
from rackplane.clock import FakeClock
from rackplane.io.mqtt import Message
from rackplane.io.tsdb import TelemetryWriter
from rackplane.settings import Identity, MqttSettings, SpoolSettings, TsdbSettings

pytestmark = [pytest.mark.servers, pytest.mark.slow]

TS = 1_767_225_600 * 10**9  # 2026-01-01T00:00:00Z


class Health(MqttClient):
    """valvey's retained ``state/health``, as any monitoring tool reads it."""

    def __init__(self, port: int, rack: str):
        super().__init__(
            MqttSettings(port=port, clean_session=True, client_id=f"dur-{uuid.uuid4().hex[:8]}",
                         reconnect_max_s=1.0),
            Identity(rack=rack),
        )
        self.last: dict[str, Any] = {}
        self.depths: list[int] = []
        self.link.subscribe(f"rackplane/lab/{rack}/valvey/state/health", self._on, qos=0)

    def _on(self, msg: Message) -> None:
        try:
            self.last = json.loads(msg.payload)
        except ValueError:
            return
        self.depths.append(int(self.last.get("spool", {}).get("depth_lines", -1)))


def _setpoint_ts_ms(lines: list[str], rack: str) -> set[int]:
    """Timestamps (ms) of the supply loop's ``pid`` lines carrying ``setpoint_c``."""
    out: set[int] = set()
    for ln in lines:
        if ln.startswith("pid,") and "loop=supply_temp" in ln and f"rack={rack}" in ln:
            _head, fields, ts = ln.rsplit(" ", 2)
            if any(f.startswith("setpoint_c=") for f in fields.split(",")):
                out.add(int(ts) // 1_000_000)
    return out


async def test_outage_then_sigkill_then_restart_loses_no_spooled_point(
    tmp_path: Path, mosquitto: Mosquitto, victoria_private: VictoriaMetrics
) -> None:
    vm = victoria_private
    rack = f"dur-{uuid.uuid4().hex[:8]}"
    modbus_port = free_port()
    await asyncio.to_thread(vm.stop)  # the database is down from the start
    cfg = write_config(
        tmp_path / "valvey.toml",
        identity={"site": "lab", "row": "row1", "rack": rack},
        cdu={"port": modbus_port, "reconnect_min_s": 0.2, "reconnect_max_s": 2.0},
        mqtt={"port": mosquitto.port, "reconnect_max_s": 2.0},
        tsdb={"url": vm.url, "flush_interval_s": 0.2, "retry_initial_s": 0.2,
              "retry_max_s": 1.0},
        spool={"directory": str(tmp_path / "spool")},
        log={"format": "json"},
    )
    sim = sim_proc(tmp_path, modbus_port, mosquitto.port, "load-step-short", rack).start()
    n1 = NotifySocket()
    v1 = valvey_proc(tmp_path, cfg, env={"NOTIFY_SOCKET": n1.name})
    try:
        async with Health(mosquitto.port, rack) as health:
            v1.start()
            await until(lambda: n1.ready_at() is not None, 30, "READY (first start)", v1, sim)
            # Outage visible: the spool depth in state/health grows.
            await until(lambda: len([d for d in health.depths if d >= 100]) >= 2, 60,
                        "spool depth >= 100 in state/health", v1, sim)
            assert health.last["spool"]["sent_lines"] == 0
            assert health.last["spool"]["dropped_lines"] == 0
            v1.signal(signal.SIGKILL)
            assert v1.wait(10) == -signal.SIGKILL
            n1.close()

            reference = _setpoint_ts_ms(await asyncio.to_thread(spool_lines,
                                                                tmp_path / "spool"), rack)
            assert len(reference) >= 10, "the run spooled too little to test anything"

            await asyncio.to_thread(vm.start)
            n2 = NotifySocket()
            v2 = valvey_proc(tmp_path, cfg, env={"NOTIFY_SOCKET": n2.name})
            t_spawn = time.monotonic()
            v2.start()
            try:
                await until(lambda: n2.ready_at() is not None, 30, "READY after restart", v2)
                ready_s = (n2.ready_at() or 0.0) - t_spawn
                print(f"durability.sigkill_restart_ready_s = {ready_s:.2f}")
                await until(lambda: health.last.get("spool", {}).get("sent_lines", 0)
                            >= len(reference), 60, "spool drained into the database", v2)
                await until(lambda: 0 <= health.last.get("spool", {}).get("depth_lines", -1)
                            < 200, 60, "spool depth back near 0 in state/health", v2)

                def stored() -> set[int]:
                    sel = f'{{__name__="pid_setpoint_c",rack="{rack}"}}'
                    series = vm.export(sel)
                    return {int(t) for s in series for t in s.get("timestamps", [])}

                deadline = time.monotonic() + 30
                got = await asyncio.to_thread(stored)
                while not reference <= got and time.monotonic() < deadline:
                    await asyncio.sleep(0.5)
                    got = await asyncio.to_thread(stored)
                lost = reference - got
                print(f"durability.sigkill_spooled_points = {len(reference)}, lost = {len(lost)}")
                assert not lost, f"{len(lost)} of {len(reference)} spooled points lost"
                v2.signal(signal.SIGTERM)
                assert v2.wait(30) == 0
            finally:
                n2.close()
                v2.stop()
    finally:
        v1.stop()
        sim.stop()


async def test_unwritable_spool_keeps_every_event_and_counts_dropped_telemetry(
    tmp_path: Path, victoria_private: VictoriaMetrics
) -> None:
    """Policy (docs/OPERATIONS.md): with the spool unwritable, memory holds
    ``memory_max_lines``; the oldest *telemetry* lines are dropped and counted, alarm and
    command lines never; with a database they are sent straight from memory."""
    vm = victoria_private
    run = f"full{uuid.uuid4().hex[:8]}"
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")  # the spool folder cannot be created under a file
    w = TelemetryWriter(
        TsdbSettings(url=vm.url, flush_interval_s=0.05, retry_initial_s=0.05, retry_max_s=0.3),
        SpoolSettings(directory=blocker / "spool", memory_max_lines=100),
        identity_tags={"site": "lab", "row": "row1", "rack": run}, clock=FakeClock(),
    )
    # 300 telemetry points and 50 alarm events, interleaved, before the writer runs.
    for i in range(300):
        w.write("durtel", {}, {"seq": float(i)}, TS + i * 10**6)
        if i % 6 == 0:
            w.write("alarm", {"alarm": "dur_test", "severity": "major"},
                    {"active": 1.0, "seq": float(i // 6)}, TS + i * 10**6 + 1)
    assert w.flush_to_spool() == 100
    st = w.stats
    assert not st.spool_ok and st.spool_errors >= 1
    assert st.dropped_memory == 250 and st.dropped_events == 0 and st.dropped == 250
    task = asyncio.create_task(w.run())
    try:
        await until(lambda: w.stats.sent == 100, 30, "memory sent to the database")
    finally:
        await w.close(budget_s=2)
        await task
    alarms = await asyncio.to_thread(
        vm.wait_export, f'{{__name__="alarm_seq",rack="{run}"}}', 50)
    assert sorted(v for s in alarms for v in s["values"]) == [float(i) for i in range(50)]
    tel = await asyncio.to_thread(vm.wait_export, f'{{__name__="durtel_seq",rack="{run}"}}', 50)
    # The newest 50 telemetry points survive; the 250 oldest were dropped (and counted).
    assert sorted(v for s in tel for v in s["values"]) == [float(i) for i in range(250, 300)]
