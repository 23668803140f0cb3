"""The demo's summary: step figures (a burst rack: its burst figures, `harness.demo.bursts`),
racky's lines, the plot, Markdown and console output.

Every figure is computed from what the run recorded (`harness.demo.record.Recorder`)."""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from harness.demo.bursts import BURST_MAX_K, BURST_RMS_K, is_burst_load, setpoints_at
from harness.demo.procs import DEMO_RACK
from harness.demo.record import Recorder
from sims.metrics import StepMetrics, step_metrics
from sims.scenario import Scenario

__all__ = [
    "BAND_K",
    "DemoSummary",
    "RackySummary",
    "command_lists",
    "count_spooled",
    "load_pattern",
    "print_summary",
    "racky_summary",
    "scoring_windows",
    "summarise",
    "summary_markdown",
    "tray_agent_text",
    "write_plot",
]

BAND_K = 0.5  # REFERENCE §5 S1: back within ±0.5 K


@dataclass
class RackySummary:
    """racky in the run, from its ``state/rack`` and ``state/rack_power`` (W, plant s)."""

    lifecycle: str | None
    """The lifecycle state last published (``provisioning`` for a new rack)."""
    lifecycle_reason: str | None
    rack_power_max_w: float | None
    """Peak of ``state/rack_power.rack_power_w`` (all shelves reporting)."""
    rack_power_samples: int
    shelves_reporting: str | None
    """``<reporting>/<configured>`` in the last rack_power sample."""
    budget_w: float | None
    limit_w: float | None
    limit_source: str | None
    over_limit_s: float
    """Plant seconds of rack_power samples above the limit in force at each (racky's
    ``limit_w`` then, `Recorder.limit_at`; 1 Hz samples)."""
    exit_code: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class DemoSummary:
    scenario: str
    duration_s: float
    steps: list[dict[str, Any]]
    points_spooled: int
    spool_dir: str
    valvey_exit_code: int | None
    alarms_raised: list[str]
    plot: str | None
    trace_csv: str
    run_dir: str
    max_gpu_tj_c: float | None
    control_mode: str = "PI control"
    """What ran, from valvey's own supply_loop state (`control_mode_from_states`)."""
    broker_problem: str | None = None
    """Set when the broker was lost during the run (the figures then miss that time)."""
    ff_source_share: dict[str, float] = field(default_factory=dict)
    """Share (0..1) of valvey's supply_loop states per feedforward source."""
    racky: RackySummary | None = None
    commands: list[str] = field(default_factory=list)
    """Commands operators sent during the run (``<plant s> <user> → <daemon> <verb>``)."""
    commands_accepted: list[str] = field(default_factory=list)
    """Those the daemon accepted (its reply ok): the step figures include their effects."""
    commands_refused: list[str] = field(default_factory=list)
    """Those refused (``... (<error code>)``): no effect on the figures."""
    commands_unanswered: list[str] = field(default_factory=list)
    """Those with no reply seen: whether they acted is unknown."""
    checklist: list[dict[str, Any]] = field(default_factory=list)
    """`harness.demo.checklist.CheckItem` s as dicts (label, ok, detail): what the run showed."""
    rack: str = DEMO_RACK
    """The rack these figures are of (its racky's and valvey's identity)."""
    load: str = ""
    """The rack's load pattern (`load_pattern`: ``load step``, ``agentic bursts``, ...)."""
    bursts: dict[str, Any] | None = None
    """A burst rack's figures (`harness.demo.bursts.burst_figures`); None for other loads."""
    trays: str = ""
    """How the rack's trays reported (`harness.demo.procs.TRAYS_VIA`); empty: not said."""
    tray_agent_exit_code: int | None = None
    """The exit code after SIGTERM of the rack's simulator process, which runs its tray
    agent (``python -m harness.simagent``); None: not started."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def count_spooled(spool_dir: Path) -> int:
    """Lines (points) in the spool's segment files, header comments excluded."""
    n = 0
    for seg in sorted(spool_dir.glob("*.lp")):
        with seg.open("rb") as fh:
            n += sum(1 for line in fh if line.strip() and not line.startswith(b"#"))
    return n


