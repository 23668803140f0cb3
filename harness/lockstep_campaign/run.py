"""A campaign in lock-step on `sims.backend.MultiRack` (see the package docstring): the scenario
set (`SCENARIOS`), one campaign (`run_campaign`) and its per-rack verdicts scored against the
injected faults' ground truth (`CampaignRun`)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from harness.lockstep_campaign.rig import OPERATOR, RackyRack, RlcSide, campaign_topology
from harness.lockstep_racky.run import WALL0_NS
from sims.backend import MultiRack
from sims.workloads import BurnInWorkload

__all__ = ["SCENARIOS", "CampaignRun", "CampaignScenario", "Expected", "RackVerdict",
           "run_campaign"]

Blame = Literal["rack", "network"]


@dataclass(frozen=True, slots=True)
class Expected:
    """What the campaign should find for one injected fault: the rack it shows on, the part
    that must be named (a substring of the verdict's parts: ``gpu07/nic1``, ``nics:all``,
    ``net:rail5``) and who is to blame (``rack``: quarantined; ``network``: the rack is not
    failed, the part outside it is named)."""

    rack: str
    part: str
    blame: Blame
    why: str


@dataclass(frozen=True, slots=True)
class CampaignScenario:
    """A scenario: faults injected into the `MultiRack` at plant time 0 (``inject``) and the
    findings they should lead to (``expected``; none: every rack healthy)."""

    name: str
    description: str
    inject: Callable[[MultiRack], None]
    expected: tuple[Expected, ...] = ()


def _none(_mr: MultiRack) -> None:
    return None


SCENARIOS: tuple[CampaignScenario, ...] = (
    CampaignScenario("healthy", "four healthy racks: every rack must reach production",
                     _none),
    CampaignScenario(
        "nics-underperform", "rack3's NICs move 60 % of their healthy throughput (firmware, "
        "PCIe, MTU); link speeds and counters look normal",
        lambda mr: mr.underperform_nics(2, 0.6),
        (Expected("rack3", "nics:all", "rack", "every backend port of rack3 low, its peers "
                  "at line rate (max-min: they send each other what rack3 cannot take)"),)),
    CampaignScenario(
        "degraded-port", "rack2's backend port gpu07/nic1 trained at 200G instead of 400G",
        lambda mr: mr.degrade_link_speed(1, "gpu07/nic1", 25_000.0),
        (Expected("rack2", "gpu07/nic1", "rack", "one port at half the rack's NIC line rate, "
                  "its rail peers in the other trays at line rate"),)),
    CampaignScenario(
        "congested-spine", "the uplink bundle of rack4's rail-5 leaf to spine1 leaves 25 % "
        "to the backend (other traffic); static ECMP holds the whole leaf's cross-rack "
        "traffic to 4 × 25 %",
        lambda mr: mr.congest_spine(3, 5, 1, 0.25),
        (Expected("rack4", "net:rail5", "network", "rack4's rail-5 port low on every tray, "
                  "its other rails at line rate: what those 18 ports share is the rail-5 "
                  "leaf and its spine uplinks, outside the rack; the spine readings name "
                  "the bundle"),)),
)


@dataclass
class RackVerdict:
    """One rack at the end of a campaign: rlc's status, the reason, the parts named."""

    rack: str
    status: str
    passed: bool
    reason: str
    parts: tuple[str, ...]
    findings: list[str] = field(default_factory=list)


@dataclass
class CampaignRun:
    """A finished lock-step campaign (`run_campaign`).

    ``trace``: per rack, per 1 s tick, ``t_s``, ``phase`` (racky's validation phase or
    ``None``), ``backend_fraction`` (`MultiRack.rack_backend` achieved / expected),
    ``nic_min`` (racky's lowest NIC port fraction of line, NaN outside a validation);
    ``verdicts``: per rack; ``found``: per expected fault, whether it was found with its
    part; ``false_quarantines``: racks quarantined that nothing blames; ``wall_s``: the
    campaign's wall time (s, the whole lock-step loop); ``plant_s``: plant time run.
    """

    scenario: CampaignScenario
    verdicts: dict[str, RackVerdict]
    trace: dict[str, dict[str, list[Any]]]
    found: list[tuple[Expected, bool, str]]
    false_quarantines: list[str]
    wall_s: float
    plant_s: float
    finished: bool
    spine: dict[str, Any]
    expected_range: tuple[float, float]
    phases: list[tuple[str, float]]
    runs: dict[str, Any]
    refused: list[tuple[float, str, str, str]]
    orders: list[tuple[float, str, str, dict[str, Any]]] = field(default_factory=list)
    """Every order rlc sent: plant s, rack, verb, racky's reply state (``validation``
    with ``again`` for a start racky already records)."""
    rlc: Any = None
    """rlc's side at the end (`harness.lockstep_campaign.rig.RlcSide`: the driver, the record)."""


