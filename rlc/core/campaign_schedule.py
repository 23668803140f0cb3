"""Which racks of a campaign start validating now, under the blast-radius limit (issue 17, pure).

`schedule(campaign, topo, committed_w, now_wall_s)` returns the runs to open now: (stage,
racks), one rack for a node or rack stage, the whole group for a multi-rack stage (all at once
or none). With the runs already holding slots (`rlc.core.campaign.Run.holds_slots`) it keeps,
after every start it returns:

- at most ``plan.max_racks_per_row`` racks of one row validating;
- never two racks of one CDU (``plan.cdu_of``) validating;
- Σ over every row (and every hall) of each rack's load ≤ its limit, where a rack's load is its
  ``committed_w`` (the most it may draw now under its budget leases, `rlc.core.leases`; given
  for every rack of the topology, campaign or not) and, while it validates, the larger of that
  and its stage's ``power_w``. A committed value missing, not finite or < 0 counts as the
  rack's ``max_w`` (the most it may ever be granted: the safe side). A row already over its
  limit starts nothing. The daemon raises a starting rack's budget to ``power_w`` through the
  allocator (`rlc.core.allocation`, ``reserve_w``: served before every priority class), which
  pays it from the headroom this check saw free;
- a stage starts only on racks whose configured cap, min(``max_w``, cooling capacity), is at
  least its ``power_w`` (the allocator could never grant more): otherwise it is not scheduled
  (the rack waits; `rlc.core.campaign.Campaign` reports it ``pending``).

Eligible: a rack of the plan that is available (`Campaign.available`), not holding a slot,
settled (``ready_at_s`` ≤ now), with a next stage; for a multi-rack stage its group, with every
member eligible and past every earlier stage. Order: later stages first (racks near production
finish first and groups are not starved by single-rack stages), then plan order; greedy, so the
result is deterministic. Cost: O(n + runs) per call.

`regroup(campaign, topo)` keeps the multi-rack groups runnable: members no longer available
leave their group; a group left with one member dissolves, and such racks that still need the
stage form new groups among themselves (up to the plan's largest group size), or join an
existing group, only where `rlc.core.campaign_plan.check_plan`'s rule says the group could run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from rlc.core.allocation import rack_cap_w
from rlc.core.campaign_plan import StageSpec, unit_problems
from rlc.core.topology import Topology

if TYPE_CHECKING:
    from rlc.core.campaign import Campaign

__all__ = ["plan_starts", "regroup", "schedule"]


def _committed(topo: Topology, committed_w: Mapping[str, float]) -> list[float]:
    out = []
    for i, r in enumerate(topo.rack_ids):
        v = committed_w.get(r)
        ok = v is not None and math.isfinite(v) and v >= 0
        out.append(float(v) if ok and v is not None else float(topo.max_w[i]))
    return out


def schedule(c: Campaign, topo: Topology, committed_w: Mapping[str, float],
             now_wall_s: float) -> list[tuple[StageSpec, tuple[str, ...]]]:
    """The runs to open now (module docstring)."""
    return plan_starts(c, topo, committed_w, now_wall_s)[0]


def plan_starts(c: Campaign, topo: Topology, committed_w: Mapping[str, float],
                now_wall_s: float) -> tuple[list[tuple[StageSpec, tuple[str, ...]]],
                                            list[tuple[StageSpec, tuple[str, ...]]]]:
    """(the runs to open now, the runs **waiting for power**): units that pass every check but
    the row's or hall's power (module docstring), given the starts before them in this pass
    (a waiting unit holds no slot: a later unit that fits may start). The daemon asks the
    allocator to raise a waiting unit's racks to the stage's draw (``reserve_w``), which lowers
    other racks' targets; once their decreases are acknowledged and the waiting racks hold the
    draw committed, the unit's extra is 0 and it starts (if its slots are still free)."""
    waiting: list[tuple[StageSpec, tuple[str, ...]]] = []
    if c.aborted is not None:
        return [], waiting
    plan = c.plan
    load = _committed(topo, committed_w)
    holding = c.holding(now_wall_s)
    row_n = [0] * len(topo.row_ids)
    busy_cdu: set[str] = set()
    for r, run in holding.items():
        i = topo.index(r)
        row_n[int(topo.row_of[i])] += 1
        busy_cdu.add(plan.cdu_of[r])
        load[i] = max(load[i], plan.stage(run.stage).power_w)
    row_w = [0.0] * len(topo.row_ids)
    hall_w = [0.0] * len(topo.hall_ids)
    for i, w in enumerate(load):
        row_w[int(topo.row_of[i])] += w
        hall_w[int(topo.hall_of[i])] += w

    index = {s.name: k for k, s in enumerate(plan.stages)}
    nxt: dict[str, int] = {}
    for r in plan.racks:
        s = c.next_stage(r)
        if s is not None and r not in holding and c.available(r) \
                and c.racks[r].ready_at_s <= now_wall_s:
            nxt[r] = index[s.name]
    group_of = {(name, r): g for name, gs in c.groups.items() for g in gs for r in g}
    units: list[tuple[int, int, StageSpec, tuple[str, ...]]] = []
    seen: set[tuple[str, ...]] = set()
    pos = {r: k for k, r in enumerate(plan.racks)}
    for r, k in nxt.items():
        s = plan.stages[k]
        unit: tuple[str, ...] = (r,)
        if s.kind == "multi_rack":
            g = group_of.get((s.name, r))
            if g is None or g in seen:
                continue
            unit = g
            seen.add(unit)
            if not all(m in nxt and nxt[m] >= k for m in unit):
                continue
        units.append((-k, pos[r], s, unit))
    units.sort(key=lambda u: (u[0], u[1]))

    cap, _below = rack_cap_w(topo, None)
    out: list[tuple[StageSpec, tuple[str, ...]]] = []
    for _, _, s, unit in units:
        idx = [topo.index(m) for m in unit]
        if any(s.power_w > float(cap[i]) for i in idx):
            continue
        rows = [int(topo.row_of[i]) for i in idx]
        cdus = [plan.cdu_of[m] for m in unit]
        if len(set(cdus)) < len(cdus) or busy_cdu.intersection(cdus):
            continue
        add_n: dict[int, int] = {}
        add_row: dict[int, float] = {}
        add_hall: dict[int, float] = {}
        for i, j in zip(idx, rows, strict=True):
            add_n[j] = add_n.get(j, 0) + 1
            extra = max(0.0, s.power_w - load[i])
            add_row[j] = add_row.get(j, 0.0) + extra
            h = int(topo.hall_of[i])
            add_hall[h] = add_hall.get(h, 0.0) + extra
        if any(row_n[j] + n > plan.max_racks_per_row for j, n in add_n.items()):
            continue
        if any(row_w[j] + w > float(topo.row_limit_w[j]) for j, w in add_row.items()) or \
                any(hall_w[h] + w > float(topo.hall_limit_w[h]) for h, w in add_hall.items()):
            waiting.append((s, unit))
            continue
        for j, n in add_n.items():
            row_n[j] += n
            row_w[j] += add_row[j]
        for h, w in add_hall.items():
            hall_w[h] += w
        for i in idx:
            load[i] = max(load[i], s.power_w)
        busy_cdu.update(cdus)
        out.append((s, unit))
    return out, waiting


