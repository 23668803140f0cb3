"""rlc's campaign driver: between the campaign core (`rlc.core.campaign`), the KV record
(`rlc.core.campaign_codec`) and racky's MQTT verbs (issue 17 item 1). No I/O here: the daemon
(`rlc.app.Rlc`) reads and writes the KV key and publishes what this returns.

One cycle of the leader (`rlc.app.Rlc._campaign_cycle`, after the budget cycle):

1. **Load.** A new tenure (or after a refused or unknown write) reads the key
   ``<site>.rlc.campaign`` (`campaign_key`) and restores the campaign from it (`restore`):
   never from memory. A record that does not decode is kept (never overwritten: an operator
   looks; counted ``bad_records``) and nothing runs.
2. **Step** (`step`): pending start or abort (from the commands) applied; what racky
   published since (``state/rack``, `on_racky_state`: its judge epoch, the run it records,
   its last judged validation, its lifecycle) fed to the campaign; `Campaign.step`.
3. **Write before send.** The record's bytes, if they changed, are written by
   compare-and-set on the revision read (`written` on success); only then are the step's
   orders published (`commands`). A refused or unknown write sends nothing and drops the
   in-memory campaign (read again next cycle). Orders not yet confirmed are re-sent every
   ``campaign.resend_s`` from the written record (`Campaign.outstanding`: each carries its
   run id, racky starts a run id once).

**racky's side** (`racky.commands`): ``start_validation`` with the run id, ``abort_validation``
only while racky records that very run (otherwise the abort is confirmed at once: nothing of it
runs), ``set_lifecycle`` ``quarantined`` (the reason) or ``production`` with the evidence
(racky checks it: `racky.core.campaign_gate`). ``validating`` is not sent: racky enters it by
``start_validation``. Every order goes out as ``<root>/<site>/<rack>/racky/cmd/<user>/<verb>``
(QoS 1, not retained); racky's replies (``.../result``) are counted (``orders_refused``, with
the code logged by the daemon).

**Restarts and failovers.** A run racky confirmed (``validation.run_id``) whose racky later
publishes a state recording neither that run nor its result (racky restarted, its pair failed
over, or the run was aborted there) is lost at once (`rlc.core.campaign.Campaign.on_dropped`):
never passed, counted as an attempt, the group's other racks aborted, and the stage runs again
under a new run id (under the rack's current judge epoch). A state whose ``judge_epoch`` is
below the rack's current one (a fenced leader's, published late) neither confirms nor drops a
run; its result is stale. A start not yet confirmed is re-sent every ``resend_s`` with its run
id: a restarted racky starts it afresh (a complete run).

**Results.** racky's ``last_validation`` (``run_id``, ``passed``, ``criteria``, ``measured``,
``judge_epoch``, ``link_alarms``) becomes a `rlc.core.campaign.StageResult` once per (rack,
run id) per tenure; failed criteria name the ports of the link alarms (``port:<id>``) for the
link criterion and the parts racky's criterion names (``parts``: the backend criterion's
``port:…``, ``nics:all``, ``net:rail<k>``), nothing otherwise ("part not named"). A payload
that does not parse is counted (``bad_states``) and ignored.

Counters (``counts``): ``writes_ok``, ``writes_refused``, ``writes_unknown``, ``bad_records``,
``bad_states``, ``orders_sent``, ``orders_refused``, ``restores``, ``record_too_large`` (a
step whose record stayed above ``max_record_bytes`` after `rlc.core.campaign_size.compact`:
not written, nothing sent, the campaign read again; the size is in the status,
``record_too_large_bytes``); Python ints (no wrap).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rackplane.core.topics import Topics
from rackplane.errors import CommandError
from rackplane.settings import Identity
from rlc.core.campaign import (
    AbortOrder,
    Campaign,
    FailedCriterion,
    Run,
    StageResult,
    StepOrders,
)
from rlc.core.campaign_codec import loads
from rlc.core.campaign_plan import CampaignPlan, PlanError, check_plan
from rlc.core.campaign_size import DEFAULT_MAX_RECORD_BYTES, check_record_size, compact
from rlc.core.topology import Topology

__all__ = ["CampaignDriver", "Order", "RackySeen", "campaign_key", "campaign_summary"]

_DONE = frozenset({"production", "quarantined", "blocked"})


def campaign_key(site: str) -> str:
    """The KV key of the campaign record: ``<site>.rlc.campaign``."""
    return f"{site}.rlc.campaign"


@dataclass
class RackySeen:
    """What rlc last read from one racky's ``state/rack``."""

    judge_epoch: int = 0
    running_run_id: str | None = None
    lifecycle: str | None = None
    result: StageResult | None = None


