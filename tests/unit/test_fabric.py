"""sims.fabric: the rack link fabric (issue 3), its counters, faults and FIELD-CASES BR-11/BR-13."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pytest

import sims.fabric
from sims.fabric import (
    COUNTER_NAMES,
    COUNTERS,
    RATE_COUNTERS,
    FabricParams,
    LinkFabric,
)

NVL_SPEED_B = 53_125e6  # REFERENCE §1.1: 53,125 MB/s per NVLink 5 link
NIC_SPEED_B = 50_000e6


def _run(f: LinkFabric, seconds: float, demand: float | np.ndarray = 0.0, dt: float = 1.0) -> None:
    d = np.broadcast_to(np.asarray(demand, dtype=float), (f.gpus,))
    for _ in range(round(seconds / dt)):
        f.step(dt, d, f.time_s)


# --- layout ---------------------------------------------------------------------------------


def test_nvl72_layout_names_and_index() -> None:
    f = LinkFabric()
    assert f.n_ports == 1440 == len(f.port_names())
    assert int(f.is_nvlink.sum()) == 72 * 18
    assert f.port_index("gpu07/nvl03") == 7 * 20 + 3
    assert f.port_index("gpu07/nic1") == 7 * 20 + 19
    assert f.port_names()[7 * 20 + 19] == "gpu07/nic1"
    assert f.port_gpu[7 * 20 + 19] == 7
    assert list(f.ports_of_gpu(1)) == list(range(20, 40))
    with pytest.raises(ValueError, match="unknown port"):
        f.port_index("gpu72/nvl00")
    with pytest.raises(ValueError):
        LinkFabric(gpus=0)


def test_snapshot_shapes_and_native_counter_widths() -> None:
    f = LinkFabric(gpus=4)
    _run(f, 3, 0.5)
    snap = f.snapshot()
    widths = {c.name: (c.bits, c.overflow) for c in COUNTERS}
    assert widths == {
        "nvl_crc_flit_errors": (64, "wrap"), "nvl_crc_data_errors": (64, "wrap"),
        "nvl_replay_errors": (64, "wrap"), "nvl_recovery_errors": (64, "wrap"),
        "symbol_error": (16, "saturate"), "link_error_recovery": (8, "saturate"),
        "link_downed": (8, "saturate"), "port_rcv_errors": (16, "saturate"),
        "carrier_changes": (32, "wrap"), "rx_bytes": (64, "wrap"), "tx_bytes": (64, "wrap"),
    }
    for c in COUNTERS:
        assert snap[c.name].dtype == c.dtype and snap[c.name].shape == (80,)
        assert np.iinfo(c.dtype).bits == c.bits
    for key in ("link_up", "link_speed_mb_per_s", "tx_bytes_per_s", "rx_bytes_per_s", "ber",
                "is_nvlink", "port_gpu"):
        assert snap[key].shape == (80,)
    assert snap["uptime_s"].shape == (4,) and snap["boot_id"].shape == (4,)
    assert snap["link_speed_mb_per_s"][0] == 53_125.0
    # the snapshot is a copy: keeping it does not alias the fabric
    snap["rx_bytes"][:] = 0
    assert f.snapshot()["rx_bytes"].max() > 0


# --- counter semantics ----------------------------------------------------------------------


def test_narrow_counters_saturate_at_their_maximum() -> None:
    f = LinkFabric(gpus=1)
    nic = f.port_index("gpu00/nic0")
    f.set_counter(nic, "symbol_error", 65_530)
    f.set_counter(nic, "port_rcv_errors", 65_000)
    f.set_counter(nic, "link_error_recovery", 250)
    f.set_counter(nic, "link_downed", 254)
    f.set_error_rate(nic, "symbol_error", 100.0)
    f.set_error_rate(nic, "port_rcv_errors", 1_000.0)
    f.set_error_rate(nic, "link_error_recovery", 50.0)
    f.flap(nic, 0.1, 0.1, count=3, start_s=0.2)
    _run(f, 5)
    s = f.snapshot()
    assert int(s["symbol_error"][nic]) == 65_535
    assert int(s["port_rcv_errors"][nic]) == 65_535
    assert int(s["link_error_recovery"][nic]) == 255
    assert int(s["link_downed"][nic]) == 255
    _run(f, 5)  # stays at the top, never wraps back to small values
    assert int(f.snapshot()["symbol_error"][nic]) == 65_535


def test_wide_counters_wrap_modulo_their_width() -> None:
    f = LinkFabric(gpus=1, params=FabricParams(traffic_jitter=0.0))
    nic = f.port_index("gpu00/nic1")
    nvl = f.port_index("gpu00/nvl05")
    f.set_counter(nic, "carrier_changes", 2**32 - 2)
    f.flap(nic, 0.2, 0.2, count=2, start_s=0.1)  # 4 transitions
    f.set_counter(nvl, "rx_bytes", 2**64 - 1_000)
    f.set_counter(nvl, "nvl_replay_errors", 2**64 - 3)
    f.set_error_rate(nvl, "nvl_replay_errors", 50.0)
    _run(f, 1, demand=0.5)
    s = f.snapshot()
    assert int(s["carrier_changes"][nic]) == 2  # (2^32 − 2 + 4) mod 2^32
    moved = int(s["rx_bytes_per_s"][nvl] * 1.0)
    assert moved > 1_000
    assert abs(int(s["rx_bytes"][nvl]) - (2**64 - 1_000 + moved) % 2**64) <= 1
    replays = int(s["nvl_replay_errors"][nvl])
    assert replays < 200  # wrapped past 2^64 (50/s for 1 s from 2^64 − 3)


def test_set_counter_rejects_values_beyond_the_width_and_foreign_counters() -> None:
    f = LinkFabric(gpus=1)
    with pytest.raises(ValueError, match=r"0\.\.255"):
        f.set_counter("gpu00/nic0", "link_downed", 256)
    with pytest.raises(ValueError, match="not a counter of nvlink"):
        f.set_counter("gpu00/nvl00", "symbol_error", 1)
    with pytest.raises(ValueError, match="not a counter of nic"):
        f.set_error_rate("gpu00/nic0", "nvl_crc_flit_errors", 1.0)
    with pytest.raises(ValueError, match="has no error rate"):
        f.set_error_rate("gpu00/nic0", "link_downed", 1.0)


def test_reboot_resets_the_gpus_counters_uptime_and_boot_id() -> None:
    f = LinkFabric(gpus=3, seed=5)
    f.set_error_rate("gpu01/nic0", "symbol_error", 5.0)
    _run(f, 30, demand=0.7)
    before = f.snapshot()
    f.reboot(1)
    after = f.snapshot()
    ports = list(f.ports_of_gpu(1))
    others = [p for p in range(f.n_ports) if p not in ports]
    for name in COUNTER_NAMES:
        assert (after[name][ports] == 0).all(), name
        assert (after[name][others] == before[name][others]).all(), name
    assert np.isnan(after["ber"][ports]).all()  # no bits since the reset: unknown, not 0
    assert after["uptime_s"][1] == 0.0 and after["uptime_s"][0] == before["uptime_s"][0]
    assert after["boot_id"][1] != before["boot_id"][1]
    assert after["boot_id"][0] == before["boot_id"][0]
    _run(f, 10, demand=0.7)
    s = f.snapshot()
    assert s["uptime_s"][1] == pytest.approx(10.0)
    assert int(s["symbol_error"][f.port_index("gpu01/nic0")]) > 0  # the fault is physical
    rec = f.fault_log()[-1]
    assert (rec.kind, rec.target, rec.start_s, rec.end_s) == ("reboot", "gpu01", 30.0, 30.0)


def test_power_off_takes_the_gpus_links_down_and_power_on_boots_them() -> None:
    """The tray power-state hook: power_off takes every up port of the GPU down (one
    link_downed and one carrier change each, as the partner sees it), no traffic, no counts,
    uptime stopped; power_on reboots the GPU (counters 0, new boot id) and trains the links up
    (carrier_changes 1). Neither is a fault (not in fault_log); the other GPUs are untouched."""
    f = LinkFabric(gpus=3, seed=7)
    _run(f, 20, demand=0.8)
    before = f.snapshot()
    ports = list(f.ports_of_gpu(1))
    others = [p for p in range(f.n_ports) if p not in ports]
    n_faults = len(f.fault_log())
    f.power_off(1)
    f.power_off(1)  # already off: nothing more happens
    _run(f, 30, demand=0.8)
    off = f.snapshot()
    assert not off["link_up"][ports].any() and off["link_up"][others].all()
    assert (off["tx_bytes_per_s"][ports] == 0).all()
    assert (off["link_downed"][ports] == before["link_downed"][ports] + 1).all()
    assert (off["carrier_changes"][ports] == before["carrier_changes"][ports] + 1).all()
    assert off["uptime_s"][1] == before["uptime_s"][1]
    assert off["uptime_s"][0] == pytest.approx(before["uptime_s"][0] + 30.0)
    assert not f.powered[1] and f.powered[[0, 2]].all()
    f.power_on(1)
    _run(f, 5, demand=0.8)
    on = f.snapshot()
    assert on["link_up"][ports].all()
    assert (on["carrier_changes"][ports] == 1).all() and (on["link_downed"][ports] == 0).all()
    assert on["boot_id"][1] != before["boot_id"][1]
    assert on["uptime_s"][1] == pytest.approx(5.0)
    assert (on["tx_bytes_per_s"][ports] > 0).all()
    assert len(f.fault_log()) == n_faults
    with pytest.raises(ValueError):
        f.power_off(3)


# --- FIELD-CASES ----------------------------------------------------------------------------


def test_br11_counter_wrap_vs_reset() -> None:
    """BR-11's four feeds, produced by the fabric (10 s sample interval)."""
    # a) Counter32 4294967290 → 5 with uptime still increasing (and d: a first sample of 7)
    f = LinkFabric(gpus=1)
    p = f.port_index("gpu00/nic0")
    f.set_counter(p, "carrier_changes", 7)
    assert int(f.snapshot()["carrier_changes"][p]) == 7  # d) a first sample is just a value
    f.set_counter(p, "carrier_changes", 4_294_967_290)
    s0 = f.snapshot()
    f.flap(p, 0.4, 0.4, count=5, start_s=0.5)  # 10 transitions, over by 4.1 s
    _run(f, 5)
    f.hold_down(p, 100.0, start_s=5.5)  # the 11th
    _run(f, 5)
    s1 = f.snapshot()
    assert int(s0["carrier_changes"][p]) == 4_294_967_290
    assert int(s1["carrier_changes"][p]) == 5
    assert s1["uptime_s"][0] == s0["uptime_s"][0] + 10.0
    assert s1["boot_id"][0] == s0["boot_id"][0]

    # b) Counter32 3000000000 → 120 with uptime 864000 s → 40 s (a reboot)
    f = LinkFabric(gpus=1)
    p = f.port_index("gpu00/nic1")
    f.set_counter(p, "carrier_changes", 3_000_000_000)
    s0 = f.snapshot()
    _run(f, 10)
    f.reboot(0)
    f.flap(p, 0.1, 0.1, count=60, start_s=10.5)  # 120 transitions after the reboot
    _run(f, 40)
    s1 = f.snapshot()
    assert (int(s0["carrier_changes"][p]), s0["uptime_s"][0]) == (3_000_000_000, 864_000.0)
    assert (int(s1["carrier_changes"][p]), s1["uptime_s"][0]) == (120, 40.0)
    assert s1["boot_id"][0] != s0["boot_id"][0]

    # c) Counter64 rx_bytes 912345678901 → 12 with the uptime reset
    f = LinkFabric(gpus=1, params=FabricParams(traffic_jitter=0.0))
    p = f.port_index("gpu00/nic0")
    f.set_counter(p, "rx_bytes", 912_345_678_901)
    s0 = f.snapshot()
    f.reboot(0)
    f.step(1.0, np.array([12 / (0.5 * NIC_SPEED_B)]), 0.0)
    s1 = f.snapshot()
    assert int(s0["rx_bytes"][p]) == 912_345_678_901
    assert int(s1["rx_bytes"][p]) == 12
    assert s1["uptime_s"][0] < s0["uptime_s"][0]
    assert s1["boot_id"][0] != s0["boot_id"][0]


