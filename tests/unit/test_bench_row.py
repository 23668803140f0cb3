"""The row benchmark's figure computations (`harness.benchrow`): the tick window, the
simulator lag from its own clocks, the daemons' lost lines, the figures against the issue's
targets and the plot."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import bench
from harness.benchrow import RowRun, lost_lines, row_figures, sim_lag_s, window_lateness_ms

NS = 1_000_000_000


def test_window_lateness_keeps_only_the_window_in_ms() -> None:
    late = [0.5, 0.001, 0.002, 0.003, 0.4]
    mono = [9.0, 10.0, 10.5, 11.0, 11.5]
    assert window_lateness_ms(late, mono, 10.0, 11.0) == pytest.approx([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="tick times"):
        window_lateness_ms(late, mono[:-1], 0.0, 1.0)


def _plant(rack: str, wall0_ns: int, rows: list[tuple[float, float, float]]
           ) -> list[list[object]]:
    """rows of (recv_mono, plant t_s, wall s after wall0) as the observer stores them."""
    return [[rack, recv, t_s, wall0_ns + round(w * NS)] for recv, t_s, w in rows]


def test_sim_lag_is_wall_minus_plant_time_from_the_sims_own_clocks() -> None:
    # rack a keeps real time; rack b skipped 0.7 s of steps after the start, 0.5 s more later
    a = _plant("a", 5 * NS, [(100.0, 12.0, 0.0), (101.0, 13.0, 1.0), (102.0, 14.0, 2.0)])
    b = _plant("b", 7 * NS, [(100.0, 0.0, 0.0), (101.0, 0.3, 1.0), (102.0, 1.3, 2.0),
                             (103.0, 1.8, 3.0)])
    lag, growth = sim_lag_s([*a, *b, ["b", 104.0, None, None]], t0=101.5)
    assert lag == pytest.approx({"a": 0.0, "b": 1.2})
    # from the first message heard at or after t0 (b at 102: lag 0.7) to the last (1.2)
    assert growth == pytest.approx({"a": 0.0, "b": 0.5})
    # an observer's late receipt does not count: only the simulator's stamps do
    late_recv = _plant("a", 5 * NS, [(100.0, 12.0, 0.0), (250.0, 13.0, 1.0)])
    assert sim_lag_s(late_recv)[0] == pytest.approx({"a": 0.0})


def test_lost_lines_from_each_daemons_last_self_metrics() -> None:
    health = [
        ["r1", "valvey", 1.0, {"telemetry_dropped_lines": 5, "telemetry_rejected_lines": 0}],
        ["r1", "valvey", 2.0, {"telemetry_dropped_lines": 7, "telemetry_rejected_lines": 2}],
        ["r1", "racky", 2.0, {"telemetry_dropped_lines": 0, "telemetry_rejected_lines": 0}],
    ]
    assert lost_lines(health, ["valvey@r1", "racky@r1", "racky@r2"]) == {
        "valvey@r1": 9, "racky@r1": 0, "racky@r2": None}


def _run(n: int, *, cpu_s: float = 3.0, late: float = 1.0, lost: int | None = 0,
         parsed_short: int = 0, lag: float = 0.1) -> RowRun:
    racks = [f"r{i}" for i in range(n)]
    keys = [f"{d}@{r}" for r in racks for d in ("valvey", "racky")]
    return RowRun(
        n_racks=n, window_s=10.0, startup_s=5.0,
        daemon_cpu_s=dict.fromkeys(keys, cpu_s / len(keys)),
        sim_cpu_s=dict.fromkeys(racks, 0.5),
        late_ms={k: [late] * 97 + [late * 3] * 2 + [late * 10] for k in keys},
        health_late_ms=[late], lost_lines={k: lost for k in keys},
        tray_published=dict.fromkeys(racks, 180),
        tray_parsed={r: 180 - (parsed_short if i == 0 else 0) for i, r in enumerate(racks)},
        lag_s={r: lag for r in racks}, lag_growth_s=dict.fromkeys(racks, 0.0))


def _by_name(one: RowRun | None, row: RowRun | None) -> dict[str, object]:
    return {f.name: f for f in row_figures(one, row)}


def test_row_figures_meet_the_targets_of_a_good_row() -> None:
    figs = _by_name(_run(1, cpu_s=0.5), _run(8))
    cpu = figs["bench.row.daemons_cpu_cores"]
    assert cpu.value == pytest.approx(0.3) and cpu.passed  # type: ignore[attr-defined]
    assert figs["bench.row.one_rack.daemons_cpu_cores"].value == pytest.approx(0.05)  # type: ignore[attr-defined]
    # 97 x 1 ms, 2 x 3 ms, one 10 ms tick: the 99th percentile, not the max nor the median
    p99 = figs["bench.row.tick_late_p99_ms"]
    assert p99.value == pytest.approx(3.0) and p99.passed  # type: ignore[attr-defined]
    for name in ("bench.row.samples_lost", "bench.row.tray_messages_lost",
                 "bench.row.sim_lag_s"):
        assert figs[name].passed, name  # type: ignore[attr-defined]


def test_row_figures_fail_a_row_that_misses_each_target() -> None:
    figs = _by_name(_run(1), _run(8, cpu_s=12.0, late=2.0, lost=3, parsed_short=4, lag=1.5))
    assert figs["bench.row.daemons_cpu_cores"].value == pytest.approx(1.2)  # type: ignore[attr-defined]
    assert figs["bench.row.tick_late_p99_ms"].value == pytest.approx(6.0)  # type: ignore[attr-defined]
    assert figs["bench.row.samples_lost"].value == 3 * 16  # type: ignore[attr-defined]
    assert figs["bench.row.tray_messages_lost"].value == 4  # type: ignore[attr-defined]
    assert figs["bench.row.sim_lag_s"].value == pytest.approx(1.5)  # type: ignore[attr-defined]
    for name in ("bench.row.daemons_cpu_cores", "bench.row.tick_late_p99_ms",
                 "bench.row.samples_lost", "bench.row.tray_messages_lost",
                 "bench.row.sim_lag_s"):
        assert figs[name].passed is False, name  # type: ignore[attr-defined]


def test_row_figures_without_self_metrics_or_a_run_fail_not_pass() -> None:
    figs = _by_name(_run(1), _run(8, lost=None))
    lost = figs["bench.row.samples_lost"]
    assert lost.value is None and lost.passed is False  # type: ignore[attr-defined]
    assert "no self-metrics from valvey@r0" in lost.detail  # type: ignore[attr-defined]
    none = _by_name(None, None)
    assert all(f.passed is not True for f in none.values())  # type: ignore[attr-defined]


def test_row_plot_is_written(tmp_path: Path) -> None:
    row = {label: {"cpu_cores": 0.1 * n, "sims_cpu_cores": 0.05 * n,
                   "p99_ms": {"valvey@a": 2.0, "racky@a": 1.0}, "median_late_ms": 0.5}
           for label, n in (("1 rack", 1), ("8 racks", 8), ("8 racks, normal policy", 8))}
    paths = bench.write_plots(tmp_path, {"row": row})
    assert [p.name for p in paths] == ["row.png"] and paths[0].stat().st_size > 1000


@pytest.mark.servers
def test_row_run_of_two_racks_measures_every_process(tmp_path: Path) -> None:
    """The machinery end to end on 2 racks for a few seconds (private Mosquitto and
    VictoriaMetrics, 2 simulators, 2 valvey, 2 racky): every daemon's ticks in the window,
    both simulators' clocks, every tray message parsed; no timing target is asserted."""
    from harness.benchrow import row_run
    from harness.benchrun import start_servers

    try:
        srv = start_servers(tmp_path)
    except RuntimeError as err:
        pytest.skip(str(err))
    try:
        run = row_run(tmp_path, srv, 2, 0.5, 3.0, "t")
    finally:
        srv.stop()
    keys = {f"{d}@tr{i}" for d in ("valvey", "racky") for i in (1, 2)}
    assert set(run.late_ms) == keys and set(run.daemon_cpu_s) == keys
    # valvey ticks at 10 Hz, racky at 1 Hz: about 30 and 3 in a 3 s window (a busy host skips some)
    for key, late in run.late_ms.items():
        assert (10 <= len(late) <= 40) if key.startswith("valvey") else (1 <= len(late) <= 5)
    assert all(v > 0 for v in run.daemon_cpu_s.values())
    assert set(run.lag_s) == {"tr1", "tr2"} and set(run.tray_published) == {"tr1", "tr2"}
    assert all(n >= 18 for n in run.tray_published.values())
    assert run.tray_parsed == run.tray_published
    assert set(run.lost_lines) == keys


