"""What the agent needs of a GPU source (NVML, the DCGM exporter): the interface and its error.
"""

from __future__ import annotations

from typing import Protocol

from trayagent.core.bmc import BmcReading
from trayagent.core.payload import GpuReading
from trayagent.core.ports import PortReading

__all__ = ["BmcReader", "GpuSource", "LinkReader", "SourceError"]


class SourceError(RuntimeError):
    """A source could not be used (not reachable, not loaded, refused a set); the message has
    the source's own error text."""


class GpuSource(Protocol):
    """A GPU source. All calls are blocking: the agent makes them from a worker thread.

    ``open`` returns the number of GPUs it sees; ``refresh`` fetches what ``read`` returns for
    this cycle (one scrape for an exporter; nothing for NVML); ``read(index, gpu)`` never raises
    for one figure (None with the reason); ``set_limit`` raises `SourceError` when the limit
    cannot be set; ``cap_enforceable`` says whether it can set limits at all."""

    cap_enforceable: bool

    def open(self) -> int: ...

    def refresh(self) -> None: ...

    def read(self, index: int, gpu: int) -> GpuReading: ...

    def set_limit(self, index: int, watts: float) -> None: ...

    def close(self) -> None: ...


class BmcReader(Protocol):
    """What the agent's BMC task needs of a tray's BMC (`trayagent.redfish.BmcSource`, or a
    simulated tray's): blocking calls, made from a worker thread. ``read(mono)`` never raises
    for one figure (None with the reason in ``errors``); ``mono`` is stamped on the reading."""

    def read(self, mono: float) -> BmcReading: ...

    def close(self) -> None: ...


class LinkReader(Protocol):
    """What the agent needs of a link-counter source (`trayagent.sysfs.SysfsLinks`): one port's
    raw counters as a `PortReading` (blocking; never raises for one figure)."""

    def read(self, name: str, mono: float) -> PortReading: ...
