"""The liquid fraction the capacity guard (`valvey.core.capacity`) and the feedforward use:
the share of the rack power that reaches the liquid (pure).

Learned (``capacity.learn_liquid_fraction``) as heat removed at the CDU / rack power racky
publishes, at steady state only (rack power and heat removed within 3 %, the supply within
0.05 K, of their averages for ``liquid_steady_s``: the heat meter lags the power through the
rack and the pipes, and a warming loop stores heat), averaged, and used only within
[``liquid_fraction_min``, ``liquid_fraction_max``]; until learned, or with every ratio outside
that window, the configured ``liquid_fraction`` is the fallback.

Persisted by the daemon (valvey.persist: `LiquidFraction.saved`, `LiquidFraction.restore`,
within the same window, and only while confirmed within ``control.learned_max_age_s``:
valvey.learned_age) so a restart does not fall back to the configured value for minutes;
``reset_learned`` forgets it (`LiquidFraction.forget`). Published in ``state/safety``
(``liquid_fraction``, ``liquid_fraction_learned``, ``liquid_fraction_source``: configured,
restored from the file, or learned this run) and the ``cdu`` telemetry line.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from valvey.core.capacity import CapacitySettings

__all__ = ["LiquidFraction"]


class _Mean:
    """Mean of the samples, turning into an exponential average of ``tau_s`` (1 s samples)."""

    __slots__ = ("n", "tau", "value")

    def __init__(self, tau_s: float):
        self.tau = tau_s
        self.value: float | None = None
        self.n = 0

    def update(self, x: float) -> float:
        self.n += 1
        self.value = x if self.value is None else self.value + (x - self.value) / min(
            float(self.n), self.tau)
        return self.value


class LiquidFraction:
    """The liquid fraction learned at steady state (module docstring): ``value`` is the one in
    use (learned, else the configured fallback), ``learned`` whether it is learned, ``source``
    where it comes from, ``saved`` what the state file keeps (`restore` lays it back)."""

    def __init__(self, s: CapacitySettings):
        self.s = s
        self._avg_p = _Mean(s.liquid_steady_s / 4.0)
        self._avg_q = _Mean(s.liquid_steady_s / 4.0)
        self._avg_pv = _Mean(s.liquid_steady_s / 4.0)
        self._steady_since: float | None = None
        self.implausible = 0  # steady ratios outside the window (not learned)
        self.forget()

    def forget(self) -> None:
        """Back to the configured fraction (``reset_learned``); the steady window goes on."""
        self._ratio = _Mean(self.s.liquid_steady_s)
        self._restored = False  # the average started from a saved value (restore)
        self._own = 0  # steady ratios of this run averaged in
        self.saved: float | None = None  # the learned value to persist (0-1, 3 decimals)

    @property
    def learned(self) -> bool:
        """A steady window of ``liquid_steady_s`` has passed and its ratio has been averaged
        for a quarter of that again (the inputs are already 30 s averages at the default);
        or a saved value was restored."""
        return self._ratio.n >= self.s.liquid_steady_s / 4.0

    @property
    def own_samples(self) -> int:
        """Steady ratios this run has averaged in since the last `forget` / `restore`: grows
        with each measurement confirming the value (valvey.learned_age)."""
        return self._own

    @property
    def value(self) -> float:
        """The fraction in use (0-1): learned (or restored), else the configured one."""
        r = self._ratio.value
        return r if self.s.learn_liquid_fraction and self.learned and r is not None else (
            self.s.liquid_fraction)

    @property
    def source(self) -> str:
        """``configured`` (the fallback in use), ``restored`` (the value saved by an earlier
        run, not yet re-confirmed: this run has averaged in fewer steady ratios than make a
        cold start's value learned) or ``learned`` (this run has)."""
        if not (self.s.learn_liquid_fraction and self.learned):
            return "configured"
        return "restored" if self._restored and self._own < self.s.liquid_steady_s / 4.0 else (
            "learned")

    def restore(self, value: float) -> bool:
        """Lay a saved learned fraction (0-1) over the configured one: taken (True) only with
        ``learn_liquid_fraction`` on and within [``liquid_fraction_min``,
        ``liquid_fraction_max``] (finite); it counts as learned, weighs as much as a cold
        start's first learned value, and this run's steady ratios average into it."""
        s = self.s
        if (isinstance(value, bool) or not isinstance(value, int | float)
                or not math.isfinite(value) or not s.learn_liquid_fraction
                or not s.liquid_fraction_min <= value <= s.liquid_fraction_max):
            return False
        self.forget()
        self._ratio.value = float(value)
        self._ratio.n = math.ceil(s.liquid_steady_s / 4.0)
        self._restored = True
        self.saved = round(float(value), 3)
        return True

    def _learn(self, ratio: float) -> None:
        """Average one steady ratio in; ``saved`` follows the value in steps of 0.005 (a save
        is due for a real change, not for the average's last digit)."""
        self._ratio.update(ratio)
        self._own += 1
        v = self._ratio.value
        if self.s.learn_liquid_fraction and self.learned and v is not None and (
                self.saved is None or abs(v - self.saved) >= 0.005):
            self.saved = round(v, 3)

    def update(self, now: float, heat_removed_kw: float | None, rack_power_w: float | None,
               pv_c: float | None) -> None:
        """One 1 s sample; anything missing or non-finite restarts the steady window."""
        s = self.s
        if (heat_removed_kw is None or rack_power_w is None or pv_c is None
                or not math.isfinite(heat_removed_kw + rack_power_w + pv_c)
                or rack_power_w < s.min_cap_w or heat_removed_kw <= 0.0):
            self._steady_since = None
            self._avg_p, self._avg_q, self._avg_pv = (_Mean(self._avg_p.tau), _Mean(
                self._avg_q.tau), _Mean(self._avg_pv.tau))
            return
        p = self._avg_p.update(rack_power_w)
        q = self._avg_q.update(heat_removed_kw)
        pv = self._avg_pv.update(pv_c)
        steady = (abs(rack_power_w - p) <= 0.03 * p and abs(heat_removed_kw - q) <= 0.03 * q
                  and abs(pv_c - pv) <= 0.05)
        if not steady:
            self._steady_since = None
            return
        if self._steady_since is None:
            self._steady_since = now
        if now - self._steady_since < s.liquid_steady_s:
            return
        ratio = 1000.0 * q / p
        if s.liquid_fraction_min <= ratio <= s.liquid_fraction_max:
            self._learn(ratio)
        else:
            self.implausible += 1
