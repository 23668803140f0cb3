"""valvey's one tick (`valvey.tick.ValveyTick`): its inputs and effects, and proof that the
lock-step harness runs it (a fault injected into the tick shows in the lock-step figures)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from harness.lockstep_valvey import figures, run_valvey
from rackplane.core.samples import Quality, Sample, good
from rackplane.io.selfmetrics import TELEMETRY_ALARMS
from sims.scenario import load_scenario
from valvey.config import ValveyConfig
from valvey.tick import TickEffects, ValveyTick

WALL = 1_764_000_000_000_000_000
ENV = "rackplane/lab/rack1/sim/telemetry/env"
RACK_POWER = "rackplane/lab/rack1/racky/state/rack_power"


def _tick(start: float = -3600.0) -> ValveyTick:
    return ValveyTick(ValveyConfig(), start, request_prefix="t", extra_alarms=TELEMETRY_ALARMS)


def test_retained_sensor_message_is_aged_from_its_ts_ns() -> None:
    t = _tick()
    payload = json.dumps({"room_temp_c": 24.0, "relative_humidity_pct": 40.0,
                          "ts_ns": WALL - 30_000_000_000}).encode()
    assert t.on_sensor_message(ENV, payload, retain=True, received_mono=100.0, wall_ns=WALL)
    s = t.latest["room_temp_c"]
    assert s.usable and s.t_mono == pytest.approx(70.0)  # 30 s old when delivered


def test_retained_message_without_ts_ns_counts_as_stale_at_once() -> None:
    t = _tick()
    t.on_sensor_message(ENV, {"room_temp_c": 24.0, "relative_humidity_pct": 40.0},
                        retain=True, received_mono=100.0, wall_ns=WALL)
    stale_s = max(x.stale_after_s for x in ValveyConfig().sensors.topics()
                  if x.topic.endswith("/env"))
    assert 100.0 - t.latest["room_temp_c"].t_mono > stale_s


def test_live_message_is_fresh_and_unmapped_topic_is_ignored() -> None:
    t = _tick()
    assert t.on_sensor_message(RACK_POWER, b'{"rack_power_w": 90000.0, "ts_ns": 1}',
                               retain=False, received_mono=5.0, wall_ns=WALL)
    assert t.latest["rack_power_w"].value == 90000.0 and t.latest["rack_power_w"].t_mono == 5.0
    assert not t.on_sensor_message("elsewhere/x", b"{}", retain=False, received_mono=5.0,
                                   wall_ns=WALL)
    t.on_sensor_message(RACK_POWER, b"not json", retain=False, received_mono=6.0, wall_ns=WALL)
    bad = t.latest["rack_power_w"]
    assert bad.quality is Quality.BAD and bad.reason == "json"


def test_unreadable_racky_reply_is_one_warning() -> None:
    t = _tick()
    logs = t.on_racky_reply("x/result", b"[1, 2]", 1.0)
    assert [(r.level, r.event) for r in logs] == [("warning", "racky_reply_unreadable")]
    assert t.on_racky_reply("x/result", {"request_id": "nope", "ok": True}, 1.0) == []


HOSTILE = [
    b"[" * 100_000 + b"]" * 100_000,                       # past the parser's recursion
    b'{"rack_power_w": ' + b"1" * 10 + b', "pad": "' + b"x" * (1 << 20) + b'"}',  # oversize
    b'{"rack_power_w": NaN}',                                 # not JSON (strict)
    b'{"rack_power_w": 1.0, "rack_power_w": 2.0}',            # duplicate key
    b"\xff\xfe",                                             # not UTF-8
]


@pytest.mark.parametrize("payload", HOSTILE)
@pytest.mark.parametrize("retain", [False, True])
def test_every_hostile_sensor_payload_gives_bad_samples(payload: bytes, retain: bool) -> None:
    """Sensor topics get the bounds every daemon input has (`read_json`): never an exception
    out of the handler, never a silent drop: the mapped points go BAD ``json``."""
    t = _tick()
    t.on_sensor_message(RACK_POWER, b'{"rack_power_w": 90000.0}', retain=False,
                        received_mono=5.0, wall_ns=WALL)
    assert t.on_sensor_message(RACK_POWER, payload, retain=retain, received_mono=6.0,
                               wall_ns=WALL)
    bad = t.latest["rack_power_w"]
    assert bad.quality is Quality.BAD and bad.reason == "json" and bad.value is None


@pytest.mark.parametrize("payload", HOSTILE)
def test_every_hostile_racky_reply_is_one_warning(payload: bytes) -> None:
    logs = _tick().on_racky_reply("x/result", payload, 1.0)
    assert [(r.level, r.event) for r in logs] == [("warning", "racky_reply_unreadable")]


def _cdu_samples(now: float, supply_c: float = 45.0) -> list[Sample]:
    vals = {"supply_temp_c": supply_c, "supply_temp_b_c": supply_c, "supply_temp_c_c": supply_c,
            "return_temp_c": 55.0, "flow_lpm": 150.0, "diff_pressure_kpa": 120.0,
            "loop_pressure_kpa": 250.0, "heat_removed_kw": 100.0, "valve_position_pct": 40.0,
            "valve_command_pct": 40.0, "pump_a_running": 1.0, "pump_a_fault": 0.0,
            "pump_b_running": 0.0, "pump_b_fault": 0.0, "duty_pump_select": 0.0,
            "facility_supply_temp_c": 35.0, "local_control": 0.0}
    return [good(k, v, "", WALL, now) for k, v in vals.items()]


def _run_ticks(t: ValveyTick, n: int, t0: float = 0.0) -> list[TickEffects]:
    out = []
    for k in range(n):
        now = t0 + 0.1 * k
        t.on_samples(_cdu_samples(now))
        out.append(t.step(now, WALL + int(k * 1e8), {a.id: False for a in TELEMETRY_ALARMS}))
    return out


def test_telemetry_and_state_come_at_their_intervals() -> None:
    t = _tick()
    fx = _run_ticks(t, 25)
    pid_ticks = [k for k, f in enumerate(fx) if any(x.measurement == "pid" for x in f.lines)]
    cdu_ticks = [k for k, f in enumerate(fx) if any(x.measurement == "coolant_loop"
                                                    for x in f.lines)]
    state_ticks = [k for k, f in enumerate(fx) if f.state_published]
    assert pid_ticks == [0, 10, 20] and cdu_ticks == [0, 10, 20] and state_ticks == [0, 10, 20]
    states = {p.name for p in fx[0].publishes if p.kind == "state"}
    assert states == {"supply_loop", "pumps", "valves", "safety"}
    loop = next(p.payload for p in fx[0].publishes if p.name == "supply_loop")
    assert loop is not None and loop["valve_position_pct"] == 40.0 and loop["ts_ns"] == WALL
    # the pump loop's telemetry comes from the core's output, not its privates
    pump = next(x for x in fx[10].lines if x.measurement == "pid" and x.tags["loop"] !=
                "supply_temp")
    assert pump.fields["duty_pump_index"] == 0.0 and pump.fields["setpoint"] is not None


def test_requests_to_racky_carry_the_envelope_and_topic() -> None:
    t = _tick()
    t.core.requests.want("cap_rack", "cap_rack", {"power_w": 50_000.0, "reason": "x",
                                                  "ttl_s": 60.0}, 0.0)
    fx = _run_ticks(t, 1)[0]
    reqs = [p for p in fx.publishes if p.kind == "request"]
    assert len(reqs) == 1
    env: Any = reqs[0].payload
    assert reqs[0].topic == "rackplane/lab/rack1/racky/cmd/valvey/cap_rack"
    assert env["args"]["power_w"] == 50_000.0 and env["request_id"].startswith("t")
    assert env["issued_at"].endswith("Z")
    assert t.racky_reply_topic == "rackplane/lab/rack1/racky/cmd/valvey/+/result"
    assert any(r.event == "racky_request" for r in fx.logs)
    # racky's reply acknowledges it: no re-send
    t.on_racky_reply(reqs[0].topic + "/result", {"request_id": env["request_id"], "ok": True},
                     0.1)
    later = _run_ticks(t, 40, 0.1)
    assert not any(p.kind == "request" for f in later for p in f.publishes)


def test_alarm_raise_is_published_logged_and_written() -> None:
    t = _tick()
    fx = _run_ticks(t, 1)[0]
    t.on_samples([good("local_control", 1.0, "", WALL, 0.1)])
    raised: list[TickEffects] = []
    for k in range(1, 40):
        now = 0.1 * k
        t.on_samples([s for s in _cdu_samples(now) if s.point != "local_control"])
        t.on_samples([good("local_control", 1.0, "", WALL, now)])
        f = t.step(now, WALL, {a.id: False for a in TELEMETRY_ALARMS})
        if any(p.kind == "alarm" and p.name == "cdu_local_control" for p in f.publishes):
            raised.append(f)
    assert fx.out is not None and len(raised) == 1
    pub = next(p for p in raised[0].publishes if p.name == "cdu_local_control")
    assert pub.payload is not None and pub.payload["state"] == "active"
    line = next(x for x in raised[0].lines if x.measurement == "alarm")
    assert line.tags == {"alarm": "cdu_local_control", "severity": "major"}
    assert line.fields["event_code"] == 0.0 and line.fields["active"] == 1.0


# --- the harness runs the daemon's tick ---------------------------------------------------------


def _s1(**kw: Any) -> dict[str, Any]:
    return figures(run_valvey(load_scenario("load-step"), seed=1, model="cdu",
                              **kw))


def test_a_fault_in_the_tick_shows_in_the_lockstep_figures(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The harness applies what `ValveyTick.step` returns: a tick that loses every write to
    the facility valve (a fault injected into the daemon's tick) leaves the supply
    temperature uncontrolled through the load step, and the figure shows it."""
    healthy = _s1()
    real_step = ValveyTick.step

    def faulty(self: ValveyTick, *a: Any, **kw: Any) -> TickEffects:
        fx = real_step(self, *a, **kw)
        valve = self.core.valves.active_unit.command
        fx.writes = [(p, v) for p, v in fx.writes if p != valve]
        return fx

    monkeypatch.setattr(ValveyTick, "step", faulty)
    broken = _s1()
    assert healthy["max_abs_error_k"] <= 0.5
    assert broken["max_abs_error_k"] > healthy["max_abs_error_k"] + 1.0, (healthy, broken)


