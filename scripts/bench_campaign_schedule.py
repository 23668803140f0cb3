"""Bench: one scheduling call of a validation campaign over 1,800 racks (issue 17).

100 rows of 18 racks (3 halls), 9 CDUs a row (2 racks each), a plan of node, rack and
multi-rack stages (groups of 4 racks from 4 rows), 3 racks a row at once. Prints the time of
one `rlc.core.campaign_schedule.schedule` call and of one `Campaign.step` (deadlines, regroup,
schedule, gate) at the campaign's start and with every rack half-way (node stage passed,
a run of the rack stage open on the racks the limits let start). Not a test: figures only.

    PYTHONPATH=. python scripts/bench_campaign_schedule.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from rlc.core.campaign import Campaign, Pass
from rlc.core.campaign_codec import dumps, loads
from rlc.core.campaign_plan import CampaignPlan
from rlc.core.campaign_schedule import schedule
from rlc.core.topology import TopologySettings, compile_topology

T0 = 1_800_000_000.0


def build() -> tuple[Any, CampaignPlan]:
    halls: dict[str, Any] = {}
    racks: list[str] = []
    cdu: dict[str, str] = {}
    for h in range(3):
        rows = {}
        for r in range(34 if h < 2 else 32):
            rn = f"h{h}row{r:02d}"
            names = [f"{rn}k{k:02d}" for k in range(18)]
            rows[rn] = {"limit_w": 18 * 20_000.0 + 3 * 132_000.0,
                        "racks": {n: {"floor_w": 20_000.0, "max_w": 132_000.0} for n in names}}
            racks += names
            cdu.update({n: f"{rn}cdu{k // 2}" for k, n in enumerate(names)})
        halls[f"hall{h}"] = {"feed_limit_w": 1e8, "rows": rows}
    topo = compile_topology(TopologySettings.model_validate({"site": "b", "halls": halls}))
    by_row: dict[int, list[str]] = {}
    for i, name in enumerate(topo.rack_ids):
        by_row.setdefault(int(topo.row_of[i]), []).append(name)
    rows_l = [by_row[j] for j in sorted(by_row)]
    groups = [[rows_l[4 * g + m][k] for m in range(4)]
              for g in range(len(rows_l) // 4) for k in range(18)]
    phases = [{"kind": "burn_in", "duration_s": 3600.0},
              {"kind": "agentic", "duration_s": 1800.0},
              {"kind": "backend_only", "duration_s": 1800.0}]
    plan = CampaignPlan.model_validate({
        "racks": racks, "cdu_of": cdu, "max_racks_per_row": 3,
        "stages": [{"name": "node", "kind": "node", "power_w": 100_000.0, "phases": phases},
                   {"name": "rack", "kind": "rack", "power_w": 125_000.0, "phases": phases,
                    "expected": {"nvlink_fraction": {"min": 0.8}}},
                   {"name": "multi", "kind": "multi_rack", "power_w": 125_000.0,
                    "phases": phases, "groups": groups,
                    "expected": {"backend_fraction": {"min": 0.3}}}]})
    return topo, plan


def timed(fn: Any, repeat: int) -> float:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    topo, plan = build()
    t = time.perf_counter()
    c = Campaign.new("bench", plan, topo)
    t_new = time.perf_counter() - t
    committed = {r: 20_000.0 for r in topo.rack_ids}
    s_start = timed(lambda: schedule(c, topo, committed, T0), a.repeat)
    n_start = len(schedule(c, topo, committed, T0))
    for r in plan.racks:                           # half-way: node passed everywhere
        c.racks[r].passes["node"] = Pass("node.0", 0, T0)
    data = dumps(c)
    t = time.perf_counter()
    copies = [loads(data, topo) for _ in range(a.repeat)]
    t_load = (time.perf_counter() - t) / a.repeat
    steps = []
    for cc in copies:
        t = time.perf_counter()
        cc.step(topo, committed, T0, 1)
        steps.append(time.perf_counter() - t)
    c = copies[0]
    open_runs = sum(1 for run in c.runs.values() if run.state == "starting")
    s_mid = timed(lambda: schedule(c, topo, committed, T0 + 1), a.repeat)
    for r in plan.racks:                           # at the multi-rack stage
        c.racks[r].passes["rack"] = Pass("rack.0", 0, T0)
    c.runs.clear()
    s_multi = timed(lambda: schedule(c, topo, committed, T0 + 2), a.repeat)
    n_multi = len(schedule(c, topo, committed, T0 + 2))
    t = time.perf_counter()
    data = dumps(c)
    t_dump = time.perf_counter() - t
    print(f"racks {topo.n}, rows {len(topo.row_ids)}, multi-rack groups "
          f"{len(plan.stages[2].groups or [])}, {a.repeat} repeats (median)")
    print(f"Campaign.new (plan checked on the topology): {t_new * 1e3:.1f} ms")
    print(f"schedule at start: {s_start * 1e3:.1f} ms, {n_start} racks start")
    print(f"step half-way (deadlines, regroup, schedule, gate): "
          f"{statistics.median(steps) * 1e3:.1f} ms, {open_runs} runs opened")
    print(f"schedule with {open_runs} runs holding slots: {s_mid * 1e3:.1f} ms")
    print(f"schedule at the multi-rack stage: {s_multi * 1e3:.1f} ms, {n_multi} groups start")
    print(f"record: dumps {t_dump * 1e3:.1f} ms ({len(data) / 1e6:.2f} MB), "
          f"loads {t_load * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
