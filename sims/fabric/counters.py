"""The fabric's hardware counters (`COUNTERS`: width, wrap or saturate, port kinds, source) and
the row indices and masks `sims.fabric.model.LinkFabric` keeps its counter matrix with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

__all__ = [
    "COUNTERS",
    "COUNTER_NAMES",
    "POST_FEC_COUNTER",
    "PRE_FEC_COUNTER",
    "RATE_COUNTERS",
    "CounterSpec",
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


#: Every counter, in the row order of the internal counter matrix (see the `sims.fabric` docstring).
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
_MASK_COL = np.array(
    [[c.max_value if c.overflow == "wrap" else 0xFFFF_FFFF_FFFF_FFFF] for c in COUNTERS],
    dtype=np.uint64,
)
_MAX_COL = np.array(
    [[c.max_value if c.overflow == "saturate" else 0xFFFF_FFFF_FFFF_FFFF] for c in COUNTERS],
    dtype=np.uint64,
)
