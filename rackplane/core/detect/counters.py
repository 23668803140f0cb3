"""Counter deltas that are right across wraps, resets and saturation (FIELD-CASES BR-11).

A hardware counter is read as a fixed-width unsigned integer. Between two reads it can:

* increase: delta = new − old;
* wrap (a ``bits``-wide counter passed 2^bits − 1 and restarted at 0): delta =
  (2^bits − old) + new, i.e. ``(new − old) mod 2^bits``;
* restart from 0 because the device rebooted or the counter was cleared: the delta of the
  interval is unknown (the count since the reset is ``new``, a lower bound); wrap arithmetic
  here gives the "1 Ebps" spike of BR-11 c;
* stop at 2^bits − 1 (IB PortCounters saturate instead of wrapping): the delta is at least
  max − old and the rate is **unknown**, never "0, healthy".

`CounterDeltas` tells them apart, per element and vectorised:

1. a reset when the device says so: its boot id changed, its uptime went down, or its uptime
   is shorter than the time since the previous read (it rebooted in between);
2. otherwise a decrease of a wrapping counter is a wrap when the wrapped delta is plausible
   (at most ``max_rate_per_s`` × elapsed + ``max_delta_slack``), else a reset (a counter
   cleared by software, or no uptime/boot id to ask); a decrease of a saturating counter is
   always a reset (it cannot wrap);
3. an increase above the plausible delta is ``implausible`` (unknown, never used);
4. a saturating counter at its maximum is ``saturated`` (unknown).

The first read of an element (and the first after `forget`) has no delta (``first``): no rate
and no alarm until a second read exists (BR-11 d). No negative delta or rate is ever produced:
every delta is either a non-negative number or NaN (unknown), with a status saying why.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import numpy as np
import numpy.typing as npt

from rackplane.core.detect._util import BoolArray, FloatArray, check_count, mask, param

__all__ = ["U64", "CounterDeltas", "CounterStatus", "CounterStep"]

U64 = npt.NDArray[np.uint64]


class CounterStatus(IntEnum):
    """Per-element outcome of one `CounterDeltas.update` (stored as int8)."""

    OK = 0
    """An increase (or no change): the delta is exact."""
    WRAP = 1
    """A decrease taken as a wrap: the delta is exact (modulo 2^bits)."""
    RESET = 2
    """Device reboot, counter cleared, or an implausible wrap: delta unknown (NaN)."""
    SATURATED = 3
    """A saturating counter at its maximum: delta at least `CounterStep.lower_bound`, rate
    unknown."""
    IMPLAUSIBLE = 4
    """An increase above the plausible delta (or a value wider than the counter): unknown."""
    FIRST = 5
    """First read of the element: no delta yet."""
    MISSING = 6
    """No new read this time: nothing known."""


@dataclass(frozen=True, slots=True)
class CounterStep:
    """Result of one update; every array has the counter shape (n,).

    Attributes:
        delta: the increase since the previous read, >= 0, NaN when unknown (see ``status``).
        dt_s: seconds since the previous read (NaN without one).
        rate_per_s: delta / dt_s where both are known and dt_s > 0, else NaN; never negative.
        status: `CounterStatus` codes (int8).
        lower_bound: for SATURATED elements the least possible delta, for RESET ones the count
            since the reset (the new value); NaN elsewhere.
    """

    delta: FloatArray
    dt_s: FloatArray
    rate_per_s: FloatArray
    status: npt.NDArray[np.int8]
    lower_bound: FloatArray

    @property
    def known(self) -> BoolArray:
        """Elements with an exact delta (OK or WRAP)."""
        return (self.status == CounterStatus.OK) | (self.status == CounterStatus.WRAP)

    def count(self, status: CounterStatus) -> int:
        """How many elements have ``status``."""
        return int((self.status == status).sum())


class CounterDeltas:
    """Deltas of ``n`` counters read together (see the module docstring).

    Args:
        n: counters (e.g. ports × counter kinds, flattened).
        bits: width of each counter (8, 16, 32 or 64; scalar or shape (n,)).
        saturating: True where the counter saturates at 2^bits − 1 instead of wrapping.
        max_rate_per_s: the largest plausible rate of each counter (inf: anything goes); a
            wrap or increase whose delta exceeds ``max_rate_per_s × dt + max_delta_slack`` is
            not trusted (BR-11: "a decrease counts as a wrap only when (2^bits − prev) + new
            is at most the configured maximum plausible delta").
        max_delta_slack: added to the plausible delta (absorbs poll jitter), counts.
        uptime_tolerance_s: an uptime may trail the time since the previous read by this much
            before it is taken as a reboot (reads are stamped on arrival).

    Raises:
        ValueError: bad sizes, widths or limits.
    """

    def __init__(
        self,
        n: int,
        bits: Any = 64,
        saturating: Any = False,
        max_rate_per_s: Any = np.inf,
        max_delta_slack: float = 1.0,
        uptime_tolerance_s: float = 5.0,
    ) -> None:
        self.n = check_count("n", n)
        b = np.asarray(bits, dtype=np.int64)
        if b.ndim == 0:
            b = np.full(self.n, int(b))
        if b.shape != (self.n,) or not np.isin(b, (8, 16, 32, 64)).all():
            raise ValueError(f"bits must be 8, 16, 32 or 64 (scalar or shape ({self.n},))")
        self.bits = b
        ones = np.uint64(0xFFFF_FFFF_FFFF_FFFF)
        self.max_value: U64 = np.where(
            b == 64, ones, (np.uint64(1) << b.astype(np.uint64)) - np.uint64(1)
        ).astype(np.uint64)
        self._max_f = self.max_value.astype(np.float64)
        self.saturating = mask("saturating", saturating, self.n)
        self.max_rate_per_s = param("max_rate_per_s", max_rate_per_s, self.n, lo=0.0,
                                    allow_inf=True)
        if not (np.isfinite(max_delta_slack) and max_delta_slack >= 0.0):
            raise ValueError("max_delta_slack must be finite and >= 0")
        self.max_delta_slack = float(max_delta_slack)
        if not (np.isfinite(uptime_tolerance_s) and uptime_tolerance_s >= 0.0):
            raise ValueError("uptime_tolerance_s must be finite and >= 0")
        self.uptime_tolerance_s = float(uptime_tolerance_s)
        self._prev = np.zeros(self.n, dtype=np.uint64)
        self._prev_t = np.full(self.n, np.nan)
        self._prev_up = np.full(self.n, np.nan)
        self._prev_boot = np.zeros(self.n, dtype=np.uint64)
        self._have = np.zeros(self.n, dtype=bool)
        self._inf_rate = np.isinf(self.max_rate_per_s)
        self._finite_rates = not bool(self._inf_rate.all())
        self._true = np.ones(self.n, dtype=bool)

    @property
    def last_value(self) -> U64:
        """The last value read per element (0 before any), a copy."""
        return self._prev.copy()

    def forget(self, which: Any = None) -> None:
        """Drop the previous reads (all, or a mask/indices): the next read is ``first``."""
        idx = slice(None) if which is None else which
        self._have[idx] = False

    def update(
        self,
        value: Any,
        t_s: Any,
        present: Any = True,
        uptime_s: Any = None,
        boot_id: Any = None,
    ) -> CounterStep:
        """Take one read per element.

        Args:
            value: the counter values (unsigned integers, shape (n,)).
            t_s: when each value was read, monotonic s (scalar or (n,)); an element whose
                ``t_s`` is not after its previous read is ``missing`` (no new information).
            present: False where there is no read this time.
            uptime_s: the device's uptime per element, s (NaN: unknown); None: unknown.
            boot_id: the device's boot id per element (0: unknown); None: unknown.

        Returns:
            The `CounterStep` of this read.

        Raises:
            ValueError: wrong shapes or non-integer values.
        """
        n = self.n
        v_in = np.asarray(value)
        if v_in.shape != (n,):
            raise ValueError(f"value must have shape ({n},), got {v_in.shape}")
        if v_in.dtype.kind not in "ui":
            raise ValueError(f"counter values must be integers, got dtype {v_in.dtype}")
        if v_in.dtype.kind == "i" and (v_in < 0).any():
            raise ValueError("counter values must be >= 0")
        v = v_in.astype(np.uint64)
        t = np.asarray(t_s, dtype=np.float64)
        if t.ndim == 0:
            t = np.full(n, float(t))
        if t.shape != (n,):
            raise ValueError(f"t_s must be a scalar or have shape ({n},)")
        pres = mask("present", present, n) & np.isfinite(t)
        up = np.full(n, np.nan) if uptime_s is None else np.broadcast_to(
            np.asarray(uptime_s, dtype=np.float64), (n,))
        boot = np.zeros(n, dtype=np.uint64) if boot_id is None else np.broadcast_to(
            np.asarray(boot_id).astype(np.uint64), (n,))

        with np.errstate(invalid="ignore", divide="ignore"):
            return self._update(v, t, pres, up, boot)

    def _update(self, v: U64, t: FloatArray, pres: BoolArray, up: FloatArray,
                boot: U64) -> CounterStep:
        n = self.n
        have = self._have
        fresh = pres & (~have | (t > self._prev_t))
        first = fresh & ~have
        cont = fresh & have
        dt = np.where(cont, t - self._prev_t, np.nan)
        too_wide = v > self.max_value
        # device reset evidence: boot id changed, uptime fell, or uptime shorter than the time
        # since the previous read
        rebooted = ((boot != 0) & (self._prev_boot != 0) & (boot != self._prev_boot)) | (
            (up < self._prev_up - 1e-6) | (up < dt - self.uptime_tolerance_s))
        dec = v < self._prev
        raw = (v - self._prev) & self.max_value  # modulo 2^bits (uint64 arithmetic wraps)
        raw_f = raw.astype(np.float64)
        if self._finite_rates:
            dt0 = np.where(cont, dt, 0.0)
            plausible = (raw_f <= self.max_rate_per_s * dt0 + self.max_delta_slack) | (
                self._inf_rate)
        else:
            plausible = self._true
        reset = cont & (rebooted | (dec & (self.saturating | ~plausible)))
        implausible = cont & ~reset & (too_wide | (~dec & ~plausible))
        saturated = cont & ~reset & ~implausible & self.saturating & (v == self.max_value)
        bad = reset | implausible | saturated
        wrap = cont & dec & ~bad
        ok = cont & ~dec & ~bad
        exact = ok | wrap
        status = np.where(exact, np.where(dec, np.int8(CounterStatus.WRAP),
                                          np.int8(CounterStatus.OK)),
                          np.int8(CounterStatus.MISSING)).astype(np.int8)
        if bad.any() or first.any():
            status[reset] = CounterStatus.RESET
            status[saturated] = CounterStatus.SATURATED
            status[implausible] = CounterStatus.IMPLAUSIBLE
            status[first] = CounterStatus.FIRST
            lower = np.where(saturated, np.where(self._prev < self.max_value,
                                                 (self.max_value - self._prev).astype(
                                                     np.float64), 0.0),
                             np.where(reset, v.astype(np.float64), np.nan))
        else:
            lower = np.full(n, np.nan)
        delta = np.where(exact, raw_f, np.nan)
        rate = np.where(exact & (dt > 0.0), delta / dt, np.nan)
        upd = fresh & ~too_wide
        if upd.all():
            self._prev = v.copy()
            self._prev_t = t.copy()
            self._prev_up = up.copy()
            self._prev_boot = boot.copy()
            self._have[:] = True
        else:
            self._prev = np.where(upd, v, self._prev)
            self._prev_t = np.where(fresh, t, self._prev_t)
            self._prev_up = np.where(fresh, up, self._prev_up)
            self._prev_boot = np.where(fresh, boot, self._prev_boot)
            self._have = have | upd
        return CounterStep(delta, dt, rate, status, lower)
