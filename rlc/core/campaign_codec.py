"""A campaign's whole state to and from JSON bytes, versioned (issue 17 item 1, pure).

rlc keeps a campaign in the KV store so that a new leader continues it where the old one
stopped: `dumps` after every change, `loads` when a leader takes over. The record holds the
plan itself (a plan changed in config later does not change a campaign under way), every
rack's progress (passes with their judge epochs, attempts, quarantine, lifecycle asked and
confirmed), every run (state, racks started, results, aborts pending, deadlines), the groups,
the judges' epochs, the run counter and the counters of refused results.

**Write before sending.** The daemon writes the record of a step (compare-and-set on the key's
revision, under its leadership epoch) *before* it sends that step's orders, and sends nothing
when the write is refused or its outcome unknown (it reads the record again). Otherwise a start
sent by a leader whose record never landed would run on a rack its successor does not count
(past the blast-radius limit), and its run id could be issued again.

Shape: ``{"format": "rlc.campaign", "version": 1, ...}``, UTF-8 JSON, keys sorted, so one
state gives the same bytes (a leader writes only on change). All times are rlc's wall clock
(Unix s): a new leader's deadlines are the old leader's, not restarted. Run ids go on from the
restored counter, so a start the old leader issued and the new one re-issues
(`rlc.core.campaign.Campaign.outstanding`) is the same run, counted once.

Errors: ``ValueError`` for bytes that are not such a record (not JSON, another format, a
version this code does not know, a field missing or of the wrong type), and
`rlc.core.campaign_plan.PlanError` when the restored plan cannot run on the topology given.
"""

from __future__ import annotations

import json
import math
from typing import Any, Final

from pydantic import ValidationError

from rlc.core.campaign import Campaign, Pass, Quarantine, RackProgress, Run, StageResult
from rlc.core.campaign_plan import CampaignPlan, check_plan
from rlc.core.topology import Topology

__all__ = ["FORMAT", "VERSION", "dumps", "loads", "run_record"]

FORMAT: Final = "rlc.campaign"
VERSION: Final = 1

_RUN_STATES: Final = ("starting", "running", "done", "lost", "aborted")


