"""racky: run the rack power and infrastructure manager, or check its config."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from rackplane.cli import EXIT_OK, fail_config, run_async, setup_logging
from rackplane.config import example_toml
from rackplane.errors import ConfigError
from rackplane.service import run_daemon
from racky.app import Racky, load_racky_config
from racky.config import RackyConfig

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
    print_default_config: Annotated[
        bool, typer.Option("--print-default-config", help="print every key with its default")
    ] = False,
    log_level: Annotated[str | None, typer.Option(help="debug | info | warning | error")] = None,
    log_format: Annotated[str | None, typer.Option(help="auto | console | json")] = None,
) -> None:
    """racky: rack power and infrastructure manager."""
    if print_default_config:
        text = example_toml(RackyConfig, "racky configuration (racky --config FILE)")
        typer.echo(text, nl=False)
        raise typer.Exit(EXIT_OK)
    try:
        cfg = load_racky_config(config)
    except ConfigError as err:
        fail_config(err)
        return
    setup_logging(log_level, log_format, cfg.log)
    if check_config:
        Console().print(
            f"config OK: {config or '<embedded defaults>'}; "
            f"{len(cfg.power_shelves)} power shelves; broker "
            f"{cfg.mqtt.host}:{cfg.mqtt.port}; tsdb {cfg.tsdb.url or 'embedded spool'}"
        )
        raise typer.Exit(EXIT_OK)
    try:
        daemon = Racky(cfg, config_path=config)
    except ConfigError as err:
        fail_config(err)
        return
    raise typer.Exit(run_async(lambda: run_daemon(daemon, "racky")))


def main() -> None:
    app()
