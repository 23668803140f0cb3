"""racky's link frame and the port half of tray ingest (pure; `racky.core.telemetry` uses it).

`LinkFrame` holds the latest read of every port in columns (shape (ports,) per quantity,
counters (counters, ports) as uint64 in their native width's range): the detectors work on
it with numpy alone. Ports are GPU-major (``gpu * ports_per_gpu + j``), the layout learnt
from the first tray message (every GPU must then carry the same number of ports).
`PortIngest` checks a tray's port blocks (the typed path, one numpy conversion per kind of
column, and the per-block reference checks that name the key path) and writes them into the
frame; the per-field value checks shared with the tray half live here too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["BoolArray", "FloatArray", "LinkFrame", "PayloadError", "PortIngest"]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


class PayloadError(ValueError):
    """A telemetry payload that cannot be used (the message names the key path)."""


@dataclass
class LinkFrame:
    """The latest read of every port of a rack (see the module docstring).

    Attributes (per port, shape (ports,) unless noted): ``names``; ``is_nvlink``; ``gpu``;
    ``t_mono`` (when the port was last read, NaN: never); ``link_up``; ``speed_mb_per_s``;
    ``tx_bytes_per_s``, ``rx_bytes_per_s``; ``ber`` (reported, NaN unknown); ``counters``
    ((counters, ports) uint64, rows in ``counter_names`` order); ``counter_seen`` ((counters,
    ports) bool: the telemetry carried it); ``uptime_s`` and ``boot_id`` (the port's GPU;
    NaN / 0 unknown); ``cable_temp_c`` (NaN unknown); per GPU (gpus,): ``gpu_traffic`` (the
    traffic the workload implies, 0..1, NaN unknown), ``gpu_power_w``.
    """

    counter_names: tuple[str, ...]
    n_gpus: int
    ports_per_gpu: int
    names: list[str]
    is_nvlink: BoolArray
    gpu: npt.NDArray[np.int64]
    t_mono: FloatArray
    link_up: BoolArray
    speed_mb_per_s: FloatArray
    tx_bytes_per_s: FloatArray
    rx_bytes_per_s: FloatArray
    ber: FloatArray
    counters: npt.NDArray[np.uint64]
    counter_seen: BoolArray
    uptime_s: FloatArray
    boot_id: npt.NDArray[np.uint64]
    cable_temp_c: FloatArray
    gpu_traffic: FloatArray
    gpu_power_w: FloatArray
    version: int = 0

    @classmethod
    def empty(cls, counter_names: Sequence[str], n_gpus: int, ports_per_gpu: int) -> LinkFrame:
        """A frame with no reads yet."""
        n = n_gpus * ports_per_gpu
        c = len(counter_names)
        return cls(
            counter_names=tuple(counter_names), n_gpus=n_gpus, ports_per_gpu=ports_per_gpu,
            names=[f"gpu{p // ports_per_gpu:02d}/port{p % ports_per_gpu:02d}" for p in range(n)],
            is_nvlink=np.zeros(n, dtype=bool), gpu=np.arange(n, dtype=np.int64) // ports_per_gpu,
            t_mono=np.full(n, np.nan), link_up=np.zeros(n, dtype=bool),
            speed_mb_per_s=np.zeros(n), tx_bytes_per_s=np.zeros(n), rx_bytes_per_s=np.zeros(n),
            ber=np.full(n, np.nan), counters=np.zeros((c, n), dtype=np.uint64),
            counter_seen=np.zeros((c, n), dtype=bool), uptime_s=np.full(n, np.nan),
            boot_id=np.zeros(n, dtype=np.uint64), cable_temp_c=np.full(n, np.nan),
            gpu_traffic=np.full(n_gpus, np.nan), gpu_power_w=np.full(n_gpus, np.nan),
        )

    @property
    def n_ports(self) -> int:
        """Ports in the frame (GPUs × ports per GPU)."""
        return len(self.names)

    def counter(self, name: str) -> npt.NDArray[np.uint64]:
        """One counter row (a view)."""
        return self.counters[self.counter_names.index(name)]



def _num(d: Mapping[str, Any], key: str, path: str, *, optional: bool = False) -> float:
    v = d.get(key)
    if v is None:
        if optional:
            return math.nan
        raise PayloadError(f"{path}.{key}: missing")
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise PayloadError(f"{path}.{key}: not a number ({v!r})")
    try:
        f = float(v)
    except OverflowError:  # an int beyond a double's range
        raise PayloadError(f"{path}.{key}: not finite") from None
    if not math.isfinite(f):
        raise PayloadError(f"{path}.{key}: not finite")
    return f


def _watts(d: Mapping[str, Any], key: str, path: str, *, optional: bool = False) -> float:
    """A power in W: finite and >= 0 (a negative power would understate the rack's draw)."""
    f = _num(d, key, path, optional=optional)
    if f < 0:
        raise PayloadError(f"{path}.{key}: {f!r} W is negative")
    return f


def _opt(d: Mapping[str, Any], key: str, path: str) -> float | None:
    f = _num(d, key, path, optional=True)
    return None if math.isnan(f) else f


def _agent_num(a: Mapping[str, Any], key: str, *, nullable: bool = False) -> float | None:
    """An agent-block number (a power, cap, ramp, percentage or duration): finite and >= 0
    (docs/CONTRACTS.md: negative powers are refused), or None where ``nullable`` (none set)."""
    f = _num(a, key, "agent", optional=nullable)
    if math.isnan(f):
        return None
    if f < 0:
        raise PayloadError(f"agent.{key}: {f!r} is negative")
    return f


def _bool(d: Mapping[str, Any], key: str, path: str, default: bool | None = None) -> bool:
    v = d.get(key, default)
    if not isinstance(v, bool):
        raise PayloadError(f"{path}.{key}: not a boolean ({v!r})")
    return v


def _list(d: Mapping[str, Any], key: str, path: str, n: int) -> list[Any]:
    v = d.get(key)
    if not isinstance(v, list) or len(v) != n:
        raise PayloadError(f"{path}.{key}: expected a list of {n}")
    return v


_PortBlock = tuple[int, dict[str, Any], float, int, dict[str, npt.NDArray[np.uint64]]]
"""A checked port block: (GPU, the JSON block, uptime s, boot id, counters converted)."""


@dataclass(slots=True)
class _TrayPorts:
    """A tray's port blocks checked and converted in one pass (`TelemetryIngest._ports_struct`):
    per port (gpus × n,) in payload GPU order, counters (rows, gpus × n) for the frame rows
    ``counter_rows`` (the others were not carried)."""

    gpus: npt.NDArray[np.int64]
    n: int
    names: list[str]
    nvlink: BoolArray
    link_up: BoolArray
    speed_mb_per_s: FloatArray
    tx_bytes_per_s: FloatArray
    rx_bytes_per_s: FloatArray
    ber: FloatArray
    cable_temp_c: FloatArray
    counter_rows: list[int]
    counters: npt.NDArray[np.uint64] | None
    uptime_s: FloatArray
    boot_id: npt.NDArray[np.uint64]


def _float_column(vals: list[Any], *, nullable: bool, non_negative: bool) -> FloatArray | None:
    """Typed floats (msgspec checked the types; ``None`` only when ``nullable``, read as NaN)
    as float64 when all are finite and (``non_negative``) >= 0; else None. The NaNs numpy
    makes must be the nulls, one for one (a NaN float from an already-decoded dict is
    refused)."""
    arr = np.array(vals, dtype=np.float64)
    if not np.isfinite(arr).all() and (  # a null (NaN here), a NaN or an infinity
            not nullable or np.isinf(arr).any() or int(np.isnan(arr).sum()) != vals.count(None)):
        return None
    if non_negative and (arr < 0).any():  # NaN (a null) compares False
        return None
    return arr



def _u64_column(vals: Any, n: int) -> npt.NDArray[np.uint64] | None:
    """``n`` unsigned 64-bit integers from a JSON list, or None when it is not one (floats,
    booleans, null, negatives, values >= 2**64, wrong length). Vectorised: the element types
    are checked with one C-level pass (``set(map(type, ...))``) and numpy converts the whole
    list exactly (it raises OverflowError outside [0, 2**64))."""
    if not isinstance(vals, list) or len(vals) != n or not set(map(type, vals)) <= {int}:
        return None
    try:
        return np.array(vals, dtype=np.uint64)
    except (OverflowError, ValueError, TypeError):
        return None


def _finite(x: float) -> bool:
    try:
        return math.isfinite(x)
    except OverflowError:  # an int beyond a double's range
        return False


def _number_column(vals: list[Any], path: str, *, nullable: bool,
                   non_negative: bool = True) -> None:
    """Check a JSON list of numbers: finite (and >= 0 when ``non_negative``), ``null`` allowed
    only when ``nullable`` (unknown).

    Raises:
        PayloadError: naming ``path`` and the first bad element.
    """
    for i, x in enumerate(vals):
        if x is None and nullable:
            continue
        if isinstance(x, bool) or not isinstance(x, int | float) or not _finite(x) or (
                non_negative and x < 0):
            raise PayloadError(f"{path}[{i}]: {x!r} is not a finite"
                               f"{' non-negative' if non_negative else ''} number")



class PortIngest:
    """The port half of `racky.core.telemetry.TelemetryIngest` (a mixin: it reads and writes
    the ingest's ``frame`` and reads its geometry and ``counter_names``)."""

    n_trays: int
    gpus_per_tray: int
    counter_names: tuple[str, ...]
    frame: LinkFrame | None

    def _ports_struct(self, gis: list[int], pbs: list[Any], uptime_s: FloatArray,
                      boot: npt.NDArray[np.uint64]) -> _TrayPorts | None:
        """Every GPU's `PortBlockStruct` checked and converted at once: one numpy conversion
        per kind of column over the whole tray. None when it cannot vouch for the blocks
        (it never refuses), and then `_check_ports` decides per block and names the key path.
        It accepts exactly what `_check_ports` accepts when it returns a value: one non-empty
        port count for every list (the frame's, once learnt), rates finite and >= 0,
        ``ber`` / ``cable_temp_c`` finite (>= 0 for BER) or null, every counter of
        ``counter_names`` carried by every GPU (other names ignored), in [0, 2**64)."""
        g = len(pbs)
        if len(set(gis)) != g:
            return None
        n = len(pbs[0].names)
        f = self.frame
        if not n or (f is not None and n != f.ports_per_gpu):
            return None
        lists = [x for pb in pbs for x in (pb.names, pb.nvlink, pb.link_up, pb.speed_mb_per_s,
                                           pb.tx_bytes_per_s, pb.rx_bytes_per_s, pb.ber)]
        if set(map(len, lists)) != {n}:
            return None
        names = list(chain.from_iterable(lists[0::7]))
        flags = np.array(list(chain.from_iterable(
            x for pb in pbs for x in (pb.nvlink, pb.link_up))), dtype=bool).reshape(g, 2, n)
        # the three rates in one conversion (>= 0; msgspec lets no null in them: a list of
        # floats converts on numpy's fast path), BER apart (>= 0 or null: all null, as a
        # healthy fabric reports, is a NaN column without a conversion)
        rates = _float_column(list(chain.from_iterable(
            x for pb in pbs for x in (pb.speed_mb_per_s, pb.tx_bytes_per_s, pb.rx_bytes_per_s))),
            nullable=False, non_negative=True)
        if rates is None:
            return None
        rate3 = rates.reshape(g, 3, n)
        bers = list(chain.from_iterable(pb.ber for pb in pbs))
        ber = (np.full(g * n, np.nan) if bers.count(None) == len(bers)
               else _float_column(bers, nullable=True, non_negative=True))
        if ber is None:
            return None
        temps = [pb.cable_temp_c for pb in pbs]
        n_none = temps.count(None)
        if n_none == g:
            cable = np.full(g * n, np.nan)
        elif n_none or set(map(len, temps)) != {n}:
            return None
        else:
            got = _float_column(list(chain.from_iterable(temps)), nullable=True,
                                non_negative=False)
            if got is None:
                return None
            cable = got
        ctrs = [pb.counters for pb in pbs]
        keys = self.counter_names
        rows = list(range(len(keys)))
        counters = None
        for c in ctrs:
            if not all(k in c for k in keys):
                return None  # a counter racky keeps is missing: `_check_ports` refuses
        if rows:
            ints = [c[k] for c in ctrs for k in keys]
            if set(map(len, ints)) != {n}:
                return None
            try:  # fromiter: no intermediate list (the tray's ~900 counters)
                counters = np.fromiter(chain.from_iterable(ints), dtype=np.uint64,
                                       count=g * len(rows) * n).reshape(g, len(rows), n)
            except (OverflowError, ValueError, TypeError):
                return None  # negative or >= 2**64
        return _TrayPorts(
            gpus=np.array(gis, dtype=np.int64), n=n, names=names,
            nvlink=flags[:, 0].ravel(), link_up=flags[:, 1].ravel(),
            speed_mb_per_s=rate3[:, 0].ravel(), tx_bytes_per_s=rate3[:, 1].ravel(),
            rx_bytes_per_s=rate3[:, 2].ravel(), ber=ber, cable_temp_c=cable,
            counter_rows=rows,
            counters=None if counters is None else counters.transpose(1, 0, 2).reshape(
                len(rows), g * n),
            uptime_s=uptime_s.copy(), boot_id=boot.copy(),
        )

    def _check_ports(self, gi: int, pb: dict[str, Any]) -> dict[str, npt.NDArray[np.uint64]]:
        """Check a GPU's port block; returns its counters converted (name -> (ports,))."""
        path = f"gpus[gpu={gi}].ports"
        names = pb.get("names")
        if not isinstance(names, list) or not names or not all(isinstance(x, str) for x in names):
            raise PayloadError(f"{path}.names: expected a list of port names")
        n = len(names)
        if self.frame is not None and n != self.frame.ports_per_gpu:
            raise PayloadError(f"{path}: {n} ports, the rack's layout has "
                               f"{self.frame.ports_per_gpu} per GPU")
        for key in ("nvlink", "link_up"):
            if not all(isinstance(x, bool) for x in _list(pb, key, path, n)):
                raise PayloadError(f"{path}.{key}: expected {n} booleans")
        for key in ("speed_mb_per_s", "tx_bytes_per_s", "rx_bytes_per_s"):
            _number_column(_list(pb, key, path, n), f"{path}.{key}", nullable=False)
        for key in ("ber", "cable_temp_c"):
            vals = pb.get(key)
            if vals is not None:
                if not isinstance(vals, list) or len(vals) != n:
                    raise PayloadError(f"{path}.{key}: expected a list of {n}")
                _number_column(vals, f"{path}.{key}", nullable=True,
                               non_negative=key == "ber")
        ctr = pb.get("counters")
        if not isinstance(ctr, dict):
            raise PayloadError(f"{path}.counters: not an object")
        parsed: dict[str, npt.NDArray[np.uint64]] = {}
        for name in self.counter_names:
            vals = ctr.get(name)
            if vals is None:
                raise PayloadError(f"{path}.counters.{name}: missing (racky keeps it: config "
                                   "links.counters)")
            col = _u64_column(vals, n)
            if col is None:
                raise PayloadError(f"{path}.counters.{name}: expected {n} unsigned integers")
            parsed[name] = col
        return parsed

    def _write_tray_ports(self, tp: _TrayPorts, t: float) -> None:
        """Write a fast-checked tray into the frame: one assignment per column (the tray's
        GPUs are one contiguous run of ports when they come in index order, as agents send
        them; else a gather index)."""
        if self.frame is None:
            self.frame = LinkFrame.empty(self.counter_names, self.n_trays * self.gpus_per_tray,
                                         tp.n)
        f = self.frame
        n = tp.n
        g0 = int(tp.gpus[0])
        sl: slice | npt.NDArray[np.int64]
        if np.array_equal(tp.gpus, np.arange(g0, g0 + len(tp.gpus))):
            sl = slice(g0 * n, (g0 + len(tp.gpus)) * n)
            f.names[sl] = tp.names
        else:
            sl = (tp.gpus[:, None] * n + np.arange(n)).ravel()
            for k, p in enumerate(sl.tolist()):
                f.names[p] = tp.names[k]
        f.is_nvlink[sl] = tp.nvlink
        f.link_up[sl] = tp.link_up
        f.speed_mb_per_s[sl] = tp.speed_mb_per_s
        f.tx_bytes_per_s[sl] = tp.tx_bytes_per_s
        f.rx_bytes_per_s[sl] = tp.rx_bytes_per_s
        f.ber[sl] = tp.ber
        f.cable_temp_c[sl] = tp.cable_temp_c
        rows = tp.counter_rows
        if tp.counters is not None and len(rows) == len(self.counter_names):
            f.counters[:, sl] = tp.counters
            f.counter_seen[:, sl] = True
        else:
            f.counter_seen[:, sl] = False
            for j, r in enumerate(rows):
                assert tp.counters is not None
                f.counters[r, sl] = tp.counters[j]
                f.counter_seen[r, sl] = True
        f.uptime_s[sl] = np.repeat(tp.uptime_s, n)
        f.boot_id[sl] = np.repeat(tp.boot_id, n)
        f.t_mono[sl] = t
        f.version += 1

    def _write_ports(self, ports: _TrayPorts | list[_PortBlock], t: float) -> None:
        if isinstance(ports, _TrayPorts):
            self._write_tray_ports(ports, t)
            return
        if self.frame is None:
            ppg = len(ports[0][1]["names"])
            self.frame = LinkFrame.empty(self.counter_names, self.n_trays * self.gpus_per_tray,
                                         ppg)
        f = self.frame
        ppg = f.ports_per_gpu
        for gi, pb, up_s, boot, parsed in ports:
            sl = slice(gi * ppg, (gi + 1) * ppg)
            f.names[sl] = pb["names"]
            f.is_nvlink[sl] = np.asarray(pb["nvlink"], dtype=bool)
            f.link_up[sl] = np.asarray(pb["link_up"], dtype=bool)
            f.speed_mb_per_s[sl] = np.asarray(pb["speed_mb_per_s"], dtype=np.float64)
            f.tx_bytes_per_s[sl] = np.asarray(pb["tx_bytes_per_s"], dtype=np.float64)
            f.rx_bytes_per_s[sl] = np.asarray(pb["rx_bytes_per_s"], dtype=np.float64)
            ber = pb.get("ber")
            f.ber[sl] = (np.asarray([np.nan if x is None else x for x in ber], dtype=np.float64)
                         if isinstance(ber, list) and len(ber) == ppg else np.nan)
            temps = pb.get("cable_temp_c")
            f.cable_temp_c[sl] = (
                np.asarray([np.nan if x is None else x for x in temps], dtype=np.float64)
                if isinstance(temps, list) and len(temps) == ppg else np.nan
            )
            for r, name in enumerate(self.counter_names):
                vals = parsed.get(name)
                if vals is not None:
                    f.counters[r, sl] = vals
                    f.counter_seen[r, sl] = True
                else:
                    f.counter_seen[r, sl] = False
            f.uptime_s[sl] = up_s
            f.boot_id[sl] = np.uint64(boot)
            f.t_mono[sl] = t
        f.version += 1
