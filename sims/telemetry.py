"""The virtual rack's MQTT payloads: pydantic models, builders and their JSON Schemas.

Topics are under ``<root>/<site>/<rack>/sim/`` (`rackplane.io.mqtt.Topics`, DESIGN §3; the row
is in every payload). Telemetry is QoS 0, one message per thing per interval (1 s):

=========================  ====================================  ==============================
topic                      payload model                         what
=========================  ====================================  ==============================
``telemetry/plant``        `PlantTelemetry`                      CDU truth + scenario inputs
                                                                 (the first simulator's topic)
``telemetry/rack``         `RackTelemetry`                       rack totals, leaks, coolant
``telemetry/trayNN``       `TrayTelemetry`                       one compute tray (NN = 00..17):
                                                                 its node agent, 4 GPUs and
                                                                 their link ports (the
                                                                 node-agent contract v1: only
                                                                 what an agent can observe)
``telemetry/truth``        `TruthTelemetry`                      the trays' simulator truth
                                                                 (plant time, demand, cold-plate
                                                                 fouling; never in the contract)
``telemetry/power``        `PowerTelemetry`                      power shelves and PSUs
``telemetry/env``          `EnvTelemetry`                        room air and dew point
``state/scenario``         `ScenarioState` (retained)            scenario progress
``state/faults``           `FaultsState` (retained)              injected faults (ground truth)
``state/faces``            `FacesState` (retained)               Modbus faces: ports and units
``state/node_agents``      `NodeAgentsState` (retained)          every tray's agent settings
``cmd/<user>/set_power_limits``  args `SetPowerLimitsArgs`       node-agent command v1 (racky)
``cmd/<user>/get_power_limits``  args `GetPowerLimitsArgs`       read the agents
=========================  ====================================  ==============================

Commands use rackplane's envelope and reply (``rackplane/schemas/command-*.schema.json``,
`rackplane.commands`). Numbers are JSON numbers; a value that is not known (a dropped
sensor, BER before any traffic) is ``null``, never NaN (DESIGN §3). Tray, GPU, shelf and PSU
indices are 0-based (GPU ``g`` is on tray ``g // 4``; port names are the fabric's,
``gpu07/nvl03``).

The node-agent tray contract v1 (`TrayTelemetry`, `AgentTelemetry`, `GpuTelemetry`, `PortBlock`)
is defined once in `rackplane.core.tray_contract` (racky reads it too) and re-exported here; the
command side is `SetPowerLimitsArgs` (caps with a TTL, the sender's epoch, ``release`` instead
of null), applied by `apply_power_limits` (the runtime's handler, and the lock-step harness).

``rackctl schemas --write`` regenerates ``sims/schemas/*.schema.json`` (through the one
generator, `rackplane.schemagen`); ``rackctl schemas --check`` exits 1 when one is stale (a
test does the same).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rackplane.commands import CommandArgs, args_refusal_code
from rackplane.core.tray_contract import (
    SCHEMA_VERSION,
    AgentTelemetry,
    GpuTelemetry,
    PortBlock,
    TrayTelemetry,
    no_null_defaults,
)
from rackplane.core.tray_contract import SetPowerLimitsArgs as ContractSetPowerLimitsArgs
from rackplane.core.tray_reply import SetPowerLimitsReply
from rackplane.errors import CommandError
from rackplane.schemagen import schema_documents_of, stale_documents, write_documents
from rackplane.settings import Identity
from sims.rack import StaleEpoch
from sims.row import VirtualRack

__all__ = [
    "SCHEMA_DIR",
    "AgentTelemetry",
    "EnvTelemetry",
    "FacesState",
    "FaultsState",
    "GetPowerLimitsArgs",
    "GpuTelemetry",
    "NodeAgentsState",
    "PlantTelemetry",
    "PortBlock",
    "PowerTelemetry",
    "RackTelemetry",
    "ScenarioState",
    "SetPowerLimitsArgs",
    "TrayTelemetry",
    "TruthTelemetry",
    "apply_power_limits",
    "finite_or_none",
    "schema_documents",
    "stale_schemas",
    "truth_payload",
    "write_schemas",
]

SCHEMA_DIR = Path(__file__).with_name("schemas")
"""Where the committed ``sim.*.schema.json`` files live."""


def finite_or_none(v: Any) -> float | None:
    """``v`` as a float, or None when it is None, NaN or infinite (JSON has no NaN)."""
    if v is None:
        return None
    f = float(v)
    return f if math.isfinite(f) else None


class _Payload(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Stamped(_Payload):
    ts_ns: int = Field(description="wall-clock timestamp, ns since the epoch")
    t_s: float = Field(description="plant time, s since the scenario started")
    site: str
    row: str
    rack: str


# --- telemetry ---------------------------------------------------------------------------------


class PlantTelemetry(_Payload):
    """``telemetry/plant``: CDU truth and scenario inputs (unchanged from the first CDU
    simulator; rackctl demo and the integration tests read it)."""

    model_config = ConfigDict(title="sim telemetry/plant")

    t_s: float
    rack_power_w: float
    facility_supply_temp_c: float
    supply_temp_c: float
    return_temp_c: float
    flow_lpm: float
    valve_position_pct: float
    valve_command_pct: float
    hottest_gpu_tj_c: float
    local_control: bool
    ts_ns: int


class LeakTelemetry(_Payload):
    """Rack-level leak sensors (REFERENCE §4.2 item 9; DSX RackLeakDetect / ...SensorFault)."""

    rope_leak: bool
    rope_sensor_fault: bool
    drip_pan_leak: bool
    drip_pan_sensor_fault: bool
    leaking_trays: list[int] = Field(description="trays whose sensor reads wet")
    faulted_tray_sensors: list[int]
    leak_lpm: float = Field(description="true total leak rate (simulator truth), L/min")
    leaked_l: float = Field(description="true volume lost so far (simulator truth), L")


class RackTelemetry(_Stamped):
    """``telemetry/rack``: the rack's totals (true values)."""

    model_config = ConfigDict(title="sim telemetry/rack")

    it_power_w: float = Field(description="IT power drawn (after throttling), W")
    it_power_demand_w: float = Field(description="node agents' requests, W")
    liquid_heat_kw: float
    air_heat_kw: float
    switch_power_w: float
    gpus_throttled: int
    gpus_shut_down: int
    trays_powered: int
    hottest_gpu_temp_c: float
    min_t_limit_c: float = Field(description="smallest T.Limit margin, K (REFERENCE §1.6)")
    inventory_l: float
    loop_pressure_kpa: float
    rack_inlet_temp_c: float
    rack_outlet_temp_c: float
    flow_lpm: float
    brownout: bool
    leak: LeakTelemetry


