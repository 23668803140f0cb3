"""The fleet's power topology: site → hall → row → rack, with limits (issue 16 item 1, pure).

Config shape (TOML, under rlc's ``[topology]``; every name a topic level, rack names unique in
the site since topics and KV keys carry ``<site>/<rack>``)::

    site = "dc1"
    classes = { critical = 0, high = 1, normal = 2, low = 3 }   # rank 0 served first
    [halls.hall1]
    feed_limit_w = 3_000_000.0              # the hall feed's limit, W
    [halls.hall1.rows.row01]
    limit_w = 400_000.0                     # the row's breaker limit, W
    ramp_w_per_s = 20_000.0                 # Σ grants of the row rise at most this fast
    [halls.hall1.rows.row01.racks.rack01]
    floor_w = 20_000.0                      # safe floor: what the rack falls to by itself
    max_w = 132_000.0                       # the most it may be granted
    priority = "normal"
    cooling_capacity_w = 120_000.0          # optional rated cooling, W (a further limit;
                                            # the rack's reported capacity, when lower, wins)

Checked at load (`TopologySettings`; a `rackplane.config.ConfigError` from
`rackplane.config.validate_data` names the key path):

- a rack's ``floor_w`` ≤ its ``max_w``, and ≤ its configured ``cooling_capacity_w`` (a floor
  the rack cannot cool would overheat it whenever its lease lapses: a config error; a
  *measured* capacity below the floor at run time is flagged by the allocator instead);
- Σ floors of a row ≤ the row's ``limit_w`` and Σ floors of a hall ≤ its ``feed_limit_w``
  (issue 16 item 2: every rack may fall to its floor at once, leases expired, and the sum must
  still hold; the message names the row or hall and its racks);
- every ``priority`` names a class; rack names are unique in the site.

`compile_topology` turns the settings into `Topology`: flat numpy arrays in a fixed order
(halls, rows and racks in config order), which the allocator works on.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Final

import numpy as np
from pydantic import Field, field_validator, model_validator

from rackplane.config import StrictModel
from rackplane.core.names import check_topic_level
from rackplane.settings import TopicLevel

__all__ = ["DEFAULT_CLASSES", "HallSpec", "RackSpec", "RowSpec", "Topology", "TopologySettings",
           "compile_topology"]

DEFAULT_CLASSES: Final = {"critical": 0, "high": 1, "normal": 2, "low": 3}
"""racky's tray classes (`racky.config.PowerSettings.classes`), reused for racks."""

_MAX_FEED_W: Final = 1e9
"""Bound of every limit, W (1 GW: no hall feed comes near it; a typo such as 4e12 is refused)."""


def _names(d: dict[str, object], what: str) -> dict[str, object]:
    for k in d:
        check_topic_level(k, what)
    return d


class RackSpec(StrictModel):
    """One rack's power envelope."""

    floor_w: float = Field(ge=0, le=_MAX_FEED_W, description="safe floor, W: what the rack "
                           "falls to by itself when its budget lease expires (racky's "
                           "fleet-mode fallback; Σ of its agents' safe caps ≤ this, issue 16)")
    max_w: float = Field(gt=0, le=_MAX_FEED_W, description="the most the rack may be granted, "
                         "W (its feed / shelf capacity)")
    priority: str = Field("normal", description="priority class (a key of classes)")
    cooling_capacity_w: float | None = Field(
        None, gt=0, le=_MAX_FEED_W, description="rated cooling capacity, W: a further limit "
        "of the grant; the rack's reported capacity (racky: valvey's measurement) caps it "
        "lower at run time, never higher; None: only the reported capacity limits (none "
        "reported: no cooling limit)")

    @model_validator(mode="after")
    def _envelope(self) -> RackSpec:
        if self.floor_w > self.max_w:
            raise ValueError(f"floor_w {self.floor_w:g} W exceeds max_w {self.max_w:g} W")
        if self.cooling_capacity_w is not None and self.cooling_capacity_w < self.floor_w:
            raise ValueError(f"cooling_capacity_w {self.cooling_capacity_w:g} W is below "
                             f"floor_w {self.floor_w:g} W: the rack's own fallback could not "
                             "be cooled")
        return self


