"""Optional keys can be switched off from TOML (issue 14 item 6): TOML has no null, so an
optional key written as "unset" is None. A CDU without some of the default map's points is
configured with those roles unset, not with dummy points at absent addresses."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from rackplane.config import UNSET, read_toml
from rackplane.core.registers import parse_register_map
from rackplane.errors import ConfigError
from rackplane.settings import ModbusTargetSettings
from valvey.config import ValveyConfig, check_points_against_map

REPO = Path(__file__).resolve().parents[2]
ABSENT = ("heat_removed_kw", "facility_supply_temp_c")


def partial_cdu_map() -> object:
    """The bundled CDU map without the points this CDU does not have."""
    data = tomllib.loads((REPO / "config/registers/cdu-generic.toml").read_text())
    data["points"] = [p for p in data["points"] if p["name"] not in ABSENT]
    return parse_register_map(data)


def test_optional_roles_unset_in_toml(tmp_path: Path) -> None:
    f = tmp_path / "valvey.toml"
    f.write_text('[points]\nheat_removed = "unset"\nfacility_supply_temp = "unset"\n')
    cfg = ValveyConfig.model_validate(read_toml(f))
    assert cfg.points.heat_removed is None and cfg.points.facility_supply_temp is None
    assert cfg.points.flow == "flow_lpm"  # absent key: the default
    check_points_against_map(cfg, partial_cdu_map())  # type: ignore[arg-type]


def test_absent_optional_point_without_unset_is_refused() -> None:
    cfg = ValveyConfig()
    with pytest.raises(ConfigError, match="heat_removed_kw"):
        check_points_against_map(cfg, partial_cdu_map())  # type: ignore[arg-type]


def test_unset_is_none_for_every_optional_kind() -> None:
    """The whole kind: any optional key (string, number, path), not only point names."""
    cfg = ValveyConfig.model_validate({"selector": {"fallback_dew_point_c": UNSET},
                                       "cdu": {"serial_port": UNSET}})
    assert cfg.selector.fallback_dew_point_c is None
    assert cfg.cdu.serial_port is None


def test_unset_on_a_required_key_is_refused_at_load_naming_it() -> None:
    """A key that cannot be None refuses "unset" where it is read, naming the key (it used to
    be kept as a value: a point named 'unset', a broker host 'unset')."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"(?s)supply_temp.*switches off optional keys only"):
        ValveyConfig.model_validate({"points": {"supply_temp": UNSET}})
    with pytest.raises(ValueError, match="switches off optional keys only"):
        ModbusTargetSettings.model_validate({"name": "x", "register_map": "m",
                                             "timeout_s": UNSET})


def test_an_unset_input_of_a_safety_function_is_warned(tmp_path: Path) -> None:
    """Acceptance round 2 of issue 14: ``points.flow = "unset"`` switched the low-flow
    interlock off and ``--check-config`` said "config OK" without a word. Each unset input
    of a safety function is a warning naming the key and the function that is off."""
    from valvey.config import config_warnings

    f = tmp_path / "valvey.toml"
    f.write_text('[points]\nflow = "unset"\nloop_pressure = "unset"\n'
                 '[safety]\nreservoir_level = "unset"\n')
    warnings = config_warnings(ValveyConfig.model_validate(read_toml(f)))
    assert "points.flow is unset; switched off: the low-flow and no-flow interlocks and the " \
        "flow warning" in warnings
    assert any(w.startswith("points.loop_pressure is unset") for w in warnings)
    assert any(w.startswith("safety.reservoir_level is unset") for w in warnings)
    # the defaults: only the rack's maximum power, a nameplate the site must give, is unset
    assert [w.split(" is unset")[0] for w in config_warnings(ValveyConfig())] == [
        "capacity.rack_max_power_w"]


def test_check_config_names_the_serial_line_of_an_rtu_cdu(tmp_path: Path) -> None:
    """The summary named the unused TCP address (127.0.0.1:5020) for a CDU on a serial line."""
    import os
    import subprocess
    import sys

    f = tmp_path / "valvey.toml"
    f.write_text('[identity]\nsite = "lab"\nrack = "rack1"\n'
                 '[cdu]\nframer = "rtu"\nserial_port = "/dev/ttyUSB0"\nlocal_echo = true\n'
                 f'[spool]\ndirectory = "{tmp_path / "spool"}"\n')
    r = subprocess.run([sys.executable, "-m", "valvey", "--config", str(f), "--check-config"],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path,
                       env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "CDU serial /dev/ttyUSB0 at 19200 baud" in r.stdout
    assert "127.0.0.1:5020" not in r.stdout
