"""Unstable-link rules, vectorised: window count, flap score, "any rise within a window".

**Window count** (`WindowCountRule`): an element is flapping from the moment it has seen
``count`` events within ``window_s`` until it has seen none for ``quiet_s``: one True span per
incident, however many events it contains (no page per transition, FIELD-CASES BR-13; an OK
between failures does not reset it, unlike "N consecutive failures"). Events are counted
from whatever evidence a poll gives: state changes between polls and counter deltas such as
Linux ``carrier_changes`` (a link that bounced between two polls both reading "up", BR-13 b).
Parameters in use: BR-13: 4 transitions in 60 s, quiet 300 s; NVSentinel
``RepeatedNICLinkFlap``: 3 link-downs in 10 min (REFERENCE §3.1, §5 S7); Azure healthagent:
3 link-downs in 3 h (REFERENCE §8).

**Flap score** (`FlapScore`): route-flap-damping style (RFC 2439's penalty with exponential
decay): each event adds ``penalty``; the score decays with ``half_life_s``; flapping when it
reaches ``raise_at``; cleared once it is below ``clear_below`` *and* no event came for
``hold_down_s``.

**Any rise within a window** (`EventWindow`): DCGM's rule for counters whose healthy rate is
zero (NVLink replay and recovery: "any increase in 60 s → FAIL", REFERENCE §8): True while the
last increase is at most ``window_s`` old.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rackplane.core.detect._util import (
    BoolArray,
    FloatArray,
    IntArray,
    check_count,
    check_time,
    values,
)

__all__ = ["EventWindow", "FlapScore", "WindowCountRule"]

_EPS = 1e-9


def _events(name: str, ev: Any, n: int) -> FloatArray:
    a = values(name, ev, n)
    a = np.where(np.isnan(a), 0.0, a)
    if (a < 0).any():
        raise ValueError(f"{name} must be >= 0 (events are counts)")
    return np.floor(a)


class WindowCountRule:
    """``count`` events within ``window_s`` raise; ``quiet_s`` without events clears.

    Args:
        n: elements.
        count: events needed (N >= 1).
        window_s: window, s (> 0).
        quiet_s: quiet time to clear, s (>= 0).

    Events passed to `update` are taken to happen at the update's time (a poll sees them
    when it sees them), so an alarm is raised by the poll that reveals the N-th event.
    """

    def __init__(self, n: int, count: int, window_s: float, quiet_s: float) -> None:
        self.n = check_count("n", n)
        self.count = check_count("count", count)
        if self.count < 1:
            raise ValueError("count must be >= 1")
        if not (np.isfinite(window_s) and window_s > 0):
            raise ValueError("window_s must be > 0")
        if not (np.isfinite(quiet_s) and quiet_s >= 0):
            raise ValueError("quiet_s must be >= 0")
        self.window_s = float(window_s)
        self.quiet_s = float(quiet_s)
        # the `count` most recent event times per element, newest first (NaN: none)
        self._times = np.full((self.n, self.count), np.nan)
        self._active = np.zeros(self.n, dtype=bool)
        self._since = np.full(self.n, np.nan)
        self._total = np.zeros(self.n, dtype=np.int64)
        self._last_t: float | None = None

    @property
    def state(self) -> BoolArray:
        """Flapping now (a copy)."""
        return self._active.copy()

    @property
    def since(self) -> FloatArray:
        """When each active element was raised (NaN otherwise), monotonic s."""
        return np.where(self._active, self._since, np.nan)

    @property
    def last_event(self) -> FloatArray:
        """Time of each element's latest event (NaN: none yet), monotonic s."""
        return self._times[:, 0].copy()

    @property
    def total_events(self) -> IntArray:
        """Events counted per element since construction."""
        return self._total.copy()

    def in_window(self, now_mono: float) -> IntArray:
        """Events within the last ``window_s`` per element (at most ``count``)."""
        with np.errstate(invalid="ignore"):
            out: IntArray = (self._times >= now_mono - self.window_s - _EPS).sum(axis=1)
        return out

    def update(self, now_mono: float, events: Any) -> BoolArray:
        """Add ``events`` (per element, counts >= 0; NaN = none) at ``now_mono``; returns the
        state (a copy).

        Raises:
            ValueError: time going backwards, wrong shape, negative counts.
        """
        now = check_time("now_mono", now_mono, self._last_t)
        self._last_t = now
        k = _events("events", events, self.n)
        hit = np.flatnonzero(k > 0)
        if hit.size:
            kk = np.minimum(k[hit], self.count).astype(np.int64)
            old = self._times[hit]
            new = np.empty_like(old)
            rows = np.arange(hit.size)
            for j in range(self.count):
                src = np.clip(j - kk, 0, self.count - 1)
                new[:, j] = np.where(j < kk, now, old[rows, src])
            self._times[hit] = new
            self._total[hit] += k[hit].astype(np.int64)
            with np.errstate(invalid="ignore"):
                full = new[:, self.count - 1] >= now - self.window_s - _EPS
            rise = full & ~self._active[hit]
            if rise.any():
                self._active[hit[rise]] = True
                self._since[hit[rise]] = now
        if self._active.any():
            with np.errstate(invalid="ignore"):
                # quiet means no event for quiet_s: an element with an event at this poll
                # never clears at it (quiet_s = 0 clears at the first poll without events)
                quiet = (self._active & (k <= 0)
                         & (now - self._times[:, 0] >= self.quiet_s - _EPS))
            if quiet.any():
                self._active[quiet] = False
                self._since[quiet] = np.nan
        return self._active.copy()


