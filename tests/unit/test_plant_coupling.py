"""Never tune to the simulator: the controllers and detectors (valvey, racky) must not embed
the nominal simulated plant's identifying constants (sims/cdu/params.py). What they need of the
plant they learn from it, or the site gives as a nameplate figure.

Two checks, both against figures derived here from `sims.cdu.params` (never typed in):

* settings defaults: a valvey/racky setting that names a plant quantity (rack maximum power,
  design flow, liquid fraction, valve stroke, cold-plate time constant) has no default within
  5 % of the nominal plant's;
* literals: no numeric literal in valvey/core, racky/core or the two daemons' config modules
  equals a figure that identifies the nominal plant (its rack power in W and kW, its design
  flow in L/min and L/s, its cold plate's C/G).

`KNOWN` lists what is still coupled, each with why; an entry that no longer matches fails too,
so the list cannot go stale.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from racky.config import RackyConfig
from sims.cdu.params import CduParams
from valvey.config import ValveyConfig

ROOT = Path(__file__).resolve().parents[2]
SCANNED = [*sorted((ROOT / "valvey" / "core").glob("*.py")),
           *sorted((ROOT / "racky" / "core").glob("*.py")),
           ROOT / "valvey" / "config.py", ROOT / "racky" / "config.py"]

_P = CduParams()
_R = _P.rack
PLATE_TAU_S = _R.gpu_plate_heat_capacity_j_per_k / _R.gpu_plate_conductance_w_per_k

QUANTITIES: dict[str, float] = {
    "rack maximum power [W]": _R.rack_max_power_w,
    "design flow [L/min]": _P.design_flow_lps * 60.0,
    "liquid fraction": _R.liquid_fraction,
    "valve stroke [s]": _P.valve_stroke_time_s,
    "cold-plate time constant [s]": PLATE_TAU_S,
}
"""The nominal plant's figures a controller setting could copy."""

FIELD_QUANTITY: dict[str, str] = {
    "rack_max_power_w": "rack maximum power [W]",
    "design_flow_lpm": "design flow [L/min]",
    "flow_setpoint_lpm": "design flow [L/min]",
    "liquid_fraction": "liquid fraction",
    "stroke_time_s": "valve stroke [s]",
    "stroke_prior_s": "valve stroke [s]",
    "plate_tau_s": "cold-plate time constant [s]",
}
"""Setting name (last part of its key) → the plant quantity it stands for."""

IDENTIFYING: dict[str, float] = {
    "rack maximum power [W]": _R.rack_max_power_w,
    "rack maximum power [kW]": _R.rack_max_power_w / 1000.0,
    "design flow [L/min]": _P.design_flow_lps * 60.0,
    "design flow [L/s]": _P.design_flow_lps,
    "cold-plate time constant [s]": PLATE_TAU_S,
}
"""Figures distinctive enough that a literal equal to one is a copy of the nominal plant
(0.85 or 60 are not: 0.85 K and 60 s are everywhere for other reasons)."""

KNOWN: dict[str, str] = {
    "valvey.capacity.liquid_fraction": (
        "the cold prior of the learned liquid fraction equals the nominal 0.85: with 1.0 (the "
        "conservative prior) S4 without a second valve over-caps 17.2 % (target <= 10 %), the "
        "valve sticking 60 s after start, before anything is learned; to go: persist the "
        "learned fraction"),
    "valvey/core/feedforward.py:132": (
        "REFERENCE_VALVE_MAP, the feedforward's cold-start map, is the nominal plant's steady "
        "state (REFERENCE §4.4); adapted online (adapt_map) and replaced by commissioning"),
}
"""What is still coupled, and why (see the module docstring)."""


def _fields(model: type[BaseModel], prefix: str) -> Iterator[tuple[str, str, Any]]:
    """``(key, field name, default)`` of every field of ``model``, nested models followed."""
    for name, info in model.model_fields.items():
        key = f"{prefix}.{name}"
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from _fields(ann, key)
        else:
            yield key, name, info.get_default(call_default_factory=True)


def _coupled_defaults() -> dict[str, str]:
    out: dict[str, str] = {}
    for daemon, model in (("valvey", ValveyConfig), ("racky", RackyConfig)):
        for key, name, default in _fields(model, daemon):
            q = FIELD_QUANTITY.get(name)
            if q is None or isinstance(default, bool) or not isinstance(default, (int, float)):
                continue
            nominal = QUANTITIES[q]
            if math.isclose(float(default), nominal, rel_tol=0.05):
                out[key] = f"default {default:g} ≈ the nominal plant's {q} {nominal:g}"
    return out


def _literals(path: Path) -> Iterator[tuple[int, float]]:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and (
                not isinstance(node.value, bool)):
            yield node.lineno, float(node.value)


def _coupled_literals() -> dict[str, str]:
    out: dict[str, str] = {}
    for path in SCANNED:
        rel = path.relative_to(ROOT).as_posix()
        for line, v in _literals(path):
            for what, nominal in IDENTIFYING.items():
                if math.isclose(v, nominal, rel_tol=1e-6):
                    out.setdefault(f"{rel}:{v:g}", f"line {line}: {v:g} = the nominal "
                                   f"plant's {what}")
    return out


def test_no_setting_defaults_to_the_nominal_plants_figure() -> None:
    found = _coupled_defaults()
    new = {k: v for k, v in found.items() if k not in KNOWN}
    assert not new, "settings copying the nominal simulated plant (learn it or make it the " \
        f"site's): {new}"


def test_no_literal_copies_the_nominal_plant() -> None:
    found = _coupled_literals()
    new = {k: v for k, v in found.items() if k not in KNOWN}
    assert not new, f"literals copying the nominal simulated plant: {new}"


def test_the_known_couplings_are_still_there() -> None:
    """Each `KNOWN` entry must still match (remove it once the coupling is gone)."""
    found = {**_coupled_defaults(), **_coupled_literals()}
    assert set(KNOWN) <= set(found), set(KNOWN) - set(found)


@pytest.mark.parametrize(("planted", "kind"), [
    ("rack_max_power_w: float = Field({rack_w})", "literal"),
    ("DESIGN_FLOW_LPM = {flow_lpm}", "literal"),
    ("tau = {tau!r}", "literal"),
])
def test_a_planted_copy_is_caught(tmp_path: Path, planted: str, kind: str) -> None:
    src = tmp_path / "planted.py"
    src.write_text(planted.format(rack_w=_R.rack_max_power_w, flow_lpm=_P.design_flow_lps * 60,
                                  tau=PLATE_TAU_S) + "\n", encoding="utf-8")
    hits = [v for _, v in _literals(src)
            if any(math.isclose(v, n, rel_tol=1e-6) for n in IDENTIFYING.values())]
    assert hits, kind


def test_the_scan_reads_every_controller_module() -> None:
    assert len(SCANNED) > 20 and all(p.exists() for p in SCANNED)
    assert QUANTITIES["design flow [L/min]"] == pytest.approx(198.0)  # the figures are derived
