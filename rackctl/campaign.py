"""``rackctl campaign start|status|abort|report``: rlc's validation campaigns (issue 17).

The verbs go to rlc (``<root>/<site>/<rack>/rlc/cmd/<user>/<verb>``, as ``rackctl cmd rlc``;
``--rack`` is rlc's identity rack, ``rlc`` by default; roles and audit are rlc's,
docs/COMMANDS.md):

- ``start PLAN --id ID``: the plan file (TOML or JSON: ``.toml``, ``.json``, else sniffed) is
  validated here with rlc's own validator before anything is sent (`load_plan`:
  `rlc.core.campaign_plan.CampaignPlan`, the record-size bound
  `rlc.core.campaign_size.check_record_size`, and with ``--rlc-config`` the topology check
  `rlc.core.campaign_plan.check_plan`): a bad plan is refused locally with the reason, exit 2.
  Then ``campaign_start {campaign_id, plan}``.
- ``status``: ``campaign_status``; per rack its status, stage, latest run and its state, the
  verdict of its result, the stages passed and the quarantine or blocked reason (a table, or
  the reply with ``--json``).
- ``abort --reason TEXT``: ``campaign_abort``.
- ``report --out DIR``: the campaign's Markdown page (``<id>.md``) and, where the data allow,
  a PNG (``<id>-figures.png``: each result's measured fractions of line rate against the
  stage's expected range). Source: with ``--rlc-config``, the record itself, read from the KV
  bucket (``<site>.rlc.campaign``; every run with its results: the PNG needs them); without,
  ``campaign_status``'s reply (the racks and the last 64 runs, no results: no PNG).

Exit codes as ``rackctl cmd``: 0 ok; 1 rlc refused (an error reply: ``invalid_args``,
``campaign_running``, ``no_campaign``, ``not_leader``...) or the broker's ACL refused; 2
usage, settings, a plan refused locally; 3 no broker, no reply in time, NATS unreachable.
``status`` exits 0 with a campaign's status and 1 with none (or an aborted one); ``report``
1 when there is no campaign to report.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from rackctl import cli
from rackctl.options import NO_OPTIONS, Connection, connection_options
from rackplane.cli import typer_app
from rackplane.errors import ConfigError, MqttError

__all__ = ["PlanRefused", "campaign_app", "load_plan", "render_report", "render_status"]

campaign_app = typer_app(no_args_is_help=True,
                         help="rlc's validation campaigns: start, status, abort, report.")
cli.app.add_typer(campaign_app, name="campaign")

RlcRackOpt = typer.Option("--rack", help="rlc's identity rack (topic level) [default: rlc]")
RlcConfigOpt = typer.Option(
    "--rlc-config", help="rlc's config: its topology (the plan is checked against it) and "
    "[fleet]/[campaign] (report: the record is read from the KV bucket)")


_CAMPAIGN_ID = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
"""rlc's ``campaign_start`` ``campaign_id`` (`rlc.commands.CampaignStartArgs`)."""


class PlanRefused(ValueError):
    """A plan file that rlc would refuse (the reason in the message)."""


PLAN_FORMATS = "TOML (.toml) or JSON (.json); another suffix: whichever of the two parses"


def _read_plan_file(path: Path) -> Any:
    """The parsed plan file: TOML if the suffix is ``.toml``, JSON if ``.json``, else
    whichever of JSON or TOML parses (a TOML plan named ``plan.yaml`` was reported as "not
    valid JSON").

    Raises:
        PlanRefused: no such file, a folder, unreadable, not UTF-8, or not in a plan format
            (the accepted formats named).
    """
    import tomllib

    if not path.exists():
        raise PlanRefused(f"plan file not found: {path}")
    if path.is_dir():
        raise PlanRefused(f"{path}: a folder, not a plan file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise PlanRefused(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})"
                          ) from None
    except OSError as err:
        raise PlanRefused(f"plan file not readable: {path}: {err.strerror}") from None
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            return tomllib.loads(text)
        if suffix == ".json":
            return json.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise PlanRefused(f"{path}: not valid TOML: {err}") from None
    except json.JSONDecodeError as err:
        raise PlanRefused(f"{path}: not valid JSON: {err}") from None
    with contextlib.suppress(json.JSONDecodeError):
        return json.loads(text)
    with contextlib.suppress(tomllib.TOMLDecodeError):
        return tomllib.loads(text)
    raise PlanRefused(f"{path}: neither JSON nor TOML (a plan is {PLAN_FORMATS})")


