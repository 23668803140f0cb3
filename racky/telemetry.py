"""What racky reads from the node agents, as arrays: tray readings and the rack's link frame.

Pure parsing (no I/O): the MQTT adapter hands each ``<agents>/telemetry/trayNN`` payload
(docs/SIMULATORS.md §4, ``sim.telemetry.tray`` schema) to `TelemetryIngest.tray_payload`, the
lock-step runner builds the same structures from the simulator directly. A malformed payload
raises `PayloadError` naming the key path; nothing of it is applied (the tray's previous
reading ages and goes stale, never re-used as fresh).

`LinkFrame` holds the latest read of every port in columns (shape (ports,) per quantity,
counters (counters, ports) as uint64 in their native width's range): the detectors work on
it with numpy alone. Ports are GPU-major (``gpu * ports_per_gpu + j``), the layout learnt
from the first tray message (every GPU must then carry the same number of ports).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


class PayloadError(ValueError):
    """A telemetry payload that cannot be used (the message names the key path)."""


class StaleMessage(PayloadError):
    """A well-formed payload that is not the tray's newest (retained, duplicate, reordered)."""


CLOCK_STEP_BACK_NS = 300 * 10**9
"""An agent ``ts_ns`` this much older than the tray's last one is a clock step, not a replay
(MQTT redelivers a QoS 1 message within seconds; 300 s leaves a wide margin)."""


@dataclass(frozen=True, slots=True)
class AgentReading:
    """A tray's node agent as reported (the enforced caps and settings in force)."""

    enforced_gpu_cap_w: float
    enforced_tray_cap_w: float
    floor_w: float
    power_cap_w: float | None
    gpu_power_cap_w: float | None
    power_floor_pct: float
    ramp_up_w_per_s: float | None
    ramp_down_w_per_s: float | None
    ramp_down_hysteresis_s: float
    capping: bool
    flooring: bool
    ramp_limited: bool


@dataclass(frozen=True, slots=True)
class TrayReading:
    """One tray's telemetry (W, °C); GPU arrays have shape (gpus_per_tray,)."""

    tray: int
    t_mono: float
    powered: bool
    power_w: float
    coolant_out_temp_c: float
    leak: bool
    leak_sensor_fault: bool
    agent: AgentReading
    gpu_index: npt.NDArray[np.int64]
    gpu_power_w: FloatArray
    gpu_demand_w: FloatArray
    gpu_temp_c: FloatArray
    gpu_t_limit_c: FloatArray
    gpu_throttled: BoolArray
    gpu_shut_down: BoolArray
    gpu_traffic: FloatArray
    gpu_uptime_s: FloatArray
    gpu_boot_id: npt.NDArray[np.uint64]


@dataclass
class TrayTable:
    """Tray readings as arrays for one tick: per tray (trays,) ``fresh``, ``reported``
    (a reading exists), ``powered``, ``power_w``, ``capping``, ``enforced_tray_cap_w`` (NaN
    unknown), ``outlet_c``; per GPU (gpus,) ``gpu_power_w``, ``gpu_demand_w``, ``gpu_temp_c``,
    ``gpu_t_limit_c``, ``gpu_throttled``, ``gpu_on`` (fresh, tray powered, not shut down)."""

    fresh: BoolArray
    reported: BoolArray
    powered: BoolArray
    power_w: FloatArray
    capping: BoolArray
    enforced_tray_cap_w: FloatArray
    outlet_c: FloatArray
    gpu_power_w: FloatArray
    gpu_demand_w: FloatArray
    gpu_temp_c: FloatArray
    gpu_t_limit_c: FloatArray
    gpu_throttled: BoolArray
    gpu_on: BoolArray

    @classmethod
    def build(cls, readings: Mapping[int, TrayReading], n_trays: int, gpus_per_tray: int,
              now: float, stale_after_s: float) -> TrayTable:
        """Gather ``readings`` (tray -> reading) into arrays (a reading older than
        ``stale_after_s`` at ``now`` is not fresh)."""
        n_g = n_trays * gpus_per_tray
        t = cls(
            fresh=np.zeros(n_trays, dtype=bool), reported=np.zeros(n_trays, dtype=bool),
            powered=np.zeros(n_trays, dtype=bool), power_w=np.zeros(n_trays),
            capping=np.zeros(n_trays, dtype=bool), enforced_tray_cap_w=np.full(n_trays, np.nan),
            outlet_c=np.full(n_trays, np.nan), gpu_power_w=np.full(n_g, np.nan),
            gpu_demand_w=np.full(n_g, np.nan), gpu_temp_c=np.full(n_g, np.nan),
            gpu_t_limit_c=np.full(n_g, np.nan), gpu_throttled=np.zeros(n_g, dtype=bool),
            gpu_on=np.zeros(n_g, dtype=bool),
        )
        for k, r in readings.items():
            if not 0 <= k < n_trays:
                continue
            t.reported[k] = True
            t.powered[k] = r.powered
            t.power_w[k] = r.power_w
            if now - r.t_mono > stale_after_s:
                continue
            t.fresh[k] = True
            t.capping[k] = r.agent.capping
            t.enforced_tray_cap_w[k] = r.agent.enforced_tray_cap_w
            t.outlet_c[k] = r.coolant_out_temp_c
            g = slice(k * gpus_per_tray, (k + 1) * gpus_per_tray)
            t.gpu_power_w[g] = r.gpu_power_w
            t.gpu_demand_w[g] = r.gpu_demand_w
            t.gpu_temp_c[g] = r.gpu_temp_c
            t.gpu_t_limit_c[g] = r.gpu_t_limit_c
            t.gpu_throttled[g] = r.gpu_throttled
            t.gpu_on[g] = r.powered & ~r.gpu_shut_down
        return t


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
    f = float(v)
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
        if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x) or (
                non_negative and x < 0):
            raise PayloadError(f"{path}[{i}]: {x!r} is not a finite"
                               f"{' non-negative' if non_negative else ''} number")


