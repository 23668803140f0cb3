"""What the rack power profiles and the per-GPU workloads share: the NVL72 rack figures, the
argument validators and REFERENCE §4.6's concurrency swell (`_Swell`)."""

from __future__ import annotations

import bisect
import math

import numpy as np

__all__ = ["NVL72_GPUS", "NVL72_MAX_POWER_W"]

#: NVL72 design rack power, W (REFERENCE §1.1 / §4.3 [S2]); `CduParams.rack.rack_max_power_w`.
NVL72_MAX_POWER_W = 132_000.0
NVL72_GPUS = 72


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

