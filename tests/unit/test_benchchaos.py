"""The chaos section's figures from hand-made results (issue 15): every name of
`CHAOS_NAMES` computed, the S1 comparison beside the CDU's local control alone, the lease's
CPU cost per role; and `first_move`, the valve demand's first change after a takeover."""

from __future__ import annotations

from harness.benchchaos import CHAOS_NAMES, LEASE_CPU_TARGET_CORE, chaos_figures
from harness.chaos import ChaosResult, Failover, first_move
from harness.chaos_s1 import S1Run


def test_first_move_is_the_first_change_after_the_start_against_the_value_held_then() -> None:
    valve = [(0.0, 60.0), (1.0, 61.0), (2.0, 61.0), (3.0, 59.5), (4.0, 62.0)]
    assert first_move(valve, 1.5, 10.0) == -1.5  # held 61.0 at 1.5 s, then 59.5
    assert first_move(valve, 0.0, 0.9) is None  # no change within the window
    assert first_move(valve, 0.5, 1.0) == 1.0  # the change at the window's end counts
    assert first_move(valve, -1.0, 10.0) is None  # nothing held before the first sample


def test_the_figures_name_every_entry_and_report_local_control_and_the_lease_cost() -> None:
    res = ChaosResult(failovers=[
        Failover("kill", 10.0, takeover_s=3.2, supply_error_k=0.2, baseline_error_k=0.1,
                 valve_move_pct=1.1),
        Failover("kill", 50.0, takeover_s=3.6, supply_error_k=0.3, baseline_error_k=0.2)])
    s1 = [(S1Run(2.0, 0.8, 4.2), S1Run(None, 0.75, None))]
    local = [S1Run(None, 1.33, None, local_only=True)]
    lease = {"holder": {"cpu_core": 0.0005, "epoch": 2, "failures": 0},
             "standby": {"cpu_core": 0.03, "epoch": 0, "failures": 1},
             "connection": {"cpu_core": 0.00002}}
    figs = {f.name: f for f in chaos_figures(res, 2, s1, lease, local)}
    assert list(figs) == [n for n, *_ in CHAOS_NAMES]
    assert figs["bench.chaos.supply_error_through_failover_k"].value == 0.3
    assert figs["bench.chaos.s1_supply_error_local_control_k"].value == 1.33
    assert abs(figs["bench.chaos.s1_extra_supply_error_k"].value - 0.05) < 1e-9  # type: ignore[operator]
    holder = figs["bench.chaos.lease_holder_cpu_core"]
    assert (holder.value, holder.target, holder.comparison) == (0.0005, LEASE_CPU_TARGET_CORE,
                                                                "<=")
    assert "0.00002 core" in holder.detail
    assert figs["bench.chaos.lease_standby_cpu_core"].value == 0.03  # reported, not hidden
    # without the lease run or the local runs the figures are missing (None), never made up
    bare = {f.name: f for f in chaos_figures(res, 2, s1)}
    assert bare["bench.chaos.lease_holder_cpu_core"].value is None
    assert bare["bench.chaos.s1_supply_error_local_control_k"].value is None
