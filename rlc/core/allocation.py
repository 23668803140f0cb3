"""One allocation cycle of row and hall power among racks (issue 16 items 2-3, pure).

`allocate(topology, cycle_input, settings)` → `Allocation`. No clock, no I/O: the caller gives
the time since the previous cycle (``dt_s``, its monotonic clock) for the ramp limit.

**Inputs per rack** (arrays in `rlc.core.topology.Topology` order, W): ``demand_w`` (what the
rack wants: racky's Σ tray demand with its headroom, which may exceed the grant; NaN when
unknown: the rack is unreachable or not reporting), ``grant_w`` (the value of its current
budget lease; NaN: none yet), ``committed_w`` (the most it may still be drawing:
`rlc.core.leases.RackLedger.committed_w`, the larger of its grant and every older, higher
grant not yet released) and optionally ``cooling_w`` (the rack's reported cooling capacity,
valvey's measurement through racky, as `rlc.core.cycle.FleetState.cooling_w` judged it fresh
and plausible; NaN: none, the configured one alone applies; the cap takes the lower of
both) and ``reserve_w`` (issue 17: what a validating rack's stage draws, ``power_w`` of its
campaign run, `rlc.campaign_driver.CampaignDriver.reserve_w`; NaN: none).

**The target** (where the grants go when nothing holds them back), in this order:

1. every rack its floor (Σ floors ≤ every row and hall limit, checked at config);
2. racks with unknown demand (or a demand that is not a finite number ≥ 0) are **held**: their
   want is their current grant, never more (issue 16: an unreachable rack is never raised);
   served before every class, as they may be drawing it;
2b. **validating** racks (``reserve_w`` given, not held): their want is at least their stage's
   draw (clipped to their cap), and that much is served before every class: the campaign's
   scheduler (`rlc.core.campaign_schedule`) started the stage only where Σ committed + the
   stage's extra fit every limit and the draw fits the rack's configured cap, so the headroom
   is free; the raise itself still follows the ramp below. Racks whose stage only **waits** for
   power (``reserve_waiting`` True) are served after every running one (a running burn-in is
   never cut for a stage not yet started). A reserve a rack cannot get (its cap below it, a
   limit lowered since, or a waiting one the row cannot fit yet) is flagged ``reserve_short``;
3. priority classes in rank order (0 first): each rack's want is its demand clipped to
   [floor, cap], where cap = min(max_w, cooling capacity) but never below the floor (a cooling
   capacity below the floor is flagged, ``cooling_below_floor``: the floor is the rack's own
   fallback and wins); within a class max-min fair under the row and hall limits
   (`rlc.core.fill.nested_fill`);
4. with ``spread_spare``, what the row and hall still have goes to the racks that are not held
   and not ``reclaimed``, in proportion to their room to cap (racky's headroom redistribution:
   a rack can burst without waiting a cycle; `rlc.core.fill.proportional_fill`). A reclaimed
   rack (silent past ``reclaim_after_s``: its demand is its floor as a stand-in) gets none: it
   could not read a raise, and an unreachable rack is never raised (issue 16).

**The step from the grants to the target** (how the cycle moves, the rule of issue 16 item 2):

- decreases are immediate (the grant falls to the target now; the rack's old, higher grant
  stays *committed* until it acknowledges or its lease runs out: `rlc.core.leases`);
- increases are ramp-limited: per row, Σ of the cycle's increases ≤ ``ramp_w_per_s × dt_s``
  (so neither Σ grants nor Σ committed of a row rises faster than the feed allows); a rack's
  raise back into what it still holds committed costs no headroom; beyond that, raises are paid
  only from headroom that is **actually free**: row limit − Σ committed and hall limit − Σ
  committed. Both in rank order, max-min fair within a rank.
- a grant below the floor (none yet, or the floor was raised) goes to the floor at once
  (``floor_forced``): the rack falls to it by itself anyway.

Invariants (tested in tests/unit/test_rlc_allocation_properties.py): Σ committed of every row
and hall ≤ its limit whenever it was so before the cycle (the cycle only adds what is free);
floor ≤ grant ≤ cap except the floor; grants equal for equal inputs (no state, no randomness);
with demand constant the target is constant, decreasing racks reach it at once and rising racks
approach it monotonically (no oscillation).

Cost: O(n log n) per cycle (a sort per fill, a fill per rank and phase), numpy-vectorised.

Errors: ``ValueError`` for arrays of the wrong shape or a negative ``dt_s`` (programming
errors of the caller).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from pydantic import Field

from rackplane.config import StrictModel
from rlc.core.fill import nested_fill, proportional_fill
from rlc.core.topology import Topology

__all__ = ["Allocation", "AllocationSettings", "CycleInput", "allocate"]


class AllocationSettings(StrictModel):
    """How rlc shares headroom beyond the racks' demand."""

    spread_spare: bool = Field(
        True, description="give what is left after every class's demand to the racks that are "
        "neither held nor reclaimed (silent past fleet.reclaim_after_s), in proportion to their "
        "room to cap (racky's headroom redistribution); "
        "false: leave it ungranted (a rise then needs no other rack's decrease first)")


