"""`LinkFabric`: one rack's per-port link state, throughput and counters (see `sims.fabric`)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from sims.fabric.counters import (
    _MASK_COL,
    _MAX_COL,
    _R_CC,
    _R_FLIT,
    _R_LD,
    _R_REC,
    _R_RX,
    _R_SYM,
    _R_TX,
    _RATE_ROW,
    _RATE_TO_CTR,
    _ROW,
    _SPEC,
    COUNTERS,
    POST_FEC_COUNTER,
    PRE_FEC_COUNTER,
    RATE_COUNTERS,
    PortKind,
    PortRef,
)
from sims.fabric.external import ExternalTraffic
from sims.fabric.params import FabricParams, FaultRecord, _finite
from sims.fabric.schedule import _T_EPS_S, _down_time, _n_before

__all__ = ["LinkFabric"]


class LinkFabric(ExternalTraffic):
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
        self._ovr = np.full((2, n), np.nan)  # tx, rx demand per port (NaN: from the GPU's)
        self._ovr_on = False
        self._nominal_speed_mb = self._speed_mb.copy()

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
        if self._ovr_on:  # per-port demand set from outside (set_port_demand): (2, ports)
            port_dem = np.where(np.isnan(self._ovr), port_dem, self._ovr)
            port_dem[:, (self._stall_until > tm)[self._port_gpu]] = 0.0
        port_dem[..., self._silence_until > tm] = 0.0
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