def load_plan(path: Path, topology: Any | None = None,
              max_record_bytes: int | None = None) -> dict[str, Any]:
    """The plan of ``path`` (`_read_plan_file`: TOML or JSON) as the JSON object
    ``campaign_start`` takes, validated as rlc validates it: `CampaignPlan`, the record-size
    bound (``max_record_bytes``, default rlc's), and with ``topology`` (rlc's
    `rlc.core.topology.TopologySettings`) `check_plan`.

    Raises:
        PlanRefused: unreadable file, not TOML / JSON, or a plan rlc would refuse (why).
    """
    from pydantic import ValidationError

    from rlc.core.campaign_plan import CampaignPlan, PlanError, check_plan
    from rlc.core.campaign_size import DEFAULT_MAX_RECORD_BYTES, check_record_size
    from rlc.core.topology import compile_topology

    raw = _read_plan_file(path)
    if not isinstance(raw, dict):
        raise PlanRefused(f"{path}: a plan is a JSON object / TOML table")
    try:
        plan = CampaignPlan.model_validate(raw)
        check_record_size(plan, max_record_bytes or DEFAULT_MAX_RECORD_BYTES)
        if topology is not None:
            check_plan(plan, compile_topology(topology))
    except ValidationError as err:
        raise PlanRefused(f"{path}: {cli._one_line(err)}") from None
    except PlanError as err:
        raise PlanRefused(f"{path}: {err}") from None
    return plan.model_dump(mode="json")


def _rlc_config(path: Path | None) -> Any:
    if path is None:
        return None
    from rlc.app import load_rlc_config

    try:
        return load_rlc_config(path)
    except ConfigError as err:
        cli._fail(f"settings: {err}", cli.EXIT_USAGE)


def _call(settings: Any, verb: str, args: dict[str, Any],
          request_id: str | None) -> dict[str, Any]:
    """Send ``verb`` to rlc, the reply; failures exit as ``rackctl cmd`` does."""
    from rackctl.client import (
        BrokerRefused,
        BrokerUnavailable,
        CommandClient,
        ReplyTimeout,
        validate_request_id,
    )
    from rackplane.io.mqtt import PublishRefused

    if request_id is not None:
        try:
            validate_request_id(request_id)
        except ValueError as err:
            cli._fail(str(err), cli.EXIT_USAGE)

    async def run() -> dict[str, Any]:
        client = CommandClient(settings)
        client.expect_replies_from("rlc")
        async with client:
            return await client.call("rlc", verb, args, request_id=request_id)

    try:
        return asyncio.run(run())
    except BrokerRefused as err:
        cli._fail(str(err), cli.EXIT_USAGE)
    except PublishRefused as err:
        cli._fail(f"{err} (your user may not send this command)", cli.EXIT_REFUSED)
    except (BrokerUnavailable, ReplyTimeout) as err:
        cli._fail(f"{err} (only rlc's leader answers)", cli.EXIT_NO_BROKER)
    except MqttError as err:
        cli._fail(f"MQTT: {err}", cli.EXIT_NO_BROKER)
    except ConfigError as err:
        cli._fail(f"settings: {err}", cli.EXIT_USAGE)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None



def _refused(verb: str, reply: dict[str, Any]) -> None:
    err = reply.get("error") or {}
    cli._fail(f"rlc refused {verb}: {err.get('code', '?')}: {err.get('message', '')}",
              cli.EXIT_REFUSED)


def _t(v: Any) -> Text:
    """The daemon's text as written (never rich markup)."""
    return Text("" if v is None else str(v))


