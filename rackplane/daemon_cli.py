"""The command line every daemon shares, built once from a `DaemonCli` description.

Flags: ``--config/-c FILE`` (default: embedded defaults, which every daemon refuses: they name
no identity and no inputs, `rackplane.config.load_config`'s ``required``), ``--check-config``
(validate, print one summary line, exit 0; 2 when invalid, every problem named at once, one a
line; ``--check-config FILE`` is ``--config FILE --check-config``), ``--dry-connect`` (the daemon's
one-shot device read, exit 0 or 1), ``--print-default-config`` (every key with its default,
as TOML), ``--log-level`` and ``--log-format`` (default: the config's ``[log]``). Without any
of them the daemon runs (`rackplane.io.service.run_daemon`) until SIGTERM. Exit codes: 0 ok,
1 runtime failure, 2 invalid config (`rackplane.cli`).
"""

# No ``from __future__ import annotations`` here: typer reads the command's annotations at
# run time, and the ``--dry-connect`` help in them is the daemon's (a closure variable).
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Generic, TypeVar

import typer
from rich.console import Console

from rackplane.cli import (
    EXIT_OK,
    LogFormat,
    LogLevel,
    fail_config,
    run_async,
    setup_logging,
    typer_app,
)
from rackplane.config import example_toml
from rackplane.errors import ConfigError
from rackplane.io.service import Daemon, run_daemon
from rackplane.log import get_logger
from rackplane.settings import LogSettings

__all__ = ["DaemonCli", "daemon_app"]

L = TypeVar("L")
"""What a daemon's loader returns (its config, or its config with what was loaded beside it)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DaemonCli(Generic[L]):
    """What a daemon's command line needs to know.

    Args:
        name: the command (and console script) name.
        help: the command's help text.
        app_help: the application's help text (the CLI module's docstring).
        config_model: the config model (``--print-default-config``).
        load: config path (None: embedded defaults) -> loaded config; raises `ConfigError`
            with the key path.
        log_settings: the ``[log]`` section of what `load` returned.
        summary: the ``--check-config`` line for what `load` returned and the path.
        dry_connect: the one-shot device read; returns the exit code.
        dry_connect_help: the ``--dry-connect`` help text.
        build: what `load` returned and the path -> the daemon (may raise `ConfigError`).
        no_args_is_help: typer's option of the same name.
        warnings: what `load` returned -> plausibility warnings (values far outside their
            physical range, `rackplane.config_plausibility`): printed by ``--check-config`` (which
            still exits 0) and logged at start (``config_implausible``, once each).
    """

    name: str
    help: str
    app_help: str | None
    config_model: type[Any]
    load: Callable[[Path | None], L]
    log_settings: Callable[[L], LogSettings]
    summary: Callable[[L, Path | None], str]
    dry_connect: Callable[[L, Console], int]
    dry_connect_help: str
    build: Callable[[L, Path | None], Daemon]
    no_args_is_help: bool | None = None
    warnings: Callable[[L], list[str]] | None = None


def _config_file(config: Path | None, file: Path | None, check_config: bool) -> Path | None:
    """The config file: ``--config FILE``, or a bare FILE after ``--check-config``
    (``valvey --check-config FILE``).

    Raises:
        typer.BadParameter: a bare FILE without ``--check-config`` (the daemon takes its file
            by ``--config``), or one that differs from ``--config``'s (exit 2, usage error).
    """
    if file is None:
        return config
    if not check_config:
        raise typer.BadParameter(f"{file}: give the config file as --config {file} (a bare FILE "
                                 "is accepted after --check-config only)", param_hint="FILE")
    if config is not None and config != file:
        raise typer.BadParameter(f"two config files: --config {config} and {file}",
                                 param_hint="FILE")
    return file


def daemon_app(spec: DaemonCli[L]) -> typer.Typer:
    """The typer application of a daemon (see the module docstring)."""
    kw: dict[str, Any] = {}
    if spec.no_args_is_help is not None:
        kw["no_args_is_help"] = spec.no_args_is_help
    app = typer_app(help=spec.app_help, **kw)

    def command(
        file: Annotated[
            Path | None,
            typer.Argument(metavar="FILE", show_default=False,
                           help="with --check-config: the file to check (as --config FILE)"),
        ] = None,
        config: Annotated[
            Path | None,
            typer.Option("--config", "-c", help="TOML config file (default: embedded defaults)"),
        ] = None,
        check_config: Annotated[
            bool,
            typer.Option("--check-config", help="validate the config and exit (2 if invalid)"),
        ] = False,
        dry_connect: Annotated[
            bool, typer.Option("--dry-connect", help=spec.dry_connect_help)
        ] = False,
        print_default_config: Annotated[
            bool, typer.Option("--print-default-config", help="print every key with its default")
        ] = False,
        log_level: Annotated[LogLevel | None, typer.Option(help="default: [log] level")] = None,
        log_format: Annotated[LogFormat | None, typer.Option(help="default: [log] format")] = None,
    ) -> None:
        if print_default_config:
            text = example_toml(spec.config_model,
                                f"{spec.name} configuration ({spec.name} --config FILE)")
            typer.echo(text, nl=False)
            raise typer.Exit(EXIT_OK)
        config = _config_file(config, file, check_config)
        try:
            loaded = spec.load(config)
        except ConfigError as err:
            fail_config(err)
            return
        setup_logging(log_level, log_format, spec.log_settings(loaded))
        console = Console()
        implausible = spec.warnings(loaded) if spec.warnings is not None else []
        if check_config:
            for w in implausible:
                console.print(f"warning: {w}", highlight=False, markup=False)
            console.print(spec.summary(loaded, config), highlight=False, markup=False)
            raise typer.Exit(EXIT_OK)
        for w in implausible:
            get_logger(spec.name).warning("config_implausible", warning=w)
        if dry_connect:
            raise typer.Exit(spec.dry_connect(loaded, console))
        try:
            daemon = spec.build(loaded, config)
        except ConfigError as err:
            fail_config(err)
            return
        raise typer.Exit(run_async(lambda: run_daemon(daemon, spec.name)))

    command.__doc__ = spec.help
    app.command(name=spec.name)(command)
    return app
