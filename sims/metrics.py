"""Scoring traces: the control figures the issues and REFERENCE §5 name, computed from runs.

Definitions (issue 4 / REFERENCE §5):
- max / RMS error: of ``pv − setpoint`` over a window, in K.
- settling time: after a disturbance at ``t0``, the time until the error enters ``±band`` and
  stays there to the end of the window; 0 when it never left the band; None when it never
  settles inside the window.
- valve active fraction: share of control periods in which the valve command moved by more
  than ``deadband_pct``; strokes per hour: total command travel / 100 % per hour.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["StepMetrics", "ValveActivity", "step_metrics", "valve_activity"]


@dataclass(frozen=True)
class StepMetrics:
    """Response to one disturbance (errors in K, times in s)."""

    max_abs_error_k: float
    rms_error_k: float
    settling_s: float | None
    t_max_error_s: float
    samples: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _window(t: Sequence[float], t0: float, t1: float | None) -> range:
    lo = next((i for i, x in enumerate(t) if x >= t0), len(t))
    hi = len(t) if t1 is None else next((i for i, x in enumerate(t) if x > t1), len(t))
    return range(lo, hi)


def step_metrics(
    t: Sequence[float],
    pv: Sequence[float | None],
    setpoint: Sequence[float] | float,
    t0: float,
    t1: float | None = None,
    band_k: float = 0.5,
) -> StepMetrics:
    """Error figures of ``pv`` against ``setpoint`` in the window [t0, t1].

    Args:
        t: sample times [s], rising.
        pv: process values (None or NaN samples are skipped).
        setpoint: one value or one per sample.
        t0: the disturbance time [s]; t1: end of the window (None: end of trace).
        band_k: the settling band (REFERENCE §5 S1: ±0.5 K).

    Raises:
        ValueError: no valid sample inside the window.
    """
    idx = _window(t, t0, t1)
    sp = [setpoint] * len(t) if isinstance(setpoint, int | float) else list(setpoint)
    errs: list[tuple[float, float]] = []
    for i in idx:
        v = pv[i]
        if v is None or not math.isfinite(v):
            continue
        errs.append((t[i], v - sp[i]))
    if not errs:
        raise ValueError("no valid samples in the window")
    t_max, e_max = max(errs, key=lambda te: abs(te[1]))
    rms = math.sqrt(sum(e * e for _, e in errs) / len(errs))
    last_out = None
    for ti, e in errs:
        if abs(e) > band_k:
            last_out = ti
    if last_out is None:
        settling: float | None = 0.0
    elif last_out >= errs[-1][0]:
        settling = None
    else:
        nxt = next(ti for ti, _ in errs if ti > last_out)
        settling = nxt - t0
    return StepMetrics(abs(e_max), rms, settling, t_max - t0, len(errs))


@dataclass(frozen=True)
class ValveActivity:
    """How hard the valve works (REFERENCE §1.5 hunting alarm: active share > 20 %)."""

    active_fraction: float
    strokes_per_h: float
    travel_pct: float
    periods: int


def valve_activity(
    command_pct: Sequence[float | None], period_s: float, deadband_pct: float = 0.1
) -> ValveActivity:
    """Valve activity from the command sampled once per control period.

    Args:
        command_pct: the valve command at each control period [%] (None skipped).
        period_s: the control period [s].
        deadband_pct: a move larger than this counts as active.
    """
    vals = [c for c in command_pct if c is not None and math.isfinite(c)]
    if len(vals) < 2:
        return ValveActivity(0.0, 0.0, 0.0, len(vals))
    moves = [abs(b - a) for a, b in itertools.pairwise(vals)]
    travel = sum(moves)
    hours = len(moves) * period_s / 3600.0
    active = sum(1 for m in moves if m > deadband_pct) / len(moves)
    return ValveActivity(active, travel / 100.0 / hours, travel, len(moves))
