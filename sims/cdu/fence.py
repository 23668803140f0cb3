"""The simulated CDU's controller-epoch fence (issue 15): a 64-bit register holding the
newest controller epoch written, and a count of every write attempt from an older one.

Rules (`ControllerFence.admit`, applied to every register write before it takes effect):

- **No epoch yet** (0, the state of a new CDU): a write without an epoch is accepted as today
  (single-instance controllers never write one); a write with an epoch claims it.
- **Epoch E held**: a write carrying E or newer is accepted (a newer one becomes the held
  epoch: a takeover); a write carrying an older epoch, or none at all, is a **stale write**:
  refused (`WriteRejected`, nothing changes, the heartbeat included) and counted, in total and
  per point.
- The epoch is nonvolatile: a controller restart (`CduPlant.restart_controller`) keeps it, so a
  fenced controller cannot write again after a CDU reboot.
- An epoch outside 1..2**64-1 (or not an int) is refused as malformed and not counted as
  stale (it is not a controller's epoch at all).

Counters are Python ints (no wrap); reports and registers show them saturated at 2**64-1.
"""

from __future__ import annotations

from typing import Final

from rackplane.errors import WriteRejected

__all__ = ["EPOCH_MAX", "ControllerFence"]

EPOCH_MAX: Final = 2**64 - 1


class ControllerFence:
    """The epoch register and its stale-write counters (module docstring for the rules)."""

    __slots__ = ("_epoch", "_stale_by_point", "_stale_writes")

    def __init__(self) -> None:
        self._epoch = 0
        self._stale_writes = 0
        self._stale_by_point: dict[str, int] = {}

    @property
    def epoch(self) -> int:
        """The newest controller epoch written (0: none yet)."""
        return self._epoch

    @property
    def stale_writes(self) -> int:
        """Write attempts from a stale (older or missing) epoch, saturated at 2**64-1."""
        return min(self._stale_writes, EPOCH_MAX)

    def stale_by_point(self) -> dict[str, int]:
        """Stale write attempts per point (a copy)."""
        return dict(self._stale_by_point)

    def admit(self, point: str, epoch: int | None) -> None:
        """Admit a write to ``point`` carrying ``epoch`` (None: the writer sent none).

        Raises:
            WriteRejected: a stale write (counted) or a malformed epoch (not counted).
        """
        if epoch is not None and (isinstance(epoch, bool) or not isinstance(epoch, int)
                                  or not 1 <= epoch <= EPOCH_MAX):
            raise WriteRejected(f"cdu: {point}: controller epoch {epoch!r} is not in "
                                "1..2**64-1")
        if epoch is None:
            if self._epoch == 0:
                return
            self._stale(point)
            raise WriteRejected(f"cdu: {point}: write without a controller epoch refused; "
                                f"epoch {self._epoch} holds the CDU")
        if epoch < self._epoch:
            self._stale(point)
            raise WriteRejected(f"cdu: {point}: stale controller epoch {epoch} refused; "
                                f"epoch {self._epoch} holds the CDU")
        self._epoch = epoch

    def _stale(self, point: str) -> None:
        self._stale_writes += 1
        self._stale_by_point[point] = self._stale_by_point.get(point, 0) + 1
