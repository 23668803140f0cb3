"""Every query of every shipped dashboard, run on a real engine (issue 19).

Grafana cannot be installed here, so the queries, not Grafana, are what is proven: the InfluxQL
dashboards (config/grafana/dashboards/valvey.json, racky.json) on the real InfluxDB 1.x
(Debian ``influxdb``), the PromQL ones (``*-promql.json``) on the real VictoriaMetrics, with
Grafana's macros and variables expanded as Grafana expands them
(tests/integration/grafana_macros.py).

The telemetry is the daemons' own: short lock-step runs of valvey's and racky's ticks (the
classes the daemons run, `harness.lockstep_valvey` / `harness.lockstep_racky`), rlc's
allocation cycle and telemetry lines over racks reporting through racky's fleet side
(`rlc_lines`), over a
"tour" scenario whose faults make every plotted field appear (a facility-water rise and a
shelf and feed loss: caps, limits, derating; a flapping link), plus what the daemon frame
writes (`rackplane.daemon`): self-metrics through the real `SelfMetrics` (with a process
restart: its counters back to 0) and command audits (`CommandAudit`). Each daemon's lines
are written by the real `TelemetryWriter` for two racks (``rack1`` and ``rack-2.b``, a
regex metacharacter in it) into an embedded store, then sent to each engine by `replay`
(the 1.x ``/write`` for InfluxDB, ``/api/v2/write`` for VictoriaMetrics).

Each query must return, for the selected racks ("All" and then one rack), one series per
identity (and per tag it groups by), each with a value for every field it plots; rates are
never negative although the counters reset.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harness.servers import InfluxDB1, VictoriaMetrics
from rackplane.clock import FakeClock
from rackplane.core.effects import TsLine
from rackplane.core.envelope import CommandAudit
from rackplane.io.selfmetrics import SelfMetrics
from rackplane.io.service import TickStats
from rackplane.io.tsdb import TelemetryWriter, replay
from rackplane.settings import MetricsSettings, SpoolSettings, TsdbSettings
from tests.integration.grafana_macros import (
    Variable,
    calculate_interval_ms,
    expand,
    influxql_values,
    promql_values,
)
from tests.unit.test_grafana_counters import counters

pytestmark = [pytest.mark.servers]

ROOT = Path(__file__).resolve().parents[2]
BOARDS = ROOT / "config" / "grafana" / "dashboards"
INFLUXQL = sorted(p for p in BOARDS.glob("*.json") if not p.stem.endswith("-promql"))
PROMQL = sorted(BOARDS.glob("*-promql.json"))
WALL0_NS = 1_767_225_600 * 10**9  # the lock-step runs' wall clock at plant time 0
SPAN_S = 600  # the dashboards' time range: 10 min of telemetry
SITE = f"dash-{uuid.uuid4().hex[:6]}"  # no other test's series share it (session servers)
RACKS = ("rack1", "rack-2.b")
MAX_DATA_POINTS = 950  # a half-width panel on a 1920 px screen
INFLUX_TIME_INTERVAL = "1s"  # jsonData.timeInterval of rackplane-influxdb.yaml
PROM_TIME_INTERVAL = "1s"  # ... of rackplane-prometheus.yaml


# --- the telemetry ---------------------------------------------------------------------------


def _scenario(name: str, duration_s: float, faults: list[dict[str, Any]]) -> Any:
    from sims.scenario import Scenario

    d = tomllib.loads((ROOT / "config" / "scenarios" / f"{name}.toml").read_text())
    d.update(name=f"dashboard-tour-{name}", duration_s=duration_s, faults=faults)
    return Scenario.model_validate(d)


def valvey_lines() -> list[TsLine]:
    """valvey's tick over 60 s of a fast facility-water rise (the cap request to racky)."""
    import harness.lockstep_valvey as lv
    import harness.lockstep_valvey.run as lv_run  # where run_valvey builds its tick
    from valvey.tick import ValveyTick

    lines: list[TsLine] = []

    class Capture(ValveyTick):
        def step(self, *a: Any, **k: Any) -> Any:
            fx = super().step(*a, **k)
            lines.extend(fx.lines)
            return fx

    sc = _scenario("facility-water-rise", 60.0, [
        {"at_s": 1.0, "kind": "facility_water_rise", "magnitude": 12.0, "ramp_s": 10.0}])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lv_run, "ValveyTick", Capture)
        lv.run_valvey(sc)
    return lines


