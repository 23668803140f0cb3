"""The rack lifecycle and racky's persisted state.

States (`racky.config.LIFECYCLE_STATES`)::

    provisioning ──start_validation──> validating ──pass──> production <──> maintenance
          ^                               │  │                                │   │
          └────────── abort ──────────────┘  └──fail──> quarantined <─────────┘   │
                                                            │   ^  (any state, by command)
                                       validating <─────────┘   │
                                       validating <─────────────────────────────────┘

* ``validating`` is entered only by starting a validation and left by its result (pass →
  production, fail → quarantined) or by aborting it (back where it started from);
* ``production`` is entered only from ``validating`` with a pass, or from ``maintenance`` when
  the last validation passed and nothing quarantined the rack since (validation gates
  production);
* ``quarantined`` can be entered from any state by command, and by racky itself from
  ``production`` or ``maintenance`` when an alarm of a kind in ``[lifecycle]
  quarantine_on_alarms`` is raised (`quarantine_reason`, e.g. ``link_flapping``); it is left
  only by a new validation or to ``maintenance``, and a quarantine forgets the passed
  validation, so the rack returns to production only through a new one.

`PersistedState` is what survives a restart: one JSON document, versioned (``format``,
``version``); `racky.persist.StateStore` reads it and writes it atomically. An unreadable or
foreign file is moved aside (``<name>.corrupt-<ns>``) and racky starts in ``maintenance``
(never ``production`` on a guess), saying why.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rackplane.core.alarms import AlarmEvent
from rackplane.errors import CommandError
from racky.config import LIFECYCLE_STATES, LifecycleState
from racky.core.campaign_gate import JudgedRun, judged_from_json, judged_to_json

__all__ = ["FORMAT", "HISTORY_KEEP", "VERSION", "Lifecycle", "PersistedState",
           "quarantine_reason"]

FORMAT = "racky-state"
VERSION = 1
HISTORY_KEEP = 50

_BY_COMMAND: dict[str, frozenset[str]] = {
    "provisioning": frozenset({"quarantined"}),
    "validating": frozenset({"quarantined"}),
    "production": frozenset({"maintenance", "quarantined"}),
    "maintenance": frozenset({"production", "quarantined"}),
    "quarantined": frozenset({"maintenance"}),
}
"""Transitions ``set_lifecycle`` may make (validation has its own verbs)."""
_CAN_VALIDATE = frozenset({"provisioning", "maintenance", "quarantined", "production"})


@dataclass
class Lifecycle:
    """The lifecycle state machine (pure; times are wall-clock ns for the record only)."""

    state: LifecycleState = "provisioning"
    since_ns: int = 0
    reason: str = ""
    by: str = ""
    validated: bool = False
    validating_from: LifecycleState | None = None
    history: list[dict[str, Any]] = field(default_factory=list)

    def _go(self, new: LifecycleState, reason: str, by: str, wall_ns: int) -> None:
        self.history.append({"from": self.state, "to": new, "reason": reason, "by": by,
                             "at_ns": wall_ns})
        del self.history[:-HISTORY_KEEP]
        self.state, self.since_ns, self.reason, self.by = new, wall_ns, reason, by

    def set_by_command(self, new: str, reason: str, by: str, wall_ns: int) -> bool:
        """An operator's ``set_lifecycle``; returns False when already there.

        Raises:
            CommandError: ``invalid_transition`` (not allowed from here, or production without
                a passed validation), ``out_of_range`` (unknown state).
        """
        if new not in LIFECYCLE_STATES:
            raise CommandError("out_of_range", f"unknown lifecycle state {new!r}; states: "
                               f"{', '.join(LIFECYCLE_STATES)}")
        if new == self.state:
            return False
        if new == "validating":
            raise CommandError("invalid_transition", "validating is entered by "
                               "start_validation, not set_lifecycle")
        if new not in _BY_COMMAND[self.state]:
            raise CommandError("invalid_transition", f"{self.state} -> {new} is not allowed by "
                               f"command (allowed: {', '.join(sorted(_BY_COMMAND[self.state]))})")
        if new == "production" and not self.validated:
            raise CommandError("invalid_transition", "production needs a passed validation "
                               "since the rack was last quarantined (start_validation)")
        if new == "quarantined":
            self.validated = False
        self._go(new, reason, by, wall_ns)  # type: ignore[arg-type]
        return True

    def start_validation(self, reason: str, by: str, wall_ns: int) -> None:
        """Enter ``validating``.

        Raises:
            CommandError: ``invalid_transition`` while already validating.
        """
        if self.state not in _CAN_VALIDATE:
            raise CommandError("invalid_transition", f"a validation cannot start from "
                               f"{self.state}")
        self.validating_from = self.state
        self._go("validating", reason, by, wall_ns)

    def validation_result(self, passed: bool, reason: str, wall_ns: int, *,
                          promote: bool = True) -> None:
        """Leave ``validating`` by the result: pass → production (``promote`` False, fleet
        mode: → maintenance, validated, waiting for rlc's order; `racky.core.campaign_gate`),
        fail → quarantined."""
        if self.state != "validating":
            return
        self.validated = passed
        self.validating_from = None
        to: LifecycleState = "quarantined" if not passed else \
            "production" if promote else "maintenance"
        self._go(to, reason, "validation", wall_ns)

    def abort_validation(self, reason: str, by: str, wall_ns: int) -> None:
        """Back to the state the validation started from.

        Raises:
            CommandError: ``invalid_transition`` when not validating.
        """
        if self.state != "validating":
            raise CommandError("invalid_transition", "no validation is running")
        back: LifecycleState = self.validating_from or "provisioning"
        if back == "production" and not self.validated:
            back = "maintenance"
        self.validating_from = None
        self._go(back, reason, by, wall_ns)

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (state file and ``state/rack``); times are wall-clock ns."""
        return {"state": self.state, "since_ns": self.since_ns, "reason": self.reason,
                "by": self.by, "validated": self.validated,
                "validating_from": self.validating_from, "history": list(self.history)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Lifecycle:
        """Parse `as_dict`'s form strictly.

        Raises:
            ValueError: an unknown state or a value of the wrong type (``validated`` must be a
                boolean: ``bool("false")`` would let a rack into production on a guess).
        """
        st = d.get("state")
        if st not in LIFECYCLE_STATES:
            raise ValueError(f"lifecycle.state {st!r} unknown")
        vf = d.get("validating_from")
        validated = d.get("validated", False)
        if not isinstance(validated, bool):  # bool("false") is True: production on a guess
            raise ValueError(f"lifecycle.validated: {validated!r} is not a boolean")
        hist = d.get("history", [])
        if not isinstance(hist, list):
            raise ValueError("lifecycle.history: not a list")
        return cls(state=st, since_ns=int(d.get("since_ns", 0)), reason=str(d.get("reason", "")),
                   by=str(d.get("by", "")), validated=validated,
                   validating_from=vf if vf in LIFECYCLE_STATES else None,
                   history=list(hist)[-HISTORY_KEEP:])


def quarantine_reason(state: str, kinds: Sequence[str], events: Iterable[AlarmEvent]
                      ) -> str | None:
    """``[lifecycle] quarantine_on_alarms``: the reason to quarantine a rack in ``state`` (its
    first raised alarm whose kind, the id before ``:``, is in ``kinds``), or None. Only
    ``production`` and ``maintenance`` (validated, one command from production) are
    quarantined; a running validation judges the alarm itself (its link criterion)."""
    if not kinds or state not in ("production", "maintenance"):
        return None
    for ev in events:
        if ev.kind == "raised" and ev.id.split(":", 1)[0] in kinds:
            return f"alarm {ev.id} raised: {ev.message}"
    return None


@dataclass
class PersistedState:
    """What survives a restart: the lifecycle, trays powered off by safety requests (tray ->
    {reason, by, at_ns}), an operator's budget override, the last validation's summary, the
    campaign runs it judged (`racky.core.campaign_gate.JudgedRun`, the gate's evidence), the
    links' learned pre-FEC baselines (``"<port>:<counter>"`` -> {baseline_per_min,
    learned_min, dispersion}, `racky.core.links.LinkHealth.export_baselines`; entries that
    are not such objects are dropped on reading: that link learns afresh)."""

    lifecycle: Lifecycle
    safety_off: dict[int, dict[str, Any]] = field(default_factory=dict)
    budget_w: float | None = None
    budget_set: bool = False
    last_validation: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    link_baselines: dict[str, dict[str, float]] = field(default_factory=dict)
    judged_runs: list[JudgedRun] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The state file's document (``format``, ``version`` and the fields above)."""
        return {
            "format": FORMAT, "version": VERSION, "lifecycle": self.lifecycle.as_dict(),
            "safety_off": {str(k): v for k, v in sorted(self.safety_off.items())},
            "budget": {"set": self.budget_set, "power_w": self.budget_w},
            "last_validation": self.last_validation,
            "link_baselines": dict(sorted(self.link_baselines.items())),
            "judged_runs": judged_to_json(self.judged_runs),
        }

    @classmethod
    def from_json(cls, d: Any) -> PersistedState:
        """Raises ValueError for a document that is not racky's state of a known version."""
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ValueError("not a racky state file")
        v = d.get("version")
        if v != VERSION:
            raise ValueError(f"state file version {v!r}; this racky reads version {VERSION}")
        lc = Lifecycle.from_dict(_obj(d.get("lifecycle"), "lifecycle"))
        so: dict[int, dict[str, Any]] = {}
        for k, x in _obj(d.get("safety_off"), "safety_off").items():
            if not k.isdigit():
                raise ValueError(f"safety_off: {k!r} is not a tray index")
            so[int(k)] = _obj(x, f"safety_off.{k}")
        b = _obj(d.get("budget"), "budget")
        bw = b.get("power_w")
        # a budget read from disk must never raise the cap on a bad value (DESIGN: no unsafe
        # output from a bad input): finite and > 0, or null
        if bw is not None and (isinstance(bw, bool) or not isinstance(bw, int | float)
                               or not math.isfinite(bw) or bw <= 0):
            raise ValueError(f"budget.power_w: {bw!r} is not a power > 0 W")
        bs = b.get("set", False)
        if not isinstance(bs, bool):
            raise ValueError(f"budget.set: {bs!r} is not a boolean")
        lv = d.get("last_validation")
        if lv is not None and not isinstance(lv, dict):
            raise ValueError("last_validation: not an object")
        lb = d.get("link_baselines")
        links = {str(k): {kk: float(vv) for kk, vv in v.items()
                          if isinstance(vv, int | float) and not isinstance(vv, bool)}
                 for k, v in lb.items() if isinstance(v, dict)} if isinstance(lb, dict) else {}
        return cls(lifecycle=lc, safety_off=so, budget_w=None if bw is None else float(bw),
                   budget_set=bs, last_validation=lv, link_baselines=links,
                   judged_runs=judged_from_json(d.get("judged_runs")))


def _obj(v: Any, path: str) -> dict[str, Any]:
    """``v`` as a JSON object ({} for a missing key).

    Raises:
        ValueError: naming ``path`` when ``v`` is something else.
    """
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ValueError(f"{path}: not an object")
    return v
