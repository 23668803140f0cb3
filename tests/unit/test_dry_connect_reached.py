"""``--dry-connect`` exits non-zero when it reached no device: a dry connect that read nothing
(nothing configured, nothing found, nothing answering) proves nothing, so it never says 0
("racky --dry-connect" on the example config read 0 shelves and exited 0). Each says why on
stderr. Real sockets: the devices are a free port nobody listens on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.servers import free_port
from racky.cli import app as racky_app
from trayagent.cli import app as trayagent_app
from valvey.cli import app as valvey_app


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.chdir(tmp_path)  # state files, spools: relative to the working directory
    yield


def _run(app: object, *argv: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(app, list(argv), env={"COLUMNS": "200"})  # type: ignore[arg-type]
    return r.exit_code, r.stdout, r.stderr


ID = '[identity]\nsite = "lab"\nrack = "rack1"\n'  # what each daemon's file must name


def test_racky_with_no_shelf_configured_and_discovery_off_fails(tmp_path: Path) -> None:
    cfg = tmp_path / "racky.toml"
    cfg.write_text(ID)
    code, _out, err = _run(racky_app, "--config", str(cfg), "--dry-connect")
    assert code == 1, (_out, err)
    assert "read nothing" in err and "discovery is off" in err, err
    code, _out, err = _run(racky_app, "--dry-connect")  # the embedded defaults: no identity
    assert code == 2 and "identity.rack: not set" in " ".join(err.split()), (_out, err)


def test_racky_whose_discovery_found_no_shelf_fails(tmp_path: Path) -> None:
    cfg = tmp_path / "racky.toml"
    port = free_port()
    cfg.write_text(f"{ID}[discovery]\nenabled = true\nport = {port}\nunit_id_first = 1\n"
                   "unit_id_last = 2\ntimeout_s = 0.2\n")
    code, out, err = _run(racky_app, "--config", str(cfg), "--dry-connect")
    assert code == 1, (out, err)
    assert "0 of 2 shelves answered" in out
    assert f"reached no power shelf (0 configured; discovery 127.0.0.1:{port} units 1..2)" \
        in " ".join(err.split()), err


def test_valvey_whose_cdu_does_not_answer_fails(tmp_path: Path) -> None:
    cfg = tmp_path / "valvey.toml"
    cfg.write_text(f"{ID}[cdu]\nport = {free_port()}\n")
    code, _out, err = _run(valvey_app, "--config", str(cfg), "--dry-connect")
    assert code == 1 and "dry connect failed" in err, (_out, err)


def test_tray_agent_with_no_source_enabled_is_refused_at_load(tmp_path: Path) -> None:
    """No GPU source and no BMC: nothing to read. It used to load and only its dry connect
    said so; now the config is refused (exit 2) naming why, before any device is touched."""
    cfg = tmp_path / "tray-agent.toml"
    cfg.write_text(f"{ID}[nvml]\nenabled = false\n[[agents.trays]]\ntray = 0\n"
                   "nvml_devices = [0, 1, 2, 3]\ncoolant_out_temp_c = 45.0\n")
    code, out, err = _run(trayagent_app, "--config", str(cfg), "--dry-connect")
    assert code == 2, (out, err)
    assert "no GPU source and no BMC, nothing to read" in " ".join(err.split()), err


def test_rlc_whose_nats_does_not_answer_fails(tmp_path: Path) -> None:
    from rlc.cli import app as rlc_app

    cfg = tmp_path / "rlc.toml"
    cfg.write_text(f'[fleet]\nservers = ["nats://127.0.0.1:{free_port()}"]\n'
                   '[topology]\nsite = "lab"\nhalls = {h1 = {feed_limit_w = 1e6, rows = {r1 = {'
                   'limit_w = 1e5, racks = {rack1 = {floor_w = 1e4, max_w = 5e4}}}}}}\n')
    code, out, err = _run(rlc_app, "--config", str(cfg), "--dry-connect")
    assert code == 1, (out, err)
    assert "dry connect: fleet bucket rackplane_fleet on nats://127.0.0.1:" in \
        " ".join(err.split()), err


async def test_valvey_names_the_cdu_points_it_could_not_read() -> None:
    """A CDU that answers some points: the table shows all, exit 1, stderr names the rest
    (it exited 1 without a word)."""
    import asyncio
    import contextlib
    import io

    from rich.console import Console

    from rackplane.core.registers import parse_register_map
    from rackplane.settings import ModbusTargetSettings
    from sims.modbus_face import ModbusFace
    from valvey.cli import _dry_connect

    good = [{"name": "supply_temp_c", "table": "input", "address": 0, "type": "uint16"},
            {"name": "flow_lpm", "table": "input", "address": 2, "type": "uint16"}]
    absent = [{"name": "dp_kpa", "table": "input", "address": 30, "type": "uint16"}]
    face = ModbusFace(parse_register_map({"device": {"name": "cdu"}, "points": good}))
    face.update({"supply_temp_c": 30, "flow_lpm": 400})
    await face.start()
    try:
        target = ModbusTargetSettings.model_validate({
            "name": "cdu", "host": "127.0.0.1", "port": face.port, "unit_id": 1,
            "register_map": "cdu", "timeout_s": 0.5})
        regmap = parse_register_map({"device": {"name": "cdu"}, "points": good + absent})
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err):
            code = await asyncio.to_thread(_dry_connect, target,  # type: ignore[arg-type]
                                           regmap, Console(file=out, width=200))
    finally:
        await face.stop()
    assert code == 1
    assert "supply_temp_c" in out.getvalue() and "dp_kpa" in out.getvalue()
    said = " ".join(err.getvalue().split())
    assert f"dry connect: 2 of 3 CDU points usable; not usable: dp_kpa (127.0.0.1:{face.port} " \
        "unit 1)" in said, said
