"""valvey's auto-commissioning verbs (issue 21; `valvey.core.commissioning`), registered by
`valvey.commands.register_valvey_commands` with the others (the table there lists them):

* ``start_commissioning {step_pct, discard_pending}`` (operator): from a steady state in
  auto; ``step_pct`` bounded by ``commissioning.max_step_pct`` either way (``out_of_range``;
  at least ``min_step_pct`` in size), refused ``commissioning_refused`` naming why, and
  ``commissioning_pending`` while a proposal awaits accept / reject unless
  ``discard_pending`` (the reply's ``changed.commissioning.discarded_proposal`` and the log
  line ``commissioning_proposal_discarded`` then carry it);
* ``accept_commissioning {}``: apply the proposal (``no_commissioning_proposal``,
  ``proposal_not_acceptable`` for a failed identification);
* ``reject_commissioning {}``: abort a run (the valve back where it was) or discard a proposal
  (``no_commissioning`` when there is neither).

Every one moves the facility valve (lease and interlock checks by the caller's ``check``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import Field

from rackplane.commands import ArgBound, CommandArgs, CommandContext, NoArgs, json_limits
from rackplane.log import get_logger
from rackplane.settings import Role
from valvey.core.commissioning import STEP_MAX_PCT
from valvey.core.controller import ValveyCore

__all__ = ["COMMISSIONING_VERBS", "StartCommissioningArgs", "commissioning_handlers",
           "commissioning_step_bound"]


class StartCommissioningArgs(CommandArgs):
    """``start_commissioning``: from a steady state in auto, step the valve by ``step_pct``,
    identify the loop and propose PI gains, the feedforward gain and the valve stroke
    (valvey.core.commissioning); nothing changes until ``accept_commissioning``."""

    step_pct: float = Field(allow_inf_nan=False,
                            json_schema_extra=json_limits(-STEP_MAX_PCT, STEP_MAX_PCT),
                            description="valve step [%], commissioning.min_step_pct to "
                            "max_step_pct in size (out_of_range); + opens (supply falls)")
    discard_pending: bool = Field(
        False, description="discard a proposal not yet accepted or rejected (reported in the "
        "reply's changed.commissioning.discarded_proposal); false: refused "
        "(commissioning_pending) while one is pending")


COMMISSIONING_VERBS: dict[str, tuple[type[CommandArgs], Role]] = {
    "start_commissioning": (StartCommissioningArgs, "operator"),
    "accept_commissioning": (NoArgs, "operator"),
    "reject_commissioning": (NoArgs, "operator"),
}


def commissioning_step_bound(core: ValveyCore) -> ArgBound:
    """``start_commissioning``'s ``step_pct`` bound from the live config."""
    c = core.commissioning.s
    return ArgBound(-c.max_step_pct, c.max_step_pct, "%",
                    "commissioning.max_step_pct either way (at least min_step_pct in size)")


def commissioning_handlers(
    core: ValveyCore, check: Callable[[CommandContext], None],
    now_mono: Callable[[CommandContext], float],
) -> dict[str, Callable[[Any, CommandContext], dict[str, Any]]]:
    """The verbs' handlers on ``core``: ``check(ctx)`` first (leases, interlocks), then the
    change (`CommandError` before any). Each returns `valvey.commands.loop_state` with
    ``changed.commissioning``."""
    from valvey.commands import loop_state  # the shared reply state (no import cycle)

    def start(args: StartCommissioningArgs, ctx: CommandContext) -> dict[str, Any]:
        check(ctx)
        c = core.commissioning
        before = c.phase
        pending = c.proposal if before == "proposed" else None
        target = c.start(core, now_mono(ctx), args.step_pct,
                         discard_pending=args.discard_pending)
        changed: dict[str, Any] = {"from": before, "to": "stepping",
                                   "valve_target_pct": target}
        if pending is not None:
            changed["discarded_proposal"] = pending
            get_logger("valvey").warning("commissioning_proposal_discarded", user=ctx.user,
                                         request_id=ctx.request_id, proposal=pending)
        return loop_state(core, {"commissioning": changed})

    def accept(_args: NoArgs, ctx: CommandContext) -> dict[str, Any]:
        check(ctx)
        applied = core.commissioning.accept(core)
        return loop_state(core, {"commissioning": {"from": "proposed", "to": "accepted",
                                                   "applied": applied}})

    def reject(_args: NoArgs, ctx: CommandContext) -> dict[str, Any]:
        check(ctx)
        before = core.commissioning.reject(core)
        after = core.commissioning.phase
        return loop_state(core, {"commissioning": {"from": before, "to": after}})

    return {"start_commissioning": start, "accept_commissioning": accept,
            "reject_commissioning": reject}