def racky_lines() -> list[TsLine]:
    """racky's tick over 130 s: shelf and feed loss (caps, limit), facility water rise
    (derating), a flapping link (link figures every 60 s)."""
    from harness.lockstep_racky import WALL0_NS as R0
    from harness.lockstep_racky import run_racky
    from racky.tick import RackyTick

    lines: list[TsLine] = []

    class Capture(RackyTick):
        def step(self, *a: Any, **k: Any) -> Any:
            eff = super().step(*a, **k)
            lines.extend(eff.lines)
            return eff

    sc = _scenario("psu-failure", 130.0, [
        {"at_s": 5.0, "kind": "shelf_loss", "shelf": 2},
        {"at_s": 10.0, "kind": "feed_loss", "feed": 1},
        {"at_s": 5.0, "kind": "facility_water_rise", "magnitude": 8.0, "ramp_s": 30.0},
        {"at_s": 5.0, "kind": "link_flap", "port": "gpu07/nic1", "down_s": 5.0,
         "up_s": 20.0, "count": 3},
    ])
    assert R0 == WALL0_NS
    run_racky(sc, tick_factory=lambda c, k: Capture(c, k, 0.0, agent_epoch=R0 // 10**6))
    return lines


def rlc_lines() -> list[TsLine]:
    """rlc leading a fleet of two rows (``ra``, ``rb``; ``rc``) for `SPAN_S` at its 1 s
    cycle: the real `rlc.core.cycle.FleetState` allocating and `rlc.telemetry.fleet_lines`
    (what the daemon's tick writes), the racks' reports made by racky's real fleet side
    (`racky.core.budget.FleetSide`: leases followed, read-back, demand, AC power and the
    cooling capacity converted) on a plant that draws min(demand, budget); ``rc`` reports a
    cooling capacity and goes silent from 200 s to 260 s (unreachable, reclaimed)."""
    import numpy as np

    from rackplane.core.budget_leases import BudgetLease
    from racky.core.budget import BudgetFollower, FleetSide, InputRatio
    from rlc.config import RlcConfig, example_topology
    from rlc.core.cycle import FleetState
    from rlc.core.topology import TopologySettings, compile_topology
    from rlc.telemetry import fleet_lines

    cfg = RlcConfig(topology=example_topology())  # its timings; the topology is below
    rack = {"floor_w": 20_000.0, "max_w": 90_000.0}
    topo = compile_topology(TopologySettings.model_validate({"site": "s", "halls": {"h1": {
        "feed_limit_w": 1e6, "rows": {
            "row1": {"limit_w": 150_000.0, "ramp_w_per_s": 20_000.0, "racks": {
                "ra": {**rack, "cooling_capacity_w": 70_000.0}, "rb": dict(rack)}},
            "row2": {"limit_w": 100_000.0, "racks": {"rc": dict(rack)}}}}}}))
    f = cfg.fleet
    st = FleetState(topo, cfg.leases, cfg.allocation, f.unreachable_after_s,
                    f.reclaim_after_s, f.write_deadband_w, cooling_max_w=f.cooling_max_w,
                    cooling_hold_s=f.cooling_hold_s)
    sides = {r: FleetSide(BudgetFollower(r, 20_000.0, cfg.leases.clock_margin_s, 500.0),
                          InputRatio(1.05)) for r in topo.rack_ids}
    rng = np.random.default_rng(5)
    demand_dc = {"ra": 60_000.0, "rb": 70_000.0, "rc": 50_000.0}
    st.restore(1, dict.fromkeys(topo.rack_ids), 0.0)
    lines: list[TsLine] = []
    rev = 0
    for t in range(SPAN_S):
        wall = WALL0_NS / 1e9 + t
        silent = 200 <= t < 260
        for w in st.cycle(1, wall, float(t)):
            rev += 1
            st.write_done(w.rack, rev)
            if not (w.rack == "rc" and silent):
                sides[w.rack].follower.offer(BudgetLease.from_record(
                    json.loads(w.record)["lease"]), float(t))
        for r, side in sides.items():
            demand_dc[r] = float(np.clip(demand_dc[r] + rng.normal(0.0, 1_500.0), 0.0, 85e3))
            budget_dc = side.dc_budget_w(wall, float(t))
            out_w = min(demand_dc[r], budget_dc)
            side.observe(budget_dc, demand_dc[r], out_w * 1.04, out_w, wall, float(t),
                         cooling_dc_w=55_000.0 - 10.0 * t if r == "rc" else None)
            if not (r == "rc" and silent):
                rev += 1
                st.on_report(r, (rev, json.dumps(side.follower.report(
                    wall, float(t)).as_record()).encode()), float(t))
        lines += fleet_lines(st, float(t), WALL0_NS + t * 10**9)
    return lines


def frame_lines(daemon: str, writer: TelemetryWriter, clock: FakeClock) -> None:
    """What the daemon frame writes besides the tick's lines: self-metrics every 10 s for
    `SPAN_S` (the process restarts half way: every counter back to 0) and command audits."""
    n = {"mqtt": 0, "refused": 0, "modbus": 0, "invalid": 0}
    mqtt = SimpleNamespace(stats=SimpleNamespace(connected=True, reconnects=0))
    cmds = SimpleNamespace(stats=SimpleNamespace(received=0, refused_total=0, refused={}))
    dev = SimpleNamespace(stats=SimpleNamespace(reconnects=0, exception_replies=0,
                                                invalid_samples=0))
    sm = SelfMetrics(daemon, MetricsSettings(), clock=clock)
    ticks = TickStats()
    for t in range(SPAN_S):
        if t == SPAN_S // 2:  # a restart: new process, counters from 0
            sm = SelfMetrics(daemon, MetricsSettings(), clock=clock)
            ticks = TickStats()
            n = dict.fromkeys(n, 0)
        n["mqtt"] += t % 60 == 7
        n["refused"] += t % 20 == 3
        n["modbus"] += t % 90 == 11
        n["invalid"] += 2
        mqtt.stats.reconnects = n["mqtt"]
        cmds.stats.refused_total = n["refused"]
        cmds.stats.refused = {"lease_held": n["refused"]} if n["refused"] else {}
        cmds.stats.received = 3 * t
        dev.stats.reconnects, dev.stats.invalid_samples = n["modbus"], n["invalid"]
        ticks.record(0.002 + 0.001 * (t % 5))
        if t % 97 == 5:
            ticks.overruns += 1
        sm.tick(clock.monotonic(), tick_stats=ticks, writer=writer, mqtt=mqtt, commands=cmds,
                devices=[dev], pv_age_s=0.1 + 0.01 * (t % 10))
        if t % 30 == 0:
            ok = t % 60 == 0
            audit = CommandAudit(user="ops", verb="set_setpoint" if ok else "lease",
                                 verb_known=True, request_id=f"r{t}",
                                 outcome="ok" if ok else "lease_held", ok=ok, role="operator",
                                 latency_s=0.004, wall_ns=clock.wall_ns())
            writer.write("command", audit.tags(), audit.fields(), audit.wall_ns)
        clock.advance(1.0)


@dataclass
class Telemetry:
    """The spools (embedded stores) to send, and what was written per measurement."""

    stores: list[Path] = field(default_factory=list)
    measurements: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))


