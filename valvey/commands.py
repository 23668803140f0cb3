"""valvey's command verbs on the supply-temperature loop and its alarms (DESIGN §1 commands,
§3 MQTT ``cmd/<user>/<verb>``). The router (`rackplane.commands.CommandRouter`) does the
envelope, TTL, roles, de-duplication, reply and audit; these handlers are pure, synchronous
operations on the `ValveyCore` (no awaits, no I/O, time from the `CommandContext`).

Verbs (least role; args; what the reply's ``state`` holds):

===================  ========  =========================================  ======================
verb                 role      args                                       refusals (error.code)
===================  ========  =========================================  ======================
get_state            reader    {}                                         -
set_setpoint         operator  {setpoint_c}  (ramped, REFERENCE §8)       out_of_range,
                                                                          invalid_value
set_mode             operator  {mode: auto | manual | shadow_on |         out_of_range
                               shadow_off, output_pct (manual only)}
ack_alarm            operator  {alarm_id}                                 unknown_alarm
shelve_alarm         operator  {alarm_id, duration_s: 60..28800}          unknown_alarm,
                                                                          invalid_shelve_time
set_dp_setpoint      operator  {dp_setpoint_kpa}  (pump loop, DP mode)    out_of_range,
                                                                          wrong_mode
set_flow_setpoint    operator  {flow_setpoint_lpm}  (flow mode)           out_of_range,
                                                                          wrong_mode
set_pump_lead        operator  {pump}  (planned changeover)               unknown_pump,
                                                                          pump_failed
rotate_pumps         operator  {}  (to the next healthy pump)             no_standby
reset_pump_faults    operator  {}                                         -
select_valve         operator  {valve, reset: bool}                       unknown_valve,
                                                                          valve_failed
set_feedforward      operator  {enabled}  (false: PID only)               -
start_step_test      operator  {step_pct}  (loop in manual)               not_manual,
                                                                          step_test_refused,
                                                                          out_of_range
accept_step_test     operator  {}  (the proposed SIMC PI gains)           no_step_test_result
cancel_step_test     operator  {}                                         -
start_commissioning  operator  {step_pct, discard_pending: bool}  (loop   out_of_range,
                               in auto, steady; bounds:                   commissioning_refused,
                               commissioning.min/max_step_pct)            commissioning_pending
accept_commissioning operator  {}  (the proposal: gains, FF, strokes)     no_commissioning_
                                                                          proposal, proposal_
                                                                          not_acceptable
reject_commissioning operator  {}  (abort a run / discard a proposal)     no_commissioning
reset_leak           operator  {reopen_isolation: bool}                   leak_still_wet
reset_learned        operator  {}  (learned valve strokes, FF map,        -
                               accepted commissioning gains, liquid
                               fraction, measured exchanger)
===================  ========  =========================================  ======================

Limits are the loop's config (``setpoint_min_c``..``setpoint_max_c``, ``output_min_pct``..
``output_max_pct``): a command can never push the valve past them (DESIGN §1). The shelve limit
of 8 h is ISA-18.2's "time-limited shelving" (`rackplane.core.alarms.DEFAULT_MAX_SHELVE_S`).

Leases (DESIGN §1): with the daemon's `LeaseGate` over `VALVEY_OUTPUTS`, every verb that
moves an output (`VERB_OUTPUTS`) is refused while an interlock holds it (``interlock_active``)
or another user leases it (``lease_held``); ``set_mode manual`` needs a lease on
``facility_valve`` (``lease_required``). ``get_state`` includes ``leases`` (the holders).
The retained state payloads' models are `valvey.states` (`VALVEY_STATES`, `valvey_contract`).

Every handler returns `ValveyCore.state()` with the loop's live settings laid over it
(``setpoint_c``, ``mode``, ``control_mode``, ``shadow``, ``alarms``: already the new values)
and, for the changing verbs, ``changed``: ``{name: {"from": old, "to": new}}`` (empty when the
command changed nothing, e.g. ``auto`` while already in auto). Measured values (supply
temperature, valve command, PID terms) are those of the last control tick; a new setpoint or
mode acts from the next tick.

Every handler validates before it mutates (the `SupplyLoop` and `AlarmEngine` methods raise
`CommandError` before changing anything), as the router's contract requires.

``rackctl schemas --write`` regenerates ``rackplane/schemas/*.schema.json``
(envelope, reply and these verbs' args).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rackplane.commands import (
    ArgBound,
    CommandArgs,
    CommandContext,
    CommandRouter,
    DaemonContract,
    LeaseGate,
    NoArgs,
    VerbBounds,
    json_limits,
    register_bounded,
)
from rackplane.core import names
from rackplane.core.alarms import DEFAULT_MAX_SHELVE_S, AlarmEvent
from rackplane.core.pair_sync import HandoverArgs
from rackplane.errors import CommandError
from rackplane.log import get_logger
from rackplane.settings import Role
from valvey.commissioning_commands import (
    COMMISSIONING_VERBS,
    commissioning_handlers,
    commissioning_step_bound,
)
from valvey.core.controller import ValveyCore
from valvey.states import (
    VALVEY_STATES,
    HealthState,
    PumpsState,
    SafetyState,
    SupplyLoopState,
    ValvesState,
)

__all__ = [
    "VALVEY_OUTPUTS",
    "VALVEY_STATES",
    "VERB_OUTPUTS",
    "AckAlarmArgs",
    "HealthState",
    "PumpsState",
    "SafetyState",
    "SetModeArgs",
    "SetSetpointArgs",
    "ShelveAlarmArgs",
    "SupplyLoopState",
    "ValvesState",
    "check_output_access",
    "register_valvey_commands",
    "valvey_arg_bounds",
    "valvey_contract",
    "valvey_verb_args",
]

ALARM_ID_PATTERN = names.ALARM_ID_PATTERN  # rackplane.core.alarms AlarmDef.id
SHELVE_MIN_S = 60.0
"""Shortest shelve [s]: a shorter one is a mis-typed unit more often than a need."""
STEP_TEST_MAX_PCT = 20.0
"""Largest step-test step [%] (a bump test moves the valve a few %, REFERENCE §2.2)."""


class SetSetpointArgs(CommandArgs):
    """``set_setpoint``: the coolant supply temperature setpoint [°C]. Refused with
    ``out_of_range`` outside the loop's configured [setpoint_min_c, setpoint_max_c]
    (defaults 25..48 °C)."""

    setpoint_c: float = Field(allow_inf_nan=False, description="new setpoint [°C]")


class SetModeArgs(CommandArgs):
    """``set_mode``: ``auto`` (bumpless from the current valve command), ``manual`` (the
    operator owns the valve: ``output_pct`` required, rate-limited, within the configured
    output limits), ``shadow_on`` / ``shadow_off`` (compute and log without writing)."""

    model_config = ConfigDict(json_schema_extra={
        "if": {"properties": {"mode": {"const": "manual"}}, "required": ["mode"]},
        "then": {"required": ["output_pct"], "properties": {"output_pct": {"type": "number"}}},
        "else": {"properties": {"output_pct": {"type": "null"}}},
    })

    mode: Literal["auto", "manual", "shadow_on", "shadow_off"]
    output_pct: float | None = Field(
        None, allow_inf_nan=False,
        description="valve output [%], manual only (and required there); within the loop's "
        "[output_min_pct, output_max_pct] (out_of_range)",
    )

    @model_validator(mode="after")
    def _output_for_manual(self) -> SetModeArgs:
        if self.mode == "manual" and self.output_pct is None:
            raise ValueError("output_pct is required for mode 'manual'")
        if self.mode != "manual" and self.output_pct is not None:
            raise ValueError(f"output_pct is only accepted with mode 'manual', not {self.mode!r}")
        return self


class AckAlarmArgs(CommandArgs):
    """``ack_alarm``: acknowledge an alarm (a latched one that has returned is reset).
    Idempotent; ``unknown_alarm`` for an id not defined."""

    alarm_id: str = Field(pattern=ALARM_ID_PATTERN, description="alarm id (alarm/<id> topic)")


class ShelveAlarmArgs(CommandArgs):
    """``shelve_alarm``: take an alarm out of annunciation for ``duration_s`` (it keeps
    tracking its condition and reappears when the shelve ends). Shelving again moves the
    end."""

    alarm_id: str = Field(pattern=ALARM_ID_PATTERN, description="alarm id (alarm/<id> topic)")
    duration_s: float = Field(
        allow_inf_nan=False, json_schema_extra=json_limits(SHELVE_MIN_S, DEFAULT_MAX_SHELVE_S),
        description="how long [s], 60 s to 8 h (ISA-18.2 time-limited shelving)",
    )


class SetDpSetpointArgs(CommandArgs):
    """``set_dp_setpoint``: the pump loop's differential-pressure setpoint [kPa], ramped;
    refused with ``wrong_mode`` when the pump loop controls flow, with ``out_of_range``
    outside [pump_loop.dp_setpoint_min_kpa, dp_setpoint_max_kpa] (the maximum is below the
    protective pump_loop.max_pressure_kpa)."""

    dp_setpoint_kpa: float = Field(allow_inf_nan=False,
                                   description="secondary DP setpoint [kPa]")


class SetFlowSetpointArgs(CommandArgs):
    """``set_flow_setpoint``: the pump loop's flow setpoint [L/min], ramped; refused with
    ``wrong_mode`` when the pump loop controls DP, with ``out_of_range`` outside
    [pump_loop.flow_setpoint_min_lpm, flow_setpoint_max_lpm]."""

    flow_setpoint_lpm: float = Field(allow_inf_nan=False,
                                     description="secondary flow setpoint [L/min]")


class SetPumpLeadArgs(CommandArgs):
    """``set_pump_lead``: make this pump the duty (lead) pump: a planned changeover (the CDU
    keeps the old pump running until the new one is at speed)."""

    pump: str = Field(pattern=r"^[a-z0-9]{1,8}$", description="pump name, e.g. a or b")


class SelectValveArgs(CommandArgs):
    """``select_valve``: drive this facility valve (the other is closed); ``reset`` forgets
    latched valve failures first (after a repair)."""

    valve: str = Field(pattern=r"^[a-z0-9]{1,8}$", description="valve name, a or b")
    reset: bool = False


class SetFeedforwardArgs(CommandArgs):
    """``set_feedforward``: dynamic feedforward from the rack power on or off (off: PID
    only, REFERENCE §4.5); bumpless either way."""

    enabled: bool


class StartStepTestArgs(CommandArgs):
    """``start_step_test``: with the loop in manual at a steady state, step the valve by
    ``step_pct`` and identify K, τ, θ (valvey.step_test)."""

    step_pct: float = Field(allow_inf_nan=False,
                            json_schema_extra=json_limits(-STEP_TEST_MAX_PCT, STEP_TEST_MAX_PCT),
                            description="valve step [%], 1 to 20 % in size (out_of_range); + "
                            "opens (supply falls)")

    @model_validator(mode="after")
    def _nonzero(self) -> StartStepTestArgs:
        if abs(self.step_pct) < 1.0:
            raise ValueError("step_pct must be at least 1 % in size")
        return self


class ResetLeakArgs(CommandArgs):
    """``reset_leak``: clear the latched leak response after repair (refused while a leak
    sensor is wet); ``reopen_isolation`` also opens the rack's isolation valves."""

    reopen_isolation: bool = False


