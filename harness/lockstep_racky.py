"""Lock-step runs of racky's tick with the whole virtual rack: no sockets, plant time as the clock.

This is where racky and the simulators meet (DESIGN §2: the daemons never import ``sims``).
Each 1 Hz tick runs the daemon's own `racky.tick.RackyTick` (the daemon's inputs, core step
and effects): the power shelves' readings are served into register words as the shelf face
serves them and decoded by the register-map decoder racky's Modbus adapter uses; the node
agents' ``telemetry/trayNN`` JSON payloads go through racky's message handling and ingest;
the cooling input is valvey's ``state/supply_loop`` payload and the simulator's
``telemetry/plant`` message; the tick's ``set_power_limits`` publishes go through the command
envelope to the simulator's node-agent handler and its replies come back as messages
(`_RackyIO`). The plant advances to the next tick in ``plant_dt_s`` steps (0.1 s: the §4
plant's step; 1 s is allowed for long link-only runs).

Usage::

    r = run_racky("flapping-link")                          # ScenarioRun(model="rack"), fabric on
    r.first_alarm("link_flapping", "gpu07/nic1")            # plant s of the raise
    r = run_racky("training-swings", cfg, fine_trace=True)  # 0.1 s rack power (S2 figures)
    res = run_validation("rack", out_dir=Path("report"))    # burn-in, judged, report written

``rackctl lockstep --daemon racky run SCENARIO | validate --stage rack --out DIR``
(docs/RACKY.md).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import ValidationError

from harness.figures import Figure, Progress, no_progress
from rackplane.commands import CommandEnvelope
from rackplane.core.registers import (
    BlockDecoder,
    ReadBlock,
    ReadMemory,
    RegisterMap,
    learn_from_exception,
    load_register_map,
    plan_reads,
)
from rackplane.core.samples import Sample
from rackplane.core.tray_contract import encode_tray
from rackplane.errors import CommandError
from rackplane.io.mqtt import Topics, encode_json
from rackplane.settings import ModbusTargetSettings
from racky.config import RackyConfig
from racky.core.controller import RackyCore
from racky.core.lifecycle import Lifecycle, PersistedState
from racky.core.validation import ValidationResult, combine
from racky.report import write_report
from racky.tick import AgentPublish, RackyTick
from sims.modbus_face import ModbusFace
from sims.runtime import apply_set_power_limits, plant_payload, serve_values
from sims.scenario import (
    FABRIC_KINDS,
    FabricSpec,
    FaultRecord,
    LoadSpec,
    PlantSpec,
    Scenario,
    ScenarioRun,
    load_scenario,
)
from sims.telemetry import SetPowerLimitsArgs, tray_payloads

__all__ = ["AlarmRecord", "RackyLockstepResult", "racky_scenario_figures", "run_racky",
           "run_validation"]

WALL0_NS = 1_767_225_600 * 10**9  # 2026-01-01T00:00:00Z: wall clock of plant time 0


@dataclass(frozen=True, slots=True)
class AlarmRecord:
    """One alarm event of a run (plant s)."""

    t_s: float
    id: str
    kind: str
    severity: str
    message: str


@dataclass
class RackyLockstepResult:
    """A finished run: the 1 Hz trace, alarm events, commands, ground truth, the core."""

    scenario: Scenario
    trace: dict[str, list[Any]]
    alarms: list[AlarmRecord]
    commands: list[tuple[float, tuple[int, ...], dict[str, Any], str]]
    ground_truth: list[FaultRecord]
    core: RackyCore
    fine: dict[str, list[float]] = field(default_factory=dict)
    refused: list[tuple[float, tuple[int, ...], str]] = field(default_factory=list)

    def raised(self, kind: str | None = None) -> list[AlarmRecord]:
        """Raise events (of ``kind``, an id prefix, when given)."""
        return [a for a in self.alarms if a.kind == "raised"
                and (kind is None or a.id == kind or a.id.startswith(kind + "."))]

    def first_alarm(self, kind: str, thing: str = "", after_s: float = -math.inf
                    ) -> float | None:
        """Plant time of the first raise of alarm ``kind`` on ``thing`` after ``after_s``."""
        from racky.core.alarmbank import alarm_id

        aid = alarm_id(kind, thing)
        for a in self.alarms:
            if a.kind == "raised" and a.id == aid and a.t_s >= after_s:
                return a.t_s
        return None


# --- racky's inputs from the simulator, its effects back ------------------------------------------


class _ShelfFace:
    """One power shelf as racky's Modbus adapter sees it: the simulator's readings put into a
    register image exactly as the shelf face serves them (`sims.runtime.serve_values` into a
    `sims.modbus_face.ModbusFace`, not started), read back in the daemon's read plan
    (`rackplane.core.registers.plan_reads` with the target's request size and gap; an
    unimplemented address is learned from as the adapter learns from exception 2) and decoded
    by `rackplane.core.registers.BlockDecoder`, the adapter's decoder."""

    def __init__(self, target: ModbusTargetSettings, regmap: RegisterMap) -> None:
        self.target = target
        self.regmap = regmap
        self.face = ModbusFace(self.regmap, unit_ids=(target.unit_id,))
        self.order = {p.name: i for i, p in enumerate(self.regmap.points)}
        memory = ReadMemory()
        while True:  # the adapter's first polls: exception 2 on a gap -> re-plan
            blocks = plan_reads(self.regmap.points, target.max_registers_per_read,
                                target.max_gap_registers, memory)
            bad = next((b for b in blocks if not self._implemented(b)), None)
            if bad is None:
                break
            memory = learn_from_exception(bad, 2, memory, target.max_registers_per_read).memory
        self.decoders = [BlockDecoder(b) for b in blocks]
        self._served: dict[str, float] = {}
        self._sentinels: frozenset[str] = frozenset()

    def _implemented(self, b: ReadBlock) -> bool:
        try:
            self.face.registers(b.table, b.start, b.count, unit=self.target.unit_id)
        except KeyError:
            return False
        return True

    def poll(self, values: Mapping[str, float], sentinels: frozenset[str] | set[str],
             wall_ns: int, now: float) -> list[Sample]:
        """Serve ``values`` and read every point back (map order)."""
        unit = self.target.unit_id
        sent = frozenset(sentinels)
        if sent != self._sentinels:  # the scenario changed its sentinel points: all again
            self._sentinels, self._served = sent, {}
        served = self._served
        changed = {k: v for k, v in values.items()
                   if k not in served or not _same(served[k], v)}
        if changed:  # an unchanged value has the same registers already
            serve_values(self.face, self.regmap, changed, sent, unit)
            served.update(changed)
        out: list[Sample] = []
        for d in self.decoders:
            b = d.block
            out += d.decode_words(self.face.registers(b.table, b.start, b.count, unit=unit),
                                  wall_ns, now).samples
        out.sort(key=lambda x: self.order[x.point])
        return out


