"""valvey's command state across restarts: the setpoint and loop mode set by command (issue 7:
a restart must not silently revert an operator's decision).

One `rackplane.io.statefile.StateFile` (format `STATE_FORMAT`, version `STATE_VERSION`), by
default ``valvey-state-<rack>.json`` beside the spool folder (``$STATE_DIRECTORY`` under
systemd; `state_file_path`; the rack in the name keeps two daemons whose spools share a parent
folder apart). Its ``data``::

    {"owner": "lab/rack1",          # identity.site/identity.rack of the daemon that saved it
     "setpoint_c": 44.0,            # the operator's setpoint (°C) when it was saved
     "file_setpoint_c": 45.0,       # supply_loop.setpoint_c of the config at that moment
     "manual_output_pct": null,     # manual mode's output (%), null: not manual
     "shadow": false,               # shadow mode
     "file_shadow": false}          # supply_loop.shadow of the config at that moment

**File vs command (the newer decision wins).** Each saved value carries the config value it
was saved against. At start (and at SIGHUP, `Valvey.reload`), a saved setpoint (or shadow
flag) is used only while the config still has the value recorded with it; once the config's
value differs, the file was edited after the command and the file wins: the saved value is
dropped (logged ``command_state_superseded``) and the next save records the file's value.
Manual mode has no config counterpart: it is kept until a command (or an interlock) ends it.

A damaged file, one of another format, or one of a newer version is moved aside
(``.bad-<ns>``), logged (``state_file_unusable``, naming why) and the config values are used.
A file saved by another rack's valvey (``owner`` differs: two daemons sharing one state
folder) is never applied: logged (``state_file_unusable``) and the config's values used; give
each daemon its own ``control.state_file`` then. The leases are not persisted: a restart drops
them (holders re-acquire).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rackplane.errors import CommandError
from rackplane.io.statefile import StateFile
from rackplane.paths import in_state_directory
from rackplane.settings import SpoolSettings, effective_spool
from valvey.core.supply_loop import SupplyLoop
from valvey.core.supply_loop_settings import SupplyLoopSettings

STATE_FORMAT = "valvey-state"
STATE_VERSION = 1
DEFAULT_NAME = "valvey-state-{rack}.json"

__all__ = [
    "DEFAULT_NAME",
    "STATE_FORMAT",
    "STATE_VERSION",
    "CommandState",
    "apply_command_state",
    "open_state_file",
    "state_file_path",
]


def state_file_path(
    state_file: Path | None, spool: SpoolSettings, rack: str,
    environ: dict[str, str] | None = None,
) -> Path:
    """Where the state file lives: ``state_file`` absolute as given, relative inside
    ``$STATE_DIRECTORY`` (first entry) or the working directory; None: `DEFAULT_NAME`
    (``rack``: ``identity.rack``) in the parent of the effective spool folder."""
    if state_file is None:
        return effective_spool(spool, environ).directory.parent / DEFAULT_NAME.format(rack=rack)
    return in_state_directory(state_file, environ)


def open_state_file(path: Path, log: Any = None) -> StateFile:
    """The `StateFile` of valvey's command state at ``path``."""
    return StateFile(path, STATE_FORMAT, STATE_VERSION, log=log)


@dataclass(frozen=True, slots=True)
class CommandState:
    """What is saved (see the module docstring); equality tells whether a save is due."""

    owner: str
    setpoint_c: float
    file_setpoint_c: float
    manual_output_pct: float | None
    shadow: bool
    file_shadow: bool

    @classmethod
    def of(cls, owner: str, loop: SupplyLoop, file: SupplyLoopSettings) -> CommandState:
        """The loop's current command state against the config's ``supply_loop``."""
        return cls(owner, loop.setpoint_c, file.setpoint_c, loop.manual_target_pct, loop.shadow,
                   file.shadow)

    def data(self) -> dict[str, Any]:
        """The state file's ``data`` object."""
        return asdict(self)

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> CommandState:
        """Parse a ``data`` object.

        Raises:
            ValueError: a field missing or of the wrong type.
        """
        def num(key: str, none_ok: bool = False) -> Any:
            v = data.get(key)
            if v is None and none_ok:
                return None
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise ValueError(f"{key}: expected a number, got {v!r}")
            return float(v)

        def flag(key: str) -> bool:
            v = data.get(key)
            if not isinstance(v, bool):
                raise ValueError(f"{key}: expected true/false, got {v!r}")
            return v

        owner = data.get("owner")
        if not isinstance(owner, str):
            raise ValueError(f"owner: expected 'site/rack', got {owner!r}")
        return cls(owner, num("setpoint_c"), num("file_setpoint_c"),
                   num("manual_output_pct", none_ok=True), flag("shadow"), flag("file_shadow"))


def apply_command_state(
    loop: SupplyLoop, file: SupplyLoopSettings, saved: CommandState
) -> tuple[list[str], list[str]]:
    """Lay a saved command state over a loop built from (or reloaded to) ``file`` (the caller
    checked ``saved.owner``).

    Returns:
        (restored, superseded): the names of the values restored, and of the values the
        edited config superseded or the loop refused (``setpoint_c: out_of_range``).
    """
    restored: list[str] = []
    superseded: list[str] = []
    if saved.setpoint_c != file.setpoint_c:
        if saved.file_setpoint_c != file.setpoint_c:
            superseded.append("setpoint_c: the config's setpoint changed since")
        else:
            try:
                loop.set_setpoint(saved.setpoint_c)
                restored.append("setpoint_c")
            except CommandError as err:
                superseded.append(f"setpoint_c: {err.code} ({err})")
    if saved.shadow != file.shadow:
        if saved.file_shadow != file.shadow:
            superseded.append("shadow: the config's shadow flag changed since")
        else:
            loop.set_shadow(saved.shadow)
            restored.append("shadow")
    if saved.manual_output_pct is not None and loop.manual_target_pct != saved.manual_output_pct:
        try:
            loop.set_manual(saved.manual_output_pct)
            restored.append("manual_output_pct")
        except CommandError as err:
            superseded.append(f"manual_output_pct: {err.code} ({err})")
    return restored, superseded
