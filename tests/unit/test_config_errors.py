"""Every problem of a config in one ``--check-config`` run (new-user report): the missing parts
(what a config must name) used to come first and the file's type errors and unknown sections
only on the next try; a type error stated its value twice; a check of the whole model came as
``<root>: Value error, ...``; ``--check-config FILE`` was refused (only ``--config FILE``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import model_validator
from typer.testing import CliRunner

from rackplane.config import StrictModel, validate_data
from rackplane.errors import ConfigError
from racky.cli import app as racky_app
from rlc.app import load_rlc_config
from rlc.cli import app as rlc_app
from trayagent.cli import app as trayagent_app
from valvey.app import load_valvey_config
from valvey.cli import app as valvey_app

APPS = {"valvey": valvey_app, "racky": racky_app, "tray-agent": trayagent_app, "rlc": rlc_app}
ID = '[identity]\nsite = "dc1"\nrack = "r07"\n'

# no [identity], no CDU (the missing parts), a type error, a range error, an unknown section
# and an unknown key: one run names all six
BAD_VALVEY = """
[supply_loop]
setpoint_c = "warm"

[bogus]
x = 1

[mqtt]
port = 99999
colour = "blue"
"""
BAD_VALVEY_PROBLEMS = [
    "bogus: Extra inputs are not permitted",
    "cdu: names no CDU (host, port or serial_port): the defaults are the rack simulator's "
    "(127.0.0.1:5020)",
    "identity.rack: not set: the rack this valvey runs for (the default 'rack1' is an "
    "example: two racks on it would share topics)",
    "identity.site: not set: the site this valvey runs in (topics and time series carry it; "
    "the default 'lab' is an example)",
    "mqtt.colour: Extra inputs are not permitted (got 'blue')",
    "mqtt.port: Input should be less than or equal to 65535 (got 99999, allowed [1, 65535])",
    "supply_loop.setpoint_c: must be a number, not a string (got 'warm')",
]
NOT_CHECKED = ("(not checked until the errors above are fixed: the checks across sections, the "
               "daemon's checks of the loaded config, e.g. register maps, environment "
               "variables, folders)")


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # state files, spools: relative to the working directory
    monkeypatch.delenv("RACKPLANE_TEST_UNSET_PW", raising=False)


def _file(tmp_path: Path, text: str, name: str = "c.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _run(app_name: str, argv: list[str]) -> tuple[int, list[str]]:
    r = CliRunner().invoke(APPS[app_name], argv, env={"COLUMNS": "400"})
    return r.exit_code, r.output.splitlines()


def test_missing_parts_schema_errors_and_unknown_keys_come_in_one_run(tmp_path: Path) -> None:
    path = _file(tmp_path, BAD_VALVEY)
    with pytest.raises(ConfigError) as err:
        load_valvey_config(path)
    assert err.value.problems == BAD_VALVEY_PROBLEMS  # every one, sorted by key path
    code, lines = _run("valvey", ["--config", str(path), "--check-config"])
    assert code == 2, lines
    assert lines == [f"config error: invalid configuration in {path} (every key with an "
                     "example: config/valvey.example.toml):",
                     *(f"  {p}" for p in BAD_VALVEY_PROBLEMS), NOT_CHECKED]


def test_a_valid_schema_gets_the_loaded_config_checks_with_the_missing_parts(
        tmp_path: Path) -> None:
    """The model validates: the missing identity, an unset secret's variable and a TLS file
    that is not there are named together (they used to come one per try)."""
    path = _file(tmp_path, '[cdu]\nhost = "10.1.2.3"\n[mqtt]\npassword_env = '
                 '"RACKPLANE_TEST_UNSET_PW"\n[mqtt.tls]\nca_file = "/no/such/ca.pem"\n')
    with pytest.raises(ConfigError) as err:
        load_valvey_config(path)
    keys = [p.split(": ", 1)[0] for p in err.value.problems]
    assert keys == ["identity.rack", "identity.site", "mqtt.password_env", "mqtt.tls.ca_file"]
    assert "not checked" not in str(err.value)


def test_rlc_names_its_missing_topology_beside_the_files_other_errors(tmp_path: Path) -> None:
    """rlc's topology check ran before the schema's (a ``mode="before"`` validator): an
    unknown section and a wrong type came only once [topology] was written."""
    path = _file(tmp_path, '[identity]\nsite = "dc1"\n[bogus]\n[fleet]\nenabled = "yes"\n')
    with pytest.raises(ConfigError) as err:
        load_rlc_config(path)
    keys = [p.split(": ", 1)[0] for p in err.value.problems]
    assert keys == ["bogus", "fleet.enabled", "topology"], err.value.problems
    assert err.value.problems[2].startswith("topology: there is no [topology] section: ")
    assert "Field required" not in str(err.value)  # the missing part is said once


def test_a_type_error_states_its_value_once(tmp_path: Path) -> None:
    for text, line in (
        ('[supply_loop]\nsetpoint_c = "45"\n',
         "supply_loop.setpoint_c: must be a number, not a string (got '45')"),
        ("[supply_loop]\nsetpoint_c = true\n",
         "supply_loop.setpoint_c: must be a number, not a boolean (got True)"),
        ('[capacity]\nenabled = "yes"\n',
         "capacity.enabled: must be a boolean (true/false), not a string (got 'yes')"),
        ("[safety]\novertemp_delay_s = inf\n",
         "safety.overtemp_delay_s: must be a finite number (got inf)"),
        ('[cdu]\nport = "unset"\n',
         "cdu.port: switches off optional keys only; this key is required: give it "
         "a value (got 'unset')"),
    ):
        with pytest.raises(ConfigError) as err:
            load_valvey_config(_file(tmp_path, ID + '[cdu]\nhost = "h"\n' * ("cdu" not in text)
                                     + text))
        assert err.value.problems == [line], (text, err.value.problems)


class _Pair(StrictModel):
    lo: float = 0.0
    hi: float = 1.0

    @model_validator(mode="after")
    def _ordered(self) -> _Pair:
        if self.lo > self.hi:
            raise ValueError(f"lo ({self.lo:g}) must not be above hi ({self.hi:g})")
        return self


class _Whole(StrictModel):
    pair: _Pair = _Pair()
    size: int = 1

    @model_validator(mode="after")
    def _checks(self) -> _Whole:
        if self.size == 2:  # what an assert raises (pytest rewrites this module's asserts)
            raise AssertionError("the reserved size 2 is refused")
        if self.size == 3:
            raise ValueError("pair.hi must be below size when size is 3")
        if self.size == 4:
            raise ValueError("a size of 4 leaves no room for [pair]")
        if self.size == 5:
            raise ValueError("size 5 is not supported by this build")
        return self


@pytest.mark.parametrize(("data", "line"), [
    ({"pair": {"lo": 2.0}}, "pair: lo (2) must not be above hi (1)"),  # a section's own check
    ({"size": 2}, "config: the reserved size 2 is refused"),  # an assert: no 'Assertion failed, '
    ({"size": 3}, "pair: pair.hi must be below size when size is 3"),  # the section it names
    ({"size": 4}, "pair: a size of 4 leaves no room for [pair]"),
    ({"size": 5}, "size: size 5 is not supported by this build"),
])
def test_model_checks_name_their_section_without_pydantics_prefix(data: dict, line: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate_data(_Whole, data, "w.toml")
    assert err.value.problems == [f"w.toml: {line}"]
    assert "<root>" not in str(err.value) and "error, " not in str(err.value)


def test_a_cross_section_check_of_a_daemon_names_the_section(tmp_path: Path) -> None:
    path = _file(tmp_path, ID + '[cdu]\nhost = "h"\ntimeout_s = 10\n'
                 "[supply_loop]\nstale_after_s = 5\n")
    with pytest.raises(ConfigError) as err:
        load_valvey_config(path)
    assert err.value.problems == ["cdu: cdu.timeout_s must be shorter than "
                                  "supply_loop.stale_after_s, or a slow reply would count as "
                                  "fresh"]
    assert "checks across sections" not in str(err.value)  # they ran


@pytest.mark.parametrize("daemon", list(APPS))
def test_check_config_takes_the_file_as_its_argument(tmp_path: Path, daemon: str) -> None:
    path = _file(tmp_path, "[bogus]\n")
    code, bare = _run(daemon, ["--check-config", str(path)])
    assert code == 2 and "  bogus: Extra inputs are not permitted" in bare, bare
    assert (code, bare) == _run(daemon, ["--config", str(path), "--check-config"])
    assert (code, bare) == _run(daemon, [str(path), "--check-config"])
    code, alone = _run(daemon, ["--check-config"])  # the flag alone: the embedded defaults
    assert code == 2 and "config error: invalid configuration in <embedded defaults>" in \
        alone[0], alone
    code, out = _run(daemon, [str(path)])  # a bare file without --check-config: refused
    assert code == 2 and "give the config file as --config" in " ".join(out), out
    other = _file(tmp_path, ID, "other.toml")
    code, out = _run(daemon, ["--config", str(other), "--check-config", str(path)])
    assert code == 2 and "two config files" in " ".join(out), out


def test_check_config_file_accepts_a_good_file(tmp_path: Path) -> None:
    path = _file(tmp_path, ID + '[cdu]\nhost = "10.1.2.3"\n')
    code, out = _run("valvey", ["--check-config", str(path)])
    assert code == 0 and out[-1].startswith(f"config OK: {path}; CDU 10.1.2.3:502"), out