_VERBS: dict[str, tuple[type[CommandArgs], Role]] = {
    "get_state": (NoArgs, "reader"),
    "set_setpoint": (SetSetpointArgs, "operator"),
    "set_mode": (SetModeArgs, "operator"),
    "ack_alarm": (AckAlarmArgs, "operator"),
    "shelve_alarm": (ShelveAlarmArgs, "operator"),
    "set_dp_setpoint": (SetDpSetpointArgs, "operator"),
    "set_flow_setpoint": (SetFlowSetpointArgs, "operator"),
    "set_pump_lead": (SetPumpLeadArgs, "operator"),
    "rotate_pumps": (NoArgs, "operator"),
    "reset_pump_faults": (NoArgs, "operator"),
    "select_valve": (SelectValveArgs, "operator"),
    "set_feedforward": (SetFeedforwardArgs, "operator"),
    "start_step_test": (StartStepTestArgs, "operator"),
    "accept_step_test": (NoArgs, "operator"),
    "cancel_step_test": (NoArgs, "operator"),
    **COMMISSIONING_VERBS,
    "reset_leak": (ResetLeakArgs, "operator"),
    "reset_learned": (NoArgs, "operator"),
}

#: The outputs each verb moves (the seam for leases: `check_output_access`).
VERB_OUTPUTS: dict[str, tuple[str, ...]] = {
    "set_setpoint": ("facility_valve",),
    "set_mode": ("facility_valve",),
    "set_dp_setpoint": ("pump_speed",),
    "set_flow_setpoint": ("pump_speed",),
    "set_pump_lead": ("duty_pump",),
    "rotate_pumps": ("duty_pump",),
    "select_valve": ("facility_valve",),
    "set_feedforward": ("facility_valve",),
    "start_step_test": ("facility_valve",),
    "accept_step_test": ("facility_valve",),
    "cancel_step_test": ("facility_valve",),
    **dict.fromkeys(COMMISSIONING_VERBS, ("facility_valve",)),
    "reset_leak": ("rack_isolation",),
    "reset_learned": ("facility_valve",),
}


