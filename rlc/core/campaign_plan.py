"""A validation campaign's plan: racks, ordered stages, phases, criteria (issue 17 item 1, pure).

A **plan** (`CampaignPlan`, validated with pydantic as rlc's config is) says which racks are
validated, on which CDU each sits, and the ordered stages every rack must pass before it may
enter production:

- a **stage** (`StageSpec`) has a kind (``node``: the listed trays of one rack; ``rack``: the
  whole rack, NVLink across its 72 GPUs; ``multi_rack``: a *group* of racks at once, collective
  traffic between them), its **phases** in order (``burn_in``: every GPU at burn-in power;
  ``agentic``: load spikes, varying concurrency and communication bursts; ``backend_only``:
  NVLink paths disabled so the collective traffic goes over the backend NICs), the power a rack
  draws while it runs (``power_w``, W per rack: what the scheduler reserves in the row), and the
  expected ranges of the measured figures rlc checks on top of racky's own criteria (thermal
  margin, links, errors, power, backend throughput: `racky.core.validation`): ``nvlink_fraction``
  and ``backend_fraction``, each a fraction of line rate in [0, 1];
- a ``multi_rack`` stage lists its **groups** (every plan rack in exactly one);
- the **blast-radius limit**: ``max_racks_per_row`` racks of one row validating at once, never
  two racks of one CDU (``cdu_of``), and never a row or hall past its power limit
  (`rlc.core.campaign_schedule`);
- **re-validation** (`revalidation_plan`): after maintenance or a detector finding (link flap,
  CRC creep, overheating) a rack runs a plan too, with the stages ``revalidation`` names for
  that reason.

**Durations** (all seconds; the campaign's clock is rlc's wall clock, `rlc.core.campaign`):

- ``PhaseSpec.duration_s``: how long racky records and the burn-in tool drives that phase;
  a stage's ``duration_s`` is the sum of its phases. racky's verb has two phase kinds: the
  ``burn_in`` and ``agentic`` phases go to its ``load_s``, ``backend_only`` to ``backend_s``
  (`racky_start_args`).
- ``start_timeout_s``: from issuing a run's ``start_validation`` to racky confirming it (every
  rack of a group). Unconfirmed by then: the run is *lost* (aborted, retried).
- ``result_grace_s``: after a run's phases end (counted from its issue + ``start_timeout_s``,
  the latest racky can have started it), how long its results may take to arrive. None by then:
  the run is lost. A lost run holds its slot in the blast-radius limit until then (the burn-in
  may still be running), or until every rack of it reported or confirmed an abort.
- ``settle_s``: after a run of a rack ends, the rack starts no other run for this long (the
  loop settles; thermal history of one stage does not flow into the next).
- ``max_attempts``: lost or unattributed runs of one stage a rack may have before it is
  *blocked* (an operator looks; it is neither failed nor promoted).

Errors: `pydantic.ValidationError` (a `ValueError`) for a plan that is wrong by itself;
`check_plan` raises `PlanError` (a `ValueError` naming every problem) for a plan that cannot
run on the topology: an unknown rack, a stage draw above a rack's ``max_w``, and a rack or a
group that could **never** fit (more of a group in one row than the limit, two on one CDU, or
its draw with every other rack of the row at its floor above the row's or hall's limit).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Final, Literal

from pydantic import Field, field_validator, model_validator

from rackplane.config import StrictModel
from rackplane.core.names import check_topic_level
from rackplane.settings import TopicLevel
from rlc.core.topology import Topology

__all__ = ["FIGURES", "CampaignPlan", "ExpectedRange", "PhaseSpec", "PlanError", "Reason",
           "StageSpec", "check_plan", "racky_start_args", "revalidation_plan", "unit_problems"]

StageKind = Literal["node", "rack", "multi_rack"]
PhaseKind = Literal["burn_in", "agentic", "backend_only"]
Reason = Literal["maintenance", "link_flap", "crc_creep", "overheating"]
Figure = Literal["nvlink_fraction", "backend_fraction"]
FIGURES: Final[tuple[str, ...]] = ("nvlink_fraction", "backend_fraction")
"""The measured figures a stage may give an expected range for (fractions of line rate)."""

_DAY_S: Final = 86_400.0
_MAX_W: Final = 1e9

_RACKY_STAGE: Final = {"node": "node", "rack": "rack", "multi_rack": "multi-rack"}


class PlanError(ValueError):
    """A plan that cannot run on the topology; ``problems`` lists each (rack, group, row)."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        shown = "; ".join(problems[:12])
        more = f"; and {len(problems) - 12} more" if len(problems) > 12 else ""
        super().__init__(f"campaign plan: {shown}{more}")


