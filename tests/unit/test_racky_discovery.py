"""racky.core.discovery.DiscoveryPlan: full scan at start, then one unknown address per slow
interval; dormant shelves re-probed every few minutes (Meta rackmon's practice, REF §8)."""

from __future__ import annotations

from racky.config import DiscoverySettings
from racky.core.discovery import DiscoveryPlan


def _plan() -> DiscoveryPlan:
    return DiscoveryPlan(DiscoverySettings(enabled=True, unit_id_first=1, unit_id_last=6,
                                           slow_scan_interval_s=120.0, reprobe_dormant_s=150.0),
                         exclude=[6])


def test_full_scan_at_start_then_one_address_per_slow_interval() -> None:
    p = _plan()
    first = p.due(0.0)
    assert first == [1, 2, 3, 4, 5]  # 6 is configured statically: not scanned
    assert p.due(1.0) == []  # in flight: not asked twice
    for u in first:
        assert p.probe_result(u, u in (2, 4), 1.0) == (u in (2, 4))
    assert p.found() == [2, 4]
    assert p.due(60.0) == []
    slow = [p.due(float(t)) for t in (120.0, 240.0, 360.0)]
    assert all(len(x) == 1 for x in slow)
    for x, t in zip(slow, (120.0, 240.0, 360.0), strict=True):
        p.probe_result(x[0], False, t)
    assert sorted(x[0] for x in slow) == [1, 3, 5]  # the unknown ones, in turn


def test_dormant_shelf_is_reprobed_every_few_minutes_and_found_again() -> None:
    p = _plan()
    for u in p.due(0.0):
        p.probe_result(u, u == 2, 0.0)
    p.went_dormant(2, 10.0)
    assert p.state[2] == "dormant"
    assert 2 not in p.due(100.0)
    assert 2 in p.due(160.0)
    assert not p.probe_result(2, False, 160.0)
    assert 2 not in p.due(200.0)
    assert 2 in p.due(310.0)
    assert p.probe_result(2, True, 311.0)  # found again: its owner task restarts
    assert p.found() == [2]
