"""The benchmark suite (issue 8, issue 3's lock-step targets): ``rackctl bench --out DIR``.

Everything is measured side by side in one run on this machine, each figure from repeated runs
(median, with the spread min..max in ``detail``); absolute times are context, the ratios and
the targets are the point. The daemons run as subprocesses (``harness.benchkids.daemon_child``:
their console-script path `rackplane.io.service.run_daemon`, plus counters they do not publish)
against private Mosquitto and VictoriaMetrics servers (`harness.servers`); the node-agent load
comes from the simulators (``harness.benchkids.loadgen``: `sims.row.VirtualRack` +
`sims.telemetry.tray_payloads`); the bare-library baselines live in ``harness.benchkids``
(DESIGN §1: the only other importers of aiomqtt, pymodbus and influxdb-client).

=====================================  ==========================================================
figure (``bench.*``)                   how
=====================================  ==========================================================
``lockstep.valvey_plant_s_per_s``      plant s per wall s: load-step, valvey's tick at 10 Hz,
                                       CDU + rack thermal (`harness.lockstep_valvey.run_valvey`)
``lockstep.racky_plant_s_per_s``       rising-crc, the whole rack with its 1,440 link ports and
                                       racky's detectors at 1 Hz (`run_racky`)
``lockstep.link_days_per_s``           the link-only harness with racky's CUSUM (healthy links)
``lockstep.<runner>.instructions_per_  callgrind's instruction count (Ir) per plant second of a
plant_s``                              fixed segment of valvey's load-step (models cdu and rack)
                                       and racky's rising-crc, start-up not counted: stable
                                       across hosts (`harness.callgrind`, section ``callgrind``)
``ingest.*``                           8 racky processes (one per NVL72 rack, as deployed) fed a
                                       row of 8 racks' tray telemetry at 1 Hz: loss, CPU-s per
                                       wall-s of all of them, peak RSS
``capacity.*``                         the same at 2x, 3x, 4x the rate: the highest with 0 loss
``receive.*``                          racky (rack1) vs a bare aiomqtt subscriber, one flood
``tick.*``                             valvey's 10 Hz tick lateness p50/p99, idle and under the
                                       ingest load (valvey polls the CDU simulator's Modbus face)
``restart.*``                          SIGKILL -> READY (sd_notify) of racky, spool intact
``modbus.*``                           CPU of polling the CDU map at 10 Hz: rackplane.io.modbus vs
                                       raw pymodbus decoding the same requests, same server
``tsdb.*``                             points/s through the spool vs raw influxdb-client batches
``row.*``                              1 then 8 racks' valvey + racky + simulator processes on
                                       one host: daemons' CPU, tick p99, losses, simulator lag
                                       (`harness.benchrow`)
``rlc.allocation_cycle_1800_racks_ms`` rlc's allocation cycle (ledgers, allocator, leases) for
                                       1,800 racks, one thread (`harness.bench_rlc`, issue 16)
=====================================  ==========================================================

A section that cannot run (no server binary, a daemon that does not start) yields failed
figures with the reason in ``detail``; the suite goes on. ``quick`` is a 1-2 minute smoke.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.benchrun import (
    Context,
    failed_figures,
    machine_info,
    reason_of,
    spread_figure,
    start_servers,
)
from harness.benchsections import SECTIONS
from harness.callgrind import callgrind_figures
from harness.figures import Figure, Progress, no_progress, write_results
from harness.machine import machine_line
from harness.progress import progress_reporter

__all__ = ["main", "run_suite"]


# -- lock-step ---------------------------------------------------------------------------------


def bench_lockstep(quick: bool, progress: Progress) -> list[Figure]:
    """Plant seconds per wall second of both lock-step runners and the link harness."""
    figs: list[Figure] = []
    reps = 1 if quick else 3
    # valvey: CDU + rack thermal (model "cdu", REFERENCE §4) with valvey's cores at 10 Hz; and
    # the whole virtual rack (workload, node agents, shelves) for context
    for model, name, target in (("cdu", "valvey_plant_s_per_s", 1000.0),
                                ("rack", "valvey_full_rack_plant_s_per_s", None)):
        fname = f"bench.lockstep.{name}"
        try:
            from harness.lockstep_valvey import run_valvey
            from sims.scenario import load_scenario

            sc = load_scenario("load-step")
            plant_s = 60.0 if quick else min(sc.duration_s, 330.0)
            rates = []
            for i in range(reps):
                t0 = time.perf_counter()
                run_valvey(sc, duration_s=plant_s, model=model)  # type: ignore[arg-type]
                rates.append(plant_s / (time.perf_counter() - t0))
                progress(f"lock-step valvey {model}", (i + 1) / reps)
            figs.append(spread_figure(
                fname, rates, "plant s/wall s", target, ">=" if target else "info",
                f"load-step, {plant_s:.0f} plant s, model {model}, plant 10 Hz + valvey tick "
                "10 Hz"))
        except Exception as err:
            figs += failed_figures([(fname, "plant s/wall s", target, ">=" if target else "info")],
                                   reason_of(err))
    # racky: the whole rack, 1,440 link ports, detectors at 1 Hz
    try:
        from harness.lockstep_racky import run_racky
        from sims.scenario import load_scenario

        sc = load_scenario("rising-crc")
        plant_s = 60.0 if quick else 600.0
        rates = []
        ports = None
        for i in range(reps):
            t0 = time.perf_counter()
            res = run_racky(sc, duration_s=plant_s)
            rates.append(plant_s / (time.perf_counter() - t0))
            ports = _port_count(res)
            progress("lock-step racky", (i + 1) / reps)
        figs.append(spread_figure(
            "bench.lockstep.racky_plant_s_per_s", rates, "plant s/wall s", 100.0, ">=",
            f"rising-crc, {plant_s:.0f} plant s, plant 10 Hz, racky 1 Hz, "
            f"{ports if ports is not None else '?'} link ports", link_ports=ports))
    except Exception as err:
        figs += failed_figures(
            [("bench.lockstep.racky_plant_s_per_s", "plant s/wall s", 100.0, ">=")],
            reason_of(err))
    # the link-only harness with racky's CUSUM on healthy links
    try:
        figs += _bench_harness(quick, progress)
    except Exception as err:
        figs += failed_figures([("bench.lockstep.link_days_per_s", "link-days/s", None, "info")],
                               reason_of(err))
    return figs


def _port_count(res: Any) -> int | None:
    """Link ports racky's detectors ran on (``core.links.n``), None when unknown."""
    links = getattr(getattr(res, "core", None), "links", None)
    n = getattr(links, "n", None)
    return n if isinstance(n, int) else None


