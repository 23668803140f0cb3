"""The one threshold rule in its two forms: `ThresholdDetector` (scalar, per-tick callers) and
`VectorThreshold` (arrays) give the same outputs on any stream of values and times."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rackplane.core.detect.threshold import ThresholdDetector, VectorThreshold

values = st.one_of(st.none(), st.just(math.nan),
                   st.floats(min_value=-10.0, max_value=10.0, allow_nan=False))
streams = st.lists(st.tuples(st.floats(min_value=0.0, max_value=30.0, allow_nan=False),
                             values), min_size=1, max_size=60)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(level=st.floats(min_value=-5.0, max_value=5.0, allow_nan=False),
       hysteresis=st.floats(min_value=0.0, max_value=3.0, allow_nan=False),
       on_delay_s=st.sampled_from([0.0, 0.5, 2.0, 10.0]),
       off_delay_s=st.sampled_from([0.0, 1.0, 5.0]),
       stream=streams)
def test_scalar_and_vector_forms_agree(level: float, hysteresis: float, on_delay_s: float,
                                       off_delay_s: float,
                                       stream: list[tuple[float, float | None]]) -> None:
    scalar = ThresholdDetector(level, hysteresis, on_delay_s, off_delay_s)
    vector = VectorThreshold(1, level, hysteresis, on_delay_s, off_delay_s)
    t = 0.0
    for dt, v in stream:
        t += dt
        a = scalar.update(t, v)
        b = vector.update(t, np.array([math.nan if v is None else v]))
        assert a == bool(b[0]), (t, v)


def test_the_forms_differ_when_one_is_broken() -> None:
    """The comparison above can fail: a detector without the on-delay disagrees at once."""
    scalar = ThresholdDetector(2.0, 1.0, on_delay_s=0.0)
    vector = VectorThreshold(1, 2.0, 1.0, on_delay_s=120.0)
    assert scalar.update(0.0, 3.0) is True
    assert bool(vector.update(0.0, np.array([3.0]))[0]) is False
