"""The leadership lease core (rackplane/core/leadership.py) on a fake clock: acquire, renew,
fence by the holder's own clock from the send time of its last confirmed write, unknown
outcomes resolved by re-reading, lost compare-and-set, release, bad records and revisions."""

from __future__ import annotations

import math

import pytest

from rackplane.core.leadership import (
    EPOCH_MAX,
    LeaderLease,
    LeaseRecord,
    LeaseTiming,
    Op,
    Step,
)

T = LeaseTiming()  # 15 s lease, renew every 2 s, deadline 10 s, retry 0.5 s


def other(seq: int = 1, epoch: int = 0, lease_s: float = 15.0, owner: str = "x/9") -> bytes:
    return LeaseRecord(owner=owner, seq=seq, epoch=epoch, lease_s=lease_s).encode()


PROBE_REV = 1_000_000  # probes write a key of their own: their revisions are not the lease's


def cycle(lease: LeaderLease, now: float, revision: int | None, raw: bytes | None) -> None:
    """One healthy follower cycle at ``now``: a confirmed probe, then a read answering
    ``revision``/``raw``."""
    assert lease.step(now).op is Op.PROBE
    lease.write_done(now, PROBE_REV)
    assert lease.step(now).op is Op.READ
    lease.read_done(now, revision, raw)


def acquire(lease: LeaderLease, now: float = 0.0, revision: int = 7) -> Step:
    """Absent key → CREATE → confirmed at ``now``: holding with epoch ``revision``."""
    cycle(lease, now, None, None)
    step = lease.step(now)
    assert step.op is Op.CREATE and step.record is not None and step.record.epoch == 0
    lease.write_done(now, revision)
    assert lease.may_write(now) and lease.epoch == revision
    return step


def kinds(lease: LeaderLease) -> list[str]:
    return [e.kind for e in lease.drain_events()]


# --- timing and records --------------------------------------------------------------------------

def test_default_timing_is_the_kubernetes_figures() -> None:
    assert (T.lease_s, T.renew_every_s, T.renew_deadline_s) == (15.0, 2.0, 10.0)


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"renew_deadline_s": 15.0}, "renew_deadline_s (15.0) must be < lease_s"),
    ({"renew_every_s": 10.0}, "renew_every_s (10.0) must be < renew_deadline_s"),
    ({"renew_deadline_s": 9.0}, "must be > election_max_s"),
    ({"retry_every_s": 3.0}, "retry_every_s (3.0) must be <= renew_every_s"),
    ({"lease_s": math.nan}, "lease_s must be a finite number > 0"),
    ({"renew_every_s": -1.0}, "renew_every_s must be a finite number > 0"),
    ({"lease_s": True}, "lease_s must be a finite number > 0"),
    ({"election_max_s": math.inf}, "election_max_s must be a finite number > 0"),
])
def test_timing_relations_are_validated(kwargs: dict[str, float], named: str) -> None:
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(")", r"\)")):
        LeaseTiming(**kwargs)


def test_record_round_trips_and_every_bad_shape_is_refused() -> None:
    rec = LeaseRecord(owner="a/1f", seq=3, epoch=EPOCH_MAX, lease_s=15.0)
    assert LeaseRecord.decode(rec.encode()) == rec
    good = {"owner": "a/1", "seq": 1, "epoch": 0, "lease_s": 15}
    bad: list[bytes] = [b"\xff", b"not json", b"[1]", b"null"]
    for key, value in [("owner", ""), ("owner", 5), ("owner", "a b"), ("seq", -1),
                       ("seq", True), ("seq", 1.5), ("epoch", EPOCH_MAX + 1), ("epoch", "1"),
                       ("lease_s", 0), ("lease_s", "15"), ("lease_s", False)]:
        import json
        bad.append(json.dumps({**good, key: value}).encode())
    bad.append(b'{"owner":"a/1","seq":1,"epoch":0,"lease_s":NaN}')
    for raw in bad:
        with pytest.raises(ValueError):
            LeaseRecord.decode(raw)


