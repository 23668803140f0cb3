"""Rack power shelves: PSUs with an efficiency curve, temperatures, failures and redundancy.

Default: the GB200 reference rack, **8 shelves × 6 PSUs × 5.5 kW = 33 kW per shelf**, 264 kW
nameplate for a 132 kW rack (REFERENCE §1.2 [S]); shelves 0–3 on feed A and 4–7 on feed B, so
either feed alone carries the design load (the N+N reading of that nameplate, REFERENCE §1.2
[D]). A BBU rides through a shortfall for 90 s at its rating (ORv3 HPR, REFERENCE §1.2 [S]).

Each step the rack's DC load (its IT power, W) is shared by the live PSUs in proportion to
their available capacity (active current sharing); a PSU's available capacity is its rating ×
its derate factor, 0 when it failed or its shelf or feed lost AC. AC input = DC output / η(load
fraction), with η from a curve through 90 % at 5 %, 94 % at 10 %, 96.5 % at 20 %, 97.8 % at
30 %, **98.5 % at 50 % (peak) and 97.5 % at 100 %** load: the peak and full-load points are
REFERENCE §1.2's OCP shelf figures [S2]; the light-load shape is [U] (an 80 PLUS Titanium-like
fall-off); below 5 % the loss stays at its 5 % value (no-load loss). The loss heats the PSU
(first-order, τ 120 s, 0.15 K/W above the room air it breathes [U]) and goes to room air.

When the load exceeds the live capacity the PSUs deliver their capacity and the BBU the rest
(≤ its power rating) while its energy lasts (``bbu_power_w`` × ``bbu_backup_s``); when it is
empty, or the shortfall is above its rating, the rack browns out (`ShelfState.brownout`,
latched until `reset_brownout`; `sims.row` then powers every compute tray off). The BBU
recharges at ``bbu_recharge_w`` from the PSUs when there is headroom.

Redundancy (REFERENCE §5 S10), computed each step for the current load:

* ``N+N``: each feed alone carries the load;
* ``N+k``: k ≥ 1 more PSU failures (largest first) still leave capacity ≥ load;
* ``N``: capacity ≥ load, no failure tolerated;
* ``overloaded``: capacity < load (BBU discharging, a cap is needed).

Status bits (uint16, also the register map ``config/registers/power-shelf.toml``): PSU bit 0
output OK, 1 failed, 2 derated, 3 AC input lost, 4 over-temperature, 5 current limit; shelf
bit 0 any PSU fault, 1 AC input lost, 2 rack redundancy lost (below N+1), 3 rack overloaded,
4 BBU discharging, 5 brown-out.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from pydantic import Field, model_validator

from rackplane.config import StrictModel

__all__ = [
    "PSU_STATUS_BITS",
    "SHELF_STATUS_BITS",
    "PowerShelfParams",
    "PowerShelves",
    "ShelfFlows",
    "ShelfState",
]

PSU_STATUS_BITS: dict[str, int] = {
    "output_ok": 0,
    "failed": 1,
    "derated": 2,
    "ac_lost": 3,
    "over_temp": 4,
    "current_limit": 5,
}
"""Bit numbers of a PSU's status register."""

SHELF_STATUS_BITS: dict[str, int] = {
    "psu_fault": 0,
    "ac_lost": 1,
    "redundancy_lost": 2,
    "overloaded": 3,
    "bbu_discharging": 4,
    "brownout": 5,
}
"""Bit numbers of a shelf's status register."""

_DEFAULT_CURVE: tuple[tuple[float, float], ...] = (
    (0.05, 0.90),
    (0.10, 0.94),
    (0.20, 0.965),
    (0.30, 0.978),
    (0.50, 0.985),
    (0.75, 0.982),
    (1.00, 0.975),
)