@dataclass(frozen=True, slots=True)
class Order:
    """One command to a racky: topic and envelope args; ``run_id`` for the log."""

    rack: str
    verb: str
    args: dict[str, Any]


@dataclass
class CampaignDriver:
    """The leader's campaign state between cycles (module docstring)."""

    topo: Topology
    root: str
    user: str
    racky_daemon: str = "racky"
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    campaign: Campaign | None = None
    revision: int | None = None
    loaded: bool = False
    bad_record: bool = False
    pending_start: tuple[str, CampaignPlan, str] | None = None
    pending_abort: tuple[str, str] | None = None
    seen: dict[str, RackySeen] = field(default_factory=dict)
    fed: set[tuple[str, str]] = field(default_factory=set)
    last_written: bytes | None = None
    too_large: int | None = None
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("writes_ok", "writes_refused", "writes_unknown", "bad_records", "bad_states",
         "orders_sent", "orders_refused", "restores", "record_too_large"), 0))

    # --- commands (synchronous, no I/O) -------------------------------------------------

    def request_start(self, campaign_id: str, plan: CampaignPlan, user: str) -> None:
        """Queue a start for the next cycle.

        Raises:
            CommandError: ``not_ready`` (the record is not read yet, or does not decode),
                ``invalid_args`` (the plan cannot run on the topology, every problem named),
                ``campaign_running`` (one is under way or queued).
        """
        if not self.loaded or self.bad_record:
            raise CommandError("not_ready", "the campaign record is not read yet (a leader "
                               "just took over): try again" if not self.loaded else
                               "the campaign record in the KV bucket does not decode: an "
                               "operator must look before a campaign can start")
        try:
            check_plan(plan, self.topo)
            check_record_size(plan, self.max_record_bytes)
        except PlanError as err:
            raise CommandError("invalid_args", str(err)) from None
        if self.pending_start is not None or (self.campaign is not None
                                              and not self.finished()):
            raise CommandError("campaign_running", "a campaign is under way: "
                               f"{self._current_id()} (campaign_abort first)")
        self.pending_start = (campaign_id, plan, user)

    def request_abort(self, reason: str, user: str) -> None:
        """Queue an abort. Raises CommandError ``no_campaign``."""
        if self.pending_start is not None:
            self.pending_start = None
            return
        if self.campaign is None or self.campaign.aborted is not None:
            raise CommandError("no_campaign", "no campaign is under way")
        self.pending_abort = (reason, user)

    def _current_id(self) -> str:
        if self.pending_start is not None:
            return self.pending_start[0]
        return self.campaign.campaign_id if self.campaign is not None else "none"

    def finished(self) -> bool:
        """No campaign, an aborted one, or every rack promoted, quarantined or blocked."""
        c = self.campaign
        if c is None or c.aborted is not None:
            return True
        return all(c.status(r, math.inf) in _DONE for r in c.plan.racks)

    # --- racky's state --------------------------------------------------------------------

    def on_racky_state(self, rack: str, payload: bytes) -> None:
        """racky's retained ``state/rack`` of ``rack`` (a rack of the topology; others are
        ignored). Counts ``bad_states`` when it does not parse."""
        if rack not in self.topo.rack_ids:
            return
        try:
            d = json.loads(payload)
            ep = d.get("judge_epoch", 0)
            if isinstance(ep, bool) or not isinstance(ep, int) or ep < 0:
                raise ValueError(f"judge_epoch {ep!r}")
            v = d.get("validation") or {}
            lv = d.get("last_validation")
            res = None
            if isinstance(lv, dict) and isinstance(lv.get("run_id"), str):
                res = _result(rack, lv)
            lc = d.get("lifecycle") or {}
            self.seen[rack] = RackySeen(ep, v.get("run_id") if isinstance(v, dict) else None,
                                        lc.get("state") if isinstance(lc, dict) else None,
                                        res)
        except (ValueError, TypeError, AttributeError, KeyError):
            self.counts["bad_states"] += 1

    # --- the cycle ------------------------------------------------------------------------

    def forget(self) -> None:
        """Not leading: drop the campaign (the next tenure reads the record)."""
        self.campaign, self.revision, self.loaded, self.last_written = None, None, False, None
        self.fed.clear()

    def restore(self, got: tuple[int, bytes] | None) -> None:
        """The key as read (None: absent). A record that does not decode is kept untouched
        (``bad_record``: nothing runs until an operator clears it)."""
        self.fed.clear()
        self.bad_record = False
        self.counts["restores"] += 1
        if got is None:
            self.campaign, self.revision, self.last_written = None, None, None
        else:
            rev, data = got
            self.revision, self.last_written = rev, data
            try:
                self.campaign = loads(data, self.topo)
            except ValueError:
                self.counts["bad_records"] += 1
                self.campaign, self.bad_record = None, True
        self.loaded = True

    def step(self, now_wall_s: float, epoch: int, committed_w: Mapping[str, float]
             ) -> tuple[bytes | None, StepOrders]:
        """Apply pending commands and racky's news, run `Campaign.step`. Returns the record to
        write (None: unchanged) and the orders to send once it is written."""
        out = StepOrders()
        if self.bad_record:
            return None, out
        abort_req = self.pending_abort
        if self.pending_start is not None:
            cid, plan, _user = self.pending_start
            self.pending_start = None
            self.campaign = Campaign.new(cid, plan, self.topo)
            self.fed.clear()
        c = self.campaign
        if c is None:
            return None, out
        if self.pending_abort is not None:
            reason, user = self.pending_abort
            self.pending_abort = None
            out = c.abort(f"{reason} (by {user})", now_wall_s)
        for r in c.plan.racks:
            s = self.seen.get(r)
            if s is None:
                continue
            c.on_judge_epoch(r, s.judge_epoch)
            fenced = s.judge_epoch < c.judge_epoch.get(r, 0)  # a fenced leader's late state
            if s.running_run_id is not None and not fenced:
                c.on_started(s.running_run_id, r, now_wall_s)
            if s.result is not None and (r, s.result.run_id) not in self.fed:
                self.fed.add((r, s.result.run_id))
                c.on_result(s.result, now_wall_s)
            if s.lifecycle is not None:
                c.on_lifecycle(r, s.lifecycle)
            if not fenced:
                out.aborts += self._dropped(c, r, s, now_wall_s)
            for rid in self._aborts_pending(r):
                if s.running_run_id != rid:  # racky records no such run: nothing to abort
                    c.on_aborted(rid, r)
        got = c.step(self.topo, committed_w, now_wall_s, epoch)
        out.starts += got.starts
        out.aborts += got.aborts
        out.lifecycle = got.lifecycle
        data = compact(c, now_wall_s, self.max_record_bytes)
        if len(data) > self.max_record_bytes:  # nothing written, nothing sent: read again
            self.counts["record_too_large"] += 1
            self.too_large = len(data)
            self.campaign, self.loaded = None, False
            self.pending_abort = abort_req  # applied again to the record read next
            self.fed.clear()
            return None, StepOrders()
        self.too_large = None
        return (None if data == self.last_written else data), out

    @staticmethod
    def _dropped(c: Campaign, rack: str, s: RackySeen, now_wall_s: float) -> list[AbortOrder]:
        """Runs ``rack``'s racky confirmed but no longer records, nor reports a result of:
        lost now (`Campaign.on_dropped`). racky ends a run and publishes its result in one
        state, so a state without both means the run is gone there."""
        out: list[AbortOrder] = []
        for run in list(c.runs.values()):
            if run.state == "running" and rack in run.racks and rack not in run.results \
                    and s.running_run_id != run.run_id \
                    and (s.result is None or s.result.run_id != run.run_id):
                out += c.on_dropped(run.run_id, rack, now_wall_s)
        return out

    def _aborts_pending(self, rack: str) -> list[str]:
        c = self.campaign
        if c is None:
            return []
        return [run.run_id for run in c.runs.values() if rack in run.abort_pending]

    def written(self, revision: int, data: bytes) -> None:
        """The record landed at ``revision``."""
        self.revision, self.last_written = revision, data
        self.counts["writes_ok"] += 1

    def write_failed(self, unknown: bool) -> None:
        """Refused (``unknown`` False) or unanswered: drop the campaign, read it again."""
        self.counts["writes_unknown" if unknown else "writes_refused"] += 1
        self.campaign, self.loaded = None, False
        self.fed.clear()

    def reserve_w(self, now_wall_s: float) -> dict[str, tuple[float, bool]]:
        """rack -> (its stage's ``power_w``, W; False) while a run holds its slot (starting,
        running, or lost / aborted and possibly still burning in), and (``power_w``, True)
        while it waits to start for want of power (`rlc.core.campaign.Campaign.waiting`):
        what the allocator serves it before every priority class, running stages before
        waiting ones (`rlc.core.allocation`, ``reserve_w``). {} without a campaign."""
        c = self.campaign
        if c is None:
            return {}
        out = {r: (w, True) for r, w in c.waiting.items()}
        out.update({r: (c.plan.stage(run.stage).power_w, False)
                    for r, run in c.holding(now_wall_s).items()})
        return out

    def outstanding(self, now_wall_s: float) -> StepOrders:
        """Orders of the written record not yet confirmed (re-sent every resend_s)."""
        if self.campaign is None or self.bad_record:
            return StepOrders()
        return self.campaign.outstanding(now_wall_s)

    def commands(self, orders: StepOrders) -> list[Order]:
        """racky verbs for ``orders`` (module docstring)."""
        out = [Order(o.rack, "start_validation", {**o.args, "run_id": o.run_id})
               for o in orders.starts]
        for a in orders.aborts:
            if self.seen.get(a.rack, RackySeen()).running_run_id == a.run_id:
                out.append(Order(a.rack, "abort_validation", {"reason": a.reason}))
        for lo in orders.lifecycle:
            if lo.state == "validating":
                continue
            args: dict[str, Any] = {"state": lo.state, "reason": lo.reason}
            if lo.state == "production":
                args["evidence"] = lo.evidence
            out.append(Order(lo.rack, "set_lifecycle", args))
        return out

    def topic(self, o: Order) -> str:
        """``<root>/<site>/<rack>/racky/cmd/<user>/<verb>``."""
        return Topics(self.root, Identity(site=self.topo.site, rack=o.rack),
                      self.racky_daemon).cmd(self.user, o.verb)

    def state_filter(self) -> str:
        """``<root>/<site>/+/racky/state/rack`` (every racky's retained state)."""
        return f"{self.root}/{self.topo.site}/+/{self.racky_daemon}/state/rack"

    def reply_filter(self) -> str:
        """``<root>/<site>/+/racky/cmd/<user>/+/result`` (racky's replies to rlc)."""
        return f"{self.root}/{self.topo.site}/+/{self.racky_daemon}/cmd/{self.user}/+/result"

    def status(self, now_wall_s: float) -> dict[str, Any]:
        """``state/campaign`` (`rlc.commands.CampaignStatus`)."""
        c = self.campaign
        pending = ("start " + self.pending_start[0] if self.pending_start is not None else
                   "abort" if self.pending_abort is not None else None)
        base: dict[str, Any] = {"campaign_id": None if c is None else c.campaign_id,
                                "pending": pending, "counts": dict(self.counts),
                                "record_too_large_bytes": self.too_large}
        if c is None:
            return base
        return {**base, **campaign_summary(c, now_wall_s),
                "counts": {**self.counts, "stale_results": c.stale_results,
                           "unusable_results": c.unusable_results}}