VALVEY_OUTPUTS: dict[str, str] = {
    "facility_valve": "facility water valve: supply temperature loop, manual output",
    "pump_speed": "pump loop setpoint (differential pressure or flow)",
    "duty_pump": "duty (lead) pump selection",
    "rack_isolation": "rack liquid isolation valves",
}
"""valvey's leasable outputs (`rackplane.core.leases.LeaseTable`; ``state/leases``)."""


def check_output_access(
    verb: str, ctx: CommandContext, leases: LeaseGate | None = None, *,
    require_lease: bool = False,
) -> None:
    """**The lease check** (DESIGN §1): every verb that moves an output calls this before it
    changes anything: active safety interlocks first (``interlock_active``), then leases
    (``lease_held``; with ``require_lease``, ``lease_required`` without one). No ``leases``
    (a core driven without the daemon): allowed. Safety actions of the core never come
    through here: leases never hold them back.

    Raises:
        CommandError: ``interlock_active``, ``lease_held``, ``lease_required``.
    """
    if leases is None:
        return
    for output in VERB_OUTPUTS.get(verb, ()):
        leases.check(output, ctx, require_lease=require_lease)


def valvey_verb_args() -> dict[str, type[BaseModel]]:
    """verb -> args model, for `rackplane.commands.schema_documents` ({"valvey": ...})."""
    return {verb: model for verb, (model, _role) in _VERBS.items()}


