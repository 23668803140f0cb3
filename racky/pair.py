"""racky as one instance of a redundant pair (issue 15; docs/OPERATIONS.md §6): its part of
the pair's state record and the epoch of its commands to the node agents.

The frame (`rackplane.daemon.DaemonFrame`) runs the lease, the sync task and the roles; this
module holds what is racky's own:

- **Epoch** (`agent_epoch`): a single instance's commands carry its start time in ms since
  the Unix epoch; one of a pair carries ``2**62 + `` its lease epoch
  (`rackplane.core.tray_contract.command_epoch`, docs/CONTRACTS.md "Command epochs"). The
  agents refuse an older epoch than the newest they have seen, so once a new active has sent
  them a command, the old active's delayed or queued commands are refused (``stale_epoch``).
- **Sync state** (`sync_state` / `apply_sync_state`): what a takeover must continue from, laid
  over the standby's core as the active writes it: the persisted state (lifecycle, budget
  override, trays powered off for safety, last validation, link baselines), the caps other
  daemons requested (``cap_rack``: power and the time left), the operators' node cap
  overrides (time left), the desired power state of every tray, and the power cycles under
  way (time until the "on" half). Times travel as seconds left, never as monotonic instants
  (each host has its own clock). The command router's applied request-ids and the output
  leases are the frame's part of the record.

Not carried (re-learned from the inputs on the standby's own shadow core): the cap
allocator's smoothing state, the thermal protection state, the alarm bank, the sequencer's
queue of trays waiting for their inrush slot (a power-up under way at the takeover restarts
its sequencing from the desired state).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rackplane.core.tray_contract import command_epoch
from racky.core.controller import RackyCore
from racky.core.lifecycle import PersistedState
from racky.core.power import RequestedCap

__all__ = ["agent_epoch", "apply_sync_state", "sync_state"]


def agent_epoch(start_ms: int, lease_epoch: int) -> int:
    """The epoch racky's commands carry (`command_epoch`): ``start_ms`` for a single instance
    (``lease_epoch`` 0), ``2**62 + lease_epoch`` for one of a pair."""
    return command_epoch(start_ms, lease_epoch)


def _caps_out(caps: Mapping[Any, RequestedCap], now: float) -> dict[str, dict[str, Any]]:
    return {str(k): {"user": c.user, "power_w": c.power_w,
                     "remaining_s": round(c.until_mono - now, 3), "reason": c.reason}
            for k, c in caps.items() if c.until_mono > now}


def sync_state(core: RackyCore, now: float) -> dict[str, Any]:
    """racky's part of the pair's sync record (JSON object; module docstring): ``persisted``
    (`PersistedState.to_json`), ``requested`` / ``cap_overrides`` (key -> user, power_w W,
    remaining_s s, reason), ``desired_powered`` (per tray true / false / null: not yet
    known), ``cycle_on_in_s`` (tray -> s until its power cycle's "on" half)."""
    return {
        "persisted": core.persisted.to_json(),
        "requested": _caps_out(core.requested, now),
        "cap_overrides": _caps_out(core.cap_overrides, now),
        "desired_powered": list(core.desired_powered),
        "cycle_on_in_s": {str(k): round(max(at - now, 0.0), 3)
                          for k, at in core.cycle_on_at.items()},
    }


def _caps_in(raw: Any, now: float, key: type, what: str) -> dict[Any, RequestedCap]:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{what}: not an object")
    out: dict[Any, RequestedCap] = {}
    for k, c in raw.items():
        try:
            pw, left = float(c["power_w"]), float(c["remaining_s"])
            if not (math.isfinite(pw) and pw > 0 and math.isfinite(left) and left > 0):
                raise ValueError("power_w or remaining_s not finite and > 0")
            out[key(k)] = RequestedCap(str(c["user"]), pw, now + left, str(c["reason"]))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{what}.{k}: {err}") from None
    return out


def apply_sync_state(core: RackyCore, state: Mapping[str, Any], now: float) -> list[str]:
    """Lay the active's `sync_state` over a standby's core at monotonic ``now``. Returns the
    names of the parts that changed (``persisted`` changed bumps ``core.persist_version``:
    the standby saves it to its own state file).

    Raises:
        ValueError: a part does not parse (nothing is changed then).
    """
    try:
        persisted = PersistedState.from_json(state.get("persisted"))
    except (TypeError, KeyError, ValueError) as err:
        raise ValueError(f"persisted: {err}") from None
    requested = _caps_in(state.get("requested", {}), now, str, "requested")
    overrides = _caps_in(state.get("cap_overrides", {}), now, int, "cap_overrides")
    if any(not 0 <= k < core.n_trays for k in overrides):
        raise ValueError("cap_overrides: a tray index out of range")
    powered = state.get("desired_powered")
    if not (isinstance(powered, list) and len(powered) == core.n_trays
            and all(x is None or isinstance(x, bool) for x in powered)):
        raise ValueError(f"desired_powered: not a list of {core.n_trays} true/false/null")
    cyc_raw = state.get("cycle_on_in_s", {})
    if not isinstance(cyc_raw, Mapping):
        raise ValueError("cycle_on_in_s: not an object")
    try:
        cycles = {int(k): now + float(v) for k, v in cyc_raw.items()}
    except (TypeError, ValueError) as err:
        raise ValueError(f"cycle_on_in_s: {err}") from None
    if any(not (0 <= k < core.n_trays and math.isfinite(at)) for k, at in cycles.items()):
        raise ValueError("cycle_on_in_s: a tray index out of range or a time not finite")
    changed = []
    if persisted.to_json() != core.persisted.to_json():
        core.persisted = persisted
        core.persist_version += 1
        changed.append("persisted")
    if {k: (c.power_w, c.reason) for k, c in requested.items()} != {
            k: (c.power_w, c.reason) for k, c in core.requested.items()}:
        changed.append("requested")
    core.requested = requested
    if {k: c.power_w for k, c in overrides.items()} != {
            k: c.power_w for k, c in core.cap_overrides.items()}:
        changed.append("cap_overrides")
    core.cap_overrides = overrides
    if list(powered) != core.desired_powered:
        changed.append("desired_powered")
        core.desired_powered = list(powered)
    core.cycle_on_at = cycles
    return changed
