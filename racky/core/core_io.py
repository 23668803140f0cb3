"""What racky's core reads and decides each tick (`racky.core.controller.RackyCore.step`):
its inputs (`RackyInputs`) and its output (`CoreOutput`), plain data with no behaviour, kept
apart from the core's logic so the daemon, the lock-step harness and the tests share them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from rackplane.core.alarms import AlarmEvent
from rackplane.core.samples import Sample
from racky.core.agent_settings import AgentCommand
from racky.core.linkframe import LinkFrame
from racky.core.links import LinkHealth, LinkStep
from racky.core.power import LimitState, ShelfView
from racky.core.telemetry import TrayReading
from racky.core.thermal import CoolingReading, ThermalStep
from racky.core.validation import ValidationResult

__all__ = ["CoreOutput", "FloatArray", "RackyInputs"]

FloatArray = npt.NDArray[np.float64]


@dataclass
class RackyInputs:
    """What one tick reads: shelf samples (device -> point -> sample), tray readings, the link
    frame, the cooling loop."""

    shelves: Mapping[str, Mapping[str, Sample]] = field(default_factory=dict)
    trays: Mapping[int, TrayReading] = field(default_factory=dict)
    frame: LinkFrame | None = None
    cooling: CoolingReading | None = None
    awaiting: frozenset[int] = frozenset()
    """Trays with an agent command still unanswered (within ``node_agents.reply_timeout_s``):
    the tick sends them nothing new until it is answered or expires (`RackyCore.step`)."""


@dataclass
class CoreOutput:
    """What one tick decided."""

    t_mono: float
    commands: list[AgentCommand]
    alarm_events: list[AlarmEvent]
    shelves: ShelfView
    rack_power_w: float | None
    it_power_w: float | None
    limit: LimitState
    caps_w: FloatArray
    thermal: ThermalStep
    links: LinkStep | None
    validation_result: ValidationResult | None = None
    derate_w: float | None = None
    """The facility-water derate cap in force after the tick, W (None: not derating)."""
    cooling_capacity_w: float | None = None
    """The rack power the cooling carries now by valvey's measurement, W (DC; the derate's
    P_max: `Derate.measured_capacity_w`); None: no fresh facility water or no measurement."""
    trays_off: int = 0
    """Trays racky wants off (safety power-downs, power cycles, sequencing)."""
    readings: Mapping[int, TrayReading] = field(default_factory=dict)
    """The tray readings the tick used (tray -> reading)."""
    link_health: LinkHealth | None = None
    """The link pipeline (its per-port figures for telemetry), once a frame arrived."""
    persist_version: int = 0
    """Changes whenever the persisted state changed (the caller saves it)."""
