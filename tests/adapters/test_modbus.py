"""ModbusDevice (rackplane.io.modbus) against the simulators' ModbusFace and a raw fault server.

Every test runs real TCP on loopback: the pymodbus server behind `sims.modbus_face`, or the
raw asyncio server of `tests.adapters.modbus_fault_server` for frames pymodbus cannot craft.
Field cases are named by id (FIELD-CASES.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import structlog

from harness.servers import free_port
from rackplane.clock import SystemClock
from rackplane.core.registers import RegisterMap, load_register_map, parse_register_map
from rackplane.core.samples import Quality, Sample
from rackplane.errors import (
    ModbusConnectionError,
    ModbusError,
    ModbusExceptionResponse,
    ModbusTimeout,
    WriteRejected,
)
from rackplane.io.modbus import ModbusDevice
from rackplane.settings import ModbusTargetSettings
from sims.modbus_face import ModbusFace
from tests.adapters.modbus_fault_server import Delayed, FaultServer, Request, mbap

REPO = Path(__file__).resolve().parents[2]
CLOCK = SystemClock()


# --- helpers ---------------------------------------------------------------------------------


def regmap(*points: dict[str, Any], name: str = "t") -> RegisterMap:
    return parse_register_map({"device": {"name": name}, "points": list(points)})


def target(port: int, **kw: Any) -> ModbusTargetSettings:
    base: dict[str, Any] = {
        "name": "dev", "host": "127.0.0.1", "port": port, "unit_id": 1,
        "register_map": "test-map", "poll_interval_s": 0.05, "timeout_s": 0.3,
        "reconnect_min_s": 0.1, "reconnect_max_s": 0.5,
    }
    base.update(kw)
    return ModbusTargetSettings.model_validate(base)


class Polls:
    """``on_samples`` sink: every poll's samples, with waiting helpers."""

    def __init__(self, hook: Callable[[list[Sample]], None] | None = None) -> None:
        self.polls: list[list[Sample]] = []
        self.hook = hook
        self._changed = asyncio.Event()

    def __call__(self, samples: list[Sample]) -> None:
        self.polls.append(samples)
        if self.hook is not None:
            self.hook(samples)
        self._changed.set()

    async def until(self, cond: Callable[[], bool], within: float = 10.0) -> None:
        """Wait until ``cond()`` holds after some poll (IndexError counts as not yet)."""

        def holds() -> bool:
            try:
                return cond()
            except IndexError:
                return False

        async with asyncio.timeout(within):
            while not holds():
                self._changed.clear()
                await self._changed.wait()

    async def more(self, n: int, within: float = 10.0) -> None:
        target_len = len(self.polls) + n
        await self.until(lambda: len(self.polls) >= target_len, within)

    def of(self, point: str) -> list[Sample]:
        return [s for poll in self.polls for s in poll if s.point == point]

    def last(self, point: str) -> Sample:
        return self.of(point)[-1]


async def until(cond: Callable[[], bool], within: float = 10.0, step: float = 0.01) -> None:
    """Poll ``cond`` (counters and flags of the objects under test) until true."""
    async with asyncio.timeout(within):
        while not cond():  # noqa: ASYNC110 (polling state, not waiting on an event)
            await asyncio.sleep(step)


