"""rackctl: the operator's CLI (demo, replay of the embedded store, lock-step runs)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from rackplane.cli import EXIT_CONFIG, EXIT_RUNTIME, fail_config
from rackplane.errors import ConfigError, SpoolError
from rackplane.log import configure_logging
from rackplane.settings import TsdbSettings

app = typer.Typer(add_completion=False, help=__doc__, no_args_is_help=True)


@app.command()
def demo(
    duration: Annotated[
        float | None,
        typer.Option("--duration", min=5, help="seconds to run (default: the scenario's length)"),
    ] = None,
    scenario: Annotated[str, typer.Option(help="bundled scenario name or TOML path")] = "load-step",
    broker: Annotated[
        str | None,
        typer.Option(help="HOST:PORT of a Mosquitto to use instead of the embedded broker"),
    ] = None,
    out: Annotated[Path, typer.Option(help="folder for the run's outputs")] = Path("demo-output"),
) -> None:
    """Run valvey against the CDU simulator on embedded defaults, live, then summarise."""
    from rackctl.demo import print_summary, run_demo

    configure_logging("warning", "console")
    console = Console()
    try:
        summary = asyncio.run(
            run_demo(
                scenario=scenario, duration_s=duration, broker=broker, out_root=out, console=console
            )
        )
    except ConfigError as err:
        fail_config(err)
        return
    except RuntimeError as err:
        console.print(f"[red]demo failed: {err}[/]")
        raise typer.Exit(EXIT_RUNTIME) from None
    print_summary(summary, console)
    if summary.valvey_exit_code not in (0, None):
        raise typer.Exit(EXIT_RUNTIME)


@app.command()
def replay(
    spool: Annotated[Path, typer.Argument(help="spool / embedded-store folder")],
    url: Annotated[str, typer.Option(help="InfluxDB URL, e.g. http://influx:8086")],
    org: Annotated[str, typer.Option()] = "rackplane",
    bucket: Annotated[str, typer.Option()] = "rackplane",
    token_env: Annotated[str | None, typer.Option(help="env var holding the API token")] = None,
) -> None:
    """Send a spool (the embedded store) to an InfluxDB v2 write API."""
    from rackplane.tsdb import replay as do_replay

    configure_logging("warning", "console")
    try:
        settings = TsdbSettings(url=url, org=org, bucket=bucket, token_env=token_env)
    except ValueError as err:
        Console(stderr=True).print(f"invalid option: {err}", markup=False)
        raise typer.Exit(EXIT_CONFIG) from None
    console = Console()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("replaying", total=None)

        def on_progress(*args: object, **kwargs: object) -> None:
            done = args[0] if args else kwargs.get("sent", 0)
            progress.update(task, completed=done if isinstance(done, int | float) else 0)

        try:
            result = asyncio.run(do_replay(spool, settings, progress=on_progress))
        except ConfigError as err:
            fail_config(err)
            return
        except SpoolError as err:
            Console(stderr=True).print(f"replay failed: {err}", markup=False)
            raise typer.Exit(EXIT_CONFIG) from None
    fields = result.__dict__ if hasattr(result, "__dict__") else {
        k: getattr(result, k) for k in getattr(result, "__slots__", ())
    }
    table = Table(title=f"replay of {spool} to {url}")
    table.add_column("")
    table.add_column("value")
    for k, v in fields.items():
        table.add_row(k.replace("_", " "), str(v))
    console.print(table)


@app.command()
def lockstep(
    scenario: Annotated[
        str, typer.Argument(help="bundled scenario name or TOML path")
    ] = "load-step",
    config: Annotated[Path | None, typer.Option("--config", "-c", help="valvey config")] = None,
) -> None:
    """Run a scenario with valvey's core in lock-step (no sockets) and print its figures."""
    from rackctl.lockstep import run_valvey
    from sims.metrics import step_metrics, valve_activity
    from sims.scenario import load_scenario
    from valvey.app import load_valvey_config

    try:
        sc = load_scenario(scenario)
        cfg, _ = load_valvey_config(config)
    except ConfigError as err:
        fail_config(err)
        return
    console = Console()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"{sc.name} in lock-step", total=1.0)
        res = run_valvey(sc, cfg, progress=lambda f: progress.update(task, completed=f))
    tr = res.trace
    figures: dict[str, Any] = {}
    ld = sc.load
    if ld.kind == "step" and ld.step_at_s is not None:
        figures["step_up"] = step_metrics(
            tr.t_s, tr.supply_temp_c, tr.setpoint_c, ld.step_at_s, ld.back_at_s
        ).as_dict()
        if ld.back_at_s is not None:
            figures["step_down"] = step_metrics(
                tr.t_s, tr.supply_temp_c, tr.setpoint_c, ld.back_at_s
            ).as_dict()
    figures["valve"] = valve_activity(res.control_periods_cmd, res.loop_period_s).__dict__
    figures["max_gpu_tj_c"] = max(tr.hottest_gpu_tj_c)
    figures["alarm_events"] = res.alarm_events
    def rounded(x: Any) -> Any:
        if isinstance(x, float):
            return round(x, 3)
        if isinstance(x, dict):
            return {k: rounded(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [rounded(v) for v in x]
        return x

    console.print_json(json.dumps(rounded(figures), default=str))


def main() -> None:
    app()
