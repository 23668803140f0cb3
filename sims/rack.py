"""An NVL72-class rack's electrical side: node agents, tray power and leak sensors (pure).

Topology (REFERENCE §1.1 [S]): 18 compute trays × 4 GPUs (+ Grace CPUs, memory, NICs and
fans, modelled as a fixed share of the tray's GPU power) and 9 NVLink switch trays. The rack's
heat and GPU temperatures are `sims.cdu.RackThermal` (per-GPU mode), so CDU and rack stay one
energy-consistent thermal model; `sims.row.VirtualRack` joins them.

Per-GPU power path, each step::

    workload demand (fraction of TGP) ──► node agent: clip to [floor, cap], ramp-limit,
    tray power on/off  ──► GPU power request ──► RackThermal: × HW-slowdown scale (0 when shut
    down) ──► power drawn ──► tray power = Σ GPU × (1 + other share); + switch trays = P_IT

**The node-agent contract** (what racky will command over MQTT, DESIGN §3, docs/SIMULATORS.md):
`NodeAgentSettings` in (tray power cap W, per-GPU cap W, power floor % of TGP, ramp-up and
ramp-down limits W/s per GPU, ramp-down hysteresis, tray power on/off), `NodeAgentStatus` out
(enforced per-GPU and tray caps, floor, the demand and the measured power). The knobs are
NVML's Blackwell power-smoothing ones (REFERENCE §1.3 [S]: ``PERCENT_TMP_FLOOR``,
``RAMP_UP_RATE`` / ``RAMP_DOWN_RATE`` in W/s, ``RAMP_DOWN_HYSTERESIS`` in ms; the GB300 blog's
"power floor and ramp limits") plus the classic power cap. Rules (the model's, [U] where
REFERENCE §6 item 4 says the vendor values were not retrieved):

* enforced per-GPU cap = min(TGP, ``gpu_power_cap_w``, ``power_cap_w`` / ((1 + other
  share) · GPUs per tray)); a cap below ``gpu_min_power_limit_w`` is refused;
* floor = ``power_floor_pct`` % of TGP, never above the enforced cap (the cap wins);
* request = clip(demand, floor, cap) (below the floor the GPU burns power);
* ramp: the power moves towards the request at ≤ ``ramp_up_w_per_s`` up and ≤
  ``ramp_down_w_per_s`` down (None: immediately); a ramp-down starts only after the request
  has stayed below the power for ``ramp_down_hysteresis_s``;
* each GPU's own power limit (`NodeAgents.set_gpu_power_limit`, NVML's power management
  limit; TGP until set) bounds the request like the cap: an external node agent (the real
  tray agent on the virtual rack, harness.simagent) caps through it;
* a cap always acts at once: the power never exceeds the enforced cap (NVLink-switch style
  budgets are enforced within ~1 s, REFERENCE §1.3; a cap is a safety limit);
* a tray powered off draws nothing (GPUs, CPUs); powered on again, it ramps from 0.

Commands (node-agent contract v1, `command`; docs/CONTRACTS.md): every command carries the
sender's ``epoch``; an agent drops (refuses, `StaleEpoch`) a command whose epoch is older than
the newest it has seen on that tray. A command that sets a cap carries a ``ttl_s``: the tray's
caps (``power_cap_w``, ``gpu_power_cap_w``) expire together ``ttl_s`` after the last command
that set one (agent time: the sum of the steps), and the tray is uncapped again unless the
sender refreshed them. Floors, ramps and the power state do not expire.

Leak sensors (REFERENCE §4.2 item 9, §5 S6, §8 leak response): one per compute tray, a CDU
rope sensor and the rack drip pan. A location's sensor trips once the cumulative volume leaked
there exceeds its threshold and it has stayed wet for the wetting delay; a tray holds
``tray_retention_ml`` before the rest drips into the drip pan. A sensor fault (open wire)
is a separate flag (``RackLeakSensorFault`` in the DSX BMS schema, REFERENCE §1.5) and the
faulted sensor reports no leak. The leak rates feed the CDU's inventory
(`sims.cdu.CduPlant.set_leak_lpm`, done by `sims.row`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

import numpy as np
from pydantic import Field

from rackplane.config import StrictModel
from sims.cdu import RackParams

__all__ = [
    "ComputeRack",
    "ComputeRackParams",
    "LeakSensorParams",
    "LeakSensors",
    "LeakState",
    "NodeAgentSettings",
    "NodeAgentStatus",
    "NodeAgents",
    "StaleEpoch",
]

LeakSensorName = Literal["tray", "rope", "drip_pan"]


class LeakSensorParams(StrictModel):
    """Leak sensor figures (REFERENCE §4.2 item 9 gives the mechanism, not values: all [U])."""

    tray_threshold_ml: float = Field(
        20.0, gt=0.0, description="volume at a tray sensor that wets it, mL [U]"
    )
    tray_retention_ml: float = Field(
        500.0, ge=0.0, description="volume a tray holds before it drips into the drip pan, mL [U]"
    )
    drip_pan_threshold_ml: float = Field(
        100.0, gt=0.0, description="volume in the rack drip pan that trips its sensor, mL [U]"
    )
    rope_threshold_ml: float = Field(
        50.0, gt=0.0, description="volume on the CDU rope sensor that trips it, mL [U]"
    )
    wetting_delay_s: float = Field(
        2.0, ge=0.0, description="time from reaching the threshold to the sensor tripping, s [U]"
    )


class ComputeRackParams(StrictModel):
    """Rack electrical figures beyond `sims.cdu.RackParams` (which gives the tray and GPU
    counts, TGP and the rack's 100 % power)."""

    switch_trays: int = Field(9, ge=0, le=32, description="NVLink switch trays (REF §1.1 [S])")
    switch_tray_power_w: float = Field(
        400.0, ge=0.0, description="power per switch tray, W (REF §1.1: ~0.4 kW each [S2])"
    )
    gpu_min_power_limit_w: float = Field(
        200.0,
        gt=0.0,
        description="lowest per-GPU power cap a node agent accepts, W (NVML's min enforced "
        "limit; not retrieved for Blackwell, [U])",
    )
    leak: LeakSensorParams = Field(default_factory=LeakSensorParams)


@dataclass(frozen=True, slots=True)
class NodeAgentSettings:
    """What a node agent is told (the contract racky uses; see the module docstring).

    Attributes:
        power_cap_w: whole-tray power cap, W (GPUs + CPUs etc.); None: none.
        gpu_power_cap_w: per-GPU power cap, W; None: none (TGP applies).
        power_floor_pct: per-GPU power floor, % of TGP (0 = off; NVML PERCENT_TMP_FLOOR).
        ramp_up_w_per_s, ramp_down_w_per_s: per-GPU ramp limits, W/s; None: unlimited
            (NVML RAMP_UP_RATE / RAMP_DOWN_RATE).
        ramp_down_hysteresis_s: hold before a ramp-down starts, s (NVML
            RAMP_DOWN_HYSTERESIS, given there in ms).
        powered: tray power on (False: the tray is switched off, e.g. a leaking tray).
    """

    power_cap_w: float | None = None
    gpu_power_cap_w: float | None = None
    power_floor_pct: float = 0.0
    ramp_up_w_per_s: float | None = None
    ramp_down_w_per_s: float | None = None
    ramp_down_hysteresis_s: float = 0.0
    powered: bool = True

    def as_dict(self) -> dict[str, Any]:
        """Plain dict (MQTT state, logs)."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class NodeAgentStatus:
    """What a node agent reports for its tray (watts per GPU are tuples of 4).

    ``enforced_gpu_cap_w`` is the cap in force per GPU after combining the tray cap, the GPU
    cap and TGP; ``enforced_tray_cap_w`` the same as a tray figure; ``floor_w`` the floor per
    GPU (never above the cap). ``gpu_demand_w`` is what the workload asked, ``gpu_request_w``
    what the agent let through (cap / floor / ramp), ``gpu_power_w`` what the GPUs drew after
    thermal throttling (the measured power), ``tray_power_w`` the tray's measured total.
    ``capping``: demand above the cap on some GPU; ``flooring``: the floor is burning power;
    ``ramp_limited``: a ramp limit holds some GPU away from its target. ``epoch``: the newest
    command epoch seen (None: none yet); ``cap_expires_in_s``: s until the caps expire (None:
    no expiring cap); ``gpu_power_capped``: per GPU, the cap holds it below its demand (NVML's
    ``sw_power_cap`` clock-event reason).
    """

    tray: int
    settings: NodeAgentSettings
    enforced_gpu_cap_w: float
    enforced_tray_cap_w: float
    floor_w: float
    gpu_demand_w: tuple[float, ...]
    gpu_request_w: tuple[float, ...]
    gpu_power_w: tuple[float, ...]
    tray_power_w: float
    capping: bool
    flooring: bool
    ramp_limited: bool
    powered: bool
    epoch: int | None = None
    cap_expires_in_s: float | None = None
    gpu_power_capped: tuple[bool, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """Plain dict (MQTT state, logs)."""
        d = asdict(self)
        d["settings"] = self.settings.as_dict()
        return d


class StaleEpoch(ValueError):
    """A command whose epoch is older than the newest the agent has seen (dropped)."""


class NodeAgents:
    """The node agents of every compute tray, vectorised over the rack's GPUs.

    Args:
        n_trays, gpus_per_tray: rack geometry.
        tgp_w: GPU TGP (100 % power), W.
        other_share: non-GPU tray power as a share of its GPU power (Grace CPUs etc.).
        gpu_min_power_limit_w: lowest accepted per-GPU cap, W.

    `configure` sets one tray's `NodeAgentSettings` (validated); `step` turns per-GPU demand
    into per-GPU power requests; `status` reports one tray.
    """

    def __init__(
        self,
        n_trays: int,
        gpus_per_tray: int,
        tgp_w: float,
        other_share: float,
        gpu_min_power_limit_w: float,
    ) -> None:
        self.n_trays = n_trays
        self.gpus_per_tray = gpus_per_tray
        self.tgp_w = tgp_w
        self.other_share = other_share
        self.gpu_min_power_limit_w = gpu_min_power_limit_w
        n = n_trays * gpus_per_tray
        self._settings = [NodeAgentSettings() for _ in range(n_trays)]
        self._cap = np.full(n, tgp_w)
        self._hw_limit = np.full(n, tgp_w)  # per-GPU power limit (NVML's), W
        self._eff = self._cap.copy()  # min(agent cap, hardware limit)
        self._floor = np.zeros(n)
        self._up = np.full(n, math.inf)
        self._down = np.full(n, math.inf)
        self._hyst = np.zeros(n)
        self._powered = np.ones(n, dtype=bool)
        self._out = np.zeros(n)
        self._demand = np.zeros(n)
        self._below_s = np.zeros(n)  # how long the request has been below the power
        self._target = np.zeros(n)
        self._limited = False  # any ramp limit or hysteresis configured
        self._version = 0
        self._t_s = 0.0  # agent time: the sum of the steps, s
        self._epoch: list[int | None] = [None] * n_trays
        self._cap_expires_s = np.full(n_trays, math.inf)  # agent time the caps expire
        self.expired_caps = 0  # trays whose caps expired (counted per expiry)
        self.stale_refused = 0  # commands refused for an epoch older than the newest seen

    @property
    def version(self) -> int:
        """Increments on every accepted `configure` (publish state on change)."""
        return self._version

    def settings(self, tray: int) -> NodeAgentSettings:
        """The settings of ``tray``. Raises ValueError for no such tray."""
        return self._settings[self._tray(tray)]

    def all_settings(self) -> list[NodeAgentSettings]:
        """Every tray's settings, tray order."""
        return list(self._settings)

    def _tray(self, tray: int) -> int:
        if not (isinstance(tray, int) and not isinstance(tray, bool) and 0 <= tray < self.n_trays):
            raise ValueError(f"tray {tray!r} outside 0..{self.n_trays - 1}")
        return tray

    def enforced_gpu_cap_w(self, s: NodeAgentSettings) -> float:
        """Per-GPU cap in force for settings ``s``, W (module docstring)."""
        cap = self.tgp_w
        if s.gpu_power_cap_w is not None:
            cap = min(cap, s.gpu_power_cap_w)
        if s.power_cap_w is not None:
            cap = min(cap, s.power_cap_w / ((1.0 + self.other_share) * self.gpus_per_tray))
        return cap

    def validate(self, s: NodeAgentSettings) -> None:
        """Check settings without applying them.

        Raises:
            ValueError: a cap below the minimum power limit (per GPU, or per tray: that
                times (1 + other share) × GPUs per tray), floor outside 0–100 %, a ramp rate
                not > 0, a negative hysteresis, any non-finite number.
        """
        for name in ("power_cap_w", "gpu_power_cap_w", "ramp_up_w_per_s", "ramp_down_w_per_s"):
            v = getattr(s, name)
            if v is not None and not math.isfinite(v):
                raise ValueError(f"{name} must be finite")
        lo = self.gpu_min_power_limit_w
        if s.gpu_power_cap_w is not None and s.gpu_power_cap_w < lo:
            raise ValueError(f"gpu_power_cap_w {s.gpu_power_cap_w} W below the minimum {lo} W")
        tray_lo = lo * (1.0 + self.other_share) * self.gpus_per_tray
        if s.power_cap_w is not None and s.power_cap_w < tray_lo:
            raise ValueError(
                f"power_cap_w {s.power_cap_w} W below the tray minimum {tray_lo:.0f} W"
            )
        if not (math.isfinite(s.power_floor_pct) and 0.0 <= s.power_floor_pct <= 100.0):
            raise ValueError(f"power_floor_pct {s.power_floor_pct} outside 0–100 %")
        for name in ("ramp_up_w_per_s", "ramp_down_w_per_s"):
            v = getattr(s, name)
            if v is not None and not v > 0.0:
                raise ValueError(f"{name} must be > 0 W/s (or None for unlimited)")
        if not (math.isfinite(s.ramp_down_hysteresis_s) and 0.0 <= s.ramp_down_hysteresis_s
                <= 3600.0):
            raise ValueError("ramp_down_hysteresis_s must be within 0–3600 s")

    def configure(self, tray: int, settings: NodeAgentSettings) -> NodeAgentSettings:
        """Apply ``settings`` to ``tray`` (all or nothing); returns the previous settings.

        Raises:
            ValueError: no such tray, or invalid settings (`validate`); nothing changes.
        """
        k = self._tray(tray)
        self.validate(settings)
        old = self._settings[k]
        self._settings[k] = settings
        g = slice(k * self.gpus_per_tray, (k + 1) * self.gpus_per_tray)
        cap = self.enforced_gpu_cap_w(settings)
        self._cap[g] = cap
        self._eff = np.minimum(self._cap, self._hw_limit)
        self._floor[g] = min(cap, settings.power_floor_pct / 100.0 * self.tgp_w)
        self._up[g] = math.inf if settings.ramp_up_w_per_s is None else settings.ramp_up_w_per_s
        self._down[g] = (
            math.inf if settings.ramp_down_w_per_s is None else settings.ramp_down_w_per_s
        )
        self._hyst[g] = settings.ramp_down_hysteresis_s
        self._powered[g] = settings.powered
        if not settings.powered:
            self._out[g] = 0.0
        self._limited = bool(
            np.isfinite(self._up).any() or np.isfinite(self._down).any() or self._hyst.any()
        )
        self._version += 1
        return old

    def set_gpu_power_limit(self, gpu: int, watts: float) -> None:
        """Set GPU ``gpu``'s own power limit (what NVML's ``nvmlDeviceSetPowerManagementLimit``
        sets on a real GPU, W): the GPU never draws more, whatever the agent's settings (an
        external node agent caps the virtual rack through it).

        Raises:
            ValueError: no such GPU, or ``watts`` not finite and > 0.
        """
        if not 0 <= gpu < self._hw_limit.size:
            raise ValueError(f"gpu {gpu} outside 0..{self._hw_limit.size - 1}")
        if not (math.isfinite(watts) and watts > 0.0):
            raise ValueError(f"power limit {watts!r} W is not finite and > 0")
        self._hw_limit[gpu] = watts
        self._eff = np.minimum(self._cap, self._hw_limit)

    @property
    def gpu_power_limit_w(self) -> np.ndarray:
        """Per-GPU power limits in force (`set_gpu_power_limit`; TGP until set), W (a copy)."""
        return self._hw_limit.copy()

    def cap_expires_in_s(self, tray: int) -> float | None:
        """s until tray ``tray``'s caps expire (None: no expiring cap)."""
        k = self._tray(tray)
        if math.isinf(self._cap_expires_s[k]):
            return None
        return max(0.0, float(self._cap_expires_s[k] - self._t_s))

    def newest_epoch(self, tray: int) -> int | None:
        """The newest command epoch tray ``tray`` has seen (None: no command yet)."""
        return self._epoch[self._tray(tray)]

    def command(self, trays: list[int], *, epoch: int, changes: dict[str, Any],
                release: tuple[str, ...] = (), ttl_s: float | None = None) -> None:
        """Apply one contract-v1 command to ``trays`` (all or nothing): ``changes`` (settings
        field -> value, never None), ``release`` (the limits to remove), the sender's
        ``epoch``; a command setting a cap arms the tray's cap expiry at ``ttl_s``.

        Raises:
            StaleEpoch: ``epoch`` older than the newest seen on one of ``trays`` (counted in
                ``stale_refused``, one per command).
            ValueError: no such tray, invalid settings (`validate`), a cap without ``ttl_s``;
                nothing changes.
        """
        ks = [self._tray(t) for t in trays]
        for k in ks:
            seen = self._epoch[k]
            if seen is not None and epoch < seen:
                self.stale_refused += 1
                raise StaleEpoch(f"epoch {epoch} older than {seen}, the newest tray {k} has "
                                 "seen")
        sets_cap = any(f in changes for f in ("power_cap_w", "gpu_power_cap_w"))
        if sets_cap and ttl_s is None:
            raise ValueError("a cap needs a ttl_s")
        fields: dict[str, Any] = {**changes, **dict.fromkeys(release)}
        new = {k: replace(self._settings[k], **fields) for k in ks}
        for s in new.values():  # validate all before changing any
            self.validate(s)
        for k, s in new.items():
            self._epoch[k] = epoch
            if s.power_cap_w is None and s.gpu_power_cap_w is None:
                self._cap_expires_s[k] = math.inf
            elif sets_cap:
                assert ttl_s is not None
                self._cap_expires_s[k] = self._t_s + ttl_s
            if s != self._settings[k]:
                self.configure(k, s)

    def _expire(self) -> None:
        """Release the caps whose TTL ran out (agent time)."""
        for k in np.flatnonzero(self._cap_expires_s <= self._t_s + 1e-9).tolist():
            self._cap_expires_s[k] = math.inf
            self.expired_caps += 1
            self.configure(k, replace(self._settings[k], power_cap_w=None,
                                      gpu_power_cap_w=None))

    def set_powered(self, tray: int, powered: bool) -> None:
        """Switch a tray on or off, other settings kept. Raises ValueError for no such tray."""
        self.configure(tray, replace(self.settings(tray), powered=powered))

    def reset(self, request_w: np.ndarray | None = None) -> None:
        """Set the power state at once (warm start): to ``request_w`` clipped by the current
        settings (zeros when None); ramp timers cleared."""
        if request_w is None:
            self._out[:] = 0.0
        else:
            self._out = np.where(self._powered, np.clip(request_w, self._floor, self._eff), 0.0)
        self._target = self._out.copy()
        self._below_s[:] = 0.0

    def step(self, demand_w: np.ndarray, dt: float) -> np.ndarray:
        """Per-GPU power requests after cap / floor / ramp / power state, W (a copy).

        Args:
            demand_w: per-GPU demand, W, shape ``(n_trays × gpus_per_tray,)``.
            dt: step, s (> 0).
        """
        self._t_s += dt
        if self._cap_expires_s.min() <= self._t_s + 1e-9:
            self._expire()
        self._demand = demand_w
        target = np.minimum(np.maximum(demand_w, self._floor), self._eff)
        target *= self._powered
        self._target = target
        if not self._limited:
            self._out = target
            return target.copy()
        out = self._out
        d = target - out
        down = d < 0.0
        self._below_s = np.where(down, self._below_s + dt, 0.0)
        hold = down & (self._below_s < self._hyst - 1e-12)
        step = np.clip(d, -self._down * dt, self._up * dt)
        step[hold] = 0.0
        out = out + step
        out = np.minimum(out, self._eff)  # a cap acts at once
        out[~self._powered] = 0.0
        self._out = out
        return out.copy()

    @property
    def request_w(self) -> np.ndarray:
        """The last per-GPU requests, W (a copy)."""
        return self._out.copy()

    @property
    def powered(self) -> np.ndarray:
        """Per-GPU tray power state (a copy)."""
        return self._powered.copy()

    def status(self, tray: int, gpu_power_w: np.ndarray) -> NodeAgentStatus:
        """Tray ``tray``'s report, with the rack's measured per-GPU power ``gpu_power_w``
        (after throttling, shape ``(n_trays × gpus_per_tray,)``).

        Raises:
            ValueError: no such tray.
        """
        k = self._tray(tray)
        s = self._settings[k]
        g = slice(k * self.gpus_per_tray, (k + 1) * self.gpus_per_tray)
        cap = float(self._cap[g][0])
        measured = gpu_power_w[g]
        demand = self._demand[g] if len(self._demand) else np.zeros(self.gpus_per_tray)
        tray_w = float(measured.sum() + self.other_share * self._out[g].sum())
        return NodeAgentStatus(
            tray=k,
            settings=s,
            enforced_gpu_cap_w=cap,
            enforced_tray_cap_w=cap * self.gpus_per_tray * (1.0 + self.other_share),
            floor_w=float(self._floor[g][0]),
            gpu_demand_w=tuple(demand.astype(np.float64).tolist()),  # float(v) each
            gpu_request_w=tuple(self._out[g].astype(np.float64).tolist()),
            gpu_power_w=tuple(measured.astype(np.float64).tolist()),
            tray_power_w=tray_w,
            capping=bool(s.powered and (demand > cap + 1e-9).any()),
            flooring=bool(s.powered and (demand < self._floor[g][0] - 1e-9).any()),
            ramp_limited=bool(s.powered and (np.abs(self._target[g] - self._out[g]) > 1e-6).any()),
            powered=s.powered,
            epoch=self._epoch[k],
            cap_expires_in_s=None if math.isinf(self._cap_expires_s[k])
            else max(0.0, float(self._cap_expires_s[k] - self._t_s)),
            gpu_power_capped=tuple(bool(s.powered and d > cap + 1e-9)
                                   for d in demand.astype(np.float64).tolist()),
        )


@dataclass
class LeakState:
    """Leak sensors at a time: per compute tray, rope and drip pan (True = wet / faulted)."""

    tray_leak: np.ndarray
    tray_sensor_fault: np.ndarray
    rope_leak: bool
    rope_sensor_fault: bool
    drip_pan_leak: bool
    drip_pan_sensor_fault: bool
    tray_leaked_ml: np.ndarray
    rope_leaked_ml: float
    drip_pan_ml: float
    leak_lpm: float
    leaked_l: float
    extra: dict[str, Any] = field(default_factory=dict)

    def leaking_trays(self) -> list[int]:
        """Trays whose sensor reads wet."""
        return [int(i) for i in np.flatnonzero(self.tray_leak)]


class LeakSensors:
    """Leak locations and sensors of one rack (+ its CDU rope sensor); module docstring.

    Args:
        n_trays: compute trays.
        params: thresholds and delay.

    `set_tray_leak` / `set_rope_leak` set leak rates (L/min); `set_sensor_fault` sets a
    sensor's fault flag; `step(dt)` accumulates volumes and trips sensors; `state` reads.
    """

    def __init__(self, n_trays: int, params: LeakSensorParams | None = None) -> None:
        self.n_trays = n_trays
        self.params = params if params is not None else LeakSensorParams()
        self._tray_lpm = np.zeros(n_trays)
        self._rope_lpm = 0.0
        self._tray_ml = np.zeros(n_trays)
        self._rope_ml = 0.0
        self._pan_ml = 0.0
        self._tray_wet_s = np.zeros(n_trays)
        self._rope_wet_s = 0.0
        self._pan_wet_s = 0.0
        self._tray_fault = np.zeros(n_trays, dtype=bool)
        self._rope_fault = False
        self._pan_fault = False
        self._leaked_l = 0.0
        # No leak rate was ever set: every volume and wetting timer is still 0, so `step`
        # has nothing to add and `state` reads dry (a fast path: most runs never leak).
        self._idle = True

    def _idle_dry(self) -> bool:
        """True while `_idle` holds and the thresholds are positive (0 mL never wets)."""
        p = self.params
        return self._idle and (p.tray_threshold_ml > 0.0 and p.rope_threshold_ml > 0.0
                               and p.drip_pan_threshold_ml > 0.0)

    def _tray(self, tray: int) -> int:
        if not (isinstance(tray, int) and 0 <= tray < self.n_trays):
            raise ValueError(f"tray {tray!r} outside 0..{self.n_trays - 1}")
        return tray

    @staticmethod
    def _rate(leak_lpm: float) -> float:
        if not (math.isfinite(leak_lpm) and leak_lpm >= 0.0):
            raise ValueError("leak_lpm must be finite and >= 0")
        return float(leak_lpm)

    def set_tray_leak(self, tray: int, leak_lpm: float) -> None:
        """Leak ``leak_lpm`` L/min at compute tray ``tray`` (0 stops it; REFERENCE §5 S6:
        weep 0.2, QD failure 20). Raises ValueError for a bad tray or rate."""
        self._tray_lpm[self._tray(tray)] = self._rate(leak_lpm)
        self._idle = False

    def set_rope_leak(self, leak_lpm: float) -> None:
        """Leak ``leak_lpm`` L/min at the CDU (onto its rope sensor). Raises ValueError."""
        self._rope_lpm = self._rate(leak_lpm)
        self._idle = False

    def set_sensor_fault(self, sensor: LeakSensorName, fault: bool, tray: int | None = None
                         ) -> None:
        """Set the fault flag of a sensor (``tray`` with its index, ``rope``, ``drip_pan``).

        Raises:
            ValueError: unknown sensor or missing/bad tray.
        """
        if sensor == "tray":
            if tray is None:
                raise ValueError("a tray leak-sensor fault needs the tray")
            self._tray_fault[self._tray(tray)] = fault
        elif sensor == "rope":
            self._rope_fault = fault
        elif sensor == "drip_pan":
            self._pan_fault = fault
        else:
            raise ValueError(f"unknown leak sensor {sensor!r} (tray, rope, drip_pan)")

    def dry(self) -> None:
        """Clean up: every location dry, sensors reset (leak rates and faults kept)."""
        self._tray_ml[:] = 0.0
        self._rope_ml = self._pan_ml = 0.0
        self._tray_wet_s[:] = 0.0
        self._rope_wet_s = self._pan_wet_s = 0.0

    @property
    def leak_lpm(self) -> float:
        """Total leak rate of this rack and its rope location, L/min."""
        return float(self._tray_lpm.sum()) + self._rope_lpm

    def step(self, dt: float) -> None:
        """Accumulate ``dt`` s of leaking and advance the wetting timers."""
        if self._idle_dry():
            return  # nothing has leaked: the steps below would add 0 everywhere
        p = self.params
        k = dt * 1000.0 / 60.0  # L/min -> mL per step
        if self._tray_lpm.any():
            new = self._tray_ml + self._tray_lpm * k
            over = np.maximum(new - p.tray_retention_ml, 0.0) - np.maximum(
                self._tray_ml - p.tray_retention_ml, 0.0
            )
            self._pan_ml += float(over.sum())
            self._tray_ml = new
        self._rope_ml += self._rope_lpm * k
        self._leaked_l += self.leak_lpm * dt / 60.0
        wet = self._tray_ml >= p.tray_threshold_ml
        self._tray_wet_s = np.where(wet, self._tray_wet_s + dt, 0.0)
        self._rope_wet_s = self._rope_wet_s + dt if self._rope_ml >= p.rope_threshold_ml else 0.0
        self._pan_wet_s = self._pan_wet_s + dt if self._pan_ml >= p.drip_pan_threshold_ml else 0.0

    def state(self) -> LeakState:
        """The sensors now (a faulted sensor reads dry and sets its fault flag)."""
        if self._idle_dry():  # nothing has leaked: the same state without the array maths
            return LeakState(
                tray_leak=np.zeros(self.n_trays, dtype=bool),
                tray_sensor_fault=self._tray_fault.copy(),
                rope_leak=False,
                rope_sensor_fault=self._rope_fault,
                drip_pan_leak=False,
                drip_pan_sensor_fault=self._pan_fault,
                tray_leaked_ml=self._tray_ml.copy(),
                rope_leaked_ml=self._rope_ml,
                drip_pan_ml=self._pan_ml,
                leak_lpm=0.0,
                leaked_l=self._leaked_l,
            )
        d = self.params.wetting_delay_s - 1e-9
        tray_wet = (self._tray_ml >= self.params.tray_threshold_ml) & (self._tray_wet_s >= d)
        rope = self._rope_ml >= self.params.rope_threshold_ml and self._rope_wet_s >= d
        pan = self._pan_ml >= self.params.drip_pan_threshold_ml and self._pan_wet_s >= d
        return LeakState(
            tray_leak=tray_wet & ~self._tray_fault,
            tray_sensor_fault=self._tray_fault.copy(),
            rope_leak=bool(rope and not self._rope_fault),
            rope_sensor_fault=self._rope_fault,
            drip_pan_leak=bool(pan and not self._pan_fault),
            drip_pan_sensor_fault=self._pan_fault,
            tray_leaked_ml=self._tray_ml.copy(),
            rope_leaked_ml=self._rope_ml,
            drip_pan_ml=self._pan_ml,
            leak_lpm=self.leak_lpm,
            leaked_l=self._leaked_l,
        )


class ComputeRack:
    """The rack's trays: node agents and power, switch trays, leak sensors.

    Args:
        rack: the thermal rack's parameters (`sims.cdu.RackParams`: tray and GPU counts,
            TGP ``gpu_max_power_w``, 100 % power ``rack_max_power_w``).
        params: `ComputeRackParams`.

    The non-GPU share of a compute tray's power is derived so that every GPU at TGP gives
    ``rack_max_power_w`` [D]: with REFERENCE §4.3's 132 kW, 72 × 1.2 kW GPUs and 9 × 0.4 kW
    switch trays it is (132 − 86.4 − 3.6) / 86.4 = 0.486 (2.33 kW of Grace CPUs, memory, NICs,
    fans and conversion per tray at full load, 7.13 kW per tray: above the ~5.4 kW GB200 tray
    figure of REFERENCE §1.1, because the 132 kW design point carries margin).

    Raises:
        ValueError: GPUs and switch trays alone exceed ``rack_max_power_w``.
    """

    def __init__(self, rack: RackParams, params: ComputeRackParams | None = None) -> None:
        self.rack = rack
        self.params = p = params if params is not None else ComputeRackParams()
        self.n_trays = rack.n_trays
        self.gpus_per_tray = rack.gpus_per_tray
        self.n_gpus = rack.n_trays * rack.gpus_per_tray
        self.tgp_w = rack.gpu_max_power_w
        self.switch_power_w = p.switch_trays * p.switch_tray_power_w
        gpu_total = self.n_gpus * self.tgp_w
        other = rack.rack_max_power_w - gpu_total - self.switch_power_w
        if other < 0.0:
            raise ValueError(
                f"GPUs ({gpu_total:.0f} W) and switch trays ({self.switch_power_w:.0f} W) "
                f"exceed rack_max_power_w {rack.rack_max_power_w:.0f} W"
            )
        self.other_share = other / gpu_total
        self.agents = NodeAgents(
            rack.n_trays, rack.gpus_per_tray, self.tgp_w, self.other_share,
            p.gpu_min_power_limit_w,
        )
        self.leaks = LeakSensors(rack.n_trays, p.leak)
        self._request = np.zeros(self.n_gpus)

    def gpu_fraction_for_rack_power(self, rack_power_w: float) -> float:
        """Uniform per-GPU fraction of TGP giving rack IT power ``rack_power_w`` (W) with every
        tray on and uncapped; below the switch trays' power it is 0."""
        full_w = self.n_gpus * self.tgp_w * (1.0 + self.other_share)
        f = (rack_power_w - self.switch_power_w) / full_w
        return max(0.0, f)

    def rack_power_for_gpu_power(self, gpu_power_w: np.ndarray) -> float:
        """Rack IT power for per-GPU power ``gpu_power_w`` (trays off draw nothing), W."""
        return float(gpu_power_w.sum()) * (1.0 + self.other_share) + self.switch_power_w

    def step(self, demand_fraction: np.ndarray, dt: float) -> tuple[np.ndarray, float]:
        """Node agents for one step: per-GPU requests (W) and the rack IT power demand (W)
        they make (before thermal throttling). Also steps the leak sensors."""
        req = self.agents.step(np.asarray(demand_fraction) * self.tgp_w, dt)
        self._request = req
        self.leaks.step(dt)
        return req, self.rack_power_for_gpu_power(req)

    def tray_power_w(self, gpu_power_w: np.ndarray) -> np.ndarray:
        """Per-compute-tray power, W, shape ``(n_trays,)``: the GPUs' drawn power
        ``gpu_power_w`` (after throttling) plus the non-GPU share of the agents' requests (a
        throttled GPU does not slow its CPUs, as in `sims.cdu.RackThermal.step_gpus`)."""
        n, g = self.n_trays, self.gpus_per_tray
        return gpu_power_w.reshape(n, g).sum(axis=1) + self.other_share * self._request.reshape(
            n, g
        ).sum(axis=1)
