"""racky's gate to production in fleet mode (issue 17 item 2, pure).

In fleet mode (``[fleet] enabled``) a rack enters production only on rlc's order after a
campaign (`rlc.core.campaign`): ``set_lifecycle production`` is refused unless

1. it comes from the controller's MQTT user (``[campaign_gate] controller_user``; the broker's
   ACL makes the user in ``cmd/<user>/<verb>`` unforgeable), and
2. it carries ``evidence`` ``{campaign, passes: {stage: {run_id, judge_epoch}}}`` in which
   every pass names a run **this racky judged** and passed (`JudgedRun`, kept in the persisted
   state, the last `JUDGED_KEEP`), judged under **the current judge epoch** (racky's
   leadership epoch now: a pass judged by a fenced leader never gates), and the passes cover
   every stage kind of ``required_stages``.

An operator's attempt is refused with ``production_gated`` (the router audits every refusal)
and the rack stays where it is. Refusal codes: ``production_gated`` (not the controller),
``evidence_refused`` (missing, unknown run, failed, stale epoch, a required stage missing).

A validation's own pass does not promote in fleet mode either: the rack goes to
``maintenance`` with ``validated`` set (`racky.core.lifecycle.Lifecycle.validation_result`)
and waits for rlc's order. Without fleet mode nothing here applies (behaviour unchanged).

A campaign's run id (``start_validation``'s ``run_id``) makes a re-issued start idempotent:
the same run id while it runs, or once judged, is answered without starting again
(`racky.commands`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from pydantic import Field

from rackplane.config import StrictModel
from rackplane.errors import CommandError

__all__ = ["EVIDENCE_REFUSED", "JUDGED_KEEP", "PRODUCTION_GATED", "RUN_ID_PATTERN",
           "CampaignGateSettings", "JudgedRun", "check_production", "judged_from_json",
           "judged_to_json"]

PRODUCTION_GATED: Final = "production_gated"
EVIDENCE_REFUSED: Final = "evidence_refused"
JUDGED_KEEP: Final = 64
"""Judged runs kept (a campaign runs a few stages per rack; 64 covers retries)."""
RUN_ID_PATTERN: Final = r"^[A-Za-z0-9_.:-]{1,80}$"
"""A campaign run id (``<stage>.<seq>``, `rlc.core.campaign`)."""

StageKind = Literal["node", "rack", "multi-rack"]


def _all_stages() -> list[StageKind]:
    return ["node", "rack", "multi-rack"]


class CampaignGateSettings(StrictModel):
    """``[campaign_gate]``: who may put the rack into production in fleet mode, and with
    which passes (module docstring). Ignored unless ``[fleet] enabled``."""

    controller_user: str = Field("rlc", pattern=r"^[A-Za-z0-9_-]{1,64}$",
                                 description="the MQTT user of rlc: only it may order "
                                 "production in fleet mode")
    required_stages: list[StageKind] = Field(
        default_factory=_all_stages, min_length=1, max_length=3,
        description="stage kinds a production order's evidence must cover, each by a pass "
        "this racky judged under its current epoch")


@dataclass(frozen=True, slots=True)
class JudgedRun:
    """A campaign run racky judged: its id, stage kind, verdict, judge epoch, when (wall ns)."""

    run_id: str
    stage: str
    passed: bool
    judge_epoch: int
    at_ns: int

    def as_json(self) -> dict[str, Any]:
        """JSON form (persisted state)."""
        return {"run_id": self.run_id, "stage": self.stage, "passed": self.passed,
                "judge_epoch": self.judge_epoch, "at_ns": self.at_ns}


def judged_to_json(runs: Sequence[JudgedRun]) -> list[dict[str, Any]]:
    """The persisted list."""
    return [r.as_json() for r in runs]


def judged_from_json(v: Any) -> list[JudgedRun]:
    """Parse the persisted list strictly (the last `JUDGED_KEEP`).

    Raises:
        ValueError: not a list of such objects (a guess could let a rack into production).
    """
    if v is None:
        return []
    if not isinstance(v, list):
        raise ValueError("judged_runs: not a list")
    out = []
    for d in v[-JUDGED_KEEP:]:
        if not isinstance(d, dict):
            raise ValueError("judged_runs: an entry is not an object")
        ep, passed = d.get("judge_epoch"), d.get("passed")
        if isinstance(ep, bool) or not isinstance(ep, int) or ep < 0 \
                or not isinstance(passed, bool):
            raise ValueError(f"judged_runs: bad entry {d!r:.120}")
        out.append(JudgedRun(str(d.get("run_id", "")), str(d.get("stage", "")), passed, ep,
                             int(d.get("at_ns", 0))))
    return out


def _refuse(why: str) -> CommandError:
    return CommandError(EVIDENCE_REFUSED, f"production refused: {why}")


def check_production(user: str, evidence: Mapping[str, Any] | None,
                     judged: Sequence[JudgedRun], judge_epoch: int,
                     cfg: CampaignGateSettings) -> None:
    """Raise unless ``user`` may put the rack into production with ``evidence`` (module
    docstring). ``judge_epoch``: racky's leadership epoch now (0: a single instance).

    Raises:
        CommandError: ``production_gated`` (not the controller), ``evidence_refused``.
    """
    if user != cfg.controller_user:
        raise CommandError(PRODUCTION_GATED, f"in fleet mode only {cfg.controller_user} puts "
                           "a rack into production, after a validation campaign (rlc "
                           "campaign_start); operators cannot")
    if not evidence:
        raise _refuse("no evidence (the campaign's passes)")
    passes = evidence.get("passes")
    if not isinstance(passes, Mapping) or not passes:
        raise _refuse("evidence has no passes")
    by_id = {r.run_id: r for r in judged}
    covered: set[str] = set()
    for stage, p in passes.items():
        if not isinstance(p, Mapping):
            raise _refuse(f"pass of {stage!s:.40}: not an object")
        rid, ep = p.get("run_id"), p.get("judge_epoch")
        run = by_id.get(str(rid))
        if run is None:
            raise _refuse(f"stage {stage!s:.40}: run {rid!s:.80} was not judged by this racky")
        if not run.passed:
            raise _refuse(f"stage {stage!s:.40}: run {rid!s:.80} failed here")
        if ep != run.judge_epoch or run.judge_epoch != judge_epoch:
            raise _refuse(f"stage {stage!s:.40}: run {rid!s:.80} judged under epoch "
                          f"{run.judge_epoch} (evidence says {ep!r:.20}); current epoch "
                          f"{judge_epoch}")
        covered.add(run.stage)
    missing = [s for s in cfg.required_stages if s not in covered]
    if missing:
        raise _refuse(f"no pass of required stage(s) {', '.join(missing)}")
