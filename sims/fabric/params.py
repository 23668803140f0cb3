"""The fabric's figures (`FabricParams`, TOML-loadable), its ground-truth fault record
(`FaultRecord`) and the number check its hooks validate arguments with."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field, field_validator

from rackplane.config import StrictModel
from sims.fabric.counters import _RATE_ROW, RATE_COUNTERS

__all__ = ["FabricParams", "FaultRecord"]


def _f(default: Any, desc: str, **kw: Any) -> Any:
    return Field(default, description=desc, **kw)


def _default_healthy_rates() -> dict[str, float]:
    return {"nvl_crc_flit_errors": 0.5, "symbol_error": 0.5}


class FabricParams(StrictModel):
    """Link-fabric figures (TOML-loadable; every field has its source in its description).

    Counter widths and semantics are fixed by the hardware (`COUNTERS`), not parameters.
    """

    nvlink_speed_mb_per_s: float = _f(
        53_125.0,
        "NVLink 5 per-link speed per direction, MB/s (1 MB = 1e6 B) (REF §1.1 / §3.1 [S])",
        gt=0.0,
    )
    nic_speed_mb_per_s: float = _f(
        50_000.0, "NIC port speed per direction, MB/s: 400 Gb/s NDR (ConnectX-7) [S2/U]", gt=0.0
    )
    nvlink_demand_share: float = _f(
        1.0, "NVLink throughput per unit GPU traffic demand, fraction of link speed [U]",
        ge=0.0, le=1.0,
    )
    nic_demand_share: float = _f(
        0.5, "NIC (scale-out) throughput per unit GPU traffic demand, fraction of speed [U]",
        ge=0.0, le=1.0,
    )
    traffic_jitter: float = _f(
        0.02, "per-port, per-direction, per-step relative throughput noise σ [U]", ge=0.0, le=1.0
    )
    healthy_rate_per_min: dict[str, float] = Field(
        default_factory=_default_healthy_rates,
        description=(
            "healthy Poisson rate per rate counter, errors/min; absent = 0. Pre-FEC "
            "symbol/CRC-flit λ0 = 0.5/min (REF §3.3 [D]); replay, recovery, link-downed 0 "
            "(REF §3.2, §8 [S])"
        ),
    )
    post_fec_fraction: float = _f(
        1e-3,
        "share of `degrade_ber`'s pre-FEC errors that are uncorrectable (crc_data / "
        "port_rcv_errors) [U]",
        ge=0.0, le=1.0,
    )
    initial_uptime_s: float = _f(
        864_000.0, "GPU uptime at the fabric's start, s (10 days; FIELD-CASES BR-11 b feed) [U]",
        ge=0.0,
    )

    @field_validator("healthy_rate_per_min")
    @classmethod
    def _check_rates(cls, v: dict[str, float]) -> dict[str, float]:
        for name, rate in v.items():
            if name not in _RATE_ROW:
                raise ValueError(f"{name!r} is not a rate counter (one of {RATE_COUNTERS})")
            if not (math.isfinite(rate) and rate >= 0.0):
                raise ValueError(f"{name}: healthy rate must be finite and >= 0 (got {rate})")
        return v


@dataclass(frozen=True, slots=True)
class FaultRecord:
    """One injected fault, as ground truth for scoring detection.

    ``target`` is a port name (``gpu07/nic1``) or a GPU name (``gpu07``); ``port`` is the port
    index or None for GPU-wide faults. ``start_s``/``end_s`` are fabric times (s); ``end_s`` is
    None while the fault is open-ended and still active (a rate fault until replaced or
    restored; an endless silence). ``detail`` holds the hook's arguments (rates in /s).
    """

    kind: str
    target: str
    gpu: int
    port: int | None
    start_s: float
    end_s: float | None
    detail: dict[str, float | str] = field(default_factory=dict)


def _finite(name: str, value: float, *, lo: float | None = None, lo_open: bool = False) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number (got {value!r})") from None
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite (got {value!r})")
    if lo is not None and (v < lo or (lo_open and v == lo)):
        raise ValueError(f"{name} must be {'>' if lo_open else '>='} {lo} (got {value!r})")
    return v