@dataclass
class TelemetryIngest:
    """Parses node-agent telemetry into `TrayReading` s and the rack's `LinkFrame`.

    Args:
        n_trays, gpus_per_tray: rack geometry (config ``node_agents``).
        counter_names: the link counters to keep (config ``links.counters``), frame rows.
    """

    n_trays: int
    gpus_per_tray: int
    counter_names: tuple[str, ...]
    trays: dict[int, TrayReading] = field(default_factory=dict)
    frame: LinkFrame | None = None
    errors: int = 0
    stale_messages: int = 0
    clock_steps: int = 0
    last_ts_ns: dict[int, int] = field(default_factory=dict)

    def tray_payload(self, payload: Any, t_mono: float, *, retained: bool = False,
                     expected_tray: int | None = None) -> TrayReading:
        """Parse one ``telemetry/trayNN`` payload received at ``t_mono`` (monotonic s); store it
        and write its ports into the link frame.

        Freshness comes from the receive time, so a message that is not the agent's newest is
        refused rather than taken as fresh: a retained copy (``retained``, the broker's store,
        of unknown age) and a message whose ``ts_ns`` (the agent's timestamp) is not newer
        than the last accepted one of that tray (a duplicate, or one overtaken by a newer
        message) raise `StaleMessage`; its counters would otherwise run backwards. A ``ts_ns``
        more than `CLOCK_STEP_BACK_NS` older than the last one is an agent clock stepped back
        (NTP, a restart): accepted, counted in ``clock_steps``. ``expected_tray`` (the tray
        the topic names) must match the payload's ``tray``: a misconfigured agent never
        overwrites another tray's reading.

        Raises:
            PayloadError: anything unusable (nothing is applied then); `StaleMessage` for the
                cases above (counted in ``stale_messages``, not in ``errors``).
        """
        if retained:
            self.stale_messages += 1
            raise StaleMessage("retained telemetry (from the broker's store, age unknown)")
        try:
            reading, ports = self._parse(payload, t_mono)
            if expected_tray is not None and reading.tray != expected_tray:
                raise PayloadError(f"tray: {reading.tray} in a message on tray "
                                   f"{expected_tray}'s topic")
        except PayloadError:
            self.errors += 1
            raise
        ts = payload.get("ts_ns")
        if isinstance(ts, int) and not isinstance(ts, bool):
            last = self.last_ts_ns.get(reading.tray)
            if last is not None and ts <= last:
                if last - ts <= CLOCK_STEP_BACK_NS:
                    self.stale_messages += 1
                    raise StaleMessage("ts_ns not newer than the tray's last message "
                                       "(duplicate or out of order)")
                self.clock_steps += 1
            self.last_ts_ns[reading.tray] = ts
        if ports:
            self._write_ports(ports, t_mono)
        self.trays[reading.tray] = reading
        return reading

    def _parse(self, p: Any, t_mono: float) -> tuple[TrayReading, list[_PortBlock]]:
        if not isinstance(p, dict):
            raise PayloadError("payload: not a JSON object")
        tray = p.get("tray")
        if isinstance(tray, bool) or not isinstance(tray, int) or not 0 <= tray < self.n_trays:
            raise PayloadError(f"tray: {tray!r} is not a tray index 0..{self.n_trays - 1}")
        a = p.get("agent")
        if not isinstance(a, dict):
            raise PayloadError("agent: missing")
        agent = AgentReading(
            enforced_gpu_cap_w=_num(a, "enforced_gpu_cap_w", "agent"),
            enforced_tray_cap_w=_num(a, "enforced_tray_cap_w", "agent"),
            floor_w=_num(a, "floor_w", "agent", optional=True),
            power_cap_w=_opt(a, "power_cap_w", "agent"),
            gpu_power_cap_w=_opt(a, "gpu_power_cap_w", "agent"),
            power_floor_pct=_num(a, "power_floor_pct", "agent", optional=True),
            ramp_up_w_per_s=_opt(a, "ramp_up_w_per_s", "agent"),
            ramp_down_w_per_s=_opt(a, "ramp_down_w_per_s", "agent"),
            ramp_down_hysteresis_s=_num(a, "ramp_down_hysteresis_s", "agent", optional=True),
            capping=_bool(a, "capping", "agent", False),
            flooring=_bool(a, "flooring", "agent", False),
            ramp_limited=_bool(a, "ramp_limited", "agent", False),
        )
        gl = _list(p, "gpus", "payload", self.gpus_per_tray)
        g = self.gpus_per_tray
        idx = np.zeros(g, dtype=np.int64)
        cols: dict[str, FloatArray] = {k: np.full(g, np.nan) for k in (
            "power_w", "demand_w", "temp_c", "t_limit_c", "traffic", "uptime_s")}
        thr = np.zeros(g, dtype=bool)
        down = np.zeros(g, dtype=bool)
        boot = np.zeros(g, dtype=np.uint64)
        ports: list[tuple[int, dict[str, Any], float, int]] = []
        for i, gp in enumerate(gl):
            path = f"gpus[{i}]"
            if not isinstance(gp, dict):
                raise PayloadError(f"{path}: not an object")
            gi = gp.get("gpu")
            lo = tray * g
            if isinstance(gi, bool) or not isinstance(gi, int) or not lo <= gi < lo + g:
                raise PayloadError(f"{path}.gpu: {gi!r} is not a GPU of tray {tray}")
            idx[i] = gi
            cols["power_w"][i] = _watts(gp, "power_w", path)
            cols["demand_w"][i] = _watts(gp, "demand_w", path, optional=True)
            cols["temp_c"][i] = _num(gp, "temp_c", path, optional=True)
            cols["t_limit_c"][i] = _num(gp, "t_limit_c", path, optional=True)
            cols["traffic"][i] = _num(gp, "traffic", path, optional=True)
            cols["uptime_s"][i] = _num(gp, "uptime_s", path, optional=True)
            thr[i] = _bool(gp, "throttled", path, False)
            down[i] = _bool(gp, "shut_down", path, False)
            b = gp.get("boot_id")
            if b is not None:
                if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < 2**64:
                    raise PayloadError(f"{path}.boot_id: not an unsigned 64-bit integer")
                boot[i] = np.uint64(b)
            pb = gp.get("ports")
            if pb is not None:
                if not isinstance(pb, dict):
                    raise PayloadError(f"{path}.ports: not an object")
                ports.append((gi, pb, cols["uptime_s"][i], int(boot[i])))
        reading = TrayReading(
            tray=tray, t_mono=float(t_mono), powered=_bool(p, "powered", "payload"),
            power_w=_watts(p, "power_w", "payload"),
            coolant_out_temp_c=_num(p, "coolant_out_temp_c", "payload", optional=True),
            leak=_bool(p, "leak", "payload", False),
            leak_sensor_fault=_bool(p, "leak_sensor_fault", "payload", False), agent=agent,
            gpu_index=idx, gpu_power_w=cols["power_w"], gpu_demand_w=cols["demand_w"],
            gpu_temp_c=cols["temp_c"], gpu_t_limit_c=cols["t_limit_c"], gpu_throttled=thr,
            gpu_shut_down=down, gpu_traffic=cols["traffic"], gpu_uptime_s=cols["uptime_s"],
            gpu_boot_id=boot,
        )
        # port blocks are checked (and their counters converted) now, written after (all or
        # nothing)
        checked = [(gi, pb, up, bt, self._check_ports(gi, pb)) for gi, pb, up, bt in ports]
        return reading, checked

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
                continue
            col = _u64_column(vals, n)
            if col is None:
                raise PayloadError(f"{path}.counters.{name}: expected {n} unsigned integers")
            parsed[name] = col
        return parsed

    def _write_ports(self, ports: list[_PortBlock], t: float) -> None:
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

    def update_gpu_columns(self) -> None:
        """Copy the trays' per-GPU traffic and power into the frame (once per tick)."""
        f = self.frame
        if f is None:
            return
        for r in self.trays.values():
            f.gpu_traffic[r.gpu_index] = r.gpu_traffic
            f.gpu_power_w[r.gpu_index] = r.gpu_power_w
