"""rackplane.core.detect.counters:
deltas across wraps, resets and saturation (FIELD-CASES BR-11)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rackplane.core.detect import CounterDeltas, CounterStatus

U32 = 2**32
U64 = 2**64


def _one(bits: int, prev: int, new: int, *, up0: float | None = None, up1: float | None = None,
         dt: float = 10.0, saturating: bool = False, max_rate: float = np.inf,
         boot: tuple[int, int] | None = None) -> tuple[float, int, float, float]:
    c = CounterDeltas(1, bits=bits, saturating=saturating, max_rate_per_s=max_rate)
    c.update(np.array([prev], dtype=np.uint64), 0.0,
             uptime_s=None if up0 is None else [up0], boot_id=None if boot is None else [boot[0]])
    s = c.update(np.array([new], dtype=np.uint64), dt,
                 uptime_s=None if up1 is None else [up1],
                 boot_id=None if boot is None else [boot[1]])
    return float(s.delta[0]), int(s.status[0]), float(s.rate_per_s[0]), float(s.lower_bound[0])


def test_br11_a_counter32_wrap_with_uptime_increasing() -> None:
    """BR-11 a: Counter32 4294967290 → 5, uptime still increasing: delta 11, rate 1.1/s."""
    delta, status, rate, _ = _one(32, 4294967290, 5, up0=1000.0, up1=1010.0)
    assert status == CounterStatus.WRAP
    assert delta == 11.0
    assert rate == pytest.approx(1.1)


def test_br11_b_counter32_reset_by_reboot_not_wrap() -> None:
    """BR-11 b: 3000000000 → 120 with uptime 864000 s → 40 s: a reset. Delta unknown (the 120
    counted since the reboot is the lower bound), never 1294967416, no rate to alert on."""
    delta, status, rate, lower = _one(32, 3_000_000_000, 120, up0=864_000.0, up1=40.0)
    assert status == CounterStatus.RESET
    assert np.isnan(delta) and np.isnan(rate)
    assert lower == 120.0
    assert delta != 1294967416


def test_br11_c_counter64_reset_not_the_1_ebps_spike() -> None:
    """BR-11 c: Counter64 rx_bytes 912345678901 → 12 with the uptime reset: a reset, never
    18446743161363872727 (wrap arithmetic's ~1.8e19)."""
    delta, status, rate, lower = _one(64, 912_345_678_901, 12, up0=5000.0, up1=3.0)
    assert status == CounterStatus.RESET
    assert np.isnan(delta) and np.isnan(rate) and lower == 12.0
    # the wrong answer the case names, for the record
    assert (U64 - 912_345_678_901) + 12 == 18446743161363872727


def test_br11_d_first_sample_has_no_rate() -> None:
    """BR-11 d: the very first sample (7): no delta, no rate, nothing to alert on."""
    c = CounterDeltas(1, bits=32)
    s = c.update(np.array([7], dtype=np.uint64), 0.0)
    assert s.status[0] == CounterStatus.FIRST
    assert np.isnan(s.delta[0]) and np.isnan(s.rate_per_s[0])


def test_br11_reset_told_by_boot_id_alone() -> None:
    delta, status, _, _ = _one(32, 500, 600, boot=(11, 12))  # a rise, but a new boot id
    assert status == CounterStatus.RESET and np.isnan(delta)
    delta, status, _, _ = _one(32, 500, 600, boot=(11, 11))
    assert status == CounterStatus.OK and delta == 100.0


def test_br11_reboot_inside_the_interval_although_uptime_rose() -> None:
    """Uptime 100 s → 300 s but 1000 s elapsed: the device rebooted in between."""
    delta, status, _, _ = _one(32, 5_000, 6_000, up0=100.0, up1=300.0, dt=1000.0)
    assert status == CounterStatus.RESET and np.isnan(delta)


def test_br11_without_uptime_a_decrease_is_a_wrap_only_when_plausible() -> None:
    """No uptime / boot id: (2^bits − prev) + new must be at most the plausible delta."""
    delta, status, _, _ = _one(32, U32 - 6, 5, max_rate=10.0)  # 11 counts in 10 s: a wrap
    assert status == CounterStatus.WRAP and delta == 11.0
    delta, status, _, _ = _one(32, 3_000_000_000, 120, max_rate=10.0)  # 1.29e9 in 10 s: reset
    assert status == CounterStatus.RESET and np.isnan(delta)
    delta, status, _, _ = _one(32, 3_000_000_000, 120)  # no bound configured: a wrap
    assert status == CounterStatus.WRAP and delta == 1294967416.0


def test_cleared_counter_with_uptime_running_is_a_reset_when_implausible() -> None:
    delta, status, _, _ = _one(32, 3_000_000_000, 120, up0=1000.0, up1=1010.0, max_rate=100.0)
    assert status == CounterStatus.RESET and np.isnan(delta)


def test_saturating_counter_rate_unknown_never_zero_healthy() -> None:
    """IB PortCounters stop at 2^bits − 1: the rate is unknown, never "0, healthy"."""
    c = CounterDeltas(2, bits=16, saturating=True)
    c.update(np.array([65_000, 65_535], dtype=np.uint64), 0.0)
    s = c.update(np.array([65_535, 65_535], dtype=np.uint64), 1.0)
    assert (s.status == CounterStatus.SATURATED).all()
    assert np.isnan(s.delta).all() and np.isnan(s.rate_per_s).all()
    assert s.lower_bound.tolist() == [535.0, 0.0]
    s = c.update(np.array([3, 65_535], dtype=np.uint64), 2.0)  # cleared: cannot wrap
    assert s.status.tolist() == [CounterStatus.RESET, CounterStatus.SATURATED]


def test_implausible_rise_and_too_wide_values_are_unknown() -> None:
    c = CounterDeltas(2, bits=8, max_rate_per_s=5.0)
    c.update(np.array([1, 1], dtype=np.uint64), 0.0)
    s = c.update(np.array([200, 300], dtype=np.uint64), 1.0)  # 199 in 1 s; 300 > 8 bits
    assert (s.status == CounterStatus.IMPLAUSIBLE).all()
    assert np.isnan(s.delta).all()


def test_missing_and_repeated_reads_carry_no_information() -> None:
    c = CounterDeltas(3, bits=64)
    c.update(np.array([1, 1, 1], dtype=np.uint64), [0.0, 0.0, 0.0])
    s = c.update(np.array([5, 5, 5], dtype=np.uint64), [1.0, 0.0, 2.0], present=[True, True, False])
    assert s.status.tolist() == [CounterStatus.OK, CounterStatus.MISSING, CounterStatus.MISSING]
    s = c.update(np.array([9, 9, 9], dtype=np.uint64), 3.0)
    assert s.delta.tolist() == [4.0, 8.0, 8.0]  # the skipped reads left the previous value
    assert s.dt_s.tolist() == [2.0, 3.0, 3.0]


def test_widths_and_vector_of_mixed_counters() -> None:
    bits = [8, 16, 32, 64]
    c = CounterDeltas(4, bits=bits)
    c.update(np.array([250, 65530, U32 - 2, U64 - 3], dtype=np.uint64), 0.0)
    s = c.update(np.array([4, 2, 1, 2], dtype=np.uint64), 1.0)
    assert s.delta.tolist() == [10.0, 8.0, 3.0, 5.0]
    assert (s.status == CounterStatus.WRAP).all()


@settings(max_examples=200, deadline=None)
@given(
    bits=st.sampled_from([8, 16, 32, 64]),
    saturating=st.booleans(),
    data=st.data(),
)
def test_no_negative_delta_or_rate_ever(bits: int, saturating: bool, data: st.DataObject) -> None:
    top = 2**bits - 1
    vals = data.draw(st.lists(st.integers(0, top), min_size=2, max_size=12))
    ups = data.draw(st.lists(st.one_of(st.none(), st.floats(0, 1e7)), min_size=len(vals),
                             max_size=len(vals)))
    c = CounterDeltas(1, bits=bits, saturating=saturating,
                      max_rate_per_s=data.draw(st.sampled_from([np.inf, 1.0, 1e6])))
    for i, (v, u) in enumerate(zip(vals, ups, strict=True)):
        s = c.update(np.array([v], dtype=np.uint64), float(i),
                     uptime_s=None if u is None else [u])
        d, r = s.delta[0], s.rate_per_s[0]
        assert np.isnan(d) or d >= 0
        assert np.isnan(r) or r >= 0
        if s.status[0] in (CounterStatus.OK, CounterStatus.WRAP):
            assert not np.isnan(d)


def test_bad_input_is_refused() -> None:
    c = CounterDeltas(2, bits=32)
    with pytest.raises(ValueError):
        c.update(np.array([1.5, 2.0]), 0.0)
    with pytest.raises(ValueError):
        c.update(np.array([1, 2, 3], dtype=np.uint64), 0.0)
    with pytest.raises(ValueError):
        CounterDeltas(2, bits=12)
