"""The lock-step cost in instructions per plant second, counted by callgrind (issue 21).

Wall time moves with the host (the published 192 s report was 7.3 min on another machine of
the same kind); the number of instructions a lock-step plant second executes does not, to
within the interpreter build. `callgrind_figures` runs a fixed segment of each lock-step runner
(`SEGMENTS`), in turn in one subprocess (`harness.benchkids.callgrind_segment`) under
``valgrind --tool=callgrind --instr-atstart=no``: callgrind's client requests switch
instrumentation on at the segment's first plant time and, at its last, dump the counts as one
output part (``callgrind.out.N``, triggered ``Client Request: <segment>``) and switch it off, so
interpreter start-up, imports and each runner's set-up are not counted (and run once, at a
fraction of the instrumented slow-down). The total of each part is read from the file
(`read_total_ir`: the ``Ir`` column of the ``summary:`` line, or of ``totals:`` when the
summary is zero, as ``callgrind_annotate`` reads it) and divided by the plant seconds between the
two switching ticks, which the child reports from its run. (The at-exit file ``callgrind.out``
holds nothing measured; callgrind 3.19 writes a wrapped-around summary there.)

The client requests are the macros of ``<valgrind/callgrind.h>`` (shipped with valgrind's
Debian package) compiled with ``cc`` into a tiny shared library (`build_marker`, ctypes-loaded
by the child). No valgrind, no ``cc`` or a failing child: the figures are reported not measured
(value None, failed) with the reason, never skipped. ``scripts/ensure-servers --bench``
(``make bench``) installs valgrind and gcc when missing.

The child runs with ``PYTHONHASHSEED=0`` (stable dict and set orders); what remains varies by
up to 1.5 % from run to run (measured on one host: valvey_cdu 0.4 %, valvey_rack 0.7 %, racky
1.5 % over 2-3 runs, quick and full segments).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.figures import Figure, Progress, no_progress

__all__ = ["SEGMENTS", "CallgrindError", "Segment", "build_marker", "callgrind_figures",
           "figure_of", "measure_segments", "read_total_ir", "read_trigger"]

UNIT = "instructions/plant s"


class CallgrindError(RuntimeError):
    """A segment could not be measured; the message is the reason reported in the figure."""


@dataclass(frozen=True)
class Segment:
    """One measured lock-step segment: plant times [``on_s``, ``off_s``) (``quick_*`` in
    quick mode) of runner ``key`` (`harness.benchkids.callgrind_segment.SEGMENTS`), and the
    figure's ceiling in instructions per plant second. ``what`` describes the run; a
    ``{name}`` in it is filled from what the child reports (``link_ports``), ``?`` when
    unknown."""

    key: str
    what: str
    on_s: float
    off_s: float
    quick_on_s: float
    quick_off_s: float
    ceiling: float

    @property
    def name(self) -> str:
        return f"bench.lockstep.{self.key}.instructions_per_plant_s"

    def span(self, quick: bool) -> tuple[float, float]:
        return (self.quick_on_s, self.quick_off_s) if quick else (self.on_s, self.off_s)


# Ceilings: about 1.5x the counts measured on 2026-12-01 (full mode: valvey_cdu 1.16e7,
# valvey_rack 1.99e7, racky 9.24e7 per plant s), so that a 2x regression fails and neither the
# run-to-run scatter nor the quick segments' difference (<= 1.5 %) does.
SEGMENTS: tuple[Segment, ...] = (
    Segment("valvey_cdu", "load-step (S1), model cdu (CDU + rack thermal), plant and valvey's "
            "tick at 10 Hz, the 30 -> 100 % step at 60 s inside", 50.0, 110.0, 55.0, 75.0,
            17.5e6),
    Segment("valvey_rack", "load-step (S1), model rack (the whole virtual rack: workload, node "
            "agents, shelves), plant and valvey's tick at 10 Hz, the step at 60 s inside",
            50.0, 110.0, 55.0, 70.0, 30e6),
    Segment("racky", "rising-crc (S8), the whole rack with its {link_ports} link ports, plant "
            "at 10 Hz, racky's tick at 1 Hz", 10.0, 30.0, 10.0, 13.0, 135e6),
)

_MARKER_C = """\
#include <valgrind/callgrind.h>
int rp_cg_running(void) { return RUNNING_ON_VALGRIND; }
void rp_cg_start(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_ZERO_STATS; }
void rp_cg_dump_stop(const char *name) {
    CALLGRIND_DUMP_STATS_AT(name); CALLGRIND_STOP_INSTRUMENTATION; }
