"""The age of what valvey learned of its plant (the state file's ``learned`` block,
valvey.persist): when each learned value was last confirmed by a measurement, and what a
restart does with one confirmed longer ago than ``control.learned_max_age_s``.

**Confirmed**: each learned value's learner counts the measurements that confirm it
(`confirmations`): a valve's stroke samples and rest samples, the feedforward map's
adaptations (the whole map: one steady state at any power confirms it), an accepted
commissioning run (its gains; its measured strokes count for the valves), the steady ratios
averaged into the liquid fraction, the valve-open samples averaged into ``k_open``.
`LearnedAges.observe` stamps the wall-clock time of a count's change; the state file keeps the
stamps (``learned.confirmed_wall_s``: ``{name: seconds since the Unix epoch}``, whole
seconds). A stamp is renewed at most every `refresh_s` (an hour; a tenth of the maximum age
when that is shorter): a value confirmed every second does not make a save every second, and
its stamp reads at most that much older than it is (the safe side).

**Why the wall clock**: the age must survive a restart (and a reboot), which the monotonic
clock does not: it starts again at each boot. The wall clock may step (NTP, an operator, a
board without a battery-backed clock booting at its build date). A step forward makes the
values look older: dropped or kept as a starting point earlier than due (the safe side). A
step back can put a saved stamp in the future: its age is then **unknown** (a stamp more than
`FUTURE_SLACK_S` ahead of now; within it, a restart across a small NTP correction, age 0),
treated as too old. A stamp renewed after a step back is the new clock's.

**Too old or unknown** (older than ``control.learned_max_age_s``, no stamp: a file saved by
a build before these stamps, or a stamp in the future), per value (`WHEN_OLD`):

- ``drop`` (re-learned as at a cold start): the valve strokes (the cold prior is the short,
  conservative side of the expected position; an actuator ages), the valves' rest
  characteristic (reported only), the liquid fraction and the exchanger's ``k_open``: both
  feed the capacity guard and racky's derate, and one learned before the exchanger fouled (or
  before a plant change) would make valvey believe in more capacity than is there now;
  dropped, the configured liquid fraction and racky's table apply until measured again.
- ``starting_point`` (restored, not taken for fresh: its old stamp, or none, is kept, so it
  stays old until this run confirms it): the feedforward map (bounded within
  ``feedforward.adapt_max_correction_pct`` of the configured prior, feedforward only, the PI
  corrects what it misses, and it goes on adapting online; it holds the plant's measured shape
  the prior lacks) and accepted commissioning gains (an operator's decision, and the
  configured gains they replaced are no fresher; nothing re-learns them online: re-commission
  to confirm them).

Each value is logged at start with what happened to it (valvey.persist.apply_learned).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from valvey.core.controller import ValveyCore

__all__ = ["FUTURE_SLACK_S", "WHEN_OLD", "LearnedAges", "age_s", "confirmations", "describe_age",
           "kind_of"]

FUTURE_SLACK_S = 60.0
"""A saved stamp at most this far ahead of the wall clock now is of age 0 (a restart across a
small NTP correction); further ahead, its age is unknown."""

WHEN_OLD: dict[str, Literal["drop", "starting_point"]] = {
    "valve_stroke_s": "drop",
    "valve_rest_pct": "drop",
    "ff_map_pct": "starting_point",
    "commissioned": "starting_point",
    "liquid_fraction": "drop",
    "k_open_kw_per_k": "drop",
}
"""What a restart does with a value too old or of unknown age, by kind (module docstring)."""


def kind_of(name: str) -> str:
    """The kind of a learned value's name (``valve_stroke_s.a`` -> ``valve_stroke_s``)."""
    return name.split(".", 1)[0]


def confirmations(core: ValveyCore) -> dict[str, int]:
    """By learned value name (as in ``learned.confirmed_wall_s``): a count that grows with
    each measurement confirming that value (a fall: it was forgotten)."""
    out: dict[str, int] = {}
    for valve, (stroke_n, rest_n) in core.valves.learned_samples().items():
        out[f"valve_stroke_s.{valve}"] = stroke_n
        out[f"valve_rest_pct.{valve}"] = rest_n
    out["ff_map_pct"] = core.ff.adaptations
    out["commissioned"] = core.commissioning.accepts
    out["liquid_fraction"] = core.capacity.liquid.own_samples
    out["k_open_kw_per_k"] = core.capacity.k_open_samples
    return out


def age_s(stamp_s: float | None, wall_s: float) -> float | None:
    """Age [s] of a value confirmed at ``stamp_s`` [s since the epoch] at wall time
    ``wall_s``; None: unknown (no stamp, not finite, or more than `FUTURE_SLACK_S` ahead)."""
    if stamp_s is None or not math.isfinite(stamp_s) or stamp_s > wall_s + FUTURE_SLACK_S:
        return None
    return max(0.0, wall_s - stamp_s)


def describe_age(age: float | None) -> str:
    """``confirmed 3.2 d ago`` (s, min, h or d), or ``age unknown``."""
    if age is None:
        return "age unknown (no confirmation time saved, or one in the future)"
    for unit, div in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if age >= div:
            return f"confirmed {age / div:.1f} {unit} ago"
    return f"confirmed {age:.0f} s ago"


class LearnedAges:
    """When each learned value of one core was last confirmed (module docstring).

    Args:
        wall_s: the wall clock now, s since the Unix epoch (the daemon's clock).
    """

    def __init__(self, wall_s: Callable[[], float]):
        self.wall_s = wall_s
        self._n: dict[str, int] = {}  # confirmation counts last seen
        self._at: dict[str, int] = {}  # wall-clock stamp of the last confirmation, s

    @staticmethod
    def refresh_s(max_age_s: float) -> float:
        """How often a stamp is renewed at most, s: an hour, or a tenth of ``max_age_s``."""
        return min(3600.0, 0.1 * max_age_s)

    def observe(self, core: ValveyCore) -> None:
        """Stamp the values whose confirmation count changed since the last look (a count
        that fell: forgotten, its stamp too, then stamped anew if it counts again)."""
        refresh = self.refresh_s(core.cfg.control.learned_max_age_s)
        now: float | None = None
        for name, n in confirmations(core).items():
            old = self._n.get(name, 0)
            if n == old:
                continue
            self._n[name] = n
            if n < old:
                self._at.pop(name, None)
            if n <= 0:
                continue
            now = self.wall_s() if now is None else now
            prev = self._at.get(name)
            if prev is None or now - prev >= refresh or now < prev:
                self._at[name] = int(now)

    def adopt(self, core: ValveyCore, stamps: Mapping[str, int]) -> None:
        """After values were laid over ``core`` (valvey.persist.apply_learned): take its counts
        as they are now (a restore is no measurement) and ``stamps`` as the confirmation times
        of the values restored (the others lose theirs)."""
        self._n = confirmations(core)
        self._at = dict(stamps)

    def stamps(self, names: Iterable[str]) -> tuple[tuple[str, int], ...]:
        """The stamps of ``names`` (those present in the learned state), sorted; values
        without one (never confirmed by this build) are left out: age unknown."""
        return tuple(sorted((n, self._at[n]) for n in set(names) if n in self._at))