def _sum_check(kind: str, limit_key: str, limit_w: float,
               floors: list[tuple[str, float]]) -> None:
    total = math.fsum(f for _, f in floors)
    if total > limit_w:
        top = sorted(floors, key=lambda kv: -kv[1])[:8]
        listed = ", ".join(f"{k} {f:g} W" for k, f in top)
        more = f" and {len(floors) - len(top)} more" if len(floors) > len(top) else ""
        raise ValueError(f"Σ floor_w of the {kind}'s racks = {total:g} W exceeds {limit_key} "
                         f"{limit_w:g} W (racks {listed}{more}): all racks at their floors, "
                         "leases expired, would overload the feed")


class RowSpec(StrictModel):
    """One row: a breaker limit shared by its racks."""

    limit_w: float = Field(gt=0, le=_MAX_FEED_W, description="the row's breaker limit, W: "
                           "Σ of what its racks may draw never exceeds it")
    ramp_w_per_s: float | None = Field(
        None, gt=0, le=_MAX_FEED_W, description="the most Σ grants of the row may rise per "
        "second, W/s (what the feed allows); None: no ramp limit")
    racks: dict[str, RackSpec] = Field(min_length=1, description="rack name -> envelope")

    @field_validator("racks")
    @classmethod
    def _rack_names(cls, v: dict[str, object]) -> dict[str, object]:
        return _names(v, "rack name")

    @model_validator(mode="after")
    def _floors(self) -> RowSpec:
        _sum_check("row", "limit_w", self.limit_w,
                   [(k, r.floor_w) for k, r in self.racks.items()])
        return self


class HallSpec(StrictModel):
    """One hall: a feed limit shared by its rows."""

    feed_limit_w: float = Field(gt=0, le=_MAX_FEED_W, description="the hall feed's limit, W")
    rows: dict[str, RowSpec] = Field(min_length=1, description="row name -> row")

    @field_validator("rows")
    @classmethod
    def _row_names(cls, v: dict[str, object]) -> dict[str, object]:
        return _names(v, "row name")

    @model_validator(mode="after")
    def _floors(self) -> HallSpec:
        _sum_check("hall", "feed_limit_w", self.feed_limit_w,
                   [(f"{rn}.{k}", r.floor_w) for rn, row in self.rows.items()
                    for k, r in row.racks.items()])
        return self


class TopologySettings(StrictModel):
    """The site's halls, rows and racks (issue 16 item 1)."""

    site: TopicLevel = Field(description="the site's name (a topic level): required, and "
                             "rlc's identity.site must be the same")
    classes: dict[str, int] = Field(default_factory=lambda: dict(DEFAULT_CLASSES),
                                    description="priority classes: name -> rank (0 served "
                                    "first)")
    halls: dict[str, HallSpec] = Field(min_length=1, description="hall name -> hall")

    @field_validator("halls")
    @classmethod
    def _hall_names(cls, v: dict[str, object]) -> dict[str, object]:
        return _names(v, "hall name")

    @field_validator("classes")
    @classmethod
    def _ranks(cls, v: dict[str, int]) -> dict[str, int]:
        if not v:
            raise ValueError("at least one class")
        for k, rank in v.items():
            if not 0 <= rank <= 1000:
                raise ValueError(f"class {k!r}: rank {rank} outside 0..1000")
        return v

    @model_validator(mode="after")
    def _refs(self) -> TopologySettings:
        seen: dict[str, str] = {}
        problems = []
        for hn, hall in self.halls.items():
            for rn, row in hall.rows.items():
                for k, rack in row.racks.items():
                    path = f"halls.{hn}.rows.{rn}.racks.{k}"
                    if rack.priority not in self.classes:
                        problems.append(f"{path}.priority: {rack.priority!r} is not one of "
                                        f"classes {sorted(self.classes)}")
                    if k in seen:
                        problems.append(f"{path}: rack name {k!r} also at {seen[k]} (rack "
                                        "names are unique in a site)")
                    seen.setdefault(k, path)
        if problems:
            raise ValueError("; ".join(problems[:10]))
        return self


