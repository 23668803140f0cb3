"""Specific refusal codes for each kind of hostile command input, counted per code in the
self-metrics (issue 14 item 13): the strict reader's kinds (too_large, bad_json, non_finite,
duplicate_key, too_deep), the args model's (wrong_type, non_finite, out_of_range,
invalid_args), the envelope's (expired, retained); a monotonic counter per code on
Prometheus (label ``code``) and in the time series (measurement ``command_refusals``, tag
``code``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from rackplane.clock import FakeClock
from rackplane.commands import ROUTER_CODES, JsonError, read_json
from rackplane.io.selfmetrics import SelfMetrics
from rackplane.io.service import TickStats
from rackplane.io.spool import Spool
from rackplane.io.tsdb import TelemetryWriter
from rackplane.settings import MetricsSettings, SpoolSettings, TsdbSettings
from tests.unit.test_commands import error_code, make_rig

# (payload or args, expected code): every kind of the list
HOSTILE: list[tuple[dict[str, Any], str]] = [
    ({"payload": b'{"request_id": "h-1", "args": {"setpoint_c": NaN}}'}, "non_finite"),
    ({"payload": b'{"request_id": "h-2", "args": {"setpoint_c": 1e999}}'}, "non_finite"),
    ({"payload": b'{"request_id": "h-3", "request_id": "h-3"}'}, "duplicate_key"),
    ({"payload": b'{"a": ' + b"[" * 33 + b"]" * 33 + b"}"}, "too_deep"),
    ({"payload": b"{" + b" " * 20_000 + b"}"}, "too_large"),
    ({"payload": b"{nope"}, "bad_json"),
    ({"payload": b"[]"}, "wrong_type"),
    ({"args": {"setpoint_c": "40"}}, "wrong_type"),
    ({"args": {"setpoint_c": True}}, "wrong_type"),
    ({"args": {"setpoint_c": 400.0}}, "out_of_range"),
    ({"args": {"setpoint_c": 40.0, "extra": 1}}, "invalid_args"),
    ({"args": {"setpoint_c": 40.0}, "age_s": 3600.0}, "expired"),
    ({"args": {"setpoint_c": 40.0}, "retain": True}, "retained"),
]


def _send(rig: Any, i: int, case: dict[str, Any]) -> dict[str, Any]:
    kw: dict[str, Any] = {"rid": f"h-{i}"}
    if "payload" in case:
        kw["payload"] = case["payload"]
    if "retain" in case:
        kw["retain"] = True
    if "age_s" in case:
        kw["issued_offset_s"] = -case["age_s"]
    return rig.send(rig.msg("set_setpoint", case.get("args"), **kw))


@pytest.mark.parametrize(("case", "code"), HOSTILE)
def test_each_kind_of_hostile_command_gets_its_own_code(case: dict[str, Any], code: str
                                                        ) -> None:
    rig = make_rig({"max_payload_bytes": 16384})
    before = rig.core.loop.setpoint_c
    reply = _send(rig, 1, case)
    assert error_code(reply) == code, reply
    assert rig.core.loop.setpoint_c == before
    assert code in ROUTER_CODES  # part of the contract (docs/COMMANDS.md lists them)


@pytest.mark.parametrize(("payload", "code"), [
    (b'{"a": NaN}', "non_finite"), (b'{"a": -Infinity}', "non_finite"),
    (b'{"a": 1.5e400}', "non_finite"), (b'{"a": 1, "a": 2}', "duplicate_key"),
    # acceptance round 2: an integer beyond a double (float() of it raised OverflowError)
    (b'{"a": 1' + b"0" * 400 + b"}", "non_finite"), (b'{"a": [-2' + b"0" * 309 + b"]}",
                                                      "non_finite"),
    (b"[" * 40 + b"]" * 40, "too_deep"), (b"\xc3(", "bad_json"), (b"{", "bad_json"),
])
def test_the_strict_reader_says_which_kind(payload: bytes, code: str) -> None:
    with pytest.raises(JsonError) as exc:
        read_json(payload)
    assert exc.value.code == code
    with pytest.raises(JsonError) as exc:
        read_json(b"{}" + b" " * 100, max_bytes=10)
    assert exc.value.code == "too_large"


def test_refusals_are_counted_per_code_in_the_self_metrics(tmp_path: Path) -> None:
    from rackplane.io.selfmetrics import REFUSALS_MEASUREMENT

    rig = make_rig({"max_payload_bytes": 16384})
    clock: FakeClock = rig.clock
    for i, (case, _code) in enumerate(HOSTILE):
        _send(rig, i, case)
    _send(rig, 100, HOSTILE[0][0])  # a second non_finite
    writer = TelemetryWriter(TsdbSettings(), SpoolSettings(directory=tmp_path / "spool"),
                             identity_tags={"site": "lab", "row": "r", "rack": "r1"},
                             clock=clock)
    sm = SelfMetrics("valvey", MetricsSettings(interval_s=10.0), clock=clock)
    sm.tick(clock.monotonic(), tick_stats=TickStats(), writer=writer, commands=rig.router)
    st = sm.status()
    expected: dict[str, int] = {}
    for _c, code in HOSTILE:
        expected[code] = expected.get(code, 0) + 1
    expected["non_finite"] += 1
    assert st["commands_refused"] == expected
    assert st["commands_rejected"] == sum(expected.values())
    text = sm.exposition().decode()
    for code, n in expected.items():
        assert re.search(rf'rackplane_commands_refused_total\{{code="{code}",daemon="valvey"\}} '
                         rf"{n}\.0", text), (code, text)
    # monotonic: more refusals only add
    _send(rig, 200, {"args": {"setpoint_c": 400.0}})
    clock.advance(10.0)
    sm.tick(clock.monotonic(), tick_stats=TickStats(), writer=writer, commands=rig.router)
    assert sm.status()["commands_refused"]["out_of_range"] == 2
    assert sm.status()["commands_refused"]["non_finite"] == 3
    writer.flush_to_spool()
    with Spool(tmp_path / "spool", readonly=True) as sp:
        lines, _ = sp.read(1000)
    ours = [ln for ln in lines if ln.startswith(f"{REFUSALS_MEASUREMENT},")]
    oor = [ln for ln in ours if "code=out_of_range" in ln and "daemon=valvey" in ln]
    got = [re.search(r"refused=([0-9.]+)", ln) for ln in oor]
    assert [float(m.group(1)) for m in got if m] == [1.0, 2.0]
    assert len(ours) == len(expected) * 2
