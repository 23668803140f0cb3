"""The InfluxDB 1.x write path (``tsdb.api = "v1"``: ``POST /write?db=&rp=&precision=ns``).

Storage, outages and refusals against the real InfluxDB 1.x (Debian ``influxdb``, 1.6.7:
``influxdb1``, ``influxdb1_private``); the exact request (path, database, retention policy,
precision, Basic authentication) against the recording endpoint of
tests/adapters/tsdb_recording_server.py, which sits beside the real server.
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from structlog.testing import capture_logs

from harness.servers import InfluxDB1
from rackplane.clock import FakeClock, SystemClock
from rackplane.core.samples import Quality, good, invalid
from rackplane.io.tsdb import TelemetryWriter, replay
from rackplane.settings import SpoolSettings, TsdbSettings
from tests.adapters.test_tsdb import TS, until
from tests.adapters.tsdb_recording_server import RecordingTsdb
from tests.servers import start_influxdb1

IDENTITY = {"site": "lab", "row": "row1", "rack": "rack1"}
pytestmark = [pytest.mark.servers]


def v1_writer(tmp_path: Path, url: str, *, clock: Any = None, spool: str = "spool",
              **tsdb_kw: Any) -> TelemetryWriter:
    kw: dict[str, Any] = {"api": "v1", "flush_interval_s": 0.05, "retry_initial_s": 0.05,
                          "retry_max_s": 0.3, **tsdb_kw}
    return TelemetryWriter(
        TsdbSettings(url=url, **kw),
        SpoolSettings(directory=tmp_path / spool, append_interval_s=0.02),
        identity_tags=IDENTITY, clock=clock or FakeClock(),
    )


def new_db(srv: InfluxDB1) -> str:
    name = f"t{uuid.uuid4().hex[:10]}"
    srv.create_database(name)
    return name


def rows(srv: InfluxDB1, db: str, q: str) -> list[list[Any]]:
    """Values of the first series of ``q`` (all series' rows concatenated)."""
    res = srv.query(q, db)["results"][0]
    assert "error" not in res, res
    return [v for s in res.get("series", []) for v in s["values"]]


# --- settings ------------------------------------------------------------------------------


@pytest.mark.parametrize("kw, fragment", [
    ({"api": "v1", "token_env": "X"}, "token_env is for api = 'v2'"),
    ({"api": "v1", "username": "u"}, "both username and password_env"),
    ({"api": "v1", "password_env": "P"}, "both username and password_env"),
    ({"retention_policy": "autogen"}, "are for api = 'v1'"),
    ({"database": "telemetry"}, "are for api = 'v1'"),
    ({"username": "u", "password_env": "P"}, "are for api = 'v1'"),
    ({"api": "v3"}, "api"),
    ({"api": "v1", "database": ""}, "database"),
])
def test_v1_and_v2_settings_are_not_mixed(kw: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError, match=fragment):
        TsdbSettings(url="http://127.0.0.1:8086", **kw)


def test_v1_settings_accepted() -> None:
    s = TsdbSettings(url="http://db:8086", api="v1", database="cooling",
                     retention_policy="one_year", username="rackplane", password_env="PW")
    assert (s.api, s.database, s.retention_policy) == ("v1", "cooling", "one_year")
    assert TsdbSettings().api == "v2"


# --- exact requests (recording endpoint) ---------------------------------------------------


async def test_v1_exact_request_database_rp_precision_basic_auth(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RACKPLANE_TEST_INFLUX_PW", "pa:ss w0rd")
    with RecordingTsdb() as rec:
        w = v1_writer(tmp_path, rec.url, database="cooling db", retention_policy="one_year",
                      username="rackplane", password_env="RACKPLANE_TEST_INFLUX_PW")
        w.write("pump", {"device": "p1"}, {"speed_pct": 50}, TS)
        task = asyncio.create_task(w.run())
        assert await asyncio.to_thread(rec.wait_lines, 1)
        await w.close()
        await task
    (r,) = rec.requests
    assert (r.method, r.path) == ("POST", "/write")
    assert r.query == {"db": "cooling db", "rp": "one_year", "precision": "ns"}
    assert r.headers["Authorization"] == "Basic " + base64.b64encode(
        b"rackplane:pa:ss w0rd").decode()
    assert r.headers["Content-Type"].startswith("text/plain")
    assert r.body == f"pump,device=p1,rack=rack1,row=row1,site=lab speed_pct=50 {TS}"
    assert "pa:ss" not in r.path + str(r.query)  # the password never in the URL


async def test_v1_without_auth_sends_no_authorization_and_the_default_rp(
    tmp_path: Path
) -> None:
    with RecordingTsdb() as rec:
        w = v1_writer(tmp_path, rec.url)
        w.write("pump", {}, {"speed_pct": 50}, TS)
        await w.close(budget_s=10)
    (r,) = rec.requests
    assert r.query == {"db": "rackplane", "precision": "ns"}
    assert "Authorization" not in r.headers


async def test_v1_missing_password_variable_is_a_config_error(tmp_path: Path) -> None:
    from rackplane.errors import ConfigError

    with pytest.raises(ConfigError, match="RACKPLANE_TEST_UNSET_PW"):
        v1_writer(tmp_path, "http://127.0.0.1:9", username="u",
                  password_env="RACKPLANE_TEST_UNSET_PW")


# --- the real InfluxDB 1.x -----------------------------------------------------------------


async def test_v1_points_are_queried_back_from_influxdb1(
    tmp_path: Path, influxdb1: InfluxDB1
) -> None:
    db = new_db(influxdb1)
    w = v1_writer(tmp_path, influxdb1.url, database=db)
    w.write_samples("coolant_loop", {"loop": "secondary"}, [
        good("supply_temp_c", 25.5, "degC", TS, 1.0),
        invalid("flow_lpm", "lpm", TS, 1.0, Quality.BAD, "timeout"),
    ])
    w.write("link", {"port": "gpu07/nic1"}, {"link_events_total": 3}, TS,
            int_fields=("link_events_total",))
    await w.close(budget_s=10)
    assert (w.stats.sent, w.stats.rejected) == (2, 0)
    res = influxdb1.query('SELECT * FROM "coolant_loop"', db, epoch="ns")["results"][0]
    (s,) = res["series"]
    got = dict(zip(s["columns"], s["values"][0], strict=True))
    assert got == {"time": TS, "supply_temp_c": 25.5, "supply_temp_c_quality": 0,
                   "flow_lpm_quality": 2, "loop": "secondary", "site": "lab", "row": "row1",
                   "rack": "rack1"}
    assert rows(influxdb1, db, 'SELECT "link_events_total", "port" FROM "link"') == [
        [TS // 10**6, 3, "gpu07/nic1"]]


async def test_v1_outage_spools_every_line_and_delivers_it_after_restart(
    tmp_path: Path, influxdb1_private: InfluxDB1
) -> None:
    srv = influxdb1_private
    db = new_db(srv)
    w = v1_writer(tmp_path, srv.url, database=db, clock=SystemClock())
    task = asyncio.create_task(w.run())
    for i in range(20):
        w.write("outage", {}, {"seq": i}, TS + i * 10**6)
    await until(lambda: w.stats.sent == 20)
    await asyncio.to_thread(srv.stop)
    for i in range(20, 320):
        w.write("outage", {}, {"seq": i}, TS + i * 10**6)
    await until(lambda: w.stats.retries >= 3)
    during = w.stats
    assert (during.sent, during.depth_lines) == (20, 300)  # spooled, none sent, none lost
    assert during.last_error and during.backoff_s > 0
    await asyncio.to_thread(srv.start)
    await until(lambda: w.stats.sent == 320)
    await w.close()
    await task
    got = [v[1] for v in rows(srv, db, 'SELECT "seq" FROM "outage"')]
    assert sorted(got) == list(range(320))  # 0 lost, none twice
    after = w.stats
    assert (after.depth_lines, after.rejected, after.dropped) == (0, 0, 0)


async def test_v1_field_type_conflict_is_refused_counted_and_nothing_else_lost(
    tmp_path: Path, influxdb1: InfluxDB1
) -> None:
    db = new_db(influxdb1)
    w = v1_writer(tmp_path, influxdb1.url, database=db)
    w.write("cdu", {}, {"flow_lpm": 12}, TS, int_fields=("flow_lpm",))  # stored as integer
    await w.close(budget_s=10)
    assert w.stats.sent == 1
    w2 = v1_writer(tmp_path, influxdb1.url, database=db, spool="spool2")
    w2.write("cdu", {}, {"supply_temp_c": 30.0}, TS + 1)
    w2.write("cdu", {}, {"flow_lpm": 12.5}, TS + 2)  # float: a field type conflict (BR-19)
    w2.write("cdu", {}, {"supply_temp_c": 30.5}, TS + 3)
    w2.write("pump", {}, {"speed_pct": 40.0}, TS + 4)
    with capture_logs() as logs:
        task = asyncio.create_task(w2.run())
        await until(lambda: w2.stats.depth_lines == 0)
        await asyncio.sleep(0.3)  # room for a wrong retry to show up
        await w2.close()
        await task
    st = w2.stats
    assert (st.rejected, st.sent, st.retries, st.depth_lines) == (1, 3, 0, 0)
    (ev,) = [e for e in logs if e["event"] == "tsdb_batch_rejected"]
    assert (ev["status"], ev["field"], ev["measurement"], ev["lines_dropped"]) == (
        400, "flow_lpm", "cdu", 1)
    assert "flow_lpm=12.5" in ev["line"]
    assert rows(influxdb1, db, 'SELECT "flow_lpm" FROM "cdu" WHERE "flow_lpm" > 0') == [
        [TS // 10**6, 12]]
    assert [r[1] for r in rows(influxdb1, db, 'SELECT "supply_temp_c" FROM "cdu"')
            if r[1] is not None] == [30.0, 30.5]
    assert [r[1] for r in rows(influxdb1, db, 'SELECT "speed_pct" FROM "pump"')] == [40.0]


@pytest.mark.parametrize("missing", ["database", "retention_policy"])
async def test_v1_missing_database_or_rp_keeps_the_data_until_it_exists(
    tmp_path: Path, influxdb1: InfluxDB1, missing: str
) -> None:
    """404 "database not found" and 1.x's 500 "retention policy not found" are configuration
    errors: logged as such once, the data kept and retried; delivered once the operator
    creates what was missing."""
    db = f"t{uuid.uuid4().hex[:10]}"
    kw: dict[str, Any] = {"database": db}
    if missing == "retention_policy":
        influxdb1.create_database(db)
        kw["retention_policy"] = "one_week"
    w = v1_writer(tmp_path, influxdb1.url, **kw)
    with capture_logs() as logs:
        task = asyncio.create_task(w.run())
        for i in range(5):
            w.write("m", {}, {"seq": i}, TS + i)
        await until(lambda: w.stats.retries >= 3)
        assert (w.stats.sent, w.stats.rejected, w.stats.depth_lines) == (0, 0, 5)
        assert "not found" in (w.stats.last_error or "")
        if missing == "database":
            influxdb1.create_database(db)
        else:
            influxdb1.query(f'CREATE RETENTION POLICY "one_week" ON "{db}" DURATION 100000h '
                            "REPLICATION 1", post=True, epoch=None)
        await until(lambda: w.stats.sent == 5)
        await w.close()
        await task
    failing = [e for e in logs if e["event"] == "tsdb_write_failing"]
    assert len(failing) == 1 and failing[0]["kind"].startswith("configuration")
    rp = '"one_week".' if missing == "retention_policy" else ""
    assert [r[1] for r in rows(influxdb1, db, f'SELECT "seq" FROM {rp}"m"')] == list(range(5))


async def test_replay_into_influxdb1(tmp_path: Path, influxdb1: InfluxDB1) -> None:
    db = new_db(influxdb1)
    w = TelemetryWriter(TsdbSettings(), SpoolSettings(directory=tmp_path / "store"),
                        identity_tags=IDENTITY, clock=FakeClock())
    for i in range(50):
        w.write("m", {}, {"seq": i}, TS + i)
    await w.close()
    res = await replay(tmp_path / "store", TsdbSettings(url=influxdb1.url, api="v1",
                                                         database=db, batch_lines=20))
    assert res.complete and (res.sent_lines, res.rejected_lines) == (50, 0)
    assert [r[1] for r in rows(influxdb1, db, 'SELECT "seq" FROM "m"')] == list(range(50))


async def test_v1_basic_auth_on_an_auth_enabled_influxdb1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrong password is a configuration error (401): logged once, the data kept and
    retried; with the right one (a restart with the variable fixed) everything arrives."""
    srv = start_influxdb1(tmp_path, admin=("admin", "adm1n-pw"))
    try:
        db = new_db(srv)
        srv.query("CREATE USER \"rackplane\" WITH PASSWORD 'right pw'", post=True, epoch=None)
        srv.query(f'GRANT WRITE ON "{db}" TO "rackplane"', post=True, epoch=None)
        monkeypatch.setenv("RACKPLANE_TEST_INFLUX_PW", "wrong pw")
        kw: dict[str, Any] = {"database": db, "username": "rackplane",
                              "password_env": "RACKPLANE_TEST_INFLUX_PW"}
        w = v1_writer(tmp_path, srv.url, **kw)
        with capture_logs() as logs:
            task = asyncio.create_task(w.run())
            for i in range(5):
                w.write("m", {}, {"seq": i}, TS + i)
            await until(lambda: w.stats.retries >= 2)
            await w.close(budget_s=1)
            await task
        assert (w.stats.sent, w.stats.rejected, w.stats.dropped) == (0, 0, 0)
        assert "401" in (w.stats.last_error or "")
        (ev,) = [e for e in logs if e["event"] == "tsdb_write_failing"]
        assert ev["kind"].startswith("configuration") and "wrong pw" not in str(ev)
        monkeypatch.setenv("RACKPLANE_TEST_INFLUX_PW", "right pw")
        w2 = v1_writer(tmp_path, srv.url, **kw)  # the same spool, after the fix
        await w2.close(budget_s=10)
        assert (w2.stats.sent, w2.stats.depth_lines) == (5, 0)
        assert [r[1] for r in rows(srv, db, 'SELECT "seq" FROM "m"')] == list(range(5))
    finally:
        srv.stop()
