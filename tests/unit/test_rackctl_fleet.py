"""`rackctl.fleet.FleetView` (pure): what a rack may draw by rlc's rule from its budget record
(the lease in force, else the floor; an older higher grant until its expiry), records that do
not decode, and rlc's cross-checks of the report; each rack's lifecycle, power vs lease vs
cooling, alarms and controller pair (table and --json; unknown from an older racky), the
row's power Σ (the command itself: tests/integration/test_rackctl_fleet.py)."""

from __future__ import annotations

import json

from rich.console import Console

from rackctl.fleet import FleetView, RackPlace, render
from rackplane.core.budget_leases import AlarmSummary, BudgetLease, PairTag, RackReport

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


def test_an_older_grant_acknowledged_as_released_no_longer_counts_as_rlc_counts_it() -> None:
    """rlc releases an older grant once racky acknowledges the key that released it
    (`rlc.core.leases.is_released`), before its expiry: the view must not count it then (the
    demo's row showed 'OVER THE LIMIT' while power moved between racks), and must while the
    acknowledgement is older."""
    lease = BudgetLease("ra", 30_000.0, NOW - 10.0, NOW + 5.0, 3, 4)
    led = {"unreleased": [{"value_w": 60_000.0, "expires_at_s": NOW + 2.0, "life_s": 10.0,
                           "released_by": [3, 4]}]}
    budget = 5, json.dumps({"lease": lease.as_record(), "ledger": led}).encode()

    def report(acked: tuple[int, int] | None) -> tuple[int, bytes]:
        rep = RackReport("ra", 30_000.0, 30_000.0, 20_000.0, 29_000.0, acked, True, NOW - 1.0,
                         None)
        return 2, json.dumps(rep.as_record()).encode()

    held = _view(budget, report((3, 3)))["rows"]["h/r"]  # type: ignore[index]
    assert held["racks"]["ra"]["bound_w"] == 60_000.0 and held["over_limit"]
    for ack in ((3, 4), (4, 1)):  # the releasing key, or a newer one
        s = _view(budget, report(ack))
        ra = s["rows"]["h/r"]["racks"]["ra"]  # type: ignore[index]
        assert ra["bound_w"] == 30_000.0 and ra["unreleased"] == [] and s["ok"]
    # the record's own ledger acknowledgement counts too (no report)
    led_acked = {**led, "acked": [3, 4]}
    s = _view((5, json.dumps({"lease": lease.as_record(), "ledger": led_acked}).encode()))
    assert s["rows"]["h/r"]["racks"]["ra"]["bound_w"] == 30_000.0  # type: ignore[index]


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


ALARMS = AlarmSummary(critical=1, minor=2, shelved=1, ids=("leak_rope", "cap_drift:tray05"))
PAIR_B4 = PairTag("b", 4)


def _rep(*, at_s: float = NOW - 2.0, power_w: float | None = 38_200.0,
         tag: PairTag | None = PAIR_B4, drop: tuple[str, ...] = (),
         **over: object) -> tuple[int, bytes]:
    rep = RackReport("ra", 55_000.0, 30_000.0, 20_000.0, 29_000.0, (3, 4), True, at_s,
                     None, 61_500.0, power_w, lifecycle="production", alarms=ALARMS, pair=tag)
    rec = {k: v for k, v in rep.as_record().items() if k not in drop}
    return 2, json.dumps({**rec, **over}).encode()


def _text(summary: dict[str, object]) -> str:
    con = Console(record=True, width=400)
    con.print(render(summary))
    return con.export_text()


def _cells(text: str) -> tuple[list[str], list[str]]:
    """Rack ra's cells in the powers table and in the status table (the leases' table
    between them)."""
    lines = [x for x in text.splitlines() if x.startswith("│ ra ")]
    assert len(lines) == 3, text
    budget, _leases, status = ([c.strip() for c in x.split("│")[1:-1]] for x in lines)
    return budget, status


def test_the_tables_keep_every_column_readable_in_80_columns() -> None:
    """An 80-column terminal squeezed the rack column to one character and blanked the lease
    columns: the powers and the leases' detail are two tables now, each fitting."""
    con = Console(record=True, width=80)
    con.print(render(_view(_budget(30_000.0, 5.0, ((60_000.0, 2.0),)), _rep())))
    text = con.export_text()
    for head in ("rack", "power", "lease", "may draw", "enforced", "floor", "e/s", "left s",
                 "unreleased", "acked", "age s", "problems", "state", "alarms"):
        assert f" {head} " in text, head
    assert all(len(x) <= 80 for x in text.splitlines())
    assert sum(1 for x in text.splitlines() if x.startswith("│ ra ")) == 3


