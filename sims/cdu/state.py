"""The CDU plant's state: every field `CduPlant` holds, typed, in one slotted base class
that the plant's parts (`sims.cdu.loop`, `.control`, `.faults`, `.registers`, `.plant`) share.
`CduPlant.__init__` sets them."""

from __future__ import annotations

import numpy as np

from sims.cdu.fence import ControllerFence
from sims.cdu.params import CduParams
from sims.cdu.rack_thermal import RackThermal
from sims.sensors import Sensor


class PlantState:
    """The fields of `CduPlant` (set by its ``__init__``); no behaviour."""

    __slots__ = (
        "_act_b_moving",
        "_act_moving",
        "_backlash_h",
        "_boot_t",
        "_c_cdu",
        "_c_tank",
        "_ce_air",
        "_ce_hx",
        "_ce_liq",
        "_ce_pump",
        "_duty",
        "_fence",
        "_filter_foul",
        "_handover_from",
        "_hb",
        "_hb_change_t",
        "_hb_timeout",
        "_hx_exp",
        "_ideal_valve",
        "_iso",
        "_iso_cmd",
        "_iso_rate",
        "_k_sys",
        "_leak_lps",
        "_ln_r",
        "_local",
        "_n",
        "_n_cmd",
        "_n_pumps",
        "_p",
        "_p_abs0",
        "_p_in_max_w",
        "_p_loop",
        "_pi_i",
        "_pi_next_t",
        "_pink",
        "_pink_a",
        "_pink_b",
        "_pink_dt",
        "_pink_sigma",
        "_pump_p0_kw",
        "_q",
        "_q0",
        "_q_hx",
        "_q_share",
        "_qmax",
        "_qp",
        "_qp_max",
        "_qp_ref",
        "_rack",
        "_racks",
        "_remote_cmd",
        "_remote_written",
        "_ret",
        "_rhoc_p",
        "_rhoc_s",
        "_rng",
        "_rng2",
        "_rng3",
        "_rope_fault",
        "_rope_leak",
        "_run_h",
        "_s_dp",
        "_s_filter",
        "_s_flow",
        "_s_fws",
        "_s_heat",
        "_s_level",
        "_s_loop",
        "_s_ret",
        "_s_sa",
        "_s_sb",
        "_s_sc",
        "_sensors",
        "_sp",
        "_stiction",
        "_sup",
        "_sup_bias",
        "_t",
        "_t_fws",
        "_t_ss",
        "_tripped",
        "_ua2",
        "_v_inv",
        "_v_inv0",
        "_v_tank",
        "_valve_b_stuck",
        "_valve_offset",
        "_valve_rate",
        "_valve_stuck",
        "_x",
        "_x_act",
        "_x_b",
        "_x_b_act",
        "_x_b_cmd",
        "_x_cmd",
        "_z",
        "_z2",
        "_z2i",
        "_zi",
    )

    _boot_t: float
    _c_cdu: float
    _c_tank: float
    _ce_air: float
    _ce_hx: float
    _ce_liq: float
    _ce_pump: float
    _duty: int
    _fence: ControllerFence
    _filter_foul: float
    _handover_from: int | None
    _hb: int
    _hb_change_t: float
    _hb_timeout: float
    _hx_exp: float
    _iso: float
    _iso_cmd: float
    _iso_rate: float
    _k_sys: float
    _leak_lps: float
    _ln_r: float
    _local: bool
    _n: list[float]
    _n_cmd: float
    _n_pumps: int
    _p: CduParams
    _p_abs0: float
    _p_in_max_w: float
    _p_loop: float
    _pi_i: float
    _pi_next_t: float
    _pump_p0_kw: float
    _q: float
    _q0: float
    _q_hx: float
    _q_share: float
    _qmax: float
    _qp: float
    _qp_max: float
    _qp_ref: float
    _rack: RackThermal
    _racks: tuple[RackThermal, ...]
    _remote_cmd: float
    _remote_written: bool
    _ret: list[float]
    _rhoc_p: float
    _rhoc_s: float
    _rng: np.random.Generator
    _rng2: np.random.Generator
    _rope_fault: bool
    _rope_leak: bool
    _run_h: list[float]
    _s_dp: Sensor
    _s_filter: Sensor
    _s_flow: Sensor
    _s_fws: Sensor
    _s_heat: Sensor
    _s_level: Sensor
    _s_loop: Sensor
    _s_ret: Sensor
    _s_sa: Sensor
    _s_sb: Sensor
    _s_sc: Sensor
    _sensors: dict[str, Sensor]
    _sp: float
    _sup: list[float]
    _t: float
    _t_fws: float
    _t_ss: float
    _tripped: list[bool]
    _ua2: float
    _v_inv: float
    _v_inv0: float
    _v_tank: float
    _valve_offset: float
    _valve_rate: float
    _valve_stuck: bool
    _valve_b_stuck: bool
    _x: float
    _x_b: float
    _x_b_cmd: float
    _x_cmd: float
    _z: list[float]
    _z2: list[float]
    _z2i: int
    _zi: int
    _x_act: float
    _x_b_act: float
    _act_moving: bool
    _act_b_moving: bool
    _backlash_h: float
    _stiction: float
    _ideal_valve: bool
    _pink: list[float]
    _pink_sigma: float
    _pink_dt: float
    _pink_a: list[float]
    _pink_b: list[float]
    _rng3: np.random.Generator
    _sup_bias: tuple[float, float, float]
