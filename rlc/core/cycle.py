"""rlc's fleet state between KV reads and writes, and one allocation cycle over it (pure).

The daemon (`rlc.app`) reads the KV store and writes it; this class decides. No I/O, no
clock: every time is an argument (``now_wall_s`` Unix s of rlc's host, ``now_mono_s`` its
monotonic clock).

- **Reports** (`on_report`): each rack's `rackplane.core.budget_leases.RackReport` from its
  rack key, with the monotonic time its revision last changed. A rack whose report has not
  changed for ``unreachable_after_s`` (or never came) is **unreachable**: its demand is unknown
  and the allocator holds its grant (never raised; `rlc.core.allocation`). Unreachable for
  ``reclaim_after_s``, its want becomes its floor (and it gets no spare: never raised while
  silent): its grant falls to the floor, and its old grant stays committed until it
  acknowledges or that lease's expiry + clock margin + the agents' cap TTL has passed
  (`rlc.core.leases`): by then it has fallen to its floor by itself.
  Unreachable racks are marked, never removed.
- **Ledgers** are only ever built from the store (`restore`, with the revision of each budget
  key): a new tenure (`cycle` with an epoch other than the one restored) gets none until the
  daemon has read every budget key again; a write refused or of unknown outcome (`write_failed`)
  drops that rack's ledger until it is read again (`needs_restore`). While any ledger is
  missing no cycle runs (allocation needs every rack's committed power).
- **A cycle** (`cycle`): acknowledgements taken, released grants dropped, one
  `rlc.core.allocation.allocate`, and a lease issued for every rack whose grant changed by at
  least ``write_deadband_w`` or whose lease is due for renewal (``ttl_s / 3`` old; write on
  change, renew at ttl/3). Returns the writes: (rack, record, revision to compare-and-set on).

- **Cooling** (`cooling_w`): each rack's reported cooling capacity (`RackReport.cooling_w`:
  valvey's measurement through racky, AC W) is used while the rack is reachable and the figure
  plausible (finite, 0 ≤ x ≤ ``cooling_max_w``); the allocator caps the rack at the lower of
  it and the configured ``cooling_capacity_w`` (`rlc.core.allocation.rack_cap_w`): a report
  never raises a rack past its configured bound. Once the report is stale (rack unreachable),
  unknown (None: an older racky, valvey not measured) or implausible, the last good figure is
  **held** for ``cooling_hold_s`` (a capacity just measured low is not forgotten on a glitch:
  the safe direction), then dropped: the configured figure alone applies, or none. Source
  per rack in ``state/fleet`` (``cooling_source``: reported / held / configured / none).

- **Cross-checks** (`mismatches`): what racky reports of its own config against the topology's
  figure for that rack: its ``floor_w`` (above the topology's: a rack whose lease runs out
  falls to more than rlc counts for it, and its row may pass its limit; below: inconsistent,
  harmless) and ``agents_safe_w`` (Σ of its agents' stated safe caps, above the topology's
  floor: once racky is silent past the agents' cap TTL the rack draws more than its floor).
  The two figures live in files on different hosts; they meet only here. Shown per rack in
  ``state/fleet`` (``mismatch``) and logged by the daemon; the allocation is unchanged (the
  topology is the allocator's truth, and an operator must fix the file that is wrong).

Errors: none raised for bad records (a report that does not decode is counted in
``bad_records`` and ignored; a budget record that does not decode restores as no lease, which
is safe only because such a record was never written by rlc: counted too).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rackplane.core.budget_leases import RackReport
from rlc.core.allocation import Allocation, AllocationSettings, CycleInput, allocate
from rlc.core.leases import LeaseTiming, RackLedger
from rlc.core.topology import Topology

__all__ = ["FLOOR_TOLERANCE_W", "BudgetWrite", "FleetState", "RackSeen"]

FLOOR_TOLERANCE_W = 1.0
"""A reported floor within this of the topology's agrees with it, W."""


@dataclass(frozen=True, slots=True)
class BudgetWrite:
    """One budget key write: ``record`` (JSON bytes), compare-and-set on ``last_revision``
    (None: create, the key is absent)."""

    rack: str
    record: bytes
    last_revision: int | None
    value_w: float
    seq: int


@dataclass
class RackSeen:
    """A rack's newest report, its revision and when that revision was first seen (mono s)."""

    report: RackReport | None = None
    revision: int | None = None
    changed_mono_s: float | None = None


