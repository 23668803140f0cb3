"""The CDU's own supply-temperature loop (heartbeat lost → local control): PI on the median
of supply sensors A/B/C (REFERENCE §2.2 SIMC gains)."""

from __future__ import annotations

import math

from sims.cdu.loop import LoopModel


class LocalControl(LoopModel):
    """The local PI (part of `CduPlant`)."""

    __slots__ = ()

    def _supply_estimate(self) -> float:
        """Median of the finite supply sensors A/B/C; NaN when none is finite."""
        vals = [v for v in (self._s_sa.value, self._s_sb.value, self._s_sc.value) if v == v]
        if not vals:
            return math.nan
        vals.sort()
        n = len(vals)
        return vals[n // 2] if n % 2 else 0.5 * (vals[0] + vals[1])

    def _enter_local(self) -> None:
        self._local = True
        self._remote_written = False
        self._remote_cmd = self._x_cmd
        y = self._supply_estimate()
        e = 0.0 if y != y else y - self._sp
        self._pi_i = self._x_cmd - self._p.local_pi_gain_per_k * e  # bumpless
        self._pi_next_t = self._t
        self._local_pi()
        self._pi_next_t = self._t + self._p.local_pi_period_s

    def _local_pi(self) -> None:
        """PI with conditional integration on the median supply sensor; holds on signal loss
        (Vertiv CDU 600: "on signal loss the valve holds its last position", REF §1.5)."""
        y = self._supply_estimate()
        if y != y:
            return
        p = self._p
        e = y - self._sp
        kc = p.local_pi_gain_per_k
        i_new = self._pi_i + kc * e * p.local_pi_period_s / p.local_pi_integral_time_s
        u = i_new + kc * e
        if u > 1.0:
            u = 1.0
            if e <= 0.0:
                self._pi_i = i_new
        elif u < 0.0:
            u = 0.0
            if e >= 0.0:
                self._pi_i = i_new
        else:
            self._pi_i = i_new
        self._x_cmd = u
