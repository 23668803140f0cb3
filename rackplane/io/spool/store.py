"""`Spool`: opening (lock, repair, cursor), appending, rotation and the ``max_bytes`` bound
(reading and durability are in its base, `rackplane.io.spool.reading`); the format checks
`check_format` and `check_spool_config`."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rackplane.errors import ConfigError, SpoolError
from rackplane.io.spool.format import (
    _CHUNK_MIN,
    _CURSOR_FORMAT,
    _HEADER_RE,
    _SLOT_BYTES,
    CURSOR_FILE,
    FORMAT_VERSION,
    HEADER,
    HEADER_LEN,
    LOCK_FILE,
    Cursor,
    SpoolLockedError,
    SpoolWriteError,
    _cursor_crc,
    _LastRead,
    _why,
)
from rackplane.io.spool.reading import _SpoolFiles
from rackplane.log import get_logger
from rackplane.settings import SpoolSettings

__all__ = ["Spool", "check_format", "check_lock", "check_spool_config"]


class Spool(_SpoolFiles):
    """An append-only, bounded, rotated line-protocol spool in one directory.

    Args:
        directory: the spool folder (created when missing, unless ``readonly``).
        max_bytes: bound on all segments together (see the module docstring for the policy).
        segment_bytes: rotation size.
        readonly: read a spool another process may own (``rackctl replay``): no lock, no
            repair, no bound, never deletes a segment, ``append`` refused. Segments that
            appear or vanish meanwhile are followed.
        cursor_file: name of the cursor file in ``directory``; replay keeps its own
            (`REPLAY_CURSOR_FILE`) so it never moves the daemon's cursor.
        log: a structlog logger; default ``rackplane.io.spool``.

    Raises:
        SpoolError: the folder cannot be created or written, another process holds the spool,
            a segment or the cursor has another format version, or (``readonly``) the folder
            does not exist.
    """

    def __init__(
        self,
        directory: Path,
        *,
        max_bytes: int = 512 * 2**20,
        segment_bytes: int = 8 * 2**20,
        readonly: bool = False,
        cursor_file: str = CURSOR_FILE,
        log: Any = None,
    ):
        if segment_bytes <= HEADER_LEN:
            raise ValueError(f"segment_bytes must exceed the header ({HEADER_LEN} bytes)")
        if max_bytes < 2 * segment_bytes:
            raise ValueError("max_bytes must hold at least two segments (2 * segment_bytes)")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.readonly = readonly
        self._cursor_path = self.directory / cursor_file
        self._log = log if log is not None else get_logger("rackplane.io.spool")
        self._lock = threading.Lock()  # guards _fd and the fsync bookkeeping (fsync thread)
        self._lock_fd: int | None = None
        self._fd: int | None = None  # tail segment, O_APPEND
        self._ids: list[int] = []
        self._sizes: dict[int, int] = {}
        self._lines: dict[int, int] = {}  # records (newlines) per segment, writable mode
        self._checked: set[int] = set()  # readonly: segments whose header was checked
        self._cursor = Cursor(1, HEADER_LEN)
        self._depth = 0
        self._appended = 0
        self._acked = 0
        self._dropped = 0
        self._repaired = 0
        self._corrupt = 0
        self._last_read: _LastRead | None = None
        self._unsynced: set[Path] = set()
        self._dir_dirty = False
        self._cursor_dirty = False
        self._torn_tail = False
        self._closed = False
        self._cursor_write_failed = False
        self._cursor_fd: int | None = None
        self._cursor_seq = 0
        try:
            if readonly:
                self._open_readonly()
            else:
                self._open_writable()
        except BaseException:
            self._release()
            raise

    @classmethod
    def from_settings(cls, settings: SpoolSettings, **kwargs: Any) -> Spool:
        """A writable spool as configured (`SpoolSettings`; its folder resolved, see
        `rackplane.settings.effective_spool`).

        Raises:
            SpoolError: as the constructor; the folder unset.
        """
        if settings.directory is None:
            raise SpoolError("spool.directory unset: resolve it with effective_spool first")
        return cls(
            settings.directory,
            max_bytes=settings.max_bytes,
            segment_bytes=settings.segment_bytes,
            **kwargs,
        )

    # --- opening ---------------------------------------------------------------------------

    def _open_writable(self) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise SpoolError(f"cannot create spool folder {self.directory}: {err}") from None
        self._take_lock()
        ids = self._list_ids()
        for sid in ids:
            size = self._check_header(sid)
            if size is None:  # torn at creation: empty or a partial header
                self._remove_torn_segment(sid, ids)
                continue
            self._ids.append(sid)
            self._sizes[sid] = self._repair_tail(sid, size)
        for sid in self._ids:
            self._lines[sid] = self._count_records(sid, HEADER_LEN, self._sizes[sid])
        stored = self._load_cursor()
        next_id = max([*self._ids, stored.segment if stored else 0]) + 1
        if not self._ids:
            self._create_segment(max(next_id, 1))
        self._cursor = self._clamp_cursor(stored)
        self._open_tail()
        # Segments wholly before the cursor are acked: remove leftovers of an interrupted ack.
        self._normalise_and_delete()
        self._depth = sum(self._lines[s] for s in self._ids if s >= self._cursor.segment)
        if self._cursor.offset > HEADER_LEN:
            c = self._cursor
            self._depth -= self._count_records(c.segment, HEADER_LEN, c.offset)
        if stored != self._cursor:
            self._write_cursor()
        self._enforce_bound()
        if self._repaired:
            self._log.warning(
                "spool_repaired", directory=str(self.directory), repaired_bytes=self._repaired
            )

    def _open_readonly(self) -> None:
        if not self.directory.is_dir():
            raise SpoolError(f"no spool folder at {self.directory}")
        self._rescan()
        stored = self._load_cursor()
        self._cursor = self._clamp_cursor(stored)
        self._depth = self._count_depth()

    def _take_lock(self) -> None:
        path = self.directory / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as err:
            raise SpoolError(f"spool folder {self.directory} is not writable: {err}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            try:
                owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            except OSError:
                owner = "unknown"
            os.close(fd)
            raise SpoolLockedError(
                f"spool {self.directory} is in use by another process (pid {owner}); "
                "one writer per spool folder", owner
            ) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as err:
            os.close(fd)
            raise SpoolError(f"spool folder {self.directory} is not writable: {err}") from None
        self._lock_fd = fd


    def _check_header(self, sid: int) -> int | None:
        """Size of segment ``sid`` after checking its header; None when torn at creation."""
        path = self._path(sid)
        try:
            with path.open("rb") as fh:
                head = fh.read(64)
                size = os.fstat(fh.fileno()).st_size
        except OSError as err:
            raise SpoolError(f"cannot read spool segment {path}: {err}") from None
        stripped = head.rstrip(b"\x00")
        if len(stripped) < HEADER_LEN and HEADER.startswith(stripped):
            return None  # created but its header never reached the disk (crash, power loss)
        m = _HEADER_RE.match(head)
        if m is None:
            raise SpoolError(
                f"{path} is not a rackplane spool segment (no '# rackplane-spool vN' header); "
                "move it out of the spool folder"
            )
        version = int(m.group(1))
        if version != FORMAT_VERSION:
            raise SpoolError(
                f"{path} was written in spool format v{version}; this rackplane reads "
                f"v{FORMAT_VERSION} only. Run the rackplane version that wrote it to drain or "
                "replay it, or move the spool folder aside"
            )
        return size

    def _remove_torn_segment(self, sid: int, ids: list[int]) -> None:
        path = self._path(sid)
        try:
            size = path.stat().st_size
            path.unlink()
        except OSError as err:
            raise SpoolError(f"cannot repair spool segment {path}: {err}") from None
        self._repaired += size
        self._log.warning("spool_torn_segment_removed", segment=str(path), bytes=size)

    def _repair_tail(self, sid: int, size: int) -> int:
        """Cut a segment back to its last complete line; returns the new size."""
        if size <= HEADER_LEN:
            return size
        path = self._path(sid)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as err:
            raise SpoolError(f"cannot open spool segment {path}: {err}") from None
        try:
            if os.pread(fd, 1, size - 1) == b"\n":
                return size
            end = size
            keep = HEADER_LEN
            while end > HEADER_LEN:
                start = max(HEADER_LEN, end - _CHUNK_MIN)
                chunk = os.pread(fd, end - start, start)
                nl = chunk.rfind(b"\n")
                if nl >= 0:
                    keep = start + nl + 1
                    break
                end = start
            os.ftruncate(fd, keep)
            os.fsync(fd)
        except OSError as err:
            raise SpoolError(f"cannot repair spool segment {path}: {err}") from None
        finally:
            os.close(fd)
        self._repaired += size - keep
        self._log.warning("spool_torn_line_cut", segment=str(path), bytes=size - keep)
        return keep

    def _load_cursor(self) -> Cursor | None:
        """The newest valid cursor slot, None when there is none (start from the oldest)."""
        try:
            raw = self._cursor_path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as err:
            raise SpoolError(f"cannot read spool cursor {self._cursor_path}: {err}") from None
        best: tuple[int, Cursor] | None = None
        for slot in (0, 1):
            rec = raw[slot * _SLOT_BYTES : (slot + 1) * _SLOT_BYTES].strip(b" \n\x00")
            if not rec:
                continue
            try:
                data = json.loads(rec)
                fmt, version = data["format"], int(data["version"])
            except (ValueError, KeyError, TypeError):
                continue  # torn slot: the other one holds the previous position
            if fmt != _CURSOR_FORMAT or version != FORMAT_VERSION:
                raise SpoolError(
                    f"{self._cursor_path} holds a {fmt} v{version} cursor; this rackplane "
                    f"reads {_CURSOR_FORMAT} v{FORMAT_VERSION} only. Run the rackplane version "
                    "that wrote it, or move the spool folder aside"
                )
            try:
                seq, sid, off = int(data["seq"]), int(data["segment"]), int(data["offset"])
                ok = int(data["crc"]) == _cursor_crc(seq, sid, off)
            except (KeyError, TypeError, ValueError):
                ok = False
            if ok and (best is None or seq > best[0]):
                best = (seq, Cursor(sid, off))
        if best is None:
            if raw.strip(b" \n\x00"):
                # Both slots torn (power loss): resend from the oldest line rather than lose
                # anything (at-least-once).
                self._log.warning("spool_cursor_unreadable", path=str(self._cursor_path))
            return None
        self._cursor_seq = best[0]
        return best[1]


    def _create_segment(self, sid: int) -> None:
        path = self._path(sid)
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC
            fd = os.open(path, flags, 0o644)
        except OSError as err:
            raise SpoolError(f"cannot create spool segment {path}: {_why(err)}") from None
        try:
            if os.write(fd, HEADER) != HEADER_LEN:
                raise OSError(errno.ENOSPC, "short write")
        except OSError as err:
            os.close(fd)
            with contextlib.suppress(OSError):
                path.unlink()
            raise SpoolError(f"cannot create spool segment {path}: {_why(err)}") from None
        with self._lock:
            old = self._fd
            self._fd = fd
            if self._ids:
                self._unsynced.add(self._path(self._ids[-1]))
            self._dir_dirty = True
        if old is not None:
            os.close(old)
        self._ids.append(sid)
        self._sizes[sid] = HEADER_LEN
        self._lines[sid] = 0

    def _open_tail(self) -> None:
        if self._fd is not None:
            return
        path = self._path(self._ids[-1])
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        except OSError as err:
            raise SpoolError(f"cannot open spool segment {path}: {_why(err)}") from None
        with self._lock:
            self._fd = fd

    # --- appending -------------------------------------------------------------------------

    def append(self, lines: Sequence[str]) -> int:
        """Append complete lines (no trailing newline each) and hand them to the OS now.

        Returns the number of lines appended (``len(lines)``).

        Raises:
            ValueError: a line is empty or contains a newline.
            SpoolWriteError: the disk is full or the segment unwritable; ``lines_written``
                leading lines were appended, the rest were not (no partial line is left).
            SpoolError: the spool is read-only or closed.
        """
        if not lines:
            return 0
        if self.readonly or self._closed:
            raise SpoolError("spool is read-only or closed")
        data = ("\n".join(lines) + "\n").encode()
        if data.count(b"\n") != len(lines) or b"\n\n" in data or data.startswith(b"\n"):
            raise ValueError("spool lines must be non-empty and contain no newline")
        if self._torn_tail:
            self._truncate_tail()
        tail = self._ids[-1]
        try:
            if self._sizes[tail] + len(data) <= self.segment_bytes:
                self._write(data, len(lines), 0)
            else:
                self._append_split(lines)
        except SpoolWriteError as err:
            self._appended += err.lines_written
            self._depth += err.lines_written
            with contextlib.suppress(SpoolError):
                self._enforce_bound()
            raise
        self._appended += len(lines)
        self._depth += len(lines)
        self._enforce_bound()
        return len(lines)

    def _append_split(self, lines: Sequence[str]) -> None:
        """Slow path: the batch crosses a segment boundary (rotate between whole lines)."""
        done = 0
        chunk: list[bytes] = []
        chunk_bytes = 0
        for line in lines:
            b = line.encode() + b"\n"
            room = self.segment_bytes - self._sizes[self._ids[-1]] - chunk_bytes
            if len(b) > room and (chunk or self._sizes[self._ids[-1]] > HEADER_LEN):
                if chunk:
                    self._write(b"".join(chunk), len(chunk), done)
                    done += len(chunk)
                    chunk, chunk_bytes = [], 0
                self._rotate(done)
            chunk.append(b)
            chunk_bytes += len(b)
        if chunk:
            self._write(b"".join(chunk), len(chunk), done)

    def _rotate(self, done: int) -> None:
        try:
            self._create_segment(self._ids[-1] + 1)
        except SpoolError as err:
            raise SpoolWriteError(str(err), done) from None

    def _write(self, data: bytes, n_lines: int, done: int) -> None:
        tail = self._ids[-1]
        fd = self._fd
        assert fd is not None
        start = self._sizes[tail]
        view = memoryview(data)
        try:
            while view:
                n = os.write(fd, view)
                if n <= 0:
                    raise OSError(errno.ENOSPC, "no progress")
                view = view[n:]
        except OSError as err:
            try:
                os.ftruncate(fd, start)
            except OSError:
                self._torn_tail = True  # cut before the next append (or at the next open)
            raise SpoolWriteError(
                f"cannot append to spool segment {self._path(tail)}: {_why(err)}", done
            ) from None
        self._sizes[tail] = start + len(data)
        self._lines[tail] += n_lines

    def _truncate_tail(self) -> None:
        tail = self._ids[-1]
        assert self._fd is not None
        try:
            os.ftruncate(self._fd, self._sizes[tail])
        except OSError as err:
            msg = f"cannot repair spool segment {self._path(tail)}: {_why(err)}"
            raise SpoolWriteError(msg, 0) from None
        self._torn_tail = False

    def _enforce_bound(self) -> None:
        if self.readonly:
            return
        total = sum(self._sizes.values())
        while total > self.max_bytes and len(self._ids) > 1:
            oldest = self._ids[0]
            lost = 0
            if self._cursor.segment <= oldest:
                later = sum(self._lines[s] for s in self._ids[1:])
                lost = max(0, self._depth - later)
            path = self._path(oldest)
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError as err:
                raise SpoolError(f"cannot remove spool segment {path}: {err}") from None
            total -= self._sizes.pop(oldest)
            self._lines.pop(oldest)
            self._ids.pop(0)
            with self._lock:
                self._unsynced.discard(path)
                self._dir_dirty = True
            self._dropped += lost
            self._depth -= lost
            if self._cursor.segment <= oldest:
                self._cursor = Cursor(self._ids[0], HEADER_LEN)
                self._last_read = None
                self._write_cursor_quietly()
            self._log.warning(
                "spool_bound_dropped",
                segment=str(path),
                lines_dropped=lost,
                max_bytes=self.max_bytes,
            )


    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_format(directory: Path) -> None:
    """Check that the spool in ``directory`` is one this build reads, without opening it for
    writing (no lock, no repair, nothing changed): for ``--check-config``, so an upgrade or a
    rollback across a spool format change is reported before the daemon starts.

    A missing or empty folder passes. A segment torn at creation (empty or partial header)
    passes: opening repairs it.

    Raises:
        SpoolError: a segment or the cursor of another format version (both versions named),
            a foreign file named like a segment, or an unreadable file.
    """
    d = Path(directory)
    if not d.is_dir():
        return
    sp = Spool(d, readonly=True)  # reads (and checks) the cursor; never writes it
    try:
        for sid in sp._list_ids():  # every segment-named file, short ones included
            path = sp._path(sid)
            try:
                with path.open("rb") as fh:
                    head = fh.read(64)
            except FileNotFoundError:
                continue
            except OSError as err:
                raise SpoolError(f"cannot read spool segment {path}: {err}") from None
            stripped = head.rstrip(b"\x00")
            if len(stripped) < HEADER_LEN and HEADER.startswith(stripped):
                continue
            m = _HEADER_RE.match(head)
            if m is None:
                raise SpoolError(
                    f"{path} is not a rackplane spool segment (no '# rackplane-spool vN' "
                    "header); move it out of the spool folder"
                )
            if int(m.group(1)) != FORMAT_VERSION:
                raise SpoolError(
                    f"{path} was written in spool format v{int(m.group(1))}; this rackplane "
                    f"reads v{FORMAT_VERSION} only. Run the rackplane version that wrote it to "
                    "drain or replay it, or move the spool folder aside"
                )
    finally:
        sp.close()


def check_lock(directory: Path) -> None:
    """Check that no other process holds the spool in ``directory`` (for ``--check-config``):
    takes and at once releases a shared lock on its lock file; creates nothing. A lock this
    process holds (its pid in the lock file: a reload re-checking the config) is fine.

    Raises:
        SpoolLockedError: another process (a running daemon) holds it.
    """
    path = Path(directory) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return  # no lock file (or unreadable: the open for writing will say so)
    try:
        try:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        except OSError:
            owner = "unknown"
        if owner == str(os.getpid()):
            return  # this process's own writer (a reload re-checks the config)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            raise SpoolLockedError(
                f"spool {directory} is in use by another process (pid {owner}): another "
                "daemon for the same spool folder is running (one writer per spool folder; "
                "leave spool.directory unset for a folder per daemon and rack, or give each "
                "daemon its own). Expected only if pid "
                f"{owner} is this daemon's running instance", owner) from None
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def check_spool_config(key: str, directory: Path) -> None:
    """`check_format` and `check_lock` for config loading (``--check-config``): one line in a
    daemon's loader, ``check_spool_config("spool.directory", effective_spool(cfg.spool,
    daemon=..., identity=cfg.identity).directory)``.

    Raises:
        ConfigError: naming ``key``, with the `SpoolError`'s message.
    """
    try:
        check_format(directory)
        check_lock(directory)
    except SpoolError as err:
        msg = f"{key}: {err}"
        raise ConfigError(f"invalid configuration:\n  {msg}", problems=[msg]) from None


