"""Commissioning step test: with the supply loop in manual, step the valve, identify a
first-order-plus-dead-time model (gain K, time constant τ, dead time θ) and propose SIMC PI
gains (REFERENCE §2.2) for the operator to accept. Pure; fed once per loop period.

Procedure (the standardised step protocol REFERENCE §2.1 and §6 item 1 recommend replacing
the model's figures with): the operator puts the loop in manual at a steady operating point
and sends ``start_step_test {step_pct}``. The test records the PV for ``baseline_s``
(already collected while in manual), moves the valve by ``step_pct`` and records until the PV
is steady again (slope below ``steady_k_per_min`` over ``steady_window_s``, after at least
``min_duration_s``) or ``max_duration_s`` passes; then the valve returns to where it was
(``return_to_start``).

Identification: Smith's two-point method on the (filtered) response: with
``r(t) = (y(t) − y0)/(y_ss − y0)``, ``t28`` and ``t63`` the first times r reaches 28.3 % and
63.2 %, ``τ = 1.5 (t63 − t28)`` and ``θ = t63 − τ`` (≥ 0); ``K = (y_ss − y0)/Δu`` [K/%]. The
valve moves at its stroke rate, so time counts from the middle of the commanded ramp.

SIMC (Skogestad 2003; REFERENCE §2.2): ``Kc = τ / (|K| (τc + θ))`` [%/K],
``τI = min(τ, 4 (τc + θ))``; ``τc = tau_c_s`` (default 10 s: the smooth choice; τc = θ is the
tight one). §1.7 expects K ≈ −0.25…−0.37 K/%, τ ≈ 35 s, θ ≈ 1–3 s on the §4 model.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from rackplane.config import StrictModel

__all__ = ["StepTest", "StepTestResult", "StepTestSettings", "identify_fopdt", "simc_pi"]


class StepTestSettings(StrictModel):
    """Commissioning step test (module docstring)."""

    baseline_s: float = Field(30.0, ge=5, le=600, description="steady PV before the step")
    min_duration_s: float = Field(60.0, ge=10, le=3600)
    max_duration_s: float = Field(600.0, ge=30, le=7200)
    steady_window_s: float = Field(30.0, ge=5, le=600)
    steady_k_per_min: float = Field(0.05, gt=0, description="|slope| below this: steady")
    tau_c_s: float = Field(10.0, gt=0, le=600, description="SIMC closed-loop time constant")
    return_to_start: bool = True
    min_response_k: float = Field(
        0.2, gt=0, description="a smaller PV change is refused as unidentifiable (noise)"
    )


@dataclass(frozen=True, slots=True)
class StepTestResult:
    """An identified model and the proposed PI gains (K in K/%, times in s, Kc in %/K)."""

    k_k_per_pct: float
    tau_s: float
    theta_s: float
    kc_pct_per_k: float
    ti_s: float
    tau_c_s: float
    step_pct: float
    response_k: float

    def as_dict(self) -> dict[str, Any]:
        """Rounded, JSON-ready."""
        return {k: round(getattr(self, k), 4) for k in self.__slots__}


def simc_pi(k_k_per_pct: float, tau_s: float, theta_s: float, tau_c_s: float
            ) -> tuple[float, float]:
    """SIMC PI (REFERENCE §2.2): ``(Kc [%/K], τI [s])``. Raises ValueError for k = 0 or
    τ ≤ 0."""
    if k_k_per_pct == 0.0 or tau_s <= 0.0:
        raise ValueError("SIMC needs a nonzero gain and a positive time constant")
    kc = tau_s / (abs(k_k_per_pct) * (tau_c_s + theta_s))
    return kc, min(tau_s, 4.0 * (tau_c_s + theta_s))


def identify_fopdt(t: list[float], y: list[float], t_step: float, y0: float, y_ss: float
                   ) -> tuple[float, float] | None:
    """Smith's two-point method: ``(τ, θ)`` [s] from the response after ``t_step``; None
    when the response never reaches 63 %."""
    dy = y_ss - y0
    if dy == 0.0:
        return None
    t28 = t63 = None
    for ti, yi in zip(t, y, strict=True):
        if ti < t_step:
            continue
        r = (yi - y0) / dy
        if t28 is None and r >= 0.283:
            t28 = ti - t_step
        if r >= 0.632:
            t63 = ti - t_step
            break
    if t28 is None or t63 is None:
        return None
    tau = 1.5 * (t63 - t28)
    theta = max(0.0, t63 - tau)
    return max(tau, 1e-3), theta


Phase = Literal["idle", "baseline", "stepping", "returning", "done", "failed"]


class StepTest:
    """One step test at a time (module docstring).

    Args:
        settings: `StepTestSettings`.
        valve_rate_pct_per_s: how fast the valve command moves (the loop's rate limit).
    """

    def __init__(self, settings: StepTestSettings, valve_rate_pct_per_s: float):
        self.s = settings
        self._rate = valve_rate_pct_per_s
        self._hist: deque[tuple[float, float]] = deque(maxlen=3600)
        self.phase: Phase = "idle"
        self.result: StepTestResult | None = None
        self.error: str | None = None
        self._u0 = 0.0
        self._step = 0.0
        self._t0 = 0.0
        self._y0 = 0.0
        self._resp: list[tuple[float, float]] = []

    @property
    def running(self) -> bool:
        """A test is in progress."""
        return self.phase in ("stepping", "returning")

    @property
    def response(self) -> list[tuple[float, float]]:
        """The recorded response ``[(t, PV °C), ...]`` of the last step."""
        return list(self._resp)

    @property
    def step_t0(self) -> float:
        """When the last step counts from (the middle of the commanded ramp), s."""
        return self._t0

    @property
    def y0(self) -> float:
        """The last step's baseline PV, °C."""
        return self._y0

    @property
    def step_pct(self) -> float:
        """The last step, %."""
        return self._step

    def record(self, now: float, pv_c: float | None) -> None:
        """Every period: the PV history the baseline comes from (valid PVs only)."""
        if pv_c is not None and math.isfinite(pv_c):
            self._hist.append((now, pv_c))
            if self.phase == "stepping":
                self._resp.append((now, pv_c))

    def start(self, now: float, u0_pct: float, step_pct: float) -> float:
        """Start: returns the valve target (u0 + step).

        Raises:
            ValueError: a test is running, the step is 0, or no steady baseline (too short
                or drifting).
        """
        s = self.s
        if self.running:
            raise ValueError("a step test is already running")
        if step_pct == 0.0 or not math.isfinite(step_pct):
            raise ValueError("step_pct must be nonzero")
        base = [(t, y) for t, y in self._hist if t >= now - s.baseline_s]
        if not base or base[-1][0] - base[0][0] < 0.8 * s.baseline_s:
            raise ValueError(f"need {s.baseline_s:.0f} s of valid PV before the step "
                             "(step_test.baseline_s)")
        slope = self._slope(base)
        if abs(slope) > s.steady_k_per_min:
            raise ValueError(f"PV not steady ({slope:+.3f} K/min): wait for a steady state")
        self._y0 = sum(y for _, y in base) / len(base)
        self._u0, self._step = u0_pct, step_pct
        self._t0 = now + abs(step_pct) / self._rate / 2.0  # middle of the commanded ramp
        self._resp = []
        self.result, self.error = None, None
        self.phase = "stepping"
        return u0_pct + step_pct

    def cancel(self) -> float | None:
        """Abort; returns the valve target to go back to (None: nothing to undo)."""
        if not self.running:
            return None
        self.phase = "idle"
        self.error = "cancelled"
        return self._u0 if self.s.return_to_start else None

    def update(self, now: float) -> float | None:
        """Once per period after `record`; returns a new valve target when the test ends
        (the start position with ``return_to_start``), else None."""
        s = self.s
        if self.phase != "stepping":
            return None
        el = now - self._t0
        window = [(t, y) for t, y in self._resp if t >= now - s.steady_window_s]
        steady = (el >= s.min_duration_s and len(window) >= 5
                  and abs(self._slope(window)) < s.steady_k_per_min)
        if not (steady or el >= s.max_duration_s):
            return None
        tail = window or self._resp[-5:]
        y_ss = sum(y for _, y in tail) / max(1, len(tail))
        dy = y_ss - self._y0
        self.phase = "done"
        if abs(dy) < s.min_response_k:
            self.phase, self.error = "failed", f"response {dy:+.3f} K too small to identify"
        else:
            fit = identify_fopdt([t for t, _ in self._resp], [y for _, y in self._resp],
                                 self._t0, self._y0, y_ss)
            if fit is None:
                self.phase, self.error = "failed", "the response never reached 63 %"
            else:
                tau, theta = fit
                k = dy / self._step
                kc, ti = simc_pi(k, tau, theta, s.tau_c_s)
                self.result = StepTestResult(k, tau, theta, kc, ti, s.tau_c_s, self._step, dy)
        return self._u0 if s.return_to_start else None

    @staticmethod
    def _slope(pts: list[tuple[float, float]]) -> float:
        """Least-squares slope [K/min]."""
        n = len(pts)
        if n < 2:
            return 0.0
        mt = sum(t for t, _ in pts) / n
        my = sum(y for _, y in pts) / n
        den = sum((t - mt) ** 2 for t, _ in pts)
        return 0.0 if den <= 0 else 60.0 * sum((t - mt) * (y - my) for t, y in pts) / den

    def state(self) -> dict[str, Any]:
        """JSON-ready state."""
        return {"phase": self.phase, "error": self.error,
                "result": None if self.result is None else self.result.as_dict()}
