"""The tray agent's simulated source (`harness.simagent`) over a virtual rack, and the
contract 1.2 health fields (ECC totals, Xid events) from the agent's payload to racky's
decoder; the cap book's tray cap net of the non-GPU power."""

from __future__ import annotations

import json

import numpy as np
import pytest

from harness.simagent import SimTrayFace, phase_delay_s
from rackplane.clock import FakeClock
from rackplane.core.tray_contract import SCHEMA_VERSION, decode_tray
from racky.config import RackyConfig
from racky.core.telemetry import TelemetryIngest
from sims.row import VirtualRack
from sims.workloads import BurnInWorkload
from trayagent.core.caps import CapBook, DeviceLimits, TrayCaps
from trayagent.core.payload import GpuReading, TrayInfo, XidCount, tray_payload
from trayagent.sources import SourceError


def _face(delay_s: float = 0.3) -> tuple[VirtualRack, SimTrayFace, FakeClock]:
    vr = VirtualRack(workload=BurnInWorkload(), seed=1, fabric="off")
    clock = FakeClock()
    face = SimTrayFace(vr, limit_delay_s=delay_s, clock=clock)
    return vr, face, clock


def _step(vr: VirtualRack, face: SimTrayFace, clock: FakeClock, s: float) -> None:
    for _ in range(round(s / 0.1)):
        vr.step(0.1)
        clock.advance(0.1)
        face.on_step(vr, clock.monotonic())


def test_a_limit_applies_after_its_delay_and_only_the_read_back_shows_it() -> None:
    vr, face, clock = _face()
    gpus, bmcs = face.sources()
    with pytest.raises(SourceError):
        gpus.open()  # nothing to read before the first step
    _step(vr, face, clock, 2.0)
    assert gpus.open() == 72
    before = gpus.read(5, 5)
    assert before.power_w is not None and before.power_w > 700.0  # burn-in: near TGP
    assert before.limit_w == before.limits.max_w == before.limits.default_w
    gpus.set_limit(5, 600.0)
    _step(vr, face, clock, 0.2)
    assert gpus.read(5, 5).limit_w == before.limit_w  # not yet applied
    _step(vr, face, clock, 0.3)
    r = gpus.read(5, 5)
    assert r.limit_w == 600.0
    assert r.power_w is not None and r.power_w <= 600.0 + 1e-6
    assert r.reasons[:1] == ["sw_power_cap"]  # the limit holds it below its demand
    assert "sw_power_cap" not in gpus.read(4, 4).reasons
    assert r.t_limit_c is not None and r.temp_c is not None and r.energy_mj is not None
    e0 = r.energy_mj
    _step(vr, face, clock, 1.0)
    e1 = gpus.read(5, 5).energy_mj
    assert e1 is not None and 500_000 <= e1 - e0 <= 600_000 + 1  # ~600 W for 1 s, in mJ
    b = bmcs[1].read(clock.monotonic())
    tr = vr.truth()
    assert b.power_w == pytest.approx(float(tr.tray_power_w[1]))
    assert b.leak is not None and not b.leak.leak


@pytest.mark.parametrize("watts", [50.0, 5000.0, float("nan")])
def test_a_limit_outside_the_devices_range_is_refused_as_nvml_refuses_it(watts: float) -> None:
    vr, face, clock = _face()
    gpus, _ = face.sources()
    _step(vr, face, clock, 0.2)
    with pytest.raises(SourceError, match="Invalid Argument"):
        gpus.set_limit(0, watts)
    with pytest.raises(SourceError, match="no GPU"):
        gpus.set_limit(72, 600.0)


def test_the_sims_hardware_limit_bounds_the_gpu_whatever_the_agent_settings() -> None:
    vr = VirtualRack(workload=BurnInWorkload(), seed=1, fabric="off")
    vr.agents.set_gpu_power_limit(3, 400.0)
    for _ in range(20):
        vr.step(0.1)
    p = vr.truth().gpu_power_w
    assert p[3] <= 400.0 + 1e-6 and p[2] > 400.0
    assert vr.agents.gpu_power_limit_w[3] == 400.0
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError):
            vr.agents.set_gpu_power_limit(3, bad)
    with pytest.raises(ValueError):
        vr.agents.set_gpu_power_limit(72, 500.0)


