"""Numbers in the wrong unit (issue 14 item 18): a value outside its hard limits is an error
printing the value and the limits; one inside them but far outside the field's physical
range is a warning, printed by ``--check-config`` (exit 0) and logged at start."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from typer.testing import CliRunner

from rackplane.config import load_config, validate_data
from rackplane.config_plausibility import Plausible, plausibility_warnings
from rackplane.daemon_cli import DaemonCli, daemon_app
from rackplane.errors import ConfigError
from rackplane.settings import LogSettings
from racky import cli as racky_cli
from racky.config import RackyConfig
from racky.config import config_warnings as racky_warnings
from valvey import cli as valvey_cli
from valvey.config import ValveyConfig
from valvey.config import config_warnings as valvey_warnings

CONFIG = Path(__file__).resolve().parents[2] / "config"


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """The CLI configures process-wide logging onto the runner's (then closed) streams."""
    saved, root = structlog.get_config(), logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    structlog.configure(**saved)
    root.handlers[:], root.level = handlers, level


def test_defaults_and_shipped_examples_are_plausible() -> None:
    assert racky_warnings(RackyConfig()) == []
    # the one site figure valvey has no default for: the rack's maximum power (a nameplate)
    unset = [w for w in valvey_warnings(ValveyConfig())
             if w.startswith("capacity.rack_max_power_w is unset")]
    assert len(unset) == 1 and valvey_warnings(ValveyConfig()) == unset
    named = {"capacity": {"rack_max_power_w": 140_000.0}}
    assert valvey_warnings(ValveyConfig.model_validate(named)) == []
    assert racky_warnings(load_config(RackyConfig, CONFIG / "racky.example.toml")) == []
    assert valvey_warnings(load_config(ValveyConfig, CONFIG / "valvey.example.toml")) == unset


@pytest.mark.parametrize(("model", "data", "warn", "text"), [
    # flows in m³/h (12 m³/h = 200 L/min) or L/s (3.3 L/s = 198 L/min)
    (ValveyConfig, {"pump_loop": {"mode": "flow", "flow_setpoint_lpm": 12.0,
                                  "flow_setpoint_min_lpm": 10.0}}, valvey_warnings,
     "pump_loop.flow_setpoint_lpm = 12 L/min is far outside the plausible range [20, 3000] "
     "L/min"),
    (ValveyConfig, {"pump_loop": {"flow_setpoint_min_lpm": 3.3}}, valvey_warnings,
     "m³/h or L/s written as L/min?"),
    (RackyConfig, {"cooling": {"flow_low_lpm": 3.3}}, racky_warnings,
     "cooling.flow_low_lpm = 3.3 L/min is far outside"),
    # powers in kW where W is expected
    (ValveyConfig, {"capacity": {"rack_max_power_w": 132.0, "min_cap_w": 26.0}},
     valvey_warnings, "capacity.rack_max_power_w = 132 W is far outside the plausible range "
     "[10000, 600000] W"),
    (RackyConfig, {"node_agents": {"gpu_tgp_w": 1.2, "gpu_min_power_limit_w": 0.2,
                                   "non_tray_power_w": 0.0}, "power": {"confirmed_low_w": 10.0}},
     racky_warnings, "node_agents.gpu_tgp_w = 1.2 W is far outside"),
    # a supply setpoint in kelvin with limits that let it through
    (ValveyConfig, {"supply_loop": {"setpoint_c": 318.0, "setpoint_min_c": 300.0,
                                    "setpoint_max_c": 330.0, "pv_valid_max_c": 400.0}},
     valvey_warnings, "supply_loop.setpoint_c = 318 °C is far outside"),
    # a budget the rack can never reach
    (RackyConfig, {"power": {"budget_w": 250_000.0}}, racky_warnings,
     "power.budget_w = 250000 W is more than 1.5 × what the rack can draw"),
])
def test_implausible_values_warn_naming_value_range_and_source(
        model: type[Any], data: dict[str, Any], warn: Any, text: str) -> None:
    cfg = validate_data(model, data)
    warnings = warn(cfg)
    assert any(text in w for w in warnings), warnings
    assert all("REFERENCE" in w or "never binds" in w for w in warnings)