def _bench_harness(quick: bool, progress: Progress) -> list[Figure]:
    from rackplane.core.detect.change import PoissonCusum
    from racky.core.linkrate import LearnedRateCusum
    from racky.core.links import rate_design
    from racky.link_settings import LinkSettings
    from sims.link_harness import RateProfile, run

    ls = LinkSettings()
    lam0 = ls.healthy_rate_per_min
    lam1 = ls.cusum_lambda1_per_min
    design = rate_design(ls)

    def factory(n: int) -> Any:  # the alarm's detector: learned baselines (issue 22)
        if ls.rate_learned:
            return LearnedRateCusum(n, design)
        return PoissonCusum(n, lam0, lam1, ls.cusum_h, watch_h=ls.cusum_watch_h)

    n_links = 2_000 if quick else 100_000
    reps = 1 if quick else 2
    rates = []
    alarms = []
    for i in range(reps):
        t0 = time.perf_counter()
        res = run(RateProfile.healthy(lam0), n_links, 1440, factory, seed=i)
        rates.append(res.link_days / (time.perf_counter() - t0))
        alarms.append(res.total_alarms)
        progress("link harness", (i + 1) / reps)
    return [
        spread_figure("bench.lockstep.link_days_per_s", rates, "link-days/s", None, "info",
                      f"{n_links:,} healthy links x 1 day, racky's rate detector ("
                      + (f"learned baselines, NB-CUSUM h {ls.rate_h:g}" if ls.rate_learned
                         else f"fixed CUSUM h {ls.cusum_h:g}") + ")"),
        Figure("bench.lockstep.link_harness_100k_days_s",
               100_000 / statistics.median(rates), "s", 300.0, "<=",
               detail="wall time of 100,000 link-days at the measured rate (issue 3: a few "
                      "minutes)"),
        Figure("bench.lockstep.harness_false_alarms", float(sum(alarms)), "alarms",
               detail=f"in {reps * n_links:,} healthy link-days (S8 figure: "
                      "racky.S8 in the scenario report)"),
    ]


