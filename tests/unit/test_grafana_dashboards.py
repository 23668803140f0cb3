"""The Grafana dashboards query only what the daemons write, in InfluxQL only (issue 7).

The written schema is derived from the daemons' code, never typed here:

- every ``<writer>.write("<measurement>", <tags>, <fields>)`` call in valvey/, racky/, rlc/ and the
  daemon frame both run on (rackplane/daemon.py), and every ``TsLine("<measurement>", <tags>,
  <fields>, ...)`` effect of the daemons' ticks, is read with `ast`: the fields are the keys of
  the dict literal passed (or assigned to the name passed, plus ``name["key"] = ...``
  assignments), of the dict a called method returns (``audit.fields()``), or of the dict a
  comprehension iterates (``lk.port_figures()``);
  tags likewise from the tags argument;
- ``write_samples`` calls (and valvey's tick's ``TsLine`` with a computed measurement) write
  the register map's points (``<point>`` and
  ``<point>_quality``): valvey's CDU map split by ``valvey.tick.MEASUREMENT_OF_POINT``,
  racky's power-shelf map as ``power_shelf``;
- the self-metrics (`rackplane.io.selfmetrics`) count as written only once a daemon constructs
  ``SelfMetrics``: their fields are the `SelfMetricsSnapshot` dataclass fields.

Every ``FROM``/field/tag of every dashboard query must be in that set.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rackplane.core.registers import load_register_map
from rackplane.io.selfmetrics import MEASUREMENT as SELF_MEASUREMENT
from rackplane.io.selfmetrics import snapshot_fields

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "config" / "grafana"
DASHBOARDS = sorted(p for p in (GRAFANA / "dashboards").glob("*.json")
                    if not p.stem.endswith("-promql"))
"""The InfluxQL dashboards."""
PROMQL_DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*-promql.json"))
IDENTITY_TAGS = {"site", "row", "rack"}


@dataclass
class Schema:
    fields: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    tags: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    unresolved: list[str] = field(default_factory=list)


def _sources(pkg: str) -> dict[Path, ast.Module]:
    return {f: ast.parse(f.read_text(), str(f)) for f in sorted((ROOT / pkg).rglob("*.py"))}


ALL_SOURCES = {**_sources("valvey"), **_sources("racky"), **_sources("rlc"),
               **_sources("rackplane")}


def _dict_keys(node: ast.AST) -> set[str] | None:
    if isinstance(node, ast.Dict) and all(
        isinstance(k, ast.Constant) and isinstance(k.value, str) for k in node.keys
    ):
        return {str(k.value) for k in node.keys if isinstance(k, ast.Constant)}
    return None


def _method_returns(name: str) -> set[str] | None:
    """Keys of the dict literal returned by ``def <name>`` anywhere in the packages."""
    for tree in ALL_SOURCES.values():
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef) and fn.name == name:
                for r in ast.walk(fn):
                    if isinstance(r, ast.Return) and r.value is not None:
                        keys = _dict_keys(r.value)
                        if keys is not None:
                            return keys
    return None


def _name_keys(fn: ast.AST, var: str) -> set[str] | None:
    """Keys given to dict variable ``var`` in function ``fn`` (literal + subscript stores)."""
    keys: set[str] | None = None
    for n in ast.walk(fn):
        value = None
        if (isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == var
                                              for t in n.targets)) or (
            isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == var
        ):
            value = n.value
        if value is not None:
            got = _resolve(fn, value)
            if got is not None:
                keys = (keys or set()) | got
        if (isinstance(n, ast.Assign) and len(n.targets) == 1
                and isinstance(n.targets[0], ast.Subscript)
                and isinstance(n.targets[0].value, ast.Name) and n.targets[0].value.id == var
                and isinstance(n.targets[0].slice, ast.Constant)):
            keys = (keys or set()) | {str(n.targets[0].slice.value)}
    return keys


def _resolve(fn: ast.AST, node: ast.AST) -> set[str] | None:
    keys = _dict_keys(node)
    if keys is not None:
        return keys
    if isinstance(node, ast.Name):
        return _name_keys(fn, node.id)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return _method_returns(node.func.attr)
    if isinstance(node, ast.DictComp) and node.generators:
        it = node.generators[0].iter  # {k: ... for k, v in figs.items()}
        if isinstance(it, ast.Name):  # cols = [(k, ...) for k, v in figs.items()]; {.. in cols}
            for a in ast.walk(fn):
                if (isinstance(a, ast.Assign) and len(a.targets) == 1
                        and isinstance(a.targets[0], ast.Name) and a.targets[0].id == it.id
                        and isinstance(a.value, ast.ListComp | ast.GeneratorExp)):
                    it = a.value.generators[0].iter
                    break
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and \
                it.func.attr == "items":
            return _resolve(fn, it.func.value)
    return None


def _functions(tree: ast.Module) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for n in ast.walk(tree):
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
            yield n


def _point_measurements(daemon: str) -> dict[str, set[str]]:
    """What ``write_samples`` writes: register-map points (+ ``_quality``) per measurement."""
    out: dict[str, set[str]] = defaultdict(set)
    if daemon == "rlc":  # no register map
        return out
    if daemon == "valvey":
        from valvey.config import ValveyConfig
        from valvey.tick import MEASUREMENT_OF_POINT

        for p in load_register_map(ValveyConfig().cdu.register_map).points:
            out[MEASUREMENT_OF_POINT.get(p.name, "cdu")] |= {p.name, f"{p.name}_quality"}
    else:
        from racky.config import RackyConfig

        for p in load_register_map(RackyConfig().discovery.register_map).points:
            out["power_shelf"] |= {p.name, f"{p.name}_quality"}
    return out


def _line_effect(s: Schema, daemon: str, fn: ast.FunctionDef | ast.AsyncFunctionDef,
                 call: ast.Call, path: str) -> None:
    """What a ``TsLine(measurement, tags, fields, wall_ns)`` effect writes. Fields built by
    ``sample_fields(...)``, or a measurement that is not a literal (valvey's CDU points, one
    line per ``MEASUREMENT_OF_POINT`` measurement), are the register map's points, as
    ``write_samples`` writes them."""
    where = f"{path}:{call.lineno}"
    tags = _resolve(fn, call.args[1])
    if tags is None:
        s.unresolved.append(f"{where} TsLine tags")
    fa = call.args[2]
    literal = isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)
    from_samples = (isinstance(fa, ast.Call) and isinstance(fa.func, ast.Name)
                    and fa.func.id == "sample_fields")
    if not literal or from_samples:
        for meas, pts in _point_measurements(daemon).items():
            if not literal or meas == call.args[0].value:  # type: ignore[attr-defined]
                s.fields[meas] |= pts
                s.tags[meas] |= tags or set()
        return
    m = str(call.args[0].value)  # type: ignore[attr-defined]
    fields = _resolve(fn, fa)
    if fields is None:
        s.unresolved.append(f"{where} TsLine({m!r})")
    s.fields[m] |= fields or set()
    s.tags[m] |= tags or set()


def written_schema() -> Schema:
    s = Schema()
    for daemon in ("valvey", "racky", "rlc"):
        uses_selfmetrics = False
        frame = ROOT / "rackplane" / "daemon.py"
        effects = ROOT / "rackplane" / "core" / "effects.py"  # the alarm lines both ticks use
        for path, tree in {**_sources(daemon), frame: ALL_SOURCES[frame],
                           effects: ALL_SOURCES[effects]}.items():
            for fn in _functions(tree):
                for call in ast.walk(fn):
                    if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                            and call.func.id == "TsLine" and len(call.args) >= 3):
                        # a tick's telemetry effect: TsLine(measurement, tags, fields, wall_ns)
                        _line_effect(s, daemon, fn, call, f"{path.relative_to(ROOT)}")
                        continue
                    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
                        continue
                    if isinstance(call.func, ast.Attribute) and call.func.attr == "SelfMetrics":
                        uses_selfmetrics = True
                    where = f"{path.relative_to(ROOT)}:{call.lineno}"
                    if isinstance(call.func, ast.Name) and call.func.id == "TsLine":
                        # valvey.tick's time-series effects: TsLine(measurement, tags, fields,
                        # wall_ns); a measurement that is not a literal is the CDU points'
                        # (one line per MEASUREMENT_OF_POINT measurement, like write_samples)
                        tags = _resolve(fn, call.args[1])
                        if tags is None:
                            s.unresolved.append(f"{where} TsLine tags")
                        if isinstance(call.args[0], ast.Constant):
                            m = str(call.args[0].value)
                            fields = _resolve(fn, call.args[2])
                            if fields is None:
                                s.unresolved.append(f"{where} TsLine({m!r})")
                            s.fields[m] |= fields or set()
                            s.tags[m] |= tags or set()
                        else:
                            for m, pts in _point_measurements(daemon).items():
                                s.fields[m] |= pts
                                s.tags[m] |= tags or set()
                        continue
                    if not isinstance(call.func, ast.Attribute):
                        continue
                    if call.func.attr == "write" and len(call.args) >= 3 and isinstance(
                        call.args[0], ast.Constant
                    ) and isinstance(call.args[0].value, str):
                        m = call.args[0].value
                        fields, tags = _resolve(fn, call.args[2]), _resolve(fn, call.args[1])
                        if fields is None or tags is None:
                            s.unresolved.append(f"{where} write({m!r})")
                        s.fields[m] |= fields or set()
                        s.tags[m] |= tags or set()
                    elif call.func.attr == "write_samples" and len(call.args) >= 2:
                        tags = _resolve(fn, call.args[1])
                        for m, pts in _point_measurements(daemon).items():
                            s.fields[m] |= pts
                            s.tags[m] |= tags or set()
                        if tags is None:
                            s.unresolved.append(f"{where} write_samples tags")
                if any(isinstance(n, ast.Name) and n.id == "SelfMetrics" for n in ast.walk(fn)):
                    uses_selfmetrics = True
        if uses_selfmetrics:
            s.fields[SELF_MEASUREMENT] |= set(snapshot_fields())
            s.tags[SELF_MEASUREMENT] |= {"daemon"}
    return s


SCHEMA = written_schema()

_FROM_RE = re.compile(r'\bFROM\s+"([^"]+)"', re.IGNORECASE)
_SELECT_RE = re.compile(r"^\s*SELECT\s+(.*?)\s+FROM\s", re.IGNORECASE | re.DOTALL)
_WHERE_RE = re.compile(r"\bWHERE\s+(.*?)(?:\s+GROUP\s+BY\s+(.*?))?(?:\s+fill\(.*\))?\s*$",
                       re.IGNORECASE | re.DOTALL)
_IDENT_RE = re.compile(r'"([^"]+)"')
_SHOW_RE = re.compile(r'^SHOW TAG VALUES FROM "([^"]+)" WITH KEY = "([^"]+)"$')


def _queries(board: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    panels = board["panels"]
    assert isinstance(panels, list)
    for p in panels:
        for t in p.get("targets", []):
            yield p["title"], t


def test_written_schema_is_derived() -> None:
    """The derivation finds the daemons' main measurements (a broken parser fails here)."""
    for m in ("pid", "coolant_loop", "pump", "valve", "alarm", "command", "rack", "node",
              "link", "power_shelf"):
        assert SCHEMA.fields[m], f"no fields derived for {m}"
    assert "ok" in SCHEMA.fields["command"]  # through audit.fields()
    assert "cusum" in SCHEMA.fields["link"]  # through lk.port_figures()
    assert "dew_point_c" in SCHEMA.fields["environment"]  # through room["dew_point_c"]