class PowerShelfParams(StrictModel):
    """Shelves, PSUs, feeds, efficiency curve, BBU and PSU thermal figures (module docstring)."""

    shelves: int = Field(8, ge=1, le=32, description="power shelves (REF §1.2 [S])")
    psus_per_shelf: int = Field(6, ge=1, le=16, description="PSUs per shelf (REF §1.2 [S])")
    psu_rating_w: float = Field(5500.0, gt=0.0, description="PSU DC rating, W (REF §1.2 [S])")
    feeds: int = Field(
        2, ge=1, le=4, description="AC feeds; shelves split into equal consecutive groups"
    )
    efficiency_curve: tuple[tuple[float, float], ...] = Field(
        _DEFAULT_CURVE,
        description="(load fraction, efficiency) points, linear between; REF §1.2 [S2] at "
        "50 % and 100 %, [U] below",
    )
    ac_voltage_v: float = Field(415.0, gt=0.0, description="shelf AC input, V line-line [U]")
    dc_bus_voltage_v: float = Field(
        50.0, gt=0.0, description="DC busbar, V (REF §1.2: 50 VDC out [S2])"
    )
    psu_thermal_resistance_k_per_w: float = Field(
        0.15, ge=0.0, description="PSU temperature rise per W of loss, K/W [U]"
    )
    psu_thermal_tau_s: float = Field(120.0, gt=0.0, description="PSU thermal τ, s [U]")
    psu_overtemp_c: float = Field(85.0, description="PSU over-temperature flag, °C [U]")
    bbu_power_w: float = Field(
        33_000.0, ge=0.0, description="BBU power rating, W (one HPR BBU shelf, REF §1.2 [S])"
    )
    bbu_backup_s: float = Field(
        90.0, ge=0.0, description="BBU backup at its rating, s (REF §1.2 [S])"
    )
    bbu_recharge_w: float = Field(2000.0, ge=0.0, description="BBU recharge power, W [U]")

    @model_validator(mode="after")
    def _check(self) -> PowerShelfParams:
        c = self.efficiency_curve
        if len(c) < 2:
            raise ValueError("efficiency_curve needs at least two points")
        xs = [x for x, _ in c]
        if any(b <= a for a, b in itertools.pairwise(xs)) or xs[0] <= 0.0:
            raise ValueError("efficiency_curve load fractions must be > 0 and increasing")
        if any(not 0.5 <= e < 1.0 for _, e in c):
            raise ValueError("efficiency_curve efficiencies must be in [0.5, 1)")
        if self.shelves % self.feeds:
            raise ValueError("shelves must split evenly over feeds")
        return self

    @property
    def nameplate_w(self) -> float:
        """Installed DC capacity, W (264 kW by default)."""
        return self.shelves * self.psus_per_shelf * self.psu_rating_w


class ShelfFlows(NamedTuple):
    """One step's power flows, W: AC ``input_w`` = PSU DC ``output_w`` + ``loss_w``; the
    PSU output feeds the IT load and the BBU recharge; ``bbu_output_w`` covers a shortfall,
    ``unserved_w`` is what nobody delivered (brown-out)."""

    input_w: float
    output_w: float
    loss_w: float
    bbu_output_w: float
    bbu_recharge_w: float
    unserved_w: float


@dataclass(frozen=True, slots=True)
class _Config:
    avail: np.ndarray
    cap: float
    live: np.ndarray
    ac_lost: np.ndarray
    feed_cap: np.ndarray
    cum_desc: np.ndarray
    psu_bits: np.ndarray
    shelf_bits: np.ndarray
    ac_voltage: np.ndarray


