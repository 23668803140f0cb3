"""The backend network's figures (`BackendParams`, TOML-loadable) and the plant family: each
rack's own figures drawn within the family's ranges (`RackDraw`, `draw_rack`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from pydantic import Field, model_validator

from rackplane.config import StrictModel
from sims.fabric import FabricParams

__all__ = ["BackendParams", "RackDraw", "draw_rack"]


class BackendParams(StrictModel):
    """Backend (scale-out) network of a multi-rack plant and its family ranges.

    Sources: [S] stated by the source named, [S2] secondary source, [U] our assumption (the
    tag conventions of REFERENCE.md). REFERENCE.md gives no NIC or switch figures; the ones
    below are named where used.
    """

    nic_ports_per_gpu: int = Field(
        2, ge=1, le=4,
        description="backend NIC ports per GPU (8 per 4-GPU tray). GB200 NVL72 trays carry "
        "4 ConnectX-7 400 Gb/s (1 per GPU), GB300 ConnectX-8 SuperNICs at 800 Gb/s per GPU "
        "(here 2 × 400 Gb/s ports) [S2: NVIDIA GB200/GB300 NVL72 product pages]",
    )
    nic_speed_mb_per_s: float = Field(
        50_000.0, gt=0.0,
        description="NIC port line speed per direction, MB/s: 400 Gb/s (NDR / 400GbE), as "
        "sims.fabric FabricParams.nic_speed_mb_per_s [S2]",
    )
    spines: int = Field(
        4, ge=1, le=64, description="spine switches per rail plane; a leaf has one uplink "
        "bundle to each, flows split evenly over them (static ECMP) [U]")
    racks_per_leaf: int = Field(
        1, ge=1, le=8,
        description="racks whose rail-k ports share one leaf switch (a rail-optimised leaf "
        "per rail and rack group: 18 trays × 1 rack = 18 downlinks on a 64-port 400G leaf) "
        "[S2: NVIDIA DGX SuperPOD rail-optimised fabric; U: the grouping]",
    )
    oversubscription: float = Field(
        1.0, ge=1.0, le=8.0,
        description="leaf downlink / uplink capacity; 1.0 = non-blocking, as AI backend "
        "fabrics are built [S2: DGX SuperPOD reference architecture]",
    )
    backend_share: float = Field(
        1.0, gt=0.0, le=1.0,
        description="NIC demand per unit GPU traffic demand while NVLink is disabled "
        "(backend_only: the whole collective goes over the NICs) [U]",
    )
    nic_efficiency_min: float = Field(
        0.93, gt=0.0, le=1.0,
        description="lowest goodput share of line rate a healthy rack's NICs reach (RDMA "
        "write bandwidth tests on 400G NICs report ~0.93–0.97 of line rate) [U]",
    )
    nic_efficiency_max: float = Field(0.97, gt=0.0, le=1.0, description="highest, as above [U]")
    nic_efficiency_nominal: float = Field(
        0.95, gt=0.0, le=1.0,
        description="the design value the expected bandwidth is computed with [U]")
    port_efficiency_sigma: float = Field(
        0.005, ge=0.0, le=0.05, description="per-port relative spread around the rack's "
        "efficiency (cables, transceivers), σ [U]")
    symbol_error_per_min_min: float = Field(
        0.3, ge=0.0, description="healthy pre-FEC symbol-error rate per port, errors/min, "
        "drawn per rack from [min, max]: around REFERENCE §3.3's λ0 = 0.5/min [D]")
    symbol_error_per_min_max: float = Field(0.7, ge=0.0, description="as above, upper end")
    traffic_jitter_min: float = Field(
        0.01, ge=0.0, le=0.2, description="per-port per-step throughput noise σ, drawn per "
        "rack (FabricParams.traffic_jitter) [U]")
    traffic_jitter_max: float = Field(0.03, ge=0.0, le=0.2, description="as above, upper end")

    @model_validator(mode="after")
    def _ordered(self) -> BackendParams:
        for lo, hi in (("nic_efficiency_min", "nic_efficiency_max"),
                       ("symbol_error_per_min_min", "symbol_error_per_min_max"),
                       ("traffic_jitter_min", "traffic_jitter_max")):
            if getattr(self, lo) > getattr(self, hi):
                raise ValueError(f"{lo} must be <= {hi}")
        if not (self.nic_efficiency_min <= self.nic_efficiency_nominal
                <= self.nic_efficiency_max):
            raise ValueError("nic_efficiency_nominal must lie within [min, max]")
        return self

    def healthy_fraction_range(self) -> tuple[float, float]:
        """The family's spread of a healthy rack's achieved / expected backend bandwidth
        under a saturating load: (efficiency min, max) / nominal, widened by 3 σ of the
        per-port spread; (≤ 1, ≥ 1): a load below the NICs' capacity gives 1."""
        k = 3.0 * self.port_efficiency_sigma
        nom = self.nic_efficiency_nominal
        return (self.nic_efficiency_min * (1.0 - k) / nom,
                max(1.0, self.nic_efficiency_max * (1.0 + k) / nom))


@dataclass(frozen=True)
class RackDraw:
    """One rack's figures drawn from the family (`draw_rack`).

    ``port_efficiency``: shape (backend ports,), each port's goodput share of line rate
    (the rack's efficiency × its own spread, capped at 1).
    """

    nic_efficiency: float
    port_efficiency: npt.NDArray[np.float64]
    symbol_error_per_min: float
    traffic_jitter: float
    fabric: FabricParams


def draw_rack(params: BackendParams, seed: int, rack: int, ports: int) -> RackDraw:
    """Rack ``rack``'s figures for family seed ``seed`` (deterministic; the same for any
    number of racks). ``ports``: the rack's backend NIC ports. Raises ValueError for
    ``ports`` < 1."""
    if ports < 1:
        raise ValueError(f"ports must be >= 1 (got {ports})")
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), 17, rack])))
    p = params
    eff = float(rng.uniform(p.nic_efficiency_min, p.nic_efficiency_max))
    spread = 1.0 + p.port_efficiency_sigma * np.clip(rng.standard_normal(ports), -3.0, 3.0)
    port_eff = np.minimum(eff * spread, 1.0)
    sym = float(rng.uniform(p.symbol_error_per_min_min, p.symbol_error_per_min_max))
    jit = float(rng.uniform(p.traffic_jitter_min, p.traffic_jitter_max))
    fab = FabricParams(
        nic_speed_mb_per_s=p.nic_speed_mb_per_s,
        traffic_jitter=jit,
        healthy_rate_per_min={"nvl_crc_flit_errors": 0.5, "symbol_error": sym},
    )
    port_eff.setflags(write=False)
    return RackDraw(eff, port_eff, sym, jit, fab)
