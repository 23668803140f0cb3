"""The bench's ``chaos`` section (issue 15, item 6): `harness.chaos.run_chaos` with
``Context.chaos_failovers`` failovers of each kind (default 20; 3 with ``--quick``) against a
private 3-node NATS cluster started here, the suite's Mosquitto and the simulated CDU; its
figures from the epoch gate's records, the daemons' log events and the CDU's supply
temperature; then ``n // 10`` (at least one) kills 2 s into an S1 load step, each beside a
run of the same seed without one and a run of the CDU's local control alone, no valvey
(`harness.chaos_s1`, about 2 min each). The chaos run stops
starting failovers after `BUDGET_S_PER_FAILOVER` s per planned failover (the figure
``bench.chaos.skipped_failovers`` says how many it skipped). Last, the lease's CPU cost
(`lease_cost`): a holder and a standby of one lease key on the same 3-node cluster, each a
process of its own (``harness.benchkids.lease_cost``), measured over `LEASE_COST_S`."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from pathlib import Path
from typing import Any, Final

from harness.benchrun import Context, bench_script, pct, spawn
from harness.chaos import KINDS, LEASE, ChaosResult, Failover, run_chaos
from harness.chaos_s1 import AFTER_S, S1Run, s1_run
from harness.figures import Comparison, Figure
from harness.servers import NatsCluster

__all__ = ["CHAOS_NAMES", "chaos_figures", "lease_cost", "section_chaos"]

BUDGET_S_PER_FAILOVER: Final = 30.0
"""Time budget per planned failover (s): a kill takes about lease + restart (~10 s here), a
NATS node kill an election plus a rejoin (~20 s)."""

SUPPLY_TARGET_K: Final = 0.5
LEASE_CPU_TARGET_CORE: Final = 0.02
LEASE_COST_S: Final = 30.0
"""How long each lease process's CPU is measured (s): 15 renewals at the default 2 s."""
KILL_TARGET_S: Final = LEASE["lease_s"] + 2.0

CHAOS_NAMES: list[tuple[str, str, float | None, Comparison]] = [
    ("bench.chaos.stale_write_attempts", "writes", 0.0, "=="),
    ("bench.chaos.stale_writes_accepted", "writes", 0.0, "=="),
    ("bench.chaos.two_writer_intervals", "intervals", 0.0, "=="),
    ("bench.chaos.kill_takeover_p50_s", "s", None, "info"),
    ("bench.chaos.kill_takeover_p99_s", "s", KILL_TARGET_S, "<="),
    ("bench.chaos.pause_long_takeover_p99_s", "s", None, "info"),
    ("bench.chaos.partition_takeover_p99_s", "s", None, "info"),
    ("bench.chaos.pause_short_leader_changes", "changes", 0.0, "=="),
    ("bench.chaos.node_loss_leader_changes", "changes", 0.0, "=="),
    ("bench.chaos.node_loss_fencings", "fencings", 0.0, "=="),
    ("bench.chaos.supply_error_through_failover_k", "K", SUPPLY_TARGET_K, "<="),
    ("bench.chaos.supply_error_before_failover_k", "K", None, "info"),
    ("bench.chaos.skipped_failovers", "failovers", 0.0, "=="),
    ("bench.chaos.s1_supply_error_with_kill_k", "K", None, "info"),
    ("bench.chaos.s1_supply_error_without_kill_k", "K", None, "info"),
    ("bench.chaos.s1_extra_supply_error_k", "K", None, "info"),
    ("bench.chaos.s1_supply_error_local_control_k", "K", None, "info"),
    ("bench.chaos.lease_holder_cpu_core", "core", LEASE_CPU_TARGET_CORE, "<="),
    ("bench.chaos.lease_standby_cpu_core", "core", LEASE_CPU_TARGET_CORE, "<="),
]
S1_KILL_AFTER_S: Final = 2.0
"""The S1 comparison's kill: this long after the load step (s), in its transient."""


def _takeovers(fos: list[Failover]) -> list[float]:
    return [f.takeover_s for f in fos if f.takeover_s is not None]


