"""A validation campaign's progress and the gate to production (issue 17 items 1-2, pure).

`Campaign` holds a plan (`rlc.core.campaign_plan`), every rack's progress and every run, and
decides; the daemon sends what it returns (racky's ``start_validation``, ``abort_validation``,
``set_lifecycle``) and feeds back what it hears. No I/O, no clock: every time is an argument,
``now_wall_s``, rlc's **wall clock** (Unix s). The campaign outlives a leader (a new one
restores it, `rlc.core.campaign_codec`), and monotonic clocks of two hosts are not comparable.
A wall-clock step forward can only make a run *lost* early (retried; never a pass, never a
quarantine); a step back only delays a deadline.

**Runs.** `step` asks the scheduler (`rlc.core.campaign_schedule`) which racks may start now
and opens a run for each: one rack, or a group of a multi-rack stage. A run has an id
(``<stage>.<seq>``, seq growing by one per run in the campaign, never reused); its start
order carries it, so a start re-issued (by a new leader, or a retry) is the same run, never
counted twice. A run is *starting* until every rack of it confirmed (`on_started`), then
*running*; it ends *done* when every rack reported a result, *lost* when its start is not
confirmed within ``start_timeout_s`` of its issue or a result is missing at its deadline
(issue + ``start_timeout_s`` + its phases + ``result_grace_s``) or as soon as racky of a rack
of it no longer records it nor its result (`on_dropped`: racky restarted or failed over), or
*aborted*. A lost or
aborted run keeps its racks' slots (blast-radius and power) until its deadline or until every
rack of it reported or confirmed the abort: the burn-in may still run.

**Results** (`StageResult`) come from the rack's judge (racky's leader), with the judge's
**fencing epoch**. rlc keeps each rack's current judge epoch (`on_judge_epoch`, and any newer
epoch a result carries). A result with an epoch below it is **stale**: ignored (counted), it
never gates. When the epoch rises, the rack's passes recorded under older epochs stop counting
(rlc cannot tell what a fenced judge sent before its fencing from what it sent after): those
stages run again. A rack already confirmed in production stays there (the gate is taken at
promotion). A result is also refused (counted ``unusable``) if an expected range of its stage
names a figure it lacks or gives as NaN, inf or outside [0, 1.5]; the run then waits for a
usable one until its deadline.

**Verdicts.** A node or rack stage that fails quarantines the rack, with the failing criterion
(its name, measured value and limit: racky's, or an expected range rlc checked) and the parts
the result names (``tray:N``, ``port:…``, ``gpu:…``, ``nics:all``; "not named" when none). A
multi-rack run passes a rack's stage only if **every** rack of the group passed. If it fails:
each rack whose result failed *and names a part* of it is quarantined (a part outside the rack,
``net:…``, does not count: the network is to blame, not the rack); every other rack of the
group is not failed: it runs the stage again, in what is left of its group or, if fewer than 2
are left, regrouped with other such racks (feasible groups only, `check_plan`'s rule; a rack
with no one to join is reported ``needs_regroup``). A failure that names no part (a cross-rack
figure) is not attributed: the group runs again; a rack with ``max_attempts`` lost or
unattributed runs of one stage is **blocked** (an operator looks), never quarantined on that
ground.

**The gate.** A rack is promoted (``set_lifecycle production``, with the passes and epochs as
evidence) only when every stage of the plan has a pass whose judge epoch is the rack's current
one; `lifecycle_orders` re-checks the gate every time it re-issues the order. Lifecycle orders
are re-issued until confirmed (`on_lifecycle`): ``validating`` at a rack's first run,
``quarantined`` with the reason, ``production``.

Counters (the run sequence, refused results, attempts) are Python integers: they do not wrap;
a campaign opens at most a few runs per rack and stage, far below 2**53 (exact in any JSON
reader).

Errors: ``KeyError`` for a rack or stage not in the plan; ``ValueError`` for a result that
does not decode (`StageResult.from_record`) and for a ``now_wall_s`` that is not finite
(`step`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from rlc.core.campaign_plan import FIGURES, CampaignPlan, StageSpec, check_plan, racky_start_args
from rlc.core.campaign_schedule import plan_starts, regroup
from rlc.core.topology import Topology

__all__ = ["NET_PART", "AbortOrder", "Campaign", "FailedCriterion", "LifecycleOrder", "Pass",
           "Quarantine", "RackProgress", "Run", "StageResult", "StartOrder", "StepOrders"]

RunState = Literal["starting", "running", "done", "lost", "aborted"]
RackStatus = Literal["pending", "validating", "needs_regroup", "promoting", "production",
                     "quarantined", "blocked"]
_ACTIVE: Final = frozenset({"starting", "running"})
_FIGURE_MAX: Final = 1.5
"""A measured fraction of line rate above this is implausible (a unit error), W/W."""
_TEXT_MAX: Final = 200


def _text(x: object) -> str:
    return str(x)[:_TEXT_MAX]


NET_PART: Final = "net:"
"""Prefix of a part outside the rack (the backend network: ``net:rail3``, the rail-3 leaf and
its uplinks serving the rack). It names where a multi-rack failure lies but never quarantines
the rack: the run counts as unattributed for it (re-run, then blocked)."""


def _rack_parts(c: FailedCriterion) -> tuple[str, ...]:
    """The parts of ``c`` that are the rack's own (not `NET_PART`)."""
    return tuple(p for p in c.parts if not p.startswith(NET_PART))


