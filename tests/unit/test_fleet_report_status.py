"""The rack report's status fields (version 3, issue 16 item 4: `rackplane.core.budget_leases`):
lifecycle, alarms (counts per severity, shelved, the most severe ids, bounded) and the active
instance of a racky pair with its epoch. An older record reads them as unknown, a v3 record
round-trips, a field out of its bounds is refused alone (the core of the record stands, so rlc
keeps the rack's report), a bad core field still refuses the record; racky fills them from its
real alarm bank and lifecycle, only the active instance of a pair writes the report, and rlc
takes a report whatever its status fields say."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rackplane.clock import FakeClock
from rackplane.core.budget_leases import (
    ALARM_SEVERITIES,
    REPORT_ALARM_COUNT_MAX,
    REPORT_ALARM_IDS_MAX,
    REPORT_VERSION,
    AlarmSummary,
    PairTag,
    RackReport,
)
from rackplane.core.names import PAIR_INSTANCE_PATTERN
from rackplane.io.nats.lease import INSTANCE_PATTERN
from rackplane.leadership_settings import LeadershipSettings
from racky.app import Racky
from racky.config import RackyConfig
from racky.core.alarmbank import AlarmBank, AlarmKind
from racky.fleet import FleetLink
from racky.fleet_settings import FleetSettings
from tests.unit.test_fleet_defaults import _core_with
from tests.unit.test_racky_pair_epochs import _Lease
from tests.unit.test_rlc_fleet_state import state

WALL = 1.8e9
ALARMS = AlarmSummary(critical=1, major=0, minor=2, warning=0, shelved=1,
                      ids=("leak_rope", "cap_drift:tray05", "port_dropped:gpu07-nic1"))


def _v3() -> RackReport:
    return RackReport("ra", 55_000.0, 40_000.0, 20_000.0, 39_000.0, (7, 2), True, WALL,
                      15_000.0, 61_500.0, 38_200.0, lifecycle="production", alarms=ALARMS,
                      pair=PairTag("b", 4))


def _wire(rep: RackReport) -> dict[str, Any]:
    rec: dict[str, Any] = json.loads(json.dumps(rep.as_record()))
    return rec


def test_a_v3_record_round_trips_and_an_older_one_reads_the_status_as_unknown() -> None:
    rep = _v3()
    rec = _wire(rep)
    assert rec["version"] == REPORT_VERSION == 3
    assert rec["lifecycle"] == "production" and rec["pair"] == {"instance": "b", "epoch": 4}
    assert rec["alarms"] == {"counts": {"critical": 1, "major": 0, "minor": 2, "warning": 0},
                             "shelved": 1, "ids": list(ALARMS.ids)}
    back = RackReport.from_record(rec)
    assert back == rep and back.refused == ()
    assert back.alarms is not None and back.alarms.worst == "critical"
    assert back.alarms.total == 3
    # a single instance: pair null, still version 3
    single = RackReport.from_record({**rec, "pair": None})
    assert single.pair is None and single.version == 3 and single.refused == ()
    # a version-2 racky's record: no status fields at all
    v2 = {k: v for k, v in rec.items() if k not in ("lifecycle", "alarms", "pair")}
    v2["version"] = 2
    old = RackReport.from_record(v2)
    assert (old.lifecycle, old.alarms, old.pair, old.version, old.refused) == (
        None, None, None, 2, ())
    assert (old.power_w, old.cooling_w, old.demand_w) == (38_200.0, 61_500.0, 55_000.0)


BAD_STATUS: list[tuple[str, Any]] = [
    ("lifecycle", "Production"),                              # not the pattern
    ("lifecycle", "x" * 33),                                  # too long
    ("lifecycle", 3),
    ("alarms", "3 critical"),                                 # not an object
    ("alarms", {"counts": {"critical": 1, "major": 0, "minor": 0}, "ids": []}),  # missing
    ("alarms", {"counts": {**ALARMS.counts, "fatal": 1}, "ids": []}),       # unknown severity
    ("alarms", {"counts": {**ALARMS.counts, "minor": -1}, "ids": []}),
    ("alarms", {"counts": {**ALARMS.counts, "minor": 1.5}, "ids": []}),
    ("alarms", {"counts": {**ALARMS.counts, "minor": True}, "ids": []}),
    ("alarms", {"counts": {**ALARMS.counts, "minor": REPORT_ALARM_COUNT_MAX + 1}, "ids": []}),
    ("alarms", {"counts": {**ALARMS.counts, "critical": 20},
                "ids": [f"a{i}" for i in range(REPORT_ALARM_IDS_MAX + 1)]}),   # too many ids
    ("alarms", {"counts": {**ALARMS.counts}, "ids": ["a", "b", "c", "d"]}),    # > 3 alarms
    ("alarms", {"counts": {**ALARMS.counts}, "ids": ["Leak Rope"]}),           # not an id
    ("alarms", {"counts": {**ALARMS.counts}, "ids": ["x" * 65]}),
    ("alarms", {"counts": {**ALARMS.counts}, "ids": "leak_rope"}),
    ("alarms", {"counts": {**ALARMS.counts}, "shelved": -2, "ids": []}),
    ("pair", {"instance": "B", "epoch": 4}),
    ("pair", {"instance": "b" * 33, "epoch": 4}),
    ("pair", {"instance": "b", "epoch": 0}),
    ("pair", {"instance": "b", "epoch": "4"}),
    ("pair", {"instance": "b"}),
    ("pair", ["b", 4]),
]


@pytest.mark.parametrize(("field", "value"), BAD_STATUS)
def test_a_status_field_out_of_its_bounds_is_refused_alone(field: str, value: Any) -> None:
    rec = {**_wire(_v3()), field: value}
    got = RackReport.from_record(rec)
    assert got.refused == (field,)
    assert getattr(got, field) is None
    # the rest of the record stands, the other status fields too
    assert (got.demand_w, got.acked, got.power_w) == (55_000.0, (7, 2), 38_200.0)
    others = {"lifecycle": "production", "alarms": ALARMS, "pair": PairTag("b", 4)}
    for k, v in others.items():
        if k != field:
            assert getattr(got, k) == v
    # the codec never writes what it refuses: a summary or tag out of bounds is not built
    with pytest.raises(ValueError):
        if field == "alarms":
            AlarmSummary.from_record(value)
        elif field == "pair":
            PairTag.from_record(value)
        else:
            RackReport("ra", None, 1.0, 1.0, None, None, False, WALL, lifecycle=value)


def test_a_bad_core_field_still_refuses_the_whole_record() -> None:
    rec = _wire(_v3())
    for field, value in (("budget_w", "a lot"), ("acked", [1]), ("at_s", None)):
        with pytest.raises(ValueError):
            RackReport.from_record({**rec, field: value})
    with pytest.raises(ValueError):
        RackReport.from_record([rec])  # type: ignore[arg-type]


def test_the_ids_are_the_most_severe_bounded_and_shelved_ones_only_counted() -> None:
    kinds = [AlarmKind("leak", "critical", "leak {thing}"),
             AlarmKind("hot", "major", "hot {thing}"),
             AlarmKind("drift", "minor", "drift {thing}"),
             AlarmKind("note", "warning", "note {thing}")]
    bank = AlarmBank(kinds, 0.0)
    bank.update(1.0, "note", ["n1"])
    bank.update(2.0, "drift", [f"t{i:02d}" for i in range(10)])   # 10 minor, raised at 2 s
    bank.update(3.0, "hot", ["h1", "h2"])
    bank.update(4.0, "leak", ["rope"])                             # newest but most severe
    bank.shelve("hot:h2", "op", 100.0, 5.0)
    s = AlarmSummary.of(bank.active())
    assert s.counts == {"critical": 1, "major": 1, "minor": 10, "warning": 1}
    assert s.shelved == 1 and s.total == 13 and s.worst == "critical"
    assert len(s.ids) == REPORT_ALARM_IDS_MAX
    assert s.ids[:2] == ("leak:rope", "hot:h1")                    # severity first
    assert all(i.startswith("drift:") for i in s.ids[2:])         # no warning made the cut
    assert AlarmSummary.from_record(json.loads(json.dumps(s.as_record()))) == s
    none = AlarmSummary.of([])
    assert none.total == 0 and none.worst is None and none.ids == ()
    assert tuple(ALARM_SEVERITIES) == ("critical", "major", "minor", "warning")


def test_racky_reports_its_lifecycle_alarms_and_pair() -> None:
    core = _core_with({})
    link = FleetLink(FleetSettings(enabled=True, servers=["nats://127.0.0.1:1"]), "lab", "r1")
    link.observe_core(core)
    rep = link.follower.report(WALL, 0.0)
    assert rep.lifecycle == "production" and rep.pair is None
    assert rep.alarms == AlarmSummary.of(core.bank.active())
    link.observe_core(core, PairTag("a", 9))
    rep = link.follower.report(WALL, 0.0)
    assert rep.pair == PairTag("a", 9)
    assert RackReport.from_record(_wire(rep)) == rep


def test_the_instance_pattern_is_one_rule() -> None:
    assert INSTANCE_PATTERN == PAIR_INSTANCE_PATTERN
    assert LeadershipSettings.model_fields["instance"].metadata[0].pattern == (
        PAIR_INSTANCE_PATTERN)


def test_rlc_takes_a_report_whatever_its_status_fields_say() -> None:
    st = state()
    rec = {**_wire(_v3()), "alarms": {"counts": {"fatal": 99}}, "pair": "garbage",
           "lifecycle": "?"}
    st.on_report("ra", (1, json.dumps(rec).encode()), 0.0)
    got = st.seen["ra"].report
    assert got is not None and got.demand_w == 55_000.0 and st.bad_records == 0
    assert got.refused == ("lifecycle", "alarms", "pair")


def test_racky_pair_wiring_the_active_reports_with_its_epoch_the_standby_and_fenced_do_not(
        tmp_path: Path) -> None:
    cfg = RackyConfig.model_validate({
        "lifecycle": {"state_file": str(tmp_path / "racky-state.json")},
        "spool": {"directory": str(tmp_path / "spool")},
        "leadership": {"enabled": True, "instance": "b"},
        "fleet": {"enabled": True, "servers": ["nats://127.0.0.1:1"]},
    })
    r = Racky(cfg, clock=FakeClock(start_mono=1000.0, start_wall_ns=int(WALL * 1e9)))
    lease = _Lease()
    r.lease_runner = lease  # type: ignore[assignment]
    link = r.fleet
    assert link is not None and r.pair_sync is not None
    assert not link.reporting                          # before its first tick
    r._update_role(1000.0)
    r.tick(1000.0)
    assert r.role == "standby" and not link.reporting and link.follower.pair is None
    lease.epoch = 4
    r.pair_sync.caught_up_epoch = 4
    r._update_role(1001.0)
    r.tick(1001.0)
    assert r.role == "active" and link.reporting and link.fence is not None and link.fence()
    assert link.follower.pair == PairTag("b", 4)
    assert link.follower.lifecycle == r.core.persisted.lifecycle.state
    assert link.follower.alarms is not None
    lease.epoch = 0                                    # fenced: no more writes, before a tick
    assert not link.fence()
    # a single instance reports at once, no pair, never fenced
    one = Racky(RackyConfig.model_validate({**cfg.model_dump(mode="json"),
                                            "leadership": {"enabled": False}}),
                clock=FakeClock(start_mono=1000.0, start_wall_ns=int(WALL * 1e9)))
    assert one.fleet is not None and one.fleet.reporting and one.fleet.fence is None
    one.tick(1000.0)
    assert one.fleet.reporting and one.fleet.follower.pair is None