def run_suite(out: Path, quick: bool, progress: Progress = no_progress,
              only: Sequence[str] | None = None, chaos_failovers: int = 20) -> list[Figure]:
    """Run the suite (``only``: section names, ``lockstep``, ``callgrind`` and ``rlc`` among
    them; ``chaos_failovers``: failovers of each kind in the ``chaos`` section) and return
    figures. The callgrind output files are kept in ``out/callgrind``."""
    figs: list[Figure] = []
    if not only or "lockstep" in only:
        progress("lock-step", 0.0)
        figs += bench_lockstep(quick, progress)
    if not only or "callgrind" in only:
        progress("callgrind", 0.0)
        figs += callgrind_figures(out / "callgrind", quick, progress)
    if not only or "rlc" in only:
        progress("rlc allocation", 0.0)
        try:
            from harness.bench_rlc import bench_rlc

            figs += bench_rlc(quick, progress)
        except Exception as err:
            figs += failed_figures(
                [("bench.rlc.allocation_cycle_1800_racks_ms", "ms", 100.0, "<=")],
                reason_of(err))
    # the chaos run (up to 30 s per failover, 100 by default) only when asked for by name:
    # the rest of the suite keeps its 25-minute target (docs/BENCHMARKS.md)
    todo = [s for s in SECTIONS if (s[0] in only if only else s[0] != "chaos")]
    if not todo:
        return figs
    with tempfile.TemporaryDirectory(prefix="rackplane-bench-") as td:
        ctx = Context(Path(td), out, quick, progress, chaos_failovers=chaos_failovers)
        try:
            ctx.srv = start_servers(ctx.tmp)
        except RuntimeError as err:
            for _, _, names in todo:
                figs += failed_figures(names, f"servers: {err}")
            return figs
        try:
            for name, fn, names in todo:
                progress(name, 0.0)
                try:
                    figs += fn(ctx)
                except Exception as err:
                    figs += failed_figures(names, f"{name} failed: {reason_of(err)}")
                progress(name, 1.0)
        finally:
            ctx.srv.stop()
        try:
            write_plots(out, ctx.plots)
        except Exception as err:  # plots are context; a missing matplotlib is not a failure
            print(f"plots skipped: {reason_of(err)}", file=sys.stderr)
    return figs


