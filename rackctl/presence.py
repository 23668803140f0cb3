"""Whether the daemon rackctl addresses ever connected to this broker: its retained ``status``.

Every daemon's link publishes ``<root>/<site>/<rack>/<daemon>/status`` retained (``online``,
``stopping``, ``offline``; the broker publishes the daemon's Will, ``offline``, when its
connection dies); one instance of a redundant pair publishes ``.../status/<instance>``. The
broker keeps the last one, so a subscription gets it at once. `Presence` subscribes the site's
``<root>/<site>/+/<daemon>/status`` and ``.../status/+`` (readable by every authenticated user
in the shipped ACL, config/mosquitto/rackplane.acl) alongside a verb's own filters, and after
connecting waits for the addressed rack's status up to ``min(1 s, timeout)``: no added wait
when the daemon's status is there (it comes right after the SUBACK), at most that bound when
it is not. Its verdict (`Presence.verdict`):

- ``online`` (some instance online) or ``unknown`` (the filters were not granted): nothing to
  say;
- ``offline``: every status of that rack's daemon says offline (since when: its ``since_ns``,
  or for a Will the connection that died);
- ``never``: no retained status for that rack, while other racks' statuses were read: no
  daemon of that name ever connected for that rack (a mistyped ``--rack``); a command there
  reaches no one, `call` fails at once (`DaemonNeverConnected`, exit 3);
- ``none_at_site``: no status of that daemon at all at the site: a wrong ``--site`` or
  ``--topic-root``, no such daemon anywhere, or a user that may not read status topics (the
  reply timeout then says so; no early failure).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from rackctl.client import ReplyTimeout
from rackplane.io.mqtt import Message

if TYPE_CHECKING:
    from rackctl.client import ClientSettings, CommandClient

__all__ = ["PRESENCE_WAIT_S", "DaemonNeverConnected", "Presence"]

PRESENCE_WAIT_S = 1.0
"""The longest wait for the addressed rack's retained status after subscribing [s]."""

_MAX_RACKS_LISTED = 10

Verdict = Literal["online", "offline", "never", "none_at_site", "unknown"]


class DaemonNeverConnected(Exception):
    """No daemon of that name ever connected for the addressed rack (exit 3, as no reply):
    raised by `Presence.call` about ``min(1 s, timeout)`` after subscribing, not after the
    whole reply timeout."""


def _when(ns: Any) -> str | None:
    if not isinstance(ns, int) or ns <= 0:
        return None
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).isoformat(timespec="seconds").replace(
        "+00:00", "Z")