def ff_source_share(loop: list[dict[str, Any]]) -> dict[str, float]:
    """Share of supply_loop states by ``feedforward.source`` (``off`` when disabled)."""
    counts: dict[str, int] = {}
    for r in loop:
        ff = r.get("feedforward")
        src = "off" if not isinstance(ff, dict) or not ff.get("enabled") else str(
            ff.get("source"))
        counts[src] = counts.get(src, 0) + 1
    n = sum(counts.values())
    return {k: round(v / n, 3) for k, v in counts.items()} if n else {}


def racky_summary(rec: Recorder) -> RackySummary | None:
    """racky's lines, or None when racky published nothing."""
    if not rec.rack and not rec.rack_power:
        return None
    lc = rec.rack.get("lifecycle") or {}
    powers = [r["rack_power_w"] for r in rec.rack_power
              if isinstance(r.get("rack_power_w"), (int, float))]
    limit = rec.rack.get("limit_w")
    over = 0  # each sample against the limit in force when it was taken, not the last one
    for r in rec.rack_power:
        p, lim_then = r.get("rack_power_w"), rec.limit_at(float(r["t_s"]))
        if isinstance(p, (int, float)) and lim_then is not None and p > lim_then:
            over += 1
    last = rec.rack_power[-1] if rec.rack_power else {}
    return RackySummary(
        lifecycle=lc.get("state"), lifecycle_reason=lc.get("reason"),
        rack_power_max_w=max(powers) if powers else None, rack_power_samples=len(powers),
        shelves_reporting=(f"{last.get('shelves_reporting')}/{last.get('shelves_configured')}"
                           if last else None),
        budget_w=rec.rack.get("budget_w"), limit_w=limit,
        limit_source=rec.rack.get("limit_source"), over_limit_s=float(over))


LOAD_PATTERNS = {"step": "load step", "timeline": "load timeline", "agentic": "agentic bursts",
                 "training": "training swings", "constant": "constant load", "idle": "idle",
                 "burn_in": "burn-in"}
"""How the demo names a scenario's load kind (the live view, the summary)."""


def load_pattern(sc: Scenario) -> str:
    """The load pattern of ``sc`` in words (`LOAD_PATTERNS`; an unknown kind as itself)."""
    return LOAD_PATTERNS.get(sc.load.kind, sc.load.kind)


def _steps(sc: Scenario) -> list[tuple[str, float, float | None]]:
    """(label, t0, t1) of the disturbances to score, from the scenario's load timeline (none
    for agentic bursts: their figures are `harness.demo.bursts.burst_figures`)."""
    ld = sc.load
    if is_burst_load(sc):
        return []
    if ld.kind == "step" and ld.step_at_s is not None:
        out = [("load step up", ld.step_at_s, ld.back_at_s)]
        if ld.back_at_s is not None:
            out.append(("load step down", ld.back_at_s, None))
        return out
    if ld.kind == "timeline" and ld.points:
        ts = [t for t, _ in ld.points[1:]]
        return [
            (f"load change at {t:g} s", t, nxt) for t, nxt in zip(ts, [*ts[1:], None], strict=True)
        ]
    return [("whole run", 0.0, None)]


def scoring_windows(sc: Scenario) -> list[tuple[str, float, float | None]]:
    """`_steps` with each window cut at the first scripted fault inside it (the step figures
    are the load step's alone, not a fault's)."""
    out = []
    for label, t0, t1 in _steps(sc):
        cuts = [f.at_s for f in sc.faults if f.at_s > t0 and (t1 is None or f.at_s < t1)]
        out.append((label, t0, min(cuts) if cuts else t1))
    return out


