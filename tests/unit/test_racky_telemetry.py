"""racky.telemetry.TelemetryIngest: the simulator's tray payloads parse into the rack's link
frame exactly (64-bit counters included); unusable payloads are refused whole."""

from __future__ import annotations

import copy
import json
from typing import Any

import numpy as np
import pytest

from rackplane.settings import Identity
from racky.config import RackyConfig
from racky.telemetry import PayloadError, TelemetryIngest
from sims.scenario import FabricSpec, ScenarioRun, load_scenario


@pytest.fixture(scope="module")
def payloads() -> list[dict[str, Any]]:
    from sims.telemetry import tray_payloads

    sc = load_scenario("load-step-short").model_copy(
        update={"fabric": FabricSpec(enabled="on")})
    run = ScenarioRun(sc, model="rack")
    run.step(1.0)
    assert run.rack is not None
    return [json.loads(json.dumps(p)) for _, p in tray_payloads(run.rack, Identity(), 0)]


def _ingest() -> TelemetryIngest:
    cfg = RackyConfig()
    return TelemetryIngest(cfg.node_agents.trays, cfg.node_agents.gpus_per_tray,
                           tuple(cfg.links.counters))


def test_payloads_fill_the_frame_with_exact_counter_values(payloads: list[dict[str, Any]]
                                                            ) -> None:
    ing = _ingest()
    p = copy.deepcopy(payloads[2])
    ports = p["gpus"][1]["ports"]
    ports["counters"]["rx_bytes"][0] = 2**64 - 1  # above 2**63: no float rounding
    ports["counters"]["rx_bytes"][1] = 2**63 + 1
    for q in payloads:
        ing.tray_payload(q if q is not payloads[2] else p, 5.0)
    f = ing.frame
    assert f is not None and f.n_ports == 72 * 20 and len(ing.trays) == 18
    gi = p["gpus"][1]["gpu"]
    base = gi * f.ports_per_gpu
    rx = f.counter("rx_bytes")
    assert int(rx[base]) == 2**64 - 1 and int(rx[base + 1]) == 2**63 + 1
    assert f.names[base] == ports["names"][0]
    assert (f.t_mono == 5.0).all()
    assert ing.trays[2].tray == 2


@pytest.mark.parametrize("bad", [-1, 1.5, 2**64, None, True, "7"])
def test_a_bad_counter_value_refuses_the_whole_payload(payloads: list[dict[str, Any]],
                                                       bad: object) -> None:
    ing = _ingest()
    ing.tray_payload(payloads[0], 1.0)
    assert ing.frame is not None
    before = ing.frame.counters.copy()
    p = copy.deepcopy(payloads[0])
    p["gpus"][3]["ports"]["counters"]["carrier_changes"][4] = bad
    p["power_w"] = 1.0
    with pytest.raises(PayloadError, match="carrier_changes"):
        ing.tray_payload(p, 2.0)
    np.testing.assert_array_equal(ing.frame.counters, before)
    assert ing.trays[0].power_w != 1.0 and ing.errors == 1


def test_structural_errors_are_named(payloads: list[dict[str, Any]]) -> None:
    ing = _ingest()
    with pytest.raises(PayloadError, match="tray"):
        ing.tray_payload({**payloads[0], "tray": 18}, 1.0)
    p = copy.deepcopy(payloads[0])
    p["gpus"][0]["ports"]["counters"]["link_downed"] = [0, 1]
    with pytest.raises(PayloadError, match="link_downed"):
        ing.tray_payload(p, 1.0)
    with pytest.raises(PayloadError):
        ing.tray_payload([], 1.0)


def _mutated(p: dict[str, Any], path: str, value: object) -> dict[str, Any]:
    q = copy.deepcopy(p)
    *keys, last = path.split(".")
    d: Any = q
    for k in keys:
        d = d[int(k)] if isinstance(d, list) else d[k]
    if isinstance(d, list):
        d[int(last)] = value
    else:
        d[last] = value
    return q


@pytest.mark.parametrize(("path", "value"), [
    ("gpus.0.ports.link_up.0", "down"),        # a string read as True by numpy
    ("gpus.0.ports.link_up.1", 0),
    ("gpus.0.ports.nvlink.0", None),
    ("gpus.0.ports.speed_mb_per_s.0", "fast"),  # raised ValueError half-way through a write
    ("gpus.0.ports.tx_bytes_per_s.0", float("nan")),
    ("gpus.0.ports.rx_bytes_per_s.0", -5.0),
    ("gpus.0.ports.ber.0", "1e-12"),
    ("gpus.0.ports.ber.0", -1e-12),
    ("gpus.0.ports.ber", "none"),
    ("gpus.0.power_w", -300.0),                 # a negative power understates the rack
    ("power_w", -1.0),
])
def test_bad_port_and_power_values_refuse_the_payload_and_leave_the_frame(
        payloads: list[dict[str, Any]], path: str, value: object) -> None:
    ing = _ingest()
    for q in payloads:
        ing.tray_payload(q, 1.0)
    assert ing.frame is not None
    before = (ing.frame.link_up.copy(), ing.frame.speed_mb_per_s.copy(), ing.frame.t_mono.copy())
    bad = _mutated(payloads[0], path, value)
    bad["ts_ns"] += 10**9
    # through JSON as the daemon receives it (NaN/Infinity are accepted by json.loads)
    bad = json.loads(json.dumps(bad))
    with pytest.raises(PayloadError, match=path.split(".")[-2 if path[-1].isdigit() else -1]):
        ing.tray_payload(bad, 2.0)
    f = ing.frame
    assert (f.link_up == before[0]).all() and (f.t_mono == before[2]).all()
    assert np.array_equal(f.speed_mb_per_s, before[1])
    assert ing.trays[0].t_mono == 1.0 and ing.errors == 1


def test_duplicate_reordered_and_retained_messages_are_not_taken_as_fresh(
        payloads: list[dict[str, Any]]) -> None:
    from racky.telemetry import CLOCK_STEP_BACK_NS, StaleMessage

    ing = _ingest()
    p0 = copy.deepcopy(payloads[3])
    p1 = copy.deepcopy(p0)
    p1["ts_ns"] = p0["ts_ns"] + 10**9
    p1["gpus"][0]["ports"]["counters"]["rx_bytes"][0] += 1000
    ing.tray_payload(p1, 10.0)
    assert ing.frame is not None
    port0 = p1["gpus"][0]["gpu"] * ing.frame.ports_per_gpu
    rx = int(ing.frame.counter("rx_bytes")[port0])
    for late, why in ((p0, "out of order"), (p1, "duplicate")):
        with pytest.raises(StaleMessage, match=why):
            ing.tray_payload(late, 11.0)
    with pytest.raises(StaleMessage, match="retained"):
        ing.tray_payload(p1, 12.0, retained=True)
    f = ing.frame
    assert f is not None
    # the counter did not run backwards and the reading kept its receive time
    assert int(f.counter("rx_bytes")[port0]) == rx
    assert ing.trays[3].t_mono == 10.0
    assert ing.stale_messages == 3 and ing.errors == 0
    # an agent whose clock stepped back by more than the replay margin is accepted
    p2 = copy.deepcopy(p0)
    p2["ts_ns"] = p1["ts_ns"] - CLOCK_STEP_BACK_NS - 1
    ing.tray_payload(p2, 13.0)
    assert ing.trays[3].t_mono == 13.0 and ing.clock_steps == 1
