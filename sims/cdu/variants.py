"""The plant family (issue 21): named variants of the CDU plant, each a change of `CduParams`
(parameters of the one plant model, never a fork of its code).

A controller that only works on the nominal plant is tuned to the simulator; the scenarios run
on these variants too (``[plant] variant = "stroke_120s"`` in a scenario, or
``harness.lockstep_valvey.run_valvey(..., variant=...)``). Each variant scales (``scale``)
or sets (``set``) parameters *after* `CduParams.for_rack_power`, so a scaled rack keeps the
variant's relative change (UA −30 % stays −30 % at 230 kW).

==========================  =====================================================================
``nominal``                 REFERENCE §4.3 as is
``stroke_30s/90s/120s``     valve full-stroke time 30 / 90 / 120 s (nominal 60 s; REF §1.5: Belimo
                            90 s)
``rangeability_15/50``      equal-% valve rangeability R 15 / 50 (nominal 30)
``backlash_stiction``       actuator backlash 1 % and stiction band 0.5 % of stroke
``hx_fouled_30``            plate HX UA −30 % (fouling)
``transport_slow_50``       supply/return pipe volume +50 % (transport delay +50 %)
``transport_fast_50``       pipe volume −50 % (transport delay −50 %)
``sensor_lag_2s/10s``       supply sensors A/B/C lag τ 2 s (= the nominal transmitter, REF §4.3)
                            / 10 s (a deep thermowell)
``pink_noise``              1/f noise σ 0.05 K on each supply sensor (on top of the white 0.03 K)
``common_bias``             +0.3 K calibration bias common to supply sensors A, B, C (voting
                            cannot see it: the floor of any controller is the bias itself)
``facility_starved``        the building delivers 60 % of the facility water flow
``racks_2/3/4``             a row CDU cooling 2 / 3 / 4 racks (`sims.row.VirtualRow`; the CDU's
                            flows, UA, facility flow and pump power × N, `ROW_SCALED_FIELDS`);
                            each rack has its own load (`sims.scenario.Scenario.load_profile`
                            ``rack=k``: steps at other times and of other sizes, bursts of
                            their own seed), so the racks step independently
==========================  =====================================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from sims.cdu.params import ROW_SCALED_FIELDS, CduParams

__all__ = ["VARIANTS", "PlantVariant", "apply_variant", "variant_names"]


@dataclass(frozen=True, slots=True)
class PlantVariant:
    """One member of the plant family: ``scale`` multiplies `CduParams` fields, ``set``
    replaces them (applied after scaling)."""

    name: str
    description: str
    scale: Mapping[str, float] = field(default_factory=dict)
    set: Mapping[str, Any] = field(default_factory=dict)

    def apply(self, params: CduParams) -> CduParams:
        """``params`` changed by this variant (validated: raises `pydantic.ValidationError`
        if the result is not a valid `CduParams`)."""
        data = params.model_dump()
        for k, f in self.scale.items():
            data[k] = data[k] * f
        data.update(self.set)
        return CduParams.model_validate(data)


def _v(name: str, description: str, scale: Mapping[str, float] | None = None,
       **set_: Any) -> PlantVariant:
    return PlantVariant(name, description, dict(scale or {}), set_)


VARIANTS: Mapping[str, PlantVariant] = MappingProxyType({v.name: v for v in (
    _v("nominal", "REFERENCE §4.3 as is"),
    _v("stroke_30s", "valve full stroke 30 s", valve_stroke_time_s=30.0),
    _v("stroke_90s", "valve full stroke 90 s (REF §1.5 Belimo)", valve_stroke_time_s=90.0),
    _v("stroke_120s", "valve full stroke 120 s", valve_stroke_time_s=120.0),
    _v("rangeability_15", "equal-% valve rangeability 15", valve_rangeability=15.0),
    _v("rangeability_50", "equal-% valve rangeability 50", valve_rangeability=50.0),
    _v("backlash_stiction", "actuator backlash 1 %, stiction band 0.5 %",
       valve_backlash_pct=1.0, valve_stiction_pct=0.5),
    _v("hx_fouled_30", "plate HX UA −30 % (fouled)", {"hx_ua_kw_per_k": 0.7}),
    _v("transport_slow_50", "pipe volume +50 % (transport delay +50 %)",
       {"pipe_volume_l": 1.5}),
    _v("transport_fast_50", "pipe volume −50 % (transport delay −50 %)",
       {"pipe_volume_l": 0.5}),
    _v("sensor_lag_2s", "supply sensors τ 2 s (the nominal transmitter)",
       supply_sensor_tau_s=2.0),
    _v("sensor_lag_10s", "supply sensors τ 10 s (deep thermowell)", supply_sensor_tau_s=10.0),
    _v("pink_noise", "1/f noise σ 0.05 K on each supply sensor",
       supply_sensor_pink_noise_k=0.05),
    _v("common_bias", "+0.3 K bias common to supply sensors A, B, C",
       supply_sensor_bias_k=(0.3, 0.3, 0.3)),
    _v("facility_starved", "facility water flow 60 % of design",
       facility_flow_available_fraction=0.6),
    *(_v(f"racks_{n}", f"{n} racks on one row CDU (CDU flows and UA × {n}), each rack's load "
         "stepping on its own", dict.fromkeys(ROW_SCALED_FIELDS, float(n)), n_racks=n)
      for n in (2, 3, 4)),
)})


def variant_names() -> list[str]:
    """Every variant's name, ``nominal`` first."""
    return list(VARIANTS)


def apply_variant(params: CduParams, name: str | None) -> CduParams:
    """``params`` as variant ``name`` (None or ``nominal``: unchanged).

    Raises:
        KeyError: no variant of that name (the message lists the known ones).
    """
    if name is None or name == "nominal":
        return params
    try:
        v = VARIANTS[name]
    except KeyError:
        raise KeyError(f"unknown plant variant {name!r}; known: {', '.join(VARIANTS)}") from None
    return v.apply(params)
