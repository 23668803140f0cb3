"""Time racky's learned-rate threshold grids (`racky.core.linkrate._compute_grid`) for the
default config's per-port design and its pooled part designs (a part of 72 and of 144
ports: the cap scales with the largest part): seconds (wall and this process's CPU), grid
size, chain solves; with ``--flat``, also the grid before the thresholds were solved per
point (ln ARL0 − h at the design's h, taken as flat in h: one chain per point) timed on the
same points, and the thresholds (`RateDesign.h_for`) from either at the grid's λ0.

Run from the repository root:  python scripts/bench_rate_grids.py [--flat] [--repeat N]
Not a test: the figures depend on the host (report its load with them).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.getcwd())

from racky.config import RackyConfig
from racky.core import linkrate
from racky.core.arlchain import log_arl0_many
from racky.core.linkparts import PartGrouper
from racky.core.links import rate_design
from racky.core.linkthresholds import bilinear


def _designs() -> dict[str, linkrate.RateDesign]:
    links = RackyConfig().links
    per_port = rate_design(links)
    out = {"per_port": per_port}
    for ports in (72, 144):
        out[f"pooled_{ports}"] = PartGrouper({"tray": list(range(ports))}, ports,
                                             per_port).det.d
    return out


def _timed(fn: Any) -> tuple[Any, float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0


def _flat_grid(d: linkrate.RateDesign) -> Any:
    """The grid before: ln λ0 every 0.35, φ every 0.25, ln ARL0 − h at the design's h."""
    ll = np.linspace(math.log(d.floor), math.log(d.cap),
                     max(2, math.ceil(math.log(d.cap / d.floor) / 0.35) + 1))
    pp = np.linspace(d.dispersion_min, d.dispersion,
                     max(2, math.ceil((d.dispersion - d.dispersion_min) / 0.25) + 1))
    lx, px = np.meshgrid(np.exp(ll), pp, indexing="ij")
    c = log_arl0_many(lx.ravel(), px.ravel(), d.ratio, d.h, d.alternative, 200)
    return ll, pp, c.reshape(lx.shape) - d.h


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--flat", action="store_true", help="also time the flat-in-h grid")
    ap.add_argument("--repeat", type=int, default=3, help="repeats (best of)")
    args = ap.parse_args()
    print(f"host load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    for name, d in _designs().items():
        key = d.grid_key
        assert d.arl0_bins is not None
        runs = [_timed(lambda k=key: linkrate._compute_grid(*k)) for _ in range(args.repeat)]
        (ll, pp, hg), wall, cpu = min(runs, key=lambda r: r[2])
        print(f"{name}: cap {d.cap:g}/bin, {len(ll)} x {len(pp)} = {hg.size} points; "
              f"{wall:.3f} s wall, {cpu:.3f} s CPU (best of {args.repeat}); "
              f"non-finite {int((~np.isfinite(hg)).sum())}")
        if not args.flat:
            continue
        runs = [_timed(lambda d=d: _flat_grid(d)) for _ in range(args.repeat)]
        (fl, fp, c), wall_f, cpu_f = min(runs, key=lambda r: r[2])
        print(f"  flat: {c.size} points; {wall_f:.3f} s wall, {cpu_f:.3f} s CPU; new/flat CPU "
              f"{cpu / cpu_f:.1f}x")
        ln_t = math.log(d.arl0_bins)
        for phi in (1.0, 1.5, 2.0):
            l0 = np.exp(fl)
            h_new = d.h_for(l0, np.full(l0.shape, phi))
            h_flat = np.clip(ln_t - bilinear(fl, fp, c, fl, np.full(l0.shape, phi)),
                             d.h_min, d.h_max)
            k = int(np.argmax(h_flat - h_new))
            print(f"  φ={phi}: h_flat − h_new from {np.min(h_flat - h_new):+.2f} to "
                  f"{np.max(h_flat - h_new):+.2f} (largest at λ0 {l0[k]:.1f}/bin: "
                  f"{h_flat[k]:.2f} -> {h_new[k]:.2f})")


if __name__ == "__main__":
    main()
