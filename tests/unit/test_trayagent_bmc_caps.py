"""Capping a tray at its BMC: DMTF's ``Control`` (the liquid-cooled server mockup's chassis
``PowerLimit``: SetPoint 500 W, AllowableMin 150 W, AllowableMax 1000 W) written through DMTF's
Redfish client with ETag / If-Match on a service that answers 412 when another client wrote it
first, and proven only by the read-back; clamped into the control's range and said so; one
session per BMC kept through timeouts and cap sets (no session leaked at the BMC's limit)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.standin.redfish_server import RedfishServer
from trayagent.core.bmc import ControlResult, clamp_setpoint, control_range
from trayagent.core.caps import CapBook
from trayagent.redfish import BmcSource

CTL = "/redfish/v1/Chassis/1U/Controls/PowerLimit"


@pytest.fixture
def bmc() -> Iterator[RedfishServer]:
    s = RedfishServer(max_sessions=2)
    yield s
    s.close()


def _src(s: RedfishServer, timeout_s: float = 2.0, power_control: str | None = None
         ) -> BmcSource:
    return BmcSource(s.url, "1U", "admin", "secret", timeout_s, power_control=power_control)


def _hold(src: BmcSource, w: float | None, attempts: int = 3,
          dry_run: bool = False) -> ControlResult:
    return src.hold_power_limit(w, tolerance_w=1.0, attempts=attempts, mono=0.0,
                                dry_run=dry_run)


def test_range_and_clamp_rules() -> None:
    assert control_range({"AllowableMin": 150, "AllowableMax": 1000}) == (150.0, 1000.0)
    # the range the service accepts now wins over the device's
    assert control_range({"AllowableMin": 150, "AllowableMax": 1000, "SettingRangeMin": 200,
                          "SettingRangeMax": 900}) == (200.0, 900.0)
    assert control_range({"AllowableMin": "x", "AllowableMax": None}) == (None, None)
    assert clamp_setpoint(400.0, 150.0, 1000.0) == (400.0, None)
    assert clamp_setpoint(100.0, 150.0, 1000.0)[0] == 150.0
    assert clamp_setpoint(1200.0, 150.0, 1000.0)[0] == 1000.0
    assert clamp_setpoint(None, 150.0, 1000.0) == (1000.0, None)  # released: the maximum
    assert clamp_setpoint(None, 150.0, None)[0] is None


def test_a_set_is_written_with_if_match_and_proven_by_the_read_back(
        bmc: RedfishServer) -> None:
    src = _src(bmc)
    assert src.read(0.0).errors == {}  # the session is open, as in the agent
    assert bmc.etag(CTL) == '"0"'
    t0 = time.perf_counter()
    r = _hold(src, 420.0)
    took = time.perf_counter() - t0
    print(f"\nBMC cap -> read back: {took * 1000:.1f} ms (find the control, GET, PATCH "
          "If-Match, GET; local service)")
    assert (r.confirmed, r.target_w, r.enforced_w, r.clamped, r.attempts, r.error) == \
        (True, 420.0, 420.0, None, 1, None)
    assert bmc.resources[CTL]["SetPoint"] == 420.0 and bmc.etag(CTL) == '"1"'
    again = _hold(src, 420.5)  # within tolerance of what is read back: nothing written
    assert again.confirmed and again.attempts == 0 and bmc.patches == 1
    released = _hold(src, None)
    assert released.confirmed and released.enforced_w == 1000.0 and released.clamped is None
    assert src.logins == 1 and len(bmc.sessions) == 1


@pytest.mark.parametrize(("wanted", "target", "word"), [(100.0, 150.0, "minimum"),
                                                        (1500.0, 1000.0, "maximum")])
def test_a_set_outside_the_control_range_is_clamped_and_said(
        bmc: RedfishServer, wanted: float, target: float, word: str) -> None:
    r = _hold(_src(bmc), wanted)
    assert r.confirmed and r.target_w == r.enforced_w == target and r.wanted_w == wanted
    assert r.clamped is not None and word in r.clamped
    assert bmc.resources[CTL]["SetPoint"] == target


def test_412_rereads_and_retries_bounded(bmc: RedfishServer) -> None:
    src = _src(bmc)
    bmc.conflicts = 2  # two writes by another client land before ours
    r = _hold(src, 300.0, attempts=3)
    assert r.confirmed and r.attempts == 3 and bmc.patches == 3
    bmc.conflicts, bmc.patches = 10, 0  # a writer that always wins: the agent gives up
    r = _hold(src, 250.0, attempts=3)
    assert not r.confirmed and r.attempts == 3 and bmc.patches == 3
    assert r.enforced_w == 300.0 and r.error is not None and "412" in r.error
    assert bmc.resources[CTL]["SetPoint"] == 300.0


def test_only_the_read_back_proves_a_set(bmc: RedfishServer) -> None:
    bmc.ignore_writes = True  # 204, but the BMC keeps its value
    r = _hold(_src(bmc), 300.0)
    assert not r.confirmed and r.enforced_w == 500.0 and r.target_w == 300.0
    assert r.error is not None and "read back" in r.error


def test_dry_run_writes_nothing_and_a_missing_control_is_an_error(bmc: RedfishServer) -> None:
    r = _hold(_src(bmc), 300.0, dry_run=True)
    assert not r.confirmed and bmc.patches == 0 and r.enforced_w == 500.0
    assert r.error is not None and "would set SetPoint 300" in r.error
    r = _hold(_src(bmc, power_control="NoSuch"), 300.0)
    assert not r.confirmed and r.error is not None and "no power Control" in r.error
    assert bmc.patches == 0


def test_no_session_leaks_at_the_bmc_limit(bmc: RedfishServer) -> None:
    bmc.max_sessions = 1
    src = _src(bmc, timeout_s=0.3)
    assert src.read(0.0).errors == {} and _hold(src, 400.0).confirmed
    bmc.delay_s = 1.0  # every request times out: reads and sets fail, the session is kept
    for _ in range(3):
        assert src.read(0.0).power_w is None
        assert not _hold(src, 350.0).confirmed
    bmc.delay_s = 0.0
    other = _src(bmc)  # the limit is reached: a second login is refused (503)
    assert other.read(0.0).power_w is None and other.logins == 0
    assert src.read(0.0).errors == {} and _hold(src, 350.0).confirmed
    assert (src.logins, bmc.logins, len(bmc.sessions)) == (1, 1, 1)
    src.close()
    assert bmc.sessions == {}
    assert other.read(0.0).errors == {} and other.logins == 1  # the slot was given back
    other.close()


def test_the_tray_limit_a_bmc_capped_tray_is_held_at() -> None:
    book = CapBook({3: 4}, 700.0)
    assert book.tray_wanted(3, 400.0) == (3200.0, "safe")  # from the start: GPUs × safe + rest
    book.apply([3], 1, power_cap_w=2500.0, ttl_s=10.0, now=0.0)
    assert book.tray_wanted(3, 400.0) == (2500.0, "racky")
    book.apply([3], 1, gpu_power_cap_w=500.0, ttl_s=10.0, now=0.0)
    assert book.tray_wanted(3, 400.0) == (2400.0, "racky")  # the smaller: 4 × 500 + 400
    book.apply([3], 1, release=["power_cap_w", "gpu_power_cap_w"], now=1.0)
    assert book.tray_wanted(3, 400.0) == (None, "default")  # released: the control's maximum
    book.apply([3], 1, power_cap_w=2500.0, ttl_s=10.0, now=2.0)
    assert book.expire(12.0) == [3]
    assert book.tray_wanted(3, 400.0) == (3200.0, "safe")  # racky silent: never uncapped


def test_the_test_servers_event_stream_drops(bmc: RedfishServer) -> None:
    import urllib.request

    bmc.sse_events_per_connection, bmc.sse_period_s = 3, 0.01
    login = urllib.request.Request(f"{bmc.url}/redfish/v1/SessionService/Sessions",
                                   data=b'{"UserName": "admin", "Password": "secret"}',
                                   method="POST")
    with urllib.request.urlopen(login, timeout=5) as resp:
        token = resp.headers["X-Auth-Token"]
    for n in (1, 2):
        req = urllib.request.Request(f"{bmc.url}/redfish/v1/EventService/SSE",
                                     headers={"X-Auth-Token": token})
        with urllib.request.urlopen(req, timeout=5) as resp:
            body = resp.read().decode()  # returns at the drop
        assert body.count("data: ") == 3 and bmc.sse_connections == n


def test_dry_connect_prints_the_power_control_of_a_bmc_capped_tray(
        bmc: RedfishServer, monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from rich.console import Console

    from trayagent.cli import dry_connect
    from trayagent.config import TrayAgentConfig

    monkeypatch.setenv("T3_BMC_PW", "secret")
    tray = {"tray": 3, "nvml_devices": [0, 1, 2, 3], "coolant_out_temp_c": 45.0,
            "actuation": "redfish", "bmc": {"url": bmc.url, "chassis": "1U",
                                            "username": "admin", "password_env": "T3_BMC_PW"}}
    cfg = TrayAgentConfig.model_validate({"nvml": {"enabled": False},
                                          "agents": {"trays": [tray]}})
    buf = io.StringIO()
    assert dry_connect(cfg, Console(file=buf, width=400)) == 0
    assert f"bmc tray 3: power control {CTL}: set_point_w=500.0 min_w=150.0 max_w=1000.0" \
        in buf.getvalue()
    assert bmc.patches == 0 and bmc.sessions == {}  # nothing written, logged out
    tray["bmc"]["power_control"] = "NoSuch"  # type: ignore[index]
    cfg = TrayAgentConfig.model_validate({"nvml": {"enabled": False},
                                          "agents": {"trays": [tray]}})
    buf = io.StringIO()
    assert dry_connect(cfg, Console(file=buf, width=400)) == 1
    assert "no power Control with Id 'NoSuch'" in buf.getvalue()
    with pytest.raises(ValueError, match="needs the tray's bmc"):
        TrayAgentConfig.model_validate({"agents": {"trays": [{
            "tray": 3, "nvml_devices": [0, 1, 2, 3], "coolant_out_temp_c": 45.0,
            "actuation": "redfish"}]}})


def test_an_implausible_set_point_or_other_units_are_never_proof(bmc: RedfishServer) -> None:
    src = _src(bmc)
    bmc.overrides[CTL] = {"SetPoint": 5000}  # outside the control's own range: unknown
    r = _hold(src, 1000.0)
    assert not r.confirmed and r.enforced_w is None and r.target_w == 1000.0
    bmc.overrides[CTL] = {"SetPointUnits": "kW"}
    r = _hold(src, 400.0)
    assert not r.confirmed and r.error is not None and "SetPointUnits 'kW'" in r.error
    assert bmc.patches == 1  # the first hold tried once (the BMC took it, its answer did not)
