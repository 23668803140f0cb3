"""Bounds of every numeric command argument (issue 14 item 2): each verb's numeric fields
have limits taken from the daemon's config (or, for a few durations, from a standard named
in the bound's ``source``), checked at the command before the handler runs, refused with
``out_of_range`` naming the value and the limits.

A daemon registers its verbs with `register_bounded` and a table ``{field: provider}`` per
verb; a provider returns the `ArgBound` in force *now* (config reloads and measured values
such as the non-GPU share of tray power apply at once). Registration refuses a verb whose
args model has a numeric field without a bound (`numeric_fields`), so a new verb cannot be
registered unbounded; tests/unit/test_command_bounds.py walks every verb's every numeric
argument through the router.

Why bounds beyond the sign: a budget of 1e300 W turns capping off, one of 0.001 W or 120 W
(meant as kW) powers the rack down to its floor, a DP setpoint above the pump loop's maximum
pressure fights the pressure override (field findings of issue 14).
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from rackplane.commands.router import CommandRouter
from rackplane.core.envelope import (
    OUT_OF_RANGE,
    ArgProblem,
    CommandContext,
    HandlerResult,
    join_problems,
)
from rackplane.errors import CommandError
from rackplane.settings import Role

__all__ = ["ArgBound", "BoundProvider", "VerbBounds", "bound_problems", "bounds_of",
           "check_bounds", "json_limits", "numeric_fields", "register_bounded"]


@dataclass(frozen=True, slots=True)
class ArgBound:
    """The limits of one numeric argument now.

    Attributes:
        lo, hi: the limits, in ``unit`` (inclusive unless ``lo_open`` / ``hi_open``).
        unit: e.g. ``W``, ``s``, ``kPa`` ('' for an index).
        source: where the limits come from (config key paths or a standard), for the message.
        code: the refusal code (``out_of_range``; a tray index outside the rack is
            ``unknown_tray``, a lease TTL ``invalid_lease_ttl``: the codes those verbs had).
        lo_open, hi_open: the limit itself is outside the range (e.g. a TTL > 0).
    """

    lo: float
    hi: float
    unit: str
    source: str
    code: str = OUT_OF_RANGE
    lo_open: bool = False
    hi_open: bool = False

    def contains(self, value: float) -> bool:
        """True when ``value`` is finite and within the limits."""
        if not math.isfinite(value):
            return False
        above = value > self.lo if self.lo_open else value >= self.lo
        below = value < self.hi if self.hi_open else value <= self.hi
        return above and below

    def describe(self) -> str:
        """``[lo, hi] unit`` (``(`` / ``)`` for open ends)."""
        u = f" {self.unit}" if self.unit else ""
        return (f"{'(' if self.lo_open else '['}{_num(self.lo)}, {_num(self.hi)}"
                f"{')' if self.hi_open else ']'}{u}")


BoundProvider = Callable[[], ArgBound]
"""Returns the bound in force now (read from the live config / core at each command)."""

VerbBounds = Mapping[str, BoundProvider]
"""field name -> its bound provider, for one verb."""

_BOUNDS_ATTR = "__rackplane_arg_bounds__"


def json_limits(lo: float, hi: float) -> dict[str, Any]:
    """``json_schema_extra`` of a field with constant bounds: the schema shows ``minimum`` /
    ``maximum`` while the check (and its message) is `check_bounds`'s, like every bound."""
    return {"minimum": lo, "maximum": hi}


def _num(v: float) -> str:
    return f"{v:g}" if abs(v) < 1e6 or not math.isfinite(v) else f"{v:.6g}"


def _value(v: float, b: ArgBound) -> str:
    """``v`` as the refusal prints it: short, but never the same text as a limit it lies
    outside of (264000.0000001 is not printed as 264000 next to ``[25020, 264000]``)."""
    s = _num(v)
    return repr(v) if s in (_num(b.lo), _num(b.hi)) and v not in (b.lo, b.hi) else s


def _is_numeric(annotation: Any) -> bool:
    if annotation in (int, float):
        return True
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, list, tuple, set, frozenset):
        return any(_is_numeric(a) for a in typing.get_args(annotation) if a is not Ellipsis)
    return False


def numeric_fields(model: type[BaseModel]) -> tuple[str, ...]:
    """The fields of an args model that hold numbers (int or float, optional, or lists of
    them; never bool), in declaration order."""
    return tuple(name for name, f in model.model_fields.items() if _is_numeric(f.annotation))