def lease_cost(cluster: NatsCluster, tmp: Path, seconds: float = LEASE_COST_S
               ) -> dict[str, dict[str, Any]]:
    """``harness.benchkids.lease_cost``'s two contenders of one key and the connection alone,
    each a process of its own on ``cluster``, one fresh bucket, at once: ``holder`` (the one
    holding at the end), ``standby``, ``connection`` -> its JSON (``cpu_core``: process CPU
    s per wall s over ``seconds``; logs under ``tmp``).

    Raises:
        RuntimeError: a process failed (its log's tail), or not exactly one held the lease.
    """
    bucket, key = f"leasecost{uuid.uuid4().hex[:8]}", "bench.r00.valvey"
    kids = {}
    for role in ("a", "b", "connection"):
        out = tmp / f"lease-{role}.json"
        kids[role] = (out, spawn([sys.executable, *bench_script("lease_cost.py"), role,
                                  ",".join(cluster.urls), bucket, key, str(seconds), str(out)],
                                 tmp / f"lease-{role}.log"))
    res: dict[str, dict[str, Any]] = {}
    for role, (out, child) in kids.items():
        child.proc.wait(seconds + 90)
        if not out.exists():
            raise RuntimeError(f"lease {role} process failed: {child.tail()}")
        res[role] = json.loads(out.read_text())
    holders = [r for r in "ab" if res[r]["holding"]]
    if len(holders) != 1:
        raise RuntimeError(f"lease cost: {len(holders)} contenders held the lease: {res}")
    return {"holder": res[holders[0]], "standby": res["b" if holders[0] == "a" else "a"],
            "connection": res["connection"]}


def chaos_figures(res: ChaosResult, n_each: int, s1: list[tuple[S1Run, S1Run]],
                  lease: dict[str, dict[str, Any]] | None = None,
                  local: list[S1Run] | None = None) -> list[Figure]:
    """The section's figures (`CHAOS_NAMES`) from one chaos run of ``n_each`` per kind, the
    S1 comparisons (with a kill, without; ``local``: the CDU's local control alone, the same
    seed) and the lease's cost (`lease_cost`)."""
    s1_how = (f"max abs(supply - setpoint) in {AFTER_S:.0f} s after the S1 step, the active "
              f"killed {S1_KILL_AFTER_S} s after it / the same seed without a kill; "
              f"n={len(s1)} pairs of runs")
    with_k = [a.supply_error_k for a, _ in s1]
    without_k = [b.supply_error_k for _, b in s1]
    counts = ", ".join(f"{k} {len(res.of(k))}" for k in KINDS)
    how = f"{counts} failovers in {res.elapsed_s:.0f} s (lease {res.lease_s} s)"
    kill, node, short = res.of("kill"), res.of("nats_kill"), res.of("pause_short")
    during = [f.supply_error_k for f in kill if f.supply_error_k is not None]
    before = [f.baseline_error_k for f in kill if f.baseline_error_k is not None]
    stale = ", ".join(f"{k} {sum(f.stale_attempts for f in res.of(k))}" for k in KINDS)
    leaders = sum("KV leader" in f.detail for f in node)
    values: dict[str, tuple[float | None, str]] = {
        "bench.chaos.stale_write_attempts": (float(res.stale_attempts),
                                             f"{how}; refused in the failovers: {stale}"),
        "bench.chaos.stale_writes_accepted": (float(res.stale_accepted), how),
        "bench.chaos.two_writer_intervals": (float(res.two_writer_intervals), how),
        "bench.chaos.kill_takeover_p50_s": (pct(_takeovers(kill), 0.5),
                                            f"SIGKILL of the active, n={len(kill)}"),
        "bench.chaos.kill_takeover_p99_s": (pct(_takeovers(kill), 0.99),
                                            f"SIGKILL of the active, n={len(kill)}"),
        "bench.chaos.pause_long_takeover_p99_s": (
            pct(_takeovers(res.of("pause_long")), 0.99), "SIGSTOP of the active"),
        "bench.chaos.partition_takeover_p99_s": (
            pct(_takeovers(res.of("partition")), 0.99), "the active's NATS node paused"),
        "bench.chaos.pause_short_leader_changes": (
            float(sum(f.changes for f in short)), f"n={len(short)}"),
        "bench.chaos.node_loss_leader_changes": (
            float(sum(f.changes for f in node)), f"n={len(node)}, {leaders} KV leaders"),
        "bench.chaos.node_loss_fencings": (
            float(sum(f.fencings for f in node)), f"n={len(node)}, {leaders} KV leaders"),
        "bench.chaos.supply_error_through_failover_k": (
            max(during) if during else None,
            f"max abs(supply - setpoint) from a kill at steady load to its takeover + 10 s, "
            f"n={len(during)}"),
        "bench.chaos.supply_error_before_failover_k": (
            max(before) if before else None, "the 10 s just before each kill (settled: <= 0.25 K)"),
        "bench.chaos.skipped_failovers": (float(res.skipped), f"{n_each} of each planned"),
        "bench.chaos.s1_supply_error_with_kill_k": (max(with_k, default=None), s1_how),
        "bench.chaos.s1_supply_error_without_kill_k": (max(without_k, default=None), s1_how),
        "bench.chaos.s1_extra_supply_error_k": (
            max((a - b for a, b in zip(with_k, without_k, strict=True)), default=None),
            s1_how + "; the largest difference of a pair"),
        "bench.chaos.s1_supply_error_local_control_k": (
            max((r.supply_error_k for r in local or []), default=None),
            f"max abs(supply - setpoint) in {AFTER_S:.0f} s after the S1 step, the same seed, "
            f"no valvey: the CDU's own local control (its heartbeat fallback); "
            f"n={len(local or [])}"),
        **_lease_values(lease or {}),
    }
    return [Figure(name, values[name][0], unit, target, cmp, detail=values[name][1])
            for name, unit, target, cmp in CHAOS_NAMES]