async def write_telemetry(tmp: Path) -> Telemetry:
    out = Telemetry()
    for daemon, lines in (("valvey", valvey_lines()), ("racky", racky_lines()),
                          ("rlc", rlc_lines())):
        for rack in RACKS:
            clock = FakeClock(start_wall_ns=WALL0_NS)
            store = tmp / f"{daemon}-{rack}"
            w = TelemetryWriter(TsdbSettings(), SpoolSettings(directory=store),
                                identity_tags={"site": SITE, "row": "row1", "rack": rack},
                                clock=clock)
            for ln in lines:  # as rackplane.daemon.Daemon.write_lines does
                w.write(ln.measurement, ln.tags, ln.fields, ln.wall_ns)
                out.measurements[ln.measurement].add(daemon)
            frame_lines(daemon, w, clock)
            await w.close()
            st = w.stats
            assert (st.dropped, st.ts_out_of_window) == (0, 0)
            out.stores.append(store)
    return out


@pytest.fixture(scope="module")
def telemetry(tmp_path_factory: pytest.TempPathFactory) -> Telemetry:
    return asyncio.run(write_telemetry(tmp_path_factory.mktemp("dash-telemetry")))


async def send(stores: list[Path], tsdb: TsdbSettings) -> int:
    sent = 0
    for store in stores:
        res = await replay(store, tsdb)
        assert res.complete and res.rejected_lines == 0, res
        sent += res.sent_lines
    return sent


