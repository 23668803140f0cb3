"""Config loading is type-strict (F2): TOML has real types, so nothing is coerced."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from pydantic import ValidationError

from rackplane.config import check_state_file_dir, validate_data
from rackplane.errors import ConfigError
from racky.config import RackyConfig
from valvey.config import ValveyConfig


@pytest.mark.parametrize(
    ("model", "data", "key"),
    [
        (RackyConfig, {"power": {"budget_w": True}}, "power.budget_w"),
        (RackyConfig, {"power": {"budget_w": "120000"}}, "power.budget_w"),
        (ValveyConfig, {"cdu": {"port": True}}, "cdu.port"),
        (ValveyConfig, {"supply_loop": {"setpoint_c": "45"}}, "supply_loop.setpoint_c"),
        (ValveyConfig, {"cdu": {"host": ""}}, "cdu.host"),
        (ValveyConfig, {"mqtt": {"host": ""}}, "mqtt.host"),
        (ValveyConfig, {"mqtt": {"port": "1883"}}, "mqtt.port"),
        (RackyConfig, {"discovery": {"enabled": "yes"}}, "discovery.enabled"),
        (RackyConfig, {"discovery": {"enabled": 1}}, "discovery.enabled"),
    ],
)
def test_config_refuses_coercion(model: type, data: dict, key: str) -> None:
    with pytest.raises(ConfigError) as exc:
        validate_data(model, data, "t.toml")
    assert any(p.startswith(f"t.toml: {key}:") for p in exc.value.problems), exc.value.problems


def test_config_int_for_float_and_str_paths_still_load(tmp_path: Path) -> None:
    cfg = validate_data(RackyConfig, {"power": {"budget_w": 120000},
                                      "lifecycle": {"state_file": "s.json"}}, "t.toml")
    assert cfg.power.budget_w == 120000.0
    assert cfg.lifecycle.state_file == Path("s.json")


@pytest.mark.parametrize("prog", ["valvey", "racky", "rack-sim"])
@pytest.mark.parametrize(("flag", "value"), [("--log-level", "verbose"), ("--log-level", "warn"),
                                             ("--log-format", "xml")])
def test_cli_log_flags_are_choices(prog: str, flag: str, value: str) -> None:
    from typer.testing import CliRunner

    if prog == "valvey":
        from valvey.cli import app
        args = [flag, value, "--check-config"]
    elif prog == "racky":
        from racky.cli import app
        args = [flag, value, "--check-config"]
    else:
        from sims.cli import app
        args = ["run", flag, value]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    assert "is not one of" in res.output


@pytest.mark.parametrize(("prog", "section", "key"), [("valvey", "control", "control.state_file"),
                                                      ("racky", "lifecycle",
                                                       "lifecycle.state_file")])
def test_check_config_refuses_missing_state_file_folder(
    tmp_path: Path, prog: str, section: str, key: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from typer.testing import CliRunner

    if prog == "valvey":
        from valvey.cli import app
    else:
        from racky.cli import app
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    missing = tmp_path / "no" / "such" / "s.json"
    cfg = tmp_path / "c.toml"
    cdu = "[cdu]\nport = 5020\n" if prog == "valvey" else ""  # what each must name
    cfg.write_text(f'[identity]\nsite = "lab"\nrack = "rack1"\n{cdu}'
                   f'[{section}]\nstate_file = "{missing}"\n')
    res = CliRunner().invoke(app, ["-c", str(cfg), "--check-config"])
    assert res.exit_code == 2, res.output
    assert key in res.output and "does not exist" in res.output
    assert not missing.parent.exists()
    # (the accepted case is not run through CliRunner: it would point logging at its stream)
    check_state_file_dir(key, tmp_path / "s.json")
    check_state_file_dir(key, missing, {"STATE_DIRECTORY": str(tmp_path / "no")})


def test_racky_state_store_does_not_create_missing_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from racky.persist import StateStore

    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    store = StateStore(tmp_path / "no" / "dir" / "racky-state.json")
    st = store.load(1)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        store.save(st)
    assert not (tmp_path / "no").exists()
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "no"))
    store.save(st)  # systemd's StateDirectory: creating inside it is fine
    assert store.path.is_file()


def test_inf_and_nan_floats_are_config_errors_with_the_key_path() -> None:
    """TOML has inf and nan: `overtemp_delay_s = inf` used to pass --check-config and then
    the over-temperature interlock never tripped (new-user test, stop 11)."""
    for text, key in (("[safety]\novertemp_delay_s = inf\n", "safety.overtemp_delay_s"),
                      ("[safety]\novertemp_k = nan\n", "safety.overtemp_k")):
        with pytest.raises(ConfigError) as exc:
            validate_data(ValveyConfig, tomllib.loads(text), "v.toml")
        got = text.rsplit("= ", 1)[1].strip()
        assert exc.value.problems == [f"v.toml: {key}: must be a finite number (got {got})"]


def test_overtemp_clear_band_must_be_below_the_trip_band() -> None:
    """overtemp_clear_k >= overtemp_k tripped the interlock but never forced the valves open."""
    from valvey.core.safety import SafetySettings

    with pytest.raises(ValidationError, match=r"overtemp_clear_k .* must be below overtemp_k"):
        SafetySettings(overtemp_k=5.0, overtemp_clear_k=10.0)
    with pytest.raises(ValidationError, match=r"no_flow_fraction .* must be below"):
        SafetySettings(no_flow_fraction=0.6, low_flow_fraction=0.5)
    SafetySettings(overtemp_k=5.0, overtemp_clear_k=4.9)


def test_flow_mode_needs_the_sites_flow_setpoint() -> None:
    """No flow setpoint default (the nominal simulated plant's 198 L/min was one): mode
    'flow' refuses to load without the site's, mode 'diff_pressure' needs none."""
    from valvey.core.pump_settings import PumpLoopSettings

    assert PumpLoopSettings().flow_setpoint_lpm is None
    with pytest.raises(ValidationError, match="mode 'flow' needs flow_setpoint_lpm"):
        PumpLoopSettings(mode="flow")
    assert PumpLoopSettings(mode="flow", flow_setpoint_lpm=240.0).setpoint == 240.0
    assert PumpLoopSettings().setpoint == PumpLoopSettings().dp_setpoint_kpa
