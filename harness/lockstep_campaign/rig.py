"""The daemons on the multi-rack simulator: one racky per rack (its own `RackyCore`, the daemon's
tick `racky.tick.RackyTick` fed by `harness.lockstep_racky.run._RackyIO`, its real command
router and handlers) and rlc's campaign driver behind rlc's real command router
(`rlc.commands.register_rlc_commands`). The harness is only the transport: command envelopes
and ``state/rack`` JSON handed over, a dict as the KV bucket (compare-and-set by revision)."""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine, Mapping
from datetime import UTC, datetime
from typing import Any, cast

from harness.lockstep_racky.run import WALL0_NS, _RackyIO, lockstep_config
from rackplane.clock import FakeClock
from rackplane.commands import CommandAudit, CommandRouter
from rackplane.io.mqtt import Message, MqttLink
from rackplane.settings import CommandSettings, Identity, MqttSettings
from racky.commands import register_racky_commands
from racky.config import RackyConfig
from racky.core.controller import RackyCore
from racky.core.lifecycle import Lifecycle, PersistedState
from racky.tick import RackyTick
from rlc.campaign_driver import CampaignDriver, Order
from rlc.commands import register_rlc_commands
from rlc.core.topology import Topology, TopologySettings, compile_topology
from sims.row import VirtualRack
from sims.scenario import PlantSpec, ScenarioRun
from sims.scenario.run import ProtocolFaults

__all__ = ["CommandRig", "RackyRack", "RlcSide", "campaign_topology", "drive",
           "racky_command_rig", "rlc_command_rig"]

RLC_USER = "rlc"
OPERATOR = "harness"


def drive(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a command handler's coroutine that never suspends (the router replies into a
    capture; nothing awaits a real event). Raises RuntimeError if it suspends."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError("a command handler suspended: it must never wait on the loop")


class _Quiet:
    """A structlog-shaped logger that drops events (the lock-step run reports its own)."""

    def __getattr__(self, level: str) -> Any:
        return lambda *_a, **_k: None


class CommandRig:
    """A daemon's real command router with its replies and audits captured; `call` sends one
    command envelope as ``user`` and returns the reply. The harness's and the tests' one
    wiring of racky's and rlc's routers (`racky_command_rig`, `rlc_command_rig`).

    Args:
        rack: the identity's rack level (topics ``lab/<rack>/<daemon>``).
        daemon: the daemon's topic level.
        users: broker user -> role.
        clock: the router's clock (default: plant second 0 at `WALL0_NS`).
        log: a structlog-shaped logger (default: events dropped).
    """

    def __init__(self, rack: str, daemon: str, users: Mapping[str, str], *,
                 clock: FakeClock | None = None, log: Any = None) -> None:
        self.clock = clock if clock is not None else FakeClock(0.0, WALL0_NS)
        self.link = MqttLink(MqttSettings(), Identity(site="lab", rack=rack), daemon,
                             clock=self.clock)
        self.replies: list[dict[str, Any]] = []
        self.audits: list[CommandAudit] = []
        self.n = 0

        async def reply(msg: Message, payload: Mapping[str, Any]) -> str:
            self.replies.append(dict(payload))
            assert msg.response_topic is not None, "the rig's envelopes carry a reply topic"
            return msg.response_topic

        self.router = CommandRouter(self.link, CommandSettings(users=dict(users)),
                                    clock=self.clock, log=_Quiet() if log is None else log,
                                    reply=reply, audit=self.audits.append)

    def at(self, now: float) -> None:
        """Advance the router's clock to plant second ``now``."""
        self.clock.advance(now - self.clock.monotonic())

    def call(self, verb: str, args: Mapping[str, Any], user: str) -> dict[str, Any]:
        """One command envelope through the router; its reply."""
        self.n += 1
        env = {"request_id": f"r-{self.n}", "issued_at": datetime.fromtimestamp(
            self.clock.wall_ns() / 1e9, tz=UTC).isoformat(), "args": dict(args)}
        msg = Message(topic=self.link.topics.cmd(user, verb), payload=json.dumps(env).encode(),
                      qos=1, retain=False, dup=False, received_mono=self.clock.monotonic())
        drive(self.router.handle(msg))
        return self.replies[-1]


def racky_command_rig(core: RackyCore, rack: str, users: Mapping[str, str], *,
                      clock: FakeClock | None = None, log: Any = None) -> CommandRig:
    """racky's command router with every racky verb on ``core`` (agent commands dropped)."""
    rig = CommandRig(rack, "racky", users, clock=clock, log=log)
    register_racky_commands(rig.router, core, send=lambda _c: None)
    return rig


def rlc_command_rig(driver: CampaignDriver, is_leader: Callable[[], bool],
                    users: Mapping[str, str], *, clock: FakeClock | None = None,
                    log: Any = None) -> CommandRig:
    """rlc's command router with rlc's verbs on ``driver`` (``is_leader``: the lease)."""
    rig = CommandRig("rlc", "rlc", users, clock=clock, log=log)
    register_rlc_commands(rig.router, driver, is_leader)
    return rig


class _RackRun:
    """What `_RackyIO` reads of a `ScenarioRun`, for one rack of a `MultiRack`."""

    def __init__(self, vr: VirtualRack) -> None:
        self.rack = vr
        self.plant = vr.cdu
        self.protocol = ProtocolFaults()
        self.scenario = type("S", (), {"plant": PlantSpec()})()

    @property
    def t_s(self) -> float:
        return self.rack.time_s


