"""The lock-step harness runs the daemon's own tick (issue 13): a fault injected into
`racky.tick.RackyTick.step` (the method `racky.app.Racky._tick` calls) or into the core method
it calls shows up in the lock-step figures, and the harness feeds the tick only through the
daemon's input paths (Modbus samples, MQTT messages)."""

from __future__ import annotations

from typing import Any

import pytest

from harness.lockstep_racky import S2_BUDGET_W, default_config, run_racky
from racky.core.controller import RackyCore
from racky.tick import RackyTick, TickEffects

DURATION_S = 40.0


def _s2(**kw: Any) -> Any:
    cfg = default_config(budget_w=S2_BUDGET_W / 2)
    return run_racky("training-swings", cfg, duration_s=DURATION_S, plant_dt_s=0.5, **kw)


def _peak_w(r: Any) -> float:
    return max(p for p in r.trace["rack_power_w"][5:] if p is not None)


def test_a_fault_in_the_daemons_tick_changes_the_lockstep_figures(
        monkeypatch: pytest.MonkeyPatch) -> None:
    healthy = _s2()
    assert healthy.commands, "the budget must make racky cap the trays"
    assert _peak_w(healthy) <= S2_BUDGET_W / 2 * 1.1

    real_step = RackyTick.step

    def lose_agent_commands(self: RackyTick, now_mono: float, wall_ns: int,
                            extra_alarms: Any = None) -> TickEffects:
        eff = real_step(self, now_mono, wall_ns, extra_alarms)
        eff.agent_commands.clear()  # the fault: the tick's commands never go out
        return eff

    monkeypatch.setattr(RackyTick, "step", lose_agent_commands)
    broken = _s2()
    assert broken.commands == []
    assert _peak_w(broken) > S2_BUDGET_W / 2 * 1.2  # the caps never reached the agents


def test_a_fault_in_the_core_step_the_tick_calls_changes_the_figures(
        monkeypatch: pytest.MonkeyPatch) -> None:
    healthy = _s2()
    real = RackyCore.step

    def no_budget(self: RackyCore, now: float, inp: Any, wall_ns: int = 0) -> Any:
        self.persisted.budget_set, self.persisted.budget_w = True, None  # budget forgotten
        return real(self, now, inp, wall_ns)

    monkeypatch.setattr(RackyCore, "step", no_budget)
    broken = _s2()
    assert [s for s in healthy.trace["limit_source"] if s == "budget"]
    assert "budget" not in broken.trace["limit_source"]
    assert _peak_w(broken) > _peak_w(healthy) * 1.2


def test_the_harness_feeds_the_tick_only_through_the_daemons_inputs() -> None:
    seen: dict[str, int] = {"shelf": 0, "tray": 0, "cooling": 0, "plant": 0, "reply": 0}

    class Counting(RackyTick):
        def shelf_samples(self, device: str, samples: Any) -> None:
            seen["shelf"] += 1
            super().shelf_samples(device, samples)

        def message(self, topic: str, payload: bytes, **kw: Any) -> None:
            assert isinstance(payload, bytes)
            kind = ("tray" if "/telemetry/tray" in topic else "reply" if topic.endswith(
                "/result") else "cooling" if "/state/" in topic else "plant")
            seen[kind] += 1
            super().message(topic, payload, **kw)

    r = run_racky("training-swings", default_config(budget_w=S2_BUDGET_W / 2),
                  duration_s=5.0, plant_dt_s=0.5,
                  tick_factory=lambda cfg, core: Counting(cfg, core, 0.0))
    ticks = len(r.trace["t_s"])
    assert seen["shelf"] == 8 * ticks and seen["tray"] == 18 * ticks
    assert seen["cooling"] == ticks and seen["plant"] == ticks
    assert seen["reply"] == len(r.commands) > 0


def test_the_lockstep_agents_answer_with_the_contracts_reply_state(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The harness's node agents reply as the simulator's do (contract 1.3 reply state): racky
    keeps every ok reply's per-GPU read-back, none unreadable, none in an older layout."""
    ticks: list[RackyTick] = []
    real = RackyTick.agent_reply

    def spy(self: RackyTick, topic: str, payload: bytes) -> None:
        ticks.append(self)
        real(self, topic, payload)

    monkeypatch.setattr(RackyTick, "agent_reply", spy)
    r = _s2()
    assert r.commands and ticks
    s = ticks[-1].agent_stats
    assert s["ok"] > 0 and s["bad_reply_state"] == s["legacy_replies"] == 0, s
    rb = ticks[-1].agent_readback
    assert rb and all(len(x.enforced_gpu_w[k]) == 4 for k, x in rb.items())