def test_br13_a_link_bouncing_every_poll() -> None:
    """13 polls 10 s apart read up, down, up, … (12 transitions); never two downs in a row."""
    f = LinkFabric(gpus=1)
    p = f.port_index("gpu00/nic1")
    f.flap(p, down_s=10.0, up_s=10.0, count=6, start_s=5.0)
    states, carrier = [], []
    for k in range(121):
        if k % 10 == 0:
            s = f.snapshot()
            states.append(bool(s["link_up"][p]))
            carrier.append(int(s["carrier_changes"][p]))
        f.step(1.0, np.zeros(1), float(k))
    assert states == [i % 2 == 0 for i in range(13)]
    assert sum(a != b for a, b in itertools.pairwise(states)) == 12
    assert not any(not a and not b for a, b in itertools.pairwise(states))
    assert np.diff(carrier).tolist() == [1] * 12
    assert int(f.snapshot()["link_downed"][p]) == 6


def test_br13_b_flaps_between_polls_seen_only_in_carrier_changes() -> None:
    """Both polls read up; carrier_changes goes 14 → 20 (3 DOWN/UP cycles, all sub-second)."""
    f = LinkFabric(gpus=1)
    p = f.port_index("gpu00/nic0")
    f.set_counter(p, "carrier_changes", 14)
    first = f.snapshot()
    f.flap(p, down_s=0.5, up_s=0.5, count=3, start_s=2.2)
    ups = []
    for k in range(10):  # even a 1 s poll never sees the link down
        f.step(1.0, np.zeros(1), float(k))
        ups.append(bool(f.snapshot()["link_up"][p]))
    second = f.snapshot()
    assert bool(first["link_up"][p]) and bool(second["link_up"][p]) and all(ups)
    assert (int(first["carrier_changes"][p]), int(second["carrier_changes"][p])) == (14, 20)
    assert int(second["link_downed"][p]) == 3


