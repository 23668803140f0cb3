"""racky's side of rlc's budget leases (issue 16 item 2; pure: every time is an argument).

`BudgetFollower` holds the newest lease racky has read for its rack and answers:

- `budget_w`: the budget in force: the lease's value while it is in force
  (`rackplane.core.budget_leases.budget_lease_valid`: racky's wall clock before its expiry and
  less than its life run on racky's monotonic clock since it was read), else the safe floor.
  A lease is applied as soon as it is read (`offer`): a decrease at once; an increase exists
  only once read, so it is never applied before;
- `observe`: the acknowledgement: once the most the trays may draw as their agents report their
  **enforced** caps (``drawable_w``, W) is within the lease in force (+ ``tolerance_w``), that
  lease's (epoch, seq) is acknowledged (never an older one after a newer);
- `report`: the `RackReport` racky writes to its rack key.

**AC and DC.** A lease bounds what the rack draws from its feed: the shelves' AC **input**
(the breaker sees it). racky's cap loop works on the shelves' DC output. `InputRatio` learns
input / output from the shelves' own registers (plausible between 1.0 and 1.25, i.e. PSU
efficiency 80-100 %; the largest of the last ``window_s``, as efficiency falls at light load;
the configured ``fallback`` while none is measured), and `FleetSide` converts: the DC budget
racky's core gets is the lease's value / ratio; the read-back and the demand it reports are
DC × ratio.

Leases are taken in (epoch, seq) order only: an older or equal key read late (a lagging
replica, a push delivered after a read) is ignored, and a lease for another rack is refused.
Times: ``now_wall_s`` racky's wall clock (Unix s), ``now_mono_s`` its monotonic clock (s).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from rackplane.core.budget_leases import (
    AlarmSummary,
    BudgetLease,
    PairTag,
    RackReport,
    budget_lease_valid,
)

__all__ = ["COOLING_REPORT_STEP_W", "POWER_REPORT_STEP_W", "SAFE_REPORT_STEP_W",
           "BudgetFollower", "FleetSide", "InputRatio"]

POWER_REPORT_STEP_W = 100.0
"""``power_w`` is reported rounded to this step, W (telemetry; fewer report writes)."""

COOLING_REPORT_STEP_W = 500.0
"""``cooling_w`` is reported rounded down to this step, W (the safe side: a capacity is never
overstated by the rounding; the facility water's noise moves it every tick, and a changed
report is written at once)."""

SAFE_REPORT_STEP_W = 100.0
"""``agents_safe_w`` is reported rounded up to this step, W (the safe side; the learned
non-tray power and input ratio move a little every tick, and a changed report is written at
once)."""


@dataclass
class BudgetFollower:
    """One rack's lease as racky follows it (module docstring). ``floor_w`` W,
    ``clock_margin_s`` s, ``tolerance_w`` W."""

    rack: str
    floor_w: float
    clock_margin_s: float
    tolerance_w: float = 0.0
    lease: BudgetLease | None = None
    received_mono_s: float = 0.0
    acked: tuple[int, int] | None = None
    drawable_w: float | None = None
    demand_w: float | None = None
    refused: int = 0
    agents_safe_w: float | None = None
    """Σ of the safe caps the agents state, AC W (`RackReport.agents_safe_w`; set by
    `FleetSide.observe`)."""
    cooling_w: float | None = None
    """The rack's cooling capacity now, AC W (`RackReport.cooling_w`; set by
    `FleetSide.observe`; None: not known)."""
    power_w: float | None = None
    """The shelves' AC input now, W (`RackReport.power_w`; set by `FleetSide.observe`)."""
    enforced_w: float | None = None
    """racky's own limit in force (AC W: its DC limit × the input ratio; an operator's budget,
    the derate, the cooling), None when unknown: the report's ``budget_w`` is never above it."""
    lifecycle: str | None = None
    """The rack's lifecycle state (`RackReport.lifecycle`; set by `racky.fleet.FleetLink`)."""
    alarms: AlarmSummary | None = None
    """The rack's alarms (`RackReport.alarms`; set by `racky.fleet.FleetLink`)."""
    pair: PairTag | None = None
    """The active instance of a racky pair and its epoch (`RackReport.pair`; None: a single
    instance; set by racky's tick)."""

    def offer(self, lease: BudgetLease, now_mono_s: float) -> bool:
        """A lease read from the store: taken when for this rack and newer than the one held
        (True), else ignored (False; another rack's is counted in ``refused``)."""
        if lease.rack != self.rack:
            self.refused += 1
            return False
        if self.lease is not None and lease.key <= self.lease.key:
            return False
        self.lease = lease
        self.received_mono_s = now_mono_s
        return True

    def valid(self, now_wall_s: float, now_mono_s: float) -> bool:
        """Whether a lease is in force now."""
        return self.lease is not None and budget_lease_valid(
            self.lease, now_wall_s, self.received_mono_s, now_mono_s, self.clock_margin_s)

    def budget_w(self, now_wall_s: float, now_mono_s: float) -> float:
        """The fleet budget in force, W: the lease's value, or the floor without a valid one."""
        if self.lease is not None and self.valid(now_wall_s, now_mono_s):
            return self.lease.value_w
        return self.floor_w

    def observe(self, drawable_w: float | None, demand_w: float | None, now_wall_s: float,
                now_mono_s: float) -> bool:
        """The tick's read-back (``drawable_w``: None when not every tray reported) and the
        rack's demand (W). Returns True when a newer lease was acknowledged."""
        self.drawable_w = drawable_w
        self.demand_w = demand_w
        lease = self.lease
        if (lease is None or drawable_w is None or not self.valid(now_wall_s, now_mono_s)
                or drawable_w > lease.value_w + self.tolerance_w):
            return False
        if self.acked is not None and lease.key <= self.acked:
            return False
        self.acked = lease.key
        return True

    def awaiting_ack(self, now_wall_s: float, now_mono_s: float) -> bool:
        """Whether the lease in force is not acknowledged yet."""
        lease = self.lease
        return (lease is not None and self.valid(now_wall_s, now_mono_s)
                and (self.acked is None or lease.key > self.acked))

    def report(self, now_wall_s: float, now_mono_s: float) -> RackReport:
        """The rack key's record now."""
        budget = self.budget_w(now_wall_s, now_mono_s)
        if self.enforced_w is not None and math.isfinite(self.enforced_w):
            budget = min(budget, self.enforced_w)  # a lower limit of racky's own is in force
        return RackReport(rack=self.rack, demand_w=self.demand_w,
                          budget_w=budget, floor_w=self.floor_w,
                          drawable_w=self.drawable_w, acked=self.acked,
                          lease_valid=self.valid(now_wall_s, now_mono_s), at_s=now_wall_s,
                          agents_safe_w=self.agents_safe_w, cooling_w=self.cooling_w,
                          power_w=self.power_w, lifecycle=self.lifecycle, alarms=self.alarms,
                          pair=self.pair)


