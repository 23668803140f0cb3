"""Cancellation that a library swallowed, re-raised: one helper for every adapter task."""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["raise_if_cancelling"]


def raise_if_cancelling(task: asyncio.Task[Any] | None = None) -> None:
    """Re-raise a cancellation that a library swallowed (``task``: the current task, when
    the caller has it; `asyncio.current_task` costs a getpid() system call).

    Python 3.11's ``asyncio.wait_for`` (used by pymodbus 3.16.1 for every request and
    connect, and by nats-py 2.16 for every request) returns the result instead of raising
    when the cancel arrives in the same loop iteration as the reply (CPython gh-86296, fixed
    in 3.12). The task still counts the request (`asyncio.Task.cancelling`), so the owner
    checks it between steps: without this, a busy task could ignore a shutdown forever.

    Raises:
        asyncio.CancelledError: the task has a cancellation pending.
    """
    if task is None:
        task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError()
