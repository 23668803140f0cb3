"""The MQTT contract as files: the JSON Schemas of the envelope, reply, payloads and every
daemon's verbs (``rackplane/schemas``, written by `rackplane.schemagen`) and docs/COMMANDS.md
(`render_markdown`); ``rackctl schemas --write | --check`` runs them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from rackplane.commands.router import CommandRouter, _TestBlockArgs
from rackplane.core.envelope import (
    GENERIC_VERBS,
    ROUTER_CODES,
    AlarmPayload,
    CommandEnvelope,
    CommandReply,
    LeasesState,
    StatusPayload,
)
from rackplane.core.leases import LEASE_CODES
from rackplane.schemagen import schema_text, stale_documents, write_documents
from rackplane.settings import Role

__all__ = [
    "SCHEMA_DIR",
    "DaemonContract",
    "StateModels",
    "VerbArgs",
    "contract_of",
    "load_schema",
    "render_markdown",
    "schema_documents",
    "stale_schemas",
    "write_schemas",
]

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "schemas"
"""Where the committed ``*.schema.json`` files live (package data of ``rackplane``)."""

VerbArgs = Mapping[str, Mapping[str, type[BaseModel]]]
"""daemon -> verb -> args model."""

StateModels = Mapping[str, Mapping[str, type[BaseModel]]]
"""daemon -> state thing -> payload model (``<base>/state/<thing>``)."""

_BASE_SCHEMAS: dict[str, type[BaseModel]] = {
    "command-envelope.schema.json": CommandEnvelope,
    "command-reply.schema.json": CommandReply,
    "status.schema.json": StatusPayload,
    "alarm.schema.json": AlarmPayload,
    "state-leases.schema.json": LeasesState,
    **{f"lease.{verb}.args.schema.json": model for verb, model in GENERIC_VERBS.items()},
}


def schema_documents(
    verb_args: VerbArgs | None = None, states: StateModels | None = None
) -> dict[str, str]:
    """The JSON Schema files generated from the models: file name -> text.

    Always: ``command-envelope``, ``command-reply``, ``status``, ``alarm``, ``state-leases``
    and the generic ``lease.acquire_lease.args`` / ``lease.release_lease.args``; plus one
    ``<daemon>.<verb>.args.schema.json`` per verb in ``verb_args`` (e.g.
    ``{"valvey": valvey_verb_args()}``; a generic lease verb registered by a daemon is not
    repeated) and one ``<daemon>.state.<thing>.schema.json`` per model in ``states``. Draft
    2020-12, keys sorted, stable text.
    """
    docs = {name: schema_text(model, name) for name, model in _BASE_SCHEMAS.items()}
    for daemon, verbs in (verb_args or {}).items():
        for verb, model in verbs.items():
            if GENERIC_VERBS.get(verb) is model:
                continue
            name = f"{daemon}.{verb}.args.schema.json"
            docs[name] = schema_text(model, name)
    for daemon, things in (states or {}).items():
        for thing, model in things.items():
            name = f"{daemon}.state.{thing}.schema.json"
            docs[name] = schema_text(model, name)
    return docs


def write_schemas(
    directory: str | Path = SCHEMA_DIR,
    verb_args: VerbArgs | None = None,
    states: StateModels | None = None,
    *,
    prune: bool = False,
) -> list[Path]:
    """Write the files of `schema_documents` that are missing or differ; returns those.
    ``prune`` also removes ``*.schema.json`` files no model generates any more (only when
    ``verb_args`` and ``states`` cover every daemon, as ``rackctl schemas --write`` does)."""
    return write_documents(directory, schema_documents(verb_args, states), prune=prune)


def stale_schemas(
    directory: str | Path = SCHEMA_DIR,
    verb_args: VerbArgs | None = None,
    states: StateModels | None = None,
    *,
    complete: bool = False,
) -> list[str]:
    """Names of schema files missing from ``directory`` or differing from the models; with
    ``complete``, also files no model generates (a verb removed or renamed)."""
    return stale_documents(directory, schema_documents(verb_args, states), complete=complete)


# --- the contract, rendered (docs/COMMANDS.md) ---------------------------------------------------


@dataclass(frozen=True)
class DaemonContract:
    """What one daemon offers on MQTT, for the schemas and docs/COMMANDS.md.

    Attributes:
        daemon: topic level, e.g. ``valvey``.
        verbs: verb -> (args model, least role), in registration order.
        states: ``state/<thing>`` -> payload model (those the daemon has schematised).
        summary: one line for the docs.
    """

    daemon: str
    verbs: Mapping[str, tuple[type[BaseModel], Role]]
    states: Mapping[str, type[BaseModel]] = field(default_factory=dict)
    summary: str = ""


def contract_of(
    router: CommandRouter,
    states: Mapping[str, type[BaseModel]] | None = None,
    summary: str = "",
) -> DaemonContract:
    """The `DaemonContract` of a router with its verbs registered (the test-only verb is
    never part of it)."""
    verbs = {v.name: (v.model, v.role) for v in router._verbs.values()
             if v.model is not _TestBlockArgs}
    return DaemonContract(router.link.daemon, verbs, dict(states or {}), summary)


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_type(s: Mapping[str, Any]) -> str:
    if "$ref" in s:
        return f"`{str(s['$ref']).rsplit('/', 1)[-1]}`"
    if "const" in s:
        return f"`{json.dumps(s['const'])}`"
    if "enum" in s:
        return " | ".join(f"`{json.dumps(v)}`" for v in s["enum"])
    if "anyOf" in s:
        return " or ".join(_md_type(x) for x in s["anyOf"])
    t = s.get("type")
    if t == "array":
        return f"array of {_md_type(s.get('items', {}))}"
    if t == "object" and isinstance(s.get("additionalProperties"), Mapping):
        return f"object of {_md_type(s['additionalProperties'])}"
    if isinstance(t, list):
        return " or ".join(str(x) for x in t)
    return str(t) if t else "any"


_LIMIT_KEYS = (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="),
               ("exclusiveMaximum", "<"), ("minLength", "length >="),
               ("maxLength", "length <="), ("pattern", "matches"), ("format", "format"))


def _md_limits(s: Mapping[str, Any]) -> str:
    parts = []
    for sub in (s, *s.get("anyOf", ())):
        for key, label in _LIMIT_KEYS:
            if key in sub:
                v = sub[key]
                parts.append(f"{label} `{v}`" if key in ("pattern", "format") else
                             f"{label} {v:g}" if isinstance(v, float) else f"{label} {v}")
    if "default" in s:
        parts.append(f"default `{json.dumps(s['default'])}`")
    return _md_escape(", ".join(parts))


def _md_object(title: str, s: Mapping[str, Any]) -> list[str]:
    lines = [f"**{title}**" + (f": {_md_escape(s['description'])}"
                               if s.get("description") else ""), ""]
    props: Mapping[str, Any] = s.get("properties", {})
    if not props:
        extra = s.get("additionalProperties")
        if isinstance(extra, Mapping):
            lines += [f"An object; each key maps to {_md_type(extra)}.", ""]
        else:
            lines += ["No fields (`{}`).", ""]
        return lines
    required = set(s.get("required", ()))
    lines += ["| field | type | required | limits | description |",
              "|---|---|---|---|---|"]
    for name, ps in props.items():
        lines.append(f"| `{name}` | {_md_escape(_md_type(ps))} | "
                     f"{'yes' if name in required else 'no'} | {_md_limits(ps)} | "
                     f"{_md_escape(str(ps.get('description', '')))} |")
    lines.append("")
    if any(k in s for k in ("if", "allOf", "oneOf")):
        lines += ["Conditional rules apply (see the schema file).", ""]
    return lines


def _md_schema(name: str, text: str) -> list[str]:
    doc = json.loads(text)
    out = [f"Schema: `rackplane/schemas/{name}`", ""]
    out += _md_object(str(doc.get("title", name)), doc)
    for def_name, d in sorted(doc.get("$defs", {}).items()):
        out += _md_object(def_name, d)
    return out


_MD_INTRO = """\
# The rackplane MQTT contract