class _RackyIO:
    """What racky's adapters hand its tick, made from the virtual rack each tick, and the tick's
    effects applied back (the daemon's code in between is `racky.tick.RackyTick`'s):

    * power shelves: `_ShelfFace` (register words and the adapter's decoder);
    * node agents: `sims.telemetry.tray_payloads` encoded as an agent sends them
      (`rackplane.core.tray_contract.encode_tray`, msgspec: bytes that decode to the same
      values as ``encode_json``'s; ``encode_json`` itself when a float is not finite), given to
      the tick as ``<agents>/telemetry/trayNN`` messages (racky's decoder and ingest parse
      them);
    * cooling: valvey's ``state/<state_thing>`` (the CDU's supply temperature and valve as
      valvey reads them, the scenario's setpoint) and the simulator's ``telemetry/plant``
      (`sims.runtime.plant_payload`: flow, facility water) on ``cooling.plant_topic``;
    * agent commands: each ``set_power_limits`` publish goes through the command envelope
      and args models to the simulator's handler (`sims.runtime.apply_set_power_limits`); its
      reply goes back to the tick on ``.../result``.

    A publisher the scenario stops (``mqtt_stopped``) sends nothing while stopped.
    """

    def __init__(self, run: ScenarioRun, cfg: RackyConfig, tick: RackyTick) -> None:
        rack = run.rack
        assert rack is not None
        self.run = run
        self.rack = rack
        self.tick = tick
        self.ident = cfg.identity
        n = rack.shelves.params.shelves
        targets = list(cfg.power_shelves[:n]) or [
            ModbusTargetSettings(name=f"shelf{i}", unit_id=i + 1,
                                 register_map=Path("power-shelf"))
            for i in range(n)]
        maps: dict[Path, RegisterMap] = {}
        for t in targets:
            if t.register_map not in maps:
                maps[t.register_map] = load_register_map(t.register_map)
        self.shelves = [_ShelfFace(t, maps[t.register_map]) for t in targets]
        root = cfg.mqtt.topic_root
        self.agents = Topics(root, cfg.identity, cfg.node_agents.daemon)
        self.cooling_topic = Topics(root, cfg.identity, cfg.cooling.daemon).state(
            cfg.cooling.state_thing)
        self.plant_topic = cfg.cooling.plant_topic
        self.setpoint_c = run.scenario.plant.supply_setpoint_c

    def feed(self, now: float, wall_ns: int) -> None:
        """Everything the daemon would have received since the last tick (one poll, one
        message per publisher)."""
        run, tick, pr = self.run, self.tick, self.run.protocol
        sh = self.rack.shelves
        for i, face in enumerate(self.shelves):
            tick.shelf_samples(face.target.name,
                               face.poll(sh.shelf_readings(i), pr.sentinel_points, wall_ns, now))
        if pr.publishing("trays"):
            for thing, payload in tray_payloads(self.rack, self.ident, wall_ns):
                tick.message(self.agents.telemetry(thing), _encode_tray(payload),
                             retain=False, received_mono=now, wall_ns=wall_ns)
        r = run.plant.readings()
        tick.message(self.cooling_topic, encode_json({
            "supply_temp_c": _finite(r.get("supply_temp_c")), "setpoint_c": self.setpoint_c,
            "valve_command_pct": _finite(r.get("valve_command_pct")),
            "valve_position_pct": _finite(r.get("valve_position_pct")), "ts_ns": wall_ns,
        }), retain=False, received_mono=now, wall_ns=wall_ns)
        if self.plant_topic is not None and pr.publishing("plant"):
            tick.message(self.plant_topic, encode_json(plant_payload(run, wall_ns)),
                         retain=False, received_mono=now, wall_ns=wall_ns)

    def command(self, c: AgentPublish, now: float, wall_ns: int) -> str | None:
        """Deliver one ``set_power_limits`` to the node agents and its reply to the tick; the
        refusal (``code: message``), if any."""
        env = CommandEnvelope.model_validate(json.loads(encode_json(c.payload)))
        error: dict[str, str] | None = None
        try:
            apply_set_power_limits(self.rack, SetPowerLimitsArgs.model_validate(env.args))
        except ValidationError as err:
            error = {"code": "invalid_args", "message": str(err)[:300]}
        except CommandError as err:
            error = {"code": str(err.code), "message": str(err)}
        reply = {"request_id": env.request_id, "ok": error is None, "error": error,
                 "state": None}
        self.tick.message(f"{c.topic}/result", encode_json(reply), retain=False,
                          received_mono=now, wall_ns=wall_ns)
        return None if error is None else f"{error['code']}: {error['message']}"


def _encode_tray(payload: dict[str, Any]) -> bytes:
    """A tray payload as the node agent's bytes: `rackplane.core.tray_contract.encode_tray`
    (msgspec; the same values as ``encode_json``'s bytes) when every float in it is finite,
    else ``encode_json`` (which refuses NaN / inf with ValueError, as before: msgspec would
    write null)."""
    return encode_tray(payload) if _tray_finite(payload) else encode_json(payload)


def _tray_finite(p: Mapping[str, Any]) -> bool:
    """Every float of a `sims.telemetry.tray_payloads` payload is finite (a sum of finite
    floats is finite unless it overflows: then False, and ``encode_json`` decides)."""
    isfinite = math.isfinite
    if not isfinite(p["power_w"] + p["coolant_out_temp_c"]):
        return False
    if not isfinite(sum(v for v in p["agent"].values()
                        if isinstance(v, float))):
        return False
    for g in p["gpus"]:
        up = g["uptime_s"]
        if not isfinite(g["power_w"] + g["temp_c"] + g["t_limit_c"] + g["utilization"]
                        + (0.0 if up is None else up)):
            return False
        pb = g["ports"]
        if pb is not None and not isfinite(sum(pb["speed_mb_per_s"]) + sum(pb["tx_bytes_per_s"])
                                           + sum(pb["rx_bytes_per_s"])):
            return False  # ber: finite or None (finite_or_none); counters: ints
    return True


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _finite(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)


def default_config(**power: Any) -> RackyConfig:
    """racky's embedded defaults with ``[power]`` overrides (lock-step runs)."""
    cfg = RackyConfig()
    if power:
        cfg = cfg.model_copy(update={"power": cfg.power.model_copy(update=power)})
    return cfg


def lockstep_config(cfg: RackyConfig) -> RackyConfig:
    """``cfg`` with ``cooling.plant_topic`` set to the simulator's ``telemetry/plant`` when it
    is unset (as the demo wires racky: valvey's state carries no flow or facility water)."""
    if cfg.cooling.plant_topic is not None:
        return cfg
    topic = Topics(cfg.mqtt.topic_root, cfg.identity, "sim").telemetry("plant")
    return cfg.model_copy(update={"cooling": cfg.cooling.model_copy(
        update={"plant_topic": topic})})


