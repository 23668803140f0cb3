"""Secondary pumps: differential-pressure (or flow) loop on pump speed, maximum-pressure
override, lead/lag by run hours, N+1 failover with a bumpless speed hand-off. Pure: no I/O,
no clock; `PumpManager.step` is called on every 10 Hz tick with the time and the samples.

**Speed loop** (once per ``period_s``; Vertiv CDU 600: control mode flow or DP, minimum speed
15 %, REFERENCE §1.5): PI on the differential pressure (``mode = diff_pressure``) or the flow,
reverse acting (speed rises when the PV is below its setpoint), setpoint ramped. A second PI,
the **maximum-pressure override**, regulates the pump discharge pressure (static loop pressure
+ DP) to at most ``max_pressure_kpa``; the *lower* output wins (min-select) and both
integrators track the selected output (external reset feedback: no windup in the loser,
REFERENCE §2.2). While the loop pressure or the DP cannot be judged (stale, bad, outside its
plausibility window) the override holds the speed where it is as a ceiling (its safe side: no
faster, never "no limit"). The winner is reported: ``diff_pressure`` / ``flow``, ``max_pressure``,
``min_speed``, ``handoff`` (held during a changeover), ``isolated`` (rack isolated: the pumps
idle at minimum speed), ``failsafe`` (PV invalid for ``failsafe_after_periods``: the speed goes
to ``failsafe_speed_pct``), ``manual``.

**Failover** (every tick; REFERENCE §3.4: pump-failure detection must take ≤ 0.5 s: the VFD
fault bit, or flow < 50 % for 3 samples at 10 Hz; §5 S3: standby commanded ≤ 1 s, vendor
changeover 0.25 s, REFERENCE §1.5). The duty pump is declared failed on the first of:

* its fault bit (``vfd_fault``);
* its running bit off for ``running_grace_s`` while it is the duty pump (``not_running``);
* flow below ``trip_flow_fraction`` of its reference for ``trip_samples`` consecutive fresh
  samples (``flow_collapse``), or DP below ``trip_dp_fraction`` of its reference likewise
  (``dp_collapse``: DP ∝ Q², so 25 % of DP is 50 % of flow). The references are slow averages
  (``reference_tau_s``) of the healthy readings.

After ``changeover_delay_s`` the healthy standby is selected (``duty_pump_select``) and the
speed command is *kept* (the standby is pre-set to the last good output: bumpless); the speed
loop holds (``handoff``) until the new pump runs within 5 % of the command and the DP is back
to 90 % of its reference (without speed feedback: the flow back to 95 % after 5 s; at most
``handoff_max_s``), so the integrator does not wind up on the flow dip. A failed pump stays
failed until `reset_faults` (an operator command) and its fault bit is clear. With no healthy
standby, ``no_standby`` is set: the safety logic asks racky for a cap (docs/CONTRACTS.md;
REFERENCE §5 S3).

**Lead/lag**: every ``rotation_check_s`` (and once soon after start), if the duty pump has run
``rotate_after_h`` hours more than a healthy standby, the standby becomes duty (a planned
changeover: the CDU keeps the old pump running until the new one is at speed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from rackplane.core.pid import PidLoop, PidSettings
from rackplane.core.samples import Sample, fresh_value, slots_constructor
from valvey.core.pump_settings import Constraint, PumpLoopSettings, PumpSettings, PumpUnit

__all__ = ["PumpManager", "PumpStep", "PumpUnit"]

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class PumpStep:
    """What `PumpManager.step` decided.

    Attributes:
        writes: ``(point, value)`` to write now.
        speed_command_pct: the speed command (None before initialisation).
        duty: index of the duty pump (as valvey believes it).
        constraint: the speed loop's winner (see the module docstring).
        conditions: alarm conditions.
        transitions: changes in this tick (log each once).
        trip: ``(pump name, reason)`` when a duty pump was declared failed in this tick.
    """

    writes: list[tuple[str, float]]
    speed_command_pct: float | None
    duty: int
    constraint: Constraint
    conditions: Mapping[str, bool]
    transitions: tuple[str, ...]
    trip: tuple[str, str] | None = None


_new_pump_step = slots_constructor(PumpStep)  # PumpStep(...) on every tick, all fields


@dataclass(slots=True)
class _Trip:
    count_flow: int = 0
    count_dp: int = 0
    last_flow_t: float | None = None
    last_dp_t: float | None = None


@dataclass(slots=True)
class _Events:
    trip_t: float | None = None
    trip_reason: str | None = None
    standby_commanded_t: float | None = None
    handoff_done_t: float | None = None
    history: list[dict[str, Any]] = field(default_factory=list)


_val = fresh_value  # value if usable and fresh, else None


class PumpManager:
    """The pumps (module docstring).

    Args:
        pumps: `PumpSettings`; loop: `PumpLoopSettings`.
        flow_point, dp_point, pressure_point: register-map points of flow [L/min], DP [kPa]
            and static loop pressure [kPa] (None: not available).
    """

    def __init__(self, pumps: PumpSettings, loop: PumpLoopSettings, *,
                 flow_point: str | None = "flow_lpm", dp_point: str | None = "diff_pressure_kpa",
                 pressure_point: str | None = "loop_pressure_kpa"):
        self.p = pumps
        self.s = loop
        self.units = pumps.units()
        self.flow_point = flow_point
        self.dp_point = dp_point
        self.pressure_point = pressure_point
        self._main = PidLoop(self._main_settings(loop), loop.setpoint)
        self._override: PidLoop | None = None
        if loop.max_pressure_kpa is not None:
            self._override = PidLoop(self._override_settings(loop), loop.max_pressure_kpa)
        self._sp_target = loop.setpoint
        self._sp = loop.setpoint
        self._cmd: float | None = None
        self._written: float | None = None
        self._force_write = False
        self._mode: Literal["initialising", "auto", "manual", "failsafe"] = "initialising"
        self._manual: float | None = None
        self._t_period: float | None = None
        self._bad_periods = 0
        self._constraint: Constraint = "initialising"
        self._duty = 0
        self._duty_known = False
        self._selected_at: float | None = None
        self._failed: dict[int, str] = {}
        self._trip = _Trip()
        self._flow_ref: float | None = None
        self._dp_ref: float | None = None
        self._t_ref: float | None = None
        self._pending_change: tuple[int, float, bool] | None = None  # (to, at, planned)
        self._handoff_since: float | None = None
        self._next_rotation: float | None = None
        self._pending: list[str] = []
        self._duty_cmd_t: float | None = None
        self._duty_write_t = -math.inf
        self._not_running_since: float | None = None
        self.events = _Events()
        self.isolated = False
        self.no_standby = False
        self.override_active = False
        self._pv_status = "missing"
        self._failover_since: float | None = None
        self._fault_ids = [f"pump_{u.name}_fault" for u in self.units]  # alarm ids

    # --- settings --------------------------------------------------------------------------

    @staticmethod
    def _main_settings(s: PumpLoopSettings) -> PidSettings:
        dp = s.mode == "diff_pressure"
        kc = s.dp_kc_pct_per_kpa if dp else s.flow_kc_pct_per_lpm
        ti = s.dp_ti_s if dp else s.flow_ti_s
        return PidSettings(kp=kc, ki=kc / ti, action="reverse", output_min=s.speed_min_pct,
                           output_max=s.speed_max_pct, error_deadband=s.deadband)

    @staticmethod
    def _override_settings(s: PumpLoopSettings) -> PidSettings:
        kc = s.max_pressure_kc_pct_per_kpa
        return PidSettings(kp=kc, ki=kc / s.max_pressure_ti_s, action="reverse",
                           output_min=s.speed_min_pct, output_max=s.speed_max_pct)

    # --- queries ---------------------------------------------------------------------------

    @property
    def duty(self) -> int:
        """Index of the duty pump."""
        return self._duty

    @property
    def unit_names(self) -> list[str]:
        """Pump names in index order."""
        return [u.name for u in self.units]

    @property
    def setpoint(self) -> float:
        """The operator's setpoint (kPa or L/min, by mode)."""
        return self._sp_target

    @property
    def speed_command_pct(self) -> float | None:
        """The speed command [%]."""
        return self._cmd

    @property
    def failed(self) -> dict[str, str]:
        """Failed pumps: name -> reason (latched until `reset_faults`)."""
        return {self.units[i].name: r for i, r in self._failed.items()}

    @property
    def in_handoff(self) -> bool:
        """A changeover is in progress (pending or ramping)."""
        return self._handoff_since is not None or self._pending_change is not None

    def stop_command_pct(self) -> float | None:
        """Speed to write at shutdown (None: hold)."""
        if self.s.stop_action == "hold":
            return None
        return self.s.failsafe_speed_pct

    # --- operator commands -----------------------------------------------------------------

    def set_setpoint(self, value: float) -> None:
        """New DP [kPa] or flow [L/min] setpoint (by mode), ramped.

        Raises:
            ValueError: not finite or outside the mode's configured limits
                (`PumpLoopSettings.setpoint_limits`).
        """
        if not math.isfinite(value):
            raise ValueError("setpoint must be finite")
        lo, hi, name, unit = self.s.setpoint_limits
        if not lo <= value <= hi:
            raise ValueError(f"{name} = {value:g} {unit} is outside [{lo:g}, {hi:g}] {unit} "
                             "(pump_loop limits)")
        self._sp_target = float(value)
        if self.s.setpoint_ramp_per_min is None:
            self._sp = self._sp_target
            self._main.set_setpoint(self._sp)

    def select_lead(self, index: int, now: float) -> None:
        """Make pump ``index`` duty (a planned changeover).

        Raises:
            ValueError: no such pump, or it has failed.
        """
        if not 0 <= index < len(self.units):
            raise ValueError(f"no pump with index {index}")
        if index in self._failed:
            raise ValueError(f"pump {self.units[index].name} has failed "
                             f"({self._failed[index]}); reset it first")
        if index != self._duty:
            self._pending_change = (index, now, True)

    def rotate(self, now: float) -> int:
        """Planned changeover to the next healthy pump; returns its index.

        Raises:
            ValueError: no healthy standby.
        """
        n = len(self.units)
        for k in range(1, n):
            j = (self._duty + k) % n
            if j not in self._failed:
                self.select_lead(j, now)
                return j
        raise ValueError("no healthy standby pump to rotate to")

    def reset_faults(self) -> list[str]:
        """Forget latched pump failures (the pumps' own fault bits still count); returns the
        names reset."""
        names = [self.units[i].name for i in self._failed]
        self._failed.clear()
        self.events.trip_t = None
        return names

    def set_manual(self, speed_pct: float) -> None:
        """Operator speed (within the limits). Raises ValueError outside them."""
        if not (math.isfinite(speed_pct)
                and self.s.speed_min_pct <= speed_pct <= self.s.speed_max_pct):
            raise ValueError(f"speed {speed_pct} outside [{self.s.speed_min_pct}, "
                             f"{self.s.speed_max_pct}]")
        self._manual = float(speed_pct)
        self._mode = "manual"

    def set_auto(self) -> None:
        """Back to automatic, bumpless from the current command."""
        self._manual = None
        if self._mode == "manual" and self._cmd is not None:
            self._main.set_auto(self._cmd)
            if self._override is not None:
                self._override.set_auto(self._cmd)
            self._mode = "auto"

    # --- the step --------------------------------------------------------------------------

    def step(self, now: float, samples: Mapping[str, Sample], *, isolated: bool = False
             ) -> PumpStep:
        """One 10 Hz tick (module docstring). ``isolated``: the rack's isolation valves are
        closed (no flow expected: collapse detection off, pumps at minimum speed)."""
        p, s = self.p, self.s
        writes: list[tuple[str, float]] = []
        trip: tuple[str, str] | None = None
        if isolated != self.isolated:
            self._pending.append(f"pumps:isolated:{self.isolated}->{isolated}")
            self.isolated = isolated
            self._flow_ref = self._dp_ref = None
        st = p.stale_after_s
        # Which pump is duty: after our own change, the read-back must confirm it (the write
        # is repeated each second while it does not); otherwise the CDU's read-back wins (a
        # change made at the CDU's panel, or the first reading after start).
        if p.duty_select is not None:
            d = _val(samples.get(p.duty_select), now, st)
            di = None if d is None else round(d)
            if di is not None and not 0 <= di < len(self.units):
                di = None
            if self._duty_cmd_t is not None:
                if di == self._duty:
                    self._duty_cmd_t = None
                elif now - self._duty_cmd_t < p.handoff_max_s:
                    if now - self._duty_write_t >= 1.0 - _EPS:
                        self._duty_write_t = now
                        writes.append((p.duty_select, float(self._duty)))
                elif di is not None:
                    self._pending.append(f"pumps:duty_not_confirmed:{self.unit_names[di]}")
                    self._duty_cmd_t = None
            if self._duty_cmd_t is None and di is not None and (
                    di != self._duty or not self._duty_known):
                if self._duty_known:
                    self._pending.append(f"pumps:duty:{self.unit_names[self._duty]}->"
                                         f"{self.unit_names[di]}")
                self._duty = di
                self._duty_known = True
                self._selected_at = now
        else:
            self._duty_known = True
        faults = {i: _val(samples.get(u.fault), now, st) if u.fault else None
                  for i, u in enumerate(self.units)}
        flow = _val(samples.get(self.flow_point), now, st) if self.flow_point else None
        dp = _val(samples.get(self.dp_point), now, st) if self.dp_point else None
        # --- failure of the duty pump ---
        reason = None if not self._duty_known else self._duty_failure(now, samples, flow, dp,
                                                                     faults)
        if reason is not None and self._duty not in self._failed:
            self._failed[self._duty] = reason
            name = self.unit_names[self._duty]
            trip = (name, reason)
            self.events.trip_t = now
            self.events.trip_reason = reason
            self._pending.append(f"pumps:trip:{name}:{reason}")
            standby = self._standby(faults)
            if standby is None:
                self.no_standby = True
                self._pending.append("pumps:no_standby")
            else:
                self._pending_change = (standby, now + p.changeover_delay_s, False)
        elif self._duty in self._failed and self._pending_change is None:
            self.no_standby = self._standby(faults) is None
        else:
            self.no_standby = False
        # a changeover due now
        if self._pending_change is not None and now >= self._pending_change[1] - _EPS:
            to, _at, planned = self._pending_change
            self._pending_change = None
            if p.duty_select is not None:
                writes.append((p.duty_select, float(to)))
                self._duty_cmd_t = self._duty_write_t = now
            self._pending.append(f"pumps:{'rotate' if planned else 'failover'}:"
                                 f"{self.unit_names[self._duty]}->{self.unit_names[to]}")
            self._duty = to
            self._selected_at = now
            self._handoff_since = now
            if not planned:
                self.events.standby_commanded_t = now
                self._failover_since = now
            self._trip = _Trip()
            if self._cmd is not None:
                self._force_write = True  # the standby gets the last good speed at once
        # hand-off complete?
        if self._handoff_since is not None:
            done = now - self._handoff_since >= p.handoff_max_s
            u = self.units[self._duty]
            spd = _val(samples.get(u.speed), now, st) if u.speed else None
            run = _val(samples.get(u.running), now, st) if u.running else 1.0
            dp_back = self._dp_ref is None or dp is None or dp >= 0.9 * self._dp_ref
            if (self._cmd is not None and spd is not None and run and spd >= self._cmd - 5.0
                    and dp_back):
                done = True
            if spd is None and self._flow_ref is not None and flow is not None and (
                    flow >= 0.95 * self._flow_ref and now - self._handoff_since >= 5.0):
                done = True  # no speed feedback: the flow is back
            if done:
                self._handoff_since = None
                self.events.handoff_done_t = now
                self._pending.append("pumps:handoff_done")
        # references for collapse detection (healthy, steady operation only)
        self._update_refs(now, flow, dp)
        # rotation by run hours (nothing to do before the next check is due)
        if self._next_rotation is None or now >= self._next_rotation:
            self._rotation(now, samples, faults)
        # --- the speed loop (once per period) ---
        if self._t_period is None or now - self._t_period >= s.period_s - 0.05:
            dt = None if self._t_period is None else now - self._t_period
            self._t_period = now
            self._period(now, dt, samples, flow, dp)
            if self._cmd is not None and self._decide_write():
                writes.append((p.speed_command, self._cmd))
        elif self._force_write and self._cmd is not None and self._decide_write():
            writes.append((p.speed_command, self._cmd))
        conditions = self._conditions(now, faults, flow)
        trans: tuple[str, ...] = ()
        if self._pending:
            trans, self._pending = tuple(self._pending), []
        return _new_pump_step(writes, self._cmd, self._duty, self._constraint, conditions,
                              trans, trip)

    # --- internals -------------------------------------------------------------------------

    def _duty_failure(self, now: float, samples: Mapping[str, Sample], flow: float | None,
                      dp: float | None, faults: Mapping[int, float | None]) -> str | None:
        p = self.p
        u = self.units[self._duty]
        st = p.stale_after_s
        f = faults[self._duty]  # the duty pump's fault bit, read this tick
        if f is not None and f >= 0.5:
            return "vfd_fault"
        in_handoff = self._handoff_since is not None
        r = _val(samples.get(u.running), now, st) if u.running is not None else None
        if r is not None and r < 0.5 and not in_handoff and self._selected_at is not None \
                and now - self._selected_at >= p.running_grace_s:
            if self._not_running_since is None:
                self._not_running_since = now
            if now - self._not_running_since >= p.running_grace_s - _EPS:
                return "not_running"
        else:
            self._not_running_since = None
        if self.isolated or in_handoff:
            self._trip = _Trip()
            return None
        tr = self._trip
        fs = samples.get(self.flow_point) if self.flow_point else None
        if flow is not None and fs is not None and self._flow_ref is not None:
            if fs.t_mono != tr.last_flow_t:
                tr.last_flow_t = fs.t_mono
                tr.count_flow = tr.count_flow + 1 if flow < p.trip_flow_fraction * (
                    self._flow_ref) else 0
            if tr.count_flow >= p.trip_samples:
                return "flow_collapse"
        ds = samples.get(self.dp_point) if self.dp_point else None
        if dp is not None and ds is not None and self._dp_ref is not None:
            if ds.t_mono != tr.last_dp_t:
                tr.last_dp_t = ds.t_mono
                tr.count_dp = tr.count_dp + 1 if dp < p.trip_dp_fraction * self._dp_ref else 0
            if tr.count_dp >= p.trip_samples:
                return "dp_collapse"
        return None

    def _standby(self, faults: Mapping[int, float | None]) -> int | None:
        for k in range(1, len(self.units)):
            j = (self._duty + k) % len(self.units)
            f = faults.get(j)
            if j not in self._failed and not (f is not None and f >= 0.5):
                return j
        return None

    def _update_refs(self, now: float, flow: float | None, dp: float | None) -> None:
        dt = 0.0 if self._t_ref is None else now - self._t_ref
        self._t_ref = now
        if self.isolated or self._handoff_since is not None or self._duty in self._failed:
            return
        a = min(1.0, dt / self.p.reference_tau_s)
        if flow is not None and flow > 0.0:
            if self._flow_ref is None:
                self._flow_ref = flow
            elif flow > 0.8 * self._flow_ref:
                self._flow_ref += (flow - self._flow_ref) * a
        if dp is not None and dp > 0.0:
            if self._dp_ref is None:
                self._dp_ref = dp
            elif dp > 0.6 * self._dp_ref:
                self._dp_ref += (dp - self._dp_ref) * a

    def _rotation(self, now: float, samples: Mapping[str, Sample],
                  faults: Mapping[int, float | None]) -> None:
        p = self.p
        if p.rotate_after_h is None or len(self.units) < 2 or not self._duty_known:
            return
        if self._next_rotation is None:
            self._next_rotation = now + 10.0  # once soon after start, then hourly
        if now < self._next_rotation or self.in_handoff or self._duty in self._failed:
            return
        self._next_rotation = now + p.rotation_check_s
        hours = {}
        for i, u in enumerate(self.units):
            h = _val(samples.get(u.run_hours), now, p.stale_after_s) if u.run_hours else None
            if h is not None:
                hours[i] = h
        if self._duty not in hours:
            return
        best = None
        for i, h in hours.items():
            f = faults.get(i)
            if i == self._duty or i in self._failed or (f is not None and f >= 0.5):
                continue
            if hours[self._duty] - h >= p.rotate_after_h and (best is None or h < hours[best]):
                best = i
        if best is not None:
            self._pending_change = (best, now, True)

    def _period(self, now: float, dt: float | None, samples: Mapping[str, Sample],
                flow: float | None, dp: float | None) -> None:
        s = self.s
        pv = dp if s.mode == "diff_pressure" else flow
        readback = _val(samples.get(self.p.speed_command), now, s.stale_after_s)
        # setpoint ramp
        if s.setpoint_ramp_per_min is None or dt is None:
            self._sp = self._sp_target
        else:
            d = self._sp_target - self._sp
            m = s.setpoint_ramp_per_min / 60.0 * dt
            self._sp += m if d > m else -m if d < -m else d
        self._main.set_setpoint(self._sp)
        status = "ok" if pv is not None else "bad"
        if self.isolated:
            status = "isolated"  # no flow by design: the PV says nothing
        if status != self._pv_status:
            self._pending.append(f"pumps:pv:{self._pv_status}->{status}")
            self._pv_status = status
        self._bad_periods = 0 if pv is not None or self.isolated else self._bad_periods + 1
        if self._mode == "initialising":
            if readback is None:
                if self._bad_periods >= s.failsafe_after_periods and (
                        s.failsafe_speed_pct is not None):
                    self._enter_failsafe()
                return
            self._cmd = readback
            self._written = readback
            self._main.set_auto(readback)
            if self._override is not None:
                self._override.set_auto(readback)
            self._mode = "auto"
            self._constraint = "diff_pressure" if s.mode == "diff_pressure" else "flow"
            return
        assert self._cmd is not None
        if self._mode == "manual":
            assert self._manual is not None
            self._cmd = self._rate(self._cmd, self._manual, dt)
            self._main.set_manual(self._cmd)
            if self._override is not None:
                self._override.set_manual(self._cmd)
            self._set_constraint("manual")
            return
        if self.isolated:
            self._cmd = self._rate(self._cmd, s.speed_min_pct, dt)
            self._main.set_manual(self._cmd)
            if self._override is not None:
                self._override.set_manual(self._cmd)
            self._set_constraint("isolated")
            return
        if self._mode == "failsafe":
            if pv is None:
                return
            self._mode = "auto"
            self._main.set_auto(self._cmd)
            if self._override is not None:
                self._override.set_auto(self._cmd)
        elif self._main.mode == "manual":  # back from isolation
            self._main.set_auto(self._cmd)
            if self._override is not None:
                self._override.set_auto(self._cmd)
        if pv is None:
            if (self._bad_periods >= s.failsafe_after_periods
                    and s.failsafe_speed_pct is not None):
                self._enter_failsafe()
            return
        if self._handoff_since is not None:
            # Hold the speed through the changeover: the integrators track the held command.
            self._main.track(self._cmd)
            if self._override is not None:
                self._override.track(self._cmd)
            self._set_constraint("handoff")
            return
        step = dt if dt is not None and dt > 0 else s.period_s
        u_main = self._main.update(pv, step).output
        u = u_main
        winner: Constraint = "diff_pressure" if s.mode == "diff_pressure" else "flow"
        pressure = (_val(samples.get(self.pressure_point), now, s.stale_after_s)
                    if self.pressure_point else None)
        self.override_active = False
        if self._override is not None and pressure is not None and dp is not None:
            u_ovr = self._override.update(pressure + dp, step).output
            if u_ovr < u_main - _EPS:
                u, winner = u_ovr, "max_pressure"
                self.override_active = True
        elif (self._override is not None and self.pressure_point is not None
              and u_main > self._cmd + _EPS):
            # The pressure limit cannot be judged (loop pressure or DP stale, bad or outside
            # its plausibility window): its safe side is "no faster than now", never "no
            # limit" (issue 14). The speed may fall with the DP loop, not rise.
            u, winner = self._cmd, "max_pressure"
        cmd = self._rate(self._cmd, u, dt)
        if cmd <= s.speed_min_pct + _EPS and winner not in ("max_pressure",):
            winner = "min_speed"
        elif cmd >= s.speed_max_pct - _EPS:
            winner = "max_speed"
        self._main.track(cmd)
        if self._override is not None:
            self._override.track(cmd)
        self._cmd = cmd
        self._set_constraint(winner)

    def _enter_failsafe(self) -> None:
        fs = self.s.failsafe_speed_pct
        assert fs is not None
        self._cmd = fs
        self._force_write = True
        self._main.set_manual(fs)
        if self._override is not None:
            self._override.set_manual(fs)
        if self._mode != "failsafe":
            self._pending.append(f"pumps:mode:{self._mode}->failsafe")
        self._mode = "failsafe"
        self._set_constraint("failsafe")

    def _rate(self, prev: float, target: float, dt: float | None) -> float:
        if dt is None:
            return target
        m = self.s.rate_limit_pct_per_s * dt
        return prev + min(m, max(-m, target - prev))

    def _set_constraint(self, c: Constraint) -> None:
        if c != self._constraint:
            self._pending.append(f"pumps:constraint:{self._constraint}->{c}")
            self._constraint = c

    def _decide_write(self) -> bool:
        cmd = self._cmd
        assert cmd is not None
        force, self._force_write = self._force_write, False
        w = self._written
        if not force and w is not None:
            d = abs(cmd - w)
            if d <= _EPS:
                return False
            at_limit = cmd in (self.s.speed_min_pct, self.s.speed_max_pct)
            if d < self.s.min_step_pct - _EPS and not at_limit:
                return False
        self._written = cmd
        return True

    def _conditions(self, now: float, faults: Mapping[int, float | None], flow: float | None
                    ) -> dict[str, bool]:
        out: dict[str, bool] = {}
        healthy = 0
        for i, aid in enumerate(self._fault_ids):
            f = faults.get(i)
            bad = i in self._failed or (f is not None and f >= 0.5)
            out[aid] = bad
            healthy += 0 if bad else 1
        out["pump_redundancy_lost"] = len(self.units) > 1 and healthy < 2
        out["pump_no_standby"] = self.no_standby
        fo = self._failover_since
        out["pump_failover"] = fo is not None and now - fo < 5.0
        out["pump_loop_failsafe"] = self._mode == "failsafe"
        out["pump_loop_pv_invalid"] = self._bad_periods >= 1
        out["loop_pressure_high"] = self.override_active
        return out

    def state(self, now: float, samples: Mapping[str, Sample]) -> dict[str, Any]:
        """JSON-ready state (retained ``state/pumps``)."""
        units = []
        for i, u in enumerate(self.units):
            def v(pt: str | None) -> float | None:
                return _val(samples.get(pt), now, self.p.stale_after_s) if pt else None
            units.append({"name": u.name, "duty": i == self._duty, "running": v(u.running),
                          "fault": v(u.fault), "speed_pct": v(u.speed),
                          "run_hours_h": v(u.run_hours),
                          "failed": self._failed.get(i)})
        return {
            "mode": self._mode,
            "control": self.s.mode,
            "setpoint": self._sp_target,
            "setpoint_ramped": round(self._sp, 3),
            "speed_command_pct": None if self._cmd is None else round(self._cmd, 2),
            "constraint": self._constraint,
            "duty": self.unit_names[self._duty],
            "handoff": self.in_handoff,
            "no_standby": self.no_standby,
            "isolated": self.isolated,
            "flow_reference_lpm": None if self._flow_ref is None else round(self._flow_ref, 1),
            "dp_reference_kpa": None if self._dp_ref is None else round(self._dp_ref, 1),
            "units": units,
        }