@dataclass
class InputRatio:
    """The shelves' AC input / DC output, learned (module docstring). ``fallback`` (≥ 1) while
    none is measured; samples with an output below ``min_output_w`` W are not used."""

    fallback: float
    window_s: float = 60.0
    lo: float = 1.0
    hi: float = 1.25
    min_output_w: float = 1000.0
    samples: deque[tuple[float, float]] = field(default_factory=deque)
    implausible: int = 0

    def update(self, input_w: float | None, output_w: float | None, now_mono_s: float) -> None:
        """One reading of the shelves (W, None: not reported)."""
        if input_w is None or output_w is None or output_w < self.min_output_w:
            return
        r = input_w / output_w
        if not self.lo <= r <= self.hi:
            self.implausible += 1
            return
        self.samples.append((now_mono_s, r))

    def value(self, now_mono_s: float) -> float:
        """The ratio to use now: the largest of the window, else ``fallback``."""
        while self.samples and now_mono_s - self.samples[0][0] > self.window_s:
            self.samples.popleft()
        return max((r for _, r in self.samples), default=self.fallback)


@dataclass
class FleetSide:
    """racky's whole fleet side (pure): the lease follower and the AC/DC conversion."""

    follower: BudgetFollower
    ratio: InputRatio

    def dc_budget_w(self, now_wall_s: float, now_mono_s: float) -> float:
        """The budget for racky's core (DC output, W): the lease (or floor) / the ratio."""
        return self.follower.budget_w(now_wall_s, now_mono_s) / self.ratio.value(now_mono_s)

    def observe(self, drawable_dc_w: float | None, demand_dc_w: float | None,
                input_w: float | None, output_w: float | None, now_wall_s: float,
                now_mono_s: float, agents_safe_dc_w: float | None = None,
                cooling_dc_w: float | None = None, limit_dc_w: float | None = None) -> bool:
        """A step's figures in DC (`racky.fleet.rack_figures`; ``agents_safe_dc_w``: Σ of the
        agents' stated safe caps, `racky.fleet.agents_safe_figures`; ``cooling_dc_w``: the
        rack power its cooling carries, `racky.core.controller.CoreOutput.cooling_capacity_w`)
        and the shelves' input and output (W); True when a newer lease was acknowledged.
        The cooling capacity goes to the report × the input ratio (the lease bounds the feed:
        a DC budget of capacity / ratio is what racky's core gets for a lease of it), rounded
        down to `COOLING_REPORT_STEP_W`; one not finite or < 0 is reported as unknown.
        ``limit_dc_w``: racky's limit in force (DC W, `LimitState.limit_w`), × the ratio the
        report's enforced budget never exceeds (None: unknown)."""
        self.ratio.update(input_w, output_w, now_mono_s)
        r = self.ratio.value(now_mono_s)
        self.follower.power_w = None if input_w is None or not math.isfinite(input_w) else \
            round(input_w / POWER_REPORT_STEP_W) * POWER_REPORT_STEP_W
        self.follower.agents_safe_w = None if agents_safe_dc_w is None else \
            math.ceil(agents_safe_dc_w * r / SAFE_REPORT_STEP_W) * SAFE_REPORT_STEP_W
        self.follower.enforced_w = None if limit_dc_w is None or not math.isfinite(
            limit_dc_w) else limit_dc_w * r
        self.follower.cooling_w = None if cooling_dc_w is None or not (
            math.isfinite(cooling_dc_w) and cooling_dc_w >= 0) else \
            math.floor(cooling_dc_w * r / COOLING_REPORT_STEP_W) * COOLING_REPORT_STEP_W
        return self.follower.observe(None if drawable_dc_w is None else drawable_dc_w * r,
                                     None if demand_dc_w is None else demand_dc_w * r,
                                     now_wall_s, now_mono_s)
