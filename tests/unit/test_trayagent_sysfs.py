"""tray-agent's sysfs link source on trees laid out as the kernel does (class/infiniband and
class/net entries are symlinks into devices/), in a temporary folder: widths and units the
kernel documents, 32-bit fallbacks that saturate, files that read N/A or fail to read, counter
resets on a driver reload; rates unknown (never 0) when a counter cannot vouch."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from trayagent.sysfs import LinkRates, SysfsLinks

PCI = "devices/pci0000:00/0000:00:01.0/0000:01:00.0"


def _ib(root: Path, counters: dict[str, str], hw: dict[str, str] | None = None,
        state: str = "4: ACTIVE", rate: str = "400 Gb/sec (4X NDR)") -> Path:
    dev = root / PCI / "infiniband" / "mlx5_0"
    port = dev / "ports" / "1"
    (port / "counters").mkdir(parents=True, exist_ok=True)
    (port / "hw_counters").mkdir(exist_ok=True)
    (port / "state").write_text(state + "\n")
    (port / "rate").write_text(rate + "\n")
    for k, v in counters.items():
        (port / "counters" / k).write_text(v + "\n")
    for k, v in (hw or {}).items():
        (port / "hw_counters" / k).write_text(v + "\n")
    link = root / "class" / "infiniband" / "mlx5_0"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path("../..") / PCI / "infiniband" / "mlx5_0")
    return dev


def _net(root: Path, name: str, stats: dict[str, str], operstate: str = "up",
         speed: str | None = "100000", carrier_changes: str = "3") -> Path:
    dev = root / PCI / "net" / name
    (dev / "statistics").mkdir(parents=True, exist_ok=True)
    (dev / "operstate").write_text(operstate + "\n")
    if speed is None:
        (dev / "speed").mkdir(exist_ok=True)  # a read that fails (EISDIR stands in for EINVAL)
    else:
        (dev / "speed").write_text(speed + "\n")
    (dev / "carrier_changes").write_text(carrier_changes + "\n")
    for k, v in stats.items():
        (dev / "statistics" / k).write_text(v + "\n")
    link = root / "class" / "net" / name
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path("../..") / PCI / "net" / name)
    return dev


def test_discovery_lists_rdma_ports_and_interfaces_but_not_lo(tmp_path: Path) -> None:
    _ib(tmp_path, {"symbol_error": "0"})
    _net(tmp_path, "eth0", {"rx_bytes": "0"})
    _net(tmp_path, "lo", {"rx_bytes": "0"})
    assert SysfsLinks(tmp_path).discover() == ["mlx5_0/1", "eth0"]
    assert SysfsLinks(tmp_path / "nothing").discover() == []


def test_ib_data_counts_4_octet_words_and_error_counters_have_their_iba_widths(
        tmp_path: Path) -> None:
    _ib(tmp_path, {"port_xmit_data": "1000", "port_rcv_data": "10", "symbol_error": "7",
                   "link_downed": "1", "VL15_dropped": "N/A"},
        hw={"out_of_buffer": "5", "lifespan": "10"})
    links, rates = SysfsLinks(tmp_path), LinkRates(1e12)
    r = links.read("mlx5_0/1", 0.0)
    assert (r.link_up, r.speed_mb_per_s) == (True, 50000.0)
    assert (r.specs["symbol_error"].bits, r.specs["link_downed"].bits) == (16, 8)
    assert r.specs["port_xmit_data"].bits == 64 and r.specs["port_xmit_data"].scale == 4.0
    assert r.specs["hw:out_of_buffer"].bits == 64 and "hw:lifespan" not in r.counters
    assert r.counters["VL15_dropped"] is None
    assert r.errors["VL15_dropped"] == "not a count: 'N/A'"
    assert all(x.per_s is None for x in rates.update(r).values())  # a first reading
    _ib(tmp_path, {"port_xmit_data": "3000", "port_rcv_data": "10", "symbol_error": "9",
                   "link_downed": "1"}, hw={"out_of_buffer": "5"})
    got = rates.update(links.read("mlx5_0/1", 2.0))
    assert got["port_xmit_data"].per_s == 4000.0  # (3000 - 1000) words × 4 B / 2 s
    assert (got["port_rcv_data"].per_s, got["symbol_error"].per_s) == (0.0, 1.0)
    assert got["VL15_dropped"] == (None, "missing")  # N/A never becomes 0


def test_a_32_bit_fallback_saturates_and_its_rate_is_unknown(tmp_path: Path) -> None:
    top = str(2**32 - 1)
    _ib(tmp_path, {"port_xmit_data": str(2**32 - 100), "symbol_error": str(2**16 - 1)})
    links, rates = SysfsLinks(tmp_path, ib_extended_counters=False), LinkRates(1e12)
    rates.update(links.read("mlx5_0/1", 0.0))
    _ib(tmp_path, {"port_xmit_data": top, "symbol_error": str(2**16 - 1)})
    r = links.read("mlx5_0/1", 1.0)
    assert r.specs["port_xmit_data"].bits == 32 and r.specs["port_xmit_data"].saturates
    got = rates.update(r)
    assert got["port_xmit_data"] == (None, "saturated")
    assert got["symbol_error"] == (None, "saturated")
    _ib(tmp_path, {"port_xmit_data": str(2**32)})  # wider than its width: not believed
    r = links.read("mlx5_0/1", 2.0)
    assert r.counters["port_xmit_data"] is None and "beyond the counter's 32 bits" in \
        r.errors["port_xmit_data"]


def test_a_driver_reload_reads_unknown_then_reset_then_known_again(tmp_path: Path) -> None:
    dev = _ib(tmp_path, {"port_rcv_data": "5000000", "link_downed": "3"},
              hw={"out_of_buffer": "900"})
    links, rates = SysfsLinks(tmp_path), LinkRates(1e9)
    rates.update(links.read("mlx5_0/1", 0.0))
    shutil.rmtree(dev)  # the driver unloads: the device's folder is gone
    gone = links.read("mlx5_0/1", 1.0)
    assert gone.errors["port"].startswith("no such port") and gone.link_up is None
    rates.update(gone)
    _ib(tmp_path, {"port_rcv_data": "100", "link_downed": "0"}, hw={"out_of_buffer": "0"})
    back = links.read("mlx5_0/1", 2.0)
    got = rates.update(back)
    assert all(x.per_s is None for x in got.values())  # the previous reading had nothing
    rates.last["mlx5_0/1"] = links.read("mlx5_0/1", 1.5)  # as if read just before a restart
    rates.last["mlx5_0/1"].counters.update({"port_rcv_data": 5000000, "link_downed": 3,
                                            "hw:out_of_buffer": 900})
    got = rates.update(back)
    assert got["port_rcv_data"] == (None, "reset")  # 64-bit: a wrap in 0.5 s is implausible
    assert got["link_downed"] == (None, "reset")  # saturating: it never wraps
    assert got["hw:out_of_buffer"] == (None, "reset")
    _ib(tmp_path, {"port_rcv_data": "300", "link_downed": "0"}, hw={"out_of_buffer": "1"})
    got = rates.update(links.read("mlx5_0/1", 3.0))
    assert (got["port_rcv_data"].per_s, got["hw:out_of_buffer"].per_s) == (800.0, 1.0)


def test_a_down_ib_port_has_speed_0_and_an_unparsable_rate_is_unknown(tmp_path: Path) -> None:
    _ib(tmp_path, {"symbol_error": "0"}, state="1: DOWN")
    r = SysfsLinks(tmp_path).read("mlx5_0/1", 0.0)
    assert (r.link_up, r.speed_mb_per_s) == (False, 0.0)
    _ib(tmp_path, {"symbol_error": "0"}, rate="N/A")
    r = SysfsLinks(tmp_path).read("mlx5_0/1", 0.0)
    assert r.speed_mb_per_s is None and "not a rate" in r.errors["rate"]


def test_net_statistics_are_64_bit_carrier_changes_32_bit_and_wrap(tmp_path: Path) -> None:
    _net(tmp_path, "eth0", {"rx_bytes": "100", "tx_bytes": str(2**64 - 10)},
         carrier_changes=str(2**32 - 2))
    links, rates = SysfsLinks(tmp_path), LinkRates(1e12)
    r = links.read("eth0", 0.0)
    assert (r.link_up, r.speed_mb_per_s) == (True, 12500.0)
    assert (r.specs["rx_bytes"].bits, r.specs["carrier_changes"].bits) == (64, 32)
    rates.update(r)
    _net(tmp_path, "eth0", {"rx_bytes": "1100", "tx_bytes": "90"}, carrier_changes="1")
    got = rates.update(links.read("eth0", 1.0))
    assert (got["rx_bytes"].per_s, got["tx_bytes"].per_s) == (1000.0, 100.0)  # 64-bit wrap
    assert got["carrier_changes"].per_s == 3.0  # 32-bit wrap


@pytest.mark.parametrize(("operstate", "speed", "want_speed", "err"), [
    ("down", "-1", 0.0, None),
    ("up", None, None, "Is a directory"),  # the read fails (as EINVAL does on a real NIC)
    ("up", "-1", None, "not a speed"),
])
def test_net_speed_unknown_or_zero_while_down(tmp_path: Path, operstate: str,
                                               speed: str | None, want_speed: float | None,
                                               err: str | None) -> None:
    _net(tmp_path, "eth1", {"rx_bytes": "1"}, operstate=operstate, speed=speed)
    r = SysfsLinks(tmp_path).read("eth1", 0.0)
    assert r.speed_mb_per_s == want_speed
    assert (err is None) == ("speed" not in r.errors)
    if err:
        assert err in r.errors["speed"]


def test_unreadable_and_vanished_counters_are_unknown_with_the_reason(tmp_path: Path) -> None:
    dev = _net(tmp_path, "eth2", {"rx_bytes": "", "rx_errors": "12abc", "tx_bytes": "-5"})
    (dev / "statistics" / "rx_dropped").mkdir()  # not a file: skipped, not a count
    r = SysfsLinks(tmp_path).read("eth2", 0.0)
    assert r.counters["rx_bytes"] is None and r.errors["rx_bytes"] == "not a count: ''"
    assert r.counters["rx_errors"] is None and r.counters["tx_bytes"] is None
    assert "rx_dropped" not in r.counters
    assert SysfsLinks(tmp_path).read("eth9", 0.0).errors == {"port": "no such interface"}


def test_dry_connect_prints_every_port_counter_width_and_rate(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from trayagent.cli import dry_connect
    from trayagent.config import TrayAgentConfig

    _ib(tmp_path, {"symbol_error": "4", "VL15_dropped": "N/A"})
    _net(tmp_path, "eth0", {"rx_bytes": "5"})
    cfg = TrayAgentConfig.model_validate({"nvml": {"enabled": False},
                                          "sysfs": {"enabled": True, "root": str(tmp_path)}})
    buf = io.StringIO()
    assert dry_connect(cfg, Console(file=buf, width=400)) == 0
    out = buf.getvalue()
    assert "sysfs: 2 ports" in out and "port mlx5_0/1 (ib): link_up=True" in out
    assert "port mlx5_0/1: symbol_error=4 (16 bits, saturates, x1) rate 0/s" in out
    assert "port mlx5_0/1: VL15_dropped=None (16 bits, saturates, x1) rate unknown " \
        "(missing)" in out
    assert "port mlx5_0/1: VL15_dropped: not a count: 'N/A'" in out
    assert "port eth0: rx_bytes=5 (64 bits, wraps, x1)" in out
    missing = cfg.model_copy(update={"sysfs": cfg.sysfs.model_copy(
        update={"ports": ["mlx5_9/1"]})})
    assert dry_connect(missing, Console(file=io.StringIO())) == 1


def test_the_real_sysfs_of_this_machine_reads_without_raising() -> None:
    links, rates = SysfsLinks(Path("/sys")), LinkRates(1e12)
    for name in links.discover():
        r = links.read(name, 0.0)
        rates.update(r)
        assert all(v is None or v >= 0 for v in r.counters.values())


# --- the contract's port blocks ------------------------------------------------------------------

def _two_ports(root: Path, step: int, ports: tuple[str, ...] = ("1", "2")) -> None:
    """RoCE ports mlx5_0/1 and mlx5_0/2 (one HCA's two ports) with their Ethernet devices
    ens1f0 and ens1f1 (gid_attrs/ndevs/0), counters advancing with ``step``."""
    for port in ports:
        ndev = f"ens1f{int(port) - 1}"
        base = root / PCI / "infiniband" / "mlx5_0" / "ports" / port
        (base / "counters").mkdir(parents=True, exist_ok=True)
        (base / "gid_attrs" / "ndevs").mkdir(parents=True, exist_ok=True)
        (base / "gid_attrs" / "ndevs" / "0").write_text(ndev + "\n")
        (base / "gid_attrs" / "ndevs" / "1").mkdir(exist_ok=True)  # reads fail: EINVAL-like
        _net(root, ndev, {"rx_bytes": str(2000 * step), "tx_bytes": str(4000 * step)},
             carrier_changes="4")
        (base / "state").write_text("4: ACTIVE\n")
        (base / "rate").write_text("400 Gb/sec (4X NDR)\n")
        vals = {"symbol_error": 2 + step, "link_downed": 1, "port_rcv_errors": 0,
                "link_error_recovery": 0, "local_link_integrity_errors": 3,
                "port_xmit_data": 1000 * step, "port_rcv_data": 500 * step}
        for k, v in vals.items():
            (base / "counters" / k).write_text(f"{v}\n")
    link = root / "class" / "infiniband" / "mlx5_0"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path("../..") / PCI / "infiniband" / "mlx5_0")


def test_port_blocks_racky_accepts_and_unknown_rates_publish_no_block(tmp_path: Path) -> None:
    import json
    import time

    from racky.config import RackyConfig
    from racky.core.controller import RackyCore
    from racky.core.lifecycle import Lifecycle, PersistedState
    from racky.tick import RackyTick
    from trayagent.core.caps import CapBook, DeviceLimits
    from trayagent.core.payload import GpuReading, TrayInfo, tray_payload
    from trayagent.core.ports import port_block

    _two_ports(tmp_path, 1)
    links, rates = SysfsLinks(tmp_path), LinkRates(1e12)
    first = [links.read(n, 0.0) for n in ("mlx5_0/1", "mlx5_0/2")]
    r1 = [rates.update(r) for r in first]
    block, why = port_block(0, first, r1)
    assert block is None and why == "mlx5_0/1: port_xmit_data rate unknown (missing)"
    _two_ports(tmp_path, 3)
    second = [links.read(n, 2.0) for n in ("mlx5_0/1", "mlx5_0/2")]
    r2 = [rates.update(r) for r in second]
    block, why = port_block(0, second, r2)
    assert why == "" and block is not None
    assert block["names"] == ["gpu0/mlx5_0/1", "gpu0/mlx5_0/2"]
    assert block["tx_bytes_per_s"] == [4000.0, 4000.0]  # 2000 words × 4 B / 2 s
    assert block["speed_mb_per_s"] == [50000.0, 50000.0]
    assert "local_link_integrity_errors" not in block["counters"]  # 4 bits: not a contract width
    assert block["counter_bits"]["symbol_error"] == 16
    assert block["counters"]["symbol_error"] == [5, 5]
    assert block["counters"]["carrier_changes"] == [4, 4]  # from the RoCE port's netdev
    assert block["counter_bits"]["carrier_changes"] == 32

    gpus = [GpuReading(gpu=g, power_w=500.0, limit_w=700.0,
                       limits=DeviceLimits(200.0, 1200.0, 1000.0)) for g in range(4)]
    p = tray_payload(TrayInfo("lab", "row1", "rack01", 0, 0.0, 45.0), gpus,
                     CapBook({0: 4}, 700.0).trays[0], ts_ns=time.time_ns(),
                     cap_expires_in_s=None,
                     ports={g: port_block(g, second, r2)[0] for g in range(4)})
    cfg = RackyConfig.model_validate({
        "identity": {"site": "lab", "row": "row1", "rack": "rack01"},
        "node_agents": {"daemon": "trays"},
        "links": {"counters": {"symbol_error": "16/saturate", "link_downed": "8/saturate",
                               "port_rcv_errors": "16/saturate",
                               "link_error_recovery": "8/saturate",
                               "carrier_changes": "32/wrap"},
                  "zero_rate_counters": ["link_downed"], "pre_fec_nvlink": "symbol_error",
                  "pre_fec_nic": "symbol_error",
                  "counter_max_rate_per_s": {"link_downed": 100.0}}})
    ps = PersistedState(Lifecycle(cfg.lifecycle.initial_state, time.time_ns(), "new", "t"))
    racky = RackyTick(cfg, RackyCore(cfg, 0.0, ps), 0.0)
    racky.message("rackplane/lab/rack01/trays/telemetry/tray00", json.dumps(p).encode(),
                  retain=False, received_mono=1.0, wall_ns=time.time_ns())
    assert (racky.ingest.errors, racky.ingest.stale_messages) == (0, 0), racky.payload_problems

    (tmp_path / PCI / "infiniband" / "mlx5_0" / "ports" / "2" / "counters" /
     "symbol_error").write_text("N/A\n")
    third = [links.read(n, 3.0) for n in ("mlx5_0/1", "mlx5_0/2")]
    block, why = port_block(0, third, [rates.update(r) for r in third], ["symbol_error"])
    assert block is None and why == "mlx5_0/2: symbol_error unknown (not a count: 'N/A')"
    block, why = port_block(0, third, [rates.update(r) for r in third], ["nvl_replay_errors"])
    assert block is None and "nvl_replay_errors: not on every port" in why
