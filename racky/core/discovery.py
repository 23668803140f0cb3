"""Power-shelf discovery schedule (pure): which unit id to probe when.

Meta rackmon's practice (REFERENCE §8): scan the whole configured address range at start, then
slowly (one unknown address every ``slow_scan_interval_s``, ~2 min), and re-probe devices that
stopped answering ("dormant") every ``reprobe_dormant_s`` (2-3 min) instead of polling them
every cycle (on a shared RS-485 bus or gateway every timed-out request stalls the others).

`DiscoveryPlan.due` lists the probes to make now; the adapter (racky/app.py) makes them one at
a time (one request in flight per gateway) and reports each with `probe_result`; a found
shelf gets an owner task (`racky.app`), which `went_dormant` stops when the shelf has been
silent for ``dormant_after_s``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from racky.config import DiscoverySettings

__all__ = ["DiscoveryPlan"]

UnitState = Literal["unknown", "found", "dormant"]


@dataclass
class DiscoveryPlan:
    """The schedule (see the module docstring).

    Args:
        cfg: discovery settings; exclude: unit ids configured statically on the same target.
    """

    cfg: DiscoverySettings
    exclude: Iterable[int] = ()
    state: dict[int, UnitState] = field(default_factory=dict)
    _next_reprobe: dict[int, float] = field(default_factory=dict)
    _scanned: bool = False
    _next_slow: float = 0.0
    _cursor: int = 0
    _inflight: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        ex = set(self.exclude)
        for u in range(self.cfg.unit_id_first, self.cfg.unit_id_last + 1):
            if u not in ex:
                self.state[u] = "unknown"

    @property
    def units(self) -> list[int]:
        """Every unit id in the scan range (configured statically ones excluded)."""
        return sorted(self.state)

    def found(self) -> list[int]:
        """Unit ids answering now (each has an owner task polling it)."""
        return sorted(u for u, s in self.state.items() if s == "found")

    def due(self, now: float) -> list[int]:
        """Unit ids to probe now (each returned once until its result comes back)."""
        out: list[int] = []
        if not self._scanned:
            self._scanned = True
            self._next_slow = now + self.cfg.slow_scan_interval_s
            out = [u for u, s in sorted(self.state.items()) if s == "unknown"]
        elif now >= self._next_slow:
            self._next_slow = now + self.cfg.slow_scan_interval_s
            unknown = [u for u, s in sorted(self.state.items())
                       if s == "unknown" and u not in self._inflight]
            if unknown:
                self._cursor %= len(unknown)
                out.append(unknown[self._cursor])
                self._cursor += 1
        for u, t in sorted(self._next_reprobe.items()):
            if now >= t and self.state.get(u) == "dormant" and u not in self._inflight:
                out.append(u)
                self._next_reprobe[u] = now + self.cfg.reprobe_dormant_s
        out = [u for u in out if u not in self._inflight]
        self._inflight.update(out)
        return out

    def probe_result(self, unit: int, ok: bool, now: float) -> bool:
        """Record a probe; True when the unit is newly found (start its owner task)."""
        self._inflight.discard(unit)
        st = self.state.get(unit)
        if st is None:
            return False
        if ok and st != "found":
            self.state[unit] = "found"
            self._next_reprobe.pop(unit, None)
            return True
        if not ok and st == "dormant":
            self._next_reprobe[unit] = now + self.cfg.reprobe_dormant_s
        return False

    def went_dormant(self, unit: int, now: float) -> None:
        """A found unit stopped answering: poll it no more, re-probe it every few minutes."""
        if self.state.get(unit) == "found":
            self.state[unit] = "dormant"
            self._next_reprobe[unit] = now + self.cfg.reprobe_dormant_s
