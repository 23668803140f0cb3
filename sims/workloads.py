"""Rack power profiles and per-GPU workloads: what the virtual rack is asked to draw, seeded.

Two layers, one module (they share their validators and the §4.6 concurrency swell):

**Rack IT power profiles** (`LoadProfile`): ``power_w(t_s)`` at plant time ``t_s`` (s), W, in
``[0, rack_max_power_w]`` (REFERENCE §1.3, §4.5, §4.6, §5 S1/S2). They drive the CDU plant
directly (valvey's lock-step) and, through `RackPowerWorkload`, the rack model.

* `ConstantLoad` — one power.
* `StepLoad` — S1's 30 % → 100 % step (39.6 → 132 kW on an NVL72 rack), optionally back down.
* `TimelineLoad` — piecewise (t_s, power_w) points, held or ramped between points.
* `AgenticBurstLoad` — §4.6 Markov-modulated bursts: lognormal burst/gap dwell times, per-GPU
  state power fractions, a concurrency swell of 5–15 min period.
* `TrainingSquareWave` — synchronous training: compute/communication square wave, 1–10 s.

Every profile is a pure function of time once built (random ones draw their segments lazily
from their own ``numpy.random.Generator(PCG64(seed))`` and keep them, so any query order gives
the same value), and has ``describe()`` for logs.

**Per-GPU workloads** (`Workload`): for plant time ``t_s``,

* ``power_fraction(t_s)`` -> ``numpy`` array of shape ``(gpus,)``: each GPU's power demand as
  a fraction of its TGP (0..1), before the node agent's cap / floor / ramp limits
  (`sims.rack.NodeAgents`) and thermal throttling;
* ``traffic_demand(t_s)`` -> shape ``(gpus,)``: each GPU's offered link traffic as a fraction
  of its link bandwidth (0..1); the link fabric (`sims.fabric.LinkFabric.step`) consumes it.

Queries must not go back in time (a `ValueError` says so); asking twice for the same time
gives the same arrays. Every random draw comes from generators seeded by ``seed`` (one per
inference instance, one for the concurrency swell, one for spikes), and each instance's events
are processed in time order, so the values depend on the seed and the query time only, not
on the step size.

Workloads (REFERENCE §1.3, §4.6; all figures [U] there unless marked):

* `AgenticWorkload` — agentic inference: GPUs grouped into instances (8 GPUs each, one
  tensor-parallel model replica per NVLink group) that alternate prefill/burst (0.85–1.0 of TDP,
  lognormal dwell, median 6 s, σ_ln 0.8) and gaps (median 4 s, σ_ln 0.9) spent in decode
  (0.5–0.7) or tool-wait (0.2–0.45); inside a burst, communication dips (all-reduce, 0.6–0.7,
  ≈30 % below TDP per ProphetStor [S2]) carry the link-traffic bursts; inactive instances idle
  (0.15–0.25). Concurrency (the share of active instances) swells as a raised cosine between
  ``concurrency_min`` and 1 with a 5–15 min period; sudden demand spikes (Poisson,
  ``spike_rate_per_h``) put every instance into prefill at the same instant, a rack step of
  ≈+70 % in one step (the §4.6 "spike" mode), and release it ``spike_duration_s`` later.
* `TrainingWorkload` — synchronous training: every GPU together, compute at 1.0 of TDP and
  communication at 0.65 (traffic high) in a 1–10 s square wave (REFERENCE §1.3 [S], §4.6).
* `IdleWorkload` — every GPU idle at 0.15–0.25 of TDP (per GPU, seeded), almost no traffic.
* `BurnInWorkload` — every GPU at ``fraction`` (1.0) with steady traffic: acceptance burn-in.
* `RackPowerWorkload` — a rack-power profile (`LoadProfile`, W) spread evenly over the GPUs
  through a power → fraction map (the scenario load kinds step/timeline/constant).

`sims.loads` re-exports the profiles under their former import path.
"""

from __future__ import annotations

import bisect
import itertools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np