@dataclass(frozen=True)
class CycleInput:
    """One cycle's inputs (shapes (n,), W, topology order; see the module docstring)."""

    demand_w: np.ndarray
    grant_w: np.ndarray
    committed_w: np.ndarray
    dt_s: float
    cooling_w: np.ndarray | None = None
    reserve_w: np.ndarray | None = None
    reserve_waiting: np.ndarray | None = None
    reclaimed: np.ndarray | None = None
    """(n,) bool: racks whose demand is their floor as a stand-in (silent past reclaim): no
    spare and no reserve (module docstring, step 4); None: none."""


@dataclass(frozen=True)
class Allocation:
    """One cycle's result. Racks' arrays (n,), rows' (n_rows,), halls' (n_halls,), W.

    ``grant_w``: the new grants (issue them as leases); ``committed_w``: what each rack may draw
    once they are issued (its old committed value or its new grant, the larger);
    ``target_w``: where the grants would go with no ramp limit and every decrease already
    acknowledged; ``short_w`` = target − grant ≥ 0 (a rise waiting on the ramp or on headroom
    not yet released). Flags: ``held`` (demand unknown or implausible), ``implausible`` (a
    demand given but not a finite number ≥ 0), ``cooling_below_floor``, ``floor_forced``,
    ``reserve_short`` (a validating rack whose target is below its stage's draw).
    ``row_over_w``/``hall_over_w``: Σ committed above the limit, > 0 only when the inputs
    were already over it (a limit lowered under racks that hold more: they are cut to their
    targets and the excess clears as they acknowledge).
    """

    grant_w: np.ndarray
    committed_w: np.ndarray
    target_w: np.ndarray
    short_w: np.ndarray
    held: np.ndarray
    implausible: np.ndarray
    cooling_below_floor: np.ndarray
    floor_forced: np.ndarray
    row_committed_w: np.ndarray
    hall_committed_w: np.ndarray
    row_over_w: np.ndarray
    hall_over_w: np.ndarray
    reserve_short: np.ndarray | None = None


def _check(topo: Topology, inp: CycleInput) -> None:
    n = topo.n
    arrays = {"demand_w": inp.demand_w, "grant_w": inp.grant_w, "committed_w": inp.committed_w}
    if inp.cooling_w is not None:
        arrays["cooling_w"] = inp.cooling_w
    if inp.reserve_w is not None:
        arrays["reserve_w"] = inp.reserve_w
    if inp.reserve_waiting is not None:
        arrays["reserve_waiting"] = inp.reserve_waiting
    if inp.reclaimed is not None:
        arrays["reclaimed"] = inp.reclaimed
    for name, a in arrays.items():
        if a.shape != (n,):
            raise ValueError(f"{name}: shape {a.shape}, expected ({n},)")
    if not (math.isfinite(inp.dt_s) and inp.dt_s >= 0):
        raise ValueError(f"dt_s must be a finite number >= 0, not {inp.dt_s!r}")


