"""The virtual rack speaking through the real tray agent: a simulated GPU source, BMC and link
source for `trayagent.app.TrayAgent`, reading the trays of a `sims.row.VirtualRack` in this
process.

`SimTrayFace` is the hardware side: a step hook of the simulator (`VirtualRackSimulator.
step_hooks`, run in the event loop after each 0.1 s plant step) that takes an immutable
snapshot of what a tray's GPUs and BMC would report, and applies the power limits the agent
set once their delay has passed (a GPU applies a new limit after a while; the agent sees it
only in a later read-back, as on hardware). The agent's sources read the snapshot from
their worker threads: only the snapshot reference and the pending-limit list cross threads,
under one lock; the rack itself is touched only in the loop.

- `SimGpuSource` (`trayagent.sources.GpuSource`): per GPU power (the driver's 1 s average
  kind), the energy counter (integrated from the power, mJ, 64-bit), junction temperature,
  T.Limit margin, clock-event reasons (``sw_power_cap`` while the limit holds the GPU below
  its demand; ``hw_slowdown`` + ``hw_thermal_slowdown`` while thermally throttled),
  utilisation, the enforced limit read back and the device's limits (min: the rack's
  ``gpu_min_power_limit_w``, max and default: TGP). A limit outside them is refused as
  NVML refuses it (the agent clamps first).
- `SimBmc` (`trayagent.sources.BmcReader`): tray input power, coolant outlet temperature and
  the tray's leak sensor (wet / faulted).
- `harness.simlinks.SimLinks` (`trayagent.sources.LinkReader`): every GPU's link ports (18
  NVLink + 2 NIC on the NVL72 fabric) from the `harness.simlinks.LinkSnapshot` the face
  takes with each fabric step (kept in the snapshot between steps): link state, speed and
  the fabric's counters at their widths. The agent's config names each GPU's ports
  (``agents.trays[].gpu_ports``, `agent_config`), so it publishes them as each GPU's port
  block under the fabric's names (``gpu07/nic1``), NVLink ports flagged ``nvlink``, with
  rates from the counters; racky's link rules read them as from any agent.

`run_rack_agent` runs the simulator (``node_agents="external"``) and the agent in one
process; ``python -m harness.simagent`` does it from the command line (the options of
``rack-sim run`` that the demo uses: scenario name or file, Modbus ports, identity, broker,
ground truth, log format) and writes its CPU accounting as JSON at exit when ``--figures``
is given (`harness.vrack_agent_run` reads it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.simlinks import LinkSnapshot, SimLinks, gpu_port_names, link_snapshot
from rackplane.clock import SYSTEM_CLOCK, Clock
from rackplane.log import configure_logging
from rackplane.settings import Identity, MqttSettings
from sims.row import VirtualRack
from sims.runtime import VirtualRackSimulator
from sims.scenario import Scenario, load_scenario
from trayagent.app import TrayAgent
from trayagent.config import TrayAgentConfig
from trayagent.core.bmc import BmcReading, LeakState
from trayagent.core.caps import DeviceLimits
from trayagent.core.payload import GpuReading
from trayagent.sources import SourceError

__all__ = ["LIMIT_DELAY_S", "SimBmc", "SimGpuSource", "SimTrayFace", "agent_config",
           "phase_delay_s", "run_rack_agent"]

LIMIT_DELAY_S = 0.3
"""How long a simulated GPU takes to apply a new power limit, s (the stand-in NVML's figure
in the tests; a real GPU's power controller settles within about a second)."""

_THERMAL = ("hw_slowdown", "hw_thermal_slowdown")


@dataclass(frozen=True, slots=True)
class TraySnapshot:
    """What the trays' agents can read at ``mono`` (lists over the rack's GPUs / trays)."""

    mono: float
    power_w: list[float]
    energy_mj: list[int]
    temp_c: list[float]
    t_limit_c: list[float]
    throttled: list[bool]
    held_by_limit: list[bool]
    on: list[bool]
    utilization: list[float]
    limit_w: list[float]
    tray_power_w: list[float]
    coolant_out_c: list[float]
    tray_leak: list[bool]
    tray_sensor_fault: list[bool]
    links: LinkSnapshot | None = None
    """The fabric at its last step (the same object until it steps again); None: no fabric."""


class SimTrayFace:
    """The virtual rack's trays as hardware a tray agent reads (module docstring).

    Args:
        rack: the virtual rack (stepped by the simulator's loop).
        limit_delay_s: how long a set limit takes to apply, s (>= 0).
        clock: the simulator's clock (its monotonic stamps the step hook's ``now``).
    """

    def __init__(self, rack: VirtualRack, *, limit_delay_s: float = LIMIT_DELAY_S,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        if not (math.isfinite(limit_delay_s) and limit_delay_s >= 0.0):
            raise ValueError(f"limit_delay_s {limit_delay_s!r} must be finite and >= 0")
        self.rack = rack
        self.limit_delay_s = limit_delay_s
        self.clock = clock
        comp = rack.compute
        self.n_gpus = comp.n_trays * comp.gpus_per_tray
        self.gpus_per_tray = comp.gpus_per_tray
        tgp = float(rack.agents.tgp_w)
        self.limits = DeviceLimits(float(rack.agents.gpu_min_power_limit_w), tgp, tgp)
        self._lock = threading.Lock()
        self._pending: list[tuple[float, int, float]] = []  # (due mono, gpu, W)
        self._energy_j = np.zeros(self.n_gpus)
        self._last_mono: float | None = None
        self._snap: TraySnapshot | None = None
        self._links: LinkSnapshot | None = None
        self.limits_applied = 0

    def request_limit(self, gpu: int, watts: float) -> None:
        """Ask GPU ``gpu`` for a power limit of ``watts`` (any thread): applied
        ``limit_delay_s`` later by the step hook, never before a limit asked for earlier
        (the device applies the later request last, as hardware does)."""
        due = self.clock.monotonic() + self.limit_delay_s
        with self._lock:
            due = max([due, *(p[0] for p in self._pending if p[1] == gpu)])
            self._pending.append((due, gpu, watts))

    def snapshot(self) -> TraySnapshot | None:
        """The newest snapshot (None before the first step)."""
        with self._lock:
            return self._snap

    def link_snapshot(self) -> LinkSnapshot | None:
        """The fabric's newest `LinkSnapshot` (None: no fabric, or before the first step)."""
        s = self.snapshot()
        return None if s is None else s.links

    def on_step(self, vr: VirtualRack, now: float) -> None:
        """The simulator's step hook (event loop): apply the limits that are due, integrate
        the energy counters, take a new snapshot (the fabric's part only when it has
        stepped)."""
        with self._lock:
            due = [p for p in self._pending if p[0] <= now]
            if due:
                self._pending = [p for p in self._pending if p[0] > now]
        for _, gpu, watts in due:
            vr.agents.set_gpu_power_limit(gpu, watts)
            self.limits_applied += 1
        tr = vr.truth()
        if self._last_mono is not None:
            self._energy_j += tr.gpu_power_w * max(0.0, now - self._last_mono)
        self._last_mono = now
        limit = vr.agents.gpu_power_limit_w
        on = tr.gpu_on.astype(bool)
        fab = vr.fabric
        if fab is not None and (self._links is None or fab.time_s != self._links.t_s):
            self._links = link_snapshot(fab, now)
        snap = TraySnapshot(
            mono=now,
            power_w=tr.gpu_power_w.astype(np.float64).tolist(),
            energy_mj=[int(x) for x in (self._energy_j * 1000.0).tolist()],
            temp_c=tr.gpu_tj_c.astype(np.float64).tolist(),
            t_limit_c=tr.gpu_t_limit_c.astype(np.float64).tolist(),
            throttled=tr.gpu_throttled.astype(bool).tolist(),
            held_by_limit=(on & (tr.gpu_demand_w > limit + 1e-9)).tolist(),
            on=on.tolist(),
            utilization=np.clip(tr.gpu_traffic, 0.0, 1.0).astype(np.float64).tolist(),
            limit_w=limit.astype(np.float64).tolist(),
            tray_power_w=tr.tray_power_w.astype(np.float64).tolist(),
            coolant_out_c=tr.tray_coolant_out_c.astype(np.float64).tolist(),
            tray_leak=tr.leaks.tray_leak.astype(bool).tolist(),
            tray_sensor_fault=tr.leaks.tray_sensor_fault.astype(bool).tolist(),
            links=self._links,
        )
        with self._lock:
            self._snap = snap

    def sources(self) -> tuple[SimGpuSource, dict[int, SimBmc]]:
        """The agent's GPU source and one BMC reader per tray."""
        return SimGpuSource(self), {k: SimBmc(self, k)
                                    for k in range(self.rack.compute.n_trays)}

    def links(self) -> SimLinks | None:
        """The agent's link source over the rack's fabric (None: the rack has none)."""
        fab = self.rack.fabric
        return None if fab is None else SimLinks(self, fab.port_names())

    def gpu_ports(self) -> list[list[str]] | None:
        """Every rack GPU's port names (the fabric's), None without a fabric."""
        fab = self.rack.fabric
        return None if fab is None else gpu_port_names(fab.port_names(), self.n_gpus)


class SimGpuSource:
    """`trayagent.sources.GpuSource` over a `SimTrayFace`: NVML device ``index`` is rack GPU
    ``index`` (module docstring). Blocking calls, from the agent's worker thread."""

    cap_enforceable = True

    def __init__(self, face: SimTrayFace) -> None:
        self.face = face

    def open(self) -> int:
        """The number of GPUs. Raises `SourceError` before the simulator's first step."""
        if self.face.snapshot() is None:
            raise SourceError("the virtual rack has not stepped yet")
        return self.face.n_gpus

    def refresh(self) -> None:
        """Nothing to fetch ahead: every `read` reads the newest snapshot (as NVML reads the
        device)."""

    def read(self, index: int, gpu: int) -> GpuReading:
        """GPU ``index`` as rack-wide GPU ``gpu`` in the newest snapshot; never raises (a GPU
        not in the rack, or no snapshot yet: every figure None with the reason)."""
        s = self.face.snapshot()
        r = GpuReading(gpu=gpu)
        if s is None or not 0 <= index < len(s.power_w):
            why = "no snapshot yet" if s is None else f"no GPU {index} in the virtual rack"
            r.errors.update(power_w=why, limit_w=why, device=why)
            return r
        r.power_w = s.power_w[index]
        r.power_kind = "average"
        r.energy_mj = s.energy_mj[index] % 2**64
        r.temp_c = s.temp_c[index]
        r.t_limit_c = s.t_limit_c[index]
        reasons = list(_THERMAL) if s.throttled[index] else []
        if s.held_by_limit[index]:
            reasons.insert(0, "sw_power_cap")
        r.reasons = reasons
        r.utilization = s.utilization[index]
        r.limit_w = s.limit_w[index]
        r.limits = self.face.limits
        r.lost = not s.on[index]
        return r

    def set_limit(self, index: int, watts: float) -> None:
        """Ask GPU ``index`` for ``watts`` (applied after the face's delay). Raises
        `SourceError` for no such GPU or a limit outside the device's [min, max] (NVML's
        invalid argument)."""
        lim = self.face.limits
        assert lim.min_w is not None and lim.max_w is not None
        if not 0 <= index < self.face.n_gpus:
            raise SourceError(f"no GPU {index} in the virtual rack")
        if not (math.isfinite(watts) and lim.min_w <= watts <= lim.max_w):
            raise SourceError(f"Invalid Argument: {watts!r} W outside [{lim.min_w:g}, "
                              f"{lim.max_w:g}] W")
        self.face.request_limit(index, watts)

    def close(self) -> None:
        """Nothing to release."""


class SimBmc:
    """`trayagent.sources.BmcReader` of tray ``tray`` over a `SimTrayFace`: input power,
    coolant outlet temperature, the tray's leak sensor."""

    def __init__(self, face: SimTrayFace, tray: int) -> None:
        self.face = face
        self.tray = tray

    def read(self, mono: float) -> BmcReading:
        """The tray's BMC figures now (all None with the reason before the first step)."""
        s = self.face.snapshot()
        if s is None:
            why = "no snapshot yet"
            return BmcReading(errors={"power_w": why, "coolant_out_temp_c": why, "leak": why},
                              mono=mono)
        k = self.tray
        fault = s.tray_sensor_fault[k]
        leak = LeakState(s.tray_leak[k] and not fault, fault,
                         {"tray": "fault" if fault else "wet" if s.tray_leak[k] else "dry"})
        return BmcReading(power_w=s.tray_power_w[k], coolant_out_temp_c=s.coolant_out_c[k],
                          leak=leak, mono=mono)

    def close(self) -> None:
        """Nothing to release."""


def agent_config(ident: Identity, mqtt: MqttSettings, n_trays: int, gpus_per_tray: int, *,
                 daemon: str = "trays", epoch_file: Path, tick_s: float = 1.0,
                 safe_gpu_cap_w: float = 700.0,
                 gpu_ports: list[list[str]] | None = None,
                 spool_dir: Path | None = None) -> TrayAgentConfig:
    """The tray agent's config for a virtual rack: every tray hosted, NVML device = rack GPU,
    the agents' topic level ``daemon`` (racky's ``node_agents.daemon``; not ``sim``, the
    simulator's own command level, which still answers ``get_power_limits``).
    ``gpu_ports``: per rack GPU its link ports (`SimTrayFace.gpu_ports`; the link reader is
    `SimLinks`, passed to the agent in place of sysfs); None: no ports published.
    ``spool_dir``: the agent's telemetry spool (None: the default, ``spool/tray-agent-...``
    under the working folder).

    Raises:
        pydantic.ValidationError: a bad figure, or ``gpu_ports`` not one list per GPU with
            the same number of ports each.
    """
    def ports(k: int) -> dict[str, Any]:
        if gpu_ports is None:
            return {}
        return {"gpu_ports": gpu_ports[k * gpus_per_tray:(k + 1) * gpus_per_tray]}

    return TrayAgentConfig.model_validate({
        "identity": ident.model_dump(), "mqtt": mqtt.model_dump(),
        "control": {"tick_s": tick_s},
        "agents": {"daemon": daemon, "gpus_per_tray": gpus_per_tray, "trays": [
            {"tray": k, "nvml_devices": list(range(k * gpus_per_tray, (k + 1) * gpus_per_tray)),
             "coolant_out_temp_c": 45.0, **ports(k)} for k in range(n_trays)]},
        "sysfs": {"enabled": gpu_ports is not None},
        "caps": {"safe_gpu_cap_w": safe_gpu_cap_w, "epoch_file": str(epoch_file)},
        "commands": {"default_role": "automation"},
        **({} if spool_dir is None else {"spool": {"directory": str(spool_dir)}}),
    })


@dataclass
class RackAgent:
    """The simulator and the agent of one process (`run_rack_agent`)."""

    sim: VirtualRackSimulator
    face: SimTrayFace
    agent: TrayAgent


def build_rack_agent(scenario: str | Scenario, ident: Identity, mqtt: MqttSettings, *,
                     epoch_file: Path, duration_s: float | None = None,
                     modbus_port: int = 0, shelf_modbus_port: int = 0,
                     ground_truth_path: Path | None = None, spool_dir: Path | None = None,
                     limit_delay_s: float = LIMIT_DELAY_S, daemon: str = "trays",
                     safe_gpu_cap_w: float = 700.0) -> RackAgent:
    """The virtual rack (``scenario``: a bundled name, a TOML path or a loaded scenario;
    stretched to ``duration_s`` when given, else its own length) with its own node agents
    off, on its Modbus ports (0: a free one), and one tray agent hosting its trays and
    their link ports through a `SimTrayFace` (its spool in ``spool_dir``, `agent_config`).

    Raises:
        ConfigError: the scenario does not load. ValueError / RuntimeError: the simulator
            cannot be built (as ``rack-sim run``).
    """
    sc = load_scenario(scenario) if isinstance(scenario, str) else scenario
    if duration_s is not None:
        sc = sc.model_copy(update={"duration_s": duration_s})
    sim = VirtualRackSimulator(sc, modbus_port=modbus_port, shelf_modbus_port=shelf_modbus_port,
                               identity=ident, mqtt=mqtt, node_agents="external",
                               ground_truth_path=ground_truth_path)
    assert sim.rack is not None
    face = SimTrayFace(sim.rack, limit_delay_s=limit_delay_s)
    sim.step_hooks.append(face.on_step)
    comp = sim.rack.compute
    cfg = agent_config(ident, mqtt, comp.n_trays, comp.gpus_per_tray, daemon=daemon,
                       epoch_file=epoch_file, safe_gpu_cap_w=safe_gpu_cap_w,
                       gpu_ports=face.gpu_ports(), spool_dir=spool_dir)
    gpus, bmcs = face.sources()
    agent = TrayAgent(cfg, source=gpus, bmcs=bmcs, bmc_max_age_s=5.0, links=face.links())
    return RackAgent(sim, face, agent)


def phase_delay_s(phase: float, period_s: float, now_mono: float) -> float:
    """How long to wait from ``now_mono`` (s, the host's monotonic clock, shared by its
    processes) until the next instant at ``phase`` (a fraction in [0, 1)) of a ``period_s``
    cycle, s in [0, period_s).

    Raises:
        ValueError: ``phase`` outside [0, 1) or ``period_s`` not > 0.
    """
    if not (math.isfinite(phase) and 0.0 <= phase < 1.0):
        raise ValueError(f"phase {phase!r} must be in [0, 1)")
    if not (math.isfinite(period_s) and period_s > 0.0):
        raise ValueError(f"period_s {period_s!r} must be > 0")
    return (phase * period_s - now_mono) % period_s


async def run_rack_agent(ra: RackAgent, stop: asyncio.Event, *,
                         phase: float | None = None) -> None:
    """Run the simulator and the agent until ``stop``. ``phase``: start the agent at this
    fraction of its ``control.tick_s`` on the host's monotonic clock (`phase_delay_s`), so
    that several racks' agents on one host read and publish at spread instants, as
    separate tray hosts do, rather than wherever their processes happened to start; None:
    at once."""
    async with asyncio.TaskGroup() as tg:
        tg.create_task(ra.sim.run(stop))
        if phase is not None:
            await asyncio.sleep(phase_delay_s(phase, ra.agent.cfg.control.tick_s,
                                              time.monotonic()))
        tg.create_task(ra.agent.run(stop))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness.simagent", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", default="load-step-short", help="bundled name or a TOML path")
    p.add_argument("--duration-s", type=float, default=None,
                   help="stretch the scenario to this length, s (default: its own)")
    p.add_argument("--modbus-port", type=int, default=0, help="the CDU's Modbus TCP port "
                   "(0: a free one)")
    p.add_argument("--shelf-modbus-port", "--shelf-port", dest="shelf_port", type=int,
                   default=0, help="the power shelves' Modbus TCP port (0: a free one)")
    p.add_argument("--site", default="lab")
    p.add_argument("--row", default="row1")
    p.add_argument("--rack", required=True)
    p.add_argument("--mqtt-host", default="127.0.0.1")
    p.add_argument("--mqtt-port", type=int, required=True)
    p.add_argument("--mqtt-protocol", default="5", choices=("3.1.1", "5"))
    p.add_argument("--ground-truth", type=Path, default=None,
                   help="write the injected faults (JSON) here")
    p.add_argument("--epoch-file", type=Path, required=True,
                   help="the agent's cap-epoch state file")
    p.add_argument("--spool-dir", type=Path, default=None,
                   help="the agent's telemetry spool (default: spool/tray-agent-<site>-<row>-"
                   "<rack> under the working folder)")
    p.add_argument("--figures", type=Path, default=None,
                   help="JSON written at exit: CPU accounting and counts")
    p.add_argument("--log-level", default="info",
                   choices=("debug", "info", "warning", "error"))
    p.add_argument("--log-format", default="auto", choices=("auto", "json", "console"))
    return p


def _main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    configure_logging(a.log_level, a.log_format)
    ident = Identity(site=a.site, row=a.row, rack=a.rack)
    mq = MqttSettings(host=a.mqtt_host, port=a.mqtt_port, protocol=a.mqtt_protocol,
                      clean_session=True, reconnect_min_s=0.1, reconnect_max_s=1.0)
    ra = build_rack_agent(a.scenario, ident, mq, epoch_file=a.epoch_file,
                          duration_s=a.duration_s, modbus_port=a.modbus_port,
                          shelf_modbus_port=a.shelf_port, ground_truth_path=a.ground_truth,
                          spool_dir=a.spool_dir)

    async def go() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        t0, c0 = time.monotonic(), time.process_time()
        await run_rack_agent(ra, stop)
        wall, cpu = time.monotonic() - t0, time.process_time() - c0
        figures: dict[str, Any] = {
            "wall_s": wall, "process_cpu_s": cpu, "sim_tick_cpu_s": ra.sim.tick_cpu_s,
            "agent_read_cpu_s": ra.agent.read_cpu_s, "trays": len(ra.agent.gpus),
            "published": ra.agent.published_total, "limits_applied": ra.face.limits_applied,
            "pid": os.getpid()}
        if a.figures is not None:
            a.figures.write_text(json.dumps(figures, indent=2))

    asyncio.run(go())
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