def summarise(sc: Scenario, rec: Recorder, end_t: float) -> list[dict[str, Any]]:
    """Step figures from what valvey published (its process variable) and the plant truth,
    each over its `scoring_windows` window."""
    t = [r["t_s"] for r in rec.loop]
    pv = [r.get("supply_temp_c") for r in rec.loop]
    sp = [r.get("setpoint_c") or sc.plant.supply_setpoint_c for r in rec.loop]
    tt = [r["t_s"] for r in rec.plant]
    true = [r["supply_temp_c"] for r in rec.plant]
    true_sp = setpoints_at(t, sp, tt, sc.plant.supply_setpoint_c)
    out = []
    for label, t0, t1 in scoring_windows(sc):
        if t0 > end_t - 5:  # a step in the last seconds has no response to score yet
            continue
        row: dict[str, Any] = {"disturbance": label, "t0_s": t0,
                               "t1_s": min(t1, end_t) if t1 else end_t}
        for name, ts, vals, sps in (
            ("valvey_pv", t, pv, sp),
            ("plant_truth", tt, true, true_sp),
        ):
            try:
                m: StepMetrics | None = step_metrics(ts, vals, sps, t0, t1, BAND_K)
            except ValueError:
                m = None
            row[name] = m.as_dict() if m else None
        out.append(row)
    return out


def write_plot(path: Path, sc: Scenario, rec: Recorder, rack: str | None = None,
               bursts: dict[str, Any] | None = None) -> None:
    """Supply temperature, valve and load (plant truth and racky's rack power) over plant
    time, the scripted faults marked (PNG); ``rack`` named in the title when given; a burst
    rack's window (``bursts``: `harness.demo.bursts.burst_figures`) shaded, its figures on
    the temperature axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    tt = [r["t_s"] for r in rec.plant]
    t = [r["t_s"] for r in rec.loop]
    # the setpoint valvey reported at each state (an operator's set_setpoint moves it), the
    # scenario's until valvey's first state
    sps = [r.get("setpoint_c") or sc.plant.supply_setpoint_c for r in rec.loop]
    if t:
        ax[0].fill_between(t, [s - BAND_K for s in sps], [s + BAND_K for s in sps],
                           step="post", color="tab:green", alpha=0.12, label="±0.5 K")
        ax[0].step(t, sps, where="post", color="k", lw=0.8, label="setpoint")
    else:
        sp = sc.plant.supply_setpoint_c
        ax[0].axhspan(sp - BAND_K, sp + BAND_K, color="tab:green", alpha=0.12, label="±0.5 K")
        ax[0].axhline(sp, color="k", lw=0.8, label="setpoint")
    ax[0].plot(t, [r.get("supply_temp_c") for r in rec.loop], label="supply temp (valvey PV)")
    ax[0].plot(tt, [r["supply_temp_c"] for r in rec.plant], "--", lw=1, label="supply temp (plant)")
    ax[0].set_ylabel("°C")
    ax[0].legend(loc="upper right", fontsize=8)
    ax[1].plot(t, [r.get("valve_command_pct") for r in rec.loop], label="valve command")
    ax[1].plot(tt, [r["valve_position_pct"] for r in rec.plant], "--", lw=1, label="valve position")
    ax[1].set_ylabel("%")
    ax[1].legend(loc="lower right", fontsize=8)
    ax[2].plot(tt, [r["rack_power_w"] / 1000 for r in rec.plant], color="tab:red",
               label="rack load (plant)")
    rp = [(r["t_s"], r["rack_power_w"] / 1000) for r in rec.rack_power
          if isinstance(r.get("rack_power_w"), (int, float))]
    if rp:
        ax[2].plot([x for x, _ in rp], [y for _, y in rp], ".", ms=2, color="tab:blue",
                   label="racky's rack power (shelves)")
    limit = rec.rack.get("limit_w")
    if isinstance(limit, (int, float)):
        ax[2].axhline(limit / 1000, color="k", lw=0.8, ls=":", label="racky's limit")
    for f in sc.faults:  # the scripted faults, named on the top axis
        for a in ax:
            a.axvline(f.at_s, color="tab:purple", ls="--", lw=0.8)
        ax[0].annotate(f"{f.kind} {f.target()}", (f.at_s, 1.0), xycoords=("data", "axes fraction"),
                       fontsize=7, color="tab:purple", rotation=90, va="top", ha="right")
    if bursts and bursts["t1_s"] > bursts["t0_s"]:
        for a in ax:
            a.axvspan(bursts["t0_s"], bursts["t1_s"], color="tab:gray", alpha=0.08)
        ax[0].annotate(_bursts_caption(bursts), (0.01, 0.03), xycoords="axes fraction",
                       fontsize=8, va="bottom")
    ax[2].set_ylabel("kW")
    ax[2].set_xlabel("plant time, s")
    ax[2].legend(loc="lower right", fontsize=8)
    fig.suptitle(f"valvey and racky on rack {rack}:\n{sc.description}" if rack else
                 f"valvey and racky on the virtual rack: {sc.description}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _bursts_caption(b: dict[str, Any]) -> str:
    pv, tr = b.get("valvey_pv"), b.get("plant_truth")
    head = f"bursts scored over t = {b['t0_s']:g}-{b['t1_s']:.0f} s (shaded)"
    if not pv:
        return f"{head}: no valvey state"
    truth = "" if not tr else (f"; plant truth RMS {tr['rms_error_k']:.2f} K, max "
                               f"{tr['max_abs_error_k']:.2f} K")
    return (f"{head}: valvey's PV RMS {pv['rms_error_k']:.2f} K, max |error| "
            f"{pv['max_abs_error_k']:.2f} K{truth}")


def _bursts_cells(b: dict[str, Any]) -> list[str]:
    """A burst rack's row: window, RMS and max |error| (valvey's PV / plant truth), the rack
    load the bursts drew, valve moves."""
    pv, tr, ld, va = b.get("valvey_pv"), b.get("plant_truth"), b.get("load"), b.get("valve")

    def pair(key: str) -> str:
        if not pv:
            return "—"
        return f"{pv[key]:.2f} / {tr[key]:.2f} K" if tr else f"{pv[key]:.2f} / — K"

    window = f"t = {b['t0_s']:g}-{max(b['t1_s'], b['t0_s']):.0f} s" + (
        f" (to the {b['cut_by']})" if b.get("cut_by") else "")
    load = "—" if not ld else (f"{ld['p5_w'] / 1000:.0f}-{ld['p95_w'] / 1000:.0f} kW (max "
                               f"{ld['max_w'] / 1000:.0f}, largest rise "
                               f"{ld['largest_rise_w'] / 1000:.0f} kW)")
    valve = "—" if not va else (f"{va['moves']} in {va['periods']} periods "
                                f"({va['active_fraction']:.0%} active), travel "
                                f"{va['travel_pct']:.0f} % (≈ {va['strokes_per_h']:.0f} "
                                "strokes/h)")
    return [window, pair("rms_error_k"), pair("max_abs_error_k"), load, valve]


_BURSTS_COLUMNS = ("agentic bursts: window", f"RMS error (valvey's PV / plant truth; S2 ≤ "
                  f"{BURST_RMS_K:g} K)", f"max |error| (valvey's PV / plant truth; S2 ≤ "
                  f"{BURST_MAX_K:g} K)", "rack load p5-p95", "valve moves")
"""The columns of a burst rack's row (`_bursts_cells`)."""


