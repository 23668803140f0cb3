"""The spool's on-disk format: segment names and header, the cursor, stats, errors and the
CRC of the cursor slots; the layout is the `rackplane.io.spool`
docstring's."""

from __future__ import annotations

import errno
import re
import zlib
from dataclasses import dataclass

from rackplane.errors import SpoolError

__all__ = [
    "CURSOR_FILE",
    "FORMAT_VERSION",
    "HEADER",
    "HEADER_LEN",
    "LOCK_FILE",
    "REPLAY_CURSOR_FILE",
    "Cursor",
    "SpoolLockedError",
    "SpoolStats",
    "SpoolWriteError",
    "segment_name",
]

FORMAT_VERSION = 1
"""Spool format version written in every segment header and in the cursor file."""

HEADER = f"# rackplane-spool v{FORMAT_VERSION}\n".encode()
HEADER_LEN = len(HEADER)
CURSOR_FILE = "cursor"
REPLAY_CURSOR_FILE = "replay-cursor"
LOCK_FILE = ".lock"

_HEADER_RE = re.compile(rb"^# rackplane-spool v(\d+)\n")
_SEGMENT_RE = re.compile(r"^seg-(\d{16})\.lp$")
_CHUNK_MIN = 64 * 1024
_CHUNK_MAX = 8 * 2**20
_CURSOR_FORMAT = "rackplane-spool-cursor"
_SLOT_BYTES = 512  # two cursor slots, one disk sector each


def segment_name(segment_id: int) -> str:
    """File name of segment ``segment_id`` (``seg-<16 digits>.lp``)."""
    return f"seg-{segment_id:016d}.lp"


@dataclass(frozen=True, order=True, slots=True)
class Cursor:
    """A position in the spool: byte ``offset`` inside segment ``segment`` (ordered)."""

    segment: int
    offset: int


@dataclass(frozen=True, slots=True)
class SpoolStats:
    """A snapshot of the spool.

    Attributes:
        depth_lines: lines not yet acked (exact, counted at open and kept since).
        depth_bytes: bytes of those lines.
        appended_lines: lines appended by this process.
        acked_lines: lines acked by this process.
        dropped_by_bound: unacked lines removed by the ``max_bytes`` bound by this process.
        segments: segment files present.
        total_bytes: size of all segments (headers included), what ``max_bytes`` bounds.
        repaired_bytes: bytes of torn lines cut off at open.
        corrupt_lines: records skipped on read (NUL bytes, invalid UTF-8).
    """

    depth_lines: int
    depth_bytes: int
    appended_lines: int
    acked_lines: int
    dropped_by_bound: int
    segments: int
    total_bytes: int
    repaired_bytes: int
    corrupt_lines: int


class SpoolWriteError(SpoolError):
    """An append failed part way. ``lines_written`` leading lines of the call were appended
    (and stay); the rest were not (the segment was truncated back to whole lines)."""

    def __init__(self, message: str, lines_written: int):
        self.lines_written = lines_written
        super().__init__(message)


class SpoolLockedError(SpoolError):
    """The spool folder's lock is held by another process (``owner``: its pid as written in
    the lock file, or "unknown")."""

    def __init__(self, message: str, owner: str):
        self.owner = owner
        super().__init__(message)


@dataclass(slots=True)
class _LastRead:
    start: Cursor
    end: Cursor
    records: int




def _cursor_crc(seq: int, segment: int, offset: int) -> int:
    return zlib.crc32(f"{seq}:{segment}:{offset}".encode())


def _why(err: OSError) -> str:
    if err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return f"disk full ({err.strerror or err})"
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"not writable ({err.strerror or err})"
    return str(err)
