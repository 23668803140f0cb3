"""Water filling under nested limits (rack ⊂ row ⊂ hall), vectorised (pure; numpy).

The allocator's one primitive (`rlc.core.allocation`). Given what each rack still needs and
what room each row and hall has left, `nested_fill` returns what each rack gets:

- **max-min fair** (`nested_fill`): every rack gets ``min(need, level)`` where the level of a
  row is the lower of the row's own saturation level and its hall's; a row whose racks' needs
  fit gets them all. This is the progressive-filling allocation for tree-shaped limits: no
  rack's share can grow without shrinking one that is no larger.
- **proportional** (`proportional_fill`): every rack gets ``need × s_row × s_hall`` with the
  scales the smallest that fit (racky's spare spreading, "in proportion to its room").

Both are O(n log n) (one sort per level) and never exceed a room: Σ over a row ≤ its room,
Σ over a hall ≤ its room, each give in [0, need] (rooms below 0 count as 0).
"""

from __future__ import annotations

import numpy as np

__all__ = ["group_levels", "nested_fill", "proportional_fill"]


def group_levels(need: np.ndarray, group: np.ndarray, room: np.ndarray) -> np.ndarray:
    """Each group's water level: the L with Σ_{i in g} min(need_i, L) = room_g, +inf where the
    group's needs fit its room.

    Shapes: ``need`` (n,) ≥ 0, ``group`` (n,) int in [0, G), ``room`` (G,) (inf allowed;
    negative counts as 0). Returns (G,) float. O(n log n).
    """
    n_groups = room.shape[0]
    level = np.full(n_groups, np.inf)
    if need.size == 0:
        return level
    room = np.maximum(room, 0.0)
    order = np.lexsort((need, group))
    v = need[order]
    g = group[order]
    counts = np.bincount(g, minlength=n_groups)
    starts = np.cumsum(counts) - counts
    csum = np.cumsum(v)
    before = csum - v                      # Σ of the items before this one (whole array)
    before_in_group = before - before[starts[g]]
    rest = (counts[g] - (np.arange(v.size) - starts[g])).astype(float)
    cap = room[g]
    # item q is filled (gets all of v_q) iff the level reaches v_q: v_q·rest + before ≤ room;
    # sorted ascending within a group, so the filled items are a prefix.
    unfilled = v * rest + before_in_group > cap
    if not unfilled.any():
        return level
    idx = np.flatnonzero(unfilled)
    gu, first = np.unique(g[idx], return_index=True)
    at = idx[first]
    level[gu] = np.maximum((cap[at] - before_in_group[at]) / rest[at], 0.0)
    return level


def nested_fill(need: np.ndarray, row_of: np.ndarray, hall_of_row: np.ndarray,
                row_room: np.ndarray, hall_room: np.ndarray) -> np.ndarray:
    """Max-min fair gives under row and hall rooms.

    Shapes: ``need`` (n,) W ≥ 0 (NaN not allowed), ``row_of`` (n,) int, ``hall_of_row``
    (n_rows,) int, ``row_room`` (n_rows,) W, ``hall_room`` (n_halls,) W (inf: no limit).
    Returns (n,) W, each in [0, need_i].
    """
    if need.size == 0 or not need.any():
        return np.zeros_like(need)
    row_level = group_levels(need, row_of, row_room)
    need1 = np.minimum(need, row_level[row_of])
    hall_of = hall_of_row[row_of]
    hall_level = group_levels(need1, hall_of, hall_room)
    give: np.ndarray = np.minimum(need1, hall_level[hall_of])
    return _trim(give, row_of, hall_of, row_room, hall_room)


def proportional_fill(need: np.ndarray, row_of: np.ndarray, hall_of_row: np.ndarray,
                      row_room: np.ndarray, hall_room: np.ndarray) -> np.ndarray:
    """Gives in proportion to ``need`` under row and hall rooms (same shapes as
    `nested_fill`): a row that cannot give all scales its racks alike, then a hall that cannot
    scales its rows' gives alike."""
    if need.size == 0 or not need.any():
        return np.zeros_like(need)
    n_rows, n_halls = row_room.shape[0], hall_room.shape[0]
    row_need = np.bincount(row_of, weights=need, minlength=n_rows)
    s_row = _scale(row_need, row_room)
    give = need * s_row[row_of]
    hall_of = hall_of_row[row_of]
    hall_need = np.bincount(hall_of, weights=give, minlength=n_halls)
    s_hall = _scale(hall_need, hall_room)
    out: np.ndarray = give * s_hall[hall_of]
    return _trim(out, row_of, hall_of, row_room, hall_room)


def _scale(total: np.ndarray, room: np.ndarray) -> np.ndarray:
    room = np.maximum(room, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.where(total > room, room / np.where(total > 0, total, 1.0), 1.0)
    return np.clip(s, 0.0, 1.0)


def _trim(give: np.ndarray, row_of: np.ndarray, hall_of: np.ndarray, row_room: np.ndarray,
          hall_room: np.ndarray) -> np.ndarray:
    """Scale down a group whose Σ exceeds its room by float rounding (a few ulp), so Σ ≤ room
    holds exactly as computed in float (a limit is a limit)."""
    for grp, room in ((row_of, row_room), (hall_of, hall_room)):
        tot = np.bincount(grp, weights=give, minlength=room.shape[0])
        over = tot > np.maximum(room, 0.0)
        if over.any():
            s = np.ones_like(tot)
            s[over] = np.maximum(room[over], 0.0) / tot[over] * (1.0 - 4e-16)
            give = give * s[grp]
    return give
