"""The fleet's budget-lease contract between rlc and racky (issue 16 item 2; pure, shared).

rlc and racky never import each other (DESIGN §2): what both read and write in the fleet KV
bucket is defined here.

**Keys** (one bucket, ``[fleet] bucket`` on both sides; `rackplane.io.nats.kv.NatsKv`):

- ``<site>.<rack>.budget`` (`budget_key`): written by the rlc leader only, compare-and-set on
  the revision it last read or wrote (one writer per key; a stale leader's write is refused).
  Value: ``{"lease": BudgetLease.as_record(), "ledger": {...}}``: the lease racky enforces and
  rlc's ledger of that rack (``rlc.core.leases.RackLedger.as_record``), saved with the lease so
  a new leader restores both from the store, never from memory.
- ``<site>.<rack>.rack`` (`rack_key`): written by that rack's racky only (plain put).
  Value: `RackReport.as_record`: what the rack wants (``demand_w``), the budget it enforces,
  its floor, the lease (epoch, seq) it acknowledges and its cooling capacity now
  (``cooling_w``). Versioned (``version``, `REPORT_VERSION`): fields are only ever added, each
  new one optional, and a record without it (an older racky) decodes it as None = unknown;
  version 1 records carry no ``version`` key and neither ``agents_safe_w`` nor ``cooling_w``.
  Native NATS subscribers never see MQTT retained messages, so this state goes through the
  KV store, which survives rlc restarts and leader changes.

**Clocks.** A lease's times are rlc's wall clock (Unix s), as are a report's ``at_s`` racky's:
hosts keep NTP/PTP time and ``clock_margin_s`` covers their offset (`budget_lease_valid`).

Errors: ``ValueError`` for a lease out of order (value not finite or < 0, expiry not after
issue) and for records that do not decode (the message names the field).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_RACK_FLOOR_W", "REPORT_VERSION", "BudgetLease", "RackReport", "as_int",
           "budget_key", "budget_lease_valid", "rack_key"]

REPORT_VERSION = 2
"""`RackReport`'s record version: 2 adds ``cooling_w``, ``power_w`` (and the ``version`` key
itself)."""

DEFAULT_RACK_FLOOR_W = 40_000.0
"""The default safe floor of a rack, W (AC input): rlc's topology ``floor_w`` of its embedded
example racks and racky's ``[fleet] floor_w``. One constant so the two defaults agree (a rack
falling to more than rlc counts for it could take its row past the breaker); on a site the
two files must still name the same figure per rack, which rlc checks at run time against each
rack's report (`RackReport.floor_w`, ``floor_mismatch`` in ``state/fleet``). 40 kW holds a
default rack's safe caps (≈ 25 kW: `rackplane.core.tray_contract.AGENT_SAFE_GPU_CAP_W`) and
its lowest caps (racky's ``rack_floor_w``, ≈ 25 kW) with room."""

Key = tuple[int, int]
"""A lease's order: (epoch, seq)."""


def budget_key(site: str, rack: str) -> str:
    """The KV key of ``rack``'s budget lease: ``<site>.<rack>.budget``."""
    return f"{site}.{rack}.budget"


def rack_key(site: str, rack: str) -> str:
    """The KV key of ``rack``'s report (racky's state): ``<site>.<rack>.rack``."""
    return f"{site}.{rack}.rack"


def as_int(v: Any) -> int:
    """``v`` when it is an int (not a bool). Raises TypeError otherwise."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"not an integer: {v!r}")
    return v


@dataclass(frozen=True, slots=True)
class BudgetLease:
    """A rack's budget lease as written to the KV store (times: rlc's wall clock, Unix s;
    ``value_w`` W; ordered by ``key`` = (epoch, seq): ``epoch`` the issuing rlc leader's,
    ``seq`` growing by one per lease of a rack across epochs)."""

    rack: str
    value_w: float
    issued_at_s: float
    expires_at_s: float
    epoch: int
    seq: int

    def __post_init__(self) -> None:
        if not (math.isfinite(self.value_w) and self.value_w >= 0):
            raise ValueError(f"lease {self.rack}: value_w {self.value_w!r} must be >= 0")
        if not (math.isfinite(self.issued_at_s) and math.isfinite(self.expires_at_s)
                and self.expires_at_s > self.issued_at_s):
            raise ValueError(f"lease {self.rack}: expires_at_s must follow issued_at_s")
        if self.epoch < 0 or self.seq < 1:
            raise ValueError(f"lease {self.rack}: epoch >= 0 and seq >= 1")

    @property
    def key(self) -> Key:
        """(epoch, seq): the lease's place in the rack's order."""
        return (self.epoch, self.seq)

    @property
    def life_s(self) -> float:
        """expires_at_s − issued_at_s, s."""
        return self.expires_at_s - self.issued_at_s

    def as_record(self) -> dict[str, Any]:
        """The JSON-able record (KV value) of this lease."""
        return {"rack": self.rack, "value_w": self.value_w, "issued_at_s": self.issued_at_s,
                "expires_at_s": self.expires_at_s, "epoch": self.epoch, "seq": self.seq}

    @classmethod
    def from_record(cls, d: dict[str, Any]) -> BudgetLease:
        """Decode `as_record`'s output. Raises ValueError for a missing or mistyped field."""
        try:
            return cls(rack=str(d["rack"]), value_w=float(d["value_w"]),
                       issued_at_s=float(d["issued_at_s"]),
                       expires_at_s=float(d["expires_at_s"]), epoch=as_int(d["epoch"]),
                       seq=as_int(d["seq"]))
        except (KeyError, TypeError) as err:
            raise ValueError(f"budget lease record: {err!r}") from None


