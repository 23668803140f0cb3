"""valvey's command verbs on the supply-temperature loop and its alarms (DESIGN §1 commands,
§3 MQTT ``cmd/<user>/<verb>``). The router (`rackplane.commands.CommandRouter`) does the
envelope, TTL, roles, de-duplication, reply and audit; these handlers are pure, synchronous
operations on the `ValveyCore` (no awaits, no I/O, time from the `CommandContext`).

Verbs (least role; args; what the reply's ``state`` holds):

===============  ========  =============================================  =====================
verb             role      args                                           refusals (error.code)
===============  ========  =============================================  =====================
get_state        reader    {}                                             -
set_setpoint     operator  {setpoint_c}                                   out_of_range,
                                                                          invalid_value
set_mode         operator  {mode: auto | manual | shadow_on | shadow_off,  out_of_range
                           output_pct (manual only, required there)}
ack_alarm        operator  {alarm_id}                                     unknown_alarm
shelve_alarm     operator  {alarm_id, duration_s: 60..28800}              unknown_alarm,
                                                                          invalid_shelve_time
===============  ========  =============================================  =====================

Limits are the loop's config (``setpoint_min_c``..``setpoint_max_c``, ``output_min_pct``..
``output_max_pct``): a command can never push the valve past them (DESIGN §1). The shelve limit
of 8 h is ISA-18.2's "time-limited shelving" (`rackplane.alarms.DEFAULT_MAX_SHELVE_S`).

Every handler returns `ValveyCore.state()` with the loop's live settings laid over it
(``setpoint_c``, ``mode``, ``control_mode``, ``shadow``, ``alarms``: already the new values)
and, for the changing verbs, ``changed``: ``{name: {"from": old, "to": new}}`` (empty when the
command changed nothing, e.g. ``auto`` while already in auto). Measured values (supply
temperature, valve command, PID terms) are those of the last control tick; a new setpoint or
mode acts from the next tick.

Every handler validates before it mutates (the `SupplyLoop` and `AlarmEngine` methods raise
`CommandError` before changing anything), as the router's contract requires.

``python -m valvey.commands --write-schemas`` regenerates ``rackplane/schemas/*.schema.json``
(envelope, reply and these verbs' args).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rackplane.alarms import DEFAULT_MAX_SHELVE_S, AlarmEvent
from rackplane.commands import CommandArgs, CommandContext, CommandRouter, NoArgs
from rackplane.commands import main as _schemas_main
from rackplane.log import get_logger
from rackplane.settings import Role
from valvey.core import ValveyCore

__all__ = [
    "AckAlarmArgs",
    "SetModeArgs",
    "SetSetpointArgs",
    "ShelveAlarmArgs",
    "register_valvey_commands",
    "valvey_verb_args",
]

ALARM_ID_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,63}$"  # rackplane.alarms AlarmDef.id
SHELVE_MIN_S = 60.0
"""Shortest shelve [s]: a shorter one is a mis-typed unit more often than a need."""


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
        None, ge=0.0, le=100.0, allow_inf_nan=False,
        description="valve output [%], manual only (and required there)",
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
        ge=SHELVE_MIN_S, le=DEFAULT_MAX_SHELVE_S, allow_inf_nan=False,
        description="how long [s], 60 s to 8 h (ISA-18.2 time-limited shelving)",
    )


_VERBS: dict[str, tuple[type[CommandArgs], Role]] = {
    "get_state": (NoArgs, "reader"),
    "set_setpoint": (SetSetpointArgs, "operator"),
    "set_mode": (SetModeArgs, "operator"),
    "ack_alarm": (AckAlarmArgs, "operator"),
    "shelve_alarm": (ShelveAlarmArgs, "operator"),
}


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
) -> None:
    """Register valvey's verbs (see the module docstring) on ``router``.

    Args:
        router: the daemon's command router.
        app_or_core: the `ValveyCore`, or an object with a ``core`` attribute (the daemon).
        on_alarm_events: called with the events an ack or shelve produced, to publish,
            log and write them like the tick's own (the daemon passes its alarm sink); its
            exceptions are logged, never turned into a refusal (the change is made).

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

    def get_state(_args: NoArgs, _ctx: CommandContext) -> dict[str, Any]:
        return loop_state(core)

    def set_setpoint(args: SetSetpointArgs, _ctx: CommandContext) -> dict[str, Any]:
        before = core.loop.setpoint_c
        core.loop.set_setpoint(args.setpoint_c)  # CommandError before any change
        return loop_state(core, _changes(setpoint_c=(before, core.loop.setpoint_c)))

    def set_mode(args: SetModeArgs, _ctx: CommandContext) -> dict[str, Any]:
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

    handlers: dict[str, Callable[[Any, CommandContext], dict[str, Any]]] = {
        "get_state": get_state,
        "set_setpoint": set_setpoint,
        "set_mode": set_mode,
        "ack_alarm": ack_alarm,
        "shelve_alarm": shelve_alarm,
    }
    for verb, (model, role) in _VERBS.items():
        router.register(verb, model, handlers[verb], role=role)


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


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m valvey.commands --write-schemas | --check-schemas``: the envelope, reply
    and valvey's verbs' args schemas in ``rackplane/schemas``."""
    return _schemas_main(argv, verb_args={"valvey": valvey_verb_args()})


if __name__ == "__main__":
    sys.exit(main())
