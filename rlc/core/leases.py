"""Budget leases: a rack's grant as a lease, and when released headroom may be granted again
(issue 16 item 2; DESIGN §6 "Budgets as leases"). Pure: no I/O, no clock.

A **lease** (`BudgetLease`, from `rackplane.core.budget_leases`: the contract racky shares) is
(rack, value_w, issued_at_s, expires_at_s, epoch, seq): rlc
writes it to the rack's key in the KV bucket; racky reads it there (also on every reconnect),
applies a decrease at once, applies an increase only after reading it, acknowledges a lease
(``epoch``, ``seq``) once its trays' *enforced* caps (read back from the agents) are within its
value, and falls to its safe floor by itself when its lease expires unrenewed. Leases are
ordered by ``(epoch, seq)``: ``epoch`` is the issuing rlc leader's (rackplane.core.leadership),
``seq`` grows by one per lease of a rack across epochs; racky never goes back to an older one.

**Clocks.** The lease is written on one host and read on another, so its times are **wall
clock**, Unix seconds (UTC) of rlc's host: monotonic clocks of two hosts are not comparable.
Both hosts keep NTP/PTP time; ``clock_margin_s`` (`LeaseTiming`) must be at least the largest
offset between rlc's wall clock and any racky's, i.e. twice the offset each host is alarmed
on (a rack whose clock lags by δ_r falls back at true time expires_at + δ_r; rlc, ahead by
δ_l, would act at expires_at + margin − δ_l: safe while margin ≥ δ_r + δ_l). Each side also
guards against a wall-clock *step* with its own monotonic clock:

- racky (`rack_lease_valid`): a lease is in force only while its wall clock is before
  ``expires_at_s`` **and** its monotonic clock has run less than the lease's life
  (``expires_at_s − issued_at_s``) since it received it; a lease issued more than the margin
  in its future is refused (one of the two clocks is off by more than the margin);
- rlc (`RackLedger`): a superseded grant counts as released by expiry only when its wall clock
  is past ``expires_at_s + clock_margin_s + agent_cap_ttl_s`` **and** its monotonic clock has
  run the lease's life + margin + cap TTL since it wrote the lease, or first read it (a new
  leader times leases from when it read them: later than written, so never early).

**The re-grant rule** (issue 16 item 2). When rlc lowers a rack's grant, the older, higher
value stays *committed* (`RackLedger.committed_w`: the most the rack may still draw) until
either racky acknowledges the lower lease or a newer one (its enforced caps are within it, and
it never returns to an older lease), or that older lease's expiry + clock margin + the agents'
cap TTL has passed (by then racky has fallen back to its floor, or — racky dead — its agents
have dropped its last caps, which they hold at most ``agent_cap_ttl_s`` after racky last sent
them, to their safe caps, Σ ≤ the floor). The allocator pays raises only from limit − Σ
committed, so Σ of what racks may draw stays ≤ every limit at every instant.

Errors: ``ValueError`` for a lease out of order (value not finite or < 0, expiry before issue,
a key not newer than the current one) and for records that do not decode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from rackplane.config import StrictModel
from rackplane.core.budget_leases import BudgetLease, budget_lease_valid
from rackplane.core.budget_leases import as_int as _int

__all__ = ["BudgetLease", "LeaseTiming", "RackLedger", "Unreleased", "is_released",
           "rack_lease_valid"]

Key = tuple[int, int]
"""A lease's order: (epoch, seq)."""


class LeaseTiming(StrictModel):
    """Lease life and the margins of the re-grant rule (module docstring)."""

    ttl_s: float = Field(30.0, gt=0, le=600, description="a lease's life from its issue, s "
                         "(rlc's wall clock); rlc renews well before it")
    clock_margin_s: float = Field(
        2.0, ge=0, le=120, description="the largest wall-clock offset between rlc's host and "
        "any racky host, s (both NTP/PTP-disciplined; alarm each host above half of it)")
    agent_cap_ttl_s: float = Field(
        60.0, ge=0, le=3600, description="the longest a tray agent keeps a cap racky stopped "
        "refreshing, s (racky's CAP_TTL_S, racky/core/agent_settings.py: 60 s)")

    @property
    def hold_after_expiry_s(self) -> float:
        """How long after a lease's expiry its value stays committed, s."""
        return self.clock_margin_s + self.agent_cap_ttl_s


def rack_lease_valid(lease: BudgetLease, now_wall_s: float, received_mono_s: float,
                     now_mono_s: float, timing: LeaseTiming) -> bool:
    """racky's side: whether ``lease`` is in force now (else the rack falls to its floor).

    `rackplane.core.budget_leases.budget_lease_valid` with ``timing.clock_margin_s`` (racky
    calls that one: daemons never import each other)."""
    return budget_lease_valid(lease, now_wall_s, received_mono_s, now_mono_s,
                              timing.clock_margin_s)


@dataclass(frozen=True, slots=True)
class Unreleased:
    """A superseded, higher grant that may still be in use.

    ``value_w`` W; ``expires_at_s`` rlc's wall clock; ``life_s`` its lease's life;
    ``seen_mono_s`` rlc's monotonic clock when this process wrote (or first read) that lease;
    ``released_by``: an acknowledgement of this key or a newer one releases it.
    """

    value_w: float
    expires_at_s: float
    life_s: float
    seen_mono_s: float
    released_by: Key

    def as_record(self) -> dict[str, Any]:
        """JSON-able, without ``seen_mono_s`` (a monotonic time means nothing to another
        process: a reader times it from when it read it)."""
        return {"value_w": self.value_w, "expires_at_s": self.expires_at_s,
                "life_s": self.life_s, "released_by": list(self.released_by)}