def run_racky(
    scenario: Scenario | str,
    cfg: RackyConfig | None = None,
    *,
    plant_dt_s: float = 0.1,
    duration_s: float | None = None,
    fine_trace: bool = False,
    persisted: PersistedState | None = None,
    hook: Callable[[float, ScenarioRun, RackyCore], None] | None = None,
    progress: Callable[[float], None] | None = None,
    tick_factory: Callable[[RackyConfig, RackyCore], RackyTick] | None = None,
) -> RackyLockstepResult:
    """Run ``scenario`` (the whole virtual rack, fabric on when the scenario has link faults or
    asks for it) with racky's tick (`racky.tick.RackyTick`, the daemon's) at 1 Hz by default.

    Args:
        cfg: racky's config (default: embedded defaults; `lockstep_config` is applied).
        plant_dt_s: plant step, s (a divisor of the tick; <= 1).
        duration_s: stop here (default: the scenario's duration).
        fine_trace: also record rack power at every plant step (``fine``).
        persisted: racky's persisted state at start (default: a new rack in the config's
            ``lifecycle.initial_state``).
        hook: called before each tick with (plant s, the run, the core) to inject actions.
        tick_factory: builds the tick from (config, core) (default `RackyTick` started at 0;
            tests substitute a faulty one to show the figures come from the tick).

    Raises:
        ValueError: a plant step that does not divide the tick.
    """
    sc = load_scenario(scenario) if isinstance(scenario, str) else scenario
    cfg = lockstep_config(cfg or RackyConfig())
    tick_s = cfg.control.tick_s
    n_sub = round(tick_s / plant_dt_s)
    if n_sub < 1 or abs(n_sub * plant_dt_s - tick_s) > 1e-9:
        raise ValueError(f"plant_dt_s {plant_dt_s} must divide the tick {tick_s}")
    if not cfg.links.enabled and not any(f.kind in FABRIC_KINDS for f in sc.faults):
        sc = sc.model_copy(update={"fabric": FabricSpec(enabled="off")})  # nothing reads it
    run = ScenarioRun(sc, model="rack")
    ps = persisted or PersistedState(Lifecycle(cfg.lifecycle.initial_state, WALL0_NS, "new",
                                               "lockstep"))
    core = RackyCore(cfg, 0.0, ps)
    tick = (tick_factory or (lambda c, k: RackyTick(c, k, 0.0, agent_epoch=WALL0_NS // 10**6)))(
        cfg, core)
    io = _RackyIO(run, cfg, tick)
    end = sc.duration_s if duration_s is None else duration_s
    keys = ("t_s", "rack_power_w", "rack_input_w", "it_power_w", "limit_w", "limit_source",
            "caps_total_w", "capacity_w", "hottest_tj_c", "min_t_limit_c", "throttled",
            "supply_temp_c", "facility_supply_temp_c", "derate_w", "trays_powered")
    trace: dict[str, list[Any]] = {k: [] for k in keys}
    fine: dict[str, list[float]] = {"t_s": [], "rack_power_w": [], "rack_input_w": []}
    alarms: list[AlarmRecord] = []
    commands: list[tuple[float, tuple[int, ...], dict[str, Any], str]] = []
    refused: list[tuple[float, tuple[int, ...], str]] = []
    rack = run.rack
    assert rack is not None
    while True:
        now = round(run.t_s, 6)
        if now > end + 1e-9:
            break
        if hook is not None:
            hook(now, run, core)
        wall = WALL0_NS + round(now * 1e9)
        io.feed(now, wall)
        eff = tick.step(now, wall)
        out = eff.output
        assert out is not None
        for c in eff.agent_commands:
            err = io.command(c, now, wall)
            args = {k: v for k, v in c.payload["args"].items() if k != "trays"}
            commands.append((now, c.trays, args, c.reason))
            if err is not None:
                refused.append((now, c.trays, err))
        for ev in eff.alarm_events:
            alarms.append(AlarmRecord(now, ev.id, ev.kind, ev.severity, ev.message))
        tr = rack.truth()
        st = rack.shelves.state
        caps = out.caps_w
        cool = tick.cooling_reading()
        trace["t_s"].append(now)
        trace["rack_power_w"].append(out.rack_power_w)
        trace["rack_input_w"].append(st.input_w)
        trace["it_power_w"].append(tr.it_power_w)
        trace["limit_w"].append(out.limit.limit_w)
        trace["limit_source"].append(out.limit.source)
        trace["caps_total_w"].append(None if np.isnan(caps).all() else float(np.nansum(caps)))
        trace["capacity_w"].append(st.capacity_w)
        trace["hottest_tj_c"].append(float(tr.gpu_tj_c.max()))
        trace["min_t_limit_c"].append(float(tr.gpu_t_limit_c.min()))
        trace["throttled"].append(int(tr.gpu_throttled.sum()))
        trace["supply_temp_c"].append(None if cool is None else cool.supply_temp_c)
        trace["facility_supply_temp_c"].append(run.facility_supply_temp_c)
        trace["derate_w"].append(out.derate_w)
        trace["trays_powered"].append(int(tr.tray_powered.sum()))
        if progress is not None:
            progress(now)
        if now >= end - 1e-9:
            break
        for _ in range(n_sub):
            run.step(plant_dt_s)
            if fine_trace:
                fine["t_s"].append(round(run.t_s, 6))
                fine["rack_power_w"].append(rack.shelves.state.load_w)
                fine["rack_input_w"].append(rack.shelves.flows.input_w)
    return RackyLockstepResult(sc, trace, alarms, commands, list(run.ground_truth), core, fine,
                               refused)


# --- validation on the simulator -----------------------------------------------------------------


def burn_in_scenario(load_s: float, backend_s: float, *, warm_s: float = 60.0,
                     fraction: float = 0.9, traffic: float = 0.5, seed: int = 21,
                     rack_max_power_w: float = 132_000.0) -> Scenario:
    """A burn-in: idle warm-up, then every GPU at ``fraction`` of TDP with link traffic
    ``traffic`` (BurnInWorkload) for the load and backend phases."""
    return Scenario(
        name="burn-in", description="validation burn-in", reference="issue 5 validation",
        duration_s=warm_s + load_s + backend_s + 5.0, seed=seed,
        plant=PlantSpec(rack_max_power_w=rack_max_power_w, model="rack"),
        load=LoadSpec(kind="burn_in", fraction=fraction, traffic=traffic),
        fabric=FabricSpec(enabled="on"),
    )


def run_validation(
    stage: Literal["node", "rack", "multi-rack"] = "rack",
    cfg: RackyConfig | None = None,
    *,
    trays: Sequence[int] | None = None,
    racks: int = 2,
    load_s: float = 120.0,
    backend_s: float = 60.0,
    warm_s: float = 60.0,
    out_dir: Path | None = None,
    plant_dt_s: float = 0.1,
    fault: Callable[[float, ScenarioRun, RackyCore], None] | None = None,
) -> tuple[ValidationResult, list[RackyLockstepResult], Path | None]:
    """Run a validation stage on the simulator in lock-step and judge it (racky's criteria).

    The burn-in phases are applied to the simulator here: ``load`` (burn-in power and
    traffic) and ``backend`` (every NVLink port silenced, every GPU's traffic forced to full:
    the collective goes over the NICs). The node stage tests ``trays``; the multi-rack stage
    runs ``racks`` racks through the same window and judges them together. ``fault`` is a hook
    (e.g. a fouled cold plate) to check that a bad rack fails. The lifecycle of each rack's
    core moves on the result (production / quarantined); with ``out_dir`` a Markdown report
    with PNG plots is written.

    Returns:
        (the verdict, the runs, the report path or None).
    """
    cfg = cfg or RackyConfig()
    n = racks if stage == "multi-rack" else 1
    results: list[ValidationResult] = []
    runs: list[RackyLockstepResult] = []
    for i in range(n):
        sc = burn_in_scenario(load_s, backend_s, warm_s=warm_s, seed=21 + i)
        ident = cfg.identity.model_copy(update={"rack": f"{cfg.identity.rack}" if n == 1
                                                else f"rack{i + 1}"})
        rcfg = cfg.model_copy(update={"identity": ident})

        def hook(now: float, run: ScenarioRun, core: RackyCore, _i: int = i) -> None:
            if fault is not None and _i == 0:
                fault(now, run, core)
            if abs(now - warm_s) < 1e-6:
                core.start_validation(stage, now, WALL0_NS + round(now * 1e9), "lockstep",
                                      trays=trays, load_s=load_s, backend_s=backend_s)
            if abs(now - (warm_s + load_s)) < 1e-6 and backend_s > 0:
                fab = run.rack.fabric if run.rack is not None else None
                if fab is not None:
                    names = fab.port_names()
                    for p, nm in enumerate(names):
                        if "/nvl" in nm:
                            fab.silence(p, backend_s + 2.0)
                    for g in range(fab.gpus):
                        fab.burst(g, backend_s + 2.0, 1.0)

        r = run_racky(sc, rcfg, plant_dt_s=plant_dt_s, hook=hook)
        runs.append(r)
        res = r.core.last_result
        if res is None:
            raise RuntimeError("the validation did not finish within the burn-in scenario")
        results.append(res)
    verdict = results[0] if n == 1 else combine(results)
    path = None
    if out_dir is not None:
        path = write_report(results if n > 1 else [verdict], out_dir,
                            title=f"racky validation: {stage} stage (lock-step simulator)")
    return verdict, runs, path


# --- command line ---------------------------------------------------------------------------------


def _summary(r: RackyLockstepResult) -> str:
    lines = [f"scenario {r.scenario.name}: {len(r.trace['t_s'])} ticks, "
             f"{len(r.commands)} agent commands, {len(r.raised())} alarms raised"]
    for a in r.raised():
        lines.append(f"  t={a.t_s:8.1f} s  {a.severity:8s} {a.id}: {a.message}")
    for f in r.ground_truth:
        lines.append(f"  fault {f.kind} {f.target} {f.start_s}..{f.end_s}")
    return "\n".join(lines)


def _positive(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number > 0")
    return v


def _trays(text: str) -> list[int]:
    """argparse type: tray indices, comma-separated (``0,1,5``)."""
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: tray indices separated by commas, e.g. 0,1") from None


def main(argv: Sequence[str] | None = None) -> int:
    """``rackctl lockstep --daemon racky run SCENARIO [--duration S] [--plant-dt S]`` |
    ``validate --stage node|rack|multi-rack --out DIR [--trays 0,1] [--load-s S]
    [--backend-s S] [--racks N]``. Exit 0 (validation FAIL: 1); a bad argument or a
    refused validation plan: 2 with the reason (no traceback)."""
    ap = argparse.ArgumentParser(prog="rackctl lockstep --daemon racky")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a scenario with racky's tick in lock-step")
    r.add_argument("scenario", help="bundled scenario name or TOML path (rack-sim list)")
    r.add_argument("--duration", type=_positive, default=None,
                   help="plant seconds to run (default: the scenario's duration)")
    r.add_argument("--plant-dt", type=_positive, default=0.1,
                   help="plant step, s; must divide racky's 1 s tick (default 0.1)")
    r.add_argument("--budget-w", type=_positive, default=None, help="rack power budget, W")
    v = sub.add_parser("validate", help="validation stage on the simulator, with a report")
    v.add_argument("--stage", choices=("node", "rack", "multi-rack"), default="rack")
    v.add_argument("--out", type=Path, required=True, help="report directory")
    v.add_argument("--trays", type=_trays, default=None,
                   help="node stage (required there): trays, e.g. 0,1")
    v.add_argument("--racks", type=int, default=2, help="multi-rack stage: racks")
    v.add_argument("--load-s", type=_positive, default=120.0, help="burn-in load phase, s")
    v.add_argument("--backend-s", type=_positive, default=60.0,
                   help="backend-only phase (NVLink off), s")
    try:
        ns = ap.parse_args(argv)
    except SystemExit as err:  # argparse printed the usage and the problem
        return 0 if err.code == 0 else 2
    try:
        if ns.cmd == "run":
            cfg = default_config(budget_w=ns.budget_w) if ns.budget_w else None
            res = run_racky(ns.scenario, cfg, plant_dt_s=ns.plant_dt, duration_s=ns.duration)
            print(_summary(res))
            return 0
        verdict, _, path = run_validation(ns.stage, trays=ns.trays, racks=ns.racks,
                                          load_s=ns.load_s, backend_s=ns.backend_s,
                                          out_dir=ns.out)
    except (CommandError, ValueError) as err:
        print(f"rackctl lockstep --daemon racky {ns.cmd}: {err}", file=sys.stderr)
        return 2
    print(f"{verdict.stage}: {'PASS' if verdict.passed else 'FAIL'}; report {path}")
    for c in verdict.criteria:
        print(f"  {'pass' if c.passed else 'FAIL'}  {c.name}: {c.measured} ({c.limit})")
    return 0 if verdict.passed else 1



# --- the scenario figures of issue 5 --------------------------------------------------------------

#: fault kind (sims.scenario) -> the racky alarm kinds that detect it
FAULT_ALARMS: dict[str, tuple[str, ...]] = {
    "link_flap": ("link_flapping",),
    "link_down": ("port_dropped", "link_flapping"),
    "link_error_ramp": ("link_error_rate", "link_errors", "link_ber"),
    "link_ber": ("link_ber", "link_error_rate"),
    "psu_failure": ("psu_failed",),
    "shelf_loss": ("shelf_ac_lost", "shelf_offline"),
    "feed_loss": ("feed_redundancy_lost",),
    "psu_derate": ("psu_derated",),
    "fouled_cold_plate": ("tray_overheat", "gpu_slowdown"),
    "facility_water_rise": ("power_capped",),
}

#: budget and grid-side ramp of the S2 / training-swings figures (below the 132 kW peak)
S2_BUDGET_W = 120_000.0
S2_RAMP_W_PER_S = 20_000.0


def _fig(name: str, value: float | None, unit: str, target: float | None = None,
         comparison: Any = "info", detail: str = "", **extra: Any) -> Figure:
    v = None if value is None or not math.isfinite(value) else float(value)
    return Figure(f"racky.{name}", v, unit, target, comparison, detail=detail, extra=extra)


def _matches(target: str, thing: str) -> bool:
    """Whether an alarm's thing belongs to a fault's target: a port must match exactly
    (``gpu07/nic1`` ↔ ``gpu07-nic1``); a PSU or shelf fault is matched by its shelf (PSU
    numbering differs between the simulator and the alarms) or a rack-wide alarm; other
    targets (a tray, the facility water) by any thing."""
    if "/" in target:
        return thing == target.replace("/", "-")
    if target.startswith("shelf"):
        return thing == "" or thing.startswith(target.split(".")[0])
    return True


def fault_coverage(runs: Sequence[RackyLockstepResult], cfg: RackyConfig | None = None,
                   grace_s: float = 60.0, skip: Sequence[tuple[str, str]] = ()
                   ) -> tuple[int, int, list[str]]:
    """Injected faults detected over ``runs``: (detected, expected, misses).

    A fault counts as detected when an alarm of one of `FAULT_ALARMS`' kinds on its target
    (`_matches`) is raised between its start and its end (the run's end when open) +
    ``grace_s``. A single link flap (fewer flaps than the flap rule's count) is expected to
    raise nothing (S7: "one flap a day → no alarm") and is not counted; nor are faults starting
    after a shortened run's end, nor ``skip``'s (scenario, target) pairs (each figure that
    skips one says where that fault is scored). Unknown fault kinds count as missed.
    """
    cfg = cfg or RackyConfig()
    det = exp = 0
    misses: list[str] = []
    skipped = set(skip)
    for r in runs:
        end_run = r.trace["t_s"][-1] if r.trace["t_s"] else 0.0
        for f in r.ground_truth:
            if f.start_s > end_run or (r.scenario.name, f.target) in skipped:
                continue
            if f.kind == "link_flap":
                spec = next((x for x in r.scenario.faults if x.kind == "link_flap"
                             and x.port == f.target and abs(x.at_s - f.start_s) < 1e-6), None)
                if spec is not None and (spec.count or 1) < cfg.links.flap_count:
                    continue
            exp += 1
            kinds = FAULT_ALARMS.get(f.kind, ())
            stop = (end_run if f.end_s is None else f.end_s) + grace_s
            if any(a.id.split(".")[0] in kinds and f.start_s <= a.t_s <= stop
                   and _matches(f.target, a.id.partition(".")[2]) for a in r.raised()):
                det += 1
            else:
                misses.append(f"{r.scenario.name}:{f.kind}:{f.target}")
    return det, exp, misses


def s7_figures(plant_dt_s: float = 1.0, duration_s: float | None = None,
               scenario: Scenario | str = "flapping-link"
               ) -> tuple[list[Figure], RackyLockstepResult]:
    """S7 (flapping-link): flapping declared after the 3rd down, none for the single flap,
    "port dropped" at 4 min, one alert per incident (``duration_s``: stop early; the port
    drop needs the run past its down time + 4 min; ``scenario``: the S7 scenario or a variant
    with the same faults, e.g. moved closer together for a shorter test)."""
    r = run_racky(scenario, plant_dt_s=plant_dt_s, duration_s=duration_s)
    sc = r.scenario
    flap = next(f for f in sc.faults if f.kind == "link_flap" and (f.count or 1) >= 3)
    once = next(f for f in sc.faults if f.kind == "link_flap" and (f.count or 1) == 1)
    down = next(f for f in sc.faults if f.kind == "link_down")
    assert isinstance(flap.port, str) and isinstance(once.port, str)
    assert isinstance(down.port, str)
    third = flap.at_s + 2 * ((flap.down_s or 0.0) + (flap.up_s or 0.0))
    t_flap = r.first_alarm("link_flapping", flap.port)
    crit_once = [a for a in r.raised() if a.severity == "critical"
                 and a.id.endswith("." + once.port.replace("/", "-"))]
    t_drop = r.first_alarm("port_dropped", down.port)
    n_alerts = len([a for a in r.raised("link_flapping")
                    if a.id.endswith("." + flap.port.replace("/", "-"))])
    d = f"flapping-link lock-step, plant dt {plant_dt_s} s, racky tick 1 s"
    return [
        _fig("S7.flap_declared_after_3rd_down_s", None if t_flap is None else t_flap - third,
             "s", 1.0, "<=", f"{d}; 3rd down at {third:.0f} s (NVSentinel rule: 3 in 10 min)"),
        _fig("S7.single_flap_fatal_alarms", float(len(crit_once)), "alarms", 0.0, "==",
             f"{d}; {once.port} flaps once"),
        _fig("S7.port_dropped_after_s", None if t_drop is None else t_drop - down.at_s, "s",
             241.0, "<=", f"{d}; {down.port} down {down.down_s:.0f} s; target 4 min (+1 tick)"),
        _fig("S7.flap_alerts_per_incident", float(n_alerts), "alerts", 1.0, "==", d),
    ], r


def br13_figures() -> list[Figure]:
    """FIELD-CASES BR-13 through the window rule with BR-13's parameters (4 transitions in
    60 s, quiet 300 s, 10 s polls): (a) from polled state: the raise time and the count of
    alerts; (b) from a carrier_changes delta (14 → 20) with both polls reading up."""
    from rackplane.core.detect import CounterDeltas, WindowCountRule

    rule = WindowCountRule(1, 4, 60.0, 300.0)
    raises: list[float] = []
    was = False
    prev: bool | None = None
    for i in range(13 + 60):
        t = i * 10.0
        up = (i % 2 == 0) if i < 13 else True
        tr = 0 if prev is None else int(up != prev)
        prev = up
        now = bool(rule.update(t, [tr])[0])
        if now and not was:
            raises.append(t)
        was = now
    carrier = CounterDeltas(1, bits=32, max_rate_per_s=1000.0)
    rule_b = WindowCountRule(1, 4, 60.0, 300.0)
    carrier.update(np.array([14], dtype=np.uint64), 0.0, uptime_s=[5000.0])
    rule_b.update(0.0, [0])
    s = carrier.update(np.array([20], dtype=np.uint64), 10.0, uptime_s=[5010.0])
    raised_b = bool(rule_b.update(10.0, [max(float(s.delta[0]), 0.0)])[0])
    d = "FIELD-CASES BR-13: 4 transitions in 60 s, quiet 300 s, polls every 10 s"
    return [
        _fig("BR13.polled_flap_raised_at_s", raises[0] if raises else None, "s", 40.0, "==",
             d + "; up/down alternating from t=0"),
        _fig("BR13.polled_flap_alerts", float(len(raises)), "alerts", 1.0, "==", d),
        _fig("BR13.carrier_delta_flap_raised", float(raised_b), "bool", 1.0, "==",
             d + "; carrier_changes 14 → 20, both polls up"),
    ]


def _harness_delays(profile: Any, n_links: int, n_minutes: int, factory: Any, seed: int
                    ) -> Any:
    from sims.link_harness import detection_delays_min, run

    res = run(profile, n_links, n_minutes, factory, seed=seed)
    return detection_delays_min(res.first_alarm_min, 0.0)


def _q(x: Any, q: float) -> float | None:
    a = np.asarray(x, dtype=float)
    if a.size == 0 or np.isnan(a).any():
        return None  # a link never detected: no figure
    return float(np.quantile(a, q))


def s8_harness_figures(creep_links: int = 300, healthy_links: int = 100_000,
                       healthy_days: int = 1, seed: int = 5,
                       cfg: RackyConfig | None = None,
                       progress: Progress = no_progress,
                       days_target: bool = True) -> list[Figure]:
    """S8 on the link-only harness with racky's own detector classes and parameters
    (``[links]``: λ0, λ1, h; 1-minute bins): the 24 h creep 0.5 → 5/min and the 2 h fast ramp
    0.5 → 10/min (median / p90 over ``creep_links`` links, each its own seed), the static
    rules on the same counts (60-min window > 120; rate over 5 min > 2/min for 5 min), and the
    false alarms over ``healthy_links × healthy_days`` healthy link-days (``days_target``:
    the link-days figure is held to the issue's >= 100,000; off for shortened runs)."""
    from rackplane.core.detect import PoissonCusum, RateFor, WindowSum
    from sims.link_harness import RateProfile, run

    lk = (cfg or RackyConfig()).links
    bin_min = lk.bin_s / 60.0
    if abs(bin_min - 1.0) > 1e-9:
        raise ValueError("the harness works in 1-minute bins: links.bin_s must be 60")

    def cusum(n: int) -> Any:
        return PoissonCusum(n, lk.healthy_rate_per_min, lk.cusum_lambda1_per_min, lk.cusum_h,
                            watch_h=lk.cusum_watch_h)

    def window(n: int) -> Any:
        return WindowSum(n, 60, 120.0)

    def prom(n: int) -> Any:
        return RateFor(n, 5, 2.0, 5)

    slow = RateProfile.ramp(0.5, 5.0, start_min=0, duration_min=1440)
    fast = RateProfile.ramp(0.5, 10.0, start_min=0, duration_min=120)
    out: list[Figure] = []
    d = (f"link harness, {creep_links} links (seed {seed}), 1-min Poisson bins, CUSUM "
         f"λ0={lk.healthy_rate_per_min} λ1={lk.cusum_lambda1_per_min} h={lk.cusum_h}")
    progress("S8 creep", 0.0)
    c24 = _harness_delays(slow, creep_links, 1800, cusum, seed) / 60.0
    w24 = _harness_delays(slow, creep_links, 1800, window, seed) / 60.0
    p24 = _harness_delays(slow, creep_links, 1800, prom, seed) / 60.0
    out += [
        _fig("S8.creep_24h_detect_h", _q(c24, 0.5), "h", 4.5, "<=", d + "; median"),
        _fig("S8.creep_24h_detect_p90_h", _q(c24, 0.9), "h", 5.0, "<=", d + "; p90"),
        _fig("S8.creep_24h_static_window_h", _q(w24, 0.5), "h", detail=d +
             "; static rule: 60-min window > 120 errors, median"),
        _fig("S8.creep_24h_static_rate5m_h", _q(p24, 0.5), "h", detail=d +
             "; static rule: rate over 5 min > 2/min for 5 min, median"),
    ]
    progress("S8 fast", 0.2)
    c2 = _harness_delays(fast, creep_links, 240, cusum, seed + 1)
    w2 = _harness_delays(fast, creep_links, 240, window, seed + 1)
    p2 = _harness_delays(fast, creep_links, 240, prom, seed + 1)
    out += [
        _fig("S8.fast_2h_detect_min", _q(c2, 0.5), "min", 30.0, "<=", d + "; median"),
        _fig("S8.fast_2h_detect_p90_min", _q(c2, 0.9), "min", detail=d + "; p90"),
        _fig("S8.fast_2h_static_window_min", _q(w2, 0.5), "min", detail=d +
             "; static 60-min window > 120, median"),
        _fig("S8.fast_2h_static_rate5m_min", _q(p2, 0.5), "min", detail=d +
             "; static rate over 5 min > 2/min for 5 min, median"),
    ]
    progress("S8 healthy", 0.4)
    res = run(RateProfile.healthy(lk.healthy_rate_per_min), healthy_links,
              1440 * healthy_days, cusum, seed=seed + 2)
    days = res.link_days
    out.append(_fig("S8.healthy_false_alarms", float(res.total_alarms), "alarms", 3.0, "<=",
                    f"link harness, {days:,.0f} healthy link-days at λ0 = "
                    f"{lk.healthy_rate_per_min}/min, racky's CUSUM", link_days=days))
    out.append(_fig("S8.healthy_link_days", days, "link-days",
                    100_000.0 if days_target else None, ">=" if days_target else "info",
                    "healthy link-days simulated for the false-alarm count"))
    progress("S8", 1.0)
    return out


def s8_lockstep_figures(duration_s: float = 7200.0, plant_dt_s: float = 1.0
                        ) -> tuple[list[Figure], RackyLockstepResult]:
    """The rising-crc scenario through racky's whole link pipeline (counter deltas, bins,
    CUSUM) in lock-step: the fast ramp's detection, with the shadow static rules."""
    r = run_racky("rising-crc", plant_dt_s=plant_dt_s, duration_s=duration_s)
    fast = next(f for f in r.scenario.faults if f.kind == "link_error_ramp"
                and f.ramp_s <= 7200.0)
    assert isinstance(fast.port, str)
    lh = r.core.links
    t_alarm = r.first_alarm("link_error_rate", fast.port)
    figs = [_fig("S8.fast_lockstep_detect_min",
                 None if t_alarm is None else (t_alarm - fast.at_s) / 60.0, "min", 30.0, "<=",
                 f"rising-crc lock-step ({duration_s / 3600:.1f} h), {fast.port} "
                 f"{fast.counter} ramp 0.5 → 10/min over 2 h")]
    if lh is not None:
        p = lh.names.index(fast.port)
        for k, name in (("window_60min_gt_120", "fast_lockstep_static_window_min"),
                        ("rate_5m_gt_2pm_for_5m", "fast_lockstep_static_rate5m_min")):
            v = float(lh.first_raise[k][p])
            figs.append(_fig(f"S8.{name}", (v - fast.at_s) / 60.0 if math.isfinite(v) else None,
                             "min", detail=f"shadow static rule {k} on the same bins"))
    return figs, r


def s9_figures(plant_dt_s: float = 0.1, duration_s: float | None = None,
               scenario: Scenario | str = "facility-water-rise",
               ) -> tuple[list[Figure], RackyLockstepResult]:
    """S9 (facility-water-rise): derate along P_max(T_fws), supply within SP + 1 K, no GPU
    throttling, release after the water cools.

    Args:
        plant_dt_s: plant step, s; duration_s: stop here (default: the scenario's 3,600 s).
        scenario: the scenario (a shortened copy lets a test see the release).

    Returns:
        (figures ``racky.S9.*``, the run). ``derate_released_after_s`` is None when the run
        ends before the derate is released (or the fault never ends).
    """
    r = run_racky(scenario, plant_dt_s=plant_dt_s, duration_s=duration_s)
    tr = r.trace
    sp = r.scenario.plant.supply_setpoint_c
    sup = [x for x in tr["supply_temp_c"] if x is not None]
    derate = r.core.derate
    excess = [p - derate.p_max(tf) for p, tf in zip(tr["rack_power_w"],
                                                     tr["facility_supply_temp_c"], strict=True)
              if p is not None and tf is not None]
    first = next((t for t, w in zip(tr["t_s"], tr["derate_w"], strict=True) if w is not None),
                 None)
    f = next(x for x in r.ground_truth if x.kind == "facility_water_rise")
    rel = None
    if f.end_s is not None:
        rel = next((t for t, w in zip(tr["t_s"], tr["derate_w"], strict=True)
                    if t > f.end_s and w is None), None)
    d = f"facility-water-rise lock-step (plant dt {plant_dt_s} s)"
    return [
        _fig("S9.supply_over_setpoint_max_k", max(sup) - sp if sup else None, "K", 1.0, "<=", d),
        _fig("S9.gpus_throttled_max", float(max(tr["throttled"])), "GPUs", 0.0, "==", d),
        _fig("S9.power_above_pmax_max_w", max(excess) if excess else None, "W", detail=d +
             "; rack power − P_max(T_fws) (positive: above the derate line)"),
        _fig("S9.derate_engaged_at_s", first, "s", detail=d + f"; water rise from {f.start_s} s"),
        _fig("S9.derate_released_after_s", None if rel is None or f.end_s is None
             else rel - f.end_s, "s", detail=d + "; after the water is back (hysteresis)"),
    ], r


def s10_figures(plant_dt_s: float = 0.1) -> tuple[list[Figure], list[RackyLockstepResult]]:
    """S10 (psu-failure, psu-failure-n1): alarm latency per fault and the capacity cap's
    latency once redundancy is gone."""
    runs = [run_racky("psu-failure", plant_dt_s=plant_dt_s),
            run_racky("psu-failure-n1", plant_dt_s=plant_dt_s)]
    lat: list[float] = []
    cap_lat: list[float] = []
    missing = 0
    for r in runs:
        for f in r.ground_truth:
            kinds = FAULT_ALARMS.get(f.kind, ())
            t = next((a.t_s for a in r.raised() if a.id.split(".")[0] in kinds
                      and a.t_s >= f.start_s), None)
            if t is None:
                missing += 1
            else:
                lat.append(t - f.start_s)
        tr = r.trace
        tc = next((t for t, s in zip(tr["t_s"], tr["limit_source"], strict=True)
                   if s == "capacity"), None)
        if tc is not None:
            start = max(f.start_s for f in r.ground_truth if f.start_s <= tc)
            cap_lat.append(tc - start)
    d = "psu-failure and psu-failure-n1 lock-step; racky tick 1 s"
    return [
        _fig("S10.alarm_latency_max_s", max(lat) if lat and not missing else None, "s", 1.0,
             "<=", d + f"; {len(lat)} faults"),
        _fig("S10.cap_latency_max_s", max(cap_lat) if cap_lat else None, "s", 1.0, "<=",
             d + "; fault that left the load above live capacity → cap to capacity"),
    ], runs


def s2_figures(scenarios: Sequence[str] = ("training-swings", "agentic-bursts"),
               duration_s: float | None = None, budget_w: float = S2_BUDGET_W,
               ramp_w_per_s: float = S2_RAMP_W_PER_S
               ) -> tuple[list[Figure], list[RackyLockstepResult]]:
    """S2 / training swings under a budget and a grid-side ramp limit: the worst overshoot
    above the budget (0.1 s rack power), the longest excursion above it, and the largest AC
    input ramp over 1 s against the configured W/s."""
    cfg = default_config(budget_w=budget_w, rack_ramp_w_per_s=ramp_w_per_s)
    figs: list[Figure] = []
    runs: list[RackyLockstepResult] = []
    for name in scenarios:
        r = run_racky(name, cfg, fine_trace=True, duration_s=duration_s)
        runs.append(r)
        p = np.asarray(r.fine["rack_power_w"], dtype=float)
        pin = np.asarray(r.fine["rack_input_w"], dtype=float)
        over = p > budget_w
        longest = run_len = 0
        for o in over:
            run_len = run_len + 1 if o else 0
            longest = max(longest, run_len)
        step = 10  # 0.1 s plant steps: 1 s
        ramp = float(np.max(np.abs(pin[step:] - pin[:-step]))) if pin.size > step else None
        key = "training" if name.startswith("training") else "agentic"
        d = (f"{name} lock-step ({r.trace['t_s'][-1]:.0f} s), budget {budget_w / 1e3:.0f} kW, "
             f"ramp limit {ramp_w_per_s / 1e3:.0f} kW/s")
        figs += [
            _fig(f"S2.{key}_over_budget_max_pct", (p.max() - budget_w) / budget_w * 100.0, "%",
                 2.0, "<=", d + "; shelf DC output at 0.1 s"),
            _fig(f"S2.{key}_back_under_s", longest * 0.1, "s", 5.0, "<=",
                 d + "; longest excursion above the budget"),
            _fig(f"S2.{key}_grid_ramp_max_w_per_s", ramp, "W/s", ramp_w_per_s, "<=",
                 d + "; AC input change over 1 s"),
        ]
    return figs, runs


def fouling_hook(tray: int = 5, start_s: float = 120.0, ramp_s: float = 600.0,
                 final: float = 0.45) -> Callable[[float, ScenarioRun, RackyCore], None]:
    """A cold plate fouling progressively (conductance 1 → ``final`` over ``ramp_s``)."""

    def hook(now: float, run: ScenarioRun, _core: RackyCore) -> None:
        if now >= start_s:
            f = max(final, 1.0 - (1.0 - final) * (now - start_s) / ramp_s)
            for rack in run.plant.racks:
                rack.set_conductance_factor(tray, f)

    return hook


def overheat_figures(ramp_s: float = 600.0, plant_dt_s: float = 0.1
                     ) -> tuple[list[Figure], list[RackyLockstepResult]]:
    """Overheating tray: tray 5's cold plates foul progressively (1 → 0.45 over ``ramp_s``) at
    132 kW. Without racky's protection the GPUs reach HW slowdown; the lead is from racky's
    first warning on that tray to the slowdown. With protection: GPUs throttled."""
    base = load_scenario("overheating-tray").model_copy(update={"faults": []})
    end = 120.0 + ramp_s + 200.0
    cfg = RackyConfig()
    off = cfg.model_copy(update={"thermal": cfg.thermal.model_copy(update={"protect": False})})
    r_off = run_racky(base, off, hook=fouling_hook(ramp_s=ramp_s), duration_s=end,
                      plant_dt_s=plant_dt_s)
    r_on = run_racky(base, cfg, hook=fouling_hook(ramp_s=ramp_s), duration_s=end,
                     plant_dt_s=plant_dt_s)
    warn = r_off.first_alarm("tray_overheat", "tray05")
    slow = next((t for t, n in zip(r_off.trace["t_s"], r_off.trace["throttled"], strict=True)
                 if n > 0), None)
    d = (f"overheating-tray with the plate fouling over {ramp_s:.0f} s at 132 kW (plant dt "
         f"{plant_dt_s} s)")
    return [
        _fig("overheat.warn_lead_s", None if warn is None or slow is None else slow - warn, "s",
             30.0, ">=", d + "; first tray_overheat warning → first HW slowdown (protection "
             "off)"),
        _fig("overheat.throttled_with_protection", float(max(r_on.trace["throttled"])), "GPUs",
             0.0, "==", d + "; racky caps the tray (cause: tray, cooling normal)"),
    ], [r_off, r_on]


def _plots(out: Path, s2: Sequence[RackyLockstepResult], cfg: RackyConfig, seed: int) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is a test extra
        return
    from rackplane.core.detect import PoissonCusum, RateFor, WindowSum
    from sims.link_harness import RateProfile, iter_counts

    out.mkdir(parents=True, exist_ok=True)
    for r in s2:
        fig, ax = plt.subplots(figsize=(9, 3.2))
        t = np.asarray(r.fine["t_s"])
        m = t <= min(t[-1], 120.0)
        ax.plot(t[m], np.asarray(r.fine["rack_power_w"])[m] / 1e3, label="rack power (DC)")
        ax.plot(t[m], np.asarray(r.fine["rack_input_w"])[m] / 1e3, lw=0.8,
                label="AC input (grid side)")
        ax.axhline(S2_BUDGET_W / 1e3, color="r", ls="--", label="budget")
        ax.set_xlabel("s")
        ax.set_ylabel("kW")
        ax.set_title(f"{r.scenario.name}: rack power vs budget (first 120 s)")
        ax.legend(loc="lower right", fontsize=8)
        fig.tight_layout()
        fig.savefig(out / f"racky-{r.scenario.name}-power.png", dpi=100)
        plt.close(fig)
    lk = cfg.links
    prof = RateProfile.ramp(0.5, 5.0, start_min=0, duration_min=1440)
    counts = next(iter(iter_counts(prof, 1, 1800, seed=seed))).counts[0]
    marks = {}
    for name, det in (("CUSUM", PoissonCusum(1, lk.healthy_rate_per_min,
                                             lk.cusum_lambda1_per_min, lk.cusum_h)),
                      ("60-min window > 120", WindowSum(1, 60, 120.0)),
                      ("rate[5m] > 2/min for 5m", RateFor(1, 5, 2.0, 5))):
        ev = det(counts.reshape(1, -1), 0)
        if ev is not None and ev.any():
            marks[name] = (int(np.argmax(ev[0])) + 1) / 60.0
    fig, ax = plt.subplots(figsize=(9, 3.2))
    h = np.arange(counts.size) / 60.0
    k = np.convolve(counts, np.ones(10) / 10, mode="same")
    ax.plot(h, k, lw=0.8, label="errors/min (10-min mean)")
    ax.plot(h, prof.rate_per_min(np.arange(counts.size)), "k--", lw=0.8, label="true rate")
    for (name, th), c in zip(marks.items(), ("g", "r", "m"), strict=False):
        ax.axvline(th, color=c, label=f"{name}: {th:.1f} h")
    ax.set_xlabel("h")
    ax.set_ylabel("errors/min")
    ax.set_title("S8 creep 0.5 → 5/min over 24 h: one link, detection marks")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "racky-S8-crc-rate.png", dpi=100)
    plt.close(fig)


def racky_scenario_figures(out: Path | None = None, progress: Progress = no_progress,
                           quick: bool = False) -> list[Figure]:
    """Every figure of issue 5's table, computed from lock-step runs and the link harness.

    ``quick`` shortens the runs (smoke tests: fewer links, 2,000 healthy link-days, shorter
    traces; the full-size figures need ``quick=False``, a few minutes on 2 cores). With
    ``out``, PNG plots (rack power vs budget, CRC rate with detection marks) are written there.
    """
    cfg = RackyConfig()
    figs: list[Figure] = []
    runs: list[RackyLockstepResult] = []
    steps = 8

    def done(i: int, label: str) -> None:
        progress(f"racky: {label}", i / steps)

    done(0, "S7")
    f7, r7 = s7_figures()
    figs += f7
    runs.append(r7)
    figs += br13_figures()
    done(1, "S8 harness")
    figs += s8_harness_figures(creep_links=40 if quick else 300,
                               healthy_links=2_000 if quick else 100_000, cfg=cfg,
                               days_target=not quick)
    done(2, "S8 lock-step")
    f8, r8 = s8_lockstep_figures(duration_s=2400.0 if quick else 3600.0)
    figs += f8
    runs.append(r8)
    done(3, "S9")
    f9, r9 = s9_figures(plant_dt_s=0.5)
    figs += f9
    runs.append(r9)
    done(4, "S10")
    f10, r10 = s10_figures()
    figs += f10
    runs += r10
    done(5, "S2")
    f2, r2 = s2_figures(duration_s=300.0 if quick else None)
    figs += f2
    done(6, "overheating tray")
    fo, _ = overheat_figures()
    figs += fo
    runs.append(run_racky("overheating-tray", duration_s=300.0 if quick else None))
    done(7, "fault coverage")
    slow = next(f for f in r8.scenario.faults if f.kind == "link_error_ramp"
                and f.ramp_s > 7200.0)
    det, exp, misses = fault_coverage(runs, cfg, skip=[(r8.scenario.name, str(slow.port))])
    figs.append(_fig("faults.detected_pct", 100.0 * det / exp if exp else None, "%", 100.0,
                     ">=", f"{det}/{exp} injected faults detected over "
                     f"{', '.join(sorted({r.scenario.name for r in runs}))} (rising-crc's 24 h "
                     f"creep on {slow.port}: S8.creep figures, the lock-step run stops early)"
                     + (f"; missed: {', '.join(misses)}" if misses else ""), misses=misses))
    if out is not None:
        _plots(out, r2, cfg, seed=5)
    done(8, "done")
    return figs
