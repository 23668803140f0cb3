"""The short chaos run (issue 15, item 6): two failovers of each kind of `harness.chaos.KINDS`
(kill, pause longer and shorter than the renew deadline, the active's host cut off the bus,
one NATS node killed: the KV stream's leader, then a follower) against a private 3-node NATS
JetStream cluster, Mosquitto and the simulated CDU with its epoch gate. The bench's ``chaos``
section runs the same code with 20 of each (``rackctl bench --only chaos``).

The targets, two-sided where a figure has a floor: no write from a stale epoch accepted or
even attempted at the CDU; no two epochs writing at once; kill → new active writing within
lease + 2 s and not before the lease could have run out; a pause shorter than the deadline
and a lost NATS node (its KV leader included) change no active and fence nothing; through an
unplanned failover at steady load the supply stays within 0.5 K of its setpoint, and the
takeover is bumpless: the valve demand's first move after it is one step of the loop (at
most its rate limit over one period), never a jump.

The supply error through a kill was an xfail (0.51-0.59 K on a run's first kill, exactly
0.0 K before it): the first kill came ~10 s into the run, with the scenario's 30 → 100 %
load step, so the figure was the step's response (the warm-started plant sat exactly at its
setpoint until then). `harness.chaos` now waits for the step's response to be over (the loop
at rest) before a kill. The takeover's own bump was a second cause (4-5 % of valve back to a
value the standby had computed and withheld in the step's transient, re-asserted by the
read-back reconciliation: `ValveyCore.track_active_output` fixed it). Stale write attempts
after a pause or a partition were the other miss until the Modbus client asked the fence
again right before each request goes out; they are asserted 0 now.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.chaos import LEASE, SETTLED_K, run_chaos
from harness.servers import Mosquitto, NatsCluster
from valvey.core.supply_loop_settings import SupplyLoopSettings

pytestmark = [pytest.mark.servers, pytest.mark.slow]

N_EACH = 2


async def test_a_short_chaos_run_meets_the_failover_targets(
    tmp_path: Path, mosquitto: Mosquitto, nats_cluster_private: NatsCluster,
) -> None:
    res = await run_chaos(tmp_path, mosquitto, nats_cluster_private, N_EACH, budget_s=600.0)
    lines = [f"{f.kind}: takeover {f.takeover_s}, changes {f.changes}, fencings {f.fencings}, "
             f"stale attempts {f.stale_attempts}, "
             f"supply error {f.supply_error_k} K (before {f.baseline_error_k} K), "
             f"valve move {f.valve_move_pct} %; {f.detail}"
             for f in res.failovers]
    figures = (f"stale attempts {res.stale_attempts}, stale accepted {res.stale_accepted}, "
               f"two-writer intervals {res.two_writer_intervals}, skipped {res.skipped}, "
               f"{res.elapsed_s:.0f} s\n" + "\n".join(lines))
    print("\n" + figures)
    assert res.skipped == 0, figures
    assert len(res.failovers) == N_EACH * 5, figures
    assert res.stale_accepted == 0, figures
    assert res.two_writer_intervals == 0, figures
    # no write attempt from an old epoch reaches the device, whatever the kind: a resumed old
    # active's writes queued before its pause are dropped by the fence asked again right
    # before the request goes out (rackplane.io.modbus.client; issue 15 item 4)
    assert res.stale_attempts == sum(f.stale_attempts for f in res.failovers) == 0, figures
    for f in res.of("kill"):
        assert f.takeover_s is not None, figures
        # not before the old holder's last renewal could have run out; within lease + 2 s
        assert LEASE["lease_s"] - LEASE["renew_every_s"] - 0.1 <= f.takeover_s, figures
        assert f.takeover_s <= LEASE["lease_s"] + 2.0, figures
    for f in res.of("pause_long") + res.of("partition"):
        assert f.takeover_s is not None, figures
        assert f.takeover_s >= LEASE["lease_s"] - LEASE["renew_every_s"] - 0.1, figures
        assert f.changes > 0, figures  # the takeover was seen in the logs
    for f in res.of("pause_short") + res.of("nats_kill"):
        assert (f.takeover_s, f.changes, f.fencings) == (None, 0, 0), figures
    assert any("KV leader" in f.detail for f in res.of("nats_kill")), figures
    # bumpless: one period of the (default) loop's rate limit, plus the register's 0.1 %
    loop = SupplyLoopSettings()
    one_step_pct = loop.output_rate_limit_pct_per_s * loop.period_s + 0.1
    for f in res.of("kill"):  # measured, at steady load before the kill
        assert f.supply_error_k is not None and f.baseline_error_k is not None, figures
        assert "not settled" not in f.detail and f.baseline_error_k <= SETTLED_K, figures
        assert f.supply_error_k <= 0.5, figures  # issue 15
        assert f.valve_move_pct is None or abs(f.valve_move_pct) <= one_step_pct, figures
