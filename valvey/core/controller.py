"""valvey's pure core: one call per 10 Hz control tick, no I/O (DESIGN §1 "Cores are pure").

`ValveyCore.step(now_mono, samples)` takes the latest sample of every CDU point and every
MQTT sensor (room air, leak sensors, racky's rack power) and returns what to write to the CDU,
what to ask racky (`valvey.core.requests`), the loop's decision, events and alarm changes. The
daemon (valvey/app.py) and the lock-step runner (harness/lockstep_valvey/) drive the same core, so
every control figure measured in lock-step is the daemon's behaviour.

Order inside one tick (docs/VALVEY.md has the picture):

1. supply-sensor vote (`valvey.core.sensors.SupplyVoter`): the PV and each sensor's health;
2. pumps (`valvey.core.pumps`): failover detection and changeover every tick, the speed loop once
   per its period;
3. safety (`valvey.core.safety`): leak tiers, isolation, interlocks (every tick, never inhibited);
4. supply loop (`valvey.core.supply_loop`) once per its period with the dynamic feedforward
   (`valvey.core.feedforward`) and the dew-point floor (the selector); an over-temperature
   interlock overrides its output (the loop tracks it);
5. valves (`valvey.core.valves`): plausibility and failover; the loop's writes go to the active
   valve;
6. capacity (`valvey.core.capacity`) once per second: the rack power cap racky is asked for;
7. requests to racky (`valvey.core.requests`), heartbeat, read-back reconciliation, alarms.

Every actuator's declared fail-safe and stop action (DESIGN §1 "Outputs are owned") is listed
by `ValveyCore.actuators` and in docs/VALVEY.md. Shadow mode computes all of it and writes and
sends nothing (the would-be writes and requests are kept in the state for commissioning).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from rackplane.core.alarms import AlarmDef, AlarmEngine
from rackplane.core.names import alarm_id
from rackplane.core.samples import Sample, fresh_value, slots_constructor
from rackplane.errors import CommandError
from valvey.config import CduPoints, ControlSettings, ValveyConfig
from valvey.core.alarm_defs import alarm_defs
from valvey.core.capacity import CapacityGuard, CapacityStep
from valvey.core.commissioning import Commissioning
from valvey.core.feedforward import DynamicFeedforward
from valvey.core.inputs import input_gate
from valvey.core.output import CoreOutput, floor_dew_point_c
from valvey.core.pumps import PumpManager, PumpStep
from valvey.core.requests import RackyReply, RequestTracker
from valvey.core.safety import Safety, SafetyStep
from valvey.core.sensors import SupplyVoter, VoterResult
from valvey.core.step_test import StepTest
from valvey.core.supply_loop import SupplyLoop
from valvey.core.supply_loop_settings import LoopStep, SupplyLoopSettings
from valvey.core.valves import ValveManager, ValveUnit

__all__ = [
    "HEARTBEAT_MODULUS",
    "SLOW_TICKS",
    "ValveyCore",
]

HEARTBEAT_MODULUS = 65536  # a uint16 register
SLOW_TICKS = 5
"""Safety (leaks, interlocks) runs every 5th 10 Hz tick (0.5 s)."""
_SENSOR_FAULTY = frozenset(("bad", "frozen", "disagree", "drift", "out_of_range"))

_new_core_output = slots_constructor(CoreOutput)  # built on every tick, all fields


class ValveyCore:
    """Supply-temperature loop, pumps, valves, safety, capacity, alarms and the heartbeat.

    Args:
        loop: supply loop settings.
        points: which register-map points mean what.
        control: tick timing (heartbeat interval).
        start_mono: monotonic time the daemon started (alarm start-up inhibit counts from it).
        config: the whole config (default: the embedded defaults with ``loop``, ``points``
            and ``control`` laid over them).
        request_prefix: prefix of request ids to racky; unique per process start.
        extra_alarms: alarms the daemon feeds through ``step(extra_conditions=...)`` (the
            telemetry path's `rackplane.io.selfmetrics.TELEMETRY_ALARMS`); the pure core only
            keeps their state.
    """

    def __init__(
        self,
        loop: SupplyLoopSettings,
        points: CduPoints,
        control: ControlSettings,
        start_mono: float,
        *,
        config: ValveyConfig | None = None,
        request_prefix: str = "valvey",
        extra_alarms: Iterable[AlarmDef] = (),
    ):
        cfg = (config or ValveyConfig()).model_copy(
            update={"supply_loop": loop, "points": points, "control": control})
        self.cfg = cfg
        self.points = points
        self.control = control
        self.loop = SupplyLoop(loop)
        self.voter = SupplyVoter(cfg.supply_sensors, points.supply_temp)
        rp = cfg.sensors.rack_power  # a row CDU's racks: <its name>.<rack>
        self.ff = DynamicFeedforward(cfg.feedforward, None if rp is None else rp.name)
        self.pumps = PumpManager(cfg.pumps, cfg.pump_loop, flow_point=points.flow,
                                 dp_point=points.diff_pressure,
                                 pressure_point=points.loop_pressure)
        self.valves = ValveManager(cfg.valves, ValveUnit(name="a", command=points.valve_command,
                                                         position=points.valve_position))
        stale_of = {t.name: t.stale_after_s for t in cfg.sensor_topics()}
        for t in cfg.sensor_topics():
            if t.kind == "index_list":
                stale_of.update({f"{t.name}.{i:02d}": t.stale_after_s for i in range(t.count)})
        self._stale_of = stale_of
        self.inputs = input_gate(cfg)  # plausibility and failed polls, where samples enter
        self.safety = Safety(cfg.safety, stale_of)
        self.capacity = CapacityGuard(cfg.capacity)
        self.requests = RequestTracker(request_prefix, cfg.racky.retry_s)
        self.step_test = StepTest(cfg.step_test, loop.output_rate_limit_pct_per_s)
        self.commissioning = Commissioning(cfg.commissioning)  # auto-commissioning, issue 21
        self.alarms = AlarmEngine(
            [*alarm_defs(cfg, self.pumps.unit_names, [u.name for u in self.valves.units],
                         self.voter.points, self.inputs.alarm_ids()), *extra_alarms],
            start_mono)
        self._heartbeat = 0
        self._last_heartbeat_mono: float | None = None
        self.last: CoreOutput | None = None
        # Output reconciliation: what we last wrote vs what the device reads back.
        self._last_written: float | None = None
        self._last_written_point: str | None = None
        self._mismatch_since: float | None = None
        self._last_reassert: float = float("-inf")
        self.reasserts = 0
        self.readback_mismatch = False
        self._last_good_pv_mono: float | None = None
        self._ff_pct = 0.0
        self._t_ff: float | None = None
        self._t_cap: float | None = None
        self._cap: CapacityStep | None = None
        self._cap_sent: float | None = None
        self._dew_point: float | None = None
        self._room_temp_valid: float | None = None  # the last valid room temperature, °C
        self._room_stale = False
        self._vote: VoterResult | None = None
        self._pump: PumpStep | None = None
        self._safety: SafetyStep | None = None
        self._override_active = False
        self._would: list[tuple[str, float]] = []
        self._would_requests: list[dict[str, Any]] = []
        self._hunt: deque[int] = deque(maxlen=3600)
        self._hunt_sum = 0
        self._last_valve_cmd: float | None = None
        self._moved = False
        self._events: list[dict[str, Any]] = []
        self.valve_constraint = "initialising"
        self._n_tick = 0
        self._queued: list[tuple[str, float]] = []
        self._samples: Mapping[str, Sample] = {}
        self._sensor_fault_ids = {p: alarm_id("supply_sensor_fault", p)
                                  for p in self.voter.points}
        # the quiet version of the last slow safety decision, (decision, quiet): the same
        # immutable SafetyStep serves the 4 fast ticks in between
        self._quiet: tuple[SafetyStep, SafetyStep] | None = None

    @classmethod
    def from_config(cls, cfg: ValveyConfig, start_mono: float, *,
                    request_prefix: str = "valvey",
                    extra_alarms: Iterable[AlarmDef] = ()) -> ValveyCore:
        """A core from the whole config (``extra_alarms``: see the class)."""
        return cls(cfg.supply_loop, cfg.points, cfg.control, start_mono, config=cfg,
                   request_prefix=request_prefix, extra_alarms=extra_alarms)

    # --- helpers ---------------------------------------------------------------------------

    def _fresh(self, samples: Mapping[str, Sample], name: str | None, now: float
               ) -> float | None:
        """``name``'s value while fresh (an MQTT sensor's own limit, else a CDU point's)."""
        if name is None:
            return None
        limit = self._stale_of.get(name, self.cfg.safety.stale_after_s)
        return fresh_value(samples.get(name), now, limit)

    def readback_pct(self, samples: Mapping[str, Sample]) -> float | None:
        """The active valve's read-back: its command register, else its position feedback."""
        u = self.valves.active_unit
        for name in (u.command, u.position):
            s = samples.get(name) if name else None
            if s is not None and s.usable:
                return s.value
        return None

    def track_active_output(self, command_pct: float, written_pct: float | None = None) -> None:
        """A pair's standby: the active instance drives the valve. The supply loop continues
        from ``command_pct`` (% : the CDU's demand register, or the active's synced output;
        `SupplyLoop.track_applied`) and ``written_pct`` (% : what the CDU holds; default
        ``command_pct``) becomes what this core last wrote, for the read-back reconciliation:
        so a takeover continues the active's output and never re-asserts a value this
        instance computed (and withheld) earlier as a standby.

        Raises:
            ValueError: ``command_pct`` not a finite number.
        """
        self.loop.track_applied(command_pct)
        self._last_written = self.loop.command_pct if written_pct is None else written_pct
        self._last_written_point = self.valves.active_unit.command
        self._mismatch_since, self.readback_mismatch = None, False
        self._last_valve_cmd = self._last_written

    @property
    def shadow(self) -> bool:
        """True in shadow mode (nothing is written or sent)."""
        return self.loop.shadow

    # --- operator actions (raise CommandError for the reply) -------------------------------

    def set_feedforward(self, on: bool) -> None:
        """Feedforward on or off (PID-only), bumpless."""
        self.ff.set_enabled(on)
        self.loop.rebase()

    def start_step_test(self, now: float, step_pct: float) -> float:
        """Start the commissioning step test (loop must be in manual); returns the target.

        Raises:
            CommandError: ``not_manual``, ``step_test_refused`` (no steady baseline, running),
                ``out_of_range`` (the stepped output outside the output limits).
        """
        if self.loop.control_mode != "manual":
            raise CommandError("not_manual", "put the loop in manual (set_mode manual) first")
        u0 = self.loop.command_pct
        assert u0 is not None
        s = self.loop.settings
        if not s.output_min_pct <= u0 + step_pct <= s.output_max_pct:
            raise CommandError("out_of_range", f"valve {u0:.1f} % + {step_pct} % outside "
                               f"[{s.output_min_pct}, {s.output_max_pct}]")
        try:
            target = self.step_test.start(now, u0, step_pct)
        except ValueError as err:
            raise CommandError("step_test_refused", str(err)) from None
        self.loop.set_manual(target)
        return target

    def accept_step_test(self) -> dict[str, Any]:
        """Apply the proposed PI gains (bumpless); returns the new gains.

        Raises:
            CommandError: ``no_step_test_result``.
        """
        r = self.step_test.result
        if r is None:
            raise CommandError("no_step_test_result", "no identified step test to accept")
        new = self.loop.settings.model_copy(update={"kc_pct_per_k": round(r.kc_pct_per_k, 3),
                                                    "ti_s": round(r.ti_s, 1)})
        self.loop.reload(SupplyLoopSettings.model_validate(new.model_dump()))
        self.step_test.result = None
        self.step_test.phase = "idle"
        return {"kc_pct_per_k": new.kc_pct_per_k, "ti_s": new.ti_s}

    def cancel_step_test(self) -> None:
        """Abort a running step test (the valve goes back to where it started)."""
        back = self.step_test.cancel()
        if back is not None:
            self.loop.set_manual(back)

    def queue_writes(self, writes: list[tuple[str, float]]) -> None:
        """Writes an operator command produced; they go out with the next tick's."""
        self._queued += writes

    def reset_learned(self) -> None:
        """Forget what was learned of the plant (valve strokes, the feedforward map, accepted
        commissioning gains, liquid fraction, exchanger): the cold-start values (the map and
        gains bumplessly)."""
        self.valves.reset_learned()
        self.ff.reset_map()
        self.commissioning.reset(self)
        self.capacity.forget_learned()

    def reset_leak(self, now: float, *, reopen: bool) -> None:
        """Operator: clear the latched leak response (and reopen the isolation valves).

        Raises:
            ValueError: a leak sensor still reads wet.
        """
        self.queue_writes(self.safety.reset_leak(self._samples, now, reopen=reopen))
        for key in ("power_down_trays", "power_down_rack"):
            self.requests.drop(key)

    def on_racky_reply(self, reply: RackyReply, now: float) -> None:
        """A reply from racky (matched to its request)."""
        self.requests.on_reply(reply, now)

    def _racky_power_low(self, now: float) -> bool:
        st = self.requests.last_state
        t = self.requests.last_state_t
        return bool(st.get("power_confirmed_low")) and t is not None and now - t <= 10.0

    # --- the tick --------------------------------------------------------------------------

    def step(self, now_mono: float, samples: Mapping[str, Sample],
             extra_conditions: Mapping[str, bool] | None = None) -> CoreOutput:
        """One control tick at monotonic time ``now_mono`` [s].

        Args:
            samples: the latest sample of each point and sensor, by name (missing = never
                read).
            extra_conditions: conditions of the ``extra_alarms`` (alarm id -> bool).

        Raises:
            ValueError: ``now_mono`` not finite or going backwards (a caller bug).
        """
        now = now_mono
        pts = self.points
        cfg = self.cfg
        self._samples = samples
        trans: list[str] = []
        events: list[dict[str, Any]] = []
        # 1. supply sensors
        flow_s = samples.get(pts.flow or "")
        vr = self.voter.vote(now, samples, samples.get(pts.return_temp or ""),
                             samples.get(pts.heat_removed or ""), flow_s)
        self._vote = vr
        if vr.transitions:
            trans += vr.transitions
        pv = vr.pv
        pv_c = pv.value if pv is not None and pv.usable else None
        if pv_c is not None:
            assert pv is not None
            self._last_good_pv_mono = pv.t_mono
        flow = None if pts.flow is None else fresh_value(
            flow_s, now, self._stale_of.get(pts.flow, cfg.safety.stale_after_s))  # _fresh
        # 2. pumps
        isolated = self._safety.isolated if self._safety is not None else False
        ps = self.pumps.step(now, samples, isolated=isolated)
        self._pump = ps
        if ps.transitions:
            trans += ps.transitions
        # 3. safety
        sp_eff = self.loop.effective_setpoint_c
        # Safety runs every SLOW_TICKS ticks (0.5 s): its inputs are 1 Hz MQTT leak messages
        # and second-scale delays; a pump failure (0.1 s) is the pump manager's.
        self._n_tick += 1
        slow = self._n_tick % SLOW_TICKS == 1 or SLOW_TICKS == 1
        if slow or self._safety is None or ps.trip is not None:
            ss = self.safety.step(now, samples, pv_c=pv_c, setpoint_c=sp_eff, flow_lpm=flow,
                                  pump_handoff=self.pumps.in_handoff,
                                  racky_power_low=self._racky_power_low(now))
            self._safety = ss
            trans += ss.transitions
            events += ss.events
        else:
            quiet = self._quiet
            if quiet is None or quiet[0] is not self._safety:  # once per slow tick
                quiet = self._quiet = (self._safety, self._safety_quiet(self._safety))
            ss = quiet[1]
        # 4. supply loop (feedforward and the dew-point floor once per loop period)
        period = self.loop.settings.period_s
        if self._t_ff is None or now - self._t_ff >= period - 0.05:
            self._t_ff = now
            self._ff_pct = self.ff.update(now, self.ff.rack_input(samples, cfg.safety.rack_power),
                                          samples.get(pts.heat_removed or ""),
                                          self.capacity.liquid.value)
            self._selector(now, samples)
        loop = self.loop
        if ss.isolated != loop.held:
            loop.set_hold(ss.isolated, "isolated")
        ls = loop.step(now, pv, self.readback_pct(samples), self._ff_pct)
        if ls.transitions:
            trans += ls.transitions
        if ls.pid_updated or (ls.mode in ("manual", "failsafe") and ls.write):
            self.step_test.record(now, ls.pv_c)
        if self._t_ff == now:  # the FF's valve map learns from steady states (auto only)
            self.ff.observe(now, ls.command_pct, ls.deviation_c, ls.mode == "auto" and not (
                loop.held or ss.valve_override_pct is not None or self.step_test.running))
        if self.step_test.running and self._t_ff == now:
            back = self.step_test.update(now)
            if back is not None:
                self.loop.set_manual(back)
                trans.append(f"step_test:{self.step_test.phase}")
        if self._t_ff == now:
            self.commissioning.update(self, now, samples, ls.pv_c, ls.setpoint_c)
        writes: list[tuple[str, float]] = self._queued
        self._queued = []
        valve_point = self.valves.active_unit.command
        override = ss.valve_override_pct
        if override is not None:
            # An interlock wins over every mode (DESIGN §1): the loop tracks it (no windup)
            # and resumes bumplessly from it when it is released.
            if self.loop.command_pct != override:
                self.loop.track_applied(override)
            if not self._override_active or self._last_written != override:
                writes.append((valve_point, override))
                self._last_written, self._last_written_point = override, valve_point
            else:
                again = self._reconcile(now, samples.get(valve_point))
                if again is not None:
                    writes.append((valve_point, again))
            if not self._override_active:
                trans.append("valve:interlock_override")
            self._override_active = True
        else:
            if self._override_active:
                trans.append("valve:interlock_released")
            self._override_active = False
            if ls.write and ls.command_pct is not None:
                writes.append((valve_point, ls.command_pct))
                self._last_written, self._last_written_point = ls.command_pct, valve_point
            elif self._last_written_point == valve_point:
                again = self._reconcile(now, samples.get(valve_point))
                if again is not None:
                    writes.append((valve_point, again))
        if writes and writes[-1][0] == valve_point:
            v = writes[-1][1]
            self.valves.note_written(self.valves.active, v)
            if self._last_valve_cmd is None or abs(v - self._last_valve_cmd) > 0.1:
                self._moved = True
            self._last_valve_cmd = v
        if self._t_ff == now:
            self._hunting()
        # 5. valves
        if self.commissioning.running:
            self.commissioning.track(self, now, samples)
        vs = self.valves.step(now, samples, self.loop.command_pct)
        if vs.transitions:
            trans += vs.transitions
        if vs.writes:
            writes += vs.writes
            self._last_written_point = self.valves.active_unit.command
            self._last_written = self.loop.command_pct
            events.append({"kind": "valve_failover", "t_mono": now,
                           "active": self.valves.active_unit.name, "failed": vs.failed_now})
        writes += ps.writes + ss.writes
        if ps.trip is not None:
            events.append({"kind": "pump_trip", "t_mono": now, "pump": ps.trip[0],
                           "reason": ps.trip[1]})
        self.valve_constraint = self._valve_constraint(ls)
        # 6. capacity (every poll's CDU readings, averaged) and 7. requests
        self.capacity.observe(*(self._fresh(samples, p, now) for p in (
            pts.facility_supply_temp, pts.flow, pts.heat_removed, pts.return_temp)))
        if self._t_cap is None or now - self._t_cap >= 1.0 - 0.05:
            self._t_cap = now
            self._capacity(now, samples, pv_c, sp_eff, ss)
        self._wants(now, ss)
        requests = self.requests.step(now)
        # heartbeat
        if (
            pts.heartbeat
            and (
                self._last_heartbeat_mono is None
                or now - self._last_heartbeat_mono >= self.control.heartbeat_interval_s - 1e-9
            )
        ):
            self._heartbeat = (self._heartbeat + 1) % HEARTBEAT_MODULUS
            self._last_heartbeat_mono = now
            writes.append((pts.heartbeat, float(self._heartbeat)))
        if ls.mode == "shadow":
            # Shadow writes nothing, the heartbeat included (the CDU stays in its own local
            # control while a commissioning engineer watches what valvey would do), and sends
            # no request to racky.
            self._would = writes
            self._would_requests = [{"verb": r.verb, "args": dict(r.args)} for r in requests]
            writes, requests = [], []
        # alarms
        conditions, values = self._conditions(now, samples, ls, vr, ps, vs.conditions, ss)
        if extra_conditions:
            conditions.update(extra_conditions)  # a fresh dict of this tick
        alarm_events = self.alarms.update(now, conditions, values)
        out = _new_core_output(writes, ls, alarm_events, requests, events, tuple(trans), ps,
                               self.pumps.setpoint, self._cap, self._dew_point, self._ff_pct,
                               self.valve_constraint, self.valves.active,
                               self.safety.leak.isolation, self.reasserts)
        self.last = out
        return out

    @staticmethod
    def _safety_quiet(last: SafetyStep) -> SafetyStep:
        """The last safety decision without its one-off parts (writes, events, requests are
        re-derived on the next slow tick; the override and conditions stand)."""
        return SafetyStep([], last.valve_override_pct, last.wants, [], last.conditions, (),
                          last.over_temperature, last.low_flow, last.isolated)

    def _selector(self, now: float, samples: Mapping[str, Sample]) -> None:
        sel = self.cfg.selector
        if not sel.dew_point_floor:
            self.loop.set_floor(None)
            return
        # valid: fresh and plausible (valvey.core.inputs); else the safe side, never no floor
        t = self._fresh(samples, sel.room_temp, now)
        rh = self._fresh(samples, sel.room_rh, now)
        self._room_stale = t is None or rh is None
        if t is not None:
            self._room_temp_valid = t
        dp = floor_dew_point_c(t, rh, self._room_temp_valid, sel.fallback_dew_point_c)
        if dp is not None:
            self._dew_point = dp
        if self._dew_point is not None:
            self.loop.set_floor(self._dew_point + sel.dew_point_margin_k, "dew_point_floor")

    def _valve_constraint(self, ls: LoopStep) -> str:
        if self._override_active:
            return "interlock"
        if self.step_test.running:
            return "step_test"
        m = ls.control_mode
        if m in ("failsafe", "manual", "initialising"):
            return m
        if self.loop.held:
            return "isolated"
        return "supply_temp" if ls.constraint == "setpoint" else ls.constraint

    def _hunting(self) -> None:
        """Active share of the valve over the last hour (REFERENCE §1.5, Belimo: > 20 % =
        hunting): one entry per loop period, 1 when the command written to the valve moved
        more than 0.1 % in it."""
        moved = 1 if self._moved else 0
        self._moved = False
        if len(self._hunt) == self._hunt.maxlen:
            self._hunt_sum -= self._hunt[0]
        self._hunt.append(moved)
        self._hunt_sum += moved

    def _capacity(self, now: float, samples: Mapping[str, Sample], pv_c: float | None,
                  sp: float, ss: SafetyStep) -> None:
        pts = self.points
        active = self.valves.active_unit
        st = self.capacity.step(
            now, pv_c=pv_c, setpoint_c=sp,
            valve_demand_pct=self.loop.command_pct,
            valve_position_pct=self._fresh(samples, active.position, now),
            valve_stuck=self.valves.active_failed,
            heat_removed_kw=self._fresh(samples, pts.heat_removed, now),
            return_c=self._fresh(samples, pts.return_temp, now),
            facility_c=self._fresh(samples, pts.facility_supply_temp, now),
            flow_lpm=self._fresh(samples, pts.flow, now),
            rack_power_w=self._fresh(samples, self.cfg.safety.rack_power, now),
            no_standby=self.pumps.no_standby, low_flow=ss.low_flow,
            over_temperature=ss.over_temperature)
        self._cap = st

    def _wants(self, now: float, ss: SafetyStep) -> None:
        rq = self.requests
        for key, (verb, args) in ss.wants.items():
            rq.want(key, verb, args, now)
        cap = self._cap
        if not self.cfg.capacity.enabled or cap is None:
            return
        c = self.cfg.capacity
        if cap.cap_w is not None:
            rq.drop("release_cap")
            reason = ", ".join(cap.reasons) or "cooling recovering"
            sent = self._cap_sent
            # a new cap when it moved by > 1 kW (or 1 %): not on every estimate wobble; lower
            # ones (> 500 W) at once. Raises as near as that: a sent cap that follows every dip
            # down but comes back up only after a 3 % rise is the running minimum of the
            # estimate (S9: 1.5 % under the guard's cap, lock-step)
            if sent is None or cap.cap_w < sent - 500.0 or (
                    cap.cap_w - sent > max(1000.0, 0.01 * sent)):
                self._cap_sent = cap.cap_w
                rq.want("cap_rack", "cap_rack", {"power_w": cap.cap_w,
                                                 "reason": f"cooling limited: {reason}",
                                                 "ttl_s": c.ttl_s}, now,
                        resend_every_s=c.ttl_s / 3.0)
        elif self._cap_sent is not None:
            self._cap_sent = None
            rq.drop("cap_rack")
            rq.want("release_cap", "release_cap", {"reason": "cooling sufficient again"}, now)

    def _conditions(self, now: float, samples: Mapping[str, Sample], ls: LoopStep,
                    vr: VoterResult, ps: PumpStep, valve_cond: Mapping[str, bool],
                    ss: SafetyStep) -> tuple[dict[str, bool], dict[str, float]]:
        cond = dict(ls.conditions)
        keys = self._sensor_fault_ids
        for p, status in vr.status.items():
            cond[keys[p]] = status in _SENSOR_FAULTY
        cond["feedforward_source_lost"] = (self.ff.settings.enabled
                                           and self.ff.source != self.ff.settings.source)
        cond["dew_point_floor_active"] = ls.constraint == "dew_point_floor"
        cond["room_sensors_stale"] = self.cfg.selector.dew_point_floor and self._room_stale
        lc = self._fresh(samples, self.points.local_control, now)
        cond["cdu_local_control"] = lc is not None and lc >= 0.5
        cond.update(ps.conditions)
        cond.update(valve_cond)
        n = len(self._hunt)
        cond["valve_hunting"] = n >= 600 and self._hunt_sum / n > 0.2
        cond.update(ss.conditions)
        cond.update(self.inputs.conditions(samples))
        cap = self._cap
        cond["rack_power_capped"] = cap is not None and cap.cap_w is not None
        rq = self.requests
        unanswered = max(rq.unanswered_s("power_down_trays", now),
                         rq.unanswered_s("power_down_rack", now),
                         rq.unanswered_s("cap_rack", now))
        cond["racky_request_unanswered"] = unanswered >= self.cfg.racky.alarm_after_s
        values: dict[str, float] = {"supply_temp_deviation": ls.deviation_c or 0.0}
        if ls.pv_c is not None:
            values["supply_pv_invalid"] = ls.pv_c
        if cap is not None and cap.cap_w is not None:
            values["rack_power_capped"] = cap.cap_w
        return cond, values

    def _reconcile(self, now: float, readback: Sample | None) -> float | None:
        """The value to write again when the read-back disagrees with the last write.

        A write can be lost without an error reaching the loop (the device went away after
        accepting the TCP segment, or the CDU's local control overrode the register while our
        heartbeat was missing). The read-back is the evidence: when it differs from what we
        last wrote by more than ``readback_tolerance_pct`` for ``readback_confirm_s``, the
        same value is written again, at most once per confirm period.
        """
        c = self.control
        target = self._last_written
        if target is None or readback is None or not readback.usable or readback.value is None:
            self._mismatch_since = None
            return None
        if abs(readback.value - target) <= c.readback_tolerance_pct:
            self._mismatch_since = None
            self.readback_mismatch = False
            return None
        if self._mismatch_since is None:
            self._mismatch_since = now
            return None
        if (now - self._mismatch_since >= c.readback_confirm_s - 1e-9
                and readback.t_mono > self._mismatch_since  # a new read (not one held
                # through failed polls) confirms it
                and now - self._last_reassert >= c.readback_confirm_s - 1e-9):
            self._last_reassert = now
            self.reasserts += 1
            self.readback_mismatch = True
            return target
        return None

    # --- stop, reload, state ---------------------------------------------------------------

    def stop_writes(self) -> list[tuple[str, float]]:
        """Writes that put the outputs in their declared stop state (empty for ``hold``)."""
        out: list[tuple[str, float]] = []
        pct = self.loop.stop_command_pct()
        if pct is not None:
            out.append((self.valves.active_unit.command, pct))
        sp = None if self.shadow else self.pumps.stop_command_pct()
        if sp is not None:
            out.append((self.cfg.pumps.speed_command, sp))
        return out

    def actuators(self) -> list[dict[str, Any]]:
        """Every actuator with its declared fail-safe output, the periods after which bad
        inputs move it there, and its stop action (DESIGN §1 "Outputs are owned")."""
        ls, pl = self.loop.settings, self.cfg.pump_loop
        out = [
            {"actuator": "facility valve (active)", "point": self.valves.active_unit.command,
             "failsafe": ls.failsafe_output_pct, "after_periods": ls.failsafe_after_periods,
             "period_s": ls.period_s, "stop_action": ls.stop_action,
             "inputs": "voted supply temperature"},
            {"actuator": "pump speed", "point": self.cfg.pumps.speed_command,
             "failsafe": pl.failsafe_speed_pct, "after_periods": pl.failsafe_after_periods,
             "period_s": pl.period_s, "stop_action": pl.stop_action,
             "inputs": f"{pl.mode} measurement"},
            {"actuator": "duty pump select", "point": self.cfg.pumps.duty_select,
             "failsafe": "hold", "after_periods": None, "period_s": 0.1, "stop_action": "hold",
             "inputs": "pump status (a stale status never triggers a changeover)"},
            {"actuator": "rack isolation valves", "point": self.cfg.safety.isolation_command,
             "failsafe": "hold (open)", "after_periods": None, "period_s": 0.1,
             "stop_action": "hold",
             "inputs": "leak sensors (a stale or faulted sensor never isolates)"},
        ]
        if len(self.valves.units) > 1:
            out.insert(1, {"actuator": "facility valve (spare)",
                           "point": self.valves.units[1].command,
                           "failsafe": "closed unless active", "after_periods": None,
                           "period_s": ls.period_s, "stop_action": "hold",
                           "inputs": "valve plausibility"})
        return out

    def reload(self, loop: SupplyLoopSettings) -> None:
        """Apply new loop settings without bumping the output (accepted commissioning
        gains stay unless the file's gains changed)."""
        self.loop.reload(loop)
        self.commissioning.on_reload(self)

    def interlocks(self) -> dict[str, str]:
        """The outputs an active safety interlock holds now -> its alarm id, for
        `rackplane.commands.LeaseGate.tick` (interlocks override every lease: no command moves
        these outputs meanwhile, DESIGN §1). The isolation valves are never listed:
        ``reset_leak`` is how an operator releases them (refused while still wet)."""
        out: dict[str, str] = {}
        ss = self._safety
        if ss is not None and ss.isolated:
            out["facility_valve"] = "rack_isolated"
        if self._override_active:
            out["facility_valve"] = "supply_temp_high_interlock"
        return out

    def state(self) -> dict[str, Any]:
        """The loop's state as a JSON-ready dict (retained MQTT ``state/supply_loop``)."""
        out = self.last
        if out is None:
            return {"mode": "starting"}
        ls = out.loop
        pid = ls.pid

        def r(v: float | None, nd: int = 4) -> float | None:
            return None if v is None else round(v, nd) + 0.0  # + 0.0: no "-0.0"

        age = None if self._last_good_pv_mono is None else ls.t_mono - self._last_good_pv_mono
        vr = self._vote
        return {
            "mode": ls.mode,
            "control_mode": ls.control_mode,
            "setpoint_c": ls.setpoint_target_c,
            "effective_setpoint_c": r(ls.setpoint_c, 3),
            "constraint": self.valve_constraint,
            "supply_temp_c": r(ls.pv_c, 3),
            # the exchanger as measured (valve open), rack W per K of approach: racky's derate
            "capacity_w_per_k": None if self._cap is None or self._cap.open_w_per_k is None
            else round(self._cap.open_w_per_k, -1) + 0.0,
            "capacity_w_per_k_source": self.capacity.k_open_source,
            "pv_status": ls.pv_status,
            "pv_age_s": r(age, 2),  # since the last usable reading
            "valve_command_pct": r(ls.command_pct, 2),
            "valve_active": self.valves.active_unit.name,
            "p_term_pct": r(pid.p) if pid else None,
            "i_term_pct": r(pid.i) if pid else None,
            "d_term_pct": r(pid.d) if pid else None,
            "ff_term_pct": r(pid.ff) if pid else None,
            "feedforward": {"enabled": self.ff.settings.enabled, "source": self.ff.source,
                            "missing_racks": list(self.ff.missing_racks),
                            "power_kw": r(self.ff.power_kw, 2),
                            "filtered_kw": r(self.ff.filtered_kw, 2),
                            "ff_pct": r(self._ff_pct, 2),
                            "map_learned": self.ff.map_learned,
                            "adaptations": self.ff.adaptations,
                            "valve_map": [[x, r(y, 2)] for x, y in self.ff.valve_map]},
            "dew_point_c": r(self._dew_point, 2),
            "supply_sensors": {} if vr is None else dict(vr.status),
            "supply_estimate_c": None if vr is None else r(vr.estimate_c, 3),
            "bad_periods": ls.bad_periods,
            "readback_mismatch": self.readback_mismatch,
            "output_reasserts": self.reasserts,
            "step_test": self.step_test.state(),
            "commissioning": self.commissioning.state(),
            "alarms": self.alarms.active_ids(),
        }

    def states(self, now: float, samples: Mapping[str, Sample]) -> dict[str, dict[str, Any]]:
        """Every retained state thing: ``supply_loop``, ``pumps``, ``valves``, ``safety``."""
        cap = self._cap
        safety = {
            **self.safety.state(),
            "cap_w": None if cap is None else cap.cap_w,
            "cap_reasons": [] if cap is None else list(cap.reasons),
            "capacity_estimate_w": None if cap is None or cap.capacity_w is None
            else round(cap.capacity_w, -2),
            "liquid_fraction": round(self.capacity.liquid.value, 4),
            "liquid_fraction_learned": self.capacity.liquid.source != "configured",
            "liquid_fraction_source": self.capacity.liquid.source,
            "requests": self.requests.state(),
            "actuators": self.actuators(),
        }
        if self.shadow:
            safety["shadow_would_write"] = [list(w) for w in self._would]
            safety["shadow_would_request"] = self._would_requests
        return {
            "supply_loop": self.state(),
            "pumps": self.pumps.state(now, samples),
            "valves": self.valves.state(now, samples),
            "safety": safety,
        }
