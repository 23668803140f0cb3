"""Lock-step segments under callgrind, instrumented only between two plant times each.

Started by `harness.callgrind.measure_segments` as ``valgrind --tool=callgrind
--instr-atstart=no ... python -m harness.benchkids.callgrind_segment MARKER_SO OUT_JSON
SEGMENT:FROM_S:TO_S [SEGMENT:FROM_S:TO_S ...]``: interpreter start-up, imports, scenario loading
and each runner's set-up run with callgrind's instrumentation off (at a fraction of the
instrumented slow-down, and once for all segments); the runner's per-tick hook (`run_valvey`'s
``on_tick``, `run_racky`'s ``hook``) switches it on at the first tick at plant time >= FROM_S
and, at the first tick at >= TO_S, dumps the counts (a callgrind output part named after the
segment, which zeroes them) and switches it off. The client requests
(``CALLGRIND_START_INSTRUMENTATION`` + ``CALLGRIND_ZERO_STATS``, ``CALLGRIND_DUMP_STATS_AT``,
``CALLGRIND_STOP_INSTRUMENTATION`` of ``<valgrind/callgrind.h>``) are compiled into the small
shared library MARKER_SO (`harness.callgrind.build_marker`). Each part therefore counts whole
lock-step iterations between its two ticks (plant steps, the daemon's tick, the runner's
bookkeeping), nothing else.

SEGMENT: ``valvey_cdu`` (load-step, model ``cdu``), ``valvey_rack`` (load-step, model
``rack``) or ``racky`` (rising-crc, the whole rack, racky at 1 Hz); the segments run in turn.
OUT_JSON receives ``{on_valgrind, segments: [{segment, on_s, off_s, plant_s, dump, error}]}``:
the plant times of the two switching ticks, the plant seconds the counts cover, the number of
the dump (callgrind writes part N to ``OUT_FILE.N``) and why a segment has no counts; racky's
entry also has ``link_ports``, the ports its link detectors ran on.

Exit status 2 on a usage error.
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path
from typing import Any

SEGMENTS = ("valvey_cdu", "valvey_rack", "racky")


class Switch:
    """Instrumentation on at the first call at ``t_s >= on_s``; at the first at ``t_s >= off_s``
    the counts are dumped (``CALLGRIND_DUMP_STATS_AT(name)``, which also zeroes them) and
    instrumentation goes off. Records the two plant times."""

    def __init__(self, marker: ctypes.CDLL, name: str, on_s: float, off_s: float) -> None:
        self._marker = marker
        self._name = name.encode()
        self.on_at: float | None = None
        self.off_at: float | None = None
        self._on_s, self._off_s = on_s, off_s

    def __call__(self, t_s: float) -> None:
        if self.off_at is not None:
            return
        if self.on_at is None:
            if t_s >= self._on_s - 1e-9:
                self.on_at = t_s
                self._marker.rp_cg_start()
        elif t_s >= self._off_s - 1e-9:
            self._marker.rp_cg_dump_stop(self._name)
            self.off_at = t_s


def run(segment: str, switch: Switch, end_s: float) -> dict[str, Any]:
    """Run ``segment`` to plant time ``end_s`` with ``switch`` called at every tick; returns
    what the run says about itself (racky: ``link_ports``, the ports its detectors ran on)."""
    from sims.scenario import load_scenario

    if segment.startswith("valvey_"):
        from harness.lockstep_valvey.run import run_valvey

        model: Any = segment.removeprefix("valvey_")

        def on_tick(run: Any, core: Any, t_s: float, now: float) -> None:
            switch(t_s)

        run_valvey(load_scenario("load-step"), model=model, duration_s=end_s, on_tick=on_tick)
        return {}
    from harness.lockstep_racky.run import run_racky

    def hook(t_s: float, run: Any, core: Any) -> None:
        switch(t_s)

    res = run_racky(load_scenario("rising-crc"), duration_s=end_s, hook=hook)
    ports = getattr(getattr(res.core, "links", None), "n", None)
    return {"link_ports": ports if isinstance(ports, int) else None}


def main(argv: list[str]) -> int:
    try:
        marker_so, out = argv[0], Path(argv[1])
        specs = [(k, float(a), float(b)) for k, a, b in (x.split(":") for x in argv[2:])]
    except (IndexError, ValueError):
        specs = []
    if not specs or any(k not in SEGMENTS or a >= b for k, a, b in specs):
        print(__doc__, file=sys.stderr)
        return 2
    marker = ctypes.CDLL(marker_so)
    results: list[dict[str, Any]] = []
    dumps = 0
    for key, on_s, off_s in specs:
        switch = Switch(marker, key, on_s, off_s)
        error = None
        about: dict[str, Any] = {}
        try:
            about = run(key, switch, off_s + 2.0)  # past TO_S: the switching tick at TO_S must run
        except Exception as err:  # one failing runner is that segment's reason, not the run's
            error = f"{type(err).__name__}: {err}"
        if switch.on_at is not None and switch.off_at is None:
            marker.rp_cg_dump_stop(b"unfinished")  # keep the next segment's counts clean
        if switch.on_at is not None:
            dumps += 1
        plant_s = None
        if switch.on_at is not None and switch.off_at is not None:
            plant_s = switch.off_at - switch.on_at
        elif error is None:
            error = f"plant time never reached {off_s:g} s"
        results.append({
            "segment": key, "on_s": switch.on_at, "off_s": switch.off_at,
            "plant_s": None if error else plant_s,
            "dump": dumps if switch.on_at is not None else None, "error": error, **about,
        })
    out.write_text(json.dumps({"on_valgrind": bool(marker.rp_cg_running()),
                               "segments": results}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
