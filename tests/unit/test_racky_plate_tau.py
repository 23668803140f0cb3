"""racky's cold-plate time constant learned from the junction's response to power steps
(racky.core.plate_tau), not the nominal simulated plant's C/G."""

from __future__ import annotations

import numpy as np
import pytest

from racky.config import CoolingSettings, ThermalSettings
from racky.core.plate_tau import PlateTau
from racky.core.thermal import ThermalInputs, ThermalWatch


def _gpu_trace(tau_s: tuple[float, ...], steps: list[tuple[float, float]], seconds: float,
               noise_k: float = 0.05, seed: int = 4, jump_k_per_w: float = 0.012,
               ) -> tuple[PlateTau, np.ndarray]:
    """GPUs of plate time constants ``tau_s`` (G = 100 W/K), power stepping at ``steps``
    (time, W), read at 1 Hz with white noise; the junction = plate + R_jp·P (jumps at the
    step); returns the learner and the true τ."""
    n = len(tau_s)
    tau = np.array(tau_s)
    g = 100.0
    rng = np.random.default_rng(seed)
    lt = PlateTau(n, ThermalSettings().plate_tau_s)
    plate = np.full(n, 45.0 + 400.0 / g)
    power = np.full(n, 400.0)
    prev_p = np.full(n, np.nan)
    t, h, sub = 0.0, 1.0, 100
    while t < seconds:
        for at, w in steps:
            if t <= at < t + h:
                power = np.full(n, w)
        for _ in range(sub):  # the plant between reads
            plate += (power - g * (plate - 45.0)) / (g * tau) * (h / sub)
        t += h
        tj = plate + jump_k_per_w * power + rng.normal(0.0, noise_k, n)
        moved = ~(np.abs(power - prev_p) <= 0.03 * np.maximum(prev_p, 1.0))
        prev_p = np.where(moved, power, prev_p)
        lt.update(t, tj, moved, np.ones(n, dtype=bool))
    return lt, tau


def test_learned_from_power_steps_on_plates_unlike_the_nominal() -> None:
    steps = [(20.0, 1200.0), (80.0, 500.0), (140.0, 1100.0), (200.0, 600.0)]
    lt, tau = _gpu_trace((2.5, 6.5, 12.0), steps, 260.0)
    assert lt.learned.all()
    assert lt.tau_s == pytest.approx(tau, rel=0.12)
    assert lt.fits >= 9 and lt.rejected == 0


def test_the_prior_is_long_and_stays_until_a_step_teaches() -> None:
    prior = ThermalSettings().plate_tau_s
    assert prior >= 2.0 * 4.0  # long: warns earlier than a healthy plate's few seconds
    flat, _ = _gpu_trace((6.5,), [], 200.0)  # constant power: nothing to learn from
    assert not flat.learned.any() and flat.tau_s[0] == prior
    tiny, _ = _gpu_trace((6.5,), [(20.0, 440.0)], 200.0)  # a 0.4 K rise: under min_range_k
    assert not tiny.learned.any()


def test_an_implausible_fit_is_not_learned_and_reset_forgets() -> None:
    slow, _ = _gpu_trace((150.0,), [(20.0, 1200.0)], 200.0)  # beyond max_s (60 s)
    assert not slow.learned.any() and slow.tau_s[0] == slow.prior_s
    lt, _ = _gpu_trace((6.5,), [(20.0, 1200.0)], 60.0)
    assert lt.learned.all()
    lt.reset()
    assert not lt.learned.any() and lt.tau_s[0] == lt.prior_s


def _watch_run(learn_step: bool) -> tuple[float | None, ThermalWatch]:
    """One GPU on one tray, read at 1 Hz: (with ``learn_step``) a power step its junction
    follows with a 5 s plate, then 60 s flat; then a fouling-like rise of 0.5 K/s at flat
    power from a 9 K T.Limit margin. Returns the margin [K] when the GPU is first hot."""
    w = ThermalWatch(ThermalSettings(), CoolingSettings(), 1, 1, 1200.0, 200.0)
    t, tj, p = 0.0, 70.0, 400.0
    first: float | None = None

    def read(tj_c: float, power_w: float) -> None:
        nonlocal first
        margin = 87.0 - tj_c
        st = w.step(t, ThermalInputs(
            np.array([tj_c]), np.array([margin]), np.array([power_w]), np.array([False]),
            np.array([True]), np.array([50.0]), np.array([True]), {}, None))
        if st.hot_trays and first is None:
            first = margin

    if learn_step:
        for _ in range(10):
            read(tj, p)
            t += 1.0
        p, target = 800.0, 78.0  # +400 W: the die jumps 0.4 K, the plate rises 7.6 K
        tj_plate = tj
        for _ in range(60):
            tj_plate += (target - tj_plate) * (1.0 - np.exp(-1.0 / 5.0))
            read(tj_plate + 0.4, p)
            t += 1.0
        tj = tj_plate + 0.4
    else:
        for _ in range(70):
            read(tj, p)
            t += 1.0
    tj = 87.0 - 9.0
    while tj < 87.0 and first is None:
        read(tj, p)
        tj += 0.5
        t += 1.0
    return first, w


def test_the_prediction_waits_for_the_learned_time_constant() -> None:
    """No steady-state prediction on the prior (a long one predicted a healthy load step's
    rise as an overheat, a false rack_overheat on S1): an unlearned GPU is warned by its
    margin (2 K) alone; once its τ is learned (≈ 5 s here) the prediction warns at a margin
    of about 2 K + τ·0.5 K/s."""
    unlearned, w0 = _watch_run(False)
    assert not w0.plate.learned.any()
    assert unlearned is not None and unlearned <= ThermalSettings().gpu_warn_margin_c
    learned, w1 = _watch_run(True)
    assert w1.plate.learned.all() and w1.plate.tau_s[0] == pytest.approx(5.0, rel=0.15)
    assert learned is not None and 3.5 <= learned <= 5.5


def _drift_window(lt: PlateTau, seed: int) -> None:
    """A power step, then 30 s in which the junction does not follow a plate's decay: it
    drifts 0.1 K/s (the coolant warming under it) with 0.2 K of wander (the load moving within
    the flat band), read at 1 Hz; then the next step ends the window."""
    rng = np.random.default_rng(seed)
    one = np.ones(1, dtype=bool)
    lt.update(0.0, np.array([60.0]), one, one)  # the step
    for k in range(1, 30):
        tj = 60.0 + 0.1 * k + rng.normal(0.0, 0.2)
        lt.update(float(k), np.array([tj]), ~one, one)
    lt.update(30.0, np.array([63.0]), one, one)  # the next step closes the window


def test_a_window_the_first_order_line_does_not_explain_is_not_learned() -> None:
    """A drift with wander gives a flat, poorly fitting line (R² well below min_r2) whose
    slope is noise: b < 0 and τ = −1/b within [min_s, max_s] on these seeds (tens of s on a
    plate of a few), which the plain plausibility window learned. A τ many times too long
    made the steady-state prediction read a healthy load burst as an overheat."""
    for seed in (2, 8, 11):  # seeds whose noise slope is negative, τ in the window
        plain = PlateTau(1, 10.0, min_r2=0.0)  # no R² gate: the window is learned, long
        _drift_window(plain, seed)
        assert plain.learned.all() and plain.tau_s[0] > 10.0
        lt = PlateTau(1, 10.0)
        _drift_window(lt, seed)
        assert not lt.learned.any() and lt.rejected == 1 and lt.tau_s[0] == 10.0