class _HasCore(Protocol):
    core: ValveyCore


AlarmEventsSink = Callable[[list[AlarmEvent]], None]


def register_valvey_commands(
    router: CommandRouter,
    app_or_core: ValveyCore | _HasCore,
    *,
    on_alarm_events: AlarmEventsSink | None = None,
    leases: LeaseGate | None = None,
) -> None:
    """Register valvey's verbs (see the module docstring) on ``router``.

    Args:
        router: the daemon's command router.
        app_or_core: the `ValveyCore`, or an object with a ``core`` attribute (the daemon).
        on_alarm_events: called with the events an ack or shelve produced, to publish,
            log and write them like the tick's own (the daemon passes its alarm sink); its
            exceptions are logged, never turned into a refusal (the change is made).
        leases: the daemon's `LeaseGate` over `VALVEY_OUTPUTS` (manual valve output only
            under a lease; interlocks override every lease); None: no lease checks.

    Raises:
        ValueError: a verb is already registered on ``router``.
    """
    core = app_or_core if isinstance(app_or_core, ValveyCore) else app_or_core.core
    log = get_logger(__name__)

    def publish(events: list[AlarmEvent]) -> None:
        if not events or on_alarm_events is None:
            return
        try:
            on_alarm_events(events)
        except Exception as err:
            log.error("command_alarm_events_failed", error=repr(err), exc_info=True)

    def now_mono(ctx: CommandContext) -> float:
        # Alarm time must not go backwards against the tick's (AlarmEngine raises): the last
        # tick ran at or before this command on the same monotonic clock; the floor only
        # guards a caller feeding the core from another time base.
        last = core.last
        return ctx.now_mono if last is None else max(ctx.now_mono, last.loop.t_mono)

    def get_state(_args: NoArgs, ctx: CommandContext) -> dict[str, Any]:
        state = loop_state(core)
        if leases is not None:
            state["leases"] = leases.snapshot(ctx.now_mono)  # who holds each output
        return state

    def set_setpoint(args: SetSetpointArgs, ctx: CommandContext) -> dict[str, Any]:
        check_output_access(ctx.verb, ctx, leases)
        before = core.loop.setpoint_c
        core.loop.set_setpoint(args.setpoint_c)  # CommandError before any change
        return loop_state(core, _changes(setpoint_c=(before, core.loop.setpoint_c)))

    def set_mode(args: SetModeArgs, ctx: CommandContext) -> dict[str, Any]:
        # Manual output only under a lease (issue 6); auto / shadow: not while another
        # user holds the valve or an interlock does.
        check_output_access(ctx.verb, ctx, leases, require_lease=args.mode == "manual")
        loop = core.loop
        mode0, shadow0, command0 = loop.control_mode, loop.shadow, loop.command_pct
        if args.mode == "manual":
            assert args.output_pct is not None  # the model requires it
            loop.set_manual(args.output_pct)  # CommandError (out_of_range) before any change
        elif args.mode == "auto":
            loop.set_auto()
        else:
            loop.set_shadow(args.mode == "shadow_on")
        changes = _changes(control_mode=(mode0, loop.control_mode), shadow=(shadow0, loop.shadow))
        if args.mode == "manual":
            # The valve moves from its current command to the target at the rate limit.
            changes["valve_target_pct"] = {"from": command0, "to": args.output_pct}
        return loop_state(core, changes)

    def ack_alarm(args: AckAlarmArgs, ctx: CommandContext) -> dict[str, Any]:
        events = core.alarms.ack(args.alarm_id, ctx.user, now_mono(ctx))
        publish(events)
        return loop_state(core, {"alarm": _alarm_change(core, args.alarm_id, events)})

    def shelve_alarm(args: ShelveAlarmArgs, ctx: CommandContext) -> dict[str, Any]:
        now = now_mono(ctx)
        events = core.alarms.shelve(args.alarm_id, ctx.user, now + args.duration_s, now)
        publish(events)
        change = _alarm_change(core, args.alarm_id, events)
        # A normal alarm is shelved too (it stays quiet if it comes up meanwhile).
        change.update(shelved=True, shelved_until_mono=now + args.duration_s,
                      shelved_for_s=args.duration_s)
        return loop_state(core, {"alarm": change})

    def pump_setpoint(mode: str, value: float, ctx: CommandContext) -> dict[str, Any]:
        check_output_access(ctx.verb, ctx, leases)
        pumps = core.pumps
        if pumps.s.mode != mode:
            raise CommandError("wrong_mode", f"the pump loop controls {pumps.s.mode}, not "
                               f"{mode} (pump_loop.mode in the config)")
        before = pumps.setpoint
        try:
            pumps.set_setpoint(value)
        except ValueError as err:
            raise CommandError("out_of_range", str(err)) from None
        return loop_state(core, _changes(pump_setpoint=(before, pumps.setpoint)))

    def set_dp_setpoint(args: SetDpSetpointArgs, ctx: CommandContext) -> dict[str, Any]:
        return pump_setpoint("diff_pressure", args.dp_setpoint_kpa, ctx)

    def set_flow_setpoint(args: SetFlowSetpointArgs, ctx: CommandContext) -> dict[str, Any]:
        return pump_setpoint("flow", args.flow_setpoint_lpm, ctx)

    def set_pump_lead(args: SetPumpLeadArgs, ctx: CommandContext) -> dict[str, Any]:
        check_output_access(ctx.verb, ctx, leases)
        names = core.pumps.unit_names
        if args.pump not in names:
            raise CommandError("unknown_pump", f"no pump {args.pump!r} (pumps: {names})")
        before = names[core.pumps.duty]
        try:
            core.pumps.select_lead(names.index(args.pump), now_mono(ctx))
        except ValueError as err:
            raise CommandError("pump_failed", str(err)) from None
        return loop_state(core, _changes(duty_pump=(before, args.pump)))

    def rotate_pumps(_args: NoArgs, ctx: CommandContext) -> dict[str, Any]:
        check_output_access(ctx.verb, ctx, leases)
        names = core.pumps.unit_names
        before = names[core.pumps.duty]
        try:
            to = core.pumps.rotate(now_mono(ctx))
        except ValueError as err:
            raise CommandError("no_standby", str(err)) from None
        return loop_state(core, _changes(duty_pump=(before, names[to])))

    def reset_pump_faults(_args: NoArgs, _ctx: CommandContext) -> dict[str, Any]:
        names = core.pumps.reset_faults()
        return loop_state(core, {"pumps_reset": names})

    def select_valve(args: SelectValveArgs, ctx: CommandContext) -> dict[str, Any]:
        check_output_access(ctx.verb, ctx, leases)
        units = [u.name for u in core.valves.units]
        if args.valve not in units:
            raise CommandError("unknown_valve", f"no valve {args.valve!r} (valves: {units})")
        before = core.valves.active_unit.name
        try:
            writes = core.valves.select(units.index(args.valve), core.loop.command_pct,
                                        reset=args.reset)
        except ValueError as err:
            raise CommandError("valve_failed", str(err)) from None
        core.queue_writes(writes)
        return loop_state(core, _changes(valve=(before, args.valve)))

    def set_feedforward(args: SetFeedforwardArgs, ctx: CommandContext) -> dict[str, Any]:
        check_output_access(ctx.verb, ctx, leases)
        before = core.ff.settings.enabled
        core.set_feedforward(args.enabled)
        return loop_state(core, _changes(feedforward=(before, args.enabled)))

    def start_step_test(args: StartStepTestArgs, ctx: CommandContext) -> dict[str, Any]:
        check_output_access(ctx.verb, ctx, leases)
        target = core.start_step_test(now_mono(ctx), args.step_pct)  # CommandError
        return loop_state(core, {"step_test": {"from": "idle", "to": "stepping",
                                               "valve_target_pct": target}})

    def accept_step_test(_args: NoArgs, ctx: CommandContext) -> dict[str, Any]:
        check_output_access(ctx.verb, ctx, leases)
        s = core.loop.settings
        before = {"kc_pct_per_k": s.kc_pct_per_k, "ti_s": s.ti_s}
        after = core.accept_step_test()  # CommandError
        return loop_state(core, {"gains": {"from": before, "to": after}})

    def cancel_step_test(_args: NoArgs, ctx: CommandContext) -> dict[str, Any]:
        check_output_access(ctx.verb, ctx, leases)
        before = core.step_test.phase
        core.cancel_step_test()
        return loop_state(core, _changes(step_test=(before, core.step_test.phase)))

    def reset_leak(args: ResetLeakArgs, ctx: CommandContext) -> dict[str, Any]:
        check_output_access(ctx.verb, ctx, leases)
        before = core.safety.state()
        try:
            core.reset_leak(now_mono(ctx), reopen=args.reopen_isolation)
        except ValueError as err:
            raise CommandError("leak_still_wet", str(err)) from None
        return loop_state(core, {"leak": {"from": before, "to": core.safety.state()}})

    def reset_learned(_args: NoArgs, ctx: CommandContext) -> dict[str, Any]:
        """Forget what was learned of the plant (issue 21, `ValveyCore.reset_learned`): back
        to the cold-start values, persisted at the next save."""
        check_output_access(ctx.verb, ctx, leases)
        def learned() -> dict[str, Any]:
            cap = core.capacity
            return {"valve_stroke_s": core.valves.learned(),
                    "valve_rest_pct": core.valves.learned_rest(),
                    "ff_map_learned": core.ff.map_learned,
                    "liquid_fraction": cap.liquid.saved, "k_open_kw_per_k": cap.k_open_saved}

        before = learned()
        core.reset_learned()
        after = learned()
        return loop_state(core, {"learned": {"from": before, "to": after}}
                          if before != after else {})

    handlers: dict[str, Callable[[Any, CommandContext], dict[str, Any]]] = {
        "get_state": get_state,
        "set_setpoint": set_setpoint,
        "set_mode": set_mode,
        "ack_alarm": ack_alarm,
        "shelve_alarm": shelve_alarm,
        "set_dp_setpoint": set_dp_setpoint,
        "set_flow_setpoint": set_flow_setpoint,
        "set_pump_lead": set_pump_lead,
        "rotate_pumps": rotate_pumps,
        "reset_pump_faults": reset_pump_faults,
        "select_valve": select_valve,
        "set_feedforward": set_feedforward,
        "start_step_test": start_step_test,
        "accept_step_test": accept_step_test,
        "cancel_step_test": cancel_step_test,
        **commissioning_handlers(core, lambda ctx: check_output_access(ctx.verb, ctx, leases),
                                 now_mono),
        "reset_leak": reset_leak,
        "reset_learned": reset_learned,
    }
    bounds = valvey_arg_bounds(core)
    for verb, (model, role) in _VERBS.items():
        register_bounded(router, verb, model, handlers[verb], role, bounds.get(verb, {}))


