"""A tray's BMC readings (Redfish) as the contract's tray figures: input power, coolant outlet
temperature, leak and leak-sensor fault.

Leak detectors (Redfish ``LeakDetector``: ``DetectorState`` OK / Warning / Critical, ``Status``
{State, Health}): a detector is **faulted** when its ``Status.State`` is not ``Enabled`` or its
``DetectorState`` is not one of the three (absent, null, another word): a faulted detector is a
sensor fault, never a leak. A healthy detector in ``Warning`` or ``Critical`` is a **leak**.

- any healthy detector wet: ``leak`` true, ``leak_sensor_fault`` false (a wet reading is never
  hidden behind another detector's fault);
- else: ``leak`` false; ``leak_sensor_fault`` true when any detector is faulted or there is
  none (the tray is not fully covered: its "dry" means nothing).

Power Control (a tray capped at its BMC, ``agents.trays[].actuation = "redfish"``): the
``SetPoint`` asked for is clamped into the control's range (`control_range`,
`clamp_setpoint`) and the clamp reported; only the ``SetPoint`` read back proves a set
(`ControlResult`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = ["BmcReading", "ControlResult", "LeakState", "clamp_setpoint", "classify_leak",
           "control_range", "plausible"]

_STATES = {"OK": False, "Warning": True, "Critical": True}


class LeakState(NamedTuple):
    """``leak``, ``fault`` and, per detector id, what it read (``dry``, ``wet``, or the
    fault)."""

    leak: bool
    fault: bool
    detectors: dict[str, str]


def classify_leak(detectors: Sequence[Mapping[str, Any]]) -> LeakState:
    """The tray's leak state from its Redfish ``LeakDetector`` resources (module docstring)."""
    seen: dict[str, str] = {}
    wet = faulted = False
    for i, d in enumerate(detectors):
        name = str(d.get("Id") or d.get("@odata.id") or i)
        status = d.get("Status") if isinstance(d.get("Status"), Mapping) else {}
        state = status.get("State") if isinstance(status, Mapping) else None
        ds = d.get("DetectorState")
        if state != "Enabled":
            seen[name] = f"fault: Status.State {state!r}"
            faulted = True
        elif not isinstance(ds, str) or ds not in _STATES:
            seen[name] = f"fault: DetectorState {ds!r}"
            faulted = True
        else:
            seen[name] = "wet" if _STATES[ds] else "dry"
            wet = wet or _STATES[ds]
    if wet:
        return LeakState(True, False, seen)
    return LeakState(False, faulted or not detectors, seen)


def plausible(x: object, lo: float, hi: float) -> tuple[float | None, str | None]:
    """``x`` as a float when it is a finite number in [lo, hi]; else None and why."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None, f"not a number: {x!r}"
    v = float(x)
    if not math.isfinite(v) or not lo <= v <= hi:
        return None, f"{v:g} outside [{lo:g}, {hi:g}]"
    return v, None


@dataclass(slots=True)
class BmcReading:
    """What one BMC read gave (None: unknown, reason in ``errors``); ``mono``: when, s."""

    power_w: float | None = None
    coolant_out_temp_c: float | None = None
    leak: LeakState | None = None
    errors: dict[str, str] = field(default_factory=dict)
    mono: float = -math.inf


class ControlResult(NamedTuple):
    """One hold of a BMC power Control (Redfish ``Control``, ``ControlType`` Power): W.

    ``wanted_w``: asked for (None: released, the control's maximum); ``target_w``: after
    clamping into the control's range (None: not known); ``clamped``: why it was moved (None:
    not moved); ``enforced_w``: the ``SetPoint`` read back after the last write, the only proof
    (None: not read); ``confirmed``: the read-back is within the tolerance of the target;
    ``attempts``: PATCHes sent (a 412 re-reads and counts one more); ``error``: why not
    confirmed (None when confirmed); ``mono``: when, s."""

    wanted_w: float | None
    target_w: float | None
    clamped: str | None
    enforced_w: float | None
    confirmed: bool
    attempts: int
    error: str | None
    mono: float


def control_range(control: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """A Redfish ``Control``'s settable range, W: ``SettingRangeMin`` / ``SettingRangeMax``
    where given (the range the service accepts now), else ``AllowableMin`` / ``AllowableMax``
    (the device's); a bound that is not a finite number is None (not known)."""
    out: list[float | None] = []
    for keys in (("SettingRangeMin", "AllowableMin"), ("SettingRangeMax", "AllowableMax")):
        v: float | None = None
        for k in keys:
            x, _ = plausible(control.get(k), -math.inf, math.inf)
            if x is not None:
                v = x
                break
        out.append(v)
    return out[0], out[1]


def clamp_setpoint(wanted_w: float | None, lo: float | None, hi: float | None
                   ) -> tuple[float | None, str | None]:
    """``wanted_w`` moved into [lo, hi] and why (None: not moved); ``wanted_w`` None
    (released) is ``hi`` (None when the maximum is not known)."""
    if wanted_w is None:
        return hi, None if hi is not None else "released but the control's maximum is unknown"
    if lo is not None and wanted_w < lo:
        return lo, f"{wanted_w:g} W below the control's minimum {lo:g} W"
    if hi is not None and wanted_w > hi:
        return hi, f"{wanted_w:g} W above the control's maximum {hi:g} W"
    return wanted_w, None
