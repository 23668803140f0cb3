"""Property tests of rlc's allocation and budget leases (issue 16 item 3), with hypothesis.

Random sites (halls, rows, racks, floors, maxima, cooling, priorities, ramp limits) and random
demand. Single cycles: targets within every limit, floors, caps and priorities, max-min fair
within a class. Many cycles: deterministic, converging without oscillation under constant
demand. And a multi-step simulation of racks that read their leases late, are partitioned,
die and restart, with skewed clocks and acknowledgements that arrive late or never: the power
the racks' agents may let them draw (worst case: every rack at its enforced cap, every change
within a step taken in its worst order) stays within every row and hall limit at every step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlc.core.allocation import AllocationSettings, CycleInput, allocate
from rlc.core.leases import BudgetLease, LeaseTiming, RackLedger, rack_lease_valid
from rlc.core.topology import Topology, TopologySettings
from tests.unit.rlc_helpers import EPS_W, compiled, independent_cap, sums, topologies

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _demand(data: Any, topo: Topology, unknown: bool = True) -> np.ndarray:
    vals = []
    for _ in range(topo.n):
        choice = data.draw(st.integers(0, 9 if unknown else 7))
        if choice <= 7:
            vals.append(data.draw(st.floats(0.0, 150.0)))
        elif choice == 8:
            vals.append(math.nan)        # unknown: held
        else:
            vals.append(data.draw(st.sampled_from([-5.0, math.inf])))  # implausible: held
    return np.asarray(vals)


def _cooling(data: Any, topo: Topology) -> tuple[np.ndarray, dict[str, float]]:
    vals = np.full(topo.n, math.nan)
    measured = {}
    for i, k in enumerate(topo.rack_ids):
        if data.draw(st.booleans()):
            # may be below the floor, 0 (a capacity: the floor), or < 0 (implausible: none)
            v = data.draw(st.one_of(st.floats(0.0, 120.0), st.just(-1.0)))
            vals[i] = v
            measured[k] = v
    return vals, measured


@SETTINGS
@given(t=topologies(), data=st.data(), spread=st.booleans())
def test_one_cycle_limits_floors_caps_priorities(t: TopologySettings, data: Any,
                                                 spread: bool) -> None:
    topo = compiled(t)
    demand = _demand(data, topo)
    cooling, measured = _cooling(data, topo)
    caps = independent_cap(t, measured)
    # held racks keep a grant anywhere in [floor, max]: Σ may exceed a limit (the target cuts)
    grant = np.array([data.draw(st.floats(float(topo.floor_w[i]), float(topo.max_w[i])))
                      for i in range(topo.n)])
    a = allocate(topo, CycleInput(demand, grant, grant.copy(), 1.0, cooling),
                 AllocationSettings(spread_spare=spread))
    tgt = a.target_w
    rows, halls = sums(topo, tgt)
    assert np.all(rows <= topo.row_limit_w + EPS_W)
    assert np.all(halls <= topo.hall_limit_w + EPS_W)
    for i, k in enumerate(topo.rack_ids):
        f = float(topo.floor_w[i])
        assert f - EPS_W <= tgt[i] <= caps[k] + EPS_W, (k, tgt[i], f, caps[k])
        assert f - EPS_W <= a.grant_w[i] <= caps[k] + EPS_W
        cool = measured.get(k)
        if cool is not None and 0 <= cool < f:
            assert a.cooling_below_floor[i]
        held = not (math.isfinite(demand[i]) and demand[i] >= 0)
        assert a.held[i] == held
        if held:
            assert tgt[i] <= max(grant[i], f) + EPS_W       # never raised
    # priorities and max-min fairness: an unsatisfied rack's binding limit is full, and no
    # rack sharing it gets anything above its floor from a lower class, nor more extra from
    # its own class
    want = np.clip(np.where(a.held, grant, np.nan_to_num(demand, posinf=0.0)),
                   topo.floor_w, np.array([caps[k] for k in topo.rack_ids]))
    for i in range(topo.n):
        if a.held[i] or tgt[i] >= want[i] - 1e-6:
            continue
        r, h = topo.row_of[i], topo.hall_of[i]
        row_full = rows[r] >= topo.row_limit_w[r] - 1e-6
        assert row_full or halls[h] >= topo.hall_limit_w[h] - 1e-6
        share = (topo.row_of == r) if row_full else (topo.hall_of == h)
        extra_i = tgt[i] - topo.floor_w[i]
        for j in np.flatnonzero(share & ~a.held):
            if topo.rank[j] > topo.rank[i]:
                assert tgt[j] <= topo.floor_w[j] + 1e-6, (i, j)
            elif topo.rank[j] == topo.rank[i]:
                assert tgt[j] - topo.floor_w[j] <= extra_i + 1e-6, (i, j)
    if not spread:
        assert np.all((tgt <= want + EPS_W) | a.held)


@SETTINGS
@given(t=topologies(), data=st.data(), spread=st.booleans())
def test_constant_demand_is_deterministic_and_converges(t: TopologySettings, data: Any,
                                                        spread: bool) -> None:
    """Acks arrive every cycle (committed = grant): grants move monotonically to a constant
    target, never back, and reach it within the ramp's time; equal inputs, equal outputs."""
    topo = compiled(t)
    demand = _demand(data, topo)
    cfg = AllocationSettings(spread_spare=spread)
    g = topo.floor_w.copy()
    first_target = None
    ramp = topo.row_ramp_w_per_s
    span = np.bincount(topo.row_of, weights=topo.max_w - topo.floor_w)
    bound = int(np.max(np.where(np.isinf(ramp), 1.0, np.ceil(span / ramp)))) + 3
    prev_dir = np.zeros(topo.n)
    for _ in range(bound):
        inp = CycleInput(demand, g, g.copy(), 1.0)
        a = allocate(topo, inp, cfg)
        b = allocate(topo, inp, cfg)
        assert np.array_equal(a.grant_w, b.grant_w) and np.array_equal(a.target_w, b.target_w)
        if first_target is None:
            first_target = a.target_w
        assert np.allclose(a.target_w, first_target, atol=1e-9)
        step = a.grant_w - g
        # no oscillation: a rack never reverses direction, never overshoots its target
        assert np.all(step * prev_dir >= -1e-9)
        assert np.all(np.abs(a.grant_w - a.target_w) <= np.abs(g - a.target_w) + 1e-9)
        prev_dir = np.where(np.abs(step) > 1e-9, np.sign(step), prev_dir)
        g = a.grant_w
    assert np.allclose(g, first_target, atol=1e-6), (g, first_target)
    again = allocate(topo, CycleInput(demand, g, g.copy(), 1.0), cfg)
    assert np.allclose(again.grant_w, g, atol=1e-9)