def regroup(c: Campaign, topo: Topology) -> None:
    """Keep every multi-rack stage's groups runnable (module docstring)."""
    floors: tuple[list[float], list[float]] | None = None
    for s in c.plan.stages:
        if s.kind != "multi_rack":
            continue
        size = max((len(g) for g in s.groups or ()), default=2)
        groups: list[tuple[str, ...]] = []
        orphans: list[str] = []
        changed = False
        for g in c.groups.get(s.name, []):
            keep = tuple(r for r in g if c.available(r))
            changed |= len(keep) != len(g)
            if len(keep) >= 2:
                groups.append(keep)
            else:
                changed |= bool(keep)
                orphans += [r for r in keep if c.current_pass(r, s.name) is None]
        grouped = {r for g in groups for r in g}
        orphans += [r for r in c.plan.racks if r not in grouped and r not in orphans
                    and c.available(r) and c.current_pass(r, s.name) is None
                    and c.group_for(r, s.name) is None]
        if not changed and not orphans:
            continue
        if orphans:
            if floors is None:
                floors = _floors(topo)
            groups = _form(c, topo, s, groups, orphans, size, floors)
        c.groups[s.name] = groups


def _floors(topo: Topology) -> tuple[list[float], list[float]]:
    row = [0.0] * len(topo.row_ids)
    hall = [0.0] * len(topo.hall_ids)
    for i in range(topo.n):
        row[int(topo.row_of[i])] += float(topo.floor_w[i])
        hall[int(topo.hall_of[i])] += float(topo.floor_w[i])
    return row, hall


def _form(c: Campaign, topo: Topology, s: StageSpec, groups: list[tuple[str, ...]],
          orphans: list[str], size: int,
          floors: tuple[list[float], list[float]]) -> list[tuple[str, ...]]:
    """New groups of ``orphans`` (plan order, greedy, feasible only); a rack left alone joins
    the first existing group it can run with, or stays without one (needs regroup)."""
    def fits(unit: tuple[str, ...]) -> bool:
        return not unit_problems(c.plan, topo, s, unit, floors[0], floors[1])

    pos = {r: k for k, r in enumerate(c.plan.racks)}
    left = sorted(set(orphans), key=pos.__getitem__)
    out = list(groups)
    while left:
        cur: tuple[str, ...] = (left.pop(0),)
        for r in list(left):
            if len(cur) >= size:
                break
            if fits((*cur, r)):
                cur = (*cur, r)
                left.remove(r)
        if len(cur) >= 2:
            out.append(cur)
            continue
        for k, g in enumerate(out):
            if fits((*g, cur[0])):
                out[k] = (*g, cur[0])
                break
    return out
