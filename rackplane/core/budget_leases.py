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
  (``cooling_w``), and since version 3 the rack's status for operators (``lifecycle``,
  ``alarms``: `AlarmSummary`, ``pair``: `PairTag`). Versioned (``version``,
  `REPORT_VERSION`): fields are only ever added, each new one optional, and a record without
  it (an older racky) decodes it as None = unknown; version 1 records carry no ``version``
  key and neither ``agents_safe_w`` nor ``cooling_w``. Only the active instance of a racky
  pair writes it. Native NATS subscribers never see MQTT retained messages, so this state
  goes through the KV store, which survives rlc restarts and leader changes.

**Status fields** (version 3; rlc carries them and never decides on them): each is bounded
(`LIFECYCLE_PATTERN`, alarm ids `rackplane.core.names.ALARM_ID_PATTERN` and at most
`REPORT_ALARM_IDS_MAX` of them, counts at most `REPORT_ALARM_COUNT_MAX`, the instance
`rackplane.core.names.PAIR_INSTANCE_PATTERN`) and refused when it is not: a status field that
does not decode is read as unknown and named in `RackReport.refused`, the rest of the record
stands (a bad status field must not cost rlc a rack's report). A bad core field refuses the
whole record, as before.

**Clocks.** A lease's times are rlc's wall clock (Unix s), as are a report's ``at_s`` racky's:
hosts keep NTP/PTP time and ``clock_margin_s`` covers their offset (`budget_lease_valid`).

Errors: ``ValueError`` for a lease out of order (value not finite or < 0, expiry not after
issue), a status field out of its bounds, and for records that do not decode (the message
names the field).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, get_args

from rackplane.core.alarms import Severity
from rackplane.core.names import ALARM_ID_PATTERN, PAIR_INSTANCE_PATTERN

__all__ = ["ALARM_SEVERITIES", "DEFAULT_RACK_FLOOR_W", "LIFECYCLE_PATTERN",
           "REPORT_ALARM_COUNT_MAX", "REPORT_ALARM_IDS_MAX", "REPORT_VERSION", "AlarmSummary",
           "BudgetLease", "PairTag", "RackReport", "as_int", "budget_key", "budget_lease_valid",
           "check_lifecycle", "rack_key"]

REPORT_VERSION = 3
"""`RackReport`'s record version: 2 adds ``cooling_w``, ``power_w`` (and the ``version`` key
itself); 3 adds ``lifecycle``, ``alarms`` and ``pair``."""

ALARM_SEVERITIES: tuple[str, ...] = get_args(Severity)
"""The alarm severities, most severe first (`rackplane.core.alarms.Severity`)."""

REPORT_ALARM_IDS_MAX = 8
"""At most this many alarm ids in a report (`AlarmSummary.ids`: the most severe)."""

REPORT_ALARM_COUNT_MAX = 100_000
"""A count of alarms above this is refused (garbage, not a rack)."""

LIFECYCLE_PATTERN = r"^[a-z][a-z0-9_]{0,31}$"
"""A reported lifecycle state (racky's are ``provisioning``, ``validating``, ``production``,
``maintenance``, ``quarantined``; a newer racky's new state still decodes)."""

_ALARM_ID_RE = re.compile(ALARM_ID_PATTERN)
_INSTANCE_RE = re.compile(PAIR_INSTANCE_PATTERN)
_LIFECYCLE_RE = re.compile(LIFECYCLE_PATTERN)

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


class AlarmLike(Protocol):
    """What `AlarmSummary.of` reads of an alarm (`rackplane.core.alarms.AlarmSnapshot`)."""

    @property
    def id(self) -> str: ...
    @property
    def severity(self) -> str: ...
    @property
    def shelved(self) -> bool: ...


def _count(v: Any, what: str) -> int:
    n = as_int(v)
    if not 0 <= n <= REPORT_ALARM_COUNT_MAX:
        raise ValueError(f"{what}: {n} not within 0..{REPORT_ALARM_COUNT_MAX}")
    return n


@dataclass(frozen=True, slots=True)
class AlarmSummary:
    """A rack's alarms in its report (version 3), bounded whatever the number of alarms.

    ``critical`` … ``warning``: the number of the alarms of that severity racky annunciates
    now (active, or latched awaiting reset; not shelved); ``shelved``: the number of shelved
    ones (in no severity count); ``ids``: the ids of at most `REPORT_ALARM_IDS_MAX`
    annunciated alarms, most severe first, then oldest (racky's order).

    Raises:
        ValueError: a count or id out of its bounds, more ids than annunciated alarms.
    """

    critical: int = 0
    major: int = 0
    minor: int = 0
    warning: int = 0
    shelved: int = 0
    ids: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for k in (*ALARM_SEVERITIES, "shelved"):
            _count(getattr(self, k), f"alarm count {k}")
        if len(self.ids) > min(REPORT_ALARM_IDS_MAX, self.total):
            raise ValueError(f"alarm ids: {len(self.ids)} for {self.total} alarms "
                             f"(at most {REPORT_ALARM_IDS_MAX})")
        for aid in self.ids:
            if not (isinstance(aid, str) and _ALARM_ID_RE.match(aid)):
                raise ValueError(f"alarm id {str(aid)[:80]!r} does not match {ALARM_ID_PATTERN}")

    @property
    def counts(self) -> dict[str, int]:
        """Severity → count, most severe first (every severity of `ALARM_SEVERITIES`)."""
        return {k: getattr(self, k) for k in ALARM_SEVERITIES}

    @property
    def total(self) -> int:
        """The annunciated alarms (Σ ``counts``)."""
        return self.critical + self.major + self.minor + self.warning

    @property
    def worst(self) -> str | None:
        """The most severe severity annunciated now; None: none."""
        return next((k for k in ALARM_SEVERITIES if self.counts[k]), None)

    @classmethod
    def of(cls, alarms: Iterable[AlarmLike]) -> AlarmSummary:
        """The summary of racky's alarms not normal (`racky.core.alarmbank.AlarmBank.active`:
        most severe first, then oldest; ``ids`` keep that order within a severity)."""
        counts = dict.fromkeys(ALARM_SEVERITIES, 0)
        shelved = 0
        shown: list[tuple[int, int, str]] = []
        rank = {k: i for i, k in enumerate(ALARM_SEVERITIES)}
        for i, a in enumerate(alarms):
            if a.shelved:
                shelved += 1
                continue
            counts[a.severity] += 1
            shown.append((rank[a.severity], i, a.id))
        ids = tuple(aid for _, _, aid in sorted(shown)[:REPORT_ALARM_IDS_MAX])
        return cls(**counts, shelved=shelved, ids=ids)

    def as_record(self) -> dict[str, Any]:
        """The JSON-able record: ``{"counts": {severity: n}, "shelved": n, "ids": [...]}``."""
        return {"counts": self.counts, "shelved": self.shelved, "ids": list(self.ids)}

    @classmethod
    def from_record(cls, d: Any) -> AlarmSummary:
        """Decode `as_record`'s output (keys other than those are ignored).

        Raises:
            ValueError: not an object, a field missing, mistyped or out of its bounds.
        """
        if not isinstance(d, Mapping):
            raise ValueError("alarms: not an object")
        counts, ids = d.get("counts"), d.get("ids", [])
        if not isinstance(counts, Mapping):
            raise ValueError("alarms.counts: not an object")
        if not isinstance(ids, list) or len(ids) > REPORT_ALARM_IDS_MAX:
            raise ValueError(f"alarms.ids: not a list of at most {REPORT_ALARM_IDS_MAX}")
        if set(counts) != set(ALARM_SEVERITIES):
            raise ValueError(f"alarms.counts: severities {sorted(map(str, counts))[:8]} are "
                             f"not {list(ALARM_SEVERITIES)}")
        try:
            return cls(**{k: counts[k] for k in ALARM_SEVERITIES}, shelved=d.get("shelved", 0),
                       ids=tuple(ids))
        except TypeError as err:
            raise ValueError(f"alarms: {err}") from None


@dataclass(frozen=True, slots=True)
class PairTag:
    """The racky pair instance that wrote the report (the active one) and its fencing epoch
    (its leadership lease's epoch, ≥ 1). A single instance reports none (``pair`` null).

    Raises:
        ValueError: an instance not matching `rackplane.core.names.PAIR_INSTANCE_PATTERN`,
            an epoch not an integer ≥ 1.
    """

    instance: str
    epoch: int

    def __post_init__(self) -> None:
        if not (isinstance(self.instance, str) and _INSTANCE_RE.match(self.instance)):
            raise ValueError(f"pair instance {str(self.instance)[:80]!r} does not match "
                             f"{PAIR_INSTANCE_PATTERN}")
        if as_int(self.epoch) < 1:
            raise ValueError(f"pair epoch {self.epoch} must be >= 1")

    def as_record(self) -> dict[str, Any]:
        """``{"instance": ..., "epoch": ...}``."""
        return {"instance": self.instance, "epoch": self.epoch}

    @classmethod
    def from_record(cls, d: Any) -> PairTag:
        """Decode `as_record`'s output. Raises ValueError: not that object."""
        if not isinstance(d, Mapping):
            raise ValueError("pair: not an object")
        try:
            return cls(d["instance"], d["epoch"])
        except (KeyError, TypeError) as err:
            raise ValueError(f"pair: {err!r}") from None


def check_lifecycle(v: Any) -> str:
    """``v`` when a lifecycle state string (`LIFECYCLE_PATTERN`). Raises ValueError."""
    if not (isinstance(v, str) and _LIFECYCLE_RE.match(v)):
        raise ValueError(f"lifecycle {str(v)[:80]!r} does not match {LIFECYCLE_PATTERN}")
    return v


def _status_field(d: Mapping[str, Any], name: str, decode: Callable[[Any], Any],
                  refused: list[str]) -> Any:
    """A status field of a report record: None when absent or null, else decoded; one that
    does not decode is None and its name goes to ``refused``."""
    v = d.get(name)
    if v is None:
        return None
    try:
        return decode(v)
    except (ValueError, TypeError):
        refused.append(name)
        return None


@dataclass(frozen=True, slots=True)
class RackReport:
    """racky's report in its rack key (module docstring). W and s.

    ``demand_w``: the power the rack wants (its trays' demand with headroom plus what is
    outside the trays; may exceed its budget; None: not known now); ``budget_w``: the budget
    it enforces now (its lease's value, or its floor without a valid lease; lower when racky's
    own limit in force is lower: an operator's budget, the derate, the cooling, × the input
    ratio); ``floor_w``: its
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
    (the allocation never uses it). ``lifecycle``: the rack's lifecycle state
    (`LIFECYCLE_PATTERN`), ``alarms``: its alarms (`AlarmSummary`), ``pair``: the instance
    of a racky pair that wrote it and its epoch (`PairTag`; None from a single instance): the
    status fields (module docstring), None in an older record. ``refused``: the status
    fields present in the record that did not decode (read as None; never written).
    ``version``: the record's (`REPORT_VERSION`; 1 for a record without).
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
    lifecycle: str | None = None
    alarms: AlarmSummary | None = None
    pair: PairTag | None = None
    version: int = REPORT_VERSION
    refused: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.lifecycle is not None:
            check_lifecycle(self.lifecycle)

    def as_record(self) -> dict[str, Any]:
        """The JSON-able record (KV value)."""
        return {"rack": self.rack, "demand_w": self.demand_w, "budget_w": self.budget_w,
                "floor_w": self.floor_w, "drawable_w": self.drawable_w,
                "acked": None if self.acked is None else list(self.acked),
                "lease_valid": self.lease_valid, "at_s": self.at_s,
                "agents_safe_w": self.agents_safe_w, "cooling_w": self.cooling_w,
                "power_w": self.power_w, "lifecycle": self.lifecycle,
                "alarms": None if self.alarms is None else self.alarms.as_record(),
                "pair": None if self.pair is None else self.pair.as_record(),
                "version": self.version}

    @classmethod
    def from_record(cls, d: dict[str, Any]) -> RackReport:
        """Decode `as_record`'s output. Raises ValueError for a missing or mistyped core
        field; a status field that does not decode is None and named in ``refused``."""
        if not isinstance(d, Mapping):
            raise ValueError("rack report record: not an object")
        refused: list[str] = []
        lifecycle = _status_field(d, "lifecycle", check_lifecycle, refused)
        alarms = _status_field(d, "alarms", AlarmSummary.from_record, refused)
        pair = _status_field(d, "pair", PairTag.from_record, refused)
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
                       power_w=None if pw is None else float(pw), lifecycle=lifecycle,
                       alarms=alarms, pair=pair, version=as_int(d.get("version", 1)),
                       refused=tuple(refused))
        except (KeyError, TypeError, IndexError) as err:
            raise ValueError(f"rack report record: {err!r}") from None

