"""The demo's row under rlc (`harness.demo.fleet`, `harness.demo.fleet_check`): the rlc
checklist items from recorded leases and lifecycles (fed through the demo's own `Recorder`),
the generated configs as rlc, racky and ``rackctl campaign start`` read them, and how the
nats-server is found or refused."""

from __future__ import annotations

import json
import os
import stat
import tomllib
from pathlib import Path

import pytest

from harness.demo import Recorder
from harness.demo.fleet import (
    BUCKET,
    NATS_ENV,
    RACK_FLOOR_W,
    RowFleet,
    find_nats_server,
    no_rlc_reason,
)
from harness.demo.fleet_check import LeaseSeen, campaign_item, lease_sum_item, lease_sums
from harness.demo.procs import racky_config, write_toml
from harness.demo.racks import overlay
from rackctl.campaign import load_plan
from rackplane.core.topics import Message
from racky.config import RackyConfig
from rlc.app import load_rlc_config

LIMIT_W = 280_000.0
WALL_MINUS_MONO = 1_000_000.0
T0 = 50.0  # mono s of row t = 0


def _lease(rack: str, value_kw: float, row_t: float, seq: int) -> LeaseSeen:
    issued = row_t + T0 + WALL_MINUS_MONO
    return LeaseSeen(row_t + T0, rack, value_kw * 1000, 1, seq, issued, issued + 30.0)


def test_the_lease_sum_is_each_racks_latest_lease_after_every_lease_in_issue_order() -> None:
    leases = [_lease("r12", 40, 1.0, 1), _lease("r13", 40, 1.1, 1),
              _lease("r12", 140, 3.0, 2), _lease("r13", 140, 4.0, 2),
              # r12 lowered first, then r13 raised: never above the limit in between
              _lease("r12", 120, 9.0, 3), _lease("r13", 160, 9.5, 3)]
    sums = lease_sums(leases[::-1], ["r12", "r13"], RACK_FLOOR_W, WALL_MINUS_MONO, T0)
    assert [round(t, 3) for t, _ in sums] == [1.0, 1.1, 3.0, 4.0, 9.0, 9.5]
    assert [w / 1000 for _, w in sums] == [80, 80, 180, 280, 260, 280]
    ok = lease_sum_item(leases, ["r12", "r13"], LIMIT_W, RACK_FLOOR_W, WALL_MINUS_MONO, T0)
    assert ok.ok, ok
    assert ok.detail == ("6 leases recorded; Σ at most 280.0 kW (row t = 4 s) against 280 kW; "
                         "margin 0.0 kW")
    # r13 raised before r12's decrease: above the limit after that lease
    bad = [*leases[:4], _lease("r13", 160, 8.0, 3), _lease("r12", 120, 9.0, 3)]
    over = lease_sum_item(bad, ["r12", "r13"], LIMIT_W, RACK_FLOOR_W, WALL_MINUS_MONO, T0)
    assert not over.ok
    assert over.detail.startswith("Σ above the limit after 1 leases, first at row t = 8 s "
                                  "(300.0 kW)")


def test_the_lease_sum_is_unproven_without_a_lease_for_every_rack() -> None:
    none = lease_sum_item([], ["r12", "r13"], LIMIT_W, RACK_FLOOR_W, WALL_MINUS_MONO, T0)
    assert not none.ok and "no lease recorded" in none.detail
    one = lease_sum_item([_lease("r12", 100, 2.0, 1)], ["r12", "r13"], LIMIT_W, RACK_FLOOR_W,
                         WALL_MINUS_MONO, T0)
    # the rack without a lease counts at its floor: 140 kW, within, but not proven
    assert not one.ok and one.detail.startswith("unproven: no lease for r13; 1 leases")


def _lifecycle(rec: Recorder, mono: float, state: str, by: str, reason: str = "") -> None:
    rec.on_message(Message("rackplane/lab/r13/racky/state/rack", json.dumps(
        {"lifecycle": {"state": state, "by": by, "reason": reason,
                       "validated": state == "production"}}).encode(), received_mono=mono))


