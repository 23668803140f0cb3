"""Honest scoring (issue 21 item 4): what the plant did at every plant step, and the physical
reference a cap is measured against.

* `PlantSteps` records the plant's truth at every step (0.1 s), not from the 1 s trace: the
  supply error against valvey's setpoint, the flow, the hottest GPU, and the valves'
  *actual* movement: whether an actuator ran in the step (its motor position changed; the
  backlash dead zone and stiction are the plant's) and the plugs' travel. Valve activity is
  read from there (running-time fraction, strokes per hour = Σ|Δposition| / 100 % per hour),
  never from the commands written (fewer, larger writes would look better).
* `cap_reference_w` is the rack power that holds the supply at setpoint + 1 K for the true
  facility-water temperature, the true exchanger (the plant's own parameters: UA, fouling,
  starvation), the valves that can still move and the true pump speed. It is computed by the
  harness from the plant, never given to the controller.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field

from sims.cdu import CduPlant

__all__ = ["PlantSteps", "WindowActivity", "cap_reference_w"]


@dataclass(frozen=True)
class WindowActivity:
    """Valve activity at the plant over a window: ``running_pct`` share of plant steps in
    which an actuator moved, ``strokes_per_h`` plug travel / 100 % per hour, ``hours``."""

    running_pct: float
    strokes_per_h: float
    hours: float


@dataclass
class PlantSteps:
    """One entry per plant step (after the step): plant time (s), true supply − setpoint (K),
    true flow (L/min), hottest GPU Tj (°C), whether an actuator ran (0/1) and the plugs'
    travel in the step (%, both valves)."""

    t_s: array = field(default_factory=lambda: array("d"))
    error_k: array = field(default_factory=lambda: array("d"))
    flow_lpm: array = field(default_factory=lambda: array("d"))
    hottest_gpu_tj_c: array = field(default_factory=lambda: array("d"))
    valve_running: array = field(default_factory=lambda: array("b"))
    valve_travel_pct: array = field(default_factory=lambda: array("d"))
    _last: tuple[float, float, float, float] | None = None

    def record(self, plant: CduPlant, setpoint_c: float) -> None:
        """Append the plant's state after a step (`CduPlant.probe`)."""
        sup, flow, act_a, act_b, x_a, x_b = plant.probe()
        self.t_s.append(plant.time_s)
        self.error_k.append(sup - setpoint_c)
        self.flow_lpm.append(flow)
        self.hottest_gpu_tj_c.append(max(max(r.gpu_tj_c) for r in plant.racks))
        last = self._last
        if last is None:
            self.valve_running.append(0)
            self.valve_travel_pct.append(0.0)
        else:
            self.valve_running.append(1 if (act_a != last[0] or act_b != last[1]) else 0)
            self.valve_travel_pct.append(abs(x_a - last[2]) + abs(x_b - last[3]))
        self._last = (act_a, act_b, x_a, x_b)

    def window(self, t0: float = 0.0, t1: float | None = None) -> range:
        """Indices of the steps with ``t0 <= t <= t1`` (t1 None: to the end)."""
        t = self.t_s
        lo = next((i for i, x in enumerate(t) if x >= t0 - 1e-9), len(t))
        hi = len(t) if t1 is None else next((i for i in range(lo, len(t))
                                             if t[i] > t1 + 1e-9), len(t))
        return range(lo, hi)

    def max_abs_error_k(self, t0: float = 0.0, t1: float | None = None) -> float:
        """Largest |true supply − setpoint| in the window (nan when it is empty)."""
        w = self.window(t0, t1)
        e = self.error_k
        return max((abs(e[i]) for i in w), default=math.nan)

    def max_above_k(self, t0: float = 0.0, t1: float | None = None) -> float:
        """Largest true supply − setpoint in the window (nan when empty)."""
        w = self.window(t0, t1)
        return max((self.error_k[i] for i in w), default=math.nan)

    def rms_error_k(self, t0: float = 0.0, t1: float | None = None) -> float:
        """RMS of true supply − setpoint in the window (nan when empty)."""
        w = self.window(t0, t1)
        if not w:
            return math.nan
        e = self.error_k
        return math.sqrt(sum(e[i] * e[i] for i in w) / len(w))

    def longest_above_s(self, limit_k: float) -> float:
        """Longest run of consecutive steps with error > ``limit_k`` (s)."""
        best = cur = 0.0
        prev_t: float | None = None
        for t, e in zip(self.t_s, self.error_k, strict=True):
            if e > limit_k:
                cur += 0.0 if prev_t is None else t - prev_t
                best = max(best, cur)
            else:
                cur = 0.0
            prev_t = t
        return best

    def activity(self, t0: float = 0.0, t1: float | None = None) -> WindowActivity:
        """Valve activity at the plant over the window (zeros when it holds < 2 steps)."""
        w = self.window(t0, t1)
        if len(w) < 2:
            return WindowActivity(0.0, 0.0, 0.0)
        steps = range(w.start + 1, w.stop)  # a step's movement belongs to its interval
        hours = (self.t_s[w.stop - 1] - self.t_s[w.start]) / 3600.0
        run = sum(self.valve_running[i] for i in steps)
        travel = sum(self.valve_travel_pct[i] for i in steps)
        return WindowActivity(100.0 * run / len(steps), travel / 100.0 / hours, hours)


def cap_reference_w(plant: CduPlant, setpoint_c: float, second_valve_usable: bool) -> float:
    """The rack IT power (W) the plant can hold at ``setpoint_c`` + 1 K in steady state, now.

    From the plant's own parameters and true state: facility-water supply temperature, the
    exchanger (`CduPlant.capacity_w`: UA with fouling, facility-flow starvation), the pump's
    true speed, and the facility flow the valves can still give: a valve that is not stuck
    can open fully; a stuck one stays where it is; the second valve counts only when the
    plant has one and the controller is configured to use it (``second_valve_usable``). 0
    while no pump runs (a tripped one coasting down does not count) at or above its minimum
    speed.
    """
    tr = plant.truth()
    p = plant.params
    stuck_a, stuck_b = plant.valves_stuck
    if not stuck_a or (p.second_valve and second_valve_usable and not stuck_b):
        pos = 100.0
    else:
        xa = tr.valve_position_pct / 100.0
        xb = tr.valve_b_position_pct / 100.0 if p.second_valve else 0.0
        ln_r = math.log(p.valve_rangeability)
        flow = sum(math.exp((x - 1.0) * ln_r) for x in (xa, xb) if x > 0.0)
        pos = 0.0 if flow <= 0.0 else max(0.0, min(100.0, 100.0 * (1.0 + math.log(
            min(flow, 1.0)) / ln_r)))
    # a tripped pump coasting down is no flow to count on: running pumps only
    speed = max((pump.speed_pct for pump in tr.pumps if pump.running and not pump.tripped),
                default=0.0)
    if speed < p.pump_min_speed_pct:
        return 0.0
    try:
        return plant.capacity_w(setpoint_c + 1.0, tr.facility_supply_temp_c, pos, speed)
    except ZeroDivisionError:  # ε·C_min = C_s (the exchanger's limit at this flow): none
        return 0.0
