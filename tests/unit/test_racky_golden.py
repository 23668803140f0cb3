"""Golden line protocol of racky's tick (Telegraf's testcases): a fixed input (shelf samples,
MQTT messages, tick times: ``tests/golden/racky/<case>/input.json``) through `racky.tick.RackyTick`
gives exactly the telemetry lines of ``expected.lp`` (the writer's encoding, identity tags
merged). A change of a measurement, tag, field, quality code or the lines' order fails here.

Regenerate after an intended change: ``RACKY_GOLDEN_REGEN=1 .venv/bin/python -m pytest
tests/unit/test_racky_golden.py`` (then review the diff); the inputs come from
``tests/golden/racky/make_inputs.py`` (tests/golden/racky/README.md)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from rackplane.core.samples import Quality, Sample
from rackplane.io.tsdb import point_line
from racky.config import RackyConfig
from racky.core.controller import RackyCore
from racky.core.lifecycle import Lifecycle, PersistedState
from racky.tick import RackyTick

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "racky"
CASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "input.json").is_file())
WALL0_NS = 1_767_225_600 * 10**9


def tick_lines(case: str) -> list[str]:
    """The line protocol of every tick's telemetry effects for the case's input."""
    data: dict[str, Any] = json.loads((GOLDEN / case / "input.json").read_text())
    cfg = RackyConfig.model_validate(data.get("config", {}))
    ps = PersistedState(Lifecycle(cfg.lifecycle.initial_state, WALL0_NS, "new", "golden"))
    tick = RackyTick(cfg, RackyCore(cfg, 0.0, ps), 0.0)
    ident = cfg.identity
    identity = {"site": ident.site, "row": ident.row, "rack": ident.rack}
    out: list[str] = []
    for t in data["ticks"]:
        for name, rows in t["shelves"].items():
            tick.shelf_samples(name, [Sample(p, v, u, ts, tm, Quality[q], r)
                                      for p, v, u, ts, tm, q, r in rows])
        for m in t["messages"]:
            tick.message(m["topic"], m["payload"].encode(), retain=m["retain"],
                         received_mono=m["received_mono"], wall_ns=m["wall_ns"])
        eff = tick.step(t["t_mono"], t["wall_ns"])
        for ln in eff.lines:
            line = point_line(ln.measurement, {**identity, **ln.tags}, ln.fields, ln.wall_ns)
            if line is not None:
                out.append(line)
    return out


@pytest.mark.parametrize("case", CASES)
def test_tick_telemetry_matches_the_golden_line_protocol(case: str) -> None:
    got = tick_lines(case)
    path = GOLDEN / case / "expected.lp"
    if os.environ.get("RACKY_GOLDEN_REGEN") == "1":
        path.write_text("\n".join(got) + "\n")
        pytest.skip(f"regenerated {path}")
    want = path.read_text().splitlines()
    assert len(got) == len(want), f"{case}: {len(got)} lines, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"{case} line {i + 1}:\n got  {g}\n want {w}"


def test_the_golden_cases_cover_every_racky_measurement() -> None:
    measurements = {line.split(",", 1)[0] for case in CASES
                    for line in (GOLDEN / case / "expected.lp").read_text().splitlines()}
    assert {"power_shelf", "rack", "node", "alarm"} <= measurements
