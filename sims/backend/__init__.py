"""Several racks and the backend (scale-out) network between them, stepped in lock-step.

`MultiRack` holds ``n_racks`` (2..8) virtual racks, each a `sims.row.VirtualRack` (its own
CDU: racks validating together are never on one CDU) with its own `sims.fabric.LinkFabric`,
and a `BackendNetwork`: every tray's backend NIC ports (4 GPUs × ``nic_ports_per_gpu``, 400G
class) cabled rail-optimised to leaves, leaves to spines. Usage::

    mr = MultiRack(4, seed=3, workloads=pattern_workloads("agentic", 4, seed=3))
    mr.set_phase("backend_only")              # NVLink disabled: the collective goes over NICs
    mr.underperform_nics(2, 0.6)              # rack 3's NICs at 60 %
    mr.degrade_link_speed(1, "gpu07/nic1", 25_000.0)  # one port trained at 200G
    for _ in range(600):
        mr.step(0.1)                          # dt as VirtualRow.step
    mr.rack_backend(2).fraction               # achieved / expected backend bandwidth
    mr.backend_ports(2)                       # a PortBlock of the rack's NIC ports
    mr.tray_payloads(2, ts_ns)                # the node-agent contract, ports included
    mr.spine_bundles()                        # leaf↔spine utilisation and byte counters
    mr.fault_log()                            # ground truth

Each `MultiRack.step` steps every rack's plant (`VirtualRow.step`); at each fabric step
(1 s) it first routes the interval's backend traffic: each NIC port offers its GPU's traffic
× share (``backend_share`` while NVLink is disabled, the fabric's ``nic_demand_share``
otherwise) and the network allocates max-min fair rates (`sims.backend.network`); the
fabrics then count those rates into their per-port bytes counters (64-bit, wrapping), with
their own jitter, link down time and error counters (symbol_error 16-bit saturating,
port_rcv_errors, link_downed, carrier_changes 32-bit wrapping: `sims.fabric.COUNTERS`).

Plant family: each rack's NIC efficiency, per-port spread, healthy symbol-error rate and
traffic jitter are drawn from `BackendParams` ranges (`draw_rack`), so healthy racks differ
within `BackendParams.healthy_fraction_range`. The expected bandwidth is the same offered
load on the nominal network (every port up at nominal speed and efficiency, no congestion).

Faults that show only across racks (`fault_log` is their ground truth): a degraded backend
link (`degrade_link_speed`, `ramp_symbol_errors`, `flap_link`), a rack whose NICs
underperform (`underperform_nics`), a congested leaf↔spine bundle (`congest_spine`). With
three or more racks the traffic is work-conserving (max-min), so a fault lowers the
readings of the rack / port that has it and not its peers'.

Everything is deterministic for a ``seed``.
"""

from __future__ import annotations

from sims.backend.multirack import (
    BackendFault,
    MultiRack,
    Phase,
    RackBackend,
    pattern_workloads,
)
from sims.backend.network import Allocation, BackendNetwork
from sims.backend.params import BackendParams, RackDraw, draw_rack

__all__ = [
    "Allocation",
    "BackendFault",
    "BackendNetwork",
    "BackendParams",
    "MultiRack",
    "Phase",
    "RackBackend",
    "RackDraw",
    "draw_rack",
    "pattern_workloads",
]
