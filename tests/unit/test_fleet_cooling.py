"""Each rack's cooling capacity as a further limit of its fleet grant (issue 16): racky
reports the P_max its facility-water derate works to from valvey's measured capacity (AC, in a
versioned `RackReport`); rlc caps the rack at the lower of that and its configured figure while
the report is fresh and plausible, holds the last good figure for ``cooling_hold_s`` once it
is not, and never lets a report raise a rack past its configured bound."""

from __future__ import annotations

import json
import math

import pytest

from rackplane.core.budget_leases import REPORT_VERSION, RackReport
from racky.config import DerateSettings
from racky.core.budget import COOLING_REPORT_STEP_W
from racky.core.power import Derate
from racky.fleet import FleetLink
from racky.fleet_settings import FleetSettings
from rlc.config import example_topology
from rlc.core.allocation import AllocationSettings
from rlc.core.cycle import FleetState
from rlc.core.leases import LeaseTiming
from rlc.core.topology import TopologySettings, compile_topology
from tests.unit.test_racky_derate_measured import WALL as WALL_NS
from tests.unit.test_racky_derate_measured import _cooling, _tick

WALL = 1.8e9
TIMING = LeaseTiming(ttl_s=9.0, clock_margin_s=1.0, agent_cap_ttl_s=5.0)
HOLD_S = 60.0


# --- the record ----------------------------------------------------------------------------------

def test_the_report_carries_cooling_versioned_and_an_older_record_reads_as_unknown() -> None:
    rep = RackReport("r1", 50_000.0, 40_000.0, 20_000.0, None, (1, 2), True, WALL,
                     agents_safe_w=30_000.0, cooling_w=61_500.0)
    rec = json.loads(json.dumps(rep.as_record()))
    assert rec["version"] == REPORT_VERSION >= 2 and rec["cooling_w"] == 61_500.0
    assert RackReport.from_record(rec) == rep
    # a version-1 racky's record: no version, no agents_safe_w, no cooling_w
    old = {k: v for k, v in rec.items() if k not in ("version", "agents_safe_w", "cooling_w")}
    got = RackReport.from_record(old)
    assert got.cooling_w is None and got.agents_safe_w is None and got.version == 1
    with pytest.raises(ValueError):
        RackReport.from_record({**rec, "cooling_w": "a lot"})


# --- racky: the derate's measured P_max, reported in AC ---------------------------------------

def test_derate_reports_only_a_measured_capacity_never_the_table() -> None:
    d = Derate(DerateSettings())
    d.step(44.0, True, 1.0, 132_000.0)                       # the table: the cold prior
    assert d.cap_w is not None and d.measured_capacity_w(44.0) is None
    d.step(44.0, True, 1.0, 132_000.0, 36_400.0, 45.0)
    assert d.measured_capacity_w(44.0) == pytest.approx(36_400.0 * (45.0 - 44.1))
    assert d.measured_capacity_w(44.0) == pytest.approx(d.cap_w)  # what the derate works to
    assert d.measured_capacity_w(46.0) == 0.0                 # water above the setpoint: none


def test_racky_reports_its_measured_cooling_capacity_to_rlc_in_ac() -> None:
    t = _tick()
    _cooling(t, 1.0)                                          # valvey has not measured yet
    t.step(1.0, WALL_NS)
    assert t.core.last is not None and t.core.last.cooling_capacity_w is None
    _cooling(t, 2.0, capacity_w_per_k=36_400.0)
    t.step(2.0, WALL_NS)
    dc = 36_400.0 * (45.0 - 44.1)
    assert t.core.last.cooling_capacity_w == pytest.approx(dc)
    s = FleetSettings(enabled=True, servers=["nats://127.0.0.1:1"])
    link = FleetLink(s, "lab", "r1")
    link.observe_core(t.core)
    ac = dc * s.input_ratio_fallback                          # no shelves: the fallback ratio
    rep = RackReport.from_record(json.loads(json.dumps(
        link.follower.report(WALL, 0.0).as_record())))
    assert rep.cooling_w is not None
    assert ac - COOLING_REPORT_STEP_W < rep.cooling_w <= ac   # rounded down: never more
    assert rep.cooling_w % COOLING_REPORT_STEP_W == 0
    # the facility water stale past the derate's stale_after_s: unknown, not the old figure
    later = 2.0 + t.cfg.power.derate.stale_after_s + 1.0
    t.step(later, WALL_NS)
    assert t.core.last.cooling_capacity_w is None
    link.observe_core(t.core)
    assert link.follower.report(WALL, 0.0).cooling_w is None


# --- rlc: min(configured, reported), held, then configured / none ------------------------------

def _state(configured_w: float | None) -> FleetState:
    rack: dict[str, float] = {"floor_w": 20_000.0, "max_w": 90_000.0}
    if configured_w is not None:
        rack["cooling_capacity_w"] = configured_w
    topo = compile_topology(TopologySettings.model_validate({"site": "s", "halls": {"h": {
        "feed_limit_w": 1e6, "rows": {"r": {"limit_w": 200_000.0, "racks": {
            "ra": rack, "rb": {"floor_w": 20_000.0, "max_w": 90_000.0}}}}}}}))
    st = FleetState(topo, TIMING, AllocationSettings(spread_spare=False), 2.0, 1e6, 100.0,
                    cooling_max_w=500_000.0, cooling_hold_s=HOLD_S)
    st.restore(1, {"ra": None, "rb": None}, 0.0)
    return st


