"""The MQTT contract as files: the JSON Schemas shipped in rackplane/schemas and sims/schemas
and the rendering docs/COMMANDS.md are generated from the models (``rackctl schemas --write
--docs docs/COMMANDS.md``) and fail here when stale; rackctl writes only where it is told;
the published payloads (status, alarm, state/leases) match their schemas.
DESIGN §3 ("Every payload has a JSON Schema shipped with the package")."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from typer.testing import CliRunner

from rackctl.cli import app, daemon_contracts, shipped_schema_sets
from rackplane.clock import FakeClock
from rackplane.commands import (
    GENERIC_VERBS,
    SCHEMA_DIR,
    AlarmPayload,
    CommandRouter,
    DaemonContract,
    NoArgs,
    StateModels,
    StatusPayload,
    VerbArgs,
    alarm_payload,
    contract_of,
    load_schema,
    register_lease_verbs,
    render_markdown,
    schema_documents,
    stale_schemas,
    write_schemas,
)
from rackplane.core.leases import LeaseTable
from rackplane.io.mqtt import MqttLink
from rackplane.settings import CommandSettings, Identity, MqttSettings
from tests.unit.test_commands import make_rig

ROOT = Path(__file__).resolve().parents[2]
COMMANDS_MD = ROOT / "docs" / "COMMANDS.md"


def _inputs() -> tuple[list[DaemonContract], VerbArgs, StateModels]:
    contracts = daemon_contracts()
    verb_args = {c.daemon: {v: m for v, (m, _r) in c.verbs.items()} for c in contracts}
    states = {c.daemon: dict(c.states) for c in contracts}
    return contracts, verb_args, states


def test_committed_schemas_and_commands_md_are_current() -> None:
    """Regenerate both with ``rackctl schemas --write --docs docs/COMMANDS.md`` when this
    fails."""
    contracts, verb_args, states = _inputs()
    assert [c.daemon for c in contracts][:1] == ["valvey"]
    assert stale_schemas(SCHEMA_DIR, verb_args, states, complete=True) == []
    assert COMMANDS_MD.read_text(encoding="utf-8") == render_markdown(contracts)
    result = CliRunner().invoke(app, ["schemas", "--check", "--docs", str(COMMANDS_MD)])
    assert result.exit_code == 0, result.output
    for name in ("status.schema.json", "alarm.schema.json", "state-leases.schema.json",
                 "lease.acquire_lease.args.schema.json"):
        doc = load_schema(name)  # shipped with the package
        assert doc["$schema"].endswith("2020-12/schema") and doc["$id"].startswith("urn:")


def test_stale_and_orphan_files_detected_and_pruned(tmp_path: Path) -> None:
    _contracts, verb_args, states = _inputs()
    write_schemas(tmp_path, verb_args, states)
    assert stale_schemas(tmp_path, verb_args, states, complete=True) == []
    (tmp_path / "valvey.removed_verb.args.schema.json").write_text("{}")
    (tmp_path / "status.schema.json").write_text("{}")
    assert stale_schemas(tmp_path, verb_args, states, complete=True) == [
        "status.schema.json", "valvey.removed_verb.args.schema.json"]
    assert stale_schemas(tmp_path, verb_args, states) == ["status.schema.json"]
    written = write_schemas(tmp_path, verb_args, states, prune=True)
    assert {p.name for p in written} == {"status.schema.json",
                                         "valvey.removed_verb.args.schema.json"}
    assert stale_schemas(tmp_path, verb_args, states, complete=True) == []
    docs = tmp_path / "COMMANDS.md"
    docs.write_text("old")
    result = CliRunner().invoke(app, ["schemas", "--check", "--docs", str(docs)])
    assert result.exit_code == 1 and f"stale: {docs}" in result.output


def test_schemas_write_into_a_given_dir_then_check_it(tmp_path: Path) -> None:
    """``--write --dir`` writes every shipped set (rackplane and sims) byte for byte as the
    committed files; ``--check --dir`` then passes, and fails on one changed byte or an orphan
    file; the rendering goes to the path given, or stdout."""
    sets = shipped_schema_sets(daemon_contracts())
    assert set(sets) == {"rackplane", "sims"}
    docs = tmp_path / "out" / "COMMANDS.md"
    docs.parent.mkdir()
    r = CliRunner().invoke(app, ["schemas", "--write", "--dir", str(tmp_path),
                                 "--docs", str(docs)])
    assert r.exit_code == 0, r.output
    for pkg, (_installed, documents) in sets.items():
        written = {p.name: p.read_text(encoding="utf-8") for p in (tmp_path / pkg).iterdir()}
        assert written == documents
    assert docs.read_text(encoding="utf-8") == render_markdown(daemon_contracts())
    check = ["schemas", "--check", "--dir", str(tmp_path), "--docs", str(docs)]
    assert CliRunner().invoke(app, check).exit_code == 0
    victim = tmp_path / "sims" / "sim.telemetry.plant.schema.json"
    victim.write_text(victim.read_text(encoding="utf-8") + " ", encoding="utf-8")
    (tmp_path / "rackplane" / "valvey.gone.args.schema.json").write_text("{}")
    r = CliRunner().invoke(app, check)
    assert r.exit_code == 1
    assert "stale: sims: sim.telemetry.plant.schema.json" in r.output
    assert "stale: rackplane: valvey.gone.args.schema.json" in r.output
    r = CliRunner().invoke(app, ["schemas", "--write", "--dir", str(tmp_path), "--docs", "-"])
    assert r.exit_code == 0 and r.stdout == render_markdown(daemon_contracts())
    assert not (tmp_path / "rackplane" / "valvey.gone.args.schema.json").exists()
    assert CliRunner().invoke(app, ["schemas", "--write", "--check"]).exit_code == 2


def test_status_payloads_match_the_schema() -> None:
    link = MqttLink(MqttSettings(), Identity(site="lab", rack="r1"), "valvey", clock=FakeClock())
    online = link._status_payload("online", 1_700_000_000_000_000_000)
    will = link._status_payload("offline", None, online_since_ns=1_700_000_000_000_000_000)
    for payload in (online, will):
        assert StatusPayload.model_validate(payload).daemon == "valvey"
        json.dumps(payload)


def test_alarm_payload_from_the_engine_matches_the_schema() -> None:
    rig = make_rig(alarms=True)
    snaps = rig.core.alarms.active()
    assert snaps
    for snap in snaps:
        payload = alarm_payload(snap, 1_700_000_000_000_000_000)
        assert AlarmPayload.model_validate(payload).id == snap.id
    nan = alarm_payload(replace(snaps[0], value=math.nan), 1)
    assert nan["value"] is None  # never NaN on the wire (DESIGN §3)


def test_rendered_contract_lists_every_verb_role_and_schema() -> None:
    contracts, verb_args, states = _inputs()
    text = render_markdown(contracts)
    for c in contracts:
        for verb, (_model, role) in c.verbs.items():
            assert f"| `{verb}` | {role} |" in text
    for name in schema_documents(verb_args, states):
        assert f"`rackplane/schemas/{name}`" in text, name
    assert "## Retained commands" in text and "Retain As Published" in text


def test_generic_lease_verbs_keep_one_schema() -> None:
    clock = FakeClock()
    link = MqttLink(MqttSettings(), Identity(), "racky", clock=clock)
    router = CommandRouter(link, CommandSettings(), clock=clock)
    router.register("get_state", NoArgs, lambda a, c: {}, role="reader")
    register_lease_verbs(router, LeaseTable(["rack_cap"]))
    contract = contract_of(router, summary="test")
    docs = schema_documents({"racky": {v: m for v, (m, _r) in contract.verbs.items()}})
    assert "racky.get_state.args.schema.json" in docs
    assert not any(n.startswith("racky.") and "lease" in n for n in docs)
    text = render_markdown([contract])
    for verb in GENERIC_VERBS:
        assert f"| `{verb}` | automation | `lease.{verb}.args.schema.json` |" in text
