"""The CDU's Modbus face as valvey's poll sees it, without sockets (lock-step harness).

Each poll, plant readings are encoded into register words the way the simulator's face
serves them (`sims.runtime.encode_readings` + `rackplane.core.registers.encode_value`:
the map's type, scale, offset, word/byte order; a scenario's sentinel fault and a NaN reading
of an integer point with sentinels serve the point's first sentinel; a value the type cannot
represent keeps the point's last registers), then decoded by the decoder the daemon's
adapter uses (`rackplane.core.registers.BlockDecoder.decode_words` over read blocks planned
by `rackplane.core.registers.plan_reads` with the device's request size and gap settings).
A blackholed face delivers what `rackplane.io.modbus.ModbusDevice` delivers for a half-open
device: nothing while the request waits for its timeout (``cdu.timeout_s``: the last samples
age), then every point STALE ``timeout`` (`rackplane.core.polling.all_stale`) on every poll
until the face answers again and the daemon has reconnected (modelled as the first poll
``cdu.timeout_s + cdu.reconnect_min_s`` after the blackhole ends: the request in flight
times out, then the minimum reconnect delay).

The values are encoded by the register codec's compiled encoders
(`rackplane.core.registers.compile_point_encoder`, the same the simulator's faces use; a point
whose value did not change keeps its registers); `tests/unit/test_lockstep_cdu_face.py` checks
the polled samples against `decode_point` of the face's registers over a sequence of
repeated, changing, sentinel and held values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rackplane.core.polling import all_stale
from rackplane.core.registers import (
    BlockDecoder,
    PointSpec,
    RegisterMap,
    compile_point_encoder,
    plan_reads,
)
from rackplane.core.samples import Sample
from rackplane.settings import ModbusTargetSettings

__all__ = ["SLOW_SUFFIXES", "CduFace"]

SLOW_SUFFIXES = ("_run_hours_h", "reservoir_level_pct", "filter_diff_pressure_kpa",
                 "rack_isolation_open", "rack_isolation_closed", "rack_isolation_command",
                 "leak_rope_detected", "leak_rope_sensor_fault", "heartbeat",
                 "supply_temp_setpoint_c", "uptime_s")
"""Points read once a second instead of at 10 Hz (status and slow process values; a harness
economy, the daemon polls them all at 10 Hz: they age up to 1 s, well inside every
consumer's stale limit)."""

MAX_GAP_FAST = 125
"""Gap allowed between the 10 Hz points' reads (they share requests across the slow points'
registers; the decoder decodes only the points of a block)."""



class CduFace:
    """Plant readings in, the daemon's Modbus samples out (module docstring).

    Args:
        regmap: the CDU's register map (the one the daemon reads).
        settings: the daemon's ``cdu`` settings (request size, gaps, timeout, reconnect).
    """

    def __init__(self, regmap: RegisterMap, settings: ModbusTargetSettings):
        self.regmap = regmap
        self.settings = settings
        size: dict[str, int] = {}
        for p in regmap.points:
            size[p.table] = max(size.get(p.table, 0), p.end + 1)
        self._image: dict[str, list[int]] = {t: [0] * n for t, n in size.items()}
        fast = [p for p in regmap.points if not p.name.endswith(SLOW_SUFFIXES)]
        # the 10 Hz points in as few requests as the size limit allows (the gaps are the
        # slow points' registers, not decoded); every point as the daemon plans its reads
        self._fast = self._compile(fast, MAX_GAP_FAST)
        self._all = self._compile(list(regmap.points), settings.max_gap_registers)
        self._last: dict[str, float] = {}
        self._sent_last: frozenset[str] = frozenset()
        self._blackhole_since: float | None = None
        self._answer_at = -math.inf

    def _compile(self, points: list[PointSpec], max_gap: int
                 ) -> tuple[list[tuple[Any, ...]], list[Any]]:
        s = self.settings
        image = self._image
        encs = [(p.name, compile_point_encoder(p), image[p.table], p.address, p.address + p.words)
                for p in points]
        blocks = [(BlockDecoder(b), image[b.table], b.start, b.start + b.count)
                  for b in plan_reads(points, s.max_registers_per_read, max_gap)]
        return encs, blocks

    def poll(self, readings: Mapping[str, float], sentinel_points: frozenset[str] | set[str],
             blackhole: bool, ts_ns: int, now_mono: float, slow: bool) -> list[Sample] | None:
        """One poll at ``now_mono``: the samples the daemon's adapter delivers, or None
        when it delivers nothing (a request waiting for its timeout). ``slow``: read every
        point (else the 10 Hz ones only)."""
        if blackhole or self._answer_at > now_mono - 1e-9:
            stale = self._outage(blackhole, now_mono)
            if stale is not True:
                return None if stale is False else all_stale(
                    self.regmap.points, "timeout", ts_ns, now_mono)
        encs, blocks = self._all if slow else self._fast
        last = self._last
        last_get = last.get
        if not sentinel_points and not self._sent_last:  # the common case
            for name, enc, regs, addr, end in encs:
                v = readings[name]
                if last_get(name) == v:
                    continue  # the same value: the same registers
                last[name] = v
                words = enc(v, False)
                if words is not None:
                    regs[addr:end] = words
        else:
            was = self._sent_last
            for name, enc, regs, addr, end in encs:
                v = readings[name]
                sent = name in sentinel_points
                if last_get(name) == v and not sent and name not in was:
                    continue
                last[name] = v
                words = enc(v, sent)
                if words is not None:
                    regs[addr:end] = words
            self._sent_last = frozenset(sentinel_points)
        out: list[Sample] = []
        for dec, regs, start, end in blocks:
            # decode_words reads the block's registers from index 0 (a block at address 0
            # reads the image itself)
            out += dec.decode_words(regs if start == 0 else regs[start:end], ts_ns,
                                    now_mono).samples
        return out

    def _outage(self, blackhole: bool, now_mono: float) -> bool | None:
        """While the face is blackholed or the daemon is reconnecting: False (nothing
        delivered), None (every point STALE) or True (read normally)."""
        if blackhole:
            if self._blackhole_since is None:
                self._blackhole_since = now_mono
            if now_mono - self._blackhole_since < self.settings.timeout_s - 1e-9:
                return False  # the request in flight waits for its timeout
            self._answer_at = math.inf
            return None
        if self._blackhole_since is not None:
            self._blackhole_since = None
            if self._answer_at == math.inf:  # it timed out: the daemon reconnects
                s = self.settings
                self._answer_at = now_mono + s.timeout_s + s.reconnect_min_s
            else:  # the answer came before the timeout: nothing was lost
                self._answer_at = -math.inf
        return True if now_mono >= self._answer_at - 1e-9 else None