def dashboard_problems(board: dict[str, Any]) -> tuple[list[str], int]:
    """Queries of ``board`` that name a measurement, field or tag nobody writes; and the
    number of queries checked. Asserts InfluxQL (raw SELECT, no Flux)."""
    problems: list[str] = []
    n = 0
    for title, t in _queries(board):
        assert t.get("rawQuery") is True, f"{title}: not a raw InfluxQL query"
        query = t["query"]
        assert query.lstrip().upper().startswith("SELECT"), f"{title}: {query}"
        assert "|>" not in query and "from(bucket" not in query, f"{title}: Flux"
        n += 1
        froms = _FROM_RE.findall(query)
        assert len(froms) == 1, f"{title}: one measurement per query: {query}"
        m = froms[0]
        sel = _SELECT_RE.match(query)
        assert sel is not None
        # 'mean("x") AS "x"': the aliases repeat the field names.
        fields = set(_IDENT_RE.findall(sel.group(1)))
        wg = _WHERE_RE.search(query)
        tags: set[str] = set()
        if wg:
            tags |= set(re.findall(r'"([^"]+)"\s*(?:=~|!~|=|!=|<>)', wg.group(1)))
            if wg.group(2):
                tags |= set(_IDENT_RE.findall(wg.group(2)))
        if m == SELF_MEASUREMENT and m not in SCHEMA.fields:
            continue  # checked by test_self_metrics_panels_wait_for_wiring
        if m not in SCHEMA.fields:
            problems.append(f"{title}: measurement {m!r} is never written")
            continue
        for f in sorted(fields - SCHEMA.fields[m]):
            problems.append(f"{title}: {m}.{f} is never written")
        for tg in sorted(tags - SCHEMA.tags[m] - IDENTITY_TAGS):
            problems.append(f"{title}: tag {m}.{tg} is never written")
    templating = board["templating"]
    assert isinstance(templating, dict)
    for var in templating["list"]:
        mm = _SHOW_RE.match(var["query"])
        assert mm is not None, var["query"]
        if mm.group(1) not in SCHEMA.fields:
            problems.append(f"variable {var['name']}: measurement {mm.group(1)!r} not written")
        if mm.group(2) not in SCHEMA.tags[mm.group(1)] | IDENTITY_TAGS:
            problems.append(f"variable {var['name']}: tag {mm.group(2)!r} not written")
    return problems, n


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.stem for p in DASHBOARDS])
def test_dashboard_queries_only_written_series(path: Path) -> None:
    problems, n = dashboard_problems(json.loads(path.read_text()))
    assert n >= 10
    hint = f"\nwrites the derivation could not read: {SCHEMA.unresolved}" if problems else ""
    assert not problems, "\n".join(problems) + hint


