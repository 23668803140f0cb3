"""A command's refusal names every problem of its args at once (new-user trial): ``set_budget``
with a budget out of range and no reason used to say only "reason missing"; the operator
fixed that and was then refused for the range. The model's problems and the bounds' come
in one reply, in the order of the args model's fields, the code that of the first
(rackplane/core/envelope.py ``args_refusal``, rackplane/commands/bounds.py)."""

from __future__ import annotations

from rackplane.commands import numeric_fields
from rackplane.commands.bounds import bounds_of
from racky.fleet_settings import BEYOND_GRANT
from tests.unit.test_command_bounds import BASE_ARGS, RIGS, _outside, _put
from tests.unit.test_racky_commands import make_rack


def test_set_budget_out_of_range_without_a_reason_names_both() -> None:
    _router, call, fingerprint = RIGS["racky"]()
    before = fingerprint()
    r = call("set_budget", {"power_w": 120.0})
    assert not r["ok"]
    msg = r["error"]["message"]
    # power_w comes before reason in the args: its code first, both problems listed
    assert r["error"]["code"] == "out_of_range", r
    assert "args.power_w = 120 W is outside [" in msg and "args.reason: Field required" in msg
    assert msg.index("args.power_w") < msg.index("args.reason")
    assert fingerprint() == before


def test_two_arguments_out_of_range_are_both_named() -> None:
    _router, call, _fp = RIGS["racky"]()
    r = call("cap_rack", {"power_w": 1e300, "ttl_s": 1e6, "reason": "t"})
    msg = r["error"]["message"]
    assert r["error"]["code"] == "out_of_range"
    assert "args.power_w = 1e+300 W" in msg and "args.ttl_s = 1e+06 s" in msg, msg


def test_an_earlier_field_s_problem_gives_the_code() -> None:
    """valvey's shelve_alarm: a bad alarm id (declared first) and a too-short shelve."""
    _router, call, _fp = RIGS["valvey"]()
    r = call("shelve_alarm", {"alarm_id": "NOT AN ID", "duration_s": 5.0})
    msg = r["error"]["message"]
    assert r["error"]["code"] == "invalid_args", r
    assert "args.alarm_id" in msg and "args.duration_s = 5 s is outside [60, 28800] s" in msg


def test_every_bounded_argument_is_named_beside_another_problem() -> None:
    """The whole kind, racky's and valvey's verbs: each numeric argument out of range with an
    unknown key beside it: both named, the bound's code (unknown keys come last)."""
    walked = 0
    for daemon in ("racky", "valvey"):
        router, call, fingerprint = RIGS[daemon]()
        tables = bounds_of(router)
        for verb, model in router.verb_args().items():
            table = tables[verb]
            for name in numeric_fields(model):
                assert table is not None
                b = table[name]()
                base = BASE_ARGS[daemon][verb]
                integer = isinstance(base.get(name), list) or model.model_fields[
                    name].annotation is int
                value = _outside(b, integer)[1]
                before = fingerprint()
                r = call(verb, {**_put(base, name, value, integer), "bogus": 1})
                msg = r["error"]["message"]
                assert r["error"]["code"] == b.code, (daemon, verb, name, r)
                assert f"args.{name} = " in msg and "args.bogus" in msg, (daemon, verb, msg)
                assert fingerprint() == before
                walked += 1
    assert walked >= 15


def test_set_budget_beyond_the_fleet_grant_without_a_reason_names_both() -> None:
    """racky's fleet grant is checked with the arguments (it was in the handler: after the
    model's "reason missing")."""
    rig = make_rack()
    rig.core.fleet_budget_w = 60_000.0
    r = rig.call("set_budget", {"power_w": 70_000.0})
    msg = r["error"]["message"]
    assert r["error"]["code"] == BEYOND_GRANT, r
    assert "fleet grant 60000 W" in msg and "args.reason: Field required" in msg
    # beyond the capacity too: out_of_range (the bound) is that argument's problem
    r = rig.call("set_budget", {"power_w": 1e9, "reason": "t"})
    assert r["error"]["code"] == "out_of_range" and "fleet grant" not in r["error"]["message"]
    assert rig.call("set_budget", {"power_w": 55_000.0, "reason": "t"})["ok"]
