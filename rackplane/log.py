"""Logging with structlog: a console renderer on a TTY, JSON lines otherwise (journald-friendly).

Every module gets its logger with ``get_logger(__name__)`` and logs events as
``log.info("event_name", key=value, ...)``: the event name is stable and greppable, the
values are fields. State changes are logged once per change, never once per cycle.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Literal

import structlog

__all__ = ["configure_logging", "get_logger"]

_configured = False


class _Stderr:
    """``sys.stderr`` as it is at each write, not as it was at configuration: a stream that
    was replaced (and closed) since, as test runners do, never receives a log line."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()


def configure_logging(
    level: str = "info",
    fmt: Literal["auto", "console", "json"] = "auto",
    stream: Any = None,
) -> None:
    """Configure structlog and the stdlib root logger (library warnings go through it).

    Args:
        level: ``debug``, ``info``, ``warning`` or ``error``.
        fmt: ``console`` (coloured, for people), ``json`` (one object per line), or ``auto``:
            console when ``stream`` is a TTY, else JSON.
        stream: where to write; default stderr (the current ``sys.stderr`` at every write).
    """
    global _configured
    stream = stream or _Stderr()
    if fmt == "auto":
        fmt = "console" if getattr(stream, "isatty", lambda: False)() else "json"
    lvl = getattr(logging, level.upper())
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any
    if fmt == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=getattr(stream, "isatty", lambda: False)())
    else:
        renderer = structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )
    # Libraries (pymodbus, paho, amqtt) log through the stdlib: keep their warnings, in our format.
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder()],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(lvl, logging.WARNING))
    _configured = True


def get_logger(name: str, **bound: Any) -> Any:
    """A structlog logger bound with ``logger=name`` and any extra context."""
    return structlog.get_logger(name).bind(logger=name, **bound)
