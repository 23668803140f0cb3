"""sims.backend.MultiRack: healthy racks within the family's spread, each cross-rack fault in
its own rack / port readings only, counter widths and wraps, the contract shapes, phases,
load patterns, determinism, bad inputs."""

from __future__ import annotations

import numpy as np
import pytest

from rackplane.core.tray_contract import PortBlock, TrayTelemetry
from sims.backend import BackendParams, MultiRack, pattern_workloads
from sims.fabric import LinkFabric

SP = 50e9
LO, HI = BackendParams().healthy_fraction_range()


def _mr(seed: int = 1, pattern: str = "burn_in", n: int = 4,
        phase: str = "backend_only") -> MultiRack:
    mr = MultiRack(n, seed=seed, workloads=pattern_workloads(pattern, n, seed))  # type: ignore[arg-type]
    mr.set_phase(phase)  # type: ignore[arg-type]
    return mr


def _fractions(mr: MultiRack) -> list[float]:
    out = []
    for i in range(mr.n_racks):
        f = mr.rack_backend(i).fraction
        assert f is not None
        out.append(f)
    return out


def _window(mr: MultiRack, seconds: float) -> list[float]:
    """Achieved / expected backend bytes of each rack over the next ``seconds``."""
    a0 = [mr.rack_backend(i) for i in range(mr.n_racks)]
    mr.run(seconds, dt=1.0)
    a1 = [mr.rack_backend(i) for i in range(mr.n_racks)]
    return [(b.achieved_bytes - a.achieved_bytes) / (b.expected_bytes - a.expected_bytes)
            for a, b in zip(a0, a1, strict=True)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_healthy_racks_meet_their_expected_fraction_within_the_family_spread(seed: int) -> None:
    mr = _mr(seed)
    mr.run(3.0, dt=1.0)
    fr = _window(mr, 10.0)
    assert all(LO <= f <= HI for f in fr), (fr, LO, HI)
    effs = [d.nic_efficiency for d in mr.draws]
    assert len(set(effs)) == 4  # a family, not one tuned plant
    assert min(fr) < 0.995 * max(fr)  # and the racks really differ
    for i in range(4):
        assert mr.rack_backend(i).ports_down == 0


def test_below_saturation_healthy_racks_get_what_they_offer() -> None:
    mr = _mr(2, phase="nvlink")  # NICs carry half the traffic: below their capacity
    mr.run(3.0, dt=1.0)
    assert all(abs(f - 1.0) < 0.01 for f in _window(mr, 5.0))


def test_underperforming_nics_show_in_that_rack_only() -> None:
    mr = _mr(3)
    mr.run(2.0, dt=1.0)
    mr.underperform_nics(2, 0.6)
    mr.run(2.0, dt=1.0)
    fr = _window(mr, 10.0)
    assert 0.55 < fr[2] < 0.65
    assert all(LO <= fr[i] <= HI for i in (0, 1, 3)), fr
    ports = mr.backend_ports(2)
    assert all(s == 50_000.0 for s in ports["speed_mb_per_s"])  # nothing else looks wrong
    assert all(ports["link_up"])
    log = mr.fault_log()
    assert [(f.kind, f.rack, f.target, f.end_s) for f in log] == [
        ("nic_underperform", 2, "nics", None)]
    mr.underperform_nics(2, 1.0)
    assert mr.fault_log()[0].end_s == mr.time_s


def test_a_port_at_lower_speed_shows_on_that_port_only() -> None:
    mr = _mr(4)
    mr.run(2.0, dt=1.0)
    mr.degrade_link_speed(1, "gpu07/nic1", 25_000.0)
    fr = _window(mr, 5.0)
    for i in range(4):
        b = mr.backend_ports(i)
        tx = np.array(b["tx_bytes_per_s"])
        speed = np.array(b["speed_mb_per_s"])
        bad = np.array([i == 1 and n == "gpu07/nic1" for n in b["names"]])
        assert (speed[~bad] == 50_000.0).all() and (tx[~bad] > 0.75 * SP).all()  # jitter: 5 σ
        if bad.any():
            assert speed[bad][0] == 25_000.0 and 0.8 * 25e9 < tx[bad][0] <= 25e9
        assert mr.rack_backend(i).ports_below_speed == int(bad.any())
    assert all(LO <= f <= HI for f in fr), fr  # one port in 144: not a rack-level fault


def test_rising_symbol_errors_show_on_that_port_only() -> None:
    mr = _mr(5)
    mr.run(1.0, dt=1.0)
    before = [np.array(mr.backend_ports(i)["counters"]["symbol_error"]) for i in range(4)]
    mr.ramp_symbol_errors(0, "gpu03/nic0", 60.0, 600.0, 30.0)
    fr = _window(mr, 40.0)
    for i in range(4):
        b = mr.backend_ports(i)
        d = np.array(b["counters"]["symbol_error"]) - before[i]
        bad = np.array([i == 0 and n == "gpu03/nic0" for n in b["names"]])
        assert (d[~bad] <= 6).all()  # healthy: 0.3–0.7 /min
        if bad.any():
            assert d[bad][0] > 150  # ≈ 60 → 600 /min over 30 s, then 600 /min
        assert b["counter_bits"]["symbol_error"] == 16
    assert all(LO <= f <= HI for f in fr), fr  # FEC hides them: throughput stays


def test_a_flapping_port_shows_on_that_port_only() -> None:
    mr = _mr(6)
    mr.run(1.0, dt=1.0)
    mr.flap_link(3, "gpu10/nic0", 2.0, 3.0, count=3)
    seen_down = False
    for _ in range(20):
        mr.step(1.0)
        fr = _fractions(mr)
        assert all(LO <= fr[i] <= HI for i in (0, 1, 2)), fr
        b = mr.backend_ports(3)
        k = b["names"].index("gpu10/nic0")
        if not b["link_up"][k]:
            seen_down = True
            assert mr.rack_backend(3).ports_down == 1
    assert seen_down
    for i in range(4):
        c = mr.backend_ports(i)["counters"]
        names = mr.backend_ports(i)["names"]
        for n, ld, cc in zip(names, c["link_downed"], c["carrier_changes"], strict=True):
            if i == 3 and n == "gpu10/nic0":
                assert (ld, cc) == (3, 6)
            else:
                assert (ld, cc) == (0, 0)
    flap = mr.fault_log()[0]
    assert flap.kind == "flap" and flap.end_s == pytest.approx(13.0)  # 1 + 2 × 5 + 2


def test_a_congested_spine_bundle_shows_in_the_racks_behind_its_leaf() -> None:
    mr = _mr(7)
    mr.run(1.0, dt=1.0)
    mr.congest_spine(1, 3, 2, 0.2)  # rack 1 (racks_per_leaf 1), rail 3, spine 2
    fr = _window(mr, 6.0)
    assert fr[1] < LO - 0.05
    assert all(LO <= fr[i] <= HI for i in (0, 2, 3)), fr
    tx = np.array(mr.backend_ports(1)["tx_bytes_per_s"]).reshape(18, 8)
    assert (tx[:, 3] < 0.25 * SP).all() and (np.delete(tx, 3, axis=1) > 0.75 * SP).all()
    u = mr.spine_bundles()["utilisation"]
    assert np.allclose(u[:, 1, 3, 2], 1.0)
    rest = np.ones(u.shape, dtype=bool)
    rest[:, 1, 3, :] = False
    assert (u[rest] > 0.9).all() and (u[rest] < 0.98).all()
    assert mr.fault_log()[0].target == "leaf-p1-r3/spine2"


def test_port_counters_wrap_and_saturate_at_their_widths() -> None:
    mr = _mr(8)
    mr.run(1.0, dt=1.0)
    fab = mr.fabrics[0]
    top = 2**64 - 1000
    fab.set_counter("gpu00/nic0", "tx_bytes", top)
    fab.set_counter("gpu00/nic1", "carrier_changes", 2**32 - 1)
    fab.set_counter("gpu01/nic0", "symbol_error", 2**16 - 2)
    mr.flap_link(0, "gpu00/nic1", 0.5, 0.2, count=1)
    mr.ramp_symbol_errors(0, "gpu01/nic0", 600.0, 600.0, 1.0)
    mr.step(1.0)
    b = mr.backend_ports(0)
    c = b["counters"]
    tx = c["tx_bytes"][0]
    moved = (tx - top) % 2**64
    assert tx < 2**40  # wrapped at 2^64
    assert moved == pytest.approx(b["tx_bytes_per_s"][0], rel=1e-6, abs=2)
    assert c["carrier_changes"][1] == 1  # 2^32 − 1 + 2 wraps to 1
    assert c["symbol_error"][2] == 2**16 - 1  # saturates
    assert b["counter_bits"]["tx_bytes"] == 64 and b["counter_bits"]["carrier_changes"] == 32


def test_readings_have_the_tray_contract_shape() -> None:
    mr = _mr(9)
    mr.run(2.0, dt=1.0)
    block = PortBlock.model_validate(mr.backend_ports(0))
    assert len(block.names) == 144 and not any(block.nvlink)
    trays = mr.tray_payloads(1, 1_700_000_000_000_000_000)
    assert len(trays) == 18
    for thing, payload in trays:
        t = TrayTelemetry.model_validate(payload)
        assert thing == f"tray{t.tray:02d}" and t.rack == "rack2"
        for g in t.gpus:
            assert g.ports is not None and sum(not x for x in g.ports.nvlink) == 2


def test_backend_only_moves_the_collective_off_nvlink() -> None:
    mr = _mr(10, phase="nvlink")
    mr.run(2.0, dt=1.0)
    snap = mr.fabrics[0].snapshot()
    nvl = snap["is_nvlink"]
    assert snap["tx_bytes_per_s"][nvl].mean() > 0.9 * 53_125e6
    nic_before = snap["tx_bytes_per_s"][~nvl].mean()
    assert nic_before == pytest.approx(0.5 * SP, rel=0.03)  # nic_demand_share 0.5
    mr.set_phase("backend_only")
    mr.run(2.0, dt=1.0)
    snap = mr.fabrics[0].snapshot()
    assert (snap["tx_bytes_per_s"][nvl] == 0.0).all()
    assert snap["tx_bytes_per_s"][~nvl].mean() > 0.9 * SP
    assert mr.fabrics[0].fault_log() == []  # disabling NVLink is an operation, not a fault


def test_allreduce_bursts_are_synchronised_across_racks_and_agentic_ones_are_not() -> None:
    series: dict[str, np.ndarray] = {}
    for kind in ("allreduce", "agentic"):
        mr = _mr(11, pattern=kind)
        rows = []
        for _ in range(40):
            mr.step(0.5)
            rows.append([mr.rack_backend(i).achieved_bytes_per_s for i in range(4)])
        series[kind] = np.array(rows[4:])
    ar = series["allreduce"]
    assert ar.max() > 3.0 * ar.min()  # bursts
    assert np.corrcoef(ar.T).min() > 0.95  # together
    ag = series["agentic"]
    assert ag.std(axis=0).min() > 0.0
    assert np.corrcoef(ag.T).min() < 0.9  # racks of their own


def test_same_seed_same_readings_other_seed_other_plant() -> None:
    def run(seed: int) -> tuple[list[int], float]:
        mr = _mr(seed, pattern="agentic")
        mr.underperform_nics(1, 0.7)
        mr.flap_link(2, "gpu05/nic1", 1.0, 1.0, count=2)
        mr.run(6.0, dt=0.5)
        return mr.backend_ports(2)["counters"]["tx_bytes"], mr.draws[0].nic_efficiency

    a, b, c = run(12), run(12), run(13)
    assert a == b
    assert a[0] != c[0][0] and a[1] != c[1]


def test_lock_step_time_and_fabric_time_agree() -> None:
    mr = _mr(14)
    mr.run(3.0, dt=0.1)
    assert mr.time_s == pytest.approx(3.0)
    for vr, fab in zip(mr.racks, mr.fabrics, strict=True):
        assert vr.time_s == mr.time_s and fab.time_s == pytest.approx(mr.time_s)
    assert mr.rack_backend(0).time_s == pytest.approx(3.0)


def test_bad_arguments_raise() -> None:
    for n in (1, 9, 2.0):
        with pytest.raises(ValueError, match="n_racks"):
            MultiRack(n)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="workloads"):
        MultiRack(3, workloads=pattern_workloads("burn_in", 2))
    with pytest.raises(ValueError, match="load pattern"):
        pattern_workloads("bursty", 2)  # type: ignore[arg-type]
    mr = MultiRack(2)
    with pytest.raises(ValueError, match="NVLink"):
        mr.degrade_link_speed(0, "gpu00/nvl03", 1000.0)
    with pytest.raises(ValueError, match="rack"):
        mr.underperform_nics(2, 0.5)
    with pytest.raises(ValueError, match="fraction"):
        mr.underperform_nics(0, 0.0)
    with pytest.raises(ValueError, match="spine"):
        mr.congest_spine(0, 0, 4, 0.5)
    with pytest.raises(ValueError, match="phase"):
        mr.set_phase("nvl")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dt"):
        mr.step(2.0)
    assert mr.time_s == 0.0 and mr.fault_log() == []


