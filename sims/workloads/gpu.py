"""Per-GPU workloads (`Workload`): each GPU's power fraction and link-traffic demand at plant
time ``t_s``, seeded (the package docstring of `sims.workloads` lists them)."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable

import numpy as np

from sims.workloads.common import NVL72_GPUS, _frac_range, _Swell
from sims.workloads.profiles import LoadProfile, TrainingSquareWave

__all__ = [
    "AgenticWorkload",
    "BurnInWorkload",
    "IdleWorkload",
    "RackPowerWorkload",
    "TrainingWorkload",
    "Workload",
]

_BURST, _DECODE, _TOOL_WAIT, _IDLE = 0, 1, 2, 3
_KIND_NAMES = ("burst", "decode", "tool_wait", "idle")


class Workload(ABC):
    """Per-GPU power demand and link traffic over plant time (`sims.workloads` docstring).

    Args:
        gpus: GPUs on the rack (72 for an NVL72).

    Raises:
        ValueError: ``gpus`` < 1.
    """

    def __init__(self, gpus: int = NVL72_GPUS) -> None:
        if not (isinstance(gpus, int) and gpus >= 1):
            raise ValueError(f"gpus must be an int >= 1 (got {gpus!r})")
        self.gpus = gpus
        self._t = -math.inf
        self._frac = np.zeros(gpus)
        self._traffic = np.zeros(gpus)

    def _at(self, t_s: float) -> None:
        if not math.isfinite(t_s):
            raise ValueError(f"time {t_s!r} is not finite")
        if t_s < self._t - 1e-9:
            raise ValueError(
                f"workload queried at {t_s} s after {self._t} s: queries must not go back"
            )
        if t_s != self._t:
            self._advance(max(t_s, 0.0))
            self._t = t_s

    @abstractmethod
    def _advance(self, t_s: float) -> None:
        """Fill ``self._frac`` and ``self._traffic`` for time ``t_s`` (>= the last one)."""

    @abstractmethod
    def describe(self) -> str:
        """One line naming the workload and its parameters (logs, result files)."""

    def power_fraction(self, t_s: float) -> np.ndarray:
        """Per-GPU power demand at ``t_s`` as a fraction of TDP, shape ``(gpus,)`` (a copy).

        Raises:
            ValueError: ``t_s`` not finite or earlier than a previous query.
        """
        self._at(t_s)
        return self._frac.copy()

    def traffic_demand(self, t_s: float) -> np.ndarray:
        """Per-GPU offered link traffic at ``t_s``, 0..1 of link bandwidth, shape ``(gpus,)``
        (a copy). Raises ValueError like `power_fraction`."""
        self._at(t_s)
        return self._traffic.copy()


class IdleWorkload(Workload):
    """Every GPU idle: a fixed per-GPU fraction drawn once in ``idle_fraction`` (REFERENCE
    §4.6: 0.15–0.25 of TDP), traffic ``traffic`` (keep-alives)."""

    def __init__(
        self,
        gpus: int = NVL72_GPUS,
        seed: int = 0,
        *,
        idle_fraction: tuple[float, float] = (0.15, 0.25),
        traffic: float = 0.002,
    ) -> None:
        super().__init__(gpus)
        lo, hi = _frac_range("idle_fraction", idle_fraction)
        _frac_range("traffic", (traffic, traffic))
        rng = np.random.Generator(np.random.PCG64([seed, 0x1D]))
        self._frac = rng.uniform(lo, hi, gpus)
        self._traffic = np.full(gpus, float(traffic))
        self._desc = f"idle seed={seed}: {lo:g}–{hi:g} of TDP, traffic {traffic:g}"

    def _advance(self, t_s: float) -> None:
        return None

    def describe(self) -> str:
        return self._desc


class BurnInWorkload(Workload):
    """Acceptance burn-in: every GPU at ``fraction`` of TDP (1.0: full power), link traffic
    ``traffic`` (all-to-all test traffic) from ``start_s`` on; idle at 0.2 before."""

    def __init__(
        self,
        gpus: int = NVL72_GPUS,
        *,
        fraction: float = 1.0,
        traffic: float = 0.5,
        start_s: float = 0.0,
    ) -> None:
        super().__init__(gpus)
        _frac_range("fraction", (fraction, fraction))
        _frac_range("traffic", (traffic, traffic))
        if not (start_s >= 0.0 and math.isfinite(start_s)):
            raise ValueError("start_s must be finite and >= 0")
        self._f = float(fraction)
        self._tr = float(traffic)
        self._start = float(start_s)

    def _advance(self, t_s: float) -> None:
        on = t_s >= self._start
        self._frac.fill(self._f if on else 0.2)
        self._traffic.fill(self._tr if on else 0.0)

    def describe(self) -> str:
        return f"burn-in: {self._f:g} of TDP, traffic {self._tr:g} from {self._start:g} s"


class RackPowerWorkload(Workload):
    """A rack IT power profile (W) spread evenly over the GPUs.

    Args:
        profile: rack IT power over time, W (`LoadProfile`).
        fraction_for_power: maps a rack power (W) to the per-GPU fraction that yields it
            (`sims.rack.ComputeRack.gpu_fraction_for_rack_power`); clipped to 0..1.
        traffic: per-GPU traffic, scaled by the fraction (0.3 at full power by default).
    """

    def __init__(
        self,
        profile: LoadProfile,
        fraction_for_power: Callable[[float], float],
        gpus: int = NVL72_GPUS,
        *,
        traffic: float = 0.3,
    ) -> None:
        super().__init__(gpus)
        _frac_range("traffic", (traffic, traffic))
        self.profile = profile
        self._map = fraction_for_power
        self._tr = float(traffic)

    def _advance(self, t_s: float) -> None:
        f = min(1.0, max(0.0, self._map(self.profile.power_w(t_s))))
        self._frac.fill(f)
        self._traffic.fill(self._tr * f)

    def describe(self) -> str:
        return f"rack power profile spread over {self.gpus} GPUs: {self.profile.describe()}"


class TrainingWorkload(Workload):
    """Synchronous training: all GPUs at ``high_fraction`` (compute) for ``duty`` of each
    iteration and ``low_fraction`` (communication, traffic ``traffic_comm``) for the rest;
    period 1–10 s with seeded jitter (`TrainingSquareWave`, REFERENCE §1.3, §4.6).

    Raises:
        ValueError: as `TrainingSquareWave`, or traffic outside 0..1.
    """

    def __init__(
        self,
        gpus: int = NVL72_GPUS,
        seed: int = 0,
        *,
        period_s: float = 4.0,
        high_fraction: float = 1.0,
        low_fraction: float = 0.65,
        duty: float = 0.5,
        jitter: float = 0.02,
        traffic_compute: float = 0.05,
        traffic_comm: float = 0.9,
    ) -> None:
        super().__init__(gpus)
        _frac_range("traffic_compute", (traffic_compute, traffic_compute))
        _frac_range("traffic_comm", (traffic_comm, traffic_comm))
        self._wave = TrainingSquareWave(
            1.0,
            period_s,
            seed,
            high_fraction=high_fraction,
            low_fraction=low_fraction,
            duty=duty,
            jitter=jitter,
        )
        self._hi = high_fraction
        self._lo = low_fraction
        self._tc = traffic_compute
        self._tm = traffic_comm

    def _advance(self, t_s: float) -> None:
        f = self._wave.power_w(t_s)
        comm = self._hi != self._lo and f == self._lo
        self._frac.fill(f)
        self._traffic.fill(self._tm if comm else self._tc)

    def describe(self) -> str:
        return f"training: {self._wave.describe()}, traffic {self._tc:g}/{self._tm:g}"


class AgenticWorkload(Workload, _Swell):
    """Agentic inference on a rack (REFERENCE §4.6; see the `sims.workloads` docstring).

    Args:
        gpus: GPUs on the rack; ``gpus_per_instance`` must divide it.
        seed: seeds every draw.
        gpus_per_instance: GPUs serving one model replica (they burst together).
        burst_median_s, burst_sigma_ln: prefill/burst dwell (lognormal), REF §4.6: 6 s, 0.8.
        gap_median_s, gap_sigma_ln: gap dwell (decode or tool-wait), REF §4.6: 4 s, 0.9.
        burst_fraction, decode_fraction, tool_wait_fraction, idle_fraction, comm_fraction:
            power ranges as fractions of TDP (REF §4.6), drawn per GPU per segment.
        decode_share: probability that a gap is decode rather than tool-wait [U].
        comm_interval_s: mean time between communication dips inside a burst [U].
        comm_dip_s: dip length range, s [U].
        concurrency_min: lowest share of active instances in the swell (REF §4.6 [U]).
        swell_period_s: range of the swell period, s (REF §4.6: 5–15 min).
        spike_rate_per_h: sudden rack-wide prefill spikes per hour (0: none) [U].
        spike_duration_s: range of a spike's length, s [U].
        traffic_*: per-state link-traffic ranges (0..1 of link bandwidth) [U].

    Raises:
        ValueError: ranges outside 0..1 or unordered, non-positive medians/periods/rates,
            ``gpus_per_instance`` not dividing ``gpus``.
    """

    def __init__(
        self,
        gpus: int = NVL72_GPUS,
        seed: int = 0,
        *,
        gpus_per_instance: int = 8,
        burst_median_s: float = 6.0,
        burst_sigma_ln: float = 0.8,
        gap_median_s: float = 4.0,
        gap_sigma_ln: float = 0.9,
        burst_fraction: tuple[float, float] = (0.85, 1.0),
        decode_fraction: tuple[float, float] = (0.5, 0.7),
        tool_wait_fraction: tuple[float, float] = (0.2, 0.45),
        idle_fraction: tuple[float, float] = (0.15, 0.25),
        comm_fraction: tuple[float, float] = (0.6, 0.7),
        decode_share: float = 0.3,
        comm_interval_s: float = 1.5,
        comm_dip_s: tuple[float, float] = (0.2, 0.5),
        concurrency_min: float = 0.3,
        swell_period_s: tuple[float, float] = (300.0, 900.0),
        spike_rate_per_h: float = 4.0,
        spike_duration_s: tuple[float, float] = (5.0, 20.0),
        traffic_burst: tuple[float, float] = (0.2, 0.4),
        traffic_decode: tuple[float, float] = (0.1, 0.25),
        traffic_tool_wait: tuple[float, float] = (0.0, 0.05),
        traffic_idle: tuple[float, float] = (0.0, 0.01),
        traffic_comm: tuple[float, float] = (0.7, 1.0),
    ) -> None:
        super().__init__(gpus)
        if not (isinstance(gpus_per_instance, int) and gpus_per_instance >= 1):
            raise ValueError("gpus_per_instance must be an int >= 1")
        if gpus % gpus_per_instance:
            raise ValueError(f"gpus_per_instance {gpus_per_instance} must divide gpus {gpus}")
        if min(burst_median_s, gap_median_s, comm_interval_s) <= 0.0:
            raise ValueError("burst/gap medians and comm_interval_s must be > 0")
        if min(burst_sigma_ln, gap_sigma_ln) < 0.0:
            raise ValueError("σ_ln must be >= 0")
        for name, (lo, hi) in (
            ("swell_period_s", swell_period_s),
            ("comm_dip_s", comm_dip_s),
            ("spike_duration_s", spike_duration_s),
        ):
            if not (0.0 < lo <= hi and math.isfinite(hi)):
                raise ValueError(f"{name} must satisfy 0 < low <= high")
        if not (spike_rate_per_h >= 0.0 and math.isfinite(spike_rate_per_h)):
            raise ValueError("spike_rate_per_h must be finite and >= 0")
        _frac_range("decode_share", (decode_share, decode_share))
        cmin = _frac_range("concurrency_min", (concurrency_min, 1.0))[0]
        self._seed = int(seed)
        self._gpi = gpus_per_instance
        self._n = gpus // gpus_per_instance
        self._burst = (math.log(burst_median_s), burst_sigma_ln)
        self._gap = (math.log(gap_median_s), gap_sigma_ln)
        self._power = (
            _frac_range("burst_fraction", burst_fraction),
            _frac_range("decode_fraction", decode_fraction),
            _frac_range("tool_wait_fraction", tool_wait_fraction),
            _frac_range("idle_fraction", idle_fraction),
        )
        self._traffic_r = (
            _frac_range("traffic_burst", traffic_burst),
            _frac_range("traffic_decode", traffic_decode),
            _frac_range("traffic_tool_wait", traffic_tool_wait),
            _frac_range("traffic_idle", traffic_idle),
        )
        self._comm = _frac_range("comm_fraction", comm_fraction)
        self._comm_tr = _frac_range("traffic_comm", traffic_comm)
        self._decode_share = decode_share
        self._comm_mean = comm_interval_s
        self._dip = (float(comm_dip_s[0]), float(comm_dip_s[1]))
        self._spike_mean = 3600.0 / spike_rate_per_h if spike_rate_per_h > 0.0 else math.inf
        self._spike_dur = (float(spike_duration_s[0]), float(spike_duration_s[1]))
        # generators: one per instance, one for the swell, one for spikes, one for the ranking
        self._rngs = [
            np.random.Generator(np.random.PCG64([self._seed, 1, i])) for i in range(self._n)
        ]
        self._init_swell([self._seed, 2], cmin, swell_period_s)
        self._prng = np.random.Generator(np.random.PCG64([self._seed, 3]))
        self._rank = np.random.Generator(np.random.PCG64([self._seed, 4])).permutation(self._n)
        self._spikes: list[tuple[float, float]] = []  # (start, duration)
        self._spike_next = 0.0 if self._spike_mean == math.inf else self._draw_spike_gap()
        # instance state
        self._kind = [_IDLE] * self._n
        self._end = [0.0] * self._n
        self._lvl = [np.zeros(self._gpi) for _ in range(self._n)]
        self._trf = [np.zeros(self._gpi) for _ in range(self._n)]
        self._dips: list[list[tuple[float, float, np.ndarray, np.ndarray]]] = [
            [] for _ in range(self._n)
        ]
        self._spike_i = [0] * self._n
        self._spike_t = [self._spike(0)[0]] * self._n  # each instance's next spike start
        for i in range(self._n):
            self._start_initial(i)

    # --- random processes ---------------------------------------------------------------------

    def _draw_spike_gap(self) -> float:
        return float(self._prng.exponential(self._spike_mean))

    def _spike(self, k: int) -> tuple[float, float]:
        """The k-th spike (start, duration); ``(inf, 0)`` when there are none."""
        if self._spike_mean == math.inf:
            return math.inf, 0.0
        while len(self._spikes) <= k:
            start = self._spike_next
            dur = float(self._prng.uniform(*self._spike_dur))
            self._spikes.append((start, dur))
            self._spike_next = start + dur + self._draw_spike_gap()
        return self._spikes[k]

    def _active(self, i: int, t_s: float) -> bool:
        return bool(self._rank[i] < self.concurrency(t_s) * self._n - 1e-9)

    def _set_segment(self, i: int, kind: int, t0: float, dur: float) -> None:
        rng = self._rngs[i]
        gpi = self._gpi
        end = t0 + max(dur, 0.1)
        self._kind[i] = kind
        self._end[i] = end
        self._lvl[i] = rng.uniform(*self._power[kind], gpi)
        self._trf[i] = rng.uniform(*self._traffic_r[kind], gpi)
        dips: list[tuple[float, float, np.ndarray, np.ndarray]] = []
        if kind == _BURST:
            t = t0 + float(rng.exponential(self._comm_mean))
            while t < end:
                d = float(rng.uniform(*self._dip))
                dips.append((t, min(end, t + d), rng.uniform(*self._comm, gpi),
                             rng.uniform(*self._comm_tr, gpi)))
                t += d + float(rng.exponential(self._comm_mean))
        self._dips[i] = dips

    def _dwell(self, i: int, kind: int) -> float:
        mu, sig = self._burst if kind == _BURST else self._gap
        return float(self._rngs[i].lognormal(mu, sig))

    def _start_initial(self, i: int) -> None:
        rng = self._rngs[i]
        active = self._active(i, 0.0)
        kind = (_BURST if rng.uniform() < 0.5 else _TOOL_WAIT) if active else _IDLE
        dur = self._dwell(i, kind) * float(rng.uniform(0.05, 1.0))  # random phase
        self._set_segment(i, kind, 0.0, dur)

    def _next_segment(self, i: int, t0: float) -> None:
        if not self._active(i, t0):
            kind = _IDLE
        elif self._kind[i] == _BURST:
            kind = _DECODE if self._rngs[i].uniform() < self._decode_share else _TOOL_WAIT
        else:
            kind = _BURST
        self._set_segment(i, kind, t0, self._dwell(i, kind))

    # --- evaluation ---------------------------------------------------------------------------

    def _advance(self, t_s: float) -> None:
        gpi = self._gpi
        ends = self._end
        sp_ts = self._spike_t
        for i in range(self._n):
            while ends[i] <= t_s or sp_ts[i] <= t_s:
                sp_t, sp_d = self._spike(self._spike_i[i])
                if sp_t <= t_s and sp_t < ends[i]:
                    self._set_segment(i, _BURST, sp_t, sp_d)  # every instance bursts at once
                    self._spike_i[i] += 1
                    sp_ts[i] = self._spike(self._spike_i[i])[0]
                else:
                    self._next_segment(i, ends[i])
            lvl, trf = self._lvl[i], self._trf[i]
            for d0, d1, dl, dt in self._dips[i]:
                if d0 <= t_s < d1:
                    lvl, trf = dl, dt
                    break
                if d0 > t_s:
                    break
            self._frac[i * gpi : (i + 1) * gpi] = lvl
            self._traffic[i * gpi : (i + 1) * gpi] = trf

    def instance_states(self, t_s: float) -> list[str]:
        """Each instance's state at ``t_s`` (``burst``, ``decode``, ``tool_wait``, ``idle``;
        ``comm`` inside a communication dip), for plots and tests."""
        self._at(t_s)
        out = []
        for i in range(self._n):
            name = _KIND_NAMES[self._kind[i]]
            if any(d0 <= t_s < d1 for d0, d1, _, _ in self._dips[i]):
                name = "comm"
            out.append(name)
        return out

    def spikes_until(self, t_s: float) -> list[tuple[float, float]]:
        """The demand spikes (start s, duration s) starting at or before ``t_s``."""
        out: list[tuple[float, float]] = []
        k = 0
        while True:
            s = self._spike(k)
            if s[0] > t_s:
                return out
            out.append(s)
            k += 1

    def describe(self) -> str:
        return (
            f"agentic seed={self._seed}: {self._n} instances × {self._gpi} GPUs, burst median "
            f"{math.exp(self._burst[0]):g} s σ_ln {self._burst[1]:g}, gap median "
            f"{math.exp(self._gap[0]):g} s σ_ln {self._gap[1]:g}, concurrency {self._cmin:g}–1 "
            f"swell {self._swell[0]:g}–{self._swell[1]:g} s, spikes "
            f"{0.0 if self._spike_mean == math.inf else 3600.0 / self._spike_mean:g}/h"
        )
