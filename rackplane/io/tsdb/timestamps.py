"""`TimestampGuard`: no line leaves for the spool or the database with a timestamp outside the
sanity window (issue 14 item 8).

A timestamp outside 2020-01-01 .. 2100-01-01 (`TS_MIN_NS`, `TS_MAX_NS`) is a unit mistake (a
sample stamped in seconds or milliseconds where nanoseconds are expected: 1.7e9 lands on
1970-01-01) or a wall clock not yet synchronised at boot. Such a line is never written as it
is. ``tsdb.ts_out_of_window`` says what happens instead:

- ``"restamp"`` (default): the line gets its arrival time (the writer's wall clock when it
  was written, or when the writer or ``rackctl replay`` read it back from an older spool).
  When the wall clock itself is outside the window (unsynchronised boot), the line is
  *held* in memory with its monotonic arrival time, and restamped as ``wall - (monotonic
  now - monotonic arrival)`` once the clock is in the window: its real time, not 1970.
  Held lines are bounded by ``spool.memory_max_lines`` (the oldest dropped and counted
  beyond it) and dropped, counted, at close if the clock never came into the window.
- ``"drop"``: the line is dropped.

Every out-of-window line is counted (`TimestampGuard.out_of_window`; restamped, dropped and
held apart) and the state is logged once per change (``telemetry_timestamp_outside_window``
with the action, ``telemetry_timestamp_back_in_window``). Counters are Python ints since the
process started (no width, no wrap; a restart resets them to 0, which a rate over them shows
as a reset, never as a negative rate).

Pure: no I/O; the caller gives the wall and monotonic times.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from rackplane.io.tsdb.influx import TS_MAX_NS, TS_MIN_NS

__all__ = ["TimestampGuard", "TsAction", "in_window", "line_timestamp", "with_timestamp"]

TsAction = Literal["ok", "restamp", "hold", "drop"]

# The timestamp is the last token of a line after an unescaped space, digits only. Without a
# timestamp the last token is the field set's last ``key=value`` (it holds an "="; a string
# value with a space in it ends in a quote), so it never matches.
_TS_RE = re.compile(r"(?<!\\) (-?\d+)$")
_WINDOW = "2020-01-01..2100-01-01"


def in_window(ts_ns: int) -> bool:
    """Whether ``ts_ns`` lies in 2020-01-01 .. 2100-01-01."""
    return TS_MIN_NS <= ts_ns < TS_MAX_NS


def line_timestamp(line: str) -> int | None:
    """The timestamp of a line-protocol line, ns; None when it has none (the database
    stamps it on arrival)."""
    m = _TS_RE.search(line)
    return int(m.group(1)) if m else None


def with_timestamp(line: str, ts_ns: int) -> str:
    """``line`` with its timestamp replaced by (or, without one, set to) ``ts_ns``."""
    m = _TS_RE.search(line)
    return (line[: m.start(1)] if m else line + " ") + str(ts_ns)


@dataclass(slots=True)
class TimestampGuard:
    """Applies the ``ts_out_of_window`` policy and keeps its counters (module docstring).

    Args:
        policy: ``restamp`` or ``drop``.
        log: a structlog logger.
        max_held: bound on lines held while the wall clock is outside the window.
    """

    policy: str
    log: Any
    max_held: int = 10_000
    out_of_window: int = 0
    """Lines seen with a timestamp outside the window (restamped, held or dropped)."""
    restamped: int = 0
    dropped: int = 0
    held: list[tuple[float, str]] = field(default_factory=list)
    _bad: bool = False

    def action(self, ts_ns: int, wall_ns: int, source: str) -> TsAction:
        """What to do with a line stamped ``ts_ns`` arriving at wall time ``wall_ns``;
        counts it (``hold``: counted as restamped or dropped when released)."""
        if in_window(ts_ns):
            self._state(False, ts_ns, source, "ok")
            return "ok"
        self.out_of_window += 1
        act: TsAction
        if self.policy == "drop":
            act = "drop"
        elif in_window(wall_ns):
            act = "restamp"
        else:
            act = "hold"
        self._state(True, ts_ns, source, act)
        if act == "drop":
            self.dropped += 1
        elif act == "restamp":
            self.restamped += 1
        return act

    def hold(self, line: str, mono_s: float) -> None:
        """Keep ``line`` until the wall clock is in the window (`release`)."""
        self.held.append((mono_s, line))
        over = len(self.held) - self.max_held
        if over > 0:
            del self.held[:over]
            self.dropped += over
            self.log.error("telemetry_timestamp_held_lines_dropped", dropped=over,
                           max_held=self.max_held,
                           reason="the wall clock is still outside " + _WINDOW)

    def release(self, wall_ns: int, mono_s: float) -> list[str]:
        """The held lines restamped with their real time, when ``wall_ns`` is in the window
        (else nothing: they stay held)."""
        if not self.held or not in_window(wall_ns):
            return []
        out = [with_timestamp(line, wall_ns - round((mono_s - t) * 1e9))
               for t, line in self.held]
        self.restamped += len(out)
        self.log.info("telemetry_timestamp_held_lines_restamped", lines=len(out))
        self.held = []
        return out

    def drop_held(self) -> int:
        """Drop (and count) the held lines: the writer closes and the clock never came into
        the window. Returns how many."""
        n = len(self.held)
        if n:
            self.dropped += n
            self.log.error("telemetry_timestamp_held_lines_dropped", dropped=n,
                           reason="closing while the wall clock is outside " + _WINDOW)
        self.held = []
        return n

    def fix_lines(self, lines: Iterable[str], wall_ns: int, source: str) -> list[str]:
        """Lines read back from a spool (the writer's drain, ``rackplane replay``): each
        out-of-window timestamp restamped with ``wall_ns`` or dropped (policy; with the wall
        clock itself outside the window, dropped: there is no time to give it)."""
        out: list[str] = []
        for line in lines:
            ts = line_timestamp(line)
            if ts is None:
                out.append(line)
                continue
            act = self.action(ts, wall_ns, source)
            if act == "ok":
                out.append(line)
            elif act == "restamp":
                out.append(with_timestamp(line, wall_ns))
            elif act == "hold":  # no clock to restamp with, and nowhere to hold a read line
                self.dropped += 1
        return out

    def _state(self, bad: bool, ts_ns: int, source: str, act: str) -> None:
        if bad == self._bad:
            return
        self._bad = bad
        if bad:
            self.log.warning(
                "telemetry_timestamp_outside_window", ts_ns=ts_ns, window=_WINDOW,
                source=source, action=act, policy=self.policy,
                hint="a unit mistake (seconds or ms where ns are expected) or a wall clock "
                "not synchronised yet; never written as is (tsdb.ts_out_of_window), counted "
                "in ts_out_of_window")
        else:
            self.log.info("telemetry_timestamp_back_in_window", ts_ns=ts_ns, source=source)
