"""A valvey pair on real servers, and the chaos run over it (issue 15, items 2, 4 and 6).

`pair` starts two valvey processes (a, b) with ``[leadership] enabled`` against a real NATS
JetStream cluster, a real Mosquitto and the simulated CDU (in this process) behind real
Modbus TCP with its controller-epoch gate (sims/epoch_gate.py), which records every write it
admits or refuses with the epoch the writer's connection claimed. The integration tests
(tests/integration/test_valvey_pair*.py, test_chaos.py) and the bench's ``chaos`` section
(harness/benchsections.py) use this one implementation.

`run_chaos` induces failovers of each kind in `KINDS` on such pairs and computes every figure
from the gate's records, the daemons' JSON log events and the simulated CDU's supply
temperature (`ChaosResult`):

- ``kill``: at steady load (after the scenario's load step, 30 → 100 % at 10 s simulated,
  once the supply settled: `SETTLED_K`), SIGKILL of the active; the standby must write with
  a newer epoch (takeover time: the kill to the first accepted write of the newer epoch;
  supply error: `SUPPLY_WINDOW_S`; the valve demand's first move after the takeover); the
  killed one is restarted and waited for as standby before the next failover;
- ``pause_long``: SIGSTOP of the active until the standby writes with a newer epoch, then
  SIGCONT (the old active must find itself standby, its writes refused at the CDU);
- ``pause_short``: SIGSTOP of the active for 40 % of its renew deadline: no change of active,
  no fencing;
- ``partition``: each instance reaches one NATS node of its own; the active's node is paused
  (its host cut off the bus, as in test_valvey_pair_outages.py), the standby takes over;
- ``nats_kill``: one NATS node killed (the KV stream's leader every other time) under the
  ride-through lease `RIDE_THROUGH`: no change of active, no fencing; the node restarted and
  rejoined before the next.

The first four run on a pair with the short test lease `LEASE`, the last on a second pair
with `RIDE_THROUGH` (a stream election lasts 4-9 s on nats-server 2.9, longer than `LEASE`'s
deadline). Waits are bounded (each names what it waits for); the whole run stops starting
failovers once its time budget is spent, and says how many it skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from harness.daemons import MqttClient, Proc, until, valvey_proc, write_config
from harness.servers import Mosquitto, NatsCluster
from rackplane.io.mqtt import Message
from rackplane.settings import Identity, MqttSettings
from sims.epoch_gate import EPOCH_POINT, EpochGate, GateRecord
from sims.runtime import VirtualRackSimulator
from sims.scenario import load_scenario

__all__ = [
    "KINDS",
    "LEASE",
    "RIDE_THROUGH",
    "RIDE_WATCHDOG_S",
    "SETTLED_K",
    "SHORT_WATCHDOG_S",
    "ChaosResult",
    "Failover",
    "Pair",
    "events_after",
    "first_move",
    "first_tenure",
    "max_gap_s",
    "pair",
    "pair_states",
    "run_chaos",
]

KINDS: Final = ("kill", "pause_long", "pause_short", "partition", "nats_kill")

LEASE = {"lease_s": 3.0, "renew_every_s": 0.5, "renew_deadline_s": 2.0, "retry_every_s": 0.2,
         "election_max_s": 1.0, "request_timeout_s": 0.5}


@dataclass
class Pair:
    rack: str
    sim: VirtualRackSimulator
    gate: EpochGate
    procs: dict[str, Proc]
    status: dict[str, list[dict[str, Any]]]  # topic -> payloads seen (retained included)
    bucket: str = ""  # the lease bucket (stream KV_<bucket>)
    setpoint_c: float = 45.0  # the scenario's supply setpoint
    step_at_s: float = 0.0  # the scenario's load step (simulated s)
    stepped_mono: float | None = None  # when `sample_supply` saw the simulator pass it

    def last(self, topic: str) -> dict[str, Any]:
        return self.status.get(topic, [{}])[-1]

    def writes(self, since: float = 0.0) -> list[GateRecord]:
        """Admitted writes other than claims since ``since`` (monotonic s)."""
        return [r for r in self.gate.accepted_after(since) if EPOCH_POINT not in r.points]

    def claim_at(self, epoch: int) -> float | None:
        return next((r.t_mono for r in self.gate.records
                     if r.accepted and EPOCH_POINT in r.points and r.epoch == epoch), None)

    def instance_of(self, epoch: int) -> str:
        """Which instance logged the claim of ``epoch``."""
        for inst, p in self.procs.items():
            if any(e.get("event") == "cdu_epoch_claimed" and e.get("epoch") == epoch
                   for e in p.events()):
                return inst
        raise AssertionError(f"no instance logged a claim of epoch {epoch}")


def _config(tmp: Path, inst: str, rack: str, modbus_port: int, mqtt_port: int,
            nats: NatsCluster, bucket: str, cdu: dict[str, Any],
            supply_loop: dict[str, Any], leadership: dict[str, Any] | None = None,
            **control: Any) -> Path:
    return write_config(
        tmp / f"valvey-{inst}.toml",
        identity={"site": "lab", "rack": rack},
        cdu={"port": modbus_port, "reconnect_min_s": 0.2, "reconnect_max_s": 1.0, **cdu},
        points={"controller_epoch": "controller_epoch"},
        mqtt={"port": mqtt_port, "reconnect_max_s": 1.0, "keepalive_s": 5},
        spool={"directory": str(tmp / f"spool-{inst}")},
        control=control,
        supply_loop=supply_loop,
        commands={"users": {"alice": "operator"}},
        leadership={"enabled": True, "instance": inst, "servers": nats.urls,
                    "bucket": bucket, **LEASE, **(leadership or {})},
        log={"format": "json"},
    )


@contextlib.asynccontextmanager
async def pair(tmp: Path, mosquitto: Mosquitto, nats: NatsCluster,
               cdu: dict[str, Any] | None = None, supply_loop: dict[str, Any] | None = None,
               leadership: dict[str, Any] | None = None,
               servers: dict[str, list[str]] | None = None,
               cdu_heartbeat_timeout_s: float | None = None,
               step_at_s: float | None = None, instances: str = "ab",
               **control: Any) -> AsyncIterator[Pair]:
    """Two valvey processes (``instances``: a, b; "" for none: the CDU alone, in its own
    local control once its heartbeat watchdog ran out) on one simulated CDU.
    ``leadership`` overrides `LEASE`;
    ``servers`` gives an instance its own NATS nodes (default: every node of ``nats``);
    ``cdu_heartbeat_timeout_s`` the simulated CDU's watchdog (default the plant's 10 s);
    ``step_at_s`` the S1 load step's time (simulated s; default the scenario's 10 s)."""
    rack = f"r{uuid.uuid4().hex[:10]}"
    sc = load_scenario("load-step-short").model_copy(update={"duration_s": 3600.0})
    if step_at_s is not None:
        sc = sc.model_copy(update={"load": sc.load.model_copy(update={"step_at_s": step_at_s})})
    if cdu_heartbeat_timeout_s is not None:
        sc = sc.model_copy(update={"plant": sc.plant.model_copy(
            update={"heartbeat_timeout_s": cdu_heartbeat_timeout_s})})
    sim = VirtualRackSimulator(sc, modbus_port=0, shelf_modbus_port=None,
                               identity=Identity(rack=rack))
    assert sim.epoch_gate is not None
    stop = asyncio.Event()
    sim_task = asyncio.create_task(sim.run(stop))
    status: dict[str, list[dict[str, Any]]] = {}

    def on_status(msg: Message) -> None:
        if msg.payload:
            status.setdefault(msg.topic, []).append(json.loads(msg.payload))
        elif "/alarm/" in msg.topic:  # a cleared alarm
            status.setdefault(msg.topic, []).append({})

    watcher = MqttClient(MqttSettings(port=mosquitto.port, clean_session=True,
                                      client_id=f"pairwatch-{rack}"), Identity(rack=rack))
    base = f"rackplane/lab/{rack}/valvey"
    watcher.link.subscribe(f"{base}/status", on_status, qos=1)
    watcher.link.subscribe(f"{base}/status/+", on_status, qos=1)
    watcher.link.subscribe(f"{base}/state/+", on_status, qos=1)
    watcher.link.subscribe(f"{base}/cmd/+/+/result", on_status, qos=1)  # command replies
    watcher.link.subscribe(f"{base}/alarm/+", on_status, qos=1)
    procs: dict[str, Proc] = {}
    try:
        await until(lambda: sim.face.running and sim.face.port, 10.0, "the CDU face")
        async with watcher:
            bucket = f"pair{uuid.uuid4().hex[:8]}"
            for inst in instances:
                own = {**(leadership or {}),
                       **({"servers": servers[inst]} if servers and inst in servers else {})}
                cfg = _config(tmp, inst, rack, sim.face.port, mosquitto.port, nats, bucket,
                              cdu or {}, supply_loop or {}, own, **control)
                p = valvey_proc(tmp, cfg, env={"PYTHONUNBUFFERED": "1"})
                p.name, p.log = f"valvey-{inst}", tmp / f"valvey-{inst}.log"
                procs[inst] = p.start()
            yield Pair(rack, sim, sim.epoch_gate, procs, status, bucket,
                       float(sc.plant.supply_setpoint_c), float(sc.load.step_at_s or 0.0))
    finally:
        for p in procs.values():
            if p.alive():
                with contextlib.suppress(ProcessLookupError):
                    p.signal(signal.SIGCONT)
            p.stop()
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(sim_task, 10.0)


# rides through a JetStream election (4-9 s on 2.9.10) with the default election_max_s: a
# confirmed renewal at most 1 s old + 9 s < 11 s; the CDU watchdog outlasts lease + renewal +
# heartbeat + Modbus timeout (--check-config's rule: 14 + 1 + 1 + 0.5 s)
RIDE_THROUGH = {"lease_s": 14.0, "renew_every_s": 1.0, "renew_deadline_s": 11.0,
                "retry_every_s": 0.25, "election_max_s": 9.0, "request_timeout_s": 0.5}
RIDE_WATCHDOG_S = 20.0
# the CDU's watchdog with the short test lease (LEASE: 3 s, renew 0.5 s, deadline 2 s):
# above 3 + 0.5 + 1 + 0.5 s
SHORT_WATCHDOG_S = 6.0

async def first_tenure(pr: Pair) -> tuple[int, str]:
    """Wait until one instance claimed the CDU and writes: (its epoch, its name).

    Raises:
        AssertionError: none did within 40 s, or an instance exited.
    """
    procs = list(pr.procs.values())
    await until(lambda: pr.gate.summary()["epoch"] > 0 and len(pr.writes()) >= 5, 40.0,
                "one instance claiming the CDU and writing", *procs)
    epoch = pr.gate.summary()["epoch"]
    return epoch, pr.instance_of(epoch)


def max_gap_s(writes: list[GateRecord], start: float, end: float) -> float:
    """The longest time in [start, end] without an accepted write (s)."""
    times = [start, *sorted(r.t_mono for r in writes if start <= r.t_mono <= end), end]
    return max(b - a for a, b in itertools.pairwise(times))


def events_after(pr: Pair, t_wall: float, *kinds: str) -> list[tuple[str, str]]:
    """(instance, event) of the log lines named ``kinds`` written after ``t_wall`` (Unix s)."""
    out = []
    for inst, p in pr.procs.items():
        for e in p.events():
            if e.get("event") in kinds and _wall_s(e) >= t_wall:
                out.append((inst, str(e["event"])))
    return out


def _wall_s(event: dict[str, Any]) -> float:
    ts = event.get("timestamp") or event.get("ts")
    if isinstance(ts, int | float):
        return float(ts)
    if isinstance(ts, str):
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    return math.inf  # a line without a time counts as "after": it cannot hide an event


# -- the chaos run -----------------------------------------------------------------------------

CHANGE_EVENTS: Final = ("leadership_acquired", "leadership_lost", "pair_role",
                        "cdu_epoch_claimed")
FENCE_EVENTS: Final = ("leadership_fenced",)
SUPPLY_WINDOW_S: Final = 10.0
"""Supply error window: a kill to its takeover + this (s), against this long just before
it."""
SETTLED_K: Final = 0.25
"""Steady load before a kill: after the load step, the supply within this of its setpoint (K)
and the valve demand unchanged for `SUPPLY_WINDOW_S`; waited for at most `SETTLE_MAX_S`
(then the kill goes ahead, marked).
(Counted from the step: before it the warm-started plant sits exactly at its setpoint, and a
kill there came with the step, 0.5-0.8 K of step response measured as the failover's.)"""
SETTLE_MAX_S: Final = 90.0


@dataclass
class Failover:
    """One induced failover.

    Attributes:
        kind: one of `KINDS`.
        at: when it was induced (monotonic s).
        takeover_s: induced → first accepted write of a newer epoch (s); None: no takeover
            (expected for ``pause_short`` and ``nats_kill``).
        changes: role/lease change events logged by either instance since (`CHANGE_EVENTS`).
        fencings: ``leadership_fenced`` events since.
        detail: what was hit (instance, node).
        node: the NATS node killed (``nats_kill``; else "").
        stale_attempts: writes the CDU refused from the start of this failover to the next.
        supply_error_k / baseline_error_k: kills only: max |supply − setpoint| (K) from the
            kill to its takeover + `SUPPLY_WINDOW_S` / in the `SUPPLY_WINDOW_S` before it
            (filled at the end of the run).
        valve_move_pct: kills only: the CDU's valve demand's first change after the takeover
            (new − held, %; None: it did not change in the supply window). Bumpless: the new
            active continues the old one's output, so it is one step of its loop, never a
            jump back to an older value.
    """

    kind: str
    at: float
    takeover_s: float | None = None
    changes: int = 0
    fencings: int = 0
    detail: str = ""
    node: str = ""
    stale_attempts: int = 0
    supply_error_k: float | None = None
    baseline_error_k: float | None = None
    valve_move_pct: float | None = None


@dataclass
class ChaosResult:
    """The run's failovers and the gate's counts over both pairs.

    Attributes:
        stale_attempts: writes the CDU refused as from an older or unclaimed epoch (counted).
        stale_accepted: writes the CDU accepted with an epoch older than it held (must be 0).
        two_writer_intervals: pairs of epochs whose accepted-write spans overlap in time.
        skipped: failovers not started because the time budget ran out.
    """

    failovers: list[Failover] = field(default_factory=list)
    stale_attempts: int = 0
    stale_accepted: int = 0
    two_writer_intervals: int = 0
    skipped: int = 0
    elapsed_s: float = 0.0
    lease_s: float = LEASE["lease_s"]

    def of(self, kind: str) -> list[Failover]:
        return [f for f in self.failovers if f.kind == kind]


def gate_counts(records: list[GateRecord]) -> tuple[int, int, int]:
    """(stale attempts refused, stale writes accepted, overlapping epoch spans) of one gate's
    records (oldest first)."""
    refused = sum(not r.accepted for r in records)
    writes = [r for r in records if r.accepted and EPOCH_POINT not in r.points]
    accepted_stale = sum(r.epoch is None or r.epoch < r.held for r in writes)
    spans: dict[int | None, list[float]] = {}
    for r in writes:
        s = spans.setdefault(r.epoch, [r.t_mono, r.t_mono])
        s[1] = r.t_mono
    ordered = sorted(spans.values())
    overlaps = sum(b[0] < a[1] for a, b in itertools.pairwise(ordered))
    return refused, accepted_stale, overlaps


def pair_states(pr: Pair, inst: str) -> list[dict[str, Any]]:
    """The ``state/pair_<inst>`` payloads seen, oldest first."""
    return pr.status.get(f"rackplane/lab/{pr.rack}/valvey/state/pair_{inst}", [])


async def _standby_again(pr: Pair, inst: str, seen: int, timeout_s: float = 40.0) -> None:
    """Until ``inst`` published a pair state with role standby after its ``seen``-th."""
    await until(lambda: any(s.get("role") == "standby" for s in pair_states(pr, inst)[seen:]),
                timeout_s, f"{inst} standby again")


async def _takeover(pr: Pair, e1: int, at: float, timeout_s: float, *procs: Proc) -> float:
    await until(lambda: any((r.epoch or 0) > e1 for r in pr.writes(at)), timeout_s,
                "the standby writing with a newer epoch", *procs)
    return next(r for r in pr.writes(at) if (r.epoch or 0) > e1).t_mono - at


def _max_error_k(samples: list[tuple[float, float]], setpoint_c: float, start: float,
                 end: float) -> float | None:
    errs = [abs(t - setpoint_c) for s, t in samples if start <= s <= end]
    return max(errs) if errs else None


async def _settle(pr: Pair, samples: list[tuple[float, float]],
                  valve: list[tuple[float, float]]) -> bool:
    """Until the loop answered the load step (the valve demand moved after it) and then, for
    `SUPPLY_WINDOW_S`, the supply stayed within `SETTLED_K` of its setpoint and the valve
    demand did not move (the loop at rest) (True), or `SETTLE_MAX_S` passed (False). The
    plant's dead time hides the step from the supply for seconds, so a quiet supply alone does
    not say the step's response is over."""
    t0 = time.monotonic()
    moved_at: float | None = None  # when the valve demand first moved after the step
    while time.monotonic() - t0 < SETTLE_MAX_S:
        now = time.monotonic()
        stepped = pr.stepped_mono
        if stepped is not None and moved_at is None and first_move(valve, stepped, now):
            held = next((v for t, v in reversed(valve) if t <= stepped), None)
            moved_at = next(t for t, v in valve if t > stepped and v != held)
        err = _max_error_k(samples, pr.setpoint_c, now - SUPPLY_WINDOW_S, now)
        resting = first_move(valve, now - SUPPLY_WINDOW_S, now) is None
        if (moved_at is not None and moved_at <= now - SUPPLY_WINDOW_S
                and err is not None and err <= SETTLED_K and resting):
            return True
        await asyncio.sleep(0.5)
    return False


async def _one(kind: str, i: int, pr: Pair, cluster: NatsCluster, own: dict[str, str],
               samples: list[tuple[float, float]], valve: list[tuple[float, float]],
               last_node: str = "") -> Failover:
    settled = await _settle(pr, samples, valve) if kind == "kill" else True
    e1 = pr.gate.summary()["epoch"]
    active = pr.instance_of(e1)
    standby = "b" if active == "a" else "a"
    lease = LEASE if kind != "nats_kill" else RIDE_THROUGH
    at, wall = time.monotonic(), time.time()
    fo = Failover(kind, at, detail=f"active {active}" + ("" if settled else ", not settled")
                  + (", CDU in local control" if pr.sim.run_.plant.local_control else ""))
    seen = len(pair_states(pr, active))
    if kind == "kill":
        pr.procs[active].proc.kill()  # type: ignore[union-attr]
        await asyncio.to_thread(pr.procs[active].wait, 10.0)
        fo.takeover_s = await _takeover(pr, e1, at, lease["lease_s"] + 20.0, pr.procs[standby])
        changes = len(events_after(pr, wall, *CHANGE_EVENTS))
        pr.procs[active].start()
        await _standby_again(pr, active, seen)
    elif kind == "pause_long":
        pr.procs[active].signal(signal.SIGSTOP)
        try:
            fo.takeover_s = await _takeover(pr, e1, at, lease["lease_s"] + 20.0,
                                            pr.procs[standby])
        finally:
            pr.procs[active].signal(signal.SIGCONT)
        changes = len(events_after(pr, wall, *CHANGE_EVENTS))
        await _standby_again(pr, active, seen)
    elif kind == "pause_short":
        pr.procs[active].signal(signal.SIGSTOP)
        await asyncio.sleep(0.4 * lease["renew_deadline_s"])
        pr.procs[active].signal(signal.SIGCONT)
        await asyncio.sleep(4 * lease["renew_every_s"] + 1.0)
        changes = len(events_after(pr, wall, *CHANGE_EVENTS))
    elif kind == "partition":
        node = cluster.node(own[active])
        fo.detail += f", its node {node.name} paused"
        await asyncio.to_thread(node.pause)
        try:
            fo.takeover_s = await _takeover(pr, e1, at, lease["lease_s"] + 30.0,
                                            pr.procs[standby])
        finally:
            await asyncio.to_thread(node.resume)
        changes = len(events_after(pr, wall, *CHANGE_EVENTS))
        await _standby_again(pr, active, seen)
        await asyncio.to_thread(cluster.wait_joined, node.name, 30.0)
    else:  # nats_kill: the KV stream's leader every other time
        stream = f"KV_{pr.bucket}"
        leader = await asyncio.to_thread(cluster.wait_stream_leader, stream)
        # a follower other than the node killed last (just restarted) when there is one
        followers = [n.name for n in cluster.nodes if n.name != leader]
        fresh = [n for n in followers if n != last_node] or followers
        name = leader if i % 2 == 0 else fresh[(i // 2) % len(fresh)]
        fo.node = name
        fo.detail += f", node {name} killed ({'KV leader' if name == leader else 'follower'})"
        await asyncio.to_thread(cluster.node(name).kill)
        if name == leader:
            await asyncio.to_thread(cluster.wait_stream_leader, stream, leader, 30.0)
        await asyncio.sleep(lease["election_max_s"] + lease["renew_every_s"])
        changes = len(events_after(pr, wall, *CHANGE_EVENTS))
        fo.fencings = len(events_after(pr, wall, *FENCE_EVENTS))
        await asyncio.to_thread(cluster.node(name).start)
        await asyncio.to_thread(cluster.wait_joined, name, 30.0)
        await asyncio.sleep(2 * lease["renew_every_s"])
    if kind != "nats_kill":
        fo.fencings = len(events_after(pr, wall, *FENCE_EVENTS))
    fo.changes = changes
    fo.stale_attempts = sum(not r.accepted and r.t_mono >= at for r in pr.gate.records)
    return fo


def _supply_window_end(fo: Failover) -> float:
    return fo.at + (fo.takeover_s or 0.0) + SUPPLY_WINDOW_S


def _supply_errors(fos: list[Failover], samples: list[tuple[float, float]],
                   setpoint_c: float, valve: list[tuple[float, float]] | None = None) -> None:
    for fo in fos:
        if fo.kind != "kill":
            continue
        end = _supply_window_end(fo)
        fo.supply_error_k = _max_error_k(samples, setpoint_c, fo.at, end)
        fo.baseline_error_k = _max_error_k(samples, setpoint_c, fo.at - SUPPLY_WINDOW_S,
                                           fo.at)
        if valve and fo.takeover_s is not None:
            fo.valve_move_pct = first_move(valve, fo.at + fo.takeover_s, end)


def first_move(valve: list[tuple[float, float]], start: float, end: float) -> float | None:
    """The first change of the sampled valve demand ``valve`` ((monotonic s, %), oldest first)
    after ``start`` up to ``end`` (new − the value held at ``start``, %); None: no change."""
    held = next((v for t, v in reversed(valve) if t <= start), None)
    for t, v in valve:
        if start < t <= end and held is not None and v != held:
            return v - held
    return None


async def sample_supply(pr: Pair, out: list[tuple[float, float]],
                        valve: list[tuple[float, float]] | None = None) -> None:
    """Append (monotonic s, supply °C of the simulated CDU's truth) to ``out`` and (monotonic
    s, its valve demand %) to ``valve`` every 0.2 s until cancelled; notes when the simulator
    passed its load step (`Pair.stepped_mono`)."""
    while True:
        now = time.monotonic()
        if pr.stepped_mono is None and pr.sim.run_.t_s >= pr.step_at_s:
            pr.stepped_mono = now
        out.append((now, float(pr.sim.run_.plant.truth().supply_temp_c)))
        if valve is not None:
            valve.append((now, float(pr.sim.run_.plant.readings()["valve_command_pct"])))
        await asyncio.sleep(0.2)


async def run_chaos(tmp: Path, mosquitto: Mosquitto, cluster: NatsCluster, n_each: int,
                    budget_s: float, kinds: tuple[str, ...] = KINDS,
                    progress: Callable[[str, float], None] | None = None) -> ChaosResult:
    """``n_each`` failovers of each of ``kinds`` (module docstring) on two valvey pairs
    (logs and configs under ``tmp``) against ``cluster`` (3 nodes) and ``mosquitto``; no
    failover starts after ``budget_s`` (s) have passed.

    Returns:
        The failovers with their figures and the gates' counts (`ChaosResult`).

    Raises:
        AssertionError: a bounded wait ran out (names what it waited for) or a daemon exited.
    """
    res = ChaosResult()
    t0 = time.monotonic()
    total = n_each * len(kinds)
    done = 0
    short = [k for k in kinds if k != "nats_kill"]
    plans: list[tuple[list[str], dict[str, Any]]] = []
    own = {"a": cluster.nodes[0].name, "b": cluster.nodes[1].name}
    if short:
        plans.append((short * n_each, {
            "servers": {i: [cluster.node(n).url] for i, n in own.items()},
            "cdu": {"watchdog_timeout_s": SHORT_WATCHDOG_S},
            "cdu_heartbeat_timeout_s": SHORT_WATCHDOG_S}))
    if "nats_kill" in kinds:
        plans.append((["nats_kill"] * n_each, {
            "leadership": RIDE_THROUGH, "cdu": {"watchdog_timeout_s": RIDE_WATCHDOG_S},
            "cdu_heartbeat_timeout_s": RIDE_WATCHDOG_S}))
    for p, (todo, opts) in enumerate(plans):
        sub = tmp / f"pair{p}"
        sub.mkdir(parents=True, exist_ok=True)
        async with pair(sub, mosquitto, cluster, **opts) as pr:
            samples: list[tuple[float, float]] = []
            valve: list[tuple[float, float]] = []
            sampler = asyncio.create_task(sample_supply(pr, samples, valve))
            try:
                await first_tenure(pr)
                fos: list[Failover] = []
                for i, kind in enumerate(todo):
                    if time.monotonic() - t0 > budget_s:
                        res.skipped += len(todo) - i
                        break
                    fos.append(await _one(kind, i, pr, cluster, own, samples, valve,
                                          fos[-1].node if fos else ""))
                    done += 1
                    if progress is not None:
                        progress("chaos", done / total)
                kills = [f for f in fos if f.kind == "kill"]
                if kills:  # the last kill's supply window complete
                    await asyncio.sleep(max(0.0, _supply_window_end(kills[-1])
                                            - time.monotonic()))
            finally:
                sampler.cancel()
            _supply_errors(fos, samples, pr.setpoint_c, valve)
            res.failovers += fos
            refused, stale, overlaps = gate_counts(list(pr.gate.records))
            res.stale_attempts += refused
            res.stale_accepted += stale
            res.two_writer_intervals += overlaps
    res.elapsed_s = time.monotonic() - t0
    return res
