#!/usr/bin/env python3
"""Generate the Grafana dashboards under config/grafana/dashboards/ (issues 7, 19).

    python scripts/grafana_dashboards.py          # check: exit 1 when a file is stale
    python scripts/grafana_dashboards.py --write  # regenerate

One set of panel definitions (`Series`: measurement, fields, aggregate, tag filter, extra
grouping, rate or not), rendered twice:

- ``valvey.json``, ``racky.json``, ``rlc.json``: InfluxQL (``rawQuery``), which InfluxDB 1.x,
  2.x (through a DBRP mapping) and 3.x all answer; Flux is absent from InfluxDB 3. The
  datasource is the one config/grafana/provisioning/datasources/rackplane-influxdb.yaml
  provisions (`DATASOURCE_UID`).
- ``valvey-promql.json``, ``racky-promql.json``, ``rlc-promql.json``: PromQL (which
  VictoriaMetrics' MetricsQL also answers) for sites whose telemetry goes to Prometheus or
  VictoriaMetrics. A line
  ``<measurement>,<tags> <field>=...`` is the series ``<measurement>_<field>{<tags>}`` there
  (VictoriaMetrics' InfluxDB line-protocol import; a Prometheus fed through an InfluxDB
  line-protocol bridge such as Telegraf's uses the same names). Datasource:
  rackplane-prometheus.yaml (`PROM_DATASOURCE_UID`).

tests/unit/test_grafana_dashboards.py checks that every measurement, field and tag queried is
one the daemons write, and that the files are what this script makes;
tests/integration/test_dashboards_on_engines.py runs every query of every file on the real
engines (InfluxDB 1.x for InfluxQL, VictoriaMetrics for PromQL) with Grafana's macros
expanded as Grafana does.

Every query is grouped by every identity tag (`IDENTITY_TAGS`): selecting several racks shows
one series per rack, never one merged line. Counters (self-metric counters, fields named
``*_total``) are only ever shown as rates per `RATE_UNIT`: InfluxQL
``non_negative_derivative(last(x), 1m)`` per series, PromQL ``60 * rate(x[$__rate_interval])``
(summed per identity), on a panel with a minimum interval (`Board.panel` ``min_interval``) no
shorter than the interval the counter is written at, so a bucket is never empty and a process
restart (the counter back to 0) is never a negative rate (tests/unit/test_grafana_counters.py).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "config" / "grafana" / "dashboards"
DATASOURCE_UID = "rackplane-influxdb"
DS = {"type": "influxdb", "uid": DATASOURCE_UID}
PROM_DATASOURCE_UID = "rackplane-prometheus"
PROM_DS = {"type": "prometheus", "uid": PROM_DATASOURCE_UID}
# Identity tags on every line (rackplane.settings.Identity): the dashboards' variables.
SCOPE = "\"site\" =~ /^$site$/ AND \"rack\" =~ /^$rack$/ AND $timeFilter"
IDENTITY_TAGS = ("site", "row", "rack")
RATE_UNIT = "1m"
"""Counters are shown per minute."""
RATE_UNIT_S = 60
Agg = Literal["mean", "max", "min", "last"]
# PromQL: the aggregation over time inside a bucket, then across series of one identity
_PROM_AGG = {"mean": ("avg_over_time", "avg"), "max": ("max_over_time", "max"),
             "min": ("min_over_time", "min"), "last": ("last_over_time", "max")}


@dataclass(frozen=True)
class Series:
    """One query of a panel: ``agg`` of each field of ``measurement`` per identity (and per
    ``group`` tag), restricted to ``where`` (tag = value); ``rate``: counters, shown as a
    rate per `RATE_UNIT` (``agg`` unused)."""

    measurement: str
    fields: tuple[str, ...]
    agg: Agg = "mean"
    where: tuple[tuple[str, str], ...] = ()
    group: tuple[str, ...] = ()
    rate: bool = False

    def influxql(self) -> str:
        """The InfluxQL text (Grafana macros unexpanded)."""
        if self.rate:
            sel = ", ".join(f'non_negative_derivative(last("{f}"), {RATE_UNIT}) AS "{f}"'
                            for f in self.fields)
        else:
            sel = ", ".join(f'{self.agg}("{f}") AS "{f}"' for f in self.fields)
        cond = SCOPE + "".join(f" AND \"{k}\" = '{v}'" for k, v in self.where)
        tags = ", ".join(f'"{t}"' for t in (*IDENTITY_TAGS, *self.group))
        return (f'SELECT {sel} FROM "{self.measurement}" WHERE {cond} '
                f"GROUP BY time($__interval), {tags} fill(null)")

    def promql(self, field: str) -> str:
        """The PromQL expression of one field (Grafana macros unexpanded)."""
        metric = f"{self.measurement}_{field}"
        labels = ", ".join(['site=~"$site"', 'rack=~"$rack"',
                            *(f'{k}="{v}"' for k, v in self.where)])
        by = ", ".join((*IDENTITY_TAGS, *self.group))
        if self.rate:
            return (f"{RATE_UNIT_S} * sum by ({by}) "
                    f"(rate({metric}{{{labels}}}[$__rate_interval]))")
        over, across = _PROM_AGG[self.agg]
        return f"{across} by ({by}) ({over}({metric}{{{labels}}}[$__interval]))"


def q(measurement: str, fields: list[str], where: dict[str, str] | None = None,
      group: tuple[str, ...] = (), agg: Agg = "mean") -> Series:
    """``agg(field)`` of each field, scoped to $site/$rack, one series per identity (and per
    ``group`` tag)."""
    return Series(measurement, tuple(fields), agg, tuple((where or {}).items()), group)


def rate(measurement: str, fields: list[str], where: dict[str, str] | None = None,
         group: tuple[str, ...] = ()) -> Series:
    """Counters as a rate per `RATE_UNIT` (InfluxQL: ``non_negative_derivative(last(x))``
    of each series, the per-series aggregate first; PromQL: ``rate``): a reset to 0 at a
    restart is left out, never a negative rate."""
    return Series(measurement, tuple(fields), "last", tuple((where or {}).items()), group,
                  rate=True)


class Board:
    """A dashboard being assembled: rows of time-series panels, 2 panels a row; rendered in
    InfluxQL or PromQL (`json`)."""

    def __init__(self, uid: str, title: str, description: str, daemon: str, anchor: str):
        self.uid, self.title, self.description, self.daemon = uid, title, description, daemon
        self.anchor = anchor  # a measurement the daemon always writes: the variables' source
        self.anchor_field = ""  # a field of it (PromQL: the variables' series)
        self.items: list[dict[str, Any]] = []  # rows and panels, in order

    def row(self, title: str) -> None:
        self.items.append({"type": "row", "title": title})

    def panel(self, title: str, queries: list[Series], unit: str = "short",
              description: str = "", min_interval: str | None = None,
              stack_unless: str | None = None) -> None:
        """A time-series panel; each query's legend is the rack (one series per identity),
        the tags it groups by and the field; ``min_interval``: Grafana's minimum interval
        (required for rates); ``stack_unless``: series are stacked, except those whose name
        matches this regular expression (a limit drawn as a line against the stack)."""
        if any(sr.rate for sr in queries) and not min_interval:
            raise ValueError(f"{title}: a rate panel needs a minimum interval")
        self.items.append({"type": "timeseries", "title": title, "queries": queries,
                           "unit": unit, "description": description,
                           "min_interval": min_interval, "stack_unless": stack_unless})

    def common(self, alarms: bool = True) -> None:
        """Alarms (``alarms``), commands and the daemon's own health: the same on every
        dashboard."""
        self.row("Alarms and commands" if alarms else "Commands")
        if alarms:
            self.panel("Active alarms", [q("alarm", ["active", "severity_code"],
                                           group=("alarm",), agg="max")],
                       description="1 while an alarm is active; severity_code 1 warning .. "
                       "4 critical (one series per alarm id)")
        self.panel("Commands", [q("command", ["ok", "latency_s"], group=("verb", "outcome"),
                                  agg="max")],
                   description="every command, accepted (ok = 1) or refused (ok = 0)")
        self.row(f"{self.daemon} health (self-metrics)")
        d = {"daemon": self.daemon}
        self.panel("Control tick lateness and PV age",
                   [q("daemon", ["tick_late_max_s", "tick_late_last_s", "pv_age_s"], where=d,
                      agg="max")], unit="s")
        self.panel("Telemetry spool depth",
                   [q("daemon", ["spool_depth_lines"], where=d, agg="last")],
                   description="depth rising: the database is unreachable (the spool keeps "
                   "everything up to its bound)")
        # Self-metrics are written every [metrics] interval_s (10 s by default).
        self.panel("Telemetry losses and errors per minute",
                   [rate("daemon", ["telemetry_dropped_lines", "telemetry_rejected_lines",
                                    "spool_errors", "telemetry_ts_out_of_window_lines"],
                         where=d)], min_interval="1m",
                   description="rates of the counters: drops are counted, never silent; "
                   "out-of-window timestamps are restamped or dropped (tsdb.ts_out_of_window)")
        self.panel("Reconnects, rejected commands and invalid samples per minute",
                   [rate("daemon", ["mqtt_reconnects", "modbus_reconnects", "commands_rejected",
                                    "tick_overruns", "tick_woken", "modbus_invalid_samples",
                                    "input_invalid_samples"], where=d)],
                   min_interval="1m")

    def _targets(self, item: dict[str, Any], lang: str) -> list[dict[str, Any]]:
        queries: list[Series] = item["queries"]
        if lang == "influxql":  # the alias names only tags its own query groups by
            return [{"refId": chr(ord("A") + i), "datasource": DS, "rawQuery": True,
                     "resultFormat": "time_series", "query": sr.influxql(),
                     "alias": "$tag_site/$tag_rack "
                     + "".join(f"$tag_{g} " for g in sr.group) + "$col"}
                    for i, sr in enumerate(queries)]
        out: list[dict[str, Any]] = []
        for sr in queries:
            for f in sr.fields:
                tags = "".join(f"{{{{{g}}}}} " for g in sr.group)
                out.append({"refId": chr(ord("A") + len(out)), "datasource": PROM_DS,
                            "editorMode": "code", "range": True, "expr": sr.promql(f),
                            "legendFormat": f"{{{{site}}}}/{{{{rack}}}} {tags}{f}",
                            # a rate's $__rate_interval spans 4 of these at least
                            **({"interval": item["min_interval"]} if sr.rate else {})})
        return out

    def _panels(self, lang: str) -> list[dict[str, Any]]:
        ds = DS if lang == "influxql" else PROM_DS
        panels: list[dict[str, Any]] = []
        x = y = 0
        for n, item in enumerate(self.items, start=1):
            if item["type"] == "row":
                if x:
                    y += 8
                    x = 0
                panels.append({"id": n, "type": "row", "title": item["title"],
                               "collapsed": False,
                               "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
                y += 1
                continue
            mi = item["min_interval"]
            custom: dict[str, Any] = {"spanNulls": False}
            overrides: list[dict[str, Any]] = []
            if item.get("stack_unless"):
                custom |= {"stacking": {"mode": "normal", "group": "A"}, "fillOpacity": 25}
                overrides.append({
                    "matcher": {"id": "byRegexp", "options": item["stack_unless"]},
                    "properties": [{"id": "custom.stacking", "value": {"mode": "none"}},
                                   {"id": "custom.fillOpacity", "value": 0},
                                   {"id": "custom.lineWidth", "value": 2}]})
            panels.append({
                "id": n, "type": "timeseries", "title": item["title"],
                "description": item["description"], "datasource": ds,
                **({"interval": mi} if mi else {}),
                "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
                "fieldConfig": {"defaults": {"unit": item["unit"], "custom": custom},
                                "overrides": overrides},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"},
                            "tooltip": {"mode": "multi"}},
                "targets": self._targets(item, lang),
            })
            x = 12 - x
            if x == 0:
                y += 8
        return panels

    def json(self, lang: Literal["influxql", "promql"] = "influxql") -> dict[str, Any]:
        """The dashboard in ``lang`` (InfluxQL for InfluxDB, PromQL for Prometheus and
        VictoriaMetrics)."""
        if lang == "influxql":
            var = [
                {"name": name, "label": name, "type": "query", "datasource": DS,
                 "query": f'SHOW TAG VALUES FROM "{self.anchor}" WITH KEY = "{name}"',
                 "refresh": 2, "includeAll": True, "multi": True,
                 "current": {"selected": True, "text": "All", "value": "$__all"}}
                for name in ("site", "rack")
            ]
            uid, title, tags = self.uid, self.title, ["rackplane", self.daemon]
        else:
            sel = f"{self.anchor}_{self.anchor_field}"
            var = [
                {"name": name, "label": name, "type": "query", "datasource": PROM_DS,
                 "query": {"query": f"label_values({sel}, {name})", "refId": "var"},
                 "definition": f"label_values({sel}, {name})",
                 "refresh": 2, "includeAll": True, "multi": True,
                 "current": {"selected": True, "text": "All", "value": "$__all"}}
                for name in ("site", "rack")
            ]
            uid, title = f"{self.uid}-promql", f"{self.title} [PromQL]"
            tags = ["rackplane", self.daemon, "promql"]
        return {
            "uid": uid, "title": title, "description": self.description,
            "tags": tags, "timezone": "utc", "editable": True,
            "schemaVersion": 39, "version": 1, "refresh": "10s",
            "time": {"from": "now-6h", "to": "now"},
            "templating": {"list": var}, "annotations": {"list": []},
            "panels": self._panels(lang),
        }


def valvey() -> Board:
    b = Board("rackplane-valvey", "rackplane / valvey (cooling)",
              "CDU supply loop, pumps, valves, alarms and valvey's own health", "valvey",
              "coolant_loop")
    b.anchor_field = "supply_temp_c_quality"  # written whatever the sensor's state
    b.row("Supply temperature loop")
    sl = {"loop": "supply_temp"}
    b.panel("Supply temperature vs setpoint",
            [q("pid", ["process_variable_c", "setpoint_c"], where=sl),
             q("coolant_loop", ["supply_temp_c", "return_temp_c", "facility_supply_temp_c"])],
            unit="celsius")
    b.panel("Supply loop output and terms",
            [q("pid", ["output_pct", "p_term_pct", "i_term_pct", "d_term_pct", "ff_term_pct"],
               where=sl)], unit="percent")
    b.panel("Loop mode and PV quality",
            [q("pid", ["mode_code", "pv_quality", "constraint_code"], where=sl, agg="last")],
            description="mode_code 0 initialising, 1 auto, 2 manual, 3 failsafe, 4 shadow; "
            "pv_quality 0 good")
    b.panel("Heat removed and dew point",
            [q("coolant_loop", ["heat_removed_kw"]), q("environment", ["dew_point_c"])])
    b.row("Valves")
    b.panel("Valve position and command",
            [q("valve", ["valve_position_pct", "valve_command_pct", "valve_b_position_pct",
                         "valve_b_command_pct"])], unit="percent")
    b.panel("Rack isolation and leak",
            [q("valve", ["rack_isolation_open", "rack_isolation_closed"], agg="last"),
             q("cdu", ["leak_rope_detected", "leak_rope_sensor_fault", "isolated_code"],
               agg="last")])
    b.row("Pumps and hydraulics")
    b.panel("Pump speed",
            [q("pump", ["pump_speed_pct", "pump_speed_command_pct", "pump_a_speed_pct",
                        "pump_b_speed_pct"])], unit="percent")
    b.panel("Pump state",
            [q("pump", ["pump_a_running", "pump_b_running", "pump_a_fault", "pump_b_fault",
                        "duty_pump_select"], agg="last")])
    b.panel("Flow and pressure",
            [q("coolant_loop", ["flow_lpm", "diff_pressure_kpa", "loop_pressure_kpa",
                                "filter_diff_pressure_kpa"])])
    b.panel("Rack power cap requested from racky",
            [q("cdu", ["rack_power_cap_w", "capacity_estimate_w"])], unit="watt")
    b.common()
    return b


def racky() -> Board:
    b = Board("rackplane-racky", "rackplane / racky (power and rack health)",
              "Rack power, caps, power shelves, links, thermal, lifecycle and racky's own "
              "health", "racky", "rack")
    b.anchor_field = "trays_off"  # written every tick
    b.row("Power and caps")
    b.panel("Rack power against its limit",
            [q("rack", ["rack_power_w", "it_power_w", "limit_w", "capacity_w", "caps_total_w",
                        "derate_w"])], unit="watt")
    b.panel("Power shelves",
            [q("power_shelf", ["shelf_input_power_w", "shelf_output_power_w",
                               "shelf_available_w"], group=("device",))],
            unit="watt")
    b.panel("Tray power and caps",
            [q("node", ["power_w", "cap_w", "enforced_tray_cap_w"], group=("device",))],
            unit="watt")
    b.panel("Shelf health",
            [q("power_shelf", ["psus_ok", "rack_spare_psus", "rack_redundant_feeds",
                               "bbu_energy_pct"], group=("device",), agg="last")])
    b.row("Thermal")
    b.panel("Hottest GPU and tray coolant outlet",
            [q("node", ["hottest_gpu_temp_c", "coolant_out_temp_c"], group=("device",),
               agg="max")], unit="celsius")
    b.panel("Smallest margin to a GPU's thermal limit",
            [q("rack", ["min_t_limit_c"], agg="min")], unit="celsius")
    b.row("Links")
    # Link figures are written every control.link_telemetry_interval_s (60 s by default), a
    # line per port (hundreds): a bucket shorter than that would only return empty rows (on
    # a 10 min range at 1 s, ~50 MB of nulls per query).
    b.panel("Link error detectors (per port)",
            [q("link", ["cusum", "flap_score"], group=("port",), agg="max")],
            description="CUSUM of the pre-FEC error rate and the flap score of each port",
            min_interval="1m")
    b.panel("Pre-FEC error rate (per port)",
            [q("link", ["pre_fec_per_min"], group=("port",), agg="max")], min_interval="1m")
    b.panel("Link events per minute (per port)",
            [rate("link", ["link_events_total"], group=("port",))], min_interval="2m")
    b.row("Lifecycle")
    b.panel("Trays powered", [q("node", ["powered"], group=("device",), agg="last"),
                              q("rack", ["trays_off"], agg="last")])
    b.common()
    return b


def rlc() -> Board:
    b = Board("rackplane-rlc", "rackplane / rlc (fleet power budgets)",
              "Row power against its limit, each rack's budget lease (grant, committed power, "
              "expiry), demand, power and cooling, and rlc's own health (written by the "
              "leading rlc only)", "rlc", "fleet_row")
    b.anchor_field = "limit_w"  # written every tick while leading
    row = ("fleet_row",)
    rack = ("fleet_row", "fleet_rack")
    b.row("Rows")
    b.panel("Row power against its limit",
            [q("fleet_row", ["limit_w", "committed_w", "grants_w", "power_w"], group=row)],
            unit="watt", description="per row: the breaker limit, Σ committed (what the racks "
            "may still draw: never above the limit), Σ grants, Σ reported power (AC input; "
            "missing while a rack does not report it)")
    b.panel("Rack power stacked against the row limit",
            [q("fleet_rack", ["power_w"], group=rack), q("fleet_row", ["limit_w"], group=row)],
            unit="watt", stack_unless=".*limit_w$",
            description="each rack's reported power (AC input), stacked, with each row's limit "
            "as a line (several rows selected: the stack holds them all; pick one row's "
            "racks in the legend)")
    b.row("Racks: leases")
    b.panel("Grants and committed power per rack",
            [q("fleet_rack", ["grant_w", "committed_w"], group=rack)], unit="watt",
            description="grant: the current lease's value; committed: the most the rack may "
            "still draw (an older, higher lease not yet acknowledged or expired)")
    b.panel("Lease expiry per rack",
            [q("fleet_rack", ["lease_expires_in_s"], group=rack, agg="min")], unit="s",
            description="s until the rack's current lease expires (renewed at ttl_s / 3: a "
            "saw-tooth; at 0 the rack falls to its floor by itself)")
    b.row("Racks: demand, power, cooling")
    b.panel("Demand, power, cooling and floor per rack",
            [q("fleet_rack", ["demand_w", "power_w", "cooling_w", "floor_w"], group=rack)],
            unit="watt", description="demand: what racky asks for; power: what its shelves "
            "draw; cooling: the capacity the allocator applies (the lower of configured and "
            "reported: valvey's measurement through racky)")
    b.panel("Reachable racks",
            [q("fleet_rack", ["reachable"], group=rack, agg="min"),
             q("fleet_row", ["racks_unreachable"], group=row, agg="max")],
            description="1: the rack's report changes (racky alive); an unreachable rack's "
            "grant is held, then lowered to its floor")
    b.common(alarms=False)
    return b


def render() -> dict[Path, str]:
    out: dict[Path, str] = {}
    for b in (valvey(), racky(), rlc()):
        out[OUT / f"{b.daemon}.json"] = json.dumps(b.json("influxql"), indent=2) + "\n"
        out[OUT / f"{b.daemon}-promql.json"] = json.dumps(b.json("promql"), indent=2) + "\n"
    return out


def main(argv: list[str]) -> int:
    files = render()
    if "--write" in argv:
        OUT.mkdir(parents=True, exist_ok=True)
        for path, text in files.items():
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
        return 0
    stale = [p for p, t in files.items() if not p.exists() or p.read_text() != t]
    for p in stale:
        print(f"stale: {p.relative_to(ROOT)} (run scripts/grafana_dashboards.py --write)")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
