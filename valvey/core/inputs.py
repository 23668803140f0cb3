"""Where samples enter valvey's core: plausibility, the hold of a last good value through
failed polls, and one alarm per implausible input. Pure: no I/O, no clock.

**Plausibility** (`rackplane.core.plausibility`): every sample is judged against its input's
window (``[plausibility.<name>]``; the CDU's points also against the register map's
``valid_min`` / ``valid_max``, which the decoder applies). Outside it the sample becomes
OUT_OF_RANGE: no core uses it, each function falls back in its safe direction
(docs/VALVEY.md "Implausible inputs"), and the alarm ``input_implausible:<name>`` names the
input while its latest sample is out of range (raised once, cleared when valid again). Leak
states are judged by their kind when parsed (`valvey.core.sensors.parse_sensor_message`: a
bool that is neither 0 nor 1, a tray index outside 0..count−1) and alarm the same way.

**Failed polls** (`rackplane.core.polling.hold_good`): a poll that gets no reply delivers STALE
samples without a value; they do not replace a good value before its stale limit: a value is
good until ``stale_after_s`` after its last good read (each core judges the age with its own
limit), unless ``cdu.stale_after_failed_polls`` (default off) says otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from rackplane.core.plausibility import PlausibilityWindow, implausible_alarm_id, judge
from rackplane.core.polling import hold_good
from rackplane.core.samples import Quality, Sample
from valvey.core.feedforward import sample_names

if TYPE_CHECKING:
    from valvey.config import ValveyConfig

__all__ = ["InputGate", "input_gate", "safety_inputs"]


def safety_inputs(cfg: ValveyConfig) -> dict[str, str]:
    """The numeric inputs of valvey's interlocks, selector and limits other than the supply
    sensors (the voter has its own window and alarm): sample name -> the config key that
    names it. Each needs a plausibility window (`valvey.config.check_points_against_map`)."""
    pts, sf, sel = cfg.points, cfg.safety, cfg.selector
    roles = {
        "points.return_temp": pts.return_temp,
        "points.flow": pts.flow,
        "points.diff_pressure": pts.diff_pressure,
        "points.loop_pressure": pts.loop_pressure,
        "points.heat_removed": pts.heat_removed,
        "points.facility_supply_temp": pts.facility_supply_temp,
        "safety.reservoir_level": sf.reservoir_level,
        "safety.filter_dp": sf.filter_dp,
        "safety.rack_power": sf.rack_power,
        "selector.room_temp": sel.room_temp if sel.dew_point_floor else None,
        "selector.room_rh": sel.room_rh if sel.dew_point_floor else None,
    }
    return {name: key for key, name in roles.items() if name is not None}


def input_gate(cfg: ValveyConfig) -> InputGate:
    """The gate of valvey's config: the plausibility table, an alarm for every safety input
    (`safety_inputs`), every name of the plausibility table and every MQTT leak state (a
    row CDU's rack powers are judged by the rack power's window unless configured by name;
    their alarm is ``feedforward_source_lost``, naming them in the state); the hold lasts the
    longest stale limit of the CDU points' consumers."""
    topics = cfg.sensor_topics()
    sf = cfg.safety
    states = [t.name for t in topics if t.kind != "number"]
    # leak states and the isolation limit switch wherever they come from (a CDU register's
    # non-0/1 value is BAD not_boolean from the decoder)
    states += [n for n in (sf.rope_leak, sf.rope_sensor_fault, sf.drip_pan_leak,
                           sf.drip_pan_sensor_fault, sf.isolation_closed) if n is not None]
    lists = {t.name: t.count for t in topics if t.kind == "index_list"}
    hold_s = max(cfg.supply_loop.stale_after_s, cfg.supply_sensors.stale_after_s,
                 cfg.safety.stale_after_s, cfg.valves.stale_after_s,
                 cfg.pump_loop.stale_after_s, cfg.pumps.stale_after_s)
    windows = dict(cfg.plausibility)
    rp = cfg.sensors.rack_power
    if rp is not None and rp.name in windows:  # a row CDU's racks: the rack power's window
        for n in sample_names(cfg.feedforward, rp.name):
            windows.setdefault(n, windows[rp.name])
    return InputGate(windows, [*safety_inputs(cfg), *cfg.plausibility, *states],
                     lists, hold_s=hold_s, failed_polls=cfg.cdu.stale_after_failed_polls)


class InputGate:
    """Judges samples on their way into ``latest`` and derives the per-input alarms.

    Args:
        windows: plausibility window by sample name.
        watched: the inputs that get an ``input_implausible:<name>`` alarm (sample names).
        lists: index-list inputs (leak sensors): base name -> count (samples ``<name>.NN``).
        hold_s: how long a good value outlives failed polls (the longest stale limit of its
            consumers, s).
        failed_polls: a STALE sample replaces a good one after this many consecutive failed
            polls even before ``hold_s`` (None: off).
    """

    def __init__(self, windows: Mapping[str, PlausibilityWindow], watched: Iterable[str],
                 lists: Mapping[str, int], *, hold_s: float, failed_polls: int | None = None):
        self.windows = dict(windows)
        self.watched = sorted(set(watched))
        self.lists = dict(lists)
        self.hold_s = hold_s
        self.failed_polls = failed_polls
        self._failures: dict[str, int] = {}
        self.invalid_samples = 0
        """Samples entered not GOOD from outside a poller (MQTT: sensors, racky's state),
        after judging: monotonic since start (a poller counts its own)."""
        self._members = {n: [f"{n}.{i:02d}" for i in range(c)] for n, c in self.lists.items()}

    def alarm_ids(self) -> dict[str, str]:
        """Alarm id -> input name, one per watched input."""
        return {implausible_alarm_id(n): n for n in self.watched}

    def enter(self, latest: dict[str, Sample], samples: Iterable[Sample], *,
              polled: bool) -> None:
        """Put ``samples`` into ``latest`` (by point name), judged; ``polled``: they come
        from a poller (a STALE sample without a value is a failed poll, see the module)."""
        get = self.windows.get
        fails = self._failures
        for s in samples:
            w = get(s.point)
            if w is not None:
                s = judge(s, w)
            if not polled and s.quality is not Quality.GOOD:
                self.invalid_samples += 1
            if polled:
                if s.quality is Quality.STALE and s.value is None:
                    n = fails.get(s.point, 0) + 1
                    fails[s.point] = n
                    limit = self.failed_polls
                    if limit is None or n < limit:
                        s = hold_good(latest.get(s.point), s, self.hold_s)
                else:
                    fails.pop(s.point, None)
            latest[s.point] = s

    def conditions(self, latest: Mapping[str, Sample]) -> dict[str, bool]:
        """``input_implausible:<name>`` -> True while the input's latest sample is out of
        its window (an index list: any of its members; `_out_of_window`)."""
        out: dict[str, bool] = {}
        for n in self.watched:
            members = self._members.get(n)
            if members is None:
                bad = _out_of_window(latest.get(n))
            else:
                bad = any(_out_of_window(latest.get(m)) for m in members)
            out[implausible_alarm_id(n)] = bad
        return out


def _out_of_window(s: Sample | None) -> bool:
    """Outside its window: OUT_OF_RANGE (the plausibility table, the register map's valid
    range, a leak state that is no state), or a register bool that is neither 0 nor 1."""
    return s is not None and (s.quality is Quality.OUT_OF_RANGE or s.reason == "not_boolean")
