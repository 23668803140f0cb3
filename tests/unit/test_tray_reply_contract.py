"""The node-agent contract's ``set_power_limits`` reply (contract 1.3, docs/CONTRACTS.md
"Reply"): ONE schema (`rackplane.core.tray_reply.SetPowerLimitsReply`, shipped as
``sims/schemas/sim.set_power_limits.reply.schema.json``) validates the reply of the simulator's
node agents AND of the real tray agent (over the virtual rack through `harness.simagent`'s
simulated GPU source), for every kind of command; racky's parser reads both to the same
read-back; racky still reads the older layouts (deprecation window) and refuses a broken one.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.simagent import SimTrayFace, agent_config
from rackplane.clock import SYSTEM_CLOCK
from rackplane.core.envelope import CommandContext
from rackplane.core.tray_contract import SCHEMA_VERSION
from rackplane.core.tray_reply import (
    REFUSAL_CODES,
    ReplyStateError,
    SetPowerLimitsReply,
    parse_reply_state,
)
from rackplane.errors import CommandError
from rackplane.settings import Identity, MqttSettings
from sims.runtime import VirtualRackSimulator
from sims.scenario import load_scenario
from sims.telemetry import SCHEMA_DIR, schema_documents
from trayagent.app import TrayAgent
from trayagent.contract import SetPowerLimitsArgs as AgentArgs

TRAY = 2
EPOCH = 1_800_000_000_000

# every kind of set_power_limits the contract defines that both agents apply
COMMANDS: dict[str, dict[str, Any]] = {
    "tray_cap": {"power_cap_w": 2400.0, "ttl_s": 60.0},
    "gpu_cap": {"gpu_power_cap_w": 500.0, "ttl_s": 60.0},
    "both_caps": {"power_cap_w": 3000.0, "gpu_power_cap_w": 650.0, "ttl_s": 30.0},
    "release": {"release": ["power_cap_w", "gpu_power_cap_w"]},
    "power_on": {"powered": True},
    "cap_above_device_max": {"gpu_power_cap_w": 5000.0, "ttl_s": 60.0},
}


def _args(kind: str, epoch: int = EPOCH) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "trays": [TRAY], "epoch": epoch,
            **COMMANDS[kind]}


def _ctx() -> CommandContext:
    return CommandContext(user="racky", role="automation", verb="set_power_limits",
                          request_id="r", issued_at_ns=0, now_mono=SYSTEM_CLOCK.monotonic(),
                          wall_ns=0, received_mono=0.0)


def _sim() -> VirtualRackSimulator:
    sc = load_scenario("load-step-short")
    return VirtualRackSimulator(sc, modbus_port=0, shelf_modbus_port=0,
                                identity=Identity(), mqtt=MqttSettings())


def _sim_reply(kind: str) -> dict[str, Any]:
    """The simulator's node agents' handler, as its command router calls it."""
    from sims.telemetry import SetPowerLimitsArgs as SimArgs

    sim = _sim()
    return sim._set_power_limits(SimArgs.model_validate(_args(kind)), _ctx())


def _sim_refusal() -> CommandError:
    from sims.telemetry import SetPowerLimitsArgs as SimArgs

    sim = _sim()
    sim._set_power_limits(SimArgs.model_validate(_args("gpu_cap")), _ctx())
    with pytest.raises(CommandError) as err:
        sim._set_power_limits(SimArgs.model_validate(_args("gpu_cap", EPOCH - 1)), _ctx())
    return err.value


def _agent(tmp_path: Path) -> tuple[TrayAgent, Callable[[], None]]:
    """The real tray agent over a virtual rack (`harness.simagent`), GPUs read once; returns
    the agent and a stepper (one 0.1 s plant step + the face's hook)."""
    sim = _sim()
    assert sim.rack is not None
    vr = sim.rack
    face = SimTrayFace(vr, limit_delay_s=0.0)
    comp = vr.compute
    cfg = agent_config(Identity(), MqttSettings(), comp.n_trays, comp.gpus_per_tray,
                       epoch_file=tmp_path / "epochs.json")
    cfg = cfg.model_copy(update={"spool": type(cfg.spool).model_validate(
        {"directory": str(tmp_path / "spool")})})
    gpus, bmcs = face.sources()
    agent = TrayAgent(cfg, source=gpus, bmcs=bmcs, bmc_max_age_s=5.0)

    def step() -> None:
        vr.step(0.1)
        face.on_step(vr, SYSTEM_CLOCK.monotonic())

    step()
    gpus.open()
    for g in agent.gpus[TRAY]:
        agent._read_one(g)
    return agent, step


async def _agent_command(agent: TrayAgent, step: Callable[[], None],
                         args: dict[str, Any]) -> dict[str, Any]:
    async def plant() -> None:
        while True:
            step()  # the GPUs apply the limits the agent set
            await asyncio.sleep(0.01)

    task = asyncio.create_task(plant())
    try:
        return await agent._set_power_limits(AgentArgs.model_validate(args), _ctx())
    finally:
        task.cancel()


def _agent_reply(kind: str, tmp_path: Path) -> dict[str, Any]:
    agent, step = _agent(tmp_path)
    return asyncio.run(_agent_command(agent, step, _args(kind)))


def test_the_shipped_schema_is_the_models() -> None:
    """The schema file both implementations are checked against is generated from the one
    model (``rackctl schemas --write``), so validating with the model is validating with it."""
    name = "sim.set_power_limits.reply.schema.json"
    shipped = (SCHEMA_DIR / name).read_text(encoding="utf-8")
    assert shipped == schema_documents()[name]
    doc = json.loads(shipped)
    assert doc["additionalProperties"] is False
    assert {"schema_version", "epoch", "confirmed", "trays"} <= set(doc["required"])


@pytest.mark.parametrize("kind", sorted(COMMANDS))
def test_one_schema_validates_both_agents_replies(kind: str, tmp_path: Path) -> None:
    sim = SetPowerLimitsReply.model_validate(_sim_reply(kind))
    real = SetPowerLimitsReply.model_validate(_agent_reply(kind, tmp_path))
    for r in (sim, real):
        assert r.schema_version == SCHEMA_VERSION and r.epoch == EPOCH
        assert r.confirmed is True  # the simulated GPUs applied the limit before the reply
        assert [t.tray for t in r.trays] == [TRAY]
        t = r.trays[0]
        assert t.epoch == EPOCH
        assert [g.gpu for g in t.gpus] == [4 * TRAY + i for i in range(4)]
        assert all(g.enforced_w is not None for g in t.gpus)
    # both read back the same per-GPU limit for the same command on the same plant
    s_gpu = [g.enforced_w for g in sim.trays[0].gpus]
    r_gpu = [g.enforced_w for g in real.trays[0].gpus]
    if kind == "gpu_cap":
        assert s_gpu == r_gpu == [500.0] * 4
    if kind == "cap_above_device_max":  # both hold the GPUs at their maximum (TGP)
        assert s_gpu == r_gpu and len(set(s_gpu)) == 1 and s_gpu[0] is not None
        assert s_gpu[0] < 5000.0
        assert all(g.clamped and "maximum" in g.clamped for g in real.trays[0].gpus)
    if kind in ("tray_cap", "gpu_cap", "both_caps"):
        for r in (sim, real):
            assert r.trays[0].cap_expires_in_s is not None
            assert 0.0 < r.trays[0].cap_expires_in_s <= COMMANDS[kind]["ttl_s"]
    if kind == "release":
        for r in (sim, real):
            t = r.trays[0]
            assert (t.power_cap_w, t.gpu_power_cap_w, t.cap_expires_in_s) == (None, None, None)


@pytest.mark.parametrize("kind", sorted(COMMANDS))
def test_rackys_parser_reads_both_agents_replies_alike(kind: str, tmp_path: Path) -> None:
    sim = parse_reply_state(_sim_reply(kind))
    real = parse_reply_state(_agent_reply(kind, tmp_path))
    for r in (sim, real):
        assert not r.legacy and r.epoch == EPOCH and r.confirmed is True
        assert set(r.enforced_gpu_w) == set(r.enforced_tray_cap_w) == {TRAY}
        assert len(r.enforced_gpu_w[TRAY]) == 4
        tray_w = r.enforced_tray_cap_w[TRAY]
        assert tray_w is not None and None not in r.enforced_gpu_w[TRAY]
        assert tray_w >= sum(w or 0.0 for w in r.enforced_gpu_w[TRAY])


def test_both_agents_refuse_a_stale_epoch_with_the_same_reason(tmp_path: Path) -> None:
    sim_err = _sim_refusal()
    agent, step = _agent(tmp_path)
    asyncio.run(_agent_command(agent, step, _args("gpu_cap")))
    with pytest.raises(CommandError) as real:
        asyncio.run(_agent_command(agent, step, _args("gpu_cap", EPOCH - 1)))
    assert sim_err.code == real.value.code == "stale_epoch"
    assert "stale_epoch" in REFUSAL_CODES


def test_racky_reads_the_older_layouts_during_the_deprecation_window() -> None:
    old_sim = {"trays": [{"tray": 2, "power_cap_w": None, "gpu_power_cap_w": 500.0,
                          "power_floor_pct": 0.0, "ramp_up_w_per_s": None,
                          "ramp_down_w_per_s": None, "ramp_down_hysteresis_s": 0.0,
                          "powered": True, "enforced_gpu_cap_w": 500.0,
                          "enforced_tray_cap_w": 2300.0}], "stale_refused": 0}
    old_agent = {"confirmed": False, "dry_run": False, "epoch_persisted": True,
                 "trays": {"2": {"epoch": 5, "power_cap_w": None, "gpu_power_cap_w": 500.0,
                                 "cap_expires_in_s": 59.0, "gpus": [
                                     {"gpu": 8 + i, "target_w": 500.0, "source": "gpu_cap",
                                      "clamped": False, "enforced_w": w}
                                     for i, w in enumerate([500.0, 500.0, 700.0, None])]}}}
    a = parse_reply_state(old_sim)
    assert a.legacy and a.enforced_tray_cap_w == {2: 2300.0} and a.enforced_gpu_w == {2: [500.0]}
    b = parse_reply_state(old_agent)
    assert b.legacy and b.confirmed is False
    assert b.enforced_gpu_w == {2: [500.0, 500.0, 700.0, None]}
    assert b.enforced_tray_cap_w == {2: None}  # one GPU not read: no tray figure


def _good() -> dict[str, Any]:
    return {"schema_version": "1.3", "epoch": 7, "confirmed": True, "trays": [
        {"tray": 0, "epoch": 7, "powered": True, "power_cap_w": None, "gpu_power_cap_w": 500.0,
         "cap_expires_in_s": 60.0, "enforced_tray_cap_w": 2000.0,
         "gpus": [{"gpu": i, "enforced_w": 500.0} for i in range(4)]}]}


@pytest.mark.parametrize(("mutate", "match"), [
    (lambda d: d.update(schema_version="2.0"), "unsupported schema_version"),
    (lambda d: d.pop("epoch"), "epoch"),
    (lambda d: d["trays"][0]["gpus"][0].update(enforced_w=-1.0), "enforced_w"),
    (lambda d: d["trays"][0]["gpus"][0].update(enforced_w="500"), "enforced_w"),
    (lambda d: d.update(confirmed="true"), "confirmed"),
    (lambda d: d["trays"][0].update(fan_rpm=3), "fan_rpm"),  # same minor: no unknown field
    (lambda d: d.update(trays={"0": {}}), "trays"),
])
def test_a_broken_reply_state_is_refused_naming_the_field(mutate: Any, match: str) -> None:
    d = _good()
    assert parse_reply_state(d).enforced_gpu_w == {0: [500.0] * 4}
    mutate(d)
    with pytest.raises(ReplyStateError, match=match):
        parse_reply_state(d)


def test_a_newer_minor_may_add_fields() -> None:
    d = _good()
    d["schema_version"] = "1.9"
    d["trays"][0]["fan_rpm"] = 3
    d["trays"][0]["gpus"][1]["mem_temp_c"] = 50.0
    d["vendor"] = "x"
    r = parse_reply_state(d)
    assert r.enforced_gpu_w == {0: [500.0] * 4} and r.epoch == 7 and not r.legacy
