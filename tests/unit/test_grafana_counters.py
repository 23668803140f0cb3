"""Counters are shown as rates, one series per identity (issue 14 item 10).

The counter fields are derived from the code, never listed here: the self-metric fields whose
metadata says ``counter`` (`rackplane.io.selfmetrics.counter_fields`), and every written field
named ``*_total`` (docs/CONTRACTS.md: a time-series field that counts since process start ends
in ``_total`` unless it is a self-metric counter) in the schema
tests/unit/test_grafana_dashboards.py derives from the daemons' writes.

Every query that selects a counter must select it only as
``non_negative_derivative(last("<field>"), <unit>)`` (a per-series aggregate, then the
derivative: a restart's reset to 0 is never a negative rate) on a panel with a minimum
interval; every query is grouped by every identity tag (selecting several racks never merges
them into one series).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from rackplane.io.selfmetrics import MEASUREMENT as SELF_MEASUREMENT
from rackplane.io.selfmetrics import counter_fields
from tests.unit.test_grafana_dashboards import (
    DASHBOARDS,
    GRAFANA,
    IDENTITY_TAGS,
    PROMQL_DASHBOARDS,
    SCHEMA,
)

_FROM_RE = re.compile(r'\bFROM\s+"([^"]+)"')
_SELECT_RE = re.compile(r"^\s*SELECT\s+(.*?)\s+FROM\s", re.DOTALL)
_GROUP_RE = re.compile(r"\bGROUP\s+BY\s+(.*?)(?:\s+fill\(.*\))?\s*$", re.DOTALL)
_RATE_RE = re.compile(r'^non_negative_derivative\(last\("([^"]+)"\), \d+[smh]\) AS "\1"$')


def counters() -> set[tuple[str, str]]:
    """(measurement, field) of every counter the daemons write."""
    out = {(SELF_MEASUREMENT, f) for f in counter_fields()}
    out |= {(m, f) for m, fields in SCHEMA.fields.items() for f in fields if f.endswith("_total")}
    return out


def _select_items(select: str) -> list[str]:
    """The comma-separated select expressions (commas inside parentheses kept)."""
    items, depth, cur = [], 0, ""
    for ch in select:
        if ch == "," and depth == 0:
            items.append(cur.strip())
            cur = ""
            continue
        depth += (ch == "(") - (ch == ")")
        cur += ch
    items.append(cur.strip())
    return items


def counter_problems(board: dict[str, Any]) -> list[str]:
    """Every query of ``board`` that shows a counter other than as a rate, a rate panel with
    no minimum interval, or a query not grouped by every identity tag."""
    known = counters()
    problems = []
    for p in board["panels"]:
        for t in p.get("targets", []):
            title, query = p["title"], t["query"]
            (m,) = _FROM_RE.findall(query)
            sel = _SELECT_RE.match(query)
            assert sel is not None, query
            rates = False
            for item in _select_items(sel.group(1)):
                named = set(re.findall(r'"([^"]+)"', item))
                counted = {f for f in named if (m, f) in known}
                if not counted:
                    continue
                rm = _RATE_RE.match(item)
                if rm is None or {rm.group(1)} != counted:
                    problems.append(f"{title}: counter {m}.{sorted(counted)} not a rate: {item}")
                rates = True
            if rates and not p.get("interval"):
                problems.append(f"{title}: a rate panel needs a minimum interval")
            grp = _GROUP_RE.search(query)
            grouped = set(re.findall(r'"([^"]+)"', grp.group(1))) if grp else set()
            if not grouped >= IDENTITY_TAGS:
                problems.append(f"{title}: not grouped by {sorted(IDENTITY_TAGS - grouped)}")
    return problems


def test_counter_fields_are_derived() -> None:
    c = counters()
    for expected in (("daemon", "commands_rejected"), ("daemon", "mqtt_reconnects"),
                     ("daemon", "spool_errors"), ("daemon", "telemetry_dropped_lines"),
                     ("daemon", "tick_overruns"), ("link", "link_events_total"),
                     ("daemon", "modbus_invalid_samples")):
        assert expected in c
    assert ("daemon", "spool_depth_lines") not in c  # a gauge


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.stem for p in DASHBOARDS])
def test_counters_are_only_queried_as_rates_per_identity(path: Path) -> None:
    board = json.loads(path.read_text())
    assert not counter_problems(board)
    shown = {(json.dumps(t["query"])) for p in board["panels"] for t in p.get("targets", [])}
    assert any("non_negative_derivative" in q for q in shown)  # rates are there at all


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.stem for p in DASHBOARDS])
def test_several_racks_can_be_selected(path: Path) -> None:
    board = json.loads(path.read_text())
    for var in board["templating"]["list"]:
        assert var["multi"] and var["includeAll"], var["name"]


def test_check_can_fail() -> None:
    """A raw counter, a rate on a panel with no minimum interval, and a query that merges
    the racks are each caught."""
    board = json.loads((GRAFANA / "dashboards" / "valvey.json").read_text())
    panel = next(p for p in board["panels"] if "commands_rejected" in json.dumps(p))
    target = panel["targets"][0]
    good = target["query"]
    assert not counter_problems({"panels": [panel]})
    raw = re.sub(r'non_negative_derivative\(last\("commands_rejected"\), 1m\)',
                 'last("commands_rejected")', good)
    merged = good.replace(', "site", "row", "rack"', "")
    assert raw != good and merged != good
    no_interval = {k: v for k, v in panel.items() if k != "interval"}
    for bad_panel, bad_query in ((panel, raw), (panel, merged), (no_interval, good)):
        probe = {**bad_panel, "targets": [{**target, "query": bad_query}]}
        assert counter_problems({"panels": [probe]}), bad_query


_PROM_RATE_RE = re.compile(r"^60 \* sum by \(([^)]*)\) \(rate\(([a-z0-9_]+)\{[^}]*\}"
                           r"\[\$__rate_interval\]\)\)$")
_PROM_BY_RE = re.compile(r"\bby \(([^)]*)\)")


def promql_counter_problems(board: dict[str, Any]) -> list[str]:
    """PromQL: a counter series read other than as ``60 * sum by (...) (rate(x[...]))``, a
    rate without a minimum step (its ``$__rate_interval`` then spans 4 of them), or an
    expression not grouped by every identity label."""
    known = {f"{m}_{f}" for m, f in counters()}
    problems = []
    for p in board["panels"]:
        for t in p.get("targets", []):
            title, expr = p["title"], t["expr"]
            names = set(re.findall(r"([a-z_][a-z0-9_]*)\{", expr))
            if names & known:
                rm = _PROM_RATE_RE.match(expr)
                if rm is None or {rm.group(2)} != names:
                    problems.append(f"{title}: counter {sorted(names & known)} not a rate: "
                                    f"{expr}")
                if not t.get("interval") or not p.get("interval"):
                    problems.append(f"{title}: a rate needs a minimum step")
            by = _PROM_BY_RE.search(expr)
            grouped = {x.strip() for x in by.group(1).split(",")} if by else set()
            if not grouped >= IDENTITY_TAGS:
                problems.append(f"{title}: not grouped by {sorted(IDENTITY_TAGS - grouped)}")
    return problems


@pytest.mark.parametrize("path", PROMQL_DASHBOARDS, ids=[p.stem for p in PROMQL_DASHBOARDS])
def test_promql_counters_are_only_queried_as_rates_per_identity(path: Path) -> None:
    board = json.loads(path.read_text())
    assert not promql_counter_problems(board)
    assert any("rate(" in t["expr"] for p in board["panels"] for t in p.get("targets", []))


def test_promql_check_can_fail() -> None:
    board = json.loads((GRAFANA / "dashboards" / "valvey-promql.json").read_text())
    panel = next(p for p in board["panels"] if "daemon_commands_rejected" in json.dumps(p))
    target = next(t for t in panel["targets"] if "daemon_commands_rejected" in t["expr"])
    good = target["expr"]
    assert not promql_counter_problems({"panels": [{**panel, "targets": [target]}]})
    raw = 'max by (site, row, rack) (daemon_commands_rejected{daemon="valvey"})'
    merged = good.replace("sum by (site, row, rack)", "sum by (site)")
    no_step = {k: v for k, v in target.items() if k != "interval"}
    for t in ({**target, "expr": raw}, {**target, "expr": merged}, no_step):
        assert promql_counter_problems({"panels": [{**panel, "targets": [t]}]}), t
