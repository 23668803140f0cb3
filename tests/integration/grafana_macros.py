"""Grafana's query expansion, as Grafana does it, for running the shipped dashboards' queries
on real engines (Grafana itself cannot be installed here).

What is reproduced (Grafana 9-11 sources; links are to grafana/grafana):

- the interval: ``rangeutil.calculateInterval(range, maxDataPoints, lowLimit)``:
  `round_interval` of range / maxDataPoints, raised to the panel's minimum interval or else
  the datasource's ``timeInterval``; rendered by `seconds_to_hms` (``$__interval``) and in ms
  (``$__interval_ms``) (packages/grafana-data/src/datetime/rangeutil.ts);
- InfluxQL ``$timeFilter``: ``time >= <from>ms and time <= <to>ms``
  (public/app/plugins/datasource/influxdb/influx_query_model.ts ``getTimeFilter``);
- template variables of a multi-value / include-All variable: each value regex-escaped
  (``escapeRegex`` for InfluxQL; ``prometheusSpecialRegexEscape`` for PromQL), one value as
  itself, several as ``(a|b)``; "All" without a custom all value is every option of the
  variable (``interpolateQueryExpr`` of the influxdb and prometheus datasources);
- PromQL ``$__rate_interval`` = max($__interval + scrape, 4 x scrape), scrape being the
  target's minimum step or the datasource's ``timeInterval``; the query_range step is the
  interval, and start/end are aligned to it (prometheus datasource ``createQuery``).

The variable syntax is templateSrv's: ``$name``, ``${name}``, ``[[name]]``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_VAR_RE = re.compile(r"\$(\w+)|\[\[(\w+)\]\]|\$\{(\w+)\}")
_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000,
             "w": 604_800_000, "y": 31_536_000_000}
_ROUND = [(15, 10), (35, 20), (75, 50), (150, 100), (350, 200), (750, 500), (1500, 1000),
          (3500, 2000), (7500, 5000), (12500, 10000), (17500, 15000), (25000, 20000),
          (45000, 30000), (90000, 60000), (210000, 120000), (450000, 300000),
          (750000, 600000), (1050000, 900000), (1500000, 1200000), (2700000, 1800000),
          (5400000, 3600000), (9000000, 7200000), (16200000, 10800000),
          (32400000, 21600000), (86400000, 43200000), (604800000, 86400000),
          (1814400000, 604800000), (3628800000, 2592000000)]


def interval_to_ms(text: str) -> int:
    """``"1m"`` → 60000 (rangeutil.intervalToMs)."""
    m = re.fullmatch(r"(\d+)(ms|s|m|h|d|w|y)", text.strip())
    if m is None:
        raise ValueError(f"not an interval: {text!r}")
    return int(m.group(1)) * _UNITS_MS[m.group(2)]


def round_interval(ms: float) -> int:
    """rangeutil.roundInterval."""
    for limit, value in _ROUND:
        if ms < limit:
            return value
    return 31536000000


def seconds_to_hms(seconds: float) -> str:
    """rangeutil.secondsToHms: the largest whole unit."""
    s = int(seconds)
    for unit, n in (("y", s // 31536000), ("d", (s % 31536000) // 86400),
                    ("h", (s % 86400) // 3600), ("m", (s % 3600) // 60), ("s", s % 60)):
        if n:
            return f"{n}{unit}"
    return f"{int(seconds * 1000)}ms"


def calculate_interval_ms(from_ms: int, to_ms: int, max_data_points: int,
                          low_limit: str | None) -> int:
    """rangeutil.calculateInterval: the bucket in ms."""
    ms = round_interval((to_ms - from_ms) / max_data_points)
    low = interval_to_ms(low_limit) if low_limit else 1
    return max(ms, low)


def escape_regex(value: str) -> str:
    """@grafana/data escapeRegex (InfluxQL: the value goes inside ``/^...$/``)."""
    return re.sub(r"([\\^$*+?.()|\[\]{}/])", r"\\\1", value)


def prometheus_regex_escape(value: str) -> str:
    """prometheusSpecialRegexEscape: regex metacharacters escaped for a PromQL string (the
    backslash doubled, as the PromQL string literal halves it)."""
    v = value.replace("\\", "\\\\\\\\")
    v = re.sub(r"([$^*{}\[\]'+?.()|])", r"\\\\\1", v)
    return v


@dataclass(frozen=True)
class Variable:
    """A dashboard variable's selection: ``values`` chosen (the options when "All")."""

    name: str
    values: Sequence[str]
    multi: bool = True
    include_all: bool = True


def render_variable(var: Variable, lang: str) -> str:
    """interpolateQueryExpr of the influxdb (``influxql``) or prometheus datasource."""
    if not var.multi and not var.include_all:
        return var.values[0]
    esc = escape_regex if lang == "influxql" else prometheus_regex_escape
    vals = [esc(v) for v in var.values]
    return vals[0] if len(vals) == 1 else "(" + "|".join(vals) + ")"


def expand(text: str, values: Mapping[str, str]) -> str:
    """templateSrv.replace: every ``$name`` / ``${name}`` / ``[[name]]`` with a value;
    unknown names are left as they are (as Grafana does)."""
    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        return values.get(name, m.group(0))
    return _VAR_RE.sub(sub, text)


def influxql_values(from_ms: int, to_ms: int, interval_ms: int,
                    variables: Sequence[Variable]) -> dict[str, str]:
    """The values Grafana gives an InfluxQL query's macros and variables."""
    out = {v.name: render_variable(v, "influxql") for v in variables}
    out["timeFilter"] = f"time >= {from_ms}ms and time <= {to_ms}ms"
    out["__interval"] = seconds_to_hms(interval_ms / 1000)
    out["__interval_ms"] = str(interval_ms)
    return out


def promql_values(interval_ms: int, scrape: str,
                  variables: Sequence[Variable]) -> dict[str, str]:
    """The values Grafana gives a PromQL expression's macros and variables."""
    scrape_ms = interval_to_ms(scrape)
    out = {v.name: render_variable(v, "promql") for v in variables}
    out["__interval"] = seconds_to_hms(interval_ms / 1000)
    out["__interval_ms"] = str(interval_ms)
    rate_ms = max(interval_ms + scrape_ms, 4 * scrape_ms)
    out["__rate_interval"] = seconds_to_hms(rate_ms / 1000)
    return out
