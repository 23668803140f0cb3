"""Golden line protocol (Telegraf's testcases style): the telemetry valvey's tick writes for a
fixed input, compared line by line with ``tests/golden/valvey/<case>/expected.lp``.

Regenerate after an intended change (then review ``git diff``)::

    VALVEY_GOLDEN_UPDATE=1 .venv/bin/python -m pytest tests/unit/test_valvey_golden.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from rackplane.core.samples import Quality, make_sample
from rackplane.io.selfmetrics import TELEMETRY_ALARMS, telemetry_alarm_conditions
from rackplane.io.tsdb import point_line
from valvey.config import ValveyConfig
from valvey.tick import ValveyTick

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "valvey"
CASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "input.json").is_file())
UPDATE = os.environ.get("VALVEY_GOLDEN_UPDATE") == "1"


class _HealthyWriter:
    spool_ok = True
    depth_lines = 0
    backoff_s = 0.0


def render(case: dict[str, Any]) -> list[str]:
    """The line protocol of the tick's telemetry effects over the case's ticks."""
    cfg = ValveyConfig()
    ident = {"site": cfg.identity.site, "row": cfg.identity.row, "rack": cfg.identity.rack}
    tick = ValveyTick(cfg, case["start_mono"], request_prefix="golden",
                      extra_alarms=TELEMETRY_ALARMS)
    cond = telemetry_alarm_conditions(_HealthyWriter())
    lines: list[str] = []
    for k in range(case["ticks"]):
        now = k * case["tick_s"]
        wall = case["wall_ns"] + round(now * 1e9)
        tick.on_samples(make_sample(s["point"], s["value"], s["unit"], wall, now,
                                    Quality(s["quality"]), s["reason"])
                        for s in case["samples"])
        if k % round(1.0 / case["tick_s"]) == 0:
            for m in case["messages"]:
                tick.on_sensor_message(m["topic"], {**m["payload"], "ts_ns": wall},
                                       retain=m["retain"], received_mono=now, wall_ns=wall)
        for ln in tick.step(now, wall, cond).lines:
            out = point_line(ln.measurement, {**ident, **ln.tags}, ln.fields, ln.wall_ns)
            if out is not None:
                lines.append(out)
    return lines


@pytest.mark.parametrize("case", CASES)
def test_tick_telemetry_matches_the_golden_file(case: str) -> None:
    folder = GOLDEN / case
    got = render(json.loads((folder / "input.json").read_text()))
    expected_path = folder / "expected.lp"
    if UPDATE:
        expected_path.write_text("\n".join(got) + "\n")
    expected = expected_path.read_text().splitlines()
    assert got == expected, f"{case}: regenerate with VALVEY_GOLDEN_UPDATE=1 if intended"


def test_the_golden_cases_cover_the_measurements_and_quality_codes() -> None:
    """The cases exercise every measurement the tick writes and every non-GOOD quality."""
    text = "".join((GOLDEN / c / "expected.lp").read_text() for c in CASES)
    for m in ("pid,", "cdu,", "environment,", "coolant_loop,", "pump,", "valve,", "alarm,"):
        assert any(line.startswith(m) for line in text.splitlines()), m
    for code in ("_quality=1", "_quality=2", "_quality=3"):
        assert code in text, code