def is_released(u: Unreleased, acked: Key | None, now_wall_s: float, now_mono_s: float,
                timing: LeaseTiming) -> bool:
    """Whether ``u`` no longer counts: acknowledged (``acked`` ≥ ``u.released_by``), or past
    expiry + margin + cap TTL by rlc's wall clock **and** its monotonic clock (module
    docstring). Times in s: ``now_wall_s`` Unix, ``now_mono_s`` rlc's monotonic."""
    if acked is not None and acked >= u.released_by:
        return True
    hold = timing.hold_after_expiry_s
    return (now_wall_s >= u.expires_at_s + hold
            and now_mono_s - u.seen_mono_s >= u.life_s + hold)


@dataclass
class RackLedger:
    """One rack's current lease, the older grants not yet released, and its newest ack.

    ``floor_w`` is the rack's safe floor (W); ``committed_w`` never falls below it (a rack
    without a lease draws up to it).
    """

    rack: str
    floor_w: float
    current: BudgetLease | None = None
    current_seen_mono_s: float = 0.0
    unreleased: list[Unreleased] = field(default_factory=list)
    acked: Key | None = None
    last_seq: int = 0

    def committed_w(self) -> float:
        """The most the rack may be drawing, W: max(floor, current value, unreleased values)."""
        c = self.floor_w
        if self.current is not None and self.current.value_w > c:
            c = self.current.value_w
        for u in self.unreleased:
            if u.value_w > c:
                c = u.value_w
        return c

    @property
    def grant_w(self) -> float:
        """The current lease's value (W), NaN without one."""
        return math.nan if self.current is None else self.current.value_w

    def on_ack(self, epoch: int, seq: int) -> bool:
        """racky acknowledged lease (epoch, seq): its enforced caps are within that value.

        Returns False (ignored) for a key newer than the current lease (never issued) or not
        newer than the last ack; True when taken. Release with `release`.
        """
        key = (epoch, seq)
        if self.current is None or key > self.current.key:
            return False
        if self.acked is not None and key <= self.acked:
            return False
        self.acked = key
        return True

    def release(self, now_wall_s: float, now_mono_s: float, timing: LeaseTiming) -> int:
        """Drop what is released (`is_released`); returns how many were dropped."""
        keep = [u for u in self.unreleased
                if not is_released(u, self.acked, now_wall_s, now_mono_s, timing)]
        dropped = len(self.unreleased) - len(keep)
        self.unreleased = keep
        return dropped

    def issue(self, value_w: float, epoch: int, now_wall_s: float, now_mono_s: float,
              timing: LeaseTiming) -> BudgetLease:
        """The next lease (a renewal when the value is unchanged): ``value_w`` W from now (rlc's
        wall clock) for ``timing.ttl_s``, key (``epoch``, last seq + 1). The lease it replaces
        stays committed (`Unreleased`) unless the new one covers it (value and expiry at least
        as high). Raises ValueError for an epoch older than the current lease's."""
        if self.current is not None and epoch < self.current.epoch:
            raise ValueError(f"lease {self.rack}: epoch {epoch} older than "
                             f"{self.current.epoch}")
        lease = BudgetLease(self.rack, float(value_w), now_wall_s, now_wall_s + timing.ttl_s,
                            epoch, self.last_seq + 1)
        old = self.current
        if old is not None and not (lease.value_w >= old.value_w
                                    and lease.expires_at_s >= old.expires_at_s):
            self.unreleased.append(Unreleased(old.value_w, old.expires_at_s, old.life_s,
                                              self.current_seen_mono_s, lease.key))
        end_mono = now_mono_s + lease.life_s
        self.unreleased = [
            u for u in self.unreleased
            if u.value_w > self.floor_w and not (
                u.value_w <= lease.value_w and u.expires_at_s <= lease.expires_at_s
                and u.seen_mono_s + u.life_s <= end_mono)]
        self.current = lease
        self.current_seen_mono_s = now_mono_s
        self.last_seq = lease.seq
        return lease

    def as_record(self) -> dict[str, Any]:
        """What a new leader needs (KV; written with the lease): current, unreleased, ack."""
        return {"rack": self.rack,
                "current": None if self.current is None else self.current.as_record(),
                "unreleased": [u.as_record() for u in self.unreleased],
                "acked": None if self.acked is None else list(self.acked),
                "last_seq": self.last_seq}

    @classmethod
    def restore(cls, d: dict[str, Any], floor_w: float, now_mono_s: float) -> RackLedger:
        """A ledger from `as_record` as a new leader reads it: every lease is timed from now
        (``now_mono_s``, this process's monotonic clock), never earlier than written. Raises
        ValueError for a record that does not decode."""
        try:
            cur = d["current"]
            acked = d["acked"]
            led = cls(rack=str(d["rack"]), floor_w=floor_w,
                      current=None if cur is None else BudgetLease.from_record(cur),
                      current_seen_mono_s=now_mono_s,
                      acked=None if acked is None else (_int(acked[0]), _int(acked[1])),
                      last_seq=_int(d["last_seq"]))
            led.unreleased = [Unreleased(float(u["value_w"]), float(u["expires_at_s"]),
                                         float(u["life_s"]), now_mono_s,
                                         (_int(u["released_by"][0]), _int(u["released_by"][1])))
                              for u in d["unreleased"]]
        except (KeyError, TypeError, IndexError) as err:
            raise ValueError(f"rack ledger record: {err!r}") from None
        return led
