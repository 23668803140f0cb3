"""The command-epoch space (issue 15: `rackplane.core.tray_contract.command_epoch`), the epoch
rule at the receivers with its refusal counts (the simulated agents `sims.rack.NodeAgents`,
trayagent's `CapBook` and its persisted epochs), racky's standby withholding its commands
(`racky.tick.RackyTick.sending`), racky's part of the pair's sync record (`racky.pair`) and
the HA cap-TTL check of racky's config."""

from __future__ import annotations

import json
from pathlib import Path

import pydantic
import pytest

from rackplane.clock import FakeClock
from rackplane.core.leadership import LeadershipStatus
from rackplane.core.tray_contract import PAIR_EPOCH_BASE, command_epoch
from racky.app import Racky
from racky.config import RackyConfig
from racky.core.agent_settings import AgentCommand, DesiredTray
from racky.core.controller import RackyCore
from racky.core.lifecycle import Lifecycle, PersistedState
from racky.core.power import RequestedCap
from racky.pair import apply_sync_state, sync_state
from racky.tick import RackyTick
from sims.rack import NodeAgents, StaleEpoch
from trayagent.core.caps import CapBook
from trayagent.core.caps import StaleEpoch as AgentStaleEpoch

WALL = 1_764_000_000_000_000_000
START_MS = WALL // 1_000_000


# --- the epoch space -------------------------------------------------------------------------


def test_a_restart_a_takeover_and_a_pair_after_a_single_instance_are_all_newer() -> None:
    single = command_epoch(START_MS, 0)
    assert single == START_MS
    assert command_epoch(START_MS + 1, 0) > single  # a restart 1 ms later
    first = command_epoch(START_MS, 7)
    assert first == PAIR_EPOCH_BASE + 7
    # a pair's first tenure (a lease revision of 1) beats a single start in year 146 million
    assert command_epoch(0, 1) > command_epoch(PAIR_EPOCH_BASE - 1, 0)
    assert command_epoch(START_MS, 8) > first  # a takeover: the next revision
    assert command_epoch(0, 8) == command_epoch(START_MS, 8)  # not the start time: the lease
    assert command_epoch(0, PAIR_EPOCH_BASE - 1) == 2**63 - 1  # the contract's largest


@pytest.mark.parametrize(("start_ms", "lease"), [(-1, 0), (PAIR_EPOCH_BASE, 0), (0, -1),
                                                  (0, PAIR_EPOCH_BASE)])
def test_an_epoch_outside_its_space_is_refused(start_ms: int, lease: int) -> None:
    with pytest.raises(ValueError, match=r"2\*\*62"):
        command_epoch(start_ms, lease)


# --- the receivers -----------------------------------------------------------------------


def _agents() -> NodeAgents:
    return NodeAgents(4, 4, 1200.0, 0.1, 200.0)


def test_the_simulated_agents_refuse_and_count_an_older_epoch_and_accept_equal_or_newer(
) -> None:
    ag = _agents()
    single = command_epoch(START_MS, 0)
    ag.command([0, 1], epoch=single, changes={"power_floor_pct": 10.0})
    pair = command_epoch(0, 3)
    ag.command([0], epoch=pair, changes={"power_floor_pct": 20.0})
    assert ag.newest_epoch(0) == pair and ag.newest_epoch(1) == single
    with pytest.raises(StaleEpoch, match="older than"):  # the single instance's, delayed
        ag.command([1, 0], epoch=single, changes={"power_floor_pct": 30.0})
    assert ag.stale_refused == 1
    assert ag.settings(1).power_floor_pct == 10.0  # all trays or none: tray 1 untouched
    with pytest.raises(StaleEpoch):  # the old tenure's after a takeover
        ag.command([0], epoch=command_epoch(0, 2), changes={"power_floor_pct": 30.0})
    assert ag.stale_refused == 2
    ag.command([0], epoch=pair, changes={"power_floor_pct": 25.0})  # equal: applied
    assert ag.settings(0).power_floor_pct == 25.0
    assert ag.stale_refused == 2