@dataclass(frozen=True, slots=True)
class FailedCriterion:
    """One failed criterion: its name, what was measured, the limit, the parts named."""

    name: str
    measured: str
    limit: str
    parts: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class StageResult:
    """One rack's judged result of a run.

    ``judge_epoch``: the fencing epoch of the racky leader that judged it; ``passed``: racky's
    verdict; ``failed``: the criteria it failed (parts named where known); ``measured``:
    figures of `rlc.core.campaign_plan.FIGURES` (fractions of line rate); ``at_s`` wall s.
    """

    run_id: str
    rack: str
    judge_epoch: int
    passed: bool
    failed: tuple[FailedCriterion, ...] = ()
    measured: Mapping[str, float] = field(default_factory=dict)
    at_s: float = 0.0

    def as_record(self) -> dict[str, Any]:
        """JSON-able."""
        return {"run_id": self.run_id, "rack": self.rack, "judge_epoch": self.judge_epoch,
                "passed": self.passed, "at_s": self.at_s,
                "failed": [[c.name, c.measured, c.limit, list(c.parts)] for c in self.failed],
                "measured": {k: v for k, v in self.measured.items() if math.isfinite(v)}}

    @classmethod
    def from_record(cls, d: Mapping[str, Any]) -> StageResult:
        """From `as_record` (or racky's reply shaped alike). Raises ValueError."""
        try:
            ep = d["judge_epoch"]
            if isinstance(ep, bool) or not isinstance(ep, int) or ep < 0:
                raise ValueError(f"stage result: judge_epoch {ep!r}")
            passed = d["passed"]
            if not isinstance(passed, bool):
                raise ValueError(f"stage result: passed {passed!r}")
            return cls(_text(d["run_id"]), _text(d["rack"]), ep, passed,
                       tuple(FailedCriterion(_text(n), _text(m), _text(lim),
                                             tuple(_text(p) for p in parts[:64]))
                             for n, m, lim, parts in d.get("failed", [])[:64]),
                       {str(k): float(v) for k, v in d.get("measured", {}).items()
                        if k in FIGURES},
                       float(d.get("at_s", 0.0)))
        except (KeyError, TypeError) as err:
            raise ValueError(f"stage result: {err!r}") from None


@dataclass(frozen=True, slots=True)
class Pass:
    """A recorded pass of a stage: the run, the judge's epoch, when (wall s)."""

    run_id: str
    judge_epoch: int
    at_s: float