def test_s7_three_downs_in_eight_minutes_and_hold_down() -> None:
    f = LinkFabric(gpus=1)
    nvl = f.port_index("gpu00/nvl02")
    f.flap(nvl, down_s=5.0, up_s=155.0, count=3)  # downs at 0, 160, 320 s
    downs_at = []
    last = 0
    for k in range(480):
        f.step(1.0, np.full(1, 0.5), float(k))
        ld = int(f.snapshot()["link_downed"][nvl])
        if ld != last:
            downs_at.append(k)
            last = ld
    assert downs_at == [0, 160, 320]
    s = f.snapshot()
    assert int(s["nvl_recovery_errors"][nvl]) == 3  # each retrain of an NVLink
    nic = f.port_index("gpu00/nic0")
    f.hold_down(nic, 300.0)
    _run(f, 240, 0.5)
    s = f.snapshot()
    assert not s["link_up"][nic] and s["tx_bytes_per_s"][nic] == 0.0
    assert int(s["link_downed"][nic]) == 1
    _run(f, 61, 0.5)
    assert bool(f.snapshot()["link_up"][nic])
    log = [(r.kind, r.target, r.start_s, r.end_s) for r in f.fault_log()]
    assert log == [("flap", "gpu00/nvl02", 0.0, 325.0), ("hold_down", "gpu00/nic0", 480.0, 780.0)]


