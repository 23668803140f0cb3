"""``rackctl demo --racks 2`` (issue 20, a row): two racks side by side on the one embedded
broker, each its own simulator, valvey and racky under its own identity (r12, r13), the link
flap on the first and the pump trip on the second; each rack's summary, checklist and plot,
and the row's power against its limit computed from the recorded rack powers. Without rlc
(``--nats-server none``), and under rlc on a real nats-server (`harness.demo.fleet`): the
row's leases and a validation campaign taking the new rack r13 into production, the rlc
checklist items checked from the recorded data."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.test_demo import FAULTS_SHORT
from tests.servers import require_binary

pytestmark = pytest.mark.slow

PNG = b"\x89PNG\r\n\x1a\n"


def _run_row(tmp_path: Path, name: str, scenario_toml: str, nats_server: str,
             timeout_s: float) -> tuple[subprocess.CompletedProcess[str], float, Path]:
    """``rackctl demo --racks 2`` on ``scenario_toml`` (``--nats-server``: a binary or
    ``none``): its completed process (exit 0 asserted), wall s and run folder."""
    scenario = tmp_path / f"{name}.toml"
    scenario.write_text(scenario_toml)
    out = tmp_path / "out"
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "rackctl", "demo", "--racks", "2", "--scenario", str(scenario),
         "--out", str(out), "--nats-server", nats_server],
        capture_output=True, text=True, timeout=timeout_s, cwd=tmp_path,
    )
    wall_s = time.monotonic() - t0
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (run_dir,) = out.iterdir()
    return r, wall_s, run_dir


def test_two_racks_run_side_by_side_with_the_row_power_against_its_limit(
        tmp_path: Path) -> None:
    # the row without rlc (no NATS)
    r, wall_s, run_dir = _run_row(tmp_path, "demo-faults-short", FAULTS_SHORT, "none", 150)
    row = json.loads((run_dir / "summary.json").read_text())
    racks = {s["rack"]: s for s in row["racks"]}
    assert list(racks) == ["r12", "r13"]
    for name, s in racks.items():
        # each rack's own daemons ran under its identity, in its own folder
        assert s["valvey_exit_code"] == 0 and s["racky"]["exit_code"] == 0, (name, s)
        assert s["run_dir"] == str(run_dir / name)
        assert s["racky"]["rack_power_samples"] > 20, s["racky"]
        assert 30_000 < s["racky"]["rack_power_max_w"] < 140_000, s["racky"]
        assert s["ff_source_share"].get("rack_power", 0) > 0.5, s["ff_source_share"]
        assert s["points_spooled"] > 50
        for daemon in ("valvey", "racky"):
            cfg = (run_dir / name / f"{daemon}.toml").read_text()
            assert f'rack = "{name}"' in cfg
        assert Path(s["plot"]).name == f"demo-{name}.png"
        assert Path(s["plot"]).read_bytes()[:8] == PNG
    # the faults dealt: the flap on r12 (quarantined by its racky), the trip on r13 (failover)
    labels12 = [c["label"] for c in racks["r12"]["checklist"]]
    labels13 = [c["label"] for c in racks["r13"]["checklist"]]
    assert any(x.startswith("link flap") for x in labels12)
    assert not any(x.startswith("pump trip") for x in labels12)
    assert any(x.startswith("pump trip") for x in labels13)
    assert not any(x.startswith("link flap") for x in labels13)
    by12 = {c["label"].split(" ")[0]: c for c in racks["r12"]["checklist"]}
    by13 = {c["label"].split(" ")[0]: c for c in racks["r13"]["checklist"]}
    assert by12["link"]["ok"] and by12["rack"]["ok"], racks["r12"]["checklist"]
    assert by13["pump"]["ok"], racks["r13"]["checklist"]
    assert racks["r12"]["racky"]["lifecycle"] == "quarantined"
    assert racks["r13"]["racky"]["lifecycle"] == "production"  # no flap there
    # the row: Σ of the recorded rack powers against the row limit (2 × 140 kW)
    assert row["row_limit_w"] == 280_000.0
    assert row["budgets_w"] == {"r12": 140_000.0, "r13": 140_000.0}
    assert row["coordination"].startswith("row without rlc: no nats-server wanted")
    assert "sudo apt-get install nats-server" in row["coordination"] and row["rlc"] is None
    assert not (run_dir / "nats").exists() and not (run_dir / "rlc.toml").exists()
    points = [p for _, p in row["row_power"] if p is not None]
    assert len(points) > 20 and row["instants"] == len(row["row_power"])
    peaks = [racks[n]["racky"]["rack_power_max_w"] for n in ("r12", "r13")]
    # the Σ at an instant is two racks' AC input: above either rack's DC peak alone at full
    # load on both (both step up at 8 s), never above the sum of their DC peaks plus the
    # shelves' losses (a few %: 10 % allowed)
    assert max(peaks) < row["row_power_max_w"] <= 1.1 * sum(peaks), (row["row_power_max_w"],
                                                                     peaks)
    (item,) = row["checklist"]
    assert item["label"].startswith("row power (Σ of 2 racks' AC input, from racky) never")
    assert item["ok"] == (row["over_limit_instants"] == 0
                          and row["instants_missing"] <= 0.1 * row["instants"]), row
    assert f"peak {row['row_power_max_w'] / 1000:.1f} kW" in item["detail"]
    assert (run_dir / "row.png").read_bytes()[:8] == PNG
    assert "row without rlc" in r.stdout and "never above the row limit" in r.stdout
    assert "rack r13" in r.stdout and "r12: alarm racky:link_flapping" in r.stdout
    n13 = len(racks["r13"]["checklist"])
    ok13 = sum(1 for c in racks["r13"]["checklist"] if c["ok"])
    # each rack's line names its load pattern (this scenario is not the demo's: no bursts)
    assert racks["r13"]["load"] == "load step" and racks["r13"]["bursts"] is None
    assert f"r13 (load step): {ok13}/{n13} checklist items checked; lifecycle production" \
        in r.stdout
    print(f"--racks 2 wall {wall_s:.1f} s; row item: {item}")


ROW_RLC = """
name = "demo-row-rlc"
description = "a row under rlc, short: load step at 10 s, no scripted faults"
duration_s = 75.0
seed = 1

