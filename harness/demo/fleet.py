"""The demo's row under rlc (issue 20): row power budgets as leases and a short validation
campaign, when a ``nats-server`` binary is there.

With ``rackctl demo --racks N`` (N >= 2) and ``nats-server`` found (`find_nats_server`: the
``--nats-server`` option, else the ``RACKPLANE_DEMO_NATS_SERVER`` variable, else PATH or
``/usr/sbin``; ``none`` forces the row without rlc), `RowFleet` starts:

1. a single-node NATS JetStream server on a free loopback port (its config, store and log in
   ``<run>/nats/``, never on the console) and the fleet KV bucket on it (1 replica);
2. ``rlc`` (the real daemon, a subprocess, its config ``<run>/rlc.toml`` and log
   ``<run>/rlc.log``) with the row's topology: the demo's racks in one row whose limit is the
   demo's row limit, each rack's floor `RACK_FLOOR_W` and cap `RACK_MAX_W` (their Σ above the
   limit: rlc has to share);
3. each racky in fleet mode (`RowFleet.racky_overrides`): its budget is rlc's lease (the floor
   without one), rlc may order it (``rlc`` = operator), production only on rlc's order with a
   ``rack`` stage's pass (``[campaign_gate]``); the last rack (`RowFleet.new_rack`) starts in
   ``provisioning``, a new rack;
4. once rlc leads and every rack's racky is online and has acknowledged its lease, the
   campaign: a plan (``<run>/campaign.toml``:
   the new rack, one ``rack`` stage of `CAMPAIGN_STAGE_S` burn-in drawing `CAMPAIGN_POWER_W`)
   started as an operator would, ``rackctl campaign start`` with the demo's ``rackctl.toml``
   (its output in ``<run>/campaign-start.log``).

The demo records every lease rlc writes (each rack's budget key, pushed as written and read
every `LEASE_READ_S`), rlc's ``state/fleet`` and ``state/campaign``; `RowFleet.check_items`
turns them and the racks' records into the row's rlc checklist items (`harness.demo.
fleet_check`). Without nats-server, `no_rlc_reason` says why and how to get it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from harness.demo.checklist import CheckItem
from harness.demo.fleet_check import (
    LeaseSeen,
    campaign_item,
    lease_sum_item,
    lease_sums,
)
from harness.demo.procs import DEMO_SITE, OPERATOR, spawn, terminate, write_toml
from harness.demo.racks import DemoRack
from harness.demo.record import Recorder
from harness.servers import PortClash, ServerProcess, free_port
from rackplane.core.budget_leases import DEFAULT_RACK_FLOOR_W, BudgetLease, budget_key
from rackplane.io.mqtt import Message

__all__ = ["BUCKET", "CAMPAIGN_POWER_W", "CAMPAIGN_STAGE_S", "NATS_ENV", "RACK_FLOOR_W",
           "RACK_MAX_W", "RLC_RACK", "RowFleet", "find_nats_server", "no_rlc_reason",
           "start_row_fleet"]

NATS_ENV = "RACKPLANE_DEMO_NATS_SERVER"
"""Names the nats-server binary of the demo (``none``: run the row without rlc)."""
BUCKET = "rackplane_demo_fleet"
RLC_RACK = "rlc"
"""rlc's identity rack (its topics: ``rackplane/lab/rlc/rlc/...``; rackctl's default)."""
RACK_FLOOR_W = DEFAULT_RACK_FLOOR_W
"""Each rack's safe floor, W (rlc's topology and racky's ``[fleet] floor_w``: the shared
default)."""
RACK_MAX_W = 150_000.0
"""The most rlc grants one rack, W (AC input): above the row limit's even share, so rlc
shares the row by the racks' demand, never by a static split."""
RAMP_W_PER_S = 40_000.0
"""The row's ramp limit in the demo, W/s (grants from the floors to a full row in ~5 s)."""
CAMPAIGN_STAGE_S = 20.0
"""The demo campaign's one ``rack`` stage: its burn-in phase, s (racky records and judges
it; production needs that pass)."""
CAMPAIGN_POWER_W = 100_000.0
"""What the validating rack draws in the stage, W (rlc reserves it in the row)."""
LEASE_READ_S = 1.0
"""Each rack's lease key is read this often besides the pushes, s."""
CAMPAIGN_WAIT_S = 60.0
"""The campaign is started once rlc leads, every racky is online and every rack's lease is
acknowledged, or this long after the daemons started anyway (saying what was missing), s."""
EXPLAINED_ALARMS = {"racky:power_capped": (
    "from budget", "racky capped its trays to its budget, rlc's lease: the row limit shared "
    "between the racks' demands")}
