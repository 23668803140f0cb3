"""rlc's time series (rlc/telemetry.py): per rack its lease, committed power, report and
cooling; per row the limit and the sums, a sum left out rather than partial."""

from __future__ import annotations

import json

from rackplane.core.budget_leases import RackReport
from rlc.core.allocation import AllocationSettings
from rlc.core.cycle import FleetState
from rlc.core.leases import LeaseTiming
from rlc.core.topology import TopologySettings, compile_topology
from rlc.telemetry import fleet_lines

WALL = 1.8e9
TIMING = LeaseTiming(ttl_s=9.0, clock_margin_s=1.0, agent_cap_ttl_s=5.0)


def _state() -> FleetState:
    rack = {"floor_w": 20_000.0, "max_w": 80_000.0}
    topo = compile_topology(TopologySettings.model_validate({"site": "s", "halls": {"h": {
        "feed_limit_w": 1e6, "rows": {"r1": {"limit_w": 100_000.0, "racks": {
            "ra": {**rack, "cooling_capacity_w": 60_000.0}, "rb": dict(rack)}},
            "r2": {"limit_w": 50_000.0, "racks": {"rc": dict(rack)}}}}}}))
    return FleetState(topo, TIMING, AllocationSettings(spread_spare=False), 2.0, 4.0, 100.0)


def _report(st: FleetState, rack: str, rev: int, mono: float, power_w: float | None,
            cooling_w: float | None = None) -> None:
    rec = RackReport(rack, 30_000.0, 0.0, 20_000.0, None, None, True, WALL + mono,
                     cooling_w=cooling_w, power_w=power_w).as_record()
    st.on_report(rack, (rev, json.dumps(rec).encode()), mono)


def _by(lines: list, meas: str, tag: str) -> dict[str, dict]:  # type: ignore[type-arg]
    return {ln.tags[tag]: dict(ln.fields) for ln in lines if ln.measurement == meas}


def test_rack_and_row_lines_carry_the_lease_the_report_and_the_sums() -> None:
    st = _state()
    st.restore(1, {"ra": None, "rb": None, "rc": None}, 0.0)
    _report(st, "ra", 1, 0.0, 25_000.0, cooling_w=45_000.0)
    _report(st, "rb", 2, 0.0, 28_000.0)
    _report(st, "rc", 3, 0.0, 21_000.0)
    for i, w in enumerate(st.cycle(1, WALL, 0.0)):
        st.write_done(w.rack, 10 + i)
    lines = fleet_lines(st, 1.0, int((WALL + 1.0) * 1e9))
    racks = _by(lines, "fleet_rack", "fleet_rack")
    assert racks["ra"] == {"grant_w": 30_000.0, "committed_w": 30_000.0, "demand_w": 30_000.0,
                           "power_w": 25_000.0, "cooling_w": 45_000.0, "floor_w": 20_000.0,
                           "lease_expires_in_s": 8.0, "reachable": 1.0}
    assert racks["rb"]["cooling_w"] is None                      # none configured or reported
    rows = _by(lines, "fleet_row", "fleet_row")
    assert rows["h/r1"] == {"limit_w": 100_000.0, "grants_w": 60_000.0,
                            "committed_w": 60_000.0, "power_w": 53_000.0,
                            "racks_unreachable": 0.0}
    assert rows["h/r2"]["power_w"] == 21_000.0
    tags = {ln.tags["fleet_rack"]: ln.tags for ln in lines if ln.measurement == "fleet_rack"}
    assert tags["rc"] == {"hall": "h", "fleet_row": "h/r2", "fleet_rack": "rc"}
    # rb goes silent: unreachable after 2 s, its stale power is left out and so is row 1's sum
    _report(st, "ra", 4, 3.0, 26_000.0)
    _report(st, "rc", 5, 3.0, 21_000.0)
    lines = fleet_lines(st, 3.0, int((WALL + 3.0) * 1e9))
    racks, rows = _by(lines, "fleet_rack", "fleet_rack"), _by(lines, "fleet_row", "fleet_row")
    assert racks["rb"]["reachable"] == 0.0 and racks["rb"]["power_w"] is None
    assert rows["h/r1"]["power_w"] is None and rows["h/r1"]["racks_unreachable"] == 1.0
    assert racks["ra"]["lease_expires_in_s"] == 6.0


def test_before_any_lease_the_grant_and_expiry_are_left_out() -> None:
    st = _state()
    lines = fleet_lines(st, 0.0, int(WALL * 1e9))
    racks = _by(lines, "fleet_rack", "fleet_rack")
    assert racks["ra"]["grant_w"] is None and racks["ra"]["lease_expires_in_s"] is None
    assert racks["ra"]["cooling_w"] == 60_000.0                  # the configured one
    assert _by(lines, "fleet_row", "fleet_row")["h/r1"]["grants_w"] is None
