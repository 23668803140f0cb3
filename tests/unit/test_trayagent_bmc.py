"""tray-agent's BMC source: DMTF's Redfish client library against a Redfish service serving
DMTF's own mockups (a liquid-cooled server's chassis, a cooling unit's leak detectors) with
sessions (limit, expiry), slow answers and overrides; and the leak rules (a faulted detector
is a sensor fault, never a leak; a wet reading is never hidden)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from rackplane.core.tray_contract import convert_tray
from tests.standin.redfish_server import RedfishServer
from trayagent.core.bmc import classify_leak
from trayagent.core.caps import CapBook, DeviceLimits
from trayagent.core.payload import GpuReading, TrayInfo, tray_payload
from trayagent.redfish import BmcSource

LEAKS = "/redfish/v1/Chassis/CDU/LeakDetectors"


def _det(i: str, state: Any = "OK", status: Any = "Enabled") -> dict[str, Any]:
    return {"Id": i, "DetectorState": state, "Status": {"State": status, "Health": "OK"}}


@pytest.mark.parametrize(("dets", "leak", "fault"), [
    ([_det("a"), _det("b")], False, False),
    ([_det("a"), _det("b", "Warning")], True, False),
    ([_det("a"), _det("b", "Critical")], True, False),
    ([_det("a"), _det("b", "OK", "UnavailableOffline")], False, True),
    ([_det("a", "Critical", "Disabled")], False, True),  # a faulted detector is never a leak
    ([_det("a", "Warning"), _det("b", "OK", "Absent")], True, False),  # wet is never hidden
    ([_det("a", None)], False, True),
    ([_det("a", "Unknown")], False, True),
    ([{"Id": "a"}], False, True),
    ([{"Id": "a", "DetectorState": "OK", "Status": "Enabled"}], False, True),
    ([], False, True),  # no detector: "dry" would mean nothing
])
def test_leak_rules(dets: list[dict[str, Any]], leak: bool, fault: bool) -> None:
    s = classify_leak(dets)
    assert (s.leak, s.fault) == (leak, fault), s.detectors


@pytest.fixture
def bmc() -> Iterator[RedfishServer]:
    s = RedfishServer(max_sessions=2)
    yield s
    s.close()


def _src(s: RedfishServer, timeout_s: float = 2.0) -> BmcSource:
    return BmcSource(s.url, "1U", "admin", "secret", timeout_s)


def test_the_mockups_figures_are_read_over_one_reused_session(bmc: RedfishServer) -> None:
    src = _src(bmc)
    for _ in range(5):
        r = src.read(0.0)
        assert r.errors == {}
        assert (r.power_w, r.coolant_out_temp_c) == (374.0, 46.9)  # the hotter return
        assert r.leak is not None and (r.leak.leak, r.leak.fault) == (False, False)
        assert r.leak.detectors == {"Moisture": "dry", "Overflow": "dry"}
    assert bmc.logins == 1 and len(bmc.sessions) == 1
    bmc.sessions.clear()  # the BMC ends the session (expiry, BMC reboot)
    assert src.read(1.0).errors == {}
    assert bmc.logins == 2
    src.close()
    assert bmc.sessions == {}


def test_a_wet_or_faulted_detector_and_implausible_figures(bmc: RedfishServer) -> None:
    src = _src(bmc)
    bmc.overrides[f"{LEAKS}/Overflow"] = {"DetectorState": "Critical"}
    r = src.read(0.0)
    assert r.leak is not None and (r.leak.leak, r.leak.fault) == (True, False)
    bmc.overrides[f"{LEAKS}/Overflow"] = {"Status": {"State": "UnavailableOffline"}}
    r = src.read(0.0)
    assert r.leak is not None and (r.leak.leak, r.leak.fault) == (False, True)
    bmc.overrides["/redfish/v1/Chassis/1U/EnvironmentMetrics"] = {
        "PowerWatts": {"Reading": -5}}
    bmc.overrides["/redfish/v1/Chassis/1U/ThermalSubsystem/CoolantConnectors/CPU2"] = {
        "ReturnTemperatureCelsius": {"Reading": None}}
    r = src.read(0.0)
    assert r.power_w is None and r.errors["power_w"] == \
        "PowerWatts.Reading -5 outside [0, 20000]"
    assert r.coolant_out_temp_c is None and r.errors["coolant_out_temp_c"] == \
        "CPU2: not a number: None"  # one connector unknown: the outlet is not the other's


def test_a_session_limit_a_wrong_password_and_a_slow_bmc_read_unknown(
        bmc: RedfishServer) -> None:
    bmc.max_sessions = 0
    r = _src(bmc).read(0.0)
    assert r.power_w is None and r.leak is None and "BMC" in r.errors["power_w"]
    bmc.max_sessions = 2
    bad = BmcSource(bmc.url, "1U", "admin", "wrong", 2.0).read(0.0)
    assert bad.power_w is None and set(bad.errors) == {"power_w", "coolant_out_temp_c", "leak"}
    src = _src(bmc, timeout_s=0.2)
    assert src.read(0.0).errors == {}
    bmc.delay_s = 1.0
    slow = src.read(0.0)
    # the library gives up after its one try (RetriesExhaustedError, an empty message)
    assert slow.power_w is None and "RetriesExhaustedError" in slow.errors["power_w"]
    bmc.delay_s = 0.0
    assert src.read(0.0).errors == {}
    assert src.logins == 1 and len(bmc.sessions) == 1  # the session outlived the timeout
    missing = BmcSource(bmc.url, "9Z", "admin", "secret", 2.0).read(0.0)
    assert "HTTP 404" in missing.errors["power_w"]


def test_a_fresh_bmc_reading_fills_the_tray_figures(bmc: RedfishServer) -> None:
    r = _src(bmc).read(time.monotonic())
    gpus = [GpuReading(gpu=12 + i, power_w=300.0, limit_w=700.0,
                       limits=DeviceLimits(200.0, 1200.0, 1000.0)) for i in range(4)]
    info = TrayInfo("lab", "row1", "rack01", 3, 150.0, 45.0)
    caps = CapBook({3: 4}, 700.0).trays[3]
    with_bmc = tray_payload(info, gpus, caps, ts_ns=1, cap_expires_in_s=None, bmc=r)
    m = convert_tray(json.loads(json.dumps(with_bmc))).struct
    assert (m.power_w, m.coolant_out_temp_c, m.leak, m.leak_sensor_fault) == \
        (374.0, 46.9, False, False)
    without = tray_payload(info, gpus, caps, ts_ns=1, cap_expires_in_s=None)
    assert (without["power_w"], without["coolant_out_temp_c"], without["leak_sensor_fault"]) \
        == (1350.0, 45.0, True)


def test_dry_connect_prints_the_bmc_figures(bmc: RedfishServer,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from rich.console import Console

    from trayagent.cli import dry_connect
    from trayagent.config import TrayAgentConfig

    monkeypatch.setenv("T3_BMC_PW", "secret")
    cfg = TrayAgentConfig.model_validate({"nvml": {"enabled": False}, "agents": {"trays": [{
        "tray": 3, "nvml_devices": [0, 1, 2, 3], "coolant_out_temp_c": 45.0,
        "bmc": {"url": bmc.url, "chassis": "1U", "username": "admin",
                "password_env": "T3_BMC_PW"}}]}})
    buf = io.StringIO()
    assert dry_connect(cfg, Console(file=buf, width=400)) == 0
    assert "bmc tray 3 (" in buf.getvalue() and "power_w=374.0 coolant_out_temp_c=46.9 " \
        "leak=False fault=False" in buf.getvalue()
    assert bmc.sessions == {}  # logged out
    monkeypatch.setenv("T3_BMC_PW", "wrong")
    assert dry_connect(cfg, Console(file=io.StringIO())) == 1


def test_an_unreachable_bmc_is_reported_with_its_root_cause() -> None:
    # the library raises RetriesExhaustedError() with no message from the connection error:
    # the reading's errors (printed by --dry-connect, logged) name the root cause
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    r = BmcSource(f"http://127.0.0.1:{port}", "1U", "admin", "secret", 1.0).read(0.0)
    assert r.power_w is None and r.leak is None
    why = r.errors["power_w"]
    assert why.startswith(f"BMC http://127.0.0.1:{port}: ") and len(why) <= 300
    assert "ConnectionRefusedError" in why and "Connection refused" in why, why
