"""A multi-rack lock-step run of `sims.backend.MultiRack` with its wall time (not a test).

Default: 4 racks, 30 virtual minutes at the plant step 0.1 s, agentic load; NVLink phase for
the first 10 min, then backend_only (NVLink disabled); at 15 min the cross-rack faults: rack
4's NICs at 60 %, a port of rack 3 at 200G, rising symbol errors on a port of rack 2, a
flapping port on rack 1; at 20 min a congested spine bundle on rack 2's rail-5 leaf. Prints
each rack's backend fraction per window and the wall time::

    PYTHONPATH=. python scripts/multirack_run.py [--racks 4] [--minutes 30] [--dt 0.1]
        [--pattern agentic|allreduce|burn_in] [--payloads]

``--payloads`` also builds every rack's tray telemetry (node-agent contract) each second, as
a lock-step campaign feeding racky would.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from sims.backend import MultiRack, pattern_workloads


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--racks", type=int, default=4)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--dt", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--pattern", default="agentic", choices=("agentic", "allreduce", "burn_in"))
    ap.add_argument("--payloads", action="store_true")
    ns = ap.parse_args()
    n = ns.racks
    mr = MultiRack(n, seed=ns.seed, workloads=pattern_workloads(ns.pattern, n, ns.seed))
    total = ns.minutes * 60.0
    steps = round(total / ns.dt)
    per_s = round(1.0 / ns.dt)
    windows = [0.0, 600.0, 900.0, 1200.0, total]
    marks: list[list[tuple[float, float]]] = []
    wall0 = time.perf_counter()
    payload_s = 0.0
    for k in range(steps):
        t = mr.time_s
        if abs(t - 600.0) < ns.dt / 2:
            mr.set_phase("backend_only")
        if abs(t - 900.0) < ns.dt / 2:
            mr.underperform_nics(n - 1, 0.6)
            mr.degrade_link_speed(min(2, n - 1), "gpu07/nic1", 25_000.0)
            mr.ramp_symbol_errors(1, "gpu03/nic0", 0.5, 20.0, 600.0)
            mr.flap_link(0, "gpu10/nic0", 5.0, 155.0, count=3)
        if abs(t - 1200.0) < ns.dt / 2:
            mr.congest_spine(min(1, mr.network.pods - 1), 5, 1, 0.2)
        if any(abs(t - w) < ns.dt / 2 for w in windows):
            marks.append([(b.achieved_bytes, b.expected_bytes)
                          for b in (mr.rack_backend(i) for i in range(n))])
        mr.step(ns.dt)
        if ns.payloads and (k + 1) % per_s == 0:
            p0 = time.perf_counter()
            ts = 1_700_000_000_000_000_000 + round(mr.time_s * 1e9)
            for i in range(n):
                mr.tray_payloads(i, ts)
            payload_s += time.perf_counter() - p0
    marks.append([(b.achieved_bytes, b.expected_bytes)
                  for b in (mr.rack_backend(i) for i in range(n))])
    wall = time.perf_counter() - wall0
    print(f"{n} racks, {ns.minutes:g} virtual min at dt {ns.dt:g} s ({steps} lock-step steps), "
          f"pattern {ns.pattern}: wall {wall:.1f} s"
          + (f" (of which tray payloads {payload_s:.1f} s)" if ns.payloads else ""))
    names = ["0-10 min nvlink", "10-15 backend", "15-20 +faults", "20-end +spine"]
    for w in range(len(marks) - 1):
        fr = []
        for i in range(n):
            da = marks[w + 1][i][0] - marks[w][i][0]
            de = marks[w + 1][i][1] - marks[w][i][1]
            fr.append(f"{da / de:.3f}" if de > 0 else "n/a")
        print(f"  {names[w] if w < len(names) else w:16s} achieved/expected per rack: "
              + " ".join(fr))
    for i in range(n):
        c = mr.backend_ports(i)["counters"]
        print(f"  rack{i + 1}: symbol_error max {max(c['symbol_error'])}, link_downed max "
              f"{max(c['link_downed'])}, ports below speed {mr.rack_backend(i).ports_below_speed}")
    u = mr.spine_bundles()["utilisation"]
    print(f"  spine bundles: utilisation max {u.max():.2f}, median {float(np.median(u)):.2f}")
    print(f"  faults: {[(f.kind, f.rack, f.target) for f in mr.fault_log()]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