@dataclass(frozen=True)
class ShelfState:
    """Power shelves at a time. Arrays are ``(shelves, psus_per_shelf)`` unless noted; W,
    °C, J.

    ``load_w`` is the rack's DC demand; ``psu_output_w`` what each PSU delivers;
    ``bbu_output_w`` the BBU's share (a shortfall); ``unserved_w`` what nobody delivered;
    ``capacity_w`` the live capacity; ``feed_capacity_w`` per feed (``(feeds,)``);
    ``redundancy`` and ``spare_psus`` as in the module docstring.
    """

    time_s: float
    load_w: float
    input_w: float
    output_w: float
    loss_w: float
    capacity_w: float
    nameplate_w: float
    feed_capacity_w: np.ndarray
    redundancy: str
    spare_psus: int
    psu_input_w: np.ndarray
    psu_output_w: np.ndarray
    psu_temp_c: np.ndarray
    psu_available_w: np.ndarray
    psu_status: np.ndarray
    shelf_status: np.ndarray
    shelf_input_w: np.ndarray
    shelf_output_w: np.ndarray
    bbu_output_w: float
    bbu_recharge_w: float
    bbu_energy_j: float
    bbu_capacity_j: float
    unserved_w: float
    brownout: bool
    ac_voltage_v: np.ndarray
    dc_bus_voltage_v: float

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (arrays as lists)."""
        out: dict[str, Any] = {}
        for k in self.__dataclass_fields__:
            v = getattr(self, k)
            out[k] = v.tolist() if isinstance(v, np.ndarray) else v
        return out


class PowerShelves:
    """The rack's power shelves (pure; module docstring).

    Args:
        params: `PowerShelfParams`.

    ``step(load_w, ambient_c, dt)`` delivers the load for ``dt`` s and returns its
    `ShelfFlows`; `state` gives the full `ShelfState`. Fault hooks: `fail_psu`,
    `restore_psu`, `derate_psu`, `lose_shelf`, `restore_shelf`, `lose_feed`, `restore_feed`,
    `reset_brownout`.
    """

    def __init__(self, params: PowerShelfParams | None = None, ambient_c: float = 24.0) -> None:
        p = params if params is not None else PowerShelfParams()
        self.params = p
        shape = (p.shelves, p.psus_per_shelf)
        self._failed = np.zeros(shape, dtype=bool)
        self._derate = np.ones(shape)
        self._shelf_lost = np.zeros(p.shelves, dtype=bool)
        self._feed_lost = np.zeros(p.feeds, dtype=bool)
        self._feed_of = np.arange(p.shelves) * p.feeds // p.shelves
        self._temp = np.full(shape, float(ambient_c))
        self._bbu_cap_j = p.bbu_power_w * p.bbu_backup_s
        self._bbu_j = self._bbu_cap_j
        self._brownout = False
        self._t = 0.0
        cx = np.array([x for x, _ in p.efficiency_curve])
        ce = np.array([e for _, e in p.efficiency_curve])
        self._cx, self._ce = cx, ce
        self._loss_min_w = p.psu_rating_w * cx[0] * (1.0 / ce[0] - 1.0)
        self._config: _Config | None = None
        self._state: ShelfState | None = None
        shape0 = (p.shelves, p.psus_per_shelf)
        self._out = np.zeros(shape0)
        self._loss = np.zeros(shape0)
        self._served = 0.0
        self._short = 0.0
        self._flows = ShelfFlows(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        self._step_cfg = self._cfg()
        self.step(0.0, ambient_c, 1e-9)
        self._t = 0.0

    # --- efficiency ----------------------------------------------------------------------------

    def efficiency(self, load_fraction: float | np.ndarray) -> np.ndarray:
        """η at ``load_fraction`` of a PSU's rating (linear in the curve, held at its ends)."""
        return np.interp(load_fraction, self._cx, self._ce)

    def psu_loss_w(self, output_w: np.ndarray) -> np.ndarray:
        """Loss of PSUs delivering ``output_w`` (W each): out·(1/η − 1), at least the no-load
        loss (the 5 %-point loss)."""
        x = output_w / self.params.psu_rating_w
        loss = output_w * (1.0 / self.efficiency(x) - 1.0)
        return np.maximum(loss, self._loss_min_w)

    # --- faults --------------------------------------------------------------------------------

    def _psu(self, shelf: int, psu: int) -> tuple[int, int]:
        p = self.params
        if not (isinstance(shelf, int) and 0 <= shelf < p.shelves):
            raise ValueError(f"shelf {shelf!r} outside 0..{p.shelves - 1}")
        if not (isinstance(psu, int) and 0 <= psu < p.psus_per_shelf):
            raise ValueError(f"psu {psu!r} outside 0..{p.psus_per_shelf - 1}")
        return shelf, psu

    def fail_psu(self, shelf: int, psu: int) -> None:
        """PSU ``psu`` of shelf ``shelf`` fails (no output). Raises ValueError if none such."""
        self._failed[self._psu(shelf, psu)] = True
        self._changed()

    def restore_psu(self, shelf: int, psu: int) -> None:
        """Replace the PSU: healthy, full rating."""
        s = self._psu(shelf, psu)
        self._failed[s] = False
        self._derate[s] = 1.0
        self._changed()

    def derate_psu(self, shelf: int, psu: int, factor: float) -> None:
        """Limit the PSU to ``factor`` × its rating (0 < factor ≤ 1; 1 heals).

        Raises:
            ValueError: no such PSU, factor outside (0, 1].
        """
        s = self._psu(shelf, psu)
        if not (0.0 < factor <= 1.0):
            raise ValueError(f"derate factor {factor!r} outside (0, 1]")
        self._derate[s] = factor
        self._changed()

    def lose_shelf(self, shelf: int) -> None:
        """Shelf ``shelf`` loses AC input (its breaker or whip). Raises ValueError if none."""
        self._psu(shelf, 0)
        self._shelf_lost[shelf] = True
        self._changed()

    def restore_shelf(self, shelf: int) -> None:
        """Shelf ``shelf`` gets AC back."""
        self._psu(shelf, 0)
        self._shelf_lost[shelf] = False
        self._changed()

    def _feed(self, feed: int) -> int:
        if not (isinstance(feed, int) and 0 <= feed < self.params.feeds):
            raise ValueError(f"feed {feed!r} outside 0..{self.params.feeds - 1}")
        return feed

    def lose_feed(self, feed: int) -> None:
        """AC feed ``feed`` (0 = A) is lost: every shelf on it. Raises ValueError if none."""
        self._feed_lost[self._feed(feed)] = True
        self._changed()

    def restore_feed(self, feed: int) -> None:
        """AC feed ``feed`` is back."""
        self._feed_lost[self._feed(feed)] = False
        self._changed()

    def reset_brownout(self) -> None:
        """Clear a latched brown-out (an operator action once capacity is back)."""
        self._brownout = False
        self._state = None

    def _changed(self) -> None:
        self._config = None

    def feed_of_shelf(self, shelf: int) -> int:
        """The feed a shelf is on."""
        return int(self._feed_of[shelf])

    def settle(self, load_w: float, ambient_c: float) -> ShelfState:
        """Steady state at ``load_w`` and ``ambient_c``: PSU temperatures settled, BBU full,
        time unchanged. Raises ValueError like `step`."""
        self._bbu_j = self._bbu_cap_j
        t = self._t
        self.step(load_w, ambient_c, 1e-9)
        c = self._cfg()
        loss = np.where(c.live, self.psu_loss_w(self._out), 0.0)
        self._temp = ambient_c + self.params.psu_thermal_resistance_k_per_w * loss
        self.step(load_w, ambient_c, 1e-9)
        self._t = t
        return self.state

    # --- stepping ------------------------------------------------------------------------------

    @property
    def brownout(self) -> bool:
        """Latched brown-out (the rack lost power)."""
        return self._brownout

    def available_w(self) -> np.ndarray:
        """Per-PSU available capacity now, W, shape ``(shelves, psus_per_shelf)`` (a copy)."""
        return self._cfg().avail.copy()

    def _cfg(self) -> _Config:
        """Everything that changes only with a fault hook (cached until the next one)."""
        c = self._config
        if c is not None:
            return c
        p = self.params
        ac_lost = self._shelf_lost | self._feed_lost[self._feed_of]
        avail = p.psu_rating_w * self._derate * (~self._failed) * (~ac_lost)[:, None]
        live = avail > 0.0
        desc = np.sort(avail.ravel())[::-1]
        desc = desc[desc > 0.0]
        bits = (live.astype(np.int64) << PSU_STATUS_BITS["output_ok"]) | (
            self._failed.astype(np.int64) << PSU_STATUS_BITS["failed"]
        )
        bits |= (self._derate < 1.0).astype(np.int64) << PSU_STATUS_BITS["derated"]
        bits |= np.repeat(ac_lost[:, None], p.psus_per_shelf, axis=1).astype(np.int64) << (
            PSU_STATUS_BITS["ac_lost"]
        )
        shelf_bits = (
            ((self._failed | (self._derate < 1.0)).any(axis=1)).astype(np.int64)
            << SHELF_STATUS_BITS["psu_fault"]
        ) | (ac_lost.astype(np.int64) << SHELF_STATUS_BITS["ac_lost"])
        c = _Config(
            avail=avail,
            cap=float(avail.sum()),
            live=live,
            ac_lost=ac_lost,
            feed_cap=np.array([avail[self._feed_of == f].sum() for f in range(p.feeds)]),
            cum_desc=np.cumsum(desc),
            psu_bits=bits,
            shelf_bits=shelf_bits,
            ac_voltage=np.where(ac_lost, 0.0, p.ac_voltage_v),
        )
        self._config = c
        return c

    def _redundancy(self, load_w: float, c: _Config) -> tuple[str, int]:
        if load_w > c.cap + 1e-6:
            return "overloaded", -1
        # spare = most PSUs (largest first) that can fail with capacity still >= load
        spare = int(np.searchsorted(c.cum_desc, c.cap - load_w + 1e-6, side="right"))
        if self.params.feeds >= 2 and load_w > 0.0 and bool((c.feed_cap >= load_w - 1e-6).all()):
            return "N+N", spare
        return ("N" if spare == 0 else f"N+{spare}"), spare

    def step(self, load_w: float, ambient_c: float, dt: float) -> ShelfFlows:
        """Deliver ``load_w`` (W, the rack's DC demand) for ``dt`` s with PSU inlet air at
        ``ambient_c`` (°C). Returns the step's power flows (`ShelfFlows`); `state` has the
        full picture.

        Raises:
            ValueError: negative or non-finite load, non-finite ambient, dt not > 0.
        """
        if not (math.isfinite(load_w) and load_w >= 0.0):
            raise ValueError(f"load_w {load_w!r} must be finite and >= 0")
        if not math.isfinite(ambient_c):
            raise ValueError("ambient_c must be finite")
        if not dt > 0.0:
            raise ValueError("dt must be > 0")
        p = self.params
        c = self._cfg()
        self._t += dt
        cap = c.cap
        served = load_w if not self._brownout else 0.0
        from_psu = served if served <= cap else cap
        short = served - from_psu
        bbu_out = 0.0
        unserved = 0.0
        if short > 1e-9:
            bbu_out = min(short, p.bbu_power_w, self._bbu_j / dt)
            self._bbu_j -= bbu_out * dt
            unserved = short - bbu_out
            if unserved > 1e-6:
                self._brownout = True
        recharge = 0.0
        if short <= 1e-9 and self._bbu_j < self._bbu_cap_j:
            recharge = max(
                0.0,
                min(p.bbu_recharge_w, cap - from_psu, (self._bbu_cap_j - self._bbu_j) / dt),
            )
            self._bbu_j += recharge * dt
        total = from_psu + recharge
        out = c.avail * (total / cap) if cap > 0.0 else np.zeros_like(c.avail)
        x = out / p.psu_rating_w
        loss = out * (1.0 / np.interp(x, self._cx, self._ce) - 1.0)
        np.maximum(loss, self._loss_min_w, out=loss)
        loss *= c.live
        a = dt / p.psu_thermal_tau_s
        if a > 1.0:
            a = 1.0
        self._temp += (ambient_c + p.psu_thermal_resistance_k_per_w * loss - self._temp) * a
        self._out = out
        self._loss = loss
        self._step_cfg = c
        self._served = served
        self._short = short
        self._flows = ShelfFlows(
            input_w=total + float(loss.sum()),
            output_w=total,
            loss_w=float(loss.sum()),
            bbu_output_w=bbu_out,
            bbu_recharge_w=recharge,
            unserved_w=unserved,
        )
        self._state = None
        return self._flows

    @property
    def flows(self) -> ShelfFlows:
        """The last step's power flows."""
        return self._flows

    @property
    def state(self) -> ShelfState:
        """The full `ShelfState` of the last step (built on first access; a fault hook called
        since shows from the next step on)."""
        if self._state is not None:
            return self._state
        p = self.params
        c = self._step_cfg  # the configuration this step ran with (a fault since: next step)
        f = self._flows
        out, loss = self._out, self._loss
        inp = out + loss
        red, spare = self._redundancy(self._served, c)
        bits = c.psu_bits | (
            (self._temp > p.psu_overtemp_c).astype(np.int64) << PSU_STATUS_BITS["over_temp"]
        )
        if self._short > 1e-9:
            bits = bits | (c.live.astype(np.int64) << PSU_STATUS_BITS["current_limit"])
        rack_bits = 0
        if red in ("N", "overloaded"):
            rack_bits |= 1 << SHELF_STATUS_BITS["redundancy_lost"]
        if red == "overloaded":
            rack_bits |= 1 << SHELF_STATUS_BITS["overloaded"]
        if f.bbu_output_w > 0.0:
            rack_bits |= 1 << SHELF_STATUS_BITS["bbu_discharging"]
        if self._brownout:
            rack_bits |= 1 << SHELF_STATUS_BITS["brownout"]
        self._state = ShelfState(
            time_s=self._t,
            load_w=self._served,
            input_w=f.input_w,
            output_w=f.output_w,
            loss_w=f.loss_w,
            capacity_w=c.cap,
            nameplate_w=p.nameplate_w,
            feed_capacity_w=c.feed_cap.copy(),
            redundancy=red,
            spare_psus=spare,
            psu_input_w=inp,
            psu_output_w=out.copy(),
            psu_temp_c=self._temp.copy(),
            psu_available_w=c.avail.copy(),
            psu_status=bits,
            shelf_status=c.shelf_bits | rack_bits,
            shelf_input_w=inp.sum(axis=1),
            shelf_output_w=out.sum(axis=1),
            bbu_output_w=f.bbu_output_w,
            bbu_recharge_w=f.bbu_recharge_w,
            bbu_energy_j=self._bbu_j,
            bbu_capacity_j=self._bbu_cap_j,
            unserved_w=f.unserved_w,
            brownout=self._brownout,
            ac_voltage_v=c.ac_voltage.copy(),
            dc_bus_voltage_v=p.dc_bus_voltage_v
            if (c.cap > 0.0 or f.bbu_output_w > 0.0)
            else 0.0,
        )
        return self._state

    def shelf_readings(self, shelf: int) -> dict[str, float]:
        """Register-map values of one shelf (``config/registers/power-shelf.toml`` names).

        Raises:
            ValueError: no such shelf.
        """
        self._psu(shelf, 0)
        s = self.state
        p = self.params
        out: dict[str, float] = {
            "shelf_input_power_w": float(s.shelf_input_w[shelf]),
            "shelf_output_power_w": float(s.shelf_output_w[shelf]),
            "shelf_available_w": float(s.psu_available_w[shelf].sum()),
            "ac_voltage_v": float(s.ac_voltage_v[shelf]),
            "dc_bus_voltage_v": s.dc_bus_voltage_v,
            "shelf_status": float(s.shelf_status[shelf]),
            "psus_ok": float(((s.psu_status[shelf] & 1) == 1).sum()),
            "rack_load_w": s.load_w,
            "rack_capacity_w": s.capacity_w,
            "rack_spare_psus": float(max(s.spare_psus, 0)),
            "rack_redundant_feeds": 1.0 if s.redundancy == "N+N" else 0.0,
            "bbu_energy_pct": 100.0 * s.bbu_energy_j / s.bbu_capacity_j
            if s.bbu_capacity_j > 0.0
            else 0.0,
            "feed": float(self._feed_of[shelf]),
        }
        for i in range(p.psus_per_shelf):
            out[f"psu{i + 1}_input_power_w"] = float(s.psu_input_w[shelf, i])
            out[f"psu{i + 1}_output_power_w"] = float(s.psu_output_w[shelf, i])
            out[f"psu{i + 1}_temp_c"] = float(s.psu_temp_c[shelf, i])
            out[f"psu{i + 1}_status"] = float(s.psu_status[shelf, i])
        return out

