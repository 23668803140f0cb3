"""racky: run the rack power and infrastructure manager, check its config, or read every power
shelf once (and probe the discovery range)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from rackplane.cli import (
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
from rackplane.core.registers import load_register_map
from rackplane.core.samples import Sample
from rackplane.errors import ConfigError, ModbusError
from rackplane.io.modbus import ModbusDevice
from rackplane.io.service import run_daemon
from racky.app import Racky, _shelf_target, load_racky_config
from racky.config import RackyConfig, state_path

app = typer.Typer(add_completion=False, help=__doc__)


@app.command()
def racky(
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="TOML config file (default: embedded defaults)"),
    ] = None,
    check_config: Annotated[
        bool, typer.Option("--check-config", help="validate the config and exit (2 if invalid)")
    ] = False,
    dry_connect: Annotated[
        bool, typer.Option("--dry-connect", help="read every power shelf once (and probe the "
                           "discovery range), print it, and exit")
    ] = False,
    print_default_config: Annotated[
        bool, typer.Option("--print-default-config", help="print every key with its default")
    ] = False,
    log_level: Annotated[LogLevel | None, typer.Option(help="default: [log] level")] = None,
    log_format: Annotated[LogFormat | None, typer.Option(help="default: [log] format")] = None,
) -> None:
    """racky: rack power capping and sequencing, link health, thermal and traffic detection,
    the rack lifecycle (Modbus TCP, MQTT, InfluxDB). Validation on the simulator:
    ``python -m harness.lockstep_racky validate``; on a live rack: the ``start_validation``
    command (docs/RACKY.md)."""
    if print_default_config:
        text = example_toml(RackyConfig, "racky configuration (racky --config FILE)")
        typer.echo(text, nl=False)
        raise typer.Exit(EXIT_OK)
    try:
        cfg = load_racky_config(config)
        check_state_file_dir("lifecycle.state_file", state_path(cfg.lifecycle.state_file))
    except ConfigError as err:
        fail_config(err)
        return
    setup_logging(log_level, log_format, cfg.log)
    console = Console()
    if check_config:
        a = cfg.node_agents
        console.print(
            f"config OK: {config or '<embedded defaults>'}; {len(cfg.power_shelves)} power "
            f"shelves; discovery {'on' if cfg.discovery.enabled else 'off'}; node agents "
            f"'{a.daemon}' ({a.trays} trays x {a.gpus_per_tray} GPUs); budget "
            f"{'none' if cfg.power.budget_w is None else f'{cfg.power.budget_w:g} W'}; state file "
            f"{state_path(cfg.lifecycle.state_file)}; broker {cfg.mqtt.host}:{cfg.mqtt.port}; "
            f"tsdb {cfg.tsdb.url or 'embedded spool'}", highlight=False, markup=False,
        )
        raise typer.Exit(EXIT_OK)
    if dry_connect:
        raise typer.Exit(_dry_connect(cfg, console))
    try:
        daemon = Racky(cfg, config_path=config)
    except ConfigError as err:
        fail_config(err)
        return
    raise typer.Exit(run_async(lambda: run_daemon(daemon, "racky")))


def _dry_connect(cfg: RackyConfig, console: Console) -> int:
    """Read every configured shelf once; probe every discovery unit id once."""

    async def read(target: object) -> list[Sample]:
        assert hasattr(target, "register_map")
        dev = ModbusDevice(target, load_register_map(target.register_map),  # type: ignore[arg-type]
                           clock=SYSTEM_CLOCK, on_samples=lambda s: None)
        return await dev.read_once()

    rc = EXIT_OK
    targets = list(cfg.power_shelves)
    if cfg.discovery.enabled:
        d = cfg.discovery
        targets += [_shelf_target(cfg, u) for u in range(d.unit_id_first, d.unit_id_last + 1)]
    if not targets:
        console.print("no power shelves configured and discovery is off: nothing to read")
        return EXIT_OK
    found = 0
    for t in targets:
        try:
            samples = asyncio.run(read(t))
        except ModbusError as err:
            console.print(f"{t.name} {t.host}:{t.port} unit {t.unit_id}: {err}", markup=False,
                          highlight=False)
            rc = EXIT_RUNTIME
            continue
        if not any(s.usable for s in samples):
            console.print(f"{t.name} {t.host}:{t.port} unit {t.unit_id}: no answer",
                          markup=False, highlight=False)
            if t in cfg.power_shelves:
                rc = EXIT_RUNTIME
            continue
        found += 1
        title = f"{t.name} {t.host}:{t.port} unit {t.unit_id}"
        console.print(samples_table(title, samples, {}))
    console.print(f"{found} of {len(targets)} shelves answered")
    return rc


def main() -> None:
    app()
