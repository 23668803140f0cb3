"""Leadership leases and fencing epochs of a redundant controller pair (issue 15).

A pure core: no I/O, no clock (every method takes ``now``, the caller's monotonic seconds), no
asyncio. It decides; an adapter (`rackplane.io.natslease`) carries its `Step`s out on a
replicated key-value store with per-key revisions and compare-and-set (a NATS JetStream KV
bucket) and reports each outcome back. One `LeaderLease` per contender and lease key.

The store's contract (what the adapter must provide):

- ``read`` → (revision, value) of the key, or nothing when it is absent (or deleted);
- ``create`` succeeds only when the key is absent (create-if-absent);
- ``update(last=R)`` succeeds only when the key's revision is still ``R`` (compare-and-set);
- ``delete(last=R)`` the same, for a release;
- ``probe`` a plain write to a key of its own (``<key>.probe``): confirmed only when the store
  commits writes now;
- revisions are 64-bit and increase over the whole bucket (a JetStream stream sequence).

**The store's compare-and-set is not trusted to be serialisable.** On NATS 2.9.10 the
expected-last-sequence check is only a pre-check at the stream leader, outside the Raft
consensus (nats-server issue 4320, fixed upstream in later releases): writes proposed against
the same revision while they cannot commit (quorum lost, a leader alone) were seen to *all*
commit once the quorum returned, and two contenders both acquired. Hence rule 1's probes.

Rules (DESIGN §1, "Redundant pairs" in docs/OPERATIONS.md):

1. **Acquire**: a contender works in cycles of a ``probe`` then a ``read`` (every
   ``renew_every_s``); only a read that follows a confirmed probe in the same cycle may lead to
   an acquisition write, sent right after it (the probe's commit means every write proposed
   before it has been applied, and the store commits writes now; a probe answered later than
   ``renew_every_s`` after it was sent does not count). Absent → ``create``. Written by
   someone else → the contender times the record with its *own* clock from when it
   *received* that revision in a healthy cycle: the lease has expired only when the revision
   has not changed for ``lease_s`` (the larger of its own and the record's) since then,
   through unbroken healthy cycles: any failed request restarts the timing (a quorum lost,
   with a stale leader still answering reads, never lets a standby's takeover queue up).
   Then it takes over with ``update(last=R)``. Timers, not watch events or the server's
   clock, decide expiry.
2. **Epoch**: the revision of the winning acquisition write; it only grows (a regressed one is
   refused: the contender does not hold). Commands and device writes carry it.
3. **Renew** every ``renew_every_s`` with ``update(last=R)``.
4. **Fence by the holder's own monotonic clock**: `may_write` is false once
   ``renew_deadline_s`` has passed since the holder *sent* its last *confirmed* write, whatever
   the network says. Fencing ends the tenure for good: no later confirmation revives it, no
   renewal of that epoch is ever sent again (a new tenure, with a new epoch, needs a new
   acquisition).
5. **Unknown outcome** (a timeout, no responders, a lost connection): resolved by re-reading
   (every ``retry_every_s``) before anything else is sent. A record naming this contender's
   owner id and tenure means the write (or a later one of ours) landed: the confirmed send
   time becomes that write's send time. Anything else: the lease is lost.
6. **Lost compare-and-set**: an acquisition that loses it has lost the race. A holder's
   renewal that loses it is re-read first (on NATS 2.9.10 a write that timed out during an
   election was seen to land later, so the next compare-and-set of the holder itself fails):
   ours → continue; not ours → lost. While that re-read runs, `may_write` is false.
7. **Release** (a planned handover): the holder fences itself first, then deletes the key with
   compare-and-set; it does not contend again for ``lease_s``.

Safety argument (two writers never overlap): a contender takes over only after seeing one
revision unchanged for ``lease_s`` from when it *received* it, which is after the holder *sent*
it; the holder stops writing ``renew_deadline_s`` after *sending* its last confirmed write. So
with ``renew_deadline_s < lease_s`` the holder is fenced ``lease_s - renew_deadline_s`` (5 s
with the defaults) before any takeover, as long as the two monotonic clocks' rates differ by
less than that fraction. Stale reads cannot break it: a takeover is a compare-and-set.

Errors: ``ValueError`` for bad timing, a bad owner id, a revision outside 1..2**64-1, and for a
call out of turn (an outcome with no step in flight, a step while one is in flight):
programming errors of the adapter. A record that does not decode is someone else's.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final, Literal

__all__ = [
    "EPOCH_MAX",
    "OWNER_PATTERN",
    "LeaderLease",
    "LeadershipEvent",
    "LeadershipStatus",
    "LeaseRecord",
    "LeaseTiming",
    "Op",
    "Step",
]

EPOCH_MAX: Final = 2**64 - 1
"""Revisions and epochs are unsigned 64-bit (JetStream stream sequences): they do not wrap in
practice (2**64 writes); one outside 1..EPOCH_MAX is refused as a programming error."""

OWNER_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$"
"""An owner id: the instance name and a per-process nonce, e.g. ``a/3f9c2e``."""
_OWNER_RE = re.compile(OWNER_PATTERN)

JETSTREAM_ELECTION_MAX_S: Final = 9.0
"""The longest JetStream (2.9.10) leader election: its Raft election timeout is 4–9 s, during
which KV writes block (TEST-SERVERS.md)."""


@dataclass(frozen=True, slots=True)
class LeaseTiming:
    """The lease's timing, all in seconds of the contenders' own monotonic clocks.

    Attributes:
        lease_s: a record unchanged this long (since received) has expired (default 15).
        renew_every_s: the holder's renewal period (default 2).
        renew_deadline_s: the holder fences itself this long after sending its last confirmed
            write (default 10).
        retry_every_s: re-read period while an outcome is unknown (default 0.5).
        election_max_s: the store's longest leader election (default 9, JetStream 2.9.10).

    Raises:
        ValueError: a value not finite and > 0, or the relations broken:
            ``renew_every_s < renew_deadline_s < lease_s``, ``renew_deadline_s >
            election_max_s`` (losing one store node must not fence the holder),
            ``retry_every_s <= renew_every_s``.
    """

    lease_s: float = 15.0
    renew_every_s: float = 2.0
    renew_deadline_s: float = 10.0
    retry_every_s: float = 0.5
    election_max_s: float = JETSTREAM_ELECTION_MAX_S

    def __post_init__(self) -> None:
        for name in ("lease_s", "renew_every_s", "renew_deadline_s", "retry_every_s",
                     "election_max_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not (
                    math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a finite number > 0, not {v!r}")
        problems = []
        if not self.renew_deadline_s < self.lease_s:
            problems.append(f"renew_deadline_s ({self.renew_deadline_s}) must be < lease_s "
                            f"({self.lease_s}): the holder must be fenced before anyone may "
                            "take over")
        if not self.renew_every_s < self.renew_deadline_s:
            problems.append(f"renew_every_s ({self.renew_every_s}) must be < renew_deadline_s "
                            f"({self.renew_deadline_s})")
        if not self.renew_deadline_s > self.election_max_s:
            problems.append(f"renew_deadline_s ({self.renew_deadline_s}) must be > "
                            f"election_max_s ({self.election_max_s}): losing one store node "
                            "would fence the holder")
        if not self.retry_every_s <= self.renew_every_s:
            problems.append(f"retry_every_s ({self.retry_every_s}) must be <= renew_every_s "
                            f"({self.renew_every_s})")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The value stored under the lease key (JSON).

    Attributes:
        owner: the writer's owner id (`OWNER_PATTERN`).
        seq: the writer's write counter (distinguishes its writes; not an epoch).
        epoch: the tenure's epoch; 0 in the acquisition write (its revision becomes the epoch).
        lease_s: the writer's ``lease_s`` (contenders wait the larger of theirs and this).
    """

    owner: str
    seq: int
    epoch: int
    lease_s: float

    def encode(self) -> bytes:
        return json.dumps({"owner": self.owner, "seq": self.seq, "epoch": self.epoch,
                           "lease_s": self.lease_s}, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> LeaseRecord:
        """The record in ``raw``.

        Raises:
            ValueError: not a JSON object of that shape (owner a valid id, seq and epoch ints
                in 0..EPOCH_MAX, lease_s finite > 0).
        """
        try:
            d = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"lease record is not JSON: {err}") from None
        if not isinstance(d, dict):
            raise ValueError("lease record is not a JSON object")
        owner, seq, epoch, lease_s = (d.get(k) for k in ("owner", "seq", "epoch", "lease_s"))
        if not isinstance(owner, str) or not _OWNER_RE.fullmatch(owner):
            raise ValueError(f"lease record owner {owner!r} is not an owner id")
        for name, v in (("seq", seq), ("epoch", epoch)):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= EPOCH_MAX:
                raise ValueError(f"lease record {name} {v!r} is not an int in 0..2**64-1")
        if isinstance(lease_s, bool) or not isinstance(lease_s, int | float) or not (
                math.isfinite(lease_s) and lease_s > 0):
            raise ValueError(f"lease record lease_s {lease_s!r} is not a number > 0")
        assert isinstance(seq, int) and isinstance(epoch, int)
        return cls(owner=owner, seq=seq, epoch=epoch, lease_s=float(lease_s))