[plant]
rack_max_power_w = 132000.0
model = "rack"

[load]
kind = "step"
low_w = 39600.0
high_w = 132000.0
step_at_s = 10.0
"""
"""The demo's plant without faults, long enough for the row's campaign (rlc up, leases,
``rackctl campaign start``, a 20 s stage, the production order)."""


def test_a_row_under_rlc_grants_leases_within_the_limit_and_validates_the_new_rack(
        tmp_path: Path) -> None:
    nats = require_binary("nats-server", "nats-server")  # skipped (CI=true: failed) if missing
    r, wall_s, run_dir = _run_row(tmp_path, "demo-row-rlc", ROW_RLC, nats, 170)
    row = json.loads((run_dir / "summary.json").read_text())
    assert row["coordination"].startswith("row under rlc"), row["coordination"]
    rlc = row["rlc"]
    assert rlc["rlc_exit_code"] == 0 and rlc["campaign_start_exit_code"] == 0, rlc
    assert rlc["new_rack"] == "r13" and rlc["campaign"]["campaign_id"] == "demo-r13"
    items = {c["label"].split(" ")[0]: c for c in row["checklist"]}
    assert set(items) == {"row", "new"}, row["checklist"]
    row_items = [c for c in row["checklist"] if c["label"].startswith("row")]
    assert len(row_items) == 2, row_items
    for c in row["checklist"]:
        assert c["ok"], c
    # the lease item from the leases themselves: every rack had leases, none summed above
    leases = rlc["leases"]
    assert {x["rack"] for x in leases} == {"r12", "r13"}
    last: dict[str, float] = {}
    for x in sorted(leases, key=lambda x: (x["issued_row_t_s"], x["epoch"], x["seq"])):
        last[x["rack"]] = x["value_w"]
        assert sum(last.values()) <= row["row_limit_w"] + 1.0, (x, last)
    assert row["budgets_w"] == last
    # the new rack: provisioning -> validating -> ... -> production, on rlc's order
    racks = {s["rack"]: s for s in row["racks"]}
    assert racks["r13"]["racky"]["lifecycle"] == "production"
    assert racks["r12"]["racky"]["lifecycle"] == "production"
    st = rlc["campaign"]["racks"]["r13"]
    assert st["status"] == "production" and "rack" in st["passes"], st
    # what the run said: rlc's state, the operator's command, the items
    assert "row under rlc" in r.stdout and "rackctl campaign start" in r.stdout
    assert "validated into production by rlc's campaign" in r.stdout
    assert (run_dir / "rlc.toml").is_file() and (run_dir / "nats" / "nats.log").is_file()
    assert "nats" not in r.stderr.lower()  # NATS's output never on the console
    assert (run_dir / "row.png").read_bytes()[:8] == PNG
    print(f"--racks 2 under rlc wall {wall_s:.1f} s; {row['checklist']}")