def _plan(racks: list[str], load_s: float, backend_s: float, min_fraction: float,
          power_w: float) -> dict[str, Any]:
    return {"racks": racks, "cdu_of": {r: f"cdu{i + 1}" for i, r in enumerate(racks)},
            "max_racks_per_row": len(racks), "start_timeout_s": 10.0, "result_grace_s": 20.0,
            "max_attempts": 2, "settle_s": 2.0,
            "stages": [{"name": "multi", "kind": "multi_rack", "power_w": power_w,
                        "groups": [racks],
                        "expected": {"backend_fraction": {"min": min_fraction, "max": 1.0}},
                        "phases": [{"kind": "burn_in", "duration_s": load_s},
                                   {"kind": "backend_only", "duration_s": backend_s}]}]}


def run_campaign(scenario: CampaignScenario, *, racks: int = 4, seed: int = 3,
                 load_s: float = 20.0, backend_s: float = 30.0, warm_s: float = 15.0,
                 min_backend_fraction: float = 0.8, plant_dt_s: float = 0.5,
                 max_plant_s: float = 900.0, judge_epoch: int = 0,
                 on_tick: Callable[[float, list[RackyRack], RlcSide], None] | None = None
                 ) -> CampaignRun:
    """Run one campaign of ``scenario`` in lock-step on a ``racks``-rack `MultiRack`.

    Every rack carries a burn-in (every GPU at 0.9 of TDP, full link traffic) from plant
    time 0; at ``warm_s`` the operator starts the campaign through rlc's ``campaign_start``
    (one multi-rack stage, the racks one group: ``load_s`` of burn-in, ``backend_s``
    backend-only; expected backend fraction [``min_backend_fraction``, 1], racky's own
    ``min_backend_fraction`` alike). Each 1 s tick: rlc's cycle (racky's published states in,
    orders out through racky's command routers as user rlc), each racky's tick, then the
    burn-in tool: NVLink disabled (`MultiRack.set_phase` ``backend_only``) while a running
    validation is in its backend phase; the plant steps ``plant_dt_s``. Ends when rlc reports
    the campaign finished (every rack promoted, quarantined or blocked) or at ``max_plant_s``.

    ``judge_epoch``: every racky's fencing epoch at the start. ``on_tick(now, rackies, rlc)``,
    each tick before rlc's cycle: a test's events (a racky restarted or failed over,
    `RackyRack.restart`; a state handed to rlc, `RlcSide.driver.on_racky_state`).

    Raises:
        ValueError: a plant step that does not divide 1 s, or racks outside 2..8.
    """
    n_sub = round(1.0 / plant_dt_s)
    if n_sub < 1 or abs(n_sub * plant_dt_s - 1.0) > 1e-9:
        raise ValueError(f"plant_dt_s {plant_dt_s} must divide 1 s")
    t_wall = time.perf_counter()
    wls = [BurnInWorkload(72, fraction=0.9, traffic=1.0) for _ in range(racks)]
    mr = MultiRack(racks, seed=seed, workloads=wls)
    scenario.inject(mr)
    names = [f"rack{i + 1}" for i in range(racks)]
    vcfg = {"validation": {"min_backend_fraction": min_backend_fraction}}
    rackies = [RackyRack(mr.racks[i], names[i], vcfg) for i in range(racks)]
    for r in rackies:
        r.core.judge_epoch = judge_epoch
    by_name = {r.name: r for r in rackies}
    sent: list[tuple[float, str, str, dict[str, Any]]] = []
    rlc = RlcSide(campaign_topology(racks))
    committed = {r: 60_000.0 for r in names}
    plan = _plan(names, load_s, backend_s, min_backend_fraction, 120_000.0)
    keys = ("t_s", "phase", "backend_fraction", "nic_min")
    trace: dict[str, dict[str, list[Any]]] = {r: {k: [] for k in keys} for r in names}
    refused: list[tuple[float, str, str, str]] = []
    started = finished = False
    now = 0.0
    while now <= max_plant_s:
        wall_s = WALL0_NS / 1e9 + now
        if not started and now >= warm_s - 1e-9:
            rep = rlc.verbs.call("campaign_start", {"campaign_id": scenario.name,
                                                   "plan": plan}, OPERATOR)
            if not rep["ok"]:
                raise ValueError(f"campaign_start refused: {rep['error']}")
            started = True
        if started:
            for r in rackies:
                rlc.driver.on_racky_state(r.name, r.state_bytes())
            if on_tick is not None:
                on_tick(now, rackies, rlc)
            for o in rlc.cycle(now, wall_s, committed):
                rep = by_name[o.rack].verbs.call(o.verb, o.args, "rlc")
                sent.append((now, o.rack, o.verb, dict(rep.get("state") or {})))
                if not rep["ok"]:
                    refused.append((now, o.rack, o.verb, str(rep["error"])))
            if rlc.driver.campaign is not None and rlc.driver.finished():
                finished = True
                break
        backend = False
        for i, r in enumerate(rackies):
            r.step(now)
            v = r.core.validation
            ph = v.phase_at(now) if v is not None else None
            backend |= ph == "backend"
            tr = trace[r.name]
            rb = mr.rack_backend(i)
            tr["t_s"].append(now)
            tr["phase"].append(ph)
            tr["backend_fraction"].append(rb.fraction)
            tr["nic_min"].append(v.samples[-1].nic_fraction_min if v is not None and v.samples
                                 else math.nan)
        mr.set_phase("backend_only" if backend else "nvlink")
        for _ in range(n_sub):
            mr.step(plant_dt_s)
        now = round(now + 1.0, 6)
    wall = time.perf_counter() - t_wall
    out = _score(scenario, rlc, mr, trace, wall, now, finished, plan, refused)
    out.orders, out.rlc = sent, rlc
    return out


