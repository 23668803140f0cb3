"""The virtual rack's link fabric through the real tray agent (`harness.simlinks.SimLinks`):
the counters a read gives are the fabric's, at their widths, moving with its steps; the
agent's rates are the fabric's own interval's; and in lock-step (plant, the agent's read
cycle and publish, racky's ingest and link detector) a flapped port is published under the
fabric's name, down with its link-down counter up, and racky declares it flapping, with no
other link alarm on the rack."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.simagent import SimTrayFace, agent_config
from harness.simlinks import SimLinks
from rackplane.clock import FakeClock
from rackplane.settings import Identity, MqttSettings
from racky.config import RackyConfig
from racky.core.links import LinkHealth
from racky.core.telemetry import TelemetryIngest
from sims.fabric.counters import COUNTERS
from sims.row import VirtualRack
from sims.workloads import BurnInWorkload
from trayagent.app import TrayAgent
from trayagent.sysfs import LinkRates

PORT = "gpu07/nic1"


def _rack() -> tuple[VirtualRack, SimTrayFace, FakeClock]:
    vr = VirtualRack(workload=BurnInWorkload(), seed=3, fabric="on")
    clock = FakeClock()
    return vr, SimTrayFace(vr, clock=clock), clock


def _step(vr: VirtualRack, face: SimTrayFace, clock: FakeClock, s: float) -> None:
    for _ in range(round(s / 0.1)):
        vr.step(0.1)
        clock.advance(0.1)
        face.on_step(vr, clock.monotonic())


def test_a_read_is_the_fabrics_port_at_its_last_step_with_the_counters_widths() -> None:
    vr, face, clock = _rack()
    links = face.links()
    assert isinstance(links, SimLinks)
    t0 = clock.monotonic()
    assert links.read(PORT, 1.0).errors["port"] == "the fabric has not been sampled yet"
    _step(vr, face, clock, 2.5)
    fab = vr.fabric
    assert fab is not None
    snap, i = fab.snapshot(), fab.port_index(PORT)
    r = links.read(PORT, clock.monotonic())
    assert (r.name, r.published, r.kind, r.link_up) == (PORT, PORT, "ib", True)
    assert r.counters == {c.name: int(snap[c.name][i]) for c in COUNTERS}
    for c in COUNTERS:
        assert (r.specs[c.name].bits, r.specs[c.name].saturates) == (
            c.bits, c.overflow == "saturate")
        assert 0 <= r.counters[c.name] <= (1 << c.bits) - 1  # type: ignore[operator]
    assert r.speed_mb_per_s == pytest.approx(float(snap["link_speed_mb_per_s"][i]))
    nvl = links.read("gpu07/nvl03", clock.monotonic())
    assert nvl.kind == "nvlink" and nvl.published == "gpu07/nvl03"
    # the sample's time is the plant step that took it (t = 2.0 s), not the read's
    assert r.mono - t0 == pytest.approx(2.0)
    assert links.read("gpu99/nic0", 5.0).errors["port"].startswith("no such port")


def test_each_ports_counters_in_the_snapshot_are_its_columns_and_reads_own_their_dict(
        ) -> None:
    vr, face, clock = _rack()
    links = face.links()
    assert links is not None
    _step(vr, face, clock, 1.5)
    s = face.link_snapshot()
    assert s is not None and len(s.port_counters) == len(s.names)
    for i in (0, len(s.names) // 2, len(s.names) - 1):
        assert s.port_counters[i] == {k: col[i] for k, col in s.counters.items()}
    a, b = links.read(PORT, 2.0), links.read(PORT, 2.0)
    assert a.counters == b.counters and a.counters is not b.counters
    a.counters["tx_bytes"] = -1  # a reader's caller may keep or change its reading
    assert links.read(PORT, 2.0).counters == b.counters


def test_counters_move_with_the_fabric_and_rates_span_its_own_interval() -> None:
    vr, face, clock = _rack()
    links = face.links()
    assert links is not None
    rates = LinkRates(1e12)
    _step(vr, face, clock, 3.05)
    first = links.read(PORT, clock.monotonic())
    rates.update(first)
    _step(vr, face, clock, 2.0)  # two fabric steps
    second = links.read(PORT, clock.monotonic())
    got = rates.update(second)
    span = second.mono - first.mono
    assert span == pytest.approx(2.0)
    tx0, tx1 = first.counters["tx_bytes"], second.counters["tx_bytes"]
    assert tx0 is not None and tx1 is not None and tx1 > tx0
    assert got["tx_bytes"].per_s == pytest.approx((tx1 - tx0) / span)
    # read again before the fabric steps: the same sample, the same rates (not "no_time")
    _step(vr, face, clock, 0.2)
    again = links.read(PORT, clock.monotonic())
    assert again.mono == second.mono
    assert rates.update(again) == got
    _step(vr, face, clock, 1.0)
    moved = rates.update(links.read(PORT, clock.monotonic()))
    assert moved["tx_bytes"].per_s is not None and moved["tx_bytes"].per_s > 0
    assert moved["tx_bytes"].per_s != got["tx_bytes"].per_s


def _agent(face: SimTrayFace, clock: FakeClock, tmp_path: Path) -> TrayAgent:
    comp = face.rack.compute
    cfg = agent_config(Identity(), MqttSettings(), comp.n_trays, comp.gpus_per_tray,
                       epoch_file=tmp_path / "epochs.json", gpu_ports=face.gpu_ports())
    cfg = cfg.model_copy(update={"spool": type(cfg.spool).model_validate(
        {"directory": str(tmp_path / "spool")})})
    gpus, bmcs = face.sources()
    return TrayAgent(cfg, source=gpus, bmcs=bmcs, links=face.links(), clock=clock)


def test_a_flapped_port_goes_through_the_agent_and_racky_declares_it_flapping(
        tmp_path: Path) -> None:
    vr, face, clock = _rack()
    agent = _agent(face, clock, tmp_path)
    sent: list[tuple[str, dict[str, Any]]] = []
    agent.mqtt.publish_telemetry = (  # type: ignore[method-assign]
        lambda thing, payload, *a, **k: sent.append((thing, payload)))
    cfg = RackyConfig()
    ingest = TelemetryIngest(18, 4, tuple(cfg.links.counters))
    health: LinkHealth | None = None
    conditions: dict[str, set[str]] = {}
    seen: list[tuple[bool, int]] = []
    fab = vr.fabric
    assert fab is not None
    for k in range(40):
        if k == 10:  # as the demo's scenario: 3 downs of 2 s, 4 s apart
            fab.flap(fab.port_index(PORT), down_s=2.0, up_s=4.0, count=3)
        _step(vr, face, clock, 1.0)
        agent._cycle(agent._targets(list(agent.gpus)))
        agent._publish()
        now = clock.monotonic()
        for _thing, payload in sent:
            ingest.tray_payload(json.loads(json.dumps(payload)), now)
        if k >= 2:  # the agent's first rates need two samples
            assert len(sent) == 18
            tray1 = next(p for t, p in sent if t == "tray01")
            block = tray1["gpus"][3]["ports"]
            assert block is not None, "gpu07's ports not published"
            j = block["names"].index(PORT)
            assert block["nvlink"] == [True] * 18 + [False] * 2
            seen.append((block["link_up"][j], block["counters"]["link_downed"][j]))
        sent.clear()
        if ingest.frame is None:
            continue
        ingest.update_gpu_columns()
        if health is None:
            health = LinkHealth(cfg.links, cfg.traffic, ingest.frame)
        st = health.step(now, ingest.frame)
        for kind, things in st.conditions.items():
            for thing in things:
                conditions.setdefault(kind, set()).add(thing)
    assert ingest.errors == 0
    assert (False, 1) in seen and (False, 3) in seen  # published down, link-downs counted
    assert seen[-1] == (True, 3)
    assert conditions.get("link_flapping") == {PORT}
    others = {k: v for k, v in conditions.items() if k != "link_flapping"}
    assert not others or set().union(*others.values()) <= {PORT}
    assert np.asarray(ingest.frame.is_nvlink).sum() == 72 * 18  # type: ignore[union-attr]
