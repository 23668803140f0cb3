"""A row of virtual racks in this process for fleet tests (issue 16): each rack the full
virtual rack simulator (`sims.runtime.VirtualRackSimulator`: 8 power shelves behind Modbus
TCP, 18 simulated node agents on MQTT), with a workload the test turns like a knob
(`KnobWorkload`), and a **plant-side** monitor of the row (`RowMonitor`).

`RowMonitor` is hooked to every plant step of every rack (``step_hooks``, 10 Hz per rack):
after each step it takes that rack's Σ shelf AC input power (the plant's truth,
``ShelfState.shelf_input_w``: what the row's breaker sees, not what any daemon reads) and adds
the other racks' latest, so the row's sum is known at every step of any rack. It keeps each
rack's series (mono s, W) and the row's (mono s, W), the largest row sum, and every step
above ``limit_w``. No daemon's figure enters it.

`racky_fleet_config` writes a racky config for one rack in fleet mode: shelves found by
discovery on the rack's shelf port, agents through the broker, ``[fleet]`` on the given NATS
URLs (e.g. `harness.nats_cut.NatsCut.urls`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.daemons import until, write_config
from rackplane.settings import Identity, MqttSettings
from sims.row import VirtualRack
from sims.runtime import VirtualRackSimulator
from sims.scenario import FabricSpec, load_scenario
from sims.workloads import Workload

__all__ = ["KnobWorkload", "PlantRow", "RowMonitor", "plant_row", "racky_fleet_config"]


class KnobWorkload(Workload):
    """Every GPU at ``fraction`` of TDP (settable at any time: the next step draws it), no
    link traffic."""

    def __init__(self, gpus: int, fraction: float) -> None:
        super().__init__(gpus)
        self.fraction = fraction

    def _advance(self, t_s: float) -> None:
        self._frac.fill(self.fraction)

    def power_fraction(self, t_s: float) -> np.ndarray:
        self._advance(t_s)
        return self._frac.copy()

    def describe(self) -> str:
        return f"knob: {self.fraction:g} of TDP"


@dataclass
class RowMonitor:
    """The row's Σ shelf AC input at every plant step (module docstring). W, monotonic s."""

    racks: list[str]
    limit_w: float
    latest_w: dict[str, float] = field(default_factory=dict)
    series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    row: list[tuple[float, float]] = field(default_factory=list)
    over: list[tuple[float, float, dict[str, float]]] = field(default_factory=list)
    max_w: float = 0.0

    def hook(self, rack: str) -> Any:
        """The step hook of ``rack``'s simulator."""

        def on_step(vr: VirtualRack, now: float) -> None:
            w = float(vr.shelves.state.shelf_input_w.sum())
            self.latest_w[rack] = w
            self.series.setdefault(rack, []).append((now, w))
            if len(self.latest_w) < len(self.racks):
                return
            total = sum(self.latest_w.values())
            # a rack's simulator catching up runs past steps (their own, earlier times):
            # the row's series stays in time order, stamped no earlier than its last entry
            t = max(now, self.row[-1][0]) if self.row else now
            self.row.append((t, total))
            self.max_w = max(self.max_w, total)
            if total > self.limit_w:
                self.over.append((t, total, dict(self.latest_w)))

        return on_step

    def rack_w(self, rack: str) -> float:
        """``rack``'s latest Σ shelf input, W (NaN before its first step)."""
        return self.latest_w.get(rack, math.nan)

    def first_at_most(self, rack: str, value_w: float, since: float) -> float | None:
        """The first step of ``rack`` at or after ``since`` (mono s) from which on its input
        stayed <= ``value_w`` (to its latest step); None when its latest is above."""
        at = None
        for t, w in self.series.get(rack, []):
            if t < since:
                continue
            at = (t if at is None else at) if w <= value_w else None
        return at


@dataclass
class PlantRow:
    """The racks' simulators (by rack id), their workloads and the monitor."""

    site: str
    sims: dict[str, VirtualRackSimulator]
    loads: dict[str, KnobWorkload]
    monitor: RowMonitor
    mqtt: MqttSettings

    def shelf_port(self, rack: str) -> int:
        face = self.sims[rack].shelf_face
        assert face is not None and face.port
        return int(face.port)

    def set_load(self, rack: str, fraction: float) -> None:
        """``rack``'s GPUs demand ``fraction`` of TDP from the next step on."""
        self.loads[rack].fraction = fraction


@contextlib.asynccontextmanager
async def plant_row(mqtt_port: int, fractions: dict[str, float], limit_w: float, *,
                    telemetry_interval_s: float = 0.5, site: str | None = None
                    ) -> AsyncIterator[PlantRow]:
    """One simulator per rack of ``fractions`` (rack id → initial load, fraction of TDP),
    link fabric off, shelves on free ports, telemetry through the broker on ``mqtt_port``;
    entered once every shelf face listens; stopped (30 s, then cancelled) at exit."""
    site = site or f"s{uuid.uuid4().hex[:8]}"
    mq = MqttSettings(port=mqtt_port, clean_session=True, reconnect_min_s=0.1,
                      reconnect_max_s=1.0)
    sc = load_scenario("load-step-short").model_copy(
        update={"duration_s": 3600.0, "fabric": FabricSpec(enabled="off")})
    monitor = RowMonitor(list(fractions), limit_w)
    sims: dict[str, VirtualRackSimulator] = {}
    loads: dict[str, KnobWorkload] = {}
    for rack, frac in fractions.items():
        sim = VirtualRackSimulator(sc, modbus_port=0, shelf_modbus_port=0,
                                   identity=Identity(site=site, rack=rack), mqtt=mq,
                                   telemetry_interval_s=telemetry_interval_s, link_ports=False)
        assert sim.rack is not None
        loads[rack] = KnobWorkload(sim.rack.compute.n_gpus, frac)
        sim.rack.workload = loads[rack]
        sim.step_hooks.append(monitor.hook(rack))
        sims[rack] = sim
    stop = asyncio.Event()
    tasks = [asyncio.create_task(s.run(stop), name=f"sim-{r}") for r, s in sims.items()]
    try:
        await until(lambda: all(s.shelf_face is not None and s.shelf_face.port
                                for s in sims.values()), 10.0, "the shelf faces")
        yield PlantRow(site, sims, loads, monitor, mq)
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30.0)
        for t in tasks:
            t.cancel()


def racky_fleet_config(tmp: Path, row: PlantRow, rack: str, *, nats_urls: list[str],
                       bucket: str, floor_w: float, clock_margin_s: float,
                       every_s: float = 0.5) -> Path:
    """racky's config for ``rack`` of ``row`` in fleet mode (module docstring); files under
    ``tmp``. Leases and reports every ``every_s``."""
    path = write_config(
        tmp / f"racky-{rack}.toml",
        identity={"site": row.site, "rack": rack},
        mqtt={"port": row.mqtt.port, "reconnect_min_s": 0.1, "reconnect_max_s": 1.0,
              "keepalive_s": 5},
        discovery={"enabled": True, "port": row.shelf_port(rack), "unit_id_first": 1,
                   "unit_id_last": 8, "timeout_s": 0.3},
        lifecycle={"state_file": str(tmp / f"racky-state-{rack}.json")},
        validation={"report_dir": str(tmp / f"reports-{rack}")},
        spool={"directory": str(tmp / f"spool-{rack}")},
        fleet={"enabled": True, "servers": nats_urls, "bucket": bucket, "floor_w": floor_w,
               "clock_margin_s": clock_margin_s, "read_every_s": every_s,
               "report_every_s": every_s, "request_timeout_s": 0.5},
        log={"format": "json"},
    )
    return path
