"""valvey's capacity guard against the causes of over-capping found in S9 (issue 21): the cap
followed a noisy estimate down at once (the running minimum of its noise), the liquid fraction
was a constant of the nominal plant, and the estimate's correction (and the trim) ratcheted
down while the cap's own transient was settling."""

from __future__ import annotations

import random
from typing import Any

import pytest

from valvey.core.capacity import CapacityGuard, CapacitySettings, capacity_w, open_capacity_w_per_k

S = CapacitySettings()
RHO_C = S.coolant_rho_c_kj_per_l_k
FLOW = 198.0


def _args(**kw: Any) -> dict[str, Any]:
    """A saturated valve on the nominal-like exchanger (k ≈ 10.2 kW/K, approach 1.85 K), the
    supply at the hold (the estimate's correction has nothing to do)."""
    a: dict[str, Any] = dict(
        pv_c=45.0 + S.hold_above_setpoint_k, setpoint_c=45.0, valve_demand_pct=100.0,
        valve_position_pct=100.0, valve_stuck=False, heat_removed_kw=80.0,
        return_c=44.0 + 80.0 / 10.2, facility_c=44.0, flow_lpm=FLOW,
        rack_power_w=80_000.0 / S.liquid_fraction, no_standby=False, low_flow=False,
        over_temperature=False)
    a.update(kw)
    return a


def _true_cap(k: float, facility_c: float, liquid_fraction: float = S.liquid_fraction,
              s: CapacitySettings = S) -> float:
    est = capacity_w(k, 45.0 + s.hold_above_setpoint_k, facility_c, FLOW, RHO_C,
                     liquid_fraction)
    assert est is not None
    return est * (1.0 - s.margin_fraction)


def test_sensor_noise_does_not_ratchet_the_cap_down() -> None:
    # the CDU's sensors' noise (facility water 0.03 K, flow 1 L/min, heat meter 0.5 kW):
    # near saturation the estimate amplifies it ≈ 4×; a cap lowered at once on every dip of
    # the raw estimate sat 8 % under its mean in S9. Smoothed, it stays within 3 % both ways
    rng = random.Random(7)
    s = S
    g = CapacityGuard(s)
    k = 10.2
    caps = []
    for t in range(1800):
        q = 80.0 + rng.gauss(0.0, 0.5)
        fws = 44.0 + rng.gauss(0.0, 0.03)
        st = g.step(float(t), **_args(heat_removed_kw=q, return_c=44.0 + q / k
                                      + rng.gauss(0.0, 0.03) * 1.4, facility_c=fws,
                                      flow_lpm=FLOW + rng.gauss(0.0, 1.0)))
        if t >= 300 and st.cap_w is not None:
            caps.append(st.cap_w)
    want = _true_cap(k, 44.0, s=s)
    assert len(caps) == 1500
    assert min(caps) > 0.97 * want  # the old guard: ≈ 0.90
    assert max(caps) < 1.03 * want


def test_the_estimate_follows_a_facility_water_ramp_without_lag() -> None:
    # S9's ramp, 0.4 K/min: the smoothing must not leave the estimate (and the cap) behind a
    # rising facility water (too high a cap) nor ahead of it once it stops (too low)
    s = S
    g = CapacityGuard(s)
    k = 10.2
    worst_ramp = worst_after = 0.0
    for t in range(0, 1200):
        fws = 43.0 + min(1.0, max(0.0, (t - 300) / 150.0))
        st = g.step(float(t), **_args(facility_c=fws, return_c=fws + 80.0 / k))
        assert st.capacity_w is not None
        err = st.capacity_w / _true_cap(k, fws, s=s) - 1.0
        if 330 <= t <= 450:
            worst_ramp = max(worst_ramp, abs(err))
        elif t > 450:
            worst_after = max(worst_after, abs(err))
    assert worst_ramp < 0.01
    assert worst_after < 0.03  # the double exponential's overshoot when the ramp stops


def _steady_run(g: CapacityGuard, ratio: float, seconds: int, t0: float = 0.0,
                power_w: float = 94_000.0) -> Any:
    st = None
    k = 10.2
    for i in range(seconds):
        q = ratio * power_w / 1000.0
        st = g.step(t0 + i, **_args(heat_removed_kw=q, return_c=44.0 + q / k,
                                    rack_power_w=power_w))
    return st


