"""Rack IT power profiles (`LoadProfile`): ``power_w(t_s)`` at plant time ``t_s``, W, seeded
(the package docstring of `sims.workloads` lists them)."""

from __future__ import annotations

import bisect
import itertools
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Literal

import numpy as np

from sims.workloads.common import NVL72_MAX_POWER_W, _check_power, _frac_range, _Swell

__all__ = [
    "AgenticBurstLoad",
    "ConstantLoad",
    "LoadProfile",
    "StepLoad",
    "TimelineLoad",
    "TrainingSquareWave",
]


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

