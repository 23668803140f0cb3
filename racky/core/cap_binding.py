"""When racky's caps bind: the rule of the ``power_capped`` alarm (pure).

A cap racky has *allocated* does not mean the rack is held back: below its share of a roomy
limit a tray draws what it wants and the cap is only a ceiling. ``power_capped`` means what
an SRE reads it as, the rack's demand is being held below what it would draw. The rule, per
tray (`held_trays`): a tray is **held at its cap** while it is powered, its telemetry is fresh,
racky has a cap on it (a tray cap from the allocator or an operator's node override, or a
per-GPU protective cap) and

- its agent reports that a cap acts now (the agent's ``capping`` flag, or a GPU's clock-event
  reason ``sw_power_cap``: NVML's power cap), or
- racky's demand estimate for it (`racky.core.power.CapAllocator.demand`: the GPUs' inferred
  demand scaled to the tray, peak over ``power.demand_hold_s``) is at or above its cap.

The alarm is active while at least one tray is held; its detail names the limit, its
source and the other limits in force, the held trays and why each is held: their demand at
or above their caps, or their agents reporting a cap acting (then only the caps: racky's
estimate of a capped tray may read below its cap, and "demand below caps" contradicts the
alarm). A cap with room above the
tray's demand and no agent capping raises nothing. An agent capping on its own (its safe cap
after racky's caps expired, no racky cap on the tray) is not racky's cap binding: it shows in
``cap_drift`` / ``tray_stale`` instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from racky.core.agent_settings import DesiredTray
from racky.core.power import LimitState
from racky.core.telemetry import TrayReading

__all__ = ["LIMIT_SOURCES", "HeldTray", "held_detail", "held_trays", "limit_words",
           "tray_cap_w"]

class HeldTray(NamedTuple):
    """A tray held at its cap: why (the agent reports capping, or racky's demand estimate is
    at or above the cap) and what holds it."""

    tray: int
    demand_w: float
    """racky's demand estimate, W (NaN: none)."""
    cap_w: float
    """The tray power racky's caps allow, W (`tray_cap_w`)."""
    protective: bool
    """The cap is (or includes) a per-GPU protective one."""
    agent_capping: bool = False
    """The tray's agent reports that a cap acts now (its ``capping`` flag or a GPU's
    ``sw_power_cap``)."""


LIMIT_SOURCES: Mapping[str, str] = {
    "budget": "the rack budget",
    "capacity": "the PSUs' live capacity",
    "derate": "the facility-water derate",
}
"""What each part of the rack limit is (`racky.core.power.rack_limit`'s keys; ``requested:
<user>``: that user's derating request, ``cap_rack``)."""


def tray_cap_w(d: DesiredTray, gpus_per_tray: int, other_share: float) -> float | None:
    """The tray power racky's caps allow, W: the lower of the tray cap and the per-GPU
    protective cap as tray power (GPUs × cap × (1 + the non-GPU share)); None: no cap."""
    caps = [c for c in (d.power_cap_w, None if d.gpu_power_cap_w is None
                        else gpus_per_tray * d.gpu_power_cap_w * (1.0 + other_share))
            if c is not None and math.isfinite(c)]
    return min(caps) if caps else None


def held_trays(desired: Sequence[DesiredTray], demand_w: np.ndarray,
               trays: Mapping[int, TrayReading], fresh: np.ndarray, gpus_per_tray: int,
               other_share: float) -> list[HeldTray]:
    """The trays racky's caps hold below what they would draw now (module docstring).

    Args:
        desired: every tray's desired settings (index = tray); demand_w: racky's demand
            estimate per tray, W, shape (trays,); trays: the latest reading per tray index;
            fresh: per tray, its telemetry is fresh, shape (trays,); gpus_per_tray,
            other_share: to turn a per-GPU cap into tray power.

    Returns:
        a `HeldTray` for each held tray, by tray index.
    """
    out: list[HeldTray] = []
    for k, d in enumerate(desired):
        cap = tray_cap_w(d, gpus_per_tray, other_share)
        r = trays.get(k)
        if cap is None or r is None or not (d.powered and r.powered and bool(fresh[k])):
            continue
        dem = float(demand_w[k])
        agent_capping = bool(r.agent.capping) or bool(np.any(r.gpu_power_capped))
        if agent_capping or (math.isfinite(dem) and dem >= cap):
            out.append(HeldTray(k, dem, cap, d.gpu_power_cap_w is not None, agent_capping))
    return out


def limit_words(limit_w: float | None, source: str, parts: Mapping[str, float] | None = None,
                *, row_lease: bool = False) -> str:
    """The rack limit in force, what it is and the other limits in force (kW): ``limit 110.0
    kW from requested:valvey (valvey's derating request); also budget 120.0 kW``.
    ``row_lease``: the budget is rlc's row lease (fleet mode)."""
    if limit_w is None:
        return "no rack limit"

    def what(src: str) -> str:
        if src == "budget" and row_lease:
            return "the rack budget: rlc's row lease"
        if src.startswith("requested:"):
            return f"{src.split(':', 1)[1]}'s derating request"
        return LIMIT_SOURCES.get(src, src)

    others = [f"{k} {w / 1000:.1f} kW" for k, w in sorted((parts or {}).items(),
                                                           key=lambda kw: kw[1]) if k != source]
    also = f"; also in force: {', '.join(others)}" if others else ""
    return f"limit {limit_w / 1000:.1f} kW from {source} ({what(source)}){also}"


def held_detail(held: Sequence[HeldTray], limit: LimitState,
                fleet_budget_w: float | None = None) -> str:
    """The ``power_capped`` detail: the limit, what it is and the other limits in force
    (`limit_words`; the budget is rlc's row lease when it is ``fleet_budget_w``, W), the
    held trays, and why they are held (kW): those whose demand estimate is at or above their
    caps (demand against caps), those whose agents report a cap acting (their caps; racky's
    estimate may read below them, so it is not shown: never "demand below caps"); how many
    by a per-GPU protective cap."""
    names = ", ".join(f"tray{h.tray:02d}" for h in held[:6])
    more = f" and {len(held) - 6} more" if len(held) > 6 else ""
    prot = sum(1 for h in held if h.protective)
    why = f"; {prot} by tray protection (a per-GPU protective cap)" if prot else ""
    over = [h for h in held if math.isfinite(h.demand_w) and h.demand_w >= h.cap_w]
    acting = [h for h in held if h.tray not in {o.tray for o in over}]
    parts_out = []
    if over:
        dem = math.fsum(h.demand_w for h in over)
        cap = math.fsum(h.cap_w for h in over)
        parts_out.append(f"{_n(over)} demand {dem / 1000:.1f} kW at or above caps "
                         f"{cap / 1000:.1f} kW")
    if acting:
        cap = math.fsum(h.cap_w for h in acting)
        whose = "its agent" if len(acting) == 1 else "their agents"
        parts_out.append(f"{_n(acting)} reported capping by {whose} (the GPUs' power cap "
                         f"acts) at caps {cap / 1000:.1f} kW")
    lease = fleet_budget_w is not None and limit.parts.get("budget") == fleet_budget_w
    return (f"{limit_words(limit.limit_w, limit.source, limit.parts, row_lease=lease)}; "
            f"{len(held)} tray(s) "
            f"held at their caps ({names}{more}{why}): {'; '.join(parts_out)}")


def _n(held: Sequence[HeldTray]) -> str:
    return f"{len(held)} tray{'s' if len(held) != 1 else ''}"