def render_status(st: dict[str, Any]) -> Group:
    """The table ``rackctl campaign status`` prints for ``campaign_status``'s state."""
    cid = st.get("campaign_id")
    if cid is None:
        none = "no campaign" + (f" (pending: {st['pending']})" if st.get("pending") else "")
        return Group(Text(none, style="bold"))
    aborted = st.get("aborted")
    head = Text(f"campaign {cid}" + (f": ABORTED ({aborted})" if aborted else "")
                + (f", pending {st['pending']}" if st.get("pending") else ""),
                style="bold red" if aborted else "bold green")
    t = Table(title=head, title_justify="left")
    for col in ("rack", "status", "stage", "run", "run state", "verdict", "passed",
                "judge epoch", "quarantine / blocked"):
        t.add_column(col, overflow="fold")
    for rack, r in (st.get("racks") or {}).items():
        style = {"quarantined": "red", "blocked": "yellow", "production": "green"}.get(
            r.get("status"), "")
        t.add_row(_t(rack), Text(str(r.get("status")), style=style), _t(r.get("stage")),
                  _t(r.get("run")), _t(r.get("run_state")), _t(r.get("verdict")),
                  _t(", ".join(r.get("passes") or {})), _t(r.get("judge_epoch")),
                  _t(r.get("quarantine") or r.get("blocked")))
    parts: list[Any] = [t]
    if st.get("record_too_large_bytes"):
        parts.append(Text(f"the campaign record ({st['record_too_large_bytes']} bytes) is above "
                          "rlc's campaign.max_record_bytes: nothing is written or sent",
                          style="bold red"))
    return Group(*parts)


@campaign_app.command("start", short_help="Check a plan as rlc does, then start it.")
@connection_options(rack=RlcRackOpt)
def start(
    plan_file: Annotated[Path, typer.Argument(help="the plan (TOML or JSON)")],
    campaign_id: Annotated[str, typer.Option("--id", help="the campaign's name")],
    rlc_config: Annotated[Path | None, RlcConfigOpt] = None,
    request_id: Annotated[str | None, typer.Option(help="reuse an id to retry safely")] = None,
    json_out: cli.JsonOpt = False,
    conn: Connection = NO_OPTIONS,
) -> None:
    """Validate PLAN as rlc does (exit 2 with the reason if it would refuse it), then send
    campaign_start. Exit 0 started, 1 refused by rlc, 2 bad plan or settings, 3 no
    broker or reply."""
    cli.configure_logging("error", "console")
    if not _CAMPAIGN_ID.fullmatch(campaign_id):
        cli._fail(f"--id {campaign_id!r}: 1..64 characters of A-Z a-z 0-9 _ . : -",
                  cli.EXIT_USAGE)
    rcfg = _rlc_config(rlc_config)
    try:
        plan = load_plan(plan_file, None if rcfg is None else rcfg.topology,
                         None if rcfg is None else rcfg.campaign.max_record_bytes)
    except PlanRefused as err:
        cli._fail(f"plan refused: {err}", cli.EXIT_USAGE)
    settings = conn.settings(rack_default="rlc")
    reply = _call(settings, "campaign_start", {"campaign_id": campaign_id, "plan": plan},
                  request_id)
    if json_out:
        sys.stdout.write(json.dumps(reply, ensure_ascii=False) + "\n")
    elif reply.get("ok") is True:
        Console().print(Text(f"campaign {campaign_id} accepted by rlc: "
                             f"{len(plan['racks'])} racks, {len(plan['stages'])} stages "
                             "(`rackctl campaign status`)"), highlight=False)
    if reply.get("ok") is not True:
        if json_out:
            raise typer.Exit(cli.EXIT_REFUSED)
        _refused("campaign_start", reply)


