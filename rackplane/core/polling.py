"""What a poller delivers for points no reply covered: pure, shared by the Modbus adapter and
the lock-step harness's model of it.

FIELD-CASES BR-07: a timeout or connection loss makes every point STALE from that poll on
(values read and validated earlier in the same poll stay GOOD: they are fresh); while the
device is disconnected every poll delivers every point STALE with the reason of the outage.
A STALE sample carries no value: the last good value is never re-emitted as fresh.

A STALE sample does not, however, end a good value before its time: `hold_good` keeps the
last good sample (with its own acquisition time) until ``hold_s`` after it, so a consumer with
``stale_after_s`` sees the value good until ``stale_after_s`` after its last good read, however
many polls failed in between (issue 14, item 4).
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping

from rackplane.core.registers import PointSpec
from rackplane.core.samples import Quality, Sample, invalid

__all__ = ["all_stale", "hold_good", "mark_stale"]


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


def hold_good(prev: Sample | None, new: Sample, hold_s: float) -> Sample:
    """What a failed poll leaves as the latest sample of its point (FIELD-CASES BR-07 with
    the documented ``stale_after_s`` semantics: a value is good until ``stale_after_s`` after
    its last good read).

    ``new`` is the STALE sample a failed poll delivered (no value). While the previous sample
    ``prev`` is usable and at most ``hold_s`` older than ``new``, ``prev`` stays: it keeps its
    own acquisition time, so every consumer still judges its age against its own stale limit
    (it is never re-stamped as fresh). Past ``hold_s``, or with no good previous value,
    ``new`` replaces it.

    Args:
        prev: the latest sample so far (None: none).
        new: the failed poll's sample.
        hold_s: the longest stale limit of the point's consumers, s.
    """
    if (prev is not None and prev.usable and new.quality is Quality.STALE
            and new.t_mono - prev.t_mono <= hold_s):
        return prev
    return new
