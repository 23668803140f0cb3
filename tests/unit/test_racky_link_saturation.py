"""Issue 14.3: a saturating counter that reaches its maximum gives a lower bound on its events,
which feeds the flap, zero-rate and rate rules; its ``counter_unknown`` alarm holds until a read
below the maximum. Every width the contract allows (8, 16, 32, 64 bits)."""

from __future__ import annotations

import numpy as np
import pytest

from racky.config import RackyConfig
from tests.unit.test_racky_links import Port

WIDTHS = (8, 16, 32, 64)


def _counters(bits: int, name: str) -> dict[str, str]:
    return {**RackyConfig().links.counters, name: f"{bits}/saturate"}


@pytest.mark.parametrize("bits", WIDTHS)
def test_link_downed_stepping_to_its_maximum_and_staying_there_is_a_flap(bits: int) -> None:
    """link_downed max−5 → max (and stuck): at least 5 link-downs, enough for the default
    3-in-10-min flap rule; the reads stuck at the maximum add nothing and raise no second
    incident."""
    top = 2**bits - 1
    p = Port(counters=_counters(bits, "link_downed"))
    ld = p.frame.counter("link_downed")
    ld[0] = np.uint64(top - 5)
    raised: list[float] = []
    for i in range(120):
        if i == 10:
            ld[0] = np.uint64(top)
        if "link_flapping" in p.poll(float(i)) and not raised:
            raised.append(float(i))
    assert raised == [10.0]
    assert p.lh.events_total[0] == 5


@pytest.mark.parametrize("bits", WIDTHS)
def test_a_symbol_error_step_to_the_maximum_is_counted_as_a_lower_bound(bits: int) -> None:
    """symbol_error max−5 → max: the closed 1-minute bin holds the 5 (a lower bound: the rate
    figures and the CUSUM see them); later bins with the counter stuck are unknown (NaN), never
    0 ("healthy")."""
    top = 2**bits - 1
    p = Port(counters=_counters(bits, "symbol_error"))
    se = p.frame.counter("symbol_error")
    se[0] = np.uint64(top - 5)
    rates: list[float] = []
    for i in range(200):
        if i == 30:
            se[0] = np.uint64(top)
        p.poll(float(i))
        if i in (60, 120, 180):
            rates.append(float(p.lh.pre_fec_rate_per_min[0]))
    assert rates[0] == 5.0
    assert np.isnan(rates[1]) and np.isnan(rates[2])
    assert p.lh.pre_fec_rate_per_min[1] == 0.0  # the other port: exact, healthy


@pytest.mark.parametrize("bits", WIDTHS)
def test_counter_unknown_holds_between_messages_until_a_read_below_the_maximum(
        bits: int) -> None:
    """The alarm used to be raised only on ticks with a fresh message. It holds on ticks
    without one, on further reads at the maximum, and clears at the first read below it."""
    top = 2**bits - 1
    p = Port(counters=_counters(bits, "port_rcv_errors"))
    pr = p.frame.counter("port_rcv_errors")
    pr[0] = np.uint64(top - 1)
    f = p.frame
    seen: list[bool] = []
    for i in range(40):
        t = float(i)
        if i % 5 == 0:  # a message every 5 s, ticks every 1 s
            f.t_mono[:] = t
            f.uptime_s[:] = 1000.0 + t
            if i == 10:
                pr[0] = np.uint64(top)
            if i == 30:
                pr[0] = np.uint64(3)  # cleared (perfquery -x) and counting again
        st = p.lh.step(t, f)
        seen.append("gpu00/nic0" in st.conditions["counter_unknown"])
        if seen[-1]:
            assert "port_rcv_errors at its maximum" in st.details["counter_unknown"][
                "gpu00/nic0"]
    assert seen[:10] == [False] * 10
    assert all(seen[10:30])
    assert not any(seen[30:])
    assert "gpu00/nic1" not in st.conditions["counter_unknown"]


def test_a_counter_already_at_its_maximum_at_the_first_read_is_unknown() -> None:
    """The first read has no delta, but a saturating counter at its maximum is saturated."""
    p = Port()
    p.frame.counter("symbol_error")[0] = np.uint64(2**16 - 1)
    p.poll(0.0)
    st = p.lh.step(1.0, p.frame)
    assert "gpu00/nic0" in st.conditions["counter_unknown"]
