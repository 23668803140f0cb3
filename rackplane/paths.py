"""Where a daemon's files live: the one resolver of systemd's ``$STATE_DIRECTORY``.

Under systemd (``StateDirectory=``) a daemon's writable place is ``$STATE_DIRECTORY`` (a
``:``-separated list; the first entry is the daemon's own). A relative state path (the spool
folder, a state file, a report folder) lives there; outside systemd it is taken as given
(relative to the working directory). Absolute paths are always taken as given.

Pure functions of the path and the environment (``environ``: default `os.environ`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["in_state_directory", "is_in_state_directory", "state_directories",
           "state_directory"]


def state_directories(environ: Mapping[str, str] | None = None) -> list[Path]:
    """Every folder of ``$STATE_DIRECTORY``, in order (empty when unset)."""
    env = os.environ if environ is None else environ
    return [Path(d) for d in env.get("STATE_DIRECTORY", "").split(":") if d]


def state_directory(environ: Mapping[str, str] | None = None) -> Path | None:
    """The first folder of ``$STATE_DIRECTORY`` (the daemon's own), or None when unset."""
    dirs = state_directories(environ)
    return dirs[0] if dirs else None


def in_state_directory(path: Path, environ: Mapping[str, str] | None = None) -> Path:
    """``path`` absolute as given; relative: inside `state_directory` when set, else as
    given (the working directory)."""
    path = Path(path)
    if path.is_absolute():
        return path
    sd = state_directory(environ)
    return sd / path if sd is not None else path


def is_in_state_directory(folder: Path, environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``folder`` is one of the ``$STATE_DIRECTORY`` folders or inside one (systemd
    creates those; a daemon may create folders below them, nowhere else)."""
    f = Path(folder).absolute()
    for sd in state_directories(environ):
        a = sd.absolute()
        if f == a or a in f.parents:
            return True
    return False
