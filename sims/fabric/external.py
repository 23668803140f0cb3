"""`LinkFabric`'s hooks for what is set from outside the rack: for a network model
(`sims.backend`) per-port demand (a collective routed over the NICs), the trained link speed
(a link that came up at a lower rate) and the link state without a full snapshot; for tests
and scenarios a preset counter (`set_counter`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from sims.fabric.counters import _ROW, _SPEC, COUNTER_NAMES, PortKind, PortRef
from sims.fabric.params import _finite

__all__ = ["ExternalTraffic"]


class ExternalTraffic:
    """Mixin of `sims.fabric.LinkFabric` (its state lives there, declared here for types)."""

    n_ports: int
    _time_s: float
    _faults: list[dict[str, Any]]
    _port_gpu: npt.NDArray[np.intp]
    _link_up: npt.NDArray[np.bool_]
    _speed_mb: npt.NDArray[np.float64]
    _speed_bytes: npt.NDArray[np.float64]
    _line_bits_per_s: npt.NDArray[np.float64]
    _nominal_speed_mb: npt.NDArray[np.float64]
    _ovr: npt.NDArray[np.float64]
    _ovr_on: bool
    _ctr: npt.NDArray[np.uint64]
    _names: list[str]

    def _port(self, port: PortRef) -> int:
        raise NotImplementedError

    def _kind(self, p: int) -> PortKind:
        raise NotImplementedError

    def _record(
        self, kind: str, *, port: int | None, gpu: int, start_s: float, end_s: float | None,
        **detail: float | str,
    ) -> int:
        raise NotImplementedError

    @property
    def link_up(self) -> npt.NDArray[np.bool_]:
        """Per port: link up now, shape (ports,) (a copy; `snapshot` without the counters)."""
        return self._link_up.copy()

    @property
    def link_speed_mb_per_s(self) -> npt.NDArray[np.float64]:
        """Per port: trained line speed per direction, MB/s, shape (ports,), whether the link
        is up or not (a copy; `set_link_speed` lowers it)."""
        return self._speed_mb.copy()

    def set_port_demand(self, tx: npt.ArrayLike, rx: npt.ArrayLike) -> None:
        """From the next step, port ``p`` sends ``tx[p]`` and receives ``rx[p]`` of its line
        speed (each in [0, 1], shape (ports,)) instead of its GPU's demand × share; NaN keeps
        the GPU-derived demand for that port and direction. Jitter, link down time, stalls
        and silences still apply. An operation (a collective routed by a network model), not a
        fault: not in `fault_log`. Raises ValueError for a wrong shape or a value outside
        [0, 1] (NaN allowed); nothing changes then."""
        a = np.stack([np.asarray(tx, dtype=np.float64), np.asarray(rx, dtype=np.float64)])
        if a.shape != (2, self.n_ports):
            raise ValueError(f"tx and rx must have shape ({self.n_ports},) (got {a.shape[1:]})")
        v = a[~np.isnan(a)]
        if not (np.isfinite(v).all() and (v >= 0.0).all() and (v <= 1.0).all()):
            raise ValueError("port demand values must be NaN or within [0, 1]")
        self._ovr = a
        self._ovr_on = bool(v.size)

    def set_link_speed(self, port: PortRef, mb_per_s: float) -> None:
        """From now, ``port`` trains at ``mb_per_s`` per direction (a link that came up at a
        lower rate, e.g. 400G → 200G: ``link_speed_mb_per_s`` reads it, throughput and BER
        line bits follow it). Recorded as fault ``speed``. Raises ValueError for a speed <= 0
        or above the port's nominal speed."""
        p = self._port(port)
        v = _finite("mb_per_s", mb_per_s, lo=0.0, lo_open=True)
        if v > self._nominal_speed_mb[p]:
            raise ValueError(f"mb_per_s must be <= the nominal {self._nominal_speed_mb[p]:g}")
        self.restore_link_speed(p)
        self._set_speed(p, v)
        self._record("speed", port=p, gpu=int(self._port_gpu[p]), start_s=self._time_s,
                     end_s=None, mb_per_s=v, nominal_mb_per_s=float(self._nominal_speed_mb[p]))

    def restore_link_speed(self, port: PortRef) -> None:
        """``port`` back at its nominal speed from now; an open ``speed`` fault on it ends."""
        p = self._port(port)
        for f in self._faults:
            if f["kind"] == "speed" and f["port"] == p and f["end_s"] is None:
                f["end_s"] = self._time_s
        self._set_speed(p, float(self._nominal_speed_mb[p]))

    def _set_speed(self, p: int, mb: float) -> None:
        self._speed_mb[p] = mb
        self._speed_bytes[p] = mb * 1e6
        self._line_bits_per_s[p] = mb * 8e6

    # --- test and scenario seeding --------------------------------------------------------

    def set_counter(self, port: PortRef, counter: str, value: int) -> None:
        """Preset ``counter`` on ``port`` to ``value`` (e.g. a Counter32 near 2^32 for
        FIELD-CASES BR-11 a, or an aged counter at scenario start). Not a fault: not logged.

        Raises:
            ValueError: unknown counter, one the port's kind does not carry, or a value
                outside 0..2^bits − 1.
        """
        p = self._port(port)
        spec = _SPEC.get(counter)
        if spec is None:
            raise ValueError(f"unknown counter {counter!r}; counters: {COUNTER_NAMES}")
        if self._kind(p) not in spec.kinds:
            raise ValueError(f"{counter} is not a counter of {self._kind(p)} port "
                             f"{self._names[p]}")
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or not (
            0 <= int(value) <= spec.max_value
        ):
            raise ValueError(f"{counter} value must be an integer in 0..{spec.max_value} "
                             f"(got {value!r})")
        self._ctr[_ROW[counter], p] = np.uint64(int(value))
