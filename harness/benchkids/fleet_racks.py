"""Simulated racks for rlc's fleet-scale benchmark (issue 16): ``N`` racks' racky fleet sides
on the fleet KV bucket, through `rackplane.io.nats.kv.NatsKv` (the load generator is not the
code under test: rlc is).

Usage::

    python -m harness.benchkids.fleet_racks SERVERS BUCKET SITE RACKS_JSON DURATION_S
        STATUS_JSON

``SERVERS``: comma-separated NATS URLs; ``RACKS_JSON``: a file holding a JSON list of rack
ids. Like racky's `racky.fleet.FleetLink`, each rack is pushed every write to its budget key
(`NatsKv.subscribe_key`: one subscription per rack) and writes its report
(`rackplane.core.budget_leases.RackReport`: demand a seeded random walk around 75 kW, the
newest lease it was pushed as its budget and acknowledgement) by plain put, once per second
per rack, the racks' puts spread evenly over the second on ``CONNECTIONS`` connections.
Every 0.5 s and at the end STATUS_JSON gets: racks with a lease, puts done and failed, the
achieved put rate over the last second and over the run, and the time of the first second
in which every rack had a lease (wall s).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from rackplane.core.budget_leases import BudgetLease, RackReport, budget_key, rack_key
from rackplane.io.nats.kv import KvUnknown, NatsKv

CONNECTIONS = 4
FLOOR_W = 20_000.0


class Racks:
    """The racks' state and counters (module docstring)."""

    def __init__(self, site: str, racks: list[str], seed: int = 7) -> None:
        self.site = site
        self.racks = racks
        self.rng = np.random.default_rng(seed)
        self.demand = self.rng.uniform(40_000.0, 110_000.0, len(racks))
        self.lease: list[BudgetLease | None] = [None] * len(racks)
        self.puts = 0
        self.failed = 0
        self.all_leased_at: float | None = None

    def on_lease(self, i: int) -> Any:
        def deliver(value: bytes, deleted: bool) -> None:
            if deleted:
                return
            try:
                ls = BudgetLease.from_record(json.loads(value)["lease"])
            except (ValueError, KeyError, TypeError):
                return
            cur = self.lease[i]
            if cur is None or ls.key > cur.key:
                self.lease[i] = ls
        return deliver

    def report(self, i: int, now: float) -> bytes:
        ls = self.lease[i]
        budget = FLOOR_W if ls is None else ls.value_w
        rep = RackReport(rack=self.racks[i], demand_w=float(self.demand[i]), budget_w=budget,
                         floor_w=FLOOR_W, drawable_w=min(budget, float(self.demand[i])),
                         acked=None if ls is None else ls.key, lease_valid=ls is not None,
                         at_s=now)
        return json.dumps(rep.as_record()).encode()

    def leased(self) -> int:
        return sum(x is not None for x in self.lease)


async def run(servers: list[str], bucket: str, site: str, racks: list[str],
              duration_s: float, status: Path) -> None:
    rs = Racks(site, racks)
    kvs = [await NatsKv.connect(servers, bucket, request_timeout_s=2.0, name=f"racks{c}")
           for c in range(CONNECTIONS)]
    n = len(racks)
    for i, r in enumerate(racks):
        await kvs[i % CONNECTIONS].subscribe_key(budget_key(site, r), rs.on_lease(i))
    slots = 20                                        # puts go out in 20 slices of a second
    t0 = time.monotonic()
    last_puts, last_t = 0, t0
    rate_1s = 0.0
    next_status = t0

    async def put(i: int) -> None:
        try:
            await kvs[i % CONNECTIONS].put(rack_key(site, racks[i]), rs.report(i, time.time()))
            rs.puts += 1
        except KvUnknown:
            rs.failed += 1

    second = 0
    while time.monotonic() - t0 < duration_s:
        rs.demand = np.clip(rs.demand + rs.rng.normal(0.0, 2_000.0, n), 0.0, 140_000.0)
        for s in range(slots):
            start = t0 + second + s / slots
            await asyncio.sleep(max(0.0, start - time.monotonic()))
            await asyncio.gather(*(put(i) for i in range(s, n, slots)))
        second += 1
        now = time.monotonic()
        rate_1s = (rs.puts - last_puts) / (now - last_t)
        last_puts, last_t = rs.puts, now
        if rs.all_leased_at is None and rs.leased() == n:
            rs.all_leased_at = time.time()
        if now >= next_status:
            next_status = now + 0.5
            _write(status, rs, rate_1s, now - t0, done=False)
    _write(status, rs, rate_1s, time.monotonic() - t0, done=True)
    for kv in kvs:
        await kv.close()


def _write(path: Path, rs: Racks, rate_1s: float, elapsed_s: float, *, done: bool) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({
        "racks": len(rs.racks), "leased": rs.leased(), "puts": rs.puts, "failed": rs.failed,
        "put_rate_last_s": rate_1s, "put_rate_run": rs.puts / max(elapsed_s, 1e-9),
        "elapsed_s": elapsed_s, "all_leased_at": rs.all_leased_at, "done": done}))
    tmp.replace(path)


def main(argv: list[str]) -> int:
    servers, bucket, site, racks_json, duration, status = argv
    racks = json.loads(Path(racks_json).read_text())
    asyncio.run(run(servers.split(","), bucket, site, racks, float(duration), Path(status)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
