"""Lock-step runs of valvey: its own tick (`valvey.tick.ValveyTick`) stepped together with the
plant, no sockets, fake clock (what the tick is fed and how: `harness.lockstep_valvey.run`).

Modules, by job: `run` (the lock-step run, `run_valvey`), `plant_steps` (honest scoring: the
plant's truth at every step, the physical cap reference), `scoring` (figures of one run),
`scenario_report` (the report's jobs and figure table), `matrix` (the robustness matrix of
issue 21), `ideal` (the ideal controller beside each matrix cell).
"""

from __future__ import annotations

from harness.lockstep_valvey.run import LockstepResult, RackySeam, SimRacky, Trace, run_valvey
from harness.lockstep_valvey.scenario_report import (
    FULL_SEEDS,
    HEALTHY_SEGMENTS,
    MATRIX_QUICK,
    _figures_of,
    _jobs,
    _matrix_figures,
    _run_job,
    plot_run,
    valvey_scenario_figures,
)
from harness.lockstep_valvey.scoring import (
    figures,
    leak_figures,
    median_p90,
    report,
    seeded,
    sensor_figures,
)

__all__ = [
    "FULL_SEEDS",
    "HEALTHY_SEGMENTS",
    "MATRIX_QUICK",
    "LockstepResult",
    "RackySeam",
    "SimRacky",
    "Trace",
    "_figures_of",
    "_jobs",
    "_matrix_figures",
    "_run_job",
    "figures",
    "leak_figures",
    "median_p90",
    "plot_run",
    "report",
    "run_valvey",
    "seeded",
    "sensor_figures",
    "valvey_scenario_figures",
]
