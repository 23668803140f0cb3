"""``rackctl fleet status``: the row budgets and the racks' budget leases as they stand in the
fleet KV bucket (issue 16; read-only: nothing is written, the bucket is never made).

rlc's config file (``--rlc-config``) names the topology (site → hall → row → rack, the rows'
limits and the racks' floors) and the bucket's connection (``[fleet]``: servers, bucket,
replicas, NATS user and password variable; each overridable by an option). For every rack of
the topology the command reads its budget key (rlc's lease and ledger) and its rack key
(racky's report) once (`rackplane.core.budget_leases`), then prints per row its limit, Σ of
the power its racks draw, Σ of the leases in force and what the racks may draw by rlc's own
rule (`FleetView`), and per rack its lifecycle state, power drawn vs its lease vs its cooling
capacity, its lease (value, epoch/seq, seconds left), the older higher grants not yet
released, its report (demand, budget enforced, ack, age, the floor and agents' safe caps it
states, with rlc's cross-check, `rlc.core.cycle.FLOOR_TOLERANCE_W`), its alarms (count per
severity, the most severe ids) and its controller pair (the active racky instance and its
epoch, or a single instance). A field an older racky does not report shows ``?`` (null in
``--json``). A report older than rlc's ``unreachable_after_s`` + clock margin is marked stale
and its power not summed.

`FleetView` is pure (no I/O; times are arguments). Exit 0 when every row's bound is within its
limit and every key decodes, 1 when one is not (a row over its limit, a record or a status
field that does not decode, a rack without a lease key), 2 for a bad config or option, 3 when
the NATS cluster or the bucket cannot be reached. Alarms and lifecycle states never change
the exit code (the command checks the budgets; ``--json`` carries the alarms for a script
that wants to judge them). The NATS user must be allowed the bucket's ``STREAM.INFO`` and
``STREAM.MSG.GET`` (config/nats/: ``rlc`` is; an operator on rlc's host uses its settings).
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from rackctl import cli
from rackplane.cli import typer_app
from rackplane.core.budget_leases import BudgetLease, RackReport, budget_key, rack_key

__all__ = ["FleetView", "fleet_app", "status"]

fleet_app = typer_app(no_args_is_help=True,
                      help="The fleet tier (rlc): row budgets and budget leases.")
cli.app.add_typer(fleet_app, name="fleet")


def _key(v: Any) -> tuple[int, int] | None:
    """A lease key ``[epoch, seq]`` from a record, None when absent or malformed."""
    if isinstance(v, (list, tuple)) and len(v) == 2 and all(
            isinstance(x, int) and not isinstance(x, bool) for x in v):
        return int(v[0]), int(v[1])
    return None


@dataclass(frozen=True)
class RackPlace:
    """One rack of the topology: its row (``hall/row``), floor (W)."""

    rack: str
    row: str
    floor_w: float


@dataclass
class FleetView:
    """The fleet bucket as read once (module docstring).

    Args:
        site: the topology's site; rows: ``hall/row`` → limit (W); racks: every rack in
        topology order; budgets, reports: rack → (revision, value) of its budget / rack key,
        or None (absent).
    """

    site: str
    rows: dict[str, float]
    racks: list[RackPlace]
    budgets: dict[str, tuple[int, bytes] | None]
    reports: dict[str, tuple[int, bytes] | None]
    stale_after_s: float = math.inf
    """A report older than this (s, by its ``at_s``) is stale: its power is not counted."""

    def rack_summary(self, p: RackPlace, now_wall_s: float) -> dict[str, Any]:
        """One rack's lease and report (W, s; ``now_wall_s`` this host's wall clock, Unix s).

        ``bound_w``: what rlc counts the rack may draw now: the lease's value while in force,
        else the floor, and never below an older higher grant not yet released: neither
        acknowledged (racky's report, or the record's, acknowledges the key that releases it,
        as `rlc.core.leases.is_released` counts it) nor past its expiry (rlc also waits its
        clock margin and the agents' cap TTL after that expiry; this view, without rlc's
        timing, shows such grants in ``unreleased``).
        ``report``: racky's figures (W: demand, enforced budget, read-back, floor, safe caps,
        ``power_w`` drawn now, ``cooling_w`` its cooling carries), ``age_s`` and ``stale``,
        and its status (`report_status`); None without a report.
        ``problems``: ``no_lease`` (no budget key), ``bad_budget`` / ``bad_report`` (a
        record that does not decode), ``bad_status`` (a status field that does not: it
        reads as unknown, `RackReport.refused`), and rlc's cross-checks ``floor_above``,
        ``floor_below``, ``agents_safe_above_floor``.
        """
        from rlc.core.cycle import FLOOR_TOLERANCE_W

        out: dict[str, Any] = {"row": p.row, "floor_w": p.floor_w, "lease": None,
                               "unreleased": [], "report": None, "problems": []}
        probs: list[str] = out["problems"]
        bound = p.floor_w
        unrel: list[tuple[float, float, tuple[int, int] | None]] = []
        acked: tuple[int, int] | None = None
        got = self.budgets.get(p.rack)
        if got is None:
            probs.append("no_lease")
        else:
            try:
                d = json.loads(got[1])
                lease = BudgetLease.from_record(d["lease"])
                ledger = d.get("ledger") or {}
                unrel = [(float(u["value_w"]), float(u["expires_at_s"]),
                          _key(u.get("released_by")))
                         for u in ledger.get("unreleased", [])]
                acked = _key(ledger.get("acked"))
            except (ValueError, TypeError, KeyError, AttributeError):
                probs.append("bad_budget")
            else:
                left = lease.expires_at_s - now_wall_s
                in_force = left > 0
                out["lease"] = {"value_w": lease.value_w, "epoch": lease.epoch,
                                "seq": lease.seq, "expires_in_s": round(left, 1),
                                "in_force": in_force, "revision": got[0]}
                if in_force:
                    bound = max(bound, lease.value_w)
        rep_got = self.reports.get(p.rack)
        rep: RackReport | None = None
        if rep_got is not None:
            try:
                rep = RackReport.from_record(json.loads(rep_got[1]))
            except (ValueError, TypeError):
                probs.append("bad_report")
        rep_acked = rep.acked if rep is not None else None
        ack = max((k for k in (acked, rep_acked) if k is not None), default=None)
        # what rlc counts released: acknowledged by the key that releases it, or expired
        held = [(v, e) for v, e, by in unrel
                if not (ack is not None and by is not None and ack >= by)]
        out["unreleased"] = [{"value_w": v, "expires_in_s": round(e - now_wall_s, 1)}
                             for v, e in held]
        for v, e in held:
            if e > now_wall_s:
                bound = max(bound, v)
        out["bound_w"] = bound
        if rep is not None:  # the report, decoded once above
            age = now_wall_s - rep.at_s
            out["report"] = {"demand_w": rep.demand_w, "budget_w": rep.budget_w,
                             "drawable_w": rep.drawable_w,
                             "acked": None if rep.acked is None else list(rep.acked),
                             "lease_valid": rep.lease_valid,
                             "age_s": round(age, 1), "stale": age > self.stale_after_s,
                             "floor_w": rep.floor_w, "agents_safe_w": rep.agents_safe_w,
                             "power_w": rep.power_w, "cooling_w": rep.cooling_w,
                             **report_status(rep)}
            if rep.refused:
                probs.append("bad_status")
            if rep.floor_w > p.floor_w + FLOOR_TOLERANCE_W:
                probs.append("floor_above")
            elif rep.floor_w < p.floor_w - FLOOR_TOLERANCE_W:
                probs.append("floor_below")
            if rep.agents_safe_w is not None and rep.agents_safe_w > p.floor_w:
                probs.append("agents_safe_above_floor")
        return out

    def summary(self, now_wall_s: float) -> dict[str, Any]:
        """What ``--json`` prints: ``site``, per row ``limit_w``, ``leased_w`` (Σ of the
        leases in force), ``bound_w`` (Σ of the racks' ``bound_w``), ``over_limit``,
        ``power_w`` (Σ of the power its racks report, None unless every rack has a report
        not stale with one: a partial sum would understate), ``power_racks`` (how many
        have) and its racks (`rack_summary`), and ``ok`` (no row over its limit, no problem
        but rlc's ``floor_below``). Alarms never change ``ok``."""
        racks = {p.rack: self.rack_summary(p, now_wall_s) for p in self.racks}
        rows: dict[str, Any] = {}
        for row, limit in self.rows.items():
            mine = {r: s for r, s in racks.items() if s["row"] == row}
            leased = math.fsum(s["lease"]["value_w"] for s in mine.values()
                               if s["lease"] is not None and s["lease"]["in_force"])
            bound = math.fsum(s["bound_w"] for s in mine.values())
            power = [s["report"]["power_w"] for s in mine.values()
                     if s["report"] is not None and not s["report"]["stale"]
                     and s["report"]["power_w"] is not None]
            rows[row] = {"limit_w": limit, "leased_w": leased, "bound_w": bound,
                         "over_limit": bound > limit,
                         "power_w": math.fsum(power) if len(power) == len(mine) else None,
                         "power_racks": len(power), "racks": mine}
        ok = not any(r["over_limit"] for r in rows.values()) and not any(
            p != "floor_below" for s in racks.values() for p in s["problems"])
        return {"site": self.site, "ok": ok, "rows": rows}


def report_status(rep: RackReport) -> dict[str, Any]:
    """A report's status for ``--json``: ``version``; ``lifecycle`` (None: unknown);
    ``alarms`` (`AlarmSummary.as_record` plus ``worst``, the most severe severity
    annunciated or None; None: unknown); ``pair``: ``{"instance", "epoch"}`` of the active
    instance of a racky pair, None otherwise, with ``single_instance`` True when the report
    says it comes from a single racky, None when it cannot say (an older racky, a pair field
    that did not decode)."""
    al = rep.alarms
    knows_pair = rep.version >= 3 and "pair" not in rep.refused
    return {"version": rep.version, "lifecycle": rep.lifecycle,
            "alarms": None if al is None else {**al.as_record(), "worst": al.worst},
            "pair": None if rep.pair is None else rep.pair.as_record(),
            "single_instance": (rep.pair is None) if knows_pair else None}


_SEVERITY_STYLE = {"critical": "bold red", "major": "red", "minor": "yellow", "warning": "cyan"}


def _w(v: Any) -> str:
    return "" if v is None else f"{float(v) / 1000:.1f}"


TABLE_ALARM_IDS = 3
"""The table names at most this many alarm ids per rack (``--json``: all the report has)."""


def _alarms_cell(rep: dict[str, Any]) -> Text:
    """``1 critical, 2 minor: id, id +1`` (and `` (3 shelved)``), the most severe ids first
    (`TABLE_ALARM_IDS`); ``none``; ``?`` unknown."""
    al = rep.get("alarms")
    if al is None:
        return Text("?" if rep else "")
    counts = [f"{n} {k}" for k, n in al["counts"].items() if n]
    text = ", ".join(counts) if counts else "none"
    ids = al["ids"][:TABLE_ALARM_IDS]
    if ids:
        more = sum(al["counts"].values()) - len(ids)
        text += ": " + ", ".join(ids) + (f" +{more}" if more else "")
    if al["shelved"]:
        text += f" ({al['shelved']} shelved)"
    return Text(text, style=_SEVERITY_STYLE.get(al["worst"] or "", ""))


def _pair_cell(rep: dict[str, Any]) -> str:
    if not rep:
        return ""
    if rep["pair"] is not None:
        return f"{rep['pair']['instance']}/{rep['pair']['epoch']}"
    return {True: "single", False: "", None: "?"}[rep["single_instance"]]


def render(summary: dict[str, Any]) -> Group:
    """The tables ``rackctl fleet status`` prints, two per row: the budgets (powers in kW;
    ``e/s``: the lease's epoch/seq, ``left s``: its seconds to expiry) and the racks' status
    (``state``: the lifecycle; ``pair``: the active instance/epoch, or ``single``; the
    alarms). ``?``: a field the rack's racky does not report (an older one)."""
    parts: list[Any] = []
    for row, r in summary["rows"].items():
        style = "bold red" if r["over_limit"] else "bold green"
        n = len(r["racks"])
        power = (f"{_w(r['power_w'])} kW" if r["power_w"] is not None
                 else f"? kW ({r['power_racks']} of {n} racks report)")
        head = Text(f"row {row}: limit {_w(r['limit_w'])} kW, drawing {power}, leases in "
                    f"force {_w(r['leased_w'])} kW, racks may draw {_w(r['bound_w'])} kW"
                    + (" OVER THE LIMIT" if r["over_limit"] else ""), style=style)
        # two tables, each readable in 80 columns: the powers, then the leases' detail
        rack_w = max([4, *(len(k) for k in r["racks"])])
        t = Table(title=head, title_justify="left", caption="powers in kW",
                  caption_justify="left")
        t.add_column("rack", no_wrap=True, min_width=rack_w)
        for col in ("power", "lease", "cooling", "may draw", "demand", "enforced", "floor"):
            t.add_column(col, justify="right", no_wrap=True)
        lt = Table(title=f"row {row}: leases", title_justify="left")
        lt.add_column("rack", no_wrap=True, min_width=rack_w)
        for col in ("e/s", "left s", "unreleased", "acked", "age s"):
            lt.add_column(col, no_wrap=True)
        lt.add_column("problems", overflow="fold", min_width=8)
        st = Table(title=f"row {row}: racks' status", title_justify="left")
        for col in ("rack", "state", "pair"):
            st.add_column(col, overflow="fold")
        st.add_column("alarms", overflow="fold")
        for rack, s in r["racks"].items():
            le, rep = s["lease"], s["report"] or {}
            t.add_row(
                rack, _w(rep.get("power_w")), "" if le is None else _w(le["value_w"]),
                _w(rep.get("cooling_w")), _w(s["bound_w"]),
                _w(rep.get("demand_w")), _w(rep.get("budget_w")), _w(s["floor_w"]))
            lt.add_row(
                rack, "" if le is None else f"{le['epoch']}/{le['seq']}",
                "" if le is None else (str(le["expires_in_s"]) if le["in_force"]
                                       else "expired"),
                ", ".join(_w(u["value_w"]) for u in s["unreleased"]),
                "" if rep.get("acked") is None else "/".join(map(str, rep["acked"])),
                "" if not rep else str(rep["age_s"]) + (" stale" if rep["stale"] else ""),
                Text(", ".join(s["problems"])))
            st.add_row(rack, (rep.get("lifecycle") or "?") if rep else "", _pair_cell(rep),
                       _alarms_cell(rep))
        parts += [t, lt, st]
    return Group(*parts)


def _view_of(cfg: Any) -> FleetView:
    rows: dict[str, float] = {}
    places: list[RackPlace] = []
    for hn, hall in cfg.topology.halls.items():
        for rn, row in hall.rows.items():
            rows[f"{hn}/{rn}"] = row.limit_w
            places += [RackPlace(k, f"{hn}/{rn}", r.floor_w) for k, r in row.racks.items()]
    # rlc holds a rack whose report did not change for unreachable_after_s (+ its margin)
    return FleetView(cfg.topology.site, rows, places, {}, {},
                     cfg.fleet.unreachable_after_s + cfg.leases.clock_margin_s)


@fleet_app.command("status", short_help="Row budgets and budget leases (read-only).")
def status(
    rlc_config: Annotated[Path, typer.Option(
        "--rlc-config", help="rlc's config file: topology and [fleet] connection")],
    servers: Annotated[list[str] | None, typer.Option(
        "--server", help="a NATS server URL (repeat; default: [fleet] servers)")] = None,
    bucket: Annotated[str | None, typer.Option(help="default: [fleet] bucket")] = None,
    username: Annotated[str | None, typer.Option(
        help="NATS user (default: [fleet] username)")] = None,
    password_env: Annotated[str | None, typer.Option(
        help="env var holding the NATS password (default: [fleet] password_env)")] = None,
    timeout: Annotated[float, typer.Option(
        min=0.1, max=30.0, help="seconds per NATS request")] = 2.0,
    json_out: cli.JsonOpt = False,
) -> None:
    """Row budgets and budget leases from the fleet KV bucket (read-only).

    Per row its limit, the power drawn, the leases in force and what its racks may draw; per
    rack its lifecycle, power vs lease vs cooling, its lease (value, epoch/seq, seconds left),
    older grants not yet released, its report (demand, budget enforced, ack, age, floor and
    safe caps), alarms and controller pair. Nothing is written.

    Exit 0 all within limits, 1 a row over its limit or a bad / missing record, 2 bad config,
    3 NATS or the bucket unreachable (alarms never change it).

    \f
    The rules: the module docstring."""
    import os

    from rackplane.errors import ConfigError
    from rackplane.io.nats.errors import KvError, KvUnknown
    from rackplane.io.nats.kv import NatsKv
    from rlc.app import load_rlc_config

    cli.configure_logging("error", "console")
    try:
        cfg = load_rlc_config(rlc_config)
    except ConfigError as err:
        cli._fail(f"settings: {err}", cli.EXIT_USAGE)
    f = cfg.fleet
    pw_env = password_env if password_env is not None else f.password_env
    user = username if username is not None else f.username
    view = _view_of(cfg)
    site = view.site

    async def run() -> None:
        kv = await NatsKv.connect(servers or f.servers, bucket or f.bucket,
                                  replicas=f.replicas, request_timeout_s=timeout,
                                  name="rackctl-fleet", user=user,
                                  password=os.environ.get(pw_env, "") if pw_env else None,
                                  create=False)
        try:
            racks = [p.rack for p in view.racks]
            got = await asyncio.gather(*(kv.read(budget_key(site, r)) for r in racks),
                                       *(kv.read(rack_key(site, r)) for r in racks))
        finally:
            await kv.close()
        view.budgets = dict(zip(racks, got[:len(racks)], strict=True))
        view.reports = dict(zip(racks, got[len(racks):], strict=True))

    try:
        asyncio.run(run())
    except KvError as err:
        cli._fail(f"fleet bucket: {err}", cli.EXIT_NO_BROKER)
    except KvUnknown as err:
        cli._fail(f"NATS: {err}", cli.EXIT_NO_BROKER)
    s = view.summary(time.time())  # wall-clock: lease expiries are Unix times
    if json_out:
        sys.stdout.write(json.dumps(s, ensure_ascii=False) + "\n")
    else:
        Console().print(render(s))
    raise typer.Exit(cli.EXIT_OK if s["ok"] else cli.EXIT_REFUSED)