class PsuTelemetry(_Payload):
    psu: int
    input_w: float
    output_w: float
    temp_c: float
    available_w: float
    status: int = Field(description="bits: sims.power.PSU_STATUS_BITS")


class ShelfTelemetry(_Payload):
    shelf: int
    feed: int
    input_w: float
    output_w: float
    available_w: float
    ac_voltage_v: float
    status: int = Field(description="bits: sims.power.SHELF_STATUS_BITS")
    psus: list[PsuTelemetry]


class PowerTelemetry(_Stamped):
    """``telemetry/power``: the shelves (REFERENCE §1.2) and redundancy (§5 S10)."""

    model_config = ConfigDict(title="sim telemetry/power")

    load_w: float
    input_w: float
    output_w: float
    loss_w: float
    capacity_w: float
    nameplate_w: float
    feed_capacity_w: list[float]
    redundancy: str = Field(description="N+N, N+k, N or overloaded (sims.power)")
    spare_psus: int
    bbu_output_w: float
    bbu_energy_pct: float
    brownout: bool
    dc_bus_voltage_v: float
    shelves: list[ShelfTelemetry]


class EnvTelemetry(_Stamped):
    """``telemetry/env``: room air as the room sensors read it (null while a sensor is
    dropped) and the true dew point (Magnus, sims.environment)."""

    model_config = ConfigDict(title="sim telemetry/env")

    room_temp_c: float | None
    relative_humidity_pct: float | None
    dew_point_c: float | None
    true_room_temp_c: float
    true_relative_humidity_pct: float
    true_dew_point_c: float


