"""The per-unit bulkhead of a `rackplane.io.modbus.ModbusDevice` (issue 14 items 5 and 6):
its share of a connection (`rackplane.io.modbus.link`), the unit's availability (unavailable
after timeouts on a shared connection or a gateway's 10/11, re-probed every
``dormant_reprobe_s``) and the points the device refused (not read before
``refused_reprobe_s``). A mixin: `ModbusDevice` sets these attributes up."""

from __future__ import annotations

from typing import Any

from rackplane.clock import Clock
from rackplane.core.registers import ReadBlock, ReadMemory, RegisterMap
from rackplane.core.samples import Quality, Sample, invalid
from rackplane.errors import ModbusError, ModbusTimeout
from rackplane.io.modbus.link import ModbusLink
from rackplane.io.modbus.support import ModbusStats, _RequestWatchdog
from rackplane.settings import ModbusTargetSettings

__all__: list[str] = []


class _Bulkhead:
    _settings: ModbusTargetSettings
    _clock: Clock
    _log: Any
    _link: ModbusLink
    _client: Any
    _watchdog: _RequestWatchdog
    _memory: ReadMemory
    _blocks: list[ReadBlock]
    _unit_failures: int
    _dormant_until: float | None
    _unavailable_reason: str
    _refused_until: dict[str, float]
    _refused_reason: dict[str, str]
    _refused_logged: set[str]
    regmap: RegisterMap
    stats: ModbusStats

    def _plan(self) -> list[ReadBlock]:
        raise NotImplementedError

    def _compile(self) -> None:
        raise NotImplementedError

    def _close_client(self) -> None:
        """Close the connection (a transport error): for every unit sharing it."""
        self._watchdog.close()  # no request in flight: the next one re-arms it
        client, self._client = self._client, None
        link = self._link
        link.users.discard(id(self))
        if client is not None:
            if link.client is client:
                link.client = None
                link.users.clear()
            try:
                client.close()
            except Exception:  # closing must never fail the owner
                self._log.debug("modbus_close_error", exc_info=True)

    def _release_client(self) -> None:
        """This device is done with the connection (stopped, a dry read finished): close it
        unless other units of the link still use it."""
        link = self._link
        client = self._client
        link.users.discard(id(self))
        if client is not None and link.client is client and link.users:
            self._watchdog.close()
            self._client = None
            return
        self._close_client()

    def _transport_failure(self, err: ModbusError) -> bool:
        """Whether request failure ``err`` condemns the connection (True: replace it).

        Alone on its connection, every transport error does (BR-07). On a shared link a
        timeout is this unit's failure (counted; after ``unavailable_after_failures`` in a
        row the unit is unavailable): the connection is replaced only when every available
        unit of the link has timed out since its last valid reply.
        """
        link = self._link
        if not isinstance(err, ModbusTimeout) or not link.shared:
            return True
        self._unit_failures += 1
        self.stats.unit_failures += 1
        if self._unit_failures >= self._settings.unavailable_after_failures:
            self._mark_unreachable("timeout")
        return link.connection_at_fault(self._settings.unit_id)

    def _refuse(self, name: str, reason: str) -> None:
        """The device refused point ``name`` read alone (exception 2/3): not read again
        before ``refused_reprobe_s`` (its samples stay BAD with ``reason``)."""
        self._refused_until[name] = self._clock.monotonic() + self._settings.refused_reprobe_s
        self._refused_reason[name] = reason
        self.stats.refused_points = len(self._refused_reason)
        self._memory = self._memory.refuse([name])
        self._blocks = self._plan()
        self._compile()
        if name not in self._refused_logged:
            self._refused_logged.add(name)  # once per point, not per re-probe
            self._log.warning("modbus_point_refused", point=name, reason=reason,
                              reprobe_every_s=self._settings.refused_reprobe_s)

    def _reprobe_refused(self) -> None:
        """Plan the refused points whose re-probe time came again (read alone)."""
        now = self._clock.monotonic()
        due = [n for n, t in self._refused_until.items() if now >= t]
        if not due:
            return
        for n in due:
            del self._refused_until[n]
            del self._refused_reason[n]
        self.stats.refused_points = len(self._refused_reason)
        self._memory = self._memory.reprobe(due)
        self._blocks = self._plan()
        self._compile()
        self._log.debug("modbus_refused_reprobe", points=due)

    def _fill_refused(self, out: dict[str, Sample]) -> None:
        ts_ns = self._clock.wall_ns()
        t_mono = self._clock.monotonic()
        for name, reason in self._refused_reason.items():
            if name not in out:
                p = self.regmap.point(name)
                out[name] = invalid(name, p.unit, ts_ns, t_mono, Quality.BAD, reason)
                self.stats.refused_skips += 1

    def _mark_reachable(self) -> None:
        self._unit_failures = 0
        self._dormant_until = None
        if not self.stats.available:
            self.stats.available = True
            self._log.info("modbus_unit_available")

    def _mark_unreachable(self, reason: str) -> None:
        """The unit is unavailable (gateway 10/11, or timeouts on a shared link): not read
        again before ``dormant_reprobe_s`` (each failed re-probe re-arms it)."""
        self._dormant_until = self._clock.monotonic() + self._settings.dormant_reprobe_s
        self._unavailable_reason = reason
        if self.stats.available:
            self.stats.available = False
            self._log.warning("modbus_unit_unavailable", reason=reason,
                              reprobe_every_s=self._settings.dormant_reprobe_s)