__all__ = [
    "NVL72_GPUS",
    "NVL72_MAX_POWER_W",
    "AgenticBurstLoad",
    "AgenticWorkload",
    "BurnInWorkload",
    "ConstantLoad",
    "IdleWorkload",
    "LoadProfile",
    "RackPowerWorkload",
    "StepLoad",
    "TimelineLoad",
    "TrainingSquareWave",
    "TrainingWorkload",
    "Workload",
]

#: NVL72 design rack power, W (REFERENCE §1.1 / §4.3 [S2]); `CduParams.rack.rack_max_power_w`.
NVL72_MAX_POWER_W = 132_000.0
NVL72_GPUS = 72

_BURST, _DECODE, _TOOL_WAIT, _IDLE = 0, 1, 2, 3
_KIND_NAMES = ("burst", "decode", "tool_wait", "idle")


def _check_power(name: str, value: float) -> float:
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"{name} must be a finite power >= 0 W (got {value!r})")
    return float(value)


def _frac_range(name: str, r: tuple[float, float]) -> tuple[float, float]:
    """``r`` unchanged when ``0 <= low <= high <= 1``; ValueError naming ``name`` otherwise."""
    lo, hi = r
    if not (0.0 <= lo <= hi <= 1.0):
        raise ValueError(f"{name} must satisfy 0 <= low <= high <= 1 (got {lo}, {hi})")
    return lo, hi


class _Swell:
    """REFERENCE §4.6's concurrency swell: the active share rises and falls as a raised cosine
    between ``_cmin`` and 1, each cycle's period drawn uniformly in ``_swell`` (s) from its
    own generator ``_srng`` (so the other draws never shift it); cycle starts in ``_sw_t``."""

    _cmin: float
    _swell: tuple[float, float]
    _srng: np.random.Generator
    _sw_t: list[float]

    def _init_swell(self, seed_key: list[int], cmin: float, period_s: tuple[float, float]
                    ) -> None:
        """Set the swell up (``cmin``, ``period_s`` already checked by the caller)."""
        self._cmin = cmin
        self._swell = (float(period_s[0]), float(period_s[1]))
        self._srng = np.random.Generator(np.random.PCG64(seed_key))
        self._sw_t = [0.0]

    def concurrency(self, t_s: float) -> float:
        """Share of active instances (GPUs for `AgenticBurstLoad`) at ``t_s`` (s), in
        [``concurrency_min``, 1] (raised-cosine swell, REFERENCE §4.6); times before 0
        extrapolate the first cycle."""
        sw = self._sw_t
        while sw[-1] <= t_s:
            sw.append(sw[-1] + float(self._srng.uniform(*self._swell)))
        i = bisect.bisect_right(sw, t_s) - 1  # sw[i] <= t_s < sw[i + 1]
        if not 0 <= i < len(sw) - 1:  # t_s < 0 (or NaN): the first cycle
            i = 0
        phase = (t_s - sw[i]) / (sw[i + 1] - sw[i])
        return self._cmin + (1.0 - self._cmin) * (0.5 - 0.5 * math.cos(2.0 * math.pi * phase))


# --- rack IT power profiles ------------------------------------------------------------------


class LoadProfile(ABC):
    """Rack IT power as a function of plant time."""

    @abstractmethod
    def power_w(self, t_s: float) -> float:
        """Rack IT power demand at plant time ``t_s`` (s), W; never negative."""

    @abstractmethod
    def describe(self) -> str:
        """One line naming the profile and its parameters (for logs and result files)."""

    def __call__(self, t_s: float) -> float:
        return self.power_w(t_s)


class ConstantLoad(LoadProfile):
    """Constant ``power_w`` (W). Raises ValueError if negative or not finite."""

    def __init__(self, power_w: float) -> None:
        self._p = _check_power("power_w", power_w)

    def power_w(self, t_s: float) -> float:
        return self._p

    def describe(self) -> str:
        return f"constant {self._p / 1000:.1f} kW"


