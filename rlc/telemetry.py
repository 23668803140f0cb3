"""rlc's time series (issue 16: the fleet dashboards; pure).

`fleet_lines` turns the leader's `rlc.core.cycle.FleetState` into lines for the shared
telemetry writer (`rackplane.io.tsdb.TelemetryWriter`, the ``[tsdb]`` and ``[spool]`` sections
every daemon has; the writer adds rlc's identity tags site/row/rack). The daemon writes them
every tick while it leads (`rlc.app.Rlc.tick`); a standby writes none (one series per fleet).

Measurements (W unless named otherwise; a field not known now is left out of the line):

- ``fleet_rack`` (tags ``hall``, ``fleet_row`` = ``<hall>/<row>``, ``fleet_rack``): ``grant_w``
  (the value of its current budget lease), ``committed_w`` (what it may still draw:
  `rlc.core.leases.RackLedger.committed_w`), ``demand_w`` and ``power_w`` (its report: what it
  wants, what its shelves draw; power left out while the rack is unreachable: stale),
  ``cooling_w`` (the cooling capacity the allocator applies:
  the lower of configured and reported, `rlc.core.cycle.FleetState.cooling_w`; left out with
  none), ``floor_w``, ``lease_expires_in_s`` (s until its current lease expires, rlc's wall
  clock; negative once expired), ``reachable`` (1/0);
- ``fleet_row`` (tags ``hall``, ``fleet_row``): ``limit_w``, ``grants_w`` (Σ grants),
  ``committed_w`` (Σ committed), ``power_w`` (Σ of its racks' reported power, left out unless
  every rack reports one), ``racks_unreachable``.
"""

from __future__ import annotations

import math

from rackplane.core.effects import TsLine
from rlc.core.cycle import FleetState

__all__ = ["fleet_lines"]


def _opt(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def fleet_lines(state: FleetState, now_mono_s: float, wall_ns: int) -> list[TsLine]:
    """One line per rack and per row at ``wall_ns`` (module docstring); ``now_mono_s``:
    rlc's monotonic clock (reachability)."""
    topo = state.topo
    now_wall_s = wall_ns / 1e9
    unreachable = state.unreachable(now_mono_s)
    cooling = state.last_cooling[0] if state.last_cooling is not None else None
    lines: list[TsLine] = []
    rows: dict[int, dict[str, list[float | None]]] = {}
    for i, rack in enumerate(topo.rack_ids):
        j = int(topo.row_of[i])
        row_id = topo.row_ids[j]
        hall = row_id.split("/", 1)[0]
        led = state.ledgers.get(rack)
        cur = None if led is None else led.current
        rep = state.seen[rack].report
        reported = math.nan if cooling is None else float(cooling[i])
        known = [x for x in (reported, float(topo.cooling_w[i])) if not math.isnan(x)]
        grant = None if cur is None else cur.value_w
        committed = None if led is None else led.committed_w()
        power = None if rep is None or unreachable[i] else _opt(rep.power_w)
        lines.append(TsLine("fleet_rack", {"hall": hall, "fleet_row": row_id,
                                           "fleet_rack": rack}, {
            "grant_w": grant,
            "committed_w": committed,
            "demand_w": None if rep is None else _opt(rep.demand_w),
            "power_w": power,
            "cooling_w": min(known) if known else None,
            "floor_w": float(topo.floor_w[i]),
            "lease_expires_in_s": None if cur is None else cur.expires_at_s - now_wall_s,
            "reachable": 0.0 if unreachable[i] else 1.0,
        }, wall_ns))
        acc = rows.setdefault(j, {"grant": [], "committed": [], "power": []})
        acc["grant"].append(grant)
        acc["committed"].append(committed)
        acc["power"].append(power)
    for j, acc in rows.items():
        row_id = topo.row_ids[j]
        idx = [i for i in range(topo.n) if int(topo.row_of[i]) == j]
        lines.append(TsLine("fleet_row", {"hall": row_id.split("/", 1)[0],
                                          "fleet_row": row_id}, {
            "limit_w": float(topo.row_limit_w[j]),
            "grants_w": _sum(acc["grant"]),
            "committed_w": _sum(acc["committed"]),
            "power_w": _sum(acc["power"]),
            "racks_unreachable": float(sum(bool(unreachable[i]) for i in idx)),
        }, wall_ns))
    return lines


def _sum(xs: list[float | None]) -> float | None:
    """Σ ``xs`` (W), None unless every one is known (a partial sum would understate)."""
    return None if any(x is None for x in xs) else math.fsum(x for x in xs if x is not None)
