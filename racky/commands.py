"""racky's command verbs (DESIGN §3 ``cmd/<user>/<verb>``; CONTRACTS.md: what valvey asks).

The router (`rackplane.commands.CommandRouter`) does the envelope, TTL, roles, de-duplication,
reply and audit; these handlers are synchronous operations on the `racky.core.controller.RackyCore`
(validate, then mutate; time from the `CommandContext`).

====================  ==========  ========================================  ================
verb                  role        args                                      notes
====================  ==========  ========================================  ================
get_state             reader      {}
power_down_trays      automation  {trays: [0..], reason}                    safety (S6 b)
power_down_rack       automation  {reason}                                  safety (S6 c/d)
cap_rack              automation  {power_w, reason, ttl_s}                  derating; renew
release_cap           automation  {reason}                                  the user's cap
power_up_trays        operator    {trays, reason}                           sequenced
power_up_rack         operator    {reason}                                  sequenced
set_budget            operator    {power_w | null, reason}                persisted, <= fleet grant
set_lifecycle         operator    {state, reason, evidence?}                gated (fleet: rlc)
start_validation      operator    {stage, trays?, load_s?, backend_s?,      run_id: idempotent
                                   run_id?}
abort_validation      operator    {reason}
ack_alarm             operator    {alarm_id}
shelve_alarm          operator    {alarm_id, duration_s}
set_tray_cap          operator    {trays, power_w, ttl_s, reason}           node cap; lease
clear_tray_cap        operator    {trays, reason}                           lease-checked
cycle_trays           operator    {trays, off_s, reason}                    off, then on
====================  ==========  ========================================  ================

**Safety verbs** (``power_down_trays``, ``power_down_rack``) are exempt from the blast-radius
limit, the lease check and any start-up inhibit, and their node-agent commands go out at once
(not at the next tick). ``cap_rack`` counts against the blast radius (a renewal of the same cap
does not), so do ``set_tray_cap`` (one action; a renewal is not) and ``cycle_trays`` (one
per tray). Replies carry ``rack_power_w``, ``power_confirmed_low`` (every tray racky switched
off reports off, and the rack is below ``power.confirmed_low_w`` when all are: valvey may then
isolate the liquid, S6 c/d), the limit and the requested caps.

**Leases** (DESIGN §1) are another module's (`rackplane.core.leases`); the seam here is the
``lease_check(output, ctx, *, require_lease=False)`` callable given to
`register_racky_commands` (`rackplane.commands.LeaseGate.check`), called before a non-safety
verb mutates (outputs ``rack_cap``, ``rack_budget``, ``tray:NN``, ``lifecycle``), raising
`CommandError` (``lease_held``, ``lease_required``, ``interlock_active``...) to refuse.
``set_tray_cap`` (the node cap override) needs the user to hold the lease of every
``tray:NN`` it caps (``require_lease=True``). The default allows everything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

from rackplane.commands import (
    ArgBound,
    ArgProblem,
    CommandArgs,
    CommandContext,
    CommandRouter,
    DaemonContract,
    NoArgs,
    VerbBounds,
    json_limits,
    register_bounded,
)
from rackplane.config import StrictModel
from rackplane.core import names
from rackplane.core.alarms import DEFAULT_MAX_SHELVE_S, AlarmEvent
from rackplane.core.pair_sync import HandoverArgs
from rackplane.log import get_logger
from rackplane.settings import Role
from racky.core.agent_settings import AgentCommand
from racky.core.campaign_gate import RUN_ID_PATTERN
from racky.core.controller import RackyCore
from racky.fleet_settings import BEYOND_GRANT

__all__ = ["SAFETY_VERBS", "LeaseCheck", "racky_arg_bounds", "racky_contract",
           "racky_verb_args", "register_racky_commands"]

ALARM_ID_PATTERN = names.ALARM_ID_PATTERN  # rackplane.core.alarms AlarmDef.id
SAFETY_VERBS = frozenset({"power_down_trays", "power_down_rack"})

Reason = Field(max_length=200, description="why (logged, audited, shown in the state)")


class TraysArgs(CommandArgs):
    """Trays (0-based, 1-64 of them) and why."""

    trays: list[int] = Field(min_length=1, max_length=64, description="0-based tray indices")
    reason: str = Reason


class ReasonArgs(CommandArgs):
    """Only a reason."""

    reason: str = Reason


class CapRackArgs(CommandArgs):
    """``cap_rack``: cap the rack at ``power_w`` for ``ttl_s`` (re-send to renew)."""

    power_w: float = Field(allow_inf_nan=False, description="rack cap, W, within "
                           "[node_agents.non_tray_power_w, power.rack_capacity_w]")
    reason: str = Reason
    ttl_s: float = Field(allow_inf_nan=False, description="expiry, s",
                         json_schema_extra=json_limits(1.0, 3600.0))


class TrayCapArgs(CommandArgs):
    """``set_tray_cap``: node cap override: cap each of ``trays`` at ``power_w`` (never above
    racky's own allocation: the agents get the lower of both) until ``ttl_s`` or
    ``clear_tray_cap``; only under a lease on every ``tray:NN``. ``power_w`` must lie
    within the agents' lowest tray cap and a tray's largest draw (``out_of_range``)."""

    trays: list[int] = Field(min_length=1, max_length=64, description="0-based tray indices")
    power_w: float = Field(allow_inf_nan=False, description="per-tray cap, W, within the "
                           "agents' lowest tray cap .. a tray's largest draw")
    ttl_s: float = Field(allow_inf_nan=False, description="expiry, s",
                         json_schema_extra=json_limits(1.0, 86_400.0))
    reason: str = Reason


class CycleTraysArgs(CommandArgs):
    """``cycle_trays``: power ``trays`` off now, then on again through the sequencer (its
    inrush limit) after ``off_s`` (not a safety power-down: not persisted)."""

    trays: list[int] = Field(min_length=1, max_length=64, description="0-based tray indices")
    off_s: float = Field(10.0, allow_inf_nan=False, description="time off, s",
                         json_schema_extra=json_limits(1.0, 600.0))
    reason: str = Reason


class SetBudgetArgs(CommandArgs):
    """``set_budget``: the rack budget in W (null: back to the config's), within the rack's
    floor (every tray at its lowest cap plus the power outside the trays) and
    ``power.rack_capacity_w`` (``out_of_range``); in fleet mode at most the rack's fleet
    grant (``beyond_grant``: budgets move through rlc)."""

    power_w: float | None = Field(allow_inf_nan=False, description="W, or null")
    reason: str = Reason


class PassRef(StrictModel):
    """One stage's pass in a production order's evidence: the run and its judge's epoch."""

    run_id: str = Field(pattern=RUN_ID_PATTERN)
    judge_epoch: int = Field(ge=0, le=2**63 - 1)


class Evidence(StrictModel):
    """A campaign's passes behind a production order (racky/core/campaign_gate.py)."""

    campaign: str = Field(max_length=80)
    passes: dict[str, PassRef] = Field(max_length=16, description="stage -> its pass")


class SetLifecycleArgs(CommandArgs):
    """``set_lifecycle``: production <-> maintenance, quarantine (racky/lifecycle.py). In
    fleet mode production only from rlc with ``evidence`` (racky/core/campaign_gate.py:
    ``production_gated``, ``evidence_refused``)."""

    state: Literal["provisioning", "validating", "production", "maintenance", "quarantined"]
    reason: str = Reason
    evidence: Evidence | None = Field(None, description="fleet mode, production: the "
                                      "campaign's passes (rlc)")


class StartValidationArgs(CommandArgs):
    """``start_validation``: record and judge a validation stage while a burn-in runs."""

    stage: Literal["node", "rack", "multi-rack"]
    trays: list[int] | None = Field(None, max_length=64, description="node stage: trays")
    load_s: float | None = Field(None, allow_inf_nan=False, description="s; default "
                                 "validation.load_s", json_schema_extra=json_limits(1.0, 86_400.0))
    backend_s: float | None = Field(None, allow_inf_nan=False, description="s; default "
                                    "validation.backend_s",
                                    json_schema_extra=json_limits(0.0, 86_400.0))
    run_id: str | None = Field(None, pattern=RUN_ID_PATTERN, description="a campaign's run "
                               "(rlc): the same id again is answered, never started twice")


class AckAlarmArgs(CommandArgs):
    """``ack_alarm``."""

    alarm_id: str = Field(pattern=ALARM_ID_PATTERN)


class ShelveAlarmArgs(CommandArgs):
    """``shelve_alarm`` for ``duration_s`` (60 s to 8 h, ISA-18.2 time-limited shelving)."""

    alarm_id: str = Field(pattern=ALARM_ID_PATTERN)
    duration_s: float = Field(allow_inf_nan=False,
                              json_schema_extra=json_limits(60.0, DEFAULT_MAX_SHELVE_S))


class RackPowerState(StrictModel):
    """``racky/state/rack_power`` (retained, 1 Hz; valvey's feedforward input)."""

    rack_power_w: float | None = Field(
        description="sum of the shelves' DC output, W; null unless every configured or "
        "discovered shelf reports (a partial sum would understate the rack)")
    rack_input_w: float | None = Field(
        None, description="sum of the shelves' AC input, W (what rlc's leases and a row's "
        "feed limit are on); null unless every shelf reports it")
    it_power_w: float | None = Field(None, description="rack IT load (BBU share included), W")
    shelves_reporting: int
    shelves_configured: int
    ts_ns: int


class RackState(BaseModel):
    """``racky/state/rack`` (retained): lifecycle, limits and caps, redundancy, trays,
    validation, link and thermal summaries (racky.core.RackyCore.state)."""

    lifecycle: dict[str, Any]
    rack_power_w: float | None
    power_confirmed_low: bool
    limit_w: float | None
    limit_source: str
    limits: dict[str, float | None]
    budget_w: float | None
    requested_caps: dict[str, Any]
    derate_w: float | None
    capacity_cap_w: float | None
    tray_caps_w: dict[str, float]
    protective_gpu_caps_w: dict[str, float]
    redundancy: dict[str, Any] | None
    trays_off: list[int]
    safety_off: dict[str, Any]
    sequencing: list[dict[str, Any]]
    tray_cap_overrides: dict[str, Any] = Field(
        default_factory=dict, description="node cap overrides (set_tray_cap): tray -> "
        "{power_w, by, reason, expires_in_s}")
    cycling: list[dict[str, Any]] = Field(
        default_factory=list, description="trays in a power cycle: {tray, on_in_s}")
    validation: dict[str, Any] | None
    last_validation: dict[str, Any] | None
    judge_epoch: int = Field(0, description="racky's leadership epoch (0: single): the "
                             "epoch its validation results carry (rlc's gate)")
    cap_reasserts: int
    blast_radius_used: int
    alarms: list[str]
    links: dict[str, Any] | None
    thermal: dict[str, Any] | None
    ts_ns: int | None = None


_VERBS: dict[str, tuple[type[CommandArgs], Role]] = {
    "get_state": (NoArgs, "reader"),
    "power_down_trays": (TraysArgs, "automation"),
    "power_down_rack": (ReasonArgs, "automation"),
    "cap_rack": (CapRackArgs, "automation"),
    "release_cap": (ReasonArgs, "automation"),
    "power_up_trays": (TraysArgs, "operator"),
    "power_up_rack": (ReasonArgs, "operator"),
    "set_budget": (SetBudgetArgs, "operator"),
    "set_lifecycle": (SetLifecycleArgs, "operator"),
    "start_validation": (StartValidationArgs, "operator"),
    "abort_validation": (ReasonArgs, "operator"),
    "ack_alarm": (AckAlarmArgs, "operator"),
    "shelve_alarm": (ShelveAlarmArgs, "operator"),
    "set_tray_cap": (TrayCapArgs, "operator"),
    "clear_tray_cap": (TraysArgs, "operator"),
    "cycle_trays": (CycleTraysArgs, "operator"),
}

class LeaseCheck(Protocol):
    """``lease_check(output, ctx, *, require_lease=False)``: raise `CommandError` to refuse
    (the seam for leases; `rackplane.commands.LeaseGate.check` has this shape)."""

    def __call__(self, output: str, ctx: CommandContext, *,
                 require_lease: bool = False) -> None: ...


def _allow(_output: str, _ctx: CommandContext, *, require_lease: bool = False) -> None:
    return None


def racky_verb_args() -> dict[str, type[BaseModel]]:
    """verb -> args model (for the schemas)."""
    return {v: m for v, (m, _r) in _VERBS.items()}


def racky_contract() -> DaemonContract:
    """racky's verbs and state models (``rackctl schemas``, docs/COMMANDS.md)."""
    # ``handover``: registered by the frame (rackplane.daemon): one of a pair hands over, a
    # single instance refuses it with not_paired
    return DaemonContract(
        "racky", {**_VERBS, "handover": (HandoverArgs, "operator")},
        {"rack_power": RackPowerState, "rack": RackState},
        "The rack power and infrastructure manager (racky/commands.py).",
    )


def register_racky_commands(
    router: CommandRouter,
    core: RackyCore,
    *,
    send: Callable[[list[AgentCommand]], None],
    on_alarm_events: Callable[[list[AlarmEvent]], None] | None = None,
    lease_check: LeaseCheck | None = None,
) -> None:
    """Register racky's verbs (module docstring) on ``router``.

    Args:
        core: the daemon's core.
        send: queues node-agent commands at once (safety power-downs); must not raise.
        on_alarm_events: publishes events an ack/shelve produced (must not raise).
        lease_check: the lease seam (default: allow).
    """
    check = lease_check or _allow
    log = get_logger(__name__)

    def reply(extra: dict[str, Any] | None = None) -> dict[str, Any]:
        st = core.state()
        out = {
            "rack_power_w": st["rack_power_w"], "power_confirmed_low": st["power_confirmed_low"],
            "limit_w": st["limit_w"], "limit_source": st["limit_source"],
            "requested_caps": st["requested_caps"], "trays_off": st["trays_off"],
            "lifecycle": st["lifecycle"]["state"], "budget_w": st["budget_w"],
        }
        if extra:
            out.update(extra)
        return out

    def publish(events: list[AlarmEvent]) -> None:
        if events and on_alarm_events is not None:
            try:
                on_alarm_events(events)
            except Exception as err:  # the change is made: never turn this into a refusal
                log.error("command_alarm_events_failed", error=repr(err))

    def now_mono(ctx: CommandContext) -> float:
        last = core.last
        return ctx.now_mono if last is None else max(ctx.now_mono, last.t_mono)

    def get_state(_a: NoArgs, _ctx: CommandContext) -> dict[str, Any]:
        return core.state()

    def power_down_trays(a: TraysArgs, ctx: CommandContext) -> dict[str, Any]:
        cmds = core.power_down_trays(a.trays, a.reason, ctx.user, now_mono(ctx), ctx.wall_ns)
        send(cmds)
        return reply({"powered_down": sorted(set(a.trays))})

    def power_down_rack(a: ReasonArgs, ctx: CommandContext) -> dict[str, Any]:
        send(core.power_down_rack(a.reason, ctx.user, now_mono(ctx), ctx.wall_ns))
        return reply({"powered_down": list(range(core.n_trays))})

    def cap_rack(a: CapRackArgs, ctx: CommandContext) -> dict[str, Any]:
        check("rack_cap", ctx)
        core.cap_rack(ctx.user, a.power_w, a.ttl_s, a.reason, now_mono(ctx))
        return reply()

    def release_cap(a: ReasonArgs, ctx: CommandContext) -> dict[str, Any]:
        check("rack_cap", ctx)
        released = core.release_cap(ctx.user, now_mono(ctx))
        return reply({"released": released})

    def power_up_trays(a: TraysArgs, ctx: CommandContext) -> dict[str, Any]:
        core.check_trays(a.trays)
        for t in sorted(set(a.trays)):
            check(f"tray:{t:02d}", ctx)
        queued = core.power_up_trays(a.trays, a.reason, now_mono(ctx))
        return reply({"queued": queued})

    def power_up_rack(a: ReasonArgs, ctx: CommandContext) -> dict[str, Any]:
        for t in range(core.n_trays):
            check(f"tray:{t:02d}", ctx)
        queued = core.power_up_trays(list(range(core.n_trays)), a.reason, now_mono(ctx))
        return reply({"queued": queued})

    def set_budget(a: SetBudgetArgs, ctx: CommandContext) -> dict[str, Any]:
        check("rack_budget", ctx)  # the fleet grant: an argument check (`beyond_grant`)
        before = core.budget_w
        core.set_budget(a.power_w)
        return reply({"changed": {"budget_w": {"from": before, "to": core.budget_w}}})

    def set_lifecycle(a: SetLifecycleArgs, ctx: CommandContext) -> dict[str, Any]:
        check("lifecycle", ctx)
        before = core.persisted.lifecycle.state
        core.set_lifecycle(a.state, a.reason, ctx.user, ctx.wall_ns,
                           None if a.evidence is None else a.evidence.model_dump())
        after = core.persisted.lifecycle.state
        changed = {} if before == after else {"lifecycle": {"from": before, "to": after}}
        return reply({"changed": changed})

    def start_validation(a: StartValidationArgs, ctx: CommandContext) -> dict[str, Any]:
        check("lifecycle", ctx)
        if a.run_id is not None:  # a campaign's run re-issued: answered, never run twice
            v = core.validation
            if v is not None and v.run_id == a.run_id:
                return reply({"validation": {"stage": v.stage, "duration_s": v.duration_s,
                                             "run_id": v.run_id, "again": True}})
            done = [j for j in core.persisted.judged_runs if j.run_id == a.run_id]
            if done:
                return reply({"judged": done[-1].as_json()})
        run = core.start_validation(a.stage, now_mono(ctx), ctx.wall_ns, ctx.user, a.trays,
                                    a.load_s, a.backend_s, a.run_id)
        return reply({"validation": {"stage": run.stage, "duration_s": run.duration_s,
                                     "phases": [list(p) for p in run.phases],
                                     "run_id": run.run_id}})

    def abort_validation(a: ReasonArgs, ctx: CommandContext) -> dict[str, Any]:
        check("lifecycle", ctx)
        core.abort_validation(ctx.user, ctx.wall_ns)
        return reply()

    def ack_alarm(a: AckAlarmArgs, ctx: CommandContext) -> dict[str, Any]:
        events = core.bank.ack(a.alarm_id, ctx.user, now_mono(ctx))
        publish(events)
        return reply({"alarm": {"id": a.alarm_id, "events": [e.kind for e in events]}})

    def shelve_alarm(a: ShelveAlarmArgs, ctx: CommandContext) -> dict[str, Any]:
        now = now_mono(ctx)
        events = core.bank.shelve(a.alarm_id, ctx.user, now + a.duration_s, now)
        publish(events)
        return reply({"alarm": {"id": a.alarm_id, "shelved_for_s": a.duration_s}})

    def set_tray_cap(a: TrayCapArgs, ctx: CommandContext) -> dict[str, Any]:
        ts = core.check_trays(a.trays)  # unknown_tray before anything
        for t in ts:
            check(f"tray:{t:02d}", ctx, require_lease=True)
        now = now_mono(ctx)
        core.set_tray_cap_override(ts, a.power_w, now + a.ttl_s, a.reason, ctx.user, now)
        return reply({"tray_cap_overrides": core.state()["tray_cap_overrides"]})

    def clear_tray_cap(a: TraysArgs, ctx: CommandContext) -> dict[str, Any]:
        ts = core.check_trays(a.trays)
        for t in ts:
            check(f"tray:{t:02d}", ctx)
        return reply({"cleared": core.clear_tray_cap_override(ts, now_mono(ctx))})

    def cycle_trays(a: CycleTraysArgs, ctx: CommandContext) -> dict[str, Any]:
        ts = core.check_trays(a.trays)
        for t in ts:
            check(f"tray:{t:02d}", ctx)
        send(core.cycle_trays(ts, a.off_s, a.reason, ctx.user, now_mono(ctx)))
        return reply({"cycling": ts, "on_after_s": a.off_s})

    handlers: dict[str, Callable[[Any, CommandContext], dict[str, Any]]] = {
        "get_state": get_state, "power_down_trays": power_down_trays,
        "power_down_rack": power_down_rack, "cap_rack": cap_rack, "release_cap": release_cap,
        "power_up_trays": power_up_trays, "power_up_rack": power_up_rack,
        "set_budget": set_budget, "set_lifecycle": set_lifecycle,
        "start_validation": start_validation, "abort_validation": abort_validation,
        "ack_alarm": ack_alarm, "shelve_alarm": shelve_alarm,
        "set_tray_cap": set_tray_cap, "clear_tray_cap": clear_tray_cap,
        "cycle_trays": cycle_trays,
    }
    bounds = racky_arg_bounds(core)

    def beyond_grant(values: Mapping[str, Any]) -> list[ArgProblem]:
        # set_budget above the rack's fleet grant: named with the other argument problems
        grant, w = core.fleet_budget_w, values.get("power_w")
        if grant is None or isinstance(w, bool) or not isinstance(w, int | float) or w <= grant:
            return []
        return [("power_w", BEYOND_GRANT, f"args.power_w = {w:g} W is above this rack's "
                 f"fleet grant {grant:g} W: change budgets through rlc")]

    more = {"set_budget": beyond_grant}
    for verb, (model, role) in _VERBS.items():
        register_bounded(router, verb, model, handlers[verb], role, bounds.get(verb, {}),
                         more.get(verb))


SHELVE_MIN_S = 60.0
"""Shortest shelve, s (a shorter one is a mis-typed unit more often than a need)."""


def racky_arg_bounds(core: RackyCore) -> dict[str, VerbBounds]:
    """verb -> field -> bound provider: every numeric argument of racky's verbs (issue 14
    item 2), read from the core's config (and its measured non-GPU share) at each command.

    ``set_budget``: the rack's floor .. ``power.rack_capacity_w``. ``cap_rack`` (a derating
    request) may go below the floor, when cooling cannot carry even that the trays go to
    their minimum and ``budget_infeasible`` alarms, but not below the power outside the
    trays (no rack power at all: a unit mistake). Tray caps: the agents' lowest tray cap ..
    a tray's largest draw. Tray indices: ``unknown_tray`` outside the rack."""
    def floor_w() -> float:
        return core.n_trays * core.alloc.tray_min_w + core.cfg.node_agents.non_tray_power_w

    def budget() -> ArgBound:
        return ArgBound(floor_w(), core.cfg.power.rack_capacity_w, "W",
                        "the rack's floor: trays × lowest tray cap + "
                        "node_agents.non_tray_power_w .. power.rack_capacity_w")

    def rack_cap() -> ArgBound:
        return ArgBound(core.cfg.node_agents.non_tray_power_w, core.cfg.power.rack_capacity_w,
                        "W", "node_agents.non_tray_power_w .. power.rack_capacity_w")

    def tray_cap() -> ArgBound:
        return ArgBound(core.alloc.tray_min_w, core.alloc.tray_max_w, "W",
                        "the agents' lowest tray cap (node_agents.gpu_min_power_limit_w) .. a "
                        "tray's largest draw (node_agents.gpu_tgp_w)")

    def trays() -> ArgBound:
        return ArgBound(0, core.n_trays - 1, "", "tray indices 0 .. node_agents.trays − 1",
                        code="unknown_tray")

    def const(lo: float, hi: float, source: str, *, lo_open: bool = False
              ) -> Callable[[], ArgBound]:
        b = ArgBound(lo, hi, "s", source, lo_open=lo_open)
        return lambda: b

    day = 86_400.0
    return {
        "power_down_trays": {"trays": trays},
        "power_up_trays": {"trays": trays},
        "clear_tray_cap": {"trays": trays},
        "cap_rack": {"power_w": rack_cap,
                     "ttl_s": const(1.0, 3600.0, "a derating request lives 1 s .. 1 h "
                                    "(valvey renews it every ttl_s / 3)")},
        "set_budget": {"power_w": budget},
        "start_validation": {"trays": trays,
                             "load_s": const(1.0, day, "a validation phase: 1 s .. 1 day"),
                             "backend_s": const(0.0, day, "a validation phase: 0 .. 1 day")},
        "shelve_alarm": {"duration_s": const(SHELVE_MIN_S, DEFAULT_MAX_SHELVE_S,
                                             "ISA-18.2 time-limited shelving: 60 s .. 8 h")},
        "set_tray_cap": {"trays": trays, "power_w": tray_cap,
                         "ttl_s": const(1.0, day, "a node cap override: 1 s .. 1 day")},
        "cycle_trays": {"trays": trays,
                        "off_s": const(1.0, 600.0, "a power cycle's off time: 1 s .. 10 min")},
    }
