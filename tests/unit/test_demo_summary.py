"""The demo summary's racky and operator-command lines (harness.demo.summary), computed
from MQTT messages fed through the demo's own `Recorder`."""

from __future__ import annotations

import json
from typing import Any

from harness.demo import Recorder
from harness.demo.summary import racky_summary
from rackplane.core.topics import Message

BASE = "rackplane/lab/r12"
MONO0 = 1000.0
"""Monotonic time at plant t = 0 in these recordings, s."""


def _feed(rec: Recorder, t_s: float, topic: str, payload: Any) -> None:
    body = b"" if payload is None else json.dumps(payload).encode()
    rec.on_message(Message(f"{BASE}/{topic}", body, received_mono=MONO0 + t_s))


def _rack(limit_w: float, source: str) -> dict[str, Any]:
    return {"lifecycle": {"state": "production", "by": "racky", "reason": "validated"},
            "limit_w": limit_w, "limit_source": source, "budget_w": 140_000.0}


def test_time_above_the_limit_counts_each_sample_against_the_limit_then() -> None:
    """The rack runs at 100 kW under a 140 kW limit for 90 s; then valvey's request lowers
    the limit to 26 kW and racky brings the rack to 25 kW within 3 s. Above the limit in
    force: the 3 samples before the caps took hold, not the 90 s at 100 kW under 140 kW
    (the final limit counted those)."""
    rec = Recorder()
    _feed(rec, 0.0, "sim/telemetry/plant", {"t_s": 0.0, "supply_temp_c": 45.0})
    _feed(rec, 0.5, "racky/state/rack", _rack(140_000.0, "budget"))
    for t in range(1, 91):
        _feed(rec, float(t), "racky/state/rack_power", {"rack_power_w": 100_000.0})
    _feed(rec, 90.5, "racky/state/rack", _rack(26_000.0, "requested:valvey"))
    for t in range(91, 94):
        _feed(rec, float(t), "racky/state/rack_power", {"rack_power_w": 60_000.0})
    for t in range(94, 120):
        _feed(rec, float(t), "racky/state/rack_power", {"rack_power_w": 25_000.0})
        _feed(rec, t + 0.5, "racky/state/rack", _rack(26_000.0, "requested:valvey"))
    s = racky_summary(rec)
    assert s is not None
    assert s.limit_w == 26_000.0 and s.limit_source == "requested:valvey"
    assert s.over_limit_s == 3.0
    assert [lim for _, lim, _ in rec.limit_log] == [140_000.0, 26_000.0]
    assert rec.limit_at(0.2) is None and rec.limit_at(90.0) == 140_000.0


def test_no_limit_published_yet_counts_no_sample_above_it() -> None:
    rec = Recorder()
    _feed(rec, 0.0, "sim/telemetry/plant", {"t_s": 0.0, "supply_temp_c": 45.0})
    for t in range(1, 11):
        _feed(rec, float(t), "racky/state/rack_power", {"rack_power_w": 50_000.0})
    _feed(rec, 10.5, "racky/state/rack", _rack(40_000.0, "budget"))
    _feed(rec, 11.0, "racky/state/rack_power", {"rack_power_w": 50_000.0})
    s = racky_summary(rec)
    assert s is not None and s.over_limit_s == 1.0
