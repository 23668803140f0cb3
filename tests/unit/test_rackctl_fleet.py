"""`rackctl.fleet.FleetView` (pure): what a rack may draw by rlc's rule from its budget record
(the lease in force, else the floor; an older higher grant until its expiry), records that do
not decode, and rlc's cross-checks of the report (the command itself:
tests/integration/test_rackctl_fleet.py)."""

from __future__ import annotations

import json

from rackctl.fleet import FleetView, RackPlace
from rackplane.core.budget_leases import BudgetLease, RackReport

NOW = 1.8e9


def _budget(value_w: float, expires_in_s: float, unreleased: tuple[tuple[float, float], ...]
            = ()) -> tuple[int, bytes]:
    lease = BudgetLease("ra", value_w, NOW - 10.0, NOW + expires_in_s, 3, 4)
    led = {"unreleased": [{"value_w": v, "expires_at_s": NOW + e} for v, e in unreleased]}
    return 5, json.dumps({"lease": lease.as_record(), "ledger": led}).encode()


def _view(budget: tuple[int, bytes] | None, report: tuple[int, bytes] | None = None
          ) -> dict[str, object]:
    v = FleetView("lab", {"h/r": 50_000.0}, [RackPlace("ra", "h/r", 20_000.0)],
                  {"ra": budget}, {"ra": report})
    return v.summary(NOW)


def test_the_lease_in_force_else_the_floor_and_older_grants_until_their_expiry() -> None:
    s = _view(_budget(30_000.0, 5.0))
    assert s["rows"]["h/r"]["racks"]["ra"]["bound_w"] == 30_000.0 and s["ok"]  # type: ignore[index]
    s = _view(_budget(30_000.0, -1.0))                                  # expired: the floor
    ra = s["rows"]["h/r"]["racks"]["ra"]  # type: ignore[index]
    assert ra["bound_w"] == 20_000.0 and not ra["lease"]["in_force"]
    assert s["rows"]["h/r"]["leased_w"] == 0.0  # type: ignore[index]
    s = _view(_budget(30_000.0, 5.0, ((60_000.0, 2.0), (90_000.0, -0.5))))
    row = s["rows"]["h/r"]  # type: ignore[index]
    assert row["racks"]["ra"]["bound_w"] == 60_000.0                     # 90 kW expired
    assert row["over_limit"] and not s["ok"]                             # 60 > 50 kW


def test_records_that_do_not_decode_and_cross_checks_are_problems() -> None:
    s = _view((1, b"{not json"), (2, b'{"rack": "ra"}'))
    ra = s["rows"]["h/r"]["racks"]["ra"]  # type: ignore[index]
    assert ra["problems"] == ["bad_budget", "bad_report"] and not s["ok"]
    assert ra["bound_w"] == 20_000.0
    rep = RackReport("ra", None, 20_000.0, 15_000.0, None, None, False, NOW - 3.0, 25_000.0)
    s = _view(_budget(30_000.0, 5.0), (2, json.dumps(rep.as_record()).encode()))
    ra = s["rows"]["h/r"]["racks"]["ra"]  # type: ignore[index]
    assert ra["problems"] == ["floor_below", "agents_safe_above_floor"]
    assert ra["report"]["age_s"] == 3.0 and not s["ok"]
    # floor_below alone is harmless: still ok
    rep = RackReport("ra", None, 20_000.0, 15_000.0, None, None, False, NOW, None)
    assert _view(_budget(30_000.0, 5.0), (2, json.dumps(rep.as_record()).encode()))["ok"]
