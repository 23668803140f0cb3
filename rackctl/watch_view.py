"""What ``rackctl watch`` shows: the live view on a terminal (`WatchView.render`, a rich
group redrawn in place) and, when stdout is not a terminal (a pipe, a file, a log
collector), one plain text line per message as it arrives (`WatchView.lines`):

- ``valvey: online`` or ``valvey: online (pair: a active epoch 3, b standby)`` (the status
  line, after each ``status`` message and when a pair state changes it);
- ``state/<thing> key=value key=value ...`` (nested keys dotted, as the live table);
- ``alarm/<id> severity=... state=... acked=... shelved=... message=...`` or
  ``alarm/<id> cleared``.

A value with a space, a quote, an ``=`` or a control character is written as a JSON string,
so every line is exactly one line whatever a daemon sends. Also the table ``rackctl cmd``
prints of a command's reply (`reply_table`). Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

__all__ = ["WatchView", "flatten", "plain_value", "reply_table"]

_NEEDS_QUOTES = re.compile(r'[\s"=\x00-\x1f\x7f]')
_ALARM_FIELDS = ("severity", "state", "acked", "shelved", "message")


def flatten(value: Any, prefix: str = "", depth: int = 0) -> list[tuple[str, str]]:
    """``(dotted key, text)`` rows of a payload, three levels deep; a text over 120
    characters is cut (…)."""
    if isinstance(value, dict) and value and depth < 3:
        rows: list[tuple[str, str]] = []
        for k, v in value.items():
            rows += flatten(v, f"{prefix}.{k}" if prefix else str(k), depth + 1)
        return rows
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return [(prefix or "-", text if len(text) <= 120 else text[:119] + "…")]


def plain_value(text: str) -> str:
    """``text`` as one token of a plain line: as is, or a JSON string when it is empty or
    holds a space, quote, ``=`` or control character."""
    if text and not _NEEDS_QUOTES.search(text):
        return text
    return json.dumps(text, ensure_ascii=False)


class WatchView:
    """The latest status, each state thing and the active alarms of one daemon."""

    def __init__(self, daemon: str) -> None:
        from rackctl.pair import PairView

        self.daemon = daemon
        self.pair = PairView()  # status and status/<instance> (a pair: rackctl/pair.py)
        self.states: dict[str, Any] = {}
        self.alarms: dict[str, Any] = {}
        self._head: str | None = None  # the status line last given by `lines`
        self.note: str | None = None
        """A line shown under the status line (e.g. no such daemon at that rack)."""

    def update(self, kind: str, name: str, body: Any) -> None:
        """Take one message (``kind``: status, state or alarm; ``name``: the rest of the
        topic; ``body``: the decoded payload, None when cleared)."""
        if kind == "status":
            self.pair.update(kind, name, body)
        elif kind == "state":
            self.pair.update(kind, name, body)
            self.states[name] = body
        elif kind == "alarm":
            if body is None:
                self.alarms.pop(name, None)
            else:
                self.alarms[name] = body

    def lines(self, kind: str, name: str, body: Any) -> list[str]:
        """The plain lines of one message, taken with `update` first (module docstring):
        the status line after a ``status`` message; a state or alarm line; after a pair's
        ``state/pair_<instance>`` also the status line when it changed (a pair's roles come
        with its pair states). Empty for a topic the view does not show."""
        out: list[str] = []
        if kind == "state":
            rows = flatten(body if isinstance(body, dict) else {"value": body})
            fields = " ".join(f"{k}={plain_value(v)}" for k, v in rows)
            out.append(f"state/{name} {fields}".rstrip())
        elif kind == "alarm":
            if body is None:
                out.append(f"alarm/{name} cleared")
            else:
                b = body if isinstance(body, dict) else {"message": body}
                out.append(f"alarm/{name} " + " ".join(
                    f"{k}={plain_value(str(b.get(k, '')))}" for k in _ALARM_FIELDS))
        if kind == "status" or (kind == "state" and name.startswith("pair_")):
            head = self.pair.status_line(self.daemon).plain
            if kind == "status" or head != self._head:
                out.append(head)
            self._head = head
        return out

    def render(self) -> Group:
        """The live view: status line, one table per state thing, the alarms table."""
        parts: list[Any] = [self.pair.status_line(self.daemon)]
        if self.note is not None:
            parts.append(Text(self.note, style="yellow"))
        for thing, body in sorted(self.states.items()):
            t = Table(title=Text(f"state/{thing}"), show_header=False, title_justify="left")
            t.add_column("key", style="cyan")
            t.add_column("value", overflow="fold")
            for key, text in flatten(body if isinstance(body, dict) else {"value": body})[:40]:
                t.add_row(Text(key), Text(text))  # the daemon's text, never markup
            parts.append(t)
        a = Table(title=f"alarms ({len(self.alarms)})", title_justify="left")
        for col in ("id", "severity", "state", "acked", "shelved", "message"):
            a.add_column(col)
        for alarm_id, body in sorted(self.alarms.items()):
            b = body if isinstance(body, dict) else {}
            a.add_row(*(Text(str(v)) for v in (
                alarm_id, b.get("severity", ""), b.get("state", ""), b.get("acked", ""),
                b.get("shelved", ""), b.get("message", ""))))
        parts.append(a)
        return Group(*parts)


def reply_table(daemon: str, verb: str, reply: dict[str, Any]) -> Table:
    """The table ``rackctl cmd`` prints of a reply ``{request_id, ok, error, state}``: the
    title says ok or refused (with the error code); the request id, a refusal's message, then
    the state's rows (none for an empty state)."""
    ok = bool(reply.get("ok"))
    err = reply.get("error") or {}
    title = f"{daemon} {verb}: " + ("ok" if ok else f"refused ({err.get('code', '?')})")
    # every cell is a Text: what a daemon sends (a lease reason, an error message naming
    # ``[commands.users]``) is shown as written, never read as rich markup (a reason like
    # "[/x]" raised MarkupError in every other user's rackctl)
    t = Table(title=Text(title, style="bold green" if ok else "bold red"), show_header=False)
    t.add_column("key", style="cyan")
    t.add_column("value", overflow="fold")
    t.add_row("request_id", Text(str(reply.get("request_id"))))
    if not ok:
        t.add_row("error", Text(str(err.get("message", ""))))
    state = reply.get("state")
    if state not in (None, {}, []):  # a refusal's empty state is no row ("- │ {}")
        for key, text in flatten(state):
            t.add_row(Text(key), Text(text))
    return t
