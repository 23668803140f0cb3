"""`MultiRack`: N virtual racks (each `sims.row.VirtualRack` with its own `LinkFabric` and
CDU) joined by a backend network (`BackendNetwork`), stepped in lock-step (see `sims.backend`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from rackplane.settings import Identity
from sims.backend.network import Allocation, BackendNetwork
from sims.backend.params import BackendParams, RackDraw, draw_rack
from sims.fabric import LinkFabric
from sims.row import VirtualRack, VirtualRackParams
from sims.telemetry import port_block, tray_payloads
from sims.workloads import AgenticWorkload, BurnInWorkload, TrainingWorkload, Workload

__all__ = ["BackendFault", "MultiRack", "Phase", "RackBackend", "pattern_workloads"]

Phase = Literal["nvlink", "backend_only"]
Pattern = Literal["burn_in", "allreduce", "agentic"]


def pattern_workloads(kind: Pattern, racks: int, seed: int = 0,
                      gpus: int = 72) -> list[Workload]:
    """One `Workload` per rack for a load pattern (`sims.workloads`):

    * ``burn_in``: every GPU at full power and full traffic (a saturating bandwidth test);
    * ``allreduce``: synchronous training with the same seed on every rack, so the
      communication phases (all-reduce bursts, traffic 0.9) line up across racks;
    * ``agentic``: agentic inference per rack (own seed): demand spikes, a swelling
      concurrency, communication bursts (traffic 0.7–1.0 in all-reduce dips).

    Raises ValueError for an unknown kind or racks < 1.
    """
    if racks < 1:
        raise ValueError(f"racks must be >= 1 (got {racks})")
    if kind == "burn_in":
        return [BurnInWorkload(gpus, fraction=1.0, traffic=1.0) for _ in range(racks)]
    if kind == "allreduce":
        return [TrainingWorkload(gpus, seed=seed) for _ in range(racks)]
    if kind == "agentic":
        return [AgenticWorkload(gpus, seed=seed * 1000 + i, spike_rate_per_h=12.0)
                for i in range(racks)]
    raise ValueError(f"unknown load pattern {kind!r} (burn_in, allreduce, agentic)")


@dataclass(frozen=True, slots=True)
class BackendFault:
    """One injected cross-rack fault (ground truth). ``rack``: the rack index (None for a
    spine bundle); ``target``: a port name (``gpu07/nic1``), ``nics`` or a bundle name
    (``leaf-p0-r3/spine1``); times in plant s; ``end_s`` None while it lasts."""

    kind: str
    rack: int | None
    target: str
    start_s: float
    end_s: float | None
    detail: dict[str, float | str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RackBackend:
    """One rack's backend bandwidth at ``time_s`` (the last fabric step), bytes/s and bytes.

    ``achieved_bytes_per_s``: what its backend ports moved, (tx + rx) / 2 summed over ports
    (the ports' own throughput readings). ``expected_bytes_per_s``: what the same offered
    load moves on the family's nominal network (every port up at nominal speed and
    efficiency, no congestion). ``fraction``: achieved / expected (None when nothing was
    expected). ``*_bytes``: integrals since the start (windows: differences of two readings).
    ``ports_down``: backend ports down now; ``ports_below_speed``: up at a lower speed.
    """

    time_s: float
    achieved_bytes_per_s: float
    expected_bytes_per_s: float
    fraction: float | None
    achieved_bytes: float
    expected_bytes: float
    ports_down: int
    ports_below_speed: int


class MultiRack:
    """``n_racks`` racks and their backend network, stepped together with one ``dt``.

    Args:
        n_racks: racks (2..8).
        seed: seeds everything (each rack's plant, fabric and drawn figures).
        params: `BackendParams` (defaults when None).
        workloads: one `Workload` per rack (default `pattern_workloads("burn_in", ...)`).
        rack_params: the racks' `VirtualRackParams` (default: a GB200 NVL72).
        site, row: the racks' identity (racks are ``rack1`` .. ``rackN``).

    Raises:
        ValueError: n_racks out of range, or the wrong number of workloads.
    """

    def __init__(self, n_racks: int = 4, *, seed: int = 0, params: BackendParams | None = None,
                 workloads: Sequence[Workload] | None = None,
                 rack_params: VirtualRackParams | None = None,
                 site: str = "lab", row: str = "row1") -> None:
        if isinstance(n_racks, bool) or not isinstance(n_racks, int) or not 2 <= n_racks <= 8:
            raise ValueError(f"n_racks must be an integer in 2..8 (got {n_racks!r})")
        self.params = p = params if params is not None else BackendParams()
        rp = rack_params if rack_params is not None else VirtualRackParams()
        self.seed = int(seed)
        wls = list(workloads) if workloads is not None else pattern_workloads(
            "burn_in", n_racks, seed)
        if len(wls) != n_racks:
            raise ValueError(f"{n_racks} racks need {n_racks} workloads, got {len(wls)}")
        self.identities = [Identity(site=site, row=row, rack=f"rack{i + 1}")
                           for i in range(n_racks)]
        self.racks: list[VirtualRack] = []
        self.fabrics: list[LinkFabric] = []
        self.draws: list[RackDraw] = []
        th = rp.cdu.rack
        gpus, gpt = th.n_trays * th.gpus_per_tray, th.gpus_per_tray
        nvl, npg = rp.nvlink_ports_per_gpu, p.nic_ports_per_gpu
        for i in range(n_racks):
            vr = VirtualRack(rp, wls[i], seed=self.seed * 100 + i, fabric="off")
            draw = draw_rack(p, self.seed, i, gpus * npg)
            fab = LinkFabric(gpus, nvl, npg, seed=self.seed * 100 + i, params=draw.fabric,
                             start_time_s=vr.time_s)
            vr.racks[0].fabric = fab  # the row steps it (power-state hook, traffic average)
            self.racks.append(vr)
            self.fabrics.append(fab)
            self.draws.append(draw)
        f0 = self.fabrics[0]
        #: Indices of the backend (NIC) ports in a rack's fabric, GPU-major (port g of the
        #: network is fabric port nic_ports[g]).
        self.nic_ports = np.flatnonzero(~f0.is_nvlink)
        self._nvl_ports = np.flatnonzero(f0.is_nvlink)
        self._nic_gpu = f0.port_gpu[self.nic_ports]
        self.speed_bytes_per_s = p.nic_speed_mb_per_s * 1e6
        self.network = BackendNetwork(
            n_racks, th.n_trays, gpt * npg, self.speed_bytes_per_s, spines=p.spines,
            racks_per_leaf=p.racks_per_leaf, oversubscription=p.oversubscription)
        self._port_eff = np.stack([d.port_efficiency for d in self.draws])  # (N, ports)
        self._nic_factor = np.ones(n_racks)
        self._nominal_cap = np.full(self._port_eff.shape,
                                    self.speed_bytes_per_s * p.nic_efficiency_nominal)
        self._phase: Phase = "nvlink"
        self._acc_s = 0.0
        self._traffic_acc = np.zeros((n_racks, gpus))
        self._faults: list[dict[str, Any]] = []
        z = np.zeros(n_racks)
        self._achieved, self._expected = z.copy(), z.copy()
        self._achieved_total, self._expected_total = z.copy(), z.copy()
        self.last_allocation: Allocation | None = None
        self.last_expected: Allocation | None = None
        self._readings_t = self.time_s

    # --- time and phase ---------------------------------------------------------------------

    @property
    def n_racks(self) -> int:
        """Racks."""
        return len(self.racks)

    @property
    def time_s(self) -> float:
        """Plant time, s (every rack's)."""
        return self.racks[0].time_s

    @property
    def phase(self) -> Phase:
        """``nvlink`` (NVLink carries the collective, the NICs ``nic_demand_share`` of the
        traffic) or ``backend_only`` (NVLink disabled: no NVLink traffic, the NICs carry
        ``backend_share`` of each GPU's traffic)."""
        return self._phase

    def set_phase(self, phase: Phase) -> None:
        """Switch the phase from the next fabric step (an operation, not a fault). Raises
        ValueError for an unknown phase."""
        if phase not in ("nvlink", "backend_only"):
            raise ValueError(f"phase must be nvlink or backend_only (got {phase!r})")
        self._phase = phase

    def step(self, dt: float = 0.1) -> None:
        """Advance every rack by ``dt`` s (0 < dt ≤ 1, as `VirtualRow.step`). At each fabric
        step (``fabric_step_s``, 1 s) the backend traffic of the interval is routed first:
        each port's offered load (its GPU's workload traffic averaged over the interval, 0
        while the GPU draws no power) is allocated over the network and handed to the
        fabrics, which then count it (bytes, jitter, link down time, errors).

        Raises:
            ValueError: bad dt (nothing changes).
        """
        if not (isinstance(dt, int | float) and 0.0 < dt <= 1.0):
            raise ValueError(f"dt {dt!r} outside (0, 1] s")
        t0 = self.time_s
        for i, vr in enumerate(self.racks):
            drawing = vr.thermal.gpu_power_drawn_w > 0.0
            self._traffic_acc[i] += np.where(drawing, vr.workload.traffic_demand(t0), 0.0) * dt
        fs = self.racks[0].params.fabric_step_s
        self._acc_s += dt  # the rows' own accumulator, in the same arithmetic
        due = self._acc_s >= fs - 1e-9
        if due:
            self._route(self._traffic_acc / self._acc_s)
        for vr in self.racks:
            vr.step(dt)
        if due:
            self._read(self._acc_s)
            self._acc_s = 0.0
            self._traffic_acc[:] = 0.0

    def run(self, duration_s: float, dt: float = 0.1) -> None:
        """`step` ``dt`` until ``duration_s`` more plant seconds have passed."""
        n = round(duration_s / dt)
        for _ in range(n):
            self.step(dt)

    def _route(self, traffic: npt.NDArray[np.float64]) -> None:
        backend = self._phase == "backend_only"
        n = self.n_racks
        off = np.empty((n, self.nic_ports.size))
        cap = np.empty_like(off)
        speeds = []
        for i, fab in enumerate(self.fabrics):
            share = self.params.backend_share if backend else fab.params.nic_demand_share
            off[i] = traffic[i][self._nic_gpu] * share * self.speed_bytes_per_s
            sp = fab.link_speed_mb_per_s[self.nic_ports] * 1e6
            up = fab.link_up[self.nic_ports]
            cap[i] = sp * up * self._port_eff[i] * self._nic_factor[i]
            speeds.append(sp)
        alloc = self.network.allocate(off, cap)
        nominal = self.network.allocate(off, self._nominal_cap, np.ones_like(
            self.network.bundle_factor))
        self.last_allocation, self.last_expected = alloc, nominal
        for i, fab in enumerate(self.fabrics):
            tx = np.full(fab.n_ports, np.nan)
            rx = np.full(fab.n_ports, np.nan)
            if backend:
                tx[self._nvl_ports] = 0.0
                rx[self._nvl_ports] = 0.0
            with np.errstate(divide="ignore", invalid="ignore"):
                tx[self.nic_ports] = np.clip(np.nan_to_num(alloc.tx[i] / speeds[i]), 0.0, 1.0)
                rx[self.nic_ports] = np.clip(np.nan_to_num(alloc.rx[i] / speeds[i]), 0.0, 1.0)
            fab.set_port_demand(tx, rx)
        self._expected = 0.5 * (nominal.tx + nominal.rx).sum(axis=1)

    def _read(self, interval_s: float) -> None:
        for i, fab in enumerate(self.fabrics):
            snap = fab.snapshot()
            nic = self.nic_ports
            self._achieved[i] = 0.5 * float((snap["tx_bytes_per_s"][nic]
                                             + snap["rx_bytes_per_s"][nic]).sum())
        self._achieved_total += self._achieved * interval_s
        self._expected_total += self._expected * interval_s
        if self.last_allocation is not None:
            self.network.carry(self.last_allocation, interval_s)
        self._readings_t = self.time_s

    # --- faults (ground truth in fault_log) -----------------------------------------------

    def _rack(self, rack: int) -> int:
        if isinstance(rack, bool) or not isinstance(rack, int | np.integer) or not (
                0 <= int(rack) < self.n_racks):
            raise ValueError(f"rack must be an index in 0..{self.n_racks - 1} (got {rack!r})")
        return int(rack)

    def _nic_port(self, rack: int, port: str) -> int:
        r = self._rack(rack)
        p = self.fabrics[r].port_index(port)
        if self.fabrics[r].is_nvlink[p]:
            raise ValueError(f"{port} is an NVLink port, not a backend NIC port")
        return p

    def _log(self, kind: str, rack: int | None, target: str, *, end_s: float | None = None,
             **detail: float | str) -> None:
        self._faults.append({"kind": kind, "rack": rack, "target": target,
                             "start_s": self.time_s, "end_s": end_s, "detail": detail})

    def _end(self, kind: str, rack: int | None, target: str) -> None:
        for f in self._faults:
            if (f["kind"], f["rack"], f["target"]) == (kind, rack, target) and f["end_s"] is None:
                f["end_s"] = self.time_s

    def degrade_link_speed(self, rack: int, port: str, mb_per_s: float) -> None:
        """Backend port ``port`` (``gpu07/nic1``) of rack ``rack`` trains at the lower rate
        ``mb_per_s`` from now (e.g. 25,000: 400G → 200G); it reads so and carries at most
        that. Raises ValueError for a bad rack, port or speed."""
        p = self._nic_port(rack, port)
        self.fabrics[rack].set_link_speed(p, mb_per_s)
        self._end("link_speed", rack, port)
        self._log("link_speed", rack, port, mb_per_s=float(mb_per_s))

    def ramp_symbol_errors(self, rack: int, port: str, start_per_min: float,
                           end_per_min: float, duration_s: float) -> None:
        """Rising pre-FEC symbol errors on a backend port: the rate goes from
        ``start_per_min`` to ``end_per_min`` over ``duration_s`` and holds (`LinkFabric.
        ramp_error_rate`); FEC hides them, so throughput stays (REFERENCE §3.2's PAM4
        caveat). Raises ValueError as that hook."""
        p = self._nic_port(rack, port)
        self.fabrics[rack].ramp_error_rate(p, "symbol_error", start_per_min / 60.0,
                                           end_per_min / 60.0, duration_s)
        self._end("symbol_errors", rack, port)
        self._log("symbol_errors", rack, port, start_per_min=float(start_per_min),
                  end_per_min=float(end_per_min), duration_s=float(duration_s))

    def flap_link(self, rack: int, port: str, down_s: float, up_s: float, count: int = 1,
                  *, start_s: float | None = None) -> None:
        """``count`` DOWN→UP cycles on a backend port (`LinkFabric.flap`); while down it
        carries nothing and its peers send elsewhere. Raises ValueError as that hook."""
        p = self._nic_port(rack, port)
        self.fabrics[rack].flap(p, down_s, up_s, count, start_s=start_s)
        end = self.fabrics[rack].fault_log()[-1].end_s
        self._faults.append({"kind": "flap", "rack": rack, "target": port,
                             "start_s": self.fabrics[rack].fault_log()[-1].start_s,
                             "end_s": end, "detail": {"down_s": float(down_s),
                                                      "up_s": float(up_s), "count": count}})

    def underperform_nics(self, rack: int, fraction: float) -> None:
        """Every backend NIC of rack ``rack`` moves at most ``fraction`` (0 < f ≤ 1) of its
        healthy throughput from now (firmware, PCIe, a mis-set MTU or congestion control);
        link speed and counters look normal. 1.0 ends the fault. Raises ValueError for a
        fraction outside (0, 1]."""
        r = self._rack(rack)
        f = float(fraction)
        if not (0.0 < f <= 1.0):
            raise ValueError(f"fraction must be within (0, 1] (got {fraction!r})")
        self._nic_factor[r] = f
        self._end("nic_underperform", r, "nics")
        if f < 1.0:
            self._log("nic_underperform", r, "nics", fraction=f)

    def congest_spine(self, pod: int, rail: int, spine: int, fraction_left: float) -> None:
        """The leaf↔spine bundle of rail ``rail``'s leaf in pod ``pod`` (racks ``pod ×
        racks_per_leaf`` ..) to spine ``spine`` leaves only ``fraction_left`` (0..1) of its
        capacity to the backend from now, both directions (other traffic takes the rest;
        its switch readings show it). Flows split over the spines by static ECMP, so every
        flow of that leaf to other pods slows. 1.0 ends the fault. Raises ValueError for an
        index out of range or a fraction outside [0, 1]."""
        net = self.network
        for name, v, hi in (("pod", pod, net.pods), ("rail", rail, net.rails),
                            ("spine", spine, net.spines)):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < hi:
                raise ValueError(f"{name} must be an index in 0..{hi - 1} (got {v!r})")
        f = float(fraction_left)
        if not (0.0 <= f <= 1.0 and math.isfinite(f)):
            raise ValueError(f"fraction_left must be within [0, 1] (got {fraction_left!r})")
        net.bundle_factor[pod, rail, spine] = f
        name = f"leaf-p{pod}-r{rail}/spine{spine}"
        self._end("spine_congestion", None, name)
        if f < 1.0:
            self._log("spine_congestion", None, name, fraction_left=f)

    def fault_log(self) -> list[BackendFault]:
        """Every injected cross-rack fault, in injection order (new records)."""
        return [BackendFault(f["kind"], f["rack"], f["target"], f["start_s"], f["end_s"],
                             dict(f["detail"])) for f in self._faults]

    # --- readings -----------------------------------------------------------------------------

    def rack_backend(self, rack: int) -> RackBackend:
        """Rack ``rack``'s backend bandwidth at the last fabric step (`RackBackend`)."""
        r = self._rack(rack)
        fab = self.fabrics[r]
        nic = self.nic_ports
        up = fab.link_up[nic]
        speed = fab.link_speed_mb_per_s[nic]
        exp = float(self._expected[r])
        return RackBackend(
            time_s=self._readings_t, achieved_bytes_per_s=float(self._achieved[r]),
            expected_bytes_per_s=exp,
            fraction=float(self._achieved[r]) / exp if exp > 0.0 else None,
            achieved_bytes=float(self._achieved_total[r]),
            expected_bytes=float(self._expected_total[r]),
            ports_down=int((~up).sum()),
            ports_below_speed=int((up & (speed < self.params.nic_speed_mb_per_s)).sum()),
        )

    def backend_ports(self, rack: int) -> dict[str, Any]:
        """Rack ``rack``'s backend ports as one `rackplane.core.tray_contract.PortBlock` (the
        tray contract's per-GPU port shape, here over every backend port of the rack, in
        port order: names ``gpu07/nic1``, counters in their native widths with
        ``counter_bits``)."""
        r = self._rack(rack)
        fab = self.fabrics[r]
        snap = fab.snapshot()
        nic = self.nic_ports
        sub = {k: v[nic] for k, v in snap.items() if v.shape == (fab.n_ports,)}
        names = fab.port_names()
        return port_block(sub, range(nic.size), [names[i] for i in nic])

    def tray_payloads(self, rack: int, ts_ns: int) -> list[tuple[str, dict[str, Any]]]:
        """``(trayNN, TrayTelemetry)`` of rack ``rack``: the node-agent contract v1 as
        `sims.telemetry.tray_payloads` builds it (backend NIC ports in each GPU's
        ``ports``)."""
        r = self._rack(rack)
        return tray_payloads(self.racks[r], self.identities[r], ts_ns)

    def spine_bundles(self) -> dict[str, Any]:
        """The leaf↔spine bundles' switch readings (`BackendNetwork.bundle_readings`)."""
        return self.network.bundle_readings()

    def rail_of_port(self, port: int) -> int:
        """The rail (leaf) of backend port ``port`` (index into `nic_ports`)."""
        return int(port) % self.network.rails
