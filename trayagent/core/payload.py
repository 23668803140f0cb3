"""One tray's readings as the node-agent contract v1 ``telemetry/trayNN`` payload.

`GpuReading` is what a source (NVML, DCGM) read of one GPU, each figure None when it could not
be read. A tray is published only when every GPU's power is known (the contract has no null
power): `tray_payload` raises `NotPublishable` naming the GPU otherwise, and the caller logs it
once per change and skips the tray (racky then sees it stale after its ``stale_after_s``;
a stale value is never sent as fresh).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from rackplane.core.tray_contract import POWER_CAP_REASONS, SCHEMA_VERSION
from trayagent.core.bmc import BmcReading
from trayagent.core.caps import DeviceLimits, TrayCaps

__all__ = ["XIDS_PER_MESSAGE", "GpuReading", "NotPublishable", "TrayInfo", "XidCount",
           "tray_payload"]

PowerKind = Literal["instant", "average", "energy"]


class NotPublishable(ValueError):
    """The tray cannot be published this interval (the message says why)."""


@dataclass(slots=True)
class GpuReading:
    """One GPU as a source read it (None: not read; the source says why in ``errors``).

    Attributes:
        gpu: rack-wide GPU index.
        power_w: drawn power, W; ``power_kind`` says which figure it is: ``instant`` (NVML
            power usage on a GPU whose driver reports the instantaneous figure), ``average``
            (NVML's 1 s average, DCGM ``DCGM_FI_DEV_POWER_USAGE``) or ``energy`` (derived
            from the energy counter's increase over the interval).
        energy_mj: total energy counter, mJ (NVML ``TotalEnergyConsumption``, 64-bit).
        temp_c: GPU temperature, °C; t_limit_c: T.Limit margin, K.
        reasons: decoded clock-event reasons; unknown_reason_bits: bits not decoded.
        utilization: 0..1.
        limit_w: the enforced power limit read back, W.
        limits: the device's min / max / default limits, W.
        ecc_corrected_volatile, ecc_uncorrected_volatile: device-memory ECC error totals
            since the driver loaded (NVML volatile), counts.
        lost: the GPU fell off the bus (NVML GPU_IS_LOST) or shut down.
        errors: figure -> why it is None.
    """

    gpu: int
    power_w: float | None = None
    power_kind: PowerKind = "average"
    energy_mj: int | None = None
    temp_c: float | None = None
    t_limit_c: float | None = None
    reasons: list[str] = field(default_factory=list)
    unknown_reason_bits: int = 0
    utilization: float | None = None
    limit_w: float | None = None
    limits: DeviceLimits = field(default_factory=lambda: DeviceLimits(None, None, None))
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_volatile: int | None = None
    lost: bool = False
    errors: dict[str, str] = field(default_factory=dict)


class XidCount(NamedTuple):
    """One GPU's Xid events as the agent saw them: ``total`` since the agent started, ``recent``
    the Xid numbers since the tray's previous message (oldest first, at most `XIDS_PER_MESSAGE`).
    """

    total: int
    recent: list[int]


XIDS_PER_MESSAGE = 16
"""The most Xid numbers one message lists per GPU (``xid_total`` counts them all)."""


@dataclass(frozen=True, slots=True)
class TrayInfo:
    """Where a tray is and what the agent cannot read yet (no BMC source): ``site``, ``row``,
    ``rack``, ``tray``; ``non_gpu_power_w`` added to the GPUs' sum as the tray's input power;
    ``coolant_out_temp_c`` reported as the outlet temperature; the leak sensor is reported
    faulted (``leak`` false means nothing) while there is no leak source."""

    site: str
    row: str
    rack: str
    tray: int
    non_gpu_power_w: float
    coolant_out_temp_c: float


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _u64(n: int | None) -> int | None:
    return n if n is not None and 0 <= n < 2**64 else None


def _nonneg(x: float | None) -> float | None:
    x = _finite(x)
    return x if x is not None and x >= 0 else None


def tray_payload(info: TrayInfo, gpus: Sequence[GpuReading], caps: TrayCaps, *,
                 ts_ns: int, cap_expires_in_s: float | None, cap_enforceable: bool = True,
                 cap_clamped: bool | None = None,
                 ports: Mapping[int, dict[str, Any] | None] | None = None,
                 bmc: BmcReading | None = None,
                 tray_limit_w: float | None = None,
                 xids: Mapping[int, XidCount] | None = None,
                 safe_gpu_cap_w: float | None = None) -> dict[str, Any]:
    """The ``telemetry/trayNN`` payload (contract v1) of one tray.

    The agent block reports what is **enforced** (read back): ``enforced_gpu_cap_w`` is the
    highest read-back limit of the tray's GPUs, ``enforced_tray_cap_w`` their sum;
    ``power_cap_w`` / ``gpu_power_cap_w`` are racky's settings (null: none, or expired);
    ``capping`` is true when a GPU reports ``sw_power_cap``. This agent applies no floor, ramp
    limit or power state (those commands are refused): ``floor_w`` 0, ``flooring`` and
    ``ramp_limited`` false. Contract 1.1 fields: per GPU ``power_kind``, ``energy_mj``,
    ``power_limit_w`` (read back) and the device's ``power_limit_min_w`` / ``_max_w`` /
    ``_default_w`` (what racky's cap-drift classification needs); the agent's
    ``cap_enforceable`` (false: read only, e.g. DCGM or a dry run) and ``cap_clamped``.
    ``ports``: rack GPU -> its port block (`trayagent.core.ports.port_block`; None: not
    publishable now); a GPU not in it carries no ``ports`` key. ``bmc``: the tray's fresh BMC
    reading (None: none): its input power, outlet temperature and leak state replace the
    estimate (GPUs + ``non_gpu_power_w``), ``info.coolant_out_temp_c`` and "leak sensor
    faulted", figure by figure where known. ``tray_limit_w``: a tray capped at its BMC, the
    power Control's ``SetPoint`` read back, W: it is the ``enforced_tray_cap_w`` (None: the
    GPUs' sum). Contract 1.2: per GPU its ECC volatile totals (null: not read) and, from
    ``xids`` (rack GPU -> `XidCount`; a GPU not in it, or None: the source offers no Xid
    events, both null), ``xid_total`` and ``xids`` (at most `XIDS_PER_MESSAGE`, the newest).
    ``safe_gpu_cap_w``: the per-GPU safe cap the agent falls to, as enforced
    (`trayagent.core.caps.CapBook.safe_gpu_w`), W; None when the agent cannot apply caps
    (contract 1.2 ``agent.safe_gpu_cap_w``).

    Raises:
        NotPublishable: a GPU's power or enforced limit is unknown (the contract has no null
            for them), or the tray has no GPU.
    """
    if not gpus:
        raise NotPublishable("no GPU read")
    items: list[dict[str, Any]] = []
    limits: list[float] = []
    powers: list[float] = []
    for g in gpus:
        p = _finite(g.power_w)
        if p is None or p < 0:
            raise NotPublishable(f"gpu {g.gpu}: power unknown "
                                 f"({g.errors.get('power_w', 'not read')})")
        lim = _finite(g.limit_w)
        if lim is None or lim < 0:
            raise NotPublishable(f"gpu {g.gpu}: enforced power limit unknown "
                                 f"({g.errors.get('limit_w', 'not read')})")
        limits.append(lim)
        powers.append(p)
        u = _finite(g.utilization)
        items.append({
            "gpu": g.gpu, "power_w": p, "temp_c": _finite(g.temp_c),
            "t_limit_c": _finite(g.t_limit_c), "throttle_reasons": list(g.reasons),
            "shut_down": g.lost,
            "utilization": None if u is None else min(1.0, max(0.0, u)),
            "power_kind": g.power_kind,
            "energy_mj": g.energy_mj if g.energy_mj is not None and 0 <= g.energy_mj < 2**64
            else None,
            "power_limit_w": lim,
            "power_limit_min_w": _nonneg(g.limits.min_w),
            "power_limit_max_w": _nonneg(g.limits.max_w),
            "power_limit_default_w": _nonneg(g.limits.default_w),
            "ecc_corrected_volatile": _u64(g.ecc_corrected_volatile),
            "ecc_uncorrected_volatile": _u64(g.ecc_uncorrected_volatile),
            "xid_total": None, "xids": None,
        })
        x = None if xids is None else xids.get(g.gpu)
        if x is not None:
            items[-1]["xid_total"] = _u64(x.total)
            items[-1]["xids"] = [int(v) for v in x.recent[-XIDS_PER_MESSAGE:]]
        if ports is not None and g.gpu in ports:
            items[-1]["ports"] = ports[g.gpu]
    capping = any(POWER_CAP_REASONS.intersection(g.reasons) for g in gpus)
    return {
        "schema_version": SCHEMA_VERSION, "ts_ns": ts_ns, "site": info.site, "row": info.row,
        "rack": info.rack, "tray": info.tray, "powered": True,
        "power_w": sum(powers) + info.non_gpu_power_w if bmc is None or bmc.power_w is None
        else bmc.power_w,
        "coolant_out_temp_c": info.coolant_out_temp_c
        if bmc is None or bmc.coolant_out_temp_c is None else bmc.coolant_out_temp_c,
        "leak": bmc is not None and bmc.leak is not None and bmc.leak.leak,
        "leak_sensor_fault": bmc is None or bmc.leak is None or bmc.leak.fault,
        "agent": {
            "enforced_gpu_cap_w": max(limits),
            "enforced_tray_cap_w": sum(limits) if tray_limit_w is None or not
            math.isfinite(tray_limit_w) or tray_limit_w < 0 else tray_limit_w,
            "floor_w": 0.0, "power_cap_w": caps.power_cap_w,
            "gpu_power_cap_w": caps.gpu_power_cap_w, "power_floor_pct": 0.0,
            "ramp_up_w_per_s": None, "ramp_down_w_per_s": None,
            "ramp_down_hysteresis_s": 0.0, "capping": capping, "flooring": False,
            "ramp_limited": False, "epoch": caps.epoch,
            "cap_expires_in_s": None if cap_expires_in_s is None
            else round(cap_expires_in_s, 3),
            "cap_enforceable": cap_enforceable, "cap_clamped": cap_clamped,
            "safe_gpu_cap_w": _nonneg(safe_gpu_cap_w) if cap_enforceable else None,
        },
        "gpus": items,
    }