def test_bad_owner_and_calls_out_of_turn_are_programming_errors() -> None:
    with pytest.raises(ValueError, match="owner"):
        LeaderLease("has space")
    lease = LeaderLease("a/1")
    with pytest.raises(ValueError, match=r"no .* in flight"):
        lease.write_done(0.0, 1)
    assert lease.step(0.0).op is Op.PROBE
    with pytest.raises(ValueError, match="in flight"):
        lease.step(0.0)
    with pytest.raises(ValueError, match="no read in flight"):
        lease.read_done(0.0, 1, other())
    lease.write_done(0.0, PROBE_REV)
    lease.step(0.0)
    with pytest.raises(ValueError, match="revision"):
        lease.read_done(0.0, 0, other())
    cycle_probe = lease.step(0.0)  # the refused answer still ended that read: a new cycle
    assert cycle_probe.op is Op.PROBE


# --- acquire and renew ---------------------------------------------------------------------------

def test_absent_key_is_created_and_the_revision_is_the_epoch_renewed_by_cas() -> None:
    lease = LeaderLease("a/1", T)
    acquire(lease, 0.0, revision=7)
    assert kinds(lease) == ["acquired"]
    wait = lease.step(0.5)
    assert wait.op is Op.WAIT and wait.at_s == 2.0
    renew = lease.step(2.0)
    assert renew.op is Op.UPDATE and renew.last_revision == 7
    assert renew.record is not None and renew.record.epoch == 7 and renew.record.owner == "a/1"
    lease.write_done(2.1, 8)
    assert lease.epoch == 7  # renewals keep the epoch
    assert lease.step(2.2) == Step(Op.WAIT, at_s=4.0)
    assert lease.step(4.0).last_revision == 8


def test_two_contenders_race_for_an_absent_key_the_loser_follows() -> None:
    lease = LeaderLease("b/2", T)
    cycle(lease, 0.0, None, None)
    assert lease.step(0.0).op is Op.CREATE
    lease.write_refused(0.1)
    assert not lease.may_write(0.1) and lease.epoch == 0
    assert kinds(lease) == ["race_lost"]
    assert lease.step(0.1).op is Op.PROBE


def test_takeover_only_after_the_revision_stood_still_for_the_lease_since_received() -> None:
    lease = LeaderLease("b/2", T)
    assert lease.step(0.5).op is Op.PROBE
    lease.write_done(0.9, PROBE_REV)
    lease.step(0.9)
    lease.read_done(1.0, 5, other(seq=1))  # received at 1.0: the timing starts there
    assert kinds(lease) == ["holder_seen"]
    seen = 1.0
    now = 1.0
    while True:
        step = lease.step(now)
        if step.op is Op.WAIT:
            assert step.at_s <= seen + 15.0
            now = step.at_s
            continue
        if step.op is Op.PROBE:
            lease.write_done(now, PROBE_REV)
            continue
        if step.op is Op.READ:
            lease.read_done(now, 5, other(seq=1))
            continue
        break
    assert now == pytest.approx(seen + 15.0)
    assert step.op is Op.UPDATE and step.last_revision == 5
    assert step.record is not None and step.record.epoch == 0
    lease.write_done(now + 0.1, 6)
    assert lease.epoch == 6 and lease.may_write(now + 0.1)


def test_a_renewal_seen_restarts_the_contenders_timer() -> None:
    lease = LeaderLease("b/2", T)
    cycle(lease, 0.0, 5, other(seq=1))
    cycle(lease, 14.0, 6, other(seq=2))  # the holder renewed
    cycle(lease, 16.0, 6, other(seq=2))
    step = lease.step(16.0)
    assert step.op is Op.WAIT and step.at_s <= 29.0
    cycle(lease, 29.0, 6, other(seq=2))
    assert lease.step(29.0).op is Op.UPDATE


def test_the_records_longer_lease_is_respected() -> None:
    lease = LeaderLease("b/2", T)
    cycle(lease, 0.0, 5, other(lease_s=30.0))
    for t in (15.0, 29.0):
        cycle(lease, t, 5, other(lease_s=30.0))
    assert lease.status(29.0).takeover_in_s == pytest.approx(1.0)
    cycle(lease, 30.0, 5, other(lease_s=30.0))
    assert lease.step(30.0).op is Op.UPDATE