@dataclass(frozen=True, eq=False)
class Topology:
    """A compiled topology: racks, rows and halls as indices, their figures as arrays.

    Shapes: ``n`` racks, ``n_rows`` rows, ``n_halls`` halls, in config order. Arrays are float64
    W unless named otherwise; ``cooling_w`` is NaN where none is configured; ``row_ramp_w_per_s``
    is +inf where a row has no ramp limit. ``rank`` is each rack's class rank (0 first),
    ``ranks`` the distinct ranks in use, ascending. Treat the arrays as read-only.
    """

    site: str
    rack_ids: tuple[str, ...]
    row_ids: tuple[str, ...]          # "hall/row"
    hall_ids: tuple[str, ...]
    row_of: np.ndarray                # (n,) int: the rack's row index
    hall_of: np.ndarray               # (n,) int: the rack's hall index
    hall_of_row: np.ndarray           # (n_rows,) int
    floor_w: np.ndarray               # (n,)
    max_w: np.ndarray                 # (n,)
    cooling_w: np.ndarray             # (n,), NaN: none configured
    rank: np.ndarray                  # (n,) int
    ranks: tuple[int, ...]
    row_limit_w: np.ndarray           # (n_rows,)
    row_ramp_w_per_s: np.ndarray      # (n_rows,), inf: none
    hall_limit_w: np.ndarray          # (n_halls,)

    @property
    def n(self) -> int:
        """Number of racks."""
        return len(self.rack_ids)

    def index(self, rack: str) -> int:
        """The position of ``rack`` in the arrays. Raises KeyError for an unknown rack."""
        return self._index[rack]

    @functools.cached_property
    def _index(self) -> dict[str, int]:
        return {r: i for i, r in enumerate(self.rack_ids)}


def compile_topology(t: TopologySettings) -> Topology:
    """Flatten validated settings into a `Topology` (halls, rows, racks in config order)."""
    rack_ids: list[str] = []
    row_ids: list[str] = []
    row_of: list[int] = []
    hall_of: list[int] = []
    hall_of_row: list[int] = []
    floor, mx, cool, rank = [], [], [], []
    row_limit, row_ramp, hall_limit = [], [], []
    for h, (hn, hall) in enumerate(t.halls.items()):
        hall_limit.append(hall.feed_limit_w)
        for rn, row in hall.rows.items():
            r = len(row_ids)
            row_ids.append(f"{hn}/{rn}")
            hall_of_row.append(h)
            row_limit.append(row.limit_w)
            row_ramp.append(math.inf if row.ramp_w_per_s is None else row.ramp_w_per_s)
            for k, rack in row.racks.items():
                rack_ids.append(k)
                row_of.append(r)
                hall_of.append(h)
                floor.append(rack.floor_w)
                mx.append(rack.max_w)
                cool.append(math.nan if rack.cooling_capacity_w is None
                            else rack.cooling_capacity_w)
                rank.append(t.classes[rack.priority])
    rank_a = np.asarray(rank, dtype=np.int64)
    return Topology(
        site=t.site, rack_ids=tuple(rack_ids), row_ids=tuple(row_ids),
        hall_ids=tuple(t.halls), row_of=np.asarray(row_of, dtype=np.int64),
        hall_of=np.asarray(hall_of, dtype=np.int64),
        hall_of_row=np.asarray(hall_of_row, dtype=np.int64),
        floor_w=np.asarray(floor, dtype=float), max_w=np.asarray(mx, dtype=float),
        cooling_w=np.asarray(cool, dtype=float), rank=rank_a,
        ranks=tuple(int(x) for x in np.unique(rank_a)),
        row_limit_w=np.asarray(row_limit, dtype=float),
        row_ramp_w_per_s=np.asarray(row_ramp, dtype=float),
        hall_limit_w=np.asarray(hall_limit, dtype=float))
