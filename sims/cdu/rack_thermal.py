"""`RackThermal`: one rack's rack node and GPU cold plates (REFERENCE §4.2 items 6–7)."""

from __future__ import annotations

import math

import numpy as np

from sims.cdu.params import RackParams


class RackThermal:
    """One rack's thermal model: rack node + GPU cold plates (REFERENCE §4.2 items 6–7).

    Fed by whatever supplies it (the CDU's supply pipe, one branch of a row CDU) with an inlet
    temperature (°C), a flow (L/s) and the rack IT power demand (W); its outlet is the rack
    node temperature ``t_out_c``. Power comes in one of two ways, sharing the rack node (so
    the energy balance is the same):

    * `step` (rack power only, the §4 model and valvey's lock-step): GPU power is the rack
      power's GPU share (``P_IT · gpu_max_power_w / rack_max_power_w``) and one hottest GPU
      per tray is modelled (``tray_hotspot_factors``); when a tray's hottest GPU throttles or
      shuts down, the tray's GPUs follow it and the rack heat falls by their share.
    * `step_gpus` (per-GPU power, ``n_trays × gpus_per_tray`` values, from `sims.rack`): every
      GPU's plate is modelled (numpy, vectorised) and throttles or shuts down on its own; the
      rack heat falls by exactly the power the throttled GPUs do not draw. Hotspot factors do
      not apply (each GPU's power is given).

    ``set_conductance_factor(tray, f)`` scales G(Q) of a tray's cold plates (1 = clean; a
    fouled plate is < 1: the overheating-tray fault).

    Args:
        params: `RackParams`.
        design_flow_lps: Q0 of G(Q) = G0·(Q/Q0)^m + G_min (this rack's design flow, L/s).
        rho_c_kj_per_l_k: coolant ρc, kJ/(L·K).
    """

    __slots__ = (
        "_beta",
        "_c_plate",
        "_c_rack",
        "_events",
        "_f_liq",
        "_g0",
        "_g_exp",
        "_g_fac",
        "_g_min",
        "_g_on",
        "_g_p",
        "_g_s",
        "_g_slowed",
        "_g_tj",
        "_g_tp",
        "_gfac",
        "_gpt",
        "_gpu_mode",
        "_gpu_share",
        "_hot",
        "_loss",
        "_n_gpus",
        "_n_trays",
        "_off",
        "_on",
        "_p",
        "_q0",
        "_rhoc",
        "_rjp",
        "_s",
        "_slowed",
        "_t_recover",
        "_t_shut",
        "_t_slow",
        "_tj",
        "_tp",
        "demand_w",
        "liquid_kw",
        "power_w",
        "t_out_c",
    )

    def __init__(self, params: RackParams, design_flow_lps: float, rho_c_kj_per_l_k: float):
        r = params
        self._p = r
        self._q0 = design_flow_lps
        self._rhoc = rho_c_kj_per_l_k
        self._c_rack = rho_c_kj_per_l_k * r.fluid_volume_l + r.metal_heat_capacity_kj_per_k
        self._f_liq = r.liquid_fraction
        self._n_trays = r.n_trays
        self._gpt = r.gpus_per_tray
        self._n_gpus = r.n_trays * r.gpus_per_tray
        self._gpu_share = r.gpu_max_power_w / r.rack_max_power_w  # one GPU's share of P_IT
        self._beta = r.gpu_chain_beta
        self._hot = list(r.tray_hotspot_factors or [1.0] * r.n_trays)
        self._c_plate = r.gpu_plate_heat_capacity_j_per_k
        self._g0 = r.gpu_plate_conductance_w_per_k
        self._g_min = r.gpu_plate_min_conductance_w_per_k
        self._g_exp = r.gpu_conductance_flow_exponent
        self._rjp = r.gpu_junction_resistance_k_per_w
        self._t_slow = r.gpu_max_operating_temp_c + r.gpu_slowdown_offset_k
        self._t_shut = r.gpu_max_operating_temp_c + r.gpu_shutdown_offset_k
        self._t_recover = self._t_slow - r.gpu_throttle_hysteresis_k
        self._gfac = [1.0] * r.n_trays
        self._g_fac = np.ones(self._n_gpus)
        self._gpu_mode = False
        self._tp: list[float] = []
        self._tj: list[float] = []
        self._s: list[float] = []
        self._on: list[bool] = []
        self._slowed: list[bool] = []
        n = self._n_gpus
        self._g_tp = np.zeros(n)
        self._g_tj = np.zeros(n)
        self._g_p = np.zeros(n)
        self._g_s = np.ones(n)
        self._g_on = np.ones(n, dtype=bool)
        self._g_slowed = np.zeros(n, dtype=bool)
        self._off = 0
        self._loss = 0.0
        self._events = 0
        self.t_out_c = 45.0
        self.power_w = self.demand_w = self.liquid_kw = 0.0
        self.settle(45.0, design_flow_lps, 0.0)

    @property
    def params(self) -> RackParams:
        """The rack parameters."""
        return self._p

    @property
    def heat_capacity_kj_per_k(self) -> float:
        """C_r = ρc·V_rack + C_metal, kJ/K (191 kJ/K with the defaults, REFERENCE §1.7)."""
        return self._c_rack

    @property
    def gpu_mode(self) -> bool:
        """True when the last step or settle had per-GPU power (`step_gpus`)."""
        return self._gpu_mode

    @property
    def n_gpus(self) -> int:
        """GPUs on the rack (n_trays × gpus_per_tray; 72 for an NVL72)."""
        return self._n_gpus

    def stored_energy_kj(self) -> float:
        """Heat in the rack node relative to 0 °C, kJ (plates are part of C_metal)."""
        return self._c_rack * self.t_out_c

    def _conductance_w_per_k(self, flow_lps: float) -> float:
        if flow_lps <= 0.0:
            return self._g_min
        return self._g0 * (flow_lps / self._q0) ** self._g_exp + self._g_min

    # --- fouling ---------------------------------------------------------------------------

    def set_conductance_factor(self, tray: int, factor: float) -> None:
        """Scale G(Q) of tray ``tray``'s cold plates by ``factor`` (1 = clean; e.g. 0.4 for a
        fouled plate, the overheating-tray fault; REFERENCE §3.4 "failed cold plate").

        Raises:
            ValueError: no such tray, or factor outside (0, 2].
        """
        if not (isinstance(tray, int) and 0 <= tray < self._n_trays):
            raise ValueError(f"tray {tray!r} outside 0..{self._n_trays - 1}")
        if not (0.0 < factor <= 2.0 and math.isfinite(factor)):
            raise ValueError(f"conductance factor {factor!r} outside (0, 2]")
        self._gfac[tray] = float(factor)
        self._g_fac[tray * self._gpt : (tray + 1) * self._gpt] = factor

    @property
    def conductance_factors(self) -> tuple[float, ...]:
        """Per-tray cold-plate conductance factors (1 = clean)."""
        return tuple(self._gfac)

    # --- steady state ------------------------------------------------------------------------

    def settle(
        self,
        t_in_c: float,
        flow_lps: float,
        power_w: float,
        gpu_power_w: np.ndarray | None = None,
    ) -> float:
        """Steady state at this inlet, flow (> 0 L/s) and power, GPUs on and unthrottled;
        returns the outlet temperature (°C). With ``gpu_power_w`` (shape ``(n_gpus,)``, W) the
        per-GPU plates settle on those powers (GPU mode); else on the GPU share of
        ``power_w``.

        Raises:
            ValueError: ``flow_lps`` not > 0 (no steady state without flow), or
                ``gpu_power_w`` of the wrong shape.
        """
        if not flow_lps > 0.0:
            raise ValueError("RackThermal.settle needs flow_lps > 0")
        cs = self._rhoc * flow_lps
        liquid_kw = self._f_liq * power_w * 0.001
        rise = liquid_kw / cs
        self.t_out_c = t_in_c + rise
        self.power_w = self.demand_w = power_w
        self.liquid_kw = liquid_kw
        g = self._conductance_w_per_k(flow_lps)
        t_loc = t_in_c + self._beta * rise
        p_gpu = power_w * self._gpu_share
        gf = self._gfac
        self._tp = [t_loc + p_gpu * h / (g * f) for h, f in zip(self._hot, gf, strict=True)]
        self._tj = [tp + self._rjp * p_gpu * h for tp, h in zip(self._tp, self._hot, strict=True)]
        if gpu_power_w is None:
            self._gpu_mode = False
            gw = np.repeat(np.asarray(self._hot) * p_gpu, self._gpt)
        else:
            gw = self._check_gpu_power(gpu_power_w)
            self._gpu_mode = True
        self._g_tp = t_loc + gw / (g * self._g_fac)
        self._g_tj = self._g_tp + self._rjp * gw
        self._g_p = gw.copy()
        self.reset_gpus()
        self._events = 0
        return self.t_out_c

    def _check_gpu_power(self, gpu_power_w: np.ndarray) -> np.ndarray:
        gw = np.asarray(gpu_power_w, dtype=float)
        if gw.shape != (self._n_gpus,):
            raise ValueError(f"gpu_power_w needs shape ({self._n_gpus},), got {gw.shape}")
        return gw

    # --- stepping ----------------------------------------------------------------------------

    def _rack_node(self, t_in_c: float, flow_lps: float, power_w: float, p_eff: float,
                   dt: float) -> tuple[float, float]:
        self.demand_w = power_w
        self.power_w = p_eff
        p_liq = self._f_liq * p_eff * 0.001
        self.liquid_kw = p_liq
        cs = self._rhoc * flow_lps
        t_r0 = self.t_out_c
        self.t_out_c = t_r0 + (p_liq + cs * (t_in_c - t_r0)) * dt / self._c_rack
        return p_liq, cs

    def step(self, t_in_c: float, flow_lps: float, power_w: float, dt: float) -> float:
        """Advance by ``dt`` s with inlet ``t_in_c`` (°C), ``flow_lps`` and demand ``power_w``
        (W); the rack node uses its own value from before the step. Returns the heat into the
        liquid this step, kW (f_liq × IT power after throttling)."""
        if self._gpu_mode:
            self._to_tray_mode()
        gpu_w = power_w * self._gpu_share
        p_eff = power_w - gpu_w * self._gpt * self._loss  # throttle state of the last step
        self.demand_w = power_w
        self.power_w = p_eff
        p_liq = self._f_liq * p_eff * 0.001
        self.liquid_kw = p_liq
        cs = self._rhoc * flow_lps
        t_r0 = self.t_out_c
        self.t_out_c = t_r0 + (p_liq + cs * (t_in_c - t_r0)) * dt / self._c_rack

        # GPU sub-model: local coolant capped at the plate temperature (REFERENCE §5.1)
        if flow_lps > 0.0:
            g = self._g0 * (flow_lps / self._q0) ** self._g_exp + self._g_min
        else:
            g = self._g_min
        t_loc_f = t_in_c + self._beta * p_liq / cs if cs > 1e-9 else math.inf
        k_p = dt / self._c_plate
        rjp = self._rjp
        t_slow = self._t_slow
        tps = self._tp
        tjs = self._tj
        ss = self._s
        on = self._on
        hot = self._hot
        gf = self._gfac
        loss = 0.0
        for k in range(self._n_trays):
            tp = tps[k]
            t_loc = t_loc_f if t_loc_f < tp else tp
            if on[k]:
                sk = ss[k]
                pk = gpu_w * hot[k] * sk
                tp += k_p * (pk - g * gf[k] * (tp - t_loc))
                tps[k] = tp
                tj = tp + rjp * pk
                tjs[k] = tj
                if tj > t_slow or sk < 1.0:
                    sk = self._throttle(k, tj, sk, dt)
                    loss += 1.0 - sk
            else:
                tp -= k_p * g * gf[k] * (tp - t_loc)
                tps[k] = tp
                tjs[k] = tp
                loss += 1.0
        self._loss = loss
        return p_liq

    def step_gpus(
        self,
        t_in_c: float,
        flow_lps: float,
        power_w: float,
        gpu_power_w: np.ndarray,
        dt: float,
    ) -> float:
        """Advance by ``dt`` s with per-GPU power (GPU mode).

        Args:
            t_in_c: rack inlet temperature, °C.
            flow_lps: this rack's coolant flow, L/s.
            power_w: rack IT power demand (GPUs + everything else), W.
            gpu_power_w: the GPUs' share of it, shape ``(n_gpus,)``, W (tray-major: tray k
                holds GPUs ``k·gpus_per_tray …``).
            dt: step, s.

        Each GPU draws ``gpu_power_w × scale``, its throttle scale of the last step (0 when
        shut down); the rack heat is ``power_w`` minus what throttled GPUs do not draw.
        Returns the heat into the liquid this step, kW.

        Raises:
            ValueError: ``gpu_power_w`` of the wrong shape.
        """
        gw = self._check_gpu_power(gpu_power_w)
        if not self._gpu_mode:
            self._to_gpu_mode()
        s = self._g_s
        p_act = gw * s
        p_eff = power_w - float(gw.sum() - p_act.sum())
        p_liq, cs = self._rack_node(t_in_c, flow_lps, power_w, p_eff, dt)
        g = self._conductance_w_per_k(flow_lps)
        t_loc_f = t_in_c + self._beta * p_liq / cs if cs > 1e-9 else math.inf
        tp = self._g_tp
        t_loc = np.minimum(tp, t_loc_f)
        tp += (dt / self._c_plate) * (p_act - g * self._g_fac * (tp - t_loc))
        tj = tp + self._rjp * p_act
        self._g_tj = tj
        self._g_p = p_act
        on = self._g_on
        r = self._p
        shut = tj > self._t_shut
        shut &= on
        if shut.any():
            on[shut] = False
            s[shut] = 0.0
            self._off += int(shut.sum())
        hot = tj > self._t_slow
        hot &= on
        if hot.any():
            slowed = self._g_slowed
            self._events += int((hot & ~slowed).sum())
            slowed |= hot
            s[hot] = np.maximum(s[hot] - r.gpu_throttle_rate_per_s * dt, r.gpu_throttle_floor)
        rec = (tj < self._t_recover) & on & (s < 1.0)
        if rec.any():
            s[rec] = np.minimum(s[rec] + r.gpu_throttle_recovery_per_s * dt, 1.0)
            self._g_slowed[rec & (s >= 1.0)] = False
        return p_liq

    def _to_gpu_mode(self) -> None:
        """Switch from the hottest-GPU-per-tray state to per-GPU state (same temperatures)."""
        gpt = self._gpt
        self._g_tp = np.repeat(np.asarray(self._tp, dtype=float), gpt)
        self._g_tj = np.repeat(np.asarray(self._tj, dtype=float), gpt)
        self._g_s = np.repeat(np.asarray(self._s, dtype=float), gpt)
        self._g_on = np.repeat(np.asarray(self._on, dtype=bool), gpt)
        self._g_slowed = np.repeat(np.asarray(self._slowed, dtype=bool), gpt)
        self._gpu_mode = True

    def _to_tray_mode(self) -> None:
        """Switch from per-GPU state to one hottest GPU per tray."""
        n, gpt = self._n_trays, self._gpt
        k = self._g_tj.reshape(n, gpt).argmax(axis=1) + np.arange(n) * gpt
        self._tp = self._g_tp[k].tolist()
        self._tj = self._g_tj[k].tolist()
        self._s = self._g_s[k].tolist()
        self._on = self._g_on[k].tolist()
        self._slowed = self._g_slowed[k].tolist()
        self._loss = float(sum(1.0 - v for v in self._s))
        self._gpu_mode = False

    def _throttle(self, k: int, tj: float, sk: float, dt: float) -> float:
        """HW slowdown / shutdown of tray ``k`` (REFERENCE §4.2 item 7); returns its scale."""
        r = self._p
        if tj > self._t_shut:
            self._on[k] = False
            self._off += 1
            self._s[k] = 0.0
            return 0.0
        if tj > self._t_slow:
            if not self._slowed[k]:
                self._slowed[k] = True
                self._events += 1
            sk -= r.gpu_throttle_rate_per_s * dt
            if sk < r.gpu_throttle_floor:
                sk = r.gpu_throttle_floor
        elif tj < self._t_recover:
            sk += r.gpu_throttle_recovery_per_s * dt
            if sk >= 1.0:
                sk = 1.0
                self._slowed[k] = False
        self._s[k] = sk
        return sk

    def reset_gpus(self) -> None:
        """Power shut-down GPUs back on and clear throttling (operator action)."""
        self._on = [True] * self._n_trays
        self._s = [1.0] * self._n_trays
        self._slowed = [False] * self._n_trays
        n = self._n_gpus
        self._g_on = np.ones(n, dtype=bool)
        self._g_s = np.ones(n)
        self._g_slowed = np.zeros(n, dtype=bool)
        self._off = 0
        self._loss = 0.0

    # --- outputs -----------------------------------------------------------------------------

    @property
    def gpu_tj_c(self) -> tuple[float, ...]:
        """Hottest-GPU junction temperature per tray, °C, as the throttle logic last saw it."""
        if self._gpu_mode:
            return tuple(self._g_tj.reshape(self._n_trays, self._gpt).max(axis=1).tolist())
        return tuple(self._tj)

    @property
    def gpu_junction_temps_c(self) -> np.ndarray:
        """Every GPU's junction temperature, °C, shape ``(n_gpus,)`` (a copy). In tray mode
        the tray's hottest-GPU value stands for its GPUs."""
        if self._gpu_mode:
            return self._g_tj.copy()
        return np.repeat(np.asarray(self._tj, dtype=float), self._gpt)

    @property
    def gpu_plate_temps_c(self) -> np.ndarray:
        """Every GPU's cold-plate temperature, °C, shape ``(n_gpus,)`` (a copy)."""
        if self._gpu_mode:
            return self._g_tp.copy()
        return np.repeat(np.asarray(self._tp, dtype=float), self._gpt)

    @property
    def gpu_scales(self) -> np.ndarray:
        """Every GPU's thermal throttle scale (1 = unthrottled, 0 = shut down), shape
        ``(n_gpus,)`` (a copy)."""
        if self._gpu_mode:
            return self._g_s.copy()
        return np.repeat(np.asarray(self._s, dtype=float), self._gpt)

    @property
    def gpu_on(self) -> np.ndarray:
        """False for shut-down GPUs (latched until `reset_gpus`), shape ``(n_gpus,)``."""
        if self._gpu_mode:
            return self._g_on.copy()
        return np.repeat(np.asarray(self._on, dtype=bool), self._gpt)

    @property
    def gpu_throttled(self) -> np.ndarray:
        """True for GPUs in HW slowdown (above the threshold, or still recovering)."""
        if self._gpu_mode:
            return self._g_on & (self._g_slowed | (self._g_s < 1.0))
        t = [on and (sl or s < 1.0) for on, s, sl in zip(self._on, self._s, self._slowed,
                                                          strict=True)]
        return np.repeat(np.asarray(t, dtype=bool), self._gpt)

    @property
    def gpu_power_drawn_w(self) -> np.ndarray:
        """Power each GPU drew in the last `step_gpus` (after throttling), W (a copy)."""
        return self._g_p.copy()

    @property
    def throttled_trays(self) -> int:
        """Trays in HW slowdown (above the threshold, or still recovering)."""
        if self._gpu_mode:
            return int(self.gpu_throttled.reshape(self._n_trays, self._gpt).any(axis=1).sum())
        return len([  # a count: a list comprehension is cheaper than sum() of a generator
            1
            for on, s, sl in zip(self._on, self._s, self._slowed, strict=True)
            if on and (sl or s < 1.0)
        ])

    @property
    def shutdown_trays(self) -> int:
        """Trays with a shut-down GPU (latched until `reset_gpus`)."""
        if self._gpu_mode:
            return int((~self._g_on).reshape(self._n_trays, self._gpt).any(axis=1).sum())
        return sum(1 for on in self._on if not on)

    @property
    def throttle_events(self) -> int:
        """Entries into HW slowdown since the last settle (per tray, or per GPU in GPU
        mode)."""
        return self._events
