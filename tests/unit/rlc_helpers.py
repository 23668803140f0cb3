"""Shared builders of the rlc core tests: hypothesis strategies for topologies and a
cap computed independently of the allocator."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from hypothesis import strategies as st

from rlc.core.topology import Topology, TopologySettings, compile_topology

EPS_W = 1e-6


@st.composite
def topologies(draw: Any, max_halls: int = 2, max_rows: int = 3, max_racks: int = 5,
               ramp: bool = True) -> TopologySettings:
    """Random valid topologies: floors 0-20 W, max up to +80 W, optional cooling ≥ floor,
    row limits from Σ floors to Σ floors + 200 W, hall feeds from Σ floors (often below Σ
    row limits: oversubscribed), optional ramp limits, ranks 0-2."""
    halls: dict[str, Any] = {}
    for h in range(draw(st.integers(1, max_halls))):
        rows: dict[str, Any] = {}
        hall_floors: list[float] = []
        hall_rows_limit = 0.0
        for r in range(draw(st.integers(1, max_rows))):
            racks: dict[str, Any] = {}
            for k in range(draw(st.integers(1, max_racks))):
                floor = draw(st.floats(0.0, 20.0))
                mx = floor + draw(st.floats(1.0, 80.0))
                rack: dict[str, Any] = {"floor_w": floor, "max_w": mx,
                                        "priority": draw(st.sampled_from(["a", "b", "c"]))}
                if draw(st.booleans()):
                    rack["cooling_capacity_w"] = floor + draw(st.floats(0.5, 100.0))
                racks[f"h{h}r{r}k{k}"] = rack
            sf = math.fsum(x["floor_w"] for x in racks.values())
            limit = sf + 1e-6 + draw(st.floats(0.0, 200.0))  # + 1e-6: the validator's
            # own sum may round above math.fsum's
            row: dict[str, Any] = {"limit_w": max(limit, 1.0), "racks": racks}
            if ramp and draw(st.booleans()):
                row["ramp_w_per_s"] = draw(st.floats(5.0, 100.0))
            rows[f"row{r}"] = row
            hall_floors += [x["floor_w"] for x in racks.values()]
            hall_rows_limit += row["limit_w"]
        hall_floor = math.fsum(hall_floors)
        feed = hall_floor + 1e-6 + draw(st.floats(0.0, 1.0)) * (hall_rows_limit - hall_floor)
        halls[f"hall{h}"] = {"feed_limit_w": max(feed, 1.0), "rows": rows}
    return TopologySettings.model_validate(
        {"site": "t", "classes": {"a": 0, "b": 1, "c": 2}, "halls": halls})


def compiled(t: TopologySettings) -> Topology:
    return compile_topology(t)


def independent_cap(t: TopologySettings, cooling_measured: dict[str, float]) -> dict[str, float]:
    """Each rack's cap from the settings themselves: max(floor, min(max, cooling)), where the
    cooling is the lower of the configured and the measured one (if plausible: finite, ≥ 0)."""
    out = {}
    for hall in t.halls.values():
        for row in hall.rows.values():
            for k, r in row.racks.items():
                cool = cooling_measured.get(k)
                if cool is None or not np.isfinite(cool) or cool < 0:
                    cool = r.cooling_capacity_w
                elif r.cooling_capacity_w is not None:
                    cool = min(cool, r.cooling_capacity_w)
                cap = r.max_w if cool is None else min(r.max_w, cool)
                out[k] = max(r.floor_w, cap)
    return out


def sums(topo: Topology, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(per row, per hall) sums of (n,) ``x`` by plain Python loops (not the allocator's
    bincount)."""
    rows = np.zeros(len(topo.row_ids))
    halls = np.zeros(len(topo.hall_ids))
    for i in range(topo.n):
        rows[int(topo.row_of[i])] += float(x[i])
        halls[int(topo.hall_of[i])] += float(x[i])
    return rows, halls