"""Alarms a row under rlc explains (`harness.demo.checklist.checklist`'s ``explained``): at
full load the racks want more than the row limit, so rlc's leases cap them."""
RLC_USER = "rlc"
"""The MQTT user rlc's orders to racky come from (rlc's default, racky's controller_user)."""


def find_nats_server(choice: str | None = None) -> tuple[str | None, str]:
    """The nats-server binary to run: ``choice`` (a path or name; ``none``: off), else
    `NATS_ENV`, else PATH or ``/usr/sbin``. Returns (path, "") or (None, why not)."""
    choice = choice if choice is not None else os.environ.get(NATS_ENV) or None
    if choice is not None and choice.strip().lower() in ("none", "off", ""):
        return None, "no nats-server wanted (--nats-server none)"
    name = choice or "nats-server"
    path = shutil.which(name) or (f"/usr/sbin/{name}" if "/" not in name and
                                  os.access(f"/usr/sbin/{name}", os.X_OK) else None)
    if path is None:
        if "/" in name:
            return None, f"{name} is not an executable nats-server"
        return None, f"nats-server not found ({name!r} on PATH and in /usr/sbin)"
    return path, ""


def no_rlc_reason(why: str) -> str:
    """The row's coordination line when rlc did not run (``why``), with how to get it."""
    return (f"row without rlc: {why}; install NATS (sudo apt-get install nats-server, or "
            "make servers) and the row runs under rlc: budgets as leases and a validation "
            "campaign")


