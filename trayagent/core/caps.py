"""The agent's cap book: what racky set per tray, the epoch rule, the TTL and the safe cap, and
the per-GPU power limit each GPU should be held at (clamped to the device's limits).

Rules (docs/CONTRACTS.md "Node-agent contract v1", and the tray edge's own, docs/TRAY-AGENT.md):

- **Epoch**: a command carries the sender's epoch (0 where the site runs no redundant
  controllers). Per tray the newest epoch seen is kept (and persisted by the caller); a command
  with an older one is refused (`StaleEpoch`) on any of its trays, so once a positive epoch
  has been seen, 0 is refused too. An equal or newer one is applied.
- **TTL**: a command that sets a cap carries ``ttl_s``; the tray's caps (``power_cap_w``,
  ``gpu_power_cap_w``) expire together ``ttl_s`` after the last command that set one. Then
  racky's caps are reported null (as the contract says) but the GPUs are held at the
  configured **safe cap**, never uncapped: racky went silent, the agent cannot know the rack's
  budget. The same safe cap holds from the agent's start until the first command.
- **Released** caps (racky named them in ``release``): racky decided the tray is uncapped: each
  GPU goes to its default power limit.
- **Target** per GPU: min(``gpu_power_cap_w``, (``power_cap_w`` − the tray's non-GPU power) /
  GPUs of the tray), clamped to the device's [min, max] limits (``power_cap_w`` is the whole
  tray's input power: CPUs, NICs and fans take their share first; the caller says how much,
  measured or configured); a clamped target says so (``clamped``). A racky cap below the
  device minimum is refused by the command handler (``out_of_range``) before it gets here; a
  safe cap below it is clamped up (and says so).

A tray capped at its BMC (one chassis power limit, `CapBook.tray_wanted`): racky's
``power_cap_w``; a ``gpu_power_cap_w`` as GPUs × it + the tray's non-GPU power (the chassis
limit bounds the tray's input power); the smaller of the two; the safe cap likewise (GPUs ×
``safe_gpu_cap_w`` + non-GPU power); released: None (the control's maximum). The control's
range clamps it (`trayagent.core.bmc.clamp_setpoint`).

**Convergence** (`limit_action`): what a GPU is held at converges to the last desired state.
A GPU applies a new limit after a delay and the agent sees it only in a later read-back, so a
read-back equal to the target does not prove it is held while another limit the agent set is
still on its way (a set, then a release or another set, within the delay): the target is set
again (the device applies the later set last), and every read-back that differs from the
target is set again too, however often the same command came: no "nothing changed" shortcut.

Times are monotonic seconds passed in by the caller (this module reads no clock).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

__all__ = ["CapBook", "DeviceLimits", "LimitAction", "StaleEpoch", "Target", "TrayCaps",
           "limit_action"]

Source = Literal["racky", "safe", "default"]
LimitAction = Literal["held", "wait", "set"]


class StaleEpoch(ValueError):
    """A command's epoch is older than the newest one a tray has seen."""


class DeviceLimits(NamedTuple):
    """A GPU's power-limit constraints as NVML reports them, W (None: not read)."""

    min_w: float | None
    max_w: float | None
    default_w: float | None


class Target(NamedTuple):
    """The power limit a GPU should be held at, W; ``source``: racky's cap, the safe cap or
    the device default (caps released); ``clamped``: why the wanted value was moved into the
    device's limits (None: not clamped); ``wanted_w``: the value before clamping."""

    watts: float | None
    source: Source
    clamped: str | None
    wanted_w: float | None


@dataclass(slots=True)
class TrayCaps:
    """One tray's command state (racky's settings as last set)."""

    gpus: int
    power_cap_w: float | None = None
    gpu_power_cap_w: float | None = None
    expires_at: float | None = None
    epoch: int | None = None
    held_safe: bool = True
    """held at the safe cap: no command since the start, or the caps expired (a release by
    racky is not silence)"""
    expired_total: int = 0


