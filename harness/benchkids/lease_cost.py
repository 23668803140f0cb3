"""The lease's CPU cost (issue 15: lease renewals at most 0.02 core per daemon): one process
that connects to the NATS cluster and runs one contender of a lease key
(`rackplane.io.nats.lease.LeaseRunner`, instance ``a`` or ``b``, the default ``[leadership]``
timing: renew every 2 s), or, as ``connection``, only the connection and its bucket (the
baseline: what the process costs without the runner).

Usage: ``python -m harness.benchkids.lease_cost a|b|connection SERVERS BUCKET KEY SECONDS
OUT_JSON`` (SERVERS: comma-separated ``nats://host:port``). A contender waits until it holds
the lease or sees the other holding it, then the process CPU is measured over SECONDS of wall
time. Writes ``{role, cpu_s, wall_s, cpu_core, holding, epoch, failures}`` (``cpu_core``: CPU
s per wall s; ``holding`` at the end). Exits 1 when no holder was seen within 30 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from pathlib import Path

from rackplane.io.nats.kv import NatsKv
from rackplane.io.nats.lease import LeaseRunner
from rackplane.leadership_settings import LeadershipSettings

READY_WITHIN_S = 30.0


async def measure(role: str, servers: list[str], bucket: str, key: str,
                  seconds: float) -> dict[str, object]:
    """The role's process CPU over ``seconds`` once it is steady (module docstring).

    Raises:
        RuntimeError: neither this contender nor another held the lease within
            `READY_WITHIN_S`.
    """
    ls = LeadershipSettings()
    kv = await NatsKv.connect(servers, bucket, request_timeout_s=ls.request_timeout_s)
    runner = None if role == "connection" else LeaseRunner(kv, key, role, ls.timing())
    task = None if runner is None else asyncio.create_task(runner.run())
    try:
        t_end = time.monotonic() + READY_WITHIN_S
        while runner is not None:
            st = runner.status()
            if st.holding or st.holder_seen is not None:
                break
            if time.monotonic() > t_end:
                raise RuntimeError(f"{role}: not steady within {READY_WITHIN_S} s: {st}")
            await asyncio.sleep(0.1)
        c0, t0 = time.process_time(), time.monotonic()
        await asyncio.sleep(seconds)
        cpu_s, wall_s = time.process_time() - c0, time.monotonic() - t0
        end = runner.status() if runner is not None else None
        return {"role": role, "cpu_s": cpu_s, "wall_s": wall_s, "cpu_core": cpu_s / wall_s,
                "holding": bool(end and end.holding), "epoch": end.epoch if end else 0,
                "failures": runner.failures if runner is not None else 0}
    finally:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await kv.close()


def main(argv: list[str]) -> int:
    role, servers, bucket, key, seconds, out = argv
    if role not in ("a", "b", "connection"):
        raise SystemExit(f"role {role!r}: a, b or connection")
    try:
        res = asyncio.run(measure(role, servers.split(","), bucket, key, float(seconds)))
    except RuntimeError as err:
        print(err, file=sys.stderr)
        return 1
    Path(out).write_text(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