class StepLoad(LoadProfile):
    """``low_w`` until ``step_at_s``, then ``high_w``; back to ``low_w`` at ``back_at_s``.

    Each edge is a linear ramp of ``ramp_s`` (0 = instantaneous; S1 asks for ≤ 100 ms).
    `StepLoad.s1` builds REFERENCE §5 S1's 30 % → 100 % step.

    Raises:
        ValueError: negative powers, ``back_at_s`` not after the step's end, negative ramp.
    """

    def __init__(
        self,
        low_w: float,
        high_w: float,
        step_at_s: float,
        back_at_s: float | None = None,
        ramp_s: float = 0.0,
    ) -> None:
        self._lo = _check_power("low_w", low_w)
        self._hi = _check_power("high_w", high_w)
        if not (ramp_s >= 0.0 and math.isfinite(ramp_s) and math.isfinite(step_at_s)):
            raise ValueError("step_at_s must be finite and ramp_s >= 0")
        if back_at_s is not None and not (back_at_s >= step_at_s + ramp_s):
            raise ValueError("back_at_s must come after the up-step has finished")
        self._t_up = float(step_at_s)
        self._t_down = back_at_s
        self._ramp = float(ramp_s)

    @classmethod
    def s1(
        cls,
        rack_max_power_w: float = NVL72_MAX_POWER_W,
        step_at_s: float = 60.0,
        back_at_s: float | None = None,
        low_fraction: float = 0.3,
        high_fraction: float = 1.0,
        ramp_s: float = 0.0,
    ) -> StepLoad:
        """REFERENCE §5 S1 / §4.5: 30 % → 100 % of rack power at ``step_at_s`` (39.6 → 132
        kW with the NVL72 default), back down at ``back_at_s`` if given."""
        _frac_range(
            "step fraction", (min(low_fraction, high_fraction), max(low_fraction, high_fraction))
        )
        return cls(
            low_fraction * rack_max_power_w,
            high_fraction * rack_max_power_w,
            step_at_s,
            back_at_s,
            ramp_s,
        )

    def _edge(self, t_s: float, t0: float, a: float, b: float) -> float:
        if t_s < t0:
            return a
        if self._ramp <= 0.0 or t_s >= t0 + self._ramp:
            return b
        return a + (b - a) * (t_s - t0) / self._ramp

    def power_w(self, t_s: float) -> float:
        if self._t_down is not None and t_s >= self._t_down:
            return self._edge(t_s, self._t_down, self._hi, self._lo)
        return self._edge(t_s, self._t_up, self._lo, self._hi)

    def describe(self) -> str:
        back = "" if self._t_down is None else f", back at {self._t_down:g} s"
        return (
            f"step {self._lo / 1000:.1f} → {self._hi / 1000:.1f} kW at {self._t_up:g} s"
            f"{back} (ramp {self._ramp:g} s)"
        )


class TimelineLoad(LoadProfile):
    """Piecewise profile through ``points`` = [(t_s, power_w), ...] (times strictly rising).

    ``mode="hold"`` keeps each point's power until the next point; ``"ramp"`` interpolates
    linearly. Before the first point the first power holds, after the last the last.

    Raises:
        ValueError: empty, unsorted or duplicate times, negative or non-finite powers.
    """

    def __init__(
        self, points: Sequence[tuple[float, float]], mode: Literal["hold", "ramp"] = "hold"
    ) -> None:
        if not points:
            raise ValueError("timeline needs at least one (t_s, power_w) point")
        if mode not in ("hold", "ramp"):
            raise ValueError(f"mode must be 'hold' or 'ramp' (got {mode!r})")
        ts = [float(t) for t, _ in points]
        ps = [_check_power(f"points[{i}].power_w", p) for i, (_, p) in enumerate(points)]
        if not all(math.isfinite(t) for t in ts) or any(b <= a for a, b in itertools.pairwise(ts)):
            raise ValueError("timeline times must be finite and strictly increasing")
        self._ts = ts
        self._ps = ps
        self._mode = mode

    def power_w(self, t_s: float) -> float:
        i = bisect.bisect_right(self._ts, t_s) - 1
        if i < 0:
            return self._ps[0]
        if i >= len(self._ts) - 1 or self._mode == "hold":
            return self._ps[i]
        t0, t1 = self._ts[i], self._ts[i + 1]
        return self._ps[i] + (self._ps[i + 1] - self._ps[i]) * (t_s - t0) / (t1 - t0)

    def describe(self) -> str:
        return (
            f"timeline ({self._mode}) of {len(self._ts)} points over "
            f"{self._ts[0]:g}–{self._ts[-1]:g} s, {min(self._ps) / 1000:.1f}–"
            f"{max(self._ps) / 1000:.1f} kW"
        )


