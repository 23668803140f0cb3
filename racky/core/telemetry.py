"""What racky reads from the node agents, as arrays: tray readings and the rack's link frame.

Pure parsing (no I/O): the MQTT adapter hands each ``<agents>/telemetry/trayNN`` payload
(docs/SIMULATORS.md §4, ``sim.telemetry.tray`` schema) to `TelemetryIngest.tray_payload`, the
lock-step runner builds the same structures from the simulator directly. A malformed payload
raises `PayloadError` naming the key path; nothing of it is applied (the tray's previous
reading ages and goes stale, never re-used as fresh). The payload contract is
`rackplane.core.tray_contract` (one definition, shared with the simulator).

Speed (issue 8, receive path; bench ``bench.receive``): a tray message is ~13 kB of JSON with
~1,700 values, at up to ~150 messages/s per rack host. `decode_payload` decodes and
type-checks it in one pass into the contract's msgspec Struct (`rackplane.core.tray_contract.
decode_tray`, generated from the pydantic models); the typed path (`TelemetryIngest.
_parse_struct`: value checks and one numpy conversion per kind of column over the whole tray)
only ever *accepts*. A payload that is not the contract (a wrong type, a missing required or
an unknown field: the Struct decode fails) is refused at once with msgspec's key path; when
the typed path cannot vouch for a payload of the contract's shape (a non-finite, negative or
out-of-range value, a repeated GPU index, a missing counter), the per-field value checks
(the reference, which name the key path) decide. The two agree exactly
(tests/unit/test_racky_telemetry.py compares them on hundreds of mutated payloads).

The link frame (`LinkFrame`) and the port half of the checks are `racky.core.linkframe`.

Node-agent contract v1 (docs/CONTRACTS.md): racky reads only what an agent can observe. The
GPU demand the cap loop needs is inferred (`infer_gpu_demand_w`: the power, or more than the
cap for a GPU whose clock-event reasons include the power cap); a newer minor version's
extra fields are ignored and their key paths kept in ``TelemetryIngest.ignored_fields``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from rackplane.core.tray_contract import (
    POWER_CAP_REASONS,
    SCHEMA_VERSION,
    THERMAL_REASONS,
    AgentStruct,
    DecodedTray,
    NotJsonError,
    TrayShapeError,
    UnsupportedVersion,
    convert_tray,
    decode_tray,
    is_tray_struct,
    struct_to_builtins,
)
from racky.core.linkframe import (
    BoolArray,
    FloatArray,
    LinkFrame,
    PayloadError,
    PortIngest,
    _agent_num,
    _bool,
    _float_column,
    _list,
    _num,
    _PortBlock,
    _TrayPorts,
    _watts,
)

__all__ = ["CAPPED_DEMAND_FACTOR", "CLOCK_STEP_BACK_NS", "TS_NS_MAX", "AgentReading",
           "StaleMessage", "TelemetryIngest", "TrayReading",
           "TrayTable", "decode_payload", "infer_gpu_demand_w"]

class StaleMessage(PayloadError):
    """A well-formed payload that is not the tray's newest (retained, duplicate, reordered)."""


CLOCK_STEP_BACK_NS = 300 * 10**9
"""An agent ``ts_ns`` this much older than the tray's last one is a clock step, not a replay
(MQTT redelivers a QoS 1 message within seconds; 300 s leaves a wide margin)."""


TS_NS_MAX = 2**63 - 1
"""Largest ``ts_ns`` racky accepts (a signed 64-bit ns count since the epoch, as agents keep
it; a ``ts_ns`` must be an integer in [0, TS_NS_MAX])."""


AgentReading = AgentStruct
"""A tray's node agent as reported (the enforced caps and settings in force): the contract's
``AgentTelemetry`` as its frozen msgspec Struct (`rackplane.core.tray_contract.AgentStruct`: same
fields, keyword construction), the decoded block itself, or rebuilt by the per-field checks
(null caps and ramp limits: None)."""


