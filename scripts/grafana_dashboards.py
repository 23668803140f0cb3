#!/usr/bin/env python3
"""Generate the Grafana dashboards under config/grafana/dashboards/ (issue 7).

    python scripts/grafana_dashboards.py          # check: exit 1 when a file is stale
    python scripts/grafana_dashboards.py --write  # regenerate

Every query is InfluxQL (``rawQuery``), which InfluxDB 1.8+, 2.x (through a DBRP mapping) and
3.x all answer; Flux is absent from InfluxDB 3. The datasource is the one
config/grafana/provisioning/datasources/rackplane-influxdb.yaml provisions (uid
`DATASOURCE_UID`). tests/unit/test_grafana_dashboards.py checks that every measurement, field
and tag queried here is one the daemons write, and that the files are what this script makes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "config" / "grafana" / "dashboards"
DATASOURCE_UID = "rackplane-influxdb"
DS = {"type": "influxdb", "uid": DATASOURCE_UID}
# Identity tags on every line (rackplane.settings.Identity): the dashboards' variables.
SCOPE = "\"site\" =~ /^$site$/ AND \"rack\" =~ /^$rack$/ AND $timeFilter"


def q(measurement: str, fields: list[str], where: str = "", group: str = "",
      agg: str = "mean") -> str:
    """One InfluxQL query: ``agg(field)`` of each field, scoped to $site/$rack."""
    sel = ", ".join(f'{agg}("{f}") AS "{f}"' for f in fields)
    cond = SCOPE + (f" AND {where}" if where else "")
    grp = "time($__interval)" + (f", {group}" if group else "")
    return f'SELECT {sel} FROM "{measurement}" WHERE {cond} GROUP BY {grp} fill(null)'


class Board:
    """A dashboard being assembled: rows of time-series panels, 2 panels a row."""

    def __init__(self, uid: str, title: str, description: str, daemon: str, anchor: str):
        self.uid, self.title, self.description, self.daemon = uid, title, description, daemon
        self.anchor = anchor  # a measurement the daemon always writes: the variables' source
        self.panels: list[dict[str, Any]] = []
        self.y = 0
        self.x = 0
        self.next_id = 1

    def row(self, title: str) -> None:
        if self.x:
            self.y += 8
            self.x = 0
        self.panels.append({"id": self.next_id, "type": "row", "title": title, "collapsed": False,
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}, "panels": []})
        self.next_id += 1
        self.y += 1

    def panel(self, title: str, queries: list[str], unit: str = "short",
              description: str = "", legend: str = "") -> None:
        targets = [{"refId": chr(ord("A") + i), "datasource": DS, "rawQuery": True,
                    "resultFormat": "time_series", "query": text,
                    **({"alias": legend} if legend else {})}
                   for i, text in enumerate(queries)]
        self.panels.append({
            "id": self.next_id, "type": "timeseries", "title": title,
            "description": description, "datasource": DS,
            "gridPos": {"h": 8, "w": 12, "x": self.x, "y": self.y},
            "fieldConfig": {"defaults": {"unit": unit, "custom": {"spanNulls": False}},
                            "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom"},
                        "tooltip": {"mode": "multi"}},
            "targets": targets,
        })
        self.next_id += 1
        self.x = 12 - self.x
        if self.x == 0:
            self.y += 8

    def common(self) -> None:
        """Alarms, commands and the daemon's own health: the same on both dashboards."""
        self.row("Alarms and commands")
        self.panel("Active alarms", [q("alarm", ["active", "severity_code"], group='"alarm"',
                                       agg="max")],
                   description="1 while an alarm is active; severity_code 1 warning .. "
                   "4 critical (one series per alarm id)", legend="$tag_alarm $col")
        self.panel("Commands", [q("command", ["ok", "latency_s"], group='"verb", "outcome"',
                                  agg="max")],
                   description="every command, accepted (ok = 1) or refused (ok = 0)",
                   legend="$tag_verb $tag_outcome $col")
        self.row(f"{self.daemon} health (self-metrics)")
        d = f"\"daemon\" = '{self.daemon}'"
        self.panel("Control tick lateness and PV age",
                   [q("daemon", ["tick_late_max_s", "tick_late_last_s", "pv_age_s"], where=d,
                      agg="max")], unit="s")
        self.panel("Telemetry spool",
                   [q("daemon", ["spool_depth_lines", "telemetry_dropped_lines",
                                 "telemetry_rejected_lines", "spool_errors"], where=d,
                      agg="last")],
                   description="depth rising: the database is unreachable (the spool keeps "
                   "everything up to its bound); drops are counted, never silent")
        self.panel("Reconnects and rejected commands",
                   [q("daemon", ["mqtt_reconnects", "modbus_reconnects", "commands_rejected",
                                 "tick_overruns"], where=d, agg="last")])

    def json(self) -> dict[str, Any]:
        var = [
            {"name": name, "label": name, "type": "query", "datasource": DS,
             "query": f'SHOW TAG VALUES FROM "{meas}" WITH KEY = "{name}"',
             "refresh": 2, "includeAll": True, "multi": False,
             "current": {"selected": True, "text": "All", "value": "$__all"}}
            for name, meas in (("site", self.anchor), ("rack", self.anchor))
        ]
        return {
            "uid": self.uid, "title": self.title, "description": self.description,
            "tags": ["rackplane", self.daemon], "timezone": "utc", "editable": True,
            "schemaVersion": 39, "version": 1, "refresh": "10s",
            "time": {"from": "now-6h", "to": "now"},
            "templating": {"list": var}, "annotations": {"list": []},
            "panels": self.panels,
        }


