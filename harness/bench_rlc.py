"""rlc's allocation cycle at fleet scale (issue 16 target: 1,800 racks ≤ 100 ms, one core).

A synthetic site (`synthetic_site`: 10 halls × 18 rows × 10 racks by default, NVL72-sized
envelopes: floor 20 kW, max 132 kW, rows of 10 racks at 800 kW, hall feeds at 85 % of their
rows' sum, four priority classes, every third rack with a rated cooling capacity) is driven
through cycles by `run_cycles` exactly as the daemon will: every rack's ledger releases what is
acknowledged or expired, the allocator runs (`rlc.core.allocation.allocate`) and every rack
gets its next lease (`rlc.core.leases.RackLedger.issue`, a renewal where unchanged). Demand
is a seeded random walk around 75 kW with 2 % of racks unknown (held) at any cycle and
measured cooling capacities on a tenth of the racks; half the racks acknowledge their lease
the next cycle. The figure is the median wall time of a cycle (ledger + allocation + issue)
in this one process, with its CPU time beside it (one thread: CPU/wall ≈ 1).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from harness.benchrun import spread_figure
from harness.figures import Figure, Progress, no_progress
from rlc.core.allocation import AllocationSettings, CycleInput, allocate
from rlc.core.leases import LeaseTiming, RackLedger
from rlc.core.topology import Topology, TopologySettings, compile_topology

__all__ = ["bench_rlc", "run_cycles", "synthetic_site"]

CLASSES = ("critical", "high", "normal", "low")


def synthetic_site(halls: int = 10, rows: int = 18, racks: int = 10,
                   seed: int = 0) -> TopologySettings:
    """A validated site of ``halls × rows × racks`` racks (module docstring)."""
    rng = np.random.default_rng(seed)
    data: dict[str, Any] = {"site": "bench", "halls": {}}
    for h in range(halls):
        hall_rows: dict[str, Any] = {}
        for r in range(rows):
            rr: dict[str, Any] = {}
            for k in range(racks):
                rack: dict[str, Any] = {"floor_w": 20_000.0, "max_w": 132_000.0,
                                        "priority": CLASSES[int(rng.integers(0, 4))]}
                if k % 3 == 0:
                    rack["cooling_capacity_w"] = float(rng.uniform(90_000.0, 132_000.0))
                rr[f"h{h:02d}r{r:02d}k{k:02d}"] = rack
            hall_rows[f"row{r:02d}"] = {"limit_w": 80_000.0 * racks, "ramp_w_per_s": 50_000.0,
                                        "racks": rr}
        data["halls"][f"hall{h:02d}"] = {"feed_limit_w": 0.85 * 80_000.0 * racks * rows,
                                         "rows": hall_rows}
    return TopologySettings.model_validate(data)


def run_cycles(topo: Topology, cycles: int, seed: int = 1
               ) -> tuple[list[float], list[float], list[float]]:
    """Run ``cycles`` full cycles; returns (cycle wall ms, cycle CPU ms, allocate-only wall
    ms) per cycle."""
    rng = np.random.default_rng(seed)
    timing = LeaseTiming()
    settings = AllocationSettings()
    ledgers = [RackLedger(k, float(topo.floor_w[i])) for i, k in enumerate(topo.rack_ids)]
    demand = rng.uniform(40_000.0, 110_000.0, topo.n)
    wall_ms, cpu_ms, alloc_ms = [], [], []
    wall0, mono0 = 1.7e9, 0.0
    for c in range(cycles):
        demand = np.clip(demand + rng.normal(0.0, 4_000.0, topo.n), 0.0, 140_000.0)
        shown = np.where(rng.random(topo.n) < 0.02, np.nan, demand)
        cooling = np.where(rng.random(topo.n) < 0.1,
                           rng.uniform(60_000.0, 132_000.0, topo.n), np.nan)
        acks = rng.random(topo.n) < 0.5
        now_wall, now_mono = wall0 + c, mono0 + c
        t0, p0 = time.perf_counter(), time.process_time()
        for i, led in enumerate(ledgers):
            if acks[i] and led.current is not None:
                led.on_ack(*led.current.key)
            led.release(now_wall, now_mono, timing)
        grant = np.fromiter((led.grant_w for led in ledgers), float, topo.n)
        committed = np.fromiter((led.committed_w() for led in ledgers), float, topo.n)
        t1 = time.perf_counter()
        a = allocate(topo, CycleInput(shown, grant, committed, 1.0, cooling), settings)
        t2 = time.perf_counter()
        for led, v in zip(ledgers, a.grant_w.tolist(), strict=True):
            led.issue(v, 1, now_wall, now_mono, timing)
        wall_ms.append((time.perf_counter() - t0) * 1e3)
        cpu_ms.append((time.process_time() - p0) * 1e3)
        alloc_ms.append((t2 - t1) * 1e3)
    return wall_ms, cpu_ms, alloc_ms


def bench_rlc(quick: bool, progress: Progress = no_progress) -> list[Figure]:
    """The allocation-cycle figures: 1,800 racks (target ≤ 100 ms), and 18,000 for the
    growth (O(n log n): 10× the racks should cost ≈ 10-13×)."""
    cycles = 20 if quick else 100
    topo = compile_topology(synthetic_site())
    run_cycles(topo, 5)                                        # warm-up
    wall, cpu, alloc = run_cycles(topo, cycles)
    progress("rlc allocation", 0.5)
    how = (f"{topo.n:,} racks ({len(topo.hall_ids)} halls, {len(topo.row_ids)} rows), "
           f"{cycles} cycles of ledger release + allocate + issue, one process, one thread; "
           f"CPU/wall {sum(cpu) / sum(wall):.2f}")
    figs = [
        spread_figure("bench.rlc.allocation_cycle_1800_racks_ms", wall, "ms", 100.0, "<=", how,
                      cpu_ms_median=statistics.median(cpu)),
        spread_figure("bench.rlc.allocate_only_1800_racks_ms", alloc, "ms", None, "info",
                      "the allocator alone (rlc.core.allocation.allocate), same cycles"),
    ]
    big = compile_topology(synthetic_site(halls=100))
    bwall, _, _ = run_cycles(big, max(cycles // 10, 3))
    progress("rlc allocation", 1.0)
    ratio = statistics.median(bwall) / statistics.median(wall)
    figs.append(Figure("bench.rlc.cycle_growth_10x_racks", ratio, "x", detail=(
        f"median cycle of {big.n:,} racks ({statistics.median(bwall):.1f} ms) / of {topo.n:,}; "
        "O(n log n) gives ≈ 10-13×")))
    return figs
