"""valvey: run the cooling controller, check its config, or read every point once."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rich.console import Console

from rackplane.cli import EXIT_OK, EXIT_RUNTIME, samples_table
from rackplane.clock import SYSTEM_CLOCK
from rackplane.config import check_state_file_dir
from rackplane.core.registers import RegisterMap
from rackplane.core.samples import Sample
from rackplane.daemon_cli import DaemonCli, daemon_app
from rackplane.errors import ModbusError
from rackplane.io.modbus import ModbusDevice
from valvey.app import Valvey, load_valvey_config
from valvey.config import CduTarget, ValveyConfig, config_warnings
from valvey.persist import state_file_path

Loaded = tuple[ValveyConfig, RegisterMap]


def _load(config: Path | None) -> Loaded:
    """The config and its CDU register map; the state file's folder checked.

    Raises:
        ConfigError: naming the key path.
    """
    cfg, regmap = load_valvey_config(config)
    if cfg.control.state_file is not None:  # the default lives beside the spool folder
        check_state_file_dir("control.state_file", state_file_path(
            cfg.control.state_file, cfg.spool, cfg.identity.rack))
    return cfg, regmap


def _summary(loaded: Loaded, config: Path | None) -> str:
    cfg, regmap = loaded
    c = cfg.cdu
    where = (f"serial {c.serial_port} at {c.baudrate} baud" if c.serial_port is not None
             else f"{c.host}:{c.port}")
    return (
        f"config OK: {config or '<embedded defaults>'}; CDU {where} "
        f"unit {cfg.cdu.unit_id} map {regmap.device.name} ({len(regmap.points)} points); "
        f"supply setpoint {cfg.supply_loop.setpoint_c} °C; broker "
        f"{cfg.mqtt.host}:{cfg.mqtt.port}; tsdb {cfg.tsdb.url or 'embedded spool'}"
    )


def _dry_connect(target: CduTarget, regmap: RegisterMap, console: Console) -> int:
    """Read every point once; print value, unit, quality and range verdict. Exit 0 when
    every point was read usable; 1 otherwise (no answer, a point unusable, or no point
    read at all), saying which on stderr."""

    async def read() -> list[Sample]:
        dev = ModbusDevice(target, regmap, clock=SYSTEM_CLOCK, on_samples=lambda s: None)
        return await dev.read_once()

    try:
        samples = asyncio.run(read())
    except ModbusError as err:
        Console(stderr=True).print(
            f"dry connect failed: {target.host}:{target.port} unit {target.unit_id}: {err}",
            markup=False, highlight=False,
        )
        return EXIT_RUNTIME

    def bound(v: float | None) -> str:
        return "" if v is None else f"{v:g}"

    ranges = {p.name: f"{bound(p.valid_min)}..{bound(p.valid_max)}" for p in regmap.points}
    title = f"{target.name} {target.host}:{target.port} unit {target.unit_id}"
    console.print(samples_table(title, samples, ranges))
    bad = [s for s in samples if not s.usable]
    if samples and not bad:
        return EXIT_OK
    Console(stderr=True).print(
        f"dry connect: {len(samples) - len(bad)} of {len(samples)} CDU points usable"
        + (f"; not usable: {', '.join(s.point for s in bad)}" if bad else "")
        + f" ({target.host}:{target.port} unit {target.unit_id})", markup=False,
        highlight=False)
    return EXIT_RUNTIME


def _dry_connect_loaded(loaded: Loaded, console: Console) -> int:
    return _dry_connect(loaded[0].cdu, loaded[1], console)


app = daemon_app(DaemonCli(
    name="valvey",
    help="valvey: holds the CDU's coolant supply temperature (Modbus TCP, MQTT, InfluxDB).",
    app_help=__doc__,
    config_model=ValveyConfig,
    load=_load,
    log_settings=lambda loaded: loaded[0].log,
    summary=_summary,
    dry_connect=_dry_connect_loaded,
    dry_connect_help="read every CDU point once, print it, and exit",
    warnings=lambda loaded: config_warnings(loaded[0]),
    build=lambda loaded, config: Valvey(loaded[0], loaded[1], config_path=config),
    no_args_is_help=False,
))


def main() -> None:
    app()


__all__ = ["app", "main"]