def test_an_unreadable_record_is_someone_elses_taken_over_after_the_lease() -> None:
    lease = LeaderLease("b/2", T)
    cycle(lease, 0.0, 5, b"garbage")
    assert kinds(lease) == ["bad_record", "holder_seen"]
    cycle(lease, 15.0, 5, b"garbage")
    assert kinds(lease) == []  # logged once
    assert lease.step(15.0).op is Op.UPDATE


# --- fencing -------------------------------------------------------------------------------------

def test_fenced_at_the_deadline_from_the_send_time_of_the_last_confirmed_renewal() -> None:
    lease = LeaderLease("a/1", T)
    acquire(lease, 0.0)
    renew = lease.step(2.0)  # sent at 2.0 ...
    assert renew.op is Op.UPDATE
    lease.write_done(5.0, 8)  # ... confirmed at 5.0: the deadline counts from 2.0
    assert lease.may_write(11.999)
    assert not lease.may_write(12.0)
    assert lease.status(12.0).holding is False
    assert kinds(lease) == ["acquired", "fenced"]


def test_renewal_timeouts_fence_at_the_deadline_and_that_epoch_is_never_renewed_again() -> None:
    lease = LeaderLease("a/1", T)
    acquire(lease, 0.0, revision=7)
    writes: list[tuple[float, Step]] = []

    def run(now: float, until: float) -> float:
        while now < until:
            step = lease.step(now)
            if step.op is Op.WAIT:
                now = min(step.at_s, until)
                continue
            if step.op is not Op.READ:
                writes.append((now, step))
            now += 1.0  # every request times out after 1 s
            lease.failed(now, "timeout")
        return now

    now = run(0.0, 9.5)
    assert lease.may_write(9.999)
    run(now, 40.0)
    assert not any(lease.may_write(t) for t in (10.0, 20.0, 39.0))
    assert [t for t, _ in writes] == [2.0]  # one renewal, then only re-reads
    assert "fenced" in kinds(lease)


def test_a_late_confirmation_never_revives_a_fenced_tenure() -> None:
    lease = LeaderLease("a/1", T)
    acquire(lease, 0.0)
    lease.step(2.0)
    lease.write_done(12.5, 8)  # sent at 2.0, confirmed after the deadline of the first one
    assert not lease.may_write(12.5)
    assert lease.epoch == 0
    assert "fenced" in kinds(lease)
    # the key still holds our record of the ended tenure: taken back with a NEW epoch
    cycle(lease, 12.6, 8, LeaseRecord("a/1", 2, 7, 15.0).encode())
    step = lease.step(12.6)
    assert step.op is Op.UPDATE and step.last_revision == 8
    assert step.record is not None and step.record.epoch == 0
    lease.write_done(12.7, 9)
    assert lease.epoch == 9 and lease.may_write(12.7)


# --- unknown outcomes ----------------------------------------------------------------------------

def test_renewal_timeout_then_reread_says_ours_the_write_landed() -> None:
    lease = LeaderLease("a/1", T)
    acquire(lease, 0.0)
    renew = lease.step(2.0)
    lease.failed(3.0, "timeout")
    assert lease.may_write(3.0)  # an unknown outcome alone does not fence
    assert lease.step(3.0).op is Op.WAIT
    assert lease.step(3.5).op is Op.READ  # re-read before anything else
    assert renew.record is not None
    lease.read_done(3.6, 8, renew.record.encode())
    assert lease.may_write(11.9)  # confirmed: the deadline counts from its send time, 2.0
    assert lease.status(3.6).fence_in_s == pytest.approx(8.4)
    step = lease.step(3.6)  # renew at once
    assert step.op is Op.UPDATE and step.last_revision == 8


def test_renewal_timeout_then_reread_says_ours_but_the_write_did_not_land() -> None:
    lease = LeaderLease("a/1", T)
    first = acquire(lease, 0.0)
    lease.step(2.0)
    lease.failed(3.0, "timeout")
    lease.step(3.5)
    assert first.record is not None
    lease.read_done(3.6, 7, first.record.encode())
    assert lease.status(3.6).fence_in_s == pytest.approx(6.4)  # still from 0.0
    assert lease.step(3.6).last_revision == 7