class _Racks:
    """Two racks reporting a demand of 80 kW each, ``ra`` with a cooling figure."""

    def __init__(self, st: FleetState) -> None:
        self.st, self.rev = st, 0

    def cycle(self, mono: float, ra_cooling_w: float | None, *, report: bool = True
              ) -> dict[str, float]:
        if report:
            for rack, cool in (("ra", ra_cooling_w), ("rb", None)):
                self.rev += 1
                rec = RackReport(rack, 80_000.0, 0.0, 20_000.0, None, None, True, WALL + mono,
                                 cooling_w=cool).as_record()
                self.st.on_report(rack, (self.rev, json.dumps(rec).encode()), mono)
        ws = self.st.cycle(1, WALL + mono, mono)
        for w in ws:
            self.st.write_done(w.rack, self.rev)
        led = self.st.ledgers
        return {r: led[r].current.value_w for r in ("ra", "rb")  # type: ignore[union-attr]
                } | {"source": self.st.last_cooling[1][0]}  # type: ignore[index]


def test_rlc_caps_at_the_lower_of_configured_and_reported() -> None:
    r = _Racks(_state(60_000.0))
    assert r.cycle(0.0, None) == {"ra": 60_000.0, "rb": 80_000.0, "source": "configured"}
    assert r.cycle(1.0, 45_000.0) == {"ra": 45_000.0, "rb": 80_000.0, "source": "reported"}
    # a reported capacity above the configured bound never lifts it
    assert r.cycle(2.0, 75_000.0) == {"ra": 60_000.0, "rb": 80_000.0, "source": "reported"}
    fleet = r.st.summary(2.0)["rows"]["h/r"]["racks"]
    assert fleet["ra"]["cooling_w"] == 60_000.0 and fleet["ra"]["reported_cooling_w"] == 75_000.0
    assert fleet["rb"]["cooling_w"] is None and fleet["rb"]["cooling_source"] == "none"


@pytest.mark.parametrize("configured_w", [None, 70_000.0])
@pytest.mark.parametrize("lost", ["unknown", "implausible_high", "negative", "silent"])
def test_a_lost_capacity_is_held_for_the_hold_time_then_the_configured_or_none(
        configured_w: float | None, lost: str) -> None:
    r = _Racks(_state(configured_w))
    assert r.cycle(0.0, 45_000.0)["ra"] == 45_000.0
    bad = {"unknown": None, "implausible_high": 5e6, "negative": -1.0, "silent": None}[lost]
    silent = lost == "silent"                 # no report at all: unreachable after 2 s
    for t in (3.0, 30.0, HOLD_S - 0.5):
        got = r.cycle(t, bad, report=not silent)
        assert got["ra"] == 45_000.0 and got["source"] == "held", (t, got)
    if lost in ("implausible_high", "negative"):
        assert r.st.cooling_implausible == 3
    got = r.cycle(HOLD_S + 0.5, bad, report=not silent)
    assert got["source"] == ("none" if configured_w is None else "configured")
    if silent:
        assert got["ra"] == 45_000.0          # unreachable: held where it is, never raised
    else:
        assert got["ra"] == (80_000.0 if configured_w is None else configured_w)
    # a fresh plausible report takes over at once, down as well as up
    assert r.cycle(HOLD_S + 1.0, 30_000.0)["ra"] == 30_000.0


def test_a_zero_capacity_is_a_capacity_the_rack_falls_to_its_floor() -> None:
    r = _Racks(_state(None))
    assert r.cycle(0.0, 0.0)["ra"] == 20_000.0
    assert r.st.last is not None and bool(r.st.last.cooling_below_floor[0])


def test_no_nominal_cooling_default_in_rlc() -> None:
    topo = compile_topology(example_topology())
    assert all(math.isnan(c) for c in topo.cooling_w.tolist())


def test_fleet_side_reports_the_shelves_ac_input_and_cooling_in_ac() -> None:
    from racky.core.budget import BudgetFollower, FleetSide, InputRatio

    f = BudgetFollower("r1", 20_000.0, 1.0)
    side = FleetSide(f, InputRatio(1.10))
    side.observe(50_000.0, 50_000.0, 52_340.0, 50_000.0, WALL, 0.0, cooling_dc_w=40_000.0)
    rep = f.report(WALL, 0.0)
    assert rep.power_w == 52_300.0                            # the AC input, to 100 W
    assert rep.cooling_w == 41_500.0                          # 40 kW × 1.0468 = 41.87 kW, down
    side.observe(50_000.0, 50_000.0, None, None, WALL, 1.0, cooling_dc_w=float("nan"))
    rep = f.report(WALL, 1.0)
    assert rep.power_w is None and rep.cooling_w is None