def valvey() -> Board:
    b = Board("rackplane-valvey", "rackplane / valvey (cooling)",
              "CDU supply loop, pumps, valves, alarms and valvey's own health", "valvey",
              "coolant_loop")
    b.row("Supply temperature loop")
    sl = "\"loop\" = 'supply_temp'"
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
    b.row("Power and caps")
    b.panel("Rack power against its limit",
            [q("rack", ["rack_power_w", "it_power_w", "limit_w", "capacity_w", "caps_total_w",
                        "derate_w"])], unit="watt")
    b.panel("Power shelves",
            [q("power_shelf", ["shelf_input_power_w", "shelf_output_power_w",
                               "shelf_available_w"], group='"device"')],
            unit="watt", legend="$tag_device $col")
    b.panel("Tray power and caps",
            [q("node", ["power_w", "cap_w", "enforced_tray_cap_w"], group='"device"')],
            unit="watt", legend="$tag_device $col")
    b.panel("Shelf health",
            [q("power_shelf", ["psus_ok", "rack_spare_psus", "rack_redundant_feeds",
                               "bbu_energy_pct"], group='"device"', agg="last")],
            legend="$tag_device $col")
    b.row("Thermal")
    b.panel("Hottest GPU and tray coolant outlet",
            [q("node", ["hottest_gpu_temp_c", "coolant_out_temp_c"], group='"device"',
               agg="max")], unit="celsius", legend="$tag_device $col")
    b.panel("Smallest margin to a GPU's thermal limit",
            [q("rack", ["min_t_limit_c"], agg="min")], unit="celsius")
    b.row("Links")
    b.panel("Link error detectors (per port)",
            [q("link", ["cusum", "flap_score"], group='"port"', agg="max")],
            legend="$tag_port $col",
            description="CUSUM of the pre-FEC error rate and the flap score of each port")
    b.panel("Pre-FEC errors and link events",
            [q("link", ["pre_fec_per_min", "link_events_total"], group='"port"', agg="max")],
            legend="$tag_port $col")
    b.row("Lifecycle")
    b.panel("Trays powered", [q("node", ["powered"], group='"device"', agg="last"),
                              q("rack", ["trays_off"], agg="last")],
            legend="$tag_device $col")
    b.common()
    return b


def render() -> dict[Path, str]:
    return {OUT / f"{b.daemon}.json": json.dumps(b.json(), indent=2, sort_keys=False) + "\n"
            for b in (valvey(), racky())}


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