@contextlib.asynccontextmanager
async def running(device: ModbusDevice) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(device.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def serving(server: ModbusFace | FaultServer) -> AsyncIterator[Any]:
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def events(logs: Sequence[Mapping[str, Any]], name: str, **match: Any
           ) -> list[Mapping[str, Any]]:
    return [e for e in logs if e["event"] == name and all(e.get(k) == v for k, v in match.items())]


def covers(face: ModbusFace, address: int, fc: int | None = None) -> list[Any]:
    return [r for r in face.requests
            if r.address is not None and r.count is not None
            and r.address <= address < r.address + r.count
            and (fc is None or r.function_code == fc)]


# --- the bundled map end to end ----------------------------------------------------------------


CDU_VALUES = {
    "supply_temp_c": 25.0, "return_temp_c": 31.5, "flow_lpm": 123.4, "diff_pressure_kpa": 85.2,
    "valve_position_pct": 40.0, "facility_supply_temp_c": 18.3, "heat_removed_kw": 55.5,
    "pump_speed_pct": 62.5, "supply_temp_b_c": 25.01, "supply_temp_c_c": 24.99,
    "uptime_s": 864000, "loop_pressure_kpa": 210.0, "valve_command_pct": 40.0,
    "pump_speed_command_pct": 62.5, "heartbeat": 17, "supply_temp_setpoint_c": 32.5,
}


async def test_cdu_generic_face_answers_what_the_map_says() -> None:
    m = load_register_map("cdu-generic")
    written: list[tuple[str, float]] = []
    face = ModbusFace(m, on_write=lambda p, v: written.append((p, v)))
    values = {k: v for k, v in CDU_VALUES.items() if k in m.by_name}
    face.update(values)
    assert face.registers("input", 0, 2) == [0x0000, 0x41C8]  # 25.0 in CDAB (BR-01)
    polls = Polls()
    async with serving(face):
        dev = ModbusDevice(target(face.port), m, clock=CLOCK, on_samples=polls)
        async with running(dev):
            await polls.until(lambda: len(polls.polls) >= 2)
            last = {s.point: s for s in polls.polls[-1]}
            assert set(last) == set(m.by_name)
            for name, v in values.items():
                assert last[name].quality is Quality.GOOD, (name, last[name])
                assert last[name].value == pytest.approx(v, abs=1e-6), name
            assert last["supply_temp_c"].value == 25.0
            # unimplemented addresses inside the map's span answer exception 2 and are learned
            for table in ("holding", "input"):
                pts = [p for p in m.points if p.table == table]
                used = {a for p in pts for a in range(p.address, p.end + 1)}
                gaps = {a for a in range(min(used), max(used) + 1)} - used
                learned = {a for t, a in dev.read_memory.bad if t == table}
                assert gaps == learned
            # a write: rounded to the register resolution, delivered, read back
            await dev.write("valve_command_pct", 42.37)
            assert written == [("valve_command_pct", 42.4)]
            await polls.more(2)
            assert polls.last("valve_command_pct").value == 42.4
            with pytest.raises(WriteRejected):
                await dev.write("valve_command_pct", 120.0)
            with pytest.raises(WriteRejected):
                await dev.write("supply_temp_c", 20.0)
            with pytest.raises(WriteRejected):
                await dev.write("no_such_point", 1.0)
            assert written == [("valve_command_pct", 42.4)]


async def test_mbpoll_interop_reads_and_writes_the_face() -> None:
    mbpoll = shutil.which("mbpoll")
    if mbpoll is None:
        pytest.skip("mbpoll (Debian package 'mbpoll') not installed: interop check skipped")
    written: list[tuple[str, float]] = []
    face = ModbusFace(load_register_map("cdu-generic"),
                      on_write=lambda p, v: written.append((p, v)))
    face.update({"valve_command_pct": 42.4, "pump_speed_command_pct": 55.0, "heartbeat": 7})

    async def run(*args: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            mbpoll, "-m", "tcp", "-a", "1", "-t", "4", "-1", "-p", str(face.port), *args,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out, _ = await proc.communicate()
        return int(proc.returncode or 0), out.decode()

    async with serving(face):
        rc, out = await run("-r", "1", "-c", "3", "127.0.0.1")
        assert rc == 0, out
        assert "[1]: \t424" in out and "[2]: \t550" in out and "[3]: \t7" in out
        rc, out = await run("-r", "1", "-c", "10", "127.0.0.1")  # covers unimplemented 3
        assert rc != 0 and "Illegal data address" in out
        rc, out = await run("-r", "1", "127.0.0.1", "500")  # valve 50.0 %
        assert rc == 0, out
        rc, out = await run("-r", "1", "127.0.0.1", "5000")  # 500 %: refused
        assert rc != 0 and "Illegal data value" in out
    assert written == [("valve_command_pct", 50.0)]
    assert face.registers("holding", 0, 1) == [500]


# --- BR-01 -------------------------------------------------------------------------------------


BR01_POINTS = (
    {"name": "supply_temp_c", "table": "holding", "address": 100, "type": "float32",
     "order": "CDAB", "valid_min": -50.0, "valid_max": 150.0},
    *({"name": f"setpoint_{i}", "table": "holding", "address": 200 + 2 * i, "type": "float32",
       "order": "CDAB"} for i in range(3)),
)


async def test_br01_cdab_floats_end_to_end() -> None:
    """BR-01: exact 25.0 and [1.0, 2.0, 3.0] in register order through real TCP."""
    face = ModbusFace(regmap(*BR01_POINTS))
    face.set_registers("holding", 100, [0x0000, 0x41C8])
    face.set_registers("holding", 200, [0, 16256, 0, 16384, 0, 16448])
    polls = Polls()
    async with serving(face):
        dev = ModbusDevice(target(face.port), regmap(*BR01_POINTS), clock=CLOCK,
                           on_samples=polls)
        async with running(dev):
            await polls.more(2)
    last = {s.point: s.value for s in polls.polls[-1]}
    assert last["supply_temp_c"] == 25.0
    assert [last[f"setpoint_{i}"] for i in range(3)] == [1.0, 2.0, 3.0]


async def test_br01_wrong_word_order_is_logged_once() -> None:
    """BR-01: the daemon misconfigured as ABCD reads ~2.36e-41 and logs it once."""
    wrong = [dict(p, order="ABCD") for p in BR01_POINTS[:1]]
    face = ModbusFace(regmap(*BR01_POINTS))
    face.update({"supply_temp_c": 25.0})
    polls = Polls()
    async with serving(face):
        with structlog.testing.capture_logs() as logs:
            dev = ModbusDevice(target(face.port), regmap(*wrong), clock=CLOCK,
                               on_samples=polls)
            async with running(dev):
                await polls.more(5)
    v = polls.last("supply_temp_c").value
    assert v is not None and v == pytest.approx(2.36e-41, rel=1e-2)
    assert len(events(logs, "modbus_probable_word_order_error", point="supply_temp_c")) == 1


# --- BR-03 -------------------------------------------------------------------------------------

BR03_CHUNK = bytes.fromhex("001B00000005000402 0000 001C00000005000402 0002".replace(" ", ""))


async def test_br03_stale_frame_in_same_chunk_is_dropped_and_counted() -> None:
    """BR-03: tid 0x001C answered by [stale tid 0x001B value 0][right tid 0x001C value 2]."""

    def reply(r: Request, normal: bytes) -> bytes | None:
        return BR03_CHUNK if r.tid == 0x001C else None

    server = FaultServer(values=lambda unit, address: 2, reply=reply)
    m = regmap({"name": "flow_raw", "table": "input", "address": 0, "type": "uint16"})
    polls = Polls()
    async with serving(server):
        dev = ModbusDevice(target(server.port, unit_id=0, poll_interval_s=0.01), m,
                           clock=CLOCK, on_samples=polls)
        async with running(dev):
            await until(lambda: any(r.tid >= 0x001F for r in server.requests))
            await polls.more(1)
    samples = polls.of("flow_raw")
    assert samples and all(s.quality is Quality.GOOD and s.value == 2 for s in samples)
    assert dev.stats.stale_frames == 1
    assert dev.stats.dropped_frames == {"tid_mismatch": 1}
    assert dev.stats.connect_attempts == 1 and dev.stats.errors == {}
    assert server.connections == 1 and server.conn_stats[1].consecutive  # never out of step


BAD_PREFIXES: dict[str, tuple[Callable[[int], bytes], str]] = {
    "tid_zero": (lambda tid: mbap(0, 5, bytes.fromhex("04020000")), "stale"),
    "older_tid": (lambda tid: mbap(tid - 1, 5, bytes.fromhex("04020000")), "stale"),
    "other_unit": (lambda tid: mbap(tid, 6, bytes.fromhex("04020000")), "rejected"),
    "other_function": (lambda tid: mbap(tid, 5, bytes.fromhex("03020000")), "rejected"),
    "byte_count": (lambda tid: mbap(tid, 5, bytes.fromhex("040400000000")), "rejected"),
    "other_exception": (lambda tid: mbap(tid, 5, bytes.fromhex("8302")), "rejected"),
}


@pytest.mark.parametrize("kind", sorted(BAD_PREFIXES))
async def test_br03_reply_must_match_tid_unit_function_and_byte_count(kind: str) -> None:
    """BR-03: a frame is accepted only if tid, unit, function and byte count all match."""
    make, counter = BAD_PREFIXES[kind]

    def reply(r: Request, normal: bytes) -> bytes | None:
        return make(r.tid) + normal if r.tid == 3 else None

    server = FaultServer(reply=reply)
    m = regmap({"name": "x", "table": "input", "address": 7, "type": "uint16"})
    polls = Polls()
    async with serving(server):
        dev = ModbusDevice(target(server.port, unit_id=5, poll_interval_s=0.01), m,
                           clock=CLOCK, on_samples=polls)
        async with running(dev):
            await polls.until(lambda: len(polls.polls) >= 5)
    assert all(s.quality is Quality.GOOD and s.value == 5007 for s in polls.of("x"))
    if counter == "stale":
        assert (dev.stats.stale_frames, dev.stats.rejected_frames) == (1, 0)
    else:
        assert (dev.stats.stale_frames, dev.stats.rejected_frames) == (0, 1)
    assert dev.stats.connect_attempts == 1


async def test_br03_only_a_wrong_reply_means_reply_mismatch_then_recovery() -> None:
    def reply(r: Request, normal: bytes) -> bytes | None:
        return mbap(r.tid, 6, bytes.fromhex("04021234")) if r.tid == 3 else None

    server = FaultServer(reply=reply)
    m = regmap({"name": "x", "table": "input", "address": 7, "type": "uint16"})
    polls = Polls()
    async with serving(server):
        dev = ModbusDevice(target(server.port, unit_id=5, timeout_s=0.2), m, clock=CLOCK,
                           on_samples=polls)
        async with running(dev):
            await polls.until(lambda: any(s.reason == "reply_mismatch" for s in polls.of("x")))
            await polls.until(lambda: polls.last("x").quality is Quality.GOOD)
    values = [s.value for s in polls.of("x") if s.quality is Quality.GOOD]
    assert values and set(values) == {5007}  # 0x1234 never appears
    assert server.connections == 2  # the out-of-step connection was replaced


async def test_br03_large_stale_reply_before_the_right_one_in_one_chunk() -> None:
    """BR-03 with 125-register replies: pymodbus 3.16.1 drops a >264-byte buffer whole."""

    def reply(r: Request, normal: bytes) -> bytes | None:
        if r.tid == 4:
            return mbap(r.tid - 1, 1, bytes([4, 250]) + bytes(250)) + normal
        return None

    server = FaultServer(reply=reply)
    m = regmap(*({"name": f"r{i:03d}", "table": "input", "address": i, "type": "uint16"}
                 for i in range(125)))
    polls = Polls()
    async with serving(server):
        dev = ModbusDevice(target(server.port, poll_interval_s=0.01), m, clock=CLOCK,
                           on_samples=polls)
        async with running(dev):
            await polls.until(lambda: len(polls.polls) >= 6)
    for poll in polls.polls:
        assert [s.value for s in poll] == [1000 + i for i in range(125)]
    assert dev.stats.stale_frames == 1 and dev.stats.errors == {}


async def test_br03_garbage_desync_replaces_the_connection() -> None:
    def reply(r: Request, normal: bytes) -> bytes | None:
        return bytes.fromhex("0004123400050104020000") if r.tid == 4 else None  # pid 0x1234

    server = FaultServer(reply=reply)
    m = regmap({"name": "x", "table": "input", "address": 1, "type": "uint16"})
    polls = Polls()
    async with serving(server):
        dev = ModbusDevice(target(server.port, timeout_s=0.2, poll_interval_s=0.02), m,
                           clock=CLOCK, on_samples=polls)
        async with running(dev):
            await polls.until(lambda: any(s.reason == "desync" for s in polls.of("x")))
            await polls.until(lambda: polls.last("x").quality is Quality.GOOD)
    assert {s.value for s in polls.of("x") if s.quality is Quality.GOOD} == {1001}
    assert server.connections == 2


async def test_br03_late_reply_after_timeout_is_never_applied() -> None:
    """BR-03 field sequence: the reply to tid 0x001B comes after the timeout."""

    def reply(r: Request, normal: bytes) -> bytes | Delayed | None:
        if r.conn == 1 and r.tid == 0x001B:
            return Delayed(0.4, mbap(r.tid, 0, bytes.fromhex("0402DEAD")))
        return None

    server = FaultServer(values=lambda unit, address: 2, reply=reply)
    m = regmap({"name": "x", "table": "input", "address": 0, "type": "uint16"})
    polls = Polls()
    async with serving(server):
        dev = ModbusDevice(target(server.port, unit_id=0, poll_interval_s=0.01, timeout_s=0.15),
                           m, clock=CLOCK, on_samples=polls)
        async with running(dev):
            await polls.until(lambda: any(s.reason == "timeout" for s in polls.of("x")))
            await asyncio.sleep(0.5)  # the late reply has been written by now
            await polls.until(lambda: polls.last("x").quality is Quality.GOOD)
            await polls.more(3)
    goods = [s.value for s in polls.of("x") if s.quality is Quality.GOOD]
    assert goods and set(goods) == {2}  # 0xDEAD never attributed
    stale = [s for s in polls.of("x") if s.quality is Quality.STALE]
    assert stale and all(s.value is None for s in stale)
    assert server.connections == 2


class _TidNearWrap(ModbusDevice):
    """Test seam: start each connection's pymodbus tid counter 12,000 before its wrap
    (pymodbus 3.16.1 wraps 65000 -> 1), so a ~23,000-read run crosses it on every unit."""

    async def _connect(self) -> bool:
        ok = await super()._connect()
        if ok:
            assert self._client is not None
            self._client.ctx.next_tid = 65000 - 12_000
        return ok


@pytest.mark.slow
async def test_br03_70000_reads_three_units_no_misattribution_across_tid_wrap(
    tmp_path: Path,
) -> None:
    """BR-03 long run: 70,000 reads over units 1-3, value = unit*1000 + address, zero
    mis-attributions, every connection across the tid wrap. The server runs as its own
    process (one fast loopback connection per unit)."""
    port = free_port()
    stats_file = tmp_path / "stats.json"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.adapters.modbus_fault_server", "--port", str(port),
        "--stats-file", str(stats_file), cwd=REPO, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert (await proc.stdout.readline()).startswith(b"listening")
        m = regmap(*({"name": f"p{i}", "table": "input", "address": 20 * i, "type": "uint16"}
                     for i in range(5)))
        wrong: list[tuple[int, str, float | None]] = []
        devices = []
        for unit in (1, 2, 3):
            def check(samples: list[Sample], unit: int = unit) -> None:
                for s in samples:
                    if s.value != unit * 1000 + 20 * int(s.point[1:]):
                        wrong.append((unit, s.point, s.value))
            devices.append(_TidNearWrap(
                target(port, name=f"u{unit}", unit_id=unit, poll_interval_s=0.001,
                       timeout_s=2.0), m, clock=CLOCK, on_samples=check))
        tasks = [asyncio.create_task(d.run()) for d in devices]
        try:
            await until(lambda: sum(d.stats.requests for d in devices) >= 70_000,
                        within=120.0, step=0.05)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        proc.terminate()
        async with asyncio.timeout(10):
            await proc.wait()
    assert wrong == []
    assert sum(d.stats.requests for d in devices) >= 70_000
    for d in devices:
        assert d.stats.errors == {} and d.stats.connect_attempts == 1
        assert d.stats.stale_frames == 0 and d.stats.rejected_frames == 0
    conns = json.loads(stats_file.read_text())
    assert len(conns) == 3
    for st in conns.values():
        assert st["wraps"] == 1 and st["consecutive"], st
        assert st["requests"] > 12_000


# --- BR-04 -------------------------------------------------------------------------------------

BR04_POINTS = (
    {"name": "valve_cmd_pct", "table": "holding", "address": 0, "type": "uint16"},
    {"name": "setpoint_c", "table": "holding", "address": 9, "type": "float32"},  # 40010
    {"name": "speed_cmd_pct", "table": "holding", "address": 11, "type": "uint16"},
    {"name": "flow_lpm", "table": "input", "address": 0, "type": "uint16"},
)


async def test_br04_illegal_data_address_marks_one_point_and_polling_goes_on() -> None:
    m = regmap(*BR04_POINTS)
    face = ModbusFace(m)
    face.update({"valve_cmd_pct": 40, "setpoint_c": 30.5, "speed_cmd_pct": 70, "flow_lpm": 12})
    face.inject_exception(2, table="holding", address=9, count=2)
    polls = Polls()
    async with serving(face):
        with structlog.testing.capture_logs() as logs:
            dev = ModbusDevice(target(face.port, refused_reprobe_s=1.0), m, clock=CLOCK,
                               on_samples=polls)
            async with running(dev) as task:
                await polls.until(lambda: len(polls.polls) >= 12)
                assert not task.done()  # alive after 10+ cycles
                # refused alone once, then not asked again before refused_reprobe_s
                # (issue 14 item 6; was: every poll)
                assert dev.stats.exception_replies <= 3
                face.clear_exceptions()
                await polls.until(lambda: polls.last("setpoint_c").quality is Quality.GOOD)
    bad_polls = polls.polls[:12]
    last_t = -1.0
    for poll in bad_polls:
        by = {s.point: s for s in poll}
        assert by["setpoint_c"].quality is Quality.BAD
        assert by["setpoint_c"].reason == "illegal_data_address"
        assert by["setpoint_c"].value is None
        for other in ("valve_cmd_pct", "speed_cmd_pct", "flow_lpm"):
            assert by[other].quality is Quality.GOOD, (other, by[other])
        assert by["flow_lpm"].t_mono > last_t  # fresh every cycle
        last_t = by["flow_lpm"].t_mono
    assert polls.last("setpoint_c").value == 30.5
    assert len(events(logs, "modbus_point_invalid", point="setpoint_c")) == 1
    assert len(events(logs, "modbus_point_recovered", point="setpoint_c")) == 1
    assert not events(logs, "modbus_owner_error")
    assert not events(logs, "modbus_point_invalid", point="flow_lpm")


async def test_br04_exact_exception_frame() -> None:
    """BR-04: the frame 00 01 00 00 00 03 01 83 02 to FC03 40010 count 2."""

    def reply(r: Request, normal: bytes) -> bytes | None:
        if r.tid == 1:
            assert (r.function_code, r.address, r.count) == (3, 9, 2)
            return bytes.fromhex("000100000003018302")
        return None

    server = FaultServer(values=lambda u, a: {9: 0x41C8, 10: 0}[a], reply=reply)
    m = regmap(BR04_POINTS[1])
    polls = Polls()
    async with serving(server):
        # the refused point is read again at its re-probe (issue 14 item 6), not every poll
        dev = ModbusDevice(target(server.port, refused_reprobe_s=0.1), m, clock=CLOCK,
                           on_samples=polls)
        async with running(dev):
            await polls.until(lambda: polls.last("setpoint_c").quality is Quality.GOOD)
    first, last = polls.of("setpoint_c")[0], polls.last("setpoint_c")
    assert (first.quality, first.reason) == (Quality.BAD, "illegal_data_address")
    assert (last.quality, last.value) == (Quality.GOOD, 25.0)


@pytest.mark.parametrize(("code", "reason"), [(10, "gateway_path_unavailable"),
                                              (11, "gateway_target_no_response")])
async def test_br04_gateway_exceptions_mark_the_unit_unavailable(code: int, reason: str) -> None:
    m = regmap(*BR04_POINTS)
    face = ModbusFace(m)
    polls = Polls()
    async with serving(face):
        with structlog.testing.capture_logs() as logs:
            dev = ModbusDevice(target(face.port, dormant_reprobe_s=0.5), m, clock=CLOCK,
                               on_samples=polls)
            async with running(dev):
                await polls.until(lambda: polls.last("flow_lpm").quality is Quality.GOOD)
                face.inject_exception(code)
                await polls.until(lambda: polls.last("flow_lpm").reason == reason)
                asked = len(face.requests)
                await polls.more(5)
                assert not dev.stats.available
                # unavailable: not read again before dormant_reprobe_s (issue 14 item 5;
                # was: every poll, forever)
                assert len(face.requests) == asked
                assert dev.stats.dormant_polls >= 5
                assert all(s.quality is Quality.STALE and s.reason == reason
                           for s in polls.polls[-1])
                face.clear_exceptions()
                await polls.until(lambda: all(s.quality is Quality.GOOD
                                              for s in polls.polls[-1]))
    assert dev.stats.available
    assert dev.stats.connect_attempts == 1  # the gateway connection itself is fine
    assert len(events(logs, "modbus_unit_unavailable")) == 1
    assert len(events(logs, "modbus_unit_available")) == 1
    assert not events(logs, "modbus_point_invalid")  # not a configuration error


async def test_br04_server_busy_is_retried_without_invalidating() -> None:
    points = (*BR04_POINTS, {"name": "busy_c", "table": "holding", "address": 100,
                             "type": "uint16"})
    m = regmap(*points)
    face = ModbusFace(m)
    face.update({"busy_c": 7})
    face.inject_exception(6, table="holding", address=100)
    polls = Polls()
    async with serving(face):
        with structlog.testing.capture_logs() as logs:
            dev = ModbusDevice(target(face.port), m, clock=CLOCK, on_samples=polls)
            async with running(dev):
                await polls.until(lambda: len(polls.polls) >= 4)
                face.clear_exceptions()
                await polls.more(1)
                await polls.more(1)
    busy = polls.of("busy_c")
    assert all((s.quality, s.reason) == (Quality.STALE, "server_busy") for s in busy[:4])
    assert busy[-1].quality is Quality.GOOD and busy[-1].value == 7
    assert all(s.quality is Quality.GOOD for s in polls.of("flow_lpm"))
    assert dev.stats.errors.get("server_busy", 0) >= 4
    assert not events(logs, "modbus_point_invalid")
    assert len(covers(face, 100)) >= 5  # asked again every cycle


# --- BR-05 -------------------------------------------------------------------------------------


async def test_br05_gap_split_is_remembered() -> None:
    m = regmap({"name": "a_w", "table": "holding", "address": 11174, "type": "uint16"},
               {"name": "b_w", "table": "holding", "address": 11176, "type": "uint32"})
    face = ModbusFace(m)
    face.update({"a_w": 1200, "b_w": 70000})
    polls = Polls()
    async with serving(face):
        dev = ModbusDevice(target(face.port), m, clock=CLOCK, on_samples=polls)
        async with running(dev):
            await polls.until(lambda: len(polls.polls) >= 6)
    assert len(covers(face, 11175)) == 1  # one failed merged read, never repeated
    assert [(b.start, b.count) for b in dev.read_plan] == [(11174, 1), (11176, 2)]
    assert [s.value for s in polls.polls[1]] == [1200, 70000]  # valid by the 2nd cycle
    assert all(s.quality is Quality.GOOD for poll in polls.polls for s in poll)


async def test_br05_200_registers_with_a_100_register_device_limit() -> None:
    m = regmap(*({"name": f"power_w_{i:03d}", "table": "input", "address": i, "type": "uint16"}
                 for i in range(200)))
    face = ModbusFace(m)
    face.update({f"power_w_{i:03d}": 10 * i for i in range(200)})
    face.max_registers_per_request = 100
    polls = Polls()
    async with serving(face):
        dev = ModbusDevice(target(face.port), m, clock=CLOCK, on_samples=polls)
        async with running(dev):
            await polls.until(lambda: len(polls.polls) >= 4)
    assert max(r.count or 0 for r in face.requests) <= 125
    assert [s.value for s in polls.polls[1]] == [10.0 * i for i in range(200)]
    assert dev.stats.read_limit == 100
    assert [b.count for b in dev.read_plan] == [100, 100]
    later = [r for r in face.requests][-2:]
    assert [(r.address, r.count) for r in later] == [(0, 100), (100, 100)]


# --- BR-06 -------------------------------------------------------------------------------------


async def test_br06_unit0_over_tcp_waits_for_and_returns_the_reply() -> None:
    m = regmap(*({"name": f"r{i}", "table": "holding", "address": i, "type": "uint16"}
                 for i in range(10)))
    face = ModbusFace(m, unit_ids=(0,))
    face.update({f"r{i}": i for i in range(10)})
    face.reply_delay_s = 0.2
    async with serving(face):
        dev = ModbusDevice(target(face.port, unit_id=0, timeout_s=1.0), m, clock=CLOCK,
                           on_samples=lambda s: None)
        t0 = time.monotonic()
        samples = await dev.read_once()
        waited = time.monotonic() - t0
    assert [s.value for s in samples] == list(range(10))
    assert all(s.quality is Quality.GOOD for s in samples)
    assert waited >= 0.2  # it waited for the device, no instant error
    assert {r.unit for r in face.requests} == {0}


def crc16_modbus(data: bytes) -> bytes:
    crc = 0xFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0xA001 if crc & 1 else crc >> 1
    return crc.to_bytes(2, "little")


async def test_br06_rtu_broadcast_write_returns_without_waiting() -> None:
    sink = FaultServer(rtu_sink=True)
    m = regmap({"name": "pump_speed_command_pct", "table": "holding", "address": 1,
                "type": "uint16", "scale": 0.1, "writable": True,
                "write_min": 15.0, "write_max": 100.0})
    async with serving(sink):
        with structlog.testing.capture_logs() as logs:
            dev = ModbusDevice(
                target(sink.port, framer="rtu", unit_id=0, poll_enabled=False, timeout_s=2.0),
                m, clock=CLOCK, on_samples=lambda s: None)
            async with running(dev):
                await until(lambda: dev.stats.connected)
                t0 = time.monotonic()
                await dev.write("pump_speed_command_pct", 30.0)
                took = time.monotonic() - t0
                await until(lambda: len(sink.rtu_bytes) >= 8)
                with pytest.raises(ModbusError, match="broadcast"):
                    await dev.read_once()
    assert took < 1.0  # well under the 2 s timeout: nothing is awaited
    frame = bytes([0x00, 0x06, 0x00, 0x01, 0x01, 0x2C])  # unit 0, FC06, reg 1, 300 (30.0 %)
    assert bytes(sink.rtu_bytes) == frame + crc16_modbus(frame)
    assert len(events(logs, "modbus_write_no_response_expected")) == 1


# --- BR-07 -------------------------------------------------------------------------------------


async def test_br07_half_open_then_restart_with_new_values() -> None:
    """BR-07: half-open link, then the device restarts on the same port with new values."""
    m = regmap({"name": "supply_temp_c", "table": "input", "address": 0, "type": "float32"},
               {"name": "flow_lpm", "table": "input", "address": 2, "type": "uint16",
                "scale": 0.1})
    face = ModbusFace(m)
    face.update({"supply_temp_c": 25.0, "flow_lpm": 100.0})
    poll_s, timeout_s, cap_s = 0.2, 0.3, 1.0
    polls = Polls()
    await face.start()
    with structlog.testing.capture_logs() as logs:
        dev = ModbusDevice(
            target(face.port, poll_interval_s=poll_s, timeout_s=timeout_s,
                   reconnect_min_s=0.1, reconnect_max_s=cap_s), m, clock=CLOCK,
            on_samples=polls)
        try:
            async with running(dev) as task:
                await polls.until(lambda: polls.last("supply_temp_c").value == 25.0)
                face.blackhole = True  # packets dropped, no FIN
                t_black = time.monotonic()
                cpu0 = time.process_time()
                attempts0 = dev.stats.connect_attempts
                await polls.until(lambda: polls.last("supply_temp_c").quality is Quality.STALE)
                first_stale_after = time.monotonic() - t_black
                await asyncio.sleep(2.0)
                await face.stop()  # the device is killed ...
                face.blackhole = False
                face.update({"supply_temp_c": 31.5, "flow_lpm": 80.0})  # ... and comes back new
                await asyncio.sleep(1.5)
                cpu = (time.process_time() - cpu0) / (time.monotonic() - t_black)
                attempts = dev.stats.connect_attempts - attempts0
                await face.start()
                t_up = time.monotonic()
                n_before = len(polls.polls)
                await polls.until(lambda: polls.last("supply_temp_c").quality is Quality.GOOD,
                                  within=10.0)
                back_after = time.monotonic() - t_up
                assert not task.done()  # the same owner task all along: no daemon restart
        finally:
            await face.stop()
    # one offline / online pair for the whole outage, however many reconnect attempts
    assert [e["event"] for e in logs if e["event"] in ("modbus_offline", "modbus_online")] == [
        "modbus_online", "modbus_offline", "modbus_online"]
    assert first_stale_after <= poll_s + timeout_s + 0.5
    outage = [s for poll in polls.polls for s in poll
              if s.t_mono > t_black + poll_s + timeout_s + 0.1 and s.t_mono < t_up]
    assert outage and all(s.quality is Quality.STALE and s.value is None for s in outage)
    assert 3 <= attempts <= 20  # it keeps trying, backed off, never a spin
    assert cpu < 0.05, f"process CPU {cpu:.1%} during the outage"
    assert back_after <= cap_s + poll_s + timeout_s + 1.0
    first_good = next(p for p in polls.polls[n_before:]
                      if p[0].quality is Quality.GOOD)
    assert [s.value for s in first_good] == [31.5, 80.0]  # the new values, never the old
    olds = [s for poll in polls.polls for s in poll
            if s.t_mono > t_black + poll_s + timeout_s + 0.1
            and s.quality is Quality.GOOD and s.value in (25.0, 100.0)]
    assert olds == []


#: A ModbusFace in its own process (killed with SIGKILL like the simulator in the field):
#: argv = register map (JSON), port, values (JSON); "listening" on stderr once it serves.
FACE_PROCESS = """
import asyncio, json, sys
from rackplane.core.registers import parse_register_map
from sims.modbus_face import ModbusFace

async def main() -> None:
    face = ModbusFace(parse_register_map(json.loads(sys.argv[1])), port=int(sys.argv[2]))
    face.update(json.loads(sys.argv[3]))
    await face.start()
    print("listening", file=sys.stderr, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def face_process(m: dict[str, Any], port: int, values: dict[str, float]
                       ) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", FACE_PROCESS, json.dumps(m), str(port), json.dumps(values),
        cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    lines: list[bytes] = []
    try:
        async with asyncio.timeout(30):
            while not lines or lines[-1].strip() != b"listening":
                line = await proc.stderr.readline()
                if not line:
                    raise AssertionError(f"face process ended: {b''.join(lines).decode()}")
                lines.append(line)
    except BaseException:
        proc.kill()
        await proc.wait()
        raise
    return proc


async def test_br07_sigkilled_device_returns_while_writes_are_refused() -> None:
    """BR-07 field bug (valvey e2e phase 3): the device process is SIGKILLed, the control
    loop keeps submitting writes (refused: not connected) more often than the capped backoff
    delay, the device restarts on the same port. Writes refused while down used to re-arm the
    backoff each time, so the device never reconnected. Now: the new values within
    ``reconnect_max_s + poll_interval_s`` of the device being back, one failure line per point
    and one recovery line per point however many writes were refused."""
    spec = {"device": {"name": "t"}, "points": [
        {"name": "x", "table": "input", "address": 0, "type": "uint16"},
        {"name": "heartbeat", "table": "holding", "address": 0, "type": "uint16",
         "writable": True, "write_min": 0.0, "write_max": 65535.0},
        {"name": "valve_cmd_pct", "table": "holding", "address": 1, "type": "uint16",
         "scale": 0.1, "writable": True, "write_min": 0.0, "write_max": 100.0},
    ]}
    m = parse_register_map(spec)
    port = free_port()
    poll_s, timeout_s, cap_s = 0.1, 0.5, 1.0
    polls = Polls()
    dev = ModbusDevice(target(port, poll_interval_s=poll_s, timeout_s=timeout_s,
                              reconnect_min_s=0.2, reconnect_max_s=cap_s),
                       m, clock=CLOCK, on_samples=polls)
    refused = {"heartbeat": 0, "valve_cmd_pct": 0}

    async def keep_writing(point: str, period_s: float) -> None:
        n = 0
        while True:  # like the control tick: never waits for the device to come back
            n += 1
            try:
                await dev.write(point, float(n % 1000))
            except ModbusError:
                refused[point] += 1
            await asyncio.sleep(period_s)

    # both write periods are below the capped delay's lower bound (cap_s / 2), as in the
    # field (heartbeat every 1 s, cap 2 s): every refused write used to postpone the connect
    procs = [await face_process(spec, port, {"x": 1})]
    writers: list[asyncio.Task[None]] = []
    with structlog.testing.capture_logs() as logs:
        try:
            async with running(dev) as task:
                await polls.until(lambda: polls.last("x").value == 1)
                writers += [asyncio.create_task(keep_writing("heartbeat", 0.4)),
                            asyncio.create_task(keep_writing("valve_cmd_pct", 0.1))]
                await asyncio.sleep(0.5)
                procs[0].kill()  # SIGKILL: the kernel closes its sockets, nothing else
                await procs[0].wait()
                t_kill = time.monotonic()
                cpu0 = time.process_time()
                attempts0 = dev.stats.connect_attempts
                await polls.until(lambda: polls.last("x").quality is Quality.STALE)
                await asyncio.sleep(2.5)  # long enough for the backoff to reach its cap
                cpu = (time.process_time() - cpu0) / (time.monotonic() - t_kill)
                attempts = dev.stats.connect_attempts - attempts0
                refused_down = dict(refused)
                procs.append(await face_process(spec, port, {"x": 2}))
                t_up = time.monotonic()
                await polls.until(lambda: polls.last("x").value == 2,
                                  within=cap_s + poll_s + 5.0)
                back_after = time.monotonic() - t_up
                ok0 = dev.stats.writes
                await until(lambda: dev.stats.writes >= ok0 + 4)
                assert not task.done()
        finally:
            for w in writers:
                w.cancel()
            await asyncio.gather(*writers, return_exceptions=True)
            for proc in procs:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
    assert back_after <= cap_s + poll_s + 1.0, back_after  # BR-07 bound + scheduling slack
    assert min(refused_down.values()) >= 3  # writes were refused all along the outage
    assert 2 <= attempts <= 15  # backed off, never a spin
    assert cpu < 0.1, f"process CPU {cpu:.1%} during the outage"
    assert [e["event"] for e in logs if e["event"] in ("modbus_offline", "modbus_online")] == [
        "modbus_online", "modbus_offline", "modbus_online"]
    # once per change of outcome per point, not once per refused write; counted always
    for point in refused:
        failed = events(logs, "modbus_write_failed", point=point)
        assert 1 <= len(failed) <= 2, failed  # (a write in flight at the kill: timeout first)
        assert failed[-1]["reason"] == "not_connected"
        assert len(events(logs, "modbus_write_recovered", point=point)) == 1
    assert dev.stats.write_errors >= sum(refused_down.values())
    assert dev.stats.errors["not_connected"] >= sum(refused_down.values())
    assert not [e for e in logs if e["event"] == "modbus_write" and e["log_level"] != "debug"]


async def test_refused_connections_back_off_without_spinning() -> None:
    port = free_port()  # nothing listens
    m = regmap({"name": "x", "table": "input", "address": 0, "type": "uint16"})
    polls = Polls()
    dev = ModbusDevice(target(port, reconnect_min_s=0.000001, reconnect_max_s=0.3,
                              poll_interval_s=0.05), m, clock=CLOCK, on_samples=polls)
    cpu0, t0 = time.process_time(), time.monotonic()
    async with running(dev):
        await asyncio.sleep(1.5)
    cpu = (time.process_time() - cpu0) / (time.monotonic() - t0)
    assert 3 <= dev.stats.connect_attempts <= 25
    assert cpu < 0.2
    assert len(polls.polls) >= 15  # one STALE sample per point per poll meanwhile
    assert all(s.quality is Quality.STALE and s.reason == "not_connected"
               for s in polls.of("x"))
    with pytest.raises(ModbusConnectionError):
        await ModbusDevice(target(port), m, clock=CLOCK, on_samples=polls).read_once()


async def test_idle_close_by_the_device_reconnects_at_once() -> None:
    """A device or gateway closing an idle connection costs no STALE poll."""
    m = regmap({"name": "x", "table": "input", "address": 0, "type": "uint16"})
    face = ModbusFace(m)
    face.update({"x": 5})
    polls = Polls()
    async with serving(face):
        dev = ModbusDevice(target(face.port, poll_interval_s=0.3), m, clock=CLOCK,
                           on_samples=polls)
        async with running(dev):
            await polls.more(2)
            await polls.more(1)  # just polled: the connection is idle for ~0.3 s
            await face.stop()
            await face.start()
            await polls.more(3)
    assert all(s.quality is Quality.GOOD for s in polls.of("x"))
    assert dev.stats.reconnects == 1


# --- BR-09 -------------------------------------------------------------------------------------


async def test_br09_sentinels_read_every_cycle_and_recover() -> None:
    m = regmap({"name": "return_temp_c", "table": "input", "address": 0, "type": "int16",
                "scale": 0.1, "sentinels": [0x8000]},
               {"name": "valve_pos_pct", "table": "input", "address": 1, "type": "uint16",
                "scale": 0.1, "sentinels": [0xFFFF]})
    temps = [0x00FA, 0xFF38, 0x8000, 0x8000, 0x00FA]
    valve = [0x03E8, 0xFFFF, 0x03E8, 0x03E8, 0x03E8]
    face = ModbusFace(m)
    face.set_registers("input", 0, [temps[0], valve[0]])
    step = {"i": 0}

    def next_values(samples: list[Sample]) -> None:  # the device changes between polls
        step["i"] += 1
        i = min(step["i"], len(temps) - 1)
        face.set_registers("input", 0, [temps[i], valve[i]])

    polls = Polls(hook=next_values)
    async with serving(face):
        dev = ModbusDevice(target(face.port), m, clock=CLOCK, on_samples=polls)
        async with running(dev):
            await polls.until(lambda: len(polls.polls) >= 5)
    t = polls.of("return_temp_c")[:5]
    v = polls.of("valve_pos_pct")[:3]
    assert [s.value for s in t] == [25.0, -20.0, None, None, 25.0]
    assert [s.quality for s in t] == [Quality.GOOD, Quality.GOOD, Quality.BAD, Quality.BAD,
                                      Quality.GOOD]
    assert t[2].reason == t[3].reason == "sentinel"
    assert [s.value for s in v] == [100.0, None, 100.0]
    assert v[1].reason == "sentinel"
    assert len(covers(face, 0, fc=4)) >= 5  # read on every cycle, sentinel or not


# --- writes, dry reads, scheduling, robustness -----------------------------------------------


async def test_write_errors_are_typed() -> None:
    m = regmap({"name": "valve_cmd_pct", "table": "holding", "address": 0, "type": "uint16",
                "scale": 0.1, "writable": True, "write_min": 0.0, "write_max": 100.0},
               {"name": "fan_on", "table": "coil", "address": 3, "type": "bool",
                "writable": True},
               {"name": "setpoint_c", "table": "holding", "address": 4, "type": "float32",
                "writable": True, "write_min": 20.0, "write_max": 60.0})
    face = ModbusFace(m, port=free_port())
    got: list[tuple[str, float]] = []
    face.on_write = lambda p, v: got.append((p, v))
    dev = ModbusDevice(target(face.port, timeout_s=0.3), m, clock=CLOCK,
                       on_samples=lambda s: None)
    with pytest.raises(ModbusConnectionError):
        await dev.write("valve_cmd_pct", 10.0)  # owner task not running
    async with serving(face), running(dev):
        await until(lambda: dev.stats.connected)
        await dev.write("fan_on", 1.0)
        await dev.write("setpoint_c", 32.25)
        assert got == [("fan_on", 1.0), ("setpoint_c", 32.25)]
        assert face.registers("coil", 3, 1) == [1]
        face.inject_exception(4, table="holding", address=0)
        with pytest.raises(ModbusExceptionResponse) as exc:
            await dev.write("valve_cmd_pct", 10.0)
        assert exc.value.code == 4 and exc.value.reason == "server_device_failure"
        face.clear_exceptions()
        face.blackhole = True
        with pytest.raises(ModbusTimeout):
            await dev.write("valve_cmd_pct", 10.0)
        assert dev.stats.write_errors == 2
    assert got == [("fan_on", 1.0), ("setpoint_c", 32.25)]


async def test_failing_writes_and_face_callback_log_once_per_change() -> None:
    """"Log state changes once per change": a point's write failure is logged once (again
    only if the reason changes) and its recovery once, whatever the number of writes; the
    face's failing ``on_write`` likewise. Counted every time."""
    m = regmap({"name": "valve_cmd_pct", "table": "holding", "address": 0, "type": "uint16",
                "scale": 0.1, "writable": True, "write_min": 0.0, "write_max": 100.0})
    broken = {"on": True}

    def on_write(point: str, value: float) -> None:
        if broken["on"]:
            raise RuntimeError("simulator bug")

    face = ModbusFace(m, port=free_port(), on_write=on_write)
    dev = ModbusDevice(target(face.port), m, clock=CLOCK, on_samples=lambda s: None)
    with structlog.testing.capture_logs() as logs:
        async with serving(face), running(dev):
            await until(lambda: dev.stats.connected)
            face.inject_exception(4, table="holding", address=0)
            for v in (1.0, 2.0, 3.0):
                with pytest.raises(ModbusExceptionResponse):
                    await dev.write("valve_cmd_pct", v)
            face.clear_exceptions()
            for v in (4.0, 5.0, 6.0):  # accepted by the device, on_write fails in the face
                await dev.write("valve_cmd_pct", v)
            broken["on"] = False
            await dev.write("valve_cmd_pct", 7.0)
    failed = events(logs, "modbus_write_failed", point="valve_cmd_pct")
    assert [(e["reason"], e["failed_writes"]) for e in failed] == [("server_device_failure", 1)]
    recovered = events(logs, "modbus_write_recovered", point="valve_cmd_pct")
    assert [(e["was"], e["failed_writes"], e["value"]) for e in recovered] == [
        ("server_device_failure", 3, 4.0)]
    assert dev.stats.write_errors == 3 and dev.stats.writes == 4
    assert [e["log_level"] for e in events(logs, "modbus_write")] == ["debug"] * 4
    assert len(events(logs, "modbus_face_on_write_failed", point="valve_cmd_pct")) == 1
    assert len(events(logs, "modbus_face_on_write_recovered", point="valve_cmd_pct")) == 1
    assert face.on_write_errors == 3


async def test_read_once_running_and_standalone() -> None:
    m = regmap({"name": "x", "table": "input", "address": 0, "type": "uint16"})
    face = ModbusFace(m)
    face.update({"x": 9})
    async with serving(face):
        dev = ModbusDevice(target(face.port, poll_interval_s=5.0), m, clock=CLOCK,
                           on_samples=lambda s: None)
        assert [s.value for s in await dev.read_once()] == [9.0]
        assert not dev.stats.connected  # the dry connect closed again
        async with running(dev):
            await until(lambda: dev.stats.connected)
            face.update({"x": 10})
            assert [s.value for s in await dev.read_once()] == [10.0]


async def test_fixed_rate_schedule_does_not_drift() -> None:
    m = regmap({"name": "x", "table": "input", "address": 0, "type": "uint16"})
    face = ModbusFace(m)
    face.reply_delay_s = 0.02  # each poll takes >= 20 ms of a 50 ms period
    polls = Polls()
    async with serving(face):
        dev = ModbusDevice(target(face.port, poll_interval_s=0.05), m, clock=CLOCK,
                           on_samples=polls)
        async with running(dev):
            await polls.until(lambda: len(polls.polls) >= 32)
    t = [s.t_mono for s in polls.of("x")]
    # sleep-after-work would take 31 * 0.07 = 2.17 s; the fixed rate takes 31 * 0.05
    assert t[31] - t[1] == pytest.approx(31 * 0.05, abs=0.25)


async def test_on_samples_exception_never_stops_the_owner() -> None:
    m = regmap({"name": "x", "table": "input", "address": 0, "type": "uint16"})
    face = ModbusFace(m)
    calls = {"n": 0}

    def broken(samples: list[Sample]) -> None:
        calls["n"] += 1
        raise RuntimeError("consumer bug")

    async with serving(face):
        with structlog.testing.capture_logs() as logs:
            dev = ModbusDevice(target(face.port, poll_interval_s=0.02), m, clock=CLOCK,
                               on_samples=broken)
            async with running(dev) as task:
                await until(lambda: calls["n"] >= 5)
                assert not task.done()
    assert dev.stats.errors["on_samples_error"] >= 5
    assert len(events(logs, "modbus_on_samples_failed")) == 1


async def test_cancel_closes_the_connection_and_fails_later_writes() -> None:
    m = regmap({"name": "x_pct", "table": "holding", "address": 0, "type": "uint16",
                "writable": True, "write_min": 0.0, "write_max": 100.0})
    face = ModbusFace(m)
    async with serving(face):
        dev = ModbusDevice(target(face.port), m, clock=CLOCK, on_samples=lambda s: None)
        async with running(dev):
            await until(lambda: dev.stats.connected)
        assert not dev.stats.connected and not dev.running
        with pytest.raises(ModbusConnectionError):
            await dev.write("x_pct", 1.0)


async def test_face_multi_unit_and_unknown_unit() -> None:
    m = regmap({"name": "x", "table": "input", "address": 0, "type": "uint16"})
    face = ModbusFace(m, unit_ids=(1, 2))
    face.update({"x": 1}, unit=1)
    face.update({"x": 2}, unit=2)
    with pytest.raises(KeyError):
        face.update({"nope": 1})
    with pytest.raises(ValueError):
        face.update({"x": 70000})
    async with serving(face):
        for unit, want in ((1, 1.0), (2, 2.0)):
            dev = ModbusDevice(target(face.port, unit_id=unit), m, clock=CLOCK,
                               on_samples=lambda s: None)
            assert [s.value for s in await dev.read_once()] == [want]
        dev = ModbusDevice(target(face.port, unit_id=9), m, clock=CLOCK,
                           on_samples=lambda s: None)
        [s] = await dev.read_once()
        assert (s.quality, s.reason) == (Quality.STALE, "gateway_target_no_response")


async def test_cancel_during_fast_polling_always_stops() -> None:
    """Python 3.11's asyncio.wait_for (inside pymodbus) can swallow a cancel that arrives
    with the reply; the owner must still stop (DESIGN §3: bounded stop)."""
    server = FaultServer()
    m = regmap({"name": "x", "table": "input", "address": 0, "type": "uint16"})
    async with serving(server):
        for i in range(40):
            dev = ModbusDevice(target(server.port, poll_interval_s=0.001), m, clock=CLOCK,
                               on_samples=lambda s: None)
            task = asyncio.create_task(dev.run())
            wanted = 5 + i

            def busy(dev: ModbusDevice = dev, wanted: int = wanted) -> bool:
                return dev.stats.requests >= wanted

            await until(busy)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                async with asyncio.timeout(3.0):
                    await task


async def test_face_overlapping_requests_keep_their_own_transaction_ids() -> None:
    """pymodbus 3.16.1's own request handler answers a delayed request with the *next*
    request's tid (it re-reads ``last_pdu`` after the await); the face must not."""
    m = regmap(*({"name": f"r{i}", "table": "holding", "address": i, "type": "uint16"}
                 for i in range(10)))
    face = ModbusFace(m)
    face.update({f"r{i}": 100 + i for i in range(10)})
    face.reply_delay_s = 0.2
    async with serving(face):
        reader, writer = await asyncio.open_connection("127.0.0.1", face.port)
        for tid, address in ((1, 0), (2, 5)):
            writer.write(mbap(tid, 1, bytes([3]) + address.to_bytes(2, "big") + b"\x00\x01"))
            await writer.drain()
            await asyncio.sleep(0.05)
        replies = {}
        async with asyncio.timeout(5):
            for _ in range(2):
                head = await reader.readexactly(7)
                body = await reader.readexactly(int.from_bytes(head[4:6], "big") - 1)
                replies[int.from_bytes(head[:2], "big")] = int.from_bytes(body[2:4], "big")
        writer.close()
    assert replies == {1: 100, 2: 105}
