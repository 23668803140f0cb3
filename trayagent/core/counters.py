"""Hardware counters turned into rates that say when they cannot vouch for them.

Every counter has a width (bits) and a behaviour at its top: IBA PortCounters (the kernel's
``/sys/class/infiniband/*/ports/*/counters``) **saturate** (stay at 2**bits − 1, the legacy
32-bit data and packet counters included, when the HCA has no extended counters); Linux
``/sys/class/net/*/statistics`` and the driver's ``hw_counters`` are 64-bit and **wrap**
(never in practice); ``carrier_changes`` is a 32-bit atomic that wraps.

`counter_rate` returns a rate only when the two readings vouch for it; otherwise ``None`` with
the reason:

- ``missing``: either reading is absent (a file that reads ``N/A``, an I/O error);
- ``saturated``: a saturating counter at its top (the true count is unknown from then on until
  it is cleared);
- ``reset``: the counter went down and the wrapped difference is implausible (larger than
  ``max_rate_per_s`` × elapsed), or it saturates and cannot wrap: a driver reload or a
  counter clear; the next interval has a rate again;
- ``no_time``: no time elapsed between the readings (or time went backwards).

A wrap of a wrapping counter is counted as a wrap when the wrapped difference is plausible.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = ["CounterSpec", "Rate", "counter_rate"]


@dataclass(frozen=True, slots=True)
class CounterSpec:
    """A counter's width and behaviour at its top.

    Args:
        bits: 4, 8, 16, 32 or 64.
        saturates: True: it stops at 2**bits − 1 (IBA); False: it wraps to 0.
        scale: units per count (``port_xmit_data`` counts 4-octet words: scale 4 for bytes).
    """

    bits: int
    saturates: bool
    scale: float = 1.0
    top: int = field(init=False, repr=False, compare=False)
    """The largest value, 2**bits − 1 (derived once: `counter_rate` reads it for every
    counter of every port each cycle)."""

    def __post_init__(self) -> None:
        if self.bits not in (4, 8, 16, 32, 64):
            raise ValueError(f"counter width {self.bits} bits is not 4, 8, 16, 32 or 64")
        if not self.scale > 0:
            raise ValueError(f"counter scale {self.scale} must be > 0")
        object.__setattr__(self, "top", (1 << self.bits) - 1)


class Rate(NamedTuple):
    """``per_s``: the rate in the counter's units × scale per second; None with ``reason``
    when the readings cannot vouch for it (module docstring)."""

    per_s: float | None
    reason: str | None = None


_MISSING = Rate(None, "missing")
_NO_TIME = Rate(None, "no_time")
_SATURATED = Rate(None, "saturated")
_RESET = Rate(None, "reset")
_ZERO = Rate(0.0)


def counter_rate(spec: CounterSpec, prev: int | None, cur: int | None, elapsed_s: float,
                 max_rate_per_s: float) -> Rate:
    """The rate between two readings ``elapsed_s`` apart (module docstring).

    Args:
        spec: the counter's width and behaviour.
        prev, cur: raw readings (None: absent); a value outside [0, 2**bits) is treated
            as absent (the reader should not produce one).
        elapsed_s: monotonic time between them, s.
        max_rate_per_s: the largest plausible rate, in raw counts per second (a wrap
            implying more is a reset).
    """
    top = spec.top
    if prev is None or cur is None or not (0 <= prev <= top and 0 <= cur <= top):
        return _MISSING
    if not elapsed_s > 0:
        return _NO_TIME
    if spec.saturates and cur == top:
        return _SATURATED
    if cur == prev:
        return _ZERO  # most error counters, most of the time
    if cur > prev:
        return Rate((cur - prev) * spec.scale / elapsed_s)
    if spec.saturates:
        return _RESET
    wrapped = cur + top + 1 - prev
    if wrapped > max_rate_per_s * elapsed_s:
        return _RESET
    return Rate(wrapped * spec.scale / elapsed_s)
