"""A row CDU (issue 21 item 1): N racks on one CDU whose loads step independently (the
``racks_N`` plant variants, `sims.row.VirtualRow` through `sims.scenario.ScenarioRun`), and
valvey configured with the N racks, its feedforward summing their published powers.

Lock-step (`harness.lockstep_valvey.run_valvey`): valvey's own tick; each rack's power reaches
it as racky publishes it (``state/rack_power`` of each rack of ``feedforward.racks``).
"""

from __future__ import annotations

from typing import Any

import pytest

from harness.lockstep_valvey import figures, run_valvey
from harness.lockstep_valvey.run import row_config
from sims.scenario import Scenario, ScenarioRun, load_scenario
from valvey.config import ValveyConfig
from valvey.core.controller import ValveyCore


def _on(variant: str, name: str = "load-step") -> Scenario:
    sc = load_scenario(name)
    return sc.model_copy(update={"plant": type(sc.plant).model_validate(
        {**sc.plant.model_dump(), "variant": variant})})


def _rack_powers(sc: Scenario, model: str, until_s: float) -> list[tuple[float, list[float]]]:
    run = ScenarioRun(sc, model=model)  # type: ignore[arg-type]
    out = []
    n = 0
    while run.t_s < until_s - 1e-9:
        if n % 10 == 0:
            run.plant.write("heartbeat", float(n // 10 % 1000))
        run.step(0.1)
        n += 1
        if n % 10 == 0:
            out.append((round(run.t_s, 1), [r.power_w for r in run.plant.racks]))
    return out


@pytest.mark.parametrize(("variant", "model"), [("racks_4", "rack"), ("racks_3", "cdu")])
def test_the_racks_of_a_row_step_at_their_own_times_and_sizes(variant: str, model: str) -> None:
    sc = _on(variant)
    n = int(variant[-1])
    seen = _rack_powers(sc, model, 300.0)
    assert all(len(p) == n for _, p in seen)
    low, high = sc.load.low_w, sc.load.high_w
    assert low is not None and high is not None
    ups, downs, tops = [], [], []
    for k in range(n):
        up = next(t for t, p in seen if p[k] > low + 1000.0)
        down = next(t for t, p in seen if t > up and p[k] < low + 1000.0)
        ups.append(up)
        downs.append(down)
        tops.append(max(p[k] for _, p in seen))
    assert len(set(ups)) == n and len(set(downs)) == n, (ups, downs)  # own times
    assert len({round(x, -2) for x in tops}) == n, tops  # own sizes
    assert tops[0] == pytest.approx(high, rel=1e-3)  # rack 0: the scenario's own step
    assert all(low + 0.4 * (high - low) < x <= high * 1.001 for x in tops)
    # the row's total stays within the CDU's N racks and is never N times one rack
    totals = [sum(p) for _, p in seen]
    assert max(totals) <= n * high * 1.001
    assert any(abs(sum(p) - n * p[0]) > 50_000.0 for _, p in seen)


def _ff_log(log: list[tuple[int, float | None, list[float], list[str], str]]) -> Any:
    def on_tick(run: ScenarioRun, core: ValveyCore, t_s: float, _now: float) -> None:
        if abs(t_s - round(t_s)) < 1e-6:  # racky publishes, the feedforward updates
            log.append((round(t_s), core.ff.power_kw, [r.power_w for r in run.plant.racks],
                        list(core.ff.missing_racks), core.ff.source))
    return on_tick


def test_valvey_sums_the_published_powers_of_every_rack_of_the_row() -> None:
    """racks_4, S1: the feedforward's input is the racks' total as racky publishes it (read
    per rack on the map); with only its own rack listed it sees a quarter of the row and holds
    the supply worse."""
    sc = _on("racks_4")
    cfg = row_config(ValveyConfig(), 4)
    assert cfg.feedforward.racks == ["rack1", "rack1-2", "rack1-3", "rack1-4"]
    log: list[tuple[int, float | None, list[float], list[str], str]] = []
    res = run_valvey(sc, cfg, model="cdu", on_tick=_ff_log(log))
    for t, kw, powers, _m, _s in log:  # published this tick, before the plant steps
        assert kw is not None and kw * 4 == pytest.approx(sum(powers) / 1000.0, rel=1e-3), t
    assert len(log) == round(sc.duration_s)
    assert {source for *_x, source in log} == {"rack_power"}
    assert all(not missing for *_x, missing, _s in log)
    summed = figures(res)
    own = figures(run_valvey(sc, ValveyConfig(), model="cdu"))
    assert summed["max_abs_error_k"] <= 0.5
    assert summed["valves_declared_stuck"] == 0
    # measured: 0.19 K summed vs 0.37 K from its own rack alone
    assert summed["max_abs_error_k"] < own["max_abs_error_k"] - 0.1, (summed, own)


def test_a_rack_without_a_power_is_never_counted_as_0_w_and_is_alarmed() -> None:
    """Three racks listed on a two-rack row: the third never publishes. The feedforward runs
    on the CDU's heat figure (the whole row), names the rack, alarms, and holds S1."""
    sc = _on("racks_2")
    cfg = row_config(ValveyConfig(), 3)
    log: list[tuple[int, float | None, list[float], list[str], str]] = []
    res = run_valvey(sc, cfg, model="cdu", on_tick=_ff_log(log))
    late = [e for e in log if e[0] >= 10.0]
    assert {s for *_x, s in late} == {"heat_removed"}
    assert {tuple(m) for *_x, m, _s in late} == {("rack1-3",)}
    assert "feedforward_source_lost" in {a for _, a in res.alarms_raised()}
    # per rack of the three listed, the row's heat (two racks at 39.6 kW, 85 % to liquid),
    # not the two published racks' sum as if the third drew 0 W
    kw = next(kw for t, kw, *_r in log if t == 50.0)
    assert kw is not None and kw * 3 == pytest.approx(2 * 39.6, rel=0.05)
    assert figures(res)["max_abs_error_k"] <= 0.5
