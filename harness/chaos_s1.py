"""Kills during an S1 load step, each compared with the same seed without one (issue 15,
item 6): a fresh valvey pair (`harness.chaos.pair`, the short lease `LEASE`) on the simulated
CDU running the short S1 (seed fixed by the scenario) with its load step at `STEP_AT_S`; with
``kill_after_s`` the active is SIGKILLed that long after the step, otherwise nothing happens;
with ``local_only`` no valvey runs at all: the CDU's own local control alone (its fallback
once its heartbeat watchdog ran out, `SHORT_WATCHDOG_S` into the run), the same seed and step.
The figure of a run is the largest |supply − setpoint| (K) from the step to `AFTER_S` after
it, from the CDU's supply temperature sampled every 0.2 s.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from harness.chaos import SHORT_WATCHDOG_S, first_tenure, pair, sample_supply
from harness.daemons import until
from harness.servers import Mosquitto, NatsCluster

__all__ = ["AFTER_S", "STEP_AT_S", "S1Run", "s1_run"]

STEP_AT_S: Final = 40.0
"""The load step's simulated time (s): after the pair's first tenure (10-25 s here)."""
AFTER_S: Final = 60.0
"""How long after the step the supply error is taken (s): the loop's settling after S1."""


@dataclass(frozen=True)
class S1Run:
    """One S1 step run: ``kill_after_s`` (None: no kill), the largest supply error after the
    step (K), the kill's takeover (s; None without a kill), ``local_only``: the CDU's local
    control alone (no valvey)."""

    kill_after_s: float | None
    supply_error_k: float
    takeover_s: float | None
    local_only: bool = False


async def s1_run(tmp: Path, mosquitto: Mosquitto, cluster: NatsCluster,
                 kill_after_s: float | None, *, local_only: bool = False) -> S1Run:
    """One run (module docstring); logs under ``tmp`` (an existing folder).

    Raises:
        AssertionError: the pair did not start, the step did not come within 90 s, the
            standby did not take over within lease + 20 s, or (``local_only``) the CDU was not
            in local control at the step.
    """
    async with pair(tmp, mosquitto, cluster, cdu={"watchdog_timeout_s": SHORT_WATCHDOG_S},
                    cdu_heartbeat_timeout_s=SHORT_WATCHDOG_S, step_at_s=STEP_AT_S,
                    instances="" if local_only else "ab") as pr:
        samples: list[tuple[float, float]] = []
        sampler = asyncio.create_task(sample_supply(pr, samples))
        try:
            if not local_only:
                await first_tenure(pr)
            await until(lambda: pr.sim.run_.t_s >= STEP_AT_S, STEP_AT_S + 90.0,
                        "the S1 load step", *pr.procs.values())
            step_at = time.monotonic()
            assert not local_only or pr.sim.run_.plant.local_control, "CDU not in local control"
            takeover_s = None
            if kill_after_s is not None:
                await asyncio.sleep(kill_after_s)
                e1 = pr.gate.summary()["epoch"]
                active = pr.instance_of(e1)
                standby = "b" if active == "a" else "a"
                killed_at = time.monotonic()
                pr.procs[active].proc.kill()  # type: ignore[union-attr]
                await until(lambda: any((r.epoch or 0) > e1 for r in pr.writes(killed_at)),
                            23.0, "the standby writing with a newer epoch", pr.procs[standby])
                takeover_s = next(r for r in pr.writes(killed_at)
                                  if (r.epoch or 0) > e1).t_mono - killed_at
            await asyncio.sleep(max(0.0, step_at + AFTER_S - time.monotonic()))
        finally:
            sampler.cancel()
        errs = [abs(t - pr.setpoint_c) for s, t in samples if step_at <= s <= step_at + AFTER_S]
        return S1Run(kill_after_s, max(errs), takeover_s, local_only)