class Presence:
    """The retained statuses of one daemon at every rack of the site (module docstring).

    Args:
        settings: the verb's settings (topic root, site, the addressed rack).
        daemon: the daemon addressed (a topic level).
    """

    def __init__(self, settings: ClientSettings, daemon: str) -> None:
        self.daemon = daemon
        self.rack = settings.rack
        self._prefix = f"{settings.topic_root}/{settings.site}/"
        self.filters = [f"{self._prefix}+/{daemon}/status",
                        f"{self._prefix}+/{daemon}/status/+"]
        self.statuses: dict[str, dict[str, Any]] = {}
        """rack -> status topic -> its latest payload (a dict; ``{}`` when not JSON)."""
        self._own = asyncio.Event()

    @property
    def own_topic(self) -> str:
        """The addressed rack's ``status`` topic."""
        return f"{self._prefix}{self.rack}/{self.daemon}/status"

    def attach(self, client: CommandClient) -> None:
        """Subscribe the site's status filters on ``client`` (before entering it)."""
        for flt in self.filters:
            client.subscribe(flt, self.on_message, qos=1)

    def on_message(self, msg: Message) -> None:
        """Take one status message (an empty payload clears that topic)."""
        rest = msg.topic[len(self._prefix):] if msg.topic.startswith(self._prefix) else ""
        rack = rest.split("/", 1)[0]
        if not rack:
            return
        if not msg.payload:
            self.statuses.get(rack, {}).pop(msg.topic, None)
            return
        try:
            body = msg.json()
        except ValueError:
            body = {}
        self.statuses.setdefault(rack, {})[msg.topic] = body if isinstance(body, dict) else {}
        if rack == self.rack:
            self._own.set()

    def racks_seen(self) -> list[str]:
        """Racks with a retained status of this daemon, sorted."""
        return sorted(r for r, topics in self.statuses.items() if topics)

    async def settle(self, client: CommandClient, wait_s: float) -> Verdict:
        """Wait up to ``wait_s`` (from now: call it once connected) for the addressed rack's
        status and return the verdict (module docstring)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._own.wait(), wait_s)
        return self.verdict(client.link.subscribed_topics)

    def verdict(self, granted: list[str]) -> Verdict:
        """The verdict from what arrived so far; ``granted``: the filters the broker
        granted."""
        own = self.statuses.get(self.rack) or {}
        if own:
            states = [b.get("status") for b in own.values()]
            return "offline" if all(s == "offline" for s in states) else "online"
        if not all(f in granted for f in self.filters):
            return "unknown"
        others = [r for r in self.racks_seen() if r != self.rack]
        return "never" if others else "none_at_site"

    def explain(self, verdict: Verdict) -> str | None:
        """One sentence on the verdict, None for ``online`` and ``unknown``."""
        d, rack = self.daemon, self.rack
        if verdict == "never":
            seen = self.racks_seen()
            listed = ", ".join(seen[:_MAX_RACKS_LISTED]) + (
                f" (and {len(seen) - _MAX_RACKS_LISTED} more)"
                if len(seen) > _MAX_RACKS_LISTED else "")
            return (f"no {d} of rack '{rack}' has ever connected to this broker (no retained "
                    f"{self.own_topic}); racks seen: {listed}")
        if verdict == "none_at_site":
            return (f"no retained {d} status at all under {self.filters[0]}: no {d} ever "
                    "connected at this site (check --site and --topic-root), or your user may "
                    "not read status topics")
        if verdict == "offline":
            parts = []
            for topic, body in sorted((self.statuses.get(rack) or {}).items()):
                since = _when(body.get("since_ns"))
                if since is not None:
                    parts.append(f"offline since {since}")
                else:  # the Will: the broker noticed the connection die, the daemon could not
                    made = _when(body.get("online_since_ns"))
                    parts.append("offline: its connection" + (f" made {made}" if made else "")
                                 + " was lost")
                if topic != self.own_topic:
                    parts[-1] = f"{topic.rsplit('/', 1)[-1]}: {parts[-1]}"
            return f"{d} of rack '{rack}' is " + "; ".join(parts) + " (its retained status)"
        return None

    async def absent_note(self, client: CommandClient) -> str | None:
        """For ``rackctl watch`` (once connected): after `settle` for ``min(1 s, timeout)``, a
        note when no status of that daemon at that rack exists (``never``,
        ``none_at_site``: nothing will show until one connects), else None."""
        verdict = await self.settle(client, min(PRESENCE_WAIT_S, client.settings.timeout_s))
        if verdict not in ("never", "none_at_site"):
            return None
        return f"note: {self.explain(verdict)}; watching anyway"

    async def call(
        self,
        client: CommandClient,
        verb: str,
        args: Mapping[str, Any] | None = None,
        *,
        request_id: str | None = None,
    ) -> dict[str, Any]:
        """`CommandClient.call` to this daemon, with the verdict beside it: a reply is returned
        as it comes (no added wait); with no daemon ever connected for that rack
        (``never``) it fails after ``min(1 s, timeout)``; a reply timeout names what the
        statuses say (offline since when, nothing at this site).

        Raises:
            DaemonNeverConnected: verdict ``never``.
            ReplyTimeout: no reply in ``timeout_s`` (its text says why, when the statuses
                tell).
            As `CommandClient.call` otherwise.
        """
        s = client.settings
        rid = request_id or f"rc-{uuid.uuid4().hex[:16]}"
        check = asyncio.ensure_future(self.settle(client, min(PRESENCE_WAIT_S, s.timeout_s)))
        reply = asyncio.ensure_future(client.call(self.daemon, verb, args, request_id=rid))
        try:
            done, _ = await asyncio.wait({check, reply}, return_when=asyncio.FIRST_COMPLETED)
            if reply not in done and check.result() == "never":
                await asyncio.wait({reply}, timeout=0.05)  # a reply racing the verdict wins
                if not reply.done():
                    raise DaemonNeverConnected(
                        f"{self.explain('never')}: the {verb} command reaches no one (check "
                        "--rack)")
            try:
                return await reply
            except ReplyTimeout as err:
                verdict = await check
                why = self.explain(verdict)
                if why is None:
                    raise
                if verdict != "offline":
                    raise ReplyTimeout(f"{err}; {why}") from None
                raise ReplyTimeout(
                    f"no reply from {self.daemon} to {verb} within {s.timeout_s:g} s: {why}; "
                    f"it may still apply the command within its TTL if it comes back (retry "
                    f"with the same --request-id {rid}, it is never applied twice)"
                ) from None
        finally:
            for task in (check, reply):
                if not task.done():
                    task.cancel()
            await asyncio.gather(check, reply, return_exceptions=True)
