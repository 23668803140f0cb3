"""rlc's command line and config: ``--check-config`` of the example and of configs that must be
refused (key paths named, exit 2), and the leadership and fleet relations."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from rlc.cli import app
from tests.unit.config_examples import rlc_example_text

CONFIG = Path(__file__).resolve().parents[2] / "config"


def _check(path: Path) -> tuple[int, str]:
    r = CliRunner().invoke(app, ["--config", str(path), "--check-config"])
    return r.exit_code, " ".join(r.output.split())  # rich wraps long lines


def test_example_checks_and_summary_names_the_fleet(tmp_path: Path) -> None:
    p = tmp_path / "rlc.toml"
    p.write_text(rlc_example_text())
    code, out = _check(p)
    assert code == 0, out
    assert "1 halls, 1 rows, 2 racks" in out and "rackplane_fleet" in out


def test_a_config_without_a_topology_is_refused_naming_it(tmp_path: Path) -> None:
    """rlc used to run on a built-in two-rack example when the config had no [topology]: it
    budgeted racks nobody configured. The shipped example (its topology commented out), an
    empty file, no file, an empty [topology] and one without halls are all refused."""
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    no_halls = tmp_path / "no_halls.toml"
    no_halls.write_text('[topology]\nsite = "lab"\n')
    empty_table = tmp_path / "empty_table.toml"
    empty_table.write_text("[topology]\n")
    for path, what in ((CONFIG / "rlc.example.toml", "there is no [topology] section"),
                       (empty, "there is no [topology] section"),
                       (empty_table, "[topology] is empty"),
                       (no_halls, "[topology] names no halls")):
        code, out = _check(path)
        assert code == 2, (path, out)
        assert what in out and "config/rlc.example.toml" in out, (path, out)
    r = CliRunner().invoke(app, ["--check-config"])  # no file: the embedded defaults
    assert r.exit_code == 2 and "no [topology] section" in " ".join(r.output.split())
    # the model itself: no default topology to fall back on
    from rlc.config import RlcConfig
    with pytest.raises(ValidationError, match="no \\[topology\\] section"):
        RlcConfig.model_validate({})
    site_missing = tomllib.loads(rlc_example_text())
    del site_missing["topology"]["site"]
    with pytest.raises(ValidationError, match=r"topology\.site\n  Field required"):
        RlcConfig.model_validate(site_missing)


def test_refused_configs_name_the_key(tmp_path: Path) -> None:
    base = rlc_example_text()
    cases = {
        # Σ floors 2 × 20 kW above a 30 kW row limit
        '"limit_w" = 200000.0': ('"limit_w" = 30000.0', "exceeds limit_w"),
        # renewals at ttl/3 must fit the cycle
        "ttl_s = 30.0": ("ttl_s = 2.0", "leases.ttl_s"),
        'bucket = "rackplane_fleet"': ('bucket = "a.b"', "fleet.bucket"),
        "reclaim_after_s = 15.0": ("reclaim_after_s = 1.0", "reclaim_after_s"),
    }
    for old, (new, text) in cases.items():
        assert old in base, old
        p = tmp_path / "rlc.toml"
        p.write_text(base.replace(old, new, 1))
        code, out = _check(p)
        assert code == 2, (new, out)
        assert text in out, (new, out)


def test_lease_timings_that_defeat_the_re_grant_rule_or_a_failover_are_warned() -> None:
    """An agent cap TTL below racky's (a dead rack's trays keep caps after its share is
    re-granted) and, for a pair of rlc replicas, budget leases no longer than a failover (every
    rack at its floor while the new leader takes over) are warned; the defaults are not."""
    from rackplane.core.tray_contract import RACKY_CAP_TTL_S
    from rlc.config import RlcConfig, config_warnings

    base = tomllib.loads(rlc_example_text())
    assert config_warnings(RlcConfig.model_validate(base)) == []
    short_ttl = {**base, "leases": {**base["leases"], "agent_cap_ttl_s": RACKY_CAP_TTL_S - 1}}
    assert [w for w in config_warnings(RlcConfig.model_validate(short_ttl))
            if "agent_cap_ttl_s" in w]
    pair = {**base, "leadership": {**base.get("leadership", {}), "enabled": True,
                                   "servers": ["nats://10.0.0.1:4222", "nats://10.0.0.2:4222"],
                                   "lease_s": 15.0, "renew_every_s": 2.0}}
    assert not [w for w in config_warnings(RlcConfig.model_validate(pair)) if "failover" in w]
    pair["leases"] = {**base["leases"], "ttl_s": 15.0}
    assert [w for w in config_warnings(RlcConfig.model_validate(pair)) if "failover" in w]
