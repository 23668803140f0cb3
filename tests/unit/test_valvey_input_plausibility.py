"""Implausible inputs to a safety function are not believed, and a failed poll does not end a
good value before its stale limit (issue 14, items 1 and 4), through valvey's tick (the
daemon's and the lock-step harness's input path)."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

from rackplane.core.plausibility import PlausibilityWindow, is_implausible, judge
from rackplane.core.polling import hold_good
from rackplane.core.samples import Quality, good, invalid
from rackplane.errors import ConfigError
from valvey.config import ValveyConfig, check_points_against_map
from valvey.core.output import dew_point_c
from valvey.tick import ValveyTick

WALL = 1_764_000_000_000_000_000
SIM = "rackplane/lab/rack1/sim/telemetry"
ENV, RACK = f"{SIM}/env", f"{SIM}/rack"
RACK_POWER = "rackplane/lab/rack1/racky/state/rack_power"


class Run:
    """A valvey tick fed room messages once a second, stepped at 10 Hz."""

    def __init__(self, cfg: ValveyConfig | None = None) -> None:
        self.t = ValveyTick(cfg or ValveyConfig(), -3600.0, request_prefix="t")
        self.now = 0.0
        self.raised: list[str] = []
        self.cleared: list[str] = []

    def step(self, seconds: float, topic: str | None = None,
             payload: dict[str, Any] | None = None) -> None:
        end = self.now + seconds
        while self.now < end - 1e-9:
            if topic is not None and payload is not None and abs(
                    self.now - round(self.now)) < 1e-6:
                self.t.on_sensor_message(topic, payload, retain=False, received_mono=self.now,
                                         wall_ns=WALL)
            fx = self.t.step(self.now, WALL)
            for ev in fx.out.alarm_events:
                (self.raised if ev.kind == "raised" else self.cleared).append(ev.id)
            self.now = round(self.now + 0.1, 6)

    @property
    def dew_point(self) -> float | None:
        out = self.t.core.last
        return None if out is None else out.dew_point_c

    def active(self) -> set[str]:
        return {a.id for a in self.t.core.alarms.active()}


def room(t_c: float, rh: float) -> dict[str, Any]:
    return {"room_temp_c": t_c, "relative_humidity_pct": rh}


RH_ID, T_ID = "input_implausible:room_rh_pct", "input_implausible:room_temp_c"


@pytest.mark.parametrize("rh", [0.6, 0.0, 105.0, math.nan, -5.0])
def test_dew_point_floor_holds_on_implausible_humidity(rh: float) -> None:
    """RH 0.6 (a fraction), 0 %, 105 %, NaN: the humidity is not believed; the floor takes the
    air as saturated at the room temperature (dew point = 24 °C), never −40 °C or "no floor";
    the alarm names the input, is raised once and clears when the input is valid again."""
    r = Run()
    r.step(3.0, ENV, room(24.0, 50.0))
    assert r.dew_point == pytest.approx(dew_point_c(24.0, 50.0), abs=0.01)
    r.step(5.0, ENV, room(24.0, rh))
    assert r.dew_point == pytest.approx(24.0)
    if not math.isnan(rh):  # NaN is BAD (not a number), the others out of their window
        assert is_implausible(r.t.latest["room_rh_pct"])
        assert RH_ID in r.active() and r.raised.count(RH_ID) == 1
    assert "room_sensors_stale" in r.active() or r.now < 10.0
    r.step(3.0, ENV, room(24.0, 50.0))
    assert r.dew_point == pytest.approx(dew_point_c(24.0, 50.0), abs=0.01)
    assert RH_ID not in r.active()
    if not math.isnan(rh):
        assert r.cleared.count(RH_ID) == 1


def test_dew_point_floor_holds_on_room_temperature_in_kelvin() -> None:
    """A room temperature in kelvin is not believed: the floor uses the last valid room
    temperature as the dew point (saturated air), not the last dew point forever."""
    r = Run()
    r.step(3.0, ENV, room(26.0, 40.0))
    r.step(5.0, ENV, room(299.15, 40.0))
    assert is_implausible(r.t.latest["room_temp_c"])
    assert r.dew_point == pytest.approx(26.0)
    assert T_ID in r.active() and r.raised.count(T_ID) == 1


def test_dew_point_floor_uses_configured_value_when_nothing_valid() -> None:
    cfg = ValveyConfig.model_validate({"selector": {"fallback_dew_point_c": 21.0}})
    r = Run(cfg)
    r.step(3.0, ENV, room(24.0, 0.6))
    assert r.dew_point == pytest.approx(21.0)


def test_plausibility_windows_are_configured_and_merged_over_defaults() -> None:
    cfg = ValveyConfig.model_validate(
        {"plausibility": {"room_rh_pct": {"min": 1.0, "max": 100.0}}})
    assert cfg.plausibility["room_rh_pct"].min == 1.0
    assert "room_temp_c" in cfg.plausibility  # the other defaults stay
    with pytest.raises(ValueError):
        PlausibilityWindow(min=5.0, max=5.0)


def test_every_safety_input_needs_a_window() -> None:
    """An MQTT input of a safety function without a window refuses the config."""
    from rackplane.core.registers import load_register_map

    cfg = ValveyConfig()
    regmap = load_register_map(cfg.cdu.register_map)
    check_points_against_map(cfg, regmap)  # the defaults are complete
    cfg2 = cfg.model_copy(update={"plausibility": {
        k: v for k, v in cfg.plausibility.items() if k != "rack_power_w"}})
    with pytest.raises(ConfigError, match=r"rack_power_w.*plausibility window"):
        check_points_against_map(cfg2, regmap)


@pytest.mark.parametrize("payload", [
    {"leak": {"leaking_trays": [18], "faulted_tray_sensors": [],
              "drip_pan_leak": False, "drip_pan_sensor_fault": False}},
    {"leak": {"leaking_trays": [-1], "faulted_tray_sensors": [],
              "drip_pan_leak": False, "drip_pan_sensor_fault": False}},
])
def test_leak_state_with_a_tray_the_rack_lacks_is_implausible_not_dry(
        payload: dict[str, Any]) -> None:
    """A tray index outside 0..17 (a 1-based list, a wrong count): every tray's state is
    unknown, not "dry"; the alarm names the input, and (DESIGN's safety model: a leak-sensor
    fault alarms but never isolates) no tray or rack is powered down."""
    r = Run()
    r.step(12.0, RACK, payload)
    assert all(is_implausible(r.t.latest[f"leak_tray.{i:02d}"]) for i in range(18))
    act = r.active()
    assert "input_implausible:leak_tray" in act and "leak_sensor_unavailable" in act
    assert not ({"leak_tray", "leak_rack"} & act)


def test_leak_bool_that_is_no_state_is_implausible() -> None:
    r = Run()
    r.step(3.0, RACK, {"leak": {"leaking_trays": [], "faulted_tray_sensors": [],
                                "drip_pan_leak": 2, "drip_pan_sensor_fault": False}})
    assert is_implausible(r.t.latest["leak_drip_pan"])
    assert "input_implausible:leak_drip_pan" in r.active()
    assert "leak_rack" not in r.active()


@pytest.mark.parametrize("power_w", [1e300, 132.0e6, -5e4])
def test_rack_power_outside_its_window_is_not_believed(power_w: float) -> None:
    r = Run()
    r.step(3.0, RACK_POWER, {"rack_power_w": power_w})
    s = r.t.latest["rack_power_w"]
    assert is_implausible(s) and not s.usable
    assert "input_implausible:rack_power_w" in r.active()


def test_judge_keeps_value_for_diagnostics_and_passes_others() -> None:
    w = PlausibilityWindow(min=0.0, max=100.0)
    s = judge(good("x", 120.0, "%", 1, 1.0), w)
    assert s.quality is Quality.OUT_OF_RANGE and s.value == 120.0 and s.reason == "implausible"
    inside = good("x", 50.0, "%", 1, 1.0)
    assert judge(inside, w) is inside


# --- item 4: stale_after_s is what the loop does ---------------------------------------------

CDU_POINTS = ("supply_temp_c", "supply_temp_b_c", "supply_temp_c_c", "valve_command_pct",
              "valve_position_pct")


def _poll(t: float, ok: bool) -> list[Any]:
    vals = {"supply_temp_c": 45.0, "supply_temp_b_c": 45.0, "supply_temp_c_c": 45.0,
            "valve_command_pct": 40.0, "valve_position_pct": 40.0}
    if ok:
        return [good(p, v + (0.01 * t % 0.05 if "supply" in p else 0.0), "", WALL, t)
                for p, v in vals.items()]
    return [invalid(p, "", WALL, t, Quality.STALE, "timeout") for p in vals]


def _slow_poll_cfg(**cdu: Any) -> ValveyConfig:
    return ValveyConfig.model_validate({
        "cdu": {"poll_interval_s": 10.0, "timeout_s": 5.0, **cdu},
        "supply_loop": {"stale_after_s": 30.0},
        "supply_sensors": {"stale_after_s": 30.0, "freeze_after_s": None, "redundant": []},
        "safety": {"stale_after_s": 30.0}, "valves": {"stale_after_s": 30.0},
        "pump_loop": {"stale_after_s": 30.0}, "pumps": {"stale_after_s": 30.0},
    })


def test_a_poll_slower_than_a_stale_limit_is_refused() -> None:
    """A 10 s poll with the pumps' 1 s stale limit would make the pump status stale between
    two good reads: refused at load, naming both."""
    with pytest.raises(ValueError, match=r"pumps\.stale_after_s"):
        ValveyConfig.model_validate({
            "cdu": {"poll_interval_s": 10.0, "timeout_s": 5.0},
            "supply_loop": {"stale_after_s": 30.0},
            "supply_sensors": {"stale_after_s": 30.0}, "safety": {"stale_after_s": 30.0},
            "valves": {"stale_after_s": 30.0}, "pump_loop": {"stale_after_s": 30.0}})


def _run_slow_poll(cfg: ValveyConfig) -> tuple[float | None, float | None]:
    """Good polls every 10 s until t = 10, then every poll times out (5 s after it starts).
    Returns (first tick with the PV not ok, first tick in fail-safe)."""
    t = ValveyTick(cfg, -3600.0, request_prefix="t")
    first_bad = failsafe = None
    now = 0.0
    while now < 60.0:
        if abs(now % 10.0) < 1e-6 and now <= 10.0:
            t.on_samples(_poll(now, True))
        elif abs((now - 5.0) % 10.0) < 1e-6 and now > 10.0:
            t.on_samples(_poll(now, False))
        fx = t.step(now, WALL)
        if fx.out.loop.pv_status != "ok" and first_bad is None:
            first_bad = now
        if fx.out.loop.mode == "failsafe" and failsafe is None:
            failsafe = now
        now = round(now + 0.1, 6)
    return first_bad, failsafe


def test_stale_after_s_holds_output_until_deadline() -> None:
    """10 s poll, stale_after_s = 30: the last good read at t = 10 stays good until t = 40
    (timed-out polls at 15, 25, 35 do not end it); then the PV is stale, the loop goes to its
    fail-safe within failsafe_after_periods and alarms."""
    cfg = _slow_poll_cfg()
    first_bad, failsafe = _run_slow_poll(cfg)
    assert first_bad is not None and failsafe is not None
    assert 40.0 - 1e-6 <= first_bad <= 40.0 + 0.2
    n = cfg.supply_loop.failsafe_after_periods * cfg.supply_loop.period_s
    assert first_bad < failsafe <= first_bad + n + 0.2


def test_stale_after_failed_polls_is_the_separate_faster_setting() -> None:
    """``cdu.stale_after_failed_polls = 1``: the first timed-out poll (t = 15) ends the value."""
    first_bad, _ = _run_slow_poll(_slow_poll_cfg(stale_after_failed_polls=1))
    assert first_bad is not None and 15.0 - 1e-6 <= first_bad <= 15.0 + 0.2


def test_hold_good_keeps_the_last_good_sample_with_its_own_time() -> None:
    prev = good("p", 1.0, "", 1, 10.0)
    failed = invalid("p", "", 2, 15.0, Quality.STALE, "timeout")
    assert hold_good(prev, failed, 30.0) is prev  # not re-stamped: ages from t = 10
    late = invalid("p", "", 3, 41.0, Quality.STALE, "timeout")
    assert hold_good(prev, late, 30.0) is late
    assert hold_good(None, failed, 30.0) is failed
    bad = invalid("p", "", 2, 15.0, Quality.BAD, "nan")
    assert hold_good(prev, bad, 30.0) is bad  # a reply that says "bad" is news, not a gap


def test_a_read_back_held_through_failed_polls_is_no_evidence_of_a_lost_write() -> None:
    """A last good read-back held through failed polls (older than the write) never makes a
    write count as lost; a read taken since the mismatch began does."""
    t = ValveyTick(ValveyConfig(), -3600.0, request_prefix="t")
    core = t.core
    core._last_written = 50.0
    held = good("valve_command_pct", 40.0, "%", WALL, 0.0)
    confirm = core.control.readback_confirm_s
    assert core._reconcile(0.0, held) is None  # the mismatch starts
    assert core._reconcile(confirm + 1.0, held) is None  # the same old read: no evidence
    fresh = good("valve_command_pct", 40.0, "%", WALL, confirm + 1.1)
    assert core._reconcile(confirm + 1.1, fresh) == 50.0


def test_cdu_leak_register_that_is_no_state_alarms_by_name_and_never_isolates() -> None:
    """The CDU's rope leak register reading 2 (decoder: BAD not_boolean): alarm naming it,
    no rack isolation (a leak-sensor fault alarms but never isolates)."""
    from rackplane.core.samples import make_sample

    r = Run()
    for _k in range(30):
        r.t.on_samples([make_sample("leak_rope_detected", None, "bool", WALL, r.now,
                                    Quality.BAD, "not_boolean")])
        r.step(0.1)
    act = r.active()
    assert "input_implausible:leak_rope_detected" in act
    assert "leak_rack" not in act and "rack_isolated" not in act


def test_implausible_input_alarm_is_a_valid_alarm_payload_and_can_be_acked() -> None:
    """The new ``kind:subject`` id passes the alarm contract and the ack command's schema."""
    from rackplane.core.envelope import AlarmPayload
    from valvey.commands import ALARM_ID_PATTERN

    r = Run()
    r.step(3.0, ENV, room(24.0, 0.6))
    snap = next(a for a in r.t.core.alarms.active() if a.id == RH_ID)
    AlarmPayload.model_validate({"id": snap.id, "severity": snap.severity,
                                 "message": snap.message, "state": "active", "acked": False,
                                 "shelved": False, "runbook": snap.runbook, "value": None,
                                 "ts_ns": WALL})
    assert re.match(ALARM_ID_PATTERN, RH_ID)
