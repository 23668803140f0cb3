"""Facility valves: continuous plausibility (demand vs feedback, allowing travel time), slow
vs stuck, the stroke time learned online, and failover to a second valve. Pure;
`ValveManager.step` runs on every 10 Hz tick.

REFERENCE §1.5 and §8: a CDU's own check (Vertiv) runs every 15 min and flags > 10 % mismatch;
Coolcentric switches to a second valve above 10 % mismatch. Here the check is continuous: an
*expected position* follows the valve's demand at the actuator's stroke rate, so a valve still
travelling is never blamed. The demand compared is the CDU's read-back of the command register
when there is one (what the actuator is really given, also in the CDU's local control), else
the last value written.

**Slow is not stuck** (issue 21). A valve is declared failed (``stuck``) only when its
feedback is more than ``mismatch_pct`` from the expected position for ``confirm_s`` *and* it
has made no progress (``motion_pct``) towards its demand for ``stuck_no_motion_s``. A valve
that keeps moving, however much slower than rated, is never failed over: a healthy 120 s
actuator on a plant rated 60 s used to be declared stuck in a normal load step, the loop
failed over to the equally slow spare, declared that failed too and capped the rack.

**Stroke time learned from command vs feedback** (``learn_stroke``): while the demand is at
least ``travel_gap_pct`` from the feedback the actuator runs at full speed; every
``stroke_sample_pct`` of such travel gives one sample (travel time / distance × 100 %),
averaged 1:1 into the estimate, bounded to [``stroke_min_s``, ``stroke_max_s``]; travel that
makes no progress teaches nothing. The expected position uses the learned stroke (cold: the
configured ``stroke_time_s``, the actuator's rating from its data sheet, else the short
``stroke_prior_s``: never the simulated plant's 60 s). ``valve_actuator_slow:<valve>`` is
raised while the learned stroke exceeds ``stroke_time_s × slow_ratio`` (with a rating only).
The estimates are in `ValveManager.state` (``units[].stroke_time_s``, ``stroke_learned``),
`learned` / `restore_learned` (persistence) and `reset_learned`. The positioner's static
characteristic is learned too, at rest (command and feedback still): the mean feedback −
command offset and the scatter about it (dead band, backlash) (``units[].rest_offset_pct`` /
``rest_band_pct``; `learned_rest` / `restore_learned_rest`); it is reported, not used by the
check.

Failover (``second_valve = true`` and the other valve healthy): the spare takes the loop's
demand at once (REFERENCE §2.2: pre-set the standby actuator to the last good output), the
failed one is commanded closed (if it frees itself it does not add uncontrolled cooling).
The valves are in parallel on the facility water, so the loop simply keeps controlling; the
integrator carries on. The spare is judged by its own response in the same way (moving
towards its demand: not failed). With no healthy valve left (``no_spare``) the loop drives the
failed valve that is more open (more cooling, the safe direction for the supply temperature)
and the safety logic asks racky for a cap at the power the stuck valve can remove
(`valvey.core.capacity`, REFERENCE §5 S4).

The valve failure is latched until `reset` (operator command ``select_valve`` with
``reset``): a valve that stuck once is not trusted again without a look.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import Field, model_validator

from rackplane.config import StrictModel
from rackplane.core.names import alarm_id
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
    stroke_time_s: float | None = Field(
        None, gt=0, le=600, description="the actuator's rated full-stroke time, s: its data "
        "sheet's, the site's to give (REFERENCE §1.5: Belimo 90 s): the reference a slow "
        "actuator is measured against (valve_actuator_slow) and the cold-start estimate "
        "until one is learned. None: no rating: no slow alarm, and stroke_prior_s is the "
        "cold-start estimate"
    )
    stroke_prior_s: float = Field(
        30.0, gt=0, le=600, description="cold-start stroke estimate with no stroke_time_s, s, "
        "until one is learned from the valve's own response: short, the conservative side "
        "(the expected position runs ahead of a slower valve, so a stuck one is seen sooner; "
        "a slower valve that keeps moving is never stuck: stuck_no_motion_s) [U]"
    )
    mismatch_pct: float = Field(10.0, gt=0, le=50, description="REFERENCE §1.5/§8: 10 %")
    confirm_s: float = Field(
        1.0, ge=0, le=600, description="the mismatch must last this long (10 % is already "
        "twice the actuator's ±5 % accuracy, REFERENCE §1.5)"
    )
    stale_after_s: float = Field(3.0, gt=0, le=60)
    motion_pct: float = Field(
        0.5, gt=0, le=10, description="feedback progress towards the demand that counts as "
        "moving, %"
    )
    stuck_no_motion_s: float = Field(
        5.0, gt=0, le=120, description="a valve is stuck only when it has made no progress "
        "(motion_pct) towards its demand for this long while out of step by mismatch_pct; a "
        "valve still moving is slow, never stuck (an actuator slower than motion_pct per this "
        "time counts as stuck: 1000 s stroke with the defaults)"
    )
    learn_stroke: bool = Field(
        True, description="estimate each valve's stroke time online from command vs feedback "
        "(travel with the demand more than travel_gap_pct away) and use it for the expected "
        "position"
    )
    travel_gap_pct: float = Field(
        3.0, gt=0, le=50, description="the valve counts as travelling at full speed while its "
        "demand is at least this far from its feedback, %"
    )
    stroke_sample_pct: float = Field(
        10.0, gt=0, le=100, description="full-speed travel that makes one stroke-time sample, %"
    )
    stroke_min_s: float = Field(5.0, gt=0, le=600, description="learned stroke lower bound, s")
    stroke_max_s: float = Field(600.0, gt=0, le=3600,
                                description="learned stroke upper bound, s")
    rest_samples: int = Field(
        60, ge=1, le=3600, description="seconds at rest averaged into the learned rest "
        "characteristic (feedback − command offset and scatter)"
    )
    slow_ratio: float = Field(
        1.25, gt=1, le=10, description="valve_actuator_slow:<valve> while the learned stroke "
        "exceeds stroke_time_s × this (no alarm without stroke_time_s)"
    )

    @model_validator(mode="after")
    def _bounds(self) -> ValveSettings:
        for name, v in (("stroke_time_s", self.stroke_time_s),
                        ("stroke_prior_s", self.stroke_prior_s)):
            if v is not None and not self.stroke_min_s <= v <= self.stroke_max_s:
                raise ValueError(f"valves: need stroke_min_s <= {name} <= stroke_max_s")
        return self


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
    __slots__ = ("expected", "fb_prev", "gap_prev", "mismatch", "moved_t", "ref_fb",
                 "rest_band", "rest_cmd", "rest_fb", "rest_n", "rest_offset", "rest_t",
                 "seg_dist", "seg_t", "since", "stroke_n", "stroke_s", "t")

    def __init__(self) -> None:
        self.expected: float | None = None
        self.t: float | None = None
        self.since: float | None = None
        self.mismatch = 0.0
        self.ref_fb: float | None = None  # feedback when progress was last seen
        self.moved_t: float | None = None  # when progress was last seen (or demand reached)
        self.fb_prev: float | None = None
        self.gap_prev = 0.0  # demand − feedback in the previous tick
        self.seg_dist = 0.0  # full-speed travel towards the demand in this segment, %
        self.seg_t = 0.0  # its duration, s
        self.stroke_s: float | None = None  # learned stroke time (None: not yet)
        self.rest_offset: float | None = None  # learned feedback − command at rest, %
        self.rest_band: float | None = None  # learned mean |scatter| about it, %
        self.rest_t: float | None = None
        self.rest_fb = 0.0
        self.rest_cmd = 0.0
        self.stroke_n = 0  # stroke samples measured (valvey.learned_age: confirmations)
        self.rest_n = 0  # rest samples averaged in (ditto)


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
        self._slow_ids: dict[str, str] = {}

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
        stale_s = s.stale_after_s
        for i, u in enumerate(self.units):
            c = self._checks[i]
            cmd = _val(samples.get(u.command), now, stale_s)
            if cmd is None:
                cmd = self._written.get(i)
            fb = _val(samples.get(u.position), now, stale_s) if u.position else None
            if cmd is None or fb is None:
                c.since = c.moved_t = c.fb_prev = None
                c.seg_dist = c.seg_t = 0.0
                c.expected = fb
                c.t = now
                continue
            if c.expected is None or c.t is None:
                c.expected = fb
            else:
                d = cmd - c.expected
                m = (now - c.t) * 100.0 / self.stroke_time_s(i)
                c.expected += m if d > m else -m if d < -m else d
                if s.learn_stroke:
                    self._learn(c, fb, now - c.t)
            c.t = now
            c.fb_prev = fb
            c.gap_prev = cmd - fb
            self._progress(c, cmd, fb, now)
            if s.learn_stroke:
                self._learn_rest(c, cmd, fb, now)
            c.mismatch = abs(c.expected - fb)
            if c.mismatch > s.mismatch_pct and c.moved_t is not None \
                    and now - c.moved_t >= s.stuck_no_motion_s - 1e-9:
                if c.since is None:
                    c.since = now
                if now - c.since >= s.confirm_s - 1e-9 and i not in self._failed:
                    self._failed[i] = "stuck"
                    failed_now = u.name
                    self._pending.append(f"valves:failed:{u.name}:mismatch "
                                         f"{c.mismatch:.1f} %, no motion for "
                                         f"{now - c.moved_t:.1f} s")
                    if i == self._active:
                        self.detected_t = now
                        writes += self._after_failure(i, now, samples, demand_pct)
            else:
                c.since = None
        cond: dict[str, bool] = {}
        for i, u in enumerate(self.units):
            aid = self._fault_ids.get(u.name)
            if aid is None:  # alarm ids built once per valve name, not per tick
                aid = self._fault_ids[u.name] = f"valve_{u.name}_fault"
                self._slow_ids[u.name] = alarm_id("valve_actuator_slow", u.name)
            cond[aid] = i in self._failed
            st = self._checks[i].stroke_s
            cond[self._slow_ids[u.name]] = (st is not None and i not in self._failed
                                            and s.stroke_time_s is not None
                                            and st > s.stroke_time_s * s.slow_ratio)
        cond["valve_failover"] = self._active != 0
        cond["valve_no_spare"] = self._active in self._failed
        trans: tuple[str, ...] = ()
        if self._pending:
            trans, self._pending = tuple(self._pending), []
        return _new_valve_step(writes, self._active, cond, trans, failed_now)

    def _after_failure(self, i: int, now: float, samples: Mapping[str, Sample],
                       demand_pct: float | None) -> list[tuple[str, float]]:
        """The active valve ``i`` was just declared stuck: fail over to a healthy spare, or,
        with none left, drive the failed valve that is more open (more cooling: the safe
        direction for the supply temperature) and leave the other as it is; the safety logic
        caps the rack (``valve_no_spare``)."""
        name = self.units[i].name
        spare = self._spare()
        if spare is not None:
            self._active = spare
            self.failover_t = now
            self._pending.append(f"valves:failover:{name}->{self.units[spare].name}")
            self._checks[spare].since = None
            return self._swap(i, spare, demand_pct)
        self._pending.append(f"valves:no_spare:{name}")
        best, best_fb = i, -1.0
        for k, u in enumerate(self.units):
            fb = (_val(samples.get(u.position), now, self.s.stale_after_s)
                  if u.position else None)
            if fb is not None and fb > best_fb + 1e-9:
                best, best_fb = k, fb
        if best != i:
            self._active = best
            self._pending.append(f"valves:hold:{self.units[best].name} (more open)")
        return []

    def _progress(self, c: _Check, cmd: float, fb: float, now: float) -> None:
        """Note when the feedback last made progress towards the demand (or was there)."""
        mp = self.s.motion_pct
        if c.moved_t is None or c.ref_fb is None or abs(cmd - fb) <= mp:
            c.moved_t, c.ref_fb = now, fb
            return
        toward = (fb - c.ref_fb) if cmd > c.ref_fb else (c.ref_fb - fb)
        if toward >= mp:
            c.moved_t, c.ref_fb = now, fb

    def _learn(self, c: _Check, fb: float, dt: float) -> None:
        """Stroke-time sample from full-speed travel: while the demand was at least
        ``travel_gap_pct`` from the feedback, progress over time; one sample per
        ``stroke_sample_pct`` of travel, averaged 1:1 into the estimate, bounded."""
        s = self.s
        g = c.gap_prev
        if c.fb_prev is None or dt <= 0.0 or abs(g) < s.travel_gap_pct or (
                c.moved_t is not None and c.t is not None
                and c.t - c.moved_t > s.stuck_no_motion_s):
            c.seg_dist = c.seg_t = 0.0  # not travelling (or not moving: no speed to learn)
            return
        c.seg_dist += (fb - c.fb_prev) if g > 0.0 else (c.fb_prev - fb)
        c.seg_t += dt
        if c.seg_dist >= s.stroke_sample_pct:
            sample = 100.0 * c.seg_t / c.seg_dist
            est = sample if c.stroke_s is None else 0.5 * (c.stroke_s + sample)
            c.stroke_s = min(s.stroke_max_s, max(s.stroke_min_s, est))
            c.stroke_n += 1
            c.seg_dist = c.seg_t = 0.0

    def _learn_rest(self, c: _Check, cmd: float, fb: float, now: float) -> None:
        """The positioner's static characteristic from command vs feedback at rest (both
        still within 0.1 % over a second, feedback within mismatch_pct / 2 of the command):
        the offset (mean feedback − command) and the scatter about it (dead band, backlash),
        averaged over ~``rest_samples`` seconds. Reported (state, persisted); the
        plausibility check does not use them (a stuck valve at rest looks the same)."""
        if c.rest_t is None:
            c.rest_t, c.rest_fb, c.rest_cmd = now, fb, cmd
            return
        if now - c.rest_t < 1.0 - 1e-9:
            return
        still = abs(fb - c.rest_fb) < 0.1 and abs(cmd - c.rest_cmd) < 0.1
        c.rest_t, c.rest_fb, c.rest_cmd = now, fb, cmd
        lim = 0.5 * self.s.mismatch_pct
        e = fb - cmd
        if not still or abs(e) > lim:
            return
        a = 1.0 / self.s.rest_samples
        off = e if c.rest_offset is None else c.rest_offset + (e - c.rest_offset) * a
        c.rest_offset = min(lim, max(-lim, off))
        c.rest_n += 1
        dev = abs(e - c.rest_offset)
        c.rest_band = dev if c.rest_band is None else c.rest_band + (dev - c.rest_band) * a

    def stroke_time_s(self, index: int) -> float:
        """The stroke time the expected position of valve ``index`` uses, s: the learned one
        when there is one, else the configured ``stroke_time_s``, else ``stroke_prior_s``."""
        st = self._checks[index].stroke_s
        if st is not None and self.s.learn_stroke:
            return st
        return self.s.stroke_time_s if self.s.stroke_time_s is not None else (
            self.s.stroke_prior_s)

    def learned(self) -> dict[str, float]:
        """Learned stroke times by valve name, s (persisted by the daemon)."""
        return {u.name: c.stroke_s for u, c in zip(self.units, self._checks, strict=True)
                if c.stroke_s is not None}

    def learned_rest(self) -> dict[str, tuple[float, float]]:
        """Learned rest characteristic by valve name: (offset %, scatter %) (persisted)."""
        return {u.name: (c.rest_offset, c.rest_band if c.rest_band is not None else 0.0)
                for u, c in zip(self.units, self._checks, strict=True)
                if c.rest_offset is not None}

    def restore_learned_rest(self, learned: Mapping[str, Any]) -> list[str]:
        """Lay saved rest characteristics (``name: [offset %, scatter %]``) over the cold
        ones; an offset beyond mismatch_pct / 2, a scatter outside [0, mismatch_pct / 2],
        non-numbers and unknown valves are skipped. Returns the names restored."""
        lim = 0.5 * self.s.mismatch_pct
        done = []
        for u, c in zip(self.units, self._checks, strict=True):
            v = learned.get(u.name)
            if not isinstance(v, list | tuple) or len(v) != 2:
                continue
            off, band = v
            if all(isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
                   for x in (off, band)) and abs(off) <= lim and 0.0 <= band <= lim:
                c.rest_offset, c.rest_band = float(off), float(band)
                done.append(u.name)
        return done

    def learned_samples(self) -> dict[str, tuple[int, int]]:
        """By valve name: (stroke samples, rest samples) measured so far, counts that grow
        with each measurement confirming `learned` / `learned_rest` (valvey.learned_age)."""
        return {u.name: (c.stroke_n, c.rest_n)
                for u, c in zip(self.units, self._checks, strict=True)}

    def restore_learned(self, learned: Mapping[str, Any], *,
                        measured: bool = False) -> list[str]:
        """Lay saved stroke times over the cold estimates; values outside
        [stroke_min_s, stroke_max_s], non-numbers and unknown valves are skipped.
        ``measured``: the strokes were measured just now (a commissioning run's): each one
        taken counts as a stroke sample (`learned_samples`). Returns the names of the valves
        restored."""
        s = self.s
        done = []
        for u, c in zip(self.units, self._checks, strict=True):
            v = learned.get(u.name)
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) \
                    and s.stroke_min_s <= v <= s.stroke_max_s:
                c.stroke_s = float(v)
                c.stroke_n += int(measured)
                done.append(u.name)
        return done

    def reset_learned(self) -> None:
        """Forget the learned stroke times (back to the cold-start estimate) and
        rest characteristics."""
        for c in self._checks:
            c.stroke_s = c.rest_offset = c.rest_band = None
            c.seg_dist = c.seg_t = 0.0
            c.stroke_n = c.rest_n = 0

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
                "stroke_time_s": round(self.stroke_time_s(i), 1),
                "stroke_learned": c.stroke_s is not None,
                "rest_offset_pct": None if c.rest_offset is None else round(c.rest_offset, 2),
                "rest_band_pct": None if c.rest_band is None else round(c.rest_band, 2),
            })
        return {"active": self.units[self._active].name,
                "second_valve": self.s.second_valve and len(self.units) > 1,
                "units": out}
