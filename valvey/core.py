"""valvey's pure core: one call per 10 Hz control tick, no I/O (DESIGN §1 "Cores are pure").

`ValveyCore.step(now_mono, samples)` takes the latest sample of every CDU point and returns
what to write to the CDU, the loop's decision (for state and telemetry) and the alarm events.
The daemon (valvey/app.py) and the lock-step runner (rackctl/lockstep.py) drive the same core,
so every control figure measured in lock-step is the daemon's behaviour.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rackplane.alarms import AlarmEngine, AlarmEvent
from rackplane.samples import Sample
from valvey.config import CduPoints, ControlSettings
from valvey.supply_loop import LoopStep, SupplyLoop, SupplyLoopSettings, default_alarm_defs

HEARTBEAT_MODULUS = 65536  # a uint16 register


@dataclass(frozen=True)
class CoreOutput:
    """Result of one tick.

    Attributes:
        writes: ``(point, value)`` pairs to write to the CDU now, in order.
        loop: the supply loop's decision.
        alarm_events: alarm changes in this tick (log, publish, write each once).
    """

    writes: list[tuple[str, float]]
    loop: LoopStep
    alarm_events: list[AlarmEvent] = field(default_factory=list)


class ValveyCore:
    """Supply-temperature loop, alarms and the CDU heartbeat.

    Args:
        loop: supply loop settings.
        points: which register-map points mean what.
        control: tick timing (heartbeat interval).
        start_mono: monotonic time the daemon started (alarm start-up inhibit counts from it).
    """

    def __init__(
        self,
        loop: SupplyLoopSettings,
        points: CduPoints,
        control: ControlSettings,
        start_mono: float,
    ):
        self.points = points
        self.control = control
        self.loop = SupplyLoop(loop)
        self.alarms = AlarmEngine(default_alarm_defs(), start_mono)
        self._heartbeat = 0
        self._last_heartbeat_mono: float | None = None
        self.last: CoreOutput | None = None
        # Output reconciliation: what we last wrote vs what the device reads back.
        self._last_written: float | None = None
        self._mismatch_since: float | None = None
        self._last_reassert: float = float("-inf")
        self.reasserts = 0
        self.readback_mismatch = False
        self._last_good_pv_mono: float | None = None

    def readback_pct(self, samples: Mapping[str, Sample]) -> float | None:
        """The valve's read-back: the command register, else the position feedback."""
        for name in (self.points.valve_command, self.points.valve_position):
            s = samples.get(name) if name else None
            if s is not None and s.usable:
                return s.value
        return None

    def step(self, now_mono: float, samples: Mapping[str, Sample]) -> CoreOutput:
        """One control tick at monotonic time ``now_mono`` [s].

        Args:
            samples: the latest sample of each point, by point name (missing = never read).

        Raises:
            ValueError: ``now_mono`` not finite or going backwards (a caller bug).
        """
        pv = samples.get(self.points.supply_temp)
        if pv is not None and pv.usable:
            self._last_good_pv_mono = pv.t_mono
        ls = self.loop.step(now_mono, pv, self.readback_pct(samples))
        writes: list[tuple[str, float]] = []
        if ls.mode != "shadow":
            # Judge the previous write against the read-back before a new one replaces it;
            # a new write does not reset the judgement: only a matching read-back does.
            again = self._reconcile(now_mono, samples.get(self.points.valve_command))
            if ls.write and ls.command_pct is not None:
                writes.append((self.points.valve_command, ls.command_pct))
                self._last_written = ls.command_pct
            elif again is not None:
                writes.append((self.points.valve_command, again))
        if (
            self.points.heartbeat
            and ls.mode != "shadow"
            and (
                self._last_heartbeat_mono is None
                or now_mono - self._last_heartbeat_mono >= self.control.heartbeat_interval_s - 1e-9
            )
        ):
            # Shadow mode writes nothing, the heartbeat included: the CDU stays in its own
            # local control while a commissioning engineer watches what valvey would do.
            self._heartbeat = (self._heartbeat + 1) % HEARTBEAT_MODULUS
            self._last_heartbeat_mono = now_mono
            writes.append((self.points.heartbeat, float(self._heartbeat)))
        values = {"supply_temp_deviation": ls.deviation_c or 0.0}
        if ls.pv_c is not None:
            values["supply_pv_invalid"] = ls.pv_c
        events = self.alarms.update(now_mono, ls.conditions, values)
        out = CoreOutput(writes, ls, events)
        self.last = out
        return out

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
                and now - self._last_reassert >= c.readback_confirm_s - 1e-9):
            self._last_reassert = now
            self.reasserts += 1
            self.readback_mismatch = True
            return target
        return None

    def stop_writes(self) -> list[tuple[str, float]]:
        """Writes that put the outputs in their declared stop state (empty for ``hold``)."""
        pct = self.loop.stop_command_pct()
        return [] if pct is None else [(self.points.valve_command, pct)]

    def reload(self, loop: SupplyLoopSettings) -> None:
        """Apply new loop settings without bumping the output."""
        self.loop.reload(loop)

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
        return {
            "mode": ls.mode,
            "control_mode": ls.control_mode,
            "setpoint_c": ls.setpoint_c,
            "supply_temp_c": ls.pv_c,
            "pv_status": ls.pv_status,
            "pv_age_s": r(age, 2),  # since the last usable reading
            "valve_command_pct": r(ls.command_pct, 2),
            "p_term_pct": r(pid.p) if pid else None,
            "i_term_pct": r(pid.i) if pid else None,
            "d_term_pct": r(pid.d) if pid else None,
            "ff_term_pct": r(pid.ff) if pid else None,
            "bad_periods": ls.bad_periods,
            "readback_mismatch": self.readback_mismatch,
            "output_reasserts": self.reasserts,
            "alarms": sorted(a.id for a in self.alarms.active()),
        }