class TrayTruth(_Payload):
    """One compute tray's simulator truth (what no node agent can observe)."""

    tray: int
    cold_plate_conductance_factor: float = Field(description="1 = clean cold plates")
    gpu_demand_w: list[float] = Field(description="per GPU: what the workload asked, W")
    gpu_request_w: list[float] = Field(description="per GPU: what the agent let through, W")
    gpu_plate_temp_c: list[float] = Field(description="per GPU: cold-plate temperature, °C")
    gpu_traffic: list[float] = Field(description="per GPU: offered link traffic, 0..1")
    gpu_throttle_scale: list[float] = Field(description="per GPU: thermal throttle scale "
                                            "(1 = none, 0 = shut down)")


class TruthTelemetry(_Stamped):
    """``telemetry/truth``: the simulator's ground truth of every compute tray, on its own
    topic (never inside the node-agent contract; racky does not read it: tests, figures and
    dashboards may)."""

    model_config = ConfigDict(title="sim telemetry/truth")

    trays: list[TrayTruth]


# --- state -------------------------------------------------------------------------------------


class ScenarioState(_Payload):
    """``state/scenario`` (retained)."""

    model_config = ConfigDict(title="sim state/scenario")

    name: str
    t_s: float
    duration_s: float
    done: bool


class FaultItem(_Payload):
    kind: str
    target: str
    start_s: float
    end_s: float | None


class FaultsState(_Payload):
    """``state/faults`` (retained): every injected fault with plant-time start and end."""

    model_config = ConfigDict(title="sim state/faults")

    faults: list[FaultItem]


class FaceInfo(_Payload):
    host: str
    port: int
    unit_ids: list[int]
    register_map: str


class FacesState(_Payload):
    """``state/faces`` (retained): where the Modbus faces answer."""

    model_config = ConfigDict(title="sim state/faces")

    cdu: FaceInfo
    power: FaceInfo | None


class AgentSettingsItem(_Payload):
    tray: int
    power_cap_w: float | None
    gpu_power_cap_w: float | None
    power_floor_pct: float
    ramp_up_w_per_s: float | None
    ramp_down_w_per_s: float | None
    ramp_down_hysteresis_s: float
    powered: bool
    enforced_gpu_cap_w: float
    enforced_tray_cap_w: float


class NodeAgentsState(_Payload):
    """``state/node_agents`` (retained, on change): every tray's agent settings; also the
    ``state`` of the command replies."""

    model_config = ConfigDict(title="sim state/node_agents")

    trays: list[AgentSettingsItem]
    stale_refused: int = Field(ge=0, description="commands the agents refused since the start "
                               "for an epoch older than the newest seen (stale_epoch)")


# --- commands ----------------------------------------------------------------------------------


class SetPowerLimitsArgs(ContractSetPowerLimitsArgs):
    """``set_power_limits`` (node-agent contract v1, docs/CONTRACTS.md): node-agent settings
    for ``trays`` (all or nothing). A field left out keeps its value; ``null`` is never a
    value (refused): a cap or ramp limit is removed by naming it in ``release``. Every command
    carries the sender's ``epoch`` (agents drop one older than the newest they have seen:
    ``stale_epoch``); a command that sets a cap carries ``ttl_s``, after which the tray's caps
    expire unless refreshed. Refused with ``out_of_range`` below the GPUs' minimum power
    limit, ``unknown_tray`` for a tray that does not exist. The settings are
    `sims.rack.NodeAgentSettings` (per-GPU watts and W/s, NVML power-smoothing knobs,
    REFERENCE §1.3)."""

    model_config = ConfigDict(strict=True, title="sim set_power_limits args (node-agent "
                              "contract v1)", json_schema_extra=no_null_defaults,
                              validate_default=False)

    def changes(self) -> dict[str, Any]:
        """The settings fields this command sets (field -> value)."""
        return {f: getattr(self, f) for f in self.model_fields_set
                if f not in ("schema_version", "trays", "epoch", "ttl_s", "release")}