@dataclass(slots=True)
class CapBook:
    """The cap state of every tray this agent hosts (module docstring).

    Args:
        gpus_per_tray: tray index -> its GPU count.
        safe_gpu_cap_w: the per-GPU limit held while racky is silent (W, > 0).
        epochs: the newest epoch per tray persisted by an earlier run.
    """

    gpus_per_tray: Mapping[int, int]
    safe_gpu_cap_w: float
    epochs: Mapping[int, int] = field(default_factory=dict)
    trays: dict[int, TrayCaps] = field(init=False)
    stale_refused: int = field(default=0, init=False)
    """commands refused by `apply` for a stale epoch since the start (one per command)"""
    version: int = field(default=0, init=False)
    """grows with every change of the book (`apply`, `expire`): targets computed under an
    older version are stale"""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.safe_gpu_cap_w) and self.safe_gpu_cap_w > 0):
            raise ValueError(f"safe_gpu_cap_w {self.safe_gpu_cap_w} must be finite and > 0")
        self.trays = {t: TrayCaps(n, epoch=self.epochs.get(t))
                      for t, n in self.gpus_per_tray.items()}

    def check_epoch(self, trays: Iterable[int], epoch: int) -> None:
        """Raises `StaleEpoch` when ``epoch`` is older than the newest one of any of
        ``trays`` (all must be hosted: KeyError otherwise)."""
        for t in trays:
            seen = self.trays[t].epoch
            if seen is not None and epoch < seen:
                raise StaleEpoch(f"epoch {epoch} older than {seen}, the newest tray {t} has "
                                 "seen")

    def apply(self, trays: Iterable[int], epoch: int, *, power_cap_w: float | None = None,
              gpu_power_cap_w: float | None = None, release: Iterable[str] = (),
              ttl_s: float | None = None, now: float) -> bool:
        """Apply an accepted command (the handler validated it) to ``trays`` at ``now``.
        Returns True when the newest epoch of some tray grew (persist it).

        Raises:
            StaleEpoch: see `check_epoch` (nothing changes; counted in ``stale_refused``).
            ValueError: a cap without ``ttl_s`` (nothing changes).
        """
        ts = list(trays)
        try:
            self.check_epoch(ts, epoch)
        except StaleEpoch:
            self.stale_refused += 1
            raise
        sets_cap = power_cap_w is not None or gpu_power_cap_w is not None
        if sets_cap and ttl_s is None:
            raise ValueError("a cap needs ttl_s")
        rel = set(release)
        grew = False
        self.version += 1
        for t in ts:
            c = self.trays[t]
            if c.epoch is None or epoch > c.epoch:
                grew = True
            c.epoch = epoch
            c.held_safe = False
            if power_cap_w is not None:
                c.power_cap_w = power_cap_w
            if gpu_power_cap_w is not None:
                c.gpu_power_cap_w = gpu_power_cap_w
            if "power_cap_w" in rel:
                c.power_cap_w = None
            if "gpu_power_cap_w" in rel:
                c.gpu_power_cap_w = None
            if c.power_cap_w is None and c.gpu_power_cap_w is None:
                c.expires_at = None
            elif sets_cap:
                assert ttl_s is not None
                c.expires_at = now + ttl_s
        return grew

    def expire(self, now: float) -> list[int]:
        """Drop the caps whose TTL ran out at ``now``; the trays that expired (the caller logs
        each once)."""
        out = []
        for t, c in self.trays.items():
            if c.expires_at is not None and now >= c.expires_at:
                c.power_cap_w = c.gpu_power_cap_w = c.expires_at = None
                c.expired_total += 1
                c.held_safe = True
                out.append(t)
        if out:
            self.version += 1
        return out

    def expires_in_s(self, tray: int, now: float) -> float | None:
        """s until the tray's caps expire (>= 0); None: no cap set."""
        c = self.trays[tray]
        return None if c.expires_at is None else max(0.0, c.expires_at - now)

    def targets(self, tray: int, limits: list[DeviceLimits], non_gpu_power_w: float = 0.0
                ) -> list[Target]:
        """The limit each GPU of ``tray`` should be held at (module docstring), one per entry
        of ``limits`` (the GPUs' device limits); ``non_gpu_power_w``: the tray's power outside
        its GPUs, W (taken off ``power_cap_w`` before it is shared; a negative or non-finite
        figure counts as 0)."""
        other = non_gpu_power_w if math.isfinite(non_gpu_power_w) and non_gpu_power_w > 0 \
            else 0.0
        c = self.trays[tray]
        out = []
        for lim in limits:
            if c.held_safe:
                wanted: float | None = self.safe_gpu_cap_w
                src: Source = "safe"
            elif c.power_cap_w is None and c.gpu_power_cap_w is None:
                wanted, src = lim.default_w, "default"
            else:
                share = math.inf if c.power_cap_w is None \
                    else max(0.0, c.power_cap_w - other) / c.gpus
                gcap = math.inf if c.gpu_power_cap_w is None else c.gpu_power_cap_w
                wanted, src = min(share, gcap), "racky"
            out.append(_clamp(wanted, lim, src))
        return out


    def safe_gpu_w(self, limits: list[DeviceLimits]) -> float:
        """The per-GPU safe cap as it would be enforced on GPUs of these device limits, W:
        ``safe_gpu_cap_w`` clamped into each one's [min, max], the largest of them (what the
        telemetry states as ``agent.safe_gpu_cap_w``; ``safe_gpu_cap_w`` itself when no limit
        is known)."""
        got = [t.watts for t in (_clamp(self.safe_gpu_cap_w, lim, "safe") for lim in limits)
               if t.watts is not None]
        return max(got, default=self.safe_gpu_cap_w)

    def tray_wanted(self, tray: int, non_gpu_power_w: float) -> tuple[float | None, Source]:
        """The tray limit a BMC-capped tray should be held at (module docstring), W, before
        the control's clamp; None: released (the control's maximum)."""
        c = self.trays[tray]
        if c.held_safe:
            return self.safe_gpu_cap_w * c.gpus + non_gpu_power_w, "safe"
        if c.power_cap_w is None and c.gpu_power_cap_w is None:
            return None, "default"
        cap = math.inf if c.power_cap_w is None else c.power_cap_w
        if c.gpu_power_cap_w is not None:
            cap = min(cap, c.gpu_power_cap_w * c.gpus + non_gpu_power_w)
        return cap, "racky"