def test_self_metrics_panels_wait_for_wiring() -> None:
    """Panels on measurement ``daemon`` show data once the daemons construct SelfMetrics;
    until then they query only SelfMetricsSnapshot fields (the schema they will write)."""
    for path in DASHBOARDS:
        for title, t in _queries(json.loads(path.read_text())):
            if f'FROM "{SELF_MEASUREMENT}"' in t["query"]:
                sel = _SELECT_RE.match(t["query"])
                assert sel is not None
                assert set(_IDENT_RE.findall(sel.group(1))) <= set(snapshot_fields()), title


def test_check_can_fail() -> None:
    """A field, measurement or tag nobody writes is caught (the comparison is live)."""
    board = json.loads((GRAFANA / "dashboards" / "valvey.json").read_text())
    (target,) = board["panels"][1]["targets"][:1]
    good_query = target["query"]
    for bad in (
        good_query.replace('"process_variable_c"', '"no_such_field_c"'),
        good_query.replace('FROM "pid"', 'FROM "no_such_measurement"'),
        good_query.replace("\"loop\" = 'supply_temp'", "\"no_such_tag\" = 'x'"),
    ):
        assert bad != good_query
        board["panels"][1]["targets"] = [{**target, "query": bad}]
        problems, _ = dashboard_problems(board)
        assert problems, bad