@dataclass(frozen=True, slots=True)
class Quarantine:
    """Why a rack was quarantined: the stage and run, the failing criterion, the parts."""

    stage: str
    run_id: str
    criterion: str
    measured: str
    limit: str
    parts: tuple[str, ...]
    judge_epoch: int
    at_s: float

    @property
    def reason(self) -> str:
        """One line for ``set_lifecycle quarantined`` (≤ 200 characters; the parts come
        before the measured text, so a long measurement never cuts them off)."""
        parts = ", ".join(self.parts) if self.parts else "part not named"
        return _text(f"campaign {self.stage} ({self.run_id}): {self.criterion} failed on "
                     f"{parts}: {self.measured} (limit {self.limit})")


@dataclass
class RackProgress:
    """One rack's progress. ``lifecycle_wanted``/``lifecycle_confirmed``: the lifecycle state
    rlc asked racky for and the one racky confirmed (None: none yet)."""

    passes: dict[str, Pass] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)
    quarantine: Quarantine | None = None
    blocked: str | None = None
    ready_at_s: float = -math.inf
    lifecycle_wanted: str | None = None
    lifecycle_confirmed: str | None = None


@dataclass
class Run:
    """One run: a stage on one rack or one group (module docstring)."""

    run_id: str
    stage: str
    racks: tuple[str, ...]
    issued_at_s: float
    rlc_epoch: int
    deadline_s: float
    state: RunState = "starting"
    started: set[str] = field(default_factory=set)
    results: dict[str, StageResult] = field(default_factory=dict)
    abort_pending: set[str] = field(default_factory=set)
    ended_at_s: float | None = None

    def holds_slots(self, now_wall_s: float) -> bool:
        """Whether its racks still count against the blast-radius and power limits: while
        starting or running, and after it was lost or aborted while a rack of it neither
        reported nor confirmed the abort, until its deadline."""
        if self.state in _ACTIVE:
            return True
        return bool(self.abort_pending) and now_wall_s < self.deadline_s


@dataclass(frozen=True, slots=True)
class StartOrder:
    """Send racky of ``rack`` ``start_validation`` with ``args`` for run ``run_id``."""

    run_id: str
    rack: str
    args: dict[str, Any]


@dataclass(frozen=True, slots=True)
class AbortOrder:
    """Send racky of ``rack`` ``abort_validation`` (``reason``) for run ``run_id``."""

    run_id: str
    rack: str
    reason: str


@dataclass(frozen=True, slots=True)
class LifecycleOrder:
    """Send racky of ``rack`` ``set_lifecycle`` ``state`` with ``reason``; ``evidence``: the
    passes (stage -> run, judge epoch) behind a production order, else empty."""

    rack: str
    state: str
    reason: str
    evidence: dict[str, Any]


@dataclass
class StepOrders:
    """What one `Campaign.step` decided: new starts and aborts, and lifecycle orders."""

    starts: list[StartOrder] = field(default_factory=list)
    aborts: list[AbortOrder] = field(default_factory=list)
    lifecycle: list[LifecycleOrder] = field(default_factory=list)


