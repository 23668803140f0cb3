"""Lock-step runs of racky's tick with the whole virtual rack: no sockets, plant time as the clock.

This is where racky and the simulators meet (DESIGN §2: the daemons never import ``sims``).
Each 1 Hz tick runs the daemon's own `racky.tick.RackyTick` (the daemon's inputs, core step
and effects): the power shelves' readings are served into register words as the shelf face
serves them and decoded by the register-map decoder racky's Modbus adapter uses; the node
agents' ``telemetry/trayNN`` JSON payloads go through racky's message handling and ingest;
the cooling input is valvey's ``state/supply_loop`` payload and the simulator's
``telemetry/plant`` message; the tick's ``set_power_limits`` publishes go through the command
envelope to the simulator's node-agent handler and its replies come back as messages
(`_RackyIO`). The plant advances to the next tick in ``plant_dt_s`` steps (0.1 s: the §4
plant's step; 1 s is allowed for long link-only runs).

Usage::

    r = run_racky("flapping-link")                          # ScenarioRun(model="rack"), fabric on
    r.first_alarm("link_flapping", "gpu07/nic1")            # plant s of the raise
    r = run_racky("training-swings", cfg, fine_trace=True)  # 0.1 s rack power (S2 figures)
    res = run_validation("rack", out_dir=Path("report"))    # burn-in, judged, report written

``rackctl lockstep --daemon racky run SCENARIO | validate --stage rack --out DIR``
(docs/RACKY.md).

Modules, by job: `run` (the lock-step run, `run_racky`), `validation` (burn-in validation and
the command line, `main`), `scenario_report` (the scenario figures and the report's job).
"""

from __future__ import annotations

from harness.lockstep_racky.run import (
    WALL0_NS,
    AlarmRecord,
    RackyLockstepResult,
    _encode_tray,
    _ShelfFace,
    default_config,
    lockstep_config,
    run_racky,
)
from harness.lockstep_racky.scenario_report import (
    FAULT_ALARMS,
    S2_BUDGET_W,
    S2_RAMP_W_PER_S,
    br13_figures,
    fault_coverage,
    fouling_hook,
    overheat_figures,
    racky_scenario_figures,
    s2_figures,
    s7_figures,
    s8_harness_figures,
    s8_lockstep_figures,
    s9_figures,
    s10_figures,
)
from harness.lockstep_racky.validation import burn_in_scenario, main, run_validation

__all__ = [
    "FAULT_ALARMS",
    "S2_BUDGET_W",
    "S2_RAMP_W_PER_S",
    "WALL0_NS",
    "AlarmRecord",
    "RackyLockstepResult",
    "_ShelfFace",
    "_encode_tray",
    "br13_figures",
    "burn_in_scenario",
    "default_config",
    "fault_coverage",
    "fouling_hook",
    "lockstep_config",
    "main",
    "overheat_figures",
    "racky_scenario_figures",
    "run_racky",
    "run_validation",
    "s2_figures",
    "s7_figures",
    "s8_harness_figures",
    "s8_lockstep_figures",
    "s9_figures",
    "s10_figures",
]
