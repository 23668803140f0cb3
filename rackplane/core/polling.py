"""What a poller delivers for points no reply covered: pure, shared by the Modbus adapter and
the lock-step harness's model of it.

FIELD-CASES BR-07: a timeout or connection loss makes every point STALE from that poll on
(values read and validated earlier in the same poll stay GOOD: they are fresh); while the
device is disconnected every poll delivers every point STALE with the reason of the outage.
A STALE sample carries no value: the last good value is never re-emitted as fresh.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping

from rackplane.core.registers import PointSpec
from rackplane.core.samples import Quality, Sample, invalid

__all__ = ["all_stale", "mark_stale"]


def mark_stale(out: MutableMapping[str, Sample], points: Iterable[PointSpec], reason: str,
               ts_ns: int, t_mono: float) -> None:
    """Set ``out[name]`` of every point in ``points`` to a STALE sample without a value.

    Args:
        reason: why (``timeout``, ``connection_lost``, ``server_busy``, ...).
        ts_ns: wall-clock timestamp [ns] (time series only); t_mono: monotonic time [s].
    """
    for p in points:
        out[p.name] = invalid(p.name, p.unit, ts_ns, t_mono, Quality.STALE, reason)


def all_stale(points: Iterable[PointSpec], reason: str, ts_ns: int,
              t_mono: float) -> list[Sample]:
    """One STALE sample without a value per point, in the order of ``points`` (a poll of a
    disconnected device, or one whose first request failed)."""
    return [invalid(p.name, p.unit, ts_ns, t_mono, Quality.STALE, reason) for p in points]
