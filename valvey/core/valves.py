"""Facility valves: continuous plausibility (demand vs feedback, allowing travel time) and
failover to a second valve. Pure; `ValveManager.step` runs on every 10 Hz tick.

REFERENCE §1.5 and §8: a CDU's own check (Vertiv) runs every 15 min and flags > 10 % mismatch;
Coolcentric switches to a second valve above 10 % mismatch. Here the check is continuous: an
*expected position* follows the valve's demand at the actuator's stroke rate (``stroke_time_s``:
60 s in REFERENCE §4.3; Belimo 90 s / 60 mm, §1.5), so a valve still travelling is never
blamed; a valve whose feedback stays more than ``mismatch_pct`` from the expected position for
``confirm_s`` is declared failed (``stuck``: it does not follow; REFERENCE §5 S4 wants ≤ 15 s,
not the vendor's 15 min). The demand compared is the CDU's read-back of the command register
when there is one (what the actuator is really given, also in the CDU's local control), else
the last value written.

Failover (``second_valve = true`` and the other valve healthy): the spare takes the loop's
demand at once (REFERENCE §2.2: pre-set the standby actuator to the last good output), the
failed one is commanded closed (if it frees itself it does not add uncontrolled cooling).
The valves are in parallel on the facility water, so the loop simply keeps controlling; the
integrator carries on. With no spare the failure stays (``no_spare``) and the safety logic asks
racky for a cap at the power the stuck valve can remove (`valvey.core.capacity`, REFERENCE §5 S4).

The valve failure is latched until `reset` (operator command ``select_valve`` with
``reset``): a valve that stuck once is not trusted again without a look.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from rackplane.config import StrictModel
from rackplane.core.samples import Sample, fresh_value, slots_constructor

__all__ = ["ValveManager", "ValveSettings", "ValveStep", "ValveUnit"]


class ValveUnit(StrictModel):
    """One facility valve's points."""

    name: str = Field(pattern=r"^[a-z0-9]{1,8}$")
    command: str
    position: str | None = None


class ValveSettings(StrictModel):
    """Valves and their plausibility check (module docstring). The first valve is
    ``points.valve_command`` / ``points.valve_position``."""

    second_command: str | None = Field(
        "valve_b_command_pct", description="the second (spare) valve's demand register; None: "
        "no second valve"
    )
    second_position: str | None = Field("valve_b_position_pct")
    second_valve: bool = Field(True, description="fail over to the second valve")
    stroke_time_s: float = Field(60.0, gt=0, le=600, description="REFERENCE §1.7, §4.3")
    mismatch_pct: float = Field(10.0, gt=0, le=50, description="REFERENCE §1.5/§8: 10 %")
    confirm_s: float = Field(
        1.0, ge=0, le=600, description="the mismatch must last this long (10 % is already "
        "twice the actuator's ±5 % accuracy, REFERENCE §1.5)"
    )
    stale_after_s: float = Field(3.0, gt=0, le=60)


@dataclass(frozen=True, slots=True)
class ValveStep:
    """What `ValveManager.step` decided: writes, the active valve, alarm conditions,
    transitions and, when a valve was declared failed in this tick, its name."""

    writes: list[tuple[str, float]]
    active: int
    conditions: Mapping[str, bool]
    transitions: tuple[str, ...]
    failed_now: str | None = None


_new_valve_step = slots_constructor(ValveStep)  # ValveStep(...), every tick, all fields


class _Check:
    __slots__ = ("expected", "mismatch", "since", "t")

    def __init__(self) -> None:
        self.expected: float | None = None
        self.t: float | None = None
        self.since: float | None = None
        self.mismatch = 0.0


_val = fresh_value  # value if usable and fresh, else None