@dataclass
class FleetState:
    """The fleet as the leader sees it (module docstring).

    Args:
        topo: the compiled topology; timing: lease life and re-grant margins;
        settings: allocation settings; unreachable_after_s / reclaim_after_s: s (reclaim ≥
        unreachable); write_deadband_w: a grant change smaller than this is not written
        (W; the ledger keeps the written one, so Σ committed stays exact); cooling_max_w: a
        reported cooling capacity above this is implausible (W); cooling_hold_s: the last
        plausible one is held this long once the report is stale, unknown or implausible (s)
        (module docstring: Cooling).
    """

    topo: Topology
    timing: LeaseTiming
    settings: AllocationSettings
    unreachable_after_s: float
    reclaim_after_s: float
    write_deadband_w: float
    seen: dict[str, RackSeen] = field(default_factory=dict)
    ledgers: dict[str, RackLedger] = field(default_factory=dict)
    revisions: dict[str, int | None] = field(default_factory=dict)
    epoch: int | None = None
    last_cycle_mono_s: float | None = None
    bad_records: int = 0
    last: Allocation | None = None
    started_mono_s: float | None = None
    cooling_max_w: float = 1_000_000.0
    cooling_hold_s: float = 300.0
    cooling_known: dict[str, tuple[float, float]] = field(default_factory=dict)
    """rack -> (the last plausible reported cooling capacity W, mono s it was last seen)."""
    cooling_implausible: int = 0
    """Cycles in which a reachable rack reported a cooling capacity outside the window."""
    last_cooling: tuple[np.ndarray, list[str]] | None = None
    """The last cycle's `cooling_w` (for ``state/fleet``)."""

    def __post_init__(self) -> None:
        for r in self.topo.rack_ids:
            self.seen[r] = RackSeen()

    # --- reading --------------------------------------------------------------------------

    def on_report(self, rack: str, got: tuple[int, bytes] | None, now_mono_s: float,
                  now_wall_s: float | None = None) -> None:
        """The rack key's read: (revision, value) or None (absent). A report seen for the
        first time (this process just started) is dated by its ``at_s`` against
        ``now_wall_s`` when given, beyond the clock margin: an old report left by a dead
        racky does not make its rack reachable."""
        s = self.seen.get(rack)
        if s is None or got is None:
            return
        rev, value = got
        if rev == s.revision:
            return
        first = s.revision is None
        s.revision = rev
        s.changed_mono_s = now_mono_s
        try:
            s.report = RackReport.from_record(json.loads(value))
        except (ValueError, TypeError):
            self.bad_records += 1
            s.report = None
            return
        if first and now_wall_s is not None:
            age = now_wall_s - s.report.at_s - self.timing.clock_margin_s
            if age > 0:
                s.changed_mono_s = now_mono_s - age

    def needs_restore(self) -> list[str]:
        """Racks whose ledger must be read from the store before the next cycle."""
        return [r for r in self.topo.rack_ids if r not in self.ledgers]

    def forget(self) -> None:
        """Not the leader (or a new tenure): drop every ledger (never reused from memory)."""
        self.ledgers.clear()
        self.revisions.clear()
        self.epoch = None
        self.last_cycle_mono_s = None

    def restore(self, epoch: int, records: Mapping[str, tuple[int, bytes] | None],
                now_mono_s: float) -> None:
        """Ledgers from the budget keys as read now (rack -> (revision, value) or None)."""
        if self.epoch != epoch:
            self.forget()
            self.epoch = epoch
        for rack, got in records.items():
            i = self.topo.index(rack)
            floor = float(self.topo.floor_w[i])
            if got is None:
                self.ledgers[rack] = RackLedger(rack, floor)
                self.revisions[rack] = None
                continue
            rev, value = got
            try:
                d = json.loads(value)
                led = RackLedger.restore(d["ledger"], floor, now_mono_s)
            except (ValueError, TypeError, KeyError):
                self.bad_records += 1
                led = RackLedger(rack, floor)
            self.ledgers[rack] = led
            self.revisions[rack] = rev

    def write_done(self, rack: str, revision: int) -> None:
        """A budget write landed with ``revision``."""
        self.revisions[rack] = revision

    def write_failed(self, rack: str) -> None:
        """Refused or unknown: the rack's ledger is read again before the next cycle."""
        self.ledgers.pop(rack, None)
        self.revisions.pop(rack, None)

    # --- the cycle ------------------------------------------------------------------------

    def unreachable(self, now_mono_s: float) -> np.ndarray:
        """(n,) bool: racks without a report change for ``unreachable_after_s``."""
        return self._silent_for(now_mono_s) >= self.unreachable_after_s

    def _silent_for(self, now_mono_s: float) -> np.ndarray:
        start = self.started_mono_s if self.started_mono_s is not None else now_mono_s
        out = np.empty(self.topo.n)
        for i, r in enumerate(self.topo.rack_ids):
            s = self.seen[r]
            since = s.changed_mono_s if s.changed_mono_s is not None else start
            out[i] = now_mono_s - since
        return out

    def demand_w(self, now_mono_s: float) -> np.ndarray:
        """(n,) W for the allocator: NaN (held) when unreachable or unknown, the floor when
        unreachable for ``reclaim_after_s``."""
        silent = self._silent_for(now_mono_s)
        out = np.full(self.topo.n, math.nan)
        for i, r in enumerate(self.topo.rack_ids):
            rep = self.seen[r].report
            if silent[i] >= self.reclaim_after_s:
                out[i] = float(self.topo.floor_w[i])
            elif silent[i] < self.unreachable_after_s and rep is not None \
                    and rep.demand_w is not None:
                out[i] = rep.demand_w
        return out

    def cooling_w(self, now_mono_s: float) -> tuple[np.ndarray, list[str]]:
        """((n,) W reported cooling capacity for the allocator, NaN: none; source per rack:
        ``reported``, ``held``, ``configured`` or ``none``) (module docstring: Cooling)."""
        reachable = ~self.unreachable(now_mono_s)
        out = np.full(self.topo.n, math.nan)
        src: list[str] = []
        for i, r in enumerate(self.topo.rack_ids):
            rep = self.seen[r].report
            x = None if rep is None or not reachable[i] else rep.cooling_w
            if x is not None:
                if math.isfinite(x) and 0.0 <= x <= self.cooling_max_w:
                    self.cooling_known[r] = (x, now_mono_s)
                else:
                    self.cooling_implausible += 1
            known = self.cooling_known.get(r)
            if known is not None and now_mono_s - known[1] > self.cooling_hold_s:
                del self.cooling_known[r]
                known = None
            if known is not None:
                out[i] = known[0]
                src.append("reported" if known[1] == now_mono_s else "held")
            else:
                src.append("none" if math.isnan(self.topo.cooling_w[i]) else "configured")
        return out, src

    def cycle(self, epoch: int, now_wall_s: float, now_mono_s: float,
              reserve_w: Mapping[str, tuple[float, bool]] | None = None
              ) -> list[BudgetWrite]:
        """One cycle as leader of ``epoch`` (module docstring). ``reserve_w``: rack -> (its
        campaign stage's draw, W; whether the stage only waits for power) while it validates
        or waits (`rlc.core.allocation`). Returns [] while a ledger is missing or the ledgers
        were restored for another epoch."""
        if self.started_mono_s is None:
            self.started_mono_s = now_mono_s
        if self.epoch != epoch or self.needs_restore():
            return []
        topo, timing = self.topo, self.timing
        leds = [self.ledgers[r] for r in topo.rack_ids]
        for r, led in zip(topo.rack_ids, leds, strict=True):
            rep = self.seen[r].report
            if rep is not None and rep.acked is not None:
                led.on_ack(*rep.acked)
            led.release(now_wall_s, now_mono_s, timing)
        dt = 0.0 if self.last_cycle_mono_s is None else now_mono_s - self.last_cycle_mono_s
        self.last_cycle_mono_s = now_mono_s
        grant = np.fromiter((led.grant_w for led in leds), float, topo.n)
        committed = np.fromiter((led.committed_w() for led in leds), float, topo.n)
        reserve = waiting = None
        if reserve_w:
            got = [reserve_w.get(r, (math.nan, False)) for r in topo.rack_ids]
            reserve = np.array([w for w, _ in got], float)
            waiting = np.array([wt for _, wt in got], bool)
        reclaimed = self._silent_for(now_mono_s) >= self.reclaim_after_s
        cooling, _ = self.last_cooling = self.cooling_w(now_mono_s)
        a = allocate(topo, CycleInput(self.demand_w(now_mono_s), grant, committed, max(dt, 0.0),
                                      cooling_w=cooling, reserve_w=reserve,
                                      reserve_waiting=waiting, reclaimed=reclaimed),
                     self.settings)
        self.last = a
        writes: list[BudgetWrite] = []
        renew_age = timing.ttl_s / 3.0
        for r, led, v in zip(topo.rack_ids, leds, a.grant_w.tolist(), strict=True):
            cur = led.current
            if cur is not None and cur.epoch > epoch:
                continue  # a newer leader wrote it: never write under an older epoch
            changed = cur is None or abs(v - cur.value_w) >= self.write_deadband_w
            if not (changed or (cur is not None and now_wall_s - cur.issued_at_s >= renew_age)):
                continue
            value = v if changed or cur is None else cur.value_w
            lease = led.issue(value, epoch, now_wall_s, now_mono_s, timing)
            rec = {"lease": lease.as_record(), "ledger": led.as_record()}
            writes.append(BudgetWrite(r, json.dumps(rec, separators=(",", ":")).encode(),
                                      self.revisions.get(r), lease.value_w, lease.seq))
        return writes

    def mismatches(self) -> dict[str, list[str]]:
        """rack → what its latest report contradicts in the topology (module docstring),
        for the racks with anything: ``floor_above`` / ``floor_below`` (its ``floor_w`` vs the
        topology's), ``agents_safe_above_floor`` (its ``agents_safe_w`` > the topology's
        floor)."""
        out: dict[str, list[str]] = {}
        for i, r in enumerate(self.topo.rack_ids):
            rep = self.seen[r].report
            if rep is None:
                continue
            floor = float(self.topo.floor_w[i])
            got = []
            if rep.floor_w > floor + FLOOR_TOLERANCE_W:
                got.append("floor_above")
            elif rep.floor_w < floor - FLOOR_TOLERANCE_W:
                got.append("floor_below")
            if rep.agents_safe_w is not None and rep.agents_safe_w > floor:
                got.append("agents_safe_above_floor")
            if got:
                out[r] = got
        return out

    def summary(self, now_mono_s: float) -> dict[str, Any]:
        """Per row: limit, Σ grants, Σ committed, unreachable racks (W) for ``state/fleet``."""
        topo = self.topo
        unr = self.unreachable(now_mono_s)
        mism = self.mismatches()
        cool, cool_src = self.last_cooling or (np.full(topo.n, math.nan), [
            "none" if math.isnan(c) else "configured" for c in topo.cooling_w.tolist()])
        below = None if self.last is None else self.last.cooling_below_floor
        rows: dict[str, Any] = {}
        for j, row in enumerate(topo.row_ids):
            idx = [i for i in range(topo.n) if int(topo.row_of[i]) == j]
            racks = {}
            for i in idx:
                r = topo.rack_ids[i]
                led = self.ledgers.get(r)
                rep = self.seen[r].report
                racks[r] = {"grant_w": None if led is None or led.current is None
                            else led.current.value_w,
                            "committed_w": None if led is None else led.committed_w(),
                            "seq": None if led is None else led.last_seq,
                            "acked": None if led is None or led.acked is None
                            else list(led.acked),
                            "demand_w": None if rep is None else rep.demand_w,
                            "floor_w": float(topo.floor_w[i]),
                            "reported_floor_w": None if rep is None else rep.floor_w,
                            "agents_safe_w": None if rep is None else rep.agents_safe_w,
                            "reported_cooling_w": None if rep is None else rep.cooling_w,
                            "cooling_w": _cooling_used(float(cool[i]),
                                                       float(topo.cooling_w[i])),
                            "cooling_source": cool_src[i],
                            "cooling_below_floor": below is not None and bool(below[i]),
                            "mismatch": mism.get(r, []),
                            "unreachable": bool(unr[i])}
            comm = [led.committed_w() for r in (topo.rack_ids[i] for i in idx)
                    if (led := self.ledgers.get(r)) is not None]
            rows[row] = {"limit_w": float(topo.row_limit_w[j]),
                         "committed_w": math.fsum(comm) if len(comm) == len(idx) else None,
                         "racks": racks}
        return {"epoch": self.epoch, "rows": rows, "bad_records": self.bad_records,
                "cooling_implausible": self.cooling_implausible}


def _cooling_used(reported_w: float, configured_w: float) -> float | None:
    """The cooling capacity the allocator applies (W; the lower of both known; None: no
    limit)."""
    known = [x for x in (reported_w, configured_w) if not math.isnan(x)]
    return min(known) if known else None
