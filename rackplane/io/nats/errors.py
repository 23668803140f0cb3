"""The outcomes of a key-value request other than a result (no nats-py here: the lease runner
and tests use them without the client library)."""

from __future__ import annotations

__all__ = ["KvConflict", "KvError", "KvUnknown"]


class KvError(RuntimeError):
    """The bucket cannot be used as configured (wrong replicas/history, bad name)."""


class KvConflict(RuntimeError):
    """A compare-and-set or create-if-absent was refused: nothing was written."""


class KvUnknown(RuntimeError):
    """The outcome is unknown: a write may or may not have landed."""
