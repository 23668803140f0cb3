"""Link fabric of one NVL72-class rack: per-port state, throughput and error counters (pure, numpy).

One rack = ``gpus`` GPUs × (``nvlink_ports_per_gpu`` NVLink ports + ``nic_ports_per_gpu`` NIC
ports); the defaults give 72 × (18 + 2) = 1,440 ports (REFERENCE §1.1 / §3.1: 18 NVLink 5
links per GPU at 53,125 MB/s). Every per-port quantity is one numpy array of shape ``(ports,)``
(counters: one ``(counters, ports)`` matrix); `LinkFabric.step` has no Python loop over ports
or GPUs, so its cost is a constant number of numpy calls (tested by counting Python calls).

Usage::

    fabric = LinkFabric(seed=3)                        # 72 GPUs, 1,440 ports
    p = fabric.port_index("gpu07/nic1")
    fabric.flap(p, down_s=0.4, up_s=0.6, count=3)      # 3 DOWN→UP cycles from now
    fabric.ramp_error_rate("gpu07/nvl03", "nvl_crc_flit_errors", 0.5 / 60, 5 / 60, 86_400.0)
    for k in range(3600):
        fabric.step(1.0, demand, t_s=float(k))         # demand: shape (72,), in [0, 1]
        snap = fabric.snapshot()                       # {"link_up": (1440,) bool, ...}
    fabric.fault_log()                                 # ground truth: kind, target, start, end

Port order is GPU-major: port ``g * ports_per_gpu + j`` is ``gpu{g}/nvl{j}`` for ``j <
nvlink_ports_per_gpu`` and ``gpu{g}/nic{j - nvlink_ports_per_gpu}`` after that; names are
zero-padded (``gpu07/nvl03``, ``gpu07/nic1``).

Counters (`COUNTERS`; width, wrap or saturate, which port kind carries it, source). Snapshot
arrays have the counter's native unsigned dtype (uint8/16/32/64), so a consumer sees the real
width; wrap arithmetic on them is modulo 2^bits, saturating counters stop at 2^bits − 1 until
a reset (a saturated counter's rate is unknown, never "0, healthy"):

====================== ==== ======== ====== =====================================================
name                   bits overflow kinds  source
====================== ==== ======== ====== =====================================================
nvl_crc_flit_errors    64   wrap     nvlink DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL / NVML
                                            nvmlDeviceGetNvLinkErrorCounter (unsigned long long)
nvl_crc_data_errors    64   wrap     nvlink DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL
nvl_replay_errors      64   wrap     nvlink DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL
nvl_recovery_errors    64   wrap     nvlink DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL
symbol_error           16   saturate nic    IBA PortCounters SymbolErrorCounter; Linux
                                            drivers/infiniband/core/sysfs.c PORT_PMA_ATTR width 16
link_error_recovery    8    saturate nic    IBA LinkErrorRecoveryCounter (sysfs width 8)
link_downed            8    saturate both   IBA LinkDownedCounter (sysfs width 8); NVLink: [U]
port_rcv_errors        16   saturate nic    IBA PortRcvErrors (sysfs width 16)
carrier_changes        32   wrap     both   Linux /sys/class/net/<if>/carrier_changes (32-bit,
                                            FIELD-CASES BR-13 source rezolus#289); NVLink: [U]
rx_bytes, tx_bytes     64   wrap     both   Linux rtnl_link_stats64 rx_bytes/tx_bytes; NVLink:
                                            nvidia-smi nvlink data counters [U]
====================== ==== ======== ====== =====================================================

Counters of the other port kind exist in the matrix but stay 0 on that kind (snapshot key
``is_nvlink`` says which kind a port is). NVLink has no native link-down or carrier counter;
the model keeps both for NVLink ports as the node agent's count of its own link-state polls
[U], and a DOWN→UP on an NVLink port also counts one ``nvl_recovery_errors`` (a link retrain)
[U].

Error model. Each rate counter draws Poisson counts per step with mean ``rate_per_s × up
time in the step`` (no errors while the link is down). Healthy rates (`FabricParams`): the
pre-FEC counters ``symbol_error`` (NIC) and ``nvl_crc_flit_errors`` (NVLink) at λ0 = 0.5/min
(REFERENCE §3.3 [D]; issue 5: "non-zero healthy rate, never > 0"); replay, recovery,
link-error-recovery, port-rcv and link-downed at zero (REFERENCE §3.2 DCGM / NVSentinel:
any increase fails). BER (snapshot ``ber``) is pre-FEC errors since the last counter reset
divided by the line bits carried while up (NaN before any bit: unknown, never 0); the line
rate is 53,125 MB/s × 8 for NVLink and ``nic_speed_mb_per_s`` × 8 for a NIC port, so the
healthy λ0 is a BER ≈ 2e-14 and IBTA's 1e-12 (REFERENCE §3.2) is ≈ 25/min at NVLink 5's rate
(REFERENCE's "120 per hour" matches a ~33 Gb/s lane; rates here are per port).

Time convention. ``step(dt_s, demand, t_s)`` advances the interval ``[t_s, t_s + dt_s)``;
``t_s`` must continue from the previous step (or ``start_time_s``). A snapshot taken after
the step is the state at ``t_s + dt_s`` and reflects every link transition strictly before
that instant. Rates, ramps, stalls and bursts are evaluated at the step midpoint (exact for a
linear ramp); link flaps are resolved to the transition instant, so a flap shorter than a
poll interval changes ``carrier_changes`` while both polls read ``up`` (FIELD-CASES BR-13 b).

Faults (hooks, applied at the fabric's current time ``time_s`` unless ``start_s`` is given)
are recorded as ground truth in `fault_log`: `flap`, `hold_down`, `set_error_rate`,
`ramp_error_rate`, `degrade_ber`, `restore_error_rate`, `reboot`, `stall`, `silence`, `burst`.

Power state. `power_off` / `power_on` (the tray power-state hook `sims.row` calls when a tray
is switched, a GPU shuts down or the rack browns out) take a GPU's links DOWN and, at power-on,
reboot it and train its links UP again; they are operations, not faults (not in `fault_log`).
Bad arguments raise ValueError naming the argument and nothing is changed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field, field_validator

from rackplane.config import StrictModel

__all__ = [
    "COUNTERS",
    "COUNTER_NAMES",
    "POST_FEC_COUNTER",
    "PRE_FEC_COUNTER",
    "RATE_COUNTERS",
    "CounterSpec",
    "FabricParams",
    "FaultRecord",
    "LinkFabric",
]

PortKind = Literal["nvlink", "nic"]
PortRef = int | str

_NVL: frozenset[str] = frozenset({"nvlink"})
_NIC: frozenset[str] = frozenset({"nic"})
_BOTH: frozenset[str] = frozenset({"nvlink", "nic"})


@dataclass(frozen=True, slots=True)
class CounterSpec:
    """One hardware counter: its width, what happens at the top, who carries it, its source."""

    name: str
    bits: int
    overflow: Literal["wrap", "saturate"]
    kinds: frozenset[str]
    source: str

    @property
    def max_value(self) -> int:
        """Largest value the counter holds: 2^bits − 1."""
        return (1 << self.bits) - 1

    @property
    def dtype(self) -> type[np.unsignedinteger[Any]]:
        """The native numpy dtype of the counter's width."""
        table: dict[int, type[np.unsignedinteger[Any]]] = {
            8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64,
        }
        return table[self.bits]


