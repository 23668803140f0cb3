"""One source of truth for the floor guarantee's figures across rlc, racky and tray-agent
(issue 16; docs/RLC.md "Defaults and cross-checks"): the shared defaults agree and hold every
rule, the shipped example configs agree with each other, the agent's safe cap is on the wire
(contract 1.2) as it would be enforced, racky compares it with what it assumes and reports
the Σ to rlc, and rlc flags a rack whose floor or agents' safe caps contradict its topology."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from rackplane.core.budget_leases import DEFAULT_RACK_FLOOR_W, RackReport
from rackplane.core.tray_contract import AGENT_SAFE_GPU_CAP_W
from racky.config import RackyConfig
from racky.core.budget import BudgetFollower, FleetSide, InputRatio
from racky.core.controller import RackyCore, RackyInputs
from racky.core.telemetry import PayloadError, TelemetryIngest, decode_payload
from racky.fleet import FleetLink, agents_safe_figures
from racky.fleet_settings import FleetSettings, agents_safe_total_w
from racky.persist import Lifecycle, PersistedState
from rlc.config import RlcConfig, example_topology
from rlc.core.allocation import AllocationSettings
from rlc.core.cycle import FleetState
from rlc.core.leases import LeaseTiming
from rlc.core.topology import compile_topology
from tests.unit.config_examples import rlc_example_text
from trayagent.config import TrayAgentConfig
from trayagent.core.caps import CapBook, DeviceLimits
from trayagent.core.payload import GpuReading, TrayInfo, tray_payload

ROOT = Path(__file__).resolve().parents[2]
WALL = 1.8e9


# --- the shared defaults and the shipped examples ----------------------------------------------

def test_the_three_daemons_default_to_one_floor_and_one_safe_cap() -> None:
    racky, agent = RackyConfig(), TrayAgentConfig()
    rlc = RlcConfig(topology=example_topology())  # rlc has no default topology: the example's
    floors = {float(f) for f in compile_topology(rlc.topology).floor_w}
    assert floors == {DEFAULT_RACK_FLOOR_W} == {racky.fleet.floor_w}
    assert agent.caps.safe_gpu_cap_w == racky.fleet.agent_safe_gpu_cap_w == AGENT_SAFE_GPU_CAP_W
    # the defaults hold racky's fleet rules (a default rack can join a fleet as it is)
    on = RackyConfig.model_validate({"fleet": {"enabled": True}})
    assert agents_safe_total_w(on) <= on.fleet.floor_w
    assert on.rack_floor_w <= on.fleet.floor_w
    assert on.fleet.agent_safe_gpu_cap_w >= on.node_agents.gpu_min_power_limit_w


def test_the_shipped_examples_agree_across_the_three_files() -> None:
    def load(name: str) -> dict[str, Any]:
        return tomllib.loads((ROOT / "config" / name).read_text())

    racky, agent = load("racky.example.toml"), load("tray-agent.example.toml")
    rlc = tomllib.loads(rlc_example_text())  # its example [topology] uncommented
    topo = compile_topology(RlcConfig.model_validate(rlc).topology)
    assert {float(f) for f in topo.floor_w} == {float(racky["fleet"]["floor_w"])}
    assert agent["caps"]["safe_gpu_cap_w"] <= racky["fleet"]["agent_safe_gpu_cap_w"]
    assert racky["fleet"]["bucket"] == rlc["fleet"]["bucket"]


def test_racky_refuses_a_safe_cap_assumption_below_the_gpus_lowest_limit() -> None:
    with pytest.raises(ValidationError, match=r"fleet.agent_safe_gpu_cap_w = 150 W is below "
                       r"node_agents.gpu_min_power_limit_w 200 W"):
        RackyConfig.model_validate({"fleet": {"enabled": True, "agent_safe_gpu_cap_w": 150.0}})
    # off: not checked (a single rack)
    assert RackyConfig.model_validate({"fleet": {"agent_safe_gpu_cap_w": 150.0}})


# --- the safe cap on the wire ------------------------------------------------------------------

LIM = DeviceLimits(200.0, 1200.0, 1000.0)


def _tray(tray: int, safe_w: float, limits: DeviceLimits = LIM, *, enforceable: bool = True,
          ts_ns: int = 10**18) -> bytes:
    book = CapBook({tray: 4}, safe_w)
    gpus = [GpuReading(gpu=tray * 4 + i, power_w=150.0, temp_c=50.0, reasons=[],
                       utilization=0.5, limit_w=book.safe_gpu_w([limits]), limits=limits)
            for i in range(4)]
    p = tray_payload(TrayInfo("lab", "row1", "r1", tray, 150.0, 45.0), gpus, book.trays[tray],
                     ts_ns=ts_ns, cap_expires_in_s=None, cap_enforceable=enforceable,
                     safe_gpu_cap_w=book.safe_gpu_w([limits] * 4))
    return json.dumps(p).encode()


def test_the_agent_states_its_safe_cap_as_enforced_and_racky_reads_it() -> None:
    ingest = TelemetryIngest(18, 4, ())
    m = decode_payload(_tray(0, 250.0))
    assert m.struct.agent.safe_gpu_cap_w == 250.0 and m.struct.schema_version == "1.3"
    assert ingest.tray_payload(m, 1.0).agent.safe_gpu_cap_w == 250.0
    # below the device's lowest limit: the agent holds (and states) that limit
    low = decode_payload(_tray(1, 100.0, DeviceLimits(180.0, 1200.0, 1000.0))).struct
    assert low.agent.safe_gpu_cap_w == 180.0
    # an agent that cannot cap states none
    ro = decode_payload(_tray(2, 250.0, enforceable=False)).struct
    assert ro.agent.safe_gpu_cap_w is None
    # the per-field path (plain JSON objects) reads it too, and refuses a negative one
    d = json.loads(_tray(3, 250.0))
    assert ingest.tray_payload(d, 2.0).agent.safe_gpu_cap_w == 250.0
    d["agent"]["safe_gpu_cap_w"] = -1.0
    d["ts_ns"] += 1
    with pytest.raises(PayloadError, match="safe_gpu_cap_w"):
        ingest.tray_payload(d, 3.0)


def _core_with(safe_w: dict[int, float]) -> RackyCore:
    """racky's real core after one step on 18 trays' agent payloads (tray → stated safe cap,
    every other tray 200 W)."""
    cfg = RackyConfig.model_validate({"fleet": {"enabled": True}})
    core = RackyCore(cfg, 0.0, PersistedState(Lifecycle("production", 0, "new", "test")))
    ingest = TelemetryIngest(18, 4, ())
    trays = {k: ingest.tray_payload(decode_payload(_tray(k, safe_w.get(k, 200.0))), 1.0)
             for k in range(18)}
    core.step(1.0, RackyInputs(trays=trays))
    return core


def test_racky_compares_the_stated_safe_caps_with_its_assumption_and_reports_the_sum() -> None:
    core = _core_with({})
    dc, above = agents_safe_figures(core, 200.0)
    a = core.cfg.node_agents
    assert above == {}
    share = max(a.other_share, core.other_share)                # the safe side
    assert dc == pytest.approx(18 * 4 * 200.0 * (1 + share)
                               + max(a.non_tray_power_w, core.non_tray_w))
    assert dc == pytest.approx(agents_safe_total_w(core.cfg))   # what the config check used
    core = _core_with({5: 300.0, 7: 200.9})                  # 200.9: within the 1 W rounding
    dc2, above = agents_safe_figures(core, 200.0)
    assert above == {5: 300.0}
    assert dc2 is not None and dc is not None and dc2 > dc
    # a tray that states none (an older agent): the Σ is unknown, never a partial one
    del core.readings[3]  # type: ignore[attr-defined]
    assert agents_safe_figures(core, 200.0)[0] is None

    # the link counts and logs the trays above, and the report carries the Σ in AC terms
    link = FleetLink(FleetSettings(enabled=True, servers=["nats://127.0.0.1:1"]), "lab", "r1")
    link.observe_core(_core_with({5: 300.0}))
    assert link.stats["safe_cap_above_trays"] == 1
    rep = link.follower.report(WALL, 0.0)
    assert rep.agents_safe_w is not None and rep.agents_safe_w >= dc2 * 1.10 - 1e-6
    assert rep.agents_safe_w % 100.0 == 0.0                  # rounded up to 100 W
    back = RackReport.from_record(json.loads(json.dumps(rep.as_record())))
    assert back == rep
    link.observe_core(_core_with({}))
    assert link.stats["safe_cap_above_trays"] == 0


def test_fleet_side_reports_no_sum_without_one() -> None:
    f = BudgetFollower("r1", 40_000.0, 1.0)
    FleetSide(f, InputRatio(1.1)).observe(None, None, None, None, WALL, 0.0)
    assert f.report(WALL, 0.0).agents_safe_w is None
    # an older racky's record (no agents_safe_w) still decodes
    rec = f.report(WALL, 0.0).as_record()
    del rec["agents_safe_w"]
    assert RackReport.from_record(rec).agents_safe_w is None


# --- rlc's cross-check -------------------------------------------------------------------------

def _state() -> FleetState:
    topo = compile_topology(example_topology())  # rack1, rack2 at the default floor
    return FleetState(topo, LeaseTiming(), AllocationSettings(), 5.0, 15.0, 100.0)


def _report(st: FleetState, rack: str, rev: int, floor_w: float,
            agents_safe_w: float | None) -> None:
    rec = RackReport(rack, 50_000.0, floor_w, floor_w, None, None, False, WALL,
                     agents_safe_w).as_record()
    st.on_report(rack, (rev, json.dumps(rec).encode()), 0.0)


@pytest.mark.parametrize(("floor_w", "safe_w", "want"), [
    (DEFAULT_RACK_FLOOR_W, 30_000.0, []),
    (DEFAULT_RACK_FLOOR_W + 0.5, None, []),                       # rounding
    (DEFAULT_RACK_FLOOR_W + 10_000.0, None, ["floor_above"]),     # falls to more than counted
    (DEFAULT_RACK_FLOOR_W - 10_000.0, None, ["floor_below"]),
    (DEFAULT_RACK_FLOOR_W, DEFAULT_RACK_FLOOR_W + 100.0, ["agents_safe_above_floor"]),
    (DEFAULT_RACK_FLOOR_W * 2, DEFAULT_RACK_FLOOR_W * 1.5,
     ["floor_above", "agents_safe_above_floor"]),
])
def test_rlc_flags_a_rack_whose_report_contradicts_its_topology(
        floor_w: float, safe_w: float | None, want: list[str]) -> None:
    st = _state()
    _report(st, "rack1", 1, floor_w, safe_w)
    _report(st, "rack2", 2, DEFAULT_RACK_FLOOR_W, None)
    assert st.mismatches() == ({"rack1": want} if want else {})
    rack = st.summary(0.0)["rows"]["hall1/row1"]["racks"]["rack1"]
    assert rack["mismatch"] == want
    assert (rack["floor_w"], rack["reported_floor_w"], rack["agents_safe_w"]) == (
        DEFAULT_RACK_FLOOR_W, floor_w, safe_w)


def test_racky_warns_of_a_fleet_user_other_than_its_racks() -> None:
    from racky.config import config_warnings

    def warns(**fleet: object) -> list[str]:
        cfg = RackyConfig.model_validate({"identity": {"site": "lab", "rack": "rack1"},
                                          "fleet": {"enabled": True, **fleet}})
        return [w for w in config_warnings(cfg) if w.startswith("fleet.username")]

    assert warns() == [] and warns(username="racky-lab-rack1") == []
    (w,) = warns(username="racky")
    assert "'racky-lab-rack1'" in w
    assert warns(username="racky-lab-rack2") != []