@campaign_app.command("status", short_help="Per rack: stage, run, verdict, quarantine.")
@connection_options(rack=RlcRackOpt)
def status(
    json_out: cli.JsonOpt = False,
    conn: Connection = NO_OPTIONS,
) -> None:
    """Per rack: status, stage, run, verdict, quarantine reason (campaign_status). Exit 0
    a campaign under way or finished, 1 none, aborted or refused, 2/3 as for rackctl cmd."""
    cli.configure_logging("error", "console")
    settings = conn.settings(rack_default="rlc")
    reply = _call(settings, "campaign_status", {}, None)
    if reply.get("ok") is not True:
        if json_out:
            sys.stdout.write(json.dumps(reply, ensure_ascii=False) + "\n")
            raise typer.Exit(cli.EXIT_REFUSED)
        _refused("campaign_status", reply)
    st = reply.get("state") or {}
    if json_out:
        sys.stdout.write(json.dumps(st, ensure_ascii=False) + "\n")
    else:
        Console().print(render_status(st))
    ok = st.get("campaign_id") is not None and not st.get("aborted")
    raise typer.Exit(cli.EXIT_OK if ok else cli.EXIT_REFUSED)


@campaign_app.command("abort", short_help="Abort the campaign under way.")
@connection_options(rack=RlcRackOpt)
def abort(
    reason: Annotated[str, typer.Option("--reason", help="why (logged, audited, recorded)")],
    request_id: Annotated[str | None, typer.Option(help="reuse an id to retry safely")] = None,
    json_out: cli.JsonOpt = False,
    conn: Connection = NO_OPTIONS,
) -> None:
    """Abort the campaign (campaign_abort): running validations aborted, nothing starts.
    Exit 0 accepted, 1 refused (no_campaign...), 2/3 as for rackctl cmd."""
    cli.configure_logging("error", "console")
    if len(reason) > 200:
        cli._fail("--reason: at most 200 characters", cli.EXIT_USAGE)
    settings = conn.settings(rack_default="rlc")
    reply = _call(settings, "campaign_abort", {"reason": reason}, request_id)
    if json_out:
        sys.stdout.write(json.dumps(reply, ensure_ascii=False) + "\n")
    elif reply.get("ok") is True:
        Console().print(Text("abort accepted by rlc (`rackctl campaign status`)"),
                        highlight=False)
    if reply.get("ok") is not True:
        if json_out:
            raise typer.Exit(cli.EXIT_REFUSED)
        _refused("campaign_abort", reply)


# --- the report ------------------------------------------------------------------------------


def _md(v: Any) -> str:
    return "" if v is None else str(v).replace("|", "/").replace("\n", " ")


