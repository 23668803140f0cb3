"""racky's node-level verbs through the real command router and a `LeaseGate` (issue 6: node
cap override under a lease, tray power cycle): limits validated, leases checked, audited,
counted against the blast radius (they are not safety verbs), and every refusal leaves the
core, its persisted state, the lease table and the node-agent commands sent exactly as they
were."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from rackplane.clock import FakeClock
from rackplane.commands import CommandAudit, CommandReply, CommandRouter, LeaseGate
from rackplane.core.leases import LeaseTable
from rackplane.io.mqtt import Message, MqttLink
from rackplane.settings import CommandSettings, Identity, MqttSettings
from racky.commands import register_racky_commands
from racky.config import BlastRadiusSettings, RackyConfig
from racky.core.agent_settings import AgentCommand
from racky.core.controller import RackyCore, RackyInputs
from racky.core.lifecycle import Lifecycle, PersistedState
from tests.unit.test_commands import CaptureLog, drive

USERS = {"alice": "operator", "bob": "operator", "bms": "automation", "viewer": "reader"}


@dataclass
class RackRig:
    clock: FakeClock
    link: MqttLink
    router: CommandRouter
    core: RackyCore
    gate: LeaseGate
    replies: list[dict[str, Any]] = field(default_factory=list)
    audits: list[CommandAudit] = field(default_factory=list)
    sent: list[AgentCommand] = field(default_factory=list)
    n: int = 0

    def call(self, verb: str, args: Mapping[str, Any] | None = None, *, user: str = "alice"
             ) -> dict[str, Any]:
        self.n += 1
        env: dict[str, Any] = {"request_id": f"r-{self.n}", "issued_at": datetime.fromtimestamp(
            self.clock.wall_ns() / 1e9, tz=UTC).isoformat(), "args": dict(args or {})}
        msg = Message(topic=self.link.topics.cmd(user, verb), payload=json.dumps(env).encode(),
                      qos=1, retain=False, dup=False, received_mono=self.clock.monotonic())
        k = len(self.replies)
        drive(self.router.handle(msg))
        assert len(self.replies) == k + 1, "exactly one reply per command"
        CommandReply.model_validate(self.replies[-1])
        return self.replies[-1]

    def fingerprint(self) -> str:
        now = self.clock.monotonic()
        c = self.core
        return json.dumps([c.state(), c.persisted.to_json(), self.gate.snapshot(now),
                           [repr(x) for x in self.sent], c.blast.used(now),
                           sorted(c.cap_overrides), sorted(c.cycle_on_at.items())],
                          sort_keys=True, default=repr)


def make_rack(max_actions: int = 10) -> RackRig:
    clock = FakeClock()
    link = MqttLink(MqttSettings(), Identity(site="lab", rack="r1"), "racky", clock=clock)
    cfg = RackyConfig()
    cfg = cfg.model_copy(update={"power": cfg.power.model_copy(update={
        "blast_radius": BlastRadiusSettings(max_actions=max_actions, window_s=600.0)})})
    core = RackyCore(cfg, clock.monotonic(),
                     PersistedState(Lifecycle("production", 0, "new", "test")))
    rig = RackRig(clock, link, None, core, None)  # type: ignore[arg-type]

    async def reply(msg: Message, payload: Mapping[str, Any]) -> str:
        rig.replies.append(dict(payload))
        assert msg.response_topic is not None
        return msg.response_topic

    rig.router = CommandRouter(link, CommandSettings(users=USERS), clock=clock,
                               log=CaptureLog(), reply=reply, audit=rig.audits.append)
    outputs = ["rack_cap", "rack_budget", "lifecycle",
               *(f"tray:{i:02d}" for i in range(core.n_trays))]
    rig.gate = LeaseGate(rig.router, LeaseTable(outputs), log=CaptureLog())
    register_racky_commands(rig.router, core, send=rig.sent.extend,
                            lease_check=rig.gate.check)
    core.step(clock.monotonic(), RackyInputs())
    return rig


def refused(rig: RackRig, verb: str, args: Mapping[str, Any], code: str, *,
            user: str = "alice") -> None:
    """The command is refused with ``code`` and changes nothing."""
    before = rig.fingerprint()
    r = rig.call(verb, args, user=user)
    assert not r["ok"] and r["error"]["code"] == code, r
    assert rig.fingerprint() == before
    assert rig.audits[-1].outcome == code and rig.audits[-1].verb == verb


def lease(rig: RackRig, trays: list[int], user: str = "alice") -> None:
    for t in trays:
        r = rig.call("acquire_lease", {"output": f"tray:{t:02d}", "ttl_s": 600}, user=user)
        assert r["ok"], r


def test_set_tray_cap_needs_a_lease_caps_at_the_lower_value_and_clears() -> None:
    rig = make_rack()
    core = rig.core
    lo, hi = core.alloc.tray_min_w, core.alloc.tray_max_w
    args = {"trays": [2, 3], "power_w": 5000.0, "ttl_s": 120.0, "reason": "node test"}
    refused(rig, "set_tray_cap", args, "lease_required")  # no lease held
    lease(rig, [2])
    refused(rig, "set_tray_cap", args, "lease_required")  # not on every tray
    lease(rig, [3])
    refused(rig, "set_tray_cap", args, "lease_held", user="bob")  # alice holds them
    refused(rig, "set_tray_cap", args, "forbidden", user="bms")  # operator verb
    refused(rig, "set_tray_cap", {**args, "trays": [2, 99]}, "unknown_tray")
    refused(rig, "set_tray_cap", {**args, "power_w": lo - 1}, "out_of_range")
    refused(rig, "set_tray_cap", {**args, "power_w": hi + 1}, "out_of_range")
    refused(rig, "set_tray_cap", {**args, "ttl_s": 0}, "out_of_range")
    r = rig.call("set_tray_cap", args)
    assert r["ok"], r
    ov = r["state"]["tray_cap_overrides"]
    assert set(ov) == {"tray02", "tray03"} and ov["tray02"]["power_w"] == 5000.0
    assert ov["tray02"]["by"] == "alice" and rig.audits[-1].outcome == "ok"
    assert core.blast.used(rig.clock.monotonic()) == 1
    d = core.desired()
    assert d[2].power_cap_w == 5000.0 and d[3].power_cap_w == 5000.0
    assert d[4].power_cap_w != 5000.0
    # Never above racky's own allocation: an allocation below the override wins.
    core.alloc.caps[2] = 4000.0
    assert core.desired()[2].power_cap_w == 4000.0
    core.alloc.caps[2] = float("nan")
    # A renewal of the same cap is not a new blast-radius action.
    assert rig.call("set_tray_cap", args)["ok"]
    assert core.blast.used(rig.clock.monotonic()) == 1
    # clear: lease-checked, returns what it cleared.
    refused(rig, "clear_tray_cap", {"trays": [2], "reason": "x"}, "lease_held", user="bob")
    r = rig.call("clear_tray_cap", {"trays": [2], "reason": "done"})
    assert r["ok"] and r["state"]["cleared"] == [2]
    assert set(core.state()["tray_cap_overrides"]) == {"tray03"}
    assert core.desired()[2].power_cap_w is None


def test_tray_cap_override_expires_in_the_tick() -> None:
    rig = make_rack()
    lease(rig, [5])
    assert rig.call("set_tray_cap", {"trays": [5], "power_w": 5000.0, "ttl_s": 30.0,
                                     "reason": "x"})["ok"]
    t0 = rig.clock.monotonic()
    rig.core.step(t0 + 29.0, RackyInputs())
    assert 5 in rig.core.cap_overrides
    rig.core.step(t0 + 30.0, RackyInputs())
    assert rig.core.cap_overrides == {} and rig.core.desired()[5].power_cap_w is None


def test_cycle_trays_switches_off_now_and_back_on_through_the_sequencer() -> None:
    rig = make_rack()
    core = rig.core
    core.desired_powered = [True] * core.n_trays
    refused(rig, "cycle_trays", {"trays": [1], "off_s": 0.5, "reason": "x"}, "out_of_range")
    refused(rig, "cycle_trays", {"trays": [1, 40], "reason": "x"}, "unknown_tray")
    refused(rig, "cycle_trays", {"trays": [1], "reason": "x"}, "forbidden", user="viewer")
    lease(rig, [1], user="bob")
    refused(rig, "cycle_trays", {"trays": [1, 2], "reason": "x"}, "lease_held")
    r = rig.call("cycle_trays", {"trays": [2, 3], "off_s": 20.0, "reason": "hung BMC"})
    assert r["ok"] and r["state"]["cycling"] == [2, 3] and r["state"]["on_after_s"] == 20.0
    assert [c.trays for c in rig.sent] == [(2, 3)] and rig.sent[0].args["powered"] is False
    assert core.persisted.safety_off == {}  # not a safety power-down
    assert core.blast.used(rig.clock.monotonic()) == 2  # one action per tray
    assert [x["tray"] for x in core.state()["cycling"]] == [2, 3]
    t0 = rig.clock.monotonic()
    core.step(t0 + 19.0, RackyInputs())
    assert core.desired_powered[2] is False and core.desired_powered[3] is False
    core.step(t0 + 20.0, RackyInputs())
    assert core.cycle_on_at == {}
    # Back on through the sequencer (its inrush limit may spread them over ticks).
    for i in range(1, 30):
        core.step(t0 + 20.0 + i, RackyInputs())
    assert core.desired_powered[2] is True and core.desired_powered[3] is True


def test_cycle_trays_refuses_safety_off_trays_and_a_safety_power_down_ends_a_cycle() -> None:
    rig = make_rack()
    core = rig.core
    core.desired_powered = [True] * core.n_trays
    assert rig.call("power_down_trays", {"trays": [4], "reason": "leak"}, user="bms")["ok"]
    refused(rig, "cycle_trays", {"trays": [4, 5], "reason": "x"}, "invalid_transition")
    assert rig.call("cycle_trays", {"trays": [5], "off_s": 10, "reason": "x"})["ok"]
    assert rig.call("power_down_trays", {"trays": [5], "reason": "leak"}, user="bms")["ok"]
    assert core.cycle_on_at == {}
    t0 = rig.clock.monotonic()
    for i in range(0, 40, 5):
        core.step(t0 + i, RackyInputs())
    assert core.desired_powered[5] is False


@pytest.mark.parametrize("verb", ["cycle_trays", "set_tray_cap"])
def test_node_verbs_count_against_the_blast_radius(verb: str) -> None:
    rig = make_rack(max_actions=3)
    lease(rig, [0, 1, 2, 3])
    args: dict[str, Any] = {"trays": [0, 1], "reason": "x"}
    if verb == "set_tray_cap":
        args |= {"power_w": 5000.0, "ttl_s": 60.0}
        for p in (4000.0, 5000.0, 6000.0):
            assert rig.call(verb, {**args, "power_w": p})["ok"]
        refused(rig, verb, {**args, "power_w": 3000.0}, "blast_radius")
    else:
        assert rig.call(verb, args)["ok"]
        refused(rig, verb, {**args, "trays": [2, 3]}, "blast_radius")
    # Safety verbs stay exempt.
    assert rig.call("power_down_trays", {"trays": [6], "reason": "leak"}, user="bms")["ok"]
