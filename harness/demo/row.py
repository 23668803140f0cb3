"""The demo's row (``rackctl demo --racks N``, N >= 2): the row's power (Σ of each rack's
AC input, racky's ``state/rack_power.rack_input_w``: the power shelves' AC input as racky
reads it) against the row limit, the row's checklist item, its live view, its plot and its
summary. The row limit is on AC input, as rlc's leases are (a row's feed); the racks' DC
output (``rack_power_w``, what racky's budgets cap) is below it by the shelves' losses, so
summing it would flatter the row.

Without rlc (no nats-server) nothing moves the racks' budgets: the row limit is split
evenly into racky budgets (`ROW_LIMIT_PER_RACK_W` each), so the racks' own caps are what
keeps the row under it; under rlc (`harness.demo.fleet`) the budgets are rlc's leases of the
same limit. Either way the row item checks it from the recorded AC inputs, never from the
configuration. (Without rlc the split budgets are racky's, on DC output: a rack held at its
budget draws its share plus the shelves' losses on AC, which the item shows if it happens.)

Time: each rack's records are on its own simulator's plant clock; the row puts them on one
axis, "row time", s since the first rack's plant t = 0 (each rack's plant t = 0 is
estimated from when its plant telemetry arrived, `Recorder.plant_t0_mono`).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from harness.demo.checklist import CheckItem
from harness.demo.procs import RACKY_BUDGET_W
from harness.demo.record import Recorder
from harness.demo.summary import BAND_K, DemoSummary, print_summary, summary_markdown

__all__ = [
    "ROW_LIMIT_PER_RACK_W",
    "ROW_POWER_KEY",
    "ROW_SAMPLE_MAX_AGE_S",
    "ROW_STEP_S",
    "RowSummary",
    "held_at",
    "latest_rack_power_w",
    "print_row_summary",
    "rack_lines",
    "rack_power_series",
    "row_figures",
    "row_line",
    "row_markdown",
    "row_power",
    "row_power_item",
    "row_power_now_w",
    "row_t0",
    "row_view",
    "write_row_plot",
]

ROW_LIMIT_PER_RACK_W = RACKY_BUDGET_W
"""The row limit's share of each rack, W: the row limit is N × this, and each racky's budget
is this (a static split, as a row without rlc has)."""
ROW_POWER_KEY = "rack_input_w"
"""The field of racky's ``state/rack_power`` the row sums: the shelves' AC input, W (the row
limit and rlc's leases are on AC input)."""
ROW_STEP_S = 1.0
"""The row power's time step, s (racky publishes its rack power at 1 Hz)."""
ROW_SAMPLE_MAX_AGE_S = 2.5
"""A rack's last power sample older than this at an instant leaves the instant without a
row power (missing), s."""
MISSING_SHARE_MAX = 0.1
"""The row item is unchecked when more than this share of the instants has no row power
(a rack not heard): "never above" would then be unproven."""


def row_t0(recs: Sequence[Recorder]) -> float | None:
    """Monotonic time of row t = 0: the earliest rack's plant t = 0 (None: no plant seen)."""
    t0s = [r.plant_t0_mono for r in recs if r.plant_t0_mono is not None]
    return min(t0s) if t0s else None


def _row_t(rec: Recorder, t_plant: float, t0: float) -> float:
    return t_plant + (rec.plant_t0_mono or t0) - t0


def rack_power_series(rec: Recorder, t0: float, key: str = ROW_POWER_KEY
                      ) -> list[tuple[float, float]]:
    """racky's rack power samples of one rack on the row's time axis: (row s, W); ``key``:
    the ``state/rack_power`` field (default the AC input, `ROW_POWER_KEY`; samples without
    it are left out)."""
    return [(_row_t(rec, float(r["t_s"]), t0), float(r[key])) for r in rec.rack_power
            if isinstance(r.get(key), (int, float))]


def row_power(series: Sequence[Sequence[tuple[float, float]]], step_s: float = ROW_STEP_S,
              max_age_s: float = ROW_SAMPLE_MAX_AGE_S) -> list[tuple[float, float | None]]:
    """Σ of the racks' power every ``step_s`` from the latest first sample to the earliest
    last one: each rack's last sample at or before the instant (row s, W); None where a
    rack's last sample is older than ``max_age_s`` (or a rack has none: then no instants).
    Each series sorted by time."""
    if not series or any(not s for s in series):
        return []
    start = max(s[0][0] for s in series)
    end = min(s[-1][0] for s in series)
    times = [[t for t, _ in s] for s in series]
    out: list[tuple[float, float | None]] = []
    k = 0
    while start + k * step_s <= end + 1e-9:
        t = start + k * step_s
        k += 1
        total: float | None = 0.0
        for ts, s in zip(times, series, strict=True):
            i = bisect.bisect_right(ts, t + 1e-9) - 1
            if i < 0 or t - ts[i] > max_age_s or total is None:
                total = None
                continue
            total += s[i][1]
        out.append((t, total))
    return out


def held_at(series: Sequence[tuple[float, float]], times: Sequence[float]) -> list[float]:
    """A rack's last sample at or before each of ``times`` (W; 0 before its first)."""
    ts = [t for t, _ in series]
    out = []
    for t in times:
        i = bisect.bisect_right(ts, t + 1e-9) - 1
        out.append(series[i][1] if i >= 0 else 0.0)
    return out


def row_power_item(points: Sequence[tuple[float, float | None]], limit_w: float,
                   n_racks: int) -> CheckItem:
    """"Row power never above the row limit", from `row_power`'s instants of the racks' AC
    input (`ROW_POWER_KEY`: like the row limit and rlc's leases): checked when no instant
    with every rack heard is above ``limit_w`` (W, AC) and at most `MISSING_SHARE_MAX` of
    the instants miss a rack."""
    label = (f"row power (Σ of {n_racks} racks' AC input, from racky) never above the row "
             "limit (AC)")
    heard = [(t, p) for t, p in points if p is not None]
    missing = len(points) - len(heard)
    if not heard:
        return CheckItem(label, False, f"no instant with every rack's power heard "
                                       f"({len(points)} instants)")
    t_max, p_max = max(heard, key=lambda tp: tp[1])
    over = [(t, p) for t, p in heard if p > limit_w]
    seen = (f"peak {p_max / 1000:.1f} kW at row t = {t_max:.0f} s against {limit_w / 1000:.0f} "
            f"kW; {len(heard)} instants ({ROW_STEP_S:g} s apart) with every rack heard, "
            f"{missing} without")
    if over:
        return CheckItem(label, False, f"above the limit at {len(over)} instants, first at row "
                                       f"t = {over[0][0]:.0f} s ({over[0][1] / 1000:.1f} kW); "
                                       f"{seen}")
    if missing > MISSING_SHARE_MAX * len(points):
        return CheckItem(label, False, f"unproven: too many instants without every rack's "
                                       f"power; {seen}")
    return CheckItem(label, True, f"{seen}; margin {(limit_w - p_max) / 1000:.1f} kW")


@dataclass
class RowSummary:
    """The row's run: each rack's `DemoSummary` and the row's power against its limit."""

    racks: list[DemoSummary]
    row_limit_w: float
    budgets_w: dict[str, float]
    """Each racky's budget, W: without rlc the static split (their Σ is the row limit);
    under rlc each rack's last lease (AC input)."""
    row_power_max_w: float | None
    row_power_max_t_s: float | None
    instants: int
    instants_missing: int
    over_limit_instants: int
    checklist: list[dict[str, Any]]
    plot: str | None
    run_dir: str
    coordination: str = ""
    """How the row was coordinated (``row under rlc: ...`` or ``row without rlc: ...`` with
    why)."""
    rlc: dict[str, Any] | None = None
    """rlc's side of the run (`harness.demo.fleet.RowFleet.as_dict`: its leases, the
    campaign); None: the row ran without rlc."""
    row_power: list[tuple[float, float | None]] = field(default_factory=list)
    """(row s, W of AC input) every `ROW_STEP_S`: what the row item and plot were computed
    from."""
    wall_s: float | None = None
    """``rackctl demo``'s wall time from its start to this summary, s (None: not measured)."""
    machine: str = ""
    """The host the run ran on (`harness.machine.machine_line`)."""
    date: str = ""
    """The run's date, UTC (YYYY-MM-DD)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def exit_codes_ok(self) -> bool:
        return all(r.valvey_exit_code in (0, None) for r in self.racks)


def row_figures(points: Sequence[tuple[float, float | None]], limit_w: float
                ) -> dict[str, Any]:
    """`RowSummary`'s row figures from `row_power`'s instants."""
    heard = [(t, p) for t, p in points if p is not None]
    top = max(heard, key=lambda tp: tp[1]) if heard else None
    return {"row_power_max_w": top[1] if top else None,
            "row_power_max_t_s": round(top[0], 1) if top else None,
            "instants": len(points), "instants_missing": len(points) - len(heard),
            "over_limit_instants": sum(1 for _, p in heard if p > limit_w)}


def latest_rack_power_w(rec: Recorder, key: str = ROW_POWER_KEY) -> float | None:
    """racky's last rack power of a rack (``key``: default the AC input), W; None when none,
    or older than `ROW_SAMPLE_MAX_AGE_S` against the rack's latest plant telemetry."""
    rp = rec.rack_power[-1] if rec.rack_power else {}
    w = rp.get(key)
    if not isinstance(w, (int, float)) or not rec.plant:
        return None
    return float(w) if float(rec.plant[-1]["t_s"]) - float(rp["t_s"]) <= ROW_SAMPLE_MAX_AGE_S \
        else None


def row_power_now_w(recs: Sequence[Recorder]) -> float | None:
    """Σ of the racks' `latest_rack_power_w` (AC input), W; None while any rack has none."""
    ws = [latest_rack_power_w(r) for r in recs]
    return None if any(w is None for w in ws) else sum(w for w in ws if w is not None)


def row_line(recs: Sequence[Recorder], limit_w: float,
             note: str = "row without rlc: static racky budgets") -> Text:
    """The row's power against its limit, now (green within, red above or unknown)."""
    total_w = row_power_now_w(recs)
    style = "green" if total_w is not None and total_w <= limit_w else "red"
    return Text(f"row: Σ rack AC input {_kw(total_w)} kW / row limit {limit_w / 1000:.0f} kW"
                f" ({note})", style=style)


def _kw(w: Any) -> str:
    return "—" if not isinstance(w, (int, float)) else f"{w / 1000:.1f}"


def row_view(recs: Sequence[tuple[str, Recorder]], limit_w: float, elapsed: float,
             total: float, broker: str, faults: str, *,
             loads: Mapping[str, str] | None = None, rlc: Sequence[Text] = (),
             rlc_events: Sequence[tuple[float, str]] = ()) -> Group:
    """The live view of a row: a line per rack (with its load pattern when ``loads``, rack ->
    pattern, is given), the row's power against its limit, the latest alarms and actions of
    all racks (row time); with rlc (`harness.demo.fleet`) its lines (leases, campaign) and its
    events ((mono s, text)) among the racks'."""
    tbl = Table(show_header=True, header_style="bold", expand=False, box=box.SIMPLE_HEAD,
                pad_edge=False)
    for col in ("rack", *(("pattern",) if loads else ()), "plant s", "load kW", "err K",
                "valve %", "power/budget kW", "lifecycle", "pump", "daemons"):
        tbl.add_column(col, no_wrap=True)
    alarms = Text("active alarms:")
    for name, rec in recs:
        p = rec.plant[-1] if rec.plant else {}
        lp = rec.loop[-1] if rec.loop else {}
        sp, pv = lp.get("setpoint_c"), lp.get("supply_temp_c")
        err = None if sp is None or pv is None else pv - sp
        rp = rec.rack_power[-1] if rec.rack_power else {}
        lc = (rec.rack.get("lifecycle") or {}).get("state", "—")
        up = rec.valvey_status == "online" and rec.racky_status == "online"
        tbl.add_row(
            name, *((loads.get(name, "—"),) if loads else ()),
            "—" if not p else f"{float(p['t_s']):.0f}",
            _kw(p.get("rack_power_w")),
            Text("—" if err is None else f"{err:+.2f}",
                 style="green" if err is not None and abs(err) <= BAND_K else "yellow"),
            "—" if lp.get("valve_command_pct") is None else f"{lp['valve_command_pct']:.1f}",
            f"{_kw(rp.get('rack_power_w'))}/{_kw(rec.rack.get('budget_w'))}",
            Text(str(lc), style="green" if lc == "production" else "yellow"),
            str(rec.pumps[-1]["duty"]) if rec.pumps else "—",
            Text("online" if up else f"v {rec.valvey_status}, r {rec.racky_status}",
                 style="green" if up else "yellow"))
        alarms.append(f"\n  {name}: ")
        alarms.append(", ".join(sorted(rec.alarms)) or "none",
                      style="red" if rec.alarms else "green")
    t0 = row_t0([r for _, r in recs]) or 0.0
    events = sorted([(_row_t(rec, t, t0), f"{name}: {e}") for name, rec in recs
                     for t, e in rec.events] + [(t - t0, e) for t, e in rlc_events])
    ev = Text("\n".join(f"{t:5.0f} s  {e}" for t, e in events[-10:]) or "none yet")
    return Group(
        Panel(Group(tbl, alarms, row_line([r for _, r in recs], limit_w, *(
            ["row under rlc: budgets as leases"] if rlc else [])), *rlc),
              title=f"rackplane demo: a row of {len(recs)} racks ({broker})",
              subtitle=f"{elapsed:5.0f} / {total:.0f} s"),
        Panel(ev, title="alarms and actions (row time)", subtitle=faults or None),
        Text("Ctrl-C stops early; the summary and plots are written either way.", style="dim"),
    )


def write_row_plot(path: Path, recs: Sequence[tuple[str, Recorder]],
                   faults: Sequence[tuple[str, float, str]], limit_w: float,
                   points: Sequence[tuple[float, float | None]],
                   granted: Sequence[tuple[float, float]] | None = None) -> None:
    """The row at a glance (PNG): each rack's AC input (racky's) and their Σ against the row
    limit, each rack's supply error (valvey's PV − setpoint) with the ±0.5 K band; ``faults``
    (rack, plant s, what) marked on the row's time axis; ``granted``: Σ of rlc's leases
    (row s, W; `harness.demo.fleet`), a step line (None: a row without rlc)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = row_t0([r for _, r in recs]) or 0.0
    fig, ax = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    nan = float("nan")
    for name, rec in recs:
        ax[1].plot([_row_t(rec, r["t_s"], t0) for r in rec.loop],
                   [nan if r.get("supply_temp_c") is None or r.get("setpoint_c") is None
                    else r["supply_temp_c"] - r["setpoint_c"] for r in rec.loop],
                   lw=1, label=name)
    # the racks' power stacked (each rack's held sample at the row's instants): the top of
    # the stack is the row's Σ
    heard = [t for t, p in points if p is not None]
    if heard:
        stacks = [[w / 1000 for w in held_at(rack_power_series(rec, t0), heard)]
                  for _, rec in recs]
        ax[0].stackplot(heard, stacks, labels=[f"{n} AC input (racky)" for n, _ in recs],
                        alpha=0.6)
    if granted:
        ax[0].step([t for t, _ in granted], [w / 1000 for _, w in granted], where="post",
                   color="black", lw=1, label="Σ rlc leases")
    ax[0].axhline(limit_w / 1000, color="tab:red", ls="--", lw=1, label="row limit")
    ax[0].set_ylabel("kW")
    ax[0].legend(loc="center right", fontsize=8)
    ax[1].axhspan(-BAND_K, BAND_K, color="tab:green", alpha=0.12, label="±0.5 K")
    ax[1].set_ylabel("supply error, K")
    ax[1].set_xlabel("row time, s")
    ax[1].legend(loc="upper right", fontsize=8)
    by = dict(recs)
    for name, at_s, what in faults:
        t = _row_t(by[name], at_s, t0)
        for a in ax:
            a.axvline(t, color="tab:purple", ls="--", lw=0.8)
        ax[0].annotate(f"{name}: {what}", (t, 0.02), xycoords=("data", "axes fraction"),
                       fontsize=7, color="tab:purple", rotation=90, va="bottom", ha="right")
    fig.suptitle(f"the row: {len(recs)} racks, Σ AC input against the row limit "
                 f"({limit_w / 1000:.0f} kW; "
                 f"{'under rlc' if granted is not None else 'row without rlc'})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _check_lines(items: Sequence[dict[str, Any]]) -> list[str]:
    return [f"[{'x' if c['ok'] else ' '}] {c['label']}: {c['detail']}" for c in items]


def rack_lines(s: RowSummary) -> list[str]:
    """A line per rack: its load pattern (when known), its checklist items checked, its
    lifecycle, its alarms raised, its processes' exit codes after SIGTERM (valvey, racky,
    the simulator with its tray agent; — not started)."""
    out = []
    for r in s.racks:
        ok = sum(1 for c in r.checklist if c["ok"])
        raised = [a.split(" ")[2] for a in r.alarms_raised if " raised" in a]
        rcs = [r.valvey_exit_code, r.racky.exit_code if r.racky else None,
               r.tray_agent_exit_code]
        v, k, a = ("—" if rc is None else str(rc) for rc in rcs)
        out.append(f"{r.rack}{f' ({r.load})' if r.load else ''}: {ok}/{len(r.checklist)} "
                   f"checklist items checked; lifecycle "
                   f"{r.racky.lifecycle if r.racky else '—'}; alarms raised: "
                   f"{', '.join(raised) or 'none'}; exit codes after SIGTERM: valvey {v}, "
                   f"racky {k}, tray agent {a}")
    return out


def row_markdown(s: RowSummary) -> str:
    """Each rack's summary (Markdown), then the row's."""
    took = (f"; `rackctl demo` took {s.wall_s:.0f} s of wall time from its start to this "
            "summary" if s.wall_s is not None else "")
    head = (f"Row demo, {len(s.racks)} racks ({', '.join(r.rack for r in s.racks)}), run "
            f"{s.date or '?'} on {s.machine or 'an unnamed host'}{took}.\n\n")
    parts = [head] + [f"## rack {r.rack}\n\n{summary_markdown(r)}" for r in s.racks]
    row = [f"## the row ({len(s.racks)} racks)", "", s.coordination, "",
           *[f"- {x}" for x in rack_lines(s)],
           *[f"- {x}" for x in _check_lines(s.checklist)], "",
           f"Row plot: {s.plot or 'not written'}."]
    return "\n".join(parts) + "\n" + "\n".join(row) + "\n"


def print_row_summary(s: RowSummary, console: Console) -> None:
    """Each rack's summary under its name, then the row's lines."""
    for r in s.racks:
        console.rule(f"rack {r.rack}")
        print_summary(r, console)
    console.rule(f"the row: {len(s.racks)} racks")
    console.print(s.coordination, markup=False, highlight=False)
    for line in rack_lines(s):
        console.print(f"  {line}", markup=False, highlight=False)
    for line, c in zip(_check_lines(s.checklist), s.checklist, strict=True):
        console.print(f"  {line}", style=None if c["ok"] else "yellow", markup=False,
                      highlight=False)
    console.print(f"row plot: {s.plot}\nrow summary: {s.run_dir}/summary.json",
                  markup=False, highlight=False)