def test_dashboards_are_generated() -> None:
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "grafana_dashboards.py")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def promql_problems(board: dict[str, Any]) -> tuple[list[str], int]:
    """PromQL expressions of ``board`` naming a series (``<measurement>_<field>``) or label
    nobody writes; and the number checked."""
    problems: list[str] = []
    n = 0
    for title, t in _queries(board):
        expr = t["expr"]
        n += 1
        names = re.findall(r"([a-z_][a-z0-9_]*)\{", expr)
        assert len(names) == 1, f"{title}: one series per expression: {expr}"
        name = names[0]
        meas = [m for m in SCHEMA.fields if name.startswith(m + "_")
                and name[len(m) + 1:] in SCHEMA.fields[m]]
        if not meas:
            problems.append(f"{title}: series {name} is never written")
            continue
        m = max(meas, key=len)
        labels = set(re.findall(r"([a-z_]+)=~?\"", expr))
        by = re.search(r"\bby \(([^)]*)\)", expr)
        labels |= {x.strip() for x in by.group(1).split(",")} if by else set()
        for tg in sorted(labels - SCHEMA.tags[m] - IDENTITY_TAGS):
            problems.append(f"{title}: label {m}.{tg} is never written")
    for var in board["templating"]["list"]:
        mm = re.match(r"^label_values\(([a-z0-9_]+), (\w+)\)$", var["query"]["query"])
        assert mm is not None, var["query"]
        if not any(mm.group(1) == f"{m}_{f}" for m, fs in SCHEMA.fields.items() for f in fs):
            problems.append(f"variable {var['name']}: series {mm.group(1)} not written")
    return problems, n