class GetPowerLimitsArgs(CommandArgs):
    """``get_power_limits``: read the node agents (every tray when ``trays`` is left out)."""

    model_config = ConfigDict(strict=True, title="sim get_power_limits args")

    trays: list[int] | None = Field(None, max_length=64)


# --- builders ----------------------------------------------------------------------------------


def _round1_list(a: np.ndarray) -> list[float]:
    """``[round(float(x), 1) for x in a]`` (Python's correctly rounded ``round``), vectorised:
    ``rint(10 x) / 10`` is that value whenever ``fl(10 x)`` is more than a few ulps from a
    half (then it rounds as the exact ``10 x`` does, and ``D / 10`` is correctly rounded);
    the others (near a tie, huge, not finite) go through ``round`` itself."""
    x = np.asarray(a, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        p = x * 10.0
        vals: list[float] = (np.rint(p) / 10.0).tolist()
        risky = ~(np.abs(p) < 2.0**52) | (
            np.abs(p - np.floor(p) - 0.5) <= 4.0 * np.spacing(np.abs(p)) + 1e-300)
    if risky.any():
        src = x.tolist()
        for i in np.flatnonzero(risky).tolist():
            vals[i] = round(src[i], 1)
    return vals


def _port_columns(snap: Mapping[str, np.ndarray], names: Sequence[str]) -> dict[str, Any]:
    """Every `PortBlock` column of a fabric snapshot as plain Python lists over all ports
    (one ``.tolist()`` per column; `port_block` slices them per GPU). Unknown keys become
    counters when they are integer arrays of port length; ``counter_bits`` their dtype's
    width."""
    n_ports = len(names)
    counters: dict[str, list[int]] = {}
    bits: dict[str, int] = {}
    for k, v in snap.items():
        if (
            k not in ("link_up", "is_nvlink", "port_gpu")
            and v.shape == (n_ports,)
            and np.issubdtype(v.dtype, np.integer)
        ):
            counters[k] = v.tolist()  # Python ints, as int(x) per element
            bits[k] = 8 * v.dtype.itemsize  # the counter's native width
    ber = snap.get("ber")
    isfinite = math.isfinite
    # astype: the exact values float()/bool() give per element, as Python floats / bools
    return {
        "names": list(names),
        "nvlink": snap["is_nvlink"].astype(bool).tolist(),
        "link_up": snap["link_up"].astype(bool).tolist(),
        "speed_mb_per_s": snap["link_speed_mb_per_s"].astype(np.float64).tolist(),
        "tx_bytes_per_s": _round1_list(snap["tx_bytes_per_s"]),
        "rx_bytes_per_s": _round1_list(snap["rx_bytes_per_s"]),
        "ber": [x if isfinite(x) else None for x in ber.astype(np.float64).tolist()]
        if ber is not None
        else [None] * n_ports,
        "counters": counters,
        "counter_bits": bits,
    }


def _port_block_of(cols: Mapping[str, Any], start: int, stop: int) -> dict[str, Any]:
    """The `PortBlock` of ports ``start:stop`` from `_port_columns` (fresh lists)."""
    return {
        "names": cols["names"][start:stop],
        "nvlink": cols["nvlink"][start:stop],
        "link_up": cols["link_up"][start:stop],
        "speed_mb_per_s": cols["speed_mb_per_s"][start:stop],
        "tx_bytes_per_s": cols["tx_bytes_per_s"][start:stop],
        "rx_bytes_per_s": cols["rx_bytes_per_s"][start:stop],
        "ber": cols["ber"][start:stop],
        "counters": {k: v[start:stop] for k, v in cols["counters"].items()},
        "counter_bits": dict(cols["counter_bits"]),
    }


def port_block(
    snap: Mapping[str, np.ndarray], ports: range, names: Sequence[str]
) -> dict[str, Any]:
    """The `PortBlock` of ports ``ports`` from a fabric snapshot (unknown keys become
    counters when they are integer arrays of port length; ``counter_bits`` their dtype's
    width)."""
    return _port_block_of(_port_columns(snap, names), ports.start, ports.stop)


def _stamp(vr: VirtualRack, ident: Identity, ts_ns: int) -> dict[str, Any]:
    return {"ts_ns": ts_ns, "t_s": round(vr.time_s, 3), "site": ident.site, "row": ident.row,
            "rack": ident.rack}


def rack_payload(vr: VirtualRack, ident: Identity, ts_ns: int) -> dict[str, Any]:
    """`RackTelemetry` of the rack now."""
    tr = vr.truth()
    ct = vr.cdu_truth()
    lk = tr.leaks
    return {
        **_stamp(vr, ident, ts_ns),
        "it_power_w": tr.it_power_w,
        "it_power_demand_w": tr.it_power_demand_w,
        "liquid_heat_kw": tr.liquid_kw,
        "air_heat_kw": tr.air_kw,
        "switch_power_w": tr.switch_power_w,
        "gpus_throttled": int(tr.gpu_throttled.sum()),
        "gpus_shut_down": int((~tr.gpu_on).sum()),
        "trays_powered": int(tr.tray_powered.sum()),
        "hottest_gpu_temp_c": float(tr.gpu_tj_c.max()),
        "min_t_limit_c": float(tr.gpu_t_limit_c.min()),
        "inventory_l": ct.inventory_l,
        "loop_pressure_kpa": ct.loop_pressure_kpa,
        "rack_inlet_temp_c": ct.rack_inlet_temp_c,
        "rack_outlet_temp_c": ct.rack_outlet_temp_c,
        "flow_lpm": ct.flow_lpm,
        "brownout": tr.brownout,
        "leak": {
            "rope_leak": lk.rope_leak,
            "rope_sensor_fault": lk.rope_sensor_fault,
            "drip_pan_leak": lk.drip_pan_leak,
            "drip_pan_sensor_fault": lk.drip_pan_sensor_fault,
            "leaking_trays": lk.leaking_trays(),
            "faulted_tray_sensors": [int(i) for i in np.flatnonzero(lk.tray_sensor_fault)],
            "leak_lpm": lk.leak_lpm,
            "leaked_l": lk.leaked_l,
        },
    }


_THERMAL = ["hw_slowdown", "hw_thermal_slowdown"]
"""The clock-event reasons a thermally throttled GPU reports (NVML sets both)."""


def tray_payloads(
    vr: VirtualRack, ident: Identity, ts_ns: int, *, ports: bool = True
) -> list[tuple[str, dict[str, Any]]]:
    """``(thing, TrayTelemetry)`` for every compute tray (thing ``trayNN``): the node-agent
    contract v1, only what an agent on the tray can observe (the simulator's truth is
    `truth_payload`). A thermally throttled GPU reports ``hw_slowdown`` and
    ``hw_thermal_slowdown``, one its agent holds below its demand by a cap ``sw_power_cap``.
    With ``ports`` each GPU carries its link ports (`PortBlock`) when the rack has a
    fabric."""
    tr = vr.truth()
    comp = vr.compute
    gpt = comp.gpus_per_tray
    fab = vr.fabric
    cols = None
    names: list[str] = []
    uptime: list[float] | None = None
    boot: list[int] | None = None
    if fab is not None and ports:
        snap = fab.snapshot()
        names = fab.port_names()
        cols = _port_columns(snap, names)  # one conversion per column, sliced per GPU
        up = snap.get("uptime_s")
        bt = snap.get("boot_id")
        uptime = None if up is None else up.astype(np.float64).tolist()
        boot = None if bt is None else [int(x) for x in bt.tolist()]
    ppg = len(names) // comp.n_gpus if names else 0
    # the truth's columns as Python values once (float(x) / bool(x) per element)
    power = tr.gpu_power_w.astype(np.float64).tolist()
    temp = tr.gpu_tj_c.astype(np.float64).tolist()
    t_limit = tr.gpu_t_limit_c.astype(np.float64).tolist()
    throttled = tr.gpu_throttled.astype(bool).tolist()
    on = tr.gpu_on.astype(bool).tolist()
    traffic = tr.gpu_traffic.astype(np.float64).tolist()
    tray_powered = tr.tray_powered.astype(bool).tolist()
    tray_power = tr.tray_power_w.astype(np.float64).tolist()
    coolant_out = tr.tray_coolant_out_c.astype(np.float64).tolist()
    tray_leak = tr.leaks.tray_leak.astype(bool).tolist()
    tray_sensor_fault = tr.leaks.tray_sensor_fault.astype(bool).tolist()
    out = []
    for k in range(comp.n_trays):
        st = comp.agents.status(k, tr.gpu_power_w)
        s = st.settings
        capped = st.gpu_power_capped
        gpus = []
        for i, g in enumerate(range(k * gpt, (k + 1) * gpt)):
            reasons = list(_THERMAL) if throttled[g] else []
            if capped and capped[i]:
                reasons.insert(0, "sw_power_cap")
            item: dict[str, Any] = {
                "gpu": g,
                "power_w": power[g],
                "temp_c": temp[g],
                "t_limit_c": t_limit[g],
                "throttle_reasons": reasons,
                "shut_down": not on[g],
                "utilization": traffic[g],
                "uptime_s": None if uptime is None else uptime[g],
                "boot_id": None if boot is None else boot[g],
                "ports": None
                if cols is None
                else _port_block_of(cols, g * ppg, (g + 1) * ppg),
            }
            gpus.append(item)
        out.append((f"tray{k:02d}", {
            "schema_version": SCHEMA_VERSION,
            "ts_ns": ts_ns, "site": ident.site, "row": ident.row, "rack": ident.rack,
            "tray": k,
            "powered": tray_powered[k],
            "power_w": tray_power[k],
            "coolant_out_temp_c": coolant_out[k],
            "leak": tray_leak[k],
            "leak_sensor_fault": tray_sensor_fault[k],
            "agent": {
                "enforced_gpu_cap_w": st.enforced_gpu_cap_w,
                "enforced_tray_cap_w": st.enforced_tray_cap_w,
                "floor_w": st.floor_w,
                "power_cap_w": s.power_cap_w,
                "gpu_power_cap_w": s.gpu_power_cap_w,
                "power_floor_pct": s.power_floor_pct,
                "ramp_up_w_per_s": s.ramp_up_w_per_s,
                "ramp_down_w_per_s": s.ramp_down_w_per_s,
                "ramp_down_hysteresis_s": s.ramp_down_hysteresis_s,
                "capping": st.capping,
                "flooring": st.flooring,
                "ramp_limited": st.ramp_limited,
                "epoch": st.epoch,
                "cap_expires_in_s": None if st.cap_expires_in_s is None
                else round(st.cap_expires_in_s, 3),
            },
            "gpus": gpus,
        }))
    return out


def truth_payload(vr: VirtualRack, ident: Identity, ts_ns: int) -> dict[str, Any]:
    """`TruthTelemetry`: the simulator's truth of every compute tray now (``telemetry/truth``;
    what the node-agent contract leaves out)."""
    tr = vr.truth()
    comp = vr.compute
    gpt = comp.gpus_per_tray
    scale = np.where(tr.gpu_on, np.where(tr.gpu_request_w > 0.0, tr.gpu_power_w
                                         / np.maximum(tr.gpu_request_w, 1e-9), 1.0), 0.0)
    trays = []
    for k in range(comp.n_trays):
        g = slice(k * gpt, (k + 1) * gpt)
        trays.append({
            "tray": k,
            "cold_plate_conductance_factor": float(tr.conductance_factors[k]),
            "gpu_demand_w": [float(x) for x in tr.gpu_demand_w[g]],
            "gpu_request_w": [float(x) for x in tr.gpu_request_w[g]],
            "gpu_plate_temp_c": [float(x) for x in tr.gpu_plate_temp_c[g]],
            "gpu_traffic": [float(x) for x in tr.gpu_traffic[g]],
            "gpu_throttle_scale": [round(float(min(x, 1.0)), 6) for x in scale[g]],
        })
    return {**_stamp(vr, ident, ts_ns), "trays": trays}


def apply_power_limits(vr: VirtualRack, args: SetPowerLimitsArgs | Mapping[str, Any]) -> None:
    """Apply a ``set_power_limits`` (contract v1) to the rack's node agents, as an agent does:
    all trays or none, a command older than the newest epoch seen dropped, a cap armed for
    ``ttl_s``. ``args``: the model, or the wire args as a dict (validated strictly).

    Raises:
        CommandError: the router's code of the args' problem (`args_refusal_code`:
            ``wrong_type``, ``non_finite``, ``invalid_args``), ``unknown_tray``, ``stale_epoch``,
            ``out_of_range`` (settings an agent refuses); nothing changes then.
    """
    if not isinstance(args, SetPowerLimitsArgs):
        try:
            args = SetPowerLimitsArgs.model_validate(dict(args), strict=True)
        except ValidationError as err:
            raise CommandError(args_refusal_code(err), str(err).splitlines()[0] + ": "
                               + "; ".join(e["msg"] for e in err.errors())) from None
    n = vr.compute.n_trays
    bad = [t for t in args.trays if not 0 <= t < n]
    if bad:
        raise CommandError("unknown_tray", f"trays {bad} do not exist (0..{n - 1})")
    try:
        vr.agents.command(list(args.trays), epoch=args.epoch, changes=args.changes(),
                          release=tuple(args.release),
                          ttl_s=args.ttl_s if "ttl_s" in args.model_fields_set else None)
    except StaleEpoch as err:
        raise CommandError("stale_epoch", str(err)) from None
    except ValueError as err:
        raise CommandError("out_of_range", str(err)) from None


def power_payload(vr: VirtualRack, ident: Identity, ts_ns: int) -> dict[str, Any]:
    """`PowerTelemetry` of the rack's shelves now."""
    sh = vr.shelves
    st = sh.state
    shelves = []
    for i in range(sh.params.shelves):
        shelves.append({
            "shelf": i,
            "feed": sh.feed_of_shelf(i),
            "input_w": float(st.shelf_input_w[i]),
            "output_w": float(st.shelf_output_w[i]),
            "available_w": float(st.psu_available_w[i].sum()),
            "ac_voltage_v": float(st.ac_voltage_v[i]),
            "status": int(st.shelf_status[i]),
            "psus": [
                {
                    "psu": j,
                    "input_w": float(st.psu_input_w[i, j]),
                    "output_w": float(st.psu_output_w[i, j]),
                    "temp_c": float(st.psu_temp_c[i, j]),
                    "available_w": float(st.psu_available_w[i, j]),
                    "status": int(st.psu_status[i, j]),
                }
                for j in range(sh.params.psus_per_shelf)
            ],
        })
    return {
        **_stamp(vr, ident, ts_ns),
        "load_w": st.load_w,
        "input_w": st.input_w,
        "output_w": st.output_w,
        "loss_w": st.loss_w,
        "capacity_w": st.capacity_w,
        "nameplate_w": st.nameplate_w,
        "feed_capacity_w": [float(x) for x in st.feed_capacity_w],
        "redundancy": st.redundancy,
        "spare_psus": int(st.spare_psus),
        "bbu_output_w": st.bbu_output_w,
        "bbu_energy_pct": 100.0 * st.bbu_energy_j / st.bbu_capacity_j
        if st.bbu_capacity_j > 0.0
        else 0.0,
        "brownout": st.brownout,
        "dc_bus_voltage_v": st.dc_bus_voltage_v,
        "shelves": shelves,
    }


def env_payload(vr: VirtualRack, ident: Identity, ts_ns: int) -> dict[str, Any]:
    """`EnvTelemetry` of the room now."""
    e = vr.environment_state()
    return {
        **_stamp(vr, ident, ts_ns),
        "room_temp_c": finite_or_none(e.sensed_room_temp_c),
        "relative_humidity_pct": finite_or_none(e.sensed_relative_humidity_pct),
        "dew_point_c": finite_or_none(e.sensed_dew_point_c),
        "true_room_temp_c": e.room_temp_c,
        "true_relative_humidity_pct": e.relative_humidity_pct,
        "true_dew_point_c": e.dew_point_c,
    }


def node_agents_payload(vr: VirtualRack, trays: Sequence[int] | None = None) -> dict[str, Any]:
    """`NodeAgentsState` of ``trays`` (default: all)."""
    ag = vr.agents
    out = []
    for k in range(ag.n_trays) if trays is None else trays:
        s = ag.settings(k)
        cap = ag.enforced_gpu_cap_w(s)
        out.append({
            "tray": k,
            **{f: getattr(s, f) for f in (
                "power_cap_w", "gpu_power_cap_w", "power_floor_pct", "ramp_up_w_per_s",
                "ramp_down_w_per_s", "ramp_down_hysteresis_s", "powered")},
            "enforced_gpu_cap_w": cap,
            "enforced_tray_cap_w": cap * ag.gpus_per_tray * (1.0 + ag.other_share),
        })
    return {"trays": out, "stale_refused": ag.stale_refused}


# --- schemas -----------------------------------------------------------------------------------

_MODELS: dict[str, type[BaseModel]] = {
    "sim.telemetry.plant": PlantTelemetry,
    "sim.telemetry.rack": RackTelemetry,
    "sim.telemetry.tray": TrayTelemetry,
    "sim.telemetry.power": PowerTelemetry,
    "sim.telemetry.env": EnvTelemetry,
    "sim.telemetry.truth": TruthTelemetry,
    "sim.state.scenario": ScenarioState,
    "sim.state.faults": FaultsState,
    "sim.state.faces": FacesState,
    "sim.state.node_agents": NodeAgentsState,
    "sim.set_power_limits.args": SetPowerLimitsArgs,
    "sim.set_power_limits.reply": SetPowerLimitsReply,
    "sim.get_power_limits.args": GetPowerLimitsArgs,
}


def payload_models() -> dict[str, type[BaseModel]]:
    """schema name (file name without ``.schema.json``) -> model."""
    return dict(_MODELS)


def schema_documents() -> dict[str, str]:
    """file name -> JSON Schema text (`rackplane.schemagen.schema_text`: draft 2020-12, keys
    sorted, stable)."""
    return schema_documents_of(_MODELS)


def write_schemas(directory: str | Path = SCHEMA_DIR) -> list[Path]:
    """Write the schema files that are missing or differ; returns those written."""
    return write_documents(directory, schema_documents())


def stale_schemas(directory: str | Path = SCHEMA_DIR) -> list[str]:
    """Schema files missing from ``directory`` or differing from the models."""
    return stale_documents(directory, schema_documents())
