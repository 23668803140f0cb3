"""The lock-step harness's fast tray payload path gives the same values as the plain one:
`sims.telemetry._round1_list` is Python's ``round(x, 1)``, and `tray_contract.encode_tray`'s
bytes decode to what ``encode_json``'s do."""

from __future__ import annotations

import json
import math

import numpy as np

from harness.lockstep_racky import WALL0_NS, _encode_tray
from rackplane.core.topics import encode_json
from rackplane.core.tray_contract import encode_tray
from racky.config import RackyConfig
from sims.scenario import ScenarioRun, load_scenario
from sims.telemetry import _round1_list, tray_payloads


def _same(got: list[float], src: np.ndarray) -> None:
    exp = [round(float(x), 1) for x in src]
    assert len(got) == len(exp)
    for g, e, x in zip(got, exp, src.tolist(), strict=True):
        if math.isnan(e):
            assert math.isnan(g), x
        else:
            assert g == e and math.copysign(1.0, g) == math.copysign(1.0, e), x


def test_round1_list_is_pythons_round() -> None:
    rng = np.random.default_rng(7)
    _same(_round1_list(np.array([0.0, -0.0, 0.05, 0.15, 0.25, -0.05, -0.15, 2.675, 0.45,
                                 1.45, 123456789.05, 4.5e14, 1e15, 1e300, -1e300, 5e-324,
                                 np.inf, -np.inf, np.nan])), np.array(
        [0.0, -0.0, 0.05, 0.15, 0.25, -0.05, -0.15, 2.675, 0.45, 1.45, 123456789.05, 4.5e14,
         1e15, 1e300, -1e300, 5e-324, np.inf, -np.inf, np.nan]))
    for scale in (1e-3, 1.0, 1e3, 1e6, 1e9, 1e11, 1e14, 1e16):
        for a in (rng.uniform(-scale, scale, 20_000),
                  np.round(rng.uniform(0, scale, 20_000), 1) + 0.05,  # near ties
                  rng.integers(-10**6, 10**6, 20_000) * 0.05):
            _same(_round1_list(a), a)
    bits = rng.integers(0, 2**63, 50_000, dtype=np.int64).view(np.float64)  # any double
    _same(_round1_list(bits), bits)
    ints = np.arange(-5, 5, dtype=np.int64)  # an integer column: as float(x)
    _same(_round1_list(ints), ints.astype(np.float64))


def test_encode_tray_decodes_as_encode_json() -> None:
    run = ScenarioRun(load_scenario("rising-crc"), model="rack")
    for _ in range(5):
        run.step(0.1)
    assert run.rack is not None
    for _, p in tray_payloads(run.rack, RackyConfig().identity, WALL0_NS):
        ref = json.loads(encode_json(p))
        assert json.loads(encode_tray(p)) == ref
        assert json.loads(_encode_tray(p)) == ref
    odd = {"a": 1e16, "b": 1e-7, "c": 2**63 + 5, "d": "é\u2028", "e": [True, None, -0.0]}
    assert json.loads(encode_tray(odd)) == json.loads(encode_json(odd))


def test_non_finite_tray_float_is_refused_as_before() -> None:
    run = ScenarioRun(load_scenario("rising-crc"), model="rack")
    assert run.rack is not None
    _, p = tray_payloads(run.rack, RackyConfig().identity, WALL0_NS)[0]
    p["gpus"][1]["ports"]["tx_bytes_per_s"][3] = math.nan
    try:
        _encode_tray(p)
    except ValueError:
        pass
    else:  # pragma: no cover
        raise AssertionError("a NaN reached the bytes")