def test_renewal_timeout_then_reread_says_not_ours_the_lease_is_lost() -> None:
    lease = LeaderLease("a/1", T)
    acquire(lease, 0.0)
    lease.step(2.0)
    lease.failed(3.0, "timeout")
    lease.step(3.5)
    lease.read_done(3.6, 9, other(seq=1))
    assert not lease.may_write(3.6) and lease.epoch == 0
    assert kinds(lease) == ["acquired", "lost", "holder_seen"]
    assert lease.step(3.6).op is Op.PROBE  # follows the new holder: cycles, no lease write


def test_a_read_older_than_what_the_holder_knows_is_asked_again() -> None:
    lease = LeaderLease("a/1", T)
    acquire(lease, 0.0, revision=7)
    lease.step(2.0)
    lease.write_done(2.1, 8)
    lease.step(4.0)
    lease.failed(5.0, "timeout")
    lease.step(5.5)
    lease.read_done(5.6, 6, other())  # a lagging replica's answer from before our tenure
    assert lease.may_write(5.6)
    assert lease.step(6.1).op is Op.READ


def test_unknown_acquisition_resolved_by_rereading() -> None:
    landed = LeaderLease("a/1", T)
    cycle(landed, 0.0, None, None)
    create = landed.step(0.0)
    landed.failed(1.0, "no responders")
    assert not landed.may_write(1.0)
    landed.step(1.5)
    assert create.record is not None
    landed.read_done(1.6, 3, create.record.encode())
    assert landed.epoch == 3 and landed.may_write(9.9) and not landed.may_write(10.0)

    lost = LeaderLease("a/1", T)
    cycle(lost, 0.0, None, None)
    lost.step(0.0)
    lost.failed(1.0, "timeout")
    lost.step(1.5)
    lost.read_done(1.6, 3, other())
    assert lost.epoch == 0 and not lost.may_write(1.6)


# --- lost compare-and-set ------------------------------------------------------------------------

def test_renewal_losing_its_cas_stops_writes_until_a_reread_says_ours() -> None:
    lease = LeaderLease("a/1", T)
    acquire(lease, 0.0, revision=7)
    doubtful = lease.step(2.0)
    lease.failed(3.0, "timeout")
    lease.step(3.5)
    first = LeaseRecord("a/1", 1, 0, 15.0)
    lease.read_done(3.6, 7, first.encode())  # not landed yet ...
    lease.step(3.6)
    lease.write_refused(3.7)  # ... then it landed and our next CAS lost to it
    assert not lease.may_write(3.7)
    assert lease.step(3.7).op is Op.READ
    assert doubtful.record is not None
    lease.read_done(3.8, 8, doubtful.record.encode())
    assert lease.may_write(3.8) and lease.epoch == 7
    assert lease.step(3.8).last_revision == 8


def test_renewal_losing_its_cas_to_another_owner_is_the_race_lost() -> None:
    lease = LeaderLease("a/1", T)
    acquire(lease, 0.0, revision=7)
    lease.step(2.0)
    lease.write_refused(2.1)
    lease.step(2.1)
    lease.read_done(2.2, 8, other())
    assert not lease.may_write(2.2) and lease.epoch == 0
    assert "lost" in kinds(lease)


# --- epochs and release --------------------------------------------------------------------------

def test_an_epoch_not_above_every_revision_seen_is_refused_once() -> None:
    lease = LeaderLease("a/1", T)
    cycle(lease, 0.0, 500, other())
    cycle(lease, 15.0, 500, other())
    assert lease.step(15.0).op is Op.UPDATE
    lease.write_done(15.1, 3)  # a recreated bucket counting from 1 again
    assert not lease.may_write(15.1) and lease.epoch == 0
    assert kinds(lease) == ["holder_seen", "epoch_regressed"]