def test_the_liquid_fraction_is_learned_at_steady_state() -> None:
    # a rack that sends all its heat to the liquid (REFERENCE §4.3: Vera Rubin f_liq = 1.0):
    # the configured 0.85 would ask for a cap 18 % too high for the exchanger it measures
    g = CapacityGuard(S)
    st = _steady_run(g, 1.0, 60)
    assert not g.liquid.learned and st.liquid_fraction == S.liquid_fraction  # the fallback
    st = _steady_run(g, 1.0, 2000, t0=60.0)
    assert g.liquid.learned and st.liquid_fraction == pytest.approx(1.0, abs=0.005)
    assert st.cap_w == pytest.approx(round(_true_cap(10.2, 44.0, 1.0), -2), abs=150.0)
    # the published capacity per K uses it too
    assert st.open_w_per_k == pytest.approx(open_capacity_w_per_k(10.2, FLOW, RHO_C, 1.0))


def test_the_liquid_fraction_is_learned_soon_after_one_steady_window() -> None:
    # learned once a steady window (liquid_steady_s) has passed and its ratio has been
    # averaged a quarter of that again: not before the window, not three windows later (a
    # stuck valve 60 s into a run finds the prior in use either way: the learned value is
    # the plant's own only after this)
    w = S.liquid_steady_s
    g = CapacityGuard(S)
    _steady_run(g, 0.8, int(w * 1.2))
    assert not g.liquid.learned
    st = _steady_run(g, 0.8, int(w * 0.1), t0=w * 1.2)
    assert g.liquid.learned and st.liquid_fraction == pytest.approx(0.8, abs=0.005)


def test_an_implausible_ratio_is_not_learned_and_the_fallback_stays() -> None:
    # a heat meter reading 30 % of the rack power: outside [min, max], never learned
    g = CapacityGuard(S)
    st = _steady_run(g, 0.3, 2000)
    assert not g.liquid.learned and g.liquid.implausible > 0
    assert st.liquid_fraction == S.liquid_fraction
    # learning off: the configured value, whatever the plant says
    off = CapacityGuard(CapacitySettings(learn_liquid_fraction=False))
    assert _steady_run(off, 1.0, 2000).liquid_fraction == S.liquid_fraction


def test_the_liquid_fraction_is_not_learned_off_steady_state() -> None:
    # rack power stepping every 30 s (the heat meter lags it through the rack and the pipes):
    # the ratio then is no liquid fraction
    g = CapacityGuard(S)
    t = 0.0
    for n in range(60):
        p = 60_000.0 if n % 2 else 120_000.0
        _steady_run(g, 0.85, 30, t0=t, power_w=p)
        t += 30.0
    assert not g.liquid.learned and g.liquid.value == S.liquid_fraction


def _engaged(g: CapacityGuard, stuck: bool = False, pv_c: float = 45.6) -> float:
    t = 0.0
    for _ in range(12):
        g.step(t, **_args(pv_c=pv_c, valve_stuck=stuck))
        t += 1.0
    assert g.cap_w is not None
    return t


def test_the_correction_does_not_ratchet_while_the_supply_settles_toward_the_hold() -> None:
    # S4: the cap engages after the supply overshot; the overshoot decays toward the hold
    # over minutes. That is the cap working, not the estimate's error: no correction
    g = CapacityGuard(S)
    t = _engaged(g, stuck=True)
    hold = 45.0 + S.hold_above_setpoint_k
    for i in range(240):  # 0.6 K above the hold, decaying toward it (τ 50 s)
        g.step(t, **_args(pv_c=hold + 0.6 * 0.98 ** i, valve_stuck=True))
        t += 1.0
    # the old guard: ÷1.01 every 20 s above hold + 0.1 → 0.96; now at most once, on the tail
    # where the decay is as slow as the averaged supply's noise
    assert g.correction >= 1.0 / 1.01
    # above the hold and not settling: the estimate's error, corrected
    for _ in range(100):
        g.step(t, **_args(pv_c=hold + 0.3, valve_stuck=True))
        t += 1.0
    assert g.correction == pytest.approx(1.01 ** -5, rel=0.011)


