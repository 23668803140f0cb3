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

The alarm is active while at least one tray is held; its detail names the limit and its
source, the held trays and their demand against their caps. A cap with room above the
tray's demand and no agent capping raises nothing. An agent capping on its own (its safe cap
after racky's caps expired, no racky cap on the tray) is not racky's cap binding: it shows in
``cap_drift`` / ``tray_stale`` instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from racky.core.agent_settings import DesiredTray
from racky.core.telemetry import TrayReading

__all__ = ["HeldTray", "held_detail", "held_trays", "tray_cap_w"]

HeldTray = tuple[int, float, float, bool]
"""(tray index, demand W, cap W, the cap is a per-GPU protective one) of a tray held at its
cap."""


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
        ``(tray, demand W, cap W, protective)`` for each held tray, by tray index.
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
            out.append((k, dem, cap, d.gpu_power_cap_w is not None))
    return out


def held_detail(held: Sequence[HeldTray], limit_w: float | None, source: str) -> str:
    """The ``power_capped`` detail: the limit and its source, the held trays, their demand
    against their caps (kW)."""
    names = ", ".join(f"tray{h[0]:02d}" for h in held[:6])
    more = f" and {len(held) - 6} more" if len(held) > 6 else ""
    dem = math.fsum(h[1] for h in held if math.isfinite(h[1]))
    cap = math.fsum(h[2] for h in held)
    lim = "no rack limit" if limit_w is None else f"limit {limit_w / 1000:.1f} kW from {source}"
    prot = sum(1 for h in held if h[3])
    why = f"; {prot} by tray protection (a per-GPU protective cap)" if prot else ""
    return (f"{lim}; {len(held)} tray(s) held at their caps ({names}{more}{why}): demand "
            f"{dem / 1000:.1f} kW against caps {cap / 1000:.1f} kW")
