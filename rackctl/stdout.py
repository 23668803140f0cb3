"""rackctl's stdout when the reader leaves (``rackctl watch racky | head -5``).

A closed stdout ends a verb at once and quietly with status 141 (128 + SIGPIPE), as `yes`,
`cat` or `grep` end when ``| head`` closes the pipe: no traceback, no flood of errors. The
default SIGPIPE action is not restored instead: it would also kill rackctl on a broker socket
that closes while it writes."""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable
from typing import Any

EXIT_STDOUT_CLOSED = 141  # 128 + SIGPIPE


def run_closing_quietly(app: Callable[[], Any]) -> None:
    """Run the typer/click ``app``; when it ended because stdout was closed, exit 141.

    Typer's click turns a write's EPIPE into exit 1 with stdout replaced by a
    ``PacifyFlushWrapper`` (typer vendors click privately: matched by the replacement and its
    class name); that case becomes 141, with file descriptor 1 on /dev/null so the
    interpreter's last flush prints no BrokenPipeError (Python's recommended handling of EPIPE)."""
    before = sys.stdout
    try:
        app()
    except SystemExit:
        if sys.stdout is not before and type(sys.stdout).__name__ == "PacifyFlushWrapper":
            stdout_to_devnull()
            raise SystemExit(EXIT_STDOUT_CLOSED) from None
        raise


def stdout_to_devnull() -> None:
    """Point file descriptor 1 at /dev/null."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
    finally:
        os.close(devnull)


def write_lines(lines: list[str]) -> bool:
    """Write ``lines`` (each + newline) to stdout and flush; False when the reader closed the
    pipe (EPIPE). Streaming verbs call this from message handlers, whose exceptions the MQTT
    dispatcher logs and swallows, and end on False by raising `stdout_closed`."""
    try:
        for line in lines:
            sys.stdout.write(line + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        return False
    return True


def stdout_closed() -> OSError:
    """The error (EPIPE) that makes click end the CLI as on a closed stdout."""
    return OSError(errno.EPIPE, "stdout closed")
