"""Two contenders of the leadership lease core against a compare-and-set store, on one fake
clock: random latencies, lost answers (the write may still land, even seconds later, as seen
on NATS 2.9.10 during an election), process pauses longer than the lease, and outages of the
store's quorum modelled as NATS 2.9.10 behaves (nats-server issue 4320): reads still answered
from the applied state, writes pre-checked against it and queued, then all committed without a
second check when the quorum returns. Never two writers at once; tenures' epochs only grow
(hypothesis draws the schedules)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from rackplane.core.leadership import LeaderLease, LeaseTiming, Op, Step

DT = 0.05
TIMEOUT_S = 1.0


@dataclass
class Store:
    """One key: revision and value; revisions grow over the bucket."""

    revision: int = 0
    value: bytes | None = None
    seq: int = 0
    down_until: float = 0.0     # writes do not commit before then (quorum lost)
    queued: list[Flight] = field(default_factory=list)

    def apply(self, flight: Flight, now: float) -> tuple[str, int | None, bytes | None] | None:
        """The answer, or None for now: a write queued while the quorum is lost (pre-checked
        now, committed later without a check; a client still waiting then gets its answer)."""
        step = flight.step
        if step.op is Op.READ:
            return "read", (self.revision if self.value is not None else None), self.value
        if step.op is Op.PROBE:
            if now < self.down_until:
                return None
            self.seq += 1
            return "done", self.seq, None
        exists = self.value is not None
        if (step.op is Op.CREATE and exists) or (step.op in (Op.UPDATE, Op.DELETE) and (
                not exists or self.revision != step.last_revision)):
            return "refused", None, None
        if now < self.down_until:
            self.queued.append(flight)  # passed the pre-check: it will commit later
            return None
        return self._commit(step)

    def _commit(self, step: Step) -> tuple[str, int | None, bytes | None]:
        assert step.record is not None
        self.seq += 1
        self.revision = self.seq
        self.value = None if step.op is Op.DELETE else step.record.encode()
        return "done", self.revision, None

    def tick(self, now: float) -> None:
        if now >= self.down_until and self.queued:
            for f in self.queued:
                f.result = self._commit(f.step)
                f.answer_s = now if f.answer_s is not None else None
            self.queued.clear()


@dataclass
class Flight:
    step: Step
    sent_s: float
    apply_s: float | None     # None: never reaches the store
    answer_s: float | None    # None: the answer is lost (the client times out)
    result: tuple[str, int | None, bytes | None] | None = None
    applied: bool = False


@dataclass
class Contender:
    lease: LeaderLease
    paused_until: float = 0.0
    flight: Flight | None = None


def simulate(seed: int, lease_cls: type[LeaderLease] = LeaderLease,
             horizon_s: float = 150.0) -> list[int]:
    """Run one schedule; the epochs of the tenures seen writing, in order.

    Raises:
        AssertionError: two writers at once, or an epoch that did not grow.
    """
    rng = random.Random(seed)
    store = Store()
    cs = [Contender(lease_cls("a/1", LeaseTiming())), Contender(lease_cls("b/2", LeaseTiming()))]
    flights: list[Flight] = []  # every write or read not yet applied, answered or not
    epochs: list[int] = []
    now = 0.0
    while now < horizon_s:
        store.tick(now)
        if rng.random() < 0.0006 and now >= store.down_until:
            store.down_until = now + rng.uniform(5, 30)  # quorum lost for a while
        for f in [f for f in flights if f.apply_s is not None and f.apply_s <= now]:
            f.result = store.apply(f, now)
            f.applied = True
            flights.remove(f)
        for c in cs:
            if now < c.paused_until:
                continue
            f = c.flight
            if f is not None and f.answer_s is not None and f.answer_s <= now and f.result:
                # (a write queued by a lost quorum has no result: the client times out)
                kind, rev, value = f.result
                if f.step.op is Op.READ:
                    c.lease.read_done(now, rev, value)
                elif kind == "done":
                    c.lease.write_done(now, rev or 1)
                else:
                    c.lease.write_refused(now)
                c.flight = None
            elif f is not None and now - f.sent_s >= TIMEOUT_S:
                c.lease.failed(now, "timeout")  # it may still land later
                c.flight = None
            if c.flight is None:
                step = c.lease.step(now)
                if step.op is not Op.WAIT:
                    latency = rng.expovariate(1 / 0.03)
                    if rng.random() < 0.15:  # answer lost; the request lands late or never
                        apply_s = now + rng.uniform(0, 8) if rng.random() < 0.6 else None
                        fl = Flight(step, now, apply_s, None)
                    else:
                        fl = Flight(step, now, now + latency / 2, now + latency)
                    c.flight = fl
                    if fl.apply_s is not None:
                        flights.append(fl)
            if rng.random() < 0.003:
                c.paused_until = now + rng.uniform(0, 25)  # SIGSTOP, shorter or longer
        writers = [c for c in cs if c.lease.may_write(now)]
        assert len(writers) <= 1, f"two writers at {now:.2f} s (seed {seed})"
        for c in writers:
            if not epochs or epochs[-1] != c.lease.epoch:
                assert not epochs or c.lease.epoch > epochs[-1], (epochs, c.lease.epoch)
                epochs.append(c.lease.epoch)
        now = round(now + DT, 6)
    return epochs


@settings(max_examples=30, deadline=None)
@given(st.integers(min_value=0, max_value=2**32))
def test_never_two_writers_and_epochs_grow(seed: int) -> None:
    simulate(seed)


def test_the_schedules_do_fail_over() -> None:
    """The simulation exercises takeovers (else the property above proves little)."""
    assert max(len(simulate(seed)) for seed in range(5)) >= 3


class NoFence(LeaderLease):
    """A broken core: writes while it believes it holds, ignoring the renew deadline."""

    def may_write(self, now: float) -> bool:
        return self._holding


def test_the_check_catches_a_core_that_does_not_fence() -> None:
    failures = 0
    for seed in range(40):
        try:
            simulate(seed, NoFence)
        except AssertionError:
            failures += 1
    assert failures > 0