# --- query checks ----------------------------------------------------------------------------


@dataclass
class Tally:
    queries: int = 0
    ok: int = 0
    problems: list[str] = field(default_factory=list)

    def add(self, problems: list[str]) -> None:
        self.queries += 1
        self.ok += not problems
        self.problems += problems


def _targets(board: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for p in board["panels"]:
        for t in p.get("targets", []):
            yield p, t


def _selections(options: dict[str, list[str]], all_sites: bool) -> list[list[Variable]]:
    """Racks: "All" (every option the variable's query found), then one of several. Sites:
    "All" on a private database, else this test's site (a shared server holds others')."""
    assert set(RACKS) <= set(options["rack"]) and SITE in options["site"], options
    site = Variable("site", options["site"] if all_sites else [SITE])
    return [[site, Variable("rack", options["rack"])], [site, Variable("rack", [RACKS[1]])]]


COUNTERS = counters()
"""(measurement, field) of every counter the daemons write (tests/unit/test_grafana_counters)."""


def _check_series(where: str, got: list[tuple[dict[str, str], dict[str, list[Any]]]],
                  group: list[str], fields: list[str], racks: list[str],
                  counted: bool) -> list[str]:
    """``got``: (tags, column -> values) per returned series; ``counted``: the query reads a
    counter, whose rate is never negative (the data holds a reset to 0)."""
    problems = []
    if not got:
        return [f"{where}: no series"]
    seen: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: dict.fromkeys(fields, 0))
    for tags, cols in got:
        missing = [g for g in group if not tags.get(g)]
        if missing:
            problems.append(f"{where}: a series without tags {missing}: {tags}")
        counts = seen[(tags.get("site", ""), tags.get("rack", ""))]
        for f in fields:
            vals = [v for v in cols.get(f, []) if v is not None]
            counts[f] += len(vals)
            if counted and any(v < 0 for v in vals):
                problems.append(f"{where}: negative rate of {f}: {min(vals)}")
    want = {(SITE, r) for r in racks if r in RACKS}
    if set(seen) != want:
        problems.append(f"{where}: identities {sorted(seen)} != {sorted(want)}")
    for ident, counts in seen.items():
        empty = [f for f, c in counts.items() if c == 0]
        if empty:
            problems.append(f"{where}: {ident} has no value of {empty}")
    return problems


def influx_options(srv: InfluxDB1, db: str, board: dict[str, Any]) -> dict[str, list[str]]:
    """Each variable's options, from its own query on the engine."""
    out = {}
    for var in board["templating"]["list"]:
        res = srv.query(var["query"], db)["results"][0]
        out[var["name"]] = [v[1] for s in res.get("series", []) for v in s["values"]]
    return out