def _settle(m: dict[str, Any] | None, never: str) -> str:
    if not m:
        return "—"
    v = m["settling_s"]
    return never if v == 0 else ("not settled" if v is None else f"{v:.0f} s")


def _kw(w: float | None) -> str:
    return "—" if w is None else f"{w / 1000:.1f} kW"


def tray_agent_text(s: DemoSummary) -> str:
    """The tray agent's exit code after SIGTERM: that of the rack's simulator process, which
    runs the agent (``harness.simagent``)."""
    rc = "— (not started)" if s.tray_agent_exit_code is None else s.tray_agent_exit_code
    return f"Tray agent (in the simulator's process) exit code after SIGTERM: {rc}."


def _racky_text(r: RackySummary | None) -> str:
    if r is None:
        return "racky: published nothing in this run."
    lim = "" if r.limit_w is None else f"; its power limit {_kw(r.limit_w)} (from {r.limit_source})"
    return (f"racky: lifecycle {r.lifecycle or '—'}"
            f"{f' ({r.lifecycle_reason})' if r.lifecycle_reason else ''}; rack power from the "
            f"power shelves ({r.shelves_reporting} reporting, {r.rack_power_samples} samples) "
            f"peaked at {_kw(r.rack_power_max_w)} against a budget of {_kw(r.budget_w)}{lim}, "
            f"{r.over_limit_s:g} s above the limit in force at the time; racky's exit code "
            f"after SIGTERM: {r.exit_code}.")