def test_the_trim_does_not_ratchet_while_the_supply_settles() -> None:
    g = CapacityGuard(S)
    hold = 45.0 + S.hold_above_setpoint_k
    t = _engaged(g, pv_c=hold + 1.5)
    cap0 = g.cap_w
    assert cap0 is not None
    for i in range(90):  # 1.5 K above the hold, coming down 0.01 K/s
        g.step(t, **_args(pv_c=hold + 1.5 - 0.01 * i))
        t += 1.0
    assert g.cap_w == pytest.approx(cap0, rel=0.005)  # the old guard: 2 trims of 5 %
    for _ in range(65):  # back up to 1 K above the hold and staying: trimmed every trim_s
        g.step(t, **_args(pv_c=hold + 1.0))  # (and the estimate corrected once, ÷1.01)
        t += 1.0
    assert g.cap_w == pytest.approx(cap0 * 0.95 ** 2 / 1.01, rel=0.003)


def test_every_poll_is_used_not_one_in_ten() -> None:
    # valvey polls the CDU at 10 Hz and decides once a second: the step uses the mean of the
    # polls since the last one (the transmitters' white noise averages down), not the last
    s = S
    g = CapacityGuard(s)
    k = 10.2
    st = None
    for t in range(30):
        for i in range(10):  # ±0.05 K around 44.0 °C, alternating
            g.observe(44.0 + (0.05 if i % 2 else -0.05), FLOW, 80.0, 44.0 + 80.0 / k)
        st = g.step(float(t), **_args(facility_c=44.05))  # the last poll read 44.05
    assert st is not None and st.capacity_w is not None
    assert st.capacity_w == pytest.approx(_true_cap(k, 44.0, s=s), rel=1e-6)
    # a reading missing now (stale) is missing, whatever was polled before
    g.observe(44.0, FLOW, 80.0, 44.0 + 80.0 / k)
    assert g.step(30.0, **_args(facility_c=None)).capacity_w is None


def test_the_supply_is_brought_to_the_hold_not_left_a_band_under_it() -> None:
    # the steady supply 0.05 K under the hold: the estimate was low by ≈ 3 % of the cap at a
    # 2 K approach; the old 0.1 K dead band left it there
    g = CapacityGuard(S)
    t = _engaged(g)
    hold = 45.0 + S.hold_above_setpoint_k
    for _ in range(200):
        g.step(t, **_args(pv_c=hold - 0.05))
        t += 1.0
    assert g.correction == pytest.approx(1.01 ** 10, rel=0.011)
    for _ in range(200):  # within the band: left alone
        g.step(t, **_args(pv_c=hold - 0.01))
        t += 1.0
    assert g.correction == pytest.approx(1.01 ** 10, rel=0.011)


def test_the_cap_does_not_follow_estimate_noise_down_while_the_supply_settles() -> None:
    hold = 45.0 + S.hold_above_setpoint_k
    g = CapacityGuard(S)
    t = _engaged(g, pv_c=hold + 0.3)
    cap0 = g.cap_w
    assert cap0 is not None
    pv = hold + 0.3
    for i in range(30):  # the supply falling toward the hold, then the estimate dipping 2 %
        pv -= 0.005
        fws = 44.0 + 0.04 * min(1.0, max(0.0, i - 15) / 5.0)
        g.step(t, **_args(pv_c=pv, facility_c=fws, return_c=fws + 80.0 / 10.2))
        t += 1.0
    assert g.cap_w == pytest.approx(cap0)  # the old guard: lowered at once, ≈ 2 %
    # a real drop (facility water 0.3 K up: −16 %) applies at once, settling or not
    for _ in range(10):
        pv -= 0.005
        g.step(t, **_args(pv_c=pv, facility_c=44.3, return_c=44.3 + 80.0 / 10.2))
        t += 1.0
    assert g.cap_w is not None and g.cap_w < 0.9 * cap0
    # and the supply rising: every dip of the estimate applies at once
    g2 = CapacityGuard(S)
    t = _engaged(g2, pv_c=hold + 0.1)
    c2 = g2.cap_w
    assert c2 is not None
    for i in range(10):
        g2.step(t, **_args(pv_c=hold + 0.1 + 0.005 * i, facility_c=44.04,
                           return_c=44.04 + 80.0 / 10.2))
        t += 1.0
    assert g2.cap_w is not None and g2.cap_w < 0.99 * c2