def run_influxql(srv: InfluxDB1, db: str, board: dict[str, Any], tally: Tally) -> None:
    from_ms, to_ms = WALL0_NS // 10**6, WALL0_NS // 10**6 + SPAN_S * 1000
    for variables in _selections(influx_options(srv, db, board), all_sites=True):
        racks = list(variables[1].values)
        for panel, t in _targets(board):
            iv = calculate_interval_ms(from_ms, to_ms, MAX_DATA_POINTS,
                                       panel.get("interval") or INFLUX_TIME_INTERVAL)
            text = expand(t["query"], influxql_values(from_ms, to_ms, iv, variables))
            assert not re.search(r"\$\{?\w|\[\[", text), text  # every macro expanded
            where = f"{board['uid']} / {panel['title']} / {t['refId']} racks={racks}"
            gm = re.search(r"GROUP BY time\([^)]*\), (.*?) fill\(", text)
            group = re.findall(r'"([^"]+)"', gm.group(1)) if gm else []
            fields = re.findall(r'AS "([^"]+)"', text)
            alias_tags = re.findall(r"\$tag_(\w+)", t.get("alias", ""))
            problems = [f"{where}: alias names tag {a} it does not group by"
                        for a in alias_tags if a not in group]
            try:
                res = srv.query(text, db)["results"][0]
            except urllib.error.HTTPError as err:  # a syntax error: 400
                tally.add([f"{where}: HTTP {err.code} {err.read()[:300]!r}: {text}"])
                continue
            if "error" in res:
                tally.add([f"{where}: {res['error']}: {text}"])
                continue
            got = []
            for s in res.get("series", []):
                cols = {c: [row[i] for row in s["values"]] for i, c in enumerate(s["columns"])}
                got.append((s.get("tags", {}), cols))
            meas = re.search(r'FROM "([^"]+)"', text)
            counted = meas is not None and any((meas.group(1), f) in COUNTERS for f in fields)
            tally.add(problems + _check_series(where, got, group, fields, racks, counted))


def test_every_influxql_dashboard_query_returns_its_series_on_influxdb(
    telemetry: Telemetry, influxdb1: InfluxDB1
) -> None:
    db = f"dash{uuid.uuid4().hex[:8]}"
    influxdb1.create_database(db)
    sent = asyncio.run(send(telemetry.stores, TsdbSettings(url=influxdb1.url, api="v1",
                                                           database=db, batch_lines=5000)))
    assert sent > 10_000
    tally = Tally()
    for path in INFLUXQL:
        run_influxql(influxdb1, db, json.loads(path.read_text()), tally)
    print(f"\nInfluxQL on InfluxDB 1.x: {tally.ok}/{tally.queries} query runs returned "
          f"their series ({tally.queries // 2} queries x 2 rack selections)")
    assert tally.queries >= 60
    assert not tally.problems, "\n".join(tally.problems)
    # The counters really reset (a raw read would go negative); the rates above never did.
    res = influxdb1.query(
        'SELECT difference(last("commands_rejected")) FROM "daemon" WHERE "rack" = \'rack1\' '
        f"AND time >= {WALL0_NS} AND time <= {WALL0_NS + SPAN_S * 10**9} "
        'GROUP BY time(1m), "daemon"', db)["results"][0]
    assert min(v[1] for s in res["series"] for v in s["values"] if v[1] is not None) < 0


def _mutated(board: dict[str, Any], key: str, old: str, new: str) -> dict[str, Any]:
    """``board`` with only the first target whose ``key`` holds ``old``, changed to ``new``."""
    for p, t in _targets(board):
        if old in t[key]:
            return {**board, "panels": [{**p, "targets": [{**t, key: t[key].replace(old, new)}]}]}
    raise AssertionError(f"no target with {old!r}")


