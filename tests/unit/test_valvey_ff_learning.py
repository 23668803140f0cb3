"""The feedforward's valve map learned online from steady states (valvey/core/feedforward.py,
issue 21): bounded, monotone, bumpless, resettable; nothing learned outside a steady state."""

from __future__ import annotations

import itertools

import pytest

from rackplane.core.samples import good
from valvey.core.feedforward import DynamicFeedforward, FeedforwardSettings


def feed(ff: DynamicFeedforward, t0: float, seconds: float, power_w: float, valve: float,
         error_k: float = 0.0, steady_ok: bool = True) -> tuple[float, int]:
    """One update + observe per second; returns (time, number of steady states learned).
    Learning never moves the FF term at the moment it happens (bumpless)."""
    learned = 0
    t = t0
    for _ in range(round(seconds)):
        ff.update(t, good("rack_power_w", power_w, "W", 0, t), None)
        before = ff.ff_pct
        if ff.observe(t, valve, error_k, steady_ok):
            learned += 1
            assert ff.ff_pct == pytest.approx(before, abs=1e-9)
        t += 1.0
    return t, learned


def test_map_moves_towards_the_valve_seen_at_a_steady_state_bumplessly() -> None:
    ff = DynamicFeedforward(FeedforwardSettings(adapt_blend_s=0.0))  # (fading: below)
    assert ff.map_pct(40.0) == 63.0
    t, n = feed(ff, 0.0, 100.0, 40_000.0, 53.0)  # shorter than adapt_steady_s (120 s)
    assert n == 0 and not ff.map_learned
    t, n = feed(ff, t, 30.0, 40_000.0, 53.0)  # (feed checks the FF does not step)
    assert n == 1 and ff.map_learned
    assert ff.map_pct(40.0) == pytest.approx(58.0)  # half the 10 % error (adapt_rate 0.5)
    for _ in range(6):
        t, n = feed(ff, t, 121.0, 40_000.0, 53.0)
    assert ff.map_pct(40.0) == pytest.approx(53.0, abs=0.2)
    # the FF change for a power step follows the learned map
    f0 = ff.ff_pct
    feed(ff, t, 400.0, 80_000.0, 53.0, steady_ok=False)
    assert ff.ff_pct - f0 == pytest.approx(ff.map_pct(80.0) - ff.map_pct(40.0), abs=0.01)


@pytest.mark.parametrize(("error_k", "steady_ok", "valve_wander"), [
    (0.5, True, 0.0), (0.0, False, 0.0), (0.0, True, 5.0)])
def test_nothing_is_learned_outside_a_steady_state(error_k: float, steady_ok: bool,
                                                   valve_wander: float) -> None:
    ff = DynamicFeedforward(FeedforwardSettings())
    t = 0.0
    for k in range(600):
        ff.update(t, good("rack_power_w", 40_000.0, "W", 0, t), None)
        assert not ff.observe(t, 53.0 + valve_wander * (k % 2), error_k, steady_ok)
        t += 1.0
    assert not ff.map_learned


def test_learning_is_bounded_monotone_and_resettable() -> None:
    s = FeedforwardSettings(adapt_max_correction_pct=10.0, adapt_rate=1.0)
    ff = DynamicFeedforward(s)
    t = 0.0
    for _ in range(5):  # a valve far below the prior at 80 kW
        t, _n = feed(ff, t, 121.0, 80_000.0, 30.0)
    ys = [y for _, y in ff.valve_map]
    assert ff.map_pct(80.0) == pytest.approx(77.0 - 10.0)  # bounded by the correction
    assert all(b >= a for a, b in itertools.pairwise(ys))  # never falling
    before = ff.ff_pct
    ff.reset_map()
    assert not ff.map_learned and ff.adaptations == 0
    assert ff.ff_pct == pytest.approx(before)
    assert not ff.restore_map([0.0, 47.0, 63.0, 50.0, 87.0, 91.0, 100.0])  # 27 % off the prior
    assert not ff.restore_map([0.0, 47.0])
    assert not ff.map_learned


def test_learning_off_keeps_the_configured_map() -> None:
    ff = DynamicFeedforward(FeedforwardSettings(adapt_map=False))
    feed(ff, 0.0, 600.0, 40_000.0, 53.0)
    assert not ff.map_learned


def test_a_learned_change_fades_into_the_feedforward_without_a_step() -> None:
    ff = DynamicFeedforward(FeedforwardSettings(adapt_blend_s=100.0))
    t, n = feed(ff, 0.0, 121.0, 40_000.0, 53.0)
    assert n == 1
    assert ff.ff_pct == pytest.approx(63.0)  # no step at the moment of learning
    prev = ff.ff_pct
    for _ in range(600):  # steps of at most 5 % × 1 s / 100 s per second: a slow ramp
        t, _n = feed(ff, t, 1.0, 40_000.0, 53.0, steady_ok=False)
        assert abs(ff.ff_pct - prev) <= 0.06
        prev = ff.ff_pct
    assert ff.ff_pct == pytest.approx(ff.map_pct(40.0), abs=0.05)  # the map's own value