class Op(StrEnum):
    """What the adapter does next."""

    WAIT = "wait"      # nothing until `Step.at_s`
    READ = "read"      # read the key
    CREATE = "create"  # create-if-absent with `Step.record`
    UPDATE = "update"  # compare-and-set on `Step.last_revision` with `Step.record`
    DELETE = "delete"  # compare-and-set delete on `Step.last_revision` (release)
    PROBE = "probe"    # a plain write to the probe key (the store commits writes now?)


@dataclass(frozen=True, slots=True)
class Step:
    """One step for the adapter. ``at_s``: for WAIT, when to ask again (monotonic s)."""

    op: Op
    at_s: float = 0.0
    last_revision: int = 0
    record: LeaseRecord | None = None


EventKind = Literal["acquired", "race_lost", "fenced", "lost", "released", "holder_seen",
                    "bad_record", "epoch_regressed"]


@dataclass(frozen=True, slots=True)
class LeadershipEvent:
    """One change, to be logged once. ``epoch``: the tenure's (or 0); ``detail``: why."""

    kind: EventKind
    now: float
    epoch: int
    detail: str


@dataclass(frozen=True, slots=True)
class LeadershipStatus:
    """What `LeaderLease.status` shows (rackctl, the state topic).

    Attributes:
        holding: this contender holds the lease and may write now.
        epoch: its epoch while holding, else 0.
        fence_in_s: seconds until it fences itself unless a renewal is confirmed (0 when not
            holding).
        holder_seen: the other owner id last read in the key (None: absent or ours).
        takeover_in_s: seconds until the record read is old enough to take over (None when
            holding or nothing to wait for).
        last_change: the last event's kind and detail, or None.
    """

    holding: bool
    epoch: int
    fence_in_s: float
    holder_seen: str | None
    takeover_in_s: float | None
    last_change: str | None