def limit_action(read_w: float | None, target_w: float, last_set_w: float | None,
                 since_set_s: float, tolerance_w: float, settle_s: float) -> LimitAction:
    """What to do for one GPU (module docstring, **Convergence**): ``"held"`` (the read-back
    ``read_w`` is within ``tolerance_w`` of ``target_w`` and no other limit the agent set
    less than ``settle_s`` ago can still land), ``"wait"`` (``target_w`` itself was set
    ``since_set_s`` < ``settle_s`` ago and is not read back yet) or ``"set"`` (set
    ``target_w`` now). All in W and s; ``last_set_w``: the limit last set (None: never)."""
    recent = last_set_w is not None and since_set_s < settle_s
    other_pending = recent and last_set_w is not None \
        and abs(last_set_w - target_w) > tolerance_w
    if read_w is not None and abs(read_w - target_w) <= tolerance_w and not other_pending:
        return "held"
    if recent and not other_pending:
        return "wait"
    return "set"


def _clamp(wanted: float | None, lim: DeviceLimits, src: Source) -> Target:
    if wanted is None:
        return Target(None, src, "device default limit not known", None)
    if lim.min_w is not None and wanted < lim.min_w:
        return Target(lim.min_w, src, f"{wanted:g} W below the device minimum {lim.min_w:g} W",
                      wanted)
    if lim.max_w is not None and wanted > lim.max_w:
        return Target(lim.max_w, src, f"{wanted:g} W above the device maximum {lim.max_w:g} W",
                      wanted)
    return Target(wanted, src, None, wanted)