class RackyRack:
    """One rack's racky: core, tick, inputs from the simulator, command router.

    Args:
        vr: the rack's `VirtualRack` (a `MultiRack` rack).
        name: its rack name (``rack1``).
        overrides: racky config (dict form) merged over the fleet-mode defaults.
    """

    def __init__(self, vr: VirtualRack, name: str, overrides: Mapping[str, Any]) -> None:
        raw: dict[str, Any] = {
            "fleet": {"enabled": True, "floor_w": 60_000.0},
            "campaign_gate": {"required_stages": ["multi-rack"]},
            "identity": {"site": "lab", "row": "row1", "rack": name}}
        for k, v in overrides.items():
            raw[k] = {**raw.get(k, {}), **v} if isinstance(v, dict) else v
        self.name = name
        self.vr = vr
        self.cfg = lockstep_config(RackyConfig.model_validate(raw))
        ps = PersistedState(Lifecycle(self.cfg.lifecycle.initial_state, WALL0_NS, "new",
                                      "lockstep"))
        self.refused: list[tuple[float, str]] = []
        self.restarts = 0
        self._boot(0.0, ps, 0)

    def _boot(self, now: float, ps: PersistedState, judge_epoch: int) -> None:
        self.core = RackyCore(self.cfg, now, ps)
        self.core.judge_epoch = judge_epoch
        self.tick = RackyTick(self.cfg, self.core, now,
                              agent_epoch=WALL0_NS // 10**6 + round(now * 1000))
        self.io = _RackyIO(cast(ScenarioRun, _RackRun(self.vr)), self.cfg, self.tick)
        self.verbs = racky_command_rig(self.core, self.name,
                                       {OPERATOR: "operator", RLC_USER: "operator"})
        self.verbs.at(now)

    def restart(self, now: float, judge_epoch: int | None = None) -> RackyCore:
        """racky restarted at plant second ``now``, or its pair's standby took over
        (``judge_epoch``: the new leader's fencing epoch; None: unchanged): a new core, tick,
        inputs and command router from the persisted state as stored (its JSON document);
        what the old process held only in memory (a validation under way) is gone. Returns
        the old core (a fenced leader, for what it may still publish)."""
        old = self.core
        ps = PersistedState.from_json(json.loads(json.dumps(old.persisted.to_json())))
        self.restarts += 1
        self._boot(now, ps, old.judge_epoch if judge_epoch is None else judge_epoch)
        return old

    def step(self, now: float) -> None:
        """One 1 Hz tick of the daemon at plant second ``now``."""
        wall = WALL0_NS + round(now * 1e9)
        self.verbs.at(now)
        self.core.drop_lost_validation(wall)  # as the daemon does while active (racky.app)
        self.io.feed(now, wall)
        eff = self.tick.step(now, wall)
        for c in eff.agent_commands:
            err = self.io.command(c, now, wall)
            if err is not None:
                self.refused.append((now, err))

    def state_bytes(self) -> bytes:
        """``state/rack`` as published."""
        return json.dumps(self.core.state()).encode()


def campaign_topology(racks: int, *, max_w: float = 132_000.0) -> Topology:
    """rlc's topology of the lock-step campaign: one hall, one row of ``racks`` racks
    (``rack1`` ..), each on its own CDU, the row and hall sized so every rack may validate
    at once."""
    rack = {"floor_w": 60_000.0, "max_w": max_w, "priority": "normal",
            "cooling_capacity_w": max_w}
    return compile_topology(TopologySettings.model_validate({
        "site": "lab", "halls": {"hall1": {"feed_limit_w": 2.0 * racks * max_w, "rows": {
            "row1": {"limit_w": 1.5 * racks * max_w, "ramp_w_per_s": 20_000.0,
                     "racks": {f"rack{i + 1}": dict(rack) for i in range(racks)}}}}}}))


class RlcSide:
    """rlc's leader: the campaign driver behind rlc's command router, the KV record a dict."""

    def __init__(self, topo: Topology, resend_s: float = 10.0) -> None:
        self.topo = topo
        self.driver = CampaignDriver(topo, "rackplane", RLC_USER)
        self.verbs = rlc_command_rig(self.driver, lambda: True, {OPERATOR: "operator"})
        self.kv: dict[str, Any] = {"rev": 0, "data": None}
        self.driver.restore(None)
        self.resend_s = resend_s
        self._last_resend = -1e18

    def cycle(self, now: float, wall_s: float, committed_w: Mapping[str, float]
              ) -> list[Order]:
        """One leader cycle (`rlc.app.Rlc._campaign_cycle`'s order): restore if needed, step,
        write before send, re-send what is unconfirmed every ``resend_s``."""
        self.verbs.at(now)
        d = self.driver
        if not d.loaded:
            d.restore(None if self.kv["data"] is None else (self.kv["rev"], self.kv["data"]))
        data, orders = d.step(wall_s, 1, committed_w)
        out: list[Order] = []
        if data is not None:
            self.kv["rev"] += 1
            self.kv["data"] = data
            d.written(self.kv["rev"], data)
            out = d.commands(orders)
        if now - self._last_resend >= self.resend_s:
            self._last_resend = now
            out += d.commands(d.outstanding(wall_s))
        return out
