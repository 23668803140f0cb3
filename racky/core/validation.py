"""Staged validation: node, rack and multi-rack burn-in judged on racky's own measurements.

A `ValidationRun` is a plan of phases (``load``: every GPU of the tested trays at burn-in
power; ``backend``: NVLink paths disabled so the collective traffic goes over the NICs) and a
recorder of one `ValidationSample` per tick (the same figures racky computes for its alarms).
Who drives the burn-in is outside racky: in lock-step the runner applies the phases to the
simulator (``rackctl lockstep --daemon racky validate``); on a live rack a burn-in tool does
it (NCCL tests with P2P/NVLS disabled for the backend phase) while racky records and judges
(``start_validation``). The same criteria apply either way:

============ ==============================================================================
criterion    pass when
============ ==============================================================================
thermal      T.Limit margin stays >= ``min_t_limit_margin_c`` under load; no HW slowdown
             (REFERENCE §1.6, §3.4)
links        no link alarm (flapping, dropped, zero-rate errors, error rate, BER); every link
             up; pre-FEC rate <= ``max_pre_fec_per_min`` per port (IBTA 120/h, §3.2)
power        rack power <= limit × (1 + ``max_power_over_budget_pct``) and <= PSU capacity
backend      in the backend phase NIC throughput >= ``min_backend_fraction`` of line rate on
             every NIC port, NVLink <= ``max_nvlink_fraction_backend`` (paths disabled)
============ ==============================================================================

Stages: ``node`` judges the listed trays only; ``rack`` the whole rack; ``multi-rack`` is one
run per rack judged together (`combine`). `racky.report.write_report` turns results into a
Markdown report with PNG plots.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from racky.config import ValidationSettings

__all__ = ["Criterion", "ValidationResult", "ValidationRun", "ValidationSample", "combine"]

Stage = Literal["node", "rack", "multi-rack"]
Phase = Literal["load", "backend"]


@dataclass(frozen=True, slots=True)
class ValidationSample:
    """One tick of a validation (figures over the tested trays / their ports)."""

    t_s: float
    phase: str
    rack_power_w: float | None
    limit_w: float | None
    capacity_w: float | None
    hottest_tj_c: float
    min_margin_c: float
    throttled_gpus: int
    nvlink_fraction: float
    nic_fraction_mean: float
    nic_fraction_min: float
    ports_down: int
    link_alarms: int
    pre_fec_max_per_min: float


@dataclass(frozen=True, slots=True)
class Criterion:
    """One judged criterion."""

    name: str
    passed: bool
    measured: str
    limit: str


@dataclass
class ValidationResult:
    """A judged run."""

    stage: str
    rack: str
    trays: tuple[int, ...] | None
    passed: bool
    criteria: list[Criterion]
    samples: list[ValidationSample]
    started_wall_ns: int = 0
    link_alarm_ids: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """JSON-ready summary (persisted, replied)."""
        return {
            "stage": self.stage, "rack": self.rack,
            "trays": list(self.trays) if self.trays is not None else None,
            "passed": self.passed, "started_ns": self.started_wall_ns,
            "criteria": [{"name": c.name, "passed": c.passed, "measured": c.measured,
                          "limit": c.limit} for c in self.criteria],
            "link_alarms": list(self.link_alarm_ids),
        }


class ValidationRun:
    """A validation in progress (module docstring).

    Args:
        stage: node | rack | multi-rack; rack: the rack's name.
        cfg: criteria; start_mono: when it starts [monotonic s].
        phases: ``(phase, duration_s)`` in order (default ``load_s`` then ``backend_s``).
        trays: the trays under test (node stage), None: all.
    """

    def __init__(self, stage: Stage, rack: str, cfg: ValidationSettings, start_mono: float,
                 phases: list[tuple[Phase, float]] | None = None,
                 trays: tuple[int, ...] | None = None, started_wall_ns: int = 0) -> None:
        self.stage = stage
        self.rack = rack
        self.cfg = cfg
        self.start = start_mono
        self.phases = phases if phases is not None else [
            ("load", cfg.load_s), *([("backend", cfg.backend_s)] if cfg.backend_s > 0 else [])]
        self.trays = trays
        self.samples: list[ValidationSample] = []
        self.link_alarm_ids: set[str] = set()
        self.started_wall_ns = started_wall_ns

    @property
    def duration_s(self) -> float:
        """The planned burn-in length, s (the phases' sum)."""
        return sum(d for _, d in self.phases)

    def phase_at(self, now: float) -> str | None:
        """The phase at ``now`` (None once the plan is over)."""
        t = now - self.start
        for ph, d in self.phases:
            if t < d:
                return ph
            t -= d
        return None

    def add(self, s: ValidationSample, link_alarms: set[str] | None = None) -> None:
        """Record one tick's sample and the link alarms active at it (alarm ids)."""
        self.samples.append(s)
        if link_alarms:
            self.link_alarm_ids |= link_alarms

    def judge(self) -> ValidationResult:
        """Apply the criteria to what was recorded."""
        c = self.cfg
        load = [s for s in self.samples if s.phase == "load"] or self.samples
        back = [s for s in self.samples if s.phase == "backend"]
        crit: list[Criterion] = []
        mm = min((s.min_margin_c for s in load if math.isfinite(s.min_margin_c)),
                 default=math.nan)
        thr = max((s.throttled_gpus for s in self.samples), default=0)
        hot = max((s.hottest_tj_c for s in load if math.isfinite(s.hottest_tj_c)),
                  default=math.nan)
        crit.append(Criterion(
            "thermal under load",
            math.isfinite(mm) and mm >= c.min_t_limit_margin_c and (c.allow_throttle or thr == 0),
            f"min T.Limit margin {mm:.1f} K, hottest {hot:.1f} °C, throttled GPUs {thr}",
            f"margin >= {c.min_t_limit_margin_c:g} K"
            + ("" if c.allow_throttle else ", no slowdown"),
        ))
        down = max((s.ports_down for s in self.samples), default=0)
        pre = max((s.pre_fec_max_per_min for s in self.samples
                   if math.isfinite(s.pre_fec_max_per_min)), default=0.0)
        nal = len(self.link_alarm_ids)
        crit.append(Criterion(
            "link errors", nal == 0 and down == 0 and pre <= c.max_pre_fec_per_min,
            f"link alarms {nal}, links down (max) {down}, pre-FEC max {pre:.2f}/min per port",
            f"no link alarm, all links up, pre-FEC <= {c.max_pre_fec_per_min:g}/min",
        ))
        over = 0.0
        over_cap = False
        for s in self.samples:
            if s.rack_power_w is None:
                continue
            if s.limit_w:
                over = max(over, 100.0 * (s.rack_power_w / s.limit_w - 1.0))
            if s.capacity_w is not None and s.rack_power_w > s.capacity_w * 1.001:
                over_cap = True
        pw = max((s.rack_power_w or 0.0 for s in self.samples), default=0.0)
        crit.append(Criterion(
            "power within budget", over <= c.max_power_over_budget_pct and not over_cap,
            f"peak {pw / 1000:.1f} kW, {max(over, 0.0):.1f} % over the limit"
            + (", above PSU capacity" if over_cap else ""),
            f"<= limit + {c.max_power_over_budget_pct:g} %, <= capacity",
        ))
        if back:
            nic = min(s.nic_fraction_min for s in back[len(back) // 4:])
            nvl = max(s.nvlink_fraction for s in back[len(back) // 4:])
            crit.append(Criterion(
                "backend traffic (NVLink disabled)",
                nic >= c.min_backend_fraction and nvl <= c.max_nvlink_fraction_backend,
                f"NIC min {nic:.2f} of line rate, NVLink {nvl:.3f}",
                f"NIC >= {c.min_backend_fraction:g}, NVLink <= "
                f"{c.max_nvlink_fraction_backend:g}",
            ))
        return ValidationResult(self.stage, self.rack, self.trays, all(x.passed for x in crit),
                                crit, list(self.samples), self.started_wall_ns,
                                sorted(self.link_alarm_ids))


def combine(results: list[ValidationResult]) -> ValidationResult:
    """The multi-rack verdict: passed when every rack passed (criteria prefixed by rack)."""
    crit = [Criterion(f"{r.rack}: {c.name}", c.passed, c.measured, c.limit)
            for r in results for c in r.criteria]
    samples = results[0].samples if results else []
    return ValidationResult("multi-rack", ",".join(r.rack for r in results), None,
                            bool(results) and all(r.passed for r in results), crit, samples,
                            results[0].started_wall_ns if results else 0,
                            sorted({a for r in results for a in r.link_alarm_ids}))
