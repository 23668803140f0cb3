"""valvey's design flow (valvey.core.design_flow): the site's figure, else learned from the
plant as the highest steady flow; the low/no-flow interlocks judge the flow against it, not
against the nominal simulated plant's 198 L/min."""

from __future__ import annotations

import random

import pytest

from valvey.core.design_flow import DesignFlow
from valvey.core.safety import Safety, SafetySettings


def _feed(d: DesignFlow, flow: float, seconds: float, t0: float = 0.0, *, noise: float = 0.0,
          healthy: bool = True, seed: int = 3) -> float:
    rng = random.Random(seed)
    t = t0
    while t < t0 + seconds:
        d.update(t, flow + rng.gauss(0.0, noise), healthy)
        t += 0.5
    return t


def test_learned_as_the_highest_steady_flow_never_followed_down() -> None:
    d = DesignFlow(None)
    assert d.value_lpm is None and not d.learned
    t = _feed(d, 310.0, 10.0, noise=1.0)
    assert not d.learned and d.value_lpm == pytest.approx(310.0, abs=5.0)  # highest seen
    t = _feed(d, 310.0, 60.0, t, noise=1.0)
    assert d.learned and d.value_lpm == pytest.approx(310.0, abs=1.0)
    # a slowly clogging loop: lower steady flows are not a new design
    t = _feed(d, 250.0, 120.0, t, noise=1.0)
    assert d.value_lpm == pytest.approx(310.0, abs=1.0)
    # a higher steady flow (the operator raised the pump setpoint) is
    _feed(d, 350.0, 70.0, t, noise=1.0)
    assert d.value_lpm == pytest.approx(350.0, abs=1.0)


def test_unsteady_unhealthy_or_implausible_flows_are_not_learned() -> None:
    d = DesignFlow(None)
    t = 0.0
    for k in range(40):  # swinging ±20 % every 2 s: never steady
        t = _feed(d, 200.0 if k % 2 else 260.0, 2.0, t)
    assert d.steady_lpm is None
    h = DesignFlow(None)
    _feed(h, 300.0, 120.0, healthy=False)  # a pump changeover throughout
    assert h.steady_lpm is None and h.value_lpm is None
    m3h = DesignFlow(None)
    _feed(m3h, 12.0, 120.0)  # m³/h written as L/min
    assert m3h.value_lpm is None
    site = DesignFlow(240.0)
    _feed(site, 300.0, 120.0)
    assert site.value_lpm == 240.0 and site.learned


@pytest.mark.parametrize(("drop_to", "low", "no_flow"), [(140.0, True, False),
                                                         (40.0, True, True),
                                                         (170.0, False, False)])
def test_interlocks_judge_against_the_learned_design_flow(drop_to: float, low: bool,
                                                          no_flow: bool) -> None:
    """A plant whose design flow is 300 L/min (not the nominal 198): a drop to 140 L/min is
    low flow (47 %), to 40 L/min no flow (13 %); against 198 neither would be."""
    s = SafetySettings()
    assert s.design_flow_lpm is None
    saf = Safety(s)
    t = 0.0
    while t < 90.0:
        saf.step(t, {}, pv_c=45.0, setpoint_c=45.0, flow_lpm=300.0, pump_handoff=False,
                 racky_power_low=False)
        t += 0.5
    assert saf.design_flow.value_lpm == pytest.approx(300.0)
    st = None
    while t < 120.0:
        st = saf.step(t, {}, pv_c=45.0, setpoint_c=45.0, flow_lpm=drop_to, pump_handoff=False,
                      racky_power_low=False)
        t += 0.5
    assert st is not None and st.low_flow is low
    assert ("power_down_rack" in st.wants) is no_flow