class _Segmented(LoadProfile):
    """Lazily generated piecewise-constant segments: starts ``_t`` and values ``_v``."""

    def __init__(self, seed: int) -> None:
        self._seed = int(seed)
        self._rng = np.random.Generator(np.random.PCG64(self._seed))
        self._t: list[float] = [0.0]
        self._v: list[float] = []
        self._end = 0.0

    @abstractmethod
    def _next_segment(self, t0: float) -> tuple[float, float]:
        """(duration_s > 0, value) of the segment starting at ``t0``."""

    def _value_at(self, t_s: float) -> float:
        if t_s < 0.0:
            t_s = 0.0
        while self._end <= t_s:
            d, v = self._next_segment(self._end)
            self._v.append(v)
            self._end += d
            self._t.append(self._end)
        return self._v[bisect.bisect_right(self._t, t_s) - 1]


class AgenticBurstLoad(_Segmented, _Swell):
    """REFERENCE §4.6 agentic inference bursts on one rack (all parameters [U] there).

    The rack alternates burst and gap segments with lognormal dwell times (burst median 6 s,
    σ_ln 0.8; gap median 4 s, σ_ln 0.9). Active GPUs run at U(0.85, 1.0) of TDP in a burst
    (prefill) and U(0.2, 0.45) in a gap (tool-wait); inactive GPUs idle at U(0.15, 0.25), drawn
    once per segment. The active share (concurrency) swells as a raised cosine between
    ``concurrency_min`` and 1 with each swell's period drawn uniformly in 5–15 min.

    ``power_w(t) = P_max · (c(t)·f_state + (1 − c(t))·f_idle)``, in [0, P_max].

    Raises:
        ValueError: non-positive medians/periods, fractions outside [0, 1].
    """

    def __init__(
        self,
        rack_max_power_w: float = NVL72_MAX_POWER_W,
        seed: int = 0,
        *,
        burst_median_s: float = 6.0,
        burst_sigma_ln: float = 0.8,
        gap_median_s: float = 4.0,
        gap_sigma_ln: float = 0.9,
        burst_fraction: tuple[float, float] = (0.85, 1.0),
        gap_fraction: tuple[float, float] = (0.2, 0.45),
        idle_fraction: tuple[float, float] = (0.15, 0.25),
        concurrency_min: float = 0.3,
        swell_period_s: tuple[float, float] = (300.0, 900.0),
    ) -> None:
        super().__init__(seed)
        self._pmax = _check_power("rack_max_power_w", rack_max_power_w)
        if min(burst_median_s, gap_median_s) <= 0.0 or min(burst_sigma_ln, gap_sigma_ln) < 0.0:
            raise ValueError("dwell medians must be > 0 and σ_ln >= 0")
        lo, hi = swell_period_s
        if not (0.0 < lo <= hi):
            raise ValueError("swell_period_s must satisfy 0 < low <= high")
        self._burst = (math.log(burst_median_s), burst_sigma_ln)
        self._gap = (math.log(gap_median_s), gap_sigma_ln)
        self._fb = _frac_range("burst_fraction", burst_fraction)
        self._fg = _frac_range("gap_fraction", gap_fraction)
        self._fi = _frac_range("idle_fraction", idle_fraction)
        cmin, _ = _frac_range("concurrency_min", (concurrency_min, 1.0))
        self._in_burst = False
        self._idle: list[float] = []
        self._init_swell([self._seed, 1], cmin, (lo, hi))

    def _next_segment(self, t0: float) -> tuple[float, float]:
        self._in_burst = not self._in_burst  # starts with a burst
        rng = self._rng
        mu, sig = self._burst if self._in_burst else self._gap
        lo, hi = self._fb if self._in_burst else self._fg
        d = float(rng.lognormal(mu, sig))
        v = float(rng.uniform(lo, hi))
        self._idle.append(float(rng.uniform(*self._fi)))
        return max(d, 0.1), v

    def power_w(self, t_s: float) -> float:
        t = t_s if t_s > 0.0 else 0.0
        f_state = self._value_at(t)
        f_idle = self._idle[bisect.bisect_right(self._t, t) - 1]
        c = self.concurrency(t)
        return self._pmax * (c * f_state + (1.0 - c) * f_idle)

    def describe(self) -> str:
        return (
            f"agentic bursts seed={self._seed}: P_max {self._pmax / 1000:.1f} kW, burst "
            f"median {math.exp(self._burst[0]):g} s σ_ln {self._burst[1]:g} at {self._fb}, gap "
            f"median {math.exp(self._gap[0]):g} s σ_ln {self._gap[1]:g} at {self._fg}, idle "
            f"{self._fi}, concurrency {self._cmin:g}–1 swell {self._swell[0]:g}–"
            f"{self._swell[1]:g} s"
        )


