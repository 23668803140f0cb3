"""The campaign record's size against the KV store's bound (issue 17, pure).

rlc keeps a whole campaign in one KV value (`rlc.core.campaign_codec`, key
``<site>.rlc.campaign``). NATS refuses a message above its servers' ``max_payload``
(default 1 MiB = 1 048 576 bytes; a KV value is a message, its headers count too), so a record
that grows past it could never be written again: the campaign would stop with no order sent.
Two guards, both against ``campaign.max_record_bytes`` (default `DEFAULT_MAX_RECORD_BYTES`:
1 MiB less `RECORD_MARGIN_BYTES` for the KV headers):

- **at plan validation** (`check_record_size`, run by ``campaign_start`` and by
  ``rackctl campaign start`` before anything is sent): the encoded size of the plan's record at
  its largest *bounded* extent (`worst_case_record_bytes`) must fit, else the plan is refused
  with both figures (bytes) named (`rlc.core.campaign_plan.PlanError`);
- **on each write** (`rlc.campaign_driver.CampaignDriver.step`): what the bounded estimate
  cannot bound (runs repeated after a judge's epoch rose, results with more failed criteria than
  `RESULT_CRITERIA` or longer texts) is caught when the record is encoded: ended runs that hold
  no slot are dropped from the record, oldest first (`compact`; their ids stay in the passes
  and quarantines that cite them, the counter ``compacted`` counts them); a record still above
  the bound is not written and nothing is sent (``record_too_large``, logged with the size).

**The bounded extent** (`worst_case_record_bytes`): every rack with a pass of every stage, its
attempts at ``max_attempts``, a quarantine and a blocked reason with every text at the record's
cap (200 characters) and `QUARANTINE_PARTS` parts, its lifecycle strings; per rack and stage
``max_attempts + 1`` runs (the attempts that give no verdict, then the one that does; a
multi-rack stage's runs hold its largest group), each with a result of every rack of it carrying
every figure and `RESULT_CRITERIA` failed criteria of `RESULT_TEXT` characters with
`RESULT_PARTS` parts each; run ids and times at their longest. Cost: one encoding of that
record, O(racks × stages × max_attempts).
"""

from __future__ import annotations

import json
from typing import Final

from rlc.core.campaign import (
    Campaign,
    FailedCriterion,
    Pass,
    Quarantine,
    RackProgress,
    Run,
    StageResult,
)
from rlc.core.campaign_codec import dumps, run_record
from rlc.core.campaign_plan import FIGURES, CampaignPlan, PlanError

__all__ = ["DEFAULT_MAX_RECORD_BYTES", "NATS_MAX_PAYLOAD_BYTES", "QUARANTINE_PARTS",
           "RECORD_MARGIN_BYTES", "RESULT_CRITERIA", "RESULT_PARTS", "RESULT_TEXT",
           "check_record_size", "compact", "worst_case_record_bytes"]

NATS_MAX_PAYLOAD_BYTES: Final = 1_048_576
"""nats-server's default ``max_payload``, bytes."""
RECORD_MARGIN_BYTES: Final = 4096
"""Left for the KV message's headers and subject, bytes."""
DEFAULT_MAX_RECORD_BYTES: Final = NATS_MAX_PAYLOAD_BYTES - RECORD_MARGIN_BYTES

QUARANTINE_PARTS: Final = 8
RESULT_CRITERIA: Final = 2
RESULT_PARTS: Final = 4
RESULT_TEXT: Final = 64
_TEXT: Final = 200
_T: Final = 1_999_999_999.123456  # a wall time (Unix s) at its longest
_EPOCH: Final = 2**53 - 1


def _campaign(plan: CampaignPlan) -> Campaign:
    long = "x" * _TEXT
    seq = 0
    runs: dict[str, Run] = {}
    per_stage = plan.max_attempts + 1
    n_units = sum(len(s.groups) if s.groups else len(plan.racks) for s in plan.stages)
    width = len(str(max(n_units * per_stage, 1)))

    def run_id(stage: str, k: int) -> str:
        return f"{stage}.{str(k).rjust(width, '9')}"

    figures = dict.fromkeys(FIGURES, 0.123456789012345)
    failed = tuple(FailedCriterion("c" * RESULT_TEXT, "m" * RESULT_TEXT, "l" * RESULT_TEXT,
                                   tuple("p" * RESULT_TEXT for _ in range(RESULT_PARTS)))
                   for _ in range(RESULT_CRITERIA))
    for s in plan.stages:
        units = [tuple(g) for g in s.groups] if s.groups else [(r,) for r in plan.racks]
        for unit in units:
            for _ in range(per_stage):
                seq += 1
                rid = run_id(s.name, seq)
                runs[rid] = Run(rid, s.name, unit, _T, _EPOCH, _T, "aborted", set(unit),
                                {r: StageResult(rid, r, _EPOCH, False, failed, figures, _T)
                                 for r in unit}, set(unit), _T)
    racks = {}
    for r in plan.racks:
        last = plan.stages[-1].name
        racks[r] = RackProgress(
            passes={s.name: Pass(run_id(s.name, seq), _EPOCH, _T) for s in plan.stages},
            attempts={s.name: plan.max_attempts for s in plan.stages},
            quarantine=Quarantine(last, run_id(last, seq), long, long, long,
                                  tuple(long for _ in range(QUARANTINE_PARTS)), _EPOCH, _T),
            blocked=long, ready_at_s=_T, lifecycle_wanted="quarantined",
            lifecycle_confirmed="quarantined")
    groups = {s.name: [tuple(g) for g in s.groups or ()] for s in plan.stages
              if s.kind == "multi_rack"}
    return Campaign("c" * 64, plan, racks, runs, groups,
                    dict.fromkeys(plan.racks, _EPOCH), seq, long, _EPOCH, _EPOCH, _EPOCH)


def worst_case_record_bytes(plan: CampaignPlan) -> int:
    """The encoded size of ``plan``'s record at its bounded extent (module docstring), bytes."""
    return len(dumps(_campaign(plan)))


def check_record_size(plan: CampaignPlan, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
                      ) -> int:
    """Raise `PlanError` when ``plan``'s record could exceed ``max_record_bytes``; returns the
    bounded size (bytes)."""
    n = worst_case_record_bytes(plan)
    if n > max_record_bytes:
        raise PlanError([f"its campaign record could reach {n} bytes, above the KV store's "
                         f"bound of {max_record_bytes} bytes (campaign.max_record_bytes; "
                         "NATS max_payload): fewer racks, stages or max_attempts per "
                         "campaign"])
    return n


def compact(c: Campaign, now_wall_s: float, max_record_bytes: int) -> bytes:
    """Drop ended runs that hold no slot and wait for no abort, oldest first, until the record
    fits ``max_record_bytes`` (or none is left to drop); returns the record's bytes. Counts
    them in ``c.compacted_runs``."""
    data = dumps(c)
    excess = len(data) - max_record_bytes
    if excess <= 0:
        return data
    for rid in [rid for rid, run in c.runs.items() if run.ended_at_s is not None
                and not run.abort_pending and not run.holds_slots(now_wall_s)]:
        excess -= len(json.dumps(run_record(c.runs.pop(rid)), sort_keys=True,
                                 separators=(",", ":"))) + 1
        c.compacted_runs += 1
        if excess <= 0:
            data = dumps(c)
            excess = len(data) - max_record_bytes
            if excess <= 0:
                return data
    return dumps(c)
