"""Sensors valvey reads over MQTT (room air, leak sensors, rack power) and the supply-sensor
voter. Pure: no I/O, no clock; the daemon's MQTT handler and the lock-step runner both call
`parse_sensor_message`, so the same parsing is exercised in both.

**Topic mapping** (DESIGN §3: "sensor topics are mapped in config"). Each `SensorTopic` names
one sample (``name``), the topic it arrives on (placeholders ``{root}``, ``{site}``,
``{rack}``), a dotted path to the value in the JSON payload (``field``), an optional quality
field (the NVIDIA DSX Exchange BMS payload ``{value, timestamp_ms, quality}`` has
``quality = 1`` for good, REFERENCE §1.5) and how old a value may be before it is STALE
(``stale_after_s``; a DSX source republishes every 100 s when unchanged, so 2 × 100 s there,
REFERENCE §5 S5; the simulator publishes every second, so 10 s by default). Kinds:

* ``number``: a float (``null`` → BAD ``null``);
* ``bool``: 1.0 / 0.0 (another number: OUT_OF_RANGE ``implausible``);
* ``index_list``: a list of indices (``leak.leaking_trays``) → one bool sample per index
  ``<name>.<NN>`` for NN in 0..count−1 (1.0 when listed); an index outside 0..count−1 makes
  every sample of the message OUT_OF_RANGE ``implausible`` (the trays' states are unknown).

A number is judged against its plausibility window where it enters the core
(`valvey.core.inputs`), not here.

The embedded defaults are the simulator's topics (docs/SIMULATORS.md §4) and racky's
``state/rack_power`` (docs/CONTRACTS.md). A payload that cannot be parsed, a missing field or
a bad quality gives BAD samples with a reason: never a silent drop, never a stale value
passed as fresh.

**Supply-sensor voter** (`SupplyVoter`): the CDU's redundant supply sensors A/B/C (REFERENCE
§1.5, Coolcentric: three sensors averaged, > 1.0 K disagreement for 30 s drops the bad one,
an open-circuit sensor alarms at once). Each sensor is judged every tick:

* ``bad`` / ``stale`` / ``out_of_range`` from its `Sample` quality (a NaN or sentinel reading
  is caught on the first sample: REFERENCE §5 S5 "dropout in ≤ 2 samples");
* ``frozen``: an exactly unchanged value for ``freeze_after_s`` (REFERENCE §5 S5: zero variance
  where σ ≈ 0.03 K noise is expected; 5 s at 10 Hz is 50 identical samples);
* ``disagree``: more than ``disagree_k`` from the median of the other healthy sensors for
  ``disagree_s`` (the CDU default, 1 K / 30 s: a 0.05 K/min drift needs ~20 min);
* ``drift``: the energy-balance residual (REFERENCE §5 S5 "sooner through an energy-balance
  residual"): the supply temperature the heat balance implies, ``T_ret − q_hx / (ρc·Q)``, is
  compared with each sensor through a ``residual_tau_s`` moving average; a sensor more than
  ``drift_k`` off for ``drift_hold_s`` *and* more than half that from the median of the
  others is dropped (a common offset, e.g. of the return sensor or the heat meter, moves all
  sensors' residuals alike and drops none).

The PV is the median of the healthy sensors. A dropped sensor is readmitted after it agrees
with the others within ``readmit_k`` for ``readmit_s`` (and is not frozen or bad). With one
sensor left it is used, and a drift indication alone never drops it (the fail-safe needs
evidence of a bad reading, not of a disagreement with a model).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rackplane.config import StrictModel
from rackplane.core.envelope import MAX_INPUT_BYTES, JsonError, read_json
from rackplane.core.names import check_topic_levels
from rackplane.core.plausibility import IMPLAUSIBLE
from rackplane.core.samples import Quality, Sample, good, invalid, make_sample, slots_constructor
from valvey.core.design_flow import DesignFlow

__all__ = [
    "SensorMap",
    "SensorTopic",
    "SupplySensorSettings",
    "SupplyVoter",
    "VoterResult",
    "default_sensor_topics",
    "parse_sensor_message",
    "resolve_topic",
]

SensorKind = Literal["number", "bool", "index_list"]


class SensorTopic(StrictModel):
    """One sensor mapped from an MQTT topic (see the module docstring)."""

    name: str = Field(description="sample name valvey uses (e.g. room_temp_c)")
    topic: str = Field(description="topic; {root}, {site}, {rack} are replaced")
    field: str = Field(description="dotted path to the value in the JSON payload")
    kind: SensorKind = "number"
    unit: str = ""
    count: int = Field(18, ge=1, le=256, description="index_list: indices 0..count-1")
    quality_field: str | None = Field(
        None, description="dotted path to a quality value; anything but good_quality is BAD"
    )
    good_quality: float = 1.0
    stale_after_s: float = Field(
        10.0, gt=0, le=3600, description="older than this is STALE (2 × the source's "
        "republish interval: 1 s for the simulator, 100 s for a DSX-style source)"
    )

    @field_validator("topic")
    @classmethod
    def _topic_levels(cls, v: str) -> str:
        # Each level a topic level (rackplane.core.names: no wildcards, '$', '.', spaces),
        # or one of the placeholders {root} {site} {rack}.
        return check_topic_levels(v, "sensor topic",
                                  placeholders=frozenset({"root", "site", "rack"}))


_SIM = "{root}/{site}/{rack}/sim/telemetry"


class SensorMap(StrictModel):
    """The MQTT sensors valvey reads, one mapping per role (None: not available). The
    defaults are the simulator's topics (docs/SIMULATORS.md §4) and racky's
    ``state/rack_power`` (docs/CONTRACTS.md); on a real site, the BMS's (e.g. DSX
    ``BMS/v1/PUB/Value/Rack/RackLeakDetectTray/...`` with ``field = "value"`` and
    ``quality_field = "quality"``)."""

    rack_power: SensorTopic | None = SensorTopic(
        name="rack_power_w", topic="{root}/{site}/{rack}/racky/state/rack_power",
        field="rack_power_w", unit="W", stale_after_s=5.0)
    room_temp: SensorTopic | None = SensorTopic(
        name="room_temp_c", topic=f"{_SIM}/env", field="room_temp_c", unit="degC")
    room_rh: SensorTopic | None = SensorTopic(
        name="room_rh_pct", topic=f"{_SIM}/env", field="relative_humidity_pct", unit="%")
    tray_leak: SensorTopic | None = SensorTopic(
        name="leak_tray", topic=f"{_SIM}/rack", field="leak.leaking_trays",
        kind="index_list", unit="bool")
    tray_leak_sensor_fault: SensorTopic | None = SensorTopic(
        name="leak_tray_sensor_fault", topic=f"{_SIM}/rack", field="leak.faulted_tray_sensors",
        kind="index_list", unit="bool")
    drip_pan_leak: SensorTopic | None = SensorTopic(
        name="leak_drip_pan", topic=f"{_SIM}/rack", field="leak.drip_pan_leak", kind="bool",
        unit="bool")
    drip_pan_sensor_fault: SensorTopic | None = SensorTopic(
        name="leak_drip_pan_sensor_fault", topic=f"{_SIM}/rack",
        field="leak.drip_pan_sensor_fault", kind="bool", unit="bool")

    def topics(self) -> list[SensorTopic]:
        """Every mapping in use."""
        return [v for v in (getattr(self, k) for k in type(self).model_fields) if v is not None]


def default_sensor_topics() -> list[SensorTopic]:
    """The embedded mapping (`SensorMap` defaults) as a list."""
    return SensorMap().topics()


def resolve_topic(template: str, root: str, site: str, rack: str) -> str:
    """``template`` with ``{root}``, ``{site}``, ``{rack}`` replaced."""
    return template.replace("{root}", root).replace("{site}", site).replace("{rack}", rack)


def _dig(payload: Any, path: str) -> tuple[bool, Any]:
    cur = payload
    for part in path.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return False, None
        cur = cur[part]
    return True, cur


def _names(s: SensorTopic) -> list[str]:
    if s.kind == "index_list":
        return [f"{s.name}.{i:02d}" for i in range(s.count)]
    return [s.name]


def parse_sensor_message(
    sensors: Iterable[SensorTopic],
    payload: bytes | Mapping[str, Any],
    now_mono: float,
    ts_ns: int,
) -> list[Sample]:
    """Samples for every sensor in ``sensors`` (those mapped to the topic the payload came on).

    Args:
        sensors: the mappings whose topic matched.
        payload: the raw bytes (JSON) or an already-decoded mapping (lock-step).
        now_mono: monotonic time of reception [s] (age and staleness count from it).
        ts_ns: wall-clock timestamp for the time series [ns].

    Returns:
        One sample per sensor name (``index_list``: one per index); BAD with a reason
        (``json``, ``missing_field``, ``null``, ``type``, ``source_quality``) when the value
        cannot be used.
    """
    data: Any
    err: str | None = None
    if isinstance(payload, Mapping):
        data = payload
    else:
        try:  # bounded and strict, as every daemon input (rackplane.core.envelope.read_json)
            data = read_json(payload, max_bytes=MAX_INPUT_BYTES)
        except JsonError:
            data, err = None, "json"
    out: list[Sample] = []
    for s in sensors:
        reason = err
        value: Any = None
        if reason is None:
            found, value = _dig(data, s.field)
            if not found:
                reason = "missing_field"
            elif value is None:
                reason = "null"
        if reason is None and s.quality_field is not None:
            qfound, q = _dig(data, s.quality_field)
            if not qfound or not isinstance(q, int | float) or float(q) != s.good_quality:
                reason = "source_quality"
        if reason is not None:
            out.extend(invalid(n, s.unit, ts_ns, now_mono, Quality.BAD, reason) for n in _names(s))
            continue
        if s.kind == "index_list":
            if not isinstance(value, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in value
            ):
                out.extend(invalid(n, s.unit, ts_ns, now_mono, Quality.BAD, "type")
                           for n in _names(s))
                continue
            wet = set(value)
            if any(i < 0 or i >= s.count for i in wet):
                # a tray that does not exist (a 1-based list, a wrong count): the state of
                # every tray in the message is unknown, not "dry" (alarm input_implausible)
                out.extend(invalid(n, s.unit, ts_ns, now_mono, Quality.OUT_OF_RANGE,
                                   IMPLAUSIBLE) for n in _names(s))
                continue
            out.extend(good(f"{s.name}.{i:02d}", 1.0 if i in wet else 0.0, s.unit, ts_ns,
                            now_mono) for i in range(s.count))
        elif s.kind == "bool":
            if isinstance(value, bool) or (isinstance(value, int | float) and value in (0, 1)):
                out.append(good(s.name, 1.0 if value else 0.0, s.unit, ts_ns, now_mono))
            elif isinstance(value, int | float):  # a number that is no state (2, 0.5, NaN)
                out.append(invalid(s.name, s.unit, ts_ns, now_mono, Quality.OUT_OF_RANGE,
                                   IMPLAUSIBLE))
            else:
                out.append(invalid(s.name, s.unit, ts_ns, now_mono, Quality.BAD, "type"))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out.append(good(s.name, float(value), s.unit, ts_ns, now_mono))  # NaN -> BAD nan
        else:
            out.append(invalid(s.name, s.unit, ts_ns, now_mono, Quality.BAD, "type"))
    return out


# --- the supply-sensor voter ------------------------------------------------------------------

SensorStatus = Literal[
    "ok", "missing", "bad", "stale", "out_of_range", "frozen", "disagree", "drift"
]


class SupplySensorSettings(StrictModel):
    """Redundant supply sensors and their fault detection (module docstring; REFERENCE §1.5
    Coolcentric defaults, §5 S5)."""

    redundant: list[str] = Field(
        default_factory=lambda: ["supply_temp_b_c", "supply_temp_c_c"],
        max_length=4,
        description="redundant supply sensors (register-map points) voted with "
        "points.supply_temp (sensor A); [] for a single sensor",
    )
    stale_after_s: float = Field(3.0, gt=0, le=60, description="older readings are stale")
    valid_min_c: float = Field(5.0, description="plausible range of a supply reading, °C")
    valid_max_c: float = Field(90.0)
    freeze_after_s: float | None = Field(
        5.0, gt=0, description="an exactly unchanged value this long is frozen (None: off)"
    )
    disagree_k: float = Field(1.0, gt=0, description="REFERENCE §1.5: 1.0 K for 30 s")
    disagree_s: float = Field(30.0, ge=0)
    energy_balance: bool = Field(True, description="drift detection by energy balance")
    drift_k: float = Field(
        0.3, gt=0, description="energy-balance residual that marks drift, K [D]: 6 min of a "
        "0.05 K/min drift; the residual of a healthy sensor stayed below 0.02 K on the agentic "
        "burst train and below 0.1 K through the S1 load steps (lock-step, this plant)"
    )
    drift_hold_s: float = Field(30.0, ge=0)
    residual_tau_s: float = Field(
        60.0, gt=0, description="averaging of the residual, s: longer than the CDU node and "
        "heat-meter lags, so load swings average out"
    )
    min_flow_fraction: float = Field(
        0.3, ge=0, le=1, description="no energy balance below this share of design flow"
    )
    design_flow_lpm: float | None = Field(
        None, gt=0, description="design flow min_flow_fraction is a share of, L/min: the "
        "site's figure; None: learned from the plant, the highest steady flow seen "
        "(valvey.core.design_flow)"
    )
    coolant_rho_c_kj_per_l_k: float = Field(4.03, gt=0, description="PG25 (REFERENCE §1.4)")
    readmit_k: float = Field(0.3, gt=0)
    readmit_s: float = Field(60.0, ge=0)

    @model_validator(mode="after")
    def _check(self) -> SupplySensorSettings:
        if self.valid_min_c >= self.valid_max_c:
            raise ValueError("valid_min_c must be below valid_max_c")
        if len(set(self.redundant)) != len(self.redundant):
            raise ValueError("redundant sensors must be distinct")
        return self


@dataclass(slots=True)
class _SensorState:
    status: SensorStatus = "missing"
    healthy: bool = False  # used for the PV
    last_value: float | None = None
    same_since: float | None = None
    disagree_since: float | None = None
    agree_since: float | None = None
    residual: float | None = None
    residual_t: float | None = None
    drift_since: float | None = None
    dropped_for: str | None = None  # why it is out (until readmitted)
    detected_at: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class VoterResult:
    """One vote.

    Attributes:
        pv: the voted supply temperature as a Sample (GOOD: median of the healthy sensors;
            else the most informative invalid sample), None before any reading.
        status: per point, its `SensorStatus`.
        healthy: points used for the PV.
        estimate_c: the energy-balance supply estimate, °C (None when not computable).
        transitions: ``sensor:<point>:<old>-><new>`` changes in this tick.
    """

    pv: Sample | None
    status: Mapping[str, SensorStatus]
    healthy: tuple[str, ...]
    estimate_c: float | None
    transitions: tuple[str, ...]


_new_voter_result = slots_constructor(VoterResult)  # VoterResult(...) on every tick

_GOOD, _STALE, _OUT_OF_RANGE = Quality.GOOD, Quality.STALE, Quality.OUT_OF_RANGE
_isfinite = math.isfinite


def _median(vals: Sequence[float]) -> float:
    v = sorted(vals)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


class SupplyVoter:
    """Votes the redundant supply sensors each tick (module docstring).

    Args:
        settings: `SupplySensorSettings`.
        primary: the main supply sensor (sensor A, ``points.supply_temp``).
    """

    def __init__(self, settings: SupplySensorSettings, primary: str = "supply_temp_c"):
        self.s = settings
        self.points = [primary, *(p for p in settings.redundant if p != primary)]
        self._st = {p: _SensorState() for p in self.points}
        self._t_last: float | None = None
        self._t_rel: float | None = None
        self._est: float | None = None
        self.design_flow = DesignFlow(settings.design_flow_lpm)
        self._last: VoterResult | None = None

    @property
    def last(self) -> VoterResult | None:
        """The last result."""
        return self._last

    def detected_at(self, point: str) -> dict[str, float]:
        """When each fault kind was last detected on ``point`` (monotonic s)."""
        return dict(self._st[point].detected_at)

    def vote(
        self,
        now: float,
        samples: Mapping[str, Sample],
        return_temp: Sample | None = None,
        heat_removed_kw: Sample | None = None,
        flow_lpm: Sample | None = None,
    ) -> VoterResult:
        """Judge every sensor and vote (see the module docstring)."""
        s = self.s
        self._t_last = now
        dt = 0.0
        trans: list[str] = []
        values: dict[str, float] = {}
        base: dict[str, SensorStatus] = {}
        stale_after_s = s.stale_after_s
        for p, st in self._st.items():
            smp = samples.get(p)
            status: SensorStatus
            # Sample.usable and Sample.age_s inlined (three sensors on every 10 Hz tick)
            if smp is None:
                status = "missing"
            elif (q := smp.quality) is _STALE:
                status = "stale"
            elif q is _OUT_OF_RANGE:
                status = "out_of_range"
            elif q is not _GOOD or (v := smp.value) is None or not _isfinite(v):
                status = "bad"
            elif now - smp.t_mono > stale_after_s or stale_after_s < 0.0:
                status = "stale"  # age_s = max(0, now - t_mono) > stale_after_s
            else:
                if not s.valid_min_c <= v <= s.valid_max_c:
                    status = "out_of_range"
                else:
                    status = "ok"
                    if st.last_value != v or st.same_since is None:
                        st.last_value, st.same_since = v, smp.t_mono
                    elif (s.freeze_after_s is not None
                          and smp.t_mono - st.same_since >= s.freeze_after_s):
                        status = "frozen"
                    if status == "ok":
                        values[p] = v
            if status != "ok" and status != "frozen":
                st.same_since = None  # a gap: the freeze timer starts afresh
            base[p] = status
        # Relative checks (disagreement, energy balance, readmission: timers of 30-60 s) once
        # a second; the per-reading checks above run on every tick.
        rel = self._t_rel is None or now - self._t_rel >= 1.0 - 1e-6
        if rel:
            dt = 0.0 if self._t_rel is None else now - self._t_rel
            self._t_rel = now
            self.design_flow.update(now, None if flow_lpm is None or not flow_lpm.usable
                                    else flow_lpm.value)
            est = self._estimate(return_temp, heat_removed_kw, flow_lpm)
            self._est = est
        else:
            est = self._est
        for p, st in self._st.items():
            status = base[p]
            if status == "ok" and not rel:
                if st.status in ("disagree", "drift"):
                    status = st.status
                elif st.dropped_for is None and st.status == "ok":
                    continue  # healthy and unchanged: nothing below applies
            elif status == "ok":
                others = [values[q] for q in values if q != p and self._st[q].dropped_for is None]
                v = values[p]
                med_o = _median(others) if others else None
                # disagreement (Coolcentric: > 1 K for 30 s)
                if med_o is not None and abs(v - med_o) > s.disagree_k:
                    if st.disagree_since is None:
                        st.disagree_since = now
                    if now - st.disagree_since >= s.disagree_s:
                        status = "disagree"
                else:
                    st.disagree_since = None
                # energy-balance drift
                if est is not None and s.energy_balance:
                    r = v - est
                    if st.residual is None:
                        st.residual = r
                    else:
                        a = min(1.0, dt / s.residual_tau_s)
                        st.residual += (r - st.residual) * a
                    attributed = med_o is not None and abs(v - med_o) > 0.5 * s.drift_k
                    if abs(st.residual) > s.drift_k and attributed:
                        if st.drift_since is None:
                            st.drift_since = now
                        if now - st.drift_since >= s.drift_hold_s and status == "ok":
                            status = "drift"
                    else:
                        st.drift_since = None
                # readmission of a dropped sensor that behaves again
                if st.dropped_for is not None and status == "ok":
                    if med_o is None:
                        # No other sensor to compare with: a reading that is good again is
                        # used at once (with no redundancy, waiting only keeps the loop blind).
                        st.dropped_for = None
                        st.agree_since = None
                    elif abs(v - med_o) <= s.readmit_k:
                        if st.agree_since is None:
                            st.agree_since = now
                        if now - st.agree_since >= s.readmit_s:
                            st.dropped_for = None
                            st.agree_since = None
                            st.residual = None
                    else:
                        st.agree_since = None
            elif status != "ok":
                st.disagree_since = st.drift_since = st.agree_since = None
            if status in ("frozen", "disagree", "drift", "bad", "out_of_range"):
                if st.dropped_for is None or status != st.dropped_for:
                    st.detected_at[status] = now
                st.dropped_for = status
            elif status in ("stale", "missing"):
                pass  # no judgement on a sensor we have no news from
            if status != st.status:
                trans.append(f"sensor:{p}:{st.status}->{status}")
                st.status = status
        healthy = tuple([p for p, st in self._st.items()
                         if st.status == "ok" and st.dropped_for is None])
        if not healthy:  # sensors dropped only for disagreeing are better than none
            healthy = tuple(p for p in self._st if base[p] == "ok"
                            and self._st[p].dropped_for in ("disagree", "drift"))
        pv = self._pv(now, samples, healthy, values)
        res = _new_voter_result(pv, {p: st.status for p, st in self._st.items()}, healthy,
                                est, tuple(trans))
        self._last = res
        return res

    def _estimate(self, ret: Sample | None, heat: Sample | None, flow: Sample | None
                  ) -> float | None:
        s = self.s
        if ret is None or heat is None or flow is None:
            return None
        if not (ret.usable and heat.usable and flow.usable):
            return None
        assert ret.value is not None and heat.value is not None and flow.value is not None
        design = self.design_flow.value_lpm
        if design is None or flow.value < s.min_flow_fraction * design:
            return None
        cs = s.coolant_rho_c_kj_per_l_k * flow.value / 60.0
        return ret.value - heat.value / cs

    def _pv(self, now: float, samples: Mapping[str, Sample], healthy: tuple[str, ...],
            values: Mapping[str, float]) -> Sample | None:
        if healthy:
            vals = [values[p] for p in healthy if p in values]
            if vals:
                # newest time of the healthy samples: max() of each, in one pass
                x = samples[healthy[0]]
                t, ts = x.t_mono, x.ts_ns
                for p in healthy[1:]:
                    x = samples[p]
                    if x.t_mono > t:
                        t = x.t_mono
                    if x.ts_ns > ts:
                        ts = x.ts_ns
                m = _median(vals)
                if _isfinite(m):  # `good` without its constructor's per-field setattr
                    return make_sample("supply_temp_voted_c", float(m), "degC", ts, t)
                return good("supply_temp_voted_c", m, "degC", ts, t)
        first = samples.get(self.points[0])
        if first is None:
            return None
        if first.usable and not healthy:
            reason = self._st[self.points[0]].status
            # aged past its stale limit (its last good read held through failed polls):
            # STALE, so the loop knows the hold is over (rackplane.core.polling.hold_good)
            q = Quality.STALE if reason == "stale" else Quality.BAD
            return invalid("supply_temp_voted_c", "degC", first.ts_ns, first.t_mono, q, reason)
        return first