def test_messages_reach_the_harness_through_the_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sensor messages go through `ValveyTick.on_sensor_message`: dropping them there
    (a fault in the daemon's message handling) makes the room sensors stale in lock-step."""
    def drop(self: ValveyTick, topic: str, *a: Any, **kw: Any) -> bool:
        return False

    monkeypatch.setattr(ValveyTick, "on_sensor_message", drop)
    res = run_valvey(load_scenario("load-step"), seed=1, duration_s=40.0)
    assert "room_sensors_stale" in {a for _, a in res.alarms_raised()}


@pytest.mark.parametrize("ts_ns", [
    7_258_118_400 * 10**9,  # year 2200: a publisher's clock far off
    WALL * 1000,  # a timestamp in the wrong unit, beyond 2^63
    WALL + 3600 * 10**9,  # an hour ahead
])
def test_retained_message_stamped_in_the_future_is_stale_not_fresh(ts_ns: int) -> None:
    """Acceptance round 2 of issue 14 (item 8's kind, timestamps far off): a retained room
    reading whose ts_ns lies in the future gave age 0 and was taken as fresh (a dead
    publisher's last value believed). Its age is unknown: stale at once, as without ts_ns."""
    t = _tick()
    t.on_sensor_message(ENV, {"room_temp_c": 24.0, "relative_humidity_pct": 40.0,
                              "ts_ns": ts_ns}, retain=True, received_mono=100.0, wall_ns=WALL)
    stale_s = max(x.stale_after_s for x in ValveyConfig().sensors.topics()
                  if x.topic.endswith("/env"))
    assert 100.0 - t.latest["room_temp_c"].t_mono > stale_s


def test_retained_message_a_little_ahead_is_aged_as_new() -> None:
    """A clock skew of a few seconds is no error: the value counts as new, not stale."""
    t = _tick()
    t.on_sensor_message(ENV, {"room_temp_c": 24.0, "relative_humidity_pct": 40.0,
                              "ts_ns": WALL + 2 * 10**9}, retain=True, received_mono=100.0,
                        wall_ns=WALL)
    assert t.latest["room_temp_c"].t_mono == pytest.approx(100.0)


@pytest.mark.parametrize("topic", [ENV, RACK_POWER])
def test_an_integer_beyond_a_double_in_a_sensor_message_is_bad_not_a_crash(topic: str) -> None:
    """Acceptance round 2 of issue 14: a 400-digit integer (valid JSON) made float() raise
    OverflowError out of the sensor path: the message was lost without a BAD sample."""
    t = _tick()
    big = b"1" + b"0" * 400
    body = (b'{"room_temp_c": ' + big + b', "relative_humidity_pct": 40}' if topic == ENV
            else b'{"rack_power_w": ' + big + b"}")
    for retain in (False, True):
        assert t.on_sensor_message(topic, body, retain=retain, received_mono=5.0, wall_ns=WALL)
        name = "room_temp_c" if topic == ENV else "rack_power_w"
        s = t.latest[name]
        assert s.quality is Quality.BAD and not s.usable


def test_a_pump_trip_event_is_logged_by_the_daemons_logger_without_raising() -> None:
    """Issue 20's demo: valvey died with TypeError at its first pump trip (the event's log
    record carried a field named ``event``, structlog's own argument). The record is emitted
    as the daemon does (`rackplane.daemon.DaemonFrame.log_records`)."""
    from collections.abc import Mapping, MutableMapping

    import structlog

    from rackplane.core.effects import LogRecord

    t = _tick()
    fx = TickEffects()
    t._events([{"kind": "pump_trip", "t_mono": 5.0, "pump": "a", "reason": "vfd_fault"}],
              WALL, fx)
    (rec,) = fx.logs
    seen: list[dict[str, Any]] = []

    def keep(_lg: Any, _name: str, ev: MutableMapping[str, Any]) -> Mapping[str, Any]:
        seen.append(dict(ev))
        raise structlog.DropEvent

    log = structlog.wrap_logger(None, processors=[keep],
                                wrapper_class=structlog.make_filtering_bound_logger(0))
    getattr(log, rec.level)(rec.event, **rec.fields)
    assert seen == [{"event": "valvey_event", "kind": "pump_trip", "t_mono": 5.0,
                     "pump": "a", "reason": "vfd_fault"}]
    with pytest.raises(ValueError, match="field named 'event'"):
        LogRecord("warning", "x", {"event": "pump_trip"})
