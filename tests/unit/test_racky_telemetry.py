"""racky.core.telemetry.TelemetryIngest: the simulator's tray payloads parse into the rack's link
frame exactly (64-bit counters included); unusable payloads are refused whole."""

from __future__ import annotations

import copy
import json
from typing import Any

import numpy as np
import pytest

from rackplane.settings import Identity
from racky.config import RackyConfig
from racky.core.linkframe import PayloadError
from racky.core.telemetry import TelemetryIngest
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
    from racky.core.telemetry import CLOCK_STEP_BACK_NS, StaleMessage

    ing = _ingest()
    p0 = copy.deepcopy(payloads[3])
    p0["ts_ns"] = 1_800_000_000 * 10**9  # a wall-clock time (ns), so a step back stays >= 0
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


def _leaf_paths(x: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(x, dict):
        for k, v in x.items():
            out += _leaf_paths(v, (*path, k))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            out += _leaf_paths(v, (*path, i))
    return out


def _outcome(ing: TelemetryIngest, p: Any, t: float) -> tuple[Any, ...]:
    try:
        r = ing.tray_payload(p, t)
        res: tuple[Any, ...] = ("ok", r.power_w, repr(r.agent),
                                r.gpu_power_w.tobytes(), r.gpu_demand_w.tobytes(),
                                r.gpu_uptime_s.tobytes(), r.gpu_boot_id.tobytes(),
                                r.gpu_throttled.tobytes(), r.gpu_power_capped.tobytes(),
                                r.gpu_traffic.tobytes())
    except PayloadError as err:
        res = ("refused", str(err))
    return (*res, *_frame_state(ing))


def _frame_state(ing: TelemetryIngest) -> tuple[Any, ...]:
    f = ing.frame
    if f is None:
        return ()
    return (tuple(f.names), f.is_nvlink.tobytes(), f.link_up.tobytes(),
            f.speed_mb_per_s.tobytes(), f.tx_bytes_per_s.tobytes(), f.rx_bytes_per_s.tobytes(),
            f.ber.tobytes(), f.cable_temp_c.tobytes(), f.counters.tobytes(),
            f.counter_seen.tobytes(), f.uptime_s.tobytes(), f.boot_id.tobytes(),
            f.t_mono.tobytes(), f.version)


def _mutations(payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    import random

    bad_values: list[object] = [None, True, False, -1, -1.5, 1.5, 2**64, 2**63, "x",
                                float("nan"), float("inf"), [], {}, 0, 1, 10**400]
    rng = random.Random(3)
    cases: list[dict[str, Any]] = []
    for k, p in enumerate(payloads):
        cases.append(p)
        paths = [q for q in _leaf_paths(p) if q]
        for _ in range(40 if k < 6 else 3):
            q = copy.deepcopy(p)
            path = rng.choice(paths)
            node: Any = q
            for key in path[:-1]:
                node = node[key]
            if isinstance(node, dict) and rng.random() < 0.2:
                del node[path[-1]]
            elif isinstance(node, dict) and rng.random() < 0.05:
                node["unknown_field"] = 1  # the contract forbids it, racky ignores it
            else:
                node[path[-1]] = rng.choice(bad_values)
            cases.append(q)
    return cases


def test_typed_path_agrees_with_the_per_field_checks_on_mutated_payloads(
        payloads: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    """The typed path (msgspec Struct + `_parse_struct`, `_ports_struct`) accepts, refuses and
    writes exactly what the per-GPU, per-list checks do: every payload, and hundreds of single
    mutations (wrong types, bools for numbers, NaN/inf, negatives, out-of-range integers,
    deleted keys, unknown fields), go through an ingest with and one without the typed path;
    outcomes, error messages and frames must be identical."""
    import racky.core.telemetry as tm

    cases = _mutations(payloads)
    fast, slow = _ingest(), _ingest()
    seen = {"typed": 0}
    real = tm.TelemetryIngest._parse_struct

    def counting(self: TelemetryIngest, *a: Any) -> Any:
        out = real(self, *a)
        seen["typed"] += out is not None
        return out

    refused = 0
    for i, case in enumerate(cases):
        t = float(i + 1)
        a_case = {**case, "ts_ns": i} if isinstance(case, dict) else case
        monkeypatch.setattr(tm.TelemetryIngest, "_parse_struct", counting)
        a = _outcome(fast, copy.deepcopy(a_case), t)
        monkeypatch.setattr(tm.TelemetryIngest, "_parse_struct", lambda *_: None)
        b = _outcome(slow, copy.deepcopy(a_case), t)
        monkeypatch.undo()
        assert a == b, f"case {i}: typed {a[:2]} != per-field {b[:2]}"
        refused += a[0] == "refused"
    assert fast.errors == slow.errors == refused
    assert 0 < refused < len(cases) and seen["typed"] > len(payloads)


def test_bytes_decode_agrees_with_the_per_field_checks(
        payloads: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    """As the daemon receives them (`decode_payload` on the bytes, then `tray_payload`): the
    same outcome and frame as the per-field checks on the same JSON, and the refusal names
    the same key path (its text may show an int as the float the Struct holds); NaN /
    Infinity literals are refused as not JSON."""
    import racky.core.telemetry as tm

    fast, slow = _ingest(), _ingest()
    typed = 0
    for i, case in enumerate(_mutations(payloads)):
        raw = json.dumps({**case, "ts_ns": i}).encode()
        t = float(i + 1)
        if b"NaN" in raw or b"Infinity" in raw:
            with pytest.raises(PayloadError, match=r"not valid JSON|not the tray contract"):
                tm.decode_payload(raw)
            continue
        try:
            decoded = tm.decode_payload(raw)
        except PayloadError as err:  # not the contract: refused on decode, not counted here
            fast.errors += 1
            a: tuple[Any, ...] = ("refused", str(err), *_frame_state(fast))
        else:
            typed += 1
            a = _outcome(fast, decoded, t)
        monkeypatch.setattr(tm.TelemetryIngest, "_parse_struct", lambda *_: None)
        b = _outcome(slow, json.loads(raw), t)
        monkeypatch.undo()
        if a[0] == "refused":
            assert b[0] == "refused" and a[1].split(":")[0] == b[1].split(":")[0], (i, a[1], b[1])
            assert a[2:] == b[2:], f"case {i}"
        else:
            assert a == b, f"case {i}: bytes {a[:2]} != per-field {b[:2]}"
    assert typed > len(payloads) and fast.errors == slow.errors


def test_not_json_is_refused_naming_the_payload() -> None:
    from racky.core.telemetry import decode_payload

    for raw in (b"{", b'{"power_w": NaN}', b'{"power_w": 1e400}', b"\xff\xfe"):
        with pytest.raises(PayloadError, match=r"payload: not (valid JSON|the tray contract)"):
            decode_payload(raw)


def test_generated_structs_read_a_payload_as_the_pydantic_contract_does(
        payloads: list[dict[str, Any]]) -> None:
    """The msgspec Structs are generated from the contract's models: a simulator payload
    decodes to the same values as `TrayTelemetry` validates it to, and the Structs refuse
    what the models forbid (unknown and missing required fields), naming the key path."""
    from rackplane.core.tray_contract import (
        TrayShapeError,
        TrayTelemetry,
        decode_tray,
        struct_to_builtins,
    )

    p = payloads[5]
    got, ignored = decode_tray(json.dumps(p).encode())
    assert struct_to_builtins(got) == TrayTelemetry.model_validate(p).model_dump()
    assert ignored == frozenset()
    extra = copy.deepcopy(p)
    extra["gpus"][2]["surprise"] = 1
    with pytest.raises(TrayShapeError, match=r"surprise.*\$\.gpus\[2\]"):
        decode_tray(json.dumps(extra).encode())
    missing = copy.deepcopy(p)
    del missing["gpus"][1]["ports"]["names"]
    with pytest.raises(TrayShapeError, match=r"names.*\$\.gpus\[1\]\.ports"):
        decode_tray(json.dumps(missing).encode())


# --- the contract is enforced whole (new-user findings, H8) ------------------------------------


def _raw(p: Any) -> bytes:
    return json.dumps(p).encode()


def _refused_both_ways(p: dict[str, Any], match: str) -> None:
    """Refused from the bytes (`decode_payload`, then `tray_payload`) and from the dict (the
    lock-step runner's way), naming ``match``; nothing stored."""
    from racky.core.telemetry import decode_payload

    ing = _ingest()
    with pytest.raises(PayloadError, match=match):
        ing.tray_payload(decode_payload(_raw(p)), 1.0)
    with pytest.raises(PayloadError, match=match):
        ing.tray_payload(copy.deepcopy(p), 1.0)
    assert ing.trays == {} and ing.frame is None


def test_h8_a_missing_leak_flag_is_refused_not_read_as_dry(
        payloads: list[dict[str, Any]]) -> None:
    p = copy.deepcopy(payloads[2])
    del p["leak"]  # a wet tray whose agent drops the field must not read as dry
    _refused_both_ways(p, "missing required field `leak`")
    q = copy.deepcopy(payloads[2])
    del q["leak_sensor_fault"]
    _refused_both_ways(q, "leak_sensor_fault")


@pytest.mark.parametrize("bad", [1.5, -1, "1", 2**63, 2**64, 10**40, True, None, "missing"])
def test_h8_ts_ns_must_be_a_non_negative_int64(payloads: list[dict[str, Any]],
                                                 bad: object) -> None:
    p = copy.deepcopy(payloads[2])
    if bad == "missing":
        del p["ts_ns"]
    else:
        p["ts_ns"] = bad
    _refused_both_ways(p, "ts_ns")


def test_h8_ts_ns_at_the_ends_of_its_range_is_accepted(payloads: list[dict[str, Any]]) -> None:
    from racky.core.telemetry import TS_NS_MAX, decode_payload

    for ts in (0, TS_NS_MAX):
        ing = _ingest()
        assert ing.tray_payload(decode_payload(_raw({**payloads[2], "ts_ns": ts})), 1.0)
        assert ing.last_ts_ns[2] == ts


def test_h8_a_repeated_gpu_index_is_refused(payloads: list[dict[str, Any]]) -> None:
    p = copy.deepcopy(payloads[2])
    p["gpus"][1]["gpu"] = p["gpus"][0]["gpu"]  # [8 8 10 11]: GPU 9 would go missing
    _refused_both_ways(p, r"gpus\[1\]\.gpu: 8 repeats")
    q = copy.deepcopy(payloads[2])
    for g in q["gpus"]:
        g["ports"] = None  # no port blocks: the GPU check alone must catch it
    q["gpus"][3]["gpu"] = q["gpus"][2]["gpu"]
    _refused_both_ways(q, r"gpus\[3\]\.gpu: 10 repeats")


@pytest.mark.parametrize("key", ["enforced_gpu_cap_w", "enforced_tray_cap_w", "floor_w",
                                 "power_cap_w", "gpu_power_cap_w", "ramp_up_w_per_s",
                                 "ramp_down_w_per_s", "power_floor_pct",
                                 "ramp_down_hysteresis_s", "cap_expires_in_s", "epoch"])
def test_h8_negative_agent_powers_caps_and_ramps_are_refused(
        payloads: list[dict[str, Any]], key: str) -> None:
    p = copy.deepcopy(payloads[2])
    if key == "epoch":
        p["agent"][key] = -1
        _refused_both_ways(p, r"agent\.epoch: -1 is not an integer")
        return
    p["agent"][key] = -1.0
    _refused_both_ways(p, f"agent.{key}: -1.0 is negative")


def test_h8_the_fallback_follows_the_contract(payloads: list[dict[str, Any]]) -> None:
    """Whatever the typed path cannot vouch for is refused as the contract says: every
    required field present, types as the models say, unknown fields refused, every counter
    racky keeps present; counter names racky does not keep are ignored (typed still); a
    repeated JSON key is not detected, its last value wins (docs/CONTRACTS.md)."""
    from racky.core.telemetry import decode_payload

    base = payloads[2]
    _refused_both_ways({**copy.deepcopy(base), "site": 123}, r"\$\.site")
    no_floor = copy.deepcopy(base)
    del no_floor["agent"]["floor_w"]
    _refused_both_ways(no_floor, r"floor_w.*\$\.agent")
    extra = copy.deepcopy(base)
    extra["agent"]["surprise"] = 1
    _refused_both_ways(extra, r"surprise.*\$\.agent")
    no_ctr = copy.deepcopy(base)
    del no_ctr["gpus"][1]["ports"]["counters"]["symbol_error"]
    _refused_both_ways(no_ctr, r"gpus\[gpu=9\]\.ports\.counters\.symbol_error: missing")
    bad = copy.deepcopy(base)
    bad["gpus"][3]["ports"]["counters"]["carrier_changes"][4] = 1.5
    _refused_both_ways(bad, r"\$\.gpus\[3\]\.ports\.counters\.carrier_changes\[4\]")
    # a counter racky does not keep: ignored, the frame is what it is without it
    n = len(base["gpus"][0]["ports"]["names"])
    unknown = copy.deepcopy(base)
    for g in unknown["gpus"]:
        g["ports"]["counters"]["vendor_ctr"] = [7] * n
    a, b = _ingest(), _ingest()
    a.tray_payload(decode_payload(_raw(unknown)), 1.0)
    b.tray_payload(decode_payload(_raw(base)), 1.0)
    assert a.frame is not None and b.frame is not None
    np.testing.assert_array_equal(a.frame.counters, b.frame.counters)
    unknown["gpus"][0]["ports"]["counters"]["vendor_ctr"][0] = "x"  # still the contract's type
    _refused_both_ways(unknown, r"vendor_ctr")
    # a repeated key: the last one wins
    ing = _ingest()
    r = ing.tray_payload(decode_payload(b'{"tray": 7, "leak": true, ' + _raw(base)[1:]), 1.0)
    assert r.tray == base["tray"] and r.leak is base["leak"]


def test_h8_very_deep_nesting_is_a_payload_error_not_a_recursion_error() -> None:
    from rackplane.core.tray_contract import NotJsonError, decode_json
    from racky.core.telemetry import decode_payload

    deep = b"[" * 100_000 + b"]" * 100_000
    for raw in (b'{"x":' + deep + b"}", deep, b'{"gpus":' + deep + b"}"):
        with pytest.raises(PayloadError, match="payload: not"):
            decode_payload(raw)
    with pytest.raises(NotJsonError, match="too deep"):
        decode_json(b'{"x":' + deep + b"}")
    nested: list[Any] = []
    for _ in range(100_000):
        nested = [nested]
    with pytest.raises(PayloadError):
        _ingest().tray_payload({"gpus": nested}, 1.0)


# --- contract v1: versions, ignored fields, nothing of the simulator's truth -------------------


def test_v1_payload_carries_no_simulator_truth(payloads: list[dict[str, Any]]) -> None:
    """What a real agent cannot observe is not in the contract (plant time, demand, the
    agent's internal request, cold-plate fouling and temperature, offered traffic)."""
    from rackplane.core.tray_contract import SCHEMA_VERSION, GpuTelemetry, TrayTelemetry

    for p in payloads:
        assert p["schema_version"] == SCHEMA_VERSION
        assert not {"t_s", "cold_plate_conductance_factor"} & set(p)
        for g in p["gpus"]:
            assert not {"demand_w", "request_w", "plate_temp_c", "traffic"} & set(g)
    for field in ("t_s", "cold_plate_conductance_factor"):
        assert field not in TrayTelemetry.model_fields
    assert "demand_w" not in GpuTelemetry.model_fields


def _newer_minor(p: dict[str, Any]) -> dict[str, Any]:
    q = copy.deepcopy(p)
    q["schema_version"] = "1.7"
    q["fan_rpm"] = 9000
    q["agent"]["vendor_mode"] = "eco"
    for g in q["gpus"]:
        g["mem_temp_c"] = 70.0
        if g["ports"] is not None:
            g["ports"]["fec_mode"] = ["rs"] * len(g["ports"]["names"])
    return q


def test_a_newer_minor_versions_extra_fields_are_accepted_ignored_and_counted_once(
        payloads: list[dict[str, Any]]) -> None:
    """A 1.7 agent's message with fields 1.0 does not know is read as the 1.0 fields say
    (the same reading and frame as without them), from the bytes and from a dict; each
    unknown field's key path is counted once however many messages carry it."""
    from racky.core.telemetry import decode_payload

    a, b, c = _ingest(), _ingest(), _ingest()
    for i, p in enumerate(payloads[:4]):
        q = _newer_minor(p)
        ra = a.tray_payload(decode_payload(_raw(q)), 1.0 + i)
        rc = c.tray_payload(copy.deepcopy(q), 1.0 + i)
        rb = b.tray_payload(copy.deepcopy(p), 1.0 + i)
        for r in (ra, rc):
            assert repr(r.agent) == repr(rb.agent)
            np.testing.assert_array_equal(r.gpu_power_w, rb.gpu_power_w)
    assert a.frame is not None and b.frame is not None
    assert _frame_state(a) == _frame_state(b)
    want = {"fan_rpm", "agent.vendor_mode", "gpus[].mem_temp_c", "gpus[].ports.fec_mode"}
    assert a.ignored_fields == c.ignored_fields == want
    assert a.ignored_field_count == 4 and b.ignored_field_count == 0
    assert a.newest_version == "1.7" and a.errors == 0


def test_a_newer_minor_version_is_still_refused_for_wrong_types_missing_fields_and_values(
        payloads: list[dict[str, Any]]) -> None:
    q = _newer_minor(payloads[2])
    q["gpus"][1]["power_w"] = "high"
    _refused_both_ways(q, r"\$\.gpus\[1\]\.power_w")
    r = _newer_minor(payloads[2])
    del r["leak"]
    _refused_both_ways(r, "missing required field `leak`")
    v = _newer_minor(payloads[2])
    v["power_w"] = -5.0
    _refused_both_ways(v, r"payload\.power_w: -5.0 W is negative")
    ing = _ingest()
    with pytest.raises(PayloadError):
        ing.tray_payload(r, 1.0)
    assert ing.ignored_fields == set()  # nothing of a refused message is counted


@pytest.mark.parametrize(("version", "match"), [
    ("2.0", r"unsupported contract version.*major version 2 is not supported"),
    ("0.9", r"unsupported contract version.*major version 0"),
    ("1", r"unsupported contract version.*not MAJOR\.MINOR"),
    ("1.0.1", r"not MAJOR\.MINOR"),
    (" 1.0", r"not MAJOR\.MINOR"),
    (1.0, r"\$\.schema_version"),
    ("missing", "missing required field `schema_version`"),
])
def test_another_major_version_or_a_malformed_version_is_refused(
        payloads: list[dict[str, Any]], version: object, match: str) -> None:
    p = copy.deepcopy(payloads[2])
    if version == "missing":
        del p["schema_version"]
    else:
        p["schema_version"] = version
    _refused_both_ways(p, match)
    q = _newer_minor(payloads[2])  # with unknown fields too: the version is the reason
    q["schema_version"] = "2.0"
    _refused_both_ways(q, "major version 2")


def test_unknown_fields_in_this_minor_version_are_refused(payloads: list[dict[str, Any]]
                                                          ) -> None:
    """An extension needs a newer minor version: a 1.0 message with a field 1.0 does not
    define is a mistake and refused naming it (also an older minor's)."""
    q = {**copy.deepcopy(payloads[2]), "fan_rpm": 9000}
    _refused_both_ways(q, r"unknown field `fan_rpm`")
    r = _newer_minor(payloads[2])
    r["schema_version"] = "1.0"
    _refused_both_ways(r, r"unknown field `(fan_rpm|vendor_mode|mem_temp_c|fec_mode)`")


def test_demand_is_inferred_from_power_the_cap_and_the_power_cap_reason() -> None:
    from racky.core.telemetry import CAPPED_DEMAND_FACTOR, infer_gpu_demand_w

    power = np.array([300.0, 700.0, 650.0, np.nan])
    capped = np.array([False, True, True, False])
    got = infer_gpu_demand_w(power, 700.0, capped)
    # not capped: demand ~ power; capped at the cap: more than the cap; capped below the cap
    # (a thermal slowdown as well): still at least the cap
    np.testing.assert_allclose(got[:3], [300.0, 700.0 * CAPPED_DEMAND_FACTOR,
                                         700.0 * CAPPED_DEMAND_FACTOR])
    assert np.isnan(got[3])


def test_ingest_reads_throttle_reasons_and_infers_demand(payloads: list[dict[str, Any]]
                                                         ) -> None:
    from racky.core.telemetry import CAPPED_DEMAND_FACTOR

    p = copy.deepcopy(payloads[2])
    cap = p["agent"]["enforced_gpu_cap_w"]
    p["gpus"][0]["throttle_reasons"] = ["sw_power_cap"]
    p["gpus"][0]["power_w"] = cap
    p["gpus"][1]["throttle_reasons"] = ["hw_slowdown", "hw_thermal_slowdown"]
    p["gpus"][2]["throttle_reasons"] = ["gpu_idle", "a_future_reason"]
    p["gpus"][3]["throttle_reasons"] = []
    for q in (p, json.loads(_raw(p))):
        r = _ingest().tray_payload(q, 1.0)
        assert r.gpu_power_capped.tolist() == [True, False, False, False]
        assert r.gpu_throttled.tolist() == [False, True, False, False]
        assert r.gpu_demand_w[0] == pytest.approx(cap * CAPPED_DEMAND_FACTOR)
        np.testing.assert_array_equal(r.gpu_demand_w[1:], r.gpu_power_w[1:])
    bad = copy.deepcopy(p)
    bad["gpus"][2]["throttle_reasons"] = "hw_slowdown"
    _refused_both_ways(bad, r"throttle_reasons")


def test_the_contract_docs_examples_are_the_contract() -> None:
    """docs/CONTRACTS.md "Node-agent contract v1" examples: the telemetry validates as the
    model and racky takes it; the command args validate as the agents' model."""
    import re
    from pathlib import Path

    from rackplane.core.tray_contract import TrayTelemetry
    from sims.telemetry import SetPowerLimitsArgs

    doc = (Path(__file__).parents[2] / "docs" / "CONTRACTS.md").read_text(encoding="utf-8")
    section = doc[doc.index("## Node-agent contract v1"):]
    section = section[section.index("### Examples"):]
    blocks = re.findall(r"```json\n(.*?)```", section, re.S)
    tele = json.loads(blocks[0])
    TrayTelemetry.model_validate(tele, strict=True)
    ing = TelemetryIngest(18, 1, ("nvl_crc_flit_errors",))
    r = ing.tray_payload({**tele, "gpus": [{**tele["gpus"][0], "gpu": 3}]}, 1.0)
    assert r.gpu_power_capped.tolist() == [True]
    dec = json.JSONDecoder()
    text, cmds = blocks[1].strip(), []
    while text:
        obj, end = dec.raw_decode(text)
        cmds.append(obj)
        text = text[end:].strip()
    assert len(cmds) == 2
    for c in cmds:
        SetPowerLimitsArgs.model_validate(c["args"], strict=True)