# --- traffic --------------------------------------------------------------------------------


def test_throughput_follows_demand_and_is_zero_when_down() -> None:
    f = LinkFabric(gpus=8, seed=2)
    demand = np.linspace(0.0, 1.0, 8)
    _run(f, 1, demand)
    s = f.snapshot()
    nvl, gpu = f.is_nvlink, f.port_gpu
    for g in range(8):
        got = s["tx_bytes_per_s"][nvl & (gpu == g)].mean()
        assert got == pytest.approx(demand[g] * NVL_SPEED_B, rel=0.02, abs=1.0)
        got = s["rx_bytes_per_s"][~nvl & (gpu == g)].mean()
        assert got == pytest.approx(demand[g] * 0.5 * NIC_SPEED_B, rel=0.05, abs=1.0)
    assert (s["tx_bytes_per_s"] <= np.where(nvl, NVL_SPEED_B, NIC_SPEED_B)).all()
    # bytes counters integrate the throughput
    rx0 = s["rx_bytes"].astype(float)
    _run(f, 10, demand)
    s = f.snapshot()
    grew = s["rx_bytes"].astype(float) - rx0
    assert grew[gpu == 7].sum() == pytest.approx(10 * 1.0 * (18 * NVL_SPEED_B + NIC_SPEED_B),
                                                 rel=0.01)
    # a port down for half the step carries half; a port down for the whole step nothing
    half, full = f.port_index("gpu07/nvl00"), f.port_index("gpu07/nvl01")
    f.hold_down(half, 0.5, start_s=f.time_s + 0.25)
    f.hold_down(full, 5.0)
    _run(f, 1, demand)
    s = f.snapshot()
    assert s["tx_bytes_per_s"][half] == pytest.approx(0.5 * NVL_SPEED_B, rel=0.1)
    assert s["tx_bytes_per_s"][full] == 0.0 and s["rx_bytes_per_s"][full] == 0.0
    assert s["link_speed_mb_per_s"][full] == 0.0 and not s["link_up"][full]


