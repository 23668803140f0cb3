"""valvey as one instance of a redundant pair (issue 15): the controller-epoch claim at the CDU.

The frame (`rackplane.daemon.DaemonFrame`) runs the leadership lease and gates every Modbus
write on it; this module makes the CDU itself refuse a fenced-out instance's writes. The CDU
holds, per TCP connection, the epoch that connection claimed (`sims.epoch_gate`: a write on a
connection with an older claim, or none once an epoch is held, is refused with exception 1
and counted). So the active instance writes its lease's epoch to ``points.controller_epoch``
**before any other write** of a tenure, and again on every new connection (the device's
`ModbusDevice.connection_serial` changed); until that claim is confirmed the tick's writes
are held (latest value per point) and then sent in one go.

A claim that fails (the CDU refuses it: an epoch newer than ours holds it; a timeout; no
connection) is logged once per reason and tried again on the next tick. A write already
queued on a connection that drops before it is sent goes out on the new, unclaimed one and is
refused (counted at the CDU as a stale attempt, logged here as a failed write); the claim on
the new connection follows at the next tick.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, Protocol

from rackplane.errors import ModbusError, WriteRejected
from rackplane.io.modbus import ModbusDevice

__all__ = ["EPOCH_FLOAT_MAX", "EpochClaimer"]

EPOCH_FLOAT_MAX = 2**53
"""Largest epoch written exactly: engineering values are floats (the bundled map's
``write_max``). A JetStream stream sequence above it needs 2**53 writes to the bucket."""


class Submit(Protocol):
    def submit(self, point: str, value: float) -> None: ...


class EpochClaimer:
    """Routes the active instance's writes behind its epoch claim (module docstring).

    Args:
        device: the CDU's Modbus owner.
        point: the register-map point of the controller epoch (``points.controller_epoch``).
        outputs: where confirmed writes go (`valvey.app.OutputWriter`).
        timeout_s: bound on the claim write (``control.write_timeout_s``).
        log: the daemon's logger.
    """

    def __init__(self, device: ModbusDevice, point: str, outputs: Submit, timeout_s: float,
                 log: Any) -> None:
        self.device = device
        self.point = point
        self.outputs = outputs
        self.timeout_s = timeout_s
        self.log = log
        #: (epoch, connection serial) of the last confirmed claim; None: none.
        self.claimed: tuple[int, int] | None = None
        self.held: dict[str, float] = {}
        self.claims_ok = 0
        self.claims_failed = 0
        self._task: asyncio.Task[None] | None = None
        self._failing: str | None = None

    def route(self, epoch: int, writes: Iterable[tuple[str, float]]) -> None:
        """The tick's writes of tenure ``epoch`` (> 0): sent now when this tenure's claim on
        the current connection is confirmed, else held (latest per point) and a claim
        started (one at a time)."""
        writes = list(writes)
        if self.claimed == (epoch, self.device.connection_serial) and not self.held:
            for point, value in writes:
                self.outputs.submit(point, value)
            return
        self.held.update(writes)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._claim(epoch, self.device.connection_serial), name="claim_epoch")

    def standby(self) -> None:
        """Not active any more: drop held writes and the claim (a new tenure claims again)."""
        self.held.clear()
        self.claimed = None

    async def _claim(self, epoch: int, serial: int) -> None:
        try:
            if not 1 <= epoch <= EPOCH_FLOAT_MAX:
                raise WriteRejected(f"epoch {epoch} is not in 1..2**53 (not exact as a float)")
            await asyncio.wait_for(self.device.write(self.point, float(epoch)), self.timeout_s)
        except (ModbusError, WriteRejected, TimeoutError) as err:
            self.claims_failed += 1
            reason = getattr(err, "reason", type(err).__name__)
            if self._failing != reason:
                self._failing = reason
                self.log.warning("cdu_epoch_claim_failed", epoch=epoch, error=str(err),
                                 note="writes held; claimed again next tick")
            return
        finally:
            self._task = None
        self._failing = None
        if serial != self.device.connection_serial:
            return  # reconnected meanwhile: claim again on the new connection
        self.claims_ok += 1
        self.claimed = (epoch, serial)
        self.log.info("cdu_epoch_claimed", epoch=epoch, point=self.point,
                      connection=serial, held_writes=len(self.held))
        held, self.held = self.held, {}
        for point, value in held.items():
            self.outputs.submit(point, value)
