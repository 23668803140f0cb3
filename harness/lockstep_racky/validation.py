"""Validation on the simulator (burn-in, `run_validation`) and the ``rackctl lockstep --daemon
racky`` command line (`main`)."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from harness.lockstep_racky.run import WALL0_NS, RackyLockstepResult, default_config, run_racky
from rackplane.errors import CommandError
from racky.config import RackyConfig
from racky.core.controller import RackyCore
from racky.core.validation import ValidationResult, combine
from racky.report import write_report
from sims.scenario import FabricSpec, LoadSpec, PlantSpec, Scenario, ScenarioRun


def burn_in_scenario(load_s: float, backend_s: float, *, warm_s: float = 60.0,
                     fraction: float = 0.9, traffic: float = 0.5, seed: int = 21,
                     rack_max_power_w: float = 132_000.0) -> Scenario:
    """A burn-in: idle warm-up, then every GPU at ``fraction`` of TDP with link traffic
    ``traffic`` (BurnInWorkload) for the load and backend phases."""
    return Scenario(
        name="burn-in", description="validation burn-in", reference="issue 5 validation",
        duration_s=warm_s + load_s + backend_s + 5.0, seed=seed,
        plant=PlantSpec(rack_max_power_w=rack_max_power_w, model="rack"),
        load=LoadSpec(kind="burn_in", fraction=fraction, traffic=traffic),
        fabric=FabricSpec(enabled="on"),
    )


def run_validation(
    stage: Literal["node", "rack", "multi-rack"] = "rack",
    cfg: RackyConfig | None = None,
    *,
    trays: Sequence[int] | None = None,
    racks: int = 2,
    load_s: float = 120.0,
    backend_s: float = 60.0,
    warm_s: float = 60.0,
    out_dir: Path | None = None,
    plant_dt_s: float = 0.1,
    fault: Callable[[float, ScenarioRun, RackyCore], None] | None = None,
) -> tuple[ValidationResult, list[RackyLockstepResult], Path | None]:
    """Run a validation stage on the simulator in lock-step and judge it (racky's criteria).

    The burn-in phases are applied to the simulator here: ``load`` (burn-in power and
    traffic) and ``backend`` (every NVLink port silenced, every GPU's traffic forced to full:
    the collective goes over the NICs). The node stage tests ``trays``; the multi-rack stage
    runs ``racks`` racks through the same window and judges them together. ``fault`` is a hook
    (e.g. a fouled cold plate) to check that a bad rack fails. The lifecycle of each rack's
    core moves on the result (production / quarantined); with ``out_dir`` a Markdown report
    with PNG plots is written.

    Returns:
        (the verdict, the runs, the report path or None).
    """
    cfg = cfg or RackyConfig()
    n = racks if stage == "multi-rack" else 1
    results: list[ValidationResult] = []
    runs: list[RackyLockstepResult] = []
    for i in range(n):
        sc = burn_in_scenario(load_s, backend_s, warm_s=warm_s, seed=21 + i)
        ident = cfg.identity.model_copy(update={"rack": f"{cfg.identity.rack}" if n == 1
                                                else f"rack{i + 1}"})
        rcfg = cfg.model_copy(update={"identity": ident})

        def hook(now: float, run: ScenarioRun, core: RackyCore, _i: int = i) -> None:
            if fault is not None and _i == 0:
                fault(now, run, core)
            if abs(now - warm_s) < 1e-6:
                core.start_validation(stage, now, WALL0_NS + round(now * 1e9), "lockstep",
                                      trays=trays, load_s=load_s, backend_s=backend_s)
            if abs(now - (warm_s + load_s)) < 1e-6 and backend_s > 0:
                fab = run.rack.fabric if run.rack is not None else None
                if fab is not None:
                    names = fab.port_names()
                    for p, nm in enumerate(names):
                        if "/nvl" in nm:
                            fab.silence(p, backend_s + 2.0)
                    for g in range(fab.gpus):
                        fab.burst(g, backend_s + 2.0, 1.0)

        r = run_racky(sc, rcfg, plant_dt_s=plant_dt_s, hook=hook)
        runs.append(r)
        res = r.core.last_result
        if res is None:
            raise RuntimeError("the validation did not finish within the burn-in scenario")
        results.append(res)
    verdict = results[0] if n == 1 else combine(results)
    path = None
    if out_dir is not None:
        path = write_report(results if n > 1 else [verdict], out_dir,
                            title=f"racky validation: {stage} stage (lock-step simulator)")
    return verdict, runs, path


# --- command line ---------------------------------------------------------------------------------


def _summary(r: RackyLockstepResult) -> str:
    lines = [f"scenario {r.scenario.name}: {len(r.trace['t_s'])} ticks, "
             f"{len(r.commands)} agent commands, {len(r.raised())} alarms raised"]
    for a in r.raised():
        lines.append(f"  t={a.t_s:8.1f} s  {a.severity:8s} {a.id}: {a.message}")
    for f in r.ground_truth:
        lines.append(f"  fault {f.kind} {f.target} {f.start_s}..{f.end_s}")
    return "\n".join(lines)


def _positive(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number > 0")
    return v


def _trays(text: str) -> list[int]:
    """argparse type: tray indices, comma-separated (``0,1,5``)."""
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: tray indices separated by commas, e.g. 0,1") from None


def main(argv: Sequence[str] | None = None) -> int:
    """``rackctl lockstep --daemon racky run SCENARIO [--duration S] [--plant-dt S]`` |
    ``validate --stage node|rack|multi-rack --out DIR [--trays 0,1] [--load-s S]
    [--backend-s S] [--racks N]``. Exit 0 (validation FAIL: 1); a bad argument or a
    refused validation plan: 2 with the reason (no traceback)."""
    ap = argparse.ArgumentParser(prog="rackctl lockstep --daemon racky")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a scenario with racky's tick in lock-step")
    r.add_argument("scenario", help="bundled scenario name or TOML path (rack-sim list)")
    r.add_argument("--duration", type=_positive, default=None,
                   help="plant seconds to run (default: the scenario's duration)")
    r.add_argument("--plant-dt", type=_positive, default=0.1,
                   help="plant step, s; must divide racky's 1 s tick (default 0.1)")
    r.add_argument("--budget-w", type=_positive, default=None, help="rack power budget, W")
    v = sub.add_parser("validate", help="validation stage on the simulator, with a report")
    v.add_argument("--stage", choices=("node", "rack", "multi-rack"), default="rack")
    v.add_argument("--out", type=Path, required=True, help="report directory")
    v.add_argument("--trays", type=_trays, default=None,
                   help="node stage (required there): trays, e.g. 0,1")
    v.add_argument("--racks", type=int, default=2, help="multi-rack stage: racks")
    v.add_argument("--load-s", type=_positive, default=120.0, help="burn-in load phase, s")
    v.add_argument("--backend-s", type=_positive, default=60.0,
                   help="backend-only phase (NVLink off), s")
    try:
        ns = ap.parse_args(argv)
    except SystemExit as err:  # argparse printed the usage and the problem
        return 0 if err.code == 0 else 2
    try:
        if ns.cmd == "run":
            cfg = default_config(budget_w=ns.budget_w) if ns.budget_w else None
            res = run_racky(ns.scenario, cfg, plant_dt_s=ns.plant_dt, duration_s=ns.duration)
            print(_summary(res))
            return 0
        verdict, _, path = run_validation(ns.stage, trays=ns.trays, racks=ns.racks,
                                          load_s=ns.load_s, backend_s=ns.backend_s,
                                          out_dir=ns.out)
    except (CommandError, ValueError) as err:
        print(f"rackctl lockstep --daemon racky {ns.cmd}: {err}", file=sys.stderr)
        return 2
    print(f"{verdict.stage}: {'PASS' if verdict.passed else 'FAIL'}; report {path}")
    for c in verdict.criteria:
        print(f"  {'pass' if c.passed else 'FAIL'}  {c.name}: {c.measured} ({c.limit})")
    return 0 if verdict.passed else 1
