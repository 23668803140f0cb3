"""The one atomic file writer: a crash or power loss leaves the old or the new file, never
a torn one.

`write_atomic` writes a temporary file in the same folder (``.<name>.tmp-<pid>``), fsyncs it,
renames it over the target (`os.replace`), then fsyncs the folder so the rename itself is
durable.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["move_aside", "write_atomic"]


def write_atomic(path: Path, data: bytes | str, *, mode: int = 0o640) -> None:
    """Write ``data`` (str: UTF-8) to ``path`` atomically and durably.

    Args:
        path: the target file; its folder must exist.
        data: the whole new content.
        mode: permission bits of a new file (before the umask).

    Raises:
        OSError: the folder is missing or not writable, the disk is full, ... (the temporary
            file is removed; the old file is untouched).
    """
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
        try:
            view = memoryview(raw)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    dfd = os.open(path.parent, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def move_aside(path: Path, tag: str) -> Path:
    """Rename an unusable file to ``<name>.<tag>`` beside it (kept for an operator to look
    at) and return the new path.

    Raises:
        OSError: it could not be renamed.
    """
    path = Path(path)
    aside = path.with_name(f"{path.name}.{tag}")
    os.replace(path, aside)
    return aside
