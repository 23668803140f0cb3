"""The whole virtual rack speaking through the real tray agent, on a real Mosquitto, capped by
a real racky (`harness.vrack_agent_run`, the short version of its 10-minute run): the agent's
process hosts the rack's 18 trays through the simulated source (`harness.simagent`), racky
caps the rack under its budget after the scenario's load step, and

- racky refuses none of the agent's contract messages and none of its command replies;
- every cap command is answered confirmed (the GPUs' limits read back at the target), and the
  trays report the enforced caps below TGP;
- the simulated GPUs really took the limits (applied after their delay)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.servers import Mosquitto
from harness.vrack_agent_run import run

pytestmark = [pytest.mark.servers, pytest.mark.slow]

TGP_W = 1200.0  # the virtual rack's GPUs (sims.cdu.RackParams), what racky's caps go below


async def test_the_virtual_rack_through_the_real_agent_is_capped_and_nothing_is_refused(
        tmp_path: Path, mosquitto: Mosquitto) -> None:
    figs = await run(35.0, tmp_path, broker_port=mosquitto.port)
    print(figs.summary())
    assert figs.trays == 18
    assert figs.tray_messages >= 18 * 25  # 1 Hz per tray, most of the run
    # every GPU's link ports through the agent (harness.simlinks): all but the first reads
    assert figs.tray_messages_with_ports >= figs.tray_messages - 18 * 3
    assert figs.refused_tray_messages == 0
    assert figs.refused_commands == 0 and figs.commands_ok >= 1
    assert figs.unreadable_reply_states == 0  # racky reads the agent's 1.3 reply state
    assert figs.cap_commands >= 1
    assert figs.cap_commands_confirmed == figs.cap_commands
    assert len(figs.enforced_gpu_caps_w) == 18
    assert all(c < TGP_W - 50.0 for c in figs.enforced_gpu_caps_w), figs.enforced_gpu_caps_w
    assert figs.child["limits_applied"] >= 72  # every GPU's limit was set on the "hardware"