def test_a_tray_cap_leaves_the_non_gpu_power_its_share_first() -> None:
    b = CapBook({0: 4}, 700.0)
    b.apply([0], 1, power_cap_w=4000.0, ttl_s=60.0, now=0.0)
    lim = DeviceLimits(200.0, 1200.0, 1200.0)
    assert [t.watts for t in b.targets(0, [lim] * 4, 800.0)] == [800.0] * 4
    assert [t.watts for t in b.targets(0, [lim] * 4)] == [1000.0] * 4
    for bad in (float("nan"), -50.0):  # not a figure: none taken off
        assert [t.watts for t in b.targets(0, [lim] * 4, bad)] == [1000.0] * 4
    t = b.targets(0, [lim], 3900.0)[0]  # nothing left: the device minimum, said so
    assert t.watts == 200.0 and t.clamped is not None


# --- contract 1.2: ECC totals and Xid events ---------------------------------------------------

def _payload(xids: dict[int, XidCount] | None, ecc: tuple[int | None, int | None]
             ) -> dict[str, object]:
    gpus = [GpuReading(gpu=g, power_w=500.0, limit_w=1000.0, ecc_corrected_volatile=ecc[0],
                       ecc_uncorrected_volatile=ecc[1]) for g in range(8, 12)]
    return tray_payload(TrayInfo("s", "r", "k", 2, 300.0, 40.0), gpus, TrayCaps(4), ts_ns=1,
                        cap_expires_in_s=None, xids=xids)


def test_ecc_and_xids_reach_racky_and_older_messages_still_read() -> None:
    xids = {9: XidCount(20, list(range(40, 60)))}
    p = _payload(xids, (7, 2**64))  # an impossible count is not sent
    assert p["schema_version"] == SCHEMA_VERSION == "1.3"
    g = p["gpus"]
    assert isinstance(g, list)
    assert (g[0]["ecc_corrected_volatile"], g[0]["ecc_uncorrected_volatile"]) == (7, None)
    assert (g[0]["xid_total"], g[0]["xids"]) == (None, None)  # GPU 8: no Xid source
    assert g[1]["xid_total"] == 20 and g[1]["xids"] == list(range(44, 60))  # the newest 16
    cfg = RackyConfig()
    ing = TelemetryIngest(cfg.node_agents.trays, cfg.node_agents.gpus_per_tray,
                          tuple(cfg.links.counters))
    raw = json.dumps(p).encode()
    got = decode_tray(raw)
    assert got.ignored == frozenset() and got.struct.gpus[1].xids == list(range(44, 60))
    ing.tray_payload(got, 1.0)
    assert ing.errors == 0 and 2 in ing.trays
    # a 1.1 agent (no health fields) and a 1.0 one are read as before
    for version in ("1.1", "1.0"):
        old = json.loads(raw)
        old["schema_version"] = version
        old["ts_ns"] += 1 if version == "1.1" else 2
        for gp in old["gpus"]:
            for k in ("ecc_corrected_volatile", "ecc_uncorrected_volatile", "xid_total",
                      "xids"):
                del gp[k]
        d = decode_tray(json.dumps(old).encode())
        assert d.ignored == frozenset() and d.struct.gpus[0].xid_total is None
        ing.tray_payload(d, 2.0)
    assert ing.errors == 0
    # a newer minor with its own fields: accepted, the unknown ones named
    newer = json.loads(raw)
    newer["schema_version"] = "1.4"
    newer["gpus"][0]["xid_names"] = ["GSP timeout"]
    assert decode_tray(json.dumps(newer).encode()).ignored == frozenset({"gpus[].xid_names"})


def test_a_negative_or_wrapped_xid_total_is_never_published() -> None:
    p = _payload({8: XidCount(-1, [79])}, (None, None))
    g = p["gpus"]
    assert isinstance(g, list) and g[0]["xid_total"] is None and g[0]["xids"] == [79]
    assert np.all([gp["ecc_corrected_volatile"] is None for gp in g])


@pytest.mark.parametrize(("phase", "now", "want"), [
    (0.0, 100.0, 0.0), (0.25, 100.0, 0.25), (0.25, 100.5, 0.75), (0.875, 7.9, 0.975),
])
def test_the_agent_waits_for_its_phase_of_the_period(phase: float, now: float,
                                                     want: float) -> None:
    assert phase_delay_s(phase, 1.0, now) == pytest.approx(want)
    assert (now + phase_delay_s(phase, 2.0, now)) % 2.0 == pytest.approx(2.0 * phase)


@pytest.mark.parametrize(("phase", "period_s"), [(1.0, 1.0), (-0.1, 1.0), (float("nan"), 1.0),
                                                 (0.5, 0.0), (0.5, float("inf"))])
def test_a_phase_outside_a_period_is_refused(phase: float, period_s: float) -> None:
    with pytest.raises(ValueError):
        phase_delay_s(phase, period_s, 3.0)