#: Every counter, in the row order of the internal counter matrix (see the module docstring).
COUNTERS: tuple[CounterSpec, ...] = (
    CounterSpec("nvl_crc_flit_errors", 64, "wrap", _NVL,
                "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL (NVML unsigned long long) [S]"),
    CounterSpec("nvl_crc_data_errors", 64, "wrap", _NVL,
                "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL [S]"),
    CounterSpec("nvl_replay_errors", 64, "wrap", _NVL,
                "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL [S]"),
    CounterSpec("nvl_recovery_errors", 64, "wrap", _NVL,
                "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL [S]"),
    CounterSpec("symbol_error", 16, "saturate", _NIC,
                "IBA PortCounters SymbolErrorCounter; linux drivers/infiniband/core/sysfs.c [S]"),
    CounterSpec("link_error_recovery", 8, "saturate", _NIC,
                "IBA PortCounters LinkErrorRecoveryCounter; linux sysfs width 8 [S]"),
    CounterSpec("link_downed", 8, "saturate", _BOTH,
                "IBA PortCounters LinkDownedCounter; linux sysfs width 8 [S]; NVLink [U]"),
    CounterSpec("port_rcv_errors", 16, "saturate", _NIC,
                "IBA PortCounters PortRcvErrors; linux sysfs width 16 [S]"),
    CounterSpec("carrier_changes", 32, "wrap", _BOTH,
                "linux /sys/class/net/<if>/carrier_changes, 32-bit (FIELD-CASES BR-13) [S]"),
    CounterSpec("rx_bytes", 64, "wrap", _BOTH,
                "linux rtnl_link_stats64.rx_bytes [S]; NVLink data counters [U]"),
    CounterSpec("tx_bytes", 64, "wrap", _BOTH,
                "linux rtnl_link_stats64.tx_bytes [S]; NVLink data counters [U]"),
)
COUNTER_NAMES: tuple[str, ...] = tuple(c.name for c in COUNTERS)
_ROW: dict[str, int] = {n: i for i, n in enumerate(COUNTER_NAMES)}
_SPEC: dict[str, CounterSpec] = {c.name: c for c in COUNTERS}

#: Counters driven by a Poisson error rate (the others move with link state and traffic).
RATE_COUNTERS: tuple[str, ...] = (
    "nvl_crc_flit_errors",
    "nvl_crc_data_errors",
    "nvl_replay_errors",
    "nvl_recovery_errors",
    "symbol_error",
    "link_error_recovery",
    "port_rcv_errors",
)
#: The counter `degrade_ber` raises and BER is computed from, per port kind.
PRE_FEC_COUNTER: dict[str, str] = {"nvlink": "nvl_crc_flit_errors", "nic": "symbol_error"}
#: Post-FEC (uncorrectable) counter `degrade_ber` raises by ``post_fec_fraction``.
POST_FEC_COUNTER: dict[str, str] = {"nvlink": "nvl_crc_data_errors", "nic": "port_rcv_errors"}

_RATE_ROW: dict[str, int] = {n: i for i, n in enumerate(RATE_COUNTERS)}
_RATE_TO_CTR = np.array([_ROW[n] for n in RATE_COUNTERS], dtype=np.intp)
_R_LD = _ROW["link_downed"]
_R_CC = _ROW["carrier_changes"]
_R_REC = _ROW["nvl_recovery_errors"]
_R_RX = _ROW["rx_bytes"]
_R_TX = _ROW["tx_bytes"]
_R_FLIT = _ROW["nvl_crc_flit_errors"]
_R_SYM = _ROW["symbol_error"]
_U64_ALL = np.uint64(0xFFFF_FFFF_FFFF_FFFF)
_MASK_COL = np.array(
    [[c.max_value if c.overflow == "wrap" else 0xFFFF_FFFF_FFFF_FFFF] for c in COUNTERS],
    dtype=np.uint64,
)
_MAX_COL = np.array(
    [[c.max_value if c.overflow == "saturate" else 0xFFFF_FFFF_FFFF_FFFF] for c in COUNTERS],
    dtype=np.uint64,
)
#: Transition instants within this many seconds of a poll count as "at" the poll (float noise).
_T_EPS_S = 1e-9


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


