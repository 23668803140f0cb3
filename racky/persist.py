"""racky's persisted state on disk: `StateStore` loads and saves
`racky.core.lifecycle.PersistedState` (lifecycle, trays powered off by safety requests, budget
override, last validation).

One JSON document, versioned (``format``, ``version``), written atomically
(`rackplane.io.files.write_atomic`: temporary file in the same directory, fsync, rename, fsync of
the directory) so a crash leaves the old or the new file, never a torn one. An unreadable or
foreign file is moved aside (``<name>.corrupt-<ns>``) and racky starts in ``maintenance``
(never ``production`` on a guess), saying why. The file's folder is never created, except
inside systemd's ``$STATE_DIRECTORY`` (`rackplane.paths`).
"""

from __future__ import annotations

import json
from pathlib import Path

from rackplane.core.envelope import finite_int
from rackplane.io.files import move_aside, write_atomic
from rackplane.paths import is_in_state_directory
from racky.config import LifecycleState, RackyConfig, state_path
from racky.core.lifecycle import Lifecycle, PersistedState

__all__ = ["LEGACY_STATE_FILE", "STATE_FILE_NAME", "StateStore", "lifecycle_state_file"]

STATE_FILE_NAME = "racky-state-{site}-{row}-{rack}.json"
"""The default name of racky's state file (``lifecycle.state_file`` unset): one per rack."""

LEGACY_STATE_FILE = Path("racky-state.json")
"""The default name before it was per rack (every racky of a folder shared it)."""


def lifecycle_state_file(cfg: RackyConfig, environ: dict[str, str] | None = None) -> Path:
    """Where racky's state file is: ``lifecycle.state_file`` (relative: `state_path`), or,
    unset, `STATE_FILE_NAME` of this rack's identity in the same place."""
    f = cfg.lifecycle.state_file
    if f is None:
        i = cfg.identity
        f = Path(STATE_FILE_NAME.format(site=i.site, row=i.row, rack=i.rack))
    return state_path(f, environ)


class StateStore:
    """Loads and atomically saves `PersistedState` at ``path`` (module docstring)."""

    def __init__(self, path: Path, initial: LifecycleState = "provisioning") -> None:
        self.path = Path(path)
        self.initial: LifecycleState = initial
        self.saves = 0

    def load(self, wall_ns: int) -> PersistedState:
        """The persisted state, a fresh one (no file), or ``maintenance`` with a note when the
        file was unusable (moved aside). Never raises for the file's content."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return PersistedState(Lifecycle(self.initial, wall_ns, "new rack", "racky"))
        except OSError as err:
            return self._unusable(wall_ns, f"cannot read {self.path}: {err}", move=False)
        try:
            # no integer a double cannot hold: a 400-digit one made float() raise at start
            return PersistedState.from_json(json.loads(text, parse_int=finite_int))
        except (ValueError, TypeError, KeyError, RecursionError) as err:
            return self._unusable(wall_ns, f"{self.path}: {err}", move=True)

    def _unusable(self, wall_ns: int, why: str, *, move: bool) -> PersistedState:
        note = why
        if move:
            try:
                aside = move_aside(self.path, f"corrupt-{wall_ns}")
                note += f"; moved aside to {aside}"
            except OSError as err:
                note += f"; could not move it aside ({err})"
        st = PersistedState(Lifecycle("maintenance", wall_ns,
                                      "state file unusable: " + why, "racky"))
        st.notes.append(note)
        return st

    def save(self, state: PersistedState) -> None:
        """Write atomically (tmp + fsync + rename + directory fsync).

        Raises:
            OSError: the directory cannot be written, or is missing (it is never created,
                except inside systemd's ``$STATE_DIRECTORY``).
        """
        parent = self.path.parent
        if not parent.is_dir():
            if not is_in_state_directory(parent):
                raise FileNotFoundError(
                    f"state file folder {parent} does not exist (lifecycle.state_file; "
                    "it is not created: create it or point state_file into an existing one)")
            parent.mkdir(parents=True, exist_ok=True)
        data = json.dumps(state.to_json(), indent=2, sort_keys=True) + "\n"
        write_atomic(self.path, data, mode=0o666)
        self.saves += 1
