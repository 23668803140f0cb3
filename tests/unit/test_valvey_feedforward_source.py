"""valvey feedforward: the configured primary source (racky's rack power, or the CDU's heat
removed for sites without racky) decides what is used and when `feedforward_source_lost` is due."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rackplane.core.samples import Sample
from valvey.core.feedforward import DynamicFeedforward, FeedforwardSettings


def _s(point: str, value: float, t: float) -> Sample:
    return Sample(point, value, "kW" if point == "heat_removed_kw" else "W", 0, t)


def test_rack_power_primary_falls_back_to_heat_removed() -> None:
    ff = DynamicFeedforward(FeedforwardSettings())
    ff.update(0.0, _s("rack_power_w", 100_000.0, 0.0), _s("heat_removed_kw", 85.0, 0.0))
    assert ff.source == "rack_power"
    ff.update(10.0, _s("rack_power_w", 100_000.0, 0.0), _s("heat_removed_kw", 85.0, 10.0))
    assert ff.source == "heat_removed"  # rack power 10 s old: stale, the fallback


def test_heat_removed_primary_ignores_rack_power_and_needs_no_fallback_flag() -> None:
    ff = DynamicFeedforward(FeedforwardSettings(source="heat_removed", fallback_heat_removed=False))
    ff.update(0.0, _s("rack_power_w", 100_000.0, 0.0), _s("heat_removed_kw", 85.0, 0.0))
    assert ff.source == "heat_removed"
    assert ff.power_kw == pytest.approx(85.0 / 0.85)
    ff.update(10.0, None, _s("heat_removed_kw", 85.0, 0.0))
    assert ff.source == "none"  # its own primary stale: nothing


def test_unknown_source_refused() -> None:
    with pytest.raises(ValidationError):
        FeedforwardSettings(source="flow")  # type: ignore[arg-type]
