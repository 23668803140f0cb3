"""The ideal beside each matrix cell (issue 21 item 5): a controller with perfect knowledge of
the plant, within its actuator's real speed, computed by the harness from the plant model."""

from __future__ import annotations

import itertools

import pytest

from harness.lockstep_valvey.ideal import _rate_limited_path, ideal_figures
from sims.scenario import load_scenario


def test_the_rate_limited_path_is_centred_on_a_known_change() -> None:
    want = [0.2] * 100 + [0.7] * 100
    path = _rate_limited_path(want, 0.2, 0.01)
    assert all(abs(b - a) <= 0.01 + 1e-9 for a, b in itertools.pairwise(path))
    worst = max(abs(p - w) for p, w in zip(path, want, strict=True))
    assert worst == pytest.approx(0.25, abs=0.01)  # half the change: centred
    start = next(i for i, p in enumerate(path) if p > 0.2 + 1e-9)
    assert 70 <= start < 100  # moves before the change, not at full speed at it


@pytest.mark.parametrize(("variant", "lo", "hi"), [
    ("nominal", 0.0, 0.05),        # a fast valve follows the heat as it arrives
    ("common_bias", 0.28, 0.32),   # the bias common to the sensors is the floor
])
def test_the_ideal_on_s1(variant: str, lo: float, hi: float) -> None:
    f = ideal_figures(load_scenario("load-step"), variant=variant)
    assert lo <= f["max_abs_error_k"] <= hi, f
    assert f["valve_strokes_per_h"] > 0.0
