"""The command path without a broker: rackplane.commands.CommandRouter driven with constructed
`Message`s (a real, never-connected `MqttLink` gives the topics; replies are captured through
the router's ``reply`` injection point) and valvey's verbs on a real `ValveyCore`.

DESIGN §1 (commands), §3 (MQTT contract: cmd/<user>/<verb>, {request_id, ok, error, state},
roles from config, never acted on when retained or expired, JSON Schemas shipped).
FIELD-CASES BR-22 a (a DUP redelivery is answered, never re-applied), BR-24 (the handler never
awaits anything real: `drive` fails if it suspends).
"""

from __future__ import annotations

import json
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rackplane.clock import FakeClock
from rackplane.commands import (
    ROLE_RANK,
    ROUTER_CODES,
    SCHEMA_DIR,
    CommandArgs,
    CommandAudit,
    CommandContext,
    CommandReply,
    CommandRouter,
    LeaseGate,
    NoArgs,
    load_schema,
    schema_documents,
    stale_schemas,
)
from rackplane.config import validate_data
from rackplane.core.alarms import AlarmEvent
from rackplane.core.leases import LeaseTable
from rackplane.core.samples import good
from rackplane.errors import CommandError, ConfigError
from rackplane.io.mqtt import Message, MqttLink
from rackplane.settings import CommandSettings, Identity, MqttSettings
from valvey.commands import VALVEY_OUTPUTS, register_valvey_commands, valvey_verb_args
from valvey.config import CduPoints, ControlSettings, ValveyConfig
from valvey.core.controller import ValveyCore
from valvey.core.supply_loop_settings import (
    SUPPLY_LOOP_FAILSAFE,
    SUPPLY_PV_INVALID,
    SupplyLoopSettings,
)

USERS = {"alice": "operator", "bms": "automation", "viewer": "reader"}
HANDLER_CODES = {"out_of_range", "invalid_value", "unknown_alarm", "invalid_shelve_time"}
KNOWN_CODES = ROUTER_CODES | HANDLER_CODES