@dataclass
class Campaign:
    """A campaign in progress (module docstring). Build with `Campaign.new`."""

    campaign_id: str
    plan: CampaignPlan
    racks: dict[str, RackProgress]
    runs: dict[str, Run] = field(default_factory=dict)
    groups: dict[str, list[tuple[str, ...]]] = field(default_factory=dict)
    judge_epoch: dict[str, int] = field(default_factory=dict)
    seq: int = 0
    aborted: str | None = None
    stale_results: int = 0
    unusable_results: int = 0
    ignored_results: int = 0
    compacted_runs: int = 0
    waiting: dict[str, float] = field(default_factory=dict)
    """rack -> the draw (W) of the stage it waits to start for want of power (the last step's
    `rlc.core.campaign_schedule.plan_starts`; not in the record)."""

    @classmethod
    def new(cls, campaign_id: str, plan: CampaignPlan, topo: Topology) -> Campaign:
        """A fresh campaign of ``plan``; raises `rlc.core.campaign_plan.PlanError` if it cannot
        run on ``topo``."""
        check_plan(plan, topo)
        return cls(campaign_id=campaign_id, plan=plan,
                   racks={r: RackProgress() for r in plan.racks},
                   groups={s.name: [tuple(g) for g in s.groups or ()]
                           for s in plan.stages if s.kind == "multi_rack"})

    # --- queries ------------------------------------------------------------------------

    def current_pass(self, rack: str, stage: str) -> Pass | None:
        """The rack's pass of ``stage`` if its judge epoch is the current one."""
        p = self.racks[rack].passes.get(stage)
        if p is None or p.judge_epoch < self.judge_epoch.get(rack, 0):
            return None
        return p

    def gate_open(self, rack: str) -> bool:
        """Whether ``rack`` may enter production: not quarantined or blocked, and a current
        pass of every stage of the plan."""
        rp = self.racks[rack]
        return rp.quarantine is None and rp.blocked is None and all(
            self.current_pass(rack, s.name) is not None for s in self.plan.stages)

    def next_stage(self, rack: str) -> StageSpec | None:
        """The first stage of the plan without a current pass of ``rack`` (None: all)."""
        for s in self.plan.stages:
            if self.current_pass(rack, s.name) is None:
                return s
        return None

    def active_run(self, rack: str, now_wall_s: float) -> Run | None:
        """The run holding ``rack``'s slot now, if any."""
        return self.holding(now_wall_s).get(rack)

    def holding(self, now_wall_s: float) -> dict[str, Run]:
        """rack -> the run holding its slot now (`Run.holds_slots`)."""
        out: dict[str, Run] = {}
        for run in self.runs.values():
            if run.holds_slots(now_wall_s):
                for r in run.racks:
                    out[r] = run
        return out

    def group_for(self, rack: str, stage: str) -> tuple[str, ...] | None:
        """``rack``'s current group of multi-rack ``stage`` (None: needs regroup)."""
        for g in self.groups.get(stage, ()):
            if rack in g:
                return g
        return None

    def status(self, rack: str, now_wall_s: float) -> RackStatus:
        """The rack's status now."""
        rp = self.racks[rack]
        if rp.quarantine is not None:
            return "quarantined"
        if rp.blocked is not None:
            return "blocked"
        if rp.lifecycle_wanted == "production":
            return "production" if rp.lifecycle_confirmed == "production" else "promoting"
        if self.active_run(rack, now_wall_s) is not None:
            return "validating"
        s = self.next_stage(rack)
        if s is not None and s.kind == "multi_rack" and self.group_for(rack, s.name) is None:
            return "needs_regroup"
        return "pending"

    def available(self, rack: str) -> bool:
        """Whether ``rack`` may still run stages (not quarantined, blocked or promoted)."""
        rp = self.racks[rack]
        return rp.quarantine is None and rp.blocked is None and \
            rp.lifecycle_wanted != "production" and self.aborted is None

    # --- inputs -------------------------------------------------------------------------

    def on_judge_epoch(self, rack: str, epoch: int) -> bool:
        """The current fencing epoch of ``rack``'s judge (its racky leader lease). Returns
        True when it rose: passes under older epochs stop counting; a promotion not yet
        confirmed is withdrawn."""
        if rack not in self.racks or epoch <= self.judge_epoch.get(rack, 0):
            return False
        self.judge_epoch[rack] = epoch
        rp = self.racks[rack]
        rp.passes = {s: p for s, p in rp.passes.items() if p.judge_epoch >= epoch}
        if rp.lifecycle_wanted == "production" and rp.lifecycle_confirmed != "production":
            rp.lifecycle_wanted = "validating"
        return True

    def on_started(self, run_id: str, rack: str, now_wall_s: float) -> None:
        """racky of ``rack`` confirmed run ``run_id`` (again: no change)."""
        run = self.runs.get(run_id)
        if run is None or rack not in run.racks or run.state != "starting":
            return
        run.started.add(rack)
        if run.started.issuperset(run.racks):
            run.state = "running"

    def on_dropped(self, run_id: str, rack: str, now_wall_s: float) -> list[AbortOrder]:
        """racky of ``rack``, which had confirmed running ``run_id``, records neither it nor
        its result any more (it restarted, its pair failed over, or the run was aborted
        there): the run is lost now (an attempt for every rack of it without a result; the
        others of a group are aborted), never passed, and the stage runs again under a new
        run id. Returns the aborts to send."""
        run = self.runs.get(run_id)
        if run is None or run.state != "running" or rack not in run.racks \
                or rack in run.results:
            return []
        return self._end_lost(run, "lost", now_wall_s, f"racky of {rack} no longer records "
                              "it (restarted or failed over)")

    def on_aborted(self, run_id: str, rack: str) -> None:
        """racky of ``rack`` confirmed the abort of ``run_id`` (or has no run)."""
        run = self.runs.get(run_id)
        if run is not None:
            run.abort_pending.discard(rack)

    def on_lifecycle(self, rack: str, state: str) -> None:
        """racky of ``rack`` confirmed lifecycle ``state``."""
        if rack in self.racks:
            self.racks[rack].lifecycle_confirmed = state

    def on_result(self, res: StageResult, now_wall_s: float) -> str:
        """Take one result. Returns what became of it: ``taken``, ``stale`` (older judge
        epoch), ``unusable`` (a figure an expected range needs is missing or implausible) or
        ``ignored`` (unknown run or rack, or the run already ended with this rack's result)."""
        run = self.runs.get(res.run_id)
        if run is None or res.rack not in run.racks or res.rack in run.results \
                or run.state == "done":
            self.ignored_results += 1
            return "ignored"
        if res.judge_epoch < self.judge_epoch.get(res.rack, 0):
            self.stale_results += 1
            return "stale"
        self.on_judge_epoch(res.rack, res.judge_epoch)
        stage = self.plan.stage(run.stage)
        for fig in stage.expected:
            x = res.measured.get(fig, math.nan)
            if not (math.isfinite(x) and 0.0 <= x <= _FIGURE_MAX):
                self.unusable_results += 1
                return "unusable"
        if run.state == "aborted":
            self.ignored_results += 1
            return "ignored"
        run.results[res.rack] = res
        run.abort_pending.discard(res.rack)
        run.started.add(res.rack)
        if run.state == "lost" and res.passed is False:
            self._quarantine_if_named(run, stage, res, now_wall_s)
        if run.state in _ACTIVE and set(run.results) >= set(run.racks):
            self._finish(run, now_wall_s)
        return "taken"

    def abort(self, reason: str, now_wall_s: float) -> StepOrders:
        """Abort the campaign: every running run aborted (its racks told); nothing starts."""
        self.aborted = _text(reason)
        out = StepOrders()
        for run in self.runs.values():
            if run.state in _ACTIVE:
                out.aborts += self._end_lost(run, "aborted", now_wall_s, f"campaign aborted: "
                                             f"{self.aborted}")
        return out

    # --- the step -----------------------------------------------------------------------

    def step(self, topo: Topology, committed_w: Mapping[str, float], now_wall_s: float,
             rlc_epoch: int) -> StepOrders:
        """Deadlines, regrouping, the scheduler, new runs (module docstring).

        ``committed_w``: rack -> the most it may draw now, W (`rlc.core.leases.RackLedger`,
        every rack of ``topo``; missing or implausible: the rack's ``max_w``);
        ``rlc_epoch``: this leader's epoch, recorded in the runs it opens.
        """
        if not math.isfinite(now_wall_s):
            raise ValueError(f"now_wall_s must be finite, not {now_wall_s!r}")
        out = StepOrders()
        for run in list(self.runs.values()):
            if run.state == "starting" and now_wall_s >= \
                    run.issued_at_s + self.plan.start_timeout_s:
                out.aborts += self._end_lost(run, "lost", now_wall_s, "start not confirmed")
            elif run.state in _ACTIVE and now_wall_s >= run.deadline_s:
                out.aborts += self._end_lost(run, "lost", now_wall_s, "results missing")
        self.waiting = {}
        if self.aborted is None:
            regroup(self, topo)
            starts, waiting = plan_starts(self, topo, committed_w, now_wall_s)
            self.waiting = {r: s.power_w for s, u in waiting for r in u}
            for stage, racks in starts:
                out.starts += self._open(stage, racks, now_wall_s, rlc_epoch)
                for r in racks:
                    if self.racks[r].lifecycle_wanted is None:
                        self.racks[r].lifecycle_wanted = "validating"
        holding = self.holding(now_wall_s)
        for r in self.plan.racks:
            if r not in holding and self.available(r) and self.gate_open(r):
                self.racks[r].lifecycle_wanted = "production"
        out.lifecycle = self.lifecycle_orders()
        return out

    def outstanding(self, now_wall_s: float) -> StepOrders:
        """Every order not yet confirmed (a new leader, or a retry, sends them again; each
        carries its run id, so racky and rlc count it once)."""
        out = StepOrders(lifecycle=self.lifecycle_orders())
        for run in self.runs.values():
            stage = self.plan.stage(run.stage)
            if run.state == "starting":
                out.starts += [StartOrder(run.run_id, r, racky_start_args(stage))
                               for r in run.racks if r not in run.started]
            if run.abort_pending and now_wall_s < run.deadline_s:
                out.aborts += [AbortOrder(run.run_id, r, "campaign: run ended")
                               for r in sorted(run.abort_pending)]
        return out

    def lifecycle_orders(self) -> list[LifecycleOrder]:
        """Lifecycle orders not yet confirmed; a production order only while the gate is open
        (otherwise it is withdrawn here)."""
        out = []
        for r in self.plan.racks:
            rp = self.racks[r]
            want = rp.lifecycle_wanted
            if want is None or want == rp.lifecycle_confirmed:
                continue
            if want == "production":
                if not self.gate_open(r):
                    rp.lifecycle_wanted = "validating"
                    continue
                ev = {s.name: {"run_id": p.run_id, "judge_epoch": p.judge_epoch}
                      for s in self.plan.stages if (p := self.current_pass(r, s.name))}
                out.append(LifecycleOrder(r, "production", _text(
                    f"campaign {self.campaign_id}: every stage passed"),
                    {"campaign": self.campaign_id, "passes": ev}))
            elif want == "quarantined" and rp.quarantine is not None:
                out.append(LifecycleOrder(r, want, rp.quarantine.reason, {}))
            else:
                out.append(LifecycleOrder(r, want, _text(f"campaign {self.campaign_id}"), {}))
        return out

    # --- transitions --------------------------------------------------------------------

    def _open(self, stage: StageSpec, racks: tuple[str, ...], now_wall_s: float,
              rlc_epoch: int) -> list[StartOrder]:
        self.seq += 1
        run_id = f"{stage.name}.{self.seq}"
        p = self.plan
        self.runs[run_id] = Run(run_id, stage.name, racks, now_wall_s, rlc_epoch,
                                now_wall_s + p.start_timeout_s + stage.duration_s
                                + p.result_grace_s)
        args = racky_start_args(stage)
        return [StartOrder(run_id, r, args) for r in racks]

    def _end_lost(self, run: Run, state: RunState, now_wall_s: float,
                  why: str) -> list[AbortOrder]:
        """End ``run`` without every result: no verdict for the racks without one (an
        attempt counted against those, if lost); failures that name a part still count."""
        run.state = state
        run.ended_at_s = now_wall_s
        stage = self.plan.stage(run.stage)
        missing = [r for r in run.racks if r not in run.results]
        run.abort_pending = set(missing)
        for r in missing:
            if state == "lost":
                self._attempt(r, stage.name, f"run {run.run_id}: {why}")
            self.racks[r].ready_at_s = now_wall_s + self.plan.settle_s
        for r, res in run.results.items():
            if not res.passed:
                self._quarantine_if_named(run, stage, res, now_wall_s)
            self.racks[r].ready_at_s = now_wall_s + self.plan.settle_s
        return [AbortOrder(run.run_id, r, _text(f"campaign: {why}")) for r in missing]

    def _attempt(self, rack: str, stage: str, why: str) -> None:
        rp = self.racks[rack]
        rp.attempts[stage] = rp.attempts.get(stage, 0) + 1
        if rp.attempts[stage] >= self.plan.max_attempts and rp.quarantine is None:
            rp.blocked = _text(f"stage {stage}: {rp.attempts[stage]} runs without a verdict; "
                               f"last {why}")

    def _finish(self, run: Run, now_wall_s: float) -> None:
        run.state = "done"
        run.ended_at_s = now_wall_s
        stage = self.plan.stage(run.stage)
        verdicts = {r: self._failures(stage, res) for r, res in run.results.items()}
        for r in run.racks:
            self.racks[r].ready_at_s = now_wall_s + self.plan.settle_s
        if all(not f for f in verdicts.values()):
            for r, res in run.results.items():
                self.racks[r].passes[stage.name] = Pass(run.run_id, res.judge_epoch, res.at_s)
            return
        for r in run.racks:  # a failed run: no rack keeps an older pass of this stage
            self.racks[r].passes.pop(stage.name, None)
        if stage.kind != "multi_rack":
            (r,) = run.racks
            self._quarantine(r, stage, run.run_id, run.results[r], verdicts[r][0], now_wall_s)
            return
        named = {r for r, f in verdicts.items() if f and any(_rack_parts(c) for c in f)}
        for r in sorted(named):
            c = next(c for c in verdicts[r] if _rack_parts(c))
            self._quarantine(r, stage, run.run_id, run.results[r], c, now_wall_s)
        if not named:
            for r, f in verdicts.items():
                if f:
                    net = sorted({p for c in f for p in c.parts})
                    self._attempt(r, stage.name, f"run {run.run_id}: {f[0].name} failed, "
                                  + (f"outside the rack: {', '.join(net)}" if net
                                     else "no part named"))

    def _failures(self, stage: StageSpec, res: StageResult) -> list[FailedCriterion]:
        """racky's failed criteria (one unnamed if it failed without listing any), then the
        expected ranges not met."""
        out = list(res.failed)
        if not res.passed and not out:
            out.append(FailedCriterion("racky verdict", "failed", "pass"))
        parts = tuple(sorted({p for c in res.failed for p in c.parts}))
        for fig, rng in stage.expected.items():
            x = res.measured.get(fig, math.nan)
            if not rng.holds(x):
                out.append(FailedCriterion(fig, f"{x:.3f}", f"[{rng.min:g}, {rng.max:g}]",
                                           parts))
        return out

    def _quarantine_if_named(self, run: Run, stage: StageSpec, res: StageResult,
                             now_wall_s: float) -> None:
        f = self._failures(stage, res)
        named = [c for c in f if _rack_parts(c)]
        if named or (f and stage.kind != "multi_rack"):
            self._quarantine(res.rack, stage, run.run_id, res, (named or f)[0], now_wall_s)

    def _quarantine(self, rack: str, stage: StageSpec, run_id: str, res: StageResult,
                    c: FailedCriterion, now_wall_s: float) -> None:
        rp = self.racks[rack]
        if rp.quarantine is not None:
            return
        rp.quarantine = Quarantine(stage.name, run_id, c.name, c.measured, c.limit, c.parts,
                                   res.judge_epoch, now_wall_s)
        rp.passes.pop(stage.name, None)
        rp.lifecycle_wanted = "quarantined"
