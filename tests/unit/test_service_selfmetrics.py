"""Self-metrics (rackplane.io.selfmetrics): time series, status and the Prometheus endpoint."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest
from pydantic import ValidationError

from rackplane.clock import FakeClock
from rackplane.core.samples import good
from rackplane.io.selfmetrics import MEASUREMENT, SelfMetrics, pv_age_s, snapshot_fields
from rackplane.io.service import TickStats
from rackplane.io.spool import Spool
from rackplane.io.tsdb import TelemetryWriter
from rackplane.settings import MetricsSettings, SpoolSettings, TsdbSettings

IDENT = {"site": "lab", "row": "row1", "rack": "rack1"}


def _writer(tmp_path: Path, clock: FakeClock) -> TelemetryWriter:
    return TelemetryWriter(
        TsdbSettings(), SpoolSettings(directory=tmp_path / "spool"),
        identity_tags=IDENT, clock=clock,
    )


def test_metrics_settings_listen_is_checked() -> None:
    assert MetricsSettings().listen is None  # off by default
    assert MetricsSettings(listen="127.0.0.1:9108").listen == "127.0.0.1:9108"
    assert MetricsSettings(listen="[::1]:9108").listen == "[::1]:9108"
    for bad in ("9108", "127.0.0.1:", ":9108", "127.0.0.1:70000", "host:port"):
        with pytest.raises(ValidationError, match=r"host:port|must name a host"):
            MetricsSettings(listen=bad)


def test_self_metrics_go_to_the_time_series_and_status(tmp_path: Path) -> None:
    clock = FakeClock()
    w = _writer(tmp_path, clock)
    sm = SelfMetrics("valvey", MetricsSettings(interval_s=10.0), clock=clock)
    ts = TickStats()
    ts.record(0.004)
    ts.record(0.120)
    ts.overruns = 3
    ts.woken = 2
    pv = good("supply_temp_c", 45.0, "degC", clock.wall_ns(), clock.monotonic())
    for _ in range(25):  # 25 s of 1 Hz ticks: written at 0, 10 and 20 s
        now = clock.monotonic()
        sm.tick(now, tick_stats=ts, writer=w, pv_age_s=pv_age_s([pv, None], now))
        clock.advance(1.0)
    assert sm.points_written == 3
    st = sm.status()
    assert list(st) == list(snapshot_fields())
    assert st["tick_late_max_s"] == pytest.approx(0.120)
    assert st["tick_overruns"] == 3
    assert st["tick_woken"] == 2
    assert st["pv_age_s"] == pytest.approx(24.0)
    w.flush_to_spool()
    w_stats = w.stats
    assert w_stats.spooled >= 3
    with Spool(tmp_path / "spool", readonly=True) as sp:
        got, _ = sp.read(100)
    ours = [ln for ln in got if ln.startswith(f"{MEASUREMENT},")]
    assert len(ours) == 3
    assert "daemon=valvey" in ours[0] and "tick_overruns=3" in ours[0]
    assert "tick_woken=2" in ours[0]
    assert "pv_age_s=" in ours[0] and "spool_depth_lines=" in ours[0]


def test_pv_age_none_before_the_first_read() -> None:
    assert pv_age_s([None, None], 10.0) is None


def test_prometheus_endpoint_serves_the_snapshot() -> None:
    clock = FakeClock()
    sm = SelfMetrics("racky", MetricsSettings(listen="127.0.0.1:0"), clock=clock)
    sm.start()
    try:
        assert sm.listening is not None
        ts = TickStats()
        ts.overruns = 7
        sm.tick(clock.monotonic(), tick_stats=ts, pv_age_s=None)
        url = f"http://127.0.0.1:{sm.listening[1]}/metrics"
        body = urllib.request.urlopen(url, timeout=10).read().decode()
    finally:
        sm.stop()
    assert 'rackplane_tick_overruns_total{daemon="racky"} 7.0' in body
    assert "# TYPE rackplane_spool_depth_lines gauge" in body
    assert "rackplane_pv_age_s" not in body  # no value yet: absent, never a made-up 0
    assert sm.listening is None


def test_busy_port_is_logged_and_the_daemon_runs_on() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        sm = SelfMetrics("valvey", MetricsSettings(listen=f"127.0.0.1:{port}"), clock=FakeClock())
        sm.start()  # must not raise
        assert sm.listening is None
        sm.stop()


def test_endpoint_off_by_default() -> None:
    sm = SelfMetrics("valvey", MetricsSettings(), clock=FakeClock())
    sm.start()
    assert sm.listening is None


async def test_run_daemon_serves_the_daemons_metrics_while_it_runs() -> None:
    import asyncio

    from rackplane.io.service import run_daemon

    class Dummy:
        def __init__(self) -> None:
            self.selfmetrics = SelfMetrics("valvey", MetricsSettings(listen="127.0.0.1:0"),
                                           clock=FakeClock())
            self.body = ""

        async def run(self, stop: asyncio.Event) -> None:
            self.selfmetrics.tick(0.0, tick_stats=TickStats())
            assert self.selfmetrics.listening is not None
            url = f"http://127.0.0.1:{self.selfmetrics.listening[1]}/metrics"
            raw = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read())
            self.body = raw.decode()

        def reload(self) -> None:
            pass

    d = Dummy()
    assert await run_daemon(d, "valvey") == 0
    assert 'rackplane_uptime_s{daemon="valvey"}' in d.body
    assert d.selfmetrics.listening is None  # stopped with the daemon


async def test_unwritable_spool_raises_the_telemetry_alarm(tmp_path: Path) -> None:
    from rackplane.core.alarms import AlarmEngine
    from rackplane.io.selfmetrics import TELEMETRY_ALARMS, telemetry_alarm_conditions

    blocker = tmp_path / "file"
    blocker.write_text("x")
    clock = FakeClock()
    w = TelemetryWriter(TsdbSettings(), SpoolSettings(directory=blocker / "spool"),
                        identity_tags=IDENT, clock=clock)
    ok = TelemetryWriter(TsdbSettings(), SpoolSettings(directory=tmp_path / "ok"),
                         identity_tags=IDENT, clock=clock)
    engine = AlarmEngine(TELEMETRY_ALARMS, clock.monotonic())
    assert engine.update(clock.monotonic(), telemetry_alarm_conditions(ok.stats)) == []
    events = engine.update(clock.monotonic(), telemetry_alarm_conditions(w.stats))
    assert [(e.id, e.kind) for e in events] == [("telemetry_spool_failed", "raised")]
    assert "disk full" in TELEMETRY_ALARMS[0].message
    await w.close(budget_s=0)
    await ok.close(budget_s=0)


async def test_unusable_mqtt_inputs_are_counted_in_the_self_metrics(tmp_path: Path) -> None:
    """Acceptance round 2 of issue 14 (item 9's kind): invalid samples from MQTT (a NaN room
    temperature, RH as a fraction, a leak list with a tray the rack lacks; a refused tray
    message) were counted nowhere monotonic, only Modbus ones. Each is counted now."""
    import json

    from rackplane.core.registers import load_register_map
    from rackplane.io.mqtt import Message
    from racky.app import Racky
    from racky.config import RackyConfig
    from valvey.app import Valvey
    from valvey.config import ValveyConfig

    def msg(topic: str, body: object, t: float) -> Message:
        return Message(topic, json.dumps(body).encode(), qos=0, retain=False, received_mono=t)

    cfg = ValveyConfig.model_validate({"spool": {"directory": str(tmp_path / "sv")}})
    v = Valvey(cfg, load_register_map(cfg.cdu.register_map), clock=FakeClock(start_mono=0.0))
    env = "rackplane/lab/rack1/sim/telemetry/env"
    v._on_sensor_message(msg(env, {"room_temp_c": 24.0, "relative_humidity_pct": 40.0}, 1.0))
    v.run_tick(1.0)
    assert v.selfmetrics.snapshot is not None
    assert v.selfmetrics.snapshot.input_invalid_samples == 0
    v._on_sensor_message(msg(env, {"room_temp_c": "NaN", "relative_humidity_pct": 0.6}, 2.0))
    v.run_tick(3.0)
    assert v.selfmetrics.snapshot.input_invalid_samples == 2
    await v.writer.close(budget_s=0)

    rcfg = RackyConfig.model_validate({
        "lifecycle": {"state_file": str(tmp_path / "r.json")},
        "spool": {"directory": str(tmp_path / "sr")}})
    r = Racky(rcfg, clock=FakeClock(start_mono=1000.0))
    r._on_agent_telemetry(msg(f"{r.agent_base}/telemetry/tray00", {"not": "a tray"}, 1000.0))
    r._on_cooling(Message(r.cooling_topic, b"[1, 2]", qos=1, retain=False,
                          received_mono=1000.5))
    r._on_cooling(msg(r.cooling_topic, {"supply_temp_c": 318.0, "setpoint_c": 45.0}, 1000.6))
    r.run_tick(1001.0)
    assert r.selfmetrics.snapshot is not None
    assert r.racky_tick.ingest.errors == 1
    assert r.selfmetrics.snapshot.input_invalid_samples == 3  # + not an object, + kelvin
    await r.writer.close(budget_s=0)