@dataclass
class RowFleet:
    """NATS, rlc, the campaign and what the demo recorded of them (module docstring)."""

    racks: list[str]
    limit_w: float
    run_dir: Path
    nats_binary: str
    new_rack: str = ""
    nats: ServerProcess | None = None
    url: str = ""
    rlc: Any = None
    rlc_rc: int | None = None
    rlc_status: str = "?"
    fleet_state: dict[str, Any] = field(default_factory=dict)
    campaign_state: dict[str, Any] = field(default_factory=dict)
    committed_log: list[tuple[float, float]] = field(default_factory=list)
    """rlc's Σ committed of the row as ``state/fleet`` showed it: (mono s, W)."""
    leases: list[LeaseSeen] = field(default_factory=list)
    campaign_id: str = ""
    campaign_started_mono: float | None = None
    campaign_rc: int | None = None
    campaign_said: str = ""
    events: list[tuple[float, str]] = field(default_factory=list)
    """(mono s, text): rlc's side of the run, for the live view and the off-terminal lines."""
    wall_minus_mono: float = field(default_factory=lambda: time.time() - time.monotonic())
    _kv: Any = None
    _unsub: list[Any] = field(default_factory=list)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _seen: set[tuple[str, int, int]] = field(default_factory=set)
    _campaign_task: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self.run_dir = self.run_dir.resolve()
        self.new_rack = self.new_rack or self.racks[-1]
        self.campaign_id = f"demo-{self.new_rack}"

    # --- configs -------------------------------------------------------------------------

    def racky_overrides(self, rack: str) -> dict[str, Any]:
        """What racky's demo config gets in fleet mode (sections laid over it; a None value
        removes the key): ``[fleet]`` on the demo's NATS, ``[campaign_gate]``, rlc's role,
        no static budget, and the new rack's lifecycle ``provisioning``."""
        out: dict[str, Any] = {
            "fleet": {"enabled": True, "servers": [self.url], "bucket": BUCKET, "replicas": 1,
                      "floor_w": RACK_FLOOR_W, "read_every_s": 0.5, "report_every_s": 0.5,
                      "request_timeout_s": 0.5},
            "campaign_gate": {"controller_user": RLC_USER, "required_stages": ["rack"]},
            "commands": {"users": {"valvey": "automation", OPERATOR: "operator",
                                   RLC_USER: "operator"}},
            "power": {"budget_w": None},
        }
        if rack == self.new_rack:
            out["lifecycle"] = {"initial_state": "provisioning"}
        return out

    def rlc_config(self, host: str, port: int, protocol: str) -> dict[str, Any]:
        """rlc's config: the row's topology, the demo's NATS (1 replica), short cycles."""
        rack = {"floor_w": RACK_FLOOR_W, "max_w": RACK_MAX_W, "priority": "normal"}
        return {
            "identity": {"site": DEMO_SITE, "row": "fleet", "rack": RLC_RACK},
            "mqtt": {"host": host, "port": port, "protocol": protocol,
                     "reconnect_min_s": 0.2, "reconnect_max_s": 2.0},
            "spool": {"directory": str((self.run_dir / "rlc-spool").resolve())},
            "log": {"format": "json"},
            "control": {"tick_s": 0.5, "state_interval_s": 1.0},
            "fleet": {"servers": [self.url], "bucket": BUCKET, "replicas": 1,
                      "request_timeout_s": 0.5, "cycle_s": 0.5, "unreachable_after_s": 5.0,
                      "reclaim_after_s": 15.0},
            "campaign": {"resend_s": 2.0},
            "commands": {"users": {OPERATOR: "operator"}},
            "topology": {"site": DEMO_SITE, "halls": {"hall1": {
                "feed_limit_w": self.limit_w, "rows": {"row1": {
                    "limit_w": self.limit_w, "ramp_w_per_s": RAMP_W_PER_S,
                    "racks": {r: dict(rack) for r in self.racks}}}}}},
        }

    def plan(self) -> dict[str, Any]:
        """The campaign's plan: the new rack, one short ``rack`` stage."""
        return {"racks": [self.new_rack], "cdu_of": {self.new_rack: f"cdu-{self.new_rack}"},
                "max_racks_per_row": 1, "start_timeout_s": 15.0, "result_grace_s": 30.0,
                "max_attempts": 2,
                "stages": [{"name": "rack", "kind": "rack", "power_w": CAMPAIGN_POWER_W,
                            "phases": [{"kind": "burn_in", "duration_s": CAMPAIGN_STAGE_S}]}]}

    # --- start, run, stop ----------------------------------------------------------------

    async def start(self, host: str, port: int, protocol: str) -> None:
        """NATS (3 tries on a port race), the bucket, rlc.

        Raises:
            RuntimeError: NATS did not start (its log named) or the bucket could not be
                made.
        """
        nats_dir = self.run_dir / "nats"
        (nats_dir / "store").mkdir(parents=True, exist_ok=True)
        for attempt in range(3):
            nport = free_port()
            conf = nats_dir / "nats.conf"
            conf.write_text(f"server_name: demo\nlisten: 127.0.0.1:{nport}\n"
                            f'jetstream {{ store_dir: "{(nats_dir / "store").resolve()}" }}\n')
            srv = ServerProcess([self.nats_binary, "-c", str(conf)], nport,
                                nats_dir / "nats.log")
            try:
                await asyncio.to_thread(srv.start)
            except PortClash:
                if attempt == 2:
                    raise
                continue
            except RuntimeError as err:
                raise RuntimeError(f"nats-server did not start; see {nats_dir / 'nats.log'}"
                                   ) from err
            self.nats, self.url = srv, f"nats://127.0.0.1:{nport}"
            break
        from rackplane.io.nats.kv import KvError, KvUnknown, NatsKv

        try:  # the bucket made here with 1 replica: rlc and racky open it as it is
            self._kv = await NatsKv.connect([self.url], BUCKET, replicas=1,
                                            request_timeout_s=2.0, name="rackctl-demo")
        except (KvError, KvUnknown) as err:
            raise RuntimeError(f"the demo's NATS bucket: {err}") from err
        for r in self.racks:
            self._unsub.append(await self._kv.subscribe_key(
                budget_key(DEMO_SITE, r), lambda v, d, r=r: self._lease(r, v, d)))
        self._tasks.append(asyncio.create_task(self._read_leases(), name="demo-leases"))
        cfg = self.run_dir / "rlc.toml"
        write_toml(cfg, self.rlc_config(host, port, protocol),
                   "rlc: the demo row's power budgets as leases, its validation campaign")
        self.rlc = await spawn([sys.executable, "-m", "rlc", "--config", str(cfg)],
                               self.run_dir / "rlc.log")
        self._event(f"rlc started: row limit {self.limit_w / 1000:.0f} kW over "
                    f"{', '.join(self.racks)} (NATS {self.url}, log {self.run_dir / 'rlc.log'})")

    def _event(self, text: str) -> None:
        self.events.append((time.monotonic(), text))

    def _lease(self, rack: str, value: bytes, deleted: bool) -> None:
        if deleted or not value:
            return
        with contextlib.suppress(ValueError, KeyError, TypeError):
            lease = BudgetLease.from_record(json.loads(value)["lease"])
            key = (rack, lease.epoch, lease.seq)
            if key in self._seen:
                return
            self._seen.add(key)
            prev = next((x for x in reversed(self.leases) if x.rack == rack), None)
            self.leases.append(LeaseSeen(time.monotonic(), rack, lease.value_w, lease.epoch,
                                         lease.seq, lease.issued_at_s, lease.expires_at_s))
            if prev is None or abs(prev.value_w - lease.value_w) >= 5_000.0:
                self._event(f"rlc: {rack} lease {lease.value_w / 1000:.1f} kW (seq "
                            f"{lease.seq})")

    async def _read_leases(self) -> None:
        from rackplane.io.nats.kv import KvError, KvUnknown

        while True:
            for r in self.racks:
                with contextlib.suppress(KvUnknown, KvError, ValueError):
                    got = await self._kv.read(budget_key(DEMO_SITE, r))
                    if got is not None:
                        self._lease(r, got[1], False)
            await asyncio.sleep(LEASE_READ_S)

    def topics(self, root: str) -> list[str]:
        """rlc's topics the demo records (with `on_message`)."""
        base = f"{root}/{DEMO_SITE}/{RLC_RACK}/rlc"
        return [f"{base}/state/fleet", f"{base}/state/campaign", f"{base}/status"]

    def on_message(self, msg: Message) -> None:
        try:
            payload = msg.json() if msg.payload else None
        except ValueError:
            return
        if msg.topic.endswith("/rlc/status"):
            self.rlc_status = str(payload.get("status", payload)) if isinstance(
                payload, dict) else str(payload)
        elif msg.topic.endswith("/state/fleet") and isinstance(payload, dict):
            self.fleet_state = payload
            row = self._row()
            if isinstance(row.get("committed_w"), (int, float)):
                self.committed_log.append((msg.received_mono, float(row["committed_w"])))
        elif msg.topic.endswith("/state/campaign") and isinstance(payload, dict):
            before = self._campaign_word(self.campaign_state)
            self.campaign_state = payload
            now = self._campaign_word(payload)
            if now and now != before:
                self._event(f"campaign {payload.get('campaign_id')}: {now}")

    def _campaign_word(self, st: dict[str, Any]) -> str:
        r = (st.get("racks") or {}).get(self.new_rack)
        if not isinstance(r, dict):
            return ""
        run = f", run {r['run']} {r.get('run_state')}" if r.get("run") else ""
        verdict = f", verdict {r['verdict']}" if r.get("verdict") else ""
        return f"{self.new_rack} {r.get('status')}{run}{verdict}"

    def latest(self) -> dict[str, LeaseSeen]:
        """Each rack's latest lease seen."""
        out: dict[str, LeaseSeen] = {}
        for x in self.leases:
            out[x.rack] = x
        return out

    def _row(self) -> dict[str, Any]:
        """The row in rlc's last ``state/fleet`` (its one row, ``hall1/row1``; {}: none)."""
        rows = self.fleet_state.get("rows")
        row = next(iter(rows.values()), None) if isinstance(rows, dict) else None
        return row if isinstance(row, dict) else {}

    def acked(self) -> list[str]:
        """The racks whose racky acknowledged its lease's value now (rlc's ``state/fleet``:
        the ack of the first lease of the latest value or a later one; a renewal at the same
        value is acknowledged by racky at once, ~1 s before state/fleet shows it)."""
        racks = self._row().get("racks") or {}
        out = []
        for r in self.racks:
            mine = [x for x in self.leases if x.rack == r]
            ack = (racks.get(r) or {}).get("acked")
            if not mine or not isinstance(ack, list) or len(ack) != 2:
                continue
            first = mine[-1]
            for x in reversed(mine):
                if abs(x.value_w - mine[-1].value_w) > 1.0:
                    break
                first = x
            if tuple(ack) >= (first.epoch, first.seq):
                out.append(r)
        return out

    def handed_out(self) -> str | None:
        """None once rlc has handed out the row: every rack's latest lease acknowledged and
        their Σ within 1 % of what the row can give (the lower of its limit and Σ of the
        racks' caps, `RACK_MAX_W`); else what is missing. Leases start at the racks' floors
        and ramp (`RAMP_W_PER_S`): an operator's ``set_budget`` above a rack's grant is
        refused (``beyond_grant``) until then, so the demo announces itself after it."""
        if self.rlc_status != "online":
            return f"rlc {self.rlc_status}"
        unacked = [r for r in self.racks if r not in self.acked()]
        if unacked:
            return "leases not yet acknowledged: " + ", ".join(unacked)
        row_w = min(self.limit_w, RACK_MAX_W * len(self.racks))
        total = sum(x.value_w for x in self.latest().values())
        if total < 0.99 * row_w:
            return f"rlc's leases ramping: {total / 1000:.0f} of {row_w / 1000:.0f} kW"
        return None

    async def tick(self, started_mono: float, rackctl_cfg: Path,
                   recs: dict[str, Recorder]) -> None:
        """Called every loop of the demo: starts the campaign once rlc is online, every
        racky online and every rack's latest lease acknowledged (or after
        `CAMPAIGN_WAIT_S` anyway, saying what was missing), through ``rackctl campaign
        start``."""
        if self.campaign_started_mono is not None or self.rlc is None:
            return
        missing = ([f"rlc {self.rlc_status}"] if self.rlc_status != "online" else []) + [
            f"{r}'s racky {rec.racky_status}" for r, rec in recs.items()
            if rec.racky_status != "online"] + [
            f"{r}'s lease acknowledged" for r in self.racks if r not in self.acked()]
        if missing and time.monotonic() - started_mono < CAMPAIGN_WAIT_S:
            return
        self.campaign_started_mono = time.monotonic()
        if missing:
            self._event(f"starting the campaign after {CAMPAIGN_WAIT_S:g} s without "
                        + ", ".join(missing))
        self._campaign_task = asyncio.create_task(self._start_campaign(rackctl_cfg))

    def campaign_argv(self, plan: Path) -> list[str]:
        """The operator's command (module docstring)."""
        return [sys.executable, "-m", "rackctl", "campaign", "start", str(plan), "--id",
                self.campaign_id, "--rlc-config", str(self.run_dir / "rlc.toml")]

    async def _start_campaign(self, rackctl_cfg: Path) -> None:
        plan = self.run_dir / "campaign.toml"
        write_toml(plan, self.plan(), f"the validation campaign of new rack {self.new_rack}")
        argv = self.campaign_argv(plan)
        self._event(f"operator: rackctl campaign start {plan.name} --id {self.campaign_id} "
                    f"--rlc-config rlc.toml (RACKCTL_CONFIG={rackctl_cfg.name})")
        log = self.run_dir / "campaign-start.log"
        with log.open("ab") as fh:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=fh, stderr=fh,
                env={**os.environ, "RACKCTL_CONFIG": str(self.run_dir / rackctl_cfg.name)})
        try:
            self.campaign_rc = await asyncio.wait_for(proc.wait(), 60)
        except TimeoutError:
            proc.kill()
            self.campaign_rc = await proc.wait()
        said = log.read_text(errors="replace").strip().splitlines()
        self.campaign_said = said[-1] if said else ""
        self._event(f"rackctl campaign start exited {self.campaign_rc}: {self.campaign_said}")

    def gone(self) -> str | None:
        """rlc or NATS exited early (a name), else None."""
        if self.rlc is not None and self.rlc.returncode is not None:
            return "rlc"
        if self.nats is not None and not self.nats.running:
            return "nats-server"
        return None

    async def stop(self) -> None:
        """rlc (SIGTERM, 20 s), the demo's NATS reads, NATS."""
        if self._campaign_task is not None and not self._campaign_task.done():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._campaign_task, 10)
        self.rlc_rc = await terminate(self.rlc, 20)
        for t in self._tasks:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for u in self._unsub:
            with contextlib.suppress(Exception):
                await u()
        if self._kv is not None:
            with contextlib.suppress(Exception):
                await self._kv.close()
        if self.nats is not None:
            await asyncio.to_thread(self.nats.stop)

    # --- what it shows -------------------------------------------------------------------

    def lines(self) -> list[Text]:
        """rlc's state now: leases per rack against the row limit, the campaign."""
        latest = self.latest()
        total = sum(x.value_w for x in latest.values())
        acked = self.acked()
        per = ", ".join(f"{r} {latest[r].value_w / 1000:.1f}" + (
            "" if r in acked else " (ack pending)") if r in latest else f"{r} —"
            for r in self.racks)
        ok = total <= self.limit_w + 1.0 and len(latest) == len(self.racks)
        lease = Text(f"rlc ({self.rlc_status}): leases kW {per}; Σ {total / 1000:.1f} / row "
                     f"limit {self.limit_w / 1000:.0f} kW", style="green" if ok else "yellow")
        word = self._campaign_word(self.campaign_state)
        camp = (f"campaign {self.campaign_id}: {word}" if word else
                f"campaign {self.campaign_id}: "
                + ("not started yet (waits for every rack's acknowledged lease)"
                   if self.campaign_started_mono is None else "started, rlc has not said yet"))
        return [lease, Text(camp, style="green" if "production" in word else "")]

    def check_items(self, recs: dict[str, Recorder], t0_mono: float) -> list[CheckItem]:
        """The row's rlc items (`harness.demo.fleet_check`) from what was recorded."""
        return [campaign_item(self.new_rack, recs[self.new_rack], t0_mono,
                              self.campaign_state, self.campaign_id, RLC_USER),
                lease_sum_item(self.leases, self.racks, self.limit_w, RACK_FLOOR_W,
                               self.wall_minus_mono, t0_mono)]

    def granted_series(self, t0_mono: float) -> list[tuple[float, float]]:
        """Σ of the racks' latest leases after each lease: (row s, W), for the plot."""
        return [(t, w) for t, w in lease_sums(self.leases, self.racks, RACK_FLOOR_W,
                                              self.wall_minus_mono, t0_mono)]

    def coordination(self) -> str:
        latest = self.latest()
        return (f"row under rlc: rlc (the real daemon) on a single-node NATS JetStream "
                f"({self.url}) grants the row's {self.limit_w / 1000:.0f} kW as budget leases "
                f"(each rack floor {RACK_FLOOR_W / 1000:.0f} kW, cap {RACK_MAX_W / 1000:.0f} "
                f"kW; {len(self.leases)} leases recorded; last: "
                + ", ".join(f"{r} {x.value_w / 1000:.1f} kW" for r, x in latest.items())
                + f"); each racky in fleet mode; campaign {self.campaign_id} on new rack "
                f"{self.new_rack} started by rackctl campaign start (exit "
                f"{self.campaign_rc if self.campaign_rc is not None else 'not run'})")

    def as_dict(self, t0_mono: float) -> dict[str, Any]:
        """What the row's summary.json keeps of rlc."""
        return {"nats": self.url, "rlc_exit_code": self.rlc_rc, "new_rack": self.new_rack,
                "campaign_id": self.campaign_id, "campaign_start_exit_code": self.campaign_rc,
                "campaign_start_said": self.campaign_said,
                "campaign": self.campaign_state,
                "leases": [x.as_row(self.wall_minus_mono, t0_mono) for x in self.leases],
                "committed_max_w": max((w for _, w in self.committed_log), default=None)}