<!-- Generated by `rackctl schemas --write --docs docs/COMMANDS.md` from rackplane/commands/
and the daemons' verb registrations; the JSON Schemas it renders are
rackplane/schemas/*.schema.json. Do not edit by hand: `rackctl schemas --check --docs
docs/COMMANDS.md` and tests/unit/test_commands_contract.py fail when this file is stale. -->

DESIGN §3. Topic root `<root>/<site>/<rack>/<daemon>/` (`<root>` is `mqtt.topic_root`,
default `rackplane`; the row travels in payloads and tags):

| topic | retained | QoS | payload |
|---|---|---|---|
| `status` | yes | 1 | `status.schema.json`; Last Will `offline` |
| `state/<thing>` | yes | 1 | JSON per thing (below); `state/leases`: `state-leases.schema.json` |
| `telemetry/<thing>` | no | 0 | JSON |
| `alarm/<id>` | yes, while active | 1 | `alarm.schema.json`; an empty retained message clears it |
| `cmd/<user>/<verb>` | **never** | 1 | `command-envelope.schema.json` with the verb's args |
| `cmd/<user>/<verb>/result[/...]` | no | 1 | `command-reply.schema.json` |

## Sending a command

- Publish the envelope `{request_id, issued_at, args}` to `.../<daemon>/cmd/<user>/<verb>`,
  QoS 1, not retained. `<user>` is your broker username: the broker's ACL lets each operator
  write only below its own name (config/mosquitto/acl), so it cannot be forged. Your role
  (reader < automation < operator) comes from the daemon's `[commands] users` config, never
  from the payload; users not listed get `default_role` (reader: `get_state` only).
- The reply `{request_id, ok, error: {code, message} | null, state}` comes on your MQTT v5
  Response Topic with your Correlation Data (match it by that), if the response topic is in
  your own reply space: `.../<daemon>/cmd/<user>/<verb>/result` or below it (e.g.
  `.../result/<nonce>`; every level letters, digits, `_ : -`). A command with any other
  response topic (a wildcard, another user's or daemon's topic, `$SYS`) is **neither
  executed nor answered**: it is only audited (`response_topic_refused`). Without one
  (MQTT 3.1.1) the reply comes on `.../<daemon>/cmd/<user>/<verb>/result`: match it by
  `request_id`. The reply's QoS is never above your request's; ignore retained messages on
  reply topics (a reply is never retained).
- A repeated `request_id` (a QoS 1 redelivery, or your retry) is answered with the first
  reply and never applied twice (FIELD-CASES BR-22 a): retry with the same id when a reply
  did not come. The same id with another verb or args is refused (`request_id_reused`).
- `issued_at` older than `commands.ttl_s` (default 300 s, long enough that commands queued by
  the broker through a short outage still apply) is refused (`expired`); more than
  `commands.clock_skew_s` ahead (default 30 s) is refused (`from_future`).
- `rackctl cmd <daemon> <verb> --arg k=v` does all of this (exit 0 ok, 1 refused, 2 usage or
  config, 3 no broker or no reply in time).

## Retained commands

A retained command is never executed (DESIGN §3). Retained messages reach a subscriber in
two ways: from the broker's retained store when it subscribes (every MQTT version flags these
`retain=1`: refused), and live, as they are published. MQTT 3.1.1 clears the flag on live
deliveries (§3.3.1.3), so a 3.1.1 daemon cannot tell a live retained command from a normal
one: it is applied once, like any fresh command (and bounded by the TTL), and refused at every
later delivery from the store. MQTT v5 daemons subscribe with Retain As Published (§3.8.3.1),
so a command published retained is refused even live. Mosquitto 2.0 cannot refuse retained
publishes on some topics only: `retain_available false` applies to the whole broker (it would
also forbid the retained `status`, `state` and `alarm` topics) and `acl_file` rules do not
distinguish retained publishes. Run the daemons with `mqtt.protocol = "5"` (the default);
clear a stray retained command with an empty retained publish to its topic.

## Leases and interlocks

Who may move an output (rackplane/core/leases.py, DESIGN §1): active safety interlocks override
every lease (`interlock_active`); below them a lease is exclusive (`lease_held`), operator >
automation (an operator's `acquire_lease` preempts an automation lease), every lease has an
expiry (`ttl_s`, default `commands.lease_default_ttl_s`, at most `commands.lease_max_ttl_s`)
and an explicit `release_lease`. Verbs that move an output only under a lease refuse without
one (`lease_required`). `state/leases` (retained) shows every output's holder and any
interlock; it is published when a lease or an interlock changes and every 10 s while a lease
is held. A lease is taken by the broker username in the topic, like every command: an
operator's `acquire_lease` preempts an automation lease; automation never preempts.

## Error codes

Router: @ROUTER_CODES@. Leases: @LEASE_CODES@. Each verb adds its own (e.g.
`wrong_mode`, `unknown_tray`).

Each kind of bad input has its own code: `too_large` (over `max_payload_bytes`), `bad_json`
(not UTF-8, not JSON), `non_finite` (NaN/Infinity, or a number beyond a double's range such as
`1e400`), `duplicate_key`, `too_deep` (nested deeper than 32 levels), `wrong_type` (not an
object; an argument of another JSON type), `out_of_range`, `invalid_args` (a missing or
unknown key, a pattern or enum mismatch), `expired`, `retained`. **Every numeric argument
of every verb has bounds from the daemon's config** (or, for a few durations, a stated
standard), checked before the verb acts: outside them the reply is `out_of_range` naming the
argument, the value and the limits, e.g. `args.power_w = 120 W is outside [25020, 264000] W
(the rack's floor ... power.rack_capacity_w)` (rackplane/commands/bounds.py; the limits of
each verb's arguments are in its description). **A refusal of the args lists every problem
at once** (the model's and the bounds': `set_budget` with a budget out of range and no
reason names both), in the order of the verb's args fields (unknown keys last); its code is
that of the first. The daemons count refusals per code in their
self-metrics (`commands_refused`, docs/OPERATIONS.md).
"""


def render_markdown(contracts: Sequence[DaemonContract]) -> str:
    """docs/COMMANDS.md: the topic table and conventions, every daemon's verbs (least role,
    args) and every payload schema, rendered from `schema_documents` of ``contracts``."""
    verb_args = {c.daemon: {v: m for v, (m, _r) in c.verbs.items()} for c in contracts}
    states = {c.daemon: dict(c.states) for c in contracts}
    docs = schema_documents(verb_args, states)
    intro = _MD_INTRO.replace(
        "@ROUTER_CODES@", ", ".join(f"`{c}`" for c in sorted(ROUTER_CODES))
    ).replace("@LEASE_CODES@", ", ".join(f"`{c}`" for c in sorted(LEASE_CODES)))
    out = [intro.rstrip("\n"), ""]
    out += ["## Envelope and reply", ""]
    for name in ("command-envelope.schema.json", "command-reply.schema.json"):
        out += _md_schema(name, docs[name])
    for c in contracts:
        out += [f"## {c.daemon}", ""]
        if c.summary:
            out += [c.summary, ""]
        out += ["| verb | least role | args schema |", "|---|---|---|"]
        for verb, (model, role) in c.verbs.items():
            generic = GENERIC_VERBS.get(verb) is model
            schema = f"lease.{verb}.args" if generic else f"{c.daemon}.{verb}.args"
            out.append(f"| `{verb}` | {role} | `{schema}.schema.json` |")
        out.append("")
        for verb, (model, _role) in c.verbs.items():
            if GENERIC_VERBS.get(verb) is model:
                continue
            name = f"{c.daemon}.{verb}.args.schema.json"
            out += [f"### {c.daemon} `{verb}`", ""]
            out += _md_schema(name, docs[name])
        for thing in c.states:
            name = f"{c.daemon}.state.{thing}.schema.json"
            out += [f"### {c.daemon} `state/{thing}`", ""]
            out += _md_schema(name, docs[name])
    out += ["## Generic verbs (any daemon that registers them)", ""]
    for verb in GENERIC_VERBS:
        name = f"lease.{verb}.args.schema.json"
        out += [f"### `{verb}`", ""]
        out += _md_schema(name, docs[name])
    out += ["## Published payloads", ""]
    for name in ("status.schema.json", "alarm.schema.json", "state-leases.schema.json"):
        out += _md_schema(name, docs[name])
    while out and out[-1] == "":
        out.pop()
    return "\n".join(out) + "\n"


def load_schema(name: str) -> dict[str, Any]:
    """A shipped schema by file name (from the installed package), e.g.
    ``load_schema("command-envelope.schema.json")``.

    Raises:
        FileNotFoundError: no such schema.
    """
    text = resources.files("rackplane").joinpath("schemas", name).read_text(encoding="utf-8")
    doc = json.loads(text)
    assert isinstance(doc, dict)
    return doc