class ValveManager:
    """The facility valves (module docstring).

    Args:
        settings: `ValveSettings`.
        first: the normal control valve (``points.valve_command``/``valve_position``).
    """

    def __init__(self, settings: ValveSettings, first: ValveUnit):
        self.s = settings
        self.units = [first]
        if settings.second_command is not None:
            self.units.append(ValveUnit(name="b" if first.name != "b" else "c",
                                        command=settings.second_command,
                                        position=settings.second_position))
        self._checks = [_Check() for _ in self.units]
        self._failed: dict[int, str] = {}
        self._active = 0
        self._written: dict[int, float] = {}
        self._pending: list[str] = []
        self.detected_t: float | None = None
        self.failover_t: float | None = None
        self._fault_ids: dict[str, str] = {}

    @property
    def active(self) -> int:
        """Index of the valve the loop drives."""
        return self._active

    @property
    def active_unit(self) -> ValveUnit:
        """The valve the loop drives."""
        return self.units[self._active]

    @property
    def spare_available(self) -> bool:
        """A healthy second valve the loop could move to."""
        return (self.s.second_valve and len(self.units) > 1
                and any(i not in self._failed for i in range(len(self.units))
                        if i != self._active))

    @property
    def active_failed(self) -> bool:
        """The valve the loop drives has failed (no spare took over)."""
        return self._active in self._failed

    @property
    def failed(self) -> dict[str, str]:
        """Failed valves: name -> reason."""
        return {self.units[i].name: r for i, r in self._failed.items()}

    def mismatch_pct(self, index: int) -> float:
        """|expected − feedback| of valve ``index`` in the last tick [%]."""
        return self._checks[index].mismatch

    def select(self, index: int, demand_pct: float | None, *, reset: bool = False
               ) -> list[tuple[str, float]]:
        """Operator: drive valve ``index`` (the other is closed); ``reset`` forgets latched
        failures first. Returns the writes (the new valve gets the demand: bumpless).

        Raises:
            ValueError: no such valve, or it has failed (and no reset).
        """
        if not 0 <= index < len(self.units):
            raise ValueError(f"no valve with index {index}")
        if reset:
            self._failed.clear()
            for c in self._checks:
                c.since = None
        if index in self._failed:
            raise ValueError(f"valve {self.units[index].name} has failed "
                             f"({self._failed[index]}); select it with reset")
        writes: list[tuple[str, float]] = []
        if index != self._active:
            old = self._active
            self._active = index
            self._pending.append(f"valves:select:{self.units[old].name}->"
                                 f"{self.units[index].name}")
            writes += self._swap(old, index, demand_pct)
        return writes

    def _swap(self, old: int, new: int, demand: float | None) -> list[tuple[str, float]]:
        w: list[tuple[str, float]] = []
        if demand is not None:
            w.append((self.units[new].command, demand))
            self._written[new] = demand
        w.append((self.units[old].command, 0.0))
        self._written[old] = 0.0
        return w

    def note_written(self, index: int, value: float) -> None:
        """The loop wrote ``value`` to valve ``index`` (its expected position follows it)."""
        self._written[index] = value

    def step(self, now: float, samples: Mapping[str, Sample], demand_pct: float | None
             ) -> ValveStep:
        """Check every valve; fail over when the active one fails (module docstring).

        Args:
            demand_pct: the loop's current valve demand [%] (for the spare's pre-set).
        """
        s = self.s
        writes: list[tuple[str, float]] = []
        failed_now = None
        rate = 100.0 / s.stroke_time_s
        stale_s = s.stale_after_s
        for i, u in enumerate(self.units):
            c = self._checks[i]
            cmd = _val(samples.get(u.command), now, stale_s)
            if cmd is None:
                cmd = self._written.get(i)
            fb = _val(samples.get(u.position), now, stale_s) if u.position else None
            if cmd is None or fb is None:
                c.since = None
                c.expected = fb
                c.t = now
                continue
            if c.expected is None or c.t is None:
                c.expected = fb
            else:
                d = cmd - c.expected
                m = rate * (now - c.t)
                c.expected += m if d > m else -m if d < -m else d
            c.t = now
            c.mismatch = abs(c.expected - fb)
            if c.mismatch > s.mismatch_pct:
                if c.since is None:
                    c.since = now
                if now - c.since >= s.confirm_s - 1e-9 and i not in self._failed:
                    self._failed[i] = "stuck"
                    failed_now = u.name
                    self._pending.append(f"valves:failed:{u.name}:mismatch "
                                         f"{c.mismatch:.1f} %")
                    if i == self._active:
                        self.detected_t = now
                        spare = self._spare()
                        if spare is not None:
                            self._active = spare
                            self.failover_t = now
                            self._pending.append(f"valves:failover:{u.name}->"
                                                 f"{self.units[spare].name}")
                            writes += self._swap(i, spare, demand_pct)
                            self._checks[spare].since = None
                        else:
                            self._pending.append(f"valves:no_spare:{u.name}")
            else:
                c.since = None
        cond: dict[str, bool] = {}
        for i, u in enumerate(self.units):
            aid = self._fault_ids.get(u.name)
            if aid is None:  # alarm ids built once per valve name, not per tick
                aid = self._fault_ids[u.name] = f"valve_{u.name}_fault"
            cond[aid] = i in self._failed
        cond["valve_failover"] = self._active != 0
        cond["valve_no_spare"] = self._active in self._failed
        trans: tuple[str, ...] = ()
        if self._pending:
            trans, self._pending = tuple(self._pending), []
        return _new_valve_step(writes, self._active, cond, trans, failed_now)

    def _spare(self) -> int | None:
        if not self.s.second_valve:
            return None
        for i in range(len(self.units)):
            if i != self._active and i not in self._failed:
                return i
        return None

    def state(self, now: float, samples: Mapping[str, Sample]) -> dict[str, Any]:
        """JSON-ready state (retained ``state/valves``)."""
        out = []
        for i, u in enumerate(self.units):
            fb = _val(samples.get(u.position), now, self.s.stale_after_s) if u.position else None
            c = self._checks[i]
            out.append({
                "name": u.name,
                "active": i == self._active,
                "command_pct": self._written.get(i),
                "position_pct": fb,
                "expected_pct": None if c.expected is None else round(c.expected, 2),
                "mismatch_pct": round(c.mismatch, 2) if math.isfinite(c.mismatch) else None,
                "failed": self._failed.get(i),
            })
        return {"active": self.units[self._active].name,
                "second_valve": self.s.second_valve and len(self.units) > 1,
                "units": out}