def _t(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _rack(rp: RackProgress) -> dict[str, Any]:
    q = rp.quarantine
    return {"passes": {s: [p.run_id, p.judge_epoch, p.at_s] for s, p in rp.passes.items()},
            "attempts": dict(rp.attempts),
            "quarantine": None if q is None else [q.stage, q.run_id, q.criterion, q.measured,
                                                  q.limit, list(q.parts), q.judge_epoch,
                                                  q.at_s],
            "blocked": rp.blocked, "ready_at_s": _t(rp.ready_at_s),
            "lifecycle_wanted": rp.lifecycle_wanted,
            "lifecycle_confirmed": rp.lifecycle_confirmed}


def run_record(r: Run) -> dict[str, Any]:
    """One run as it is in the record (JSON-able)."""
    return {"run_id": r.run_id, "stage": r.stage, "racks": list(r.racks),
            "issued_at_s": r.issued_at_s, "rlc_epoch": r.rlc_epoch, "deadline_s": r.deadline_s,
            "state": r.state, "started": sorted(r.started),
            "results": [r.results[k].as_record() for k in sorted(r.results)],
            "abort_pending": sorted(r.abort_pending), "ended_at_s": r.ended_at_s}


def dumps(c: Campaign) -> bytes:
    """The whole state as JSON bytes (module docstring)."""
    rec = {"format": FORMAT, "version": VERSION, "campaign_id": c.campaign_id,
           "plan": c.plan.model_dump(mode="json"),
           "racks": {r: _rack(rp) for r, rp in c.racks.items()},
           "runs": [run_record(r) for r in c.runs.values()],
           "groups": {s: [list(g) for g in gs] for s, gs in c.groups.items()},
           "judge_epoch": dict(c.judge_epoch), "seq": c.seq, "aborted": c.aborted,
           "counters": {"stale": c.stale_results, "unusable": c.unusable_results,
                        "ignored": c.ignored_results, "compacted": c.compacted_runs}}
    return json.dumps(rec, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _int(x: Any) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"expected an integer, got {x!r}")
    return x


def _num(x: Any) -> float:
    if isinstance(x, bool) or not isinstance(x, int | float):
        raise TypeError(f"expected a number, got {x!r}")
    return float(x)


def _opt_str(x: Any) -> str | None:
    if x is not None and not isinstance(x, str):
        raise TypeError(f"expected a string or null, got {x!r}")
    return x


def _load_rack(d: dict[str, Any]) -> RackProgress:
    q = d["quarantine"]
    ready = d["ready_at_s"]
    return RackProgress(
        passes={str(s): Pass(str(p[0]), _int(p[1]), _num(p[2]))
                for s, p in d["passes"].items()},
        attempts={str(s): _int(n) for s, n in d["attempts"].items()},
        quarantine=None if q is None else Quarantine(
            str(q[0]), str(q[1]), str(q[2]), str(q[3]), str(q[4]),
            tuple(str(p) for p in q[5]), _int(q[6]), _num(q[7])),
        blocked=_opt_str(d["blocked"]),
        ready_at_s=-math.inf if ready is None else _num(ready),
        lifecycle_wanted=_opt_str(d["lifecycle_wanted"]),
        lifecycle_confirmed=_opt_str(d["lifecycle_confirmed"]))


def _load_run(d: dict[str, Any]) -> Run:
    state = d["state"]
    if state not in _RUN_STATES:
        raise ValueError(f"campaign record: run state {state!r}")
    results = [StageResult.from_record(x) for x in d["results"]]
    ended = d["ended_at_s"]
    return Run(run_id=str(d["run_id"]), stage=str(d["stage"]),
               racks=tuple(str(r) for r in d["racks"]), issued_at_s=_num(d["issued_at_s"]),
               rlc_epoch=_int(d["rlc_epoch"]), deadline_s=_num(d["deadline_s"]), state=state,
               started={str(r) for r in d["started"]},
               results={x.rack: x for x in results},
               abort_pending={str(r) for r in d["abort_pending"]},
               ended_at_s=None if ended is None else _num(ended))


def loads(data: bytes, topo: Topology) -> Campaign:
    """A campaign from `dumps`' bytes, checked against ``topo`` (module docstring)."""
    try:
        d = json.loads(data)
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ValueError("not an rlc campaign record")
        if d.get("version") != VERSION:
            raise ValueError(f"campaign record version {d.get('version')!r}; this rlc reads "
                             f"{VERSION}")
        plan = CampaignPlan.model_validate(d["plan"])
        racks = {str(r): _load_rack(x) for r, x in d["racks"].items()}
        if set(racks) != set(plan.racks):
            raise ValueError("campaign record: racks differ from its plan's")
        runs = [_load_run(x) for x in d["runs"]]
        names = {s.name for s in plan.stages}
        for run in runs:
            if run.stage not in names or not set(run.racks) <= set(racks):
                raise ValueError(f"campaign record: run {run.run_id} names a stage or rack "
                                 "not in the plan")
        cnt = d["counters"]
        c = Campaign(
            campaign_id=str(d["campaign_id"]), plan=plan, racks=racks,
            runs={r.run_id: r for r in runs},
            groups={str(s): [tuple(str(r) for r in g) for g in gs]
                    for s, gs in d["groups"].items()},
            judge_epoch={str(r): _int(e) for r, e in d["judge_epoch"].items()},
            seq=_int(d["seq"]), aborted=_opt_str(d["aborted"]),
            stale_results=_int(cnt["stale"]), unusable_results=_int(cnt["unusable"]),
            ignored_results=_int(cnt["ignored"]),
            compacted_runs=_int(cnt.get("compacted", 0)))
    except ValidationError as err:
        raise ValueError(f"campaign record plan: {err}") from None
    except (KeyError, TypeError, IndexError, AttributeError) as err:
        raise ValueError(f"campaign record: {err!r}") from None
    check_plan(c.plan, topo)
    return c
