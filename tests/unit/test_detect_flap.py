"""rackplane.core.detect.flap: window count (FIELD-CASES BR-13), flap score, DCGM "any rise"."""

from __future__ import annotations

import numpy as np
import pytest

from rackplane.core.detect import (
    CounterDeltas,
    CounterStatus,
    EventWindow,
    FlapScore,
    VectorThreshold,
    WindowCountRule,
)

# BR-13 (c): polls every 10 s, flap window 60 s, threshold 4 transitions, quiet 300 s to clear.
POLL_S, WINDOW_S, COUNT, QUIET_S = 10.0, 60.0, 4, 300.0


def test_br13_a_one_alert_at_the_fourth_transition_and_quiet_300s_to_clear() -> None:
    """BR-13 a: operstate up, down, up, ... (13 samples, 12 transitions over 2 minutes):
    exactly one flapping alert, raised at the 4th transition inside 60 s (t = 40 s), cleared
    only after 300 s without transitions; the "2 consecutive downs" rule fires 0 times."""
    rule = WindowCountRule(1, COUNT, WINDOW_S, QUIET_S)
    two_downs = VectorThreshold(1, 0.5, 0.0, on_delay_s=POLL_S)  # down on 2 consecutive polls
    raises, clears, consecutive_fired = [], [], 0
    prev_up: bool | None = None
    was = False
    for i in range(13 + 60):  # 13 alternating samples, then "up" for 10 more minutes
        t = i * POLL_S
        up = (i % 2 == 0) if i < 13 else True
        transitions = 0 if prev_up is None else int(up != prev_up)
        prev_up = up
        now = bool(rule.update(t, [transitions])[0])
        if now and not was:
            raises.append(t)
        if was and not now:
            clears.append(t)
        was = now
        if two_downs.update(t, [0.0 if up else 1.0])[0]:
            consecutive_fired += 1
    assert raises == [40.0]
    last_transition = 12 * POLL_S  # 120 s
    assert clears == [last_transition + QUIET_S]
    assert consecutive_fired == 0  # the rule BR-13 warns about never saw it
    assert len(raises) == 1  # not one page per transition


def test_br13_b_flap_from_carrier_change_delta_while_both_polls_read_up() -> None:
    """BR-13 b: both polls read 'up', carrier_changes 14 → 20 between them: 6 transitions
    (3 down/up cycles) are counted from the delta and the flap alert is raised. The delta uses
    BR-11's rules on the 32-bit counter (a wrap included)."""
    for before, after in ((14, 20), (2**32 - 3, 3)):
        carrier = CounterDeltas(1, bits=32, max_rate_per_s=1000.0)
        rule = WindowCountRule(1, COUNT, WINDOW_S, QUIET_S)
        carrier.update(np.array([before], dtype=np.uint64), 0.0, uptime_s=[5000.0])
        assert not rule.update(0.0, [0])[0]
        s = carrier.update(np.array([after], dtype=np.uint64), POLL_S, uptime_s=[5010.0])
        assert s.status[0] in (CounterStatus.OK, CounterStatus.WRAP)
        transitions = max(s.delta[0], 0.0)  # the polled state did not change (up, up)
        assert transitions == 6.0
        assert rule.update(POLL_S, [transitions])[0]


def test_window_rule_nvsentinel_three_downs_in_ten_minutes() -> None:
    """REFERENCE §3.1 / §5 S7: 3 link-downs in 10 min → flapping at the 3rd; one a day → not."""
    rule = WindowCountRule(2, 3, 600.0, 600.0)
    fired = {}
    for t in range(0, 1000):
        ev = [1 if t in (60, 220, 380) else 0, 1 if t == 100 else 0]
        st = rule.update(float(t), ev)
        for i in (0, 1):
            if st[i] and i not in fired:
                fired[i] = t
    assert fired == {0: 380}
    assert rule.in_window(380.0)[0] == 3
    assert rule.total_events.tolist() == [3, 1]


def test_window_rule_counts_events_older_than_the_window_out() -> None:
    rule = WindowCountRule(1, 3, 60.0, 0.0)
    for t in (0.0, 50.0, 100.0, 150.0):  # every gap 50 s: never 3 within 60 s
        assert not rule.update(t, [1])[0]
    assert rule.update(160.0, [2])[0]  # 150, 160, 160


def test_flap_score_decays_and_holds_down() -> None:
    fs = FlapScore(1, penalty=1.0, half_life_s=100.0, raise_at=3.0, clear_below=1.0,
                   hold_down_s=50.0)
    assert not fs.update(0.0, [2])[0]
    assert not fs.update(10.0, [1])[0]  # 2·2^-0.1 + 1 ≈ 2.87: decayed below 3, not raised
    assert fs.score[0] == pytest.approx(2 * 2**-0.1 + 1)
    assert fs.update(20.0, [1])[0]  # 2.87·2^-0.1 + 1 ≈ 3.68
    # decays: 3.68·2^-1.3 ≈ 1.49 at 150 s (still raised), 3.68·2^-2.3 ≈ 0.75 at 250 s, and no
    # event for 50 s: cleared
    assert fs.update(150.0, [0])[0]
    assert not fs.update(250.0, [0])[0]


def test_flap_score_hold_down_keeps_it_raised_after_the_score_fell() -> None:
    fs = FlapScore(1, penalty=4.0, half_life_s=1.0, raise_at=3.0, clear_below=1.0,
                   hold_down_s=100.0)
    assert fs.update(0.0, [1])[0]
    assert fs.update(50.0, [0])[0]  # score ≈ 0, but the last event is only 50 s old
    assert not fs.update(100.0, [0])[0]


def test_flap_score_raise_exactly() -> None:
    fs = FlapScore(1, penalty=1.0, half_life_s=1e9, raise_at=3.0, clear_below=1.0,
                   hold_down_s=0.0)
    assert not fs.update(0.0, [2])[0]
    assert fs.update(1.0, [1])[0]


def test_event_window_any_rise_within_60s() -> None:
    ew = EventWindow(2, 60.0)
    assert ew.update(0.0, [0, 1]).tolist() == [False, True]
    assert ew.update(60.0, [0, 0]).tolist() == [False, True]
    assert ew.update(61.0, [0, 0]).tolist() == [False, False]
    assert ew.update(62.0, [np.nan, 3]).tolist() == [False, True]


def test_rules_refuse_bad_input() -> None:
    rule = WindowCountRule(1, 3, 60.0, 0.0)
    rule.update(10.0, [0])
    with pytest.raises(ValueError):
        rule.update(5.0, [0])  # time backwards
    with pytest.raises(ValueError):
        rule.update(20.0, [-1])
    with pytest.raises(ValueError):
        WindowCountRule(1, 0, 60.0, 0.0)
    with pytest.raises(ValueError):
        FlapScore(1, raise_at=1.0, clear_below=2.0)