@pytest.mark.parametrize("path", PROMQL_DASHBOARDS, ids=[p.stem for p in PROMQL_DASHBOARDS])
def test_promql_dashboard_queries_only_written_series(path: Path) -> None:
    problems, n = promql_problems(json.loads(path.read_text()))
    assert n >= 10
    assert not problems, "\n".join(problems)


def test_promql_check_can_fail() -> None:
    board = json.loads((GRAFANA / "dashboards" / "valvey-promql.json").read_text())
    panel = next(p for p in board["panels"] if p.get("targets"))
    target = panel["targets"][0]
    good = target["expr"]
    for bad in (good.replace("pid_process_variable_c", "pid_no_such_field_c"),
                good.replace('loop="supply_temp"', 'no_such_tag="x"')):
        assert bad != good
        probe = {**board, "panels": [{**panel, "targets": [{**target, "expr": bad}]}]}
        assert promql_problems(probe)[0], bad


def test_both_languages_show_the_same_panels() -> None:
    """The PromQL set is the InfluxQL set rendered again: same panels, same fields."""
    for path in DASHBOARDS:
        influx = json.loads(path.read_text())
        prom = json.loads(path.with_name(f"{path.stem}-promql.json").read_text())
        assert [p["title"] for p in influx["panels"]] == [p["title"] for p in prom["panels"]]
        for a, b in zip(influx["panels"], prom["panels"], strict=True):
            fa = [f for t in a.get("targets", []) for f in re.findall(
                r'AS "([^"]+)"', t["query"])]
            fb = [t["legendFormat"].rsplit(" ", 1)[1] for t in b.get("targets", [])]
            assert fa == fb, a["title"]


def test_provisioning_uses_influxql_and_the_dashboards_datasource() -> None:
    yaml = pytest.importorskip("yaml")
    ds = yaml.safe_load((GRAFANA / "provisioning/datasources/rackplane-influxdb.yaml").read_text())
    (src,) = ds["datasources"]
    assert src["type"] == "influxdb" and src["jsonData"]["version"] == "InfluxQL"
    prov = yaml.safe_load((GRAFANA / "provisioning/dashboards/rackplane.yaml").read_text())
    assert prov["providers"][0]["type"] == "file"
    for path in DASHBOARDS:
        for _title, t in _queries(json.loads(path.read_text())):
            assert t["datasource"]["uid"] == src["uid"]
    prom = yaml.safe_load(
        (GRAFANA / "provisioning/datasources/rackplane-prometheus.yaml").read_text())
    (psrc,) = prom["datasources"]
    assert psrc["type"] == "prometheus"
    for path in PROMQL_DASHBOARDS:
        board = json.loads(path.read_text())
        for _title, t in _queries(board):
            assert t["datasource"]["uid"] == psrc["uid"]
        assert {v["datasource"]["uid"] for v in board["templating"]["list"]} == {psrc["uid"]}
