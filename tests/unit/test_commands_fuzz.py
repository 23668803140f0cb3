"""Thousands of generated command payloads against both daemons' real verbs (issue 6: "bad
payloads ... get a clear error reply; nothing crashes and nothing partial is applied; a
hypothesis-driven test sends thousands of generated payloads and checks exactly that").

Each daemon's router carries its real verbs on its real core (valvey/commands.py,
racky/commands.py) and the generic lease verbs through a `LeaseGate` (racky's verbs check
their outputs through it, so leases refuse commands here too). The payloads are drawn from
each verb's own JSON Schema, bent: values at, inside and just past every limit, wrong types,
missing and unknown keys, NaN literals, unknown verbs, readers and unknown users, retained
deliveries, stale and future ``issued_at``, broken JSON, oversized and deeply nested payloads,
and repeats of earlier request ids (a QoS 1 redelivery or a retry).

For every message: exactly one reply, valid against the reply schema; a refusal carries a
machine code (``[a-z_]+``) and a message for people, and leaves the daemon exactly as it was
(its whole state, persisted state, lease table and the node-agent commands sent); an
``internal_error`` (a handler that crashed) fails the test; a repeat is answered with the
first reply and applies nothing; only a fresh, valid, non-retained command of a user whose
configured role allows the verb is applied.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from rackplane.clock import FakeClock
from rackplane.commands import (
    INTERNAL_ERROR,
    ROLE_RANK,
    CommandReply,
    CommandRouter,
    LeaseGate,
)
from rackplane.core.leases import LeaseTable
from rackplane.io.mqtt import Message, MqttLink
from rackplane.settings import CommandSettings, Identity, MqttSettings
from racky.commands import register_racky_commands
from racky.config import RackyConfig
from racky.core.agent_settings import AgentCommand
from racky.core.controller import RackyCore
from racky.core.lifecycle import Lifecycle, PersistedState
from tests.unit.test_commands import CaptureLog, drive, loop_fingerprint, make_rig

USERS = {"alice": "operator", "bms": "automation", "viewer": "reader"}
CODE_RE = re.compile(r"^[a-z][a-z_]{1,40}$")
MAX_PAYLOAD = 8192
BATCH = 25  # commands per hypothesis example (amortises its per-example cost)
EXAMPLES_PER_DAEMON = 60  # 60 x 25 = 1500 commands per daemon, 3000 in all


@dataclass
class Target:
    """One daemon under fuzz: its router with captured replies, and how to fingerprint it."""

    name: str
    clock: FakeClock
    router: CommandRouter
    gate: LeaseGate
    fingerprint_extra: Any  # () -> JSON-able: the core's state
    ids: list[str]  # alarm, pump, valve names: valid strings some args need
    replies: list[tuple[Message, dict[str, Any]]] = field(default_factory=list)
    sent: list[AgentCommand] = field(default_factory=list)
    history: list[tuple[Message, dict[str, Any]]] = field(default_factory=list)
    n: int = 0
    applied: int = 0
    codes: dict[str, int] = field(default_factory=dict)

    def fingerprint(self) -> str:
        now = self.clock.monotonic()
        return json.dumps([self.fingerprint_extra(), self.gate.snapshot(now),
                           [repr(c) for c in self.sent]], sort_keys=True, default=repr)

    def handle(self, msg: Message) -> dict[str, Any]:
        k = len(self.replies)
        drive(self.router.handle(msg))
        assert len(self.replies) == k + 1, "exactly one reply per command message"
        reply = self.replies[-1][1]
        CommandReply.model_validate(reply)
        return reply


async def _noop_reply(_m: Message, _p: Mapping[str, Any]) -> None:  # replaced per target
    return None


def _capture(target: Target) -> Any:
    async def reply(msg: Message, payload: Mapping[str, Any]) -> str:
        target.replies.append((msg, dict(payload)))
        assert msg.response_topic is not None
        return msg.response_topic
    return reply


def _valvey_target() -> Target:
    rig = make_rig({"users": USERS, "max_payload_bytes": MAX_PAYLOAD}, alarms=True)
    core = rig.core
    t = Target("valvey", rig.clock, rig.router, None,  # type: ignore[arg-type]
               lambda: [core.state(), loop_fingerprint(core), core.pumps.setpoint,
                        core.ff.settings.enabled, core.step_test.phase,
                        core.loop.settings.kc_pct_per_k, core.loop.settings.ti_s,
                        core.safety.state(), repr(getattr(core, "_queued", None))],
               [a.id for a in core.alarms.active()] + core.pumps.unit_names
               + [u.name for u in core.valves.units]
               + ["facility_valve", "pump_speed", "duty_pump"])
    rig.router._reply = _capture(t)
    t.gate = LeaseGate(rig.router, LeaseTable({"facility_valve": "", "pump_speed": "",
                                               "duty_pump": ""}), log=CaptureLog())
    return t


def _racky_target() -> Target:
    clock = FakeClock()
    link = MqttLink(MqttSettings(), Identity(site="lab", rack="r1"), "racky", clock=clock)
    router = CommandRouter(link, CommandSettings(users=USERS, max_payload_bytes=MAX_PAYLOAD),
                           clock=clock, log=CaptureLog(), reply=_noop_reply)
    cfg = RackyConfig()
    core = RackyCore(cfg, clock.monotonic(),
                     PersistedState(Lifecycle(cfg.lifecycle.initial_state, 0, "new", "fuzz")))
    outputs = ["rack_cap", "rack_budget", "lifecycle",
               *(f"tray:{i:02d}" for i in range(core.n_trays))]
    t = Target("racky", clock, router, None,  # type: ignore[arg-type]
               lambda: [core.state(), core.persisted.to_json()],
               ["thermal_gpu_hot", "rack_cap", "rack_budget", "lifecycle", "tray:03"])
    router._reply = _capture(t)
    t.gate = LeaseGate(router, LeaseTable(outputs), log=CaptureLog())
    register_racky_commands(router, core, send=t.sent.extend, lease_check=t.gate.check)
    return t


TARGETS = {"valvey": _valvey_target(), "racky": _racky_target()}


# --- payloads bent from each verb's schema -----------------------------------------------------


def _resolve(schema: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = schema.get("$ref")
    if isinstance(ref, str):
        found: Mapping[str, Any] = root["$defs"][ref.rsplit("/", 1)[-1]]
        return found
    return schema


_WRONG = st.one_of(st.none(), st.booleans(), st.text(max_size=8),
                   st.integers(-10**20, 10**20), st.floats(allow_nan=False),
                   st.lists(st.integers(), max_size=3),
                   st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def _value(schema: Mapping[str, Any], root: Mapping[str, Any], ids: list[str]
           ) -> st.SearchStrategy[Any]:
    """Values for one property: usually near its schema (limits, enums, ids), sometimes of
    a wrong type."""
    s = _resolve(schema, root)
    near: list[st.SearchStrategy[Any]] = []
    for o in (_resolve(o, root) for o in s.get("anyOf", [s])):
        t = o.get("type")
        if "enum" in o or "const" in o:
            near += [st.sampled_from(list(o.get("enum", [o.get("const")])))] * 4
            near.append(st.text(max_size=12))
        elif t in ("number", "integer"):
            edges: list[float] = [0, -1, 1, 1e9, -1e9]
            for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
                if k in o:
                    v = float(o[k])
                    edges += [v, v - 1e-6, v + 1e-6, v - 1, v + 1]
            lo = float(o.get("minimum", o.get("exclusiveMinimum", -1e3)))
            hi = float(o.get("maximum", o.get("exclusiveMaximum", 1e4)))
            num = st.sampled_from(edges) | st.floats(min(lo, hi), max(lo, hi), allow_nan=False)
            near += [num.map(int) if t == "integer" else num] * 3
            near.append(st.integers(-100, 100))
        elif t == "string":
            near += [st.sampled_from([*ids, "", "x" * 300, "ü", "a/b", "+", "#"])] * 2
            near += [st.sampled_from(ids) if ids else st.text(max_size=16)] * 2
            near.append(st.text(max_size=16))
        elif t == "boolean":
            near.append(st.booleans())
        elif t == "array":
            near += [st.lists(st.integers(0, 17), min_size=1, max_size=3)] * 3
            near.append(st.lists(st.integers(-3, 70), max_size=6))
            near.append(st.lists(st.text(max_size=3), max_size=2))
        elif t == "null":
            near.append(st.none())
    # About one value in ten of a wrong type.
    return _pick([*near, *[_WRONG] * max(1, len(near) // 9)]) if near else _WRONG


def _pick(options: list[st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """One of ``options``, each equally likely (repeat one to weight it): ``st.one_of``
    leans to its first, simplest branches, which would make most values "missing" or
    wrong."""
    return st.sampled_from(options).flatmap(lambda s: s)


def _args(model: type[BaseModel], ids: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """Args objects bent from ``model``'s JSON Schema: each key sometimes missing, sometimes
    an unknown key added."""
    root = model.model_json_schema()
    props: Mapping[str, Any] = root.get("properties", {})
    maybe = {name: st.tuples(st.sampled_from([False] * 19 + [True]), _value(ps, root, ids))
             .map(lambda p: _MISSING if p[0] else p[1])
             for name, ps in props.items()}
    extra = _pick([st.just({})] * 14
                  + [st.dictionaries(st.text(min_size=1, max_size=8), st.just(1), max_size=1)])
    return st.tuples(st.fixed_dictionaries(maybe), extra).map(
        lambda p: {**{k: v for k, v in p[0].items() if v is not _MISSING}, **p[1]})


_MISSING = object()


@dataclass(frozen=True)
class Draft:
    """One generated command message, before it is stamped with the target's time."""

    verb: str
    user: str
    retain: bool
    age_s: float  # [s] before now (negative: ahead)
    kind: str
    args: dict[str, Any]
    bad_ts: Any
    raw: bytes


