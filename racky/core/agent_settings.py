"""What racky wants each tray's node agent to hold, and getting it there (pure): the desired
settings (`DesiredTray`), the commands that change them (`AgentCommand`, `diff_commands`; on
the wire the node-agent contract v1, `AgentCommand.wire_args`), staggered tray power
switching (`Sequencer`) and reconciliation against what the agents report (`Reconciler`,
including the caps' TTL refresh). `racky.core.power` re-exports these names.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rackplane.core.tray_contract import (
    CAP_FIELDS,
    RACKY_CAP_TTL_S,
    RELEASABLE_FIELDS,
    SCHEMA_VERSION,
)
from racky.config import NodeAgentsSettings, PowerSettings, SequencingSettings
from racky.core.telemetry import TrayReading

__all__ = ["CAP_REFRESH_S", "CAP_TTL_S", "DRIFT_CAUSES", "AgentCommand", "CapDrift",
           "DesiredTray", "DeviceLimits", "Reconciler", "Sequencer", "classify_cap_drift",
           "diff_commands", "with_powered"]

CAP_TTL_S = RACKY_CAP_TTL_S
"""The TTL racky gives the caps it sends, s (`rackplane.core.tray_contract.RACKY_CAP_TTL_S`):
an agent releases a cap racky stopped refreshing
(racky stopped, or cut off from the agent) this long after the last command that set it."""

CAP_REFRESH_S = 20.0
"""racky re-sends a tray's settings when nothing was sent to it for this long while it holds
a cap (a third of `CAP_TTL_S`: two refreshes may be lost before a cap lapses)."""


@dataclass(frozen=True, slots=True)
class DesiredTray:
    """What racky wants a tray's agent to hold (the agent contract's fields)."""

    powered: bool = True
    power_cap_w: float | None = None
    gpu_power_cap_w: float | None = None
    power_floor_pct: float = 0.0
    ramp_up_w_per_s: float | None = None
    ramp_down_w_per_s: float | None = None
    ramp_down_hysteresis_s: float = 0.0

    def args(self) -> dict[str, Any]:
        """The ``set_power_limits`` args of these settings (without ``trays``)."""
        return {
            "powered": self.powered, "power_cap_w": self.power_cap_w,
            "gpu_power_cap_w": self.gpu_power_cap_w, "power_floor_pct": self.power_floor_pct,
            "ramp_up_w_per_s": self.ramp_up_w_per_s,
            "ramp_down_w_per_s": self.ramp_down_w_per_s,
            "ramp_down_hysteresis_s": self.ramp_down_hysteresis_s,
        }


@dataclass(frozen=True, slots=True)
class AgentCommand:
    """A ``set_power_limits`` to send: ``trays`` and the changed settings ``args`` (racky's
    own form: `DesiredTray` fields, None = no cap / no ramp limit). On the wire it is
    `wire_args` (node-agent contract v1: never null)."""

    trays: tuple[int, ...]
    args: dict[str, Any]
    reason: str

    def wire_args(self, epoch: int) -> dict[str, Any]:
        """The command's ``set_power_limits`` args in the node-agent contract v1
        (docs/CONTRACTS.md): ``schema_version``, ``trays``, the sender's ``epoch`` (racky:
        its start time, ms since the Unix epoch), every changed setting with its value, the
        limits set to None named in ``release`` (never null), and ``ttl_s`` = `CAP_TTL_S`
        when a cap is set (racky refreshes its caps every `CAP_REFRESH_S`).

        Raises:
            ValueError: a setting other than a cap or ramp limit is None (racky never
                builds one).
        """
        out: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "trays": list(self.trays),
                               "epoch": int(epoch)}
        release = []
        for f, v in self.args.items():
            if v is None:
                if f not in RELEASABLE_FIELDS:
                    raise ValueError(f"{f}: None is not a value (contract v1)")
                release.append(f)
            else:
                out[f] = v if isinstance(v, bool) else float(v)
        if release:
            out["release"] = [f for f in RELEASABLE_FIELDS if f in release]
        if any(f in out for f in CAP_FIELDS):
            out["ttl_s"] = CAP_TTL_S
        return out


def diff_commands(old: Sequence[DesiredTray | None], new: Sequence[DesiredTray],
                  reason: str, force: Sequence[int] = ()) -> list[AgentCommand]:
    """Commands that take the agents from ``old`` (None: unknown, send everything) to
    ``new``: trays with the same changed fields and values share a command (<= 64 trays)."""
    groups: dict[tuple[tuple[str, Any], ...], list[int]] = {}
    forced = set(force)
    for k, (o, n) in enumerate(zip(old, new, strict=True)):
        na = n.args()
        if o is None or k in forced:
            changed = tuple(sorted(na.items()))
        else:
            oa = o.args()
            changed = tuple(sorted((f, v) for f, v in na.items() if oa[f] != v))
        if changed:
            groups.setdefault(changed, []).append(k)
    out = []
    for fields, trays in groups.items():
        for i in range(0, len(trays), 64):
            out.append(AgentCommand(tuple(trays[i:i + 64]), dict(fields), reason))
    return out


class Sequencer:
    """Staggered tray power on/off within an inrush limit (module docstring)."""

    def __init__(self, cfg: SequencingSettings, n_trays: int) -> None:
        self.cfg = cfg
        self.n = n_trays
        self._queue: deque[tuple[int, bool]] = deque()
        self._recent: deque[tuple[float, float]] = deque()  # (t, W switched)

    @property
    def pending(self) -> list[tuple[int, bool]]:
        """Switchings still queued: (tray, power on) in order."""
        return list(self._queue)

    def request(self, trays: Sequence[int], powered: bool) -> None:
        """Queue trays to switch (a later request for a tray replaces an earlier one)."""
        drop = set(trays)
        self._queue = deque((t, p) for t, p in self._queue if t not in drop)
        self._queue.extend((t, powered) for t in trays)

    def cancel(self, trays: Sequence[int]) -> None:
        """Drop the queued switchings of ``trays`` (a safety power-down overrides them)."""
        drop = set(trays)
        self._queue = deque((t, p) for t, p in self._queue if t not in drop)

    def step(self, now: float) -> list[tuple[int, bool]]:
        """The switches allowed now (at most ``inrush_limit_w`` per ``stagger_s``)."""
        c = self.cfg
        while self._recent and now - self._recent[0][0] >= c.stagger_s - 1e-9:
            self._recent.popleft()
        used = sum(w for _, w in self._recent)
        out: list[tuple[int, bool]] = []
        while self._queue and (used + c.tray_inrush_w <= c.inrush_limit_w + 1e-9
                               or (not self._recent and not out)):
            t, p = self._queue.popleft()
            out.append((t, p))
            used += c.tray_inrush_w
            self._recent.append((now, c.tray_inrush_w))
        return out


DRIFT_CAUSES: dict[str, str] = {
    "reverted_to_default": "the agent holds no cap or the default power limit: a driver "
    "reload, a GPU reset or an agent restart restored the default",
    "clamped_to_device_limit": "the device holds a limit of its own instead of the value "
    "(its minimum or maximum power limit)",
    "other_writer": "another value is set: another tool or controller writes the cap",
}
"""The likely causes of a cap that drifts (issue 14 item 14), by class."""


@dataclass(frozen=True, slots=True)
class DeviceLimits:
    """The power limits of a tray's GPUs as racky knows them (W): per GPU, and the same as
    tray figures (× GPUs × (1 + the non-GPU share)). ``default``: what a GPU holds with no cap
    set (NVML's default power limit: the TGP); ``min`` / ``max``: the limits a cap is
    clamped to (NVML's power-limit constraints; racky's ``node_agents.gpu_min_power_limit_w``
    and ``gpu_tgp_w``)."""

    gpu_min_w: float
    gpu_default_w: float
    gpu_max_w: float
    tray_min_w: float
    tray_default_w: float
    tray_max_w: float

    @classmethod
    def of(cls, agents: NodeAgentsSettings, other_share: float) -> DeviceLimits:
        """From racky's ``[node_agents]`` config and the non-GPU share of tray power (the
        tray minimum rounded up as `racky.core.power.CapAllocator.tray_min_w`)."""
        per_tray = agents.gpus_per_tray * (1.0 + other_share)
        lo, tgp = agents.gpu_min_power_limit_w, agents.gpu_tgp_w
        return cls(lo, tgp, tgp, math.ceil(lo * per_tray + 1.0), tgp * per_tray,
                   tgp * per_tray)


@dataclass(frozen=True, slots=True)
class CapDrift:
    """A cap the agent does not hold as commanded, classified.

    Attributes:
        field: ``tray cap`` or ``GPU cap``.
        commanded_w: what racky set (W; a tray or per-GPU figure).
        enforced_w: what the agent reports holding instead (the cap it reports set, or the
            one in force when the set one is racky's), W; None: no cap set.
        cause: a key of `DRIFT_CAUSES`.
    """

    field: str
    commanded_w: float
    enforced_w: float | None
    cause: str

    def describe(self) -> str:
        """``other_writer: tray cap desired 5000 W (racky's command), agent holds 6200 W
        (likely ...)``."""
        held = "no cap" if self.enforced_w is None else f"{self.enforced_w:.0f} W"
        return (f"{self.cause}: {self.field} desired {self.commanded_w:.0f} W (racky's "
                f"command), agent holds {held} (likely {DRIFT_CAUSES[self.cause]})")


def classify_cap_drift(d: DesiredTray, a: Any, lim: DeviceLimits | None, tol_w: float
                       ) -> CapDrift | None:
    """Classify a tray whose agent does not hold racky's cap, from what the agent reports
    (node-agent contract v1: the caps set, ``power_cap_w`` / ``gpu_power_cap_w``, and those
    in force, ``enforced_tray_cap_w`` / ``enforced_gpu_cap_w``) and the device limits:

    - no cap set where racky set one, or the default limit set or in force:
      ``reverted_to_default``;
    - another value set that is a device limit the commanded value lies beyond, or racky's
      value set but another one in force above it: ``clamped_to_device_limit``;
    - another value set: ``other_writer``.

    Only the caps count (the power state, floor and ramps are other mismatches). A cap in
    force *below* the commanded one is no drift (the tray draws less, e.g. racky's own GPU
    cap binds). Tolerance: ``tol_w`` for a tray figure, ``tol_w`` / 4 per GPU, at least 2 %.

    Returns:
        The drift, or None when the caps are held.
    """
    def near(x: float | None, y: float, t: float) -> bool:
        return x is not None and math.isfinite(x) and abs(x - y) <= t

    fields = (("tray cap", d.power_cap_w, a.power_cap_w, a.enforced_tray_cap_w, tol_w,
               None if lim is None else (lim.tray_min_w, lim.tray_default_w, lim.tray_max_w)),
              ("GPU cap", d.gpu_power_cap_w, a.gpu_power_cap_w, a.enforced_gpu_cap_w,
               tol_w / 4.0,
               None if lim is None else (lim.gpu_min_w, lim.gpu_default_w, lim.gpu_max_w)))
    for name, want, held, enforced, tol, limits in fields:
        if want is None:
            continue
        t = max(tol, 0.02 * want)
        lo, dflt, hi = limits if limits is not None else (math.nan, math.nan, math.nan)
        if held is None:
            return CapDrift(name, want, None, "reverted_to_default")
        if abs(held - want) > t:
            if near(held, dflt, t):
                cause = "reverted_to_default"
            elif (near(held, lo, t) and want < lo) or (near(held, hi, t) and want > hi):
                cause = "clamped_to_device_limit"
            else:
                cause = "other_writer"
            return CapDrift(name, want, held, cause)
        if math.isfinite(enforced) and enforced > want + t:
            cause = "reverted_to_default" if near(enforced, dflt, t) else \
                "clamped_to_device_limit"
            return CapDrift(name, want, enforced, cause)
    return None


class Reconciler:
    """Desired vs reported agent settings per tray (module docstring).

    **Cap drift** (issue 14 item 14): every re-assert of a cap the agent does not hold is an
    episode, classified (`classify_cap_drift`: reverted to default, clamped to the device
    limit, another writer). ``cap_drift:<tray>`` is raised when a mismatch lasts
    ``drift_alarm_s`` *or* when ``drift_recur_count`` episodes fall within
    ``drift_recur_window_s`` (a cap that another writer keeps changing is re-asserted each
    time and never drifts for long); its detail names the tray's commanded and held values
    and the class. A recurrence alarm clears when the window holds fewer episodes.

    Args:
        limits: the device limits (`DeviceLimits`) for the classification; None: only
            ``other_writer`` / ``reverted_to_default`` (no cap set) can be told.
    """

    def __init__(self, cfg: PowerSettings, n_trays: int,
                 limits: DeviceLimits | None = None) -> None:
        self.cfg = cfg
        self.n = n_trays
        self.limits = limits
        self._since = np.full(n_trays, np.nan)
        self._last_assert = np.full(n_trays, -np.inf)
        self.reasserts = 0
        self.refreshes = 0
        self.refreshed: set[int] = set()
        self.mismatch: dict[int, str] = {}
        self.drift_episodes = 0
        self.drift: dict[int, CapDrift] = {}
        self._episodes: dict[int, deque[tuple[float, CapDrift]]] = {}
        self._counted: set[int] = set()

    def note_sent(self, trays: Sequence[int], now: float) -> None:
        """New settings for ``trays`` went out: judge them afresh from now."""
        for k in trays:
            self._since[k] = np.nan
            self._last_assert[k] = now

    def note_reasserted(self, trays: Sequence[int], now: float) -> None:
        """Unchanged settings were re-sent to ``trays``: the next reading judged is one newer
        than this, but the mismatch keeps its age (an agent that accepts and does not hold a
        cap still drifts, and ``drift_alarm_s`` still raises its alarm)."""
        for k in trays:
            self._last_assert[k] = now

    def step(self, now: float, desired: Sequence[DesiredTray],
             readings: Mapping[int, TrayReading], fresh: np.ndarray
             ) -> tuple[list[int], dict[int, str]]:
        """Trays to re-assert now, and trays drifting long enough to alarm (with detail).

        Also the trays whose caps are due for their TTL refresh (node-agent contract v1): a
        tray that has reported, with a cap desired and sent, nothing sent to it for
        `CAP_REFRESH_S` (counted in ``refreshes``, not in ``reasserts``; this step's in
        ``refreshed``). A tray whose mismatch is being confirmed waits for its re-assert
        (at most ``reconcile_confirm_s``, far within `CAP_TTL_S`), so a drift is counted
        and classified rather than silently repaired by a refresh."""
        tol = self.cfg.reconcile_tolerance_w
        resend: list[int] = []
        drift: dict[int, str] = {}
        self.mismatch = {}
        for k in range(self.n):
            r = readings.get(k)
            if r is None or not fresh[k] or r.t_mono <= self._last_assert[k]:
                continue
            why = _mismatch(desired[k], r, tol)
            if why is None:
                self._since[k] = np.nan
                self._counted.discard(k)
                self.drift.pop(k, None)
                continue
            self.mismatch[k] = why
            cd = classify_cap_drift(desired[k], r.agent, self.limits, tol)
            if cd is not None:
                self.drift[k] = cd
                why = cd.describe()
            else:
                self.drift.pop(k, None)
            if np.isnan(self._since[k]):
                self._since[k] = now
            age = now - self._since[k]
            if (age >= self.cfg.reconcile_confirm_s - 1e-9
                    and now - self._last_assert[k] >= self.cfg.reconcile_confirm_s - 1e-9):
                resend.append(k)
                self.reasserts += 1
                if cd is not None and k not in self._counted:  # one episode per mismatch
                    self._counted.add(k)
                    self.drift_episodes += 1
                    self._episodes.setdefault(k, deque()).append((now, cd))
            if age >= self.cfg.drift_alarm_s - 1e-9:
                drift[k] = why
        drift.update(self._recurring(now, drift))
        due = set(resend)
        self.refreshed = set()
        for k in range(self.n):
            d = desired[k]
            if (k not in due and k not in self.mismatch  # being confirmed: re-asserted soon
                    and k in readings and math.isfinite(self._last_assert[k])
                    and (d.power_cap_w is not None or d.gpu_power_cap_w is not None)
                    and now - self._last_assert[k] >= CAP_REFRESH_S - 1e-9):
                resend.append(k)
                self.refreshed.add(k)
                self.refreshes += 1
        return resend, drift


    def _recurring(self, now: float, persistent: Mapping[int, str]) -> dict[int, str]:
        """Trays whose cap drifted ``drift_recur_count`` times within
        ``drift_recur_window_s`` (and do not already alarm for a persistent drift)."""
        c = self.cfg
        out: dict[int, str] = {}
        for k, eps in list(self._episodes.items()):
            while eps and now - eps[0][0] >= c.drift_recur_window_s:
                eps.popleft()
            if not eps:
                del self._episodes[k]
                continue
            if len(eps) >= c.drift_recur_count and k not in persistent:
                causes = sorted({cd.cause for _t, cd in eps})
                out[k] = (f"{eps[-1][1].describe()}; re-asserted {len(eps)} times within "
                          f"{c.drift_recur_window_s:g} s (causes: {', '.join(causes)})")
        return out


def _mismatch(d: DesiredTray, r: TrayReading, tol: float) -> str | None:
    a = r.agent
    if d.powered != r.powered:
        return f"powered: desired {d.powered}, reported {r.powered}"

    def differ(x: float | None, y: float | None) -> bool:
        if x is None or y is None:
            return (x is None) != (y is None)
        return abs(x - y) > tol

    if differ(d.power_cap_w, a.power_cap_w):
        return f"tray cap: desired {_w(d.power_cap_w)}, reported {_w(a.power_cap_w)}"
    if differ(d.gpu_power_cap_w, a.gpu_power_cap_w):
        return f"GPU cap: desired {_w(d.gpu_power_cap_w)}, reported {_w(a.gpu_power_cap_w)}"
    if d.power_cap_w is not None and a.enforced_tray_cap_w > d.power_cap_w + tol:
        return f"enforced tray cap {a.enforced_tray_cap_w:.0f} W above {d.power_cap_w:.0f} W"
    if abs(d.power_floor_pct - (0.0 if math.isnan(a.power_floor_pct) else a.power_floor_pct)) \
            > 0.5:
        return f"floor: desired {d.power_floor_pct:g} %, reported {a.power_floor_pct:g} %"
    if differ(d.ramp_up_w_per_s, a.ramp_up_w_per_s) or differ(
            d.ramp_down_w_per_s, a.ramp_down_w_per_s):
        return "ramp limits differ"
    return None


def _w(x: float | None) -> str:
    return "none" if x is None else f"{x:.0f} W"


def with_powered(d: DesiredTray, powered: bool) -> DesiredTray:
    """``d`` with the tray's power state replaced."""
    return replace(d, powered=powered)
