"""The simulated CDU's controller-epoch fence on its Modbus face (issue 15, item 2).

`sims.cdu.fence.ControllerFence` holds the newest controller epoch in the plant and counts
stale write attempts; this gate puts it behind the CDU's Modbus TCP face
(`sims.modbus_face.ModbusFace.admit_write`) with the register block of
config/registers/cdu-generic.toml:

- ``controller_epoch`` (holding 9..12, uint64): a controller **claims** its epoch by writing
  it here; reading it gives the newest epoch claimed (0: none yet);
- ``controller_stale_writes`` (input 39..42, uint64): the write attempts refused as stale.

**How a write carries its epoch: the connection's claim.** Modbus writes have no room for an
epoch, so the gate keeps, per TCP connection, the epoch that connection last claimed. A
controller claims on every new connection and after every new tenure, before any other
write. Then:

1. a claim of epoch E is admitted when E is not older than the held epoch (E becomes the held
   one and this connection's); an older claim is refused and counted;
2. any other write is admitted with the connection's claimed epoch (none: the connection never
   claimed) by the plant's fence: with no epoch ever held everything is admitted (single
   controllers never claim: nothing changes for them); once one is held, a write on a
   connection whose claim is older, or that claimed nothing, is refused and counted;
3. a write that claims and writes in one request (FC16 over the block and its neighbour) is
   taken as the claim first, then the rest.

A refusal is Modbus **exception 1** (the spec's "the server is in the wrong state to process
a request of this type"), not 4 (device failure): the controller's Modbus client keeps its
connection (it only drops on transport errors) and the write's caller sees
`rackplane.errors.ModbusExceptionResponse` code 1.

Why per connection, and not "the epoch of whoever wrote last" or an epoch written in the
same batch: the failure this fence exists for is an old active that was paused or partitioned
and resumes with writes already past its own lease check (queued in its Modbus owner task, or
in the socket): those writes go out on its **old connection**, whose claim is the old epoch,
so they are refused and counted however they are batched, and nothing the old active sends
without first re-claiming a newer epoch (which it cannot have: epochs come from the lease)
is ever accepted. A batch-carried epoch would need every write to be an FC16 spanning the
block, which the bundled map's points (and real CDUs' maps) do not allow; "the last claimer
holds the CDU" is what this scheme is, with the connection as the claimer's identity. A
restarted controller opens a new connection and must claim again; a connection that drops
between a claim and a write has its write refused (counted: the count measures attempts from
an unclaimed or older epoch, whatever the cause) and the controller claims again on the new
one. A Modbus TCP gateway multiplexing several controllers on one upstream connection would
merge their claims: a controller of a pair needs its own TCP connection to the CDU.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from rackplane.core.registers import PointSpec, RegisterMap, raw_from_registers, raw_to_registers
from rackplane.errors import WriteRejected
from sims.cdu.fence import EPOCH_MAX, ControllerFence
from sims.modbus_face import FaceWrite, ModbusFace

__all__ = ["EPOCH_POINT", "STALE_POINT", "EpochGate", "GateRecord"]

EPOCH_POINT: Final = "controller_epoch"
STALE_POINT: Final = "controller_stale_writes"
REFUSED_CODE: Final = 1
"""Modbus exception 1, illegal function (pymodbus ``ExcCodes.ILLEGAL_FUNCTION``)."""


@dataclass(frozen=True, slots=True)
class GateRecord:
    """One write the gate decided on (kept for tests and reports).

    Attributes:
        t_mono: when (monotonic s, the simulator's clock).
        connection: the TCP connection (`FaceWrite.connection`).
        epoch: the epoch it was judged with (the claim's value for a claim; the connection's
            claimed epoch, or None, for any other write).
        held: the CDU's epoch after the decision.
        points: the points written.
        accepted: admitted (True) or refused and counted (False).
    """

    t_mono: float
    connection: int
    epoch: int | None
    held: int
    points: tuple[str, ...]
    accepted: bool


class EpochGate:
    """Per-connection epoch claims in front of a plant's `ControllerFence` (module docstring).

    Args:
        fence: returns the plant's fence (looked up at each write: a scenario may rebuild its
            plant).
        regmap: the CDU's register map (must have ``controller_epoch``; ``controller_stale_
            writes`` is served when it has it).
        now: the monotonic clock of the records.
        keep: how many `GateRecord` to keep (newest).

    Raises:
        KeyError: the map has no ``controller_epoch`` point.
    """

    def __init__(self, fence: Callable[[], ControllerFence], regmap: RegisterMap, *,
                 now: Callable[[], float], keep: int = 100_000, log: Any = None) -> None:
        self._fence = fence
        self._epoch_spec: PointSpec = regmap.point(EPOCH_POINT)
        self._stale_spec: PointSpec | None = regmap.by_name.get(STALE_POINT)
        self._now = now
        self._log = log
        self._claims: dict[int, int] = {}
        #: Newest decisions, oldest first.
        self.records: deque[GateRecord] = deque(maxlen=keep)
        #: The epoch the write being applied was admitted with (for the plant's own fence:
        #: `VirtualRackSimulator` passes it with ``CduPlant.write``); None outside a write.
        self.current_epoch: int | None = None

    def claim_of(self, connection: int) -> int | None:
        """The epoch ``connection`` last claimed (None: none)."""
        return self._claims.get(connection)

    def admit(self, w: FaceWrite) -> int | None:
        """`ModbusFace.admit_write`: None admits ``w``, `REFUSED_CODE` refuses it (counted in
        the fence unless the claimed value is malformed)."""
        fence = self._fence()
        names = tuple(name for name, _v, _r in w.points)
        claim = next((regs for name, _v, regs in w.points if name == EPOCH_POINT), None)
        epoch = self._claims.get(w.connection)
        try:
            if claim is not None:
                epoch = raw_from_registers(self._epoch_spec, claim)
                fence.admit(EPOCH_POINT, epoch)  # an older claim: refused and counted
                self._claims[w.connection] = epoch
            for name in names:
                if name != EPOCH_POINT:
                    fence.admit(name, epoch)
        except WriteRejected as err:
            self.records.append(GateRecord(self._now(), w.connection, epoch, fence.epoch,
                                           names, False))
            if self._log is not None:
                self._log.info("cdu_write_fenced", connection=w.connection, epoch=epoch,
                               held=fence.epoch, points=list(names), error=str(err))
            return REFUSED_CODE
        self.records.append(GateRecord(self._now(), w.connection, epoch, fence.epoch, names,
                                       True))
        self.current_epoch = epoch
        return None

    def serve(self, face: ModbusFace, unit: int | None = None) -> None:
        """Put the fence's exact 64-bit epoch and stale count into the face's registers (the
        plant's float readings are exact only up to 2**53)."""
        fence = self._fence()
        face.set_registers("holding", self._epoch_spec.address,
                           raw_to_registers(self._epoch_spec, min(fence.epoch, EPOCH_MAX)),
                           unit=unit)
        if self._stale_spec is not None:
            face.set_registers("input", self._stale_spec.address,
                               raw_to_registers(self._stale_spec, fence.stale_writes),
                               unit=unit)

    def accepted_after(self, t_mono: float) -> list[GateRecord]:
        """The admitted writes since ``t_mono`` (claims included)."""
        return [r for r in self.records if r.accepted and r.t_mono >= t_mono]

    def summary(self) -> dict[str, Any]:
        """Counts for logs and reports: held epoch, stale writes, claims per connection."""
        fence = self._fence()
        return {"epoch": fence.epoch, "stale_writes": fence.stale_writes,
                "stale_by_point": fence.stale_by_point(), "claims": dict(self._claims),
                "accepted": sum(r.accepted for r in self.records),
                "refused": sum(not r.accepted for r in self.records)}