def _drafts(target: Target) -> st.SearchStrategy[Draft]:
    verbs = target.router.verb_args()
    per_verb = [st.tuples(st.just(v), _args(m, target.ids)) for v, m in verbs.items()]
    per_verb += [st.tuples(st.sampled_from(["nope", "x" * 64]), st.just({"a": 1}))]
    return st.builds(
        lambda va, user, retain, age, kind, bad_ts, raw: Draft(va[0], user, retain, age, kind,
                                                               va[1], bad_ts, raw),
        st.one_of(*per_verb),
        st.sampled_from(["alice"] * 4 + ["bms"] * 3 + ["viewer", "stranger"]),
        st.sampled_from([False] * 19 + [True]),
        st.sampled_from([0.0] * 12 + [-29.0, 299.0, -400.0, 400.0]),
        st.sampled_from(["env"] * 28 + ["no_id", "bad_ts", "raw", "huge", "deep", "nan",
                                        "array"]),
        st.sampled_from(["yesterday", 0, "2026-01-01T00:00:00", None]),
        st.binary(max_size=40),
    )


def _message(target: Target, d: Draft) -> tuple[Message, bool]:
    """The message of a draft at the target's time, and whether it is fresh, well-formed
    and not retained (the only kind that may be applied)."""
    target.n += 1
    env: dict[str, Any] = {
        "request_id": f"{target.name}-{target.n}",
        "issued_at": datetime.fromtimestamp(target.clock.wall_ns() / 1e9 - d.age_s,
                                            tz=UTC).isoformat(),
        "args": d.args,
    }
    fresh = -30.0 <= d.age_s <= 300.0  # the default clock_skew_s and ttl_s
    if d.kind == "no_id":
        env.pop("request_id")
    elif d.kind == "bad_ts":
        env["issued_at"] = d.bad_ts
    if d.kind == "raw":
        raw = d.raw
    elif d.kind == "huge":
        raw = json.dumps({**env, "args": {"pad": "x" * MAX_PAYLOAD}}).encode()
    elif d.kind == "deep":
        raw = ('{"request_id":"d","issued_at":"x","args":' + "[" * 5000).encode()
    elif d.kind == "nan":
        raw = json.dumps({**env, "args": {k: float("nan") for k in list(d.args)[:1] or ["v"]}}
                         ).encode()
    elif d.kind == "array":
        raw = json.dumps([env]).encode()
    else:
        raw = json.dumps(env, ensure_ascii=False).encode("utf-8", "surrogatepass")
    msg = Message(topic=target.router.topics.cmd(d.user, d.verb), payload=raw, qos=1,
                  retain=d.retain, received_mono=target.clock.monotonic())
    return msg, fresh and d.kind == "env" and not d.retain


