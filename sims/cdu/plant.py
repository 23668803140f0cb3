"""`CduPlant`: the CDU + its rack(s), stepped with an explicit ``dt`` (REFERENCE §4.2 items
1–7, 9, 10). Construction, steady state (`capacity_w`, `warm_start`) and `step` live here; the
state it holds is `sims.cdu.state`, its other parts `sims.cdu.loop`, `.control`, `.faults` and
`.registers` (see the package docstring, `sims.cdu`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from sims.cdu.fence import ControllerFence
from sims.cdu.hx import hx_conductance_kw_per_k
from sims.cdu.loop import ATM_KPA
from sims.cdu.outputs import WarmStartResult
from sims.cdu.params import CduParams
from sims.cdu.rack_thermal import RackThermal
from sims.cdu.registers import RegisterInterface
from sims.sensors import Sensor, SensorParams

_NOISE_BLOCK = 4096


class CduPlant(RegisterInterface):
    """CDU + its rack(s), stepped with an explicit ``dt``; deterministic for a ``seed``.

    Args:
        params: `CduParams` (REFERENCE §4.3 defaults); ``params.n_racks`` identical racks
            share the secondary flow equally (a row CDU; 1 by default).
        seed: seeds the sensor-noise stream (numpy PCG64).

    The constructor leaves the plant at the zero-load steady state (valve closed, everything at
    the setpoint, duty pump A at design speed); call `warm_start` for a loaded one. Writes come
    through `write`; each `step` takes the rack IT power (W; one value for every rack, or one
    per rack), optionally per-GPU power (`RackThermal.step_gpus`), and the facility water
    supply temperature (°C). Fault hooks: `trip_pump`, `reset_pump`, `set_duty_pump`,
    `set_valve_stuck`, `set_valve_feedback_offset_pct`, `set_valve_slow_factor`,
    `set_sensor_fault`, `clear_sensor_fault`, `set_leak_lpm`, `restart_controller`,
    `reset_gpus`.
    """

    __slots__ = ()

    def __init__(self, params: CduParams | None = None, seed: int = 0) -> None:
        p = params if params is not None else CduParams()
        r = p.rack
        self._p = p
        self._rng = np.random.Generator(np.random.PCG64(seed))
        self._z = []
        self._zi = 0
        # constants (REFERENCE §4.2/4.3)
        self._rhoc_s = p.coolant_rho_c_kj_per_l_k
        self._rhoc_p = p.facility_rho_c_kj_per_l_k
        self._q0 = p.design_flow_lps
        self._qmax = p.max_flow_lps
        self._ua2 = 2.0 * p.hx_ua_kw_per_k
        self._hx_exp = p.hx_flow_exponent
        # flow starvation: the valve's full-open flow falls, the HX's UA reference stays
        self._qp_max = p.facility_max_flow_lps * p.facility_flow_available_fraction
        self._qp_ref = p.hx_primary_ref_fraction * p.facility_max_flow_lps
        self._ln_r = math.log(p.valve_rangeability)
        self._k_sys = p.diff_pressure_design_kpa / p.design_flow_lps**2
        self._c_cdu = p.coolant_rho_c_kj_per_l_k * p.cdu_volume_l
        self._v_tank = p.pipe_volume_l / p.pipe_tanks
        self._c_tank = p.coolant_rho_c_kj_per_l_k * self._v_tank
        self._n_pumps = p.n_pumps
        self._pump_p0_kw = p.pump_power_full_speed_w / 1000.0
        self._q_share = 1.0 / p.n_racks
        self._racks = tuple(
            RackThermal(r, p.design_flow_lps * self._q_share, p.coolant_rho_c_kj_per_l_k)
            for _ in range(p.n_racks)
        )
        self._rack = self._racks[0]
        self._p_in_max_w = 2.0 * r.rack_max_power_w
        self._hb_timeout = p.heartbeat_timeout_s
        self._v_inv0 = 2.0 * p.pipe_volume_l + p.cdu_volume_l + p.n_racks * r.fluid_volume_l
        self._p_abs0 = p.fill_pressure_kpa + ATM_KPA
        # state
        self._t = 0.0
        self._boot_t = 0.0
        self._sp = p.supply_temp_setpoint_c
        self._t_fws = p.facility_supply_temp_c
        self._hb = 0
        self._hb_change_t = 0.0
        self._fence = ControllerFence()  # nonvolatile: kept over restart_controller
        self._local = False
        self._pi_i = 0.0
        self._pi_next_t = 0.0
        self._remote_cmd = 0.0
        self._remote_written = False
        self._valve_stuck = False
        self._valve_b_stuck = False
        self._valve_offset = 0.0
        self._valve_rate = 1.0 / p.valve_stroke_time_s
        self._x = 0.0
        self._x_cmd = 0.0
        self._x_act = self._x_b_act = 0.0
        self._act_moving = self._act_b_moving = False
        self._backlash_h = 0.005 * p.valve_backlash_pct
        self._stiction = 0.01 * p.valve_stiction_pct
        self._ideal_valve = self._backlash_h == 0.0 and self._stiction == 0.0
        # 1/f noise on the supply sensors: its own stream (the other noise is unchanged)
        self._rng3 = np.random.Generator(np.random.PCG64([seed, 0x504B]))
        self._pink = [0.0] * 12
        self._pink_sigma = p.supply_sensor_pink_noise_k
        self._pink_dt = -1.0
        self._pink_a = self._pink_b = [0.0] * 4
        if self._pink_sigma > 0.0:  # start stationary: each process at its own variance
            self._pink = (0.5 * self._pink_sigma * self._rng3.standard_normal(12)).tolist()
        self._qp = 0.0
        self._duty = 0
        self._handover_from = None
        self._n = [0.0] * p.n_pumps
        self._tripped = [False] * p.n_pumps
        self._run_h = list(p.pump_initial_run_hours_h or [8000.0 + 50.0 * i
                                                          for i in range(p.n_pumps)])
        self._x_b = 0.0
        self._x_b_cmd = 0.0
        self._iso = 1.0
        self._iso_cmd = 1.0
        self._iso_rate = 1.0 / p.rack_isolation_stroke_s
        self._rope_leak = False
        self._rope_fault = False
        self._filter_foul = 1.0
        # The issue-4 transmitters (level, filter ΔP) draw from their own stream, so the
        # original sensors' noise (and every seeded figure built on it) is unchanged.
        self._rng2 = np.random.Generator(np.random.PCG64([seed, 0x4C56]))
        self._z2 = []
        self._z2i = 0
        self._s_level = Sensor(
            "reservoir_level_pct", SensorParams(tau_s=5.0, noise_sigma=0.1, quantum=0.1)
        )
        self._s_filter = Sensor(
            "filter_diff_pressure_kpa", SensorParams(tau_s=0.5, noise_sigma=0.3, quantum=0.1)
        )
        self._n_cmd = p.design_flow_lps / p.max_flow_lps
        self._q = p.design_flow_lps
        self._t_ss = self._sp
        self._sup = [self._sp] * p.pipe_tanks
        self._ret = [self._sp] * p.pipe_tanks
        self._q_hx = 0.0
        self._v_inv = self._v_inv0
        self._leak_lps = 0.0
        self._p_loop = 0.0
        self._ce_liq = self._ce_air = self._ce_hx = self._ce_pump = 0.0
        sb = p.supply_sensor_bias_k
        self._sup_bias = sb
        ts = p.temp_sensor
        if p.supply_sensor_tau_s is not None:
            ts = ts.model_copy(update={"tau_s": p.supply_sensor_tau_s})
        self._s_sa = Sensor("supply_temp_c", ts, sb[0])
        self._s_sb = Sensor("supply_temp_b_c", ts, sb[1])
        self._s_sc = Sensor("supply_temp_c_c", ts, sb[2])
        self._s_ret = Sensor("return_temp_c", p.temp_sensor, p.return_sensor_bias_k)
        self._s_fws = Sensor("facility_supply_temp_c", p.temp_sensor, p.facility_sensor_bias_k)
        self._s_flow = Sensor("flow_lpm", p.flow_sensor)
        self._s_dp = Sensor("diff_pressure_kpa", p.pressure_sensor)
        self._s_heat = Sensor("heat_removed_kw", p.heat_meter)
        self._s_loop = Sensor("loop_pressure_kpa", p.pressure_sensor)
        self._sensors = {
            s.name: s
            for s in (
                self._s_sa,
                self._s_sb,
                self._s_sc,
                self._s_ret,
                self._s_fws,
                self._s_flow,
                self._s_dp,
                self._s_heat,
                self._s_loop,
                self._s_level,
                self._s_filter,
            )
        }
        self.warm_start(0.0)

    # --- properties ------------------------------------------------------------------------

    @property
    def params(self) -> CduParams:
        """The parameter set."""
        return self._p

    @property
    def time_s(self) -> float:
        """Plant time, s since construction."""
        return self._t

    @property
    def racks(self) -> tuple[RackThermal, ...]:
        """The rack thermal models on this CDU (one unless ``params.n_racks`` > 1)."""
        return self._racks

    @property
    def local_control(self) -> bool:
        """True while the CDU runs its own supply-temperature loop (heartbeat lost)."""
        return self._local

    @property
    def sensors(self) -> dict[str, Sensor]:
        """The simulated transmitters by point name (for fault injection and inspection)."""
        return dict(self._sensors)

    # --- steady state ----------------------------------------------------------------------

    def capacity_w(
        self,
        supply_temp_c: float,
        facility_supply_temp_c: float,
        valve_position_pct: float = 100.0,
        pump_speed_pct: float | None = None,
    ) -> float:
        """Steady-state rack IT power (W) the plant removes at ``supply_temp_c``.

        With the valve at ``valve_position_pct`` (100 = open) and the pump at
        ``pump_speed_pct`` (default design speed). REFERENCE §4.4: ≈52 kW per K of approach
        with the defaults (41 °C → ≈208 kW at 45 °C). 0 when supply ≤ facility temperature.
        For a row CDU it is the total over its racks.
        """
        n = pump_speed_pct if pump_speed_pct is not None else self._p.design_pump_speed_pct
        q = self._qmax * n / 100.0
        k = hx_conductance_kw_per_k(q, self._valve_flow(valve_position_pct / 100.0), self._p)
        dt_k = supply_temp_c - facility_supply_temp_c
        if k <= 0.0 or dt_k <= 0.0:
            return 0.0
        q_liq = dt_k / (1.0 / k - 1.0 / (self._rhoc_s * q))
        return 1000.0 * q_liq / self._rack.params.liquid_fraction

    def warm_start(
        self,
        rack_power_w: float | Sequence[float],
        supply_setpoint_c: float | None = None,
        facility_supply_temp_c: float | None = None,
        pump_speed_pct: float | None = None,
        *,
        gpu_power_w: np.ndarray | Sequence[np.ndarray] | None = None,
    ) -> WarmStartResult:
        """Put the plant at the steady state where a valve position holds the setpoint.

        Bisection on the valve position (REFERENCE §4.4 method). Every tank, node, GPU plate
        and sensor lag is set to its steady value; pumps healthy, duty A at ``pump_speed_pct``
        (default design speed); valve command = position; remote control with a fresh
        heartbeat; energy counters reset. ``supply_setpoint_c`` also becomes the local-control
        setpoint register. Plant time is not reset. ``rack_power_w`` and ``gpu_power_w`` are
        as in `step` (with ``gpu_power_w`` the racks settle in GPU mode).

        Raises:
            ValueError: power outside [0, 2 × rack_max_power_w], setpoint outside 20–60 °C,
                pump speed outside [pump_min_speed_pct, 100], non-finite input, wrong number
                of per-rack values.
        """
        p = self._p
        sp = p.supply_temp_setpoint_c if supply_setpoint_c is None else supply_setpoint_c
        t_fws = (
            p.facility_supply_temp_c if facility_supply_temp_c is None else facility_supply_temp_c
        )
        n_pct = p.design_pump_speed_pct if pump_speed_pct is None else pump_speed_pct
        powers = self._rack_powers(rack_power_w)
        gpus = self._gpu_powers(gpu_power_w)
        if not (20.0 <= sp <= 60.0):
            raise ValueError(f"supply setpoint {sp} °C outside 20–60 °C")
        if not (-20.0 <= t_fws <= 95.0):
            raise ValueError(f"facility_supply_temp_c {t_fws} outside −20–95 °C")
        if not (p.pump_min_speed_pct <= n_pct <= 100.0):
            raise ValueError(f"pump_speed_pct {n_pct} outside [{p.pump_min_speed_pct}, 100]")
        n = n_pct / 100.0
        q = self._qmax * n
        cs = self._rhoc_s * q
        q_liq = self._rack.params.liquid_fraction * sum(powers) / 1000.0
        rise = q_liq / cs

        def t_ss_at(x: float) -> float:
            k = hx_conductance_kw_per_k(q, self._valve_flow(x), p)
            return t_fws + q_liq / k - rise

        holds = True
        if q_liq <= 0.0:
            x, t_ss = 0.0, sp
        elif t_ss_at(1.0) > sp:
            x, t_ss, holds = 1.0, t_ss_at(1.0), False
        else:
            lo, hi = 0.0, 1.0  # t_ss_at decreases with x; invariant t_ss_at(hi) <= sp
            for _ in range(60):
                mid = 0.5 * (lo + hi)
                if t_ss_at(mid) > sp:
                    lo = mid
                else:
                    hi = mid
            x = hi
            t_ss = t_ss_at(x)
            holds = abs(t_ss - sp) < 1e-6
        # state
        self._sp = sp
        self._t_fws = t_fws
        self._x = self._x_cmd = self._remote_cmd = self._x_act = x
        self._act_moving = self._act_b_moving = False
        self._remote_written = False
        self._qp = self._valve_flow(x)
        self._duty = 0
        self._handover_from = None
        self._n = [n if i == 0 else 0.0 for i in range(self._n_pumps)]
        self._tripped = [False] * self._n_pumps
        self._n_cmd = n
        self._x_b = self._x_b_cmd = self._x_b_act = 0.0
        self._iso = self._iso_cmd = 1.0
        self._q = q
        self._t_ss = t_ss
        self._sup = [t_ss] * p.pipe_tanks
        q_r = q * self._q_share
        t_r = 0.0
        for i, rack in enumerate(self._racks):
            t_r += rack.settle(t_ss, q_r, powers[i], None if gpus is None else gpus[i])
        t_r *= self._q_share
        self._ret = [t_r] * p.pipe_tanks
        self._q_hx = q_liq
        self._local = False
        self._hb_change_t = self._t
        self._ce_liq = self._ce_air = self._ce_hx = self._ce_pump = 0.0
        self._p_loop = self._static_pressure_kpa()
        self._s_sa.reset(t_ss)
        self._s_sb.reset(t_ss)
        self._s_sc.reset(t_ss)
        self._s_ret.reset(t_r)
        self._s_fws.reset(t_fws)
        self._s_flow.reset(q * 60.0)
        self._s_dp.reset(self._k_sys * q * q)
        self._s_heat.reset(q_liq)
        self._s_loop.reset(self._p_loop)
        self._s_level.reset(self._level_pct())
        self._s_filter.reset(self._filter_dp_kpa(q))
        return WarmStartResult(100.0 * x, t_ss, holds)

    # --- stepping --------------------------------------------------------------------------

    def _noise(self) -> list[float]:
        self._z = self._rng.standard_normal(_NOISE_BLOCK).tolist()
        self._zi = 0
        return self._z

    def _rack_powers(self, rack_power_w: float | Sequence[float]) -> list[float]:
        n = len(self._racks)
        if isinstance(rack_power_w, int | float):
            powers = [float(rack_power_w)] * n
        else:
            powers = [float(v) for v in rack_power_w]
            if len(powers) != n:
                raise ValueError(f"rack_power_w needs {n} values (one per rack), got {len(powers)}")
        for v in powers:
            if not (0.0 <= v <= self._p_in_max_w):
                raise ValueError(f"rack_power_w {v} outside [0, {self._p_in_max_w}]")
        return powers

    def _gpu_powers(
        self, gpu_power_w: np.ndarray | Sequence[np.ndarray] | None
    ) -> list[np.ndarray] | None:
        if gpu_power_w is None:
            return None
        n = len(self._racks)
        arrs = [gpu_power_w] if isinstance(gpu_power_w, np.ndarray) else list(gpu_power_w)
        if len(arrs) != n:
            raise ValueError(f"gpu_power_w needs {n} arrays (one per rack), got {len(arrs)}")
        out = []
        for a in arrs:
            a = np.asarray(a, dtype=float)
            if not (a.size and a.min() >= 0.0 and math.isfinite(a.sum())):
                raise ValueError("gpu_power_w must be finite and >= 0 W")
            out.append(a)
        return out

    def step(
        self,
        rack_power_w: float | Sequence[float],
        facility_supply_temp_c: float,
        dt: float = 0.1,
        *,
        gpu_power_w: np.ndarray | Sequence[np.ndarray] | None = None,
    ) -> None:
        """Advance the plant by ``dt`` s (REFERENCE §4.2 items 1–7, 9, 10).

        Args:
            rack_power_w: rack IT power demand (before GPU throttling), W: one value (every
                rack of a row CDU gets it) or one per rack.
            facility_supply_temp_c: facility water supply temperature, °C.
            dt: step, s (0 < dt ≤ 1).
            gpu_power_w: per-GPU power demand, the GPU part of ``rack_power_w`` (an array of
                shape ``(n_trays × gpus_per_tray,)``, or one per rack): the racks step in GPU
                mode (`RackThermal.step_gpus`). None: the §4 hottest-GPU-per-tray model.

        Raises:
            ValueError: non-finite or out-of-range input (power outside
                [0, 2 × rack_max_power_w], facility temperature outside −20–95 °C, wrong
                number of per-rack values or GPU array shape); nothing changes.
        """
        racks = self._racks
        # (int, float): a tuple, not a union built on every step
        if len(racks) == 1 and isinstance(rack_power_w, (int, float)):
            if not (0.0 <= rack_power_w <= self._p_in_max_w):
                raise ValueError(f"rack_power_w {rack_power_w} outside [0, {self._p_in_max_w}]")
            powers = [rack_power_w]
        else:
            powers = self._rack_powers(rack_power_w)
        gpus = None if gpu_power_w is None else self._gpu_powers(gpu_power_w)
        if gpus is not None:
            for a in gpus:
                if a.shape != (racks[0].n_gpus,):
                    raise ValueError(
                        f"gpu_power_w needs shape ({racks[0].n_gpus},), got {a.shape}"
                    )
        if not (-20.0 <= facility_supply_temp_c <= 95.0):
            raise ValueError(f"facility_supply_temp_c {facility_supply_temp_c} outside −20–95 °C")
        if not (0.0 < dt <= 1.0):
            raise ValueError(f"dt {dt} outside (0, 1] s")
        t = self._t + dt
        self._t = t
        t_fws = facility_supply_temp_c
        self._t_fws = t_fws

        # heartbeat watchdog and local control (the CDU's own PI at 1 Hz)
        if not self._local:
            if t - self._hb_change_t >= self._hb_timeout:
                self._enter_local()
        elif t >= self._pi_next_t:
            self._pi_next_t += self._p.local_pi_period_s
            self._local_pi()

        # 1. valve: rate-limited, equal-percentage
        x = self._x
        if not self._ideal_valve:
            if not self._valve_stuck:
                x, self._x_act, self._act_moving = self._travel(
                    x, self._x_act, self._act_moving, self._x_cmd, dt)
                self._x = x
        elif not self._valve_stuck:
            d = self._x_cmd - x
            m = dt * self._valve_rate
            if d > m:
                d = m
            elif d < -m:
                d = -m
            x += d
            self._x = x
        qp = self._qp_max * math.exp((x - 1.0) * self._ln_r) if x > 0.0 else 0.0
        xb = self._x_b
        if xb > 0.0 or self._x_b_cmd > 0.0:  # second valve (parallel): flows add, capped
            if self._valve_b_stuck:  # frozen where it is
                pass
            elif self._ideal_valve:
                d = self._x_b_cmd - xb
                m = dt * self._valve_rate
                xb += m if d > m else -m if d < -m else d
                self._x_b = xb
            else:
                xb, self._x_b_act, self._act_b_moving = self._travel(
                    xb, self._x_b_act, self._act_b_moving, self._x_b_cmd, dt)
                self._x_b = xb
            if xb > 0.0:
                qp += self._qp_max * math.exp((xb - 1.0) * self._ln_r)
                if qp > self._qp_max:
                    qp = self._qp_max
        self._qp = qp
        iso = self._iso
        if iso != self._iso_cmd:  # rack isolation valves travel
            d = self._iso_cmd - iso
            m = dt * self._iso_rate
            iso += m if d > m else -m if d < -m else d
            self._iso = iso

        # 2. pumps: VFD ramp, coast-down after a trip, flow lag
        p = self._p
        ns = self._n
        ramp = p.pump_vfd_ramp_pct_per_s * 0.01 * dt
        coast = dt / p.pump_coast_tau_s
        if coast > 1.0:
            coast = 1.0
        nmax = 0.0
        pump_kw = 0.0
        hand = self._handover_from
        if hand is not None and (
            self._tripped[hand] or ns[self._duty] >= self._n_cmd - 0.01
            or self._tripped[self._duty]
        ):
            hand = self._handover_from = None  # the new duty pump is at speed (or a trip)
        dt_h = dt / 3600.0
        for i in range(self._n_pumps):
            ni = ns[i]
            if self._tripped[i]:
                ni -= ni * coast
            else:
                d = (self._n_cmd if i == self._duty or i == hand else 0.0) - ni
                if d > ramp:
                    d = ramp
                elif d < -ramp:
                    d = -ramp
                ni += d
            ns[i] = ni
            if ni > nmax:
                nmax = ni
            if ni > 0.01:
                self._run_h[i] += dt_h
            pump_kw += ni * ni * ni
        pump_kw *= self._pump_p0_kw
        a_q = dt / p.flow_tau_s
        if a_q > 1.0:
            a_q = 1.0
        q = self._q + (self._qmax * nmax * iso - self._q) * a_q
        self._q = q
        cs = self._rhoc_s * q

        # 3. plate HX (ε-NTU counterflow, flow-dependent UA)
        sup = self._sup
        ret = self._ret
        t_rc = ret[-1]
        if q > 1e-9 and qp > 1e-9:
            hx_e = self._hx_exp
            ua = self._ua2 / ((self._q0 / q) ** hx_e + (self._qp_ref / qp) ** hx_e)
            cp = self._rhoc_p * qp
            if cs < cp:
                cmin = cs
                cr = cs / cp
            else:
                cmin = cp
                cr = cp / cs
            ntu = ua / cmin
            if cr > 0.999999999:
                eps = ntu / (1.0 + ntu)
            else:
                e = math.exp(-ntu * (1.0 - cr))
                eps = (1.0 - e) / (1.0 - cr * e)
            q_hx = eps * cmin * (t_rc - t_fws)
        else:
            q_hx = 0.0
        self._q_hx = q_hx

        # 4.–7. pipes (tanks in series), CDU node, rack: all from the state before the step
        t_ss0 = self._t_ss
        t_in0 = sup[-1]
        if len(racks) == 1:
            t_r0 = racks[0].t_out_c
        else:
            t_r0 = sum(r.t_out_c for r in racks) * self._q_share
        a_t = cs * dt / self._c_tank
        if a_t > 1.0:
            a_t = 1.0
        for k in range(len(sup) - 1, 0, -1):
            sup[k] += (sup[k - 1] - sup[k]) * a_t
            ret[k] += (ret[k - 1] - ret[k]) * a_t
        sup[0] += (t_ss0 - sup[0]) * a_t
        ret[0] += (t_r0 - ret[0]) * a_t
        self._t_ss = t_ss0 + (cs * (t_rc - t_ss0) - q_hx) * dt / self._c_cdu
        if gpus is None and len(racks) == 1:  # the §4 model, valvey's lock-step: keep it lean
            rack = racks[0]
            p_liq = rack.step(t_in0, q, powers[0], dt)
            p_it_kw = rack.power_w * 0.001
        else:
            q_r = q * self._q_share
            p_liq = 0.0
            p_it_kw = 0.0
            for i, rack in enumerate(racks):
                if gpus is None:
                    p_liq += rack.step(t_in0, q_r, powers[i], dt)
                else:
                    p_liq += rack.step_gpus(t_in0, q_r, powers[i], gpus[i], dt)
                p_it_kw += rack.power_w * 0.001

        # 9. inventory (leak) and static pressure
        if self._leak_lps:  # leaks are downstream of the rack isolation valves [U]
            v = self._v_inv - self._leak_lps * iso * dt
            self._v_inv = v if v > 0.0 else 0.0

        # energy counters (kJ)
        self._ce_liq += p_liq * dt
        self._ce_air += (p_it_kw - p_liq) * dt
        self._ce_hx += q_hx * dt
        self._ce_pump += pump_kw * dt

        # 10. sensors
        zi = self._zi
        z = self._z if zi + 9 <= len(self._z) else self._noise()
        zi = self._zi
        self._zi = zi + 9
        t_ss = self._t_ss
        if self._pink_sigma > 0.0:
            self._pink_step(dt)
        self._s_sa.update(t_ss, dt, z[zi])
        self._s_sb.update(t_ss, dt, z[zi + 1])
        self._s_sc.update(t_ss, dt, z[zi + 2])
        self._s_ret.update(ret[-1], dt, z[zi + 3])
        self._s_fws.update(t_fws, dt, z[zi + 4])
        self._s_flow.update(q * 60.0, dt, z[zi + 5])
        self._s_dp.update(self._k_sys * q * q, dt, z[zi + 6])
        self._s_heat.update(q_hx, dt, z[zi + 7])
        self._p_loop = self._static_pressure_kpa()
        self._s_loop.update(self._p_loop, dt, z[zi + 8])
        z2i = self._z2i
        if z2i + 2 > len(self._z2):
            self._z2 = self._rng2.standard_normal(_NOISE_BLOCK).tolist()
            z2i = 0
        self._z2i = z2i + 2
        z2 = self._z2
        self._s_level.update(self._level_pct(), dt, z2[z2i])
        self._s_filter.update(self._filter_dp_kpa(q), dt, z2[z2i + 1])

    # --- plant-family non-idealities (issue 21) ----------------------------------------------

    def _travel(
        self, x: float, a: float, moving: bool, cmd: float, dt: float
    ) -> tuple[float, float, bool]:
        """One valve's travel with stiction and backlash: the actuator ``a`` moves at the
        stroke rate towards ``cmd``; at rest it starts only when ``|cmd − a|`` exceeds the
        stick band and, once moving, runs to the demand and sticks again; the plug ``x``
        follows ``a`` through a dead zone of ± half the backlash (the seat and the full-open
        stop take up the slack). Returns ``(x, a, moving)``."""
        d = cmd - a
        if not moving and (d > self._stiction or -d > self._stiction):
            moving = True
        if moving:
            m = dt * self._valve_rate
            if d > m:
                a += m
            elif d < -m:
                a -= m
            else:
                a = cmd
                moving = False
        h = self._backlash_h
        if a <= 0.0:
            x = 0.0
        elif a >= 1.0:
            x = 1.0
        elif x < a - h:
            x = a - h
        elif x > a + h:
            x = a + h
        return x, a, moving

    def _pink_step(self, dt: float) -> None:
        """Advance the supply sensors' 1/f noise (four AR(1) processes each, τ 0.3–300 s,
        equal variance σ²/4) and put it in the sensors' bias."""
        if dt != self._pink_dt:
            self._pink_dt = dt
            self._pink_a = [math.exp(-dt / tau) for tau in (0.3, 3.0, 30.0, 300.0)]
            sc = self._pink_sigma / 2.0  # each of 4 processes: σ/2, variance σ²/4
            self._pink_b = [sc * math.sqrt(1.0 - a * a) for a in self._pink_a]
        z = self._rng3.standard_normal(12)
        pk = self._pink
        pa = self._pink_a
        pb = self._pink_b
        tot = [0.0, 0.0, 0.0]
        for i in range(12):
            k = i & 3
            v = pa[k] * pk[i] + pb[k] * float(z[i])
            pk[i] = v
            tot[i >> 2] += v
        sb = self._sup_bias
        self._s_sa.bias = sb[0] + tot[0]
        self._s_sb.bias = sb[1] + tot[1]
        self._s_sc.bias = sb[2] + tot[2]
