"""A config naming nothing a daemon needs is refused by ``--check-config`` (exit 2), naming each
missing part and the example file; what is merely unusual is a printed warning (exit 0). An
empty valvey, racky or tray-agent config used to say "config OK": the daemon then ran as rack
``rack1`` of site ``lab`` (another rack's topics), valvey on the simulator's CDU address, a
tray agent with no trays (publishing nothing) or with nothing to read."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from racky.cli import app as racky_app
from trayagent.cli import app as trayagent_app
from valvey.cli import app as valvey_app

APPS = {"valvey": valvey_app, "racky": racky_app, "tray-agent": trayagent_app}
ID = '[identity]\nsite = "dc1"\nrack = "r07"\n'
TRAY = '[[agents.trays]]\ntray = 0\nnvml_devices = [0, 1, 2, 3]\ncoolant_out_temp_c = 45.0\n'
BMC = ('[agents.trays.bmc]\nurl = "https://10.0.0.5"\nchassis = "tray0"\nusername = "ops"\n'
       'password_env = "RACKPLANE_TEST_BMC_PW"\n')


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # state files, spools: relative to the working directory
    monkeypatch.setenv("RACKPLANE_TEST_BMC_PW", "pw")


def _check(daemon: str, path: Path | None) -> tuple[int, str]:
    argv = ["--check-config"] + ([] if path is None else ["--config", str(path)])
    r = CliRunner().invoke(APPS[daemon], argv, env={"COLUMNS": "400"})
    return r.exit_code, " ".join(r.output.split())


def _file(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


@pytest.mark.parametrize(("daemon", "missing"), [
    ("valvey", ["identity.site: not set", "identity.rack: not set", "cdu: names no CDU"]),
    ("racky", ["identity.site: not set", "identity.rack: not set"]),
    ("tray-agent", ["identity.site: not set", "identity.rack: not set",
                    "agents.trays: lists no tray"]),
])
def test_an_empty_or_absent_config_is_refused_naming_each_missing_part(
        tmp_path: Path, daemon: str, missing: list[str]) -> None:
    for path in (_file(tmp_path, ""), None):  # an empty file; no file (the embedded defaults)
        code, out = _check(daemon, path)
        assert code == 2, (path, out)
        assert f"(every key with an example: config/{daemon}.example.toml)" in out, out
        for m in missing:
            assert m in out, (m, out)


def test_the_other_problems_of_an_incomplete_file_are_named_with_it(tmp_path: Path) -> None:
    code, out = _check("racky", _file(tmp_path, "[power]\nbudget_w = -5\n"))
    assert code == 2 and "identity.rack: not set" in out and "power.budget_w" in out, out


def test_what_each_daemon_needs_is_enough(tmp_path: Path) -> None:
    code, out = _check("valvey", _file(tmp_path, ID + "[cdu]\nhost = \"10.1.2.3\"\n"))
    assert code == 0 and "config OK" in out, out
    code, out = _check("tray-agent", _file(tmp_path, ID + TRAY))
    assert code == 0 and "config OK" in out, out
    shelf = ('[[power_shelves]]\nname = "shelf0"\nhost = "10.1.2.4"\nport = 502\n'
             'unit_id = 1\nregister_map = "power-shelf"\n')
    code, out = _check("racky", _file(tmp_path, ID + shelf))
    assert code == 0 and "config OK" in out and "warning: no power shelves" not in out, out


def test_racky_without_shelves_or_discovery_is_warned(tmp_path: Path) -> None:
    """The node agents alone can be capped (not fatal), but nothing measures the rack."""
    code, out = _check("racky", _file(tmp_path, ID))
    assert code == 0 and "config OK" in out, out
    assert "warning: no power shelves: power_shelves is empty and discovery is off" in out, out
    code, out = _check("racky", _file(tmp_path, ID + "[discovery]\nenabled = true\n"))
    assert code == 0 and "warning: no power shelves" not in out, out


def test_a_tray_agent_with_nothing_to_read_is_refused_one_with_a_bmc_only_warned(
        tmp_path: Path) -> None:
    off = "[nvml]\nenabled = false\n"
    code, out = _check("tray-agent", _file(tmp_path, ID + off + TRAY))
    assert code == 2 and "no GPU source and no BMC, nothing to read" in out, out
    code, out = _check("tray-agent", _file(tmp_path, ID + off + TRAY + BMC))
    assert code == 0 and "warning: nvml.enabled is false" in out, out
    assert "have no bmc" not in out, out
    code, out = _check("tray-agent", _file(tmp_path, ID + TRAY))
    assert code == 0 and "warning: trays [0] have no bmc" in out, out
