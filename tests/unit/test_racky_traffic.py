"""Issue 22: irregular traffic judged from what the ports show (racky.core.links), never from
the workload figure only the simulator publishes. Agentic patterns (independent bursts per
GPU, variable concurrency, communication spikes) stay quiet; a silent port is found through
them; a stalled GPU is found among peers in a synchronised (collective) phase."""

from __future__ import annotations

import numpy as np

from racky.config import RackyConfig
from racky.core.linkframe import LinkFrame
from racky.core.links import LinkHealth

GPUS, NVL, NIC = 8, 4, 2
PPG = NVL + NIC
KINDS = ("port_silent", "gpu_stalled", "gpu_burst")


class Rack:
    def __init__(self, seed: int = 3) -> None:
        cfg = RackyConfig()
        f = self.frame = LinkFrame.empty(list(cfg.links.counters), GPUS, PPG)
        f.names[:] = [f"gpu{g:02d}/nvl{j}" if j < NVL else f"gpu{g:02d}/nic{j - NVL}"
                      for g in range(GPUS) for j in range(PPG)]
        f.is_nvlink[:] = [j < NVL for _ in range(GPUS) for j in range(PPG)]
        f.link_up[:] = True
        f.counter_seen[:] = True
        f.speed_mb_per_s[:] = np.where(f.is_nvlink, 100_000.0, 50_000.0)
        f.boot_id[:] = 7
        f.gpu_traffic[:] = np.nan  # what a real tray sends: no workload figure
        self.lh = LinkHealth(cfg.links, cfg.traffic, f)
        self.rng = np.random.default_rng(seed)
        self.t = 0.0
        self.raised: dict[str, set[str]] = {k: set() for k in KINDS}

    def tick(self, demand: np.ndarray, silent: tuple[int, ...] = ()) -> None:
        f = self.frame
        self.t += 1.0
        share = np.where(f.is_nvlink, 1.0, 0.5)
        u = np.repeat(demand, PPG) * share * (1.0 + 0.02 * self.rng.standard_normal(GPUS * PPG))
        u = np.clip(u, 0.0, 1.0)
        u[list(silent)] = 0.0
        bps = u * f.speed_mb_per_s * 1e6
        f.tx_bytes_per_s[:] = bps
        f.rx_bytes_per_s[:] = bps
        f.t_mono[:] = self.t
        f.uptime_s[:] = 1e5 + self.t
        st = self.lh.step(self.t, f)
        for k in KINDS:
            self.raised[k].update(st.conditions[k])


def agentic(rng: np.random.Generator, state: np.ndarray) -> np.ndarray:
    """Independent per-GPU bursts: each GPU switches between idle and a random level (variable
    concurrency) every few seconds, with occasional full-rate communication spikes."""
    switch = rng.random(GPUS) < 0.3
    state = np.where(switch, np.where(rng.random(GPUS) < 0.4, 0.0, rng.uniform(0.1, 0.9, GPUS)),
                     state)
    spike = rng.random(GPUS) < 0.05
    return np.where(spike, 1.0, state)


def test_healthy_agentic_bursts_raise_nothing() -> None:
    r = Rack()
    state = np.zeros(GPUS)
    for _ in range(900):
        state = agentic(r.rng, state)
        r.tick(state)
    assert r.raised == {k: set() for k in KINDS}


def test_a_silent_port_is_found_through_agentic_bursts_and_nothing_else_is() -> None:
    r = Rack()
    state = np.zeros(GPUS)
    silent = (2 * PPG + 1, 5 * PPG + NVL + 1)  # gpu02/nvl1, gpu05/nic1
    for i in range(900):
        state = agentic(r.rng, state)
        r.tick(state, silent if i >= 300 else ())
    assert r.raised == {"port_silent": {"gpu02/nvl1", "gpu05/nic1"}, "gpu_stalled": set(),
                        "gpu_burst": set()}


def test_a_gpu_stalled_in_a_collective_phase_and_a_bursting_one_are_found() -> None:
    r = Rack()
    for i in range(120):
        demand = np.full(GPUS, 0.6 if (i // 10) % 2 else 0.3)  # every GPU in phase
        if i >= 40:
            demand[4] = 0.0  # stalled
        if 60 <= i < 100:
            demand[6] = 1.0  # far above its synchronised peers
        r.tick(demand)
    assert r.raised == {"port_silent": set(), "gpu_stalled": {"gpu04"}, "gpu_burst": {"gpu06"}}
