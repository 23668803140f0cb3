"""racky's fleet side on the simulated rack in lock-step (issue 16 item 2): the real racky tick
and core under a `BudgetFollower` fed leases as racky's ``fleet`` task would, on the plant of
S1-short (30 % → 100 % load at 10 s).

- a lease decrease (120 → 70 kW) is applied at once and acknowledged once the agents' enforced
  caps read back within it (`racky.fleet.rack_figures`, converted to AC input by the learned
  input/output ratio, `racky.core.budget.FleetSide`), within 2 s (the issue's target); from
  the acknowledgement on, the shelves' AC input power (what the row's breaker sees; the
  plant's truth) stays within the lease at every plant step;
- leases stop coming (partition, rlc down): at the last lease's expiry racky falls to its
  floor by itself, and the plant's AC input follows.

Figures are printed (``-s``).
"""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from harness.lockstep_racky import WALL0_NS, run_racky
from rackplane.core.budget_leases import BudgetLease
from racky.config import RackyConfig
from racky.core.budget import BudgetFollower, FleetSide, InputRatio
from racky.core.controller import RackyCore
from racky.fleet import FleetLink, rack_figures
from sims.scenario import ScenarioRun, load_scenario

FLOOR_W = 40_000.0
TTL_S = 10.0
DECREASE_AT_S, LAST_LEASE_AT_S = 30.0, 45.0
HIGH_W, LOW_W = 120_000.0, 70_000.0


def test_lease_decrease_enforced_and_acked_then_floor_on_expiry() -> None:
    cfg = RackyConfig.model_validate({"fleet": {"enabled": True, "floor_w": FLOOR_W,
                                                "agent_safe_gpu_cap_w": 200.0}})
    f = BudgetFollower("rack1", FLOOR_W, 1.0)
    side = FleetSide(f, InputRatio(cfg.fleet.input_ratio_fallback))
    wall0 = WALL0_NS / 1e9
    seq = 0
    acks: dict[tuple[int, int], float] = {}
    issued: dict[tuple[int, int], float] = {}

    def hook(now: float, run: ScenarioRun, core: RackyCore) -> None:
        nonlocal seq
        wall = wall0 + now
        if now <= LAST_LEASE_AT_S and (seq == 0 or now % 3.0 == 0.0 or now == DECREASE_AT_S):
            seq += 1
            value = HIGH_W if now < DECREASE_AT_S else LOW_W
            lease = BudgetLease("rack1", value, wall, wall + TTL_S, 1, seq)
            f.offer(lease, now)
            issued[lease.key] = now
        drawable, demand = rack_figures(core)
        view = core.last.shelves if core.last is not None else None
        if side.observe(drawable, demand, None if view is None else view.rack_input_w,
                        None if view is None else view.rack_power_w, wall, now):
            assert f.acked is not None
            acks[f.acked] = now
        core.fleet_budget_w = side.dc_budget_w(wall, now)

    r = run_racky(load_scenario("load-step-short"), cfg, duration_s=70.0, plant_dt_s=0.5,
                  fine_trace=True, hook=hook)
    dec_key = next(k for k, t in issued.items() if t == DECREASE_AT_S)
    assert dec_key in acks, f"the decrease was never acknowledged: {acks}"
    ack_s = acks[dec_key] - DECREASE_AT_S
    fine = r.fine
    t, dc, ac = fine["t_s"], fine["rack_power_w"], fine["rack_input_w"]
    before = [p for x, p in zip(t, dc, strict=True) if DECREASE_AT_S - 5 <= x < DECREASE_AT_S]
    after = [(x, p, a) for x, p, a in zip(t, dc, ac, strict=True)
             if acks[dec_key] <= x < LAST_LEASE_AT_S + TTL_S]
    expiry = LAST_LEASE_AT_S + TTL_S
    floor = [(x, p, a) for x, p, a in zip(t, dc, ac, strict=True) if x >= expiry + 3.0]
    floor_ack = next((tt for k, tt in acks.items() if tt >= expiry), math.nan)
    print(f"\n[racky fleet lockstep] before the decrease {max(before):.0f} W; lease "
          f"{LOW_W:.0f} W acked {ack_s:.1f} s after it (target <= 2 s); after the ack max DC "
          f"{max(p for _, p, _ in after):.0f} W, AC input {max(a for _, _, a in after):.0f} W; "
          f"leases stop, expiry at {expiry:.0f} s: from {expiry + 3:.0f} s max DC "
          f"{max(p for _, p, _ in floor):.0f} W, AC {max(a for _, _, a in floor):.0f} W "
          f"(floor {FLOOR_W:.0f} W); floor acked {floor_ack - expiry:.1f} s after expiry")
    assert max(before) > LOW_W                       # the decrease had something to cut
    assert 0.0 < ack_s <= 2.0
    assert max(a for _, _, a in after) <= LOW_W
    assert max(a for _, _, a in floor) <= FLOOR_W
    print(f"[racky fleet lockstep] learned input/output ratio {side.ratio.value(70.0):.4f} "
          f"(fallback {cfg.fleet.input_ratio_fallback})")