def _stale_view(report: tuple[int, bytes]) -> dict[str, object]:
    return FleetView("lab", {"h/r": 50_000.0}, [RackPlace("ra", "h/r", 20_000.0)],
                     {"ra": _budget(30_000.0, 5.0)}, {"ra": report}, 5.0).summary(NOW)


def test_each_rack_shows_lifecycle_power_lease_cooling_alarms_and_pair() -> None:
    s = _view(_budget(30_000.0, 5.0), _rep())
    row = s["rows"]["h/r"]  # type: ignore[index]
    rep = row["racks"]["ra"]["report"]
    assert (rep["lifecycle"], rep["power_w"], rep["cooling_w"], rep["version"]) == (
        "production", 38_200.0, 61_500.0, 3)
    assert rep["alarms"] == {"counts": {"critical": 1, "major": 0, "minor": 2, "warning": 0},
                             "shelved": 1, "ids": ["leak_rope", "cap_drift:tray05"],
                             "worst": "critical"}
    assert rep["pair"] == {"instance": "b", "epoch": 4} and rep["single_instance"] is False
    assert (row["power_w"], row["power_racks"]) == (38_200.0, 1)
    assert s["ok"]                                   # a critical alarm changes no exit code
    text = _text(s)
    assert "row h/r: limit 50.0 kW, drawing 38.2 kW, leases in force 30.0 kW" in text
    budget, status = _cells(text)
    assert budget[:5] == ["ra", "38.2", "30.0", "61.5", "30.0"]   # power, lease, cooling
    assert status == ["ra", "production", "b/4",
                      "1 critical, 2 minor: leak_rope, cap_drift:tray05 +1 (1 shelved)"]
    # a single instance says so
    s = _view(_budget(30_000.0, 5.0), _rep(tag=None))
    rep = s["rows"]["h/r"]["racks"]["ra"]["report"]  # type: ignore[index]
    assert rep["pair"] is None and rep["single_instance"] is True
    assert _cells(_text(s))[1][2] == "single"


def test_an_older_racky_shows_unknown_and_a_bad_status_field_is_a_problem() -> None:
    v2 = _rep(drop=("lifecycle", "alarms", "pair"), version=2)
    s = _view(_budget(30_000.0, 5.0), v2)
    rep = s["rows"]["h/r"]["racks"]["ra"]["report"]  # type: ignore[index]
    assert (rep["lifecycle"], rep["alarms"], rep["pair"], rep["single_instance"]) == (
        None, None, None, None)
    assert s["ok"] and rep["demand_w"] == 55_000.0
    assert _cells(_text(s))[1] == ["ra", "?", "?", "?"]      # lifecycle, pair, alarms
    s = _view(_budget(30_000.0, 5.0), _rep(pair={"instance": "B", "epoch": 4}))
    ra = s["rows"]["h/r"]["racks"]["ra"]  # type: ignore[index]
    assert ra["problems"] == ["bad_status"] and not s["ok"]
    assert ra["report"]["pair"] is None and ra["report"]["single_instance"] is None
    assert ra["report"]["lifecycle"] == "production"        # the rest stands


def test_a_stale_report_or_one_without_power_leaves_the_rows_power_unknown() -> None:
    s = _stale_view(_rep(at_s=NOW - 2.0))
    assert s["rows"]["h/r"]["power_w"] == 38_200.0  # type: ignore[index]
    s = _stale_view(_rep(at_s=NOW - 9.0))                       # older than 5 s
    row = s["rows"]["h/r"]  # type: ignore[index]
    assert row["racks"]["ra"]["report"]["stale"] and row["power_w"] is None
    assert row["power_racks"] == 0 and s["ok"]
    text = _text(s)
    assert "drawing ? kW (0 of 1 racks report)" in text and "9.0 stale" in text
    s = _stale_view(_rep(power_w=None))
    assert s["rows"]["h/r"]["power_w"] is None  # type: ignore[index]
