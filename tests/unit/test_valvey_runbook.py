"""Every alarm valvey can raise has a runbook entry in docs/RUNBOOK.md (issue 4)."""

from __future__ import annotations

import re
from pathlib import Path

from rackplane.io.selfmetrics import TELEMETRY_ALARMS
from valvey.config import ValveyConfig
from valvey.core.controller import ValveyCore

RUNBOOK = Path(__file__).resolve().parents[2] / "docs" / "RUNBOOK.md"


def test_every_valvey_alarm_has_a_runbook_entry() -> None:
    headings = set(re.findall(r"^### (\S+)$", RUNBOOK.read_text(), flags=re.M))
    # as the daemon builds it: the telemetry path's alarms included (issue 7)
    core = ValveyCore.from_config(ValveyConfig(), 0.0, extra_alarms=TELEMETRY_ALARMS)
    missing = []
    for d in core.alarms.defs.values():
        # one entry covers every pump / valve of a kind (pump_a_fault, pump_b_fault, ...)
        key = re.sub(r"^valvey\.(pump|valve)_\w+?_fault$", r"valvey.\1_a_fault", d.runbook or "")
        if key not in headings:
            missing.append(d.runbook)
    assert missing == []
    assert len(core.alarms.defs) >= 30
    assert {d.id for d in TELEMETRY_ALARMS} <= core.alarms.defs.keys()