@dataclass(slots=True)
class _Pending:
    op: Op
    sent_s: float
    seq: int = 0
    purpose: Literal["acquire", "renew", "read", "release", "probe"] = "read"


@dataclass(slots=True)
class LeaderLease:
    """The lease state machine of one contender (module docstring for the rules).

    Drive it as: ``step = lease.step(now)``; do ``step.op`` unless WAIT; report the outcome
    with `read_done`, `write_done`, `write_refused` or `failed`; ask `may_write(now)` right
    before every output write.
    """

    owner: str
    timing: LeaseTiming = field(default_factory=LeaseTiming)
    # --- state ---
    _holding: bool = False
    _epoch: int = 0
    _revision: int = 0          # holder: the key's revision as last confirmed
    _confirmed_sent_s: float = -math.inf
    _next_renew_s: float = 0.0
    _tenure_seq: int = 0        # the seq of this tenure's acquisition write
    _suspect: bool = False      # a renewal lost its compare-and-set: re-reading, no writes
    _resolve: bool = False      # an outcome is unknown: re-read before anything else
    _next_read_s: float = -math.inf
    _hurry: bool = False  # read_soon: the next cycle at once, after any step in flight
    _seen_revision: int = 0     # follower: the record's revision and when first received
    _clock_start_s: float | None = None  # when the record was received in a healthy cycle
    _probed_s: float | None = None   # send time of this cycle's confirmed probe (None: none)
    _seen_owner: str | None = None
    _seen_lease_s: float = 0.0
    _take_over: bool = False    # the record read may be taken over now
    _hold_off_until_s: float = -math.inf
    _max_revision: int = 0
    _seq: int = 0
    _sent: dict[int, float] = field(default_factory=dict)  # write seq -> send time
    _pending: _Pending | None = None
    _events: list[LeadershipEvent] = field(default_factory=list)
    _last_change: str | None = None
    _acquire_why: str = ""  # what the acquisition write in flight followed (event detail)

    def __post_init__(self) -> None:
        if not isinstance(self.owner, str) or not _OWNER_RE.fullmatch(self.owner):
            raise ValueError(f"owner {self.owner!r} does not match {OWNER_PATTERN}")

    # --- queries -------------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The current tenure's epoch (0 when not holding)."""
        return self._epoch if self._holding else 0

    @property
    def revision(self) -> int:
        """The key's revision as last confirmed by this holder (0 when not holding)."""
        return self._revision if self._holding else 0

    def may_write(self, now: float) -> bool:
        """True while this contender holds the lease, its renew deadline (from the send time
        of its last confirmed write) has not passed at ``now``, and no renewal conflict is
        being checked. Ask right before each output write."""
        return (self._holding and not self._suspect
                and now < self._confirmed_sent_s + self.timing.renew_deadline_s)

    def status(self, now: float) -> LeadershipStatus:
        self._check_fence(now)
        takeover = None
        if not self._holding and self._seen_owner is not None and (
                self._clock_start_s is not None):
            wait = max(self.timing.lease_s, self._seen_lease_s)
            takeover = max(0.0, self._clock_start_s + wait - now)
        return LeadershipStatus(
            holding=self.may_write(now), epoch=self.epoch,
            fence_in_s=(max(0.0, self._confirmed_sent_s + self.timing.renew_deadline_s - now)
                        if self._holding else 0.0),
            holder_seen=self._seen_owner, takeover_in_s=takeover, last_change=self._last_change)

    def drain_events(self) -> list[LeadershipEvent]:
        """The changes since the last call, oldest first (log each once)."""
        out, self._events = self._events, []
        return out

    # --- the next step -------------------------------------------------------------------------

    def step(self, now: float) -> Step:
        """What to do at ``now``. A non-WAIT step is in flight until its outcome is reported.

        Raises:
            ValueError: a step is already in flight.
        """
        if self._pending is not None:
            raise ValueError(f"a {self._pending.op} is in flight: report its outcome first")
        self._check_fence(now)
        if self._resolve or self._suspect:
            if now < self._next_read_s:
                return Step(Op.WAIT, at_s=self._next_read_s)
            return self._start(Op.READ, now, "read")
        if self._holding:
            if now < self._next_renew_s:
                fence_at = self._confirmed_sent_s + self.timing.renew_deadline_s
                return Step(Op.WAIT, at_s=min(self._next_renew_s, fence_at))
            rec = self._record(self._epoch)
            return self._start(Op.UPDATE, now, "renew", rec, self._revision)
        if now < self._hold_off_until_s:
            return Step(Op.WAIT, at_s=self._hold_off_until_s)
        if self._take_over:
            self._take_over = False
            if self._seen_revision == 0:
                self._acquire_why = "key absent (released, or never held)"
                return self._start(Op.CREATE, now, "acquire", self._record(0))
            self._acquire_why = ("own record of an ended tenure"
                                 if self._seen_owner == self.owner
                                 else f"record of {self._seen_owner} expired")
            return self._start(Op.UPDATE, now, "acquire", self._record(0), self._seen_revision)
        if now < self._next_read_s:
            return Step(Op.WAIT, at_s=self._next_read_s)
        if self._probed_s is None:
            return self._start(Op.PROBE, now, "probe")
        return self._start(Op.READ, now, "read")

    def release(self, now: float) -> Step | None:
        """Give the lease up (planned handover): fenced at once; the returned DELETE step
        (compare-and-set on the last confirmed revision) is then in flight. None when not
        holding. The contender does not try to acquire again for ``lease_s``.

        Raises:
            ValueError: a step is in flight (wait for its outcome first).
        """
        if self._pending is not None:
            raise ValueError(f"a {self._pending.op} is in flight: report its outcome first")
        self._check_fence(now)
        self._hold_off_until_s = now + self.timing.lease_s
        if not self._holding:
            return None
        epoch, revision = self._epoch, self._revision
        self._end_tenure(now, "released", "released for a handover")
        self._pending = _Pending(Op.DELETE, now, purpose="release")
        return Step(Op.DELETE, last_revision=revision, record=self._record(epoch))

    def read_soon(self, now: float) -> None:
        """A hint that the holder released the lease (its last sync record said so, a
        planned handover): a contender that does not hold starts its next probe-and-read cycle
        at ``now`` (or right after the step in flight) instead of up to ``renew_every_s``
        later. Nothing else changes: only a
        key found absent, or a revision unchanged for ``lease_s``, leads to a write, and a
        release's hold-off is kept."""
        if self._holding:
            return
        if self._pending is None:
            self._next_read_s = min(self._next_read_s, now)
        else:
            self._hurry = True  # the read in flight may predate the release: one more

    # --- outcomes ------------------------------------------------------------------------------

    def read_done(self, now: float, revision: int | None, raw: bytes | None) -> None:
        """The read answered at ``now`` (when the answer arrived): the key's ``revision`` and
        value, or None, None when it is absent or deleted."""
        self._finish(now, {Op.READ})
        self._resolve = False
        probed_s, self._probed_s = self._probed_s, None  # a probe serves one read
        healthy = probed_s is not None and not self._holding
        if revision is None:
            self._on_absent(now, healthy)
            return
        self._revision_ok(revision)
        try:
            rec: LeaseRecord | None = LeaseRecord.decode(raw or b"")
        except ValueError as err:
            rec = None
            if revision != self._seen_revision:
                self._event("bad_record", now, f"revision {revision}: {err}")
        if self._holding:
            self._holder_read(now, revision, rec)
        else:
            self._follower_read(now, revision, rec, probed_s if healthy else None)
        self._max_revision = max(self._max_revision, revision)
        if self._hurry and not self._holding:  # `read_soon` during this read: once more now
            self._hurry = False
            self._next_read_s = min(self._next_read_s, now)

    def write_done(self, now: float, revision: int) -> None:
        """The in-flight CREATE/UPDATE/DELETE is confirmed; ``revision`` is the key's new one
        (ignored for a DELETE)."""
        pending = self._finish(now, {Op.CREATE, Op.UPDATE, Op.DELETE, Op.PROBE})
        if pending.purpose == "probe":
            if now - pending.sent_s > self.timing.renew_every_s:
                self._unhealthy(now)  # answered late (a pause?): says nothing about now
            else:
                self._probed_s = pending.sent_s  # the read comes next, at once
            return
        if pending.purpose == "release":
            self._next_read_s = now
            return
        self._revision_ok(revision)
        self._on_ours(now, revision, pending.seq)

    def write_refused(self, now: float) -> None:
        """The in-flight write lost its compare-and-set (the key exists / its revision moved
        on)."""
        pending = self._finish(now, {Op.CREATE, Op.UPDATE, Op.DELETE, Op.PROBE})
        if pending.purpose == "probe":  # a plain write is never refused: as unknown
            self._unhealthy(now)
        elif pending.purpose == "renew" and self._holding:
            self._suspect = True  # ours landed late, or someone else wrote: re-read
            self._next_read_s = now
        elif pending.purpose == "acquire":
            self._sent.pop(pending.seq, None)  # refused: it can never land
            self._event("race_lost", now, "acquisition lost the compare-and-set race")
            self._next_read_s = now
        else:
            self._next_read_s = now

    def failed(self, now: float, reason: str) -> None:
        """The in-flight step's outcome is unknown (timeout, no responders, connection lost):
        re-read after ``retry_every_s`` before anything else."""
        pending = self._finish(now, {Op.READ, Op.CREATE, Op.UPDATE, Op.DELETE, Op.PROBE})
        if pending.op in (Op.CREATE, Op.UPDATE):
            self._resolve = True
        self._unhealthy(now)
        del reason  # the adapter logs and counts failures; state changes come as events

    # --- internals -----------------------------------------------------------------------------

    def _record(self, epoch: int) -> LeaseRecord:
        self._seq += 1
        return LeaseRecord(owner=self.owner, seq=self._seq, epoch=epoch,
                           lease_s=self.timing.lease_s)

    def _unhealthy(self, now: float) -> None:
        """A request failed: the timing of a record restarts with the next healthy cycle."""
        self._probed_s = None
        self._clock_start_s = None
        self._next_read_s = now + self.timing.retry_every_s

    def _start(self, op: Op, now: float,
               purpose: Literal["acquire", "renew", "read", "probe"],
               rec: LeaseRecord | None = None, last: int = 0) -> Step:
        seq = rec.seq if rec is not None else 0
        if rec is not None:
            if purpose == "acquire":
                # an earlier attempt that still lands shows up as our own record of no
                # tenure: taken back by compare-and-set, never trusted as a tenure
                self._sent.clear()
                self._tenure_seq = seq
            self._sent[seq] = now
        self._pending = _Pending(op, now, seq, purpose)
        return Step(op, last_revision=last, record=rec)

    def _finish(self, now: float, ops: set[Op]) -> _Pending:
        pending = self._pending
        if pending is None or pending.op not in ops:
            raise ValueError(f"no {'/'.join(sorted(ops))} in flight")
        self._pending = None
        self._check_fence(now)
        return pending

    @staticmethod
    def _revision_ok(revision: int) -> None:
        if isinstance(revision, bool) or not isinstance(revision, int) or not (
                1 <= revision <= EPOCH_MAX):
            raise ValueError(f"revision {revision!r} is not an int in 1..2**64-1")

    def _event(self, kind: EventKind, now: float, detail: str) -> None:
        if kind == "epoch_regressed" and (self._last_change or "").startswith(kind):
            return  # repeated attempts: logged once
        self._events.append(LeadershipEvent(kind, now, self._epoch, detail))
        self._last_change = f"{kind}: {detail}"

    def _check_fence(self, now: float) -> None:
        if self._holding and now >= self._confirmed_sent_s + self.timing.renew_deadline_s:
            self._end_tenure(now, "fenced",
                             f"no confirmed renewal sent in the last "
                             f"{self.timing.renew_deadline_s} s")

    def _end_tenure(self, now: float, kind: EventKind, detail: str) -> None:
        self._event(kind, now, detail)
        self._holding = False
        self._suspect = False
        self._epoch = 0
        self._tenure_seq = 0
        self._next_read_s = now
        self._probed_s = None
        self._clock_start_s = None
        # writes of the ended tenure can never confirm anything any more
        self._sent.clear()

    def _ours_this_tenure(self, rec: LeaseRecord | None) -> bool:
        return (rec is not None and rec.owner == self.owner and rec.seq in self._sent
                and rec.seq >= self._tenure_seq > 0)

    def _on_ours(self, now: float, revision: int, seq: int) -> None:
        """A write of ours (``seq``) is known to have produced ``revision``."""
        sent_s = self._sent.get(seq)
        if sent_s is None:
            return  # a write of a tenure that has ended (fenced, lost, released): ignored
        if not self._holding:
            if seq != self._tenure_seq:
                return
            if revision <= self._max_revision:
                self._event("epoch_regressed", now,
                            f"acquired revision {revision} is not above {self._max_revision}")
                self._sent.clear()
                self._next_read_s = now + self.timing.renew_every_s
                return
            self._holding = True
            self._epoch = revision
            self._seen_owner = None
            self._seen_revision = 0
            self._event("acquired", now, f"epoch {revision} after {self._acquire_why}")
        self._max_revision = max(self._max_revision, revision)
        self._revision = max(self._revision, revision)
        self._confirmed_sent_s = max(self._confirmed_sent_s, sent_s)
        self._next_renew_s = sent_s + self.timing.renew_every_s
        for old in [s for s in self._sent if s < seq]:
            del self._sent[old]
        self._suspect = False
        self._check_fence(now)

    def _holder_read(self, now: float, revision: int, rec: LeaseRecord | None) -> None:
        if revision < self._revision:
            # an answer older than what we know (a lagging replica): ask again
            self._resolve = True
            self._next_read_s = now + self.timing.retry_every_s
            return
        if self._ours_this_tenure(rec):
            assert rec is not None
            self._on_ours(now, revision, rec.seq)
            self._next_renew_s = now  # resolved: renew at once to push the deadline out
            return
        who = rec.owner if rec is not None else "an unreadable record"
        self._end_tenure(now, "lost", f"the key holds {who} at revision {revision}")
        self._follower_read(now, revision, rec, None)

    def _follower_read(self, now: float, revision: int, rec: LeaseRecord | None,
                       probed_s: float | None) -> None:
        """``probed_s``: the send time of the confirmed probe this read follows (None: a read
        without one, e.g. resolving an unknown outcome: it may not lead to a write)."""
        if self._ours_this_tenure(rec) and rec is not None and rec.seq == self._tenure_seq:
            self._on_ours(now, revision, rec.seq)  # our acquisition landed after all
            return
        owner = rec.owner if rec is not None else "?"
        healthy_now = None if probed_s is None else now  # received now, in a healthy cycle
        if revision != self._seen_revision:
            if owner not in (self._seen_owner, self.owner):
                self._event("holder_seen", now, f"{owner} at revision {revision}")
            self._seen_revision = revision
            self._seen_owner = owner
            self._seen_lease_s = rec.lease_s if rec is not None else 0.0
            self._clock_start_s = healthy_now
        elif self._clock_start_s is None:
            self._clock_start_s = healthy_now
        if probed_s is None:
            self._next_read_s = now  # a healthy cycle (probe, read) next
            return
        if rec is not None and rec.owner == self.owner:
            # our own record of an ended tenure: nobody wrote since, take it back by
            # compare-and-set (a new tenure, a new epoch)
            self._take_over = True
            return
        assert self._clock_start_s is not None
        expires_s = self._clock_start_s + max(self.timing.lease_s, self._seen_lease_s)
        if now >= expires_s:
            self._take_over = True
        else:
            self._next_read_s = min(now + self.timing.renew_every_s, expires_s)

    def _on_absent(self, now: float, healthy: bool) -> None:
        if self._holding:
            self._end_tenure(now, "lost", "the key is gone (deleted or expired)")
        self._seen_revision, self._seen_owner, self._seen_lease_s = 0, None, 0.0
        self._clock_start_s = None
        if healthy:
            self._take_over = True
        else:
            self._next_read_s = now