def test_stall_silence_and_burst_shape_the_traffic() -> None:
    f = LinkFabric(gpus=4, seed=1)
    f.stall(1, 5.0)
    f.silence("gpu02/nvl04")
    f.burst(3, 5.0, demand=1.0)
    _run(f, 2, 0.2)
    s = f.snapshot()
    gpu = f.port_gpu
    assert (s["tx_bytes_per_s"][gpu == 1] == 0.0).all() and s["link_up"][gpu == 1].all()
    assert s["tx_bytes_per_s"][f.port_index("gpu02/nvl04")] == 0.0
    assert s["tx_bytes_per_s"][f.port_index("gpu02/nvl05")] > 0.1 * NVL_SPEED_B
    assert s["tx_bytes_per_s"][(gpu == 3) & f.is_nvlink].mean() > 0.95 * NVL_SPEED_B
    _run(f, 5, 0.2)  # stall and burst over; silence holds
    s = f.snapshot()
    assert s["tx_bytes_per_s"][(gpu == 1) & f.is_nvlink].mean() == pytest.approx(
        0.2 * NVL_SPEED_B, rel=0.05)
    assert s["tx_bytes_per_s"][(gpu == 3) & f.is_nvlink].mean() == pytest.approx(
        0.2 * NVL_SPEED_B, rel=0.05)
    assert s["tx_bytes_per_s"][f.port_index("gpu02/nvl04")] == 0.0
    kinds = [(r.kind, r.target, r.end_s) for r in f.fault_log()]
    assert kinds == [("stall", "gpu01", 5.0), ("silence", "gpu02/nvl04", None),
                     ("burst", "gpu03", 5.0)]


# --- error rates ----------------------------------------------------------------------------


def test_healthy_pre_fec_rate_is_poisson_lambda0_and_zero_rate_counters_stay_zero() -> None:
    """REFERENCE §3.3: λ0 = 0.5/min on symbol / CRC-flit counters, Poisson (mean = variance);
    replay, recovery, link-downed etc. never move on a healthy link."""
    f = LinkFabric(seed=11)
    per_min: dict[str, list[np.ndarray]] = {"nvl_crc_flit_errors": [], "symbol_error": []}
    prev = f.snapshot()
    for _ in range(60):
        f.step(60.0, np.full(72, 0.5), f.time_s)
        cur = f.snapshot()
        for name in per_min:
            per_min[name].append(cur[name].astype(np.int64) - prev[name].astype(np.int64))
        prev = cur
    nvl = f.is_nvlink
    flit = np.array(per_min["nvl_crc_flit_errors"])[:, nvl].ravel()  # 77,760 link-minutes
    sym = np.array(per_min["symbol_error"])[:, ~nvl].ravel()  # 8,640 link-minutes
    for x, tol in ((flit, 0.02), (sym, 0.04)):
        assert x.mean() == pytest.approx(0.5, abs=tol)
        assert x.var() / x.mean() == pytest.approx(1.0, abs=0.08)
    assert (np.array(per_min["nvl_crc_flit_errors"])[:, ~nvl] == 0).all()  # not a NIC counter
    for name in ("nvl_crc_data_errors", "nvl_replay_errors", "nvl_recovery_errors",
                 "link_error_recovery", "link_downed", "port_rcv_errors", "carrier_changes"):
        assert (prev[name] == 0).all(), name
    ber = prev["ber"]  # ≈ 2e-14 (30 errors per port: compare the mean over 1,296 ports)
    assert ber[nvl].mean() == pytest.approx(0.5 / 60 / (NVL_SPEED_B * 8), rel=0.03)