def bound_problems(values: Mapping[str, Any], bounds: VerbBounds,
                   skip: Collection[str] = ()) -> list[ArgProblem]:
    """Every number of ``values`` (field -> value, or list of values) outside its bound, in
    ``bounds``' order, one problem per field (its first value outside); None values and
    anything not a number are not checked (None means "not given" or "back to the
    config's"; a wrong type is the model's problem), nor fields in ``skip``."""
    out: list[ArgProblem] = []
    for name, provider in bounds.items():
        if name in skip:
            continue
        value = values.get(name)
        for v in value if isinstance(value, list | tuple) else [value]:
            if v is None or isinstance(v, bool) or not isinstance(v, int | float):
                continue
            b = provider()
            if not b.contains(float(v)):
                u = f" {b.unit}" if b.unit else ""
                out.append((name, b.code, f"args.{name} = {_value(float(v), b)}{u} is outside "
                            f"{b.describe()} ({b.source})"))
                break
    return out


def check_bounds(args: BaseModel, bounds: VerbBounds,
                 more: Callable[[Mapping[str, Any]], list[ArgProblem]] | None = None) -> None:
    """Refuse an args object with a number outside its bound (`bound_problems`), or with a
    problem ``more`` finds: every such argument named at once, the code that of the first in
    the model's field order.

    Raises:
        CommandError: the first problem's code (a bound's: ``out_of_range``), naming
            ``args.<field>``, the value, the limits and their source, for each problem.
    """
    problems = _problems({n: getattr(args, n, None) for n in type(args).model_fields}, bounds,
                         more)
    if problems:
        order = {name: k for k, name in enumerate(type(args).model_fields)}
        problems.sort(key=lambda p: order.get(p[0], len(order)))
        raise CommandError(problems[0][1], join_problems([p[2] for p in problems]))


def _problems(values: Mapping[str, Any], bounds: VerbBounds,
              more: Callable[[Mapping[str, Any]], list[ArgProblem]] | None,
              skip: Collection[str] = ()) -> list[ArgProblem]:
    out = bound_problems(values, bounds, skip)
    if more is not None:
        seen = {p[0] for p in out} | set(skip)  # one problem per argument: its bound's first
        out += [p for p in more(values) if p[0] not in seen]
    return out


def register_bounded(
    router: CommandRouter,
    verb: str,
    model: type[BaseModel],
    handler: Callable[[Any, CommandContext], HandlerResult],
    role: Role,
    bounds: VerbBounds,
    more: Callable[[Mapping[str, Any]], list[ArgProblem]] | None = None,
) -> None:
    """`CommandRouter.register` with every numeric argument checked against ``bounds``
    before ``handler`` runs (`check_bounds`), and on the raw args too when the model refuses
    them (the refusal then lists the model's problems and the bounds' at once,
    `rackplane.core.envelope.args_refusal`).

    Args:
        more: further checks of argument values against the daemon's state (e.g. racky's
            fleet grant): ``more(values)`` -> problems (field, code, text) for the values
            (the validated args', or the raw ones: anything may be of the wrong type there);
            never raises. An argument outside its bound is not checked by it.

    Raises:
        ValueError: a numeric field of ``model`` has no bound, or a bound names no field;
            those of `CommandRouter.register`.
    """
    fields = numeric_fields(model)
    missing = [f for f in fields if f not in bounds]
    if missing:
        raise ValueError(f"verb {verb!r}: numeric arguments {missing} have no bounds "
                         "(every numeric command argument is bounded from config)")
    extra = [f for f in bounds if f not in model.model_fields]
    if extra:
        raise ValueError(f"verb {verb!r}: bounds for unknown arguments {extra}")
    table = dict(bounds)

    def bounded(args: Any, ctx: CommandContext) -> HandlerResult:
        check_bounds(args, table, more)
        return handler(args, ctx)

    def raw_problems(raw: Mapping[str, Any], skip: Collection[str]) -> list[ArgProblem]:
        return _problems(raw, table, more, skip)

    setattr(bounded, _BOUNDS_ATTR, table)
    bounded.__doc__ = handler.__doc__
    router.register(verb, model, bounded, role=role, arg_check=raw_problems)


def bounds_of(router: CommandRouter) -> dict[str, dict[str, BoundProvider] | None]:
    """verb -> its bound table (None: registered without `register_bounded`)."""
    return {v.name: getattr(v.handler, _BOUNDS_ATTR, None) for v in router._verbs.values()}