def render_report(summary: dict[str, Any], plan: dict[str, Any] | None,
                  results: list[dict[str, Any]] | None, png_name: str | None,
                  source: str) -> str:
    """The Markdown page: ``summary`` (`rlc.campaign_driver.campaign_summary` or the status
    reply's state), the plan (None: not in the source), every result (None: none in the
    source; each ``as_record`` with its ``stage``), the PNG's file name (None: no plot)."""
    cid = summary.get("campaign_id")
    lines = [f"# Validation campaign `{cid}`", "", f"Source: {source}.", ""]
    if summary.get("aborted"):
        lines += [f"**Aborted**: {_md(summary['aborted'])}", ""]
    if plan is not None:
        lines += [f"Plan: {len(plan['racks'])} racks, max {plan['max_racks_per_row']} per "
                  f"row, max_attempts {plan['max_attempts']}. Stages:", ""]
        for s in plan["stages"]:
            ph = ", ".join(f"{p['kind']} {p['duration_s']:g} s" for p in s["phases"])
            exp = ", ".join(f"{k} [{v['min']:g}, {v['max']:g}]"
                            for k, v in (s.get("expected") or {}).items())
            lines.append(f"- `{s['name']}` ({s['kind']}, {s['power_w'] / 1000:g} kW per "
                         f"rack): {ph}" + (f"; expected {exp}" if exp else ""))
        lines.append("")
    racks = summary.get("racks") or {}
    counts: dict[str, int] = {}
    for r in racks.values():
        counts[str(r.get("status"))] = counts.get(str(r.get("status")), 0) + 1
    lines += ["Racks: " + (", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
                           or "none"), "",
              "| rack | status | stage | latest run | run state | verdict | stages passed "
              "(run, judge epoch) | quarantine / blocked |", "|---|---|---|---|---|---|---|---|"]
    for rack, r in racks.items():
        passed = "; ".join(f"{s} ({p[0]}, {p[1]})" for s, p in (r.get("passes") or {}).items())
        lines.append(f"| {_md(rack)} | {_md(r.get('status'))} | {_md(r.get('stage'))} | "
                     f"{_md(r.get('run'))} | {_md(r.get('run_state'))} | "
                     f"{_md(r.get('verdict'))} | {_md(passed)} | "
                     f"{_md(r.get('quarantine') or r.get('blocked'))} |")
    lines += ["", "## Runs", "", "| run | stage | racks | state |", "|---|---|---|---|"]
    for rid, run in (summary.get("runs") or {}).items():
        lines.append(f"| {_md(rid)} | {_md(run.get('stage'))} | "
                     f"{_md(', '.join(run.get('racks') or []))} | {_md(run.get('state'))} |")
    if results is not None:
        lines += ["", "## Results (racky's verdicts)", "",
                  "| run | rack | judge epoch | verdict | measured | failed criteria |",
                  "|---|---|---|---|---|---|"]
        for x in results:
            meas = ", ".join(f"{k} {v:.3f}" for k, v in sorted(x["measured"].items()))
            failed = "; ".join(f"{f[0]}: {f[1]} (limit {f[2]})"
                               + (f" on {', '.join(f[3])}" if f[3] else "")
                               for f in x["failed"])
            lines.append(f"| {_md(x['run_id'])} | {_md(x['rack'])} | {x['judge_epoch']} | "
                         f"{'pass' if x['passed'] else 'FAIL'} | {_md(meas)} | "
                         f"{_md(failed)} |")
        if not results:
            lines.append("| (none yet) | | | | | |")
    lines.append("")
    if png_name is not None:
        lines += [f"![measured fractions against the expected ranges]({png_name})", ""]
    elif results is None:
        lines += ["(no plot: the status reply carries no results; `--rlc-config` reads the "
                  "record with them)", ""]
    else:
        lines += ["(no plot: no result with a measured figure, or matplotlib missing)", ""]
    counts_ = summary.get("counts")
    if counts_:
        lines += ["Counters: " + ", ".join(f"{k} {v}" for k, v in counts_.items()), ""]
    return "\n".join(lines)


def _plot(plan: dict[str, Any], results: list[dict[str, Any]], path: Path) -> bool:
    """Per figure (nvlink / backend fraction): each result's value per rack, the stage's
    expected range shaded; False when there is nothing to plot or no matplotlib."""
    pts = [(x["stage"], x["rack"], k, v, x["passed"]) for x in results
           for k, v in x["measured"].items() if math.isfinite(v)]
    if not pts:
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    figs = sorted({p[2] for p in pts})
    racks = list(dict.fromkeys(p[1] for p in pts))
    stages = {s["name"]: s for s in plan["stages"]}
    fig, axes = plt.subplots(len(figs), 1, figsize=(9, 2.6 * len(figs) + 0.6), squeeze=False)
    for ax, name in zip(axes[:, 0], figs, strict=True):
        for k, (st, s) in enumerate(stages.items()):
            rng = (s.get("expected") or {}).get(name)
            if rng is not None:
                ax.axhspan(rng["min"], rng["max"], color=f"C{k}", alpha=0.08,
                           label=f"{st}: expected")
        for k, st in enumerate(stages):
            mine = [p for p in pts if p[0] == st and p[2] == name]
            for passed in (True, False):
                sel = [p for p in mine if p[4] is passed]
                if sel:
                    ax.scatter([racks.index(p[1]) for p in sel], [p[3] for p in sel],
                               color=f"C{k}", marker="o" if passed else "x",
                               label=f"{st}: {'pass' if passed else 'fail'}")
        ax.set_xticks(range(len(racks)), racks, fontsize=7, rotation=45)
        ax.set_ylabel(f"{name}\n(of line rate)", fontsize=8)
        ax.set_ylim(0.0, 1.1)
        ax.legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def write_report(out: Path, summary: dict[str, Any], plan: dict[str, Any] | None,
                 results: list[dict[str, Any]] | None, source: str) -> list[Path]:
    """Write ``<out>/<id>.md`` (and ``<id>-figures.png`` when `_plot` draws); the paths."""
    out.mkdir(parents=True, exist_ok=True)
    cid = str(summary.get("campaign_id"))
    png = out / f"{cid}-figures.png"
    plotted = plan is not None and results is not None and _plot(plan, results, png)
    page = out / f"{cid}.md"
    page.write_text(render_report(summary, plan, results, png.name if plotted else None,
                                  source), encoding="utf-8")
    return [page, png] if plotted else [page]


