"""valvey: run the cooling controller, check its config, or read every point once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from rackplane.cli import (
    EXIT_CONFIG,
    EXIT_OK,
    EXIT_RUNTIME,
    LogFormat,
    LogLevel,
    fail_config,
    run_async,
    samples_table,
    setup_logging,
)
from rackplane.clock import SYSTEM_CLOCK
from rackplane.config import check_state_file_dir, example_toml
from rackplane.core.registers import RegisterMap
from rackplane.core.samples import Sample
from rackplane.errors import ConfigError, ModbusError
from rackplane.io.modbus import ModbusDevice
from rackplane.io.service import run_daemon
from valvey.app import Valvey, load_valvey_config
from valvey.config import CduTarget, ValveyConfig
from valvey.persist import state_file_path

app = typer.Typer(add_completion=False, help=__doc__, no_args_is_help=False)


@app.command()
def valvey(
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="TOML config file (default: embedded defaults)"),
    ] = None,
    check_config: Annotated[
        bool, typer.Option("--check-config", help="validate the config and exit (2 if invalid)")
    ] = False,
    dry_connect: Annotated[
        bool,
        typer.Option("--dry-connect", help="read every CDU point once, print it, and exit"),
    ] = False,
    print_default_config: Annotated[
        bool, typer.Option("--print-default-config", help="print every key with its default")
    ] = False,
    log_level: Annotated[LogLevel | None, typer.Option(help="default: [log] level")] = None,
    log_format: Annotated[LogFormat | None, typer.Option(help="default: [log] format")] = None,
) -> None:
    """valvey: holds the CDU's coolant supply temperature (Modbus TCP, MQTT, InfluxDB)."""
    if print_default_config:
        text = example_toml(ValveyConfig, "valvey configuration (valvey --config FILE)")
        typer.echo(text, nl=False)
        raise typer.Exit(EXIT_OK)
    try:
        cfg, regmap = load_valvey_config(config)
        if cfg.control.state_file is not None:  # the default lives beside the spool folder
            check_state_file_dir("control.state_file", state_file_path(
                cfg.control.state_file, cfg.spool, cfg.identity.rack))
    except ConfigError as err:
        fail_config(err)
        return
    setup_logging(log_level, log_format, cfg.log)
    console = Console()
    if check_config:
        console.print(
            f"config OK: {config or '<embedded defaults>'}; CDU {cfg.cdu.host}:{cfg.cdu.port} "
            f"unit {cfg.cdu.unit_id} map {regmap.device.name} ({len(regmap.points)} points); "
            f"supply setpoint {cfg.supply_loop.setpoint_c} °C; broker "
            f"{cfg.mqtt.host}:{cfg.mqtt.port}; tsdb {cfg.tsdb.url or 'embedded spool'}"
        )
        raise typer.Exit(EXIT_OK)
    if dry_connect:
        raise typer.Exit(_dry_connect(cfg.cdu, regmap, console))
    raise typer.Exit(
        run_async(lambda: run_daemon(Valvey(cfg, regmap, config_path=config), "valvey"))
    )


def _dry_connect(target: CduTarget, regmap: RegisterMap, console: Console) -> int:
    """Read every point once; print value, unit, quality and range verdict."""

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
    return EXIT_OK if all(s.usable for s in samples) else EXIT_RUNTIME


def main() -> None:
    app()


__all__ = ["EXIT_CONFIG", "main"]
