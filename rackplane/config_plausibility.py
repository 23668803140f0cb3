"""Plausibility of config values: warnings for numbers far outside a field's physical range,
the signature of a wrong unit (issue 14 item 18: ``budget_w = 120`` meant as kW, a flow
setpoint in m³/h where L/min is expected, a pressure in bar where kPa is expected).

A value outside its hard limits is an error (the model's validators, with the value and the
limits); a value inside them but outside the range any real installation has is accepted
with a warning, printed by ``--check-config`` and logged at start (``config_implausible``).
Each daemon lists its fields with the range and its source (`Plausible`; racky/config.py,
valvey/config.py). Pure: no I/O. (The plausibility windows of live inputs are
`rackplane.core.plausibility`.)
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["Plausible", "plausibility_warnings", "value_at"]


@dataclass(frozen=True, slots=True)
class Plausible:
    """The physical range of one config value.

    Attributes:
        path: the key path, e.g. ``power.budget_w``.
        lo, hi: the range, in ``unit``.
        unit: as in the key's name (``W``, ``L/min``, ``kPa``, ``°C``).
        source: where the range comes from (REFERENCE.md section and its figures).
        hint: the likely mistake, e.g. ``kW written as W?``.
    """

    path: str
    lo: float
    hi: float
    unit: str
    source: str
    hint: str = ""

    def check(self, value: float) -> str | None:
        """The warning for ``value`` (None: plausible)."""
        if not math.isfinite(value) or self.lo <= value <= self.hi:
            return None
        hint = f"; {self.hint}" if self.hint else ""
        return (f"{self.path} = {value:g} {self.unit} is far outside the plausible range "
                f"[{self.lo:g}, {self.hi:g}] {self.unit} ({self.source}){hint}")


def value_at(cfg: Any, path: str) -> Any:
    """The value at a dotted key path of a config model (None when a part is None).

    Raises:
        AttributeError: no such key (a table naming a key that does not exist is a bug).
    """
    node = cfg
    for part in path.split("."):
        if node is None:
            return None
        node = getattr(node, part)
    return node


def plausibility_warnings(cfg: Any, table: Iterable[Plausible]) -> list[str]:
    """One line per value of ``table`` outside its plausible range, in table order (unset
    values, None, are not judged)."""
    out = []
    for p in table:
        v = value_at(cfg, p.path)
        if isinstance(v, int | float) and not isinstance(v, bool):
            w = p.check(float(v))
            if w is not None:
                out.append(w)
    return out
