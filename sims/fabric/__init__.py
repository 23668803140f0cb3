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

from sims.fabric.counters import (
    COUNTER_NAMES,
    COUNTERS,
    POST_FEC_COUNTER,
    PRE_FEC_COUNTER,
    RATE_COUNTERS,
    CounterSpec,
)
from sims.fabric.model import LinkFabric
from sims.fabric.params import FabricParams, FaultRecord

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