def _score(scenario: CampaignScenario, rlc: RlcSide, mr: MultiRack,
           trace: dict[str, dict[str, list[Any]]], wall: float, now: float, finished: bool,
           plan: dict[str, Any], refused: list[tuple[float, str, str, str]]) -> CampaignRun:
    c = rlc.driver.campaign
    assert c is not None
    verdicts: dict[str, RackVerdict] = {}
    for r in c.plan.racks:
        rp = c.racks[r]
        st = c.status(r, math.inf)
        q = rp.quarantine
        findings = [f"{res.run_id}: " + "; ".join(
            f"{f.name} ({f.measured}; limit {f.limit})"
            + (f" parts {', '.join(f.parts)}" if f.parts else "") for f in res.failed)
            for run in c.runs.values() for rr, res in run.results.items()
            if rr == r and not res.passed]
        if q is not None:
            reason, parts = q.reason, q.parts
        elif rp.blocked is not None:
            reason, parts = rp.blocked, ()
        elif st == "production":
            p = rp.passes.get("multi")
            reason = f"every stage passed ({p.run_id if p else '?'})"
            parts = ()
        else:
            reason, parts = f"not finished ({st})", ()
        verdicts[r] = RackVerdict(r, st, st == "production", reason, parts, findings)
    found: list[tuple[Expected, bool, str]] = []
    for e in scenario.expected:
        v = verdicts[e.rack]
        if e.blame == "rack":
            ok = v.status == "quarantined" and any(e.part in p for p in v.parts)
        else:
            ok = v.status != "quarantined" and any(e.part in f for f in v.findings)
        found.append((e, ok, v.reason))
    blamed = {e.rack for e in scenario.expected if e.blame == "rack"}
    false_q = sorted(r for r, v in verdicts.items()
                     if v.status == "quarantined" and r not in blamed)
    sw = mr.spine_bundles()
    util = sw["utilisation"]
    k = int(util.reshape(-1).argmax())
    spine = {"hottest_bundle": sw["names"][k % len(sw["names"])],
             "utilisation": float(util.reshape(-1)[k]),
             "median_utilisation": float(sorted(util.reshape(-1))[util.size // 2])}
    stage = plan["stages"][0]
    rng = stage["expected"]["backend_fraction"]
    runs = {rid: {"racks": list(run.racks), "state": run.state,
                  "passed": {r: res.passed for r, res in run.results.items()}}
            for rid, run in c.runs.items()}
    return CampaignRun(scenario, verdicts, trace, found, false_q, wall, now, finished, spine,
                       (rng["min"], rng["max"]),
                       [(p["kind"], p["duration_s"]) for p in stage["phases"]], runs, refused)
