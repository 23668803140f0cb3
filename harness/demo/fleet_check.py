"""The row's rlc checklist items (`harness.demo.fleet`), each checked from what the demo
recorded, never from the configuration:

* **a rack validated into production**: the new rack's lifecycle as its racky published it
  (``state/rack``): from ``provisioning`` through ``validating`` (a validation started by
  rlc's campaign) to ``production`` on rlc's order, with each time on the row's axis; and rlc's
  ``state/campaign`` showing the rack in production with its stage passed;
* **row budgets granted by rlc never summed above the row limit**: every lease rlc wrote (each
  rack's budget key in the fleet KV bucket, as the demo read it); after each one (in the
  order rlc issued them) the Σ of every rack's latest lease (its floor before its first: what
  racky holds without one) against the limit.

Times: leases carry rlc's wall clock (Unix s), mapped to the demo's monotonic clock by the
offset taken at the start (same host); the row's axis is `harness.demo.row`'s (s since the
first rack's plant t = 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.demo.checklist import CheckItem
from harness.demo.record import Recorder

__all__ = ["LeaseSeen", "campaign_item", "lease_sum_item", "lease_sums"]


@dataclass(frozen=True)
class LeaseSeen:
    """A lease rlc wrote, as the demo read it: when read (mono s), rack, value (W, AC
    input), its (epoch, seq), issue and expiry (rlc's wall clock, Unix s)."""

    t_mono: float
    rack: str
    value_w: float
    epoch: int
    seq: int
    issued_at_s: float
    expires_at_s: float

    def row_t(self, wall_minus_mono: float, t0_mono: float) -> float:
        """Its issue on the row's axis, s."""
        return self.issued_at_s - wall_minus_mono - t0_mono

    def as_row(self, wall_minus_mono: float, t0_mono: float) -> dict[str, Any]:
        return {"rack": self.rack, "value_w": self.value_w, "epoch": self.epoch,
                "seq": self.seq, "issued_row_t_s": round(self.row_t(wall_minus_mono, t0_mono), 2),
                "ttl_s": round(self.expires_at_s - self.issued_at_s, 2)}


def lease_sums(leases: Sequence[LeaseSeen], racks: Sequence[str], floor_w: float,
               wall_minus_mono: float, t0_mono: float) -> list[tuple[float, float]]:
    """After each lease in issue order: (row s, Σ of every rack's latest lease value, W;
    a rack without one yet at ``floor_w``)."""
    now = dict.fromkeys(racks, floor_w)
    out = []
    for x in sorted(leases, key=lambda x: (x.issued_at_s, x.epoch, x.seq)):
        now[x.rack] = x.value_w
        out.append((x.row_t(wall_minus_mono, t0_mono), sum(now.values())))
    return out


def lease_sum_item(leases: Sequence[LeaseSeen], racks: Sequence[str], limit_w: float,
                   floor_w: float, wall_minus_mono: float, t0_mono: float) -> CheckItem:
    """"Row budgets granted by rlc never summed above the row limit" (module docstring):
    checked when every rack got a lease and no Σ is above ``limit_w`` (W)."""
    label = "row budgets granted by rlc (Σ of the racks' leases) never above the row limit"
    if not leases:
        return CheckItem(label, False, "no lease recorded: rlc granted nothing the demo saw")
    without = [r for r in racks if not any(x.rack == r for x in leases)]
    sums = lease_sums(leases, racks, floor_w, wall_minus_mono, t0_mono)
    t_max, s_max = max(sums, key=lambda ts: ts[1])
    over = [(t, s) for t, s in sums if s > limit_w + 1.0]
    seen = (f"{len(leases)} leases recorded; Σ at most {s_max / 1000:.1f} kW (row t = "
            f"{t_max:.0f} s) against {limit_w / 1000:.0f} kW")
    if over:
        return CheckItem(label, False, f"Σ above the limit after {len(over)} leases, first at "
                                       f"row t = {over[0][0]:.0f} s ({over[0][1] / 1000:.1f} "
                                       f"kW); {seen}")
    if without:
        return CheckItem(label, False, f"unproven: no lease for {', '.join(without)}; {seen}")
    return CheckItem(label, True, f"{seen}; margin {(limit_w - s_max) / 1000:.1f} kW")


def campaign_item(rack: str, rec: Recorder, t0_mono: float, campaign: dict[str, Any],
                  campaign_id: str, controller: str) -> CheckItem:
    """"``rack`` validated into production by rlc's campaign" (module docstring)."""
    label = f"new rack {rack} validated into production by rlc's campaign"
    log = rec.lifecycle_log
    off = (rec.plant_t0_mono or t0_mono) - t0_mono

    def at(t: float) -> str:
        return f"row t = {t + off:.0f} s"

    if not log:
        return CheckItem(label, False, "racky published no lifecycle")
    first = log[0]
    val = next((r for r in log if r[1] == "validating"), None)
    prod = None if val is None else next(
        (r for r in log if r[0] >= val[0] and r[1] == "production"), None)
    st = (campaign.get("racks") or {}).get(rack) if campaign.get(
        "campaign_id") == campaign_id else None
    camp = ("rlc's state/campaign: no campaign " + campaign_id if st is None else
            f"rlc's state/campaign: {rack} {st.get('status')}, passed "
            f"{', '.join(st.get('passes') or {}) or 'none'}")
    path = " -> ".join(f"{r[1]} at {at(r[0])}" + (f" by {r[2]}" if r[2] else "") for r in log)
    if first[1] == "production":
        return CheckItem(label, False, f"the rack was already in production at the start; "
                                       f"{path}")
    if val is None or prod is None:
        return CheckItem(label, False, f"lifecycle {path}; {camp}")
    ok = prod[2] == controller and st is not None and st.get("status") == "production" \
        and bool(st.get("passes"))
    took = prod[0] - val[0]
    return CheckItem(label, ok, f"{path} ({took:.0f} s from validating to production); "
                                f"{camp}")