def drive(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine that must finish without suspending (the router never blocks or waits:
    with a capture as ``reply`` nothing in it may await a real event)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise AssertionError("the command handler suspended: it must never wait on the loop")


class CaptureLog:
    """A structlog-shaped logger that records (level, event, fields)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []

    def _rec(self, level: str) -> Any:
        def f(event: str, **kw: Any) -> None:
            self.events.append((level, event, kw))
        return f

    def __getattr__(self, level: str) -> Any:
        if level in ("debug", "info", "warning", "error", "exception", "critical"):
            return self._rec(level)
        raise AttributeError(level)

    def named(self, event: str) -> list[tuple[str, str, dict[str, Any]]]:
        return [e for e in self.events if e[1] == event]


@dataclass
class Rig:
    clock: FakeClock
    link: MqttLink
    router: CommandRouter
    core: ValveyCore
    replies: list[tuple[Message, dict[str, Any]]] = field(default_factory=list)
    audits: list[CommandAudit] = field(default_factory=list)
    alarm_events: list[AlarmEvent] = field(default_factory=list)
    log: CaptureLog = field(default_factory=CaptureLog)

    def msg(
        self,
        verb: str,
        args: Mapping[str, Any] | None = None,
        *,
        user: str = "alice",
        rid: str = "r-1",
        issued_offset_s: float = 0.0,
        payload: bytes | None = None,
        retain: bool = False,
        dup: bool = False,
        response_topic: str | None = None,
        correlation_data: bytes | None = None,
    ) -> Message:
        if payload is None:
            env: dict[str, Any] = {"request_id": rid, "issued_at": self.iso(issued_offset_s)}
            if args is not None:
                env["args"] = dict(args)
            payload = json.dumps(env).encode()
        return Message(
            topic=f"{self.link.topics.base}/cmd/{user}/{verb}" if "/" not in verb else verb,
            payload=payload, qos=1, retain=retain, dup=dup,
            received_mono=self.clock.monotonic(), response_topic=response_topic,
            correlation_data=correlation_data,
        )

    def iso(self, offset_s: float = 0.0) -> str:
        return datetime.fromtimestamp(self.clock.wall_ns() / 1e9 + offset_s, tz=UTC).isoformat()

    def send(self, msg: Message) -> dict[str, Any]:
        """Handle one message; exactly one reply, which is returned."""
        n = len(self.replies)
        drive(self.router.handle(msg))
        assert len(self.replies) == n + 1, "exactly one reply per command"
        reply = self.replies[-1][1]
        CommandReply.model_validate(reply)  # the reply schema's model
        return reply

    def call(self, verb: str, args: Mapping[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
        return self.send(self.msg(verb, args, **kw))


def make_core(clock: FakeClock, loop: SupplyLoopSettings | None = None,
              alarms: bool = False) -> ValveyCore:
    """A core in auto (valve read-back 30 %, supply 45 °C); with ``alarms`` the PV is then lost
    for 4 s, raising supply_pv_invalid (2 s on-delay) and the latched fail-safe alarm."""
    core = ValveyCore(loop or SupplyLoopSettings(), CduPoints(), ControlSettings(),
                      clock.monotonic())
    for _ in range(15):
        clock.advance(0.1)
        t = clock.monotonic()
        core.step(t, {
            "supply_temp_c": good("supply_temp_c", 45.0, "degC", clock.wall_ns(), t),
            "valve_command_pct": good("valve_command_pct", 30.0, "pct", clock.wall_ns(), t),
        })
    assert core.loop.control_mode == "auto"
    if alarms:
        for _ in range(40):
            clock.advance(0.1)
            core.step(clock.monotonic(), {})
        active = {a.id for a in core.alarms.active()}
        assert {SUPPLY_PV_INVALID, SUPPLY_LOOP_FAILSAFE} <= active
    return core


def make_rig(
    settings_kw: Mapping[str, Any] | None = None,
    *,
    loop: SupplyLoopSettings | None = None,
    alarms: bool = False,
    audit_raises: bool = False,
    leases: Any = None,
) -> Rig:
    clock = FakeClock()
    link = MqttLink(MqttSettings(), Identity(site="lab", rack="r1"), "valvey", clock=clock)
    core = make_core(clock, loop, alarms)
    cmd_settings = CommandSettings(**{"users": USERS, **(settings_kw or {})})
    rig = Rig(clock, link, None, core)  # type: ignore[arg-type]

    async def reply(msg: Message, payload: Mapping[str, Any]) -> str:
        rig.replies.append((msg, dict(payload)))
        assert msg.response_topic is not None  # the router always chooses the topic
        return msg.response_topic

    def audit(a: CommandAudit) -> None:
        rig.audits.append(a)
        if audit_raises:
            raise RuntimeError("tsdb closed")

    rig.router = CommandRouter(link, cmd_settings, clock=clock, audit=audit, log=rig.log,
                               reply=reply)
    register_valvey_commands(rig.router, core, on_alarm_events=rig.alarm_events.extend,
                             leases=leases(rig.router) if callable(leases) else None)
    return rig


def loop_fingerprint(core: ValveyCore) -> tuple[Any, ...]:
    loop = core.loop
    return (loop.setpoint_c, loop.control_mode, loop.shadow, loop.command_pct,
            tuple((a.id, a.state, a.acked, a.shelved, a.shelved_until)
                  for a in core.alarms.active()))


def error_code(reply: Mapping[str, Any]) -> str | None:
    err = reply["error"]
    return None if err is None else str(err["code"])


# --- schemas -------------------------------------------------------------------------------


def test_committed_schemas_match_the_models() -> None:
    """Regenerate with ``rackctl schemas --write`` when this fails."""
    verbs = {"valvey": valvey_verb_args()}
    assert stale_schemas(SCHEMA_DIR, verbs) == []
    names = set(schema_documents(verbs))
    assert {"command-envelope.schema.json", "command-reply.schema.json",
            "valvey.set_setpoint.args.schema.json", "valvey.shelve_alarm.args.schema.json"} <= names
    for name in names:  # shipped as package data, readable through importlib.resources
        doc = load_schema(name)
        assert doc["$schema"].endswith("2020-12/schema") and doc["type"] == "object"
    env = load_schema("command-envelope.schema.json")
    assert set(env["required"]) == {"request_id", "issued_at"}
    assert env["additionalProperties"] is False
    shelve = load_schema("valvey.shelve_alarm.args.schema.json")["properties"]["duration_s"]
    assert (shelve["minimum"], shelve["maximum"]) == (60.0, 28800.0)


def test_stale_schema_is_detected(tmp_path: Any) -> None:
    from rackplane.commands import write_schemas

    verbs = {"valvey": valvey_verb_args()}
    assert len(write_schemas(tmp_path, verbs)) == len(schema_documents(verbs))
    assert write_schemas(tmp_path, verbs) == []  # nothing differs: nothing rewritten
    p = tmp_path / "valvey.set_setpoint.args.schema.json"
    p.write_text(p.read_text().replace("setpoint_c", "setpoint"))
    assert stale_schemas(tmp_path, verbs) == ["valvey.set_setpoint.args.schema.json"]


# --- accepted commands ----------------------------------------------------------------------


def test_get_state_needs_no_config_any_user_is_reader() -> None:
    rig = make_rig({"users": {}})
    reply = rig.call("get_state", {}, user="someone")
    assert reply["ok"] is True and reply["error"] is None and reply["request_id"] == "r-1"
    state = reply["state"]
    assert state["mode"] == "auto" and state["setpoint_c"] == 45.0 and "changed" not in state
    # The envelope's args may be left out for a verb without args.
    assert rig.call("get_state", None, user="someone", rid="r-2")["ok"] is True
    # ...but everything else is operator-only by default.
    assert error_code(rig.call("set_setpoint", {"setpoint_c": 40}, user="someone",
                               rid="r-3")) == "forbidden"
    assert rig.core.loop.setpoint_c == 45.0


def test_set_setpoint_applied_and_reported() -> None:
    rig = make_rig()
    reply = rig.call("set_setpoint", {"setpoint_c": 40})  # a JSON integer is a number
    assert reply["ok"] is True
    assert reply["state"]["setpoint_c"] == 40.0
    assert reply["state"]["changed"] == {"setpoint_c": {"from": 45.0, "to": 40.0}}
    assert rig.core.loop.setpoint_c == 40.0
    st = rig.router.stats
    assert (st.received, st.applied, st.refused, st.duplicates) == (1, 1, {}, 0)


def test_set_setpoint_out_of_config_limits_refused_by_the_loop() -> None:
    rig = make_rig()
    for i, sp in enumerate((24.9, 48.5, 100)):
        reply = rig.call("set_setpoint", {"setpoint_c": sp}, rid=f"r-{i}")
        assert error_code(reply) == "out_of_range" and reply["state"] is None
        assert "setpoint_c" in reply["error"]["message"]
    assert rig.core.loop.setpoint_c == 45.0
    assert rig.router.stats.refused == {"out_of_range": 3}


def test_set_mode_manual_auto_and_shadow() -> None:
    rig = make_rig(loop=SupplyLoopSettings(output_max_pct=80.0, failsafe_output_pct=80.0))
    # Manual beyond the configured output limit: the loop refuses, nothing changes.
    r = rig.call("set_mode", {"mode": "manual", "output_pct": 90}, rid="m-0")
    assert error_code(r) == "out_of_range"
    assert rig.core.loop.control_mode == "auto"
    r = rig.call("set_mode", {"mode": "manual", "output_pct": 55.5}, rid="m-1")
    assert r["ok"] and rig.core.loop.control_mode == "manual"
    assert r["state"]["changed"]["control_mode"] == {"from": "auto", "to": "manual"}
    assert r["state"]["changed"]["valve_target_pct"] == {"from": 30.0, "to": 55.5}
    assert r["state"]["control_mode"] == "manual"  # live, not the last tick's
    r = rig.call("set_mode", {"mode": "auto"}, rid="m-2")
    assert r["ok"] and rig.core.loop.control_mode == "auto"
    r = rig.call("set_mode", {"mode": "auto"}, rid="m-3")
    assert r["ok"] and r["state"]["changed"] == {}  # nothing to change
    r = rig.call("set_mode", {"mode": "shadow_on"}, rid="m-4")
    assert r["ok"] and rig.core.loop.shadow and r["state"]["mode"] == "shadow"
    assert r["state"]["changed"] == {"shadow": {"from": False, "to": True}}
    r = rig.call("set_mode", {"mode": "shadow_off"}, rid="m-5")
    assert r["ok"] and not rig.core.loop.shadow


@pytest.mark.parametrize(("args", "code", "path"), [
    ({"mode": "manual"}, "invalid_args", "args: Value error, output_pct is required"),
    ({"mode": "auto", "output_pct": 10}, "invalid_args",
     "args: Value error, output_pct is only accepted"),
    ({"mode": "manual", "output_pct": 101}, "out_of_range",
     "args.output_pct = 101 % is outside [0, 100] %"),
    ({"mode": "hand"}, "invalid_args", "args.mode: Input should be 'auto'"),
    ({"mode": "manual", "output_pct": "50"}, "wrong_type",
     "args.output_pct: Input should be a valid number"),
    ({"mode": "manual", "output_pct": True}, "wrong_type",
     "args.output_pct: Input should be a valid number"),
])
def test_set_mode_invalid_args(args: dict[str, Any], code: str, path: str) -> None:
    rig = make_rig()
    before = loop_fingerprint(rig.core)
    reply = rig.call("set_mode", args)
    assert error_code(reply) == code
    assert path in reply["error"]["message"]
    assert loop_fingerprint(rig.core) == before


def test_ack_and_shelve_alarms() -> None:
    rig = make_rig(alarms=True)
    now = rig.clock.monotonic()
    r = rig.call("ack_alarm", {"alarm_id": SUPPLY_PV_INVALID}, rid="a-1")
    assert r["ok"] and r["state"]["changed"]["alarm"]["events"] == ["acked"]
    assert r["state"]["changed"]["alarm"]["acked"] is True
    assert [(e.id, e.kind, e.user) for e in rig.alarm_events] == [
        (SUPPLY_PV_INVALID, "acked", "alice")]  # handed to the daemon to publish
    snap = {a.id: a for a in rig.core.alarms.active()}[SUPPLY_PV_INVALID]
    assert snap.acked and snap.acked_by == "alice"
    # Acks are idempotent: a new request acking again changes nothing.
    assert rig.call("ack_alarm", {"alarm_id": SUPPLY_PV_INVALID}, rid="a-2")["ok"]
    assert len(rig.alarm_events) == 1

    r = rig.call("shelve_alarm", {"alarm_id": SUPPLY_LOOP_FAILSAFE, "duration_s": 600},
                 rid="s-1")
    assert r["ok"]
    snap = {a.id: a for a in rig.core.alarms.active()}[SUPPLY_LOOP_FAILSAFE]
    assert snap.shelved and snap.shelved_until == pytest.approx(now + 600.0)  # monotonic expiry
    assert r["state"]["changed"]["alarm"]["shelved_until_mono"] == pytest.approx(now + 600.0)
    assert rig.alarm_events[-1].kind == "shelved"


@pytest.mark.parametrize(("verb", "args", "code", "text"), [
    ("ack_alarm", {"alarm_id": "no_such_alarm"}, "unknown_alarm", "no_such_alarm"),
    ("shelve_alarm", {"alarm_id": "no_such_alarm", "duration_s": 600}, "unknown_alarm", "no_"),
    ("ack_alarm", {"alarm_id": "Bad Id"}, "invalid_args", "args.alarm_id"),
    ("shelve_alarm", {"alarm_id": SUPPLY_PV_INVALID, "duration_s": 59}, "out_of_range",
     "args.duration_s = 59 s is outside [60, 28800] s"),
    ("shelve_alarm", {"alarm_id": SUPPLY_PV_INVALID, "duration_s": 28801}, "out_of_range",
     "args.duration_s = 28801 s is outside [60, 28800] s"),
    ("shelve_alarm", {"alarm_id": SUPPLY_PV_INVALID}, "invalid_args",
     "args.duration_s: Field required"),
])
def test_alarm_verbs_refused(verb: str, args: dict[str, Any], code: str, text: str) -> None:
    rig = make_rig(alarms=True)
    before = loop_fingerprint(rig.core)
    reply = rig.call(verb, args)
    assert error_code(reply) == code and text in reply["error"]["message"]
    assert loop_fingerprint(rig.core) == before and rig.alarm_events == []


# --- refusals ---------------------------------------------------------------------------------


def test_retained_command_never_executed() -> None:
    rig = make_rig()
    reply = rig.call("set_setpoint", {"setpoint_c": 40}, retain=True)
    assert error_code(reply) == "retained" and reply["request_id"] == "r-1"  # matchable
    junk = rig.send(rig.msg("set_setpoint", payload=b"\xff{", retain=True))
    assert error_code(junk) == "retained" and junk["request_id"] is None
    assert rig.core.loop.setpoint_c == 45.0
    # Not remembered either: the same request sent properly afterwards is applied.
    assert rig.call("set_setpoint", {"setpoint_c": 40})["ok"]
    assert rig.core.loop.setpoint_c == 40.0


def test_too_large_refused_before_parsing() -> None:
    rig = make_rig({"max_payload_bytes": 1024})
    env = {"request_id": "big-1", "issued_at": rig.iso(), "args": {"setpoint_c": 40},
           "pad": "x" * 2000}
    reply = rig.send(rig.msg("set_setpoint", payload=json.dumps(env).encode()))
    assert error_code(reply) == "too_large" and reply["request_id"] is None
    assert "1024" in reply["error"]["message"]


@pytest.mark.parametrize(("payload", "code", "text"), [
    (b"", "bad_json", "empty payload"),
    (b"\xff\xfe{}", "bad_json", "not UTF-8"),
    (b"{not json", "bad_json", "not valid JSON"),
    (b'{"request_id": "a"} trailing', "bad_json", "not valid JSON"),
    (b'{"request_id": NaN}', "non_finite", "NaN is not valid JSON"),
    (b'{"x": Infinity}', "non_finite", "Infinity is not valid JSON"),
    (b'{"x": -Infinity}', "non_finite", "Infinity is not valid JSON"),
    (b'{"x": 1e400}', "non_finite", "beyond a double's range"),
    (b'{"x": [-2.5e999]}', "non_finite", "beyond a double's range"),
    (b'{"request_id": "a", "request_id": "b"}', "duplicate_key", "duplicate key 'request_id'"),
    (b'{"args": {"a": 1, "a": 1}}', "duplicate_key", "duplicate key 'a'"),
    (b"[" * 3000 + b"]" * 3000, "too_deep", "nested deeper than 32 levels"),
    (b'{"request_id": "n-1", "issued_at": "x", "args": {"a": ' + b"[" * 40 + b"]" * 40 + b"}}",
     "too_deep", "nested deeper than 32 levels"),
    (b"[1, 2]", "wrong_type", "must be a JSON object, got an array"),
    (b'"a string"', "wrong_type", "got a string"),
    (b"null", "wrong_type", "got null"),
    (b"1" * 5000, "bad_json", "not valid JSON"),  # more digits than Python converts
])
def test_bad_json(payload: bytes, code: str, text: str) -> None:
    """Each kind of hostile JSON is refused with its own code (issue 14 item 13)."""
    rig = make_rig({"max_payload_bytes": 16384})
    reply = rig.send(rig.msg("get_state", payload=payload))
    assert error_code(reply) == code and reply["request_id"] is None
    assert text in reply["error"]["message"]


@pytest.mark.parametrize(("env", "rid", "text"), [
    ({"issued_at": "T"}, None, "request_id: Field required"),
    ({"request_id": "e-1"}, "e-1", "issued_at: Field required"),
    ({"request_id": "e-2", "issued_at": "2026-01-01T00:00:00"}, "e-2",
     "issued_at: Input should have timezone info"),
    ({"request_id": "e-3", "issued_at": 1767225600}, "e-3", "issued_at: Value error, must be "
     "an RFC 3339 timestamp string"),
    ({"request_id": "e-4", "issued_at": "yesterday"}, "e-4", "issued_at: Input should be a "
     "valid datetime"),
    # numbers as strings: pydantic read them as unix s / ms and "-1" as 1969 (issue 14 round 2)
    ({"request_id": "e-7", "issued_at": "1767225600"}, "e-7", "issued_at: Value error, must be "
     "an RFC 3339 timestamp string"),
    ({"request_id": "e-8", "issued_at": "1767225600000"}, "e-8", "issued_at: Value error, must "
     "be an RFC 3339 timestamp string"),
    ({"request_id": "e-9", "issued_at": "-1"}, "e-9", "issued_at: Value error, must be an RFC "
     "3339 timestamp string"),
    ({"request_id": "e-10", "issued_at": " 1.7672256e9 "}, "e-10", "issued_at: Value error, "
     "must be an RFC 3339 timestamp string"),
    ({"request_id": "bad id!", "issued_at": "NOW"}, None, "request_id: String should match"),
    ({"request_id": "x" * 65, "issued_at": "NOW"}, None, "request_id: String should have at most"),
    ({"request_id": 7, "issued_at": "NOW"}, None, "request_id: Input should be a valid string"),
    ({"request_id": "e-5", "issued_at": "NOW", "args": [1]}, "e-5", "args: Input should be a "
     "valid dictionary"),
    ({"request_id": "e-6", "issued_at": "NOW", "role": "operator"}, "e-6",
     "role: Extra inputs are not permitted"),  # a role in the payload is never honoured
])
def test_invalid_envelope_names_key_paths(env: dict[str, Any], rid: str | None,
                                          text: str) -> None:
    rig = make_rig()
    if env.get("issued_at") == "NOW":
        env["issued_at"] = rig.iso()
    reply = rig.send(rig.msg("get_state", payload=json.dumps(env).encode()))
    assert error_code(reply) == "invalid_envelope"
    assert reply["request_id"] == rid  # echoed when readable, else null
    assert text in reply["error"]["message"]


def test_expired_and_from_future_use_the_injected_wall_clock() -> None:
    rig = make_rig({"ttl_s": 300.0, "clock_skew_s": 30.0})
    assert rig.call("get_state", rid="t-1", issued_offset_s=-299.0)["ok"]
    r = rig.call("set_setpoint", {"setpoint_c": 40}, rid="t-2", issued_offset_s=-301.0)
    assert error_code(r) == "expired" and "ttl_s = 300" in r["error"]["message"]
    assert rig.call("get_state", rid="t-3", issued_offset_s=29.0)["ok"]
    r = rig.call("set_setpoint", {"setpoint_c": 40}, rid="t-4", issued_offset_s=31.0)
    assert error_code(r) == "from_future" and "clock_skew_s = 30" in r["error"]["message"]
    assert rig.core.loop.setpoint_c == 45.0
    # A command issued now but handled after a wall-clock step of +400 s (NTP) is expired:
    msg = rig.msg("set_setpoint", {"setpoint_c": 41}, rid="t-5")
    rig.clock.step_wall(400.0)
    assert error_code(rig.send(msg)) == "expired"
    assert rig.core.loop.setpoint_c == 45.0
    # Timezones are honoured: the same instant written with an offset is fresh.
    ny = datetime.fromtimestamp(rig.clock.wall_ns() / 1e9, tz=timezone(timedelta(hours=-5)))
    assert ny.isoformat().endswith("-05:00")
    env = {"request_id": "t-6", "issued_at": ny.isoformat(), "args": {"setpoint_c": 42}}
    assert rig.send(rig.msg("set_setpoint", payload=json.dumps(env).encode()))["ok"]


def test_unknown_verb_lists_known_verbs() -> None:
    rig = make_rig()
    reply = rig.call("set_speed", {"pump_speed_pct": 50})
    assert error_code(reply) == "unknown_verb"
    msg = reply["error"]["message"]
    for verb in ("get_state", "set_setpoint", "set_mode", "ack_alarm", "shelve_alarm"):
        assert verb in msg
    assert rig.audits[-1].tags()["verb"] == "_unknown"  # bounded tag cardinality


def test_roles_from_config_least_role_per_verb() -> None:
    rig = make_rig()
    calls: list[str] = []

    def nudge(_a: NoArgs, ctx: CommandContext) -> dict[str, Any]:
        calls.append(ctx.user)
        return {"role": ctx.role}

    rig.router.register("nudge", NoArgs, nudge, role="automation")
    expect = {  # user -> (get_state, nudge, set_setpoint)
        "viewer": ("ok", "forbidden", "forbidden"),
        "bms": ("ok", "ok", "forbidden"),
        "alice": ("ok", "ok", "ok"),
        "stranger": ("ok", "forbidden", "forbidden"),  # default_role reader
    }
    for user, codes in expect.items():
        got = tuple(
            error_code(rig.call(verb, args, user=user, rid=f"{user}-{verb}")) or "ok"
            for verb, args in (("get_state", {}), ("nudge", {}),
                               ("set_setpoint", {"setpoint_c": 40}))
        )
        assert got == codes, user
    assert calls == ["bms", "alice"]
    forbidden = next(r for _, r in rig.replies if error_code(r) == "forbidden")
    assert "needs" in forbidden["error"]["message"]
    # default_role from config, and a reload applies at once.
    rig.router.update_settings(CommandSettings(users=USERS, default_role="operator"))
    assert rig.call("set_setpoint", {"setpoint_c": 41}, user="stranger", rid="late")["ok"]


def test_handler_exception_is_internal_error_logged_with_traceback() -> None:
    rig = make_rig()

    def broken(_a: NoArgs, _ctx: CommandContext) -> dict[str, Any]:
        raise KeyError("bug")

    rig.router.register("broken", NoArgs, broken, role="reader")
    reply = rig.call("broken", {})
    assert error_code(reply) == "internal_error" and "nothing was applied" in \
        reply["error"]["message"]
    failed = rig.log.named("command_handler_failed")
    assert len(failed) == 1 and failed[0][0] == "error" and failed[0][2]["exc_info"] is True
    assert rig.router.stats.refused == {"internal_error": 1}


def test_handler_state_with_nan_sent_as_null_and_bad_state_still_ok() -> None:
    rig = make_rig()
    rig.router.register("nan", NoArgs, lambda _a, _c: {"x": float("nan"), "y": [1.5]},
                        role="reader")
    rig.router.register("odd", NoArgs, lambda _a, _c: {"when": object()}, role="reader")
    r = rig.call("nan", {})
    assert r["ok"] and r["state"] == {"x": None, "y": [1.5]}
    r = rig.call("odd", {}, rid="r-2")  # applied, state not sendable: ok, state null, logged
    assert r["ok"] and r["state"] is None and rig.log.named("command_state_invalid")


def test_command_error_from_a_handler_keeps_its_code() -> None:
    rig = make_rig()

    class Pct(CommandArgs):
        pct: float

    def refuse(a: Pct, _c: CommandContext) -> dict[str, Any]:
        raise CommandError("interlock_active", f"leak interlock holds the valve; {a.pct} ignored")

    rig.router.register("move", Pct, refuse)
    reply = rig.call("move", {"pct": 3})
    assert reply["error"] == {"code": "interlock_active",
                              "message": "leak interlock holds the valve; 3.0 ignored"}


def test_router_bug_is_answered_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = make_rig()

    def explode(*_a: Any) -> None:
        raise ZeroDivisionError("router bug")

    monkeypatch.setattr(rig.router, "_decide", explode)
    reply = rig.call("get_state", {})
    assert error_code(reply) == "internal_error" and reply["request_id"] is None
    assert rig.log.named("command_router_bug") and len(rig.audits) == 1


# --- duplicates (BR-22 a) -------------------------------------------------------------------


def test_br22a_dup_redelivery_answered_not_reapplied() -> None:
    rig = make_rig()
    first = rig.msg("set_setpoint", {"setpoint_c": 40}, rid="c-1")
    r1 = rig.send(first)
    assert r1["ok"] and rig.core.loop.setpoint_c == 40.0
    r2 = rig.call("set_setpoint", {"setpoint_c": 41}, rid="c-2")
    assert r2["ok"] and rig.core.loop.setpoint_c == 41.0
    # The broker redelivers c-1 with DUP (its PUBACK was lost): the cached reply, not 40 again.
    r3 = rig.send(replace(first, dup=True))
    assert r3 == r1
    assert rig.core.loop.setpoint_c == 41.0
    # A client retry of c-1 (same request, re-serialised with a new issued_at) as well.
    assert rig.call("set_setpoint", {"setpoint_c": 40}, rid="c-1", issued_offset_s=5) == r1
    assert rig.core.loop.setpoint_c == 41.0
    st = rig.router.stats
    assert (st.received, st.applied, st.duplicates) == (4, 2, 2)
    assert [a.outcome for a in rig.audits] == ["ok", "ok", "duplicate", "duplicate"]


def test_duplicate_of_a_refusal_gets_the_same_refusal() -> None:
    rig = make_rig()
    r1 = rig.call("set_setpoint", {"setpoint_c": 40}, user="viewer", rid="v-1")
    assert error_code(r1) == "forbidden"
    rig.router.update_settings(CommandSettings(users={**USERS, "viewer": "operator"}))
    assert rig.call("set_setpoint", {"setpoint_c": 40}, user="viewer", rid="v-1") == r1
    assert rig.core.loop.setpoint_c == 45.0  # what the client was told still holds


def test_request_id_reused_for_another_command_refused() -> None:
    rig = make_rig()
    assert rig.call("set_setpoint", {"setpoint_c": 40}, rid="same")["ok"]
    r = rig.call("set_setpoint", {"setpoint_c": 42}, rid="same")
    assert error_code(r) == "request_id_reused" and r["request_id"] == "same"
    r = rig.call("get_state", {}, rid="same")
    assert error_code(r) == "request_id_reused"
    assert rig.core.loop.setpoint_c == 40.0
    # Per user: another user may use the same id.
    assert rig.call("get_state", {}, user="viewer", rid="same")["ok"]


def test_dedup_cache_is_bounded_lru() -> None:
    rig = make_rig({"dedup_entries": 16})
    first = rig.msg("set_setpoint", {"setpoint_c": 40}, rid="old")
    assert rig.send(first)["ok"]
    for i in range(16):
        rig.call("get_state", {}, rid=f"g-{i}")
    rig.call("set_setpoint", {"setpoint_c": 41}, rid="new")
    # "old" was evicted: a very late redelivery (still within ttl_s) is applied again. The
    # cache must therefore hold more than the commands expected within ttl_s (config doc).
    assert rig.send(first)["ok"] and rig.core.loop.setpoint_c == 40.0
    assert rig.router.stats.duplicates == 0


# --- topics, replies, audit ----------------------------------------------------------------


def test_result_topics_and_foreign_topics_ignored() -> None:
    rig = make_rig()
    t = rig.link.topics
    for topic in (t.cmd_result("alice", "set_setpoint"), t.state("supply_loop"),
                  "rackplane/lab/r1/racky/cmd/alice/set_setpoint"):
        drive(rig.router.handle(Message(topic, b"{}", 1)))
    assert rig.replies == [] and rig.audits == []
    assert rig.router.stats.ignored == 3 and rig.router.stats.received == 0


def test_reply_topic_v5_response_topic_by_convention_else_result() -> None:
    """docs/COMMANDS.md: a v5 response topic is used only inside the sender's own reply space
    (``<base>/cmd/<user>/<verb>/result[/...]``), so the broker ACL can grant it and no client
    can make the daemon publish onto a topic of its choosing."""
    rig = make_rig()
    t = rig.link.topics
    own = t.cmd("alice", "get_state") + "/result/x"
    rig.call("get_state", {}, rid="a", response_topic=own, correlation_data=b"\x01\x02")
    rig.call("get_state", {}, rid="b")
    rig.call("get_state", {}, rid="b2", response_topic=t.cmd_result("alice", "set_mode"))
    # Not used: a command topic, another user's replies, our own state, another daemon's
    # topic, anything outside the tree, a level that is not "result".
    refused = [t.cmd("bob", "set_setpoint"), t.cmd_result("bob", "get_state"),
               t.state("supply_loop"), "rackplane/lab/r1/racky/state/rack_power",
               "clients/alice/replies", t.cmd("alice", "get_state") + "/other",
               t.cmd("alice", "get_state") + "/result//x",
               # acceptance round 2: wildcards, a level ending in a newline, a level with '.'
               "rackplane/+/+/valvey/cmd/alice/get_state/result", "#",
               t.cmd("alice", "get_state") + "/result/x\n",
               t.cmd("alice", "get_state") + "/result/+",
               t.cmd("alice", "get_state") + "/result/a.b", "$SYS/broker/x"]
    for i, rt in enumerate(refused):
        drive(rig.router.handle(rig.msg("get_state", {}, rid=f"c{i}", response_topic=rt)))
    topics = [m.response_topic for m, _ in rig.replies]
    result = t.cmd_result("alice", "get_state")
    # Issue 14 item 12: a refused response topic gets no reply at all (audit only).
    assert topics == [own, result, t.cmd_result("alice", "set_mode")]
    assert rig.replies[0][0].correlation_data == b"\x01\x02"
    assert len(rig.log.named("command_response_topic_refused")) == len(refused)
    assert [a.reply_topic for a in rig.audits] == topics + [None] * len(refused)
    assert {a.outcome for a in rig.audits[3:]} == {"response_topic_refused"}


def test_every_command_audited_once_with_numeric_fields() -> None:
    rig = make_rig()
    rig.call("set_setpoint", {"setpoint_c": 40}, rid="x-1")
    rig.call("set_setpoint", {"setpoint_c": 99}, rid="x-2")
    rig.send(rig.msg("get_state", payload=b"junk"))
    rig.call("set_setpoint", {"setpoint_c": 40}, rid="x-1")
    assert [(a.outcome, a.ok) for a in rig.audits] == [
        ("ok", True), ("out_of_range", False), ("bad_json", False), ("duplicate", True)]
    a = rig.audits[1]
    assert a.tags() == {"user": "alice", "verb": "set_setpoint", "outcome": "out_of_range"}
    assert a.fields() == {"ok": 0.0, "latency_s": 0.0}
    assert all(isinstance(v, float) for v in a.fields().values())
    assert a.wall_ns == rig.clock.wall_ns() and a.message and "outside" in a.message
    logged = rig.log.named("command")
    assert [e[2]["outcome"] for e in logged] == [a.outcome for a in rig.audits]
    assert [e[0] for e in logged] == ["info", "warning", "warning", "info"]


def test_audit_latency_from_receipt() -> None:
    rig = make_rig()
    msg = rig.msg("get_state", {})
    rig.clock.advance(0.25)  # waited in the link's inbox
    rig.send(msg)
    assert rig.audits[-1].latency_s == pytest.approx(0.25)


def test_audit_or_reply_failure_never_raises() -> None:
    rig = make_rig(audit_raises=True)
    for i in range(5):
        rig.call("get_state", {}, rid=f"q-{i}")
    assert rig.router.stats.audit_errors == 5
    assert len(rig.log.named("command_audit_failed")) == 4  # 1, 2, 3, then powers of two

    async def failing_reply(_m: Message, _p: Mapping[str, Any]) -> str:
        raise ValueError("outbox gone")

    rig.router._reply = failing_reply
    drive(rig.router.handle(rig.msg("set_setpoint", {"setpoint_c": 40}, rid="q-9")))
    assert rig.router.stats.reply_errors == 1 and rig.core.loop.setpoint_c == 40.0


def test_unprintable_user_tag_bounded() -> None:
    rig = make_rig()
    rig.call("get_state", {}, user="we\tird")
    assert rig.audits[-1].tags()["user"] == "_invalid" and rig.audits[-1].user == "we\tird"


def test_burst_of_commands_each_answered() -> None:
    """BR-24 d: a burst of 100 commands, every one handled or explicitly refused."""
    rig = make_rig()
    for i in range(100):
        verb, args = (("get_state", {}) if i % 3 else ("set_setpoint", {"setpoint_c": 200}))
        rig.call(verb, args, rid=f"b-{i}")
    assert len(rig.replies) == 100 and len({r["request_id"] for _, r in rig.replies}) == 100
    st = rig.router.stats
    assert st.applied + st.refused_total == 100


# --- registration and settings ------------------------------------------------------------


def test_register_validation() -> None:
    rig = make_rig()
    with pytest.raises(ValueError, match="already registered"):
        rig.router.register("get_state", NoArgs, lambda _a, _c: {})
    with pytest.raises(ValueError, match="topic level"):
        rig.router.register("set/speed", NoArgs, lambda _a, _c: {})
    with pytest.raises(ValueError, match="role"):
        rig.router.register("x", NoArgs, lambda _a, _c: {}, role="admin")  # type: ignore[arg-type]
    verbs = rig.router.verbs
    # The valvey verbs (valvey/commands.py may add more).
    assert {k: verbs.get(k) for k in ("get_state", "set_setpoint", "set_mode", "ack_alarm",
                                      "shelve_alarm")} == {
        "get_state": "reader", "set_setpoint": "operator", "set_mode": "operator",
        "ack_alarm": "operator", "shelve_alarm": "operator"}
    assert set(verbs.values()) <= set(ROLE_RANK)


def test_command_settings_validation_names_key_paths() -> None:
    cfg = validate_data(ValveyConfig, {})
    assert cfg.commands.default_role == "reader" and cfg.commands.ttl_s == 300.0
    ok = validate_data(ValveyConfig, {"commands": {"users": {"alice": "operator"}}})
    assert ok.commands.users == {"alice": "operator"}
    with pytest.raises(ConfigError) as err:
        validate_data(ValveyConfig, {"commands": {
            "users": {"bob": "admin"}, "ttl_s": 0, "sudo": True}})
    text = str(err.value)
    for path in ("commands.users.bob", "commands.ttl_s", "commands.sudo"):
        assert path in text, path
    with pytest.raises(ConfigError) as err:
        validate_data(ValveyConfig, {"commands": {"users": {"a/b": "operator"}}})
    assert err.value.problems == [  # the value once, no pydantic prefix
        "<config>: commands.users.a/b[key]: value 'a/b' must be 1-64 characters of letters, "
        "digits, '_', ':' or '-', starting with a letter or digit (no '/', '+', '#', '$', '.', "
        "spaces or control characters): it is an MQTT topic level"]


def test_attach_subscribes_cmd_filter_qos1_retain_as_published() -> None:
    rig = make_rig()
    rig.router.attach(environ={})
    rig.router.attach(environ={})
    assert rig.link.configured_topics == [rig.link.topics.cmd_filter]
    sub = rig.link._subs[rig.link.topics.cmd_filter]
    assert sub.qos == 1 and sub.retain_as_published is True  # v5: live retained -> refused
    assert "test_block" not in rig.router.verbs


# --- fuzz ----------------------------------------------------------------------------------

_json_leaf = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
              | st.text(max_size=20))
_json = st.recursive(_json_leaf, lambda c: st.lists(c, max_size=4)
                     | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=12)
_rid = st.one_of(st.from_regex(r"\A[A-Za-z0-9._:-]{1,64}\Z"), st.text(max_size=70), _json)
_when = st.one_of(st.sampled_from(["NOW", "OLD", "FUTURE", "2026-01-01T00:00:00"]),
                  st.text(max_size=30), st.integers(), _json)
_args = st.one_of(
    st.fixed_dictionaries({}, optional={
        "setpoint_c": st.one_of(st.floats(), st.integers(), st.text(max_size=5)),
        "mode": st.one_of(st.sampled_from(["auto", "manual", "shadow_on", "x"]), _json),
        "output_pct": st.one_of(st.floats(), st.integers(), _json),
        "alarm_id": st.one_of(st.sampled_from([SUPPLY_PV_INVALID, "nope", "BAD"]), _json),
        "duration_s": st.one_of(st.floats(), st.integers(-10, 40000)),
        "extra": _json,
    }),
    _json,
)
_envelope = st.fixed_dictionaries({}, optional={
    "request_id": _rid, "issued_at": _when, "args": _args, "role": st.just("operator"),
    "junk": _json,
})


_typed_args: st.SearchStrategy[Any] = st.one_of(
    st.fixed_dictionaries({"setpoint_c": st.floats(0.0, 100.0)}),
    st.fixed_dictionaries({"mode": st.sampled_from(["auto", "manual", "shadow_on", "shadow_off"])},
                          optional={"output_pct": st.floats(-10.0, 110.0)}),
    st.fixed_dictionaries({"alarm_id": st.sampled_from([SUPPLY_PV_INVALID, SUPPLY_LOOP_FAILSAFE,
                                                        "supply_temp_deviation", "nope"])},
                          optional={"duration_s": st.floats(0.0, 40_000.0)}),
    st.just({}),
    _args,
)
_near = st.fixed_dictionaries({
    "request_id": st.sampled_from(["UNIQUE"] * 4 + ["same"]),
    "issued_at": st.sampled_from(["NOW"] * 6 + ["OLD", "FUTURE"]),
    "args": _typed_args,
})


@st.composite
def _payloads(draw: st.DrawFn) -> bytes | Any:
    kind = draw(st.sampled_from(["near"] * 5 + ["envelope"] * 2 + ["json", "bytes", "huge",
                                                                   "deep", "unicode"]))
    if kind == "near":
        return draw(_near)
    if kind == "envelope":
        return draw(_envelope)
    if kind == "json":
        return draw(_json)
    if kind == "bytes":
        return draw(st.binary(max_size=64))
    if kind == "huge":
        n = draw(st.integers(1, 40_000))
        return {"request_id": "h-1", "issued_at": "NOW", "args": {"alarm_id": "x" * n}} \
            if draw(st.booleans()) else ("é" * n).encode()
    if kind == "deep":
        d = draw(st.integers(1, 4000))
        return (draw(st.sampled_from(["[", '{"a":'])) * d).encode()
    return {"request_id": draw(st.text(min_size=1, max_size=10)), "issued_at": "NOW",
            "args": {draw(st.text(max_size=10)): draw(st.text(max_size=10))}}


FUZZ = make_rig({"max_payload_bytes": 16384}, alarms=True)  # shared across examples
_FUZZ_IDS: list[int] = []


@settings(max_examples=500, deadline=None, derandomize=True,  # + test_commands_fuzz.py
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.filter_too_much])
@given(
    payload=_payloads(),
    verb=st.sampled_from(["get_state", "set_setpoint", "set_mode", "ack_alarm",
                          "shelve_alarm", "nope", "x" * 64]),
    user=st.sampled_from(["alice"] * 3 + ["viewer", "stranger", "ü-ser"]),
    retain=st.sampled_from([False] * 9 + [True]),
)
def test_fuzz_every_payload_exactly_one_reply_and_no_state_change_unless_valid(
    payload: Any, verb: str, user: str, retain: bool
) -> None:
    rig = FUZZ
    if isinstance(payload, bytes):
        raw = payload
    else:
        if isinstance(payload, dict) and payload.get("issued_at") in ("NOW", "OLD", "FUTURE"):
            off = {"NOW": 0.0, "OLD": -400.0, "FUTURE": 100.0}[payload["issued_at"]]
            payload = {**payload, "issued_at": rig.iso(off)}
        if isinstance(payload, dict) and payload.get("request_id") == "UNIQUE":
            _FUZZ_IDS.append(len(_FUZZ_IDS))
            payload = {**payload, "request_id": f"f-{len(_FUZZ_IDS)}"}
        raw = json.dumps(payload, ensure_ascii=False).encode("utf-8", "surrogatepass")
    before = loop_fingerprint(rig.core)
    n_audit = len(rig.audits)
    reply = rig.send(rig.msg(verb, user=user, payload=raw, retain=retain))
    assert len(rig.audits) == n_audit + 1  # audited once
    if reply["ok"]:
        # Only a valid command of a known verb by a user allowed to use it.
        assert not retain and verb in rig.router.verbs
        assert user == "alice" or verb == "get_state"
        assert isinstance(reply["state"], dict)
    else:
        assert error_code(reply) in KNOWN_CODES
        assert reply["state"] is None
        assert loop_fingerprint(rig.core) == before
    rid = reply["request_id"]
    assert rid is None or (isinstance(payload, dict) and payload.get("request_id") == rid)
    rig.replies.clear()
    rig.audits.clear()
    rig.alarm_events.clear()
    rig.log.events.clear()


# --- valvey wiring ---------------------------------------------------------------------------


async def test_valvey_app_routes_commands_and_audits_to_the_time_series(tmp_path: Any) -> None:
    """valvey/app.py: the router exists without any config, is subscribed before run(), acts
    on the daemon's core and writes measurement ``command`` (tags user, verb, outcome; numeric
    fields ok and latency_s) through the spool (DESIGN §3)."""
    from valvey.app import Valvey, load_valvey_config

    conf = tmp_path / "valvey.toml"  # the defaults but for what a config must name
    conf.write_text('[identity]\nsite = "lab"\nrack = "rack1"\n[cdu]\nport = 5020\n')
    cfg, regmap = load_valvey_config(conf)
    cfg = cfg.model_copy(update={
        "spool": cfg.spool.model_copy(update={"directory": tmp_path}),
        "commands": CommandSettings(users={"alice": "operator"}),
    })
    clock = FakeClock()
    app = Valvey(cfg, regmap, clock=clock)
    # The command filter is subscribed before run() (other subscriptions, e.g. racky's
    # rack power, may come with it).
    assert app.mqtt.topics.cmd_filter in app.mqtt.configured_topics
    env = {"request_id": "w-1", "issued_at": datetime.fromtimestamp(
        clock.wall_ns() / 1e9, tz=UTC).isoformat(), "args": {"mode": "shadow_on"}}
    msg = Message(app.mqtt.topics.cmd("alice", "set_mode"), json.dumps(env).encode(), 1,
                  received_mono=clock.monotonic())
    await app.commands.handle(msg)
    assert app.core.loop.shadow is True and app.commands.stats.applied == 1
    await app.commands.handle(replace(msg, topic=app.mqtt.topics.cmd("mallory", "set_mode")))
    assert app.commands.stats.refused == {"forbidden": 1}
    app.writer.flush_to_spool()
    await app.writer.close(0.5)
    text = "".join(p.read_text() for p in tmp_path.glob("*.lp"))
    lines = [ln for ln in text.splitlines() if ln.startswith("command,")]
    assert len(lines) == 2
    assert "outcome=ok" in lines[0] and "user=alice" in lines[0] and "verb=set_mode" in lines[0]
    assert " latency_s=0,ok=1 " in lines[0]  # floats, never 1i (BR-19)
    assert "outcome=forbidden" in lines[1] and "ok=0 " in lines[1]


def test_valvey_manual_output_only_under_a_lease_interlocks_override_holder_in_state() -> None:
    """Issue 6 leases on valvey's verbs: manual valve output only under a lease; operator >
    automation; an active interlock (from the tick) refuses every move whoever holds the
    lease; get_state shows the holder."""
    gates: list[LeaseGate] = []

    def gate(router: CommandRouter) -> LeaseGate:
        gates.append(LeaseGate(router, LeaseTable(VALVEY_OUTPUTS), log=CaptureLog()))
        return gates[0]

    rig = make_rig(leases=gate)
    g = gates[0]
    before = loop_fingerprint(rig.core)
    r = rig.call("set_mode", {"mode": "manual", "output_pct": 40.0}, rid="m-0")
    assert error_code(r) == "lease_required" and loop_fingerprint(rig.core) == before
    assert rig.call("acquire_lease", {"output": "facility_valve"}, user="bms", rid="a-0")["ok"]
    assert error_code(rig.call("set_setpoint", {"setpoint_c": 40.0}, rid="s-0")) == "lease_held"
    assert rig.call("acquire_lease", {"output": "facility_valve"}, rid="a-1")["ok"]  # preempts
    assert rig.call("set_mode", {"mode": "manual", "output_pct": 40.0}, rid="m-1")["ok"]
    assert rig.core.loop.control_mode == "manual"
    assert error_code(rig.call("acquire_lease", {"output": "facility_valve"}, user="bms",
                               rid="a-2")) == "lease_held"  # automation never preempts
    g.tick(rig.clock.monotonic(), {"facility_valve": "supply_temp_high_interlock"})
    before = loop_fingerprint(rig.core)
    r = rig.call("set_mode", {"mode": "auto"}, rid="m-2")
    assert error_code(r) == "interlock_active" and loop_fingerprint(rig.core) == before
    st = rig.call("get_state", rid="g-0")["state"]["leases"]["facility_valve"]
    assert st["holder"] == "alice" and st["interlock"] == "supply_temp_high_interlock"
    g.tick(rig.clock.monotonic(), {})
    assert rig.call("set_mode", {"mode": "auto"}, rid="m-3")["ok"]
    assert rig.call("release_lease", {"output": "facility_valve"}, rid="r-0")["ok"]
    assert rig.call("get_state", rid="g-1")["state"]["leases"]["facility_valve"]["holder"] \
        is None