class LinkFabric:
    """Per-port link state, throughput and counters of one rack, stepped with an explicit dt.

    Args:
        gpus: GPUs in the rack (72 for NVL72, REFERENCE §1.1).
        nvlink_ports_per_gpu: NVLink ports per GPU (18 NVLink 5 links, REFERENCE §1.1 / §3.1).
        nic_ports_per_gpu: NIC ports per GPU (2; issue 3).
        seed: seeds every random draw; same seed and same call sequence, same trace.
        params: `FabricParams` (defaults when None).
        start_time_s: fabric time before the first step, s.

    Raises:
        ValueError: counts below their minimum (``gpus`` < 1, no ports, negative port counts).
    """

    def __init__(
        self,
        gpus: int = 72,
        nvlink_ports_per_gpu: int = 18,
        nic_ports_per_gpu: int = 2,
        seed: int = 0,
        params: FabricParams | None = None,
        *,
        start_time_s: float = 0.0,
    ) -> None:
        for name, v, lo in (("gpus", gpus, 1), ("nvlink_ports_per_gpu", nvlink_ports_per_gpu, 0),
                            ("nic_ports_per_gpu", nic_ports_per_gpu, 0)):
            if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < lo:
                raise ValueError(f"{name} must be an integer >= {lo} (got {v!r})")
        if nvlink_ports_per_gpu + nic_ports_per_gpu < 1:
            raise ValueError("a GPU needs at least one port (nvlink_ports_per_gpu + nic_ports)")
        self.params = params if params is not None else FabricParams()
        p = self.params
        self.gpus = int(gpus)
        self.nvlink_ports_per_gpu = int(nvlink_ports_per_gpu)
        self.nic_ports_per_gpu = int(nic_ports_per_gpu)
        self.ports_per_gpu = self.nvlink_ports_per_gpu + self.nic_ports_per_gpu
        self.n_ports = self.gpus * self.ports_per_gpu
        self._time_s = _finite("start_time_s", start_time_s)

        ss = np.random.SeedSequence(int(seed))
        err_ss, traffic_ss, id_ss = ss.spawn(3)
        self._rng_err = np.random.Generator(np.random.PCG64(err_ss))
        self._rng_traffic = np.random.Generator(np.random.PCG64(traffic_ss))
        self._rng_ids = np.random.Generator(np.random.PCG64(id_ss))

        n, ppg = self.n_ports, self.ports_per_gpu
        local = np.arange(n) % ppg
        self._port_gpu = np.arange(n) // ppg
        self._is_nvl = local < self.nvlink_ports_per_gpu
        self._port_gpu.setflags(write=False)
        self._is_nvl.setflags(write=False)
        w = max(2, len(str(self.gpus - 1)))
        wn = max(2, len(str(max(self.nvlink_ports_per_gpu - 1, 0))))
        self._names = [
            f"gpu{g:0{w}d}/nvl{j:0{wn}d}" if j < self.nvlink_ports_per_gpu
            else f"gpu{g:0{w}d}/nic{j - self.nvlink_ports_per_gpu}"
            for g in range(self.gpus) for j in range(ppg)
        ]
        self._index = {name: i for i, name in enumerate(self._names)}
        self._gpu_width = w

        # static per-port figures
        self._speed_mb = np.where(self._is_nvl, p.nvlink_speed_mb_per_s, p.nic_speed_mb_per_s)
        self._speed_bytes = self._speed_mb * 1e6
        self._line_bits_per_s = self._speed_bytes * 8.0
        self._share = np.where(self._is_nvl, p.nvlink_demand_share, p.nic_demand_share)
        kinds = np.array([[("nvlink" in c.kinds), ("nic" in c.kinds)] for c in COUNTERS])
        self._applies = np.where(self._is_nvl[None, :], kinds[:, :1], kinds[:, 1:])  # (C, P)
        self._rate_applies = self._applies[_RATE_TO_CTR]  # (R, P)

        # healthy rates per s, per (rate counter, port)
        healthy = np.zeros((len(RATE_COUNTERS), n))
        for name, per_min in p.healthy_rate_per_min.items():
            healthy[_RATE_ROW[name]] = per_min / 60.0
        self._healthy = healthy * self._rate_applies
        self._rate_base = self._healthy.copy()
        self._ramp_on = np.zeros_like(self._rate_base, dtype=bool)
        self._ramp_t0 = np.zeros_like(self._rate_base)
        self._ramp_dur = np.ones_like(self._rate_base)
        self._ramp_from = np.zeros_like(self._rate_base)
        self._ramp_to = np.zeros_like(self._rate_base)
        self._n_ramps = 0
        self._active_rows = np.zeros(0, dtype=np.intp)
        self._refresh_active_rows()

        # counters and their side figures
        self._ctr = np.zeros((len(COUNTERS), n), dtype=np.uint64)
        self._prefec_total = np.zeros(n)
        self._line_bits_total = np.zeros(n)
        self._byte_carry = np.zeros((2, n))
        self._thr = np.zeros((2, n))  # tx, rx bytes/s averaged over the last step

        # link state and its down schedules (flap / hold_down): one per port at a time
        self._link_up = np.ones(n, dtype=bool)
        self._fl_on = np.zeros(n, dtype=bool)
        self._fl_start = np.zeros(n)
        self._fl_down = np.ones(n)
        self._fl_up = np.zeros(n)
        self._fl_count = np.zeros(n)
        self._fl_end = np.zeros(n)
        self._fl_idx = np.zeros(0, dtype=np.intp)

        # traffic irregularities
        self._stall_until = np.full(self.gpus, -np.inf)
        self._burst_until = np.full(self.gpus, -np.inf)
        self._burst_level = np.zeros(self.gpus)
        self._silence_until = np.full(n, -np.inf)

        # per GPU power state (the tray power-state hook) and identity
        self._powered = np.ones(self.gpus, dtype=bool)
        self._uptime_s = np.full(self.gpus, p.initial_uptime_s)
        self._boot_id = self._rng_ids.integers(1, 2**63, size=self.gpus, dtype=np.int64).astype(
            np.uint64
        )

        self._faults: list[dict[str, Any]] = []
        self._open_rate: dict[tuple[int, int], int] = {}  # (port, rate row) -> fault index

    # --- identity -------------------------------------------------------------------------

    @property
    def time_s(self) -> float:
        """Fabric time, s: the end of the last step (or ``start_time_s``)."""
        return self._time_s

    @property
    def port_gpu(self) -> npt.NDArray[np.intp]:
        """GPU index of each port, shape (ports,), read-only."""
        return self._port_gpu

    @property
    def is_nvlink(self) -> npt.NDArray[np.bool_]:
        """True for NVLink ports, False for NIC ports, shape (ports,), read-only."""
        return self._is_nvl

    def port_names(self) -> list[str]:
        """Port names in port order, e.g. ``gpu07/nvl03``, ``gpu07/nic1`` (a new list)."""
        return list(self._names)

    def port_index(self, name: str) -> int:
        """Index of port ``name``. Raises ValueError for an unknown name."""
        try:
            return self._index[name]
        except (KeyError, TypeError):
            raise ValueError(
                f"unknown port {name!r} (names look like {self._names[0]!r})"
            ) from None

    def gpu_name(self, gpu: int) -> str:
        """``gpu07`` style name of GPU ``gpu``."""
        return f"gpu{self._gpu(gpu):0{self._gpu_width}d}"

    def ports_of_gpu(self, gpu: int) -> range:
        """Port indices of GPU ``gpu``. Raises ValueError for a GPU out of range."""
        g = self._gpu(gpu)
        return range(g * self.ports_per_gpu, (g + 1) * self.ports_per_gpu)

    def _port(self, port: PortRef) -> int:
        if isinstance(port, str):
            return self.port_index(port)
        if isinstance(port, bool) or not isinstance(port, int | np.integer):
            raise ValueError(f"port must be an index or a port name (got {port!r})")
        if not 0 <= int(port) < self.n_ports:
            raise ValueError(f"port index {port} out of range 0..{self.n_ports - 1}")
        return int(port)

    def _gpu(self, gpu: int) -> int:
        if isinstance(gpu, bool) or not isinstance(gpu, int | np.integer):
            raise ValueError(f"gpu must be an integer index (got {gpu!r})")
        if not 0 <= int(gpu) < self.gpus:
            raise ValueError(f"gpu index {gpu} out of range 0..{self.gpus - 1}")
        return int(gpu)

    def _kind(self, p: int) -> PortKind:
        return "nvlink" if self._is_nvl[p] else "nic"

    def _rate_counter(self, p: int, counter: str) -> int:
        if counter not in _RATE_ROW:
            if counter in _ROW:
                raise ValueError(
                    f"{counter} has no error rate: it moves with link state or traffic "
                    f"(use flap/hold_down, or the traffic demand); rate counters: {RATE_COUNTERS}"
                )
            raise ValueError(f"unknown counter {counter!r}; rate counters: {RATE_COUNTERS}")
        if self._kind(p) not in _SPEC[counter].kinds:
            raise ValueError(
                f"{counter} is not a counter of {self._kind(p)} port {self._names[p]}"
            )
        return _RATE_ROW[counter]

    # --- stepping -------------------------------------------------------------------------

    def step(
        self, dt_s: float, traffic_demand: npt.ArrayLike, t_s: float
    ) -> None:
        """Advance the interval ``[t_s, t_s + dt_s)``.

        Args:
            dt_s: step length, s (> 0, finite).
            traffic_demand: per-GPU traffic demand, shape (gpus,), each in [0, 1] of link
                bandwidth; a port carries ``demand × share × speed`` per direction (shares in
                `FabricParams`), ±``traffic_jitter``, capped at its speed, zero while down,
                stalled or silenced.
            t_s: plant time at the start of the step, s; must equal `time_s` (within 1 µs).

        Raises:
            ValueError: bad ``dt_s``, a ``t_s`` that does not continue the fabric's time, or a
                demand of the wrong shape, not finite or outside [0, 1]. Nothing changes then.
        """
        dt = _finite("dt_s", dt_s, lo=0.0, lo_open=True)
        t0 = _finite("t_s", t_s)
        if abs(t0 - self._time_s) > 1e-6 + 1e-12 * abs(t0):
            raise ValueError(
                f"t_s={t0!r} does not continue the fabric's time {self._time_s!r} "
                "(step t_s is the start of the interval)"
            )
        demand = np.asarray(traffic_demand, dtype=np.float64)
        if demand.shape != (self.gpus,):
            raise ValueError(f"traffic_demand must have shape ({self.gpus},) (got {demand.shape})")
        if not (np.isfinite(demand).all() and (demand >= 0.0).all() and (demand <= 1.0).all()):
            raise ValueError("traffic_demand values must be finite and within [0, 1]")
        t1 = t0 + dt
        tm = t0 + 0.5 * dt
        n = self.n_ports

        # 1. link transitions inside [t0, t1) and down time (only ports with a schedule)
        downs = np.zeros(n, dtype=np.uint64)
        ups = np.zeros(n, dtype=np.uint64)
        up_time = np.full(n, dt)
        idx = self._fl_idx
        if idx.size:
            s, d, u = self._fl_start[idx], self._fl_down[idx], self._fl_up[idx]
            cnt = self._fl_count[idx]
            per = d + u
            nd0, nd1 = _n_before(t0, s, per, cnt), _n_before(t1, s, per, cnt)
            nu0, nu1 = _n_before(t0, s + d, per, cnt), _n_before(t1, s + d, per, cnt)
            downs[idx] = (nd1 - nd0).astype(np.uint64)
            ups[idx] = (nu1 - nu0).astype(np.uint64)
            up_time[idx] = dt - (_down_time(t1, s, d, per, cnt) - _down_time(t0, s, d, per, cnt))
            self._link_up[idx] = nd1 <= nu1
            done = t1 > self._fl_end[idx] + _T_EPS_S  # the last UP is inside this step
            if done.any():
                self._fl_on[idx[done]] = False
                self._link_up[idx[done]] = True
                self._fl_idx = np.flatnonzero(self._fl_on)
        np.clip(up_time, 0.0, dt, out=up_time)
        if not self._powered.all():  # a powered-off GPU: links down, no traffic, no counts
            off = ~self._powered[self._port_gpu]
            self._link_up[off] = False
            up_time[off] = 0.0
            downs[off] = 0
            ups[off] = 0

        # 2. traffic
        dem = np.where(self._burst_until > tm, np.maximum(demand, self._burst_level), demand)
        dem[self._stall_until > tm] = 0.0
        port_dem = dem[self._port_gpu] * self._share
        port_dem[self._silence_until > tm] = 0.0
        jitter = self._rng_traffic.standard_normal((2, n))
        frac = np.clip(port_dem * (1.0 + self.params.traffic_jitter * jitter), 0.0, 1.0)
        moved = frac * (self._speed_bytes * up_time)  # bytes per direction in this step
        self._thr = moved / dt
        moved += self._byte_carry
        whole = np.floor(moved)
        self._byte_carry = moved - whole

        # 3. errors: Poisson with mean rate × up time, only for rows with any rate
        rows = self._active_rows
        delta = np.zeros((len(COUNTERS), n), dtype=np.uint64)
        if rows.size:
            rate = self._rates_at(tm)[rows] if self._n_ramps else self._rate_base[rows]
            counts = self._rng_err.poisson(rate * up_time)
            delta[_RATE_TO_CTR[rows]] = counts.astype(np.uint64)
            if self._n_ramps:
                self._finish_ramps(t1)
        delta[_R_LD] += downs
        delta[_R_CC] += downs + ups
        delta[_R_REC] += ups * self._is_nvl
        delta[_R_TX] = whole[0].astype(np.uint64)
        delta[_R_RX] = whole[1].astype(np.uint64)

        # 4. counters: wrap (mask) or saturate (min) per row; uint64 adds wrap at 2^64
        self._ctr = np.minimum((self._ctr + delta) & _MASK_COL, _MAX_COL)
        self._prefec_total += (delta[_R_FLIT] + delta[_R_SYM]).astype(np.float64)
        self._line_bits_total += self._line_bits_per_s * up_time
        self._uptime_s += dt * self._powered
        self._time_s = t1

    def _rates_at(self, t: float) -> npt.NDArray[np.float64]:
        on = self._ramp_on
        frac = np.clip((t - self._ramp_t0) / self._ramp_dur, 0.0, 1.0)
        ramp = self._ramp_from + (self._ramp_to - self._ramp_from) * frac
        return np.where(on & (t >= self._ramp_t0), ramp, self._rate_base)

    def _finish_ramps(self, t: float) -> None:
        done = self._ramp_on & (t >= self._ramp_t0 + self._ramp_dur)
        if done.any():
            self._rate_base[done] = self._ramp_to[done]
            self._ramp_on[done] = False
            self._n_ramps = int(self._ramp_on.sum())
            self._refresh_active_rows()

    def _refresh_active_rows(self) -> None:
        self._active_rows = np.flatnonzero(
            (self._rate_base > 0.0).any(axis=1) | self._ramp_on.any(axis=1)
        )

    # --- outputs --------------------------------------------------------------------------

    def snapshot(self) -> dict[str, npt.NDArray[Any]]:
        """The fabric as telemetry would read it now (at `time_s`); new arrays, safe to keep.

        Returns:
            Per port, shape (ports,): every counter of `COUNTERS` in its native dtype
            (uint8/16/32/64), ``link_up`` (bool; NVLink "active"), ``link_speed_mb_per_s``
            (speed per direction, 0 while down), ``tx_bytes_per_s`` / ``rx_bytes_per_s``
            (average over the last step), ``ber`` (pre-FEC errors since the last reset per
            line bit carried; NaN before any bit), ``is_nvlink`` (bool), ``port_gpu`` (int).
            Per GPU, shape (gpus,): ``uptime_s`` (float64, s since the last reboot) and
            ``boot_id`` (uint64; changes on every reboot, FIELD-CASES BR-11).
        """
        out: dict[str, npt.NDArray[Any]] = {
            c.name: self._ctr[i].astype(c.dtype) for i, c in enumerate(COUNTERS)
        }
        out["link_up"] = self._link_up.copy()
        out["link_speed_mb_per_s"] = self._speed_mb * self._link_up
        out["tx_bytes_per_s"] = self._thr[0].copy()
        out["rx_bytes_per_s"] = self._thr[1].copy()
        with np.errstate(invalid="ignore", divide="ignore"):
            out["ber"] = np.where(
                self._line_bits_total > 0.0, self._prefec_total / self._line_bits_total, np.nan
            )
        out["is_nvlink"] = self._is_nvl.copy()
        out["port_gpu"] = self._port_gpu.copy()
        out["uptime_s"] = self._uptime_s.copy()
        out["boot_id"] = self._boot_id.copy()
        return out

    def truth(self) -> dict[str, npt.NDArray[Any]]:
        """Unsensed state for scoring: ``<rate counter>_rate_per_s`` (ports,) at `time_s`,
        ``ber_rate`` (current pre-FEC rate per line bit/s), ``down_scheduled`` (bool: a flap
        or hold-down is in progress or pending)."""
        rates = self._rates_at(self._time_s) if self._n_ramps else self._rate_base
        out: dict[str, npt.NDArray[Any]] = {
            f"{name}_rate_per_s": rates[i].copy() for i, name in enumerate(RATE_COUNTERS)
        }
        pre = np.where(self._is_nvl, rates[_RATE_ROW["nvl_crc_flit_errors"]],
                       rates[_RATE_ROW["symbol_error"]])
        out["ber_rate"] = pre / self._line_bits_per_s
        out["down_scheduled"] = self._fl_on.copy()
        return out

    def fault_log(self) -> list[FaultRecord]:
        """Every injected fault so far, in injection order (new records, ground truth)."""
        return [
            FaultRecord(
                kind=f["kind"], target=f["target"], gpu=f["gpu"], port=f["port"],
                start_s=f["start_s"], end_s=f["end_s"], detail=dict(f["detail"]),
            )
            for f in self._faults
        ]

    def _record(
        self, kind: str, *, port: int | None, gpu: int, start_s: float, end_s: float | None,
        **detail: float | str,
    ) -> int:
        target = self._names[port] if port is not None else self.gpu_name(gpu)
        self._faults.append({
            "kind": kind, "target": target, "gpu": gpu, "port": port,
            "start_s": start_s, "end_s": end_s, "detail": detail,
        })
        return len(self._faults) - 1

    # --- link-state faults ----------------------------------------------------------------

    def flap(
        self, port: PortRef, down_s: float, up_s: float, count: int = 1,
        *, start_s: float | None = None,
    ) -> None:
        """``count`` DOWN→UP cycles on ``port``: down for ``down_s``, then up for ``up_s``.

        The first DOWN is at ``start_s`` (default: now). Each DOWN adds 1 to ``link_downed``
        (8-bit, saturating) and each transition 1 to ``carrier_changes`` (32-bit, wraps);
        each UP of an NVLink port adds 1 to ``nvl_recovery_errors``. Transitions are placed at
        their exact instants, so cycles shorter than the step or the poll interval are counted
        while the polled state may read ``up`` (FIELD-CASES BR-13 b). REFERENCE §5 S7:
        ``flap(p, down_s=5, up_s=155, count=3)`` is 3 link-downs within 8 min.

        Raises:
            ValueError: ``down_s`` <= 0, ``up_s`` < 0 (or 0 with count > 1), ``count`` < 1,
                ``start_s`` before now, or a flap/hold-down still pending on the port.
        """
        p = self._port(port)
        d = _finite("down_s", down_s, lo=0.0, lo_open=True)
        u = _finite("up_s", up_s, lo=0.0)
        if isinstance(count, bool) or not isinstance(count, int | np.integer) or count < 1:
            raise ValueError(f"count must be an integer >= 1 (got {count!r})")
        if count > 1 and u == 0.0:
            raise ValueError("up_s must be > 0 when count > 1")
        s = self._start(start_s)
        end = self._schedule_down(p, s, d, u, int(count))
        self._record("flap", port=p, gpu=int(self._port_gpu[p]), start_s=s, end_s=end,
                     down_s=d, up_s=u, count=int(count))

    def hold_down(self, port: PortRef, down_s: float, *, start_s: float | None = None) -> None:
        """Take ``port`` down for ``down_s`` (one DOWN, one UP): REFERENCE §5 S7's "DOWN held
        for 5 min" is ``hold_down(p, 300)``. Raises ValueError as `flap` does."""
        p = self._port(port)
        d = _finite("down_s", down_s, lo=0.0, lo_open=True)
        s = self._start(start_s)
        end = self._schedule_down(p, s, d, 0.0, 1)
        self._record("hold_down", port=p, gpu=int(self._port_gpu[p]), start_s=s, end_s=end,
                     down_s=d)

    def _start(self, start_s: float | None) -> float:
        if start_s is None:
            return self._time_s
        s = _finite("start_s", start_s)
        if s < self._time_s - _T_EPS_S:
            raise ValueError(f"start_s={s} is before the fabric's time {self._time_s}")
        return max(s, self._time_s)

    def _schedule_down(self, p: int, s: float, d: float, u: float, count: int) -> float:
        if self._fl_on[p]:
            raise ValueError(
                f"{self._names[p]} already has a flap/hold-down until {self._fl_end[p]} s; "
                "schedule the next one after it ends"
            )
        end = s + (count - 1) * (d + u) + d
        self._fl_on[p] = True
        self._fl_start[p], self._fl_down[p], self._fl_up[p] = s, d, u
        self._fl_count[p], self._fl_end[p] = float(count), end
        self._fl_idx = np.flatnonzero(self._fl_on)
        return end

    # --- error-rate faults ----------------------------------------------------------------

    def set_error_rate(self, port: PortRef, counter: str, per_s: float) -> None:
        """From now, ``counter`` on ``port`` counts Poisson errors at ``per_s`` (absolute rate,
        errors/s while up; replaces the healthy rate and any earlier rate fault on it).

        Raises:
            ValueError: unknown counter, a counter without a rate (link_downed,
                carrier_changes, bytes), a counter the port's kind does not carry, or a
                negative / non-finite rate.
        """
        p = self._port(port)
        r = self._rate_counter(p, counter)
        rate = _finite("per_s", per_s, lo=0.0)
        self._replace_rate_faults(p, [r])
        self._set_base(p, r, rate)
        i = self._record("error_rate", port=p, gpu=int(self._port_gpu[p]), start_s=self._time_s,
                         end_s=None, counter=counter, per_s=rate)
        self._open_rate[(p, r)] = i
        self._refresh_active_rows()

    def ramp_error_rate(
        self, port: PortRef, counter: str, start_per_s: float, end_per_s: float,
        duration_s: float,
    ) -> None:
        """From now, ``counter``'s rate goes linearly from ``start_per_s`` to ``end_per_s``
        over ``duration_s`` and then holds ``end_per_s`` (REFERENCE §5 S8: 0.5 → 5/min over
        24 h is ``ramp_error_rate(p, "symbol_error", 0.5/60, 5/60, 86_400)``; fast: 0.5 →
        10/min over 2 h). Replaces earlier rate faults on the counter. Raises ValueError as
        `set_error_rate`, and for ``duration_s`` <= 0.
        """
        p = self._port(port)
        r = self._rate_counter(p, counter)
        a = _finite("start_per_s", start_per_s, lo=0.0)
        b = _finite("end_per_s", end_per_s, lo=0.0)
        dur = _finite("duration_s", duration_s, lo=0.0, lo_open=True)
        self._replace_rate_faults(p, [r])
        now = self._time_s
        self._rate_base[r, p] = a
        self._ramp_on[r, p] = True
        self._ramp_t0[r, p], self._ramp_dur[r, p] = now, dur
        self._ramp_from[r, p], self._ramp_to[r, p] = a, b
        self._n_ramps = int(self._ramp_on.sum())
        i = self._record("error_ramp", port=p, gpu=int(self._port_gpu[p]), start_s=now,
                         end_s=None, counter=counter, start_per_s=a, end_per_s=b,
                         duration_s=dur, ramp_end_s=now + dur)
        self._open_rate[(p, r)] = i
        self._refresh_active_rows()

    def degrade_ber(self, port: PortRef, ber: float) -> None:
        """From now, the port's pre-FEC counter (`PRE_FEC_COUNTER`) counts at ``ber`` × line
        rate (bits/s) and its post-FEC counter (`POST_FEC_COUNTER`) at ``post_fec_fraction`` ×
        that. IBTA compliance is BER < 1e-12 (REFERENCE §3.2). Raises ValueError for a BER
        outside [0, 1e-3] (beyond that the link would not train)."""
        p = self._port(port)
        b = _finite("ber", ber, lo=0.0)
        if b > 1e-3:
            raise ValueError(f"ber must be <= 1e-3 (got {ber!r})")
        kind = self._kind(p)
        pre, post = _RATE_ROW[PRE_FEC_COUNTER[kind]], _RATE_ROW[POST_FEC_COUNTER[kind]]
        pre_rate = b * float(self._line_bits_per_s[p])
        self._replace_rate_faults(p, [pre, post])
        self._set_base(p, pre, pre_rate)
        self._set_base(p, post, pre_rate * self.params.post_fec_fraction)
        i = self._record("ber", port=p, gpu=int(self._port_gpu[p]), start_s=self._time_s,
                         end_s=None, ber=b, pre_fec_per_s=pre_rate,
                         counter=PRE_FEC_COUNTER[kind])
        self._open_rate[(p, pre)] = i
        self._open_rate[(p, post)] = i
        self._refresh_active_rows()

    def restore_error_rate(self, port: PortRef, counter: str | None = None) -> None:
        """End rate faults on ``port`` (on ``counter`` only, if given): back to healthy rates
        from now, and the faults' records get ``end_s`` = now. Raises ValueError as
        `set_error_rate` for a bad counter."""
        p = self._port(port)
        if counter is None:
            rows = [_RATE_ROW[c] for c in RATE_COUNTERS if self._kind(p) in _SPEC[c].kinds]
        else:
            rows = [self._rate_counter(p, counter)]
        self._replace_rate_faults(p, rows)
        for r in rows:
            self._set_base(p, r, float(self._healthy[r, p]))
        self._refresh_active_rows()

    def _set_base(self, p: int, r: int, rate: float) -> None:
        self._rate_base[r, p] = rate
        if self._ramp_on[r, p]:
            self._ramp_on[r, p] = False
            self._n_ramps = int(self._ramp_on.sum())

    def _replace_rate_faults(self, p: int, rows: Iterable[int]) -> None:
        """Close open rate faults touching (p, row); a closed fault ends as a whole, so its
        other counters go back to healthy too."""
        for r in list(rows):
            i = self._open_rate.get((p, r))
            if i is None:
                continue
            self._faults[i]["end_s"] = self._time_s
            for key in [k for k, v in self._open_rate.items() if v == i]:
                del self._open_rate[key]
                if key[1] != r:
                    self._set_base(key[0], key[1], float(self._healthy[key[1], key[0]]))

    # --- device and traffic faults --------------------------------------------------------

    # --- power state (the tray power-state hook) --------------------------------------------

    @property
    def powered(self) -> npt.NDArray[np.bool_]:
        """Per GPU: powered (its tray on), shape (gpus,) (a copy)."""
        return self._powered.copy()

    def power_off(self, gpu: int) -> None:
        """GPU ``gpu`` loses power now (its tray was switched off, or the rack browned out):
        every port that was up goes DOWN (one ``link_downed`` and one ``carrier_changes`` each,
        as a link partner would see it), carries nothing and counts nothing until
        `power_on`; the GPU's uptime stops. An operation, not a fault: not in `fault_log`.
        Raises ValueError for a bad GPU; nothing happens when it is already off."""
        g = self._gpu(gpu)
        if not self._powered[g]:
            return
        sl = slice(g * self.ports_per_gpu, (g + 1) * self.ports_per_gpu)
        was_up = self._link_up[sl].astype(np.uint64)
        self._ctr[_R_LD, sl] = np.minimum(self._ctr[_R_LD, sl] + was_up, _MAX_COL[_R_LD, 0])
        self._ctr[_R_CC, sl] = (self._ctr[_R_CC, sl] + was_up) & _MASK_COL[_R_CC, 0]
        self._link_up[sl] = False
        self._thr[:, sl] = 0.0
        self._powered[g] = False

    def power_on(self, gpu: int) -> None:
        """GPU ``gpu`` is powered again: it boots (counters, BER accumulators and uptime to
        0, a new ``boot_id``, as `reboot`) and its links train UP (``carrier_changes`` = 1;
        a port inside a scheduled flap follows its schedule from the next step). Not in
        `fault_log`. Raises ValueError for a bad GPU; nothing happens when it is on."""
        g = self._gpu(gpu)
        if self._powered[g]:
            return
        self._reset_gpu(g)
        sl = slice(g * self.ports_per_gpu, (g + 1) * self.ports_per_gpu)
        self._link_up[sl] = True
        self._ctr[_R_CC, sl] = 1
        self._powered[g] = True

    def reboot(self, gpu: int) -> None:
        """Reboot GPU ``gpu`` now: every counter of its ports back to 0 (with the BER
        accumulators), uptime to 0 s and a new ``boot_id`` (FIELD-CASES BR-11: a consumer
        tells a reset from a wrap by uptime or boot id). Link state, flap schedules and
        injected error rates (physical faults) are kept. Raises ValueError for a bad GPU."""
        g = self._gpu(gpu)
        self._reset_gpu(g)
        self._record("reboot", port=None, gpu=g, start_s=self._time_s, end_s=self._time_s)

    def _reset_gpu(self, g: int) -> None:
        sl = slice(g * self.ports_per_gpu, (g + 1) * self.ports_per_gpu)
        self._ctr[:, sl] = 0
        self._prefec_total[sl] = 0.0
        self._line_bits_total[sl] = 0.0
        self._byte_carry[:, sl] = 0.0
        self._uptime_s[g] = 0.0
        old = self._boot_id[g]
        new = old
        while new == old:
            new = np.uint64(self._rng_ids.integers(1, 2**63, dtype=np.int64))
        self._boot_id[g] = new

    def stall(self, gpu: int, duration_s: float) -> None:
        """GPU ``gpu`` moves no traffic on any port for ``duration_s`` from now, whatever the
        demand (links stay up): a stalled rank. Raises ValueError for bad arguments."""
        g = self._gpu(gpu)
        dur = _finite("duration_s", duration_s, lo=0.0, lo_open=True)
        end = self._time_s + dur
        self._stall_until[g] = max(self._stall_until[g], end)
        self._record("stall", port=None, gpu=g, start_s=self._time_s, end_s=end,
                     duration_s=dur)

    def silence(self, port: PortRef, duration_s: float = math.inf) -> None:
        """``port`` stays up but carries no traffic for ``duration_s`` from now (default:
        for good): a silent port. Raises ValueError for bad arguments."""
        p = self._port(port)
        try:
            dur = float(duration_s)
        except (TypeError, ValueError):
            raise ValueError(f"duration_s must be a number (got {duration_s!r})") from None
        if math.isnan(dur) or dur <= 0.0:
            raise ValueError(f"duration_s must be > 0 (got {duration_s!r})")
        end = self._time_s + dur
        self._silence_until[p] = max(self._silence_until[p], end)
        self._record("silence", port=p, gpu=int(self._port_gpu[p]), start_s=self._time_s,
                     end_s=None if math.isinf(end) else end, duration_s=dur)

    def burst(self, gpu: int, duration_s: float, demand: float = 1.0) -> None:
        """GPU ``gpu``'s traffic demand is at least ``demand`` (in [0, 1]) for ``duration_s``
        from now: a communication burst. Raises ValueError for bad arguments."""
        g = self._gpu(gpu)
        dur = _finite("duration_s", duration_s, lo=0.0, lo_open=True)
        lvl = _finite("demand", demand, lo=0.0)
        if lvl > 1.0:
            raise ValueError(f"demand must be within [0, 1] (got {demand!r})")
        end = self._time_s + dur
        self._burst_until[g] = end
        self._burst_level[g] = lvl
        self._record("burst", port=None, gpu=g, start_s=self._time_s, end_s=end,
                     duration_s=dur, demand=lvl)

    # --- test and scenario seeding --------------------------------------------------------

    def set_counter(self, port: PortRef, counter: str, value: int) -> None:
        """Preset ``counter`` on ``port`` to ``value`` (e.g. a Counter32 near 2^32 for
        FIELD-CASES BR-11 a, or an aged counter at scenario start). Not a fault: not logged.

        Raises:
            ValueError: unknown counter, one the port's kind does not carry, or a value
                outside 0..2^bits − 1.
        """
        p = self._port(port)
        spec = _SPEC.get(counter)
        if spec is None:
            raise ValueError(f"unknown counter {counter!r}; counters: {COUNTER_NAMES}")
        if self._kind(p) not in spec.kinds:
            raise ValueError(f"{counter} is not a counter of {self._kind(p)} port "
                             f"{self._names[p]}")
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or not (
            0 <= int(value) <= spec.max_value
        ):
            raise ValueError(f"{counter} value must be an integer in 0..{spec.max_value} "
                             f"(got {value!r})")
        self._ctr[_ROW[counter], p] = np.uint64(int(value))


def _n_before(
    t: float, first: npt.NDArray[np.float64], per: npt.NDArray[np.float64],
    count: npt.NDArray[np.float64],
) -> npt.NDArray[np.float64]:
    """Events at ``first + i·per`` (i < count) strictly before ``t`` (minus `_T_EPS_S`)."""
    k = np.ceil((t - first - _T_EPS_S) / per)
    return np.clip(k, 0.0, count)


def _down_time(
    t: float, s: npt.NDArray[np.float64], d: npt.NDArray[np.float64],
    per: npt.NDArray[np.float64], count: npt.NDArray[np.float64],
) -> npt.NDArray[np.float64]:
    """Time spent down in ``[s, t)`` by a schedule of ``count`` cycles (down ``d``, period
    ``per``)."""
    x = np.maximum(t - s, 0.0)
    k = np.floor(x / per)
    full = np.minimum(k, count)
    part = np.where(k < count, np.minimum(x - k * per, d), 0.0)
    return full * d + part