def _lease_record(value_w: float, now: float, seq: int) -> bytes:
    wall = WALL0_NS / 1e9 + now
    lease = BudgetLease("rack1", value_w, wall, wall + TTL_S, 1, seq)
    return json.dumps({"lease": lease.as_record()}).encode()


def test_a_decrease_wakes_the_tick_and_is_acked_at_the_read_back() -> None:
    """racky's fleet link as the daemon wires it (`racky.app.Racky`), its ``wake_tick`` as the
    daemon frame's: a decrease arriving between ticks runs the tick at once (caps within the
    lease sent in the same plant step), and the acknowledgement comes with the first agents'
    telemetry reading the lowered caps back (every 0.5 s, between ticks), not at a later
    tick. Old racky: applied at its next tick, acked a tick later still."""
    cfg = RackyConfig.model_validate({"fleet": {"enabled": True, "floor_w": FLOOR_W,
                                                "agent_safe_gpu_cap_w": 200.0}})
    link = FleetLink(cfg.fleet, "lab", "rack1")
    issued_at = 30.3  # a plant step between ticks
    agents_s, plant_dt = 0.5, 0.1
    seq = [0]

    def between(now: float, run: ScenarioRun, core: RackyCore) -> None:
        if now < issued_at - 1e-6 and (seq[0] == 0 or abs(now % 3.0) < 1e-6):  # renewals
            seq[0] += 1
            link.take(_lease_record(HIGH_W, now, seq[0]))
        if abs(now - issued_at) < 1e-6:
            seq[0] += 1
            link.take(_lease_record(LOW_W, now, seq[0]))

    r = run_racky(load_scenario("load-step-short"), cfg, duration_s=36.0, plant_dt_s=plant_dt,
                  between=between, fleet=link, agents_every_s=agents_s)
    dec_key = (1, seq[0])
    woke = [t for p, t in itertools.pairwise(r.ticks)
            if t - p < cfg.control.tick_s - 1e-6 and t > issued_at - 1e-6]
    cmds = [(t, c) for t, _, c, _ in r.commands if abs(t - issued_at) < 1e-6]
    ack_t = next(t for t, k in r.fleet_acks if k == dec_key)
    readback_t = next(t for t in np.arange(agents_s, 40.0, agents_s) if t > issued_at + 1e-6)
    print(f"\n[racky fleet wake] lease {HIGH_W:.0f} -> {LOW_W:.0f} W at {issued_at} s: ticks "
          f"run early at {woke}; {len(cmds)} cap commands at the lease's plant step; acked "
          f"at {ack_t:.1f} s ({ack_t - issued_at:.2f} s after the lease; agents' telemetry "
          f"every {agents_s} s, first after it at {readback_t:.1f} s)")
    assert woke and woke[0] == pytest.approx(issued_at)  # the tick ran at once, not at 31 s
    assert cmds, "no caps sent at the lease's plant step"
    # acknowledged with the first read-back after the caps, not before it, not a tick later
    assert ack_t == pytest.approx(readback_t)
    assert ack_t - issued_at < cfg.control.tick_s
    # then the schedule goes on a tick after the last early one; a few early ticks only
    later = [t for t in r.ticks if t > ack_t + 1e-6]
    assert later[0] == pytest.approx(ack_t + cfg.control.tick_s)
    assert len(woke) <= 3, woke
    assert not [t for t, k in r.fleet_acks if k > dec_key]
