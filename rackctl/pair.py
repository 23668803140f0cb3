"""rackctl's views of a redundant pair and the ``handover`` command (issue 15 item 5).

A daemon runs either as a single instance, publishing the rack-level ``<base>/status``, or as
an active/standby pair (docs/OPERATIONS.md §6), each instance publishing its own retained
``<base>/status/<instance>`` (online / stopping / offline, Last Will offline) and
``<base>/state/pair_<instance>`` (published by `rackplane.daemon.DaemonFrame.pair_state` on
change and every second: ``role``, ``epoch``, ``fence_in_s``, ``takeover_in_s``,
``last_change``, ``acquisitions``, ``synced_age_s``, ``alarms`` ...). A pair publishes no
rack-level status, so a view must not call it offline for that (`PairView.daemon_status`).

`PairView` is pure (no I/O): feed it (kind, name, payload) as `rackctl.cli` classifies topics.
Commands: ``rackctl pair DAEMON`` (one look at the retained topics) and ``rackctl handover
DAEMON`` (the ``handover`` verb through the command client, as ``rackctl cmd``).
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass, field
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from rackctl import cli
from rackctl.options import NO_OPTIONS, Connection, connection_options
from rackplane.errors import ConfigError, MqttError

__all__ = ["PairView", "handover", "pair"]


@dataclass
class PairView:
    """The latest rack-level status, and each instance's status and pair state.

    Attributes:
        single: the payload of ``<base>/status`` (None: not seen or cleared).
        instance_status: instance → payload of ``status/<instance>``.
        pair_state: instance → payload of ``state/pair_<instance>``.
    """

    single: dict[str, Any] | None = None
    instance_status: dict[str, dict[str, Any]] = field(default_factory=dict)
    pair_state: dict[str, dict[str, Any]] = field(default_factory=dict)

    def update(self, kind: str, name: str, body: Any) -> bool:
        """Take one message (``kind`` status/state, ``name`` the rest of the topic: ``""``,
        an instance, or a state thing). True when it was a status or pair topic."""
        doc = body if isinstance(body, dict) else None
        if kind == "status":
            if not name:
                self.single = doc
            elif doc is None:
                self.instance_status.pop(name, None)
            else:
                self.instance_status[name] = doc
            return True
        if kind == "state" and name.startswith("pair_") and len(name) > 5:
            inst = name[5:]
            if doc is None:
                self.pair_state.pop(inst, None)
            else:
                self.pair_state[inst] = doc
            return True
        return False

    @property
    def mode(self) -> str:
        """``pair`` (any instance topic seen), ``single`` (only ``<base>/status``), or
        ``unknown`` (nothing retained)."""
        if self.instance_status or self.pair_state:
            return "pair"
        return "single" if self.single is not None else "unknown"

    def instances(self) -> list[str]:
        return sorted(set(self.instance_status) | set(self.pair_state))

    def online(self, inst: str) -> bool:
        return (self.instance_status.get(inst) or {}).get("status") == "online"

    def active(self) -> list[str]:
        """Instances that are online and report role ``active`` (more than one: a fault)."""
        return [i for i in self.instances()
                if self.online(i) and (self.pair_state.get(i) or {}).get("role") == "active"]

    def daemon_status(self) -> str:
        """One word for the daemon: a single instance's own status; for a pair ``online``
        when exactly one instance is online and active, ``no_active`` when instances are
        online but none is active, ``two_active`` when more than one is, ``offline`` when no
        instance is online; ``unknown`` with nothing retained."""
        if self.mode == "single":
            return str((self.single or {}).get("status", "unknown"))
        if self.mode == "unknown":
            return "unknown"
        act = self.active()
        if len(act) > 1:
            return "two_active"
        if act:
            return "online"
        return "no_active" if any(self.online(i) for i in self.instances()) else "offline"

    def summary(self) -> dict[str, Any]:
        """What ``rackctl pair --json`` prints: ``mode``, ``status`` (`daemon_status`),
        ``active`` (instance or None), ``epoch``, ``lease_remaining_s`` (the active's
        ``fence_in_s``: seconds until it fences itself if no renewal is confirmed),
        ``last_change`` (the active's last lease event, "kind: detail": how it got the
        lease), ``acquisitions`` (its tenures begun: failovers and handovers to it), and per
        instance its status, role, epoch, fence_in_s, takeover_in_s, last_change,
        acquisitions, synced_age_s (seconds since it applied the active's last sync record;
        a standby's), alarms (raised pair alarms)."""
        act = self.active()
        head = self.pair_state.get(act[0], {}) if len(act) == 1 else {}
        per = {}
        for i in self.instances():
            ps = self.pair_state.get(i) or {}
            per[i] = {"status": (self.instance_status.get(i) or {}).get("status", "unknown"),
                      **{k: ps.get(k) for k in (
                          "role", "epoch", "fence_in_s", "takeover_in_s", "last_change",
                          "acquisitions", "synced_age_s", "alarms")}}
        return {"mode": self.mode, "status": self.daemon_status(),
                "active": act[0] if len(act) == 1 else None,
                "epoch": head.get("epoch"), "lease_remaining_s": head.get("fence_in_s"),
                "last_change": head.get("last_change"),
                "acquisitions": head.get("acquisitions"), "instances": per}

    def status_line(self, daemon: str) -> Text:
        """The head line of ``rackctl watch``: ``valvey: online`` for a single instance,
        ``valvey: online (pair: a active epoch 12, b standby)`` for a pair."""
        st = self.daemon_status()
        text = f"{daemon}: {st}"
        if self.mode == "pair":
            parts = []
            for i in self.instances():
                ps = self.pair_state.get(i) or {}
                role = ps.get("role", "?") if self.online(i) else \
                    (self.instance_status.get(i) or {}).get("status", "unknown")
                epoch = f" epoch {ps.get('epoch')}" if role == "active" else ""
                parts.append(f"{i} {role}{epoch}")
            text += f" (pair: {', '.join(parts)})"
        return Text(text, style="bold green" if st == "online" else "bold red")

    def table(self, daemon: str) -> Table:
        s = self.summary()
        t = Table(title=self.status_line(daemon), title_justify="left")
        for col in ("instance", "status", "role", "epoch", "lease left s", "takeover in s",
                    "synced age s", "acquisitions", "last change", "alarms"):
            t.add_column(col, overflow="fold")
        for i, d in s["instances"].items():
            # the daemons' text shown as written, never read as rich markup
            t.add_row(*(Text(c) for c in (
                i, str(d["status"]), str(d["role"] or ""), _txt(d["epoch"]),
                _txt(d["fence_in_s"]), _txt(d["takeover_in_s"]), _txt(d["synced_age_s"]),
                _txt(d["acquisitions"]), str(d["last_change"] or ""),
                ", ".join(str(a) for a in d["alarms"] or []))))
        return t


def _txt(v: Any) -> str:
    return "" if v is None else str(v)


def pair_filters(base: str) -> list[str]:
    """The retained topics a pair view reads: ``status``, ``status/+``, ``state/+``."""
    return [f"{base}/status", f"{base}/status/+", f"{base}/state/+"]


@cli.app.command("pair", short_help="Show a daemon's pair: active instance, epoch.")
@connection_options(replies=False)
def pair(
    daemon: Annotated[str, typer.Argument(help="daemon name, e.g. valvey")],
    wait: Annotated[float, typer.Option(
        min=0.1, max=30.0, help="seconds to collect the retained topics")] = 1.5,
    json_out: cli.JsonOpt = False,
    conn: Connection = NO_OPTIONS,
) -> None:
    """Show whether a daemon runs single or as a pair; for a pair which instance is active,
    its epoch, the lease's remaining time, its last lease change, each instance's sync age
    and pair alarms.

    Exit 0 when the daemon is online (a pair: exactly one active), 1 when not (offline, no
    active, two active, nothing retained), 2/3 as for cmd."""
    from rackctl.client import BrokerRefused, BrokerUnavailable, CommandClient
    from rackplane.io.mqtt import Message

    cli.configure_logging("error", "console")
    settings = conn.settings()
    try:
        base = settings.topics(daemon).base
    except ValueError as err:
        cli._fail(f"invalid daemon: {cli._one_line(err)}", cli.EXIT_USAGE)
    view = PairView()

    def on_message(msg: Message) -> None:
        rest = msg.topic[len(base) + 1:] if msg.topic.startswith(base + "/") else msg.topic
        kind, _, name = rest.partition("/")
        try:
            body = msg.json() if msg.payload else None
        except ValueError:
            body = None
        view.update(kind, name, body)

    async def run() -> None:
        client = CommandClient(settings)
        for flt in pair_filters(base):
            client.subscribe(flt, on_message, qos=1)
        async with client:
            await asyncio.sleep(wait)

    try:
        asyncio.run(run())
    except BrokerRefused as err:
        cli._fail(str(err), cli.EXIT_USAGE)
    except BrokerUnavailable as err:
        cli._fail(str(err), cli.EXIT_NO_BROKER)
    except ConfigError as err:
        cli._fail(f"settings: {err}", cli.EXIT_USAGE)
    if json_out:
        sys.stdout.write(json.dumps(view.summary(), ensure_ascii=False) + "\n")
    elif view.mode == "single":
        Console().print(Text(f"{daemon}: single instance, "
                             f"{view.daemon_status()}"), highlight=False)
    elif view.mode == "unknown":
        Console().print(Text(f"{daemon}: nothing retained under {base} (never started, or "
                             "another site/rack)"), highlight=False)
    else:
        Console().print(view.table(daemon))
    raise typer.Exit(cli.EXIT_OK if view.daemon_status() == "online" else cli.EXIT_REFUSED)


@cli.app.command("handover", short_help="Hand a pair's active role to the standby.")
@connection_options()
def handover(
    daemon: Annotated[str, typer.Argument(help="daemon name, e.g. valvey")],
    reason: Annotated[str | None, typer.Option(help="why (logged by the daemon)")] = None,
    request_id: Annotated[str | None, typer.Option(
        help="reuse an id to retry safely (a retry never hands back)")] = None,
    json_out: cli.JsonOpt = False,
    conn: Connection = NO_OPTIONS,
) -> None:
    """Planned maintenance: the pair's active instance releases its lease and the standby
    takes over bumplessly (verb handover, role operator; docs/OPERATIONS.md §6).

    Exit 0 released, 1 refused (e.g. unavailable: the KV store did not confirm, nothing
    released; not_paired: a single instance), 2/3 as for cmd."""
    from rackctl.client import (
        BrokerRefused,
        BrokerUnavailable,
        CommandClient,
        ReplyTimeout,
        validate_request_id,
    )
    from rackplane.io.mqtt import PublishRefused

    cli.configure_logging("error", "console")
    if request_id is not None:
        try:
            validate_request_id(request_id)
        except ValueError as err:
            cli._fail(str(err), cli.EXIT_USAGE)
    settings = conn.settings()
    try:
        settings.topics(daemon)
    except ValueError as err:
        cli._fail(f"invalid daemon: {cli._one_line(err)}", cli.EXIT_USAGE)
    args = {"reason": reason} if reason is not None else {}

    async def run() -> dict[str, Any]:
        client = CommandClient(settings)
        client.expect_replies_from(daemon)
        async with client:
            return await client.call(daemon, "handover", args, request_id=request_id)

    try:
        reply = asyncio.run(run())
    except BrokerRefused as err:
        cli._fail(str(err), cli.EXIT_USAGE)
    except PublishRefused as err:
        cli._fail(f"{err} (your user may not send this command)", cli.EXIT_REFUSED)
    except (BrokerUnavailable, ReplyTimeout) as err:
        cli._fail(f"{err} (only the active instance answers: is one active? "
                  f"`rackctl pair {daemon}`)", cli.EXIT_NO_BROKER)
    except MqttError as err:
        cli._fail(f"MQTT: {err}", cli.EXIT_NO_BROKER)
    except ConfigError as err:
        cli._fail(f"settings: {err}", cli.EXIT_USAGE)
    if json_out:
        sys.stdout.write(json.dumps(reply, ensure_ascii=False) + "\n")
    else:
        Console().print(Text(handover_message(daemon, reply)), highlight=False)
    raise typer.Exit(cli.EXIT_OK if reply.get("ok") is True else cli.EXIT_REFUSED)


def handover_message(daemon: str, reply: dict[str, Any]) -> str:
    """The one line ``rackctl handover`` prints for ``reply`` (a command reply)."""
    if reply.get("ok") is True:
        st = reply.get("state") or {}
        return (f"{daemon}: instance {st.get('instance', '?')} released its lease (epoch "
                f"{st.get('released_epoch', '?')}); the standby takes over now. Check with "
                f"`rackctl pair {daemon}`.")
    err = reply.get("error") or {}
    code = err.get("code", "?")
    if code in ("not_paired", "unknown_verb"):
        # not_paired: a single instance's refusal; unknown_verb: an older single instance
        # (no handover verb: its message lists every verb it has, which buries the point)
        return (f"{daemon}: handover refused: {daemon} runs as a single instance, not part of "
                f"a redundant pair: there is no standby to hand over to ({code}; `rackctl "
                f"pair {daemon}` shows it)")
    hint = {"unavailable": " (nothing was released; this instance stays active)",
            "not_active": " (this instance does not hold the lease)"}.get(code, "")
    return f"{daemon}: handover refused: {code}: {err.get('message', '')}{hint}"
