"""Auto-commissioning (issue 21 item 2): from a steady state in auto, step the valve, identify
the loop and *propose* PI gains, the feedforward gain (with the steady map point it was taken
at) and the valve's stroke time for an operator to accept. Pure; `Commissioning.update` is
fed once per loop period by `valvey.core.controller.ValveyCore.step`.

**Start** (command ``start_commissioning {step_pct}``, ``min_step_pct`` ≤ |step| ≤
``max_step_pct``): refused (``commissioning_refused``, naming why) unless the loop is in auto
(not shadow, not held, no interlock, no step test), no alarm is active, no valve is failed and
the loop has been steady for ``steady_s``: supply within ``steady_band_k`` of the setpoint,
valve command within ``steady_valve_band_pct``, rack power within ``steady_power_pct`` of its
mean. ``u0 + step`` outside the output limits is ``out_of_range``. A proposal not yet
accepted or rejected is never lost silently: the start is refused (``commissioning_pending``)
unless it says ``discard_pending = true`` (the reply then names the discarded proposal).

**Sequence.** The baseline means are kept (supply y0, valve u0, rack power P0, facility water
T_fac); the loop goes to manual and the commissioning step test (`valvey.core.step_test`)
steps the valve by ``step_pct`` and records until the supply is steady again; the valve goes
back to u0; once the supply is back within ``steady_band_k`` of the setpoint (or after
``return_timeout_s``) the loop returns to auto (bumpless) and the proposal is published.
**Abort** (phase ``aborted``, the valve back to u0, then auto): any alarm active, the supply
more than ``abort_band_k`` from the setpoint or not measured, the rack power more than
``abort_power_pct`` from P0 (the identification needs a constant load), a valve failed, an
interlock, or the loop's mode changed by someone else; ``reject_commissioning`` aborts too.

**Proposal** (``state.commissioning.proposal``; nothing changes until
``accept_commissioning``):

* model: K [K/%], τ, θ [s] by Smith's two-point method and the fit quality
  ``1 − Σ(y − ŷ)² / Σ(y − ȳ)²`` of the FOPDT model ŷ over the recorded response;
* PI: SIMC from the model with the **actuator's lag** added to θ: a valve slower than the
  loop's rate limit (``supply_loop.output_rate_limit_pct_per_s``) runs behind the loop's
  command by ``θ_act = m · (T_stroke / 100 − 1 / rate)`` [s] (≥ 0; ``model.actuator_lag_s``)
  over a move of m = ``actuator_move_pct``, T_stroke the stroke measured below (none
  measured: the valve kept up, 0). The step test counts time from the middle of the
  *commanded* ramp, so this lag is a dead time the fit does not see (it reads θ ≈ 0 on a
  slew-limited valve). θ' = θ + θ_act, τc = max(``tau_c_s``, θ') (SIMC's τc ≥ θ),
  ``Kc = τ / (|K| (τc + θ'))``, ``τI = min(τ, 4 (τc + θ'))``, clamped into
  [``kc_min_pct_per_k``, ``kc_max_pct_per_k``] and [``ti_min_s``, ``ti_max_s``] (flagged
  ``clamped``). Measured (issue 21, S2sync on a 120 s stroke): the proposal without it
  (Kc 34.9 %/K, FF gain 1.12) ran the valve 36.1 % of the time, over the 30 % target, where
  the cold defaults ran it 28.8 %: a valve half as fast runs twice as long for the same
  travel, so the travel a proposal commands must fall with the actuator's speed (with it:
  Kc 27.1 %/K, τI 52 s, FF gain 0.87, 26.1 %, RMS 0.10 K; a valve that keeps up with the
  rate limit gets the plain SIMC proposal). m is a setting, not the operator's step: with
  the step (2–10 %) in its place the caution followed the operator's choice (a 2 % step on
  the 120 s valve still ran it 31.7 % of the time);
* feedforward: the gain that makes the feedforward's local slope the one the energy balance
  asks for (the steady point (P0, u0) is reported as ``map_point``; one point says nothing
  about the map's slope and its level is the integrator's, so the map is left to the online
  learner: moving one point of it alone made the slopes beside it wrong): with the
  exchanger's heat Q = f(u)·(T_return − T_fac) and T_return = T_supply + Q/(ṁc), holding the
  supply needs ``du/dP = (y0 − T_fac) / (P0 · |K|)`` [%/kW] at this operating point
  (∂T_supply/∂Q at fixed valve is (T_supply − T_fac)/Q, ∂T_supply/∂u at fixed load is K);
  ``gain_balance`` = that slope / the configured map's slope at P0 (±25 % of P0); the gain
  proposed is that times the actuator factor ``(tau_c_s + θ) / (τc + θ')``
  (``feedforward.actuator_factor``: 1 with a valve that keeps up with the loop's rate limit;
  the factor by which the actuator's lag slows the feedback above, applied to the
  feedforward's moves too: both drive the same valve, and a feedforward moving it more than
  it can follow buys running time, not tracking), clamped into [``ff_gain_min``,
  ``ff_gain_max``];
  none proposed without a fresh facility-water temperature, an approach below
  ``min_approach_k`` or a power below ``min_power_kw``;
* valves: the active valve's stroke time from its command vs its feedback at every tick of
  the step and the return (`Commissioning.track`): the feedback's speed while it ran behind
  its command by more than ``stroke_gap_pct`` and did not move away, over at least
  ``min_stroke_travel_pct`` of such travel; else the stroke learned online
  (`valvey.core.valves`); else none ("kept up with the loop's rate limit": the stroke is then
  at most 100 % / the rate limit and nothing is proposed). The spare valve is not stroked
  (it would add cooling).

A proposal is acceptable only when the identification succeeded, K < 0 (opening cools) and
the fit quality is at least ``min_fit_quality``. **Accept** applies it bumplessly: gains via
the loop's settings, the feedforward gain, the stroke
(`ValveManager.restore_learned`, bounded); the accepted gains and FF gain are persisted with
the other learned values (valvey.persist) together with the configured values they replaced,
re-applied after a SIGHUP reload unless the file's values changed since (the newer decision
wins), and forgotten by ``reset_learned`` (`Commissioning.reset`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from rackplane.config import StrictModel
from rackplane.core.samples import Sample, fresh_value
from rackplane.errors import CommandError
from valvey.core.step_test import simc_pi

if TYPE_CHECKING:
    from valvey.core.controller import ValveyCore

__all__ = ["STEP_MAX_PCT", "Accepted", "Commissioning", "CommissioningSettings", "fit_quality"]

STEP_MAX_PCT = 20.0
"""The widest ``max_step_pct`` a config may set, % (the schema's bound of ``step_pct``)."""


class CommissioningSettings(StrictModel):
    """Auto-commissioning (module docstring): the command's bounds, the steady state it
    starts from, its abort limits and the bounds of what it may propose."""

    min_step_pct: float = Field(2.0, ge=0.5, le=STEP_MAX_PCT, description="smallest "
                                "|step_pct|, %")
    max_step_pct: float = Field(10.0, ge=0.5, le=STEP_MAX_PCT, description="largest "
                                "|step_pct|, %")
    steady_s: float = Field(60.0, ge=10, le=1800, description="the loop must have been "
                            "steady in auto this long before the start, s")
    steady_band_k: float = Field(0.3, gt=0, le=2, description="steady: supply within this "
                                 "of the setpoint, K (also the return's end)")
    steady_valve_band_pct: float = Field(3.0, gt=0, le=20, description="steady: valve "
                                         "command range, %")
    steady_power_pct: float = Field(5.0, gt=0, le=50, description="steady: rack power range, "
                                    "% of its mean")
    abort_band_k: float = Field(1.5, gt=0, le=5, description="abort when the supply is "
                                "further than this from the setpoint, K")
    abort_power_pct: float = Field(10.0, gt=0, le=100, description="abort when the rack power "
                                   "moves further than this from its baseline, %")
    return_timeout_s: float = Field(600.0, ge=30, le=3600, description="back to auto after "
                                    "this long in the return even if the supply is not yet "
                                    "within steady_band_k, s")
    tau_c_s: float = Field(10.0, gt=0, le=600, description="SIMC closed-loop time constant, "
                           "s (REFERENCE §2.2)")
    min_fit_quality: float = Field(0.8, ge=0, le=1, description="a fit below this quality "
                                   "(R² of the FOPDT model) is not acceptable")
    kc_min_pct_per_k: float = Field(1.0, gt=0, le=200, description="proposed Kc bounds, %/K")
    kc_max_pct_per_k: float = Field(60.0, gt=0, le=200)
    ti_min_s: float = Field(5.0, gt=0, le=3600, description="proposed integral time bounds, s")
    ti_max_s: float = Field(600.0, gt=0, le=3600)
    ff_gain_min: float = Field(0.25, ge=0, le=3, description="proposed feedforward gain bounds "
                               "(feedforward.gain is at most 3)")
    ff_gain_max: float = Field(3.0, ge=0, le=3)
    min_power_kw: float = Field(5.0, gt=0, le=1000, description="no feedforward gain "
                                "proposed below this rack power, kW")
    min_approach_k: float = Field(0.5, gt=0, le=50, description="no feedforward gain proposed "
                                  "with the supply closer than this to the facility water, K")
    stroke_gap_pct: float = Field(0.5, gt=0, le=20, description="the valve runs at full speed "
                                  "while its feedback is further than this from its command "
                                  "(and moving towards it), %")
    min_stroke_travel_pct: float = Field(1.0, gt=0, le=50, description="full-speed travel "
                                         "needed for a stroke observation, %")
    actuator_move_pct: float = Field(5.0, gt=0, le=50, description="the valve move over which "
                                     "a valve slower than the loop's rate limit runs behind "
                                     "its command counts as dead time in the proposal, % (the "
                                     "loop's typical move, not the operator's step)")

    @model_validator(mode="after")
    def _order(self) -> CommissioningSettings:
        for lo, hi in (("min_step_pct", "max_step_pct"), ("kc_min_pct_per_k", "kc_max_pct_per_k"),
                       ("ti_min_s", "ti_max_s"), ("ff_gain_min", "ff_gain_max")):
            if getattr(self, lo) > getattr(self, hi):
                raise ValueError(f"commissioning: need {lo} <= {hi}")
        return self


Phase = Literal["idle", "stepping", "returning", "proposed", "failed", "aborted", "accepted",
                "rejected"]

Accepted = tuple[float, float, float, float, float | None, float]
"""Accepted gains: ``(kc_pct_per_k, ti_s, ff_gain, file_kc, file_ti, file_ff_gain)``."""


def fit_quality(t: list[float], y: list[float], t0: float, y0: float, dy: float, tau: float,
                theta: float) -> float:
    """R² of the FOPDT step response ``ŷ = y0 + dy (1 − e^{−(t − t0 − θ)/τ})`` (t > t0 + θ)
    against ``y`` (1: perfect, ≤ 0: no better than the mean; 0 for < 3 points)."""
    if len(y) < 3 or tau <= 0.0:
        return 0.0
    m = sum(y) / len(y)
    sst = sum((v - m) ** 2 for v in y)
    sse = 0.0
    for ti, v in zip(t, y, strict=True):
        el = ti - t0 - theta
        yh = y0 + (dy * (1.0 - math.exp(-el / tau)) if el > 0.0 else 0.0)
        sse += (v - yh) ** 2
    return 0.0 if sst <= 0.0 else 1.0 - sse / sst


def _interp(xs: list[float], ys: list[float], x: float) -> float:
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = max(i for i in range(len(xs) - 1) if xs[i] <= x)
    return ys[i] + (ys[i + 1] - ys[i]) * (x - xs[i]) / (xs[i + 1] - xs[i])


def _r(v: float | None, nd: int = 3) -> float | None:
    return None if v is None else round(v, nd) + 0.0


class Commissioning:
    """One auto-commissioning run at a time (module docstring).

    Args:
        settings: `CommissioningSettings`.
    """

    def __init__(self, settings: CommissioningSettings):
        self.s = settings
        # per loop period: (t, pv °C, setpoint °C, valve %, power kW, facility °C)
        self._hist: deque[tuple[float, float | None, float, float | None, float | None,
                                float | None]] = deque(maxlen=3600)
        self.phase: Phase = "idle"
        self.error: str | None = None
        self.proposal: dict[str, Any] | None = None
        self.acceptable = False
        self.accepted: Accepted | None = None
        self.accepts = 0  # proposals accepted (measured gains: valvey.learned_age)
        self._base: dict[str, float | None] = {}
        self._t_start = 0.0
        self._t_return = 0.0
        self._abort: str | None = None
        self._travel: list[tuple[float, float | None, float | None]] = []  # t, cmd, feedback

    @property
    def running(self) -> bool:
        """A run is in progress (the valve is the commissioning's)."""
        return self.phase in ("stepping", "returning")

    # --- commands --------------------------------------------------------------------------

    def start(self, core: ValveyCore, now: float, step_pct: float, *,
              discard_pending: bool = False) -> float:
        """Start from the steady state; returns the valve target. A proposal not yet
        accepted or rejected is kept: the start is refused unless ``discard_pending`` (then
        the new run replaces it; the caller reports it).

        Raises:
            CommandError: ``commissioning_pending`` (a proposal awaits accept / reject),
                ``out_of_range`` (step size outside [min_step_pct, max_step_pct] or u0 + step
                outside the output limits), ``commissioning_refused`` (why).
        """
        s = self.s
        if self.phase == "proposed" and not discard_pending:
            raise CommandError(
                "commissioning_pending", "a commissioning proposal awaits accept_commissioning "
                "or reject_commissioning; start with discard_pending=true to discard it")
        if not (math.isfinite(step_pct) and s.min_step_pct <= abs(step_pct) <= s.max_step_pct):
            raise CommandError("out_of_range", f"|step_pct| must be {s.min_step_pct} .. "
                               f"{s.max_step_pct} % (commissioning.min_step_pct .. "
                               f"max_step_pct), got {step_pct}")
        why = self._not_ready(core, now)
        if why is not None:
            raise CommandError("commissioning_refused", why)
        u0 = core.loop.command_pct
        assert u0 is not None
        ls = core.loop.settings
        if not ls.output_min_pct <= u0 + step_pct <= ls.output_max_pct:
            raise CommandError("out_of_range", f"valve {u0:.1f} % + {step_pct} % outside "
                               f"[{ls.output_min_pct}, {ls.output_max_pct}]")
        base = [h for h in self._hist if h[0] >= now - s.steady_s]
        try:
            target = core.step_test.start(now, u0, step_pct)
        except ValueError as err:
            raise CommandError("commissioning_refused", str(err)) from None
        core.loop.set_manual(target)

        def mean(i: int) -> float | None:
            vals = [h[i] for h in base if h[i] is not None]
            return None if not vals else sum(vals) / len(vals)  # type: ignore[arg-type]

        self._base = {"y0": mean(1), "u0": u0, "p0": mean(4), "t_fac": mean(5),
                      "sp": base[-1][2]}
        self.phase, self.error, self.proposal, self.acceptable = "stepping", None, None, False
        self._t_start, self._abort, self._travel = now, None, []
        return target

    def _not_ready(self, core: ValveyCore, now: float) -> str | None:
        s = self.s
        loop = core.loop
        if self.running or core.step_test.running:
            return "a commissioning run or step test is in progress"
        if loop.control_mode != "auto" or loop.shadow or loop.held or core.interlocks():
            return "the loop must be in auto (not shadow, not held, no interlock)"
        active = [a.id for a in core.alarms.active() if a.state == "active"]
        if active:
            return f"alarms active: {', '.join(active)}"
        if core.valves.failed:
            return f"valve failed: {', '.join(core.valves.failed)}"
        base = [h for h in self._hist if h[0] >= now - s.steady_s]
        if not base or base[-1][0] - base[0][0] < 0.9 * s.steady_s:
            return f"need {s.steady_s:.0f} s of steady auto operation first"
        if any(pv is None or abs(pv - sp) > s.steady_band_k for _, pv, sp, *_ in base):
            return f"supply not within {s.steady_band_k} K of the setpoint for {s.steady_s:.0f} s"
        us = [h[3] for h in base if h[3] is not None]
        if len(us) < len(base) or max(us) - min(us) > s.steady_valve_band_pct:
            return f"valve moved more than {s.steady_valve_band_pct} % in {s.steady_s:.0f} s"
        ps = [h[4] for h in base if h[4] is not None]
        if ps and (len(ps) < len(base) or max(ps) - min(ps) > 0.01 * s.steady_power_pct * max(
                1.0, sum(ps) / len(ps))):
            return f"rack power not steady within {s.steady_power_pct} %"
        return None

    def reject(self, core: ValveyCore) -> str:
        """Abort a run (the valve back to where it was, then auto) or discard a proposal;
        returns the phase before.

        Raises:
            CommandError: ``no_commissioning`` (nothing running or proposed).
        """
        before = self.phase
        if self.running:
            now = self._t_start if core.last is None else core.last.loop.t_mono
            self._do_abort(core, "rejected by the operator", now, back=self._abort is None)
        elif self.phase in ("proposed", "failed"):
            self.phase, self.proposal, self.acceptable = "rejected", None, False
        else:
            raise CommandError("no_commissioning", "no commissioning run or proposal to reject")
        return before

    def accept(self, core: ValveyCore) -> dict[str, Any]:
        """Apply the proposal (module docstring); returns what was applied.

        Raises:
            CommandError: ``no_commissioning_proposal``, ``proposal_not_acceptable``.
        """
        p = self.proposal
        if p is None or self.phase not in ("proposed", "failed"):
            raise CommandError("no_commissioning_proposal", "no commissioning proposal to accept")
        if not self.acceptable:
            raise CommandError("proposal_not_acceptable", "the proposal is not acceptable: "
                               f"{p.get('why_not')}")
        ls = core.loop.settings
        file_ff = core.ff.settings.gain if self.accepted is None else self.accepted[5]
        file_kc = ls.kc_pct_per_k if self.accepted is None else self.accepted[3]
        file_ti = ls.ti_s if self.accepted is None else self.accepted[4]
        pi, ff = p["pi"], p["feedforward"]
        gain = ff["gain"] if ff["gain"] is not None else core.ff.settings.gain
        applied: dict[str, Any] = {"kc_pct_per_k": pi["kc_pct_per_k"], "ti_s": pi["ti_s"],
                                   "ff_gain": gain}
        got = core.valves.restore_learned({k: v["stroke_time_s"] for k, v in p["valves"].items()
                                           if v["stroke_time_s"] is not None}, measured=True)
        applied["valve_stroke_s"] = {k: p["valves"][k]["stroke_time_s"] for k in got}
        self.accepted = (pi["kc_pct_per_k"], pi["ti_s"], gain, file_kc, file_ti, file_ff)
        self.accepts += 1
        self.apply_accepted(core)
        self.phase = "accepted"
        return applied

    def apply_accepted(self, core: ValveyCore) -> None:
        """Lay the accepted gains over the loop and the feedforward (bumpless)."""
        if self.accepted is None:
            return
        kc, ti, gain = self.accepted[:3]
        core.loop.reload(core.loop.settings.model_copy(update={"kc_pct_per_k": kc, "ti_s": ti}))
        core.ff.set_gain(gain)
        core.loop.rebase()

    def restore(self, core: ValveyCore, saved: Accepted) -> bool:
        """Lay persisted accepted gains over a fresh core: only while the configured values
        are those they replaced and they are within this config's bounds (False: dropped)."""
        s = self.s
        kc, ti, gain, fkc, fti, fgain = saved
        ls = core.loop.settings
        if (fkc, fti, fgain) != (ls.kc_pct_per_k, ls.ti_s, core.ff.settings.gain):
            return False
        if not (s.kc_min_pct_per_k <= kc <= s.kc_max_pct_per_k and s.ti_min_s <= ti <= s.ti_max_s
                and s.ff_gain_min <= gain <= s.ff_gain_max):
            return False
        self.accepted = (kc, ti, gain, fkc, fti, fgain)
        self.apply_accepted(core)
        return True

    def on_reload(self, core: ValveyCore) -> None:
        """After a SIGHUP reload of the loop settings: the accepted gains again, unless the
        file's gains are no longer those they replaced (then the file wins)."""
        a = self.accepted
        if a is None:
            return
        ls = core.loop.settings
        if (ls.kc_pct_per_k, ls.ti_s) != (a[3], a[4]):
            self.accepted = None
            return
        self.apply_accepted(core)

    def reset(self, core: ValveyCore) -> None:
        """Forget the accepted gains: the configured ones again (bumpless)."""
        a = self.accepted
        if a is None:
            return
        self.accepted = None
        core.loop.reload(core.loop.settings.model_copy(update={"kc_pct_per_k": a[3],
                                                                "ti_s": a[4]}))
        core.ff.set_gain(a[5])
        core.loop.rebase()

    # --- the run ---------------------------------------------------------------------------

    def update(self, core: ValveyCore, now: float, samples: Mapping[str, Sample],
               pv_c: float | None, setpoint_c: float) -> None:
        """Once per loop period after the step test's update: the history, then the run."""
        loop = core.loop
        stale = core.cfg.safety.stale_after_s
        fac = core.points.facility_supply_temp
        t_fac = None if fac is None else fresh_value(samples.get(fac), now, stale)
        auto = loop.control_mode == "auto" and not loop.held
        self._hist.append((now, pv_c if auto else None, setpoint_c,
                           loop.command_pct if auto else None, core.ff.power_kw, t_fac))
        if not self.running:
            return
        s, b = self.s, self._base
        active = [a.id for a in core.alarms.active() if a.state == "active"]
        p, p0 = core.ff.power_kw, b["p0"]
        why = None
        if active:
            why = f"alarm {active[0]}"
        elif pv_c is None or abs(pv_c - setpoint_c) > s.abort_band_k:
            why = f"supply outside setpoint ± {s.abort_band_k} K"
        elif p0 is not None and (p is None or abs(p - p0) > 0.01 * s.abort_power_pct * max(
                p0, 1.0)):
            why = f"rack power moved more than {s.abort_power_pct} % (load changed)"
        elif core.valves.failed or core.interlocks():
            why = "valve failed or interlock"
        elif loop.control_mode != "manual":
            why = "the loop's mode was changed"
        # returning: the return to u0 is the recovery; the band and the load abort the step
        if why is not None and (self.phase == "stepping" or why.startswith("alarm")
                                or "mode" in why):
            self._do_abort(core, why, now, back=self.phase == "stepping" and "mode" not in why)
            return
        if self.phase == "stepping" and core.step_test.phase in ("done", "failed"):
            self.phase, self._t_return = "returning", now
        if self.phase == "returning":
            u0 = b["u0"]
            assert u0 is not None
            at_u0 = loop.command_pct is not None and abs(loop.command_pct - u0) < 0.05
            back = pv_c is not None and abs(pv_c - setpoint_c) <= s.steady_band_k
            late = now - self._t_return >= s.return_timeout_s
            if self._abort is not None and (at_u0 or late):
                loop.set_auto()  # aborted: the valve is back where it was
                self.phase = "aborted"
            elif at_u0 and (back or late):
                loop.set_auto()
                self._propose(core)

    def track(self, core: ValveyCore, now: float, samples: Mapping[str, Sample]) -> None:
        """Every tick while running: the active valve's command and feedback (the stroke
        observation)."""
        unit = core.valves.active_unit
        fb = None if unit.position is None else fresh_value(
            samples.get(unit.position), now, core.cfg.valves.stale_after_s)
        if len(self._travel) < 20000:
            self._travel.append((now, core.loop.command_pct, fb))

    def _do_abort(self, core: ValveyCore, why: str, now: float, *, back: bool = True) -> None:
        """Abort: the valve back to u0 in manual, then auto (``back``), or auto at once (an
        alarm while already returning, the mode changed by someone else)."""
        if core.step_test.running:
            core.step_test.cancel()
        u0 = self._base.get("u0")
        self.proposal, self.acceptable, self.error, self._abort = None, False, why, why
        if back and self.phase == "stepping" and u0 is not None:
            core.loop.set_manual(u0)
            self.phase, self._t_return = "returning", now
            return
        if core.loop.control_mode == "manual":
            core.loop.set_auto()  # bumpless from where the valve is: the PID takes it back
        self.phase = "aborted"

    def _propose(self, core: ValveyCore) -> None:
        s = self.s
        st = core.step_test
        r = st.result
        why_not: str | None = None
        valves = self._stroke_proposal(core)
        act_s = self._actuator_lag_s(core, valves, s.actuator_move_pct)
        model: dict[str, Any] = {"step_pct": _r(st.step_pct, 2), "actuator_lag_s": _r(act_s, 2)}
        pi: dict[str, Any] = {"kc_pct_per_k": None, "ti_s": None, "tau_c_s": s.tau_c_s,
                              "clamped": False}
        k = None
        slow = 1.0
        if r is None:
            why_not = f"identification failed: {st.error}"
        else:
            k = r.k_k_per_pct
            q = fit_quality([t for t, _ in st.response], [y for _, y in st.response],
                            st.step_t0, st.y0, r.response_k, r.tau_s, r.theta_s)
            model.update(k_k_per_pct=_r(k, 4), tau_s=_r(r.tau_s, 1), theta_s=_r(r.theta_s, 1),
                         response_k=_r(r.response_k), fit_quality=_r(q))
            if k >= 0.0:
                why_not = f"K = {k:+.3f} K/%: opening the valve must cool"
            elif q < s.min_fit_quality:
                why_not = f"fit quality {q:.2f} below {s.min_fit_quality}"
            else:
                # the actuator's lag is a dead time the fit does not see (module docstring)
                theta = r.theta_s + act_s
                tau_c = max(s.tau_c_s, theta)
                kc, ti = simc_pi(k, r.tau_s, theta, tau_c)
                slow = (s.tau_c_s + r.theta_s) / (tau_c + theta)
                kc2 = min(s.kc_max_pct_per_k, max(s.kc_min_pct_per_k, kc))
                ti2 = min(s.ti_max_s, max(s.ti_min_s, ti))
                pi.update(kc_pct_per_k=round(kc2, 3), ti_s=round(ti2, 1),
                          tau_c_s=_r(tau_c, 2), clamped=(kc2, ti2) != (kc, ti))
        self.proposal = {"model": model, "pi": pi,
                         "feedforward": self._ff_proposal(core, k, slow),
                         "valves": valves, "why_not": why_not}
        self.acceptable = why_not is None
        self.phase = "proposed" if why_not is None else "failed"
        self.error = why_not
        st.result, st.phase = None, "idle"  # the proposal is the one way to apply it

    @staticmethod
    def _actuator_lag_s(core: ValveyCore, valves: Mapping[str, Mapping[str, Any]],
                        move_pct: float) -> float:
        """The time the active valve, at the stroke measured, runs behind the loop's own
        rate-limited command over a move of ``move_pct``, s (0: it keeps up, or no stroke
        measured: it kept up with the rate limit)."""
        stroke = valves.get(core.valves.active_unit.name, {}).get("stroke_time_s")
        if stroke is None:
            return 0.0
        rate = core.loop.settings.output_rate_limit_pct_per_s
        return max(0.0, move_pct * (stroke / 100.0 - 1.0 / rate))

    def _ff_proposal(self, core: ValveyCore, k: float | None, slow: float = 1.0
                     ) -> dict[str, Any]:
        s, b, ff = self.s, self._base, core.ff
        fs = ff.settings
        # the configured map's slope (the learned one moves by single points: its local
        # slope is not the plant's)
        xs = [float(q[0]) for q in fs.valve_map]
        new = [float(q[1]) for q in fs.valve_map]
        p0, u0, y0, t_fac = b["p0"], b["u0"], b["y0"], b["t_fac"]
        out: dict[str, Any] = {"map_point": None if p0 is None or u0 is None else [
            _r(p0, 2), _r(u0, 2)], "gain": None, "gain_from": fs.gain, "approach_k": None,
            "slope_pct_per_kw": None, "gain_balance": None, "actuator_factor": _r(slow),
            "note": None}
        if p0 is None or u0 is None:
            out["note"] = "no rack power: no feedforward proposal"
            return out
        if k is None or k >= 0.0 or t_fac is None or y0 is None:
            out["note"] = "no identified gain or facility-water temperature: gain not proposed"
            return out
        approach = y0 - t_fac
        if approach < s.min_approach_k or p0 < s.min_power_kw:
            out["note"] = (f"approach {approach:.2f} K or power {p0:.1f} kW too small: gain "
                           "not proposed")
            return out
        need = approach / (p0 * abs(k))
        d = max(1.0, 0.25 * p0)
        have = (_interp(xs, new, p0 + d) - _interp(xs, new, max(0.0, p0 - d))) / (
            p0 + d - max(0.0, p0 - d))
        out.update(approach_k=_r(approach, 2), slope_pct_per_kw=_r(need, 4))
        if have <= 0.0:
            out["note"] = "the map is flat at this power: gain not proposed"
            return out
        # the actuator's lag slows the feedforward as it slows the feedback (module docstring)
        out["gain_balance"] = _r(need / have)
        out["gain"] = round(min(s.ff_gain_max, max(s.ff_gain_min, slow * need / have)), 3)
        return out

    def _stroke_proposal(self, core: ValveyCore) -> dict[str, dict[str, Any]]:
        vs = core.valves
        gap = self.s.stroke_gap_pct
        active = vs.active_unit.name
        dist = dur = 0.0
        for (t0, c0, f0), (t1, c1, f1) in zip(self._travel, self._travel[1:], strict=False):
            if c0 is None or c1 is None or f0 is None or f1 is None:
                continue
            g0, g1 = c0 - f0, c1 - f1
            moved = f1 - f0
            # behind its command at both ends, on the same side, not moving away (a feedback
            # quantised coarser than one tick's travel shows no change in some ticks)
            if abs(g0) > gap and abs(g1) > gap and g0 * g1 > 0 and moved * g0 >= 0:
                dist += abs(moved)
                dur += t1 - t0
        learned = vs.learned()
        out: dict[str, dict[str, Any]] = {}
        for u in vs.units:
            if u.name == active and dist >= self.s.min_stroke_travel_pct and dur > 0.0:
                st = min(vs.s.stroke_max_s, max(vs.s.stroke_min_s, 100.0 * dur / dist))
                out[u.name] = {"stroke_time_s": round(st, 1), "how": "observed in the step"}
            elif u.name in learned:
                out[u.name] = {"stroke_time_s": round(learned[u.name], 1),
                               "how": "learned online"}
            else:
                out[u.name] = {"stroke_time_s": None, "how": "spare: not stroked"
                               if u.name != active else "kept up with the loop's rate limit"}
        return out

    def state(self) -> dict[str, Any]:
        """JSON-ready state (``state.supply_loop.commissioning``)."""
        a = self.accepted
        return {"phase": self.phase, "error": self.error, "acceptable": self.acceptable,
                "proposal": self.proposal,
                "accepted": None if a is None else {"kc_pct_per_k": a[0], "ti_s": a[1],
                                                    "ff_gain": a[2]}}
