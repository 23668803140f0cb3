"""Alarm engine lifecycle and ThresholdDetector (rackplane/core/alarms.py)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rackplane.config import validate_data
from rackplane.core.alarms import AlarmDef, AlarmEngine, AlarmEvent
from rackplane.core.detect.threshold import ThresholdDetector
from rackplane.errors import CommandError, ConfigError

T0 = 1000.0


def kinds(events: list[AlarmEvent]) -> list[tuple[str, str]]:
    return [(e.id, e.kind) for e in events]


def engine(*defs: AlarmDef, start: float = T0) -> AlarmEngine:
    return AlarmEngine(defs, start)


def adef(aid: str = "hot", **kw: object) -> AlarmDef:
    data: dict[str, object] = {"id": aid, "severity": "major", "message": f"{aid} alarm"}
    data.update(kw)
    return AlarmDef.model_validate(data)


def test_alarm_def_validation() -> None:
    with pytest.raises(ConfigError) as err:
        validate_data(AlarmDef, {"id": "Bad/Topic", "severity": "major", "message": "x"}, "a")
    assert "id" in str(err.value)
    with pytest.raises(ConfigError):
        validate_data(AlarmDef, {"id": "x", "severity": "fatal", "message": "x"}, "a")
    with pytest.raises(ConfigError):
        validate_data(AlarmDef, {"id": "x", "severity": "minor", "message": "x",
                                 "on_delay_s": -1}, "a")
    with pytest.raises(ValueError, match="duplicate"):
        AlarmEngine([adef("x"), adef("x")], T0)


def test_on_delay_and_off_delay() -> None:
    eng = engine(adef(on_delay_s=10.0, off_delay_s=5.0))
    assert eng.update(T0, {"hot": True}, {"hot": 47.5}) == []
    assert eng.update(T0 + 9.9, {"hot": True}) == []
    ev = eng.update(T0 + 10.0, {"hot": True})
    assert kinds(ev) == [("hot", "raised")]
    assert ev[0].value == 47.5 and ev[0].t_mono == T0 + 10.0 and ev[0].severity == "major"
    assert eng.update(T0 + 11.0, {"hot": False}) == []
    assert eng.update(T0 + 12.0, {"hot": True}) == []  # blip back: off-delay restarts
    assert eng.update(T0 + 13.0, {"hot": False}) == []
    assert eng.update(T0 + 17.9, {"hot": False}) == []
    assert kinds(eng.update(T0 + 18.0, {"hot": False})) == [("hot", "cleared")]
    assert eng.active() == []


def test_condition_shorter_than_on_delay_never_raises() -> None:
    eng = engine(adef(on_delay_s=10.0))
    for k in range(100):  # 5 s on, 5 s off
        assert eng.update(T0 + k, {"hot": (k // 5) % 2 == 0}) == []


def test_missing_condition_keeps_the_last_one_and_unknown_is_an_error() -> None:
    eng = engine(adef(on_delay_s=2.0))
    eng.update(T0, {"hot": True})
    assert kinds(eng.update(T0 + 2.0, {})) == [("hot", "raised")]
    with pytest.raises(ValueError, match="unknown"):
        eng.update(T0 + 3.0, {"cold": True})
    with pytest.raises(ValueError, match="backwards"):
        eng.update(T0 + 1.0, {})
    with pytest.raises(ValueError):
        eng.update(math.nan, {})


def test_non_latched_ack_and_clear() -> None:
    eng = engine(adef())
    eng.update(T0, {"hot": True})
    ev = eng.ack("hot", "alice", T0 + 1)
    assert kinds(ev) == [("hot", "acked")] and ev[0].user == "alice"
    assert eng.ack("hot", "bob", T0 + 2) == []  # idempotent
    snap = eng.active()[0]
    assert snap.state == "active" and snap.acked and snap.acked_by == "alice"
    assert kinds(eng.update(T0 + 3, {"hot": False})) == [("hot", "cleared")]
    # Non-latched alarms clear with their condition even when never acknowledged.
    eng.update(T0 + 4, {"hot": True})
    assert kinds(eng.update(T0 + 5, {"hot": False})) == [("hot", "cleared")]


def test_latched_alarm_stays_until_acknowledged_after_the_condition_clears() -> None:
    eng = engine(adef(latch=True))
    assert kinds(eng.update(T0, {"hot": True})) == [("hot", "raised")]
    assert kinds(eng.ack("hot", "alice", T0 + 1)) == [("hot", "acked")]
    # Acked while active: still there once the condition clears (ack after return = reset).
    assert kinds(eng.update(T0 + 2, {"hot": False})) == [("hot", "returned")]
    assert eng.is_active("hot")
    assert eng.active()[0].state == "returned"
    for k in range(3, 50):
        assert eng.update(T0 + k, {"hot": False}) == []
    assert kinds(eng.ack("hot", "bob", T0 + 50)) == [("hot", "acked"), ("hot", "cleared")]
    assert not eng.is_active("hot")


def test_latched_alarm_reraises_if_the_condition_returns_before_reset() -> None:
    eng = engine(adef(latch=True, on_delay_s=1.0))
    eng.update(T0, {"hot": True})
    eng.update(T0 + 1, {"hot": True})
    eng.update(T0 + 2, {"hot": False})
    assert eng.active()[0].state == "returned"
    eng.update(T0 + 3, {"hot": True})
    ev = eng.update(T0 + 4, {"hot": True})
    assert kinds(ev) == [("hot", "raised")]
    assert eng.active()[0].state == "active" and not eng.active()[0].acked


def test_shelve_expiry_reappears_when_still_active() -> None:
    eng = engine(adef())
    eng.update(T0, {"hot": True})
    ev = eng.shelve("hot", "alice", T0 + 60, T0 + 1)
    assert kinds(ev) == [("hot", "shelved")] and ev[0].user == "alice"
    assert eng.active()[0].shelved
    assert eng.update(T0 + 30, {"hot": True}) == []
    ev = eng.update(T0 + 60, {"hot": True})
    assert kinds(ev) == [("hot", "unshelved"), ("hot", "raised")]
    assert not eng.active()[0].shelved and not eng.active()[0].acked


def test_shelved_alarm_tracks_its_condition_silently() -> None:
    eng = engine(adef(on_delay_s=5.0))
    eng.shelve("hot", "alice", T0 + 100, T0)
    eng.update(T0 + 1, {"hot": True})
    assert eng.update(T0 + 6, {"hot": True}) == []  # raised, but shelved: no annunciation
    assert eng.is_active("hot") and eng.active()[0].shelved
    assert eng.update(T0 + 10, {"hot": False}) == []  # cleared while shelved: silent too
    assert kinds(eng.update(T0 + 100, {"hot": False})) == [("hot", "unshelved")]
    assert eng.active() == []


def test_unshelve_early_and_latched_returned_reappears() -> None:
    eng = engine(adef(latch=True))
    eng.update(T0, {"hot": True})
    eng.shelve("hot", "alice", T0 + 100, T0 + 1)
    assert eng.update(T0 + 2, {"hot": False}) == []
    ev = eng.unshelve("hot", "alice", T0 + 3)
    assert kinds(ev) == [("hot", "unshelved"), ("hot", "returned")]
    assert eng.unshelve("hot", "alice", T0 + 4) == []


def test_shelve_and_ack_errors_are_typed() -> None:
    eng = engine(adef())
    with pytest.raises(CommandError) as err:
        eng.ack("nope", "alice", T0)
    assert err.value.code == "unknown_alarm"
    with pytest.raises(CommandError) as err:
        eng.shelve("nope", "alice", T0 + 10, T0)
    assert err.value.code == "unknown_alarm"
    for until in (T0, T0 - 5, T0 + 9 * 3600, math.inf, math.nan):
        with pytest.raises(CommandError) as err:
            eng.shelve("hot", "alice", until, T0)
        assert err.value.code == "invalid_shelve_time"


def test_startup_inhibit_delays_raising_only() -> None:
    eng = engine(adef(startup_inhibit_s=1200.0, on_delay_s=120.0), adef("cold"))
    assert kinds(eng.update(T0 + 1, {"hot": True, "cold": True})) == [("cold", "raised")]
    assert eng.inhibited("hot", T0 + 1)
    for t in range(2, 1200, 50):
        assert eng.update(T0 + t, {"hot": True}) == []
    # Condition held through the inhibit: raised the moment it ends.
    assert kinds(eng.update(T0 + 1200, {"hot": True})) == [("hot", "raised")]
    assert not eng.inhibited("hot", T0 + 1200)


def test_startup_inhibit_then_on_delay_counts_from_onset() -> None:
    eng = engine(adef(startup_inhibit_s=100.0, on_delay_s=30.0))
    eng.update(T0 + 90, {"hot": True})
    assert eng.update(T0 + 110, {"hot": True}) == []
    assert kinds(eng.update(T0 + 120, {"hot": True})) == [("hot", "raised")]


def test_active_snapshot_order_and_fields() -> None:
    eng = engine(adef("w", severity="warning"), adef("c", severity="critical", runbook="rb.c"),
                 adef("m"))
    eng.update(T0, {"w": True})
    eng.update(T0 + 1, {"m": True, "c": True}, {"c": 3.5, "m": math.nan})
    snaps = eng.active()
    assert [s.id for s in snaps] == ["c", "m", "w"]
    c = snaps[0]
    assert (c.severity, c.runbook, c.value, c.raised_t_mono, c.latch) == (
        "critical", "rb.c", 3.5, T0 + 1, False)
    assert snaps[1].value is None  # a non-finite value is stored as None


# --- ThresholdDetector --------------------------------------------------------------------


def test_threshold_detector_reference_deviation_alarm() -> None:
    """REFERENCE §8: supply-temperature deviation warns at ±2 °C for >= 120 s and clears with
    1 °C hysteresis (fed |supply − setpoint|)."""
    det = ThresholdDetector(high=2.0, hysteresis=1.0, on_delay_s=120.0, off_delay_s=0.0)
    t = T0
    assert det.update(t, 2.1) is False
    assert det.update(t + 119.0, 2.0) is False
    assert det.update(t + 120.0, 2.2) is True
    # Inside the hysteresis band it stays on.
    assert det.update(t + 130.0, 1.5) is True
    assert det.update(t + 140.0, 1.0) is True
    assert det.update(t + 150.0, 0.99) is False
    # Back into the band from below: stays off.
    assert det.update(t + 160.0, 1.9) is False


def test_threshold_detector_on_delay_restarts_on_a_dip() -> None:
    det = ThresholdDetector(high=2.0, hysteresis=1.0, on_delay_s=120.0)
    det.update(T0, 2.5)
    det.update(T0 + 100, 0.5)  # dips below the clear level: the pending raise restarts
    det.update(T0 + 110, 2.5)
    assert det.update(T0 + 200, 2.5) is False
    assert det.update(T0 + 230, 2.5) is True


def test_threshold_detector_hysteresis_band_does_not_reset_pending() -> None:
    det = ThresholdDetector(high=2.0, hysteresis=1.0, on_delay_s=120.0)
    det.update(T0, 2.5)
    det.update(T0 + 60, 1.5)  # inside the band: still "high" for the detector
    assert det.update(T0 + 120, 1.5) is True


def test_threshold_detector_off_delay_and_missing_values() -> None:
    det = ThresholdDetector(high=10.0, hysteresis=2.0, on_delay_s=0.0, off_delay_s=30.0)
    assert det.update(T0, 10.0) is True
    assert det.update(T0 + 1, 5.0) is True
    assert det.update(T0 + 20, None) is True  # no information: holds, pending restarts
    assert det.update(T0 + 25, 5.0) is True
    assert det.update(T0 + 54, math.nan) is True
    assert det.update(T0 + 55, 5.0) is True
    assert det.update(T0 + 85, 5.0) is False
    with pytest.raises(ValueError):
        det.update(T0, 1.0)  # time going backwards
    with pytest.raises(ValueError):
        ThresholdDetector(high=1.0, hysteresis=-1.0)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.floats(-5, 5), min_size=1, max_size=100))
def test_threshold_detector_without_delay_is_a_hysteresis_relay(values: list[float]) -> None:
    det = ThresholdDetector(high=2.0, hysteresis=1.0)
    state = False
    for k, v in enumerate(values):
        out = det.update(T0 + k, v)
        if v >= 2.0:
            state = True
        elif v < 1.0:
            state = False
        assert out is state
