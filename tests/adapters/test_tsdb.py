"""Telemetry writer (rackplane.io.tsdb): line building, spool draining, outcomes, shutdown, replay.

Storage is checked against the real VictoriaMetrics (``victoria``, ``victoria_private``); the
exact requests (org, bucket, precision, token) and the 4xx/5xx reactions against the recording
endpoint of tests/adapters/tsdb_recording_server.py, since VictoriaMetrics ignores the former
and never answers the latter.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import selectors
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from harness.servers import VictoriaMetrics
from rackplane.clock import FakeClock, SystemClock
from rackplane.core.samples import Quality, good, invalid
from rackplane.errors import ConfigError
from rackplane.io.spool import Spool
from rackplane.io.tsdb import (
    LineCounters,
    ReplayResult,
    TelemetryWriter,
    classify_status,
    point_line,
    replay,
)
from rackplane.io.tsdb.influx import _backoff_s
from rackplane.settings import SpoolSettings, TsdbSettings
from tests.adapters.tsdb_recording_server import RecordingTsdb, Reply

TS = 1_767_225_600 * 10**9  # 2026-01-01T00:00:00Z
CHILD = Path(__file__).with_name("tsdb_writer_child.py")
ROOT = Path(__file__).resolve().parents[2]
CONFLICT_BODY = json.dumps(
    {
        "code": "invalid",
        "message": 'partial write: field type conflict: input field "flow_lpm" on measurement '
        '"cdu" is type float, already exists as type integer dropped=1',
    }
)


def uid(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def make_writer(
    tmp_path: Path,
    url: str | None,
    *,
    identity: dict[str, str] | None = None,
    clock: Any = None,
    spool_dir: Path | None = None,
    memory_max_lines: int = 10_000,
    **tsdb_kw: Any,
) -> TelemetryWriter:
    kw: dict[str, Any] = {
        "flush_interval_s": 0.05,
        "retry_initial_s": 0.05,
        "retry_max_s": 0.3,
        **tsdb_kw,
    }
    return TelemetryWriter(
        TsdbSettings(url=url, **kw),
        SpoolSettings(
            directory=spool_dir or tmp_path / "spool",
            append_interval_s=0.02,
            memory_max_lines=memory_max_lines,
        ),
        identity_tags=identity or {"site": "lab", "row": "row1", "rack": "rack1"},
        clock=clock or FakeClock(),
    )


async def until(cond: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


def seq_of(line: str) -> int:
    m = re.search(r" seq=(\d+)(?:\.0)? ", line)
    assert m, line
    return int(m.group(1))


@pytest.fixture
def rec() -> Iterator[RecordingTsdb]:
    with RecordingTsdb() as r:
        yield r


# --- line building -----------------------------------------------------------------------


def test_br19_numbers_are_floats_unless_declared_integer() -> None:
    assert point_line("cdu", {"rack": "r12"}, {"flow_lpm": 12}, TS) == (
        f"cdu,rack=r12 flow_lpm=12 {TS}"
    )
    assert point_line("cdu", {"rack": "r12"}, {"flow_lpm": 12.5}, TS) == (
        f"cdu,rack=r12 flow_lpm=12.5 {TS}"
    )
    line = point_line("link", {"port": "p1"}, {"crc_errors": 12, "up": True}, TS, {"crc_errors"})
    assert line == f"link,port=p1 crc_errors=12i,up=1 {TS}"
    assert point_line("link", {"port": "p1"}, {"crc_errors": 12.0}, TS, {"crc_errors"}) == (
        f"link,port=p1 crc_errors=12i {TS}"
    )
    with pytest.raises(ValueError, match="non-integral"):
        point_line("link", {"port": "p1"}, {"crc_errors": 12.5}, TS, {"crc_errors"})


def test_br21_tag_values_are_escaped_by_the_library_exactly() -> None:
    tags = {"rack": "CDU 3,row=A", "sensor": "inlet temp"}
    line = point_line("coolant", tags, {"temp": 25.5}, TS)
    assert line == rf"coolant,rack=CDU\ 3\,row\=A,sensor=inlet\ temp temp=25.5 {TS}"


def test_br21_empty_tag_is_rejected_never_written_untagged(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="BR-21"):
        point_line("coolant", {"rack": ""}, {"temp": 25.5}, TS)
    with pytest.raises(ValueError, match="BR-21"):
        make_writer(tmp_path, None, identity={"site": "lab", "rack": ""})
    w = make_writer(tmp_path, None)
    with pytest.raises(ValueError, match="BR-21"):
        w.write("coolant", {"loop": ""}, {"temp": 25.5})
    assert w.flush_to_spool() == 0
    assert w.stats.spooled == 0


def test_unrepresentable_names_and_values_are_refused() -> None:
    with pytest.raises(TypeError, match="numeric"):
        point_line("m", {"rack": "r"}, {"state": "running"}, TS)  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="control character"):
        point_line("m", {"rack": "a\nb"}, {"v": 1.0}, TS)
    with pytest.raises(ValueError, match="backslash"):
        point_line("m", {"rack": "a\\"}, {"v": 1.0}, TS)
    with pytest.raises(TypeError, match="int nanoseconds"):
        point_line("m", {"rack": "r"}, {"v": 1.0}, 1.5e18)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="empty"):
        point_line("", {"rack": "r"}, {"v": 1.0}, TS)


def test_none_nan_inf_are_omitted_and_counted() -> None:
    c = LineCounters()
    line = point_line(
        "pump",
        {"rack": "r"},
        {"speed_pct": None, "power_w": math.nan, "head_kpa": math.inf, "flow_lpm": 3.0},
        TS,
        counters=c,
    )
    assert line == f"pump,rack=r flow_lpm=3 {TS}"
    assert point_line("pump", {"rack": "r"}, {"speed_pct": -math.inf}, TS, counters=c) is None
    assert point_line("pump", {"rack": "r"}, {"n": 2**64}, TS, {"n"}, counters=c) is None
    assert (c.omitted_fields, c.empty_points) == (5, 2)
    assert c.omitted_by_field["pump.speed_pct"] == 2


_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
)


@given(st.dictionaries(st.sampled_from(["a", "b_c", "flow_lpm", "temp_c"]), _values, min_size=1))
def test_no_nan_or_inf_ever_reaches_the_client(fields: dict[str, Any]) -> None:
    c = LineCounters()
    line = point_line("m", {"rack": "r1"}, fields, TS, counters=c)
    finite = {k: float(v) for k, v in fields.items() if v is not None and math.isfinite(float(v))}
    assert c.omitted_fields == len(fields) - len(finite)
    if not finite:
        assert line is None
        return
    assert line is not None
    head, field_part, ts = line.split(" ")
    assert (head, ts) == ("m,rack=r1", str(TS))
    parsed = dict(kv.split("=") for kv in field_part.split(","))
    assert set(parsed) == set(finite)
    for k, text in parsed.items():
        assert not text.endswith("i")
        assert "nan" not in text.lower() and "inf" not in text.lower()
        assert float(text) == finite[k]


def test_classify_status() -> None:
    assert classify_status(204, "").kind == "ok"
    r = classify_status(400, CONFLICT_BODY)
    assert (r.kind, r.status) == ("reject", 400)
    assert r.message.startswith("partial write: field type conflict")
    assert classify_status(422, "x").kind == "reject"
    assert classify_status(413, "").kind == "too_large"
    for s in (401, 403, 404, 405):
        assert classify_status(s, "").kind == "config"
    for s in (429, 500, 502, 503, 504):
        assert classify_status(s, "").kind == "retry"
    assert classify_status(503, "", "7").retry_after_s == 7.0
    assert classify_status(503, "", "Wed, 21 Oct").retry_after_s is None


def test_classify_status_of_influxdb1_answers() -> None:
    """InfluxDB 1.x's error bodies (``{"error": ...}``, measured on 1.6.7): the partial
    write's dropped count (unparsable lines are outside it), and the 500 it answers to a
    retention policy it lacks, which is a configuration error, not an outage."""
    r = classify_status(400, '{"error":"partial write: field type conflict: input field '
                        '\\"f\\" on measurement \\"m\\" is type float, already exists as '
                        'type integer dropped=1"}')
    assert (r.kind, r.dropped, r.dropped_of(5)) == ("reject", 1, 1)
    assert r.message.startswith("partial write: field type conflict: input field")
    r = classify_status(400, '{"error":"partial write: unable to parse \'bad line\': invalid '
                        'field format dropped=0"}')
    assert (r.kind, r.dropped, r.dropped_of(2)) == ("reject", 1, 1)
    assert classify_status(400, '{"error":"x"}').dropped_of(3) == 3  # no count: all of it
    assert classify_status(400, '{"error":"dropped=9"}').dropped_of(3) == 3  # not believable
    rp = classify_status(500, '{"error":"retention policy not found: one_week"}')
    assert (rp.kind, rp.message) == ("config", "retention policy not found: one_week")
    db = classify_status(404, '{"error":"database not found: \\"x\\""}')
    assert (db.kind, db.message) == ("config", 'database not found: "x"')
    assert classify_status(500, '{"error":"timeout"}').kind == "retry"


def test_backoff_grows_doubling_to_the_cap_and_honours_retry_after() -> None:
    t = TsdbSettings(retry_initial_s=1.0, retry_max_s=30.0)
    for attempt, nominal in [(1, 1.0), (2, 2.0), (3, 4.0), (6, 30.0), (60, 30.0)]:
        assert 0.8 * nominal <= _backoff_s(t, attempt, None) <= nominal
    assert 0.8 * 10 <= _backoff_s(t, 1, 10.0) <= 10.0
    assert _backoff_s(t, 1, 500.0) <= 30.0


def test_write_samples_records_quality_for_every_sample(tmp_path: Path) -> None:
    w = make_writer(tmp_path, None)
    samples = [
        good("supply_temp_c", 25.5, "degC", TS, 1.0),
        invalid("flow_lpm", "lpm", TS, 1.0, Quality.BAD, "timeout"),
        good("pressure_kpa", 150.0, "kPa", TS, 1.0).as_stale(),  # keeps its old value
        good("return_temp_c", 31.0, "degC", TS + 10**9, 2.0),
    ]
    assert w.write_samples("coolant_loop", {"loop": "sec"}, samples) == 2
    w.flush_to_spool()
    got = Spool(tmp_path / "spool", readonly=True, cursor_file="t").read(10)[0]
    assert got == [
        "coolant_loop,loop=sec,rack=rack1,row=row1,site=lab flow_lpm_quality=2,"
        f"pressure_kpa_quality=1,supply_temp_c=25.5,supply_temp_c_quality=0 {TS}",
        "coolant_loop,loop=sec,rack=rack1,row=row1,site=lab return_temp_c=31,"
        f"return_temp_c_quality=0 {TS + 10**9}",
    ]


def test_timestamp_outside_sanity_window_is_counted_logged_once_and_held(
    tmp_path: Path,
) -> None:
    """The clock itself is outside the window: its lines are held, never spooled as 1970
    (tests/adapters/test_tsdb_timestamps.py has the rest of the policy)."""
    clock = FakeClock(start_wall_ns=86_400 * 10**9)  # 1970-01-02: clock not synchronised
    w = make_writer(tmp_path, None, clock=clock)
    with capture_logs() as logs:
        w.write("pump", {}, {"speed_pct": 50.0})
        w.write("pump", {}, {"speed_pct": 51.0})
        w.write("pump", {}, {"speed_pct": 52.0}, ts_ns=TS)
    assert w.stats.ts_out_of_window == 2 and w.stats.ts_held == 2
    events = [e["event"] for e in logs]
    assert events.count("telemetry_timestamp_outside_window") == 1
    assert events.count("telemetry_timestamp_back_in_window") == 1
    w.flush_to_spool()
    assert w.stats.spooled == 1


def test_identity_tags_are_merged_and_cannot_be_contradicted(tmp_path: Path) -> None:
    w = make_writer(tmp_path, None)
    assert w.write("pump", {"rack": "rack1", "device": "p1"}, {"speed_pct": 50.0}, TS)
    with pytest.raises(ValueError, match="contradicts the identity"):
        w.write("pump", {"rack": "rack2"}, {"speed_pct": 50.0}, TS)


def test_only_tsdb_imports_influxdb_client() -> None:
    offenders = []
    for pkg in ("rackplane", "valvey", "racky", "rackctl"):
        for path in (ROOT / pkg).rglob("*.py"):
            text = path.read_text(errors="replace")
            if re.search(r"^\s*(from|import)\s+influxdb_client", text, re.M):
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == ["rackplane/io/tsdb/influx.py"]


def test_missing_token_variable_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RACKPLANE_TEST_NO_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="RACKPLANE_TEST_NO_TOKEN"):
        make_writer(tmp_path, "http://127.0.0.1:9", token_env="RACKPLANE_TEST_NO_TOKEN")


# --- exact requests and outcomes (recording endpoint) -------------------------------------


async def test_exact_request_org_bucket_precision_token(
    tmp_path: Path, rec: RecordingTsdb, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RACKPLANE_TEST_TOKEN", "s3cr3t-token")
    w = make_writer(
        tmp_path, rec.url, org="acme", bucket="cooling", token_env="RACKPLANE_TEST_TOKEN"
    )
    w.write("pump", {"device": "p1"}, {"speed_pct": 50, "power_w": math.nan}, TS)
    task = asyncio.create_task(w.run())
    assert await asyncio.to_thread(rec.wait_lines, 1)
    await w.close()
    await task
    (r,) = rec.requests
    assert (r.method, r.path) == ("POST", "/api/v2/write")
    assert r.query == {"org": "acme", "bucket": "cooling", "precision": "ns"}
    assert r.headers["Authorization"] == "Token s3cr3t-token"
    assert r.headers["Content-Type"].startswith("text/plain")
    assert r.body == f"pump,device=p1,rack=rack1,row=row1,site=lab speed_pct=50 {TS}"
    assert w.stats.omitted_fields == 1


async def test_br19_field_type_conflict_is_dropped_counted_logged_not_retried(
    tmp_path: Path, rec: RecordingTsdb
) -> None:
    rec.script(Reply(400, CONFLICT_BODY))
    w = make_writer(tmp_path, rec.url)
    w.write("cdu", {}, {"supply_temp_c": 30.0}, TS)
    w.write("cdu", {}, {"flow_lpm": 12.5}, TS)
    with capture_logs() as logs:
        task = asyncio.create_task(w.run())
        await until(lambda: w.stats.rejected == 1)
        w.write("cdu", {}, {"flow_lpm": 13.0}, TS + 10**9)
        await until(lambda: w.stats.sent == 1)
        await asyncio.sleep(0.3)  # room for a wrong retry to show up
        await w.close()
        await task
    assert [len(r.lines) for r in rec.requests] == [2, 1]  # the rejected batch never came back
    st_ = w.stats
    # "dropped=1": the server stored the other line of the partial write
    assert (st_.rejected, st_.sent, st_.retries, st_.depth_lines) == (1, 2, 0, 0)
    (ev,) = [e for e in logs if e["event"] == "tsdb_batch_rejected"]
    assert ev["log_level"] == "error"
    assert (ev["status"], ev["field"], ev["measurement"], ev["retried"]) == (
        400, "flow_lpm", "cdu", False
    )
    assert ev["line"].startswith("cdu,") and "flow_lpm=12.5" in ev["line"]
    assert ev["lines_dropped"] == 1


async def test_413_splits_the_batch_and_delivers_everything_once(
    tmp_path: Path, rec: RecordingTsdb
) -> None:
    rec.script(Reply(413, '{"code":"request too large","message":"too large"}'))
    w = make_writer(tmp_path, rec.url)
    for i in range(10):
        w.write("m", {}, {"seq": i}, TS + i)
    task = asyncio.create_task(w.run())
    await until(lambda: w.stats.sent == 10)
    await w.close()
    await task
    sizes = [len(r.lines) for r in rec.requests]
    assert sizes[0] == 10 and rec.requests[0].status == 413
    assert [seq_of(x) for r in rec.requests[1:] for x in r.lines] == list(range(10))
    assert max(sizes[1:]) <= 5
    assert w.stats.rejected == 0


@pytest.mark.parametrize("status", [401, 403, 429, 500, 503])
async def test_failures_keep_the_data_back_off_and_retry(
    tmp_path: Path, rec: RecordingTsdb, status: int
) -> None:
    body = '{"code":"unauthorized","message":"unauthorized access"}'
    rec.script(Reply(status, body), Reply(status, body))
    w = make_writer(tmp_path, rec.url)
    for i in range(5):
        w.write("m", {}, {"seq": i}, TS + i)
    with capture_logs() as logs:
        task = asyncio.create_task(w.run())
        await until(lambda: w.stats.sent == 5)
        await w.close()
        await task
    assert len(rec.requests) == 3
    assert rec.requests[0].body == rec.requests[1].body == rec.requests[2].body
    st_ = w.stats
    assert (st_.retries, st_.rejected, st_.depth_lines) == (2, 0, 0)
    failing = [e for e in logs if e["event"] == "tsdb_write_failing"]
    assert len(failing) == 1  # once per change of state, not once per attempt
    assert failing[0]["log_level"] == ("error" if status in (401, 403) else "warning")
    assert [e["event"] for e in logs].count("tsdb_write_recovered") == 1


async def test_close_returns_within_budget_when_the_database_hangs(
    tmp_path: Path, rec: RecordingTsdb
) -> None:
    """The request in flight at the deadline is abandoned; its batch is resent after the
    restart: that batch alone may arrive twice (at-least-once)."""
    rec.default = Reply(204, delay_s=3.0)
    w = make_writer(tmp_path, rec.url, timeout_s=10)
    for i in range(50):
        w.write("m", {}, {"seq": i}, TS + i)
    t0 = time.monotonic()
    await w.close(budget_s=0.5)
    assert time.monotonic() - t0 < 2.5
    assert await asyncio.to_thread(rec.wait_requests, 1)  # received, answer still pending
    rec.default = Reply(204)
    w2 = make_writer(tmp_path, rec.url)
    assert w2.stats.depth_lines == 50  # nothing acked, nothing lost
    await w2.close(budget_s=30)
    counts = Counter(seq_of(x) for x in rec.lines())
    assert set(counts) == set(range(50))
    assert {s for s, n in counts.items() if n > 1} <= {seq_of(x) for x in rec.requests[0].lines}


async def test_cancelled_run_leaves_the_request_in_flight_for_close_to_settle(
    tmp_path: Path, rec: RecordingTsdb
) -> None:
    """The service cancels run() and then calls close(): the batch already on the wire is
    acked by close(), not sent a second time."""
    rec.default = Reply(204, delay_s=0.5)
    w = make_writer(tmp_path, rec.url)
    for i in range(40):
        w.write("m", {}, {"seq": i}, TS + i)
    task = asyncio.create_task(w.run())
    assert await asyncio.to_thread(rec.wait_requests, 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await w.close(budget_s=10)
    assert [seq_of(x) for x in rec.lines()] == list(range(40))
    assert (w.stats.sent, w.stats.depth_lines) == (40, 0)
    assert not w.write("m", {}, {"seq": 99}, TS)  # after close: refused and counted
    assert w.stats.dropped_closed == 1


async def test_unwritable_spool_is_reported_and_memory_is_sent_directly(
    tmp_path: Path, rec: RecordingTsdb
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with capture_logs() as logs:
        w = make_writer(tmp_path, rec.url, spool_dir=blocker / "spool")
        for i in range(20):
            w.write("m", {}, {"seq": i}, TS + i)
        task = asyncio.create_task(w.run())
        await until(lambda: w.stats.sent == 20)
        await w.close()
        await task
    st_ = w.stats
    assert (st_.spool_ok, st_.spool_errors >= 1, st_.spooled) == (False, True, 0)
    assert [seq_of(x) for x in rec.lines()] == list(range(20))
    assert [e["event"] for e in logs].count("telemetry_spool_failed") == 1


async def test_memory_is_bounded_while_the_spool_cannot_be_written(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    w = make_writer(tmp_path, None, spool_dir=blocker / "spool", memory_max_lines=100)
    for i in range(150):
        w.write("m", {}, {"seq": i}, TS + i)
    assert w.flush_to_spool() == 100
    st_ = w.stats
    assert (st_.dropped_memory, st_.dropped, st_.pending_memory) == (50, 50, 100)
    await w.close(budget_s=0)


# --- shutdown and crash (subprocesses) -----------------------------------------------------


def _read_line(proc: subprocess.Popen[str], timeout_s: float) -> str:
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        if not sel.select(timeout_s):
            raise AssertionError("child said nothing in time")
        return proc.stdout.readline()
    finally:
        sel.close()


def test_br18_sigterm_sends_every_buffered_point_before_exit(
    tmp_path: Path, rec: RecordingTsdb
) -> None:
    budget_s = 5.0
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), "sigterm", rec.url, str(tmp_path / "spool"), "br18", "100",
         str(budget_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert _read_line(proc, 60).strip() == "READY"
        time.sleep(0.2)
        assert rec.requests == []  # buffered: flush interval 60 s, batch 1000
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert elapsed < budget_s
    assert sorted(seq_of(x) for x in rec.lines()) == list(range(100))
    stats = json.loads(out.strip().splitlines()[-1])
    assert (stats["sent"], stats["depth_lines"], stats["rejected"]) == (100, 0, 0)


async def test_sigkill_then_a_new_writer_sends_every_appended_point_once(tmp_path: Path) -> None:
    """Exactly once except for the one batch the database may have received while the child
    died before recording its ack (at-least-once); those duplicates, if any, must be lines of
    the last request before the kill."""
    spool_dir = tmp_path / "spool"
    with RecordingTsdb(default=Reply(204, delay_s=0.003)) as rec:
        proc = subprocess.Popen(  # noqa: ASYNC220 (a plain child we kill; no awaiting on it)
            [sys.executable, str(CHILD), "kill", rec.url, str(spool_dir), "kill"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        appended = 0
        try:
            while appended < 3000 or len(rec.requests) < 5:
                line = await asyncio.to_thread(_read_line, proc, 60)
                assert line.startswith("APPENDED"), line
                appended = int(line.split()[1])
        finally:
            proc.kill()
            _, err = proc.communicate(timeout=30)
        await asyncio.sleep(0.5)  # let the endpoint finish a request that was in transit
        before = list(rec.requests)
        pre_lines = [seq_of(x) for r in before for x in r.lines]
        assert len(pre_lines) == len(set(pre_lines))  # no duplicate while the child lived
        w = make_writer(tmp_path, rec.url, identity={"site": "lab", "run": "kill"},
                        clock=SystemClock())
        await w.close(budget_s=60)
        assert w.stats.depth_lines == 0
        counts = Counter(seq_of(x) for x in rec.lines())
    top = max(counts) + 1
    assert top >= appended  # every point reported appended arrived
    assert set(counts) == set(range(top))  # in order, no gap
    dups = {s for s, n in counts.items() if n > 1}
    assert max(counts.values()) <= 2
    assert dups <= {seq_of(x) for x in before[-1].lines}, err


# --- storage in the real VictoriaMetrics ---------------------------------------------------


async def test_points_are_queried_back_from_victoria(
    tmp_path: Path, victoria: VictoriaMetrics
) -> None:
    rack = uid("qb")
    w = make_writer(tmp_path, victoria.url, identity={"site": "lab", "row": "row1", "rack": rack})
    w.write_samples(
        "coolant_loop",
        {"loop": "secondary"},
        [
            good("supply_temp_c", 25.5, "degC", TS, 1.0),
            invalid("flow_lpm", "lpm", TS, 1.0, Quality.BAD, "timeout"),
        ],
    )
    await w.close(budget_s=10)
    assert w.stats.sent == 1
    series = await asyncio.to_thread(
        victoria.wait_export, f'{{__name__=~"coolant_loop_.*",rack="{rack}"}}', 3
    )
    got = {s["metric"]["__name__"]: (s["values"], s["timestamps"]) for s in series}
    assert got == {
        "coolant_loop_supply_temp_c": ([25.5], [TS // 10**6]),
        "coolant_loop_supply_temp_c_quality": ([0], [TS // 10**6]),
        "coolant_loop_flow_lpm_quality": ([2], [TS // 10**6]),
    }
    labels = {k: v for k, v in series[0]["metric"].items() if k != "__name__"}
    assert labels == {"site": "lab", "row": "row1", "rack": rack, "loop": "secondary"}


async def test_br19_int_then_float_both_accepted_by_victoria_in_either_order(
    tmp_path: Path, victoria: VictoriaMetrics
) -> None:
    rack = uid("br19")
    w = make_writer(tmp_path, victoria.url, identity={"site": "lab", "rack": rack})
    w.write("cdu_a", {}, {"flow_lpm": 12}, TS)
    w.write("cdu_a", {}, {"flow_lpm": 12.5}, TS + 10**9)
    w.write("cdu_b", {}, {"flow_lpm": 12.5}, TS)
    w.write("cdu_b", {}, {"flow_lpm": 12}, TS + 10**9)
    w.flush_to_spool()
    spooled = Spool(tmp_path / "spool", readonly=True, cursor_file="t").read(10)[0]
    assert [x.split(" ")[1] for x in spooled] == [
        "flow_lpm=12", "flow_lpm=12.5", "flow_lpm=12.5", "flow_lpm=12"
    ]
    await w.close(budget_s=10)
    assert (w.stats.sent, w.stats.rejected) == (4, 0)
    series = await asyncio.to_thread(
        victoria.wait_export, f'{{__name__=~"cdu_._flow_lpm",rack="{rack}"}}', 4
    )
    got = {s["metric"]["__name__"]: s["values"] for s in series}
    assert got == {"cdu_a_flow_lpm": [12, 12.5], "cdu_b_flow_lpm": [12.5, 12]}


async def test_br21_tag_value_round_trips_through_victoria_exactly(
    tmp_path: Path, victoria: VictoriaMetrics
) -> None:
    run = uid("br21")
    w = make_writer(tmp_path, victoria.url, identity={"rack": "CDU 3,row=A", "run": run})
    w.write("coolant", {"sensor": "inlet temp"}, {"temp": 25.5}, TS)
    await w.close(budget_s=10)
    (s,) = await asyncio.to_thread(victoria.wait_export, f'{{__name__="coolant_temp",run="{run}"}}')
    assert s["metric"]["rack"] == "CDU 3,row=A"
    assert s["metric"]["sensor"] == "inlet temp"
    assert s["values"] == [25.5]


async def test_victoria_outage_loses_nothing_and_stats_show_it(
    tmp_path: Path, victoria_private: VictoriaMetrics
) -> None:
    vm = victoria_private
    run = uid("out")
    w = make_writer(tmp_path, vm.url, identity={"site": "lab", "run": run}, clock=SystemClock())
    task = asyncio.create_task(w.run())
    for i in range(20):
        w.write("outage", {}, {"seq": i}, TS + i * 10**6)
    await until(lambda: w.stats.sent == 20)
    await asyncio.to_thread(vm.stop)
    for i in range(20, 320):
        w.write("outage", {}, {"seq": i}, TS + i * 10**6)
    await until(lambda: w.stats.retries >= 3)
    during = w.stats
    assert (during.sent, during.depth_lines) == (20, 300)
    assert during.last_error and during.backoff_s > 0
    await asyncio.to_thread(vm.start)
    await until(lambda: w.stats.sent == 320)
    await w.close()
    await task
    (s,) = await asyncio.to_thread(vm.wait_export, f'{{__name__="outage_seq",run="{run}"}}', 320)
    assert sorted(s["values"]) == list(range(320))  # 0 lost, none twice
    after = w.stats
    assert (after.depth_lines, after.rejected, after.dropped, after.backoff_s) == (0, 0, 0, 0.0)


async def test_embedded_store_keeps_everything_and_replays_into_victoria(
    tmp_path: Path, victoria: VictoriaMetrics
) -> None:
    run = uid("rp")
    w = make_writer(tmp_path, None, identity={"site": "lab", "run": run})
    task = asyncio.create_task(w.run())
    for i in range(2500):
        w.write("replayed", {}, {"seq": i}, TS + i * 10**6)
    await asyncio.sleep(0.1)
    await w.close()
    await task
    assert (w.stats.spooled, w.stats.sent, w.stats.depth_lines) == (2500, 0, 2500)
    seen: list[int] = []

    def progress(r: ReplayResult) -> None:
        seen.append(r.sent_lines)

    result = await replay(
        tmp_path / "spool", TsdbSettings(url=victoria.url, batch_lines=1000), progress=progress
    )
    assert (result.sent_lines, result.rejected_lines, result.complete, result.error) == (
        2500, 0, True, None
    )
    assert result.remaining_lines == 0 and result.batches == 3
    assert seen[:3] == [1000, 2000, 2500]
    match = f'{{__name__="replayed_seq",run="{run}"}}'
    (s,) = await asyncio.to_thread(victoria.wait_export, match, 2500)
    assert sorted(s["values"]) == list(range(2500))
    with Spool(tmp_path / "spool") as sp:  # the store itself is untouched
        assert sp.depth_lines == 2500


async def test_replay_stops_on_auth_error_and_resumes_later(
    tmp_path: Path, rec: RecordingTsdb
) -> None:
    w = make_writer(tmp_path, None)
    for i in range(30):
        w.write("m", {}, {"seq": i}, TS + i)
    await w.close()
    t = TsdbSettings(url=rec.url, batch_lines=10, retry_initial_s=0.01)
    rec.script(Reply(204), Reply(401, '{"code":"unauthorized","message":"unauthorized"}'))
    first = await replay(tmp_path / "spool", t)
    assert (first.sent_lines, first.complete, first.remaining_lines) == (10, False, 20)
    assert first.error and "401" in first.error
    second = await replay(tmp_path / "spool", t, from_start=False)
    assert (second.sent_lines, second.complete, second.error) == (20, True, None)
    sent = [seq_of(x) for r in rec.requests if r.status == 204 for x in r.lines]
    assert sent == list(range(30))
    with pytest.raises(ConfigError, match=r"tsdb\.url"):
        await replay(tmp_path / "spool", TsdbSettings(url=None))


async def test_replay_gives_up_after_the_configured_time_without_progress(
    tmp_path: Path, rec: RecordingTsdb
) -> None:
    w = make_writer(tmp_path, None)
    w.write("m", {}, {"seq": 1}, TS)
    await w.close()
    rec.default = Reply(503, '{"code":"unavailable","message":"overloaded"}')
    t = TsdbSettings(url=rec.url, retry_initial_s=0.02, retry_max_s=0.05, replay_give_up_s=0.3)
    result = await replay(tmp_path / "spool", t)
    assert (result.sent_lines, result.complete, result.remaining_lines) == (0, False, 1)
    assert result.error and result.error.startswith("gave up")
    assert result.retries >= 2