def test_trayagent_counts_refusals_and_its_persisted_epochs_refuse_after_a_restart() -> None:
    book = CapBook({0: 4, 1: 4}, 300.0)
    pair = command_epoch(0, 5)
    assert book.apply([0], pair, power_cap_w=3000.0, ttl_s=60.0, now=0.0)  # grew: persist
    with pytest.raises(AgentStaleEpoch):
        book.apply([0, 1], command_epoch(START_MS, 0), power_cap_w=2000.0, ttl_s=60.0,
                   now=1.0)
    assert book.stale_refused == 1
    assert book.trays[1].epoch is None and book.trays[0].power_cap_w == 3000.0
    # restarted with the epochs the agent persisted: the old tenure is still refused
    again = CapBook({0: 4, 1: 4}, 300.0, epochs={0: pair})
    with pytest.raises(AgentStaleEpoch):
        again.apply([0], command_epoch(0, 4), power_cap_w=2000.0, ttl_s=60.0, now=0.0)
    assert again.stale_refused == 1
    assert not again.apply([0], pair, power_cap_w=2500.0, ttl_s=60.0, now=0.0)  # not grown


# --- racky ---------------------------------------------------------------------------------


def _tick(cfg: RackyConfig | None = None) -> RackyTick:
    cfg = cfg or RackyConfig()
    ps = PersistedState(Lifecycle(cfg.lifecycle.initial_state, WALL, "new", "test"))
    return RackyTick(cfg, RackyCore(cfg, 0.0, ps), 0.0, agent_epoch=command_epoch(0, 9),
                     request_prefix="racky-b")


def test_racky_standby_withholds_its_commands_and_the_active_sends_with_its_epoch() -> None:
    t = _tick()
    cmd = AgentCommand((0, 1), {"powered": True}, "test")
    t.sending = False
    eff = t.command_effects([cmd, cmd], 1.0, WALL)
    assert eff.agent_commands == [] and t.pending == {} and t.agent_stats["sent"] == 0
    assert t.withheld_commands == 2
    t.sending = True
    eff = t.command_effects([cmd], 2.0, WALL)
    (pub,) = eff.agent_commands
    assert pub.payload["args"]["epoch"] == PAIR_EPOCH_BASE + 9
    assert pub.payload["request_id"].startswith("racky-b-")
    assert t.agent_stats["sent"] == 1 and len(t.pending) == 1


def test_racky_sync_state_round_trip_carries_budget_caps_and_power_state() -> None:
    active, standby = _tick(), _tick()
    a = active.core
    a.set_budget(120_000.0)
    a.requested["valvey"] = RequestedCap("valvey", 110_000.0, 130.0, "valve stuck")
    a.cap_overrides[3] = RequestedCap("alice", 4000.0, 200.0, "test")
    a.desired_powered[5] = False
    a.cycle_on_at[6] = 105.0
    rec = json.loads(json.dumps(sync_state(a, 100.0)))  # as the KV store carries it
    # the standby's clock differs: times arrive as seconds left
    b = standby.core
    v0 = b.persist_version
    changed = apply_sync_state(b, rec, 5000.0)
    assert set(changed) == {"persisted", "requested", "cap_overrides", "desired_powered"}
    assert b.budget_w == 120_000.0 and b.persist_version == v0 + 1
    assert b.requested["valvey"].power_w == 110_000.0
    assert b.requested["valvey"].until_mono == pytest.approx(5030.0)
    assert b.cap_overrides[3].until_mono == pytest.approx(5100.0)
    assert b.desired_powered[5] is False and b.cycle_on_at == {6: pytest.approx(5005.0)}
    assert apply_sync_state(b, rec, 5001.0) == []  # the same record again: nothing new
    assert b.persist_version == v0 + 1