def _new_rack(states: list[tuple[float, str, str]]) -> Recorder:
    rec = Recorder()
    # r13's plant t = 0 at mono 52: row t = plant t + 2 s
    rec.on_message(Message("rackplane/lab/r13/sim/telemetry/plant",
                           json.dumps({"t_s": 0.0}).encode(), received_mono=T0 + 2.0))
    for t, state, by in states:
        _lifecycle(rec, T0 + 2.0 + t, state, by)
    return rec


CAMPAIGN = {"campaign_id": "demo-r13", "racks": {"r13": {
    "status": "production", "passes": {"rack": ["rack.1", 0]}}}}


def test_the_campaign_item_needs_provisioning_validating_then_production_by_rlc() -> None:
    rec = _new_rack([(3.0, "provisioning", "config"), (20.0, "validating", "rlc"),
                     (41.0, "maintenance", "racky"), (42.0, "production", "rlc")])
    item = campaign_item("r13", rec, T0, CAMPAIGN, "demo-r13", "rlc")
    assert item.ok, item
    assert item.detail == (
        "provisioning at row t = 5 s by config -> validating at row t = 22 s by rlc -> "
        "maintenance at row t = 43 s by racky -> production at row t = 44 s by rlc (22 s from "
        "validating to production); rlc's state/campaign: r13 production, passed rack")
    # production ordered by someone else (an operator), or rlc not showing the pass
    by_op = _new_rack([(3.0, "provisioning", "config"), (20.0, "validating", "rlc"),
                       (42.0, "production", "operator")])
    assert not campaign_item("r13", by_op, T0, CAMPAIGN, "demo-r13", "rlc").ok
    assert not campaign_item("r13", rec, T0, {"campaign_id": "other"}, "demo-r13", "rlc").ok
    # still validating at the end
    mid = _new_rack([(3.0, "provisioning", "config"), (20.0, "validating", "rlc")])
    late = campaign_item("r13", mid, T0, {"campaign_id": "demo-r13", "racks": {
        "r13": {"status": "validating", "passes": {}}}}, "demo-r13", "rlc")
    assert not late.ok and late.detail.endswith("r13 validating, passed none")
    # in production from the start: not a validation into production
    old = _new_rack([(3.0, "production", "config")])
    assert not campaign_item("r13", old, T0, CAMPAIGN, "demo-r13", "rlc").ok
    assert not campaign_item("r13", Recorder(), T0, CAMPAIGN, "demo-r13", "rlc").ok


def test_the_generated_configs_are_what_rlc_racky_and_rackctl_accept(tmp_path: Path) -> None:
    fleet = RowFleet(["r12", "r13"], LIMIT_W, tmp_path, "/usr/sbin/nats-server")
    fleet.url = "nats://127.0.0.1:4222"
    assert fleet.new_rack == "r13" and fleet.campaign_id == "demo-r13"
    write_toml(tmp_path / "rlc.toml", fleet.rlc_config("127.0.0.1", 1883, "3.1.1"), "t")
    rlc = load_rlc_config(tmp_path / "rlc.toml")
    (hall,) = rlc.topology.halls.values()
    (row,) = hall.rows.values()
    assert row.limit_w == LIMIT_W and sorted(row.racks) == ["r12", "r13"]
    assert sum(r.max_w for r in row.racks.values()) > LIMIT_W  # rlc has to share
    assert rlc.fleet.replicas == 1 and rlc.fleet.bucket == BUCKET
    for rack in fleet.racks:
        cfg = overlay(racky_config(tmp_path, 5020, "127.0.0.1", 1883, "3.1.1", rack),
                      fleet.racky_overrides(rack))
        write_toml(tmp_path / f"racky-{rack}.toml", cfg, "t")
        racky = RackyConfig.model_validate(
            tomllib.loads((tmp_path / f"racky-{rack}.toml").read_text()))
        assert racky.fleet.enabled and racky.fleet.servers == [fleet.url]
        assert racky.fleet.floor_w == row.racks[rack].floor_w
        assert racky.power.budget_w is None  # the lease is the budget
        assert racky.commands.users["rlc"] == "operator"
        assert racky.campaign_gate.required_stages == ["rack"]
        assert racky.lifecycle.initial_state == ("provisioning" if rack == "r13"
                                                 else "production")
    write_toml(tmp_path / "campaign.toml", fleet.plan(), "t")
    plan = load_plan(tmp_path / "campaign.toml", rlc.topology)  # as rackctl checks it
    assert plan["racks"] == ["r13"] and [s["kind"] for s in plan["stages"]] == ["rack"]


