"""The simulator's node agents' ``set_power_limits`` reply state: the node-agent contract's
`rackplane.core.tray_reply.SetPowerLimitsReply` (contract 1.3, docs/CONTRACTS.md "Reply"),
the layout the real tray agent (`trayagent.app.TrayAgent`) also produces.

The simulated agents apply a command at once: a GPU's enforced limit is the per-GPU cap in
force (`sims.rack.NodeAgents.enforced_gpu_cap_w`, W), read back the same step, so ``confirmed``
is true for every applied command.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rackplane.core.tray_contract import SCHEMA_VERSION
from sims.rack import NodeAgents

__all__ = ["set_power_limits_reply"]


def set_power_limits_reply(ag: NodeAgents, trays: Sequence[int], epoch: int) -> dict[str, Any]:
    """The reply ``state`` after an applied ``set_power_limits`` of ``epoch`` to ``trays``
    (indices already checked; each tray once, ascending)."""
    out = []
    for k in sorted(set(trays)):
        s = ag.settings(k)
        cap_w = ag.enforced_gpu_cap_w(s)
        out.append({
            "tray": k, "epoch": ag.newest_epoch(k), "powered": s.powered,
            "power_cap_w": s.power_cap_w, "gpu_power_cap_w": s.gpu_power_cap_w,
            "cap_expires_in_s": ag.cap_expires_in_s(k),
            "enforced_tray_cap_w": cap_w * ag.gpus_per_tray * (1.0 + ag.other_share),
            "gpus": [{"gpu": k * ag.gpus_per_tray + i, "enforced_w": cap_w, "target_w": cap_w}
                     for i in range(ag.gpus_per_tray)],
        })
    return {"schema_version": SCHEMA_VERSION, "epoch": epoch, "confirmed": True,
            "dry_run": False, "epoch_persisted": None, "trays": out}