def decode_payload(raw: bytes) -> DecodedTray:
    """A tray message's bytes (UTF-8 JSON) as the contract's `TrayStruct` in a `DecodedTray`
    (decoded and type-checked in one pass by msgspec, ~25 µs for 13 kB, the speed of a plain
    JSON decode; with the fields a newer minor version added, ignored), which
    `TelemetryIngest.tray_payload` then checks for values.

    Strict as the contract (`rackplane.core.tray_contract.TrayTelemetry`): every required field
    present (``leak``, ``ts_ns``, every agent field …), types as the models say (an int is
    accepted for a float; ``1.5`` or ``"1"`` is not an int), unknown fields refused unless
    ``schema_version`` is a newer minor version of major 1, another major refused. NaN /
    Infinity literals, numbers that overflow a double, invalid UTF-8 and nesting too deep to
    decode are not JSON. A repeated key is not detected: its last value wins (msgspec).

    Raises:
        PayloadError: not valid JSON, another major version of the contract, or not the
            contract (msgspec's message names the key path, e.g. ``Object missing required
            field `leak```, ``... - at `$.ts_ns```); nothing is applied.
    """
    try:
        return decode_tray(raw)
    except TrayShapeError as err:
        raise PayloadError(f"payload: not the tray contract ({err})") from None
    except UnsupportedVersion as err:
        raise PayloadError(f"payload: unsupported contract version ({err})") from None
    except NotJsonError as err:
        raise PayloadError(f"payload: not valid JSON ({err})") from None


CAPPED_DEMAND_FACTOR = 1.1
"""A GPU held at its cap (the power-cap clock-event reason) wants at least its cap: racky
takes its demand as this × max(power, enforced cap), so a capped tray's share can grow (the
cap loop's ramp limits how fast)."""


def infer_gpu_demand_w(power_w: FloatArray, enforced_gpu_cap_w: float,
                       power_capped: BoolArray) -> FloatArray:
    """Per-GPU demand, W, from what an agent can observe (no agent can measure demand): a
    GPU whose clock-event reasons include the power cap (``sw_power_cap``) is demand-limited,
    demand >= its enforced cap, taken as `CAPPED_DEMAND_FACTOR` × max(power, cap); any other
    GPU's demand is its power (a thermally throttled or ramp-limited GPU may want more: racky
    cannot tell). NaN power stays NaN.

    Args:
        power_w: per-GPU power, W, shape (gpus,); enforced_gpu_cap_w: the agent's per-GPU
            limit, W; power_capped: per GPU, the power-cap reason is active.
    """
    capped = np.maximum(power_w, enforced_gpu_cap_w) * CAPPED_DEMAND_FACTOR
    out: FloatArray = np.where(power_capped, capped, power_w)
    return out


def _reason_flags(reasons: list[list[str]]) -> tuple[BoolArray, BoolArray]:
    """(thermal slowdown, power capped) per GPU from its clock-event reason names."""
    thr = np.array([not THERMAL_REASONS.isdisjoint(r) for r in reasons], dtype=bool)
    cap = np.array([not POWER_CAP_REASONS.isdisjoint(r) for r in reasons], dtype=bool)
    return thr, cap


@dataclass(frozen=True, slots=True)
class TrayReading:
    """One tray's telemetry (W, °C); GPU arrays have shape (gpus_per_tray,).
    ``gpu_demand_w`` is racky's inference (`infer_gpu_demand_w`), never a reported figure;
    ``gpu_throttled``: a thermal / HW slowdown reason is active (`THERMAL_REASONS`);
    ``gpu_power_capped``: the power-cap reason is active; ``gpu_traffic``: the GPU's
    utilisation (0..1, NaN unknown), the traffic the link checks expect."""

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
    gpu_power_capped: BoolArray = field(default_factory=lambda: np.zeros(0, dtype=bool))


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


_GPU_NUMS = ("power_w", "temp_c", "t_limit_c", "utilization", "uptime_s")
"""A GPU's numbers, rows of the per-GPU column array (power_w required and >= 0, all finite,
the others null / absent: unknown, NaN)."""

_Gpus = tuple[npt.NDArray[np.int64], FloatArray, list[list[str]], BoolArray,
              npt.NDArray[np.uint64], list[tuple[int, dict[str, Any], float, int]]]
"""A tray's checked GPUs: (index, columns (len(_GPU_NUMS), gpus), clock-event reasons, shut
down, boot id, port blocks (GPU, block, uptime s, boot id) of the GPUs that carry one)."""