def _check(target: Target, msg: Message, user: str, plausible: bool) -> None:
    before = target.fingerprint()
    reply = target.handle(msg)
    after = target.fingerprint()
    parsed = target.router.topics.parse_cmd(msg.topic)
    assert parsed is not None
    verb = parsed[1]
    if reply["ok"]:
        target.applied += 1
        assert plausible, f"applied a command that should have been refused: {msg}"
        role = target.router.role_of(user)
        assert ROLE_RANK[role] >= ROLE_RANK[target.router.verbs[verb]]
        assert isinstance(reply["state"], dict)
        target.history.append((msg, reply))
        return
    err = reply["error"]
    code, message = err["code"], err["message"]
    target.codes[code] = target.codes.get(code, 0) + 1
    assert code != INTERNAL_ERROR, f"{target.name} {verb} crashed: {message} ({msg.payload!r})"
    assert CODE_RE.match(code), code
    assert isinstance(message, str) and message.strip() and len(message) <= 1000
    assert reply["state"] is None
    assert after == before, f"{target.name} {verb} refused ({code}) but changed state"


STEPS = st.lists(st.tuples(st.sampled_from([0.0, 0.1, 5.0]),  # clock advance [s]
                            st.integers(0, 9),  # 0: repeat an applied command
                            st.integers(1, 20)),  # which one, counting back
                  min_size=BATCH, max_size=BATCH)


