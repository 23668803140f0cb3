"""racky sends a tray at most one agent command at a time (`RackyInputs.awaiting`): a tray
whose last command is unanswered keeps its last-sent settings and gets the newest desired
ones once the reply (or the reply timeout) is in. A demo agent serving 18 trays, each
command after its read-back, was sent 61 caps in 4 s and answered them 20 s late, long
enough for racky's own cap_drift alarm to fire."""

from __future__ import annotations

from rackplane.settings import Identity
from racky.config import RackyConfig
from racky.core.controller import RackyCore, RackyInputs
from racky.core.lifecycle import Lifecycle, PersistedState
from racky.core.telemetry import TelemetryIngest
from sims.scenario import FabricSpec, ScenarioRun, load_scenario
from sims.telemetry import tray_payloads

WALL0 = 1_767_225_600 * 10**9


def _rig(budget_w: float) -> tuple[RackyCore, TelemetryIngest, ScenarioRun]:
    cfg = RackyConfig.model_validate({"power": {"budget_w": budget_w}})
    a = cfg.node_agents
    ing = TelemetryIngest(a.trays, a.gpus_per_tray, tuple(cfg.links.counters))
    core = RackyCore(cfg, 0.0, PersistedState(Lifecycle("production")))
    sc = load_scenario("load-step-short").model_copy(
        update={"fabric": FabricSpec(enabled="off")})
    return core, ing, ScenarioRun(sc, model="rack")


def _step(core: RackyCore, ing: TelemetryIngest, run: ScenarioRun, s: int,
          awaiting: frozenset[int] = frozenset()) -> list[tuple[tuple[int, ...], str]]:
    run.step(1.0)
    assert run.rack is not None
    for _, p in tray_payloads(run.rack, Identity(), WALL0 + s * 10**9):
        ing.tray_payload(p, float(s))
    out = core.step(float(s), RackyInputs({}, dict(ing.trays), None, None, awaiting), s)
    return [(c.trays, c.reason) for c in out.commands]


def test_a_tray_with_a_command_in_flight_is_sent_nothing_new_until_it_is_answered() -> None:
    core, ing, run = _rig(budget_w=30_000.0)  # far below the load: every tray capped
    first = _step(core, ing, run, 1)
    assert {k for trays, _ in first for k in trays} == set(range(18)), first
    sent0 = list(core.last_sent)
    held = frozenset({3, 7})
    for s in range(2, 8):  # an operator's node cap on 3, 7 and 10; 3 and 7 still awaited
        if s == 3:
            core.set_tray_cap_override([3, 7, 10], 1300.0, 100.0, "test", "op1", float(s))
        cmds = _step(core, ing, run, s, held)
        if s == 3:  # the tray not awaited gets its new cap at once
            assert ((10,), "cap loop") in cmds, cmds
        assert not any(k in held for trays, _ in cmds for k in trays), (s, cmds)
        assert core.deferred_trays == [3, 7]
        assert core.last_sent[3] == sent0[3] and core.last_sent[7] == sent0[7]
    # answered: the next step sends them the newest desired settings
    cmds = _step(core, ing, run, 8)
    assert core.last is not None and core.deferred_trays == []
    desired = core.desired(core.last.caps_w)
    assert all(core.last_sent[k] == desired[k] for k in held)
    moved = [k for k in held if desired[k] != sent0[k]]
    assert moved, "the caps moved while the trays were awaited (else this test shows nothing)"
    assert set(moved) <= {k for trays, _ in cmds for k in trays}, cmds


def test_an_expired_command_no_longer_holds_its_tray() -> None:
    """`RackyTick.awaiting_trays` is what `_expire_pending` left: a command older than the
    reply timeout is counted lost and its trays are sent to again."""
    from racky.tick import RackyTick

    cfg = RackyConfig()
    core = RackyCore(cfg, 0.0, PersistedState(Lifecycle("production")))
    tick = RackyTick(cfg, core, 0.0)
    tick.pending["r1"] = ((3, 7), 10.0)
    tick.pending["r2"] = ((5,), 14.0)
    assert tick.awaiting_trays() == {3, 5, 7}
    tick._expire_pending(10.0 + cfg.node_agents.reply_timeout_s + 0.1)
    assert tick.awaiting_trays() == {5} and tick.agent_stats["lost"] == 1