def campaign_summary(c: Campaign, now_wall_s: float) -> dict[str, Any]:
    """``campaign_id``, ``aborted``, per rack (``racks``) its ``status``, ``stage`` (the stage
    of the run holding it, else its next stage; None when every stage has a current pass),
    ``run`` and ``run_state`` (its latest run), ``verdict`` (of that run's result for it:
    ``pass``, ``fail``, None without one), ``passes`` (stage -> [run id, judge epoch]),
    ``quarantine`` (the reason), ``blocked``, ``judge_epoch``; and the last 64 ``runs``
    (run id -> stage, racks, state). Pure: what ``campaign_status`` and ``rackctl campaign``
    show, from the live campaign or a record read from the KV bucket."""
    latest: dict[str, Run] = {}
    for run in c.runs.values():  # issue order: the last one wins
        for r in run.racks:
            latest[r] = run
    holding = c.holding(now_wall_s)
    racks = {}
    for r in c.plan.racks:
        rp = c.racks[r]
        q = rp.quarantine
        last = latest.get(r)
        res = None if last is None else last.results.get(r)
        held = holding.get(r)
        nxt = c.next_stage(r)
        racks[r] = {"status": c.status(r, now_wall_s),
                    "stage": held.stage if held is not None else
                    (None if nxt is None else nxt.name),
                    "run": None if last is None else last.run_id,
                    "run_state": None if last is None else last.state,
                    "verdict": None if res is None else ("pass" if res.passed else "fail"),
                    "passes": {s: [p.run_id, p.judge_epoch] for s, p in rp.passes.items()},
                    "quarantine": None if q is None else q.reason,
                    "blocked": rp.blocked, "judge_epoch": c.judge_epoch.get(r, 0)}
    runs = {rid: {"stage": run.stage, "racks": list(run.racks), "state": run.state}
            for rid, run in list(c.runs.items())[-64:]}
    return {"campaign_id": c.campaign_id, "aborted": c.aborted, "racks": racks, "runs": runs}


def _result(rack: str, lv: Mapping[str, Any]) -> StageResult:
    """racky's ``last_validation`` summary as a `StageResult` (ValueError if malformed)."""
    ports = tuple(f"port:{a}" for a in lv.get("link_alarms", [])[:64])
    failed = tuple(FailedCriterion(str(c["name"]), str(c["measured"]), str(c["limit"]),
                                   (ports if c["name"] == "link errors" else ())
                                   + tuple(str(p) for p in (c.get("parts") or [])[:64]))
                   for c in lv.get("criteria", [])[:64] if not c["passed"])
    at = lv.get("started_ns", 0)
    rec = {"run_id": lv["run_id"], "rack": rack, "judge_epoch": lv.get("judge_epoch", 0),
           "passed": lv["passed"], "at_s": float(at) / 1e9 if isinstance(at, int) else 0.0,
           "measured": lv.get("measured", {}),
           "failed": [[f.name, f.measured, f.limit, list(f.parts)] for f in failed]}
    return StageResult.from_record(rec)