def _from_kv(rcfg: Any, servers: list[str] | None, timeout: float
             ) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]] | None:
    """(summary, plan, results) from the record in the KV bucket; None: no record."""
    from rackplane.io.nats.errors import KvError, KvUnknown
    from rackplane.io.nats.kv import NatsKv
    from rlc.campaign_driver import campaign_key, campaign_summary
    from rlc.core.campaign_codec import loads
    from rlc.core.topology import compile_topology

    f = rcfg.fleet
    topo = compile_topology(rcfg.topology)

    async def run() -> tuple[int, bytes] | None:
        kv = await NatsKv.connect(servers or f.servers, f.bucket, replicas=f.replicas,
                                  request_timeout_s=timeout, name="rackctl-campaign",
                                  user=f.username, password=f.password(), create=False)
        try:
            return await kv.read(campaign_key(topo.site))
        finally:
            await kv.close()

    try:
        got = asyncio.run(run())
    except (KvError, KvUnknown) as err:
        cli._fail(f"fleet bucket: {err}", cli.EXIT_NO_BROKER)
    if got is None:
        return None
    try:
        c = loads(got[1], topo)
    except ValueError as err:
        cli._fail(f"the campaign record does not decode: {err}", cli.EXIT_REFUSED)
    summary = campaign_summary(c, time.time())  # wall-clock: the record's times are Unix s
    summary["counts"] = {"stale_results": c.stale_results,
                         "unusable_results": c.unusable_results,
                         "compacted_runs": c.compacted_runs, "record_bytes": len(got[1]),
                         "record_revision": got[0]}
    results = [{**res.as_record(), "stage": run.stage} for run in c.runs.values()
               for res in run.results.values()]
    return summary, c.plan.model_dump(mode="json"), results


@campaign_app.command("report", short_help="Write the campaign report (Markdown, PNG).")
@connection_options(rack=RlcRackOpt)
def report(
    out: Annotated[Path, typer.Option("--out", help="folder for the Markdown page and PNG")],
    rlc_config: Annotated[Path | None, RlcConfigOpt] = None,
    server: Annotated[list[str] | None, typer.Option(
        "--server", help="with --rlc-config: a NATS server URL (repeat; default: [fleet] "
        "servers)")] = None,
    nats_timeout: Annotated[float, typer.Option(
        min=0.1, max=30.0, help="with --rlc-config: seconds per NATS request")] = 2.0,
    conn: Connection = NO_OPTIONS,
) -> None:
    """Write the campaign's Markdown (+ PNG with --rlc-config) to --out.
    Exit 0 written, 1 no campaign (or rlc refused), 2 settings, 3 no broker / NATS.

    \f
    What the page holds: the module docstring."""
    cli.configure_logging("error", "console")
    rcfg = _rlc_config(rlc_config)
    if rcfg is not None:
        got = _from_kv(rcfg, server, nats_timeout)
        if got is None:
            cli._fail("no campaign record in the fleet bucket", cli.EXIT_REFUSED)
        summary, plan, results = got
        read_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        source = (f"the record `{rcfg.topology.site}.rlc.campaign` in the KV bucket "
                  f"`{rcfg.fleet.bucket}`, read {read_at}")
        paths = write_report(out, summary, plan, results, source)
    else:
        settings = conn.settings(rack_default="rlc")
        reply = _call(settings, "campaign_status", {}, None)
        if reply.get("ok") is not True:
            _refused("campaign_status", reply)
        st = reply.get("state") or {}
        if st.get("campaign_id") is None:
            cli._fail("rlc has no campaign to report", cli.EXIT_REFUSED)
        paths = write_report(out, st, None, None, "rlc's campaign_status reply")
    for p in paths:
        typer.echo(f"wrote {p}")
