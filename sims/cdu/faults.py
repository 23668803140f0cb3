"""The CDU plant's fault hooks: pumps, valves, sensors, leaks, filter, controller restart."""

from __future__ import annotations

import math

from sims.cdu.control import LocalControl
from sims.sensors import SensorFault


class FaultHooks(LocalControl):
    """Fault injection and operator actions (part of `CduPlant`)."""

    __slots__ = ()

    def _pump_index(self, pump: int) -> int:
        if not (isinstance(pump, int) and 0 <= pump < self._n_pumps):
            raise ValueError(f"pump index {pump!r} outside 0..{self._n_pumps - 1}")
        return pump

    def trip_pump(self, pump: int) -> None:
        """Trip pump ``pump`` (0 = A): it coasts down with τ_coast (REFERENCE §4.2 item 2).

        Raises:
            ValueError: no such pump.
        """
        self._tripped[self._pump_index(pump)] = True

    def reset_pump(self, pump: int) -> None:
        """Clear a trip: the pump runs again (ramping) if it is the duty pump."""
        self._tripped[self._pump_index(pump)] = False

    def set_duty_pump(self, pump: int) -> None:
        """Make ``pump`` the duty pump: it ramps to the speed command; a healthy old duty pump
        keeps running until the new one is within 1 % of the command, then ramps to stop (the
        CDU's own changeover sequence [U]: a planned rotation without a flow dip); a tripped
        one keeps coasting. The register ``duty_pump_select`` does the same.

        Raises:
            ValueError: no such pump.
        """
        new = self._pump_index(pump)
        old = self._duty
        if new != old:
            self._handover_from = None if self._tripped[old] else old
        self._duty = new

    def set_leak_sensor_inputs(self, rope_leak: bool, rope_sensor_fault: bool) -> None:
        """The CDU's rope (drip-tray) leak sensor as the CDU reads it (wet, faulted): the
        leak model lives in `sims.rack.LeakSensors`; `sims.scenario.ScenarioRun` copies its
        rope sensor here every step, so the CDU's registers carry it."""
        self._rope_leak = bool(rope_leak)
        self._rope_fault = bool(rope_sensor_fault)

    def set_filter_fouling(self, factor: float) -> None:
        """Filter ΔP × ``factor`` (1 = clean). Raises ValueError for factor not >= 1 finite."""
        if not (math.isfinite(factor) and factor >= 1.0):
            raise ValueError("filter fouling factor must be finite and >= 1")
        self._filter_foul = float(factor)

    @property
    def rack_isolation_open_pct(self) -> float:
        """Rack liquid isolation valves' opening, % (100 = open)."""
        return 100.0 * self._iso

    @property
    def valves_stuck(self) -> tuple[bool, bool]:
        """Whether the first and the second valve are stuck (`set_valve_stuck`)."""
        return self._valve_stuck, self._valve_b_stuck

    def set_valve_stuck(self, stuck: bool = True, valve: int = 0) -> None:
        """Freeze a valve at its current position (REFERENCE §4.2 item 1, `stuck`): ``valve``
        0 is the first (control) valve, 1 the second.

        Raises:
            ValueError: no such valve.
        """
        if valve == 0:
            self._valve_stuck = stuck
        elif valve == 1 and self._p.second_valve:
            self._valve_b_stuck = stuck
        else:
            raise ValueError(f"no valve {valve!r} (0: first, 1: second)")

    def set_valve_feedback_offset_pct(self, offset_pct: float) -> None:
        """Feedback reads position + ``offset_pct`` (REFERENCE §4.2 item 1, `offset`)."""
        if not math.isfinite(offset_pct):
            raise ValueError("offset_pct must be finite")
        self._valve_offset = offset_pct

    def set_valve_slow_factor(self, factor: float) -> None:
        """Stroke time × ``factor`` (REFERENCE §4.2 item 1, `slow`); 1 = healthy.

        Raises:
            ValueError: factor not > 0.
        """
        if not (factor > 0.0 and math.isfinite(factor)):
            raise ValueError("valve slow factor must be > 0")
        self._valve_rate = 1.0 / (self._p.valve_stroke_time_s * factor)

    def set_sensor_fault(
        self,
        point: str,
        mode: SensorFault | str,
        *,
        magnitude: float = 0.0,
        rate_per_s: float = 0.0,
        duration_s: float | None = None,
    ) -> None:
        """Put the transmitter behind ``point`` in a fault mode (see `Sensor.set_fault`).

        Raises:
            KeyError: ``point`` has no simulated transmitter.
            ValueError: bad mode or parameters.
        """
        self._sensors[point].set_fault(
            mode, magnitude=magnitude, rate_per_s=rate_per_s, duration_s=duration_s
        )

    def clear_sensor_fault(self, point: str) -> None:
        """Heal the transmitter behind ``point``. Raises KeyError for an unknown point."""
        self._sensors[point].clear_fault()

    def set_leak_lpm(self, leak_lpm: float) -> None:
        """Lose coolant at ``leak_lpm`` L/min (inventory and static pressure fall).

        Raises:
            ValueError: negative or non-finite rate.
        """
        if not (leak_lpm >= 0.0 and math.isfinite(leak_lpm)):
            raise ValueError("leak_lpm must be finite and >= 0")
        self._leak_lps = leak_lpm / 60.0

    def restart_controller(self) -> None:
        """The CDU controller reboots: uptime restarts at 0 and it runs local control until
        the heartbeat changes again."""
        self._boot_t = self._t
        if not self._local:
            self._enter_local()

    def reset_gpus(self) -> None:
        """Power shut-down GPUs back on and clear throttling (operator action), every rack."""
        for r in self._racks:
            r.reset_gpus()
