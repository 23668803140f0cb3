"""The lock-step harness's CDU face (`harness.cdu_face`): registers as the simulator's face
serves them, samples as the daemon's decoder makes them, a half-open face as the Modbus
adapter delivers it."""

from __future__ import annotations

import math
import random

import pytest

from harness.cdu_face import CduFace
from rackplane.core.registers import (
    RegisterMap,
    bundled_register_maps,
    compile_encoder,
    compile_point_encoder,
    decode_point,
    decoded_sample,
    encode_point,
    encode_value,
    load_register_map,
)
from rackplane.core.samples import Quality
from sims.runtime import encode_readings
from valvey.config import ValveyConfig

SPECIAL = [0.0, -0.0, 1.0, 0.05, 0.15, 0.25, -0.05, -0.15, 2.5, -2.5, 1e-12, 65535.0, 65536.0,
           -32768.0, 32767.0, 6553.5, 6553.6, -3276.8, 1e39, -1e39, math.nan, math.inf,
           -math.inf, 44.43, 45.000000000049996, 0.04999999999, 0.0500000000001]


def _face_registers(regmap: RegisterMap, name: str, v: float, sentinel: bool
                    ) -> list[int] | None:
    """What the simulator's face serves for one value (None: it keeps the old registers)."""
    ok, raw, held = encode_readings(regmap, {name: v}, {name} if sentinel else set())
    if name in raw:
        return raw[name]
    if name in held:
        return None
    return encode_value(regmap.by_name[name], ok[name])


@pytest.mark.parametrize("ref", bundled_register_maps())
def test_encoder_equals_the_simulator_face_word_for_word(ref: str) -> None:
    regmap = load_register_map(ref)
    rng = random.Random(7)
    for p in regmap.points:
        enc = compile_encoder(p)
        fast = compile_point_encoder(p)
        lo = p.valid_min if p.valid_min is not None else -1000.0
        hi = p.valid_max if p.valid_max is not None else 1000.0
        values = SPECIAL + [rng.uniform(lo - 10.0, hi + 10.0) for _ in range(300)] + [
            round(rng.uniform(lo, hi), 2) + 0.005 for _ in range(100)] + [
            round(rng.uniform(lo, hi), 1) + 0.05 for _ in range(100)]  # halves of 0.01, 0.1
        for v in values:
            for sentinel in (False, True):
                want = _face_registers(regmap, p.name, v, sentinel)
                got = encode_point(enc, v, sentinel)
                assert (None if got is None else list(got)) == want, (p.name, v, sentinel)
                got = fast(v, sentinel)
                assert (None if got is None else list(got)) == want, (p.name, v, sentinel)


def test_poll_gives_the_daemon_decoders_samples() -> None:
    cfg = ValveyConfig()
    regmap = load_register_map(cfg.cdu.register_map)
    face = CduFace(regmap, cfg.cdu)
    rng = random.Random(3)
    readings = {p.name: rng.uniform(p.valid_min or 0.0, p.valid_max or 100.0)
                for p in regmap.points}
    for p in regmap.points:
        if p.type == "bool":
            readings[p.name] = float(rng.random() < 0.5)
    readings["flow_lpm"] = 5000.0  # out of range
    readings["return_temp_c"] = math.nan  # an integer point with a sentinel
    samples = face.poll(readings, {"supply_temp_b_c"}, False, 123, 7.0, True)
    assert samples is not None
    by = {s.point: s for s in samples}
    assert set(by) == {p.name for p in regmap.points}
    for p in regmap.points:
        regs = _face_registers(regmap, p.name, readings[p.name], p.name == "supply_temp_b_c")
        assert regs is not None
        assert by[p.name] == decoded_sample(p, decode_point(p, regs), 123, 7.0), p.name
    assert by["flow_lpm"].quality is Quality.OUT_OF_RANGE
    assert by["return_temp_c"].reason == "sentinel"
    assert by["supply_temp_b_c"].reason == "sentinel"
    fast = face.poll(readings, set(), False, 124, 7.1, False)
    assert fast is not None and "uptime_s" not in {s.point for s in fast}
    # a sequence with repeated, changing, sentinel and held values: every poll's samples
    # equal the reference decode of what the face serves at that poll
    regs_now = {p.name: _face_registers(regmap, p.name, readings[p.name],
                                        p.name == "supply_temp_b_c") for p in regmap.points}
    for k in range(60):
        sent = {"flow_lpm"} if 20 <= k < 30 else set()
        r = dict(readings)
        if k % 3 == 0:
            r["supply_temp_c"] = 45.0 + 0.01 * k
            r["diff_pressure_kpa"] = -1.0 if k % 9 == 0 else 100.0 + k  # negative: held
        got = face.poll(r, sent, False, 200 + k, 8.0 + 0.1 * k, True)
        assert got is not None
        for p in regmap.points:
            regs = _face_registers(regmap, p.name, r[p.name], p.name in sent)
            if regs is not None:
                regs_now[p.name] = regs
            want = decoded_sample(p, decode_point(p, regs_now[p.name]), 200 + k, 8.0 + 0.1 * k)
            assert next(s for s in got if s.point == p.name) == want, (k, p.name)


def test_a_blackholed_face_goes_silent_then_stale_then_recovers() -> None:
    cfg = ValveyConfig()
    regmap = load_register_map(cfg.cdu.register_map)
    face = CduFace(regmap, cfg.cdu)
    readings = {p.name: 1.0 for p in regmap.points}
    assert face.poll(readings, set(), False, 1, 0.0, True) is not None
    t = 0.1
    got = []
    while t < 5.0:
        got.append((round(t, 1), face.poll(readings, set(), t < 3.0, 1, t, False)))
        t += 0.1
    timeout = cfg.cdu.timeout_s
    silent = [t for t, s in got if s is None]
    assert silent and max(silent) < 0.1 + timeout
    stale = [t for t, s in got if s is not None and all(
        x.quality is Quality.STALE and x.value is None and x.reason == "timeout" for x in s)]
    assert min(stale) == pytest.approx(0.1 + timeout)
    back = [t for t, s in got if s is not None and all(x.quality is not Quality.STALE
                                                       for x in s)]
    assert min(back) == pytest.approx(3.0 + timeout + cfg.cdu.reconnect_min_s)