def test_s8_ramps_follow_their_profile() -> None:
    """S8: 0.5 → 5/min over 24 h (rate checked through truth()) and the fast 0.5 → 10/min
    over 2 h (checked statistically on all 1,296 NVLink ports, minute by minute)."""
    f = LinkFabric(seed=4)
    slow = f.port_index("gpu00/nic0")
    f.ramp_error_rate(slow, "symbol_error", 0.5 / 60, 5 / 60, 86_400.0)
    nvl_ports = np.flatnonzero(f.is_nvlink)
    for p in nvl_ports:
        f.ramp_error_rate(int(p), "nvl_crc_flit_errors", 0.5 / 60, 10 / 60, 7_200.0)
    snap = f.snapshot()
    means = []
    for _ in range(150):
        f.step(60.0, np.zeros(72), f.time_s)
        cur = f.snapshot()
        d = cur["nvl_crc_flit_errors"][nvl_ports].astype(np.int64) - snap[
            "nvl_crc_flit_errors"][nvl_ports].astype(np.int64)
        means.append(d.mean())
        snap = cur
    minute_mid = np.arange(150) + 0.5
    expect = np.minimum(0.5 + 9.5 * minute_mid / 120.0, 10.0)
    assert np.abs(np.array(means) - expect).max() < 5 * np.sqrt(10.0 / len(nvl_ports))
    rate = f.truth()["symbol_error_rate_per_s"][slow] * 60
    assert rate == pytest.approx(0.5 + 4.5 * 9_000 / 86_400)
    for _ in range(90):  # to 24.5 h
        f.step(900.0, np.zeros(72), f.time_s)
    assert f.truth()["symbol_error_rate_per_s"][slow] * 60 == pytest.approx(5.0)
    rec = next(r for r in f.fault_log() if r.target == "gpu00/nic0")
    assert (rec.kind, rec.start_s, rec.end_s) == ("error_ramp", 0.0, None)
    assert rec.detail["ramp_end_s"] == 86_400.0


def test_degrade_ber_sets_pre_and_post_fec_rates() -> None:
    f = LinkFabric(gpus=1, seed=3)
    p = f.port_index("gpu00/nvl00")
    f.degrade_ber(p, 1e-11)
    _run(f, 600, 0.3, dt=10.0)
    s, t = f.snapshot(), f.truth()
    assert t["nvl_crc_flit_errors_rate_per_s"][p] == pytest.approx(1e-11 * NVL_SPEED_B * 8)
    assert t["nvl_crc_data_errors_rate_per_s"][p] == pytest.approx(1e-11 * NVL_SPEED_B * 8e-3)
    assert s["ber"][p] == pytest.approx(1e-11, rel=0.1)  # 2,550 errors expected
    # replacing the pre-FEC rate ends the BER fault as a whole: post-FEC back to healthy 0
    f.set_error_rate(p, "nvl_crc_flit_errors", 0.1)
    t = f.truth()
    assert t["nvl_crc_data_errors_rate_per_s"][p] == 0.0
    log = f.fault_log()
    assert (log[0].kind, log[0].end_s) == ("ber", 600.0)
    assert (log[1].kind, log[1].start_s, log[1].end_s) == ("error_rate", 600.0, None)
    f.restore_error_rate(p)
    assert f.truth()["nvl_crc_flit_errors_rate_per_s"][p] == pytest.approx(0.5 / 60)
    assert f.fault_log()[1].end_s == 600.0
    with pytest.raises(ValueError, match="ber"):
        f.degrade_ber(p, 0.1)


# --- properties -----------------------------------------------------------------------------


