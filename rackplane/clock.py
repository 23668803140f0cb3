"""Clocks, injected everywhere time matters (DESIGN §1; FIELD-CASES BR-16).

Control timing uses ``monotonic()`` only. ``wall_ns()`` is for timestamps written to the time
series and MQTT payloads, never for elapsed time. Pure cores receive ``now`` as an argument;
adapters and the service runner receive a `Clock`.
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["SYSTEM_CLOCK", "Clock", "FakeClock", "SystemClock"]


class Clock(Protocol):
    """A source of monotonic seconds (control) and wall-clock ns (timestamps)."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin; never goes backwards."""
        ...

    def wall_ns(self) -> int:
        """Nanoseconds since the Unix epoch (may step: NTP, manual set)."""
        ...


class SystemClock:
    """The real clocks: ``time.monotonic`` and ``time.time_ns``."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall_ns(self) -> int:
        return time.time_ns()  # wall-clock: timestamps only, never elapsed time


class FakeClock:
    """A settable clock for tests and lock-step runs.

    ``advance(dt)`` moves both clocks; ``step_wall(ds)`` steps only the wall clock, as NTP or
    an operator would (BR-16).
    """

    def __init__(self, start_mono: float = 1000.0, start_wall_ns: int = 1_767_225_600 * 10**9):
        self._mono = start_mono
        self._wall_ns = start_wall_ns

    def monotonic(self) -> float:
        return self._mono

    def wall_ns(self) -> int:
        return self._wall_ns

    def advance(self, dt_s: float) -> None:
        """Advance both clocks by ``dt_s`` seconds (must be >= 0)."""
        if dt_s < 0:
            raise ValueError("monotonic time cannot go backwards")
        self._mono += dt_s
        self._wall_ns += round(dt_s * 1e9)

    def step_wall(self, ds: float) -> None:
        """Step only the wall clock by ``ds`` seconds (either sign)."""
        self._wall_ns += round(ds * 1e9)


SYSTEM_CLOCK = SystemClock()