def budget_lease_valid(lease: BudgetLease, now_wall_s: float, received_mono_s: float,
                       now_mono_s: float, clock_margin_s: float) -> bool:
    """racky's side: whether ``lease`` is in force now (else the rack falls to its floor).

    ``now_wall_s``: racky's wall clock (Unix s); ``received_mono_s``/``now_mono_s``: racky's
    monotonic clock when it read the lease and now (s); ``clock_margin_s``: the largest
    wall-clock offset between rlc's host and racky's (s). In force iff issued at most
    ``clock_margin_s`` in the future, the wall clock is before ``expires_at_s``, and less
    than the lease's life has run on the monotonic clock since it was read (a wall-clock step
    cannot stretch a lease).
    """
    if lease.issued_at_s > now_wall_s + clock_margin_s:
        return False
    return now_wall_s < lease.expires_at_s and now_mono_s - received_mono_s < lease.life_s


@dataclass(frozen=True, slots=True)
class RackReport:
    """racky's report in its rack key (module docstring). W and s.

    ``demand_w``: the power the rack wants (its trays' demand with headroom plus what is
    outside the trays; may exceed its budget; None: not known now); ``budget_w``: the budget
    it enforces now (its lease's value, or its floor without a valid lease); ``floor_w``: its
    configured safe floor; ``drawable_w``: the most its trays may draw as their agents report
    their **enforced** caps (None: not every tray reported); ``acked``: the newest lease
    (epoch, seq) whose value ``drawable_w`` is within (None: none yet); ``lease_valid``:
    whether it holds a lease in force; ``at_s``: racky's wall clock (Unix s) at writing;
    ``agents_safe_w``: Σ of the safe caps its agents state in their telemetry (each tray's
    ``safe_gpu_cap_w`` × GPUs × (1 + non-GPU share), plus the power outside the trays), the
    most the rack draws once racky is silent past its agents' cap TTL; None: not every tray
    states one (an older agent) or not every tray reported. ``cooling_w``: the most the rack
    may draw from its feed (AC W) that its cooling carries now: valvey's measured valve-open
    capacity per K × (setpoint − facility water − racky's derate margin), the P_max racky's
    own facility-water derate works to (`racky.core.power.Derate.measured_capacity_w`), × the
    shelves' input ratio; None: not known now (valvey has not measured, its state is stale, or
    racky's derate does not use the measurement). Both absent in an older racky's record
    (decoded as None). ``power_w``: what the rack draws from its feed now (the shelves' AC
    input, W, rounded to 100 W; None: not every shelf reports it), for rlc's telemetry only
    (the allocation never uses it). ``version``: the record's (`REPORT_VERSION`; 1 for a
    record without).
    """

    rack: str
    demand_w: float | None
    budget_w: float
    floor_w: float
    drawable_w: float | None
    acked: Key | None
    lease_valid: bool
    at_s: float
    agents_safe_w: float | None = None
    cooling_w: float | None = None
    power_w: float | None = None
    version: int = REPORT_VERSION

    def as_record(self) -> dict[str, Any]:
        """The JSON-able record (KV value)."""
        return {"rack": self.rack, "demand_w": self.demand_w, "budget_w": self.budget_w,
                "floor_w": self.floor_w, "drawable_w": self.drawable_w,
                "acked": None if self.acked is None else list(self.acked),
                "lease_valid": self.lease_valid, "at_s": self.at_s,
                "agents_safe_w": self.agents_safe_w, "cooling_w": self.cooling_w,
                "power_w": self.power_w, "version": self.version}

    @classmethod
    def from_record(cls, d: dict[str, Any]) -> RackReport:
        """Decode `as_record`'s output. Raises ValueError for a missing or mistyped field."""
        try:
            ack = d["acked"]
            dem, dr, sf = d["demand_w"], d["drawable_w"], d.get("agents_safe_w")
            cw, pw = d.get("cooling_w"), d.get("power_w")
            return cls(rack=str(d["rack"]), demand_w=None if dem is None else float(dem),
                       budget_w=float(d["budget_w"]), floor_w=float(d["floor_w"]),
                       drawable_w=None if dr is None else float(dr),
                       acked=None if ack is None else (as_int(ack[0]), as_int(ack[1])),
                       lease_valid=bool(d["lease_valid"]), at_s=float(d["at_s"]),
                       agents_safe_w=None if sf is None else float(sf),
                       cooling_w=None if cw is None else float(cw),
                       power_w=None if pw is None else float(pw),
                       version=as_int(d.get("version", 1)))
        except (KeyError, TypeError, IndexError) as err:
            raise ValueError(f"rack report record: {err!r}") from None