def write_plots(out: Path, plots: dict[str, Any]) -> list[Path]:
    """tick-lateness histogram, ingest rate vs loss/CPU and the row's CPU and lateness (PNG)
    when the data exists."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    tick = plots.get("tick")
    if tick and (tick["idle"] or tick["load"]):
        fig, ax = plt.subplots(figsize=(7, 4))
        hi = max([*tick["idle"], *tick["load"], 1.0])
        bins = [hi * k / 60 for k in range(61)]
        if tick["idle"]:
            ax.hist(tick["idle"], bins=bins, alpha=0.6, label="idle")
        if tick["load"]:
            ax.hist(tick["load"], bins=bins, alpha=0.6, label="during 8-rack ingest")
        ax.set_xlabel("valvey tick lateness, ms")
        ax.set_ylabel("ticks")
        ax.set_yscale("log")
        ax.axvline(5.0, color="k", ls="--", lw=1, label="p99 target 5 ms")
        ax.legend()
        fig.tight_layout()
        p = out / "tick_lateness.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    cap = plots.get("capacity")
    if cap:
        fig, ax = plt.subplots(figsize=(7, 4))
        xs = [c[0] for c in cap]
        ax.plot(xs, [100 * c[1] for c in cap], "o-", label="messages lost, %")
        ax.set_xlabel("offered load, samples/s")
        ax.set_ylabel("lost, %")
        ax2 = ax.twinx()
        ax2.plot(xs, [c[2] for c in cap], "s--", color="tab:red", label="racky CPU, cores")
        ax2.set_ylabel("CPU-s per s (all racky processes)")
        fig.legend(loc="upper left")
        fig.tight_layout()
        p = out / "ingest_capacity.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    row = plots.get("row")
    if row:
        paths.append(_row_plot(plt, out, row))
    return paths


def _row_plot(plt: Any, out: Path, row: dict[str, dict[str, Any]]) -> Path:
    """row.png: the daemons' (and simulators') CPU and each daemon process's p99 tick
    lateness, per run of `harness.benchrow.section_row` (keys: the runs' labels, in order:
    1 rack, the row, the row at the normal policy)."""
    ns = list(row)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    xs = range(len(ns))
    ax1.bar([x - 0.2 for x in xs], [row[n]["cpu_cores"] for n in ns], 0.4,
            label="valvey + racky")
    ax1.bar([x + 0.2 for x in xs], [row[n]["sims_cpu_cores"] for n in ns], 0.4,
            label="simulators", color="tab:gray")
    ax1.axhline(1.0, color="k", ls="--", lw=1, label="daemons' target 1 core")
    ax1.set_xticks(list(xs), [n.replace(", ", ",\n") for n in ns], fontsize=8)
    ax1.set_ylabel("CPU-s per s (cores)")
    ax1.legend(fontsize=8)
    for x, n in zip(xs, ns, strict=True):
        p99 = row[n]["p99_ms"]
        for kind, mark in (("valvey", "o"), ("racky", "s")):
            vals = [v for k, v in p99.items() if k.startswith(kind + "@")]
            ax2.plot([x] * len(vals), vals, mark, alpha=0.7,
                     label=kind if x == 0 else None, color="tab:blue" if kind == "valvey"
                     else "tab:orange")
    ax2.axhline(5.0, color="k", ls="--", lw=1, label="p99 target 5 ms")
    ax2.set_xticks(list(xs), [n.replace(", ", ",\n") for n in ns], fontsize=8)
    ax2.set_xlim(-0.5, len(ns) - 0.5)
    ax2.set_ylabel("control-tick lateness p99 per process, ms")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    p = out / "row.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def main(out: Path, quick: bool, only: Sequence[str] | None = None,
         chaos_failovers: int = 20) -> int:
    """Run the benchmark suite into ``out`` (results.json, results.md, PNGs); ``only``: the
    sections to run (`run_suite`), ``chaos_failovers``: failovers of each kind in ``chaos``.

    Returns 0 when every figure meets its target, 1 otherwise (the files are written either
    way). ``quick``: a 1-2 minute smoke with short runs and single repeats.
    """
    out.mkdir(parents=True, exist_ok=True)
    progress, close = progress_reporter(by_first_word=False, label_width=20)
    t0 = time.monotonic()
    try:
        figures = run_suite(out, quick, progress, only, chaos_failovers)
    finally:
        close()
    m = machine_info()
    preamble = (
        f"Machine: {machine_line(m)}. {'Quick smoke' if quick else 'Full'} run, "
        f"{time.monotonic() - t0:.0f} s wall. A figure measured over repeated runs is their "
        "median, its spread in its detail (the last column); one measured once says so by its "
        "window; ratios are measured side by side in the same run. How each figure is made: "
        "docs/BENCHMARKS.md."
    )
    figures.append(Figure("bench.machine.cores", float(m["cores"] or 0), "cores",
                          detail=f"{m['cpu']}; {m['ram_gb']} GB; Python {m['python']}"))
    md = write_results(out, figures, "rackplane benchmarks", preamble)
    (out / "machine.json").write_text(json.dumps(m, indent=2) + "\n")
    failed = [f.name for f in figures if f.passed is False]
    print(f"{len(figures)} figures, {len(failed)} below target; {md}")
    return 1 if failed else 0
