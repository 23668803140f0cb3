"""Healthy loads raise no overheating: racky's thermal detection on the bundled healthy
scenarios (agentic bursts, a flapping link under a healthy load) in lock-step with the rack
simulator. A load burst lifts the junctions by their plates' time constants; only a GPU whose
predicted steady state (with its learned τ) is beyond its margin is overheating.

Failed before the plate-τ fit's R² gate: one poorly fitting window (the load wandering within
the flat band) learned τ ≈ 28-55 s on a ≈ 4 s plate, and the prediction Tj + τ·dTj/dt then
raised tray_overheat at a 15 K margin (flapping-link t = 112 s) and a protective cap
("power_capped ... from tray protection")."""

from __future__ import annotations

import numpy as np
import pytest

from harness.lockstep_racky import run_racky
from sims.cdu.params import RackParams


@pytest.mark.parametrize(("scenario", "duration_s"),
                         [("flapping-link", 400.0), ("agentic-bursts", 600.0)])
def test_healthy_load_raises_no_overheat_and_no_protective_cap(scenario: str,
                                                               duration_s: float) -> None:
    run = run_racky(scenario, plant_dt_s=1.0, duration_s=duration_s)
    hot = [a.message for a in run.raised()
           if a.id.startswith(("tray_overheat", "rack_overheat", "gpu_slowdown"))]
    assert hot == []
    capped = [a.message for a in run.raised("power_capped") if "tray protection" in a.message]
    assert capped == []
    # the τ learned is the simulated plate's C/G at design flow (≈ 4 s), not a drift's
    rp = RackParams()
    plate_tau_s = rp.gpu_plate_heat_capacity_j_per_k / (
        rp.gpu_plate_conductance_w_per_k + rp.gpu_plate_min_conductance_w_per_k)
    plate = run.core.thermal.plate
    assert plate.learned.any()
    tau = plate.tau_s[plate.learned]
    assert float(np.median(tau)) == pytest.approx(plate_tau_s, rel=0.2)
    assert 0.5 * plate_tau_s <= float(tau.min()) and float(tau.max()) <= 2.0 * plate_tau_s
