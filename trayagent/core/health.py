"""A GPU's health figures beyond power: NVLink error counters, ECC error totals, Xid events
(NVML; `trayagent.nvml` reads them).

- **NVLink**: per link that exists (NVML answers its state) whether it is active and its
  data-link error counters, counts since the driver loaded (or the last counter reset), 64-bit:
  ``replay`` (``NVML_NVLINK_ERROR_DL_REPLAY``: flits replayed), ``recovery`` (link recoveries),
  ``crc_flit`` / ``crc_data`` (CRC errors in flits / data), ``ecc_data`` (ECC errors in data;
  not on every generation: None with the reason);
- **ECC**: the device memory's corrected and uncorrected error totals, ``volatile`` (since the
  driver loaded) and ``aggregate`` (the device's lifetime); None where ECC is off or not
  supported (the reason in ``errors``);
- **Xid**: an Xid critical error NVML reported for a device (``nvmlEventTypeXidCriticalError``,
  its ``eventData`` the Xid number, NVIDIA's Xid catalogue names it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = ["NVLINK_COUNTERS", "GpuHealth", "NvLink", "XidEvent"]

NVLINK_COUNTERS = ("replay", "recovery", "crc_flit", "crc_data", "ecc_data")
"""NVML's ``NVML_NVLINK_ERROR_DL_*`` counters 0..4, in that order."""


@dataclass(slots=True)
class NvLink:
    """One NVLink: ``active`` and its error counters (name -> count; None: not read, the
    reason in ``errors``)."""

    link: int
    active: bool
    counters: dict[str, int | None] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class GpuHealth:
    """One GPU's health figures (module docstring): ``links`` in link order; ECC totals,
    counts; ``errors``: figure -> why it is None."""

    links: list[NvLink] = field(default_factory=list)
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_corrected_aggregate: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    errors: dict[str, str] = field(default_factory=dict)


class XidEvent(NamedTuple):
    """An Xid reported for NVML device ``device`` (its index), number ``xid``."""

    device: int
    xid: int