def test_fabric_hooks_port_demand_and_link_speed() -> None:
    f = LinkFabric(gpus=2, seed=1)
    n = f.n_ports
    tx = np.full(n, np.nan)
    rx = np.full(n, np.nan)
    p = f.port_index("gpu01/nic0")
    tx[p], rx[p] = 0.25, 0.75
    f.set_port_demand(tx, rx)
    f.step(1.0, np.full(2, 0.5), 0.0)
    s = f.snapshot()
    assert s["tx_bytes_per_s"][p] == pytest.approx(0.25 * SP, rel=0.1)
    assert s["rx_bytes_per_s"][p] == pytest.approx(0.75 * SP, rel=0.1)
    q = f.port_index("gpu01/nic1")  # NaN: the GPU's demand × share (0.5 × 0.5)
    assert s["tx_bytes_per_s"][q] == pytest.approx(0.25 * SP, rel=0.1)
    f.stall(1, 5.0)
    f.step(1.0, np.full(2, 0.5), 1.0)
    assert f.snapshot()["tx_bytes_per_s"][p] == 0.0  # a stall still stops the port
    f.set_link_speed(q, 25_000.0)
    assert f.link_speed_mb_per_s[q] == 25_000.0 and f.snapshot()["link_speed_mb_per_s"][q] == 25e3
    with pytest.raises(ValueError, match="nominal"):
        f.set_link_speed(q, 60_000.0)
    with pytest.raises(ValueError, match="within"):
        f.set_port_demand(np.full(n, 1.5), rx)
    with pytest.raises(ValueError, match="shape"):
        f.set_port_demand(np.zeros(3), np.zeros(3))
    f.restore_link_speed(q)
    assert f.link_speed_mb_per_s[q] == 50_000.0
    speed = [r for r in f.fault_log() if r.kind == "speed"]
    assert len(speed) == 1 and speed[0].end_s == f.time_s