def test_influxql_check_can_fail(telemetry: Telemetry, influxdb1: InfluxDB1) -> None:
    """A field nobody writes, a variable compared as a plain string (multi-value "All"
    then matches nothing), a query that merges the racks, and a counter read as a plain
    derivative (negative at the restart) are each caught."""
    db = f"dash{uuid.uuid4().hex[:8]}"
    influxdb1.create_database(db)
    asyncio.run(send(telemetry.stores[:2], TsdbSettings(url=influxdb1.url, api="v1",
                                                        database=db, batch_lines=5000)))
    board = json.loads((BOARDS / "valvey.json").read_text())
    for old, new in (('"setpoint_c"', '"setpoint_degc"'),
                     ('"rack" =~ /^$rack$/', "\"rack\" = '$rack'"),
                     ('"site", "row", "rack"', '"site", "row"'),
                     ('non_negative_derivative(last("commands_rejected")',
                      'derivative(last("commands_rejected")')):
        tally = Tally()
        run_influxql(influxdb1, db, _mutated(board, "query", old, new), tally)
        assert tally.problems, (old, new)


# --- PromQL on VictoriaMetrics ---------------------------------------------------------------


def _vm_get(vm: VictoriaMetrics, path: str, params: dict[str, Any]) -> Any:
    url = vm.url + path + "?" + urllib.parse.urlencode(params, doseq=True)
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def prom_options(vm: VictoriaMetrics, board: dict[str, Any], start: int, end: int
                 ) -> dict[str, list[str]]:
    """label_values(<series>, <label>) as Grafana asks it (the labels API with match[])."""
    out = {}
    for var in board["templating"]["list"]:
        m = re.match(r"^label_values\(([a-z0-9_]+), (\w+)\)$", var["query"]["query"])
        assert m, var
        ans = _vm_get(vm, f"/api/v1/label/{m.group(2)}/values",
                      {"match[]": m.group(1), "start": start, "end": end})
        out[var["name"]] = ans["data"]
    return out


