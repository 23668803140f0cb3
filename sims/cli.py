"""rack-sim: run the simulators in real time behind real protocols, or list scenarios."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from rackplane.cli import fail_config, run_async
from rackplane.errors import ConfigError
from rackplane.log import configure_logging
from rackplane.service import run_daemon
from rackplane.settings import Identity, MqttSettings
from sims.runtime import CduSimulator
from sims.scenario import list_scenarios, load_scenario

app = typer.Typer(add_completion=False, help=__doc__, no_args_is_help=True)


@app.command("list")
def list_cmd() -> None:
    """One bundled scenario a line: name, duration, description."""
    for s in list_scenarios():
        typer.echo(f"{s.name}\t{s.duration_s:g} s\t{s.description}")


@app.command()
def run(
    scenario: Annotated[
        str, typer.Option("--scenario", "-s", help="bundled name or a TOML path")
    ] = "load-step",
    modbus_host: Annotated[
        str, typer.Option(help="listen address of the CDU's Modbus TCP")
    ] = "127.0.0.1",
    modbus_port: Annotated[int, typer.Option(help="Modbus TCP port (0: pick a free one)")] = 5020,
    unit_id: Annotated[int, typer.Option(min=0, max=255)] = 1,
    mqtt_host: Annotated[
        str | None, typer.Option(help="broker for plant telemetry (none: off)")
    ] = None,
    mqtt_port: Annotated[int, typer.Option()] = 1883,
    mqtt_protocol: Annotated[str, typer.Option(help="3.1.1 or 5")] = "5",
    site: Annotated[str, typer.Option()] = "lab",
    row: Annotated[str, typer.Option()] = "row1",
    rack: Annotated[str, typer.Option()] = "rack1",
    exit_at_end: Annotated[bool, typer.Option(help="exit when the scenario ends")] = False,
    ground_truth: Annotated[
        Path | None, typer.Option(help="write injected faults (JSON) here")
    ] = None,
    log_level: Annotated[str, typer.Option()] = "info",
    log_format: Annotated[str, typer.Option(help="auto | console | json")] = "auto",
) -> None:
    """Run a scenario in real time: a Modbus TCP CDU, plant truth on MQTT if a broker is set."""
    configure_logging(log_level, log_format)  # type: ignore[arg-type]
    try:
        sc = load_scenario(scenario)
        ident = Identity(site=site, row=row, rack=rack)
        mqtt = (
            MqttSettings(host=mqtt_host, port=mqtt_port, protocol=mqtt_protocol, clean_session=True)
            if mqtt_host
            else None
        )
    except ConfigError as err:
        fail_config(err)
        return
    except ValueError as err:
        Console(stderr=True).print(f"invalid option: {err}", markup=False)
        raise typer.Exit(2) from None
    try:
        sim = CduSimulator(
            sc,
            modbus_host=modbus_host,
            modbus_port=modbus_port,
            unit_id=unit_id,
            mqtt=mqtt,
            identity=ident,
            exit_at_end=exit_at_end,
            ground_truth_path=ground_truth,
        )
    except ConfigError as err:
        fail_config(err)
        return
    code = run_async(lambda: run_daemon(sim, "rack-sim"))
    raise typer.Exit(code)


def main() -> None:
    app()