@pytest.mark.parametrize("bad", [
    {"persisted": None},
    {"requested": {"valvey": {"user": "valvey", "power_w": float("nan"), "remaining_s": 5.0,
                              "reason": "x"}}},
    {"cap_overrides": {"99": {"user": "a", "power_w": 1.0, "remaining_s": 5.0, "reason": "x"}}},
    {"desired_powered": [True]},
    {"cycle_on_in_s": {"0": "soon"}},
])
def test_racky_sync_state_that_does_not_parse_changes_nothing(bad: dict[str, object]) -> None:
    active, standby = _tick(), _tick()
    active.core.set_budget(120_000.0)
    rec = {**json.loads(json.dumps(sync_state(active.core, 0.0))), **bad}
    before = standby.core.persisted.to_json()
    with pytest.raises(ValueError, match=r"persisted|requested|cap_overrides|desired_powered|"
                       r"cycle_on_in_s"):
        apply_sync_state(standby.core, rec, 0.0)
    assert standby.core.persisted.to_json() == before
    assert standby.core.requested == {} and standby.core.cap_overrides == {}


def test_racky_pair_config_refuses_a_lease_that_lets_the_caps_lapse_in_a_failover() -> None:
    RackyConfig.model_validate({"leadership": {"enabled": True}})  # the defaults: 38 s < 60 s
    # 20 s refresh + 36 + 2 + 1 = 59 s: accepted; 37 s: 60 s, not below the TTL
    RackyConfig.model_validate({"leadership": {"enabled": True, "lease_s": 36.0,
                                               "renew_deadline_s": 20.0}})
    with pytest.raises(pydantic.ValidationError, match="caps' ttl_s"):
        RackyConfig.model_validate({"leadership": {"enabled": True, "lease_s": 37.0,
                                                   "renew_deadline_s": 20.0}})
    # a single instance: no such relation
    RackyConfig.model_validate({"leadership": {"enabled": False, "lease_s": 37.0,
                                               "renew_deadline_s": 20.0}})


# --- racky's daemon as one of a pair (no servers: a stand-in lease) --------------------------


class _Lease:
    """Stands in for `rackplane.io.nats.lease.LeaseRunner`: holding ``epoch`` (0: not)."""

    owner = "b/test"
    renew_latency_s = None
    failures = 0
    acquisitions = 0

    def __init__(self) -> None:
        self.epoch = 0

    def may_write(self, now_mono: float) -> bool:
        return self.epoch > 0

    def status(self) -> LeadershipStatus:
        return LeadershipStatus(self.epoch > 0, self.epoch, 1.0 if self.epoch else 0.0,
                                None, None, None)


def test_racky_daemon_sends_only_while_active_and_each_tenure_resends_every_tray(
        tmp_path: Path) -> None:
    cfg = RackyConfig.model_validate({
        "lifecycle": {"state_file": str(tmp_path / "racky-state.json")},
        "spool": {"directory": str(tmp_path / "spool")},
        "leadership": {"enabled": True, "instance": "b"},
    })
    r = Racky(cfg, clock=FakeClock(start_mono=1000.0, start_wall_ns=WALL))
    lease = _Lease()
    r.lease_runner = lease  # type: ignore[assignment]
    assert r.pair_sync is not None
    r._update_role(1000.0)
    r._pair_epoch()
    assert (r.role, r.racky_tick.sending) == ("standby", False)
    r.core.last_sent = [DesiredTray()] * r.core.n_trays  # what the shadow "sent"
    lease.epoch = 4
    r.pair_sync.caught_up_epoch = 4
    r._update_role(1001.0)  # on_role_change: the tenure's epoch, everything forgotten
    assert (r.role, r.racky_tick.sending) == ("active", True)
    assert r.racky_tick.agent_epoch == PAIR_EPOCH_BASE + 4
    assert r.core.last_sent == [None] * r.core.n_trays
    assert r.pair_state()["agent_epoch"] == PAIR_EPOCH_BASE + 4
    r.core.last_sent = [DesiredTray()] * r.core.n_trays
    r._pair_epoch()  # the same tenure: nothing forgotten
    assert r.core.last_sent == [DesiredTray()] * r.core.n_trays
    lease.epoch = 0  # fenced
    r._update_role(1002.0)
    assert (r.role, r.racky_tick.sending, r.pair_state()["agent_epoch"]) == (
        "standby", False, 0)
    lease.epoch = 11  # a later tenure of the same instance
    r.pair_sync.caught_up_epoch = 11
    r._update_role(1003.0)
    assert r.racky_tick.agent_epoch == PAIR_EPOCH_BASE + 11
    assert r.core.last_sent == [None] * r.core.n_trays
