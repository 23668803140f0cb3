"""valvey feedforward: the configured primary source (racky's rack power, or the CDU's heat
removed for sites without racky) decides what is used and when `feedforward_source_lost` is due."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from rackplane.core.samples import Quality, Sample
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
    ff.update(0.0, _s("rack_power_w", 100_000.0, 0.0), _s("heat_removed_kw", 85.0, 0.0), 0.8)
    assert ff.source == "heat_removed"
    assert ff.power_kw == pytest.approx(85.0 / 0.8)
    ff.update(10.0, None, _s("heat_removed_kw", 85.0, 0.0))
    assert ff.source == "none"  # its own primary stale: nothing


@pytest.mark.parametrize("learned", [0.6, 0.92, 1.0])
def test_heat_removed_uses_the_liquid_fraction_learned_from_the_plant(learned: float) -> None:
    """No liquid fraction of its own (the nominal plant's 0.85 was one): the heat removed is
    turned into rack power with the fraction the capacity guard learned; a configured value
    overrides it; a nonsensical one (0, NaN) is not used."""
    heat = _s("heat_removed_kw", 90.0, 0.0)
    ff = DynamicFeedforward(FeedforwardSettings(source="heat_removed"))
    assert FeedforwardSettings().liquid_fraction is None
    ff.update(0.0, None, heat, learned)
    assert ff.power_kw == pytest.approx(90.0 / learned)
    fixed = DynamicFeedforward(FeedforwardSettings(source="heat_removed", liquid_fraction=0.75))
    fixed.update(0.0, None, heat, learned)
    assert fixed.power_kw == pytest.approx(120.0)
    for bad in (0.0, float("nan")):
        ff.update(1.0, None, _s("heat_removed_kw", 90.0, 1.0), bad)
        assert ff.power_kw == pytest.approx(90.0)


def test_the_core_feeds_the_learned_liquid_fraction_to_the_feedforward(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from valvey.config import CduPoints, ControlSettings
    from valvey.core.controller import ValveyCore
    from valvey.core.supply_loop_settings import SupplyLoopSettings

    core = ValveyCore(SupplyLoopSettings(), CduPoints(), ControlSettings(), 0.0)
    seen: list[float] = []
    real = core.ff.update

    def spy(now: float, rack: Any, heat: Any, f_liq: float = 1.0) -> float:
        seen.append(f_liq)
        return real(now, rack, heat, f_liq)

    monkeypatch.setattr(core.ff, "update", spy)
    core.capacity.liquid._ratio.update(0.93)  # as if learned at steady state
    core.capacity.liquid._ratio.n = 10**6
    core.step(1.0, {})
    assert seen and seen[-1] == pytest.approx(0.93)


def test_unknown_source_refused() -> None:
    with pytest.raises(ValidationError):
        FeedforwardSettings(source="flow")  # type: ignore[arg-type]


# --- a row CDU: the racks of feedforward.racks summed (issue 21 item 1) ----------------------

ROW = ["r1", "r2", "r3"]


def _row(*watts: float | None, t: float = 0.0) -> list[Sample | None]:
    return [None if w is None else _s(f"rack_power_w.{r}", w, t)
            for r, w in zip(ROW, watts, strict=True)]


def test_row_cdu_sums_every_rack_and_reads_the_map_per_rack() -> None:
    ff = DynamicFeedforward(FeedforwardSettings(racks=ROW))
    pct = ff.update(0.0, _row(40_000.0, 100_000.0, 130_000.0), None)
    assert ff.source == "rack_power" and ff.missing_racks == []
    assert ff.power_kw == pytest.approx(90.0)  # 270 kW over three racks
    assert pct == pytest.approx(ff.map_pct(90.0))
    whole = DynamicFeedforward(FeedforwardSettings(racks=ROW, map_per_rack=False))
    whole.update(0.0, _row(40_000.0, 100_000.0, 130_000.0), None)
    assert whole.power_kw == pytest.approx(270.0)
    # one rack stepping moves the sum by that rack's step alone
    ff.update(1.0, _row(40_000.0, 100_000.0, 40_000.0, t=1.0), None)
    assert ff.power_kw == pytest.approx(60.0)


@pytest.mark.parametrize("bad", ["stale", "missing", "implausible"])
def test_row_cdu_rack_without_a_fresh_power_falls_back_never_0_w(bad: str) -> None:
    ff = DynamicFeedforward(FeedforwardSettings(racks=ROW))
    heat = _s("heat_removed_kw", 229.5, 10.0)  # 270 kW at 85 % to liquid
    ff.update(0.0, _row(40_000.0, 100_000.0, 130_000.0), heat, 0.85)
    row = _row(40_000.0, 100_000.0, 130_000.0, t=10.0)
    if bad == "stale":
        row[1] = _s("rack_power_w.r2", 100_000.0, 0.0)  # 10 s old
    elif bad == "missing":
        row[1] = None
    else:
        row[1] = Sample("rack_power_w.r2", 1e9, "W", 0, 10.0, Quality.OUT_OF_RANGE)
    ff.update(10.0, row, heat, 0.85)
    assert ff.source == "heat_removed" and ff.missing_racks == ["r2"]
    assert ff.power_kw == pytest.approx(270.0 / 3)  # the whole row's heat, per rack
    # without the CDU's heat figure: nothing fresh, the filter holds (no fall to 170 kW)
    held = ff.filtered_kw
    ff.update(11.0, row, None)
    assert ff.source == "none" and ff.filtered_kw == held
    ff.update(12.0, _row(40_000.0, 100_000.0, 130_000.0, t=12.0), None)
    assert ff.source == "rack_power" and ff.missing_racks == []


def test_row_cdu_needs_one_sample_per_listed_rack_and_valid_names() -> None:
    ff = DynamicFeedforward(FeedforwardSettings(racks=ROW))
    with pytest.raises(ValueError, match="3 racks"):
        ff.update(0.0, _row(1.0, 2.0, 3.0)[:2], None)
    with pytest.raises(ValidationError, match="distinct"):
        FeedforwardSettings(racks=["r1", "r1"])
    with pytest.raises(ValidationError):
        FeedforwardSettings(racks=["r1/x"])


def test_row_cdu_config_maps_each_racks_topic_and_judges_it_by_the_rack_power_window() -> None:
    from valvey.config import ValveyConfig
    from valvey.core.inputs import input_gate

    cfg = ValveyConfig.model_validate({"feedforward": {"racks": ["rack1", "r7"]}})
    by_name = {t.name: t for t in cfg.sensor_topics()}
    assert by_name["rack_power_w.r7"].topic == "{root}/{site}/r7/racky/state/rack_power"
    assert by_name["rack_power_w.rack1"].topic == "{root}/{site}/rack1/racky/state/rack_power"
    assert by_name["rack_power_w"].topic == "{root}/{site}/{rack}/racky/state/rack_power"
    latest: dict[str, Sample] = {}
    input_gate(cfg).enter(latest, [_s("rack_power_w.r7", 1e9, 0.0)], polled=False)
    assert latest["rack_power_w.r7"].quality is Quality.OUT_OF_RANGE
    with pytest.raises(ValidationError, match=r"sensors\.rack_power"):
        ValveyConfig.model_validate({"feedforward": {"racks": ["a"]},
                                     "sensors": {"rack_power": None}})
