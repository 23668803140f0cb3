"""The plate heat exchanger: ε-NTU counterflow with flow-dependent UA (REFERENCE §4.2
item 3)."""

from __future__ import annotations

import math

from sims.cdu.params import CduParams


def hx_conductance_kw_per_k(flow_lps: float, facility_flow_lps: float, p: CduParams) -> float:
    """ε·C_min of the counterflow plate HX, kW/K, so that q_hx = ε·C_min·(T_ret − T_fws).

    REFERENCE §4.2 item 3: UA = UA0·2/((Q0/Q)^0.7 + (0.7·Qp_max/Qp)^0.7), ε-NTU counterflow,
    NTU/(1+NTU) when C_r = 1. Zero for zero flow on either side.
    """
    if flow_lps <= 1e-9 or facility_flow_lps <= 1e-9:
        return 0.0
    e = p.hx_flow_exponent
    ua = (
        2.0
        * p.hx_ua_kw_per_k
        / (
            (p.design_flow_lps / flow_lps) ** e
            + (p.hx_primary_ref_fraction * p.facility_max_flow_lps / facility_flow_lps) ** e
        )
    )
    cs = p.coolant_rho_c_kj_per_l_k * flow_lps
    cp = p.facility_rho_c_kj_per_l_k * facility_flow_lps
    cmin, cmax = (cs, cp) if cs < cp else (cp, cs)
    cr = cmin / cmax
    ntu = ua / cmin
    if cr > 1.0 - 1e-9:
        eps = ntu / (1.0 + ntu)
    else:
        x = math.exp(-ntu * (1.0 - cr))
        eps = (1.0 - x) / (1.0 - cr * x)
    return eps * cmin
