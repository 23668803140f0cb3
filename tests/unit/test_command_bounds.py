"""Every numeric argument of every verb of both daemons is bounded from config (issue 14
item 2): the table-driven walk below takes each registered verb, each numeric field of its
args model, and sends values outside the field's bound (below, above, 1e300, the wrong unit)
through the real router: each is refused with the bound's code, naming the argument, the
value and the limits, and nothing changes. A verb registered without bounds, or a numeric
field without one, fails here (and at registration: `register_bounded`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest
from pydantic import Field

from rackplane.commands import (
    ArgBound,
    CommandArgs,
    CommandRouter,
    LeaseGate,
    bounds_of,
    numeric_fields,
    register_bounded,
)
from rackplane.config import validate_data
from rackplane.core.leases import LeaseTable
from rackplane.errors import ConfigError
from racky.config import RackyConfig
from tests.unit.test_commands import CaptureLog, make_rig
from tests.unit.test_racky_commands import make_rack
from valvey.commands import VALVEY_OUTPUTS
from valvey.config import ValveyConfig

# Valid args of every verb with a numeric field (the walk replaces one field at a time).
# A new verb with a numeric argument must be added here (the walk fails until it is).
BASE_ARGS: dict[str, dict[str, dict[str, Any]]] = {
    "racky": {
        "power_down_trays": {"trays": [1], "reason": "t"},
        "power_up_trays": {"trays": [1], "reason": "t"},
        "clear_tray_cap": {"trays": [1], "reason": "t"},
        "cap_rack": {"power_w": 100_000.0, "ttl_s": 60.0, "reason": "t"},
        "set_budget": {"power_w": 120_000.0, "reason": "t"},
        "start_validation": {"stage": "node", "trays": [1], "load_s": 60.0,
                             "backend_s": 0.0},
        "shelve_alarm": {"alarm_id": "cap_drift", "duration_s": 600.0},
        "set_tray_cap": {"trays": [1], "power_w": 5000.0, "ttl_s": 60.0, "reason": "t"},
        "cycle_trays": {"trays": [1], "off_s": 10.0, "reason": "t"},
        "acquire_lease": {"output": "rack_cap", "ttl_s": 60.0},
    },
    "valvey": {
        "set_setpoint": {"setpoint_c": 40.0},
        "set_mode": {"mode": "manual", "output_pct": 50.0},
        "shelve_alarm": {"alarm_id": "supply_pv_invalid", "duration_s": 600.0},
        "set_dp_setpoint": {"dp_setpoint_kpa": 150.0},
        "set_flow_setpoint": {"flow_setpoint_lpm": 198.0},
        "start_step_test": {"step_pct": 5.0},
        "start_commissioning": {"step_pct": 4.0},
        "acquire_lease": {"output": "facility_valve", "ttl_s": 60.0},
    },
}

Call = Callable[[str, Mapping[str, Any]], dict[str, Any]]


def _valvey() -> tuple[CommandRouter, Call, Callable[[], Any]]:
    rig = make_rig(leases=lambda router: LeaseGate(router, LeaseTable(VALVEY_OUTPUTS),
                                                   log=CaptureLog()))
    n = iter(range(1, 1_000_000))
    return (rig.router, lambda v, a: rig.call(v, a, rid=f"b-{next(n)}"),
            lambda: (rig.core.state(), rig.core.loop.setpoint_c, rig.core.pumps.setpoint))


def _racky() -> tuple[CommandRouter, Call, Callable[[], Any]]:
    rig = make_rack()
    return rig.router, lambda v, a: rig.call(v, a), rig.fingerprint


RIGS = {"racky": _racky, "valvey": _valvey}


def _outside(b: ArgBound, integer: bool) -> list[float]:
    """Values outside ``b``: just below and above, far beyond (1e300: capping off), and a
    wrong unit (a thousandth of the low limit: kW sent as W)."""
    span = max(1.0, abs(b.hi - b.lo))
    vals = [b.lo - 0.5 * span, b.hi + 0.5 * span, 1e300, -1e300]
    vals.append(b.lo if b.lo_open else b.lo - (1 if integer else 1e-3 * span))
    vals.append(b.hi if b.hi_open else b.hi + (1 if integer else 1e-3 * span))
    if b.lo > 0:
        vals.append(b.lo / 1000.0)
    return [float(int(v)) if integer else v for v in vals]


def _put(args: dict[str, Any], name: str, value: float, integer: bool) -> dict[str, Any]:
    out = dict(args)
    v: Any = int(value) if integer else value
    out[name] = [v] if isinstance(args.get(name), list) else v
    return out


@pytest.mark.parametrize("daemon", ["racky", "valvey"])
def test_every_numeric_argument_of_every_verb_is_bounded_and_refused_outside(
        daemon: str) -> None:
    router, call, fingerprint = RIGS[daemon]()
    tables = bounds_of(router)
    models = router.verb_args()
    walked = 0
    for verb, model in models.items():
        fields = numeric_fields(model)
        if not fields:
            continue
        table = tables[verb]
        assert table is not None, f"{daemon} {verb}: registered without bounds"
        assert set(fields) <= set(table), f"{daemon} {verb}: unbounded {fields}"
        assert verb in BASE_ARGS[daemon], f"{daemon} {verb}: add valid args to BASE_ARGS"
        base = BASE_ARGS[daemon][verb]
        for name in fields:
            b = table[name]()
            assert b.lo <= b.hi
            integer = isinstance(base.get(name), list) or model.model_fields[
                name].annotation is int
            for value in _outside(b, integer):
                before = fingerprint()
                r = call(verb, _put(base, name, value, integer))
                assert not r["ok"] and r["error"]["code"] == b.code, (verb, name, value, r)
                msg = r["error"]["message"]
                assert f"args.{name} = " in msg and b.describe() in msg, msg
                assert f"{value:g}" in msg or f"{value:.6g}" in msg, msg
                assert fingerprint() == before, f"{verb} {name}={value} changed the state"
                walked += 1
            for value in (b.lo, b.hi):  # the limits themselves are inside (unless open)
                if (value == b.lo and b.lo_open) or (value == b.hi and b.hi_open):
                    continue
                r = call(verb, _put(base, name, value, integer))
                assert r["ok"] or r["error"]["code"] != b.code or f"args.{name}" not in \
                    r["error"]["message"], (verb, name, value, r)
    assert walked >= 40


def test_the_field_findings_are_refused_with_the_limits() -> None:
    """Issue 14: set_budget 1e300 / 0.001 / 120 (kW meant), cap_rack the same, a DP setpoint
    of 500 kPa above the 450 kPa maximum pressure."""
    _router, call, _fp = _racky()
    for value in (1e300, 0.001, 0.5, 120.0):
        r = call("set_budget", {"power_w": value, "reason": "t"})
        assert r["error"]["code"] == "out_of_range", r
        assert "264000] W" in r["error"]["message"]
        r = call("cap_rack", {"power_w": value, "ttl_s": 60.0, "reason": "t"})
        assert r["error"]["code"] == "out_of_range", r
    assert call("set_budget", {"power_w": 120_000.0, "reason": "t"})["ok"]
    assert call("set_budget", {"power_w": None, "reason": "back to config"})["ok"]
    _r, vcall, _vfp = _valvey()
    r = vcall("set_dp_setpoint", {"dp_setpoint_kpa": 500.0})
    assert r["error"]["code"] == "out_of_range"
    assert "args.dp_setpoint_kpa = 500 kPa is outside [50, 300] kPa" in r["error"]["message"]
    assert "max_pressure_kpa = 450" in r["error"]["message"]


def test_registration_refuses_a_numeric_argument_without_bounds() -> None:
    class Args(CommandArgs):
        power_w: float = Field(allow_inf_nan=False)
        trays: list[int] = Field(default_factory=list)

    router, _call, _fp = _valvey()
    with pytest.raises(ValueError, match=r"\['power_w', 'trays'\] have no bounds"):
        register_bounded(router, "new_verb", Args, lambda a, c: {}, "operator", {})
    with pytest.raises(ValueError, match="unknown arguments"):
        register_bounded(router, "new_verb", Args, lambda a, c: {}, "operator",
                         {"power_w": lambda: ArgBound(0, 1, "W", "x"),
                          "trays": lambda: ArgBound(0, 1, "", "x"),
                          "nope": lambda: ArgBound(0, 1, "", "x")})
    assert "new_verb" not in router.verbs


@pytest.mark.parametrize(("model", "data", "text"), [
    (ValveyConfig, {"pump_loop": {"dp_setpoint_max_kpa": 500.0}},
     "dp_setpoint_max_kpa = 500 kPa must be below max_pressure_kpa = 450 kPa"),
    (ValveyConfig, {"pump_loop": {"dp_setpoint_kpa": 400.0}},
     "dp_setpoint_kpa = 400 kPa is outside [50, 300] kPa"),
    (ValveyConfig, {"pump_loop": {"mode": "flow", "flow_setpoint_lpm": 12.0}},
     "flow_setpoint_lpm = 12 L/min is outside [50, 500] L/min"),
    (RackyConfig, {"power": {"budget_w": 120}}, "power.budget_w = 120 W is outside [25020, "),
    (RackyConfig, {"power": {"budget_w": 1e9}}, "264000] W"),
])
def test_config_limits_of_command_bounds_name_value_and_limits(
        model: type[Any], data: dict[str, Any], text: str) -> None:
    with pytest.raises(ConfigError) as exc:
        validate_data(model, data)
    assert text in str(exc.value)


def test_a_persisted_budget_beyond_the_capacity_counts_as_the_capacity_and_alarms() -> None:
    """The same argument by another path: a budget an older version accepted (1e300 W) and
    persisted is never believed; the rack is capped at its capacity (the safe side) and
    ``budget_out_of_range`` names it until an operator sets a valid budget."""
    from racky.core.controller import RackyCore, RackyInputs
    from racky.core.lifecycle import Lifecycle, PersistedState

    cfg = RackyConfig()
    ps = PersistedState(Lifecycle("production", 0, "new", "test"), budget_w=1e300,
                        budget_set=True)
    core = RackyCore(cfg, 0.0, ps)
    assert core.budget_w == cfg.power.rack_capacity_w
    core.step(1.0, RackyInputs())
    active = {a.id: a for a in core.bank.active()}
    assert "budget_out_of_range" in active
    assert "264.0 kW" in active["budget_out_of_range"].message
    core.set_budget(120_000.0)
    core.step(2.0, RackyInputs())
    assert core.budget_w == 120_000.0
    assert "budget_out_of_range" not in {a.id for a in core.bank.active()}


@pytest.mark.parametrize(("args", "shown"), [
    ({"power_w": 264000.0000001}, "264000.0000001 W"),
    ({"power_w": 25019.9999}, "25019.9999 W"),
    ({"power_w": 2.9e5}, "290000 W"),
])
def test_a_value_just_outside_a_limit_is_never_printed_as_the_limit(
        args: dict[str, Any], shown: str) -> None:
    """Acceptance round 2 of issue 14: a budget a hair above the capacity was refused as
    "264000 W is outside [25020, 264000] W": the value shown must differ from the limit."""
    _router, call, _fp = _racky()
    r = call("set_budget", {**args, "reason": "t"})
    assert r["error"]["code"] == "out_of_range"
    assert f"args.power_w = {shown} is outside [25020, 264000] W" in r["error"]["message"]
