"""The CDU loop's hydraulics and inventory: facility valve flow, reservoir level, filter ΔP,
static pressure (expansion tank and PRV) and the heat stored in the loop."""

from __future__ import annotations

import math

from sims.cdu.state import PlantState

ATM_KPA = 101.325


class LoopModel(PlantState):
    """Valve flow, level, filter ΔP, static pressure, stored energy (part of `CduPlant`)."""

    __slots__ = ()

    def _valve_flow(self, x: float) -> float:
        return self._qp_max * math.exp((x - 1.0) * self._ln_r) if x > 0.0 else 0.0

    def _level_pct(self) -> float:
        """Reservoir level: falls with the inventory lost (thermal expansion is the
        expansion tank's, `_static_pressure_kpa`) [U]."""
        p = self._p
        lvl = p.reservoir_initial_level_pct - 100.0 * (self._v_inv0 - self._v_inv) / (
            p.reservoir_volume_l
        )
        return 0.0 if lvl < 0.0 else 100.0 if lvl > 100.0 else lvl

    def _filter_dp_kpa(self, q: float) -> float:
        """Filter ΔP ∝ Q² × fouling factor [U]."""
        r = q / self._q0
        return self._p.filter_diff_pressure_design_kpa * self._filter_foul * r * r

    def _static_pressure_kpa(self) -> float:
        """Expansion-tank model: isothermal gas cushion squeezed by thermal expansion and
        inventory change; vents through the PRV above its setting (updates inventory)."""
        p = self._p
        heat_sum = (
            p.cdu_volume_l * self._t_ss
            + p.rack.fluid_volume_l * sum(r.t_out_c for r in self._racks)
            + self._v_tank * (sum(self._sup) + sum(self._ret))
        )
        dv = p.coolant_expansion_per_k * (heat_sum - self._v_inv0 * p.fill_temp_c) + (
            self._v_inv - self._v_inv0
        )
        vg0 = p.expansion_tank_gas_volume_l
        p_max_abs = p.relief_valve_kpa + ATM_KPA
        dv_max = vg0 * (1.0 - self._p_abs0 / p_max_abs)
        if dv > dv_max:  # PRV opens: vent the excess
            self._v_inv -= dv - dv_max
            return p.relief_valve_kpa
        p_g = self._p_abs0 * vg0 / (vg0 - dv) - ATM_KPA
        return p_g if p_g > 0.0 else 0.0

    def stored_energy_kj(self) -> float:
        """Heat stored in the loop relative to 0 °C, kJ (CDU node, pipes, rack node)."""
        return (
            self._c_cdu * self._t_ss
            + sum(r.stored_energy_kj() for r in self._racks)
            + self._c_tank * (sum(self._sup) + sum(self._ret))
        )
