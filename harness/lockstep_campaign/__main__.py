"""``python -m harness.lockstep_campaign --out DIR [--scenario NAME ...] [--racks N]``: run the
scenario set's campaigns in lock-step, write the reports, print the per-rack verdicts and the
figures. Exit 0 when every injected fault was found with its part and no healthy rack was
quarantined, 1 otherwise, 2 for a bad argument."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from harness.lockstep_campaign.report import _found, figures, write_summary
from harness.lockstep_campaign.run import SCENARIOS, run_campaign


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (module docstring)."""
    names = [s.name for s in SCENARIOS]
    ap = argparse.ArgumentParser(prog="python -m harness.lockstep_campaign")
    ap.add_argument("--out", type=Path, required=True, help="report directory")
    ap.add_argument("--scenario", action="append", choices=names,
                    help="run only these (repeatable; default: all)")
    ap.add_argument("--racks", type=int, default=4, choices=range(4, 9),
                    help="racks (4..8: the faults sit on racks 2-4)")
    try:
        ns = ap.parse_args(argv)
    except SystemExit as err:
        return 0 if err.code == 0 else 2
    runs = []
    for sc in SCENARIOS:
        if ns.scenario and sc.name not in ns.scenario:
            continue
        r = run_campaign(sc, racks=ns.racks)
        runs.append(r)
        print(f"{sc.name}: wall {r.wall_s:.1f} s, plant {r.plant_s:g} s")
        for rack, v in r.verdicts.items():
            print(f"  {rack} {'PASS' if v.passed else 'FAIL'} {v.status}: {v.reason}")
    path = write_summary(runs, ns.out)
    f = figures(runs)
    print(f"faults found with the part named: {_found(f)}; "
          f"false quarantines: {f['false_quarantines']}; "
          f"longest campaign {f['max_wall_s']:.1f} s wall; report {path}")
    ok = f["found"] == f["faults"] and f["false_quarantines"] == 0 and f["all_finished"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
