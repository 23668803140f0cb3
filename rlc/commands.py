"""rlc's command verbs (DESIGN §3 ``cmd/<user>/<verb>``): validation campaigns (issue 17).

====================  ==========  ========================================  ================
verb                  role        args                                      notes
====================  ==========  ========================================  ================
campaign_start        operator    {campaign_id, plan}                       leader only
campaign_status       reader      {}
campaign_abort        operator    {reason}                                  leader only
====================  ==========  ========================================  ================

The handlers are synchronous and do no I/O (the router's contract): ``campaign_start``
checks that the leader has read the record (``not_ready``), the plan against the topology
(`rlc.core.campaign_plan.check_plan`: ``invalid_args`` naming every problem) and that no
campaign is under way (``campaign_running``), then hands it
to the fleet task (`rlc.campaign_driver.CampaignDriver.request_start`), which writes the
campaign's record to the KV bucket **before** it sends a single order. ``campaign_abort``
likewise (``no_campaign`` without one). Only the leader answers: with ``[leadership]`` a replica not
leading ignores commands (`rlc.app.Rlc`), and one that lost the lead while handling refuses
with ``not_leader``. The plan's numbers are bounded by its own model (`CampaignPlan`: durations
1 s .. 1 day, powers up to 1 GW, at most 16 stages); the payload by
``commands.max_payload_bytes``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from rackplane.commands import (
    CommandArgs,
    CommandContext,
    CommandRouter,
    DaemonContract,
    NoArgs,
    register_bounded,
)
from rackplane.core.pair_sync import HandoverArgs
from rackplane.errors import CommandError
from rackplane.settings import Role
from rlc.core.campaign_plan import CampaignPlan

if TYPE_CHECKING:
    from rlc.campaign_driver import CampaignDriver

__all__ = ["NOT_LEADER", "register_rlc_commands", "rlc_contract", "rlc_verb_args"]

NOT_LEADER = "not_leader"


class CampaignStartArgs(CommandArgs):
    """``campaign_start``: run ``plan`` (rlc/core/campaign_plan.py) as ``campaign_id``."""

    campaign_id: str = Field(pattern=r"^[A-Za-z0-9_.:-]{1,64}$",
                             description="the campaign's name (in every report and order)")
    plan: CampaignPlan


class CampaignAbortArgs(CommandArgs):
    """``campaign_abort``: stop the campaign: running validations aborted, nothing starts."""

    reason: str = Field(max_length=200, description="why (logged, audited, in the record)")


class CampaignStatus(BaseModel):
    """``rlc/state/campaign`` (retained) and ``campaign_status``'s reply."""

    campaign_id: str | None
    aborted: str | None = None
    racks: dict[str, Any] = Field(default_factory=dict, description="rack -> {status, "
                                  "stage, run, run_state, verdict, passes, quarantine, "
                                  "blocked, judge_epoch}")
    runs: dict[str, Any] = Field(default_factory=dict, description="run id -> {stage, racks, "
                                 "state}")
    pending: str | None = Field(None, description="a start or abort not yet written")
    record_too_large_bytes: int | None = Field(
        None, description="the last step's record size when it stayed above "
        "campaign.max_record_bytes (not written, nothing sent), bytes")
    counts: dict[str, int] = Field(default_factory=dict)


_VERBS: dict[str, tuple[type[CommandArgs], Role]] = {
    "campaign_start": (CampaignStartArgs, "operator"),
    "campaign_status": (NoArgs, "reader"),
    "campaign_abort": (CampaignAbortArgs, "operator"),
}


def rlc_verb_args() -> dict[str, type[BaseModel]]:
    """verb -> args model (for the schemas)."""
    return {v: m for v, (m, _r) in _VERBS.items()}


def rlc_contract() -> DaemonContract:
    """rlc's verbs and state models (``rackctl schemas``, docs/COMMANDS.md)."""
    # ``handover``: registered by the frame (rackplane.daemon): one of a pair hands over, a
    # single instance refuses it with not_paired
    return DaemonContract("rlc", {**_VERBS, "handover": (HandoverArgs, "operator")},
                          {"campaign": CampaignStatus},
                          "The fleet controller: validation campaigns (rlc/commands.py).")


def register_rlc_commands(router: CommandRouter, driver: CampaignDriver,
                          leading: Callable[[], bool]) -> None:
    """Register rlc's verbs (module docstring) on ``router``; ``leading()``: may this replica
    act now."""

    def lead() -> None:
        if not leading():
            raise CommandError(NOT_LEADER, "this rlc replica is not leading: ask the leader")

    def start(a: CampaignStartArgs, ctx: CommandContext) -> dict[str, Any]:
        lead()
        driver.request_start(a.campaign_id, a.plan, ctx.user)
        return driver.status(ctx.wall_ns / 1e9)

    def status(_a: NoArgs, ctx: CommandContext) -> dict[str, Any]:
        return driver.status(ctx.wall_ns / 1e9)

    def abort(a: CampaignAbortArgs, ctx: CommandContext) -> dict[str, Any]:
        lead()
        driver.request_abort(a.reason, ctx.user)
        return driver.status(ctx.wall_ns / 1e9)

    handlers: dict[str, Callable[[Any, CommandContext], dict[str, Any]]] = {
        "campaign_start": start, "campaign_status": status, "campaign_abort": abort}
    for verb, (model, role) in _VERBS.items():
        register_bounded(router, verb, model, handlers[verb], role, {})