def test_release_fences_at_once_deletes_by_cas_and_holds_off() -> None:
    lease = LeaderLease("a/1", T)
    acquire(lease, 0.0, revision=7)
    step = lease.release(1.0)
    assert step is not None and step.op is Op.DELETE and step.last_revision == 7
    assert not lease.may_write(1.0)
    lease.write_done(1.1, 8)
    assert lease.epoch == 0
    assert lease.step(1.1) == Step(Op.WAIT, at_s=16.0)
    assert lease.release(2.0) is None


# --- probes: acquisition writes only right after a confirmed probe --------------------------------

def test_a_failed_probe_restarts_the_timing_of_the_record() -> None:
    lease = LeaderLease("b/2", T)
    cycle(lease, 0.0, 5, other())
    assert lease.step(10.0).op is Op.PROBE
    lease.failed(11.0, "timeout")  # writes do not commit now (quorum lost?)
    assert lease.status(11.0).takeover_in_s is None
    cycle(lease, 11.5, 5, other())  # healthy again: the timing starts at 11.5
    for t in (15.0, 26.0):
        step = lease.step(t)
        if step.op is Op.WAIT:
            continue
        assert step.op is Op.PROBE
        lease.write_done(t, PROBE_REV)
        lease.step(t)
        lease.read_done(t, 5, other())
        assert lease.step(t).op is not Op.UPDATE
    cycle(lease, 26.5, 5, other())
    assert lease.step(26.5).op is Op.UPDATE


def test_while_writes_do_not_commit_stale_reads_never_lead_to_an_acquisition_write() -> None:
    """Quorum lost with a stale leader still answering reads: the standby must not queue a
    takeover that would commit later beside someone else's (nats-server issue 4320)."""
    lease = LeaderLease("b/2", T)
    cycle(lease, 0.0, 5, other())
    now = 0.0
    ops = []
    while now < 60.0:
        step = lease.step(now)
        if step.op is Op.WAIT:
            now = step.at_s
            continue
        ops.append(step.op)
        now += 1.0
        if step.op is Op.READ:
            lease.read_done(now, 5, other())
        else:
            lease.failed(now, "timeout")  # probes time out
    assert set(ops) == {Op.PROBE}
    assert not lease.may_write(now)


def test_a_probe_answered_late_does_not_count() -> None:
    lease = LeaderLease("b/2", T)
    assert lease.step(0.0).op is Op.PROBE
    lease.write_done(20.0, PROBE_REV)  # the process was paused: says nothing about now
    assert lease.step(20.0).op is Op.WAIT
    assert lease.step(20.5).op is Op.PROBE


def test_a_read_without_a_probe_neither_creates_nor_takes_over() -> None:
    lease = LeaderLease("a/1", T)
    cycle(lease, 0.0, None, None)
    lease.step(0.0)  # CREATE ...
    lease.failed(1.0, "timeout")  # ... unknown: resolved by a read, without a probe
    assert lease.step(1.5).op is Op.READ
    lease.read_done(1.6, None, None)  # absent: ours did not land
    assert lease.step(1.6).op is Op.PROBE  # a healthy cycle first, then the create
    lease.write_done(1.7, PROBE_REV)
    lease.step(1.7)
    lease.read_done(1.8, None, None)
    assert lease.step(1.8).op is Op.CREATE



def test_acquired_event_says_what_it_followed() -> None:
    """The ``acquired`` detail names the key's state before (rackctl pair shows it as the
    last failover's cause): absent (a release) vs another owner's expired record."""
    fresh = LeaderLease("a/1", T)
    acquire(fresh, 0.0, revision=7)
    assert fresh.drain_events()[0].detail == "epoch 7 after key absent (released, or never held)"
    lease = LeaderLease("b/2", T)
    now = 0.0
    while True:
        step = lease.step(now)
        if step.op is Op.WAIT:
            now = step.at_s
        elif step.op is Op.PROBE:
            lease.write_done(now, PROBE_REV)
        elif step.op is Op.READ:
            lease.read_done(now, 5, other(seq=1, owner="a/1"))
        else:
            break
    lease.write_done(now, 6)
    assert [e.detail for e in lease.drain_events() if e.kind == "acquired"] == [
        "epoch 6 after record of a/1 expired"]
