"""The command path: MQTT commands validated, authorised, de-duplicated, applied, answered and
audited (DESIGN §1 "MQTT commands -> validate -> lease -> core -> reply", §3 MQTT contract).

A package, one room per job: the envelope, reply and payload models, codes and strict JSON
reading are pure (`rackplane.core.envelope`); `rackplane.commands.router` holds
`CommandRouter`, which reaches the broker only through a `CommandTransport` (the daemon's
`rackplane.io.mqtt.MqttLink`; a unit test's fake), so it runs without a broker;
`rackplane.commands.leases` the limit and lease hooks; `rackplane.commands.bounds` the
bounds of every numeric argument (`register_bounded`); `rackplane.commands.contract` the
schemas and docs/COMMANDS.md. Import everything from ``rackplane.commands``.

A client named ``<user>`` by the broker publishes (QoS 1, not retained) to
``<root>/<site>/<rack>/<daemon>/cmd/<user>/<verb>``::

    {"request_id": "op-42", "issued_at": "2026-01-01T12:00:00Z", "args": {"setpoint_c": 40}}

and gets exactly one reply ``{request_id, ok, error: {code, message} | null, state}`` on its
MQTT v5 Response Topic (with its Correlation Data), else on ``cmd/<user>/<verb>/result``.

**Response topics** follow one convention, so a broker ACL can grant them (config/mosquitto):
``<base>/cmd/<user>/<verb>/result`` or below it (``.../result/<client nonce>``), i.e. inside
the sender's own reply space, every level a topic level (`rackplane.core.names`). A command
with any other response topic (a wildcard, another user's or daemon's topic, ``$SYS``, one
outside the topic root) is neither executed nor answered: it is audited (outcome
``response_topic_refused``, correlation data as hex) and a warning is logged, so a client
can never make a daemon publish onto a topic of its choosing. Without a response topic
(MQTT 3.1.1) the reply goes to ``.../result``. A reply's QoS is never above the request's.

The JSON Schemas of the envelope, the reply, every verb's args, the ``status`` and ``alarm``
payloads and ``state/leases`` ship in ``rackplane/schemas/`` (`schema_documents`,
`write_schemas`, through the one generator `rackplane.schemagen`) and are rendered into
docs/COMMANDS.md (`render_markdown`); regenerate both with ``rackctl schemas --write``
(``rackctl schemas --check`` and a test fail when either is stale).

The checks, in order, each refusing with its ``error.code`` (`ROUTER_CODES`):

1. ``retained``: a command delivered from the broker's retained store is never executed (the
   reply carries its request_id when it can be read, so the sender can match it). On
   MQTT v5 the router subscribes with Retain As Published, so a command *published* retained
   is refused even when it arrives live; on MQTT 3.1.1 a live delivery cannot be told apart
   (the broker clears the flag) and only deliveries from the retained store are refused
   (docs/COMMANDS.md "Retained commands").
2. ``too_large``: payload above ``max_payload_bytes`` (not parsed at all).
3. ``bad_json`` (not UTF-8, not JSON), ``non_finite`` (NaN/Infinity literals, a number
   beyond a double's range), ``duplicate_key``, ``too_deep`` (nested deeper than 32 levels),
   ``wrong_type`` (not an object).
4. ``invalid_envelope``: `CommandEnvelope` refused it (key paths in the message). The reply
   carries the request_id if it could be read, else null.
5. A (user, request_id) already seen among the last ``dedup_entries``: answered with the first
   reply, never applied again (FIELD-CASES BR-22 a, a QoS 1 redelivery with DUP, or a client
   retry). The same request_id with another verb or other args: ``request_id_reused``; the
   same one while its first copy is still being handled (an async handler): ``in_progress``.
6. ``expired`` / ``from_future``: ``issued_at`` older than ``ttl_s`` or more than
   ``clock_skew_s`` ahead of our wall clock (``Clock.wall_ns``: a timestamp comparison, the
   only wall-clock use here).
7. ``unknown_verb`` (the message lists the known verbs).
8. ``forbidden``: the user's role (``CommandSettings.users``, else ``default_role``; never from
   the payload) is below the verb's least role (reader < automation < operator).
9. The args: the verb's args model (key paths ``args.<field>``) and every numeric argument
   against its bounds from config (`rackplane.commands.bounds`). One refusal lists **every**
   problem of the args at once (the model's and the bounds', e.g. a budget out of range and
   a missing reason), in the order of the model's fields (problems of no one field and
   unknown keys last); its code is that of the first: ``wrong_type`` (a JSON type the field
   does not take), ``non_finite``, ``out_of_range`` (a bound's code: e.g. ``unknown_tray``),
   else ``invalid_args`` (missing or unknown key, pattern, enum).
10. The handler: a `CommandError` becomes ``ok: false`` with its code; any other exception is
    ``internal_error`` (logged with its traceback); otherwise ``ok: true`` and ``state`` is the
    handler's dict.

**Handler contract.** ``handler(args, ctx) -> dict`` runs on the event loop. A synchronous
handler must be quick (BR-24: no I/O, no sleeps). Blocking work (a synchronous driver call, a
file) goes through an *async* handler: ``handler(args, ctx)`` returns an awaitable (e.g. a
coroutine that ``await asyncio.to_thread(...)``) which the router awaits, so the event loop,
the control tick, the MQTT keepalive and the watchdog keep running (FIELD-CASES BR-24 b).
Commands are still handled one at a time, in arrival order (BR-22 a): a slow async handler
delays the next command, never the loop. Either kind must *validate before it mutates*: when
it raises, nothing may have changed, so a refusal or an ``internal_error`` reply always means
"not applied" (an async handler validates and mutates after its last ``await``, or treats the
awaited work as the change). Side effects after the mutation (publishing events) must not
raise. It reads time from ``ctx.now_mono`` / ``ctx.wall_ns``, never a clock.

**Limits, interlocks and leases** are checked by the handler before it mutates: the value
against its config limits (e.g. `require_within`), the output against the daemon's
`rackplane.core.leases.LeaseTable` (``table.check(output, ctx.user, ctx.role, ctx.now_mono)``:
active interlocks first, then leases). `register_lease_verbs` adds the generic verbs
``acquire_lease`` / ``release_lease`` for any daemon; `LeaseGate` wires the whole of it in
one object (the verbs, ``check(output, ctx)`` for the handlers, ``tick(now, interlocks)`` for
the control tick, ``state/leases`` published on change).

Every command, accepted or refused, is audited once: one ``command`` log event and one call of
the ``audit`` callback with a `CommandAudit` (a daemon writes it to the time series as
measurement ``command``, DESIGN §3, via `CommandAudit.tags` / `CommandAudit.fields`).
`CommandRouter.stats` counts received, applied, refused by code and duplicates. The message
handler never raises and never blocks: every step is bounded by ``max_payload_bytes``.

The broker's ACL (config/mosquitto/acl: each operator may write only
``rackplane/+/+/+/cmd/<own username>/+``) makes ``<user>`` unforgeable; ``rackctl cmd`` is
the client. The envelope forbids unknown keys, so new fields arrive with a schema change.

**Test-only verb.** With ``RACKPLANE_TEST_VERBS=1`` in the daemon's environment, `attach`
also registers ``test_block {seconds, mode: sync | thread}`` (operator): ``sync`` blocks the
event loop with ``time.sleep`` (the broken design of BR-24 b), ``thread`` does the same sleep
through ``asyncio.to_thread`` (the fixed design). Never set in production; the integration
tests of BR-24 use it.
"""

from rackplane.commands import bounds as _bounds
from rackplane.commands import contract as _contract
from rackplane.commands import leases as _leases
from rackplane.commands import router as _router
from rackplane.commands.bounds import *  # noqa: F403 (the package's public names: its modules' __all__)
from rackplane.commands.contract import *  # noqa: F403 (the package's public names: its modules' __all__)
from rackplane.commands.leases import *  # noqa: F403 (the package's public names: its modules' __all__)
from rackplane.commands.router import *  # noqa: F403 (the package's public names: its modules' __all__)
from rackplane.core import envelope as _envelope
from rackplane.core.envelope import *  # noqa: F403 (the package's public names: its modules' __all__)

__all__: list[str] = []
__all__ += _bounds.__all__
__all__ += _contract.__all__
__all__ += _leases.__all__
__all__ += _router.__all__
__all__ += _envelope.__all__
