"""Samples: every value an acquisition adapter produces, with its time and its quality.

A `Sample` is never a bare number. It carries the point name, the engineering value (or
``None`` when there is no usable value), the unit, the wall-clock timestamp in ns (for the
time series only), the monotonic time it was acquired (for control: age and staleness), and a
`Quality`. Control cores consume only ``GOOD`` samples that are younger than their stale limit.

The numeric quality codes are the contract with the time series (DESIGN §3: a bad value is
written as its quality code, never as NaN) and must not be renumbered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum


class Quality(Enum):
    """Quality of a sample; ``code`` is what the time series stores in ``<field>_quality``."""

    GOOD = "good"
    STALE = "stale"
    BAD = "bad"
    OUT_OF_RANGE = "out_of_range"

    @property
    def code(self) -> int:
        """Numeric code written to the time series: good 0, stale 1, bad 2, out_of_range 3."""
        return _QUALITY_CODES[self]


_QUALITY_CODES = {Quality.GOOD: 0, Quality.STALE: 1, Quality.BAD: 2, Quality.OUT_OF_RANGE: 3}


@dataclass(frozen=True, slots=True)
class Sample:
    """One acquired value.

    Attributes:
        point: point name from the register map or sensor map (e.g. ``supply_temp_c``).
        value: engineering value, or ``None`` when the reading is unusable (quality not GOOD
            may still carry the last raw value for diagnostics; consumers must check quality).
        unit: engineering unit (e.g. ``degC``, ``pct``, ``lpm``, ``kPa``, ``W``).
        ts_ns: wall-clock timestamp in ns since the epoch, for the time series only.
        t_mono: monotonic time in s at acquisition; age and staleness are computed from it.
        quality: see `Quality`.
        reason: why the quality is not GOOD (``timeout``, ``illegal_data_address``,
            ``sentinel``, ``nan``, ...); ``None`` when GOOD.
    """

    point: str
    value: float | None
    unit: str
    ts_ns: int
    t_mono: float
    quality: Quality = Quality.GOOD
    reason: str | None = None

    @property
    def usable(self) -> bool:
        """True when the value may feed control: GOOD and a finite number."""
        return (
            self.quality is Quality.GOOD
            and self.value is not None
            and math.isfinite(self.value)
        )

    def age_s(self, now_mono: float) -> float:
        """Age in s at monotonic time ``now_mono`` (never negative)."""
        return max(0.0, now_mono - self.t_mono)

    def fresh(self, now_mono: float, stale_after_s: float) -> bool:
        """True when usable and not older than ``stale_after_s`` seconds."""
        return self.usable and self.age_s(now_mono) <= stale_after_s

    def as_stale(self, reason: str = "stale") -> Sample:
        """The same sample marked STALE: the old value is never re-emitted as fresh."""
        return replace(self, quality=Quality.STALE, reason=reason)


def good(point: str, value: float, unit: str, ts_ns: int, t_mono: float) -> Sample:
    """A GOOD sample; a non-finite value becomes BAD with reason ``nan``."""
    if not math.isfinite(value):
        return Sample(point, None, unit, ts_ns, t_mono, Quality.BAD, "nan")
    return Sample(point, float(value), unit, ts_ns, t_mono)


def invalid(
    point: str, unit: str, ts_ns: int, t_mono: float, quality: Quality, reason: str
) -> Sample:
    """A sample without a usable value (quality must not be GOOD)."""
    if quality is Quality.GOOD:
        raise ValueError("an invalid sample cannot have GOOD quality")
    return Sample(point, None, unit, ts_ns, t_mono, quality, reason)