def _lease_values(lease: dict[str, dict[str, Any]]) -> dict[str, tuple[float | None, str]]:
    base = lease.get("connection", {}).get("cpu_core")
    how = (f"process CPU s per wall s over {LEASE_COST_S:.0f} s, the default [leadership] "
           f"timing, a 3-node NATS cluster; the connection alone: "
           f"{'?' if base is None else f'{base:.5f}'} core")
    out: dict[str, tuple[float | None, str]] = {}
    for role in ("holder", "standby"):
        d = lease.get(role, {})
        v = d.get("cpu_core")
        out[f"bench.chaos.lease_{role}_cpu_core"] = (
            None if v is None else float(v),
            f"{how}; {role} (epoch {d.get('epoch')}, unknown outcomes {d.get('failures')})")
    return out


def section_chaos(ctx: Context) -> list[Figure]:
    """``ctx.chaos_failovers`` (3 with ``--quick``) failovers of each kind (module docstring);
    the in-process simulator's log goes to ``chaos-sim.log`` in ``ctx.out``.

    Raises:
        RuntimeError: nats-server is missing or its cluster did not form.
    """
    from rackplane.log import configure_logging

    assert ctx.srv is not None
    # the simulated CDU runs in this process: its log (info, JSON) to chaos-sim.log in the
    # output folder, not over the progress bar
    sim_log = (ctx.out / "chaos-sim.log").open("a", encoding="utf-8")
    configure_logging("info", "json", stream=sim_log)
    try:
        return _section_chaos(ctx)
    finally:
        configure_logging("warning")
        sim_log.close()


def _section_chaos(ctx: Context) -> list[Figure]:
    from harness.servers import start_nats_cluster

    assert ctx.srv is not None
    n_each = 3 if ctx.quick else ctx.chaos_failovers
    nats_dir = ctx.tmp / "chaos-nats"
    nats_dir.mkdir(parents=True, exist_ok=True)
    cluster = start_nats_cluster(nats_dir, cluster_name="rackplane-chaos")
    s1: list[tuple[S1Run, S1Run]] = []
    local: list[S1Run] = []
    try:
        res = asyncio.run(run_chaos(
            ctx.tmp / "chaos", ctx.srv.mosquitto, cluster, n_each,
            budget_s=BUDGET_S_PER_FAILOVER * n_each * len(KINDS),
            progress=ctx.progress))
        for i in range(max(1, n_each // 10)):
            runs = []
            for kill in (S1_KILL_AFTER_S, None):
                d = ctx.tmp / f"chaos-s1-{i}-{'kill' if kill else 'none'}"
                d.mkdir(parents=True, exist_ok=True)
                runs.append(asyncio.run(s1_run(d, ctx.srv.mosquitto, cluster, kill)))
            s1.append((runs[0], runs[1]))
            d = ctx.tmp / f"chaos-s1-{i}-local"
            d.mkdir(parents=True, exist_ok=True)
            local.append(asyncio.run(s1_run(d, ctx.srv.mosquitto, cluster, None,
                                            local_only=True)))
        lease_dir = ctx.tmp / "chaos-lease"
        lease_dir.mkdir(parents=True, exist_ok=True)
        lease = lease_cost(cluster, lease_dir)
    finally:
        cluster.stop()
    return chaos_figures(res, n_each, s1, lease, local)
