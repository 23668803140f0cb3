"""Validation campaigns in lock-step on the multi-rack simulator (issue 17 items 3-4).

`run_campaign` puts ``racks`` (4) racks of `sims.backend.MultiRack` under a burn-in, one racky
per rack (its own `racky.core.controller.RackyCore` stepped by the daemon's tick,
`racky.tick.RackyTick`, fed the rack's shelves, trays, NIC ports and cooling as the daemon's
adapters would hand them: `harness.lockstep_racky.run._RackyIO`), and rlc's campaign driver
(`rlc.campaign_driver.CampaignDriver`, `rlc.core.campaign`) behind rlc's command router. The
operator starts the campaign with rlc's ``campaign_start``; rlc's orders go through each
racky's real command router and handlers as user ``rlc``; racky's ``state/rack`` JSON comes
back to the driver each tick; the multi-rack stage's backend-only phase (NVLink disabled,
`MultiRack.set_phase`) is judged by racky's judge (`racky.core.validation`: backend
throughput against its line rate, the failing part named: a port, the rack's NICs, or a
rail's leaf outside the rack), and rlc gates: a rack part quarantines, a network part
(``net:…``) does not (the group runs again; the rack is blocked after ``max_attempts``).
The harness is the burn-in tool and the transport only.

Scenario set (`SCENARIOS`): all healthy; one rack with underperforming NICs; one degraded
backend port; a congested spine uplink (blamed on the network, not the rack: the deficit is
one rail of one rack on every tray, which is what its leaf and uplinks share). Each run is
scored against the injected faults (`CampaignRun.found`, ``false_quarantines``) and its wall
time is measured. Reports: `write_summary` (Markdown + PNG per campaign, ``summary.md``).

``python -m harness.lockstep_campaign --out DIR [--scenario NAME ...]``.
"""

from __future__ import annotations

from harness.lockstep_campaign.report import campaign_report, figures, phase_means, write_summary
from harness.lockstep_campaign.run import (
    SCENARIOS,
    CampaignRun,
    CampaignScenario,
    Expected,
    RackVerdict,
    run_campaign,
)

__all__ = ["SCENARIOS", "CampaignRun", "CampaignScenario", "Expected", "RackVerdict",
           "campaign_report", "figures", "phase_means", "run_campaign", "write_summary"]
