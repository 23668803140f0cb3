"""A NATS JetStream key-value bucket (nats-py; this module is its only importer).

What leadership leases need (`rackplane.core.leadership`'s store contract): read a key with
its revision, create-if-absent, compare-and-set update and delete, a plain put (probes and a
pair's state record, `rackplane.pair`); and `subscribe_key`, every write to a key pushed as
the server publishes it (a pair's standby hears the active's records and a released lease at
once, instead of at its next read).
Every outcome is one of three kinds, so the caller never has to know nats-py's exceptions:

- a result (a revision, or the key's revision and value, or None for absent/deleted);
- `KvConflict`: the compare-and-set (or create-if-absent) was refused, nothing was written;
- `KvUnknown`: no answer in ``request_timeout_s``, no responders (a stream without a leader,
  during an election), the connection lost, or any other error: a write may or may not have
  landed (on 2.9.10 a write that timed out during an election was seen to land later).

The bucket is made (when missing) with ``replicas`` (3 by default), history 1, no TTL (a lease
is timed by the contenders' clocks, never by the server's ``max_age``) and no direct gets
(reads are answered by the stream leader, never by a lagging replica). An existing bucket with
other replicas or history is refused (`KvError`). Revisions are the stream's sequence numbers:
64-bit, growing over the whole bucket.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable
from typing import Final

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.kv import KeyValue

from rackplane.io.cancel import raise_if_cancelling
from rackplane.io.nats.errors import KvConflict, KvError, KvUnknown

__all__ = ["KEY_PATTERN", "KvConflict", "KvError", "KvUnknown", "NatsKv"]

KEY_PATTERN: Final = r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$"
"""A key: dot-separated tokens of letters, digits, ``_`` and ``-`` (NATS subject tokens)."""
_KEY_RE = re.compile(KEY_PATTERN)
_BUCKET_RE = re.compile(r"^[A-Za-z0-9_-]+$")


CONNECT_TRIES_PER_SERVER: Final = 2
"""How many times `NatsKv.connect` tries each server before it gives up (`KvUnknown`)."""


def inbox_prefix(user: str) -> str:
    """The reply-subject prefix of NATS user ``user`` (``_INBOX_<user>``): only that user may
    subscribe below it (config/nats/rackplane-permissions.conf), so no other user reads its
    replies."""
    return f"_INBOX_{user}"


class NatsKv:
    """One connection to a NATS cluster and one KV bucket on it. Make with `connect`."""

    def __init__(self, nc: Client, kv: KeyValue, bucket: str, request_timeout_s: float):
        self._nc = nc
        self._kv = kv
        self.bucket = bucket
        self.request_timeout_s = request_timeout_s

    @classmethod
    async def connect(cls, servers: list[str], bucket: str, *, replicas: int = 3,
                      request_timeout_s: float = 1.0, connect_timeout_s: float = 2.0,
                      name: str | None = None, user: str | None = None,
                      password: str | None = None,
                      on_reconnect: Callable[[], None] | None = None,
                      create: bool = True) -> NatsKv:
        """Connect to ``servers`` (``nats://host:port``; all of the cluster's nodes) and open
        ``bucket``, making it when missing. The first connection is bounded: every server is
        tried `CONNECT_TRIES_PER_SERVER` times (each attempt up to ``connect_timeout_s``, 0.2 s
        apart), then `KvUnknown` is raised, so the caller logs the failure and tries again on
        its own schedule (a dead cluster, a wrong password or a refused user never hangs a
        start-up silently). Once connected the client reconnects by itself (every 0.2 s,
        without end); ``on_reconnect()`` is called after each reconnection
        (e.g. to read a key again at once: a push sent while disconnected is lost). With
        ``user`` (and ``password``) it logs in as that NATS user and takes its replies on the
        inbox prefix `inbox_prefix` ``(user)``, the one config/nats/ grants that user
        (rackplane.natsacl). ``create=False``: never make the bucket (a reader's view).

        Raises:
            KvError: bad bucket name, the bucket exists with other replicas or history, or
                (``create=False``) it does not exist.
            KvUnknown: no server answered (connect again later).
        """
        if not _BUCKET_RE.fullmatch(bucket):
            raise KvError(f"bucket name {bucket!r} must match {_BUCKET_RE.pattern}")
        async def reconnected() -> None:
            if on_reconnect is not None:
                on_reconnect()

        try:
            creds: dict[str, str] = {}
            if user is not None:
                creds = {"user": user, "password": password or "",
                         "inbox_prefix": inbox_prefix(user)}
            nc = await nats.connect(
                servers=servers, name=name, connect_timeout=connect_timeout_s, **creds,
                reconnect_time_wait=0.2, max_reconnect_attempts=CONNECT_TRIES_PER_SERVER - 1,
                allow_reconnect=True,
                error_cb=_ignore, disconnected_cb=_nothing, reconnected_cb=reconnected)
        except (TimeoutError, nats.errors.Error, OSError) as err:
            raise_if_cancelling()  # nats-py's _flush_pending and _close swallow a cancel
            raise KvUnknown(f"cannot connect to {servers}: {err!r}") from None
        # nats-py swallows a cancellation that lands in its connect loop (Client._close
        # catches CancelledError): honour it here, or a stopping daemon would go on
        try:
            raise_if_cancelling()
        except asyncio.CancelledError:
            await nc.close()
            raise
        # connected: from now on reconnect without end (nats-py reads the option per attempt)
        nc.options["max_reconnect_attempts"] = -1
        try:
            js = nc.jetstream(timeout=request_timeout_s)
            try:
                kv = await js.key_value(bucket)
            except nats.js.errors.BucketNotFoundError:
                if not create:
                    raise KvError(f"bucket {bucket} does not exist") from None
                kv = await js.create_key_value(bucket=bucket, replicas=replicas, history=1,
                                               direct=False)
            info = await js.stream_info(f"KV_{bucket}")
            if info.config.num_replicas != replicas or info.config.max_msgs_per_subject != 1:
                raise KvError(
                    f"bucket {bucket} has {info.config.num_replicas} replicas and history "
                    f"{info.config.max_msgs_per_subject}; leases need {replicas} and 1")
        except KvError:
            await nc.close()
            raise
        except (TimeoutError, nats.errors.Error) as err:
            await nc.close()
            raise KvUnknown(f"cannot open bucket {bucket}: {err!r}") from None
        return cls(nc, kv, bucket, request_timeout_s)

    @staticmethod
    def _check_key(key: str) -> None:
        if not _KEY_RE.fullmatch(key):
            raise ValueError(f"key {key!r} must match {KEY_PATTERN}")

    async def read(self, key: str) -> tuple[int, bytes] | None:
        """The key's (revision, value), or None when absent or deleted.

        Raises:
            KvUnknown: no answer (see the module docstring). ValueError: a bad key.
        """
        self._check_key(key)
        try:
            async with asyncio.timeout(self.request_timeout_s * 2):
                entry = await self._kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return None
        except (TimeoutError, nats.errors.Error, OSError) as err:
            raise KvUnknown(f"read {key}: {err!r}") from None
        finally:
            raise_if_cancelling()  # nats-py's _flush_pending and _close swallow a cancel
        return int(entry.revision or 0), bytes(entry.value or b"")

    async def create(self, key: str, value: bytes) -> int:
        """Write ``value`` only if the key is absent (or deleted); the new revision.

        Raises:
            KvConflict: the key exists. KvUnknown: outcome unknown. ValueError: a bad key.
        """
        self._check_key(key)
        return await self._write(key, self._kv.create(key, value))

    async def update(self, key: str, value: bytes, last: int) -> int:
        """Write ``value`` only if the key's revision is still ``last``; the new revision.

        Raises:
            KvConflict: the revision moved on (or the key is gone). KvUnknown: outcome
                unknown. ValueError: a bad key or ``last`` < 1.
        """
        self._check_key(key)
        if last < 1:
            raise ValueError(f"last revision must be >= 1, not {last}")
        return await self._write(key, self._kv.update(key, value, last=last))

    async def put(self, key: str, value: bytes) -> int:
        """Write ``value`` unconditionally (a lease probe); the new revision.

        Raises:
            KvUnknown: outcome unknown. ValueError: a bad key.
        """
        self._check_key(key)
        return await self._write(key, self._kv.put(key, value))

    async def delete(self, key: str, last: int) -> None:
        """Delete the key only if its revision is still ``last``.

        Raises:
            KvConflict: the revision moved on. KvUnknown: outcome unknown. ValueError: bad key
                or ``last`` < 1.
        """
        self._check_key(key)
        if last < 1:
            raise ValueError(f"last revision must be >= 1, not {last}")
        await self._write(key, self._kv.delete(key, last=last))

    async def _write(self, key: str, op: Awaitable[object]) -> int:
        try:
            async with asyncio.timeout(self.request_timeout_s * 2):
                rev = await op
        except nats.js.errors.KeyWrongLastSequenceError:
            raise KvConflict(f"{key}: compare-and-set refused") from None
        except nats.js.errors.APIError as err:
            if getattr(err, "err_code", None) in (10071, 10164):  # wrong last sequence
                raise KvConflict(f"{key}: compare-and-set refused") from None
            raise KvUnknown(f"write {key}: {err!r}") from None
        except (TimeoutError, nats.errors.Error, OSError) as err:
            raise KvUnknown(f"write {key}: {err!r}") from None
        finally:
            raise_if_cancelling()  # nats-py's _flush_pending and _close swallow a cancel
        return int(rev) if isinstance(rev, int) and not isinstance(rev, bool) else 0

    async def subscribe_key(self, key: str,
                            on_message: Callable[[bytes, bool], None]) -> Callable[
                                [], Awaitable[None]]:
        """Call ``on_message(value, deleted)`` for every write to ``key`` from now on, as the
        server publishes it: a plain NATS subscription on the bucket's subject of the key
        (``$KV.<bucket>.<key>``), no consumer. ``deleted``: a delete or purge (the
        ``KV-Operation`` header; ``value`` empty). For latency only: no revision, no
        ordering or delivery guarantee (a message sent while disconnected is lost; the client
        subscribes again after a reconnect): read the key for the truth. Returns the
        coroutine function that unsubscribes.

        Raises:
            KvUnknown: the subscription could not be sent. ValueError: a bad key.
        """
        self._check_key(key)

        async def deliver(msg: Msg) -> None:
            op = (msg.headers or {}).get("KV-Operation")
            on_message(bytes(msg.data or b""), op in ("DEL", "PURGE"))

        try:
            sub = await self._nc.subscribe(f"$KV.{self.bucket}.{key}", cb=deliver)
        except (TimeoutError, nats.errors.Error, OSError) as err:
            raise KvUnknown(f"subscribe {key}: {err!r}") from None
        finally:
            raise_if_cancelling()  # nats-py's _flush_pending and _close swallow a cancel

        async def unsubscribe() -> None:
            with contextlib.suppress(nats.errors.Error, OSError):
                await sub.unsubscribe()

        return unsubscribe

    @property
    def connected_url(self) -> str | None:
        url = self._nc.connected_url
        return None if url is None else f"{url.scheme}://{url.hostname}:{url.port}"

    async def close(self, timeout_s: float = 5.0) -> None:
        """Close the connection (idempotent), within ``timeout_s``: nats-py's close flushes
        and drains the socket first, which was seen to hang once in the outage tests; past
        the bound the socket is aborted."""
        if self._nc.is_closed:
            return
        try:
            async with asyncio.timeout(timeout_s):
                await self._nc.close()
        except TimeoutError:
            transport = getattr(self._nc, "_transport", None)
            if transport is not None:
                transport.close()


async def _ignore(err: Exception) -> None:
    """nats-py reports connection errors here too; the next request's outcome tells."""
    del err


async def _nothing() -> None:
    return None