class PhaseSpec(StrictModel):
    """One phase of a stage."""

    kind: PhaseKind
    duration_s: float = Field(gt=0, le=_DAY_S, description="how long the phase runs, s "
                              "(racky's validation phases: 1 s .. 1 day)")


class ExpectedRange(StrictModel):
    """A measured fraction of line rate must lie in [min, max]."""

    min: float = Field(0.0, ge=0, le=1)
    max: float = Field(1.0, ge=0, le=1)

    @model_validator(mode="after")
    def _order(self) -> ExpectedRange:
        if self.min > self.max:
            raise ValueError(f"expected range min {self.min:g} above max {self.max:g}")
        return self

    def holds(self, x: float) -> bool:
        """Whether ``x`` (a fraction) is in range; NaN never is."""
        return self.min <= x <= self.max


class StageSpec(StrictModel):
    """One stage of the plan (module docstring)."""

    name: TopicLevel
    kind: StageKind
    phases: list[PhaseSpec] = Field(min_length=1, max_length=32)
    power_w: float = Field(gt=0, le=_MAX_W, description="what one rack draws while it runs "
                           "the stage, W (reserved in its row and hall)")
    trays: list[int] | None = Field(None, max_length=64, description="node stage: the trays "
                                    "under test (None: all)")
    expected: dict[Figure, ExpectedRange] = Field(
        default_factory=dict, description="expected ranges of measured figures, checked by "
        "rlc on top of racky's criteria")
    groups: list[list[str]] | None = Field(None, description="multi_rack: the groups, every "
                                           "plan rack in exactly one")

    @model_validator(mode="after")
    def _shape(self) -> StageSpec:
        if self.kind == "multi_rack":
            if not self.groups:
                raise ValueError(f"stage {self.name}: a multi_rack stage needs groups")
            for g in self.groups:
                if len(g) < 2:
                    raise ValueError(f"stage {self.name}: group {g} has fewer than 2 racks")
        elif self.groups is not None:
            raise ValueError(f"stage {self.name}: groups only for a multi_rack stage")
        if self.trays is not None and self.kind != "node":
            raise ValueError(f"stage {self.name}: trays only for a node stage")
        if self.trays is not None and any(not 0 <= t <= 63 for t in self.trays):
            raise ValueError(f"stage {self.name}: trays outside 0..63")
        if self.duration_s > _DAY_S:
            raise ValueError(f"stage {self.name}: phases sum to {self.duration_s:g} s, "
                             "more than a day")
        return self

    @property
    def duration_s(self) -> float:
        """The phases' sum, s."""
        return math.fsum(p.duration_s for p in self.phases)


def _default_revalidation() -> dict[Reason, list[str]]:
    return {"maintenance": ["*"], "link_flap": ["rack", "multi_rack"],
            "crc_creep": ["rack", "multi_rack"], "overheating": ["node", "rack"]}


