"""Room air around the rack: temperature, relative humidity and dew point (pure, seeded).

The room is what the CRAH/CRAC units hold it at: a scripted temperature and relative humidity
(piecewise-linear timelines of ``(t_s, value)`` points), plus ramped offsets the fault hooks
add (a humidity rise, a room-temperature rise). Air-side heat from the rack does not warm the
room here (the room's air handling is assumed to hold its setpoint); the rack's air heat is
accounted for in `sims.row` as an energy flow.

Dew point: the Magnus form with the Alduchov & Eskridge (1996) coefficients,

    γ(T, RH) = ln(RH/100) + a·T / (b + T),     T_d = b·γ / (a − γ),
    a = 17.625, b = 243.04 °C,

O. A. Alduchov and R. E. Eskridge, "Improved Magnus form approximation of saturation vapor
pressure", J. Appl. Meteor. 35 (1996) 601–609 (error < 0.4 % in saturation vapour pressure over
−40…50 °C); the same coefficients as NOAA/NWS's dew-point calculator. valvey's dew-point
interlock compares the coolant supply with it (REFERENCE §8: supply ≥ dew point + 2–3 °C).

Defaults: 24 °C, 45 % RH (inside the ASHRAE TC 9.9 recommended envelope for class A1 air,
18–27 °C and a −9 °C…15 °C dew point / ≤ 60 % RH [S2, ASHRAE Thermal Guidelines 5th ed.]).

Sensors (`sims.sensors.Sensor`): room temperature τ 30 s, σ 0.05 K, 0.1 K resolution; humidity
τ 30 s, σ 0.5 %RH, 0.1 %RH resolution [U: typical room transmitters].
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from pydantic import Field, model_validator

from rackplane.config import StrictModel
from sims.sensors import Sensor, SensorParams

__all__ = [
    "MAGNUS_A",
    "MAGNUS_B_C",
    "Environment",
    "EnvironmentParams",
    "EnvironmentState",
    "dew_point_c",
    "relative_humidity_pct",
    "saturation_vapour_pressure_hpa",
]

MAGNUS_A = 17.625
"""Magnus coefficient a (Alduchov & Eskridge 1996), dimensionless."""
MAGNUS_B_C = 243.04
"""Magnus coefficient b (Alduchov & Eskridge 1996), °C."""
MAGNUS_C_HPA = 6.1094
"""Saturation vapour pressure at 0 °C of the same fit, hPa."""


def _check_temp(temp_c: float) -> None:
    if not (math.isfinite(temp_c) and -45.0 <= temp_c <= 60.0):
        raise ValueError(f"temperature {temp_c!r} °C outside the Magnus range −45…60 °C")


def saturation_vapour_pressure_hpa(temp_c: float) -> float:
    """Saturation vapour pressure over water at ``temp_c`` (°C), hPa (Magnus, Alduchov &
    Eskridge 1996: 6.1094·exp(17.625·T/(243.04 + T))).

    Raises:
        ValueError: temperature not finite or outside −45…60 °C.
    """
    _check_temp(temp_c)
    return MAGNUS_C_HPA * math.exp(MAGNUS_A * temp_c / (MAGNUS_B_C + temp_c))


def dew_point_c(temp_c: float, relative_humidity_pct: float) -> float:
    """Dew point (°C) of air at ``temp_c`` (°C) and ``relative_humidity_pct`` (0 < RH ≤ 100).

    Magnus form with Alduchov & Eskridge (1996) coefficients (module docstring); e.g.
    25 °C / 50 % → 13.85 °C, 20 °C / 100 % → 20.0 °C.

    Raises:
        ValueError: temperature outside −45…60 °C, RH outside (0, 100], non-finite input.
    """
    _check_temp(temp_c)
    rh = relative_humidity_pct
    if not (math.isfinite(rh) and 0.0 < rh <= 100.0):
        raise ValueError(f"relative humidity {rh!r} % outside (0, 100]")
    g = math.log(rh / 100.0) + MAGNUS_A * temp_c / (MAGNUS_B_C + temp_c)
    return MAGNUS_B_C * g / (MAGNUS_A - g)


def relative_humidity_pct(temp_c: float, dew_point_c: float) -> float:
    """Relative humidity (%) of air at ``temp_c`` with dew point ``dew_point_c`` (both °C);
    the inverse of `dew_point_c`. Raises ValueError for a dew point above the temperature or
    temperatures outside −45…60 °C."""
    if dew_point_c > temp_c + 1e-9:
        raise ValueError("dew point cannot exceed the air temperature")
    return 100.0 * saturation_vapour_pressure_hpa(dew_point_c) / saturation_vapour_pressure_hpa(
        temp_c
    )


def _interp(points: Sequence[tuple[float, float]], t_s: float) -> float:
    ts = [p[0] for p in points]
    i = bisect.bisect_right(ts, t_s) - 1
    if i < 0:
        return points[0][1]
    if i >= len(points) - 1:
        return points[-1][1]
    (t0, v0), (t1, v1) = points[i], points[i + 1]
    return v0 + (v1 - v0) * (t_s - t0) / (t1 - t0)


def _check_points(name: str, pts: list[tuple[float, float]] | None) -> None:
    if pts is None:
        return
    if not pts:
        raise ValueError(f"{name} needs at least one (t_s, value) point")
    ts = [t for t, _ in pts]
    if any(b <= a for a, b in itertools.pairwise(ts)):
        raise ValueError(f"{name} times must be strictly increasing")


class EnvironmentParams(StrictModel):
    """Room air script and sensors (module docstring for the sources)."""

    room_temp_c: float = Field(
        24.0, ge=-10.0, le=50.0, description="room (rack inlet air) temperature, °C"
    )
    relative_humidity_pct: float = Field(45.0, gt=0.0, le=100.0, description="room RH, %")
    temp_points: list[tuple[float, float]] | None = Field(
        None, description="scripted room temperature (t_s, °C), linear between points"
    )
    rh_points: list[tuple[float, float]] | None = Field(
        None, description="scripted relative humidity (t_s, %), linear between points"
    )
    temp_sensor: SensorParams = Field(
        default_factory=lambda: SensorParams(tau_s=30.0, noise_sigma=0.05, quantum=0.1),
        description="room temperature transmitter [U]",
    )
    rh_sensor: SensorParams = Field(
        default_factory=lambda: SensorParams(tau_s=30.0, noise_sigma=0.5, quantum=0.1),
        description="humidity transmitter, %RH [U]",
    )

    @model_validator(mode="after")
    def _check(self) -> EnvironmentParams:
        _check_points("temp_points", self.temp_points)
        _check_points("rh_points", self.rh_points)
        for _, v in self.rh_points or []:
            if not 0.0 < v <= 100.0:
                raise ValueError("rh_points values must be in (0, 100] %")
        for _, v in self.temp_points or []:
            if not -10.0 <= v <= 50.0:
                raise ValueError("temp_points values must be in −10…50 °C")
        return self


@dataclass(frozen=True, slots=True)
class EnvironmentState:
    """Room air at ``time_s``: true values and what the room sensors read (°C, %RH)."""

    time_s: float
    room_temp_c: float
    relative_humidity_pct: float
    dew_point_c: float
    sensed_room_temp_c: float
    sensed_relative_humidity_pct: float
    sensed_dew_point_c: float

    def as_dict(self) -> dict[str, Any]:
        """Plain dict (logs, traces)."""
        return asdict(self)


class _Ramp:
    """An offset ramped from 0 to ``target`` over ``ramp_s`` (and back when cleared)."""

    __slots__ = ("rate", "target", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.target = 0.0
        self.rate = math.inf

    def set(self, target: float, ramp_s: float) -> None:
        if not (math.isfinite(target) and ramp_s >= 0.0 and math.isfinite(ramp_s)):
            raise ValueError("offset must be finite and ramp_s >= 0")
        span = abs(target - self.value)
        self.target = target
        self.rate = math.inf if ramp_s == 0.0 or span == 0.0 else span / ramp_s

    def step(self, dt: float) -> float:
        d = self.target - self.value
        m = self.rate * dt
        self.value = self.target if abs(d) <= m else self.value + math.copysign(m, d)
        return self.value


class Environment:
    """The room: scripted temperature and humidity, fault offsets, sensors; dew point.

    Args:
        params: `EnvironmentParams`.
        seed: seeds the sensor noise (numpy PCG64).

    ``step(dt)`` advances time; `state` reads it. Fault hooks: `set_humidity_offset`
    (+%RH, ramped), `set_temp_offset` (+K, ramped). RH is clipped to (0, 100] and the
    temperature to −10…50 °C after offsets.
    """

    def __init__(self, params: EnvironmentParams | None = None, seed: int = 0) -> None:
        p = params if params is not None else EnvironmentParams()
        self._p = p
        self._rng = np.random.Generator(np.random.PCG64([seed, 0xE4]))
        self._z: list[float] = []
        self._zi = 0
        self._t = 0.0
        self._dt_off = _Ramp()
        self._rh_off = _Ramp()
        t0, rh0 = self._truth()
        self._s_t = Sensor("room_temp_c", p.temp_sensor, initial=t0)
        self._s_rh = Sensor("relative_humidity_pct", p.rh_sensor, initial=rh0)
        self._temp = t0
        self._rh = rh0

    @property
    def params(self) -> EnvironmentParams:
        """The parameters."""
        return self._p

    @property
    def time_s(self) -> float:
        """Plant time, s since construction."""
        return self._t

    @property
    def sensors(self) -> dict[str, Sensor]:
        """The room transmitters by point name (``room_temp_c``, ``relative_humidity_pct``),
        for fault injection (`Sensor.set_fault`)."""
        return {"room_temp_c": self._s_t, "relative_humidity_pct": self._s_rh}

    def _truth(self) -> tuple[float, float]:
        p = self._p
        t = self._t
        temp = p.room_temp_c if p.temp_points is None else _interp(p.temp_points, t)
        rh = p.relative_humidity_pct if p.rh_points is None else _interp(p.rh_points, t)
        temp = min(50.0, max(-10.0, temp + self._dt_off.value))
        rh = min(100.0, max(0.1, rh + self._rh_off.value))
        return temp, rh

    def set_humidity_offset(self, offset_pct: float, ramp_s: float = 0.0) -> None:
        """Add ``offset_pct`` %RH to the script, reached linearly over ``ramp_s`` s (0 to
        clear, also ramped). Raises ValueError for non-finite values or a negative ramp."""
        self._rh_off.set(offset_pct, ramp_s)

    def set_temp_offset(self, offset_k: float, ramp_s: float = 0.0) -> None:
        """Add ``offset_k`` K to the room temperature, ramped like `set_humidity_offset`."""
        self._dt_off.set(offset_k, ramp_s)

    def step(self, dt: float) -> None:
        """Advance by ``dt`` s (> 0). Raises ValueError for a non-positive or non-finite dt."""
        if not (dt > 0.0 and math.isfinite(dt)):
            raise ValueError(f"dt {dt!r} must be > 0")
        self._t += dt
        self._dt_off.step(dt)
        self._rh_off.step(dt)
        self._temp, self._rh = self._truth()
        if self._zi + 2 > len(self._z):
            self._z = self._rng.standard_normal(4096).tolist()
            self._zi = 0
        z = self._z
        i = self._zi
        self._zi = i + 2
        self._s_t.update(self._temp, dt, z[i])
        self._s_rh.update(self._rh, dt, z[i + 1])

    @property
    def room_temp_c(self) -> float:
        """True room temperature, °C."""
        return self._temp

    @property
    def relative_humidity_pct(self) -> float:
        """True relative humidity, %."""
        return self._rh

    def state(self) -> EnvironmentState:
        """True and sensed room air now (sensed dew point from the sensed values)."""
        st, srh = self._s_t.value, self._s_rh.value
        sensed_dp = (
            dew_point_c(st, min(100.0, max(0.1, srh)))
            if math.isfinite(st) and math.isfinite(srh) and -45.0 <= st <= 60.0
            else math.nan
        )
        return EnvironmentState(
            time_s=self._t,
            room_temp_c=self._temp,
            relative_humidity_pct=self._rh,
            dew_point_c=dew_point_c(self._temp, self._rh),
            sensed_room_temp_c=st,
            sensed_relative_humidity_pct=srh,
            sensed_dew_point_c=sensed_dp,
        )