@pytest.mark.parametrize(("model", "data", "text"), [
    (RackyConfig, {"power": {"budget_w": 120}},
     "power.budget_w = 120 W is outside [25020, 264000] W"),
    (ValveyConfig, {"pump_loop": {"dp_setpoint_kpa": 1.5}},
     "dp_setpoint_kpa = 1.5 kPa is outside [50, 300] kPa"),
    (ValveyConfig, {"pump_loop": {"mode": "flow", "flow_setpoint_lpm": 12.0}},
     "flow_setpoint_lpm = 12 L/min is outside [50, 500] L/min"),
])
def test_values_outside_their_limits_are_errors_printing_value_and_limits(
        model: type[Any], data: dict[str, Any], text: str) -> None:
    with pytest.raises(ConfigError) as exc:
        validate_data(model, data)
    assert text in str(exc.value)


def test_a_table_naming_a_missing_key_is_a_bug() -> None:
    with pytest.raises(AttributeError):
        plausibility_warnings(RackyConfig(), [Plausible("power.no_such_w", 0, 1, "W", "x")])
    assert plausibility_warnings(RackyConfig(), [Plausible("power.budget_w", 0, 1, "W", "x")]
                                 ) == []  # unset (None): not judged


def test_check_config_prints_the_warnings_and_exits_0(tmp_path: Path) -> None:
    conf = tmp_path / "v.toml"
    conf.write_text('[identity]\nsite = "lab"\nrack = "rack1"\n[cdu]\nport = 5020\n'
                    '[pump_loop]\nmode = "flow"\nflow_setpoint_lpm = 12\n'
                    "flow_setpoint_min_lpm = 10\n")
    r = CliRunner().invoke(valvey_cli.app, ["--config", str(conf), "--check-config"],
                           env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    assert "warning: pump_loop.flow_setpoint_lpm = 12 L/min is far outside" in r.output
    assert "config OK" in r.output
    conf = tmp_path / "r.toml"
    conf.write_text('[identity]\nsite = "lab"\nrack = "rack1"\n[cooling]\nflow_low_lpm = 3.3\n')
    r = CliRunner().invoke(racky_cli.app, ["--config", str(conf), "--check-config"],
                           env={"COLUMNS": "400"})
    assert r.exit_code == 0 and "warning: cooling.flow_low_lpm = 3.3 L/min" in r.output
    conf.write_text("[power]\nbudget_w = 120\n")
    r = CliRunner().invoke(racky_cli.app, ["--config", str(conf), "--check-config"])
    assert r.exit_code == 2
    assert "power.budget_w = 120 W is outside [25020, 264000] W" in r.output.replace("\n", "")


def test_the_warnings_are_logged_at_start() -> None:
    built: list[Any] = []

    def build(cfg: Any, _path: Any) -> Any:
        built.append(cfg)
        raise ConfigError("stop here (the test does not run a daemon)")

    app = daemon_app(DaemonCli(
        name="testd", help="t", app_help=None, config_model=RackyConfig,
        load=lambda _p: validate_data(RackyConfig, {"cooling": {"flow_low_lpm": 3.3}}),
        log_settings=lambda _c: LogSettings(), summary=lambda _c, _p: "ok",
        dry_connect=lambda _c, _con: 0, dry_connect_help="x", build=build,
        warnings=racky_warnings))
    r = CliRunner().invoke(app, ["--log-format", "json"])
    assert r.exit_code == 2 and built
    ev = [json.loads(ln) for ln in r.output.splitlines() if "config_implausible" in ln]
    assert len(ev) == 1 and "cooling.flow_low_lpm = 3.3 L/min" in ev[0]["warning"]


@pytest.mark.parametrize(("model", "data", "text"), [
    (RackyConfig, {"power": {"budget_margin_pct": 50}},
     "power.budget_margin_pct: Input should be less than or equal to 20 (got 50, allowed "
     "[0, 20])"),
    (RackyConfig, {"power": {"reconcile_confirm_s": 0}}, "(got 0, allowed (0, 120])"),
    (RackyConfig, {"node_agents": {"trays": 100}}, "(got 100, allowed [1, 64])"),
    (ValveyConfig, {"pump_loop": {"max_pressure_kpa": -1}}, "(got -1, allowed (0, ∞))"),
])
def test_a_value_outside_its_field_bounds_names_the_whole_range(
        model: type[Any], data: dict[str, Any], text: str) -> None:
    with pytest.raises(ConfigError) as exc:
        validate_data(model, data)
    assert text in str(exc.value)


@pytest.mark.parametrize(("data", "text"), [
    # acceptance round 2 of issue 14: more values of the same kind, each silently accepted
    ({"safety": {"design_flow_lpm": 3.3}},  # L/s: the low-flow interlock never trips
     "safety.design_flow_lpm = 3.3 L/min is far outside"),
    ({"safety": {"filter_dp_high_kpa": 0.6}},  # bar
     "safety.filter_dp_high_kpa = 0.6 kPa is far outside"),
    ({"safety": {"power_low_w": 15.0}},  # kW
     "safety.power_low_w = 15 W is far outside"),
    ({"selector": {"fallback_dew_point_c": 59.0}},  # °F
     "selector.fallback_dew_point_c = 59 °C is far outside"),
    ({"supply_loop": {"setpoint_min_c": 77.0, "setpoint_max_c": 118.0, "setpoint_c": 100.0,
                      "pv_valid_max_c": 150.0}},  # °F
     "supply_loop.setpoint_max_c = 118 °C is far outside"),
])
def test_more_wrong_units_warn(data: dict[str, Any], text: str) -> None:
    warnings = valvey_warnings(validate_data(ValveyConfig, data))
    assert any(text in w for w in warnings), warnings


@pytest.mark.parametrize(("data", "text"), [
    ({"supply_loop": {"setpoint_c": 113.0}},
     "setpoint_c = 113 °C is outside [setpoint_min_c, setpoint_max_c] = [25, 48] °C"),
    ({"selector": {"fallback_dew_point_c": 290.0}},  # K: no dew point is that
     "selector.fallback_dew_point_c"),
])
def test_more_wrong_units_are_errors_naming_value_and_limits(data: dict[str, Any], text: str
                                                             ) -> None:
    with pytest.raises(ConfigError) as exc:
        validate_data(ValveyConfig, data)
    assert text in str(exc.value)


@pytest.mark.parametrize(("data", "text"), [
    # °F: the protections would never fire (149 °C tray outlet, 185 °C PSU, 158 °C cable)
    ({"thermal": {"tray_outlet_limit_c": 149.0}},
     "thermal.tray_outlet_limit_c = 149 °C is far outside"),
    ({"thermal": {"psu_warn_c": 176.0, "psu_limit_c": 185.0}},
     "thermal.psu_limit_c = 185 °C is far outside"),
    ({"links": {"cable_temp_limit_c": 158.0}}, "links.cable_temp_limit_c = 158 °C is far"),
    ({"power": {"sequencing": {"inrush_limit_w": 21.0, "tray_inrush_w": 7.0}}},
     "power.sequencing.inrush_limit_w = 21 W is far outside"),
])
def test_more_wrong_units_warn_in_racky(data: dict[str, Any], text: str) -> None:
    warnings = racky_warnings(validate_data(RackyConfig, data))
    assert any(text in w for w in warnings), warnings


def test_a_rack_capacity_below_the_floor_or_beyond_any_feed_is_an_error() -> None:
    """New-user run: ``rack_capacity_w = 264`` (kW as W) and ``1e300`` passed with a warning;
    the first leaves no budget between floor and capacity, the second lifts the ceiling of
    set_budget and cap_rack off."""
    import pytest
    from pydantic import ValidationError

    from racky.config import RackyConfig

    for capacity in (264.0, 1e300, 2_000_001.0):
        with pytest.raises(ValidationError, match="rack_capacity_w"):
            RackyConfig.model_validate({"power": {"rack_capacity_w": capacity}})
    RackyConfig.model_validate({"power": {"rack_capacity_w": 2_000_000.0}})


def test_unset_on_a_required_key_is_an_error_naming_it() -> None:
    """``"unset"`` switches off optional keys; on a required one (a broker host, a site) it
    was taken as the value."""
    import pytest
    from pydantic import ValidationError

    from racky.config import RackyConfig
    from valvey.config import ValveyConfig

    for model, data in ((RackyConfig, {"mqtt": {"host": "unset"}}),
                        (RackyConfig, {"identity": {"site": "unset"}}),
                        (ValveyConfig, {"mqtt": {"host": "unset"}})):
        with pytest.raises(ValidationError, match="switches off optional keys only"):
            model.model_validate(data)
