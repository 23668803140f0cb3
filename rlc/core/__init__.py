"""rlc's pure cores (DESIGN §2: no I/O, no clock; every time is an argument).

- `rlc.core.topology`: site → hall → row → rack from config, validated (pydantic), compiled
  into arrays for the allocator.
- `rlc.core.allocation`: one allocation cycle: grants within every row and hall limit, floors,
  maxima, cooling capacity, priority classes, the ramp limit, paid only from free headroom.
- `rlc.core.leases`: budget leases, acknowledgements and the re-grant rule (issue 16 item 2),
  with their clocks stated.
- `rlc.core.campaign_plan`, `rlc.core.campaign`, `rlc.core.campaign_schedule`,
  `rlc.core.campaign_codec`: staged validation campaigns across racks (issue 17): the plan,
  the blast-radius scheduler, the gate to production with judge epochs, and the versioned
  record a new leader continues from.
"""

from rlc.core.allocation import Allocation, AllocationSettings, CycleInput, allocate
from rlc.core.leases import BudgetLease, LeaseTiming, RackLedger, rack_lease_valid
from rlc.core.topology import (
    HallSpec,
    RackSpec,
    RowSpec,
    Topology,
    TopologySettings,
    compile_topology,
)

__all__ = [
    "Allocation",
    "AllocationSettings",
    "BudgetLease",
    "CycleInput",
    "HallSpec",
    "LeaseTiming",
    "RackLedger",
    "RackSpec",
    "RowSpec",
    "Topology",
    "TopologySettings",
    "allocate",
    "compile_topology",
    "rack_lease_valid",
]
