"""The learned-rate threshold grid (`racky.core.linkrate.RateDesign`, 75 Markov-chain solves with
the defaults: 0.8–1.9 s of one core before racky.core.arlchain, ~0.2 s since) is no longer computed
in racky's tick on the event loop (issue 15: it held the loop long enough to fence a pair's active):
the core needs it only once a link is armed, and racky computes it in a worker thread from its first
tick; the grid is the same whoever computes it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from rackplane.clock import FakeClock
from racky.app import Racky
from racky.config import RackyConfig
from racky.core import linkrate
from racky.core.linkrate import LearnedRateCusum, RateDesign
from racky.core.links import rate_design

WALL0 = 1_800_000_000 * 10**9


def _design(floor: float) -> RateDesign:
    """A design of its own grid (``floor`` picks the key), its grid not computed yet."""
    d = RateDesign(arl0_bins=1e6, floor=floor, cap=2.0, dispersion=1.5, min_bins=10,
                   warmup_bins=20)
    linkrate._GRIDS.pop(d.grid_key, None)
    return d


def test_a_detector_still_learning_never_computes_the_grid() -> None:
    d = _design(0.0517)
    det = LearnedRateCusum(4, d)
    det.restore(np.full(4, np.nan), np.zeros(4))  # a fresh start: nothing persisted
    assert not d.grid_ready
    assert np.all(det.h == d.h_max)
    # armed links (a restored baseline): the grid, and each armed link's own threshold
    det.restore(np.array([0.1, 0.5, np.nan, 1.0]), np.array([50.0, 50.0, 0.0, 5.0]))
    assert d.grid_ready
    armed = np.array([True, True, False, False])
    assert np.all(det.h[~armed] == d.h_max)
    assert np.all((d.h_min <= det.h[armed]) & (det.h[armed] <= d.h_max))


def test_the_grid_is_the_same_whoever_computes_it() -> None:
    d = _design(0.0519)
    twin = RateDesign(arl0_bins=1e6, floor=0.0519, cap=2.0, dispersion=1.5, min_bins=10,
                      warmup_bins=20)
    assert twin.grid_key == d.grid_key and not twin.grid_ready
    d.prepare_grid()
    assert twin.grid_ready  # one grid per key, shared
    direct = linkrate._compute_grid(*d.grid_key)
    for a, b in zip(d._arl_grid(), direct, strict=True):
        assert np.array_equal(a, b)
    l0, phi = np.array([0.06, 0.3, 1.9]), np.array([1.0, 1.2, 1.5])
    assert np.array_equal(d.h_for(l0, phi), twin.h_for(l0, phi))
    assert RateDesign(floor=0.0519).grid_ready  # without arl0_bins there is no grid


@pytest.fixture
def racky(tmp_path: Path) -> Racky:
    cfg = RackyConfig.model_validate({
        "lifecycle": {"state_file": str(tmp_path / "racky-state.json")},
        "spool": {"directory": str(tmp_path / "spool")},
    })
    return Racky(cfg, clock=FakeClock(start_mono=1000.0, start_wall_ns=WALL0))


async def test_racky_computes_the_grid_in_a_worker_thread_not_in_its_tick(
        racky: Racky) -> None:
    design = rate_design(racky.cfg.links)
    assert design.arl0_bins is not None  # the default config sets a per-link target
    linkrate._GRIDS.pop(design.grid_key, None)
    beats = 0

    async def heartbeat() -> None:
        nonlocal beats
        while True:
            await asyncio.sleep(0.005)
            beats += 1

    hb = asyncio.create_task(heartbeat())
    try:
        racky.tick(1000.0)
        # the tick returned without the grid: it was handed to a worker thread
        assert not design.grid_ready
        worker = racky._grid_thread
        assert worker is not None and worker.daemon and design.grid_key in racky._grids_tried
        beats_at_tick = beats
        while worker.is_alive():  # the loop runs on (the test's own wait is off it too)
            await asyncio.to_thread(worker.join, 0.05)
        assert design.grid_ready
        # the loop ran on while the worker computed (on the loop it could not have beaten)
        assert beats > beats_at_tick
        racky.tick(1001.0)  # computed once: nothing handed over again
        assert racky._grid_thread is worker and racky._grids_tried == {design.grid_key}
    finally:
        hb.cancel()