_AGENT_NUMS = ("enforced_gpu_cap_w", "enforced_tray_cap_w", "floor_w", "power_floor_pct",
               "ramp_down_hysteresis_s", "power_cap_w", "gpu_power_cap_w", "ramp_up_w_per_s",
               "ramp_down_w_per_s", "cap_expires_in_s", "safe_gpu_cap_w")
"""The agent block's numbers (finite and >= 0 when given; those from the sixth on may be
null or absent)."""

EPOCH_MAX = 2**63 - 1
"""Largest command epoch an agent may report (a signed 64-bit count)."""



@dataclass
class TelemetryIngest(PortIngest):
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
    ignored_fields: set[str] = field(default_factory=set)
    newest_version: str = SCHEMA_VERSION

    @property
    def ignored_field_count(self) -> int:
        """Distinct fields (key paths, e.g. ``gpus[].fan_rpm``) racky accepted and ignored in
        messages of a newer minor contract version: each counted once (``state/health``)."""
        return len(self.ignored_fields)

    def tray_payload(self, payload: Any, t_mono: float, *, retained: bool = False,
                     expected_tray: int | None = None) -> TrayReading:
        """Parse one ``telemetry/trayNN`` payload received at ``t_mono`` (monotonic s); store it
        and write its ports into the link frame. ``payload``: what `decode_payload` returns (a
        `DecodedTray`; a bare `TrayStruct` too), or the plain JSON objects (a dict, as the
        lock-step runner passes the simulator's payloads; type-checked with `convert_tray`,
        ~9 µs). The fields of a newer minor version it ignored are added to
        ``ignored_fields`` once the message is accepted.

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
            PayloadError: anything unusable (nothing is applied then; counted in ``errors``):
                not the contract (a plain dict is converted with `convert_tray`, as strict as
                `decode_payload`), another major version,
                ``ts_ns`` outside [0, `TS_NS_MAX`], a tray or GPU index
                out of range or repeated, a non-finite number, a negative power / rate / BER /
                agent figure, a counter of ``counter_names`` missing or outside [0, 2**64),
                wrong list lengths; `StaleMessage` for the cases above (counted in
                ``stale_messages``, not in ``errors``).
        """
        if retained:
            self.stale_messages += 1
            raise StaleMessage("retained telemetry (from the broker's store, age unknown)")
        try:
            reading, ports, ts, ignored, version = self._parse_any(payload, t_mono)
            if expected_tray is not None and reading.tray != expected_tray:
                raise PayloadError(f"tray: {reading.tray} in a message on tray "
                                   f"{expected_tray}'s topic")
        except PayloadError:
            self.errors += 1
            raise
        last = self.last_ts_ns.get(reading.tray)
        if last is not None and ts <= last:
            if last - ts <= CLOCK_STEP_BACK_NS:
                self.stale_messages += 1
                raise StaleMessage("ts_ns not newer than the tray's last message "
                                   "(duplicate or out of order)")
            self.clock_steps += 1
        self.last_ts_ns[reading.tray] = ts
        if ignored:
            self.ignored_fields |= ignored
            self.newest_version = version
        if ports:
            self._write_ports(ports, t_mono)
        self.trays[reading.tray] = reading
        return reading

    def _parse_any(self, payload: Any, t_mono: float
                   ) -> tuple[TrayReading, _TrayPorts | list[_PortBlock], int, frozenset[str],
                              str]:
        """(reading, ports, the agent's ``ts_ns``, the ignored fields, the version) from a
        `DecodedTray` / `TrayStruct` (as `decode_payload` returns) or plain JSON: refused
        naming msgspec's key path unless it is the contract (`convert_tray`); then the typed
        path when it can vouch for the values, else the per-field value checks (which refuse
        naming the key path)."""
        ignored: frozenset[str] = frozenset()
        if isinstance(payload, DecodedTray):
            payload, ignored = payload
        if is_tray_struct(payload):
            m: Any = payload
        elif isinstance(payload, dict):
            try:
                m, ignored = convert_tray(payload)
            except TrayShapeError as err:
                raise PayloadError(f"payload: not the tray contract ({err})") from None
            except UnsupportedVersion as err:
                raise PayloadError(f"payload: unsupported contract version ({err})") from None
        else:
            raise PayloadError("payload: not a JSON object")
        ts = m.ts_ns  # an int (msgspec refuses a bool or a float there)
        if not 0 <= ts <= TS_NS_MAX:
            raise PayloadError(f"ts_ns: {ts!r} is not in [0, 2**63) ns since the epoch")
        out = self._parse_struct(m, t_mono)
        if out is not None:
            return out[0], out[1], ts, ignored, m.schema_version
        reading, ports = self._parse(payload if payload is not m and not ignored
                                     else struct_to_builtins(m), t_mono)
        return reading, ports, ts, ignored, m.schema_version

    def _parse_struct(self, m: Any, t_mono: float
                      ) -> tuple[TrayReading, _TrayPorts | list[_PortBlock]] | None:
        """The typed path: a `TrayStruct` (types already checked by msgspec) checked for
        values (tray and GPU indices, finite numbers, powers, rates and BER >= 0, one port
        count, counters in [0, 2**64)) per quantity over the whole tray. None when it cannot
        vouch for the payload (it never refuses; the per-field checks then decide). Accepts,
        and builds, exactly what `_parse` does when it returns a value."""
        tray = m.tray
        g = self.gpus_per_tray
        gl = m.gpus
        if not 0 <= tray < self.n_trays or len(gl) != g or not g:
            return None
        agent = m.agent
        for key in _AGENT_NUMS:
            x = getattr(agent, key)
            if x is not None and not (math.isfinite(x) and x >= 0):
                return None
        if agent.epoch is not None and not 0 <= agent.epoch <= EPOCH_MAX:
            return None
        power_w = m.power_w
        if not (math.isfinite(power_w) and power_w >= 0 and math.isfinite(m.coolant_out_temp_c)):
            return None
        gis = [x.gpu for x in gl]
        lo = tray * g
        if min(gis) < lo or max(gis) >= lo + g or len(set(gis)) != g:
            return None  # out of the tray's range, or a GPU repeated (and so another missing)
        arr = _float_column([x.power_w for x in gl] + [x.temp_c for x in gl]
                            + [x.t_limit_c for x in gl] + [x.utilization for x in gl]
                            + [x.uptime_s for x in gl],
                            nullable=True, non_negative=False)
        if arr is None:
            return None
        cols = arr.reshape(len(_GPU_NUMS), g)
        if not (cols[0] >= 0).all():
            return None  # a negative power, or a null one
        boots = [x.boot_id for x in gl]
        for b in boots:
            if b is not None and not 0 <= b < 2**64:
                return None
        boot = np.array([0 if b is None else b for b in boots], dtype=np.uint64)
        thr, capped = _reason_flags([x.throttle_reasons for x in gl])
        reading = TrayReading(
            tray=tray, t_mono=float(t_mono), powered=m.powered, power_w=power_w,
            coolant_out_temp_c=m.coolant_out_temp_c, leak=m.leak,
            leak_sensor_fault=m.leak_sensor_fault, agent=agent,
            gpu_index=np.array(gis, dtype=np.int64), gpu_power_w=cols[0],
            gpu_demand_w=infer_gpu_demand_w(cols[0], agent.enforced_gpu_cap_w, capped),
            gpu_temp_c=cols[1], gpu_t_limit_c=cols[2], gpu_throttled=thr,
            gpu_shut_down=np.array([x.shut_down for x in gl], dtype=bool),
            gpu_traffic=cols[3], gpu_uptime_s=cols[4], gpu_boot_id=boot,
            gpu_power_capped=capped,
        )
        pbs = [x.ports for x in gl]
        n_none = pbs.count(None)
        if n_none == g:
            return reading, []
        if n_none:
            return None  # some GPUs without ports: the per-block checks
        tp = self._ports_struct(gis, pbs, cols[4], boot)
        return None if tp is None else (reading, tp)

    def _parse(self, p: Any, t_mono: float) -> tuple[TrayReading, _TrayPorts | list[_PortBlock]]:
        """The per-field checks (the reference the typed path must agree with)."""
        if not isinstance(p, dict):
            raise PayloadError("payload: not a JSON object")
        tray = p.get("tray")
        if isinstance(tray, bool) or not isinstance(tray, int) or not 0 <= tray < self.n_trays:
            raise PayloadError(f"tray: {tray!r} is not a tray index 0..{self.n_trays - 1}")
        a = p.get("agent")
        if not isinstance(a, dict):
            raise PayloadError("agent: missing")
        nums = {k: _agent_num(a, k, nullable=k in _AGENT_NUMS[5:]) for k in _AGENT_NUMS}
        epoch = a.get("epoch")
        if epoch is not None and (isinstance(epoch, bool) or not isinstance(epoch, int)
                                  or not 0 <= epoch <= EPOCH_MAX):
            raise PayloadError(f"agent.epoch: {epoch!r} is not an integer in [0, 2**63)")
        agent = AgentReading(
            **nums,  # the required ones are never None (`_agent_num` raises)
            capping=_bool(a, "capping", "agent"),
            flooring=_bool(a, "flooring", "agent"),
            ramp_limited=_bool(a, "ramp_limited", "agent"),
            epoch=epoch,
        )
        gl = _list(p, "gpus", "payload", self.gpus_per_tray)
        idx, cols, reasons, down, boot, blocks = self._gpus_checked(gl, tray)
        thr, capped = _reason_flags(reasons)
        reading = TrayReading(
            tray=tray, t_mono=float(t_mono), powered=_bool(p, "powered", "payload"),
            power_w=_watts(p, "power_w", "payload"),
            coolant_out_temp_c=_num(p, "coolant_out_temp_c", "payload"),
            leak=_bool(p, "leak", "payload"),
            leak_sensor_fault=_bool(p, "leak_sensor_fault", "payload"), agent=agent,
            gpu_index=idx, gpu_power_w=cols[0],
            gpu_demand_w=infer_gpu_demand_w(cols[0], agent.enforced_gpu_cap_w, capped),
            gpu_temp_c=cols[1], gpu_t_limit_c=cols[2], gpu_throttled=thr,
            gpu_shut_down=down, gpu_traffic=cols[3], gpu_uptime_s=cols[4],
            gpu_boot_id=boot, gpu_power_capped=capped,
        )
        if not blocks:
            return reading, []
        # port blocks are checked (and their counters converted) now, written after (all or
        # nothing)
        checked = [(gi, pb, up, bt, self._check_ports(gi, pb)) for gi, pb, up, bt in blocks]
        if self.frame is None and len({len(pb["names"]) for _, pb, _, _, _ in checked}) > 1:
            raise PayloadError("gpus[*].ports: the GPUs carry different numbers of ports")
        return reading, checked

    def _gpus_checked(self, gl: list[Any], tray: int) -> _Gpus:
        """The per-GPU checks (the reference the fast path must agree with)."""
        g = self.gpus_per_tray
        idx = np.zeros(g, dtype=np.int64)
        cols = np.full((len(_GPU_NUMS), g), np.nan)
        reasons: list[list[str]] = [[] for _ in range(g)]
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
            if gi in idx[:i]:
                raise PayloadError(f"{path}.gpu: {gi} repeats an earlier GPU of the tray "
                                   "(and so another GPU is missing)")
            idx[i] = gi
            cols[0, i] = _watts(gp, "power_w", path)
            for r, key in enumerate(_GPU_NUMS[1:], 1):
                cols[r, i] = _num(gp, key, path, optional=True)
            rs = gp.get("throttle_reasons")
            if not isinstance(rs, list) or not all(isinstance(x, str) for x in rs):
                raise PayloadError(f"{path}.throttle_reasons: expected a list of strings")
            reasons[i] = rs
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
                ports.append((gi, pb, float(cols[4, i]), int(boot[i])))
        return idx, cols, reasons, down, boot, ports


    def update_gpu_columns(self) -> None:
        """Copy the trays' per-GPU traffic and power into the frame (once per tick)."""
        f = self.frame
        if f is None:
            return
        for r in self.trays.values():
            f.gpu_traffic[r.gpu_index] = r.gpu_traffic
            f.gpu_power_w[r.gpu_index] = r.gpu_power_w