class FlapScore:
    """Penalty score with exponential decay and a hold-down (see the module docstring).

    Args:
        n: elements.
        penalty: score added per event.
        half_life_s: the score halves every ``half_life_s`` without events.
        raise_at: flapping when the score reaches this.
        clear_below: cleared when the score is below this and ...
        hold_down_s: ... the last event is at least this old.
    """

    def __init__(
        self,
        n: int,
        penalty: float = 1.0,
        half_life_s: float = 300.0,
        raise_at: float = 4.0,
        clear_below: float = 1.0,
        hold_down_s: float = 300.0,
    ) -> None:
        self.n = check_count("n", n)
        for name, v in (("penalty", penalty), ("half_life_s", half_life_s),
                        ("raise_at", raise_at)):
            if not (np.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be > 0")
        if not (np.isfinite(clear_below) and 0 <= clear_below < raise_at):
            raise ValueError("clear_below must be >= 0 and below raise_at")
        if not (np.isfinite(hold_down_s) and hold_down_s >= 0):
            raise ValueError("hold_down_s must be >= 0")
        self.penalty = float(penalty)
        self.half_life_s = float(half_life_s)
        self.raise_at = float(raise_at)
        self.clear_below = float(clear_below)
        self.hold_down_s = float(hold_down_s)
        self._score = np.zeros(self.n)
        self._active = np.zeros(self.n, dtype=bool)
        self._last_event = np.full(self.n, np.nan)
        self._last_t: float | None = None

    @property
    def state(self) -> BoolArray:
        """Flapping now (a copy)."""
        return self._active.copy()

    @property
    def score(self) -> FloatArray:
        """The score at the last update (a copy)."""
        return self._score.copy()

    def update(self, now_mono: float, events: Any) -> BoolArray:
        """Decay to ``now_mono``, add ``events`` × penalty; returns the state (a copy)."""
        now = check_time("now_mono", now_mono, self._last_t)
        dt = 0.0 if self._last_t is None else now - self._last_t
        self._last_t = now
        k = _events("events", events, self.n)
        if dt > 0.0:
            self._score *= 0.5 ** (dt / self.half_life_s)
        hit = k > 0
        if hit.any():
            self._score += k * self.penalty
            self._last_event[hit] = now
        # relative tolerance: N events of ``penalty`` reach ``N·penalty`` despite a decay
        # rounding (a very long half-life over a short dt)
        self._active |= self._score >= self.raise_at * (1.0 - 1e-6)
        if self._active.any():
            with np.errstate(invalid="ignore"):
                clear = self._active & (self._score < self.clear_below) & (
                    now - self._last_event >= self.hold_down_s - _EPS
                )
            self._active &= ~clear
        return self._active.copy()


class EventWindow:
    """True while an element's latest event is at most ``window_s`` old (DCGM "any increase
    in 60 s"). Feed the increases (counts) at each poll."""

    def __init__(self, n: int, window_s: float) -> None:
        self.n = check_count("n", n)
        if not (np.isfinite(window_s) and window_s > 0):
            raise ValueError("window_s must be > 0")
        self.window_s = float(window_s)
        self._last = np.full(self.n, np.nan)
        self._last_t: float | None = None

    @property
    def last_event(self) -> FloatArray:
        """Time of the latest event per element (NaN: none), monotonic s."""
        return self._last.copy()

    def update(self, now_mono: float, events: Any) -> BoolArray:
        """Record ``events`` (counts > 0 mark an event at ``now_mono``); returns the state."""
        now = check_time("now_mono", now_mono, self._last_t)
        self._last_t = now
        k = _events("events", events, self.n)
        self._last = np.where(k > 0, now, self._last)
        with np.errstate(invalid="ignore"):
            return now - self._last <= self.window_s + _EPS