def valvey_arg_bounds(core: ValveyCore) -> dict[str, VerbBounds]:
    """verb -> field -> bound provider: every numeric argument of valvey's verbs (issue 14
    item 2), read from the live settings at each command."""
    def setpoint() -> ArgBound:
        s = core.loop.settings
        return ArgBound(s.setpoint_min_c, s.setpoint_max_c, "°C",
                        "supply_loop.setpoint_min_c .. setpoint_max_c")

    def output() -> ArgBound:
        s = core.loop.settings
        return ArgBound(s.output_min_pct, s.output_max_pct, "%",
                        "supply_loop.output_min_pct .. output_max_pct")

    def dp() -> ArgBound:
        p = core.pumps.s
        return ArgBound(p.dp_setpoint_min_kpa, p.dp_setpoint_max_kpa, "kPa",
                        "pump_loop.dp_setpoint_min_kpa .. dp_setpoint_max_kpa, below "
                        f"max_pressure_kpa = {p.max_pressure_kpa}")

    def flow() -> ArgBound:
        p = core.pumps.s
        return ArgBound(p.flow_setpoint_min_lpm, p.flow_setpoint_max_lpm, "L/min",
                        "pump_loop.flow_setpoint_min_lpm .. flow_setpoint_max_lpm")

    def shelve() -> ArgBound:
        return ArgBound(SHELVE_MIN_S, DEFAULT_MAX_SHELVE_S, "s",
                        "ISA-18.2 time-limited shelving: 60 s .. 8 h")

    def step() -> ArgBound:
        return ArgBound(-STEP_TEST_MAX_PCT, STEP_TEST_MAX_PCT, "%",
                        "step test: at most 20 % either way")

    return {
        "start_commissioning": {"step_pct": lambda: commissioning_step_bound(core)},
        "set_setpoint": {"setpoint_c": setpoint},
        "set_mode": {"output_pct": output},
        "shelve_alarm": {"duration_s": shelve},
        "set_dp_setpoint": {"dp_setpoint_kpa": dp},
        "set_flow_setpoint": {"flow_setpoint_lpm": flow},
        "start_step_test": {"step_pct": step},
    }


