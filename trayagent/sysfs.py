"""RDMA and Ethernet link counters from the kernel's sysfs (no library: plain file reads).

Where (``root`` is ``/sys`` unless configured):

- ``<root>/class/infiniband/<dev>/ports/<n>/counters/<name>``: IBA PortCounters as the kernel
  exposes them (Documentation/ABI/stable/sysfs-class-infiniband; drivers/infiniband/core/
  sysfs.c). Error counters are narrow and **saturate** (IBA: a counter stops at its top):
  ``symbol_error`` 16 bits, ``link_error_recovery`` 8, ``link_downed`` 8, ``port_rcv_errors``
  16, ``port_rcv_remote_physical_errors`` 16, ``port_rcv_switch_relay_errors`` 16,
  ``port_xmit_discards`` 16, ``port_xmit_constraint_errors`` 8, ``port_rcv_constraint_errors``
  8, ``local_link_integrity_errors`` 4, ``excessive_buffer_overrun_errors`` 4,
  ``VL15_dropped`` 16, ``port_xmit_wait`` 32. ``port_xmit_data`` / ``port_rcv_data`` count
  **4-octet words** ("divided by 4", scale 4 to bytes); they and the packet counters are 64-bit
  on an HCA with extended counters (PortCountersExtended, every ConnectX) and otherwise the
  **32-bit fallback that saturates** (config ``sysfs.ib_extended_counters = false``).
- ``<root>/class/infiniband/<dev>/ports/<n>/hw_counters/<name>``: the driver's own counters
  (``rdma_hw_stats``, u64): 64-bit; they restart at 0 when the driver is reloaded.
- ``<root>/class/net/<if>/statistics/<name>``: ``rtnl_link_stats64``, 64-bit (printed as
  ``%llu``); ``<root>/class/net/<if>/carrier_changes``: 32-bit (an ``atomic_t``).
- a RoCE port's Ethernet device: ``ports/<n>/gid_attrs/ndevs/0`` names it (the read fails
  with EINVAL on an InfiniBand link layer); its ``statistics`` and ``carrier_changes`` are
  read into the port's reading beside the RDMA counters (one port: ``link_downed`` and
  ``carrier_changes``, what racky's link rules read);
- link state: IB ``ports/<n>/state`` (``4: ACTIVE``) and ``rate`` (``400 Gb/sec (4X NDR)``);
  net ``operstate`` (``up``) and ``speed`` (Mb/s; ``-1`` or EINVAL while down).

A file that does not read as a non-negative integer of its width (``N/A``, empty, an I/O error
such as EINVAL/ENODEV, a vanished device during a driver reload) gives **None** with the reason
in `PortReading.errors`: never 0. `LinkRates` turns two readings into rates with
`trayagent.core.counters.counter_rate`, so a saturated counter, a reset (driver reload,
counters cleared) or a missing reading gives an unknown rate, never 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from trayagent.core.counters import CounterSpec, Rate, counter_rate
from trayagent.core.ports import PortReading

__all__ = ["IB_ERROR_COUNTERS", "LinkRates", "PortReading", "SysfsLinks", "ib_counter_spec",
           "net_counter_spec"]

IB_ERROR_COUNTERS: dict[str, int] = {
    "symbol_error": 16, "link_error_recovery": 8, "link_downed": 8, "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16, "port_rcv_switch_relay_errors": 16,
    "port_xmit_discards": 16, "port_xmit_constraint_errors": 8,
    "port_rcv_constraint_errors": 8, "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4, "VL15_dropped": 16, "port_xmit_wait": 32,
}
"""IBA PortCounters the kernel exposes, name -> width (they saturate)."""

IB_DATA_COUNTERS = ("port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets",
                    "unicast_xmit_packets", "unicast_rcv_packets", "multicast_xmit_packets",
                    "multicast_rcv_packets")
"""64-bit with extended counters, else 32-bit saturating (the unicast / multicast ones exist
only with extended counters)."""

_MISSING = Rate(None, "missing")

_WORDS = frozenset({"port_xmit_data", "port_rcv_data"})


def ib_counter_spec(name: str, *, extended: bool, hw: bool = False) -> CounterSpec:
    """The width and behaviour of an InfiniBand counter file (module docstring); ``hw``: a
    ``hw_counters`` file (64-bit, wraps). Unknown ``counters`` names are taken as 32-bit
    saturating (the PortCounters default), never wider than documented."""
    if hw:
        return CounterSpec(64, saturates=False)
    if name in IB_ERROR_COUNTERS:
        return CounterSpec(IB_ERROR_COUNTERS[name], saturates=True)
    scale = 4.0 if name in _WORDS else 1.0
    if name in IB_DATA_COUNTERS and extended:
        return CounterSpec(64, saturates=False, scale=scale)
    return CounterSpec(32, saturates=True, scale=scale)


def net_counter_spec(name: str) -> CounterSpec:
    """``statistics/*`` are 64-bit and wrap; ``carrier_changes`` is 32-bit and wraps."""
    return CounterSpec(32 if name == "carrier_changes" else 64, saturates=False)


def _read(path: Path) -> tuple[str | None, str | None]:
    try:
        return path.read_text(errors="replace").strip(), None
    except OSError as err:
        return None, f"{err.strerror or type(err).__name__} ({err.errno})"


def _uint(path: Path, spec: CounterSpec) -> tuple[int | None, str | None]:
    text, err = _read(path)
    if text is None:
        return None, err
    if not text.isascii() or not text.isdigit():
        return None, f"not a count: {text[:32]!r}"
    v = int(text)
    if v > spec.top:
        return None, f"{v} beyond the counter's {spec.bits} bits"
    return v, None


_RATE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec")


class SysfsLinks:
    """Reads ports under a sysfs root (module docstring).

    Args:
        root: the sysfs mount point (``/sys``; a tree in a temporary folder in tests).
        ib_extended_counters: the HCAs have PortCountersExtended (64-bit data counters).
    """

    def __init__(self, root: Path, *, ib_extended_counters: bool = True) -> None:
        self.root = Path(root)
        self.extended = ib_extended_counters

    def discover(self) -> list[str]:
        """Every port present: ``<dev>/<n>`` for InfiniBand / RoCE, interface names for
        Ethernet (``lo`` left out), sorted."""
        out: list[str] = []
        ib = self.root / "class" / "infiniband"
        if ib.is_dir():
            for dev in sorted(ib.iterdir()):
                ports = dev / "ports"
                if ports.is_dir():
                    out += [f"{dev.name}/{p.name}" for p in sorted(ports.iterdir())]
        net = self.root / "class" / "net"
        if net.is_dir():
            out += [n.name for n in sorted(net.iterdir()) if n.name != "lo"]
        return out

    def read(self, name: str, mono: float) -> PortReading:
        """Read port ``name`` (``<dev>/<n>`` or an interface); never raises: a port that is
        gone reads as all-unknown (``errors["port"]``)."""
        return self._read_ib(name, mono) if "/" in name else self._read_net(name, mono)

    def _read_ib(self, name: str, mono: float) -> PortReading:
        dev, port = name.split("/", 1)
        base = self.root / "class" / "infiniband" / dev / "ports" / port
        r = PortReading(name, "ib", mono=mono)
        if not base.is_dir():
            r.errors["port"] = "no such port (driver not loaded, or reloading)"
            return r
        state, err = _read(base / "state")
        r.link_up = None if state is None else state.upper().endswith("ACTIVE")
        if err:
            r.errors["state"] = err
        rate, err = _read(base / "rate")
        m = None if rate is None else _RATE_RE.match(rate)
        if m is not None:
            r.speed_mb_per_s = float(m.group(1)) * 1000.0 / 8.0 if r.link_up else 0.0
        else:
            r.errors["rate"] = err or f"not a rate: {(rate or '')[:32]!r}"
        for sub, hw in (("counters", False), ("hw_counters", True)):
            folder = base / sub
            if not folder.is_dir():
                continue
            for f in sorted(folder.iterdir()):
                if not f.is_file() or f.name == "lifespan":  # lifespan: a setting, not a count
                    continue
                key = f"hw:{f.name}" if hw else f.name
                spec = ib_counter_spec(f.name, extended=self.extended, hw=hw)
                r.specs[key] = spec
                r.counters[key], why = _uint(f, spec)
                if why:
                    r.errors[key] = why
        ndev, _err = _read(base / "gid_attrs" / "ndevs" / "0")
        if ndev and "/" not in ndev and ndev not in (".", ".."):
            net = self._read_net(ndev, mono)
            if "port" not in net.errors:
                for k, v in net.counters.items():
                    if k not in r.counters:
                        r.counters[k], r.specs[k] = v, net.specs[k]
                        if k in net.errors:
                            r.errors[k] = net.errors[k]
        return r

    def _read_net(self, name: str, mono: float) -> PortReading:
        base = self.root / "class" / "net" / name
        r = PortReading(name, "net", mono=mono)
        if not base.is_dir():
            r.errors["port"] = "no such interface"
            return r
        state, err = _read(base / "operstate")
        r.link_up = None if state is None else state == "up"
        if err:
            r.errors["operstate"] = err
        speed, err = _read(base / "speed")
        try:
            mbit = int(speed) if speed is not None else None
        except ValueError:
            mbit = None
        if mbit is not None and mbit >= 0:
            r.speed_mb_per_s = mbit / 8.0
        elif r.link_up is False:
            r.speed_mb_per_s = 0.0
        else:
            r.errors["speed"] = err or f"not a speed: {(speed or '')[:32]!r}"
        files = [base / "carrier_changes"]
        stats = base / "statistics"
        if stats.is_dir():
            files += sorted(f for f in stats.iterdir() if f.is_file())
        for f in files:
            spec = net_counter_spec(f.name)
            r.specs[f.name] = spec
            r.counters[f.name], why = _uint(f, spec)
            if why:
                r.errors[f.name] = why
        return r


@dataclass(slots=True)
class LinkRates:
    """Rates from successive `PortReading` s of each port (`counter_rate` rules: unknown when
    the readings cannot vouch). ``max_rate_per_s``: the largest plausible rate, counts/s.

    A reading stamped with the previous one's ``mono`` is the same sample again (a source
    that samples its counters periodically, as the simulated fabric does each step, read
    twice between two samples): it keeps the previous rates, not ``no_time``."""

    max_rate_per_s: float
    last: dict[str, PortReading] = field(default_factory=dict)
    rates: dict[str, dict[str, Rate]] = field(default_factory=dict)

    def update(self, r: PortReading) -> dict[str, Rate]:
        """The rate of every counter of ``r`` since the port's previous reading (a first
        reading: all unknown, ``missing``; the same sample again: the previous rates);
        ``r`` becomes the previous one."""
        prev = self.last.get(r.name)
        self.last[r.name] = r
        if prev is not None and prev.mono == r.mono and prev.counters == r.counters:
            same = self.rates.get(r.name)
            if same is not None:
                return same
        out: dict[str, Rate]
        if prev is None:
            out = dict.fromkeys(r.counters, _MISSING)
        else:
            before, specs, elapsed_s = prev.counters, r.specs, r.mono - prev.mono
            max_rate = self.max_rate_per_s
            out = {k: _MISSING if k not in before
                   else counter_rate(specs[k], before[k], v, elapsed_s, max_rate)
                   for k, v in r.counters.items()}
        self.rates[r.name] = out
        return out