def run_promql(vm: VictoriaMetrics, board: dict[str, Any], tally: Tally) -> None:
    from_ms, to_ms = WALL0_NS // 10**6, WALL0_NS // 10**6 + SPAN_S * 1000
    options = prom_options(vm, board, from_ms // 1000, to_ms // 1000)
    for variables in _selections(options, all_sites=False):
        racks = list(variables[1].values)
        for panel, t in _targets(board):
            min_step = t.get("interval") or PROM_TIME_INTERVAL
            iv = calculate_interval_ms(from_ms, to_ms, MAX_DATA_POINTS,
                                       panel.get("interval") or PROM_TIME_INTERVAL)
            iv = max(iv, calculate_interval_ms(from_ms, to_ms, MAX_DATA_POINTS, min_step))
            expr = expand(t["expr"], promql_values(iv, min_step, variables))
            assert not re.search(r"\$\{?\w|\[\[", expr), expr
            step = iv / 1000
            start = (from_ms / 1000 // step) * step
            end = -(-(to_ms / 1000) // step) * step
            where = f"{board['uid']} / {panel['title']} / {t['refId']} racks={racks}"
            by = re.search(r"\bby \(([^)]*)\)", expr)
            group = [x.strip() for x in by.group(1).split(",")] if by else []
            fld = t["legendFormat"].rsplit(" ", 1)[1]
            try:
                ans = _vm_get(vm, "/api/v1/query_range", {"query": expr, "start": start,
                                                          "end": end, "step": step,
                                                          "nocache": 1})
            except urllib.error.HTTPError as err:
                tally.add([f"{where}: HTTP {err.code} {err.read()[:300]!r}: {expr}"])
                continue
            got = [(s["metric"], {fld: [float(v) for _, v in s["values"]
                                        if v not in ("NaN", "+Inf", "-Inf")]})
                   for s in ans["data"]["result"]]
            metric = re.search(r"([a-z_][a-z0-9_]*)\{", expr)
            counted = metric is not None and metric.group(1) in {f"{m}_{f}"
                                                                 for m, f in COUNTERS}
            tally.add(_check_series(where, got, group, [fld], racks, counted))


def test_every_promql_dashboard_query_returns_its_series_on_victoria(
    telemetry: Telemetry, victoria: VictoriaMetrics
) -> None:
    sent = asyncio.run(send(telemetry.stores, TsdbSettings(url=victoria.url,
                                                           batch_lines=5000)))
    assert sent > 10_000
    victoria.flush()
    deadline = time.monotonic() + 30  # new series take a moment to be searchable
    from_s = WALL0_NS // 10**9
    while time.monotonic() < deadline:
        racks = _vm_get(victoria, "/api/v1/label/rack/values",
                        {"match[]": "daemon_uptime_s", "start": from_s,
                         "end": from_s + SPAN_S})["data"]
        if set(RACKS) <= set(racks):
            break
        time.sleep(0.2)
        victoria.flush()
    tally = Tally()
    for path in PROMQL:
        run_promql(victoria, json.loads(path.read_text()), tally)
    print(f"\nPromQL on VictoriaMetrics: {tally.ok}/{tally.queries} query runs returned "
          f"their series ({tally.queries // 2} queries x 2 rack selections)")
    assert tally.queries >= 150
    assert not tally.problems, "\n".join(tally.problems)


def test_promql_check_can_fail(telemetry: Telemetry, victoria: VictoriaMetrics) -> None:
    """A series nobody writes, a query that merges the racks, and a counter read as a
    plain derivative (negative at the restart) are each caught."""
    asyncio.run(send(telemetry.stores[:2], TsdbSettings(url=victoria.url, batch_lines=5000)))
    victoria.flush()
    board = json.loads((BOARDS / "valvey-promql.json").read_text())
    for old, new in (("pid_setpoint_c{", "pid_setpoint_degc{"),
                     ("avg by (site, row, rack) (avg_over_time(pid_setpoint_c",
                      "avg by (site, row) (avg_over_time(pid_setpoint_c"),
                     ("rate(daemon_commands_rejected", "deriv(daemon_commands_rejected")):
        tally = Tally()
        run_promql(victoria, _mutated(board, "expr", old, new), tally)
        assert tally.problems, (old, new)


def test_rlc_board_check_can_fail(telemetry: Telemetry, influxdb1: InfluxDB1,
                                  victoria: VictoriaMetrics) -> None:
    """The rlc board's checks see its own data: a lease-expiry field nobody writes and a row
    sum read from the racks' measurement are caught on both engines."""
    rlc_stores = [p for p in telemetry.stores if p.name.startswith("rlc-")]
    assert len(rlc_stores) == len(RACKS)
    db = f"dash{uuid.uuid4().hex[:8]}"
    influxdb1.create_database(db)
    asyncio.run(send(rlc_stores, TsdbSettings(url=influxdb1.url, api="v1", database=db,
                                              batch_lines=5000)))
    board = json.loads((BOARDS / "rlc.json").read_text())
    tally = Tally()
    run_influxql(influxdb1, db, board, tally)
    assert not tally.problems, tally.problems                # the board itself passes
    for old, new in (('"lease_expires_in_s"', '"lease_expiry_s"'),
                     ('"racks_unreachable") AS "racks_unreachable" FROM "fleet_row"',
                      '"racks_unreachable") AS "racks_unreachable" FROM "fleet_rack"')):
        tally = Tally()
        run_influxql(influxdb1, db, _mutated(board, "query", old, new), tally)
        assert tally.problems, (old, new)
    asyncio.run(send(rlc_stores, TsdbSettings(url=victoria.url, batch_lines=5000)))
    victoria.flush()
    pboard = json.loads((BOARDS / "rlc-promql.json").read_text())
    tally = Tally()
    run_promql(victoria, _mutated(pboard, "expr", "fleet_rack_lease_expires_in_s{",
                                  "fleet_rack_lease_expiry_s{"), tally)
    assert tally.problems