class TrainingSquareWave(_Segmented):
    """Synchronous training (REFERENCE §1.3 [S], §4.6): compute at ``high_fraction`` of
    ``rack_max_power_w`` for ``duty`` of each iteration, communication at ``low_fraction``
    (all-reduce dip ≈ 0.6–0.7 of TDP, §4.6) for the rest.

    ``period_s`` must lie in 1–10 s (the 0.1–20 Hz band of grid concern; 1–10 s per §4.6).
    Each iteration's length is ``period_s·(1 + jitter·N(0,1))`` (clipped to ±3 σ), seeded;
    ``jitter=0`` gives an exact square wave.

    Raises:
        ValueError: period outside 1–10 s, fractions outside [0, 1], duty outside (0, 1),
            negative jitter.
    """

    def __init__(
        self,
        rack_max_power_w: float = NVL72_MAX_POWER_W,
        period_s: float = 4.0,
        seed: int = 0,
        *,
        high_fraction: float = 1.0,
        low_fraction: float = 0.65,
        duty: float = 0.5,
        jitter: float = 0.02,
    ) -> None:
        super().__init__(seed)
        self._pmax = _check_power("rack_max_power_w", rack_max_power_w)
        if not (1.0 <= period_s <= 10.0):
            raise ValueError(f"period_s must be within 1–10 s (got {period_s})")
        if not (0.0 < duty < 1.0):
            raise ValueError("duty must be in (0, 1)")
        if not (0.0 <= jitter <= 0.3):
            raise ValueError("jitter must be in [0, 0.3]")
        _frac_range(
            "training fractions",
            (min(high_fraction, low_fraction), max(high_fraction, low_fraction)),
        )
        self._period = float(period_s)
        self._hi = high_fraction
        self._lo = low_fraction
        self._duty = duty
        self._jitter = jitter
        self._phase_high = False
        self._iter_len = 0.0

    def _next_segment(self, t0: float) -> tuple[float, float]:
        self._phase_high = not self._phase_high
        if self._phase_high:
            j = float(self._rng.standard_normal()) if self._jitter else 0.0
            j = max(-3.0, min(3.0, j))
            self._iter_len = self._period * (1.0 + self._jitter * j)
            return self._iter_len * self._duty, self._hi
        return self._iter_len * (1.0 - self._duty), self._lo

    def power_w(self, t_s: float) -> float:
        return self._pmax * self._value_at(t_s)

    def describe(self) -> str:
        return (
            f"training square wave seed={self._seed}: {self._period:g} s period, "
            f"{self._hi:g}/{self._lo:g} of {self._pmax / 1000:.1f} kW, duty {self._duty:g}, "
            f"jitter {self._jitter:g}"
        )


# --- per-GPU workloads -----------------------------------------------------------------------


class Workload(ABC):
    """Per-GPU power demand and link traffic over plant time (module docstring).

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
    """Agentic inference on a rack (REFERENCE §4.6; see the module docstring).

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