def _ff_text(share: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.0%}" for k, v in sorted(share.items(), key=lambda kv: -kv[1]))


def command_lists(rec: Recorder) -> dict[str, list[str]]:
    """`DemoSummary`'s command fields from the run: all, accepted, refused (with the reply's
    error code) and unanswered, each ``<plant s> <user> → <daemon> <verb>``."""
    out: dict[str, list[str]] = {"commands": [], "commands_accepted": [],
                                 "commands_refused": [], "commands_unanswered": []}
    for (t, daemon, user, verb), (outcome, code) in zip(rec.commands, rec.command_outcomes(),
                                                        strict=True):
        line = f"{t:.0f} s {user} → {daemon} {verb}"
        out["commands"].append(line)
        out[f"commands_{outcome}"].append(f"{line} ({code})" if outcome == "refused" and code
                                          else line)
    return out


def _named(lines: list[str], most: int = 12) -> str:
    return ", ".join(lines[:most]) + (f" and {len(lines) - most} more"
                                      if len(lines) > most else "")


def _commands_text(s: DemoSummary) -> str:
    """Operators' commands, accepted and refused apart; the figures include the effects of
    the accepted ones only."""
    acc, ref, una = s.commands_accepted, s.commands_refused, s.commands_unanswered
    parts = [f"{len(acc)} accepted" + (f": {_named(acc)}" if acc else ""),
             f"{len(ref)} refused" + (f": {_named(ref)}" if ref else "")]
    if una:
        parts.append(f"{len(una)} with no reply seen: {_named(una)}")
    if acc:
        effect = (f"the figures above include the effects of the {len(acc)} accepted only (they "
                  "are not the load steps' alone)")
    elif una:
        effect = "none was accepted; whether the unanswered ones acted is unknown"
    else:
        effect = "none was accepted: the figures above include no command's effect"
    return (f"operator commands during the run ({len(s.commands)}): {'; '.join(parts)}; "
            f"{effect}")


def _check_line(c: dict[str, Any]) -> str:
    return f"[{'x' if c['ok'] else ' '}] {c['label']}: {c['detail']}"


def summary_markdown(s: DemoSummary) -> str:
    """The summary as a Markdown table (pasted verbatim into the README)."""
    import platform

    lines = [
        f"`rackctl demo` ({s.scenario}, {s.duration_s:g} s of plant time, {s.control_mode}, real "
        f"time over Modbus TCP and MQTT; {platform.system()} {platform.machine()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d')}{f'; {s.trays}' if s.trays else ''}):",
        "",
    ]
    if s.bursts is not None:
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in _BURSTS_COLUMNS) + " |",
                  "|---|---|---|---|---|",
                  "| " + " | ".join(_bursts_cells(s.bursts)) + " |"]
    if s.steps or s.bursts is None:
        lines += ["| disturbance | max \\|error\\| (valvey's PV) | back within ±0.5 K after | "
                  "max \\|error\\| (plant truth) |", "|---|---|---|---|"]
    for st in s.steps:
        pv, tr = st.get("valvey_pv"), st.get("plant_truth")
        if not (pv and tr):
            lines.append(f"| {st['disturbance']} | — | — | — |")
            continue
        lines.append(
            f"| {st['disturbance']} at t = {st['t0_s']:g} s (scored to {st['t1_s']:.0f} s) | "
            f"{pv['max_abs_error_k']:.2f} K | "
            f"{_settle(pv, 'never left ±0.5 K')} | {tr['max_abs_error_k']:.2f} K |"
        )
    if s.checklist:
        lines += ["", "What the run showed (each item checked from its data):", ""]
        lines += [f"- {_check_line(c)}" for c in s.checklist]
    if s.commands:
        lines += ["", _commands_text(s)]
    lines += [
        "",
        f"Feedforward source over valvey's states: {_ff_text(s.ff_source_share) or '—'}. "
        f"Points spooled: {s.points_spooled} lines of line protocol in the run's `spool/` "
        f"folder (the embedded store). Hottest GPU junction: "
        f"{'—' if s.max_gpu_tj_c is None else f'{s.max_gpu_tj_c:.1f} °C'}. "
        f"Alarms: {', '.join(s.alarms_raised) or 'none'}. "
        f"valvey's exit code after SIGTERM: {s.valvey_exit_code}. {tray_agent_text(s)}",
        "",
        _racky_text(s.racky),
    ]
    return "\n".join(lines) + "\n"


