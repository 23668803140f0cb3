"""`ScenarioRun`: applies a scenario's timeline (load, facility water, faults) to the plant as
plant time advances (pure, no clock), with the ground truth and protocol faults it keeps."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from sims.cdu import CduPlant
from sims.row import FabricUnavailable, VirtualRack
from sims.scenario.models import (
    CDU_SENSOR_MODES,
    FABRIC_KINDS,
    PROTOCOL_KINDS,
    RACK_KINDS,
    FaultSpec,
    Scenario,
)
from sims.workloads import LoadProfile

__all__ = ["FaultRecord", "ModbusFaultState", "ProtocolFaults", "ScenarioRun"]


@dataclass(frozen=True)
class FaultRecord:
    """Ground truth of one injected fault: what, where, from when to when (plant s)."""

    kind: str
    target: str
    start_s: float
    end_s: float | None


@dataclass
class ModbusFaultState:
    """Fault knobs of one Modbus face (`sims.modbus_face.ModbusFace`)."""

    blackhole: bool = False
    reply_delay_s: float = 0.0
    max_registers: int | None = None
    exceptions: dict[int, tuple[int, int | None, str | None, int | None, int]] = field(
        default_factory=dict
    )  # fault index -> (code, unit, table, address, count)


@dataclass
class ProtocolFaults:
    """Protocol misbehaviour the real-time faces apply (`version` increments on change)."""

    modbus: dict[str, ModbusFaultState] = field(
        default_factory=lambda: {"cdu": ModbusFaultState(), "power": ModbusFaultState()}
    )
    sentinel_points: set[str] = field(default_factory=set)
    mqtt_stopped: set[str] = field(default_factory=set)
    version: int = 0

    def publishing(self, publisher: str) -> bool:
        """False while ``publisher`` (or ``all``) is stopped."""
        return publisher not in self.mqtt_stopped and "all" not in self.mqtt_stopped


class _Ramp:
    """An additive offset ramped linearly to a target."""

    def __init__(self) -> None:
        self.value = 0.0
        self.target = 0.0
        self.rate = math.inf

    def set(self, target: float, ramp_s: float) -> None:
        span = abs(target - self.value)
        self.target = target
        self.rate = math.inf if ramp_s <= 0.0 or span == 0.0 else span / ramp_s

    def at(self, dt: float) -> float:
        d = self.target - self.value
        m = self.rate * dt
        self.value = self.target if abs(d) <= m else self.value + math.copysign(m, d)
        return self.value


@dataclass
class ScenarioRun:
    """Applies a scenario's timeline to a plant as plant time advances (pure, no clock).

    Usage: ``run = ScenarioRun(scenario)``; ``plant = run.plant`` (the `CduPlant`, in both
    models); ``run.rack`` (the `VirtualRack`, rack model only); then each step
    ``run.step(dt)``; ``run.ground_truth`` lists the faults applied so far; ``run.protocol``
    the protocol faults in force. On a row CDU (the ``racks_N`` plant variants) ``loads``
    holds each rack's profile (`Scenario.load_profile`, independent steps), ``load`` is rack
    0's and ``rack`` the row with rack 0's shortcuts (``rack.racks``: every rack).

    Args:
        scenario: the scenario.
        model: ``cdu`` or ``rack`` (default: `Scenario.model`).

    Raises:
        ValueError: the scenario needs the rack model and ``model="cdu"`` was asked.
        FabricUnavailable: a link fault without a link fabric.
    """

    scenario: Scenario
    model: Literal["cdu", "rack"] | None = None
    plant: CduPlant = field(init=False)
    rack: VirtualRack | None = field(init=False, default=None)
    load: LoadProfile = field(init=False)
    loads: list[LoadProfile] = field(init=False)
    facility: LoadProfile = field(init=False)
    ground_truth: list[FaultRecord] = field(default_factory=list)
    protocol: ProtocolFaults = field(default_factory=ProtocolFaults)
    _pending: list[tuple[float, int, str]] = field(default_factory=list)
    _active: dict[int, int] = field(default_factory=dict)
    _fws: _Ramp = field(default_factory=_Ramp)

    def __post_init__(self) -> None:
        s = self.scenario
        model = self.model or s.model()
        if model == "cdu" and s.needs_rack():
            raise ValueError(f"scenario {s.name!r} needs the rack model (a rack-level fault)")
        self.model = model
        n_racks = s.n_racks()
        self.loads = [s.load_profile(k) for k in range(n_racks)]  # a row CDU: one per rack
        self.load = self.loads[0]
        self.facility = s.facility_profile()
        if model == "rack":
            params = s.rack_params()
            if any(f.kind in FABRIC_KINDS for f in s.faults) and params.fabric == "auto":
                params = params.model_copy(update={"fabric": "on"})
            rack = VirtualRack(params, seed=s.seed)
            self.rack = rack
            self.plant = rack.cdu
            comp = rack.compute
            rack.workload = s.workload(comp.n_gpus, comp.gpu_fraction_for_rack_power)
            for k, side in enumerate(rack.racks[1:], 1):  # a row CDU's other racks
                side.workload = s.workload(comp.n_gpus, side.compute.gpu_fraction_for_rack_power,
                                           rack=k)
            if s.agents is not None:  # every rack's node agents (a row CDU: each rack's)
                for side in rack.racks:
                    for k in range(side.compute.n_trays):
                        side.compute.agents.configure(k, s.agents.settings())
            rack.warm_start(self.facility.power_w(0.0))
            if any(f.kind in FABRIC_KINDS for f in s.faults) and rack.fabric is None:
                raise FabricUnavailable("this scenario's link faults need sims.fabric")
        else:
            self.plant = CduPlant(s.cdu_params(), seed=s.seed)
            self.plant.warm_start(
                self._load_w(0.0),
                supply_setpoint_c=s.plant.supply_setpoint_c,
                facility_supply_temp_c=self.facility.power_w(0.0),
            )
        events: list[tuple[float, int, str]] = []
        for i, f in enumerate(s.faults):
            events.append((f.at_s, i, "start"))
            own = self._own_end(f)
            self_ending = own is not None and (f.until_s is None or f.mode == "spike")
            end = own if self_ending else f.until_s
            if end is not None:
                events.append((end, i, "end"))
        self._pending = sorted(events, reverse=True)  # pop() from the end: earliest first

    @staticmethod
    def _own_end(f: FaultSpec) -> float | None:
        if f.kind == "link_flap":
            assert f.down_s is not None
            return f.at_s + (f.count - 1) * (f.down_s + (f.up_s or 0.0)) + f.down_s
        if f.kind == "link_down":
            assert f.down_s is not None
            return f.at_s + f.down_s
        if f.kind == "sensor" and f.mode == "spike":  # a spike ends by itself
            if f.duration_s is not None:
                return f.at_s + f.duration_s
            return f.until_s if f.until_s is not None else f.at_s + 0.1
        return None

    # --- time and inputs -----------------------------------------------------------------------

    @property
    def t_s(self) -> float:
        """Plant time in s since the scenario started."""
        return self.plant.time_s

    @property
    def rack_power_w(self) -> float:
        """Rack IT power demand now, W (cdu model: the profile; rack model: the node agents'
        requests, before throttling)."""
        if self.rack is not None:
            return self.rack.rack.rack_demand_w
        return self.load.power_w(self.t_s)

    @property
    def facility_supply_temp_c(self) -> float:
        """Facility water supply temperature now, °C (timeline + a rise fault's offset)."""
        return self.facility.power_w(self.t_s) + self._fws.value

    @property
    def done(self) -> bool:
        return self.t_s >= self.scenario.duration_s - 1e-9

    def step(self, dt_s: float = 0.1) -> None:
        """Apply due faults, then advance the plant by ``dt_s`` under the timeline's inputs
        (past the end too: the timeline holds its last inputs, no new faults start)."""
        while self._pending and self._pending[-1][0] <= self.t_s + 1e-9:
            _, idx, what = self._pending.pop()
            self._apply(idx, start=(what == "start"))
        self._fws.at(dt_s)
        t_fws = self.facility_supply_temp_c
        if self.rack is not None:
            self.rack.step(dt_s, t_fws)
            lk = self.rack.leaks.state()  # the CDU's registers carry its rope sensor
            self.plant.set_leak_sensor_inputs(lk.rope_leak, lk.rope_sensor_fault)
        else:
            self.plant.step(self._load_w(self.t_s), t_fws, dt_s)

    def _load_w(self, t_s: float) -> float | list[float]:
        """The racks' IT power at ``t_s``, W: one value, or one per rack on a row CDU."""
        if len(self.loads) == 1:
            return self.load.power_w(t_s)
        return [ld.power_w(t_s) for ld in self.loads]

    # --- faults --------------------------------------------------------------------------------

    def _apply(self, idx: int, *, start: bool) -> None:
        f = self.scenario.faults[idx]
        k = f.kind
        if k in PROTOCOL_KINDS:
            self._apply_protocol(idx, f, start)
        elif k in RACK_KINDS:
            self._apply_rack(f, start)
        else:
            self._apply_cdu(f, start)
        now = round(self.t_s, 6)  # plant time sums 0.1 s steps: drop the float noise
        if start:
            self._active[idx] = len(self.ground_truth)
            end = now if k in ("gpu_reboot", "controller_restart") else None
            self.ground_truth.append(FaultRecord(k, f.target(), now, end))
        elif idx in self._active:
            i = self._active.pop(idx)
            rec = self.ground_truth[i]
            self.ground_truth[i] = FaultRecord(rec.kind, rec.target, rec.start_s, now)

    def _apply_cdu(self, f: FaultSpec, start: bool) -> None:
        p = self.plant
        k = f.kind
        if k == "pump_trip":
            p.trip_pump(f.pump) if start else p.reset_pump(f.pump)
        elif k == "valve_stuck":
            p.set_valve_stuck(start)
        elif k == "valve_offset":
            p.set_valve_feedback_offset_pct(f.value if start else 0.0)
        elif k == "valve_slow":
            p.set_valve_slow_factor(f.value if start else 1.0)
        elif k == "sensor":
            assert f.point is not None and f.mode is not None
            self._sensor(f, start)
        elif k == "leak":
            if self.rack is not None:
                self.rack.loop_leak_lpm = f.value if start else 0.0
            else:
                p.set_leak_lpm(f.value if start else 0.0)
        elif k == "controller_restart" and start:
            p.restart_controller()
        elif k == "facility_water_rise":
            self._fws.set(f.magnitude if start else 0.0, f.ramp_s)
        elif k == "fouled_cold_plate":
            assert f.tray is not None
            for rack in p.racks:
                rack.set_conductance_factor(f.tray, f.value if start else 1.0)

    def _sensor(self, f: FaultSpec, start: bool) -> None:
        assert f.point is not None and f.mode is not None
        env_sensor = self.rack is not None and f.point in self.rack.environment.sensors
        if start:
            mode = CDU_SENSOR_MODES[f.mode]
            dur = f.duration_s
            if mode == "spike" and dur is None and f.until_s is not None:
                dur = f.until_s - f.at_s
            kw: dict[str, Any] = {"magnitude": f.magnitude, "rate_per_s": f.rate_per_s,
                                  "duration_s": dur}
            if env_sensor:
                assert self.rack is not None
                self.rack.environment.sensors[f.point].set_fault(mode, **kw)
            else:
                self.plant.set_sensor_fault(f.point, mode, **kw)
            if f.mode == "sentinel":
                self.protocol.sentinel_points.add(f.point)
                self.protocol.version += 1
        else:
            if env_sensor:
                assert self.rack is not None
                self.rack.environment.sensors[f.point].clear_fault()
            else:
                self.plant.clear_sensor_fault(f.point)
            if f.mode == "sentinel":
                self.protocol.sentinel_points.discard(f.point)
                self.protocol.version += 1

    def _apply_rack(self, f: FaultSpec, start: bool) -> None:
        rack = self.rack
        assert rack is not None
        k = f.kind
        if k == "tray_leak":
            assert f.tray is not None
            rack.leaks.set_tray_leak(f.tray, f.value if start else 0.0)
        elif k == "cdu_leak":
            rack.leaks.set_rope_leak(f.value if start else 0.0)
        elif k == "leak_sensor_fault":
            assert f.sensor is not None
            rack.leaks.set_sensor_fault(f.sensor, start, f.tray)
        elif k == "psu_failure":
            assert f.shelf is not None and f.psu is not None
            (rack.shelves.fail_psu if start else rack.shelves.restore_psu)(f.shelf, f.psu)
        elif k == "psu_derate":
            assert f.shelf is not None and f.psu is not None
            rack.shelves.derate_psu(f.shelf, f.psu, f.value if start else 1.0)
        elif k == "shelf_loss":
            assert f.shelf is not None
            (rack.shelves.lose_shelf if start else rack.shelves.restore_shelf)(f.shelf)
        elif k == "feed_loss":
            assert f.feed is not None
            (rack.shelves.lose_feed if start else rack.shelves.restore_feed)(f.feed)
        elif k == "humidity_rise":
            rack.environment.set_humidity_offset(f.magnitude if start else 0.0, f.ramp_s)
        elif k == "room_temp_rise":
            rack.environment.set_temp_offset(f.magnitude if start else 0.0, f.ramp_s)
        else:
            self._apply_fabric(f, start)

    def _apply_fabric(self, f: FaultSpec, start: bool) -> None:
        assert self.rack is not None
        fab = self.rack.fabric
        if fab is None:
            raise FabricUnavailable(f"a {f.kind} fault needs the link fabric")
        k = f.kind
        if k == "gpu_reboot":
            if start:
                assert f.gpu is not None
                fab.reboot(f.gpu)
            return
        if k == "link_flap":
            if start:
                assert f.down_s is not None
                fab.flap(f.port, f.down_s, f.up_s or 0.0, f.count,
                         start_s=max(self.t_s, fab.time_s))
            return
        if k == "link_down":
            if start:
                assert f.down_s is not None
                fab.hold_down(f.port, f.down_s, start_s=max(self.t_s, fab.time_s))
            return
        if not start:
            fab.restore_error_rate(f.port, None if k == "link_ber" else f.counter)
        elif k == "link_error_rate":
            assert f.counter is not None
            fab.set_error_rate(f.port, f.counter, f.rate_per_s)
        elif k == "link_error_ramp":
            assert f.counter is not None and f.start_per_s is not None
            assert f.end_per_s is not None
            fab.ramp_error_rate(f.port, f.counter, f.start_per_s, f.end_per_s, f.ramp_s)
        elif k == "link_ber":
            fab.degrade_ber(f.port, f.value)

    def _apply_protocol(self, idx: int, f: FaultSpec, start: bool) -> None:
        pr = self.protocol
        k = f.kind
        if k == "mqtt_stop":
            assert f.publisher is not None
            (pr.mqtt_stopped.add if start else pr.mqtt_stopped.discard)(f.publisher)
        else:
            assert f.device is not None
            m = pr.modbus[f.device]
            if k == "modbus_half_open":
                m.blackhole = start
            elif k == "modbus_slow":
                m.reply_delay_s = f.value if start else 0.0
            elif k == "modbus_max_registers":
                m.max_registers = int(f.value) if start else None
            elif k == "modbus_exception":
                assert f.code is not None
                if start:
                    m.exceptions[idx] = (f.code, f.unit, f.table, f.address, f.registers)
                else:
                    m.exceptions.pop(idx, None)
            elif k == "modbus_gap":
                if start:
                    m.exceptions[idx] = (2, f.unit, f.table, f.address, f.registers)
                else:
                    m.exceptions.pop(idx, None)
        pr.version += 1

    def inputs(self) -> dict[str, float]:
        """The scenario's current inputs (for telemetry and plots)."""
        return {
            "rack_power_w": self.rack_power_w,
            "facility_supply_temp_c": self.facility_supply_temp_c,
        }