# --- the multi-step simulation --------------------------------------------------------------

TIMING = LeaseTiming(ttl_s=4.0, clock_margin_s=3.0, agent_cap_ttl_s=8.0)
"""Sim time steps of 1 s: the margin covers the clocks' offsets (≤ 1 s each side) and a tick;
the agents' cap TTL covers racky's enforcement delay (≤ 2 s) and a tick, and is longer than a
lease, as on real racks (60 s vs 10 s): a racky that dies holding a lease leaves its agents
capped beyond the lease's expiry."""


SILENT_S = 3
"""Steps without a report before rlc holds a rack (the daemon's unreachable timeout)."""


@dataclass
class SimRack:
    """racky and its agents, as the worst case allows: they draw their enforced cap."""

    floor_w: float
    skew_s: float                      # racky's wall clock offset
    ack_delay: int                     # steps; -1: acks lost
    enforce_delay: int                 # steps for a decrease to be enforced at the trays
    read_lag: int                      # racky reads the KV this many steps late
    down: set[int] = field(default_factory=set)        # steps racky is dead
    cut: set[int] = field(default_factory=set)         # steps racky is cut off from NATS
    lease: BudgetLease | None = None
    received: float = 0.0
    enforced_w: float = 0.0
    pending: list[tuple[int, float]] = field(default_factory=list)   # (due step, value)
    last_refresh: int = 0
    acked_key: tuple[int, int] | None = None

    def step(self, t: int, kv: list[BudgetLease | None]) -> tuple[int, int] | None:
        """One second of racky: returns an ack key to send, or None."""
        for due, v in list(self.pending):
            if t >= due:                          # commands already sent still land
                self.enforced_w = min(self.enforced_w, v)
                self.pending.remove((due, v))
        if t in self.down:
            if t >= self.last_refresh + TIMING.agent_cap_ttl_s:
                self.enforced_w = self.floor_w    # agents drop to safe caps (Σ ≤ floor)
            return None
        if t not in self.cut and t - self.read_lag >= 0:
            seen = kv[t - self.read_lag]
            if seen is not None and (self.lease is None or seen.key > self.lease.key):
                self.lease, self.received = seen, float(t)
        valid = self.lease is not None and rack_lease_valid(
            self.lease, t + self.skew_s, self.received, float(t), TIMING)
        want = self.lease.value_w if valid and self.lease is not None else self.floor_w
        self.last_refresh = t
        if want > self.enforced_w:
            self.enforced_w = want                # raises: at once (worst case)
            self.pending = [(d, v) for d, v in self.pending if v >= want]
        elif want < self.enforced_w - 1e-12:
            self.pending.append((t + self.enforce_delay, want))
            if self.enforce_delay == 0:
                self.enforced_w = want
                self.pending.pop()
        if (t not in self.cut and valid and self.lease is not None and self.ack_delay >= 0
                and self.enforced_w <= self.lease.value_w + 1e-9
                and self.lease.key != self.acked_key):
            self.acked_key = self.lease.key
            return self.lease.key
        return None