async def start_row_fleet(row: Sequence[DemoRack], limit_w: float, run_dir: Path,
                          nats_server: str | None, link: Any, host: str, port: int,
                          protocol: str, console: Console) -> tuple[RowFleet | None, str]:
    """The row under rlc (module docstring) before the racks' daemons start: NATS and rlc
    started, rlc's topics recorded on the demo's ``link``, each rack's racky overrides set.
    Returns (the fleet, "") or, without a nats-server or when NATS does not start, (None,
    `no_rlc_reason`); either is said on the console."""
    binary, why = find_nats_server(nats_server)
    if binary is None:
        said = no_rlc_reason(why)
        console.print(said, markup=False, highlight=False, soft_wrap=True)
        return None, said
    fleet = RowFleet([r.name for r in row], limit_w, run_dir, binary)
    for topic in fleet.topics(link.settings.topic_root):
        link.subscribe(topic, fleet.on_message, qos=0)
    try:
        await fleet.start(host, port, protocol)
    except (RuntimeError, OSError) as err:
        await fleet.stop()
        said = no_rlc_reason(f"NATS did not start ({err})")
        console.print(said, markup=False, highlight=False, soft_wrap=True)
        return None, said
    for r in row:
        r.racky_extra = fleet.racky_overrides(r.name)
        r.explained_alarms = dict(EXPLAINED_ALARMS)
    console.print(f"row under rlc: NATS {fleet.url} (log {run_dir / 'nats' / 'nats.log'}), "
                  f"rlc's log {run_dir / 'rlc.log'}; new rack {fleet.new_rack} starts in "
                  f"provisioning, its campaign {fleet.campaign_id} starts once every rack "
                  "has acknowledged a lease of rlc's", markup=False, highlight=False,
                  soft_wrap=True)
    return fleet, ""