class CampaignPlan(StrictModel):
    """A campaign (module docstring). Stages run in list order on every plan rack."""

    racks: list[TopicLevel] = Field(min_length=1, max_length=100_000)
    cdu_of: dict[str, str] = Field(description="rack -> the CDU that cools it (every plan "
                                   "rack; racks of one CDU never validate at once)")
    stages: list[StageSpec] = Field(min_length=1, max_length=16)
    max_racks_per_row: int = Field(1, ge=1, le=1000, description="racks of one row "
                                   "validating at once, at most")
    start_timeout_s: float = Field(120.0, gt=0, le=3600, description="issue to confirmed "
                                   "start, s")
    result_grace_s: float = Field(600.0, ge=0, le=_DAY_S, description="after a run's phases "
                                  "end, how long its results may take, s")
    settle_s: float = Field(0.0, ge=0, le=_DAY_S, description="after a rack's run ends, no "
                            "next run of it for this long, s")
    max_attempts: int = Field(3, ge=1, le=100, description="lost or unattributed runs of one "
                              "stage before the rack is blocked")
    revalidation: dict[Reason, list[str]] = Field(
        default_factory=_default_revalidation, description="reason -> stage kinds or names "
        "to run again ('*': all)")

    @field_validator("cdu_of")
    @classmethod
    def _cdu_names(cls, v: dict[str, str]) -> dict[str, str]:
        for k, c in v.items():
            check_topic_level(k, "rack name")
            check_topic_level(c, "CDU name")
        return v

    @model_validator(mode="after")
    def _refs(self) -> CampaignPlan:
        problems = []
        dup = [r for r, c in Counter(self.racks).items() if c > 1]
        if dup:
            problems.append(f"racks listed twice: {dup[:8]}")
        racks = set(self.racks)
        missing = [r for r in self.racks if r not in self.cdu_of]
        if missing:
            problems.append(f"racks without a CDU in cdu_of: {missing[:8]}")
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names):
            problems.append(f"stage names not unique: {names}")
        for s in self.stages:
            if s.groups is None:
                continue
            seen = Counter(r for g in s.groups for r in g)
            if not racks.issuperset(seen):
                problems.append(f"stage {s.name}: groups name racks not in the plan: "
                                f"{sorted(set(seen) - racks)[:8]}")
            twice = sorted(r for r, c in seen.items() if c > 1)
            if twice:
                problems.append(f"stage {s.name}: racks in more than one group: {twice[:8]}")
            left = [r for r in self.racks if r not in seen]
            if left:
                problems.append(f"stage {s.name}: racks in no group: {left[:8]}")
        for reason, sel in self.revalidation.items():
            for x in sel:
                if x != "*" and x not in names and x not in _RACKY_STAGE:
                    problems.append(f"revalidation.{reason}: {x!r} is neither a stage name "
                                    "nor a stage kind")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def stage(self, name: str) -> StageSpec:
        """The stage called ``name``; KeyError if none."""
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)

    def group_of(self, stage: StageSpec, rack: str) -> tuple[str, ...]:
        """``rack``'s group of a multi_rack ``stage`` (a 1-tuple for other stages)."""
        for g in stage.groups or ():
            if rack in g:
                return tuple(g)
        return (rack,)


def racky_start_args(stage: StageSpec) -> dict[str, Any]:
    """The args of racky's ``start_validation`` for ``stage`` (`racky.commands`
    StartValidationArgs): burn-in and agentic phases count as its ``load_s``, backend-only as
    ``backend_s`` (s)."""
    load = math.fsum(p.duration_s for p in stage.phases if p.kind != "backend_only")
    back = math.fsum(p.duration_s for p in stage.phases if p.kind == "backend_only")
    args: dict[str, Any] = {"stage": _RACKY_STAGE[stage.kind], "load_s": max(load, 1.0),
                            "backend_s": back}
    if stage.trays is not None:
        args["trays"] = list(stage.trays)
    return args