def test_overlay_lays_sections_over_and_removes_none() -> None:
    cfg = {"power": {"budget_w": 1.0, "x": 2}, "log": {"format": "json"}}
    assert overlay(cfg, {"power": {"budget_w": None}, "fleet": {"enabled": True}}) == {
        "power": {"x": 2}, "log": {"format": "json"}, "fleet": {"enabled": True}}
    assert cfg["power"] == {"budget_w": 1.0, "x": 2}  # not changed in place


def test_the_nats_server_is_found_or_the_reason_said(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NATS_ENV, raising=False)
    assert find_nats_server("none") == (None, "no nats-server wanted (--nats-server none)")
    path, why = find_nats_server(str(tmp_path / "no-such-nats"))
    assert path is None and "is not an executable nats-server" in why
    path, why = find_nats_server("no-such-nats-server-name")  # a name: PATH and /usr/sbin
    assert path is None and "not found" in why
    fake = tmp_path / "my-nats"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    assert find_nats_server(str(fake)) == (str(fake), "")
    monkeypatch.setenv(NATS_ENV, "none")
    assert find_nats_server()[0] is None
    monkeypatch.setenv(NATS_ENV, str(fake))
    assert find_nats_server() == (str(fake), "")
    said = no_rlc_reason("nats-server not found")
    assert said.startswith("row without rlc: nats-server not found;")
    assert "sudo apt-get install nats-server" in said and "make servers" in said
    assert os.access(fake, os.X_OK)


def test_the_live_view_of_a_row_under_rlc_says_its_leases_and_campaign(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from harness.demo.row import row_view

    fleet = RowFleet(["r12", "r13"], LIMIT_W, tmp_path, "/usr/sbin/nats-server")
    fleet.leases = [_lease("r12", 140, 3.0, 2), _lease("r13", 120, 3.1, 2)]
    fleet.rlc_status = "online"
    fleet.fleet_state = {"rows": {"hall1/row1": {"racks": {"r12": {"acked": [1, 2]},
                                                           "r13": {"acked": [1, 1]}}}}}
    assert fleet.acked() == ["r12"]
    fleet.campaign_state = {"campaign_id": "demo-r13", "racks": {"r13": {
        "status": "validating", "run": "rack.1", "run_state": "running"}}}
    fleet.events = [(T0 + 5.0, "rlc: r12 lease 140.0 kW (seq 2)")]
    out = io.StringIO()
    Console(file=out, width=160).print(row_view(
        [("r12", Recorder()), ("r13", Recorder())], LIMIT_W, 10.0, 60.0, "connected", "",
        rlc=fleet.lines(), rlc_events=fleet.events))
    text = out.getvalue()
    assert "rlc (online): leases kW r12 140.0, r13 120.0 (ack pending); Σ 260.0 / row limit " \
        "280 kW" in text
    assert "campaign demo-r13: r13 validating, run rack.1 running" in text
    assert "(row under rlc: budgets as leases)" in text
    assert "rlc: r12 lease 140.0 kW (seq 2)" in text


def test_a_named_nats_server_that_is_not_there_is_a_usage_error(tmp_path: Path) -> None:
    """``--nats-server PATH`` naming nothing runnable stops at once (exit 2, saying so): it
    is not quietly the row without rlc, which ``--nats-server none`` asks for."""
    from typer.testing import CliRunner

    from harness.demo.fleet import find_nats_server
    from rackctl.cli import EXIT_USAGE, app

    missing = str(tmp_path / "no-nats-server")
    assert find_nats_server(missing) == (None, f"{missing} is not an executable nats-server")
    r = CliRunner().invoke(app, ["demo", "--nats-server", missing, "--out", str(tmp_path)])
    assert r.exit_code == EXIT_USAGE, r.output
    assert "is not an executable nats-server" in r.output and "'none'" in r.output
    assert not any(tmp_path.iterdir())  # nothing was started
