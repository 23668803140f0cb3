"""The CDU's register interface: `write` (holding registers), `readings` (what the registers
hold) and `truth` (the unsensed state beside them)."""

from __future__ import annotations

import math

from rackplane.errors import WriteRejected
from sims.cdu.faults import FaultHooks
from sims.cdu.fence import ControllerFence
from sims.cdu.outputs import CduTruth, PumpState
from sims.cdu.points import PUMP_LETTERS, WRITABLE_POINTS

_PUMP_KEYS = tuple((f"pump_{c}_running", f"pump_{c}_fault", f"pump_{c}_speed_pct",
                    f"pump_{c}_run_hours_h") for c in PUMP_LETTERS)  # `CduPlant.readings`


class RegisterInterface(FaultHooks):
    """Register writes and reads, and the truth (part of `CduPlant`)."""

    __slots__ = ()

    @property
    def fence(self) -> ControllerFence:
        """The controller-epoch fence (`sims.cdu.fence`): ``epoch``, ``stale_writes``."""
        return self._fence

    def write(self, point: str, value: float, *, epoch: int | None = None) -> None:
        """Write a holding register in engineering units (config/registers/cdu-generic.toml).

        ``epoch``: the writing controller's epoch (redundant pairs, issue 15); the fence
        (`sims.cdu.fence.ControllerFence`) admits the write first: once any epoch has been
        written, a write with an older epoch or none is refused and counted (nothing changes).

        ``valve_command_pct`` moves the valve demand (while in local control it is stored and
        used when remote control resumes); ``pump_speed_command_pct`` the duty pump speed;
        ``heartbeat`` (rounded to an integer) restores remote control when it changes;
        ``supply_temp_setpoint_c`` is the local-control setpoint; ``controller_epoch`` is a
        claim of that epoch (``value``, an integer; ``epoch`` is not used): accepted when it
        is not older than the held one (which it then becomes), else refused and counted.

        Raises:
            WriteRejected: unknown or read-only point, non-finite value, value outside the
                register's write_min/write_max, a stale or malformed controller epoch
                (nothing changes).
        """
        if point == "controller_epoch":
            # a claim: the epoch is the value (an int: a float above 2**53 is not exact)
            claim = int(value) if isinstance(value, float) and value.is_integer() else value
            self._fence.admit(point, claim)  # type: ignore[arg-type]  # malformed: refused
            return
        self._fence.admit(point, epoch)
        lim = WRITABLE_POINTS.get(point)
        if lim is None:
            raise WriteRejected(f"cdu: point {point!r} is not writable")
        if not (isinstance(value, int | float) and math.isfinite(value)):
            raise WriteRejected(f"cdu: {point} value {value!r} is not a finite number")
        if not (lim[0] <= value <= lim[1]):
            raise WriteRejected(f"cdu: {point} value {value} outside [{lim[0]}, {lim[1]}]")
        if point == "valve_command_pct":
            if self._local:
                self._remote_cmd = value / 100.0
                self._remote_written = True
            else:
                self._x_cmd = value / 100.0
        elif point == "pump_speed_command_pct":
            self._n_cmd = value / 100.0
        elif point == "duty_pump_select":
            pump = round(value)
            if pump >= self._n_pumps:
                raise WriteRejected(f"cdu: duty_pump_select {value}: the CDU has "
                                    f"{self._n_pumps} pump(s)")
            self.set_duty_pump(pump)
        elif point == "valve_b_command_pct":
            if not self._p.second_valve:
                raise WriteRejected("cdu: valve_b_command_pct: this CDU has no second valve")
            self._x_b_cmd = value / 100.0
        elif point == "rack_isolation_command":
            self._iso_cmd = 1.0 if round(value) else 0.0
        elif point == "heartbeat":
            hb = round(value)
            if hb != self._hb:
                self._hb = hb
                self._hb_change_t = self._t
                if self._local:
                    self._local = False
                    if self._remote_written:
                        self._x_cmd = self._remote_cmd
        else:
            self._sp = float(value)

    def readings(self) -> dict[str, float]:
        """What the CDU's registers hold now, keyed by `READING_POINTS` (engineering units).

        Sensors are lagged, noisy, quantised and possibly faulted (NaN when dropped);
        ``valve_position_pct`` is the feedback (with any offset fault, clipped to 0–100);
        ``pump_speed_pct`` the fastest running pump; ``valve_command_pct`` the effective demand
        (the local loop's output while in local control). Per pump (``pump_a_*``,
        ``pump_b_*``): running (not tripped and turning), fault (tripped), speed, run hours;
        ``duty_pump_select`` the duty pump's index. ``rack_isolation_open`` / ``_closed`` are
        the limit switches (both 0 while the valves travel).
        """
        x_fb = 100.0 * self._x + self._valve_offset
        run = max([n for n, tr in zip(self._n, self._tripped, strict=True) if not tr],
                  default=0.0)
        pumps: dict[str, float] = {}
        n_pumps = self._n_pumps
        for i, (k_run, k_fault, k_speed, k_hours) in enumerate(_PUMP_KEYS):
            if i < n_pumps:
                n, tr = self._n[i], self._tripped[i]
                pumps[k_run] = 1.0 if (not tr and n > 0.01) else 0.0
                pumps[k_fault] = 1.0 if tr else 0.0
                pumps[k_speed] = 100.0 * n
                pumps[k_hours] = self._run_h[i]
            else:
                pumps[k_run] = pumps[k_fault] = pumps[k_speed] = pumps[k_hours] = 0.0
        return {
            **pumps,
            "reservoir_level_pct": self._s_level.value,
            "filter_diff_pressure_kpa": self._s_filter.value,
            "valve_b_position_pct": 100.0 * self._x_b,
            "rack_isolation_open": 1.0 if self._iso >= 1.0 else 0.0,
            "rack_isolation_closed": 1.0 if self._iso <= 0.0 else 0.0,
            "leak_rope_detected": 1.0 if self._rope_leak else 0.0,
            "leak_rope_sensor_fault": 1.0 if self._rope_fault else 0.0,
            "duty_pump_select": float(self._duty),
            "valve_b_command_pct": 100.0 * self._x_b_cmd,
            "rack_isolation_command": self._iso_cmd,
            "supply_temp_c": self._s_sa.value,
            "return_temp_c": self._s_ret.value,
            "flow_lpm": self._s_flow.value,
            "diff_pressure_kpa": self._s_dp.value,
            "valve_position_pct": 0.0 if x_fb < 0.0 else 100.0 if x_fb > 100.0 else x_fb,
            "facility_supply_temp_c": self._s_fws.value,
            "heat_removed_kw": self._s_heat.value,
            "pump_speed_pct": 100.0 * run,
            "supply_temp_b_c": self._s_sb.value,
            "supply_temp_c_c": self._s_sc.value,
            "uptime_s": float(math.floor(self._t - self._boot_t + 1e-9)),
            "loop_pressure_kpa": self._s_loop.value,
            "valve_command_pct": 100.0 * self._x_cmd,
            "pump_speed_command_pct": 100.0 * self._n_cmd,
            "heartbeat": float(self._hb),
            "supply_temp_setpoint_c": self._sp,
            "local_control": 1.0 if self._local else 0.0,
            # exact as floats up to 2**53 (the Modbus face serves the exact ints:
            # sims.epoch_gate)
            "controller_stale_writes": float(self._fence.stale_writes),
            "controller_epoch": float(self._fence.epoch),
        }

    def probe(self) -> tuple[float, float, float, float, float, float]:
        """The few true values a scorer reads at every plant step, cheaply (`truth` builds
        the whole record): ``(supply_temp_c, flow_lpm, valve A actuator position %, valve B
        actuator position %, valve A plug position %, valve B plug position %)``. The
        actuator position is the motor's (it runs through the backlash dead zone and is held
        by stiction); the plug position is what sets the flow (`CduTruth`'s
        ``valve_position_pct``)."""
        x, xb = self._x, self._x_b
        if self._ideal_valve:
            a, ab = x, xb
        else:
            a, ab = self._x_act, self._x_b_act
        return (self._t_ss, self._q * 60.0, 100.0 * a, 100.0 * ab, 100.0 * x, 100.0 * xb)

    def truth(self) -> CduTruth:
        """The true state (see `CduTruth`); rack figures are totals (powers, counts) or the
        mixed value (outlet temperature) over the CDU's racks, ``gpu_tj_c`` lists every rack's
        trays in rack order."""
        racks = self._racks
        rack = racks[0]
        if len(racks) == 1:
            tjs = rack.gpu_tj_c
            n_slow = rack.throttled_trays
            n_off = rack.shutdown_trays
            p_it = rack.power_w
            p_dem = rack.demand_w
            liq = rack.liquid_kw
            t_out = rack.t_out_c
            events = rack.throttle_events
        else:
            tjs = tuple(t for r in racks for t in r.gpu_tj_c)
            n_slow = sum(r.throttled_trays for r in racks)
            n_off = sum(r.shutdown_trays for r in racks)
            p_it = sum(r.power_w for r in racks)
            p_dem = sum(r.demand_w for r in racks)
            liq = sum(r.liquid_kw for r in racks)
            t_out = sum(r.t_out_c for r in racks) * self._q_share
            events = sum(r.throttle_events for r in racks)
        hottest = max(tjs)
        q = self._q
        return CduTruth(
            time_s=self._t,
            supply_temp_c=self._t_ss,
            return_temp_c=self._ret[-1],
            rack_inlet_temp_c=self._sup[-1],
            rack_outlet_temp_c=t_out,
            facility_supply_temp_c=self._t_fws,
            flow_lps=q,
            flow_lpm=q * 60.0,
            facility_flow_lps=self._qp,
            valve_position_pct=100.0 * self._x,
            valve_command_pct=100.0 * self._x_cmd,
            diff_pressure_kpa=self._k_sys * q * q,
            loop_pressure_kpa=self._p_loop,
            q_hx_kw=self._q_hx,
            rack_power_w=p_it,
            rack_power_demand_w=p_dem,
            air_heat_kw=p_it * 0.001 - liq,
            gpu_tj_c=tjs,
            hottest_gpu_tj_c=hottest,
            t_limit_margin_c=rack.params.gpu_max_operating_temp_c - hottest,
            hw_slowdown=n_slow > 0,
            gpu_shutdown=n_off > 0,
            throttled_trays=n_slow,
            shutdown_trays=n_off,
            throttle_events=events,
            pumps=tuple(
                PumpState(
                    speed_pct=100.0 * n,
                    running=((i == self._duty or i == self._handover_from) and not tr
                             and n > 0.0),
                    tripped=tr,
                    duty=i == self._duty,
                )
                for i, (n, tr) in enumerate(zip(self._n, self._tripped, strict=True))
            ),
            duty_pump=self._duty,
            pump_power_w=1000.0 * self._pump_p0_kw * sum(n * n * n for n in self._n),
            local_control=self._local,
            inventory_l=self._v_inv,
            stored_energy_kj=self.stored_energy_kj(),
            it_liquid_energy_kj=self._ce_liq,
            air_energy_kj=self._ce_air,
            hx_energy_kj=self._ce_hx,
            pump_energy_kj=self._ce_pump,
            valve_b_position_pct=100.0 * self._x_b,
            valve_b_command_pct=100.0 * self._x_b_cmd,
            rack_isolation_open_pct=100.0 * self._iso,
            reservoir_level_pct=self._level_pct(),
            filter_diff_pressure_kpa=self._filter_dp_kpa(q),
            pump_run_hours_h=tuple(self._run_h),
        )
