"""The virtual rack (and row): CDU + racks + power shelves + room + link fabric, one dt.

`VirtualRow` composes, for ``n_racks`` racks sharing one row CDU (1 by default):

* one `sims.cdu.CduPlant` (``CduParams.n_racks`` racks on its secondary loop, per-GPU mode);
* per rack: a `sims.rack.ComputeRack` (node agents, tray and switch power, leak sensors), its
  thermal model (`sims.cdu.RackThermal`, the CDU's), `sims.power.PowerShelves`, a workload
  (`sims.workloads`) and, when available, a `sims.fabric.LinkFabric` (1,440 ports for an
  NVL72: 72 GPUs × (18 NVLink + 2 NIC));
* one `sims.environment.Environment` (room air, dew point; the PSUs breathe it).

`VirtualRack` is the one-rack row with per-rack shortcuts (``compute``, ``shelves``, ...).

Each `VirtualRow.step` (``dt`` 0.1 s by default; the fabric at its own ``fabric_step_s``,
1 s by default, with the traffic averaged over that interval)::

    room air ─► workload demand (fraction of TGP) ─► node agents (cap, floor, ramp, tray on/off)
      ─► GPU requests ─► CduPlant.step (per-GPU thermal, HW slowdown, rack node, CDU loop)
      ─► IT power drawn ─► power shelves (DC load → AC input, PSU losses, BBU, brown-out)
      ─► leak sensors (tray, drip pan, CDU rope) ─► CDU inventory (set_leak_lpm)
      ─► link fabric (traffic of GPUs that draw power; a GPU whose tray is switched off,
         that shuts down or browns out takes its links down; powered again it reboots and
         its links come back up: `sims.fabric.LinkFabric.power_off` / ``power_on``)

The energy chain: AC input = PSU DC output + PSU losses; PSU DC output (+ BBU discharge) = IT
power (+ BBU recharge); IT power = heat to liquid (f_liq) + heat to air; heat to liquid =
heat the CDU's HX removes + the change of stored heat. `RackTruth.energy_kj` integrates each
term, so the balance can be checked over any run (tests: within 2 %).

Everything is pure and deterministic for a ``seed`` (the fabric's own seed is derived from
it); time is plant time from the constructor.

The link fabric is imported lazily from `sims.fabric` (another module of issue 3): with
``fabric="on"`` a missing or broken module is a `FabricUnavailable` error naming the cause;
``"auto"`` uses it when it imports; ``"off"`` never does.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
from pydantic import Field

from rackplane.config import StrictModel
from sims.cdu import CduParams, CduPlant, CduTruth, RackThermal
from sims.cdu.params import ROW_SCALED_FIELDS
from sims.environment import Environment, EnvironmentParams, EnvironmentState
from sims.power import PowerShelfParams, PowerShelves, ShelfState
from sims.rack import ComputeRack, ComputeRackParams, LeakSensors, LeakState, NodeAgents
from sims.workloads import IdleWorkload, Workload

__all__ = [
    "FabricMode",
    "FabricUnavailable",
    "LinkFabricLike",
    "RackSide",
    "RackTruth",
    "VirtualRack",
    "VirtualRackParams",
    "VirtualRow",
    "load_link_fabric",
]

FabricMode = Literal["auto", "on", "off"]


class FabricUnavailable(RuntimeError):
    """`sims.fabric.LinkFabric` is needed but cannot be imported or built."""


class LinkFabricLike(Protocol):
    """The interface `sims.fabric.LinkFabric` provides (agreed in issue 3)."""

    def step(self, dt_s: float, traffic_demand: np.ndarray, t_s: float) -> None: ...

    def snapshot(self) -> dict[str, np.ndarray]: ...

    def flap(self, port: Any, down_s: float, up_s: float, count: int) -> None: ...

    def set_error_rate(self, port: Any, counter: str, per_s: float) -> None: ...

    def ramp_error_rate(
        self, port: Any, counter: str, start_per_s: float, end_per_s: float, duration_s: float
    ) -> None: ...

    def reboot(self, gpu: int) -> None: ...

    def port_names(self) -> list[str]: ...


def load_link_fabric() -> type[Any]:
    """The `sims.fabric.LinkFabric` class.

    Raises:
        FabricUnavailable: the module or the class cannot be imported (the cause chained).
    """
    try:
        mod = importlib.import_module("sims.fabric")
    except ImportError as err:
        raise FabricUnavailable(
            f"the link fabric (sims.fabric.LinkFabric) is not available: {err}; run without "
            'it (fabric = "off" in the scenario\'s [fabric] table, or VirtualRack(fabric="off"))'
        ) from err
    cls = getattr(mod, "LinkFabric", None)
    if cls is None:
        raise FabricUnavailable("sims.fabric has no LinkFabric class")
    return cls


class VirtualRackParams(StrictModel):
    """Everything a virtual rack is built from (defaults: one GB200 NVL72, REFERENCE §4.3)."""

    cdu: CduParams = Field(default_factory=CduParams, description="CDU and rack thermal")
    compute: ComputeRackParams = Field(default_factory=ComputeRackParams)
    power: PowerShelfParams = Field(default_factory=PowerShelfParams)
    environment: EnvironmentParams = Field(default_factory=EnvironmentParams)
    fabric: FabricMode = Field("auto", description="link fabric: auto | on | off")
    fabric_step_s: float = Field(1.0, ge=0.1, le=60.0, description="fabric step, s")
    nvlink_ports_per_gpu: int = Field(
        18, ge=0, le=64, description="NVLink ports per GPU (REF §3.1: 18 on GB200/GB300 [S])"
    )
    nic_ports_per_gpu: int = Field(2, ge=0, le=16, description="NIC ports per GPU")
    supply_setpoint_c: float = Field(45.0, ge=20.0, le=60.0, description="warm-start setpoint")


@dataclass(frozen=True)
class RackTruth:
    """One rack's true state at ``time_s`` (arrays per GPU ``(n_gpus,)`` or per tray
    ``(n_trays,)``; W, °C, kJ).

    ``gpu_t_limit_c`` is REFERENCE §1.6's T.Limit margin (T_maxop − Tj; HW slowdown below
    −slowdown offset). ``energy_kj`` integrates since the last warm start: ``it`` (IT power
    drawn), ``liquid``, ``air``, ``ac_in``, ``psu_out`` (PSU DC output), ``psu_loss``,
    ``bbu_out``, ``bbu_recharge``, ``unserved``.
    """

    time_s: float
    it_power_w: float
    it_power_demand_w: float
    liquid_kw: float
    air_kw: float
    switch_power_w: float
    gpu_demand_w: np.ndarray
    gpu_request_w: np.ndarray
    gpu_power_w: np.ndarray
    gpu_tj_c: np.ndarray
    gpu_plate_temp_c: np.ndarray
    gpu_t_limit_c: np.ndarray
    gpu_throttled: np.ndarray
    gpu_on: np.ndarray
    gpu_traffic: np.ndarray
    tray_power_w: np.ndarray
    tray_powered: np.ndarray
    tray_coolant_out_c: np.ndarray
    conductance_factors: tuple[float, ...]
    leaks: LeakState
    shelves: ShelfState
    brownout: bool
    energy_kj: dict[str, float] = field(default_factory=dict)


class RackSide:
    """One rack of a row: trays, thermal model (the CDU's), shelves, workload, fabric.

    Built by `VirtualRow`; exposed as ``row.racks[i]``. Attributes: ``index``, ``compute``
    (`ComputeRack`), ``thermal`` (`RackThermal`), ``shelves`` (`PowerShelves`),
    ``workload`` (`Workload`, replaceable), ``fabric`` (the `LinkFabric` or None).
    """

    def __init__(
        self,
        index: int,
        params: VirtualRackParams,
        thermal: RackThermal,
        workload: Workload,
        fabric: Any | None,
    ) -> None:
        self.index = index
        self.compute = ComputeRack(thermal.params, params.compute)
        self.thermal = thermal
        self.shelves = PowerShelves(params.power, params.environment.room_temp_c)
        if workload.gpus != self.compute.n_gpus:
            raise ValueError(
                f"workload has {workload.gpus} GPUs, the rack {self.compute.n_gpus}"
            )
        self.workload = workload
        self.fabric = fabric
        n = self.compute.n_gpus
        self.demand_w = np.zeros(n)
        self.request_w = np.zeros(n)
        self.traffic = np.zeros(n)
        self._traffic_acc = np.zeros(n)
        self._traffic_t = 0.0
        self._powered = np.ones(n, dtype=bool)  # per GPU, as last told to the fabric
        self.rack_demand_w = 0.0
        self.energy: dict[str, float] = {}
        self.reset_energy()

    def reset_energy(self) -> None:
        """Zero the energy integrals (warm start)."""
        self.energy = dict.fromkeys(
            ("it", "liquid", "air", "ac_in", "psu_out", "psu_loss", "bbu_out", "bbu_recharge",
             "unserved"), 0.0,
        )

    @property
    def port_count(self) -> int:
        """Link ports on the rack (0 without a fabric)."""
        return 0 if self.fabric is None else len(self.fabric.port_names())


class VirtualRow:
    """``n_racks`` virtual racks on one row CDU, stepped together (module docstring).

    Args:
        params: `VirtualRackParams` (``params.cdu`` describes one rack and the CDU for one
            rack; for ``n_racks`` > 1 the CDU's flows, UA and pump power are scaled ×
            ``n_racks``, `CduParams.for_rack_power`).
        n_racks: racks on the row CDU (1–32).
        seed: seeds the CDU sensors, the room sensors, the default workloads and the fabric.
        workloads: one `Workload` per rack (default: `IdleWorkload`).
        fabric: overrides ``params.fabric`` (auto | on | off).

    Raises:
        FabricUnavailable: ``fabric="on"`` and `sims.fabric.LinkFabric` cannot be built.
        ValueError: wrong number of workloads or a workload for another GPU count.

    The constructor warm-starts the plant at the workloads' t = 0 demand (`warm_start`).
    """

    def __init__(
        self,
        params: VirtualRackParams | None = None,
        n_racks: int = 1,
        *,
        seed: int = 0,
        workloads: Sequence[Workload] | None = None,
        fabric: FabricMode | None = None,
    ) -> None:
        p = params if params is not None else VirtualRackParams()
        if not (isinstance(n_racks, int) and 1 <= n_racks <= 32):
            raise ValueError(f"n_racks {n_racks!r} outside 1..32")
        if n_racks != p.cdu.n_racks:
            data = p.cdu.model_dump()
            scale = n_racks / p.cdu.n_racks
            for k in ROW_SCALED_FIELDS:
                data[k] *= scale
            data["n_racks"] = n_racks
            p = p.model_copy(update={"cdu": CduParams.model_validate(data)})
        self.params = p
        self.seed = int(seed)
        self.cdu = CduPlant(p.cdu, seed=seed)
        self.environment = Environment(p.environment, seed=seed)
        mode = p.fabric if fabric is None else fabric
        fabric_cls: type[Any] | None = None
        if mode == "on":
            fabric_cls = load_link_fabric()
        elif mode == "auto":
            try:
                fabric_cls = load_link_fabric()
            except FabricUnavailable:
                fabric_cls = None
        rp = p.cdu.rack
        n_gpus = rp.n_trays * rp.gpus_per_tray
        if workloads is None:
            workloads = [IdleWorkload(n_gpus, seed=seed + i) for i in range(n_racks)]
        if len(workloads) != n_racks:
            raise ValueError(f"{n_racks} racks need {n_racks} workloads, got {len(workloads)}")
        self.racks: list[RackSide] = []
        for i, (thermal, wl) in enumerate(zip(self.cdu.racks, workloads, strict=True)):
            fab = None
            if fabric_cls is not None:
                try:
                    fab = fabric_cls(
                        gpus=n_gpus,
                        nvlink_ports_per_gpu=p.nvlink_ports_per_gpu,
                        nic_ports_per_gpu=p.nic_ports_per_gpu,
                        seed=self.seed * 1000 + i,
                    )
                except Exception as err:
                    if mode == "on":
                        raise FabricUnavailable(f"LinkFabric could not be built: {err}") from err
                    raise
            self.racks.append(RackSide(i, p, thermal, wl, fab))
        self.fabric_mode: FabricMode = mode
        self.facility_supply_temp_c = p.cdu.facility_supply_temp_c
        #: Coolant lost from the loop away from any leak sensor, L/min (scenario ``leak``).
        self.loop_leak_lpm = 0.0
        self._fabric_acc_s = 0.0
        self._t = 0.0
        self.warm_start()

    # --- properties ----------------------------------------------------------------------------

    @property
    def time_s(self) -> float:
        """Plant time, s since construction."""
        return self._t

    @property
    def has_fabric(self) -> bool:
        """True when the racks have a link fabric."""
        return self.racks[0].fabric is not None

    # --- warm start ----------------------------------------------------------------------------

    def warm_start(self, facility_supply_temp_c: float | None = None) -> None:
        """Steady state for the workloads' demand at the current time: node agents at their
        (clipped) requests, CDU at the setpoint (`CduPlant.warm_start`), PSU temperatures
        settled, BBUs full, energy integrals zeroed.

        Raises:
            ValueError: as `CduPlant.warm_start`.
        """
        if facility_supply_temp_c is not None:
            self.facility_supply_temp_c = facility_supply_temp_c
        powers, gpus = [], []
        for r in self.racks:
            frac = r.workload.power_fraction(self._t)
            r.demand_w = frac * r.compute.tgp_w
            r.compute.agents.reset(r.demand_w)
            req = r.compute.agents.request_w
            r.request_w = req
            r.compute._request = req
            r.rack_demand_w = r.compute.rack_power_for_gpu_power(req)
            powers.append(r.rack_demand_w)
            gpus.append(req)
        self.cdu.warm_start(
            powers,
            supply_setpoint_c=self.params.supply_setpoint_c,
            facility_supply_temp_c=self.facility_supply_temp_c,
            gpu_power_w=gpus,
        )
        env = self.environment
        for r in self.racks:
            r.shelves.settle(r.thermal.power_w, env.room_temp_c)
            r.reset_energy()
            r.traffic = r.workload.traffic_demand(self._t)

    # --- stepping ------------------------------------------------------------------------------

    def step(self, dt: float = 0.1, facility_supply_temp_c: float | None = None) -> None:
        """Advance every part by ``dt`` s (0 < dt ≤ 1).

        Args:
            dt: plant step, s.
            facility_supply_temp_c: facility water supply temperature, °C (None: keep the
                last one).

        Raises:
            ValueError: bad dt or facility temperature (nothing changes), or a workload
                queried back in time.
        """
        if not (0.0 < dt <= 1.0):
            raise ValueError(f"dt {dt} outside (0, 1] s")
        if facility_supply_temp_c is not None:
            if not (-20.0 <= facility_supply_temp_c <= 95.0):
                raise ValueError(
                    f"facility_supply_temp_c {facility_supply_temp_c} outside −20–95 °C"
                )
            self.facility_supply_temp_c = facility_supply_temp_c
        t0 = self._t
        env = self.environment
        env.step(dt)
        powers: list[float] = []
        gpus: list[np.ndarray] = []
        leak_lpm = self.loop_leak_lpm
        for r in self.racks:
            frac = r.workload.power_fraction(t0)
            r.traffic = r.workload.traffic_demand(t0)
            if r.shelves.brownout:
                frac = np.zeros_like(frac)
            r.demand_w = frac * r.compute.tgp_w
            req, demand = r.compute.step(frac, dt)
            if r.shelves.brownout:
                demand = 0.0
            r.request_w = req
            r.rack_demand_w = demand
            powers.append(demand)
            gpus.append(req)
            leak_lpm += r.compute.leaks.leak_lpm
        self.cdu.set_leak_lpm(leak_lpm)
        self.cdu.step(powers, self.facility_supply_temp_c, dt, gpu_power_w=gpus)
        self._t = t0 + dt
        self._fabric_acc_s += dt
        fabric_due = self._fabric_acc_s >= self.params.fabric_step_s - 1e-9
        room = env.room_temp_c
        for r in self.racks:
            th = r.thermal
            it_w = th.power_w
            st = r.shelves.step(it_w, room, dt)
            e = r.energy
            e["it"] += it_w * dt * 1e-3
            e["liquid"] += th.liquid_kw * dt
            e["air"] += (it_w * 1e-3 - th.liquid_kw) * dt
            e["ac_in"] += st.input_w * dt * 1e-3
            e["psu_out"] += st.output_w * dt * 1e-3
            e["psu_loss"] += st.loss_w * dt * 1e-3
            e["bbu_out"] += st.bbu_output_w * dt * 1e-3
            e["bbu_recharge"] += st.bbu_recharge_w * dt * 1e-3
            e["unserved"] += st.unserved_w * dt * 1e-3
            if r.fabric is not None:
                # tray power-state hook: a GPU without power (tray switched off, thermal
                # shutdown, rack brown-out) takes its links down; powered again, it boots and
                # its links come back up (sims.fabric power_off / power_on)
                powered = r.compute.agents.powered & th.gpu_on
                if r.shelves.brownout:
                    powered[:] = False
                switched = powered != r._powered
                if switched.any():
                    for g in np.flatnonzero(switched):
                        if powered[g]:
                            r.fabric.power_on(int(g))
                        else:
                            r.fabric.power_off(int(g))
                    r._powered = powered
                drawing = th.gpu_power_drawn_w > 0.0
                r._traffic_acc += np.where(drawing, r.traffic, 0.0) * dt
                r._traffic_t += dt
                if fabric_due:
                    r.fabric.step(
                        r._traffic_t, r._traffic_acc / r._traffic_t, self._t - r._traffic_t
                    )
                    r._traffic_acc = np.zeros_like(r._traffic_acc)
                    r._traffic_t = 0.0
        if fabric_due:
            self._fabric_acc_s = 0.0

    # --- outputs -------------------------------------------------------------------------------

    def cdu_truth(self) -> CduTruth:
        """The CDU's true state (`CduPlant.truth`)."""
        return self.cdu.truth()

    def environment_state(self) -> EnvironmentState:
        """Room air now."""
        return self.environment.state()

    def truth(self, rack: int = 0) -> RackTruth:
        """Rack ``rack``'s true state (see `RackTruth`). Raises IndexError for no such rack."""
        r = self.racks[rack]
        th = r.thermal
        rp = th.params
        drawn = th.gpu_power_drawn_w
        tj = th.gpu_junction_temps_c
        tray_w = r.compute.tray_power_w(drawn)
        ct = self.cdu.truth()
        q = ct.flow_lps / len(self.racks)
        n_trays = r.compute.n_trays
        t_in = ct.rack_inlet_temp_c
        cs_tray = self.cdu.params.coolant_rho_c_kj_per_l_k * q / n_trays
        if cs_tray > 1e-6:
            t_out = t_in + rp.liquid_fraction * tray_w * 1e-3 / cs_tray
        else:
            t_out = np.full(n_trays, th.t_out_c)
        return RackTruth(
            time_s=self._t,
            it_power_w=th.power_w,
            it_power_demand_w=th.demand_w,
            liquid_kw=th.liquid_kw,
            air_kw=th.power_w * 1e-3 - th.liquid_kw,
            switch_power_w=0.0 if r.shelves.brownout else r.compute.switch_power_w,
            gpu_demand_w=r.demand_w.copy(),
            gpu_request_w=r.request_w.copy(),
            gpu_power_w=drawn,
            gpu_tj_c=tj,
            gpu_plate_temp_c=th.gpu_plate_temps_c,
            gpu_t_limit_c=rp.gpu_max_operating_temp_c - tj,
            gpu_throttled=th.gpu_throttled,
            gpu_on=th.gpu_on,
            gpu_traffic=r.traffic.copy(),
            tray_power_w=tray_w,
            tray_powered=np.asarray(r.compute.agents.powered.reshape(n_trays, -1).all(axis=1)),
            tray_coolant_out_c=np.asarray(t_out, dtype=float),
            conductance_factors=th.conductance_factors,
            leaks=r.compute.leaks.state(),
            shelves=r.shelves.state,
            brownout=r.shelves.brownout,
            energy_kj=dict(r.energy),
        )

    def stored_energy_kj(self) -> float:
        """Heat stored in the liquid loop (CDU, pipes, racks), kJ (`CduPlant.stored_energy_kj`)."""
        return self.cdu.stored_energy_kj()


class VirtualRack(VirtualRow):
    """One virtual rack with its own CDU share (a `VirtualRow` of one rack), or the first
    rack of a row CDU when ``params.cdu.n_racks`` > 1 (the ``racks_N`` plant variants of
    `sims.cdu.variants`: the other racks are ``racks[1:]``, idle until their workloads are
    set; the shortcuts below are rack 0's).

    Args:
        params: `VirtualRackParams`.
        workload: the rack's `Workload` (default `IdleWorkload`).
        seed: as `VirtualRow`.
        fabric: auto | on | off (default ``params.fabric``).

    Shortcuts: ``compute``, ``thermal``, ``shelves``, ``fabric``, ``workload`` (settable),
    ``leaks``, ``agents``.
    """

    def __init__(
        self,
        params: VirtualRackParams | None = None,
        workload: Workload | None = None,
        *,
        seed: int = 0,
        fabric: FabricMode | None = None,
    ) -> None:
        p = params if params is not None else VirtualRackParams()
        n = p.cdu.n_racks
        rp = p.cdu.rack
        wls: list[Workload] | None = None
        if workload is not None:
            wls = [workload] + [IdleWorkload(rp.n_trays * rp.gpus_per_tray, seed=seed + i)
                                for i in range(1, n)]
        super().__init__(p, n, seed=seed, workloads=wls, fabric=fabric)

    @property
    def rack(self) -> RackSide:
        """The rack."""
        return self.racks[0]

    @property
    def compute(self) -> ComputeRack:
        """Trays, node agents and leak sensors."""
        return self.racks[0].compute

    @property
    def agents(self) -> NodeAgents:
        """The node agents."""
        return self.racks[0].compute.agents

    @property
    def leaks(self) -> LeakSensors:
        """The leak sensors."""
        return self.racks[0].compute.leaks

    @property
    def thermal(self) -> RackThermal:
        """The rack's thermal model."""
        return self.racks[0].thermal

    @property
    def shelves(self) -> PowerShelves:
        """The power shelves."""
        return self.racks[0].shelves

    @property
    def fabric(self) -> Any | None:
        """The link fabric, or None."""
        return self.racks[0].fabric

    @property
    def workload(self) -> Workload:
        """The workload (settable: a new one must answer from the current time on)."""
        return self.racks[0].workload

    @workload.setter
    def workload(self, wl: Workload) -> None:
        if wl.gpus != self.compute.n_gpus:
            raise ValueError(f"workload has {wl.gpus} GPUs, the rack {self.compute.n_gpus}")
        self.racks[0].workload = wl

