"""Rack IT power profiles: the import path the scenarios and plant tests have always used.

The profiles (``power_w(t_s)`` at plant time ``t_s``, s -> W, deterministic per seed:
`ConstantLoad`, `StepLoad`, `TimelineLoad`, `AgenticBurstLoad`, `TrainingSquareWave`, base
class `LoadProfile`) live in `sims.workloads`, beside the per-GPU workloads built on them, so
that the validators and REFERENCE §4.6's concurrency swell exist once. This module re-exports
them unchanged (same classes, same seeded values); new code may import either path.
"""

from __future__ import annotations

from sims.workloads import (
    NVL72_MAX_POWER_W,
    AgenticBurstLoad,
    ConstantLoad,
    LoadProfile,
    StepLoad,
    TimelineLoad,
    TrainingSquareWave,
)

__all__ = [
    "NVL72_MAX_POWER_W",
    "AgenticBurstLoad",
    "ConstantLoad",
    "LoadProfile",
    "StepLoad",
    "TimelineLoad",
    "TrainingSquareWave",
]