def loop_state(core: ValveyCore, changed: dict[str, Any] | None = None) -> dict[str, Any]:
    """`ValveyCore.state()` with the live setpoint, modes and alarms over it, plus ``changed``
    when given (see the module docstring)."""
    loop = core.loop
    state = core.state()
    state.update({
        "setpoint_c": loop.setpoint_c,
        "control_mode": loop.control_mode,
        "mode": "shadow" if loop.shadow else loop.control_mode,
        "shadow": loop.shadow,
        "alarms": sorted(a.id for a in core.alarms.active()),
    })
    if changed is not None:
        state["changed"] = changed
    return state


def _changes(**pairs: tuple[Any, Any]) -> dict[str, Any]:
    return {k: {"from": a, "to": b} for k, (a, b) in pairs.items() if a != b}


def _alarm_change(core: ValveyCore, alarm_id: str, events: list[AlarmEvent]) -> dict[str, Any]:
    snap = next((a for a in core.alarms.active() if a.id == alarm_id), None)
    return {
        "id": alarm_id,
        "events": [e.kind for e in events],
        "state": snap.state if snap is not None else "normal",
        "acked": snap.acked if snap is not None else None,
        "shelved": snap.shelved if snap is not None else False,
        "shelved_until_mono": snap.shelved_until if snap is not None else None,
    }


def valvey_contract() -> DaemonContract:
    """valvey's verbs and state models (``rackctl schemas``, docs/COMMANDS.md)."""
    # ``handover``: by the frame (rackplane.daemon); a single instance refuses: not_paired
    return DaemonContract(
        "valvey", {**_VERBS, "handover": (HandoverArgs, "operator")}, dict(VALVEY_STATES),
        "The cooling controller (valvey/commands.py).",
    )