def _scripted(seed: int) -> list[dict[str, np.ndarray]]:
    f = LinkFabric(gpus=6, seed=seed)
    f.flap("gpu01/nic0", 0.3, 0.7, count=4, start_s=1.5)
    f.ramp_error_rate("gpu02/nvl07", "nvl_crc_flit_errors", 0.01, 1.0, 30.0)
    f.stall(3, 4.0)
    rng = np.random.default_rng(99)
    out = []
    for k in range(40):
        if k == 20:
            f.reboot(2)
        f.step(1.0, rng.random(6), float(k))
        out.append(f.snapshot())
    return out


def test_same_seed_same_trace_other_seed_differs() -> None:
    a, b, c = _scripted(8), _scripted(8), _scripted(9)
    for sa, sb in zip(a, b, strict=True):
        for key in sa:
            np.testing.assert_array_equal(sa[key], sb[key], err_msg=key)
    assert any(not np.array_equal(sa["tx_bytes"], sc["tx_bytes"]) for sa, sc in zip(a, c,
                                                                                    strict=True))


def _python_work(fn: Callable[[], None]) -> tuple[int, int]:
    """(Python + builtin calls, lines executed in the sims/fabric/ package) while running
    ``fn``."""
    calls = lines = 0
    fabric_files = {str(f) for f in Path(sims.fabric.__file__).parent.glob("*.py")}
    assert sys.modules[LinkFabric.__module__].__file__ in fabric_files  # step() is traced

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal lines
        if event == "line":
            lines += 1
        return local

    def prof(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename in fabric_files else None

    sys.setprofile(prof)
    sys.settrace(trace)
    try:
        fn()
    finally:
        sys.settrace(None)
        sys.setprofile(None)
    return calls, lines


def test_step_cost_does_not_grow_with_ports_no_python_loop() -> None:
    """The same faults on a 2-GPU and a 72-GPU fabric: step() makes exactly as many Python
    and builtin calls and executes as many lines of sims/fabric/ (all per-port work is
    inside numpy)."""
    counts = []
    for gpus in (2, 72):
        f = LinkFabric(gpus=gpus, seed=1)
        f.flap("gpu01/nic0", 0.2, 0.3, count=50)
        f.ramp_error_rate("gpu00/nvl01", "nvl_crc_flit_errors", 0.1, 1.0, 100.0)
        f.stall(1, 50.0)
        f.silence("gpu00/nvl03")
        d = np.full(gpus, 0.5)
        _run(f, 3, 0.5)
        counts.append(_python_work(partial(f.step, 1.0, d, f.time_s)))
    assert counts[0] == counts[1]
    assert counts[0][1] > 50  # the line tracer did see step()


def test_bad_inputs_raise_and_change_nothing() -> None:
    f = LinkFabric(gpus=2)
    before = f.snapshot()
    for bad in (np.zeros(3), np.full(2, 1.5), np.array([0.1, np.nan])):
        with pytest.raises(ValueError, match="traffic_demand"):
            f.step(1.0, bad, 0.0)
    with pytest.raises(ValueError, match="does not continue"):
        f.step(1.0, np.zeros(2), 5.0)
    with pytest.raises(ValueError, match="dt_s"):
        f.step(0.0, np.zeros(2), 0.0)
    with pytest.raises(ValueError, match="count"):
        f.flap(0, 1.0, 1.0, count=0)
    f.step(1.0, np.zeros(2), 0.0)
    with pytest.raises(ValueError, match="start_s"):
        f.flap(0, 1.0, 1.0, start_s=0.5)
    f.flap(0, 1.0, 1.0, count=2)
    with pytest.raises(ValueError, match="already has a flap"):
        f.hold_down(0, 10.0)
    with pytest.raises(ValueError, match="per_s"):
        f.set_error_rate(0, "nvl_crc_flit_errors", -1.0)
    with pytest.raises(ValueError, match="unknown counter"):
        f.set_error_rate(0, "crc", 1.0)
    with pytest.raises(ValueError, match="gpu"):
        f.reboot(2)
    assert len(f.fault_log()) == 1
    assert before["uptime_s"][0] + 1.0 == f.snapshot()["uptime_s"][0]
    assert set(RATE_COUNTERS) < set(COUNTER_NAMES)
    with pytest.raises(ValueError):
        FabricParams(healthy_rate_per_min={"link_downed": 1.0})
