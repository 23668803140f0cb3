"""rack-sim: run the virtual rack in real time behind real protocols, or list scenarios."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from rackplane.cli import LogFormat, LogLevel, fail_config, run_async, typer_app
from rackplane.errors import ConfigError
from rackplane.io.service import run_daemon
from rackplane.log import configure_logging
from rackplane.settings import Identity, MqttSettings
from sims.runtime import VirtualRackSimulator
from sims.scenario import FabricSpec, list_scenarios, load_scenario

__all__ = ["list_cmd", "main", "run"]

app = typer_app(help=__doc__, no_args_is_help=True)


@app.command("list", short_help="List the bundled scenarios.")
def list_cmd() -> None:
    """One bundled scenario a line: name, duration, description."""
    for s in list_scenarios():
        typer.echo(f"{s.name}\t{s.duration_s:g} s\t{s.description}")


@app.command(short_help="Run a scenario in real time.")
def run(
    scenario: Annotated[
        str, typer.Option("--scenario", "-s", help="bundled name or a TOML path")
    ] = "load-step",
    modbus_host: Annotated[
        str, typer.Option(help="listen address of the CDU's Modbus TCP")
    ] = "127.0.0.1",
    modbus_port: Annotated[int, typer.Option(help="Modbus TCP port (0: pick a free one)")] = 5020,
    unit_id: Annotated[int, typer.Option(min=0, max=255, help="the CDU's unit id")] = 1,
    shelf_modbus_port: Annotated[
        int, typer.Option(help="power shelves' Modbus TCP port (0: pick a free one; -1: none)")
    ] = 0,
    shelf_unit_base: Annotated[
        int, typer.Option(min=0, max=247, help="unit id of shelf 0; shelf i answers base+i")
    ] = 1,
    model: Annotated[
        str, typer.Option(help="rack: the whole virtual rack; cdu: the CDU model only")
    ] = "rack",
    fabric: Annotated[
        str | None, typer.Option(help="link fabric auto | on | off (default: the scenario's)")
    ] = None,
    telemetry_interval: Annotated[
        float, typer.Option(min=0.1, help="MQTT telemetry period, s")
    ] = 1.0,
    link_ports: Annotated[
        bool, typer.Option(help="include every GPU's link ports in telemetry/trayNN")
    ] = True,
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
    log_level: Annotated[LogLevel, typer.Option()] = LogLevel.info,
    log_format: Annotated[LogFormat, typer.Option()] = LogFormat.auto,
) -> None:
    """Run a scenario in real time: Modbus TCP CDU and power shelves; telemetry, ground truth
    and node-agent commands on MQTT when a broker is set (docs/SIMULATORS.md)."""
    configure_logging(log_level.value, log_format.value)
    try:
        if model not in ("rack", "cdu"):
            raise ValueError(f"--model must be rack or cdu, not {model!r}")
        if fabric is not None and fabric not in ("auto", "on", "off"):
            raise ValueError(f"--fabric must be auto, on or off, not {fabric!r}")
        sc = load_scenario(scenario)
        if fabric is not None:
            sc = sc.model_copy(update={"fabric": FabricSpec(
                enabled=fabric,
                step_s=sc.fabric.step_s if sc.fabric else 1.0,
            )})
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
        n_shelves = sc.power.shelves if sc.power else 8
        sim = VirtualRackSimulator(
            sc,
            modbus_host=modbus_host,
            modbus_port=modbus_port,
            unit_id=unit_id,
            shelf_modbus_port=None if shelf_modbus_port < 0 else shelf_modbus_port,
            shelf_unit_ids=list(range(shelf_unit_base, shelf_unit_base + n_shelves)),
            mqtt=mqtt,
            identity=ident,
            exit_at_end=exit_at_end,
            ground_truth_path=ground_truth,
            model=model,  # type: ignore[arg-type]
            telemetry_interval_s=telemetry_interval,
            link_ports=link_ports,
        )
    except ConfigError as err:
        fail_config(err)
        return
    except (ValueError, RuntimeError) as err:
        Console(stderr=True).print(f"cannot start the simulator: {err}", markup=False)
        raise typer.Exit(2) from None
    code = run_async(lambda: run_daemon(sim, "rack-sim"))
    raise typer.Exit(code)


def main() -> None:
    app()
