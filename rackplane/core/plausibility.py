"""Plausibility windows: the one mechanism that judges every input feeding an interlock, a
selector or a limit before a core sees it. Pure: no I/O, no clock.

A `PlausibilityWindow` is the physically believable range of one input, in the input's own
unit (a room humidity in %, a rack power in W). A GOOD sample outside it is not believed: it
becomes ``OUT_OF_RANGE`` with reason ``implausible`` (its value is kept for diagnostics only:
`Sample.usable` is False, so no core uses it). The typical causes are a unit or scale error at
the source (a humidity sent as a fraction 0.6 where percent is expected, a temperature in
kelvin, power in kW where W is expected) or a failing sensor (RH 0 %, 105 %).

Each daemon keeps a table of windows by input name (``[plausibility.<name>]`` in its config,
with field defaults) and applies `judge` where samples enter its core; the cores raise one
alarm per input (``input_implausible:<name>``) while its latest sample is implausible, and fall
back in each function's safe direction (docs/VALVEY.md, docs/RACKY.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from pydantic import Field, model_validator

from rackplane.config import StrictModel
from rackplane.core.samples import Quality, Sample, make_sample

__all__ = [
    "IMPLAUSIBLE",
    "PlausibilityWindow",
    "implausible_alarm_id",
    "is_implausible",
    "judge",
    "judge_all",
    "merge_windows",
]

IMPLAUSIBLE = "implausible"
"""The `Sample.reason` of a value outside its plausibility window."""


class PlausibilityWindow(StrictModel):
    """The believable range of one input, in its own unit (both ends included)."""

    min: float = Field(allow_inf_nan=False, description="lowest believable value")
    max: float = Field(allow_inf_nan=False, description="highest believable value")
    source: str = Field("", description="where the default comes from (documentation only)")

    @model_validator(mode="after")
    def _order(self) -> PlausibilityWindow:
        if self.min >= self.max:
            raise ValueError(f"min ({self.min}) must be below max ({self.max})")
        return self

    def contains(self, value: float) -> bool:
        """True for a finite value inside [min, max]."""
        return math.isfinite(value) and self.min <= value <= self.max


def judge(sample: Sample, window: PlausibilityWindow | None) -> Sample:
    """``sample`` as the core may see it: a GOOD sample outside ``window`` becomes
    OUT_OF_RANGE with reason ``implausible`` (value kept for diagnostics); any other sample
    (no window, not GOOD, inside) is returned unchanged."""
    if window is None or sample.quality is not Quality.GOOD or sample.value is None:
        return sample
    if window.contains(sample.value):
        return sample
    return make_sample(sample.point, sample.value, sample.unit, sample.ts_ns, sample.t_mono,
                       Quality.OUT_OF_RANGE, IMPLAUSIBLE)


def judge_all(samples: Iterable[Sample], windows: Mapping[str, PlausibilityWindow]
              ) -> list[Sample]:
    """`judge` of every sample by its point's window (``windows`` by point name)."""
    get = windows.get
    return [judge(s, get(s.point)) for s in samples]


def is_implausible(sample: Sample | None) -> bool:
    """True when ``sample`` was judged outside its plausibility window."""
    return (sample is not None and sample.quality is Quality.OUT_OF_RANGE
            and sample.reason == IMPLAUSIBLE)


def implausible_alarm_id(name: str) -> str:
    """The alarm id naming one implausible input (``input_implausible:<name>``)."""
    return f"input_implausible:{name}"


def merge_windows(defaults: Mapping[str, PlausibilityWindow], given: object) -> object:
    """For a ``mode="before"`` validator of a ``dict[str, PlausibilityWindow]`` field: the
    configured table laid over the defaults (a site names only the inputs it changes; an
    input cannot be left without a window)."""
    if not isinstance(given, Mapping):
        return given
    out: dict[str, object] = {k: v.model_dump() for k, v in defaults.items()}
    out.update(given)
    return out