def _schedule(data: Any, steps: int) -> set[int]:
    out: set[int] = set()
    for _ in range(data.draw(st.integers(0, 2))):
        a = data.draw(st.integers(0, steps - 1))
        out |= set(range(a, a + data.draw(st.integers(1, 15))))
    return out


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(t=topologies(max_halls=2, max_rows=2, max_racks=4), data=st.data(),
       spread=st.booleans(), rlc_skew=st.floats(-1.0, 1.0))
def test_simulation_never_exceeds_a_limit_at_any_step(t: TopologySettings, data: Any,
                                                      spread: bool, rlc_skew: float) -> None:
    topo = compiled(t)
    steps = 40
    cfg = AllocationSettings(spread_spare=spread)
    racks = [SimRack(float(topo.floor_w[i]), data.draw(st.floats(-1.0, 1.0)),
                     data.draw(st.sampled_from([0, 1, 3, -1])), data.draw(st.integers(0, 2)),
                     data.draw(st.integers(0, 1)), _schedule(data, steps),
                     _schedule(data, steps)) for i in range(topo.n)]
    for r in racks:
        r.enforced_w = r.floor_w
    ledgers = [RackLedger(k, float(topo.floor_w[i])) for i, k in enumerate(topo.rack_ids)]
    kv: list[list[BudgetLease | None]] = [[] for _ in range(topo.n)]
    inbox: list[tuple[int, int, tuple[int, int]]] = []      # (due step, rack, key)
    demand_now = _demand(data, topo, unknown=False)
    changes = {data.draw(st.integers(1, steps - 1)): _demand(data, topo, unknown=False)
               for _ in range(data.draw(st.integers(0, 8)))}
    # the dangerous moment: a rack's demand drops (rlc lowers it, others rise) just as it
    # dies or is cut off, so it never sees or acknowledges the lower lease
    drops: dict[int, list[int]] = {}
    for i, r in enumerate(racks):
        for start in sorted(x for x in r.down | r.cut if x - 1 not in r.down | r.cut):
            if data.draw(st.booleans()):
                drops.setdefault(start, []).append(i)
    prev_grant = topo.floor_w.copy()
    caps = np.array([independent_cap(t, {})[k] for k in topo.rack_ids])
    last_report = np.zeros(topo.n)
    for step in range(steps):
        now_wall, now_mono = step + rlc_skew, float(step)
        demand_now = changes.get(step, demand_now).copy()
        for i in drops.get(step, []):
            demand_now[i] = 0.0
            demand_now[topo.row_of == topo.row_of[i]] += np.where(
                np.arange(topo.n)[topo.row_of == topo.row_of[i]] == i, 0.0, 50.0)
        for due, i, key in [m for m in inbox if m[0] <= step]:
            ledgers[i].on_ack(*key)
            inbox.remove((due, i, key))
        for led in ledgers:
            led.release(now_wall, now_mono, TIMING)
        grant = np.array([led.grant_w for led in ledgers])
        committed = np.array([led.committed_w() for led in ledgers])
        # a rack is marked unreachable only after SILENT_S without a report: until then rlc
        # may lower a rack that is already dead or cut off (it learns of it late)
        demand = np.where(step - last_report <= SILENT_S, demand_now, math.nan)
        a = allocate(topo, CycleInput(demand, grant, committed, 1.0), cfg)
        # rlc's own account: Σ committed within every limit, grants within floor and ramp
        rows, halls = sums(topo, a.committed_w)
        assert np.all(rows <= topo.row_limit_w + EPS_W)
        assert np.all(halls <= topo.hall_limit_w + EPS_W)
        assert np.all(a.grant_w >= topo.floor_w - EPS_W)
        assert np.all(a.grant_w <= caps + EPS_W)
        rise = np.bincount(topo.row_of, weights=np.maximum(a.grant_w - prev_grant, 0.0),
                           minlength=len(topo.row_ids))
        assert np.all(rise <= topo.row_ramp_w_per_s * 1.0 + EPS_W)
        prev_grant = a.grant_w
        for i, led in enumerate(ledgers):
            kv[i].append(led.issue(float(a.grant_w[i]), 1, now_wall, now_mono, TIMING))
            assert led.committed_w() >= a.grant_w[i] - EPS_W
        # the racks: their worst-case draw through the step (each change in its worst order)
        before = np.array([r.enforced_w for r in racks])
        for i, r in enumerate(racks):
            ack = r.step(step, kv[i])
            if ack is not None and r.ack_delay >= 0:
                inbox.append((step + max(r.ack_delay, 1), i, ack))
            if step not in r.down and step not in r.cut:
                last_report[i] = step
        after = np.array([r.enforced_w for r in racks])
        worst = np.maximum(before, after)
        rows, halls = sums(topo, worst)
        assert np.all(rows <= topo.row_limit_w + EPS_W), (step, rows, topo.row_limit_w)
        assert np.all(halls <= topo.hall_limit_w + EPS_W), (step, halls, topo.hall_limit_w)