"""


def read_total_ir(path: Path) -> int:
    """Total ``Ir`` (instructions executed) of a callgrind output file.

    As ``callgrind_annotate`` reads it: the header's ``events:`` line gives the column order;
    the total is the ``summary:`` line, or the ``totals:`` line when the summary is missing or
    zero (callgrind 3.19 writes ``summary: 0`` when instrumentation is off at the dump; its
    ``totals:`` line is the sum of the dumped costs and agrees with the ``Collected`` line of
    valgrind's log). A non-zero summary and a totals line that
    disagree are refused. One part only: the parts of a multi-part dump (``path.1``, ..) are
    the segments, each read on its own.

    Raises:
        CallgrindError: no ``events:`` line, no ``Ir`` event, no non-zero summary or totals,
            or disagreeing ones.
        OSError: the file cannot be read.
    """
    events: list[str] | None = None
    summary: list[int] | None = None
    totals: list[int] | None = None
    with path.open(errors="replace") as fh:
        for line in fh:
            if line.startswith("events:"):
                events = line.split(":", 1)[1].split()
            elif line.startswith("summary:"):
                summary = [int(x) for x in line.split(":", 1)[1].split()]
            elif line.startswith("totals:"):
                totals = [int(x) for x in line.split(":", 1)[1].split()]
    if events is None:
        raise CallgrindError(f"{path.name}: no events: line (not a callgrind output?)")
    if "Ir" not in events:
        raise CallgrindError(f"{path.name}: no Ir event in {events}")
    i = events.index("Ir")
    if summary is not None and any(summary) and totals is not None and totals != summary:
        raise CallgrindError(f"{path.name}: totals {totals} disagree with summary {summary}")
    total = summary if summary is not None and any(summary) else totals
    if total is None or not any(total):
        raise CallgrindError(f"{path.name}: no non-zero summary: or totals: line")
    if i >= len(total):
        raise CallgrindError(f"{path.name}: {len(total)} cost columns, Ir is #{i + 1}")
    return total[i]


def build_marker(directory: Path) -> Path:
    """Compile the client-request marker library into ``directory``; returns its path.

    Raises:
        CallgrindError: no ``cc``, or ``<valgrind/callgrind.h>`` missing (compile error).
    """
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise CallgrindError("no C compiler (cc) to build the callgrind client-request marker "
                             "(scripts/ensure-servers --bench installs gcc)")
    src = directory / "rp_cg_marker.c"
    so = directory / "rp_cg_marker.so"
    src.write_text(_MARKER_C)
    r = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(so), str(src)],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise CallgrindError(f"cc could not build the callgrind marker: {r.stderr.strip()[-300:]}")
    return so


@dataclass(frozen=True)
class Measured:
    """Counts of one segment run: instructions, the plant seconds they cover, wall s."""

    ir: int
    plant_s: float
    on_s: float
    off_s: float
    wall_s: float
    out_file: Path
    about: dict[str, Any] = field(default_factory=dict)


def measure_segments(segments: Sequence[Segment], quick: bool, marker: Path, work: Path,
                     valgrind: str, timeout_s: float = 600.0) -> list[Measured | str]:
    """Run ``segments`` in one child under callgrind (output kept in ``work``): per segment its
    counts, or the reason it has none.

    Raises:
        CallgrindError: the child failed or timed out, or ran without valgrind (no segment
            measured).
    """
    out_file = work / "callgrind.out"
    res = work / "callgrind.json"
    log = work / "callgrind.log"
    for p in (out_file, res, *work.glob("callgrind.out.*")):
        p.unlink(missing_ok=True)
    specs = [f"{s.key}:{s.span(quick)[0]!r}:{s.span(quick)[1]!r}" for s in segments]
    argv = [valgrind, "--tool=callgrind", "--instr-atstart=no",
            f"--callgrind-out-file={out_file}", f"--log-file={log}",
            sys.executable, "-m", "harness.benchkids.callgrind_segment", str(marker), str(res),
            *specs]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    t0 = time.monotonic()
    try:
        r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise CallgrindError(f"not done after {timeout_s:.0f} s under callgrind") from None
    wall = time.monotonic() - t0
    if r.returncode != 0 or not res.exists():
        raise CallgrindError(f"the child exited {r.returncode}: "
                             f"{(r.stderr or _tail(log)).strip()[-300:]}")
    info = json.loads(res.read_text())
    if not info.get("on_valgrind"):
        raise CallgrindError("the child did not run under valgrind")
    got: list[Measured | str] = []
    for seg, row in zip(segments, info["segments"], strict=True):
        if row["error"]:
            got.append(f"{seg.key}: {row['error']}")
            continue
        part = Path(f"{out_file}.{row['dump']}")
        try:
            trigger = read_trigger(part)
            if trigger != seg.key:
                raise CallgrindError(f"{part.name} was dumped by {trigger!r}, not {seg.key!r}")
            about = {k: v for k, v in row.items() if k not in _ROW_KEYS}
            got.append(Measured(read_total_ir(part), float(row["plant_s"]), float(row["on_s"]),
                                float(row["off_s"]), wall, part, about))
        except (CallgrindError, OSError, ValueError) as err:
            got.append(f"{seg.key}: {err}")
    return got


_ROW_KEYS = frozenset({"segment", "on_s", "off_s", "plant_s", "dump", "error"})


def read_trigger(path: Path) -> str | None:
    """The name a part was dumped under (``desc: Trigger: Client Request: NAME``), or None."""
    with path.open(errors="replace") as fh:
        for line in fh:
            if line.startswith("desc: Trigger: Client Request:"):
                return line.split(":", 3)[3].strip()
            if line.startswith(("events:", "fn=")):
                break
    return None


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-300:]
    except OSError:
        return ""


def figure_of(seg: Segment, m: Measured) -> Figure:
    """The ``bench.lockstep.<key>.instructions_per_plant_s`` figure of one measured segment."""
    shown = {k: "?" if v is None else (f"{v:,}" if isinstance(v, int) else v)
             for k, v in m.about.items()}
    what = seg.what.format_map(_Unknown(shown))
    return Figure(
        seg.name, m.ir / m.plant_s, UNIT, seg.ceiling, "<=",
        detail=(f"callgrind Ir of plant s {m.on_s:g}-{m.off_s:g} ({m.ir:,} instructions / "
                f"{m.plant_s:g} plant s; summary/totals line of {m.out_file.name}) of "
                f"{what}; instrumentation on only between those ticks (start-up, imports "
                f"and set-up not counted), PYTHONHASHSEED=0; the valgrind child of all "
                f"segments took {m.wall_s:.0f} s wall"),
        extra={"ir": m.ir, "plant_s": m.plant_s, "on_s": m.on_s, "off_s": m.off_s,
               "callgrind_file": m.out_file.name, "valgrind_wall_s": round(m.wall_s, 1),
               **m.about})


class _Unknown(dict[str, Any]):
    """`str.format_map` mapping: a name the child did not report reads ``?``."""

    def __missing__(self, key: str) -> str:
        return "?"


def not_measured(seg: Segment, why: str) -> Figure:
    """A failed figure: ``seg`` not measured, ``why`` in its detail."""
    return Figure(seg.name, None, UNIT, seg.ceiling, "<=",
                  detail=f"not measured: {why}".replace("|", "/")[:400])


def callgrind_figures(work: Path, quick: bool, progress: Progress = no_progress,
                      segments: tuple[Segment, ...] = SEGMENTS,
                      valgrind: str | None = None) -> list[Figure]:
    """One instructions-per-plant-second figure per segment (`SEGMENTS`), all measured in one
    valgrind child (`measure_segments`).

    ``work`` keeps the callgrind output parts (``callgrind_annotate callgrind.out.N`` shows
    where segment N's instructions go; ``callgrind.json`` says which is which). ``valgrind``:
    the binary (default: ``valgrind`` on PATH). Never raises for a measurement problem: that
    segment's figure is not measured, with the reason.
    """
    work.mkdir(parents=True, exist_ok=True)
    vg = valgrind or shutil.which("valgrind")
    if vg is None or not Path(vg).exists():
        why = ("valgrind is not installed (Debian package valgrind; scripts/ensure-servers "
               "--bench, run by make bench, installs it)")
        return [not_measured(s, why) for s in segments]
    try:
        marker = build_marker(work)
    except (CallgrindError, OSError, subprocess.SubprocessError) as err:
        return [not_measured(s, str(err)) for s in segments]
    progress("callgrind", 0.1)
    try:
        got = measure_segments(segments, quick, marker, work, vg)
    except (CallgrindError, OSError, ValueError, KeyError) as err:
        return [not_measured(s, str(err)) for s in segments]
    finally:
        progress("callgrind", 1.0)
    return [figure_of(s, m) if isinstance(m, Measured) else not_measured(s, m)
            for s, m in zip(segments, got, strict=True)]
