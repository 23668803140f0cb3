"""A small versioned, atomically written JSON state file (issue 7: persisted state survives a
restart; an upgrade or a rollback reads or refuses it clearly).

For state a daemon must keep across restarts that is not telemetry, e.g. valvey's setpoint and
loop mode set by command (so a restart does not silently revert an operator's decision).
racky's `racky.persist.StateStore` follows the same rules for its own document.

Document::

    {"format": "<name>", "version": <int>, "saved_wall_ns": <int>, "data": {...}}

- **Atomic** (`rackplane.io.files.write_atomic`): written to a temporary file in the same
  folder, fsynced, renamed over the old one, then the folder fsynced: a crash or power loss
  leaves the old or the new document, never a mix.
- **Versioned**: a document of a *newer* version (a rollback) is refused with
  `StateVersionError` naming both versions; an *older* one (an upgrade) is converted by the
  caller's ``migrations`` (``{old_version: fn(data) -> data of old_version + 1}``) or refused
  when no migration covers it. Never misread.
- **Damaged** (not JSON, wrong format name, no ``data`` object): `StateFileError`; `load`
  leaves the file in place so an operator can look at it, `load_or_default` moves it aside
  (``<name>.bad-<wall_ns>``) and returns the default, logging why.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rackplane.core.envelope import finite_int
from rackplane.errors import RackplaneError
from rackplane.io.files import move_aside, write_atomic
from rackplane.log import get_logger

__all__ = ["StateFile", "StateFileError", "StateVersionError"]

Migration = Callable[[dict[str, Any]], dict[str, Any]]


class StateFileError(RackplaneError):
    """A state file that cannot be read or written (the message names the file and why)."""


class StateVersionError(StateFileError):
    """A state file of a version this build cannot read (upgrade without migration, or
    rollback). ``found`` and ``supported`` are the two versions."""

    def __init__(self, message: str, found: int, supported: int):
        self.found = found
        self.supported = supported
        super().__init__(message)


class StateFile:
    """One versioned JSON document at ``path``.

    Args:
        path: the file (its folder must exist and be writable to save).
        fmt: the document's format name (a file of another format is refused).
        version: the version this build writes and reads.
        migrations: ``{v: fn}`` converting the ``data`` of version ``v`` to ``v + 1``.
        log: a structlog logger; default ``rackplane.io.statefile``.
    """

    def __init__(
        self,
        path: Path,
        fmt: str,
        version: int,
        *,
        migrations: Mapping[int, Migration] | None = None,
        log: Any = None,
    ):
        if version < 1:
            raise ValueError("version must be >= 1")
        self.path = Path(path)
        self.fmt = fmt
        self.version = version
        self.migrations = dict(migrations or {})
        self._log = log if log is not None else get_logger("rackplane.io.statefile")
        self.saves = 0

    def load(self) -> dict[str, Any] | None:
        """The ``data`` object (migrated to `version`), or None when there is no file.

        Raises:
            StateVersionError: newer version (rollback) or older without a migration.
            StateFileError: unreadable, not JSON, another format, or no ``data`` object.
        """
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as err:
            raise StateFileError(f"cannot read state file {self.path}: {err}") from None
        try:
            # no integer a double cannot hold: a 400-digit one made float() raise at start
            doc = json.loads(text, parse_int=finite_int)
        except ValueError as err:
            raise StateFileError(f"state file {self.path} is not JSON ({err})") from None
        if not isinstance(doc, dict) or doc.get("format") != self.fmt:
            got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
            raise StateFileError(
                f"state file {self.path} is not a {self.fmt!r} document (format {got!r})"
            )
        found = doc.get("version")
        data = doc.get("data")
        if not isinstance(found, int) or isinstance(found, bool) or found < 1:
            raise StateFileError(f"state file {self.path} has no valid version ({found!r})")
        if not isinstance(data, dict):
            raise StateFileError(f"state file {self.path} has no 'data' object")
        if found > self.version:
            raise StateVersionError(
                f"state file {self.path} was written by a newer rackplane (format "
                f"{self.fmt!r} v{found}); this one reads v{self.version} and older. Upgrade "
                f"again, or move the file aside to start from the configuration",
                found, self.version,
            )
        v = found
        while v < self.version:
            step = self.migrations.get(v)
            if step is None:
                raise StateVersionError(
                    f"state file {self.path} is format {self.fmt!r} v{found}; this rackplane "
                    f"reads v{self.version} and has no conversion from v{v}. Move the file "
                    f"aside to start from the configuration",
                    found, self.version,
                )
            data = step(data)
            v += 1
        if found != self.version:
            self._log.info("state_file_migrated", path=str(self.path), from_version=found,
                           to_version=self.version)
        return data

    def load_or_default(self, default: dict[str, Any], wall_ns: int) -> dict[str, Any]:
        """`load`, or ``default`` when there is no file. A damaged file or one of an unreadable
        version is moved aside (``<name>.bad-<wall_ns>``) and logged; ``default`` returned.
        Never raises for the file's content."""
        try:
            data = self.load()
        except StateFileError as err:
            aside = self.move_aside(wall_ns)
            self._log.error("state_file_unusable", path=str(self.path), error=str(err),
                            moved_to=str(aside), effect="starting from the configuration")
            return dict(default)
        return dict(default) if data is None else data

    def move_aside(self, wall_ns: int) -> Path:
        """Move an unusable file aside to ``<name>.bad-<wall_ns>`` (best effort: a file that
        cannot be moved stays) and return that name."""
        aside = self.path.with_name(f"{self.path.name}.bad-{wall_ns}")
        with contextlib.suppress(OSError):
            aside = move_aside(self.path, f"bad-{wall_ns}")
        return aside

    def save(self, data: Mapping[str, Any], wall_ns: int) -> None:
        """Write ``data`` atomically (temporary file, fsync, rename, folder fsync).

        Raises:
            StateFileError: the folder is not writable, the disk is full, or ``data`` is not
                JSON-serialisable (the old file is then untouched).
        """
        doc = {"format": self.fmt, "version": self.version, "saved_wall_ns": wall_ns,
               "data": dict(data)}
        try:
            text = json.dumps(doc, indent=1, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as err:
            raise StateFileError(f"state for {self.path} is not JSON-serialisable: {err}") from None
        try:
            write_atomic(self.path, text)
        except OSError as err:
            raise StateFileError(f"cannot write state file {self.path}: {err}") from None
        self.saves += 1
