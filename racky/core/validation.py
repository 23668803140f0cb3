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
             up; pre-FEC mean rate <= ``max_pre_fec_per_min`` per port (IBTA 120/h, §3.2)
             over the bins closed during the run, a port failing only when significantly
             above (Poisson tail < ``PRE_FEC_ALPHA`` / ports); failing ports named
power        rack power <= limit × (1 + ``max_power_over_budget_pct``), the limit being the
             highest in force over the ``power_settle_s`` before the sample (a lowered limit
             takes the caps' response time to show), and <= PSU capacity
backend      in the backend phase NIC throughput >= ``min_backend_fraction`` of line rate (the
             rack's highest NIC speed: a port trained lower counts against it) on every NIC
             port, NVLink <= ``max_nvlink_fraction_backend`` (paths disabled); the failing
             part is named from the ports' medians (`backend_parts`: a port, the rack's
             NICs as a whole, or a rail's leaf outside the rack)
============ ==============================================================================

Stages: ``node`` judges the listed trays only; ``rack`` the whole rack; ``multi-rack`` is one
run per rack judged together (`combine`). `racky.report.write_report` turns results into a
Markdown report with PNG plots.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from racky.config import ValidationSettings

__all__ = ["PRE_FEC_ALPHA", "Criterion", "ValidationResult", "ValidationRun",
           "ValidationSample", "backend_parts", "combine", "poisson_tail"]

PRE_FEC_ALPHA = 0.01
"""The chance a run whose every port sits exactly at ``max_pre_fec_per_min`` fails the
pre-FEC part of the link criterion (Bonferroni over the ports); at a healthy rate far less."""

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
    nic_ports: tuple[tuple[str, float], ...] = ()
    """Backend phase only: each NIC port's (name, throughput as a fraction of the rack's
    NIC line rate); () otherwise."""
    thermal_protected: tuple[int, ...] = ()
    """Tested trays (0-based) racky's thermal protection held at a protective cap in this
    tick (`racky.core.thermal`): a tray that keeps its margin only because racky throttles
    it cannot carry the load (a fouled cold plate, low flow) and fails "thermal under load"."""
    pre_fec_bin: tuple[int, float, tuple[tuple[str, float], ...]] | None = None
    """At the first tick after a pre-FEC bin closed: (bins closed so far, bin length in
    min, each port's (name, rate of that bin per min)); `ValidationRun.add` takes it into its
    per-port totals and keeps the sample without it."""


@dataclass(frozen=True, slots=True)
class Criterion:
    """One judged criterion; ``parts``: what failed it where known (``port:gpu07/nic1``,
    ``nics:all``: the rack's NICs as a whole, ``net:rail3``: outside the rack, the backend
    network's rail-3 leaf and its uplinks serving it)."""

    name: str
    passed: bool
    measured: str
    limit: str
    parts: tuple[str, ...] = ()


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
    run_id: str | None = None
    judge_epoch: int = 0
    measured: dict[str, float] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """JSON-ready summary (persisted, replied)."""
        return {
            "stage": self.stage, "rack": self.rack,
            "trays": list(self.trays) if self.trays is not None else None,
            "passed": self.passed, "started_ns": self.started_wall_ns,
            "criteria": [{"name": c.name, "passed": c.passed, "measured": c.measured,
                          "limit": c.limit, "parts": list(c.parts)} for c in self.criteria],
            "link_alarms": list(self.link_alarm_ids),
            "run_id": self.run_id, "judge_epoch": self.judge_epoch,
            "measured": {k: round(v, 4) for k, v in self.measured.items() if math.isfinite(v)},
        }


class ValidationRun:
    """A validation in progress (module docstring).

    Args:
        stage: node | rack | multi-rack; rack: the rack's name.
        cfg: criteria; start_mono: when it starts [monotonic s].
        phases: ``(phase, duration_s)`` in order (default ``load_s`` then ``backend_s``).
        trays: the trays under test (node stage), None: all.
        gpus_per_tray: to tell a port's rail from its name (`backend_parts`).
    """

    def __init__(self, stage: Stage, rack: str, cfg: ValidationSettings, start_mono: float,
                 phases: list[tuple[Phase, float]] | None = None,
                 trays: tuple[int, ...] | None = None, started_wall_ns: int = 0,
                 run_id: str | None = None, gpus_per_tray: int = 4) -> None:
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
        self.run_id = run_id
        self.gpus_per_tray = gpus_per_tray
        #: the link monitor's bins-closed count last seen (None: no sample yet); bins that
        #: closed before the run started are not counted
        self.pre_fec_seq: int | None = None
        #: per port: [pre-FEC count, minutes observed] over the bins closed during the run
        self.pre_fec: dict[str, list[float]] = {}

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
        if s.pre_fec_bin is not None:
            seq, bin_min, rates = s.pre_fec_bin
            if self.pre_fec_seq is not None:
                for name, r in rates:
                    if math.isfinite(r):
                        acc = self.pre_fec.setdefault(name, [0.0, 0.0])
                        acc[0] += r * bin_min
                        acc[1] += bin_min
            self.pre_fec_seq = seq
            s = replace(s, pre_fec_bin=None)
        self.samples.append(s)
        if link_alarms:
            self.link_alarm_ids |= link_alarms

    def _pre_fec(self) -> tuple[str, list[str]]:
        """The pre-FEC part of the link criterion: each port's count over the bins that closed
        during the run against ``max_pre_fec_per_min`` × its minutes. A port fails only when
        its count is significantly above that (Poisson tail below `PRE_FEC_ALPHA` / ports):
        the max over ~1,400 ports of one-minute counts at a healthy 0.5/min is 3–5, above a
        2/min limit, in most runs. Returns (the text, the failing ports, worst first)."""
        lim = self.cfg.max_pre_fec_per_min
        if not self.pre_fec:
            return "pre-FEC: no full bin in the run", []
        n = len(self.pre_fec)
        worst = max(self.pre_fec.items(), key=lambda kv: kv[1][0] / max(kv[1][1], 1e-9))
        bad = sorted(((cnt / mins, name) for name, (cnt, mins) in self.pre_fec.items()
                      if mins > 0 and poisson_tail(round(cnt), lim * mins)
                      < PRE_FEC_ALPHA / n), reverse=True)
        mins = max(m for _, m in self.pre_fec.values())
        return (f"pre-FEC highest port mean {worst[1][0] / max(worst[1][1], 1e-9):.2f}/min "
                f"over {mins:g} min, {len(bad)} ports above the limit",
                [name for _, name in bad])

    def judge(self, judge_epoch: int = 0) -> ValidationResult:
        """Apply the criteria to what was recorded; ``judge_epoch``: the judging racky's
        leadership epoch (0: a single instance). ``measured``: ``nvlink_fraction`` (the
        lowest over the load phase) and ``backend_fraction`` (the lowest NIC port's, backend
        phase after its first quarter), fractions of line rate (rlc's expected ranges)."""
        c = self.cfg
        load = [s for s in self.samples if s.phase == "load"] or self.samples
        back = [s for s in self.samples if s.phase == "backend"]
        crit: list[Criterion] = []
        mm = min((s.min_margin_c for s in load if math.isfinite(s.min_margin_c)),
                 default=math.nan)
        thr = max((s.throttled_gpus for s in self.samples), default=0)
        hot = max((s.hottest_tj_c for s in load if math.isfinite(s.hottest_tj_c)),
                  default=math.nan)
        held = sorted({k for s in load for k in s.thermal_protected})
        crit.append(Criterion(
            "thermal under load",
            math.isfinite(mm) and mm >= c.min_t_limit_margin_c and (c.allow_throttle or thr == 0)
            and not held,
            f"min T.Limit margin {mm:.1f} K, hottest {hot:.1f} °C, throttled GPUs {thr}, "
            f"trays held by thermal protection {len(held)}",
            f"margin >= {c.min_t_limit_margin_c:g} K"
            + ("" if c.allow_throttle else ", no slowdown") + ", no tray held by protection",
            tuple(f"tray:tray{k:02d}" for k in held),
        ))
        down = max((s.ports_down for s in self.samples), default=0)
        nal = len(self.link_alarm_ids)
        pre_txt, pre_bad = self._pre_fec()
        crit.append(Criterion(
            "link errors", nal == 0 and down == 0 and not pre_bad,
            f"link alarms {nal}, links down (max) {down}, {pre_txt}",
            f"no link alarm, all links up, pre-FEC mean <= {c.max_pre_fec_per_min:g}/min "
            f"per port (Poisson, {PRE_FEC_ALPHA:g} over the ports)",
            tuple(f"port:{n}" for n in pre_bad[:32]),
        ))
        over = 0.0
        over_cap = False
        # a lowered limit (a lease moved, a cap request) takes the caps' response time to
        # show in the rack's power: each sample is judged against the highest limit in force
        # over the ``power_settle_s`` before it (a monotonic deque: O(samples))
        window: deque[tuple[float, float]] = deque()  # (t_s, limit W), limits decreasing
        for s in self.samples:
            if s.limit_w:
                while window and window[-1][1] <= s.limit_w:
                    window.pop()
                window.append((s.t_s, s.limit_w))
            while window and window[0][0] < s.t_s - c.power_settle_s - 1e-9:
                window.popleft()
            if s.rack_power_w is None:
                continue
            if window:
                over = max(over, 100.0 * (s.rack_power_w / window[0][1] - 1.0))
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
            judged = back[len(back) // 4:]
            nic = min(s.nic_fraction_min for s in judged)
            nvl = max(s.nvlink_fraction for s in judged)
            per_port = _port_medians(judged)
            parts = backend_parts(per_port, c.min_backend_fraction, self.gpus_per_tray) \
                if per_port else ()
            low = sorted(per_port.items(), key=lambda kv: kv[1])[:2]
            crit.append(Criterion(
                "backend traffic (NVLink disabled)",
                nic >= c.min_backend_fraction and nvl <= c.max_nvlink_fraction_backend,
                f"NIC min {nic:.2f} of line rate, NVLink {nvl:.3f}"
                + (f"; lowest ports (median) {', '.join(f'{n} {v:.2f}' for n, v in low)}"
                   if parts else ""),
                f"NIC >= {c.min_backend_fraction:g}, NVLink <= "
                f"{c.max_nvlink_fraction_backend:g}", parts,
            ))
        measured = {"nvlink_fraction": min((s.nvlink_fraction for s in load), default=math.nan)}
        if back:
            measured["backend_fraction"] = min(s.nic_fraction_min for s in back[len(back) // 4:])
        return ValidationResult(self.stage, self.rack, self.trays, all(x.passed for x in crit),
                                crit, list(self.samples), self.started_wall_ns,
                                sorted(self.link_alarm_ids), self.run_id, judge_epoch,
                                measured)


def poisson_tail(k: int, mu: float) -> float:
    """P(X >= k) for X ~ Poisson(``mu``) (1.0 for k <= mu: only the upper tail is needed)."""
    if k <= 0 or k <= mu:
        return 1.0
    if mu <= 0.0:
        return 0.0
    log_term = -mu + k * math.log(mu) - math.lgamma(k + 1)
    total, i = 0.0, k
    while True:
        t = math.exp(log_term)
        total += t
        if t < 1e-18 * total or i > k + 10_000:
            return min(total, 1.0)
        i += 1
        log_term += math.log(mu) - math.log(i)


def _port_medians(samples: list[ValidationSample]) -> dict[str, float]:
    """Each NIC port's median throughput fraction over ``samples`` (ports seen in any)."""
    seen: dict[str, list[float]] = {}
    for s in samples:
        for name, f in s.nic_ports:
            seen.setdefault(name, []).append(f)
    return {n: statistics.median(v) for n, v in seen.items()}


def _rail(name: str) -> tuple[int, int] | None:
    """``gpuNN/nicK`` -> (GPU, NIC index), None for another name."""
    g, _, k = name.partition("/")
    if not (g.startswith("gpu") and k.startswith("nic")):
        return None
    try:
        return int(g[3:]), int(k[3:])
    except ValueError:
        return None


def backend_parts(port_fraction: dict[str, float], min_fraction: float,
                  gpus_per_tray: int = 4) -> tuple[str, ...]:
    """Name what fails the backend throughput: ``port_fraction`` maps each NIC port
    (``gpu07/nic1``) to its median fraction of line rate over the judged backend phase.

    A port is *low* below ``min_fraction``. With no low port: (). When half the ports or more
    are low: ``nics:all`` (the rack's NICs as a whole: firmware, PCIe, MTU; a rack-wide
    deficit has no single port to blame). Otherwise low ports are grouped by **rail** (the
    port's slot in its tray, ``(GPU mod gpus_per_tray) × NICs per GPU + NIC``: every tray's
    port of one rail goes to the same leaf): a rail with half its ports or more low (and at
    least 3) is ``net:rail<k>``: the deficit lies in what those ports share outside the rack,
    the rail's leaf and its spine uplinks (independent faults on a NIC of every tray of one
    rail are implausible); each other low port is ``port:<name>``. At most 32 parts."""
    low = {n for n, f in port_fraction.items() if not f >= min_fraction}
    if not low:
        return ()
    if 2 * len(low) >= len(port_fraction):
        return ("nics:all",)
    ids = {n: _rail(n) for n in port_fraction}
    npg = 1 + max((r[1] for r in ids.values() if r is not None), default=0)
    rail: dict[int, list[str]] = {}
    for n, r in ids.items():
        if r is not None:
            rail.setdefault((r[0] % gpus_per_tray) * npg + r[1], []).append(n)
    out: list[str] = []
    blamed: set[str] = set()
    for k, names in sorted(rail.items()):
        bad = [n for n in names if n in low]
        if len(bad) >= 3 and 2 * len(bad) >= len(names):
            out.append(f"net:rail{k}")
            blamed.update(bad)
    out += [f"port:{n}" for n in sorted(low - blamed)]
    return tuple(out[:32])


def combine(results: list[ValidationResult]) -> ValidationResult:
    """The multi-rack verdict: passed when every rack passed (criteria prefixed by rack)."""
    crit = [Criterion(f"{r.rack}: {c.name}", c.passed, c.measured, c.limit, c.parts)
            for r in results for c in r.criteria]
    samples = results[0].samples if results else []
    return ValidationResult("multi-rack", ",".join(r.rack for r in results), None,
                            bool(results) and all(r.passed for r in results), crit, samples,
                            results[0].started_wall_ns if results else 0,
                            sorted({a for r in results for a in r.link_alarm_ids}))