def revalidation_plan(plan: CampaignPlan, racks: list[str], reason: Reason) -> CampaignPlan:
    """The plan to validate ``racks`` again after ``reason``: the stages
    ``plan.revalidation[reason]`` selects (by name or kind, '*' all), in plan order; groups of
    multi_rack stages kept where all members are re-validated, otherwise the re-validated racks
    of a group form groups among themselves, and a rack left alone is grouped with the
    nearest one (plan order). Raises ValueError when nothing is selected, a rack is not in
    ``plan``, or a multi_rack stage is selected for a single rack."""
    unknown = [r for r in racks if r not in plan.cdu_of]
    if unknown or not racks:
        raise ValueError(f"revalidation: racks not in the plan: {unknown}" if unknown
                         else "revalidation: no racks")
    sel = set(plan.revalidation.get(reason, []))
    stages = [s for s in plan.stages if "*" in sel or s.name in sel or s.kind in sel]
    if not stages:
        raise ValueError(f"revalidation {reason}: no stage selected")
    order = [r for r in plan.racks if r in set(racks)]
    out = []
    for s in stages:
        if s.kind != "multi_rack":
            out.append(s)
            continue
        if len(order) < 2:
            raise ValueError(f"revalidation {reason}: stage {s.name} needs 2 racks or more")
        keep = set(order)
        groups = [[r for r in g if r in keep] for g in s.groups or ()]
        groups = [g for g in groups if g]
        singles = [g[0] for g in groups if len(g) == 1]
        groups = [g for g in groups if len(g) > 1]
        if len(singles) >= 2:
            groups.append(singles)
        elif singles and groups:
            groups[-1].append(singles[0])
        elif singles:
            groups.append(singles)
        out.append(s.model_copy(update={"groups": groups}))
    return CampaignPlan.model_validate({
        **plan.model_dump(), "racks": order,
        "cdu_of": {r: plan.cdu_of[r] for r in order},
        "stages": [s.model_dump() for s in out]})


def check_plan(plan: CampaignPlan, topo: Topology) -> None:
    """Raise `PlanError` if ``plan`` cannot run on ``topo`` (module docstring)."""
    problems: list[str] = []
    known = set(topo.rack_ids)
    unknown = [r for r in plan.racks if r not in known]
    if unknown:
        raise PlanError([f"racks not in the topology: {unknown[:8]}"])
    n_rows = len(topo.row_ids)
    row_floor = [0.0] * n_rows
    hall_floor = [0.0] * len(topo.hall_ids)
    for i in range(topo.n):
        row_floor[int(topo.row_of[i])] += float(topo.floor_w[i])
        hall_floor[int(topo.hall_of[i])] += float(topo.floor_w[i])
    for s in plan.stages:
        units = [tuple(g) for g in s.groups] if s.groups else [(r,) for r in plan.racks]
        for unit in units:
            problems += unit_problems(plan, topo, s, unit, row_floor, hall_floor)
    if problems:
        raise PlanError(problems)


def unit_problems(plan: CampaignPlan, topo: Topology, s: StageSpec, unit: tuple[str, ...],
                   row_floor: list[float], hall_floor: list[float]) -> list[str]:
    """Why ``unit`` (a rack, or a group) could never run ``s`` at once (every other rack at
    its floor, nothing else validating); [] if it could."""
    what = f"stage {s.name} rack {unit[0]}" if len(unit) == 1 else \
        f"stage {s.name} group {list(unit)}"
    out = []
    idx = [topo.index(r) for r in unit]
    for r, i in zip(unit, idx, strict=True):
        if s.power_w > float(topo.max_w[i]):
            out.append(f"{what}: power_w {s.power_w:g} W above rack {r}'s max_w "
                       f"{float(topo.max_w[i]):g} W")
    rows = Counter(int(topo.row_of[i]) for i in idx)
    for j, k in rows.items():
        if k > plan.max_racks_per_row:
            out.append(f"{what}: {k} racks in row {topo.row_ids[j]}, above "
                       f"max_racks_per_row {plan.max_racks_per_row}")
    cdus = Counter(plan.cdu_of[r] for r in unit)
    out += [f"{what}: {k} racks on CDU {c}" for c, k in cdus.items() if k > 1]
    for kind, of, floors, limits, ids in (
            ("row", topo.row_of, row_floor, topo.row_limit_w, topo.row_ids),
            ("hall", topo.hall_of, hall_floor, topo.hall_limit_w, topo.hall_ids)):
        need: dict[int, float] = {}
        for i in idx:
            j = int(of[i])
            need[j] = need.get(j, floors[j]) + s.power_w - float(topo.floor_w[i])
        for j, w in need.items():
            if w > float(limits[j]):
                out.append(f"{what}: {w:g} W in {kind} {ids[j]} with every other rack at its "
                           f"floor, above its limit {float(limits[j]):g} W: can never run")
    return out
