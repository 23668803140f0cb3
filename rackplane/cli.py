"""Shared command-line pieces of the daemons: config errors, logging, running the service.

The CLIs are built with typer (a maintained library, chosen over argparse boilerplate).
Exit codes: 0 ok, 1 runtime failure (e.g. dry connect could not read), 2 invalid config.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from enum import StrEnum
from typing import Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from rackplane.core.samples import Sample
from rackplane.errors import ConfigError
from rackplane.log import configure_logging

__all__ = [
    "EXIT_CONFIG",
    "EXIT_OK",
    "EXIT_RUNTIME",
    "LogFormat",
    "LogLevel",
    "fail_config",
    "run_async",
    "samples_table",
    "setup_logging",
    "typer_app",
]

EXIT_OK = 0
EXIT_RUNTIME = 1
EXIT_CONFIG = 2


def typer_app(**kw: Any) -> typer.Typer:
    """A typer application whose ``--help`` is plain text: every paragraph re-wrapped to the
    terminal's width (a docstring's own line breaks never show as a sentence cut in two) and
    no rich markup read in the help (``[log] level`` stays as written). A command's docstring
    after a line holding only ``\\f`` is for the code's readers, never shown. ``kw``: as
    ``typer.Typer`` (``add_completion`` is off)."""
    return typer.Typer(add_completion=False, rich_markup_mode=None, **kw)


def fail_config(err: ConfigError) -> None:
    """Print a config error (every key path) to stderr and exit 2."""
    msg = Text("config error", style="bold red")
    msg.append(f": {err}", style="")  # plain text: config paths contain [brackets]
    Console(stderr=True, soft_wrap=True).print(msg, highlight=False)
    sys.exit(EXIT_CONFIG)


class LogLevel(StrEnum):
    """The ``--log-level`` choices (typer refuses anything else with a clear error, exit 2)."""

    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


class LogFormat(StrEnum):
    """The ``--log-format`` choices."""

    auto = "auto"
    console = "console"
    json = "json"


def setup_logging(level: str | LogLevel | None, fmt: str | LogFormat | None,
                  cfg_log: Any) -> None:
    """Configure logging: the CLI flags win over the config's ``[log]`` table."""
    lvl = level.value if isinstance(level, LogLevel) else level
    form = fmt.value if isinstance(fmt, LogFormat) else fmt
    configure_logging(lvl or cfg_log.level, form or cfg_log.format)  # type: ignore[arg-type]


def run_async(main: Callable[[], Any]) -> int:
    """Run the daemon's async main; Ctrl-C before the handlers are installed exits quietly."""
    try:
        return int(asyncio.run(main()) or 0)
    except KeyboardInterrupt:
        return 130
    except OSError as err:  # e.g. a listening port already in use, at start
        Console(stderr=True, soft_wrap=True).print(f"cannot start: {err}", markup=False)
        return EXIT_RUNTIME


def samples_table(title: str, samples: list[Sample], ranges: dict[str, str]) -> Table:
    """A table of samples for --dry-connect: point, value, unit, quality, range verdict."""
    t = Table(title=title)
    for col in ("point", "value", "unit", "quality", "valid range", "verdict"):
        t.add_column(col)
    for s in samples:
        verdict = "ok" if s.usable else (s.reason or s.quality.value)
        value = "—" if s.value is None else f"{s.value:.6g}"
        t.add_row(s.point, value, s.unit, s.quality.value, ranges.get(s.point, ""), verdict)
    return t
