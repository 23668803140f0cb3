"""A GPU's link ports as the contract's columnar port block (``gpus[].ports``).

`PortReading` is one port as a link source read it (`trayagent.sysfs`); `port_block` builds
the block of one GPU from its ports' readings and rates, or says why it cannot: the block's
columns have no null for link state, speed, rates or counters, so a GPU whose port cannot vouch
for one of them publishes ``ports: null`` for that interval (racky: "not read"), never a 0 in
place of an unknown.

Port names: ``gpu<gpu>/<name>`` (the reader's name scoped to its GPU), or the reading's own
``published`` name when the reader names its ports rack-wide (the simulated fabric's
``gpu07/nvl03``, `harness.simlinks`). ``nvlink`` is true for a reading of kind ``nvlink`` (a
GPU's NVLink port; the sysfs reader's ``ib`` / ``net`` ports are NIC ports).

Published counters: the names in ``counters`` (config), or by default every counter every
port of the GPU has (the intersection), restricted to the contract's widths (8, 16, 32, 64
bits: the 4-bit IBA counters are left out). Traffic: ``port_xmit_data`` / ``port_rcv_data``
(InfiniBand / RoCE, 4-octet words × 4) or ``tx_bytes`` / ``rx_bytes`` (Ethernet).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trayagent.core.counters import CounterSpec, Rate

__all__ = ["CONTRACT_BITS", "PortReading", "port_block"]

CONTRACT_BITS = frozenset({8, 16, 32, 64})
"""The counter widths the contract's ``counter_bits`` allows."""

_TX = ("port_xmit_data", "tx_bytes")
_RX = ("port_rcv_data", "rx_bytes")


@dataclass(slots=True)
class PortReading:
    """One port's raw counters as read (None: unreadable, reason in ``errors``).

    Attributes:
        name: ``<dev>/<port>`` (InfiniBand / RoCE) or ``<interface>`` (Ethernet); unique
            among the agent's ports (the key of its rates).
        kind: ``ib`` or ``net`` (NIC ports), ``nvlink`` (a GPU's NVLink port).
        link_up: the link is ACTIVE / up; None unknown.
        speed_mb_per_s: line rate per direction, MB/s; None unknown (0 while down).
        counters: name -> raw value; specs: name -> its width and behaviour.
        mono: monotonic time the counters were sampled at, s (a read's own time for sysfs;
            a periodically sampled source stamps its sample's time, and two readings with
            one ``mono`` are the same sample, `trayagent.sysfs.LinkRates`).
        published: the port's name in telemetry when the reader names it rack-wide
            (unique within the rack, e.g. ``gpu07/nvl03``); None: ``gpu<gpu>/<name>``.
    """

    name: str
    kind: str
    link_up: bool | None = None
    speed_mb_per_s: float | None = None
    counters: dict[str, int | None] = field(default_factory=dict)
    specs: dict[str, CounterSpec] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    mono: float = 0.0
    published: str | None = None


def _traffic(r: PortReading, rates: Mapping[str, Rate], names: tuple[str, ...]
             ) -> tuple[float | None, str]:
    for n in names:
        if n in r.counters:
            rate = rates.get(n)
            if rate is None or rate.per_s is None:
                return None, f"{n} rate unknown ({'missing' if rate is None else rate.reason})"
            return rate.per_s, ""
    return None, f"no {' / '.join(names)} counter"


def port_block(gpu: int, readings: Sequence[PortReading], rates: Sequence[Mapping[str, Rate]],
               counters: Sequence[str] | None = None) -> tuple[dict[str, Any] | None, str]:
    """The ``ports`` block of rack GPU ``gpu`` (ports named ``gpu<gpu>/<port>``), or None and
    why it cannot be published this interval (module docstring)."""
    if not readings:
        return None, "no port"
    names = list(counters) if counters else sorted(
        set(readings[0].counters).intersection(*(r.counters for r in readings[1:])))
    cols: dict[str, list[int]] = {}
    bits: dict[str, int] = {}
    for n in names:
        widths = {sp.bits for r in readings if (sp := r.specs.get(n)) is not None}
        if len(widths) != 1 or (width := widths.pop()) not in CONTRACT_BITS:
            if counters:
                return None, f"counter {n}: not on every port with one contract width"
            continue
        vals = [r.counters.get(n) for r in readings]
        if None in vals:
            bad = next(r for r in readings if r.counters.get(n) is None)
            return None, f"{bad.name}: {n} unknown ({bad.errors.get(n, 'not read')})"
        cols[n] = [int(v) for v in vals if v is not None]
        bits[n] = width
    link_up, speed, tx, rx = [], [], [], []
    for r, rt in zip(readings, rates, strict=True):
        if "port" in r.errors:
            return None, f"{r.name}: {r.errors['port']}"
        if r.link_up is None or r.speed_mb_per_s is None:
            return None, f"{r.name}: link state or speed unknown"
        t, why_t = _traffic(r, rt, _TX)
        x, why_x = _traffic(r, rt, _RX)
        if t is None or x is None:
            return None, f"{r.name}: {why_t or why_x}"
        link_up.append(r.link_up)
        speed.append(r.speed_mb_per_s)
        tx.append(t)
        rx.append(x)
    count = len(readings)
    return {
        "names": [r.published or f"gpu{gpu}/{r.name}" for r in readings],
        "nvlink": [r.kind == "nvlink" for r in readings],
        "link_up": link_up, "speed_mb_per_s": speed, "tx_bytes_per_s": tx,
        "rx_bytes_per_s": rx, "ber": [None] * count, "cable_temp_c": None,
        "counters": cols, "counter_bits": bits,
    }, ""