def _fuzz(target: Target, steps: list[tuple[float, int, int]], drafts: list[Draft]) -> None:
    for (advance, repeat, back), d in zip(steps, drafts, strict=True):
        target.clock.advance(advance)
        if repeat == 0 and target.history:
            # A repeat of an applied command (QoS 1 redelivery or client retry): the same
            # reply, nothing applied again.
            old, first = target.history[-min(back, len(target.history))]
            before = target.fingerprint()
            assert target.handle(old) == first
            assert target.fingerprint() == before
            continue
        msg, plausible = _message(target, d)
        _check(target, msg, d.user, plausible)


_FUZZ_SETTINGS = settings(max_examples=EXAMPLES_PER_DAEMON, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow,
                                                 HealthCheck.data_too_large])


@_FUZZ_SETTINGS
@given(steps=STEPS, drafts=st.lists(_drafts(TARGETS["valvey"]), min_size=BATCH,
                                    max_size=BATCH))
def test_fuzz_valvey_verbs_clear_error_and_nothing_partial(
    steps: list[tuple[float, int, int]], drafts: list[Draft]
) -> None:
    _fuzz(TARGETS["valvey"], steps, drafts)


@_FUZZ_SETTINGS
@given(steps=STEPS, drafts=st.lists(_drafts(TARGETS["racky"]), min_size=BATCH,
                                    max_size=BATCH))
def test_fuzz_racky_verbs_with_leases_clear_error_and_nothing_partial(
    steps: list[tuple[float, int, int]], drafts: list[Draft]
) -> None:
    _fuzz(TARGETS["racky"], steps, drafts)


def test_fuzz_reached_both_outcomes() -> None:
    """The generators are not all refusals (or all accepted): both daemons applied commands
    and refused them for many reasons (runs after the two fuzz tests, in file order)."""
    for t in TARGETS.values():
        assert t.n >= EXAMPLES_PER_DAEMON * BATCH // 2, t.name
        assert t.applied >= 20, (t.name, t.applied)
        assert len(t.codes) >= 8, (t.name, t.codes)


if __name__ == "__main__":  # what the generators reach: python -m tests.unit.test_commands_fuzz
    test_fuzz_valvey_verbs_clear_error_and_nothing_partial()
    test_fuzz_racky_verbs_with_leases_clear_error_and_nothing_partial()
    for _t in TARGETS.values():
        print(_t.name, "sent", _t.n, "applied", _t.applied, "refused",
              dict(sorted(_t.codes.items())))
