"""The virtual rack's link fabric as the tray agent's link source: `SimLinks`, a
`trayagent.sources.LinkReader` over the `LinkSnapshot` that `harness.simagent.SimTrayFace`
takes with each fabric step.

The fabric (`sims.fabric.LinkFabric`) steps every ``fabric_step_s`` (1 s) of plant time; its
counters change only then. `link_snapshot` turns one fabric state into plain Python values
once (one ``tolist`` per column), stamped with the monotonic time of the plant step that
took it; the face keeps it in its immutable `harness.simagent.TraySnapshot` until the fabric
steps again, and the agent's worker thread reads it without touching the fabric.

What a read gives (`SimLinks.read`), as a port's hardware would:

- ``kind``: ``nvlink`` for the fabric's NVLink ports (published with ``nvlink: true``),
  ``ib`` for its NIC ports;
- ``link_up`` and ``speed_mb_per_s`` (line rate per direction, 0 while down);
- every counter of `sims.fabric.counters.COUNTERS` at its native width, wrapping or
  saturating as the fabric keeps it (the 64-bit NVLink error and byte counters wrap, the
  IBA error counters saturate: 8 / 16 bits, ``carrier_changes`` 32-bit wraps). Every port
  carries every counter, the other kind's at 0 (the fabric's matrix; the contract's port
  block is columnar over a GPU's NVLink and NIC ports, so racky finds ``nvl_crc_flit_errors``
  and ``symbol_error`` on every port, as the simulator's own node agents published them);
- ``mono``: the sample's time (the plant step that took the snapshot), not the read's: the
  agent's rates are then the counters' change over the fabric's own interval, and two reads
  between two fabric steps are one sample (`trayagent.sysfs.LinkRates` keeps its rates);
- ``published``: the fabric's rack-wide name (``gpu07/nic1``), the name racky's alarms and
  the scenario's faults use.

A port the fabric does not have, or a read before the first snapshot, is all-unknown with
``errors["port"]`` (never raises).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from sims.fabric.counters import COUNTERS
from trayagent.core.counters import CounterSpec
from trayagent.core.ports import PortReading

__all__ = ["COUNTER_SPECS", "LinkSnapshot", "SimLinks", "gpu_port_names", "link_snapshot"]

COUNTER_SPECS: Mapping[str, CounterSpec] = {
    c.name: CounterSpec(c.bits, saturates=c.overflow == "saturate") for c in COUNTERS}
"""The fabric's counters as the agent's counter specs (width, wrap or saturate)."""

_SPECS: dict[str, CounterSpec] = dict(COUNTER_SPECS)
"""The one specs dict every reading shares (readers' readings are not modified by the agent;
a copy per port per cycle was 1,440 dicts a second per rack)."""


@dataclass(frozen=True, slots=True)
class LinkSnapshot:
    """The fabric's ports at one fabric step (lists over the ports, in `names` order).

    Attributes:
        mono: monotonic time of the plant step that took it, s.
        t_s: the fabric's own time then, s (a new snapshot is taken when it moves).
        names: port names (``gpu07/nvl03``, ``gpu07/nic1``), GPU-major.
        nvlink: the port is an NVLink port (else a NIC port).
        link_up: link state (NVLink: active).
        speed_mb_per_s: line rate per direction, MB/s (0 while down).
        counters: counter name -> raw values (Python ints within the counter's width).
        port_counters: the same per port (counter name -> raw value), built once per
            fabric step so that a read copies one dict instead of indexing every column.
    """

    mono: float
    t_s: float
    names: tuple[str, ...]
    nvlink: list[bool]
    link_up: list[bool]
    speed_mb_per_s: list[float]
    counters: dict[str, list[int]]
    port_counters: tuple[dict[str, int], ...] = ()


class FabricLike(Protocol):
    """What `link_snapshot` needs of `sims.fabric.LinkFabric`."""

    @property
    def time_s(self) -> float: ...

    def snapshot(self) -> dict[str, np.ndarray[Any, Any]]: ...

    def port_names(self) -> list[str]: ...


def link_snapshot(fabric: FabricLike, mono: float) -> LinkSnapshot:
    """The fabric now as a `LinkSnapshot` stamped ``mono`` (s). Raises ``KeyError`` when the
    fabric's snapshot lacks a counter of `COUNTER_SPECS` (a fabric of another layout)."""
    snap = fabric.snapshot()
    counters = {name: snap[name].tolist() for name in COUNTER_SPECS}
    keys = tuple(counters)
    return LinkSnapshot(
        mono=mono, t_s=float(fabric.time_s), names=tuple(fabric.port_names()),
        nvlink=snap["is_nvlink"].astype(bool).tolist(),
        link_up=snap["link_up"].astype(bool).tolist(),
        speed_mb_per_s=snap["link_speed_mb_per_s"].astype(np.float64).tolist(),
        counters=counters,
        port_counters=tuple(dict(zip(keys, row, strict=True))
                            for row in zip(*counters.values(), strict=True)))


def gpu_port_names(names: list[str] | tuple[str, ...], n_gpus: int) -> list[list[str]]:
    """The fabric's port names per GPU (GPU-major layout, the same number each).

    Raises:
        ValueError: the ports do not split evenly over ``n_gpus`` (>= 1) GPUs.
    """
    if n_gpus < 1 or not names or len(names) % n_gpus:
        raise ValueError(f"{len(names)} ports do not split evenly over {n_gpus} GPUs")
    ppg = len(names) // n_gpus
    return [list(names[g * ppg:(g + 1) * ppg]) for g in range(n_gpus)]


class _Face(Protocol):
    def link_snapshot(self) -> LinkSnapshot | None: ...


class SimLinks:
    """`trayagent.sources.LinkReader` of the virtual rack's fabric (module docstring).

    Args:
        face: what holds the newest `LinkSnapshot` (`harness.simagent.SimTrayFace`).
        names: every port name of the fabric (`sims.fabric.LinkFabric.port_names`).
    """

    def __init__(self, face: _Face, names: list[str] | tuple[str, ...]) -> None:
        self.face = face
        self.index = {n: i for i, n in enumerate(names)}

    def read(self, name: str, mono: float) -> PortReading:
        """Port ``name`` in the newest snapshot; never raises (an unknown port, or no
        snapshot yet: all unknown, the reason in ``errors["port"]``, stamped ``mono``)."""
        i = self.index.get(name)
        s = self.face.link_snapshot()
        if i is None or s is None:
            r = PortReading(name, "ib", mono=mono, published=name)
            r.errors["port"] = ("no such port in the virtual rack's fabric" if i is None
                                else "the fabric has not been sampled yet")
            return r
        return PortReading(
            name, "nvlink" if s.nvlink[i] else "ib", link_up=s.link_up[i],
            speed_mb_per_s=s.speed_mb_per_s[i],
            counters=(dict(s.port_counters[i]) if s.port_counters
                      else {k: col[i] for k, col in s.counters.items()}),
            specs=_SPECS, mono=s.mono, published=name)
