"""Rack power profiles and per-GPU workloads: what the virtual rack is asked to draw, seeded.

Two layers, one package (`profiles`, `gpu`; they share `common`'s validators and the §4.6
concurrency swell):

**Rack IT power profiles** (`LoadProfile`): ``power_w(t_s)`` at plant time ``t_s`` (s), W, in
``[0, rack_max_power_w]`` (REFERENCE §1.3, §4.5, §4.6, §5 S1/S2). They drive the CDU plant
directly (valvey's lock-step) and, through `RackPowerWorkload`, the rack model.

* `ConstantLoad` — one power.
* `StepLoad` — S1's 30 % → 100 % step (39.6 → 132 kW on an NVL72 rack), optionally back down.
* `TimelineLoad` — piecewise (t_s, power_w) points, held or ramped between points.
* `AgenticBurstLoad` — §4.6 Markov-modulated bursts: lognormal burst/gap dwell times, per-GPU
  state power fractions, a concurrency swell of 5–15 min period.
* `TrainingSquareWave` — synchronous training: compute/communication square wave, 1–10 s.

Every profile is a pure function of time once built (random ones draw their segments lazily
from their own ``numpy.random.Generator(PCG64(seed))`` and keep them, so any query order gives
the same value), and has ``describe()`` for logs.

**Per-GPU workloads** (`Workload`): for plant time ``t_s``,

* ``power_fraction(t_s)`` -> ``numpy`` array of shape ``(gpus,)``: each GPU's power demand as
  a fraction of its TGP (0..1), before the node agent's cap / floor / ramp limits
  (`sims.rack.NodeAgents`) and thermal throttling;
* ``traffic_demand(t_s)`` -> shape ``(gpus,)``: each GPU's offered link traffic as a fraction
  of its link bandwidth (0..1); the link fabric (`sims.fabric.LinkFabric.step`) consumes it.

Queries must not go back in time (a `ValueError` says so); asking twice for the same time
gives the same arrays. Every random draw comes from generators seeded by ``seed`` (one per
inference instance, one for the concurrency swell, one for spikes), and each instance's events
are processed in time order, so the values depend on the seed and the query time only, not
on the step size.

Workloads (REFERENCE §1.3, §4.6; all figures [U] there unless marked):

* `AgenticWorkload` — agentic inference: GPUs grouped into instances (8 GPUs each, one
  tensor-parallel model replica per NVLink group) that alternate prefill/burst (0.85–1.0 of TDP,
  lognormal dwell, median 6 s, σ_ln 0.8) and gaps (median 4 s, σ_ln 0.9) spent in decode
  (0.5–0.7) or tool-wait (0.2–0.45); inside a burst, communication dips (all-reduce, 0.6–0.7,
  ≈30 % below TDP per ProphetStor [S2]) carry the link-traffic bursts; inactive instances idle
  (0.15–0.25). Concurrency (the share of active instances) swells as a raised cosine between
  ``concurrency_min`` and 1 with a 5–15 min period; sudden demand spikes (Poisson,
  ``spike_rate_per_h``) put every instance into prefill at the same instant, a rack step of
  ≈+70 % in one step (the §4.6 "spike" mode), and release it ``spike_duration_s`` later.
* `TrainingWorkload` — synchronous training: every GPU together, compute at 1.0 of TDP and
  communication at 0.65 (traffic high) in a 1–10 s square wave (REFERENCE §1.3 [S], §4.6).
* `IdleWorkload` — every GPU idle at 0.15–0.25 of TDP (per GPU, seeded), almost no traffic.
* `BurnInWorkload` — every GPU at ``fraction`` (1.0) with steady traffic: acceptance burn-in.
* `RackPowerWorkload` — a rack-power profile (`LoadProfile`, W) spread evenly over the GPUs
  through a power → fraction map (the scenario load kinds step/timeline/constant).

`sims.loads` re-exports the profiles under their former import path.
"""

from __future__ import annotations

from sims.workloads.common import NVL72_GPUS, NVL72_MAX_POWER_W
from sims.workloads.gpu import (
    AgenticWorkload,
    BurnInWorkload,
    IdleWorkload,
    RackPowerWorkload,
    TrainingWorkload,
    Workload,
)
from sims.workloads.profiles import (
    AgenticBurstLoad,
    ConstantLoad,
    LoadProfile,
    StepLoad,
    TimelineLoad,
    TrainingSquareWave,
)

__all__ = [
    "NVL72_GPUS",
    "NVL72_MAX_POWER_W",
    "AgenticBurstLoad",
    "AgenticWorkload",
    "BurnInWorkload",
    "ConstantLoad",
    "IdleWorkload",
    "LoadProfile",
    "RackPowerWorkload",
    "StepLoad",
    "TimelineLoad",
    "TrainingSquareWave",
    "TrainingWorkload",
    "Workload",
]