def test_the_bench_runs_the_daemons_under_their_shipped_units_scheduling(tmp_path: Path) -> None:
    from harness.benchrow import unit_scheduling

    # the shipped units with their drop-ins: real-time round-robin, cooling above power
    v, r = unit_scheduling("valvey"), unit_scheduling("racky")
    assert v.startswith("rr:") and r.startswith("rr:") and v.endswith(":reset")
    assert int(v.split(":")[1]) > int(r.split(":")[1])
    (tmp_path / "plain.service").write_text("[Service]\nExecStart=/bin/true\n")
    assert unit_scheduling("plain", tmp_path) == "other"
    (tmp_path / "fifo.service").write_text(
        "[Service]\nCPUSchedulingPolicy=FIFO\nCPUSchedulingPriority=7\nExecStart=/bin/true\n"
        "ExecStart=/bin/false\n")  # a key twice, as units may have
    assert unit_scheduling("fifo", tmp_path) == "fifo:7"
    # a drop-in overrides the unit, a later one the earlier (name order, as systemd)
    (tmp_path / "fifo.service.d").mkdir()
    (tmp_path / "fifo.service.d" / "20-b.conf").write_text("[Service]\nCPUSchedulingPolicy=other\n")
    (tmp_path / "fifo.service.d" / "10-a.conf").write_text(
        "[Service]\nCPUSchedulingPolicy=rr\nCPUSchedulingResetOnFork=yes\n")
    assert unit_scheduling("fifo", tmp_path) == "other"
    (tmp_path / "fifo.service.d" / "20-b.conf").unlink()
    assert unit_scheduling("fifo", tmp_path) == "rr:7:reset"
    (tmp_path / "bad.service").write_text("[Service]\nCPUSchedulingPolicy=rr\n")
    with pytest.raises(ValueError, match="CPUSchedulingPriority"):
        unit_scheduling("bad", tmp_path)


def test_a_refused_or_bad_scheduling_is_said_not_hidden() -> None:
    from harness.benchkids.daemon_child import apply_scheduling
    from harness.benchrow import sched_summary

    assert apply_scheduling("other") == "other"
    for bad in ("rr:high", "rr:5:sometimes", "idle:3"):
        with pytest.raises(ValueError):
            apply_scheduling(bad)
    one = _run(1)
    one.sched = {"valvey@a": "not applied (rr:20:reset): Operation not permitted",
                 "racky@a": "rr:10:reset"}  # e.g. an RLIMIT_RTPRIO between the two
    assert sched_summary(one) == (
        "daemons: valvey at the normal policy: its unit's real-time scheduling was refused "
        "((rr:20:reset): Operation not permitted); racky rr:10, reset on fork")
    one.sched = {"valvey@a": "rr:20:reset", "racky@a": "rr:10:reset"}
    assert sched_summary(one) == ("daemons: valvey rr:20, reset on fork; "
                                  "racky rr:10, reset on fork")
    one.sched = {"valvey@a": "other", "racky@a": "other"}
    assert sched_summary(one) == ("daemons: valvey at the normal policy; "
                                  "racky at the normal policy")