def _print_bursts(s: DemoSummary, console: Console) -> None:
    """A burst rack's figures: the errors (valvey's PV and plant truth) in a table, the rack
    load and the valve moves under it."""
    assert s.bursts is not None
    window, _, _, load, valve = _bursts_cells(s.bursts)
    pv, tr = s.bursts.get("valvey_pv"), s.bursts.get("plant_truth")
    t = Table(title=f"demo summary: {s.scenario}, {s.duration_s:g} s of plant time")
    for col in (f"agentic bursts, {window}", "valvey's PV", "plant truth"):
        t.add_column(col)
    for label, key in ((f"RMS error (S2 ≤ {BURST_RMS_K:g} K)", "rms_error_k"),
                       (f"max |error| (S2 ≤ {BURST_MAX_K:g} K)", "max_abs_error_k")):
        t.add_row(label, f"{pv[key]:.2f} K" if pv else "—", f"{tr[key]:.2f} K" if tr else "—")
    console.print(t)
    console.print(f"rack load over the window (plant truth, p5-p95): {load}; valve moves "
                  f"(valvey's command): {valve}", markup=False, highlight=False, soft_wrap=True)


def print_summary(s: DemoSummary, console: Console) -> None:
    """The end-of-run summary, every figure computed from the run."""
    if s.broker_problem:
        console.print(f"broker: {s.broker_problem} (during the run; the figures below miss "
                      "what did not arrive)", style="red", markup=False, highlight=False)
    if s.bursts is not None:
        _print_bursts(s, console)
    elif not s.steps:
        console.print(
            f"No load step fell inside this {s.duration_s:g} s run, so there is no step "
            "response to score; run longer (the demo's scenario steps at t = 40 s: "
            "`make demo DURATION=60`).", markup=False, highlight=False,
        )
    t = Table(title=f"demo summary: {s.scenario}, {s.duration_s:g} s of plant time")
    for col in (
        "disturbance",
        "max |error| (valvey PV)",
        "settling to ±0.5 K",
        "max |error| (plant truth)",
    ):
        t.add_column(col)
    for st in s.steps:
        pv, tr = st.get("valvey_pv"), st.get("plant_truth")
        t.add_row(
            f"{st['disturbance']} (t={st['t0_s']:g} s, scored to {st['t1_s']:.0f} s)",
            f"{pv['max_abs_error_k']:.2f} K" if pv else "—",
            _settle(pv, "never left the band"),
            f"{tr['max_abs_error_k']:.2f} K" if tr else "—",
        )
    if s.steps or s.bursts is None:
        console.print(t)

    def say(text: str) -> None:
        console.print(text, markup=False, highlight=False)

    if s.checklist:
        say("checklist (each item checked from the run's data):")
        for c in s.checklist:
            console.print(f"  {_check_line(c)}", style=None if c["ok"] else "yellow",
                          markup=False, highlight=False)
    if s.commands:
        say(_commands_text(s))

    say(f"points spooled: {s.points_spooled} lines of line protocol in {s.spool_dir} "
        "(the embedded store; `rackctl replay` sends them to an InfluxDB)")
    if s.max_gpu_tj_c is not None:
        say(f"hottest GPU junction: {s.max_gpu_tj_c:.1f} °C")
    say(f"control: {s.control_mode}")
    if s.trays:
        say(f"trays: {s.trays}")
    say(f"feedforward source over valvey's states: {_ff_text(s.ff_source_share) or '—'}")
    say(f"alarms: {', '.join(s.alarms_raised) or 'none'}")
    say(f"valvey exit code after SIGTERM: {s.valvey_exit_code}")
    say(tray_agent_text(s))
    say(_racky_text(s.racky))
    say(f"plot: {s.plot}\ntrace: {s.trace_csv}\nlogs and config: {s.run_dir}")
