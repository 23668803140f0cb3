"""The test BMC (tests/standin/redfish_server.py, DMTF's mockups) checked with DMTF's own
``redfish-service-validator`` (its Python API: ``SystemUnderTest``, ``metadata``), offline,
against the schema bundle copied into tests/data/redfish/csdl (DSP8010 2025.4, the files the
served resources' schemas reference): the whole service from the root, every link followed.

Required: the schemas were found (every served resource's type resolves: without them the
validator passes with zero checks), 0 FAIL, 0 WARN, and every property a resource serves
PASSes (a property the validator could not check would be a SKIP or missing result). The
counts are printed."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.standin.redfish_server import RedfishServer

CSDL = Path(__file__).resolve().parents[1] / "data" / "redfish" / "csdl"


@pytest.fixture
def bmc() -> Iterator[RedfishServer]:
    s = RedfishServer(max_sessions=2)
    yield s
    s.close()


def _run(bmc: RedfishServer, log: Path, csdl: Path = CSDL) -> Any:
    import redfish
    from redfish_service_validator import logger, metadata
    from redfish_service_validator.system_under_test import SystemUnderTest

    logger.logger = redfish.redfish_logger(str(log), "%(levelname)s %(message)s",
                                           logging.INFO)
    metadata.parsed_schemas.clear()  # a module-level cache: this run's bundle only
    metadata.parse_schema_files(str(csdl))
    sut = SystemUnderTest(bmc.url, "admin", "secret", 10, "Session", None, None, None,
                          ["LogEntry", "20"], False)
    sut.validate(None, "/redfish/v1/", "/redfish/v1/")
    sut.logout()
    return sut


def test_the_test_bmc_passes_dmtfs_service_validator(bmc: RedfishServer,
                                                     tmp_path: Path) -> None:
    t0 = time.perf_counter()
    sut = _run(bmc, tmp_path / "validator.log")
    took = time.perf_counter() - t0
    bad = [(uri, prop, r["Result"], r["Message"]) for uri, res in sut._resources.items()
           for prop, r in res["Results"].items() if r["Result"] in ("FAIL", "WARN")]
    validated = [u for u, r in sut._resources.items() if r["Validated"]]
    print(f"\nredfish-service-validator: {len(validated)} resources, PASS {sut.pass_count}, "
          f"WARN {sut.warn_count}, FAIL {sut.fail_count}, SKIP {sut.skip_count} "
          f"({took:.1f} s)")
    assert bad == [] and (sut.fail_count, sut.warn_count) == (0, 0)
    # every resource the agent reads was reached from the root by following links
    for uri in ("/redfish/v1/Chassis/1U/EnvironmentMetrics",
                "/redfish/v1/Chassis/1U/ThermalSubsystem/CoolantConnectors/CPU1",
                "/redfish/v1/Chassis/1U/Controls/PowerLimit",
                "/redfish/v1/Chassis/CDU/LeakDetectors/Overflow",
                "/redfish/v1/SessionService/Sessions"):
        assert uri in validated, uri
    # the schemas were found and every property served was checked and passed
    unchecked = []
    for uri in validated:
        body = sut._resources[uri]["Response"].dict
        for prop in body:
            if prop.startswith("@") or "@" in prop:
                continue  # annotations (checked with their property)
            got = sut._resources[uri]["Results"].get(f"/{prop}", {}).get("Result")
            if got != "PASS":
                unchecked.append((uri, prop, got))
    assert unchecked == []
    ctl = sut._resources["/redfish/v1/Chassis/1U/Controls/PowerLimit"]["Results"]
    assert ctl["/SetPoint"]["Result"] == "PASS" and ctl["/AllowableMax"]["Result"] == "PASS"
    assert sut.pass_count >= 200  # measured 231 with the 2025.4 bundle: no silent shrink


def test_without_the_schemas_the_validator_checks_nothing(bmc: RedfishServer,
                                                          tmp_path: Path) -> None:
    """What the test above guards against: no bundle, no PASS (a WARN per resource)."""
    empty = tmp_path / "csdl"
    empty.mkdir()
    sut = _run(bmc, tmp_path / "validator.log", empty)
    assert sut.pass_count == 0 and sut.warn_count > 0