def rack_cap_w(topo: Topology, cooling_w: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(cap, cooling_below_floor): cap = min(max_w, cooling capacity), never below the floor.

    The cooling capacity is the lower of the configured one and ``cooling_w`` (n,) W reported
    (measured), NaN where none is reported (the configured one alone; neither: no cooling
    limit); None: the configured capacities only. A reported capacity that is not finite or
    < 0 counts as none reported; 0 is a capacity (the cooling carries nothing beyond: the
    floor, flagged).
    """
    cool = topo.cooling_w
    if cooling_w is not None:
        ok = np.isfinite(cooling_w) & (cooling_w >= 0)
        cool = np.where(ok, np.fmin(cooling_w, cool), cool)
    cap = np.fmin(topo.max_w, cool)
    below = np.nan_to_num(cool, nan=np.inf) < topo.floor_w
    return np.maximum(cap, topo.floor_w), below


class _Rooms:
    """What the rows and halls have left while one allocation fills (W)."""

    def __init__(self, topo: Topology, row_room: np.ndarray, hall_room: np.ndarray) -> None:
        self.topo = topo
        self.row = row_room
        self.hall = hall_room

    def fill(self, need: np.ndarray, *, proportional: bool = False) -> np.ndarray:
        t = self.topo
        fn = proportional_fill if proportional else nested_fill
        give = fn(need, t.row_of, t.hall_of_row, self.row, self.hall)
        self.take(give)
        return give

    def fill_by_rank(self, need: np.ndarray) -> np.ndarray:
        """Rank by rank (0 first), max-min fair within a rank."""
        out = np.zeros_like(need)
        for r in self.topo.ranks:
            sel = np.where(self.topo.rank == r, need, 0.0)
            if sel.any():
                out += self.fill(sel)
        return out

    def take(self, give: np.ndarray) -> None:
        t = self.topo
        self.row = self.row - np.bincount(t.row_of, weights=give, minlength=self.row.shape[0])
        self.hall = self.hall - np.bincount(t.hall_of, weights=give,
                                            minlength=self.hall.shape[0])


def targets(topo: Topology, want: np.ndarray, held: np.ndarray, cap: np.ndarray,
            settings: AllocationSettings, reserve: np.ndarray | None = None,
            waiting: np.ndarray | None = None, no_spare: np.ndarray | None = None
            ) -> np.ndarray:
    """The target grants (n,) W from each rack's ``want`` (n,) W in [floor, cap], held flags,
    caps, validating racks' ``reserve`` (n,) W in [floor, want] and which of those only wait
    (``waiting`` (n,) bool) (module docstring, steps 1-4); ``no_spare`` (n,) bool: racks that
    get no spare beside the held ones. Depends on no grant except through ``want``."""
    f = topo.floor_w
    rooms = _Rooms(topo, topo.row_limit_w - _by_row(topo, f), topo.hall_limit_w - _by_hall(topo, f))
    alloc = f.copy()
    alloc += rooms.fill(np.where(held, want - alloc, 0.0))
    if reserve is not None:
        later = np.zeros(topo.n, bool) if waiting is None else waiting
        for tier in (~later, later):  # running stages first, then those waiting for power
            need = np.where(held | ~tier, 0.0, np.maximum(reserve - alloc, 0.0))
            if need.any():
                alloc += rooms.fill(need)
    for r in topo.ranks:
        need = np.where(~held & (topo.rank == r), want - alloc, 0.0)
        if need.any():
            alloc += rooms.fill(need)
    if settings.spread_spare:
        skip = held if no_spare is None else held | no_spare
        need = np.where(skip, 0.0, np.maximum(cap - alloc, 0.0))
        if need.any():
            alloc += rooms.fill(need, proportional=True)
    return alloc


def allocate(topo: Topology, inp: CycleInput,
             settings: AllocationSettings | None = None) -> Allocation:
    """One cycle: new grants from demand, grants and committed values (module docstring)."""
    _check(topo, inp)
    settings = settings or AllocationSettings()
    f = topo.floor_w
    cap, below = rack_cap_w(topo, inp.cooling_w)
    d = inp.demand_w
    given = ~np.isnan(d)
    implausible = given & ~(np.isfinite(d) & (d >= 0))
    held = ~given | implausible
    g0 = np.where(np.isfinite(inp.grant_w), inp.grant_w, f)
    want = np.where(held, np.clip(g0, f, cap),
                    np.clip(np.where(held, 0.0, d), f, cap))
    reclaimed = None if inp.reclaimed is None else inp.reclaimed.astype(bool)
    reserve = None
    if inp.reserve_w is not None:
        r = inp.reserve_w
        given_r = np.isfinite(r) & (r > 0) & ~held
        if reclaimed is not None:
            given_r &= ~reclaimed  # silent: never raised, not even for a stage
        reserve = np.where(given_r, np.clip(np.where(given_r, r, 0.0), f, cap), f)
        want = np.maximum(want, reserve)
    target = targets(topo, want, held, cap, settings, reserve, inp.reserve_waiting, reclaimed)

    new = np.minimum(g0, target)                    # decreases: at once
    forced = new < f
    new = np.maximum(new, f)
    c = np.maximum(np.maximum(np.nan_to_num(inp.committed_w, nan=0.0), g0), f)
    with np.errstate(invalid="ignore"):  # inf × 0: no ramp limit (NaN replaced)
        ramp = np.where(np.isinf(topo.row_ramp_w_per_s), np.inf,
                        topo.row_ramp_w_per_s * inp.dt_s)
    no_limit = np.full(topo.hall_limit_w.shape[0], np.inf)
    # raises back into what the rack still holds committed: no headroom, only the ramp
    rooms = _Rooms(topo, ramp, no_limit)
    new = new + rooms.fill_by_rank(np.maximum(np.minimum(target, c) - new, 0.0))
    ramp_left = rooms.row
    # raises beyond it: paid from free headroom (limit − Σ committed), within the ramp left
    free_row = topo.row_limit_w - _by_row(topo, c)
    free_hall = topo.hall_limit_w - _by_hall(topo, c)
    rooms = _Rooms(topo, np.minimum(free_row, ramp_left), free_hall)
    new = new + rooms.fill_by_rank(np.maximum(target - new, 0.0))
    committed = np.maximum(c, new)
    row_c, hall_c = _by_row(topo, committed), _by_hall(topo, committed)
    return Allocation(
        grant_w=new, committed_w=committed, target_w=target,
        short_w=np.maximum(target - new, 0.0), held=held, implausible=implausible,
        cooling_below_floor=below, floor_forced=forced, row_committed_w=row_c,
        hall_committed_w=hall_c, row_over_w=np.maximum(row_c - topo.row_limit_w, 0.0),
        hall_over_w=np.maximum(hall_c - topo.hall_limit_w, 0.0),
        reserve_short=None if inp.reserve_w is None else
        np.isfinite(inp.reserve_w) & (inp.reserve_w > 0) & ~held
        & (target < inp.reserve_w - 1e-6))


def _by_row(topo: Topology, x: np.ndarray) -> np.ndarray:
    return np.bincount(topo.row_of, weights=x, minlength=len(topo.row_ids))


def _by_hall(topo: Topology, x: np.ndarray) -> np.ndarray:
    return np.bincount(topo.hall_of, weights=x, minlength=len(topo.hall_ids))
